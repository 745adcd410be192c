//! What one service port contributes to the table: map elements, and the
//! shared chains those elements jump to. A pure function of the service
//! port, its endpoints and the node.

use std::collections::BTreeSet;
use std::net::IpAddr;

use verdict_model::{
    CategorizedEndpoints, Counting, Endpoint, NodeTopology, Protocol, ServicePort,
    categorize_endpoints,
};
use verdict_nft::{Element, ElementValue, L4Proto, Value, goto};

use crate::config::ProxierConfig;
use crate::layout::{self, DynChain, LOCAL_SLOT_OFFSET};

/// Endpoints as address and port.
pub type EndpointSet = BTreeSet<(IpAddr, u16)>;
/// An affinity entry (address . protocol . port) and the endpoints an
/// affinity element for it may name.
pub type AffinityEntry = (Vec<Value>, EndpointSet);

/// Everything one service port puts into the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contribution {
    /// Elements, with the set they go into.
    pub elements: Vec<(&'static str, Element)>,
    /// Shared chains the elements jump to.
    pub chains: BTreeSet<DynChain>,
    /// Internal traffic policy Local, endpoints exist, none is local.
    pub no_local_internal: bool,
    /// External traffic policy Local, endpoints exist, none is local.
    pub no_local_external: bool,
    /// ClientIP affinity: every entry (address . protocol . port) that
    /// records affinity, with the endpoints an affinity entry for it may
    /// name (the list that entry's traffic uses). Entries naming anything
    /// else are purged.
    pub affinity: Vec<AffinityEntry>,
}

/// The nftables protocol of a service protocol.
pub fn l4(p: Protocol) -> L4Proto {
    match p {
        Protocol::Tcp => L4Proto::Tcp,
        Protocol::Udp => L4Proto::Udp,
        Protocol::Sctp => L4Proto::Sctp,
    }
}

struct Builder {
    name: String,
    proto: L4Proto,
    port: u16,
    /// How finely the port is counted: `service` gives each entry that
    /// sends to endpoints a `service-connections` element and each entry
    /// and endpoint a `service-traffic` one; `endpoint` also an
    /// `endpoint-connections` one.
    counting: Counting,
    /// The value of a drop for want of a local endpoint.
    drop: ElementValue,
    /// The (entry, endpoint) pairs given one so far (an endpoint can be in
    /// an entry's cluster list and its local list).
    traffic: BTreeSet<(Vec<Value>, (IpAddr, u16))>,
    /// The entries given a `service-connections` element so far.
    entries: BTreeSet<Vec<Value>>,
    out: Contribution,
}

impl Builder {
    fn entry(&self, ip: IpAddr) -> Vec<Value> {
        vec![
            Value::Addr(ip),
            Value::Proto(self.proto),
            Value::Port(self.port),
        ]
    }

    fn push(&mut self, set: &'static str, e: Element) {
        self.out.elements.push((set, e));
    }

    fn dispatch(&mut self, set: &'static str, key: Vec<Value>, chain: DynChain) {
        self.out.chains.insert(chain);
        let e = Element::map(key, goto(&chain.to_string())).with_comment(self.name.clone());
        self.push(set, e);
    }

    /// Counts the connections `entry` (address . protocol . port) sends to
    /// endpoints, if the port is counted.
    fn count_entry(&mut self, entry: &[Value]) {
        if self.counting != Counting::None && self.entries.insert(entry.to_vec()) {
            self.push(layout::SERVICE_CONNECTIONS, Element::key(entry.to_vec()));
        }
    }

    fn no_endpoints(&mut self, set: &'static str, key: Vec<Value>, reject: bool) {
        let v = if reject {
            goto(layout::REJECT_CHAIN)
        } else {
            self.drop.clone()
        };
        let e = Element::map(key, v).with_comment(self.name.clone());
        self.push(set, e);
    }

