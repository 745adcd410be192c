//! verdict's per-service and per-endpoint counters, from the kernel's own
//! element counters (`--service-counters`). The NAT chains see only a
//! connection's first packet, so the `service-ips`, `service-nodeports`
//! and `service-endpoints-*` counters count new connections per entry
//! point and per endpoint; `no-endpoint-*` count the rejects and drops of
//! Services without (local) endpoints, and `firewall-ips` minus
//! `service-ips` the connections `loadBalancerSourceRanges` dropped. No
//! set or map is added for them: the number of sets stays fixed.
//!
//!
//! Packets and bytes are counted apart, in `service-traffic`: the filter
//! chains send every packet of a DNATed connection, in both directions,
//! to a lookup of its original destination and its replies' source, which
//! finds one element per entry and endpoint. One set, whatever the
//! cluster size; one element per entry and endpoint, as many as the
//! endpoint maps hold.
//!
//! A counter starts again from zero when its element is replaced (an
//! endpoint moves to another slot, a Service is re-created), which
//! Prometheus reads as a counter reset.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value as Json, json};
use verdict_model::{IpFamily, ServicePort, ServicePortName};
use verdict_nft::{ElementValue, TableState, Value, Verdict};
use verdict_proxier::layout;

use crate::view::{NodeHandle, ServiceView};

/// New connections per Service port and entry point.
pub const SERVICE_CONNECTIONS: &str = "verdict_service_connections_total";
/// New connections per endpoint.
pub const ENDPOINT_CONNECTIONS: &str = "verdict_endpoint_connections_total";
/// Connections rejected: the Service has no usable endpoint.
pub const SERVICE_REJECTED: &str = "verdict_service_rejected_total";
/// Connections dropped, by reason.
pub const SERVICE_DROPPED: &str = "verdict_service_dropped_total";
/// Packets of a Service port's connections, both ways, per entry point.
pub const SERVICE_PACKETS: &str = "verdict_service_packets_total";
/// Their bytes.
pub const SERVICE_BYTES: &str = "verdict_service_bytes_total";
/// Packets of the connections sent to an endpoint, both ways.
pub const ENDPOINT_PACKETS: &str = "verdict_endpoint_packets_total";
/// Their bytes.
pub const ENDPOINT_BYTES: &str = "verdict_endpoint_bytes_total";
/// New connections to a ClusterIP on a port no Service has, rejected.
pub const CLUSTER_IP_REJECTED: &str = "verdict_cluster_ip_rejected_total";
/// New connections to an address of the service CIDRs that no Service
/// has, dropped.
pub const CLUSTER_IP_DROPPED: &str = "verdict_cluster_ip_dropped_total";

type Labels = Vec<(&'static str, String)>;

#[derive(Default)]
struct Families(BTreeMap<&'static str, BTreeMap<Labels, u64>>);

impl Families {
    fn add(&mut self, name: &'static str, labels: Labels, n: u64) {
        *self.0.entry(name).or_default().entry(labels).or_default() += n;
    }
}

fn port_labels(family: &str, port: &ServicePortName) -> Labels {
    vec![
        ("ip_family", family.to_owned()),
        ("namespace", port.service.namespace.to_string()),
        ("service", port.service.name.to_string()),
        ("port", port.port.to_string()),
    ]
}

/// Who owns what in one family, from the read model: the service port
/// each wanted element belongs to, and the ports by name and by the
/// comment the proxier writes on their elements.
struct Index<'a> {
    family: IpFamily,
    owner: HashMap<(&'a str, &'a [Value]), &'a ServicePortName>,
    ports: HashMap<&'a ServicePortName, &'a ServicePort>,
    by_comment: HashMap<String, &'a ServicePortName>,
}

impl<'a> Index<'a> {
    fn new(views: &'a [Arc<ServiceView>], family: IpFamily) -> Index<'a> {
        let mut idx = Index {
            family,
            owner: HashMap::new(),
            ports: HashMap::new(),
            by_comment: HashMap::new(),
        };
        for (f, port) in views.iter().flat_map(|v| v.ports()) {
            if f != family {
                continue;
            }
            idx.ports.insert(&port.name, &port.port);
            idx.by_comment.insert(port.name.to_string(), &port.name);
            for e in port.intent.iter().flat_map(|i| &i.elements) {
                let who = e.programmed_for.as_ref().unwrap_or(&port.name);
                let slot = idx
                    .owner
                    .entry((e.set, e.element.key.as_slice()))
                    .or_insert(who);
                if who < *slot {
                    *slot = who;
                }
            }
        }
        idx
    }

    /// The service port owning an element: the one that wants it, else
    /// the one its comment names (an element verdict no longer wants).
    fn owner(&self, set: &str, key: &[Value], table: &TableState) -> Option<ServicePortName> {
        if let Some(o) = self.owner.get(&(set, key)) {
            return Some((*o).clone());
        }
        let comment = table.sets.get(set)?.elements.get(key)?.comment.as_deref()?;
        self.by_comment.get(comment).map(|n| (*n).clone())
    }

    fn port(&self, name: &ServicePortName) -> Option<&ServicePort> {
        self.ports.get(name).copied()
    }
}

fn entry_kind(sp: Option<&ServicePort>, addr: IpAddr) -> &'static str {
    match sp {
        Some(sp) if sp.cluster_ip == addr => "ClusterIP",
        Some(sp) if sp.load_balancer_vips.contains(&addr) => "LoadBalancer",
        Some(sp) if sp.external_ips.contains(&addr) => "ExternalIP",
        _ => "unknown",
    }
}

/// The entry point of a `service-traffic` key's address and port: a
/// Service address, or a node address with the NodePort.
fn traffic_entry(sp: Option<&ServicePort>, addr: IpAddr, port: u16) -> &'static str {
    let Some(sp) = sp else { return "unknown" };
    match entry_kind(Some(sp), addr) {
        kind if port == sp.port && kind != "unknown" => kind,
        _ if sp.node_port == Some(port) => "NodePort",
        _ => "unknown",
    }
}

