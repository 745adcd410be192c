//! kube-proxy's packet-flow test cases (`runPacketFlowTests` in
//! `pkg/proxy/nftables/proxier_test.go`; reference/upstream-nftables.md §4)
//! as data: each [`Scenario`] is a node configuration, a sequence of API
//! events and syncs, and the packet flows expected afterwards. The proxier's
//! tests replay them on the in-memory backend and trace packets; the
//! network-namespace test bed replays them on a real kernel and sends real
//! traffic. The builders are shared by both.
//!
//! Address plan (kube-proxy's `NewFakeProxier`):
//! - node `test-node`: 192.168.0.2 (primary), 192.168.1.2, 192.168.99.11 on
//!   eth0; 2001:db8::1 (primary), 2001:db8:1::2; loopback 127.0.0.1, ::1
//! - pods: 10.0.0.0/8, fd00:10::/64 (the local-traffic detector)
//! - services: 172.30.0.0/16, fd00:10:96::/112
//! - external clients: 203.0.113.2 (allowed), 203.0.113.130 (blocked), 2600:5200::1

mod cases;

use verdict_model::{
    AddressType, EndpointHints, EndpointSlice, IpFamily, LoadBalancerIngress, LoadBalancerIpMode,
    Protocol, Service, ServicePortSpec, ServiceType, SessionAffinity, SliceEndpoint, SlicePort,
    TrafficPolicy,
};
use verdict_nft::L4Proto;

pub use cases::upstream_scenarios;

/// This node's name in every scenario.
pub const NODE: &str = "test-node";

/// The node every scenario runs on (kube-proxy's fake proxier), for one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// Primary node addresses (both families, as the Node object lists them).
    pub node_ips: Vec<&'static str>,
    /// Addresses on the node's interfaces (loopback first), all families.
    pub local_ips: Vec<&'static str>,
    /// The local-traffic detector CIDR of the family.
    pub pod_cidr: &'static str,
    /// Service CIDR of the family.
    pub service_cidr: &'static str,
    /// Default nodePortAddresses of the fake proxier.
    pub node_port_cidrs: Vec<&'static str>,
}

/// The node's facts for one family.
pub fn node_facts(family: IpFamily) -> NodeFacts {
    let (pod_cidr, service_cidr, np) = match family {
        IpFamily::V4 => ("10.0.0.0/8", "172.30.0.0/16", "192.168.0.2/32"),
        IpFamily::V6 => ("fd00:10::/64", "fd00:10:96::/112", "2001:db8::1/128"),
    };
    NodeFacts {
        node_ips: vec!["192.168.0.2", "2001:db8::1"],
        local_ips: vec![
            "127.0.0.1",
            "::1",
            "192.168.0.2",
            "192.168.1.2",
            "192.168.99.11",
            "2001:db8::1",
            "2001:db8:1::2",
        ],
        pod_cidr,
        service_cidr,
        node_port_cidrs: vec![np],
    }
}

/// How a scenario's node differs from kube-proxy's fake proxier defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tweaks {
    /// Replaces nodePortAddresses with these CIDRs.
    pub node_port_cidrs: Option<Vec<String>>,
    /// masqueradeAll.
    pub masquerade_all: bool,
    /// No local-traffic detector.
    pub no_detector: bool,
}

/// One step of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add or update a Service.
    Service(Service),
    /// Delete a Service (namespace, name).
    DeleteService(String, String),
    /// Add or update an EndpointSlice.
    Slice(EndpointSlice),
    /// Delete an EndpointSlice (namespace, name).
    DeleteSlice(String, String),
    /// Program the backend.
    Sync,
}

/// Records a node configuration and a sequence of steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    /// The family of the node's proxier.
    pub family: IpFamily,
    /// How the node differs from the upstream test's.
    pub tweaks: Tweaks,
    /// What happens, in order.
    pub steps: Vec<Step>,
}