    /// `address . port . slot : endpoint` for each endpoint, slots from
    /// `offset`, in the protocol's endpoint map. `entry` is
    /// address . protocol . port.
    fn slots(&mut self, entry: &[Value], eps: &[Endpoint], offset: u32) {
        let map = layout::service_endpoints(self.proto);
        for (i, ep) in eps.iter().enumerate() {
            let mut key: Vec<Value> = entry
                .iter()
                .filter(|v| !matches!(v, Value::Proto(_)))
                .copied()
                .collect();
            key.push(Value::Int(offset + i as u32));
            let v = ElementValue::Data(vec![Value::Addr(ep.ip), Value::Port(ep.port)]);
            self.push(map, Element::map(key, v));
            if self.counting != Counting::None
                && self.traffic.insert((entry.to_vec(), (ep.ip, ep.port)))
            {
                let mut key = entry.to_vec();
                key.extend([Value::Addr(ep.ip), Value::Port(ep.port)]);
                if self.counting == Counting::Endpoint {
                    self.push(layout::ENDPOINT_CONNECTIONS, Element::key(key.clone()));
                }
                self.push(layout::SERVICE_TRAFFIC, Element::key(key));
            }
        }
    }
}

/// Computes the contribution of one service port.
pub fn contribution(
    cfg: &ProxierConfig,
    sp: &ServicePort,
    endpoints: &[Endpoint],
    node_port_ips: &[IpAddr],
) -> Contribution {
    let topo = NodeTopology {
        node_name: cfg.node_name.clone(),
        zone: cfg.node_zone.clone(),
    };
    let cat: CategorizedEndpoints = categorize_endpoints(endpoints, sp, &topo);
    let mut b = Builder {
        name: sp.name.to_string(),
        proto: l4(sp.protocol),
        port: sp.port,
        counting: if cfg.counters {
            sp.counting.min(cfg.metrics.level)
        } else {
            Counting::None
        },
        drop: layout::no_local_endpoint_drop(cfg),
        traffic: BTreeSet::new(),
        entries: BTreeSet::new(),
        out: Contribution::default(),
    };
    let set = |eps: &[&Endpoint]| eps.iter().map(|e| (e.ip, e.port)).collect::<BTreeSet<_>>();
    let mut affinity_entries: Vec<AffinityEntry> = Vec::new();

    // ClusterIP: the internal policy decides the list.
    b.push(
        layout::CLUSTER_IPS,
        Element::key(vec![Value::Addr(sp.cluster_ip)]),
    );
    let internal = if sp.internal_policy_local {
        &cat.local
    } else {
        &cat.cluster
    };
    let cip = b.entry(sp.cluster_ip);
    if internal.is_empty() {
        b.no_endpoints(layout::NO_ENDPOINT_SERVICES, cip, !cat.has_any_endpoints);
        b.out.no_local_internal = sp.internal_policy_local && cat.has_any_endpoints;
    } else {
        b.dispatch(
            layout::SERVICE_IPS,
            cip.clone(),
            DynChain::Endpoints(internal.len() as u32),
        );
        b.slots(&cip, internal, 0);
        b.count_entry(&cip);
        affinity_entries.push((cip, set(&internal.iter().collect::<Vec<_>>())));
    }

    // External destinations: externalIPs, LoadBalancer VIPs, NodePorts.
    let mut external: Vec<IpAddr> = Vec::new();
    for ip in sp.external_ips.iter().chain(&sp.load_balancer_vips) {
        if !external.contains(ip) && *ip != sp.cluster_ip {
            external.push(*ip);
        }
    }
    let node_port_entries: Vec<Vec<Value>> = match sp.node_port {
        Some(np) => node_port_ips
            .iter()
            .map(|ip| vec![Value::Addr(*ip), Value::Proto(b.proto), Value::Port(np)])
            .collect(),
        None => Vec::new(),
    };
    let np_key = sp
        .node_port
        .map(|np| vec![Value::Proto(b.proto), Value::Port(np)]);
    if sp.externally_accessible() {
        let (c, l) = (cat.cluster.len() as u32, cat.local.len() as u32);
        let local_policy = sp.external_policy_local();
        if cat.has_any_endpoints && c > 0 {
            let class = if local_policy {
                DynChain::ExternalLocal(c, l)
            } else {
                DynChain::External(c)
            };
            let mut entries: Vec<Vec<Value>> = external.iter().map(|ip| b.entry(*ip)).collect();
            entries.extend(node_port_entries.iter().cloned());
            // Pods and the node use the cluster list; external clients the
            // local one with eTP=Local.
            let mut external_list: Vec<&Endpoint> = cat.cluster.iter().collect();
            if local_policy {
                external_list.extend(cat.local.iter());
            }
            for e in &entries {
                b.count_entry(e);
                b.slots(e, &cat.cluster, 0);
                if local_policy {
                    b.slots(e, &cat.local, LOCAL_SLOT_OFFSET);
                }
                affinity_entries.push((e.clone(), set(&external_list)));
            }
            for ip in &external {
                let key = b.entry(*ip);
                b.dispatch(layout::SERVICE_IPS, key.clone(), class);
                if local_policy && l == 0 {
                    b.no_endpoints(layout::NO_ENDPOINT_SERVICES, key, false);
                }
            }
            if let Some(key) = np_key {
                b.dispatch(layout::SERVICE_NODEPORTS, key.clone(), class);
                if local_policy && l == 0 {
                    b.no_endpoints(layout::NO_ENDPOINT_NODEPORTS, key, false);
                }
            }
            b.out.no_local_external = local_policy && l == 0;
            firewall(&mut b, cfg, sp);
        } else {
            for ip in &external {
                let key = b.entry(*ip);
                b.no_endpoints(layout::NO_ENDPOINT_SERVICES, key, true);
            }
            if let Some(key) = np_key {
                b.no_endpoints(layout::NO_ENDPOINT_NODEPORTS, key, true);
            }
        }
    }

    // Hairpin: a local endpoint reaching itself through the service.
    for ep in cat.all_reachable.iter().filter(|e| e.is_local) {
        let key = vec![
            Value::Addr(ep.ip),
            Value::Addr(ep.ip),
            Value::Proto(b.proto),
            Value::Port(ep.port),
        ];
        b.push(layout::HAIRPIN_CONNECTIONS, Element::key(key));
    }

    // Session affinity: record, for every entry, which endpoint was chosen.
    // Without it (see `ProxierConfig::session_affinity`) the service
    // balances every new connection.
    if let Some(timeout) = sp.session_affinity_timeout
        && cfg.session_affinity
        && !affinity_entries.is_empty()
    {
        let chain = DynChain::AffinityTimeout(timeout.max(1));
        for (e, _) in &affinity_entries {
            b.dispatch(layout::AFFINITY_SERVICES, e.clone(), chain);
        }
        b.out.affinity = affinity_entries;
    }
    b.out
}