fn addr_of(key: &[Value]) -> Option<IpAddr> {
    match key.first() {
        Some(Value::Addr(a)) => Some(*a),
        _ => None,
    }
}

/// The counters of one family's table.
fn collect(p: &Index<'_>, t: &TableState, out: &mut Families) {
    let family = match p.family {
        verdict_model::IpFamily::V4 => "IPv4",
        verdict_model::IpFamily::V6 => "IPv6",
    };
    let counters = |set: &str| t.sets.get(set).map(|s| &s.counters);
    for (key, c) in counters(layout::SERVICE_IPS).into_iter().flatten() {
        let (Some(port), Some(addr)) = (p.owner(layout::SERVICE_IPS, key, t), addr_of(key)) else {
            continue;
        };
        let mut l = port_labels(family, &port);
        l.push(("entry", entry_kind(p.port(&port), addr).into()));
        l.push(("address", addr.to_string()));
        out.add(SERVICE_CONNECTIONS, l, c.packets);
    }
    for (key, c) in counters(layout::SERVICE_NODEPORTS).into_iter().flatten() {
        let Some(port) = p.owner(layout::SERVICE_NODEPORTS, key, t) else {
            continue;
        };
        let mut l = port_labels(family, &port);
        l.push(("entry", "NodePort".into()));
        l.push(("address", String::new()));
        out.add(SERVICE_CONNECTIONS, l, c.packets);
    }
    for set in [
        layout::SERVICE_ENDPOINTS_TCP,
        layout::SERVICE_ENDPOINTS_UDP,
        layout::SERVICE_ENDPOINTS_SCTP,
    ] {
        let elements = t.sets.get(set).map(|s| &s.elements);
        for (key, c) in counters(set).into_iter().flatten() {
            let target = elements
                .and_then(|e| e.get(key))
                .and_then(|e| match &e.value {
                    Some(ElementValue::Data(d)) => match d.as_slice() {
                        [Value::Addr(a), Value::Port(port)] => Some((*a, *port)),
                        _ => None,
                    },
                    _ => None,
                });
            let (Some(port), Some((a, ep_port))) = (p.owner(set, key, t), target) else {
                continue;
            };
            let mut l = port_labels(family, &port);
            l.push(("endpoint", super::show_addr(a, ep_port)));
            out.add(ENDPOINT_CONNECTIONS, l, c.packets);
        }
    }
    for set in [layout::NO_ENDPOINT_SERVICES, layout::NO_ENDPOINT_NODEPORTS] {
        let elements = t.sets.get(set).map(|s| &s.elements);
        for (key, c) in counters(set).into_iter().flatten() {
            let Some(port) = p.owner(set, key, t) else {
                continue;
            };
            let drop = elements
                .and_then(|e| e.get(key))
                .is_some_and(|e| e.value == Some(ElementValue::Verdict(Verdict::Drop)));
            let mut l = port_labels(family, &port);
            if drop {
                l.push(("reason", "no-local-endpoints".into()));
                out.add(SERVICE_DROPPED, l, c.packets);
            } else {
                out.add(SERVICE_REJECTED, l, c.packets);
            }
        }
    }
    // Packets and bytes, per entry point and per endpoint.
    for (key, c) in counters(layout::SERVICE_TRAFFIC).into_iter().flatten() {
        let Some(port) = p.owner(layout::SERVICE_TRAFFIC, key, t) else {
            continue;
        };
        let [
            Value::Addr(entry),
            _,
            Value::Port(entry_port),
            Value::Addr(ep),
            Value::Port(ep_port),
        ] = key.as_slice()
        else {
            continue;
        };
        let sp = p.port(&port);
        let mut l = port_labels(family, &port);
        l.push(("entry", traffic_entry(sp, *entry, *entry_port).into()));
        l.push(("address", entry.to_string()));
        out.add(SERVICE_PACKETS, l.clone(), c.packets);
        out.add(SERVICE_BYTES, l, c.bytes);
        let mut l = port_labels(family, &port);
        l.push(("endpoint", super::show_addr(*ep, *ep_port)));
        out.add(ENDPOINT_PACKETS, l.clone(), c.packets);
        out.add(ENDPOINT_BYTES, l, c.bytes);
    }
    // What cluster-ips-check rejects and drops belongs to no Service: the
    // rules' own counters, for the node.
    if let Some(c) = t.chains.get(layout::CLUSTER_IPS_CHECK) {
        for (i, counter) in &c.counters {
            let name = match c.rules.get(*i).and_then(|r| r.comment.as_deref()) {
                Some(layout::INVALID_PORT_COMMENT) => CLUSTER_IP_REJECTED,
                Some(layout::UNALLOCATED_COMMENT) => CLUSTER_IP_DROPPED,
                _ => continue,
            };
            out.add(
                name,
                vec![("ip_family", family.to_owned())],
                counter.packets,
            );
        }
    }
    // Firewalled destinations: what did not reach `service-ips` was dropped.
    let accepted = counters(layout::SERVICE_IPS);
    for (key, c) in counters(layout::FIREWALL_IPS).into_iter().flatten() {
        let Some(port) = p.owner(layout::SERVICE_IPS, key, t) else {
            continue;
        };
        let passed = accepted.and_then(|a| a.get(key)).map_or(0, |a| a.packets);
        let mut l = port_labels(family, &port);
        l.push(("reason", "source-ranges".into()));
        out.add(SERVICE_DROPPED, l, c.packets.saturating_sub(passed));
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One reading of every family's counters.
#[derive(Default)]
pub struct Snapshot {
    families: Families,
}

impl Snapshot {
    /// Reads the counters of each family's table (`None`: not read),
    /// attributed to the Services of the read model.
    pub fn of(handle: &NodeHandle, tables: &[(IpFamily, Option<&TableState>)]) -> Snapshot {
        let views = handle.all_services();
        let mut families = Families::default();
        for (f, t) in tables {
            if let Some(t) = t {
                collect(&Index::new(&views, *f), t, &mut families);
            }
        }
        Snapshot { families }
    }

    /// The counters in Prometheus' text format.
    pub fn exposition(&self) -> String {
        let help = |name: &str| match name {
            SERVICE_CONNECTIONS => {
                "New connections to a Service port, per entry point (ClusterIP, ExternalIP, LoadBalancer, NodePort), counted by the kernel"
            }
            ENDPOINT_CONNECTIONS => {
                "New connections sent to an endpoint of a Service port, counted by the kernel"
            }
            SERVICE_REJECTED => {
                "New connections rejected because the Service port has no usable endpoint"
            }
            SERVICE_PACKETS => {
                "Packets of a Service port's connections, both directions, per entry point, counted by the kernel"
            }
            SERVICE_BYTES => {
                "Bytes of a Service port's connections, both directions, per entry point, counted by the kernel"
            }
            ENDPOINT_PACKETS => {
                "Packets of the connections sent to an endpoint of a Service port, both directions, counted by the kernel"
            }
            ENDPOINT_BYTES => {
                "Bytes of the connections sent to an endpoint of a Service port, both directions, counted by the kernel"
            }
            CLUSTER_IP_REJECTED => {
                "New connections to a ClusterIP on a port no Service has, rejected, counted by the kernel"
            }
            CLUSTER_IP_DROPPED => {
                "New connections to an address of the service CIDRs that no Service has, dropped, counted by the kernel"
            }
            _ => {
                "New connections dropped: no local endpoint with a Local traffic policy, or a source outside loadBalancerSourceRanges"
            }
        };
        let mut out = String::new();
        for (name, series) in &self.families.0 {
            let _ = writeln!(out, "# HELP {name} [ALPHA] {}", help(name));
            let _ = writeln!(out, "# TYPE {name} counter");
            for (labels, v) in series {
                let l: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let _ = writeln!(out, "{name}{{{}}} {v}", l.join(","));
            }
        }
        out
    }

    /// `GET /api/v1/counters`: per Service, its new connections, rejects
    /// and drops (all ports and families together); with `service`
    /// (`namespace/name`), every series of that Service.
    pub fn json(&self, service: Option<(&str, &str)>) -> Json {
        let label = |l: &Labels, k: &str| {
            l.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if let Some((ns, name)) = service {
            let mut series = Vec::new();
            for (family, s) in &self.families.0 {
                for (labels, v) in s {
                    if label(labels, "namespace") == ns && label(labels, "service") == name {
                        let mut doc = serde_json::Map::new();
                        doc.insert("metric".into(), json!(family));
                        for (k, val) in labels {
                            doc.insert((*k).into(), json!(val));
                        }
                        doc.insert("value".into(), json!(v));
                        series.push(Json::Object(doc));
                    }
                }
            }
            return json!({"service": format!("{ns}/{name}"), "series": series});
        }
        let mut totals: BTreeMap<String, [u64; 5]> = BTreeMap::new();
        for (family, s) in &self.families.0 {
            let slot = match *family {
                SERVICE_CONNECTIONS => 0,
                SERVICE_REJECTED => 1,
                SERVICE_DROPPED => 2,
                SERVICE_PACKETS => 3,
                SERVICE_BYTES => 4,
                _ => continue,
            };
            for (labels, v) in s {
                let key = format!(
                    "{}/{}",
                    label(labels, "namespace"),
                    label(labels, "service")
                );
                totals.entry(key).or_default()[slot] += v;
            }
        }
        let services: serde_json::Map<String, Json> = totals
            .into_iter()
            .map(|(k, [c, r, d, packets, bytes])| {
                let doc = json!({"connections": c, "rejected": r, "dropped": d,
                                 "packets": packets, "bytes": bytes});
                (k, doc)
            })
            .collect();
        json!({"services": services})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
    use verdict_model::IpFamily;
    use verdict_nft::{Counter, Family, MemoryBackend};
    use verdict_proxier::{LocalDetector, Proxier, ProxierConfig};

    #[test]
    fn element_counters_become_per_service_and_per_endpoint_series() {
        let mut c = ProxierConfig::new(IpFamily::V4, "n");
        c.local_detector = LocalDetector::Cidr("10.0.0.0/8".parse().unwrap());
        let mut p = Proxier::new(c).unwrap();
        let lb = svc("ns", "web")
            .cluster_ip("172.30.0.41")
            .port("http", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&["203.0.113.0/25"]);
        p.on_service(None, Some(&lb));
        p.on_service(
            None,
            Some(
                &svc("ns", "empty")
                    .cluster_ip("172.30.0.43")
                    .port("http", TCP, 80, 0),
            ),
        );
        p.on_endpoint_slice(
            &slice("ns", "web", "w")
                .port("http", TCP, 80)
                .ep("10.180.0.1", "n")
                .ep("10.180.0.2", "m"),
            false,
        );
        let mut nft = MemoryBackend::new();
        p.sync(&mut nft, Instant::now()).unwrap();
        let mut t = nft.get(Family::Ip, "verdict").unwrap().clone();
        // What the kernel would have counted: 7 connections to the
        // ClusterIP, 3 to the VIP (plus 2 the source ranges dropped), 4
        // and 6 per endpoint, 5 rejects.
        let mut count = |set: &str, key: Vec<Value>, n: u64| {
            let s = t.sets.get_mut(set).unwrap();
            assert!(s.elements.contains_key(&key), "{set}: {key:?}");
            s.counters.insert(
                key,
                Counter {
                    packets: n,
                    bytes: 60 * n,
                },
            );
        };
        let a = |s: &str| Value::Addr(s.parse().unwrap());
        let tcp = Value::Proto(verdict_nft::L4Proto::Tcp);
        count(
            layout::SERVICE_IPS,
            vec![a("172.30.0.41"), tcp, Value::Port(80)],
            7,
        );
        count(
            layout::SERVICE_IPS,
            vec![a("5.6.7.8"), tcp, Value::Port(80)],
            3,
        );
        count(
            layout::FIREWALL_IPS,
            vec![a("5.6.7.8"), tcp, Value::Port(80)],
            5,
        );
        for (entry, slot, n) in [
            ("172.30.0.41", 0, 4),
            ("172.30.0.41", 1, 3),
            ("5.6.7.8", 1, 3),
        ] {
            count(
                layout::SERVICE_ENDPOINTS_TCP,
                vec![a(entry), Value::Port(80), Value::Int(slot)],
                n,
            );
        }
        count(
            layout::NO_ENDPOINT_SERVICES,
            vec![a("172.30.0.43"), tcp, Value::Port(80)],
            5,
        );
        // Every packet of those connections, both ways: 60 bytes each.
        for (entry, ep, n) in [
            ("172.30.0.41", "10.180.0.1", 40),
            ("172.30.0.41", "10.180.0.2", 30),
            ("5.6.7.8", "10.180.0.2", 20),
        ] {
            count(
                layout::SERVICE_TRAFFIC,
                vec![a(entry), tcp, Value::Port(80), a(ep), Value::Port(80)],
                n,
            );
        }
        // Rejected at a port no Service has, dropped at an unallocated
        // address: the node's, not a Service's.
        let check = t.chains.get_mut(layout::CLUSTER_IPS_CHECK).unwrap();
        let at = |comment: &str| {
            check
                .rules
                .iter()
                .position(|r| r.comment.as_deref() == Some(comment))
        };
        let reject = at(layout::INVALID_PORT_COMMENT).expect("the invalid-port rule");
        assert!(
            check.rules[reject]
                .exprs
                .contains(&verdict_nft::Expr::Counter)
        );
        check.counters.insert(
            reject,
            Counter {
                packets: 9,
                bytes: 540,
            },
        );
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        let text = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))]).exposition();
        assert!(
            text.lines()
                .any(|l| l == "verdict_cluster_ip_rejected_total{ip_family=\"IPv4\"} 9"),
            "{text}"
        );
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        let base = "ip_family=\"IPv4\",namespace=\"ns\",service=\"web\",port=\"http\"";
        has(&format!(
            "verdict_service_connections_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}} 7"
        ));
        has(&format!(
            "verdict_service_connections_total{{{base},entry=\"LoadBalancer\",address=\"5.6.7.8\"}} 3"
        ));
        has(&format!(
            "verdict_endpoint_connections_total{{{base},endpoint=\"10.180.0.1:80\"}} 4"
        ));
        has(&format!(
            "verdict_endpoint_connections_total{{{base},endpoint=\"10.180.0.2:80\"}} 6"
        ));
        has(&format!(
            "verdict_service_dropped_total{{{base},reason=\"source-ranges\"}} 2"
        ));
        has(
            "verdict_service_rejected_total{ip_family=\"IPv4\",namespace=\"ns\",service=\"empty\",port=\"http\"} 5",
        );
        has(&format!(
            "verdict_service_packets_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}} 70"
        ));
        has(&format!(
            "verdict_service_bytes_total{{{base},entry=\"LoadBalancer\",address=\"5.6.7.8\"}} 1200"
        ));
        has(&format!(
            "verdict_endpoint_packets_total{{{base},endpoint=\"10.180.0.2:80\"}} 50"
        ));
        has(&format!(
            "verdict_endpoint_bytes_total{{{base},endpoint=\"10.180.0.1:80\"}} 2400"
        ));
        assert!(text.contains("# TYPE verdict_service_connections_total counter"));
        assert_eq!(
            Snapshot::of(&handle, &[(IpFamily::V4, None)]).exposition(),
            "",
            "no table, no series"
        );
        let snap = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))]);
        let all = snap.json(None);
        assert_eq!(all["services"]["ns/web"]["connections"], 10);
        assert_eq!(all["services"]["ns/web"]["dropped"], 2);
        assert_eq!(all["services"]["ns/web"]["packets"], 90);
        assert_eq!(all["services"]["ns/web"]["bytes"], 5400);
        assert_eq!(all["services"]["ns/empty"]["rejected"], 5);
        let one = snap.json(Some(("ns", "web")));
        let series = one["series"].as_array().unwrap();
        assert!(series.iter().any(|s| s["metric"] == ENDPOINT_CONNECTIONS
            && s["endpoint"] == "10.180.0.2:80"
            && s["value"] == 6));
        assert!(series.iter().all(|s| s["service"] == "web"));

        // A NodePort's traffic is keyed by the node's address and the
        // NodePort.
        let (_, web) = p
            .service_ports()
            .iter()
            .find(|(k, _)| k.service.name.as_str() == "web")
            .unwrap();
        let mut np = web.clone();
        std::sync::Arc::make_mut(&mut np).node_port = Some(30080);
        let node: IpAddr = "192.168.0.2".parse().unwrap();
        assert_eq!(traffic_entry(Some(&*np), node, 30080), "NodePort");
        assert_eq!(traffic_entry(Some(&*np), np.cluster_ip, 80), "ClusterIP");
        assert_eq!(traffic_entry(Some(&*np), node, 80), "unknown");
    }
}
