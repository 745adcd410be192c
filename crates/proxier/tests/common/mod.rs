//! Test support: a proxier on the in-memory backend, configured like
//! kube-proxy's fake proxier, with builders for Services and EndpointSlices
//! and a packet-flow runner.
//!
//! Address plan (kube-proxy's `NewFakeProxier`):
//! - node `test-node`: 192.168.0.2 (primary), 192.168.1.2, 192.168.99.11 on
//!   eth0; 2001:db8::1 (primary), 2001:db8:1::2; loopback 127.0.0.1, ::1
//! - pods: 10.0.0.0/8, fd00:10::/64 (the local-traffic detector)
//! - services: 172.30.0.0/16, fd00:10:96::/112
//! - external clients: 203.0.113.2 (allowed), 203.0.113.130 (blocked), 2600:5200::1

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use verdict_model::{
    AddressType, EndpointHints, EndpointSlice, IpFamily, LoadBalancerIngress, LoadBalancerIpMode,
    Protocol, Service, ServicePortSpec, ServiceType, SessionAffinity, SliceEndpoint, SlicePort,
    TrafficPolicy,
};
use verdict_nft::{Family, L4Proto, MemoryBackend, Packet, Trace, Tracer};
use verdict_proxier::{LocalDetector, NodePortAddresses, Proxier, ProxierConfig, SyncResult};

pub const NODE: &str = "test-node";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// kube-proxy's fake proxier settings for one family.
pub fn upstream_config(family: IpFamily) -> ProxierConfig {
    let mut c = ProxierConfig::new(family, NODE);
    c.node_ips = vec![ip("192.168.0.2"), ip("2001:db8::1")];
    c.local_ips = [
        "127.0.0.1",
        "::1",
        "192.168.0.2",
        "192.168.1.2",
        "192.168.99.11",
        "2001:db8::1",
        "2001:db8:1::2",
    ]
    .iter()
    .map(|s| ip(s))
    .collect();
    c.masquerade_bit = 14;
    match family {
        IpFamily::V4 => {
            c.local_detector = LocalDetector::Cidr("10.0.0.0/8".parse().unwrap());
            c.service_cidrs = vec!["172.30.0.0/16".parse().unwrap()];
            c.node_port_addresses =
                NodePortAddresses::Cidrs(vec!["192.168.0.2/32".parse().unwrap()]);
        }
        IpFamily::V6 => {
            c.local_detector = LocalDetector::Cidr("fd00:10::/64".parse().unwrap());
            c.service_cidrs = vec!["fd00:10:96::/112".parse().unwrap()];
            c.node_port_addresses =
                NodePortAddresses::Cidrs(vec!["2001:db8::1/128".parse().unwrap()]);
        }
    }
    c
}

/// A proxier on the in-memory backend, with a clock the test moves.
pub struct Fixture {
    pub proxier: Proxier,
    pub nft: MemoryBackend,
    pub now: Instant,
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
}

impl Fixture {
    pub fn new(family: IpFamily) -> Fixture {
        Fixture::with_config(upstream_config(family))
    }