/// LoadBalancer source ranges: `vip . proto . port` is firewalled, and each
/// allowed source range is `vip . proto . port . range`. If a range holds
/// the node's own address, the VIPs themselves are allowed too (a node
/// reaching its own LoadBalancer is SNATed to the VIP).
fn firewall(b: &mut Builder, cfg: &ProxierConfig, sp: &ServicePort) {
    if !sp.source_ranges_restrict || sp.load_balancer_vips.is_empty() {
        return;
    }
    let node_ips = cfg.primary_ips();
    let allow_vips = sp
        .load_balancer_source_ranges
        .iter()
        .any(|r| node_ips.iter().any(|ip| r.contains(ip)));
    let mut sources: Vec<ipnet::IpNet> = sp.load_balancer_source_ranges.clone();
    if allow_vips {
        sources.extend(
            sp.load_balancer_vips
                .iter()
                .map(|ip| ipnet::IpNet::from(*ip)),
        );
    }
    // The kernel refuses overlapping intervals ("File exists"), so ranges
    // that overlap, touch, or contain a VIP are merged first.
    let sources = ipnet::IpNet::aggregate(&sources);
    for vip in &sp.load_balancer_vips {
        let entry = b.entry(*vip);
        b.push(
            layout::FIREWALL_IPS,
            Element::key(entry.clone()).with_comment(b.name.clone()),
        );
        for src in &sources {
            let mut key = entry.clone();
            key.push(Value::Prefix(*src));
            b.push(layout::FIREWALL_ALLOW, Element::key(key));
        }
    }
}
