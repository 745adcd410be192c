//! What the kernel counted, for `/metrics` and the API
//! (`--service-counters`, on by default).
//!
//! **For the node** (a handful of series, whatever the cluster's size):
//! rule counters of the fixed chains. `nat-postrouting` and `nat-input`
//! see the first packet of each connection after DNAT, one or the other,
//! so their `ct status dnat counter` counts the connections sent to an
//! endpoint. Every reject and drop of a new connection goes through a
//! chain that remembers the connection for 3 minutes in a set of its
//! reason (`rejected-connections`, `dropped-source-range`, …), longer than
//! a client retries its SYN: each connection counts once, however often it
//! is retried.
//!
//! **Per Service**, only for the Services `--service-metrics` chooses:
//! `service-connections` (per entry point), `endpoint-connections` (per
//! entry point and endpoint, keyed by the endpoint, so a count survives a
//! change to its siblings) and `service-traffic` (the packets and bytes of
//! every packet of their connections) hold elements for those alone. The
//! problem sets name every rejected or dropped connection with its
//! destination: they are read (at least every 30 s, less than their
//! timeout) and attributed to Service ports here, for every Service, so
//! the API and the web view show what went wrong where, and the chosen
//! Services get `verdict_service_rejected_total` and
//! `verdict_service_dropped_total` series.
//!
//! A kernel counter starts again from zero when its rule or element is
//! written again (a repaired table, a re-created Service); every series
//! here is kept monotonic across that: what a counter had counted before
//! it went back is carried over.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use verdict_model::{Counting, IpFamily, NamespacedName, Protocol, ServicePort, ServicePortName};
use verdict_nft::{Counter, L4Proto, TableState, Value};
use verdict_proxier::layout;

use crate::inspect::answers::{
    ExplainAnswer, OtherPort, PortCounts, ProblemCount, Proto, RefusalReason, ServicesPage,
    TableFamily,
};
use crate::view::{NodeHandle, ServiceView};

/// The port of `view` an answer names by its name and protocol.
fn answered_port<'v>(
    view: &'v ServiceView,
    family: IpFamily,
    port: &str,
    protocol: Proto,
) -> Option<&'v crate::view::PortView> {
    let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .find(|p| Proto::from(*p) == protocol)?;
    let name = ServicePortName {
        service: view.name.clone(),
        port: port.into(),
        protocol,
    };
    view.port(family, &name)
}

/// The IP family of an nftables family.
fn family_of(nft: TableFamily) -> Option<IpFamily> {
    Some(match nft {
        TableFamily::Ip => IpFamily::V4,
        TableFamily::Ip6 => IpFamily::V6,
    })
}

/// A Service port's refusals for one reason, as the answers give them.
fn problem_count(reason: &str, p: &Problem) -> Option<ProblemCount> {
    let reason = RefusalReason::parse(reason)?;
    let (verdict, what) = reason.words();
    Some(ProblemCount {
        reason,
        verdict,
        what: what.to_owned(),
        connections: p.connections,
        recent_clients: p.recent_clients.clone(),
    })
}

/// Connections sent to an endpoint, for the node.
pub const CONNECTIONS: &str = "verdict_connections_total";
/// Connections rejected, for the node, by reason.
pub const REJECTED: &str = "verdict_rejected_total";
/// Connections dropped, for the node, by reason.
pub const DROPPED: &str = "verdict_dropped_total";
/// Connections sent to an endpoint, per chosen Service port and entry point.
pub const SERVICE_CONNECTIONS: &str = "verdict_service_connections_total";
/// Connections sent to each endpoint of a Service port counted per endpoint.
pub const ENDPOINT_CONNECTIONS: &str = "verdict_endpoint_connections_total";
/// Connections rejected because the Service port has no usable endpoint.
pub const SERVICE_REJECTED: &str = "verdict_service_rejected_total";
/// Connections to a Service port dropped, by reason.
pub const SERVICE_DROPPED: &str = "verdict_service_dropped_total";
/// Packets of a Service port's connections, both ways, per entry point.
pub const SERVICE_PACKETS: &str = "verdict_service_packets_total";
/// Their bytes.
pub const SERVICE_BYTES: &str = "verdict_service_bytes_total";
/// Packets of the connections sent to an endpoint, both ways.
pub const ENDPOINT_PACKETS: &str = "verdict_endpoint_packets_total";
/// Their bytes.
pub const ENDPOINT_BYTES: &str = "verdict_endpoint_bytes_total";

/// The sets a counter reading needs besides the table's chains: the
/// counted Services' sets and the problem sets.
pub const READ_SETS: [&str; 8] = [
    layout::SERVICE_CONNECTIONS,
    layout::ENDPOINT_CONNECTIONS,
    layout::SERVICE_TRAFFIC,
    layout::REJECTED_CONNECTIONS,
    layout::DROPPED_SOURCE_RANGE,
    layout::DROPPED_NO_LOCAL_ENDPOINT,
    layout::DROPPED_UNALLOCATED,
    layout::REJECTED_INVALID_PORT,
];

/// The sets of [`READ_SETS`] whose counters are read, not their elements.
pub const COUNTED_SETS: [&str; 3] = [
    layout::SERVICE_CONNECTIONS,
    layout::ENDPOINT_CONNECTIONS,
    layout::SERVICE_TRAFFIC,
];

/// Recent connections kept per Service port and reason, for the API.
const RECENT: usize = 5;
/// Ports a Service does not have that are counted apart, per Service,
/// family and protocol; connections to any further one are counted
/// under [`OTHER_PORTS`] (a port scan costs ten entries, not 65,535).
const INVALID_PORTS_KEPT: usize = 8;
/// The port name under which [`INVALID_PORTS_KEPT`] is exceeded.
pub const OTHER_PORTS: &str = "other";

/// The name under which connections to port `port` of a Service's
/// ClusterIP, which the Service does not have, are counted: the number
/// itself, which no port name can be (a port name holds a letter).
fn invalid_port_name(service: &NamespacedName, port: u16, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        service: service.clone(),
        port: port.to_string().as_str().into(),
        protocol,
    }
}