impl Setup {
    /// A node of `family` as upstream's fake proxier has it.
    pub fn new(family: IpFamily) -> Setup {
        Setup::with_tweaks(family, Tweaks::default())
    }

    /// A node of `family`, changed by `tweaks`.
    pub fn with_tweaks(family: IpFamily, tweaks: Tweaks) -> Setup {
        Setup {
            family,
            tweaks,
            steps: Vec::new(),
        }
    }

    /// Adds or replaces a Service.
    pub fn service(&mut self, svc: Service) -> &mut Setup {
        self.steps.push(Step::Service(svc));
        self
    }

    /// Deletes a Service.
    pub fn delete_service(&mut self, ns: &str, name: &str) -> &mut Setup {
        self.steps.push(Step::DeleteService(ns.into(), name.into()));
        self
    }

    /// Adds or replaces an EndpointSlice.
    pub fn slice(&mut self, slice: EndpointSlice) -> &mut Setup {
        self.steps.push(Step::Slice(slice));
        self
    }

    /// Deletes an EndpointSlice.
    pub fn delete_slice(&mut self, ns: &str, name: &str) -> &mut Setup {
        self.steps.push(Step::DeleteSlice(ns.into(), name.into()));
        self
    }

    /// Programs the backend.
    pub fn sync(&mut self) -> &mut Setup {
        self.steps.push(Step::Sync);
        self
    }
}

/// What a proxier is told, step by step, when a setup is replayed: every
/// event carries the object as it was before, as a watch would.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A Service changed from the first to the second (`None`: absent).
    Service(Option<Box<Service>>, Option<Box<Service>>),
    /// An EndpointSlice changed; `true` when it was removed.
    Slice(EndpointSlice, bool),
    /// Program the backend.
    Sync,
}

impl Setup {
    /// The setup's steps as events, with each object's previous version.
    pub fn events(&self) -> Vec<Event> {
        let mut services = std::collections::BTreeMap::new();
        let mut slices = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        for step in &self.steps {
            match step {
                Step::Service(svc) => {
                    let prev =
                        services.insert((svc.namespace.clone(), svc.name.clone()), svc.clone());
                    out.push(Event::Service(
                        prev.map(Box::new),
                        Some(Box::new(svc.clone())),
                    ));
                }
                Step::DeleteService(ns, n) => {
                    if let Some(prev) = services.remove(&(ns.clone(), n.clone())) {
                        out.push(Event::Service(Some(Box::new(prev)), None));
                    }
                }
                Step::Slice(sl) => {
                    slices.insert((sl.namespace.clone(), sl.name.clone()), sl.clone());
                    out.push(Event::Slice(sl.clone(), false));
                }
                Step::DeleteSlice(ns, n) => {
                    if let Some(prev) = slices.remove(&(ns.clone(), n.clone())) {
                        out.push(Event::Slice(prev, true));
                    }
                }
                Step::Sync => out.push(Event::Sync),
            }
        }
        out
    }
}

/// A setup and the flows expected after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Upstream test function (and sub-test), e.g. `TestNodePorts/ipv6`.
    pub name: String,
    /// The node and what happened to it.
    pub setup: Setup,
    /// The flows expected then.
    pub flows: Vec<Flow>,
}

impl Scenario {
    /// The upstream test function this scenario belongs to.
    pub fn group(&self) -> &str {
        self.name.split('/').next().unwrap_or(&self.name)
    }
}

/// Collects scenarios: every `run` captures the setup so far with its flows.
#[derive(Default)]
pub struct Collector {
    /// Every scenario so far, in order.
    pub scenarios: Vec<Scenario>,
}

impl Collector {
    /// Records `flows` as what `test` expects after `setup`.
    pub fn run(&mut self, test: &str, setup: &Setup, flows: &[Flow]) {
        self.scenarios.push(Scenario {
            name: test.into(),
            setup: setup.clone(),
            flows: flows.to_vec(),
        });
    }
}

// === builders ===