    pub fn with_config(cfg: ProxierConfig) -> Fixture {
        Fixture {
            proxier: Proxier::new(cfg).expect("valid config"),
            nft: MemoryBackend::new(),
            now: Instant::now(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
        }
    }

    pub fn family(&self) -> Family {
        self.proxier.config().nft_family()
    }

    /// Adds or updates a Service.
    pub fn service(&mut self, svc: Service) -> &mut Fixture {
        let key = (svc.namespace.clone(), svc.name.clone());
        let prev = self.services.insert(key, svc.clone());
        self.proxier.on_service(prev.as_ref(), Some(&svc));
        self
    }

    pub fn delete_service(&mut self, ns: &str, name: &str) -> &mut Fixture {
        if let Some(prev) = self.services.remove(&(ns.into(), name.into())) {
            self.proxier.on_service(Some(&prev), None);
        }
        self
    }

    /// Adds or updates an EndpointSlice.
    pub fn slice(&mut self, slice: EndpointSlice) -> &mut Fixture {
        self.slices
            .insert((slice.namespace.clone(), slice.name.clone()), slice.clone());
        self.proxier.on_endpoint_slice(&slice, false);
        self
    }

    pub fn delete_slice(&mut self, ns: &str, name: &str) -> &mut Fixture {
        if let Some(prev) = self.slices.remove(&(ns.into(), name.into())) {
            self.proxier.on_endpoint_slice(&prev, true);
        }
        self
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Syncs and panics on failure.
    pub fn sync(&mut self) -> SyncResult {
        let now = self.now;
        self.proxier.sync(&mut self.nft, now).expect("sync")
    }

    pub fn dump(&self) -> String {
        let cfg = self.proxier.config();
        self.nft.dump(cfg.nft_family(), &cfg.table)
    }

    /// Traces a new connection. Sources that are node addresses are sent by
    /// the node itself; pod sources arrive on a pod interface, others on eth0.
    pub fn trace(&self, proto: L4Proto, src: &str, dst: &str, dport: u16) -> Trace {
        let cfg = self.proxier.config();
        let table = self
            .nft
            .get(cfg.nft_family(), &cfg.table)
            .expect("table exists");
        let local: Vec<IpAddr> = cfg
            .local_ips
            .iter()
            .filter(|a| !a.is_loopback())
            .copied()
            .collect();
        let src = ip(src);
        let iif = if local.contains(&src) {
            None
        } else if matches!(&cfg.local_detector, LocalDetector::Cidr(n) if n.contains(&src)) {
            Some("veth-pod".to_string())
        } else {
            Some("eth0".to_string())
        };
        Tracer::new(table, cfg.nft_family(), &local).trace(&Packet {
            src,
            dst: ip(dst),
            proto,
            dport,
            iif,
        })
    }
}

// === builders ===

pub fn svc(ns: &str, name: &str) -> Service {
    Service {
        namespace: ns.into(),
        name: name.into(),
        ..Service::default()
    }
}

pub trait ServiceExt {
    fn cluster_ip(self, ip: &str) -> Service;
    fn kind(self, t: ServiceType) -> Service;
    fn port(self, name: &str, proto: Protocol, port: i32, node_port: i32) -> Service;
    fn external_ips(self, ips: &[&str]) -> Service;
    fn lb(self, ips: &[&str]) -> Service;
    fn lb_mode(self, ip: &str, mode: LoadBalancerIpMode) -> Service;
    fn source_ranges(self, r: &[&str]) -> Service;
    fn etp_local(self) -> Service;
    fn itp_local(self) -> Service;
    fn affinity(self, timeout: i32) -> Service;
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

pub trait SliceExt {
    fn v6(self) -> EndpointSlice;
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
    fn ep_zone(self, ip: &str, node: &str, zone: &str, hint_zones: &[&str]) -> EndpointSlice;
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

pub const TCP: Protocol = Protocol::Tcp;
pub const UDP: Protocol = Protocol::Udp;
pub const SCTP: Protocol = Protocol::Sctp;

// === packet flows ===

/// One expected packet flow, as in kube-proxy's `packetFlowTest`.
#[derive(Clone, Debug)]
pub struct Flow {
    pub name: String,
    pub proto: L4Proto,
    pub src: &'static str,
    pub dst: &'static str,
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
    pub fn proto(mut self, p: L4Proto) -> Flow {
        self.proto = p;
        self
    }
}

/// Counts and collects packet-flow results.
#[derive(Default)]
pub struct Report {
    pub ran: usize,
    pub failures: Vec<String>,
}

impl Report {
    /// Traces every flow on `fx` and records mismatches.
    pub fn run(&mut self, test: &str, fx: &Fixture, flows: &[Flow]) {
        for f in flows {
            self.ran += 1;
            let t = fx.trace(f.proto, f.src, f.dst, f.dport);
            let got = t.output();
            let endpoints = !matches!(f.output.as_str(), "DROP" | "REJECT" | "");
            let masq_ok = !endpoints || t.masqueraded() == Some(f.masq);
            if got != f.output || !masq_ok {
                self.failures.push(format!(
                    "{test} / {}: {} {} -> {}:{}: want {:?} masq={}, got {:?} masq={:?}\n{}",
                    f.name,
                    f.proto,
                    f.src,
                    f.dst,
                    f.dport,
                    f.output,
                    f.masq,
                    got,
                    t.masqueraded(),
                    t.explain()
                ));
            }
        }
    }
}