/// Whether `name` stands for ports its Service does not have (see
/// [`invalid_port_name`]).
pub fn is_invalid_port(name: &ServicePortName) -> bool {
    let p = name.port.as_str();
    p == OTHER_PORTS || (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

type Labels = Vec<(&'static str, String)>;

fn family_label(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

fn port_labels(family: IpFamily, port: &ServicePortName) -> Labels {
    vec![
        ("ip_family", family_label(family).to_owned()),
        ("namespace", port.service.namespace.to_string()),
        ("service", port.service.name.to_string()),
        ("port", port.port.to_string()),
    ]
}

fn protocol_of(p: L4Proto) -> Protocol {
    match p {
        L4Proto::Tcp => Protocol::Tcp,
        L4Proto::Udp => Protocol::Udp,
        L4Proto::Sctp => Protocol::Sctp,
    }
}

/// The Service port an entry point (address . protocol . port) belongs
/// to, with the kind of entry, from the read model's indexes: a Service
/// address first, else a NodePort on a node address.
pub fn entry_owner(
    node: &NodeHandle,
    family: IpFamily,
    addr: IpAddr,
    proto: L4Proto,
    port: u16,
) -> Option<(Arc<ServicePort>, &'static str)> {
    let protocol = protocol_of(proto);
    let in_family = |v: &ServiceView| -> Vec<Arc<ServicePort>> {
        v.family(family)
            .map(|f| f.ports.iter().map(|p| p.port.clone()).collect())
            .unwrap_or_default()
    };
    for v in node.services_at(addr) {
        for sp in in_family(&v) {
            if sp.protocol != protocol || sp.port != port {
                continue;
            }
            let kind = if sp.cluster_ip == addr {
                "ClusterIP"
            } else if sp.load_balancer_vips.contains(&addr) {
                "LoadBalancer"
            } else if sp.external_ips.contains(&addr) {
                "ExternalIP"
            } else {
                continue;
            };
            return Some((sp, kind));
        }
    }
    for v in node.services_at_node_port(family, port) {
        for sp in in_family(&v) {
            if sp.protocol == protocol && sp.node_port == Some(port) {
                return Some((sp, "NodePort"));
            }
        }
    }
    None
}

/// Where a raw kernel count came from: its family and its set or chain
/// (then the element's key or the rule's place).
type Place = (IpFamily, &'static str);

/// What is carried over for one counter.
#[derive(Clone, Debug, Default)]
struct Carried {
    /// The raw packets and bytes last read.
    raw: (u64, u64),
    /// What the counter had counted before it was last written again.
    offset: (u64, u64),
    /// The reading that last saw it.
    reading: u64,
    /// The entry point whose total it is part of (a `service-traffic`
    /// element): when it goes (its endpoint is removed), what it counted
    /// stays in that total.
    owner: Option<EntryKey>,
}

/// Keeps every count monotonic: a raw count lower than the last one read
/// from the same place means the rule or element was written again, and
/// what it had before is carried over. A reading looks every counter up
/// by the key it read, without copying it; only a new counter's key is
/// kept.
#[derive(Debug, Default)]
struct Monotonic {
    last: HashMap<Place, HashMap<Vec<Value>, Carried>>,
    reading: u64,
}

impl Monotonic {
    /// Starts a reading: what it does not read is forgotten at its end.
    fn begin(&mut self) {
        self.reading += 1;
    }

    /// The monotonic (packets, bytes) of `c`, read at `key` of `place`.
    fn read(&mut self, place: Place, key: &[Value], c: Counter) -> (u64, u64) {
        self.read_for(place, key, c, None)
    }

    /// [`read`](Self::read), for a counter that is part of `owner`'s
    /// total.
    fn read_for(
        &mut self,
        place: Place,
        key: &[Value],
        c: Counter,
        owner: Option<EntryKey>,
    ) -> (u64, u64) {
        let at = self.last.entry(place).or_default();
        if !at.contains_key(key) {
            at.insert(key.to_vec(), Carried::default());
        }
        let Some(e) = at.get_mut(key) else {
            return (c.packets, c.bytes);
        };
        if c.packets < e.raw.0 || c.bytes < e.raw.1 {
            e.offset = (e.offset.0 + e.raw.0, e.offset.1 + e.raw.1);
        }
        e.raw = (c.packets, c.bytes);
        e.reading = self.reading;
        if owner.is_some() && e.owner != owner {
            e.owner = owner;
        }
        (e.offset.0 + c.packets, e.offset.1 + c.bytes)
    }

    /// Forgets the counters of the families `read` that the reading did
    /// not see (those of a table that could not be read are kept as they
    /// were), handing what those with an owner had counted to `retired`.
    fn forget_others(&mut self, read: &[IpFamily], retired: &mut HashMap<EntryKey, (u64, u64)>) {
        let reading = self.reading;
        for ((family, _), at) in self.last.iter_mut() {
            if !read.contains(family) {
                continue;
            }
            at.retain(|_, e| {
                if e.reading == reading {
                    return true;
                }
                if let Some(owner) = e.owner.take() {
                    let r = retired.entry(owner).or_default();
                    r.0 += e.offset.0 + e.raw.0;
                    r.1 += e.offset.1 + e.raw.1;
                }
                false
            });
        }
        self.last.retain(|_, at| !at.is_empty());
    }
}

/// Rejected and dropped connections, per Service port and reason, since
/// verdict started, from the problem sets.
#[derive(Debug, Default)]
struct Problems {
    /// The connections in the sets at the last reading, per set.
    present: HashMap<(IpFamily, &'static str), BTreeSet<Vec<Value>>>,
    /// Counted so far, per Service port and reason.
    counts: BTreeMap<(IpFamily, ServicePortName, &'static str), Problem>,
}

/// One Service port's rejects or drops for one reason.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Problem {
    /// Connections, each counted once.
    pub connections: u64,
    /// The last few clients (address:port), newest last.
    pub recent_clients: Vec<String>,
}

impl Problems {
    /// Counts the connections of `set` (one family) not there at the last
    /// reading.
    fn read(
        &mut self,
        node: &NodeHandle,
        family: IpFamily,
        set: &'static str,
        reason: &'static str,
        keys: BTreeSet<Vec<Value>>,
    ) {
        let before = self.present.remove(&(family, set)).unwrap_or_default();
        for key in keys.difference(&before) {
            let [
                Value::Addr(client),
                Value::Addr(dst),
                Value::Proto(proto),
                Value::Port(sport),
                Value::Port(dport),
            ] = key.as_slice()
            else {
                continue;
            };
            let name = if reason == "invalid_port" {
                // The Service whose ClusterIP it is, on the port asked for.
                let Some(view) = node.services_at(*dst).into_iter().find(|v| {
                    v.family(family)
                        .is_some_and(|f| f.ports.iter().any(|p| p.port.cluster_ip == *dst))
                }) else {
                    continue;
                };
                let mut name = invalid_port_name(&view.name, *dport, protocol_of(*proto));
                let key = (family, name.clone(), reason);
                if !self.counts.contains_key(&key) {
                    let kept = self
                        .counts
                        .keys()
                        .filter(|(f, n, r)| {
                            *f == family
                                && *r == reason
                                && n.service == name.service
                                && n.protocol == name.protocol
                                && n.port.as_str() != OTHER_PORTS
                        })
                        .count();
                    if kept >= INVALID_PORTS_KEPT {
                        name.port = OTHER_PORTS.into();
                    }
                }
                name
            } else {
                let Some((sp, _)) = entry_owner(node, family, *dst, *proto, *dport) else {
                    continue;
                };
                sp.name.clone()
            };
            let p = self.counts.entry((family, name, reason)).or_default();
            p.connections += 1;
            p.recent_clients.push(super::show_addr(*client, *sport));
            if p.recent_clients.len() > RECENT {
                p.recent_clients.remove(0);
            }
        }
        self.present.insert((family, set), keys);
    }

    /// Forgets the Service ports that are gone (the ports a Service does
    /// not have, with the Service).
    fn forget_gone(&mut self, node: &NodeHandle) {
        self.counts.retain(|(family, name, reason), _| {
            node.service(&name.service).is_some_and(|v| {
                if *reason == "invalid_port" {
                    v.family(*family).is_some()
                } else {
                    v.port(*family, name).is_some()
                }
            })
        });
    }
}

/// What the counters reader keeps between readings.
#[derive(Debug, Default)]
pub struct Counted {
    monotonic: Monotonic,
    problems: Problems,
    /// The packets and bytes of the `service-traffic` elements that are
    /// gone (their endpoint was removed), per entry point: still part of
    /// its total, which never goes down while the entry point exists.
    retired: HashMap<EntryKey, (u64, u64)>,
}

/// Whether the entry point `key` is still one of its Service port's, and
/// the port counted.
fn entry_exists(node: &NodeHandle, key: &EntryKey) -> bool {
    let (family, name, kind, addr) = key;
    let Some(view) = node.service(&name.service) else {
        return false;
    };
    let Some(port) = view.port(*family, name) else {
        return false;
    };
    let sp = &port.port;
    sp.counting != Counting::None
        && match *kind {
            "ClusterIP" => sp.cluster_ip == *addr,
            "ExternalIP" => sp.external_ips.contains(addr),
            "LoadBalancer" => sp.load_balancer_vips.contains(addr),
            "NodePort" => sp.node_port.is_some(),
            _ => false,
        }
}

#[derive(Default)]
struct Families(BTreeMap<&'static str, BTreeMap<Labels, u64>>);

impl Families {
    fn add(&mut self, name: &'static str, labels: Labels, n: u64) {
        *self.0.entry(name).or_default().entry(labels).or_default() += n;
    }
}

/// Connections, packets and bytes of one Service port or endpoint.
type Tally = [u64; 3];

/// A chosen Service port's entry point: the port, the kind of entry
/// (`ClusterIP`, …) and its address.
type EntryKey = (IpFamily, ServicePortName, &'static str, IpAddr);
/// An endpoint of a chosen Service port: its address and port.
type EndpointKey = (IpFamily, ServicePortName, IpAddr, u16);

/// What was counted at one entry point or endpoint: its connections if
/// its set has it, its packets and bytes if `service-traffic` has it.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    connections: Option<u64>,
    traffic: Option<(u64, u64)>,
}

impl Counts {
    fn add_connections(&mut self, n: u64) {
        *self.connections.get_or_insert(0) += n;
    }

    fn add_traffic(&mut self, packets: u64, bytes: u64) {
        let t = self.traffic.get_or_insert((0, 0));
        t.0 += packets;
        t.1 += bytes;
    }
}

/// Every series of a reading. The chosen Services' (as many as
/// `--service-metrics` asks for) are kept as typed keys, whose names are
/// shared with the read model, and labelled only as they are written:
/// 270,000 series cost their counts, not 270,000 label lists.
#[derive(Default)]
struct Series {
    /// The node's series and the chosen ports' rejects and drops.
    labelled: Families,
    entries: BTreeMap<EntryKey, Counts>,
    endpoints: BTreeMap<EndpointKey, Counts>,
    /// New connections rejected or dropped past the log rate limit, by
    /// reason: counted, but not in the flow stream.
    not_logged: BTreeMap<&'static str, u64>,
}

/// A label list, as written.
type LabelRefs<'a> = [(&'static str, &'a str)];

/// One sample's line in Prometheus' text format.
fn write_sample(
    out: &mut dyn std::fmt::Write,
    name: &str,
    labels: &LabelRefs<'_>,
    v: u64,
) -> std::fmt::Result {
    out.write_str(name)?;
    out.write_char('{')?;
    for (i, (k, val)) in labels.iter().enumerate() {
        if i > 0 {
            out.write_char(',')?;
        }
        out.write_str(k)?;
        out.write_str("=\"")?;
        write_escaped(out, val)?;
        out.write_char('"')?;
    }
    writeln!(out, "}} {v}")
}

impl Series {
    /// A chosen Service port's connections, packets and bytes: the sums
    /// over its entry points.
    fn port_tally(&self, family: IpFamily, name: &ServicePortName) -> Tally {
        let from = (family, name.clone(), "", IpAddr::from([0, 0, 0, 0]));
        let mut t = Tally::default();
        for (_, c) in self
            .entries
            .range(from..)
            .take_while(|((f, n, _, _), _)| *f == family && n == name)
        {
            let (packets, bytes) = c.traffic.unwrap_or_default();
            t[0] += c.connections.unwrap_or_default();
            t[1] += packets;
            t[2] += bytes;
        }
        t
    }

    /// Calls `f` with each series of the metric `name`: its labels and
    /// value.
    fn each(
        &self,
        name: &'static str,
        f: &mut dyn FnMut(&LabelRefs<'_>, u64) -> std::fmt::Result,
    ) -> std::fmt::Result {
        for (labels, v) in self.labelled.0.get(name).into_iter().flatten() {
            let refs: Vec<(&'static str, &str)> =
                labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            f(&refs, *v)?;
        }
        let traffic = |c: &Counts| {
            c.traffic.map(|(packets, bytes)| {
                if matches!(name, SERVICE_PACKETS | ENDPOINT_PACKETS) {
                    packets
                } else {
                    bytes
                }
            })
        };
        match name {
            SERVICE_CONNECTIONS | SERVICE_PACKETS | SERVICE_BYTES => {
                for ((family, port, kind, addr), c) in &self.entries {
                    let v = if name == SERVICE_CONNECTIONS {
                        c.connections
                    } else {
                        traffic(c)
                    };
                    let Some(v) = v else { continue };
                    let addr = addr.to_string();
                    let labels = [
                        ("ip_family", family_label(*family)),
                        ("namespace", port.service.namespace.as_str()),
                        ("service", port.service.name.as_str()),
                        ("port", port.port.as_str()),
                        ("entry", kind),
                        ("address", addr.as_str()),
                    ];
                    f(&labels, v)?;
                }
            }
            ENDPOINT_CONNECTIONS | ENDPOINT_PACKETS | ENDPOINT_BYTES => {
                for ((family, port, ep, ep_port), c) in &self.endpoints {
                    let v = if name == ENDPOINT_CONNECTIONS {
                        c.connections
                    } else {
                        traffic(c)
                    };
                    let Some(v) = v else { continue };
                    let endpoint = super::show_addr(*ep, *ep_port);
                    let labels = [
                        ("ip_family", family_label(*family)),
                        ("namespace", port.service.namespace.as_str()),
                        ("service", port.service.name.as_str()),
                        ("port", port.port.as_str()),
                        ("endpoint", endpoint.as_str()),
                    ];
                    f(&labels, v)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Every metric a reading may hold, in the order they are written.
const METRICS: [&str; 11] = [
    CONNECTIONS,
    DROPPED,
    ENDPOINT_BYTES,
    ENDPOINT_CONNECTIONS,
    ENDPOINT_PACKETS,
    REJECTED,
    SERVICE_BYTES,
    SERVICE_CONNECTIONS,
    SERVICE_DROPPED,
    SERVICE_PACKETS,
    SERVICE_REJECTED,
];

/// One reading of every family's counters.
pub struct Snapshot {
    series: Series,
    /// Every Service port with rejects or drops, and what.
    problems: Vec<(IpFamily, ServicePortName, &'static str, Problem)>,
    /// When the kernel was read.
    read_at: SystemTime,
}

impl Default for Snapshot {
    fn default() -> Snapshot {
        Snapshot {
            series: Series::default(),
            problems: Vec::new(),
            read_at: SystemTime::now(),
        }
    }
}

/// The rule counters of `chain`, with the place of each.
fn rule_counters<'t>(
    t: &'t TableState,
    chain: &'static str,
) -> impl Iterator<Item = (usize, &'t verdict_nft::Rule, Counter)> + 't {
    t.chains.get(chain).into_iter().flat_map(|c| {
        c.counters
            .iter()
            .filter_map(|(i, counter)| c.rules.get(*i).map(|r| (*i, r, *counter)))
    })
}

impl Counted {
    /// Reads one family's table (its chains' rules with their counters,
    /// and the sets of [`READ_SETS`] with their elements).
    fn collect(
        &mut self,
        node: &NodeHandle,
        family: IpFamily,
        t: &TableState,
        series: &mut Series,
    ) {
        let out = &mut series.labelled;
        let fam = || vec![("ip_family", family_label(family).to_owned())];
        let mono = &mut self.monotonic;
        // The node's connections: one counter in each NAT chain after DNAT.
        for chain in [layout::NAT_POSTROUTING, layout::NAT_INPUT] {
            for (i, r, c) in rule_counters(t, chain) {
                if r.exprs.first() == Some(&verdict_nft::Expr::CtStatusDnat) {
                    let (n, _) = mono.read((family, chain), &[Value::Int(i as u32)], c);
                    out.add(CONNECTIONS, fam(), n);
                }
            }
        }
        // Rejects and drops: a new connection's counter, and the one
        // counting per packet once the set is full; the one counting the
        // new connections past the log rate limit counts them again, as
        // not logged.
        for (chain, metric, reason) in [
            (layout::REJECT_CHAIN, REJECTED, "no_endpoints"),
            (layout::REJECT_INVALID_PORT, REJECTED, "invalid_port"),
            (layout::DROP_SOURCE_RANGE, DROPPED, "source_range"),
            (layout::DROP_NO_LOCAL_ENDPOINT, DROPPED, "no_local_endpoint"),
            (layout::DROP_UNALLOCATED, DROPPED, "unallocated_cluster_ip"),
        ] {
            let mut l = fam();
            l.push(("reason", reason.to_owned()));
            out.add(metric, l.clone(), 0);
            for (i, r, c) in rule_counters(t, chain) {
                let (n, _) = mono.read((family, chain), &[Value::Int(i as u32)], c);
                if r.comment.as_deref() == Some(layout::NOT_LOGGED_COMMENT) {
                    *series.not_logged.entry(reason).or_default() += n;
                } else {
                    out.add(metric, l.clone(), n);
                }
            }
        }
        // The chosen Services' elements.
        let counters = |set: &str| t.sets.get(set).map(|s| &s.counters).into_iter().flatten();
        for (key, c) in counters(layout::SERVICE_CONNECTIONS) {
            let [Value::Addr(a), Value::Proto(p), Value::Port(port)] = &key[..] else {
                continue;
            };
            let Some((sp, kind)) = entry_owner(node, family, *a, *p, *port) else {
                continue;
            };
            let (n, _) = mono.read((family, layout::SERVICE_CONNECTIONS), key, *c);
            series
                .entries
                .entry((family, sp.name.clone(), kind, *a))
                .or_default()
                .add_connections(n);
        }
        for set in [layout::ENDPOINT_CONNECTIONS, layout::SERVICE_TRAFFIC] {
            for (key, c) in counters(set) {
                let [
                    Value::Addr(a),
                    Value::Proto(p),
                    Value::Port(port),
                    Value::Addr(ep),
                    Value::Port(ep_port),
                ] = &key[..]
                else {
                    continue;
                };
                let Some((sp, kind)) = entry_owner(node, family, *a, *p, *port) else {
                    continue;
                };
                let entry = (family, sp.name.clone(), kind, *a);
                let owner = (set == layout::SERVICE_TRAFFIC).then(|| entry.clone());
                let (packets, bytes) = mono.read_for((family, set), key, *c, owner);
                let at_endpoint = (family, sp.name.clone(), *ep, *ep_port);
                if set == layout::ENDPOINT_CONNECTIONS {
                    series
                        .endpoints
                        .entry(at_endpoint)
                        .or_default()
                        .add_connections(packets);
                    continue;
                }
                series
                    .entries
                    .entry(entry)
                    .or_default()
                    .add_traffic(packets, bytes);
                if sp.counting == Counting::Endpoint {
                    series
                        .endpoints
                        .entry(at_endpoint)
                        .or_default()
                        .add_traffic(packets, bytes);
                }
            }
        }
        // Rejected and dropped connections, for every Service.
        for (set, reason) in layout::PROBLEMS {
            let keys = t
                .sets
                .get(set)
                .map(|s| s.elements.keys().map(|k| k.to_vec()).collect())
                .unwrap_or_default();
            self.problems.read(node, family, set, reason, keys);
        }
    }
}

impl Snapshot {
    /// Reads the counters of each family's table (`None`: not read; its
    /// problem sets are kept as they were), attributed to the Services of
    /// the read model, carrying `state` over from the last reading.
    pub fn of(
        handle: &NodeHandle,
        tables: &[(IpFamily, Option<&TableState>)],
        state: &mut Counted,
    ) -> Snapshot {
        let read_at = SystemTime::now();
        let mut series = Series::default();
        state.monotonic.begin();
        for (f, t) in tables {
            if let Some(t) = t {
                state.collect(handle, *f, t, &mut series);
            }
        }
        let read: Vec<IpFamily> = tables
            .iter()
            .filter(|(_, t)| t.is_some())
            .map(|(f, _)| *f)
            .collect();
        state.monotonic.forget_others(&read, &mut state.retired);
        state.retired.retain(|key, _| entry_exists(handle, key));
        for (key, (packets, bytes)) in &state.retired {
            if !read.contains(&key.0) {
                continue;
            }
            series
                .entries
                .entry(key.clone())
                .or_default()
                .add_traffic(*packets, *bytes);
        }
        state.problems.forget_gone(handle);
        let mut problems = Vec::new();
        for ((family, name, reason), p) in &state.problems.counts {
            problems.push((*family, name.clone(), *reason, p.clone()));
            // A port the Service does not have is counted as the
            // Service is.
            let counted = handle
                .service(&name.service)
                .and_then(|v| match v.port(*family, name) {
                    Some(x) => Some(x.port.counting),
                    None => v
                        .family(*family)?
                        .ports
                        .iter()
                        .map(|p| p.port.counting)
                        .max(),
                })
                .unwrap_or(Counting::None);
            if counted == Counting::None {
                continue;
            }
            let mut l = port_labels(*family, name);
            if matches!(*reason, "no_endpoints" | "invalid_port") {
                l.push(("reason", (*reason).to_owned()));
                series.labelled.add(SERVICE_REJECTED, l, p.connections);
            } else {
                l.push(("reason", (*reason).to_owned()));
                series.labelled.add(SERVICE_DROPPED, l, p.connections);
            }
        }
        Snapshot {
            series,
            problems,
            read_at,
        }
    }

    /// When the kernel was read, in Unix seconds.
    pub fn counted_at(&self) -> f64 {
        self.read_at
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default()
    }

    /// What was counted for one Service port, counted at `level`.
    pub fn port_counts(
        &self,
        family: IpFamily,
        name: &ServicePortName,
        level: Counting,
    ) -> PortCounts {
        let tally = (level != Counting::None).then(|| self.series.port_tally(family, name));
        let problems = self
            .problems
            .iter()
            .filter(|(f, n, _, _)| *f == family && n == name)
            .filter_map(|(_, _, reason, p)| problem_count(reason, p))
            .collect();
        PortCounts {
            level: level.into(),
            connections: tally.map(|t| t[0]),
            packets: tally.map(|t| t[1]),
            bytes: tally.map(|t| t[2]),
            problems,
        }
    }

    /// Puts the counts into a page of the Service list.
    pub fn annotate_page(&self, handle: &NodeHandle, page: &mut ServicesPage) {
        page.counted_at = Some(self.counted_at());
        for item in &mut page.items {
            let Some(view) = handle.service(&NamespacedName::new(&item.namespace, &item.name))
            else {
                continue;
            };
            item.other_ports = self.other_ports(&view.name);
            for p in &mut item.ports {
                let Some(family) = family_of(p.family) else {
                    continue;
                };
                if let Some(port) = answered_port(&view, family, &p.port, p.protocol) {
                    p.counts = Some(self.port_counts(family, &port.name, port.port.counting));
                }
            }
        }
    }

    /// Puts the counts into an `explain` answer: per port, and per
    /// endpoint when its Service is counted at `endpoint`.
    pub fn annotate_explain(&self, handle: &NodeHandle, doc: &mut ExplainAnswer) {
        doc.counted_at = Some(self.counted_at());
        let Some(view) = handle.service(&NamespacedName::new(&doc.namespace, &doc.name)) else {
            return;
        };
        doc.other_ports = self.other_ports(&view.name);
        for fam in &mut doc.families {
            let Some(family) = family_of(fam.family) else {
                continue;
            };
            for p in &mut fam.ports {
                let Some(port) = answered_port(&view, family, &p.port, p.protocol) else {
                    continue;
                };
                let Some(detail) = p.detail.as_mut() else {
                    continue;
                };
                let level = port.port.counting;
                detail.counts = Some(self.port_counts(family, &port.name, level));
                if level != Counting::Endpoint {
                    continue;
                }
                for ep in &mut detail.endpoints {
                    let counted = ep
                        .address
                        .parse::<std::net::SocketAddr>()
                        .ok()
                        .and_then(|at| {
                            self.series.endpoints.get(&(
                                family,
                                port.name.clone(),
                                at.ip(),
                                at.port(),
                            ))
                        })
                        .copied()
                        .unwrap_or_default();
                    let (packets, bytes) = counted.traffic.unwrap_or_default();
                    ep.connections = Some(counted.connections.unwrap_or_default());
                    ep.packets = Some(packets);
                    ep.bytes = Some(bytes);
                }
            }
        }
    }

    /// The ports of `service`'s ClusterIPs it does not have that clients
    /// asked for, with the connections rejected.
    pub fn other_ports(&self, service: &NamespacedName) -> Vec<OtherPort> {
        self.problems
            .iter()
            .filter(|(_, n, _, _)| n.service == *service && is_invalid_port(n))
            .filter_map(|(family, name, reason, p)| {
                Some(OtherPort {
                    family: (*family).into(),
                    port: name.port.to_string(),
                    protocol: name.protocol.into(),
                    problem: problem_count(reason, p)?,
                })
            })
            .collect()
    }

    /// New connections rejected or dropped past the log rate limit, all
    /// reasons and families: counted, and not in the flow stream.
    pub fn not_logged(&self) -> u64 {
        self.series.not_logged.values().sum()
    }

    /// The Service ports with rejects or drops, the most first.
    pub fn problem_ports(&self) -> Vec<(IpFamily, ServicePortName)> {
        let mut by: BTreeMap<(IpFamily, ServicePortName), u64> = BTreeMap::new();
        for (f, n, _, p) in &self.problems {
            *by.entry((*f, n.clone())).or_default() += p.connections;
        }
        let mut out: Vec<_> = by.into_iter().filter(|(_, n)| *n > 0).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out.into_iter().map(|(k, _)| k).collect()
    }

    /// How many series the exposition holds.
    pub fn series(&self) -> usize {
        let mut n = 0;
        for name in METRICS {
            let _ = self.series.each(name, &mut |_, _| {
                n += 1;
                Ok(())
            });
        }
        n
    }

    /// The counters in Prometheus' text format, written to `out`.
    pub fn write(&self, out: &mut dyn std::fmt::Write) -> std::fmt::Result {
        let help = |name: &str| match name {
            CONNECTIONS => {
                "New connections sent to an endpoint of a Service, counted by the kernel"
            }
            REJECTED => {
                "New connections rejected, by reason (no_endpoints: the Service has no usable endpoint; invalid_port: a ClusterIP on a port no Service has), each once"
            }
            DROPPED => {
                "New connections dropped, by reason (source_range: outside loadBalancerSourceRanges; no_local_endpoint: a Local traffic policy and no local endpoint; unallocated_cluster_ip), each once however often it is retried"
            }
            SERVICE_CONNECTIONS => {
                "New connections of a Service port sent to an endpoint, per entry point (ClusterIP, ExternalIP, LoadBalancer, NodePort), counted by the kernel"
            }
            ENDPOINT_CONNECTIONS => {
                "New connections sent to an endpoint of a Service port, counted by the kernel"
            }
            SERVICE_REJECTED => {
                "New connections to a Service rejected, by reason (no_endpoints: the port has no usable endpoint; invalid_port: its ClusterIP on a port it does not have, the port label then the number asked for, or other past eight of them), each once"
            }
            SERVICE_DROPPED => {
                "New connections to a Service port dropped, by reason, each once however often it is retried"
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
            _ => {
                "Bytes of the connections sent to an endpoint of a Service port, both directions, counted by the kernel"
            }
        };
        for name in METRICS {
            let mut first = true;
            self.series.each(name, &mut |labels, v| {
                if first {
                    writeln!(out, "# HELP {name} [ALPHA] {}", help(name))?;
                    writeln!(out, "# TYPE {name} counter")?;
                    first = false;
                }
                write_sample(out, name, labels, v)
            })?;
        }
        Ok(())
    }

    /// The counters in Prometheus' text format.
    pub fn exposition(&self) -> String {
        let mut out = String::new();
        let _ = self.write(&mut out);
        out
    }

    /// `GET /api/v1/counters`: the node's totals, per Service its
    /// connections, packets and bytes (the Services counted), rejects and
    /// drops (every Service that had any), and the problems; with
    /// `service` (`namespace/name`), that Service's series and problems.
    pub fn answer(&self, service: Option<&NamespacedName>) -> CountersAnswer {
        let label = |l: &LabelRefs<'_>, k: &str| {
            l.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
                .unwrap_or_default()
        };
        let problems: Vec<CountedProblem> = self
            .problems
            .iter()
            .filter(|(_, name, _, _)| service.is_none_or(|s| name.service == *s))
            .map(|(family, name, reason, p)| CountedProblem {
                ip_family: family_label(*family).to_owned(),
                service: name.service.to_string(),
                port: name.port.to_string(),
                reason: (*reason).to_owned(),
                connections: p.connections,
                recent_clients: p.recent_clients.clone(),
            })
            .collect();
        if let Some(svc) = service {
            let (ns, name) = (svc.namespace.as_str(), svc.name.as_str());
            let mut series = Vec::new();
            for metric in METRICS {
                let _ = self.series.each(metric, &mut |labels, v| {
                    if label(labels, "namespace") == ns && label(labels, "service") == name {
                        series.push(Sample {
                            metric: metric.to_owned(),
                            labels: labels
                                .iter()
                                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                                .collect(),
                            value: v,
                        });
                    }
                    Ok(())
                });
            }
            return CountersAnswer::Service(ServiceCountersAnswer {
                service: svc.to_string(),
                series,
                problems,
            });
        }
        let mut services: BTreeMap<String, ServiceTotals> = BTreeMap::new();
        for ((_, name, _, _), c) in &self.series.entries {
            let t = services.entry(name.service.to_string()).or_default();
            let (packets, bytes) = c.traffic.unwrap_or_default();
            t.connections += c.connections.unwrap_or_default();
            t.packets += packets;
            t.bytes += bytes;
        }
        for (_, name, reason, p) in &self.problems {
            let t = services.entry(name.service.to_string()).or_default();
            match *reason {
                "no_endpoints" | "invalid_port" => t.rejected += p.connections,
                _ => t.dropped += p.connections,
            }
        }
        let mut node: BTreeMap<String, FamilyTotals> = BTreeMap::new();
        for name in [CONNECTIONS, REJECTED, DROPPED] {
            let _ = self.series.each(name, &mut |labels, v| {
                let t = node.entry(label(labels, "ip_family")).or_default();
                let reason = label(labels, "reason");
                match name {
                    CONNECTIONS => t.connections = v,
                    REJECTED => _ = t.rejected.insert(reason, v),
                    _ => _ = t.dropped.insert(reason, v),
                }
                Ok(())
            });
        }
        CountersAnswer::Node(NodeCountersAnswer {
            node,
            services,
            problems,
        })
    }
}

/// `/api/v1/counters`: of the node, or of one Service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CountersAnswer {
    /// One Service's.
    Service(ServiceCountersAnswer),
    /// The node's.
    Node(NodeCountersAnswer),
}

/// `/api/v1/counters`: the node's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeCountersAnswer {
    /// Per family (`IPv4`, `IPv6`), what it counted.
    pub node: BTreeMap<String, FamilyTotals>,
    /// Per Service (`namespace/name`).
    pub services: BTreeMap<String, ServiceTotals>,
    /// Every Service port's rejects and drops.
    pub problems: Vec<CountedProblem>,
}

/// `/api/v1/counters?service=`: one Service's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceCountersAnswer {
    /// `namespace/name`.
    pub service: String,
    /// Its series, as `/metrics` has them.
    pub series: Vec<Sample>,
    /// Its ports' rejects and drops.
    pub problems: Vec<CountedProblem>,
}

/// What a family counted in all.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FamilyTotals {
    /// Connections through the Services.
    #[serde(default)]
    pub connections: u64,
    /// Connections rejected, per reason.
    #[serde(default)]
    pub rejected: BTreeMap<String, u64>,
    /// Connections dropped, per reason.
    #[serde(default)]
    pub dropped: BTreeMap<String, u64>,
}

/// What one Service counted in all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTotals {
    /// Connections (the Services counted).
    pub connections: u64,
    /// Connections rejected.
    pub rejected: u64,
    /// Connections dropped.
    pub dropped: u64,
    /// Packets (the Services counted).
    pub packets: u64,
    /// Bytes (the Services counted).
    pub bytes: u64,
}

/// A series of `/metrics`: its name, labels and value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The metric's name.
    pub metric: String,
    /// Its labels.
    #[serde(flatten)]
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: u64,
}

/// One Service port's rejects or drops for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountedProblem {
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
    /// `namespace/name`.
    pub service: String,
    /// The port's name (or number).
    pub port: String,
    /// Why: `no_endpoints`, `invalid_port` (rejected), `source_range`,
    /// `no_local_endpoint` (dropped).
    pub reason: String,
    /// Connections, each counted once.
    pub connections: u64,
    /// The last few clients (address:port), newest last.
    pub recent_clients: Vec<String>,
}

/// A label's value, escaped as the text format wants it.
fn write_escaped(out: &mut dyn std::fmt::Write, v: &str) -> std::fmt::Result {
    let mut rest = v;
    while let Some(i) = rest.find(['\\', '"', '\n']) {
        out.write_str(&rest[..i])?;
        out.write_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        })?;
        rest = &rest[i + 1..];
    }
    out.write_str(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Instant;
    use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
    use verdict_model::MetricsSelection;
    use verdict_nft::{Element, Family, MemoryBackend};
    use verdict_proxier::{LocalDetector, Proxier, ProxierConfig};

    /// `shop/web` (counted per endpoint: the selection names `shop`),
    /// `shop/empty` (no endpoints) and `other/lb` (not counted, source
    /// ranges), synced into memory.
    fn node() -> (Proxier, TableState) {
        let mut c = ProxierConfig::new(IpFamily::V4, "n");
        c.local_detector = LocalDetector::Cidr("10.0.0.0/8".parse().unwrap());
        c.flow_log_group = Some(7331);
        c.metrics = MetricsSelection {
            level: Counting::Endpoint,
            namespaces: vec!["shop".into()],
            ..MetricsSelection::default()
        };
        let mut p = Proxier::new(c).unwrap();
        let web = svc("shop", "web")
            .cluster_ip("172.30.0.41")
            .port("http", TCP, 80, 0);
        let empty = svc("shop", "empty")
            .cluster_ip("172.30.0.43")
            .port("http", TCP, 80, 0);
        let lb = svc("other", "lb")
            .cluster_ip("172.30.0.51")
            .port("http", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&["203.0.113.0/25"]);
        for s in [&web, &empty, &lb] {
            p.on_service(None, Some(s));
        }
        for (ns, name) in [("shop", "web"), ("other", "lb")] {
            p.on_endpoint_slice(
                &slice(ns, name, "s")
                    .port("http", TCP, 80)
                    .ep("10.180.0.1", "n")
                    .ep("10.180.0.2", "m"),
                false,
            );
        }
        let mut nft = MemoryBackend::new();
        p.sync(&mut nft, Instant::now()).unwrap();
        let t = nft.get(Family::Ip, "verdict").unwrap().clone();
        (p, t)
    }

    fn a(s: &str) -> Value {
        Value::Addr(s.parse().unwrap())
    }

    const TCP_: Value = Value::Proto(L4Proto::Tcp);

    fn count(t: &mut TableState, set: &str, key: Vec<Value>, packets: u64) {
        let s = t.sets.get_mut(set).unwrap();
        assert!(
            s.elements.contains_key(key.as_slice()),
            "{set} has no {key:?}"
        );
        s.counters.insert(
            key.into(),
            Counter {
                packets,
                bytes: 60 * packets,
            },
        );
    }

    fn rule_count(t: &mut TableState, chain: &str, rule: usize, packets: u64) {
        let c = t.chains.get_mut(chain).unwrap();
        assert!(rule < c.rules.len(), "{chain} has no rule {rule}");
        c.counters.insert(rule, Counter { packets, bytes: 0 });
    }

    /// A connection remembered by a problem set: client 203.0.113.9:port
    /// to `dst`:80.
    fn problem(t: &mut TableState, set: &str, dst: &str, client_port: u16) {
        problem_at(t, set, dst, 80, client_port);
    }

    /// The same, to `dst`:`dport`.
    fn problem_at(t: &mut TableState, set: &str, dst: &str, dport: u16, client_port: u16) {
        let key = vec![
            a("203.0.113.9"),
            a(dst),
            TCP_,
            Value::Port(client_port),
            Value::Port(dport),
        ];
        t.sets
            .get_mut(set)
            .unwrap()
            .elements
            .insert(key.clone().into(), Element::key(key));
    }

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }

    #[test]
    fn label_values_are_escaped_as_the_text_format_wants() {
        let mut out = String::new();
        write_sample(&mut out, "m", &[("a", "x\\y\"z\nw"), ("b", "plain")], 3).unwrap();
        assert_eq!(out, "m{a=\"x\\\\y\\\"z\\nw\",b=\"plain\"} 3\n");
    }

    #[test]
    fn only_the_chosen_services_get_series_and_the_node_its_totals() {
        let (p, mut t) = node();
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        // The chosen Service's elements are there; the other's are not.
        let web = vec![a("172.30.0.41"), TCP_, Value::Port(80)];
        count(&mut t, layout::SERVICE_CONNECTIONS, web.clone(), 7);
        assert!(
            !t.sets[layout::SERVICE_CONNECTIONS]
                .elements
                .contains_key(&[a("172.30.0.51"), TCP_, Value::Port(80)][..]),
            "other/lb is not counted per Service"
        );
        for (ep, n) in [("10.180.0.1", 4), ("10.180.0.2", 3)] {
            let mut key = web.clone();
            key.extend([a(ep), Value::Port(80)]);
            count(&mut t, layout::ENDPOINT_CONNECTIONS, key.clone(), n);
            count(&mut t, layout::SERVICE_TRAFFIC, key, 10 * n);
        }
        // The node's: 12 connections (7 of them web's), one reject.
        rule_count(&mut t, layout::NAT_POSTROUTING, 0, 12);
        rule_count(&mut t, layout::REJECT_CHAIN, 1, 1);
        problem(&mut t, layout::REJECTED_CONNECTIONS, "172.30.0.43", 40001);
        // Two drops by other/lb's source ranges: attributed, not exported.
        rule_count(&mut t, layout::DROP_SOURCE_RANGE, 1, 2);
        problem(&mut t, layout::DROPPED_SOURCE_RANGE, "5.6.7.8", 40002);
        problem(&mut t, layout::DROPPED_SOURCE_RANGE, "5.6.7.8", 40003);

        let mut state = Counted::default();
        let snap = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        let text = snap.exposition();
        has(&text, "verdict_connections_total{ip_family=\"IPv4\"} 12");
        has(
            &text,
            "verdict_rejected_total{ip_family=\"IPv4\",reason=\"no_endpoints\"} 1",
        );
        has(
            &text,
            "verdict_dropped_total{ip_family=\"IPv4\",reason=\"source_range\"} 2",
        );
        has(
            &text,
            "verdict_dropped_total{ip_family=\"IPv4\",reason=\"no_local_endpoint\"} 0",
        );
        let base = "ip_family=\"IPv4\",namespace=\"shop\",service=\"web\",port=\"http\"";
        has(
            &text,
            &format!(
                "verdict_service_connections_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}} 7"
            ),
        );
        has(
            &text,
            &format!("verdict_endpoint_connections_total{{{base},endpoint=\"10.180.0.1:80\"}} 4"),
        );
        has(
            &text,
            &format!(
                "verdict_service_packets_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}} 70"
            ),
        );
        has(
            &text,
            &format!("verdict_endpoint_bytes_total{{{base},endpoint=\"10.180.0.2:80\"}} 1800"),
        );
        has(
            &text,
            "verdict_service_rejected_total{ip_family=\"IPv4\",namespace=\"shop\",service=\"empty\",port=\"http\",reason=\"no_endpoints\"} 1",
        );
        assert!(!text.contains("namespace=\"other\""), "{text}");
        // The API shows other/lb's drops all the same.
        let CountersAnswer::Node(typed) = snap.answer(None) else {
            panic!("the node's counters")
        };
        assert_eq!(typed.services["other/lb"].dropped, 2);
        let all = serde_json::to_value(&typed).unwrap();
        assert_eq!(all["services"]["other/lb"]["dropped"], 2, "{all:#}");
        assert_eq!(all["services"]["shop/empty"]["rejected"], 1);
        assert_eq!(all["services"]["shop/web"]["connections"], 7);
        assert_eq!(all["node"]["IPv4"]["connections"], 12);
        assert_eq!(all["node"]["IPv4"]["dropped"]["source_range"], 2);
        let lb =
            serde_json::to_value(snap.answer(Some(&NamespacedName::new("other", "lb")))).unwrap();
        let problems = lb["problems"].as_array().unwrap();
        assert_eq!(problems.len(), 1, "{lb:#}");
        assert_eq!(problems[0]["reason"], "source_range");
        assert_eq!(
            problems[0]["recent_clients"],
            json!(["203.0.113.9:40002", "203.0.113.9:40003"])
        );
        assert!(snap.series() < 30, "{} series", snap.series());

        // The answers carry the same counts: the most refused port first.
        let ports = snap.problem_ports();
        let names: Vec<String> = ports.iter().map(|(_, n)| n.service.to_string()).collect();
        assert_eq!(names, ["other/lb", "shop/empty"]);
        let mut page = crate::inspect::services(&handle, "", 0, 10);
        snap.annotate_page(&handle, &mut page);
        let counts = |ns: &str, name: &str| {
            page.items
                .iter()
                .find(|i| i.namespace == ns && i.name == name)
                .and_then(|i| i.ports[0].counts.clone())
                .unwrap()
        };
        assert_eq!(counts("shop", "web").connections, Some(7));
        assert_eq!(counts("shop", "web").packets, Some(70));
        let lb = counts("other", "lb");
        assert_eq!((lb.level.as_str(), lb.connections), ("none", None));
        assert_eq!(lb.refused(), 2);
        assert_eq!(
            lb.problems[0].verdict,
            crate::inspect::answers::Refusal::Dropped
        );
        let empty = counts("shop", "empty");
        assert_eq!(empty.problems[0].reason, RefusalReason::NoEndpoints);
        assert_eq!(
            empty.problems[0].verdict,
            crate::inspect::answers::Refusal::Rejected
        );
        assert!(page.counted_at.is_some());
        // explain: per endpoint, for a Service counted at `endpoint`.
        let name = verdict_model::NamespacedName::new("shop", "web");
        let mut doc = crate::inspect::explain(&handle, &name, &[]);
        snap.annotate_explain(&handle, &mut doc);
        let detail = doc.families[0].ports[0].detail.as_ref().unwrap();
        assert_eq!(detail.counts.as_ref().unwrap().connections, Some(7));
        let per_ep: Vec<(String, Option<u64>)> = detail
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), e.connections))
            .collect();
        assert_eq!(
            per_ep,
            [
                ("10.180.0.1:80".to_owned(), Some(4)),
                ("10.180.0.2:80".to_owned(), Some(3))
            ]
        );
        // The overview's answer: the same ports, with their reasons.
        let problems = crate::inspect::problems(&handle, Some(&snap));
        let refused: Vec<(&str, &str)> = problems
            .refused
            .iter()
            .map(|r| (r.service.as_str(), r.counts.problems[0].reason.as_str()))
            .collect();
        assert_eq!(
            refused,
            [("other/lb", "source_range"), ("shop/empty", "no_endpoints")]
        );
        assert_eq!(problems.refused[1].ready, 0);
        let only = crate::inspect::services_with_problems(&handle, Some(&snap), "", 0, 10);
        assert_eq!(only.total, 2);
        let by_ip = crate::inspect::services(&handle, "5.6.7", 0, 10);
        assert_eq!(by_ip.items[0].name, "lb", "a search matches addresses");
        let by_endpoint = crate::inspect::services(&handle, "10.180.0.2", 0, 10);
        assert_eq!(by_endpoint.total, 2, "and endpoints' addresses");
    }

    #[test]
    fn counts_stay_monotonic_and_each_connection_counts_once() {
        let (p, mut t) = node();
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        let web = vec![a("172.30.0.41"), TCP_, Value::Port(80)];
        let mut state = Counted::default();
        let read = |t: &TableState, state: &mut Counted| {
            serde_json::to_value(
                Snapshot::of(&handle, &[(IpFamily::V4, Some(t))], state).answer(None),
            )
            .unwrap()
        };
        count(&mut t, layout::SERVICE_CONNECTIONS, web.clone(), 7);
        rule_count(&mut t, layout::NAT_POSTROUTING, 0, 7);
        problem(&mut t, layout::REJECTED_CONNECTIONS, "172.30.0.43", 40001);
        let first = read(&t, &mut state);
        assert_eq!(first["services"]["shop/web"]["connections"], 7);
        // The table is written again (a repair): the kernel starts from
        // zero; 2 more connections. The reject is still remembered by the
        // kernel: not counted twice. A second one is new.
        count(&mut t, layout::SERVICE_CONNECTIONS, web, 2);
        rule_count(&mut t, layout::NAT_POSTROUTING, 0, 2);
        problem(&mut t, layout::REJECTED_CONNECTIONS, "172.30.0.43", 40005);
        let second = read(&t, &mut state);
        assert_eq!(second["services"]["shop/web"]["connections"], 9);
        assert_eq!(second["node"]["IPv4"]["connections"], 9);
        assert_eq!(second["services"]["shop/empty"]["rejected"], 2);
        // Both forgotten by the kernel, nothing new: counts stay.
        t.sets
            .get_mut(layout::REJECTED_CONNECTIONS)
            .unwrap()
            .elements
            .clear();
        let third = read(&t, &mut state);
        assert_eq!(third["services"]["shop/empty"]["rejected"], 2);
    }

    #[test]
    fn a_service_total_does_not_go_down_when_an_endpoint_goes() {
        let (mut p, mut t) = node();
        let web = vec![a("172.30.0.41"), TCP_, Value::Port(80)];
        let traffic = |ep: &str| {
            let mut key = web.clone();
            key.extend([a(ep), Value::Port(80)]);
            key
        };
        let mut state = Counted::default();
        let base = "ip_family=\"IPv4\",namespace=\"shop\",service=\"web\",port=\"http\"";
        let packets = format!(
            "verdict_service_packets_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}}"
        );
        count(&mut t, layout::SERVICE_TRAFFIC, traffic("10.180.0.1"), 40);
        count(&mut t, layout::SERVICE_TRAFFIC, traffic("10.180.0.2"), 30);
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        let first = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        has(&first.exposition(), &format!("{packets} 70"));

        // 10.180.0.2 is removed: its element goes with what it counted.
        p.on_endpoint_slice(
            &slice("shop", "web", "s")
                .port("http", TCP, 80)
                .ep("10.180.0.1", "n"),
            false,
        );
        let mut nft = MemoryBackend::new();
        p.sync(&mut nft, Instant::now()).unwrap();
        let mut t = nft.get(Family::Ip, "verdict").unwrap().clone();
        assert!(
            !t.sets[layout::SERVICE_TRAFFIC]
                .elements
                .contains_key(traffic("10.180.0.2").as_slice())
        );
        count(&mut t, layout::SERVICE_TRAFFIC, traffic("10.180.0.1"), 45);
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        // A reading whose table could not be read changes nothing.
        let _ = Snapshot::of(&handle, &[(IpFamily::V4, None)], &mut state);
        let second = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        let text = second.exposition();
        has(&text, &format!("{packets} 75"));
        assert!(
            !text.contains("endpoint=\"10.180.0.2:80\""),
            "the endpoint's own series ends with it:\n{text}"
        );
        let name = ServicePortName::new("shop", "web", "http", Protocol::Tcp);
        let counts = second.port_counts(IpFamily::V4, &name, Counting::Endpoint);
        assert_eq!(counts.packets, Some(75));

        // The Service goes: what it had is forgotten with it.
        p.on_service(
            Some(
                &svc("shop", "web")
                    .cluster_ip("172.30.0.41")
                    .port("http", TCP, 80, 0),
            ),
            None,
        );
        let mut nft = MemoryBackend::new();
        p.sync(&mut nft, Instant::now()).unwrap();
        let t = nft.get(Family::Ip, "verdict").unwrap().clone();
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        let third = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        assert!(!third.exposition().contains("service=\"web\""));
        assert!(state.retired.is_empty(), "{:?}", state.retired);
    }

    #[test]
    fn a_port_the_service_does_not_have_counts_per_connection_for_the_service() {
        let (p, mut t) = node();
        let handle = NodeHandle::of_proxiers(&[&p], &[]);
        // 10 connections to shop/web's ClusterIP on port 9999: the node
        // counts them in the chain, the set names each.
        let new = t.chains[layout::REJECT_INVALID_PORT]
            .rules
            .iter()
            .position(|r| r.exprs.contains(&verdict_nft::Expr::Counter))
            .unwrap();
        rule_count(&mut t, layout::REJECT_INVALID_PORT, new, 10);
        for client_port in 0..10 {
            problem_at(
                &mut t,
                layout::REJECTED_INVALID_PORT,
                "172.30.0.41",
                9999,
                41000 + client_port,
            );
        }
        // 5 more, past the log rate limit: counted by the node, not logged.
        let not_logged = t.chains[layout::REJECT_INVALID_PORT]
            .rules
            .iter()
            .position(|r| r.comment.as_deref() == Some(layout::NOT_LOGGED_COMMENT))
            .unwrap();
        rule_count(&mut t, layout::REJECT_INVALID_PORT, not_logged, 5);
        let mut state = Counted::default();
        let snap = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        let text = snap.exposition();
        has(
            &text,
            "verdict_rejected_total{ip_family=\"IPv4\",reason=\"invalid_port\"} 10",
        );
        assert_eq!(snap.not_logged(), 5);
        has(
            &text,
            "verdict_service_rejected_total{ip_family=\"IPv4\",namespace=\"shop\",service=\"web\",port=\"9999\",reason=\"invalid_port\"} 10",
        );
        let web = verdict_model::NamespacedName::new("shop", "web");
        let other = snap.other_ports(&web);
        assert_eq!(other.len(), 1);
        assert_eq!(
            (other[0].port.as_str(), other[0].protocol.as_str()),
            ("9999", "tcp")
        );
        assert_eq!(other[0].problem.connections, 10);
        assert_eq!(other[0].problem.reason, RefusalReason::InvalidPort);
        // Among the problems, the Service list's and the overview's.
        let only = crate::inspect::services_with_problems(&handle, Some(&snap), "", 0, 10);
        assert!(only.items.iter().any(|i| i.name == "web"));
        let mut page = crate::inspect::services(&handle, "shop/web", 0, 10);
        snap.annotate_page(&handle, &mut page);
        assert_eq!(page.items[0].other_ports, other);
        let overview = crate::inspect::problems(&handle, Some(&snap));
        let r = overview
            .refused
            .iter()
            .find(|r| r.service == "shop/web")
            .unwrap();
        assert_eq!((r.port.as_str(), r.counts.refused()), ("9999", 10));
        let mut doc = crate::inspect::explain(&handle, &web, &[]);
        snap.annotate_explain(&handle, &mut doc);
        assert_eq!(doc.other_ports, other);

        // A scan of many ports: eight counted apart, the rest as `other`.
        for (i, port) in (9000..9010).enumerate() {
            problem_at(
                &mut t,
                layout::REJECTED_INVALID_PORT,
                "172.30.0.41",
                port,
                42000 + i as u16,
            );
        }
        let snap = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        let ports: Vec<(String, u64)> = snap
            .other_ports(&web)
            .iter()
            .map(|o| (o.port.clone(), o.problem.connections))
            .collect();
        assert_eq!(ports.len(), 9, "{ports:?}");
        assert!(ports.contains(&(OTHER_PORTS.to_owned(), 3)), "{ports:?}");
        assert!(ports.contains(&("9999".to_owned(), 10)), "{ports:?}");
        // An address no Service has is no Service's problem.
        problem_at(
            &mut t,
            layout::REJECTED_INVALID_PORT,
            "172.30.0.99",
            1,
            43000,
        );
        let snap = Snapshot::of(&handle, &[(IpFamily::V4, Some(&t))], &mut state);
        assert_eq!(snap.other_ports(&web).len(), 9);
    }
}