/// A ClusterIP Service without ports, to build on with [`ServiceExt`].
pub fn svc(ns: &str, name: &str) -> Service {
    Service {
        namespace: ns.into(),
        name: name.into(),
        ..Service::default()
    }
}

/// Builders of a Service, as the upstream tests write them.
pub trait ServiceExt {
    /// Adds a cluster IP.
    fn cluster_ip(self, ip: &str) -> Service;
    /// Sets the type.
    fn kind(self, t: ServiceType) -> Service;
    /// Adds a port (`node_port` 0: none).
    fn port(self, name: &str, proto: Protocol, port: i32, node_port: i32) -> Service;
    /// Sets the external IPs.
    fn external_ips(self, ips: &[&str]) -> Service;
    /// Makes it a LoadBalancer with these ingress IPs.
    fn lb(self, ips: &[&str]) -> Service;
    /// Adds a load-balancer ingress IP with its `ipMode`.
    fn lb_mode(self, ip: &str, mode: LoadBalancerIpMode) -> Service;
    /// Sets `loadBalancerSourceRanges`.
    fn source_ranges(self, r: &[&str]) -> Service;
    /// `externalTrafficPolicy: Local`.
    fn etp_local(self) -> Service;
    /// `internalTrafficPolicy: Local`.
    fn itp_local(self) -> Service;
    /// ClientIP affinity with this timeout.
    fn affinity(self, timeout: i32) -> Service;
    /// Sets `healthCheckNodePort`.
    fn hcnp(self, p: i32) -> Service;
}

impl ServiceExt for Service {
    fn cluster_ip(mut self, ip: &str) -> Service {
        self.cluster_ips.push(ip.into());
        self
    }
    fn kind(mut self, t: ServiceType) -> Service {
        self.service_type = t;
        self
    }
    fn port(mut self, name: &str, proto: Protocol, port: i32, node_port: i32) -> Service {
        self.ports.push(ServicePortSpec {
            name: name.into(),
            protocol: proto,
            port,
            node_port: (node_port != 0).then_some(node_port),
        });
        self
    }
    fn external_ips(mut self, ips: &[&str]) -> Service {
        self.external_ips.extend(ips.iter().map(|s| s.to_string()));
        self
    }
    fn lb(mut self, ips: &[&str]) -> Service {
        self.service_type = ServiceType::LoadBalancer;
        self.load_balancer_ingress
            .extend(ips.iter().map(|s| LoadBalancerIngress {
                ip: Some(s.to_string()),
                ip_mode: None,
            }));
        self
    }
    fn lb_mode(mut self, ip: &str, mode: LoadBalancerIpMode) -> Service {
        self.service_type = ServiceType::LoadBalancer;
        self.load_balancer_ingress.push(LoadBalancerIngress {
            ip: Some(ip.into()),
            ip_mode: Some(mode),
        });
        self
    }
    fn source_ranges(mut self, r: &[&str]) -> Service {
        self.load_balancer_source_ranges
            .extend(r.iter().map(|s| s.to_string()));
        self
    }
    fn etp_local(mut self) -> Service {
        self.external_traffic_policy = TrafficPolicy::Local;
        self
    }
    fn itp_local(mut self) -> Service {
        self.internal_traffic_policy = TrafficPolicy::Local;
        self
    }
    fn affinity(mut self, timeout: i32) -> Service {
        self.session_affinity = SessionAffinity::ClientIP;
        self.session_affinity_timeout_seconds = Some(timeout);
        self
    }
    fn hcnp(mut self, p: i32) -> Service {
        self.health_check_node_port = Some(p);
        self
    }
}

/// An EndpointSlice of `ns/service` named `name`, of the family of its
/// first endpoint (IPv4 if none).
pub fn slice(ns: &str, service: &str, name: &str) -> EndpointSlice {
    EndpointSlice {
        namespace: ns.into(),
        name: name.into(),
        service_name: Some(service.into()),
        address_type: AddressType::IPv4,
        ..EndpointSlice::default()
    }
}

/// Builders of an EndpointSlice, as the upstream tests write them.
pub trait SliceExt {
    /// Makes it an IPv6 slice.
    fn v6(self) -> EndpointSlice;
    /// Adds a port.
    fn port(self, name: &str, proto: Protocol, port: i32) -> EndpointSlice;
    /// A ready endpoint on `node` ("" for none).
    fn ep(self, ip: &str, node: &str) -> EndpointSlice;
    /// An endpoint with explicit ready/serving/terminating conditions.
    fn ep_cond(
        self,
        ip: &str,
        node: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
    ) -> EndpointSlice;
    /// A ready endpoint in `zone`, with these zone hints.
    fn ep_zone(self, ip: &str, node: &str, zone: &str, hint_zones: &[&str]) -> EndpointSlice;
    /// Sets the `endpoints.kubernetes.io/last-change-trigger-time` annotation.
    fn trigger_time(self, t: &str) -> EndpointSlice;
}

impl SliceExt for EndpointSlice {
    fn v6(mut self) -> EndpointSlice {
        self.address_type = AddressType::IPv6;
        self
    }
    fn port(mut self, name: &str, proto: Protocol, port: i32) -> EndpointSlice {
        self.ports.push(SlicePort {
            name: Some(name.into()),
            port: Some(port),
            protocol: proto,
        });
        self
    }
    fn ep(mut self, ip: &str, node: &str) -> EndpointSlice {
        self.endpoints.push(SliceEndpoint {
            addresses: vec![ip.into()],
            node_name: (!node.is_empty()).then(|| node.to_string()),
            ..SliceEndpoint::default()
        });
        self
    }
    fn ep_cond(
        mut self,
        ip: &str,
        node: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
    ) -> EndpointSlice {
        self.endpoints.push(SliceEndpoint {
            addresses: vec![ip.into()],
            node_name: (!node.is_empty()).then(|| node.to_string()),
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
            ..SliceEndpoint::default()
        });
        self
    }
    fn ep_zone(mut self, ip: &str, node: &str, zone: &str, hint_zones: &[&str]) -> EndpointSlice {
        self.endpoints.push(SliceEndpoint {
            addresses: vec![ip.into()],
            node_name: (!node.is_empty()).then(|| node.to_string()),
            zone: Some(zone.into()),
            hints: Some(EndpointHints {
                for_zones: hint_zones.iter().map(|s| s.to_string()).collect(),
                for_nodes: Vec::new(),
            }),
            ..SliceEndpoint::default()
        });
        self
    }
    fn trigger_time(mut self, t: &str) -> EndpointSlice {
        self.last_change_trigger_time = Some(t.into());
        self
    }
}

/// TCP, as the upstream tests write it.
pub const TCP: Protocol = Protocol::Tcp;
/// UDP.
pub const UDP: Protocol = Protocol::Udp;
/// SCTP.
pub const SCTP: Protocol = Protocol::Sctp;

// === packet flows ===

/// One expected packet flow, as in kube-proxy's `packetFlowTest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// What it tests, as upstream names it.
    pub name: String,
    /// The protocol.
    pub proto: L4Proto,
    /// The source address.
    pub src: &'static str,
    /// The destination address.
    pub dst: &'static str,
    /// The destination port.
    pub dport: u16,
    /// `"IP:port, IP:port"`, `"DROP"`, `"REJECT"` or `""` (untouched).
    pub output: String,
    /// Checked only when `output` lists endpoints.
    pub masq: bool,
}

/// A TCP flow.
pub fn flow(
    name: &str,
    src: &'static str,
    dst: &'static str,
    dport: u16,
    output: &str,
    masq: bool,
) -> Flow {
    Flow {
        name: name.into(),
        proto: L4Proto::Tcp,
        src,
        dst,
        dport,
        output: output.into(),
        masq,
    }
}

impl Flow {
    /// The same flow in another protocol.
    pub fn proto(mut self, p: L4Proto) -> Flow {
        self.proto = p;
        self
    }
}
