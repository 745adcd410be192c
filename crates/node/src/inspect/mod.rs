//! Seeing into verdict: what the introspection API (`/api/v1/…` on the
//! metrics address) and the `trace`, `explain`, `services` and `syncs`
//! commands answer. Every answer is built here, as JSON, from the read
//! model ([`NodeHandle`]) and a table read back from the kernel (or,
//! offline, from the in-memory backend); the commands render the same JSON
//! as text, so a daemon's answer and an offline one read alike. Nothing
//! here waits for a sync: the read model is what the last one published.

pub mod answers;
pub mod counters;
pub mod text;
pub mod ui;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_model::{
    Endpoint, IpFamily, NamespacedName, NodeTopology, ServicePort, ServicePortName,
    categorize_endpoints,
};
use verdict_nft::{
    Backend, Disposition, Element, ElementSource, Family, InTable, L4Proto, NftError, Packet,
    SetState, TableState, TracePath, Tracer, Value,
};
use verdict_proxier::layout;
use verdict_proxier::{LocalDetector, ProxierConfig};

use crate::view::{FamilyView, NodeHandle, ServiceView};
use answers::{
    ConnectionsAnswer, ConnectionsOfEndpoint, ConnectionsOfPort, DriftCounts, EntryKind,
    EntryPoint, ExplainAnswer, ExplainElement, ExplainEndpoint, ExplainFamily, ExplainPort,
    ExplainPortDetail, FamilyDrift, FlowAnswer, HealthCheck, ProblemsAnswer, QuarantinedPort,
    RefusedPort, ServiceItem, ServiceItemPort, ServicesPage, TraceAnswer, TraceOutcome,
    TracePacket, TraceStep, TraceUpdate,
};
use serde_json::Value as Json;

/// The Service a dispatch element's comment names (`ns/name:port`, as the
/// proxier writes it).
fn named_by(comment: &str) -> Option<NamespacedName> {
    let (ns, rest) = comment.split_once('/')?;
    let name = rest.split(':').next()?;
    (!ns.is_empty() && !name.is_empty()).then(|| NamespacedName::new(ns, name))
}

/// Who owns the elements an answer shows, among a few Services: an
/// element is a Service port's when that port's intent holds its key (the
/// first in name order when several do, as the proxier programs it); an
/// element no candidate wants is named by its comment, as the kernel
/// holds it. Costs what the candidates own, whatever the cluster size.
struct Owners {
    family: IpFamily,
    candidates: Vec<Arc<ServiceView>>,
}

impl Owners {
    fn new(family: IpFamily, candidates: Vec<Arc<ServiceView>>) -> Owners {
        let mut c = candidates;
        c.sort_by(|a, b| a.name.cmp(&b.name));
        c.dedup_by(|a, b| a.name == b.name);
        Owners {
            family,
            candidates: c,
        }
    }

    /// The service port that owns `key` in `set`.
    fn owner(&self, set: &str, key: &[Value], found: Option<&Element>) -> Option<String> {
        // A staged key belongs to whoever wants it in its map.
        let set = map_of(set);
        let mut best: Option<ServicePortName> = None;
        for v in &self.candidates {
            for (f, port) in v.ports() {
                if f != self.family {
                    continue;
                }
                let Some(intent) = &port.intent else {
                    continue;
                };
                for e in intent.elements() {
                    if e.set == set && &e.element.key[..] == key {
                        let who = e
                            .programmed_for
                            .map_or_else(|| port.name.clone(), |w| w.as_ref().clone());
                        if best.as_ref().is_none_or(|b| who < *b) {
                            best = Some(who);
                        }
                    }
                }
            }
        }
        best.map(|b| b.to_string())
            .or_else(|| found.and_then(|e| e.comment.as_deref().map(str::to_owned)))
    }
}

/// A table read back for an answer, and where from: read whole, or
/// (`lookups`) read without its elements, which are then looked up in
/// the kernel key by key, so that an answer about one packet or one
/// Service costs the same at any cluster size.
pub struct TableRead {
    /// The table (`None`: the table does not exist).
    pub table: Option<TableState>,
    /// Where the elements are when `table` was read without them.
    pub lookups: Option<Lookups>,
    /// `"kernel"` or `"memory"` (offline).
    pub source: answers::ReadFrom,
    /// How long reading the table took (the lookups not included).
    pub read: Duration,
}

/// How much of a table an answer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Every element (drift, `explain --full`).
    Whole,
    /// The chains and rules with their counters, and the elements of the
    /// few sets that count ([`counters::READ_SETS`]): what `/metrics`
    /// reads, whatever the number of Services.
    Counters,
    /// The chains, rules and set definitions, then only the elements the
    /// answer looks up (`trace`, `explain`).
    Targeted,
}

/// What the kernel answered for each (set, key) asked.
type Seen = BTreeMap<(String, Vec<Value>), Option<Element>>;

/// Elements looked up key by key in the kernel, for a table read without
/// them; each (set, key) is asked once.
pub struct Lookups {
    backend: RefCell<Box<dyn Backend + Send>>,
    family: Family,
    table: String,
    seen: RefCell<Seen>,
    took: Cell<Duration>,
    failed: RefCell<Option<String>>,
}

impl Lookups {
    /// Lookups in table `family` `table` through `backend`.
    pub fn new(backend: Box<dyn Backend + Send>, family: Family, table: &str) -> Lookups {
        Lookups {
            backend: RefCell::new(backend),
            family,
            table: table.to_owned(),
            seen: RefCell::new(BTreeMap::new()),
            took: Cell::new(Duration::ZERO),
            failed: RefCell::new(None),
        }
    }

    /// The element of `set` each key matches. A kernel that cannot answer
    /// finds nothing, and says why in [`TableRead::failed`].
    fn get(&self, set: &str, keys: &[Vec<Value>]) -> Vec<Option<Element>> {
        let mut seen = self.seen.borrow_mut();
        let asked: Vec<Vec<Value>> = keys
            .iter()
            .filter(|k| !seen.contains_key(&(set.to_owned(), (*k).clone())))
            .cloned()
            .collect();
        if !asked.is_empty() {
            let t = Instant::now();
            let answer = self
                .backend
                .borrow_mut()
                .lookup(self.family, &self.table, set, &asked);
            self.took.set(self.took.get() + t.elapsed());
            match answer {
                Ok(found) => {
                    for (k, f) in asked.into_iter().zip(found) {
                        seen.insert((set.to_owned(), k), f.map(|f| f.element));
                    }
                }
                Err(e) => {
                    self.failed
                        .borrow_mut()
                        .get_or_insert_with(|| format!("looking up elements of {set}: {e}"));
                }
            }
        }
        keys.iter()
            .map(|k| seen.get(&(set.to_owned(), k.clone())).cloned().flatten())
            .collect()
    }
}

impl TableRead {
    /// Reads table `family` `name` whole through `backend`.
    pub fn whole(
        backend: &mut dyn Backend,
        family: Family,
        name: &str,
        source: answers::ReadFrom,
    ) -> Result<TableRead, NftError> {
        let t = Instant::now();
        let table = backend.table(family, name)?;
        Ok(TableRead {
            table,
            lookups: None,
            source,
            read: t.elapsed(),
        })
    }

    /// Reads table `family` `name` without its elements, then the
    /// elements of the sets that count ([`counters::READ_SETS`]). Of a
    /// counted set only the counters are kept: its elements (a copy of
    /// each key, with its comment) are dropped as soon as it is read.
    pub fn counters(
        backend: &mut dyn Backend,
        family: Family,
        name: &str,
        source: answers::ReadFrom,
    ) -> Result<TableRead, NftError> {
        let t = Instant::now();
        let mut table = backend.skeleton(family, name)?;
        if let Some(table) = table.as_mut() {
            for set in counters::READ_SETS {
                if !table.sets.contains_key(set) {
                    continue;
                }
                if let Some(mut state) = backend.set(family, name, set)? {
                    if counters::COUNTED_SETS.contains(&set) {
                        state.elements = BTreeMap::new();
                    }
                    table.sets.insert(set.to_owned(), state);
                }
            }
        }
        Ok(TableRead {
            table,
            lookups: None,
            source,
            read: t.elapsed(),
        })
    }

    /// Reads table `family` `name` without its elements through
    /// `backend`, which then looks up the elements an answer needs.
    pub fn targeted(
        mut backend: Box<dyn Backend + Send>,
        family: Family,
        name: &str,
        source: answers::ReadFrom,
    ) -> Result<TableRead, NftError> {
        let t = Instant::now();
        let table = backend.skeleton(family, name)?;
        Ok(TableRead {
            table,
            lookups: Some(Lookups::new(backend, family, name)),
            source,
            read: t.elapsed(),
        })
    }

    /// Why a lookup failed, if one did (an answer built from a kernel that
    /// could not answer must not be given).
    pub fn failed(&self) -> Option<String> {
        self.lookups
            .as_ref()
            .and_then(|l| l.failed.borrow().clone())
    }

    /// Calls `each` with every element of `set` as it is read from the
    /// kernel (a table read without its elements), or of the set read
    /// with the table; the time counts as the lookups'. A failed read
    /// fails the answer ([`TableRead::failed`]).
    pub fn each_in_set(&self, set: &str, each: &mut dyn FnMut(&Element)) {
        let Some(l) = &self.lookups else {
            let elements = self.table.as_ref().and_then(|t| t.sets.get(set));
            elements
                .into_iter()
                .flat_map(|s| s.elements.values())
                .for_each(each);
            return;
        };
        let t = Instant::now();
        let read = l
            .backend
            .borrow_mut()
            .each_element(l.family, &l.table, set, &mut |e| each(&e));
        l.took.set(l.took.get() + t.elapsed());
        if let Err(e) = &read {
            l.failed.borrow_mut().get_or_insert_with(|| e.to_string());
        }
    }

    /// Milliseconds spent reading: the table, and the lookups since.
    fn read_ms(&self) -> f64 {
        let lookups = self
            .lookups
            .as_ref()
            .map_or(Duration::ZERO, |l| l.took.get());
        (self.read + lookups).as_secs_f64() * 1e3
    }

    /// Records `other`'s failed lookup as this one's, if this has none:
    /// an answer read through both fails if either failed.
    pub fn take_failure(&self, other: &TableRead) {
        if let (Some(l), Some(e)) = (&self.lookups, other.failed()) {
            l.failed.borrow_mut().get_or_insert(e);
        }
    }

    /// Whether the elements are read from the kernel set by set, as they
    /// are asked for (not held whole from the table's read).
    pub fn reads_by_set(&self) -> bool {
        self.lookups.is_some()
    }

    /// How much of the kernel the answer read.
    fn read_kind(&self) -> answers::ReadHow {
        if self.lookups.is_some() {
            answers::ReadHow::Targeted
        } else {
            answers::ReadHow::Whole
        }
    }

    /// Looks up, set by set, the elements an answer will ask for one by
    /// one (a targeted read asks the kernel once per set, not per key).
    fn prefetch<'k>(&self, wanted: impl Iterator<Item = (&'k str, &'k Vec<Value>)>) {
        let (Some(l), Some(t)) = (&self.lookups, &self.table) else {
            return;
        };
        let mut by_set: BTreeMap<&str, Vec<Vec<Value>>> = BTreeMap::new();
        for (set, key) in wanted {
            by_set.entry(set).or_default().push(key.clone());
        }
        for (set, keys) in by_set {
            if t.sets.contains_key(set) {
                l.get(set, &keys);
            }
        }
    }

    /// Whether the kernel holds `e`, a jump of the verdict map `map`, in
    /// the map's staging ([`verdict_proxier::staging`]): its key behind the
    /// gate and in the set of its target chain.
    fn staged(&self, map: &str, e: &Element) -> bool {
        let (Some(gate), Some(set)) = (
            layout::staged_of(map),
            verdict_proxier::staging::target(e).and_then(|t| layout::staging_set(map, t)),
        ) else {
            return false;
        };
        let holds = |set: &str| {
            self.element(set, &e.key)
                .is_some_and(|found| found.key == e.key)
        };
        holds(gate) && holds(&set)
    }

    /// The element of `set` with `key` (an interval set: holding it).
    fn element(&self, set: &str, key: &[Value]) -> Option<Element> {
        let s = self.table.as_ref()?.sets.get(set)?;
        self.find(s, std::slice::from_ref(&key.to_vec()))
            .pop()
            .flatten()
    }
}

impl ElementSource for TableRead {
    fn find(&self, set: &SetState, keys: &[Vec<Value>]) -> Vec<Option<Element>> {
        match &self.lookups {
            None => InTable.find(set, keys),
            Some(l) => l.get(&set.set.name, keys),
        }
    }
}

/// An answer that could not be given, as the API's 4xx body says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

pub use answers::Origin;

/// A packet to trace: the first packet of a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Where it comes from.
    pub from: Origin,
    /// Source address.
    pub src: IpAddr,
    /// Source port (no rule looks at it; shown in the answer).
    pub sport: Option<u16>,
    /// Destination address.
    pub dst: IpAddr,
    /// Protocol.
    pub proto: L4Proto,
    /// Destination port.
    pub dport: u16,
}

impl TraceRequest {
    /// Reads a request from named values (the API's query, the command's
    /// flags), with an error naming what is wrong.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<TraceRequest, BadRequest> {
        let need = |k: &str| {
            get(k)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| BadRequest(format!("missing {k}")))
        };
        let addr = |k: &str| -> Result<IpAddr, BadRequest> {
            let v = need(k)?;
            v.parse()
                .map_err(|_| BadRequest(format!("{k} {v:?} is not an IP address")))
        };
        let port = |k: &str, v: String| -> Result<u16, BadRequest> {
            v.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| BadRequest(format!("{k} {v:?} is not a port (1-65535)")))
        };
        let from = match need("from")?.as_str() {
            "pod" => Origin::Pod,
            "node" => Origin::Node,
            "external" => Origin::External,
            other => {
                return Err(BadRequest(format!(
                    "from {other:?}: must be pod, node or external"
                )));
            }
        };
        let proto = match need("proto")?.to_ascii_lowercase().as_str() {
            "tcp" => L4Proto::Tcp,
            "udp" => L4Proto::Udp,
            "sctp" => L4Proto::Sctp,
            other => {
                return Err(BadRequest(format!(
                    "proto {other:?}: must be tcp, udp or sctp"
                )));
            }
        };
        let src = addr("src")?;
        let dst = addr("dst")?;
        if IpFamily::of(src) != IpFamily::of(dst) {
            return Err(BadRequest(format!(
                "src {src} and dst {dst} are not of the same IP family"
            )));
        }
        let sport = match get("sport").filter(|v| !v.is_empty()) {
            Some(v) => Some(port("sport", v)?),
            None => None,
        };
        Ok(TraceRequest {
            from,
            src,
            sport,
            dst,
            proto,
            dport: port("dport", need("dport")?)?,
        })
    }

    /// The request as the API's query string.
    pub fn query(&self) -> String {
        let mut q = format!(
            "from={}&src={}&dst={}&proto={}&dport={}",
            self.from.as_str(),
            self.src,
            self.dst,
            self.proto,
            self.dport
        );
        if let Some(p) = self.sport {
            q.push_str(&format!("&sport={p}"));
        }
        q
    }
}

/// An interface name for a packet from `from`, as the proxier's detector
/// tells pods from the rest: one the detector matches for a pod, one it
/// does not for an external client, none for the node's own packets.
fn input_interface(cfg: &ProxierConfig, from: Origin) -> Option<String> {
    let pod = match &cfg.local_detector {
        LocalDetector::BridgeInterface(b) => b.clone(),
        LocalDetector::InterfaceNamePrefix(p) => format!("{p}0"),
        LocalDetector::Cidr(_) | LocalDetector::None => "pod0".into(),
    };
    match from {
        Origin::Node => None,
        Origin::Pod => Some(pod),
        Origin::External => {
            let detected = |name: &str| match &cfg.local_detector {
                LocalDetector::BridgeInterface(b) => name == b,
                LocalDetector::InterfaceNamePrefix(p) => name.starts_with(p.as_str()),
                _ => false,
            };
            ["eth0", "ext0", "uplink0"]
                .into_iter()
                .find(|n| !detected(n))
                .map(str::to_owned)
        }
    }
}

fn show_key(key: &[Value]) -> String {
    key.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" . ")
}

/// `IP:port`, with brackets for IPv6.
pub fn show_addr(a: IpAddr, port: u16) -> String {
    match a {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Why a path ended as it did, in an operator's words.
fn reason(p: &Owners, path: &TracePath) -> String {
    let lookup_of = |sets: &[&str]| {
        path.steps
            .iter()
            .flat_map(|s| &s.lookups)
            // A staged key's lookups count as its map's.
            .filter(|l| sets.contains(&map_of(&l.set)))
            .find_map(|l| l.found.as_ref().map(|e| (l, e)))
    };
    let who = |set: &str, key: &[Value], e: &Element| {
        p.owner(set, key, Some(e))
            .unwrap_or_else(|| "a Service".into())
    };
    let last_chain = path.steps.last().map(|s| s.chain.as_str()).unwrap_or("");
    // With the counters, a drop ends in the chain of its reason.
    let through = |chain: &str| last_chain == chain || path.steps.iter().any(|s| s.chain == chain);
    let no_endpoints = lookup_of(&[layout::NO_ENDPOINT_SERVICES, layout::NO_ENDPOINT_NODEPORTS]);
    match (path.disposition, path.dnat) {
        (Disposition::Drop, _)
            if last_chain == layout::FIREWALL_CHECK || through(layout::DROP_SOURCE_RANGE) =>
        {
            let svc = lookup_of(&[layout::FIREWALL_IPS])
                .map(|(l, e)| who(&l.set, &l.key, e))
                .unwrap_or_else(|| "the Service".into());
            format!("dropped: the source is outside the loadBalancerSourceRanges of {svc}")
        }
        (Disposition::Reject, _)
            if last_chain == layout::CLUSTER_IPS_CHECK || through(layout::REJECT_INVALID_PORT) =>
        {
            "rejected: the ClusterIP is a Service's, but no Service port of it is this protocol and port".into()
        }
        (Disposition::Drop, _)
            if last_chain == layout::CLUSTER_IPS_CHECK || through(layout::DROP_UNALLOCATED) =>
        {
            "dropped: the address is in the service CIDR but no Service has it".into()
        }
        (Disposition::Reject, _) => match no_endpoints {
            Some((l, e)) => format!("rejected: {} has no usable endpoints", who(&l.set, &l.key, e)),
            None => format!("rejected in {last_chain}"),
        },
        (Disposition::Drop, _) => match no_endpoints {
            Some((l, e)) => format!(
                "dropped: {} has no local endpoints and its traffic policy is Local",
                who(&l.set, &l.key, e)
            ),
            None => format!("dropped in {last_chain}"),
        },
        (Disposition::Accept, Some((a, port))) => {
            let svc = lookup_of(&[layout::SERVICE_IPS, layout::SERVICE_NODEPORTS])
                .map(|(l, e)| who(&l.set, &l.key, e));
            let affinity = lookup_of(&[layout::AFFINITY]).is_some();
            let mut s = format!("DNAT to {}", show_addr(a, port));
            if let Some(svc) = svc {
                s.push_str(&format!(", an endpoint of {svc}"));
            }
            if affinity {
                s.push_str(" (chosen by an existing ClientIP affinity entry)");
            }
            s
        }
        (Disposition::Accept, None) => "accepted untouched: not a Service address and port".into(),
    }
}

/// One lookup, as the answer shows it.
fn lookup_answer(p: &Owners, l: &verdict_nft::TraceLookup) -> answers::TraceLookup {
    answers::TraceLookup {
        set: l.set.clone(),
        key: show_key(&l.key),
        found: l.found.is_some(),
        value: l
            .found
            .as_ref()
            .and_then(|e| e.value.as_ref())
            .map(ToString::to_string),
        service: p.owner(&l.set, &l.key, l.found.as_ref()),
    }
}

/// `verdict trace`: every path the packet can take through the table,
/// with the Service owning each element it met.
pub fn trace(
    handle: &NodeHandle,
    req: &TraceRequest,
    kernel: &TableRead,
) -> Result<TraceAnswer, BadRequest> {
    let family = IpFamily::of(req.dst);
    let f = handle
        .family(family)
        .ok_or_else(|| BadRequest(format!("no proxier for {}", req.dst)))?;
    let t = walk(&f.config, &handle.local_ips(), req, kernel)?;
    traced(handle, &f, req, kernel, &t)
}

/// Walks the packet through the kernel's table.
fn walk(
    cfg: &ProxierConfig,
    local_ips: &[IpAddr],
    req: &TraceRequest,
    kernel: &TableRead,
) -> Result<verdict_nft::Trace, BadRequest> {
    let table = kernel.table.as_ref().ok_or_else(|| {
        BadRequest(format!(
            "table {} {} does not exist: verdict has not programmed this family",
            cfg.nft_family(),
            cfg.table
        ))
    })?;
    Ok(
        Tracer::with_elements(table, kernel, cfg.nft_family(), local_ips).trace(&Packet {
            src: req.src,
            dst: req.dst,
            proto: req.proto,
            dport: req.dport,
            sport: req.sport.unwrap_or(0),
            iif: input_interface(cfg, req.from),
        }),
    )
}

/// The answer to `verdict trace` for the paths [`walk`] found, with the
/// Service owning each element the packet met: among the Services at the
/// packet's destination (its address, or its port as a NodePort) and
/// those the elements' comments name.
fn traced(
    handle: &NodeHandle,
    f: &FamilyView,
    req: &TraceRequest,
    kernel: &TableRead,
    t: &verdict_nft::Trace,
) -> Result<TraceAnswer, BadRequest> {
    let cfg = &f.config;
    let mut candidates = handle.services_at(req.dst);
    candidates.extend(handle.services_at_node_port(cfg.family, req.dport));
    for l in t
        .paths
        .iter()
        .flat_map(|p| &p.steps)
        .flat_map(|s| &s.lookups)
    {
        if let Some(name) = l
            .found
            .as_ref()
            .and_then(|e| e.comment.as_deref())
            .and_then(named_by)
            && let Some(v) = handle.service(&name)
        {
            candidates.push(v);
        }
    }
    let p = &Owners::new(cfg.family, candidates);
    let iif = input_interface(cfg, req.from);
    let paths: Vec<answers::TracePath> = t
        .paths
        .iter()
        .map(|path| answers::TracePath {
            probability: 1.0 / path.one_in as f64,
            disposition: disposition(path.disposition),
            dnat: path.dnat.map(|(a, port)| show_addr(a, port)),
            masquerade: path.masqueraded,
            reason: reason(p, path),
            steps: path
                .steps
                .iter()
                .map(|s| TraceStep {
                    hook: s.hook.to_string(),
                    chain: s.chain.clone(),
                    rule: s.rule.clone(),
                    lookups: s.lookups.iter().map(|l| lookup_answer(p, l)).collect(),
                })
                .collect(),
            updates: path
                .updates
                .iter()
                .map(|(set, e)| TraceUpdate {
                    set: set.clone(),
                    element: e.to_string(),
                })
                .collect(),
        })
        .collect();
    // Paths that end alike add up: the candidates with their probability.
    let mut outcomes: BTreeMap<(String, bool, String), f64> = BTreeMap::new();
    for path in &t.paths {
        *outcomes
            .entry((path.output(), path.masqueraded, reason(p, path)))
            .or_default() += 1.0 / path.one_in as f64;
    }
    let service = t
        .paths
        .iter()
        .flat_map(|p| &p.steps)
        .flat_map(|s| &s.lookups)
        .filter(|l| {
            [
                layout::SERVICE_IPS,
                layout::SERVICE_NODEPORTS,
                layout::NO_ENDPOINT_SERVICES,
                layout::NO_ENDPOINT_NODEPORTS,
            ]
            .contains(&map_of(&l.set))
        })
        .find_map(|l| p.owner(&l.set, &l.key, l.found.as_ref()));
    Ok(TraceAnswer {
        packet: TracePacket {
            from: req.from,
            src: req.src.to_string(),
            sport: req.sport,
            dst: req.dst.to_string(),
            proto: req.proto.into(),
            dport: req.dport,
            iif,
        },
        family: cfg.nft_family().into(),
        table: cfg.table.clone(),
        source: kernel.source,
        read: kernel.read_kind(),
        read_ms: kernel.read_ms(),
        service,
        outcomes: outcomes
            .into_iter()
            .map(|((output, masquerade, reason), probability)| TraceOutcome {
                output,
                masquerade,
                reason,
                probability,
            })
            .collect(),
        paths,
        live: None,
    })
}

fn disposition(d: Disposition) -> answers::Disposition {
    match d {
        Disposition::Accept => answers::Disposition::Accept,
        Disposition::Drop => answers::Disposition::Drop,
        Disposition::Reject => answers::Disposition::Reject,
    }
}

/// `GET /api/v1/services`: the Services both proxiers know, filtered by
/// `query` (a part of `namespace/name`, or of one of their addresses or
/// their endpoints' addresses), one page.
pub fn services(handle: &NodeHandle, query: &str, offset: usize, limit: usize) -> ServicesPage {
    let (total, page) = handle.services_page(query, offset, limit);
    ServicesPage {
        total,
        offset,
        limit,
        items: page.iter().map(|v| service_item(v)).collect(),
        counted_at: None,
    }
}

/// `GET /api/v1/services?problems=1`: the Services with a quarantined
/// port or with connections rejected or dropped (`snap`), the most
/// refused first, filtered by `query` like [`services`]. Its cost grows
/// with the number of such Services, not with the cluster.
pub fn services_with_problems(
    handle: &NodeHandle,
    snap: Option<&counters::Snapshot>,
    query: &str,
    offset: usize,
    limit: usize,
) -> ServicesPage {
    let mut names: Vec<NamespacedName> = Vec::new();
    let mut add = |n: &NamespacedName| {
        if !names.contains(n) {
            names.push(n.clone());
        }
    };
    for f in handle.families() {
        for (q, _) in &f.quarantined {
            add(&q.service);
        }
    }
    for (_, port) in snap
        .map(counters::Snapshot::problem_ports)
        .unwrap_or_default()
    {
        add(&port.service);
    }
    let views: Vec<Arc<ServiceView>> = names
        .iter()
        .filter_map(|n| handle.service(n))
        .filter(|v| query.is_empty() || v.matches(query))
        .collect();
    ServicesPage {
        total: views.len(),
        offset,
        limit,
        items: views
            .iter()
            .skip(offset)
            .take(limit)
            .map(|v| service_item(v))
            .collect(),
        counted_at: None,
    }
}

/// A Service as the list shows it.
fn service_item(v: &ServiceView) -> ServiceItem {
    ServiceItem {
        namespace: v.name.namespace.to_string(),
        name: v.name.name.to_string(),
        ports: v
            .ports()
            .map(|(family, port)| {
                let sp = &port.port;
                let eps = &port.endpoints;
                ServiceItemPort {
                    family: family.into(),
                    port: port.name.port.to_string(),
                    protocol: sp.protocol.into(),
                    cluster_ip: sp.cluster_ip.to_string(),
                    service_port: sp.port,
                    node_port: sp.node_port,
                    endpoints: eps.len(),
                    ready: eps.iter().filter(|e| e.ready).count(),
                    local: eps.iter().filter(|e| e.is_local && e.ready).count(),
                    quarantined: port.quarantined.is_some(),
                    counts: None,
                }
            })
            .collect(),
        other_ports: Vec::new(),
    }
}

/// `GET /api/v1/problems`: what is wrong on this node, for the web
/// view's overview. Its cost grows with what is wrong, not with the
/// cluster.
pub fn problems(handle: &NodeHandle, snap: Option<&counters::Snapshot>) -> ProblemsAnswer {
    let now = verdict_admin::time::Moment::now();
    let (healthy, health) = {
        let h = handle.health().lock().unwrap_or_else(|e| e.into_inner());
        let body = h.healthz(now).text_body();
        (
            h.healthy(now),
            serde_json::from_str(&body).unwrap_or(Json::Null),
        )
    };
    let mut quarantined = Vec::new();
    for f in handle.families() {
        for (q, why) in &f.quarantined {
            quarantined.push(QuarantinedPort {
                family: f.config.nft_family().into(),
                service: q.service.to_string(),
                port: q.port.to_string(),
                protocol: q.protocol.into(),
                why: why.clone(),
            });
        }
    }
    let mut refused = Vec::new();
    if let Some(snap) = snap {
        for (family, name) in snap.problem_ports() {
            let Some(v) = handle.service(&name.service) else {
                continue;
            };
            if counters::is_invalid_port(&name) {
                // A port the Service does not have: no endpoints to show.
                refused.push(RefusedPort {
                    family: family.into(),
                    service: name.service.to_string(),
                    port: name.port.to_string(),
                    protocol: name.protocol.into(),
                    endpoints: 0,
                    ready: 0,
                    counts: snap.port_counts(family, &name, verdict_model::Counting::None),
                });
                continue;
            }
            let Some(port) = v.port(family, &name) else {
                continue;
            };
            let eps = &port.endpoints;
            refused.push(RefusedPort {
                family: family.into(),
                service: name.service.to_string(),
                port: name.port.to_string(),
                protocol: name.protocol.into(),
                endpoints: eps.len(),
                ready: eps.iter().filter(|e| e.ready).count(),
                counts: snap.port_counts(family, &name, port.port.counting),
            });
        }
    }
    let (failed_syncs, foreign_changes, last_foreign) = {
        let h = handle.history();
        let syncs = h.syncs();
        let foreign = h.foreign_changes();
        (
            syncs.items.iter().filter(|s| s.error.is_some()).count(),
            foreign.total,
            foreign.items.first().map(|f| f.at.clone()),
        )
    };
    ProblemsAnswer {
        counted_at: snap.map(counters::Snapshot::counted_at),
        healthy,
        health,
        refused,
        quarantined,
        failed_syncs,
        foreign_changes,
        last_foreign_change: last_foreign,
    }
}

/// One endpoint as `explain` shows it: its state, which lists use it, and why.
fn endpoint_answer(ep: &Endpoint, sp: &ServicePort, cluster: bool, local: bool) -> ExplainEndpoint {
    let mut used = Vec::new();
    if cluster {
        used.push(answers::EndpointList::Cluster);
    }
    if local {
        used.push(answers::EndpointList::Local);
    }
    let why = if cluster || local {
        if ep.ready {
            "ready".to_owned()
        } else {
            "serving and terminating: used because no endpoint is ready".to_owned()
        }
    } else if !ep.ready && !ep.is_serving_terminating() {
        if ep.terminating {
            "terminating and no longer serving".to_owned()
        } else {
            "not ready".to_owned()
        }
    } else if !ep.ready {
        "serving but terminating: unused while a ready endpoint exists".to_owned()
    } else if sp.uses_cluster_endpoints() {
        let hints = ep
            .zone_hints()
            .into_iter()
            .flatten()
            .map(|z| format!("zone {z}"))
            .chain(
                ep.node_hints()
                    .into_iter()
                    .flatten()
                    .map(|n| format!("node {n}")),
            )
            .collect::<Vec<_>>();
        format!(
            "filtered out by topology: hinted for {}",
            if hints.is_empty() {
                "nothing".to_owned()
            } else {
                hints.join(", ")
            }
        )
    } else {
        "not on this node, and the traffic policy is Local".to_owned()
    };
    ExplainEndpoint {
        address: show_addr(ep.ip, ep.port),
        ready: ep.ready,
        serving: ep.serving,
        terminating: ep.terminating,
        local: ep.is_local,
        node: ep.node_name.as_deref().map(str::to_owned),
        zone: ep.zone.as_deref().map(str::to_owned),
        zone_hints: ep.zone_hints().cloned(),
        node_hints: ep.node_hints().cloned(),
        used_by: used,
        why,
        connections: None,
        packets: None,
        bytes: None,
    }
}

/// How the proxier decides masquerading for traffic to a ClusterIP.
fn cluster_ip_masquerade(cfg: &ProxierConfig) -> String {
    if cfg.masquerade_all {
        return "always masqueraded (masqueradeAll)".into();
    }
    match &cfg.local_detector {
        LocalDetector::None => {
            "never masqueraded: there is no local-traffic detector for this family".into()
        }
        LocalDetector::Cidr(c) => format!("masqueraded unless the source is in {c}"),
        LocalDetector::BridgeInterface(b) => {
            format!("masqueraded unless the packet enters through bridge {b}")
        }
        LocalDetector::InterfaceNamePrefix(p) => {
            format!("masqueraded unless the packet enters through an interface named {p}*")
        }
    }
}

fn external_masquerade(sp: &ServicePort) -> &'static str {
    if sp.external_policy_local() {
        "external clients keep their source address (externalTrafficPolicy: Local); traffic from the node itself is masqueraded; pods go to any endpoint"
    } else {
        "always masqueraded (externalTrafficPolicy: Cluster)"
    }
}

/// The elements `explain` checks in the kernel for `svc`: (family, set,
/// key) of every element the Service programs itself.
pub fn explained_elements(view: &ServiceView) -> Vec<(IpFamily, &'static str, Vec<Value>)> {
    let mut out = Vec::new();
    for (family, port) in view.ports() {
        for e in port.intent.iter().flat_map(|i| i.elements()) {
            if e.programmed_for.is_none() {
                out.push((family, e.set.name(), e.element.key.to_vec()));
            }
        }
    }
    out
}

/// Looks up, set by set, the elements `explain` will check (`wanted`, from
/// [`explained_elements`]), so that `explain` asks the kernel once per set
/// rather than once per key; a table read whole needs nothing.
pub fn prefetch_explained(
    wanted: &[(IpFamily, &'static str, Vec<Value>)],
    kernels: &[(IpFamily, TableRead)],
) {
    for (f, k) in kernels {
        k.prefetch(
            wanted
                .iter()
                .filter(|(x, _, _)| x == f)
                .map(|(_, set, key)| (*set, key)),
        );
    }
}

/// `verdict explain`: one Service, entry point by entry point, endpoint
/// by endpoint, with the elements it owns and whether the kernel holds
/// them (`kernels`: per family, the table read back).
pub fn explain(
    handle: &NodeHandle,
    svc: &NamespacedName,
    kernels: &[(IpFamily, TableRead)],
) -> ExplainAnswer {
    let mut families = Vec::new();
    let (mut missing, mut differs, mut extra) = (0usize, 0usize, 0usize);
    let mut extra_checked = true;
    let view = handle.service(svc);
    for sf in view.iter().flat_map(|v| &v.families) {
        let Some(fv) = handle.family(sf.family) else {
            continue;
        };
        let cfg = &fv.config;
        let kernel = kernels
            .iter()
            .find(|(f, _)| *f == cfg.family)
            .map(|(_, k)| k);
        let table = kernel.and_then(|k| k.table.as_ref());
        let topo = NodeTopology {
            node_name: cfg.node_name.clone(),
            zone: cfg.node_zone.clone(),
        };
        // A table read whole shows the elements that name this Service
        // but that verdict does not want; a targeted read cannot look for
        // them.
        let whole = kernel.is_some_and(|k| k.lookups.is_none());
        if !whole {
            extra_checked = false;
        }
        // The kernel's elements by the comment naming their owner, read
        // once for every port of the Service.
        let mut commented: BTreeMap<&str, Vec<(&str, &Element)>> = BTreeMap::new();
        for (set, s) in table.iter().filter(|_| whole).flat_map(|t| &t.sets) {
            for el in s.elements.values() {
                if let Some(c) = el.comment.as_deref() {
                    commented.entry(c).or_default().push((set.as_str(), el));
                }
            }
        }
        let node_port_ips: Vec<String> = fv.node_port_ips.iter().map(ToString::to_string).collect();
        let mut port_docs = Vec::new();
        for port in &sf.ports {
            let (name, sp) = (&port.name, &*port.port);
            let eps = &port.endpoints[..];
            let cat = categorize_endpoints(eps, sp, &topo);
            let in_list = |list: &[Endpoint], ep: &Endpoint| {
                list.iter().any(|e| e.ip == ep.ip && e.port == ep.port)
            };
            let endpoints: Vec<ExplainEndpoint> = eps
                .iter()
                .map(|ep| {
                    endpoint_answer(ep, sp, in_list(&cat.cluster, ep), in_list(&cat.local, ep))
                })
                .collect();
            let policy = answers::Policy::of;
            let entry = |kind: EntryKind, address: Option<String>| EntryPoint {
                kind,
                address,
                port: None,
                addresses: None,
                source_ranges: None,
                traffic_policy: policy(sp.external_policy_local()),
                masquerade: external_masquerade(sp).into(),
            };
            let mut entry_points = vec![EntryPoint {
                traffic_policy: policy(sp.internal_policy_local),
                masquerade: cluster_ip_masquerade(cfg),
                ..entry(
                    EntryKind::ClusterIP,
                    Some(show_addr(sp.cluster_ip, sp.port)),
                )
            }];
            for ip in &sp.external_ips {
                entry_points.push(entry(EntryKind::ExternalIP, Some(show_addr(*ip, sp.port))));
            }
            for ip in &sp.load_balancer_vips {
                entry_points.push(EntryPoint {
                    source_ranges: Some(
                        sp.load_balancer_source_ranges
                            .iter()
                            .map(ToString::to_string)
                            .collect(),
                    ),
                    ..entry(EntryKind::LoadBalancer, Some(show_addr(*ip, sp.port)))
                });
            }
            if let Some(np) = sp.node_port {
                entry_points.push(EntryPoint {
                    port: Some(np),
                    addresses: Some(node_port_ips.clone()),
                    ..entry(EntryKind::NodePort, None)
                });
            }
            let intent = port.intent.as_ref();
            let mut elements = Vec::new();
            for e in intent.into_iter().flat_map(|i| i.elements()) {
                let state = match (kernel.filter(|_| table.is_some()), &e.programmed_for) {
                    (_, Some(first)) => {
                        format!("shared: {first} claims it first, its element is programmed")
                    }
                    (None, _) => "unknown: the table was not read".to_owned(),
                    (Some(k), None) => match k
                        .element(e.set.name(), &e.element.key)
                        .filter(|found| found.key == e.element.key)
                    {
                        None if k.staged(e.set.name(), e.element) => format!(
                            "in the kernel, staged: moves into @{} shortly",
                            e.set.name()
                        ),
                        None => {
                            missing += 1;
                            "MISSING from the kernel".to_owned()
                        }
                        Some(k) if k.value != e.element.value => {
                            differs += 1;
                            format!(
                                "DIFFERS in the kernel: {}",
                                k.value
                                    .as_ref()
                                    .map(ToString::to_string)
                                    .unwrap_or_default()
                            )
                        }
                        Some(_) => "in the kernel".to_owned(),
                    },
                };
                elements.push(ExplainElement {
                    set: e.set.name().into(),
                    element: element_text(e.element),
                    kernel: state,
                    programmed_for: e.programmed_for.as_ref().map(ToString::to_string),
                });
            }
            // Elements in the kernel that name this port but that it does
            // not want (a comment names the owner of dispatch elements).
            let wanted: Vec<(&str, &[Value])> = intent
                .map(|i| {
                    i.elements()
                        .map(|e| (e.set.name(), &e.element.key[..]))
                        .collect()
                })
                .unwrap_or_default();
            let port_name = name.to_string();
            for (set, el) in commented.get(port_name.as_str()).into_iter().flatten() {
                // A staged jump's key names its Service in its target's set.
                let staged_for = layout::parse_staging_set(set).map(|(map, _)| map);
                let wants = |set: &str| wanted.contains(&(set, &el.key[..]));
                if !wants(set) && !staged_for.is_some_and(wants) {
                    extra += 1;
                    elements.push(ExplainElement {
                        set: (*set).into(),
                        element: element_text(el),
                        kernel: "EXTRA in the kernel: verdict does not want it".into(),
                        programmed_for: None,
                    });
                }
            }
            let local_ready = eps.iter().filter(|e| e.is_local && e.ready).count();
            port_docs.push(ExplainPort {
                port: name.port.to_string(),
                protocol: sp.protocol.into(),
                quarantined: port.quarantined.clone(),
                detail: Some(ExplainPortDetail {
                    service_port: sp.port,
                    entry_points,
                    internal_traffic_policy: policy(sp.internal_policy_local),
                    external_traffic_policy: policy(sp.external_policy_local()),
                    session_affinity_seconds: sp.session_affinity_timeout,
                    health_check_node_port: sp.health_check_node_port.map(|port| HealthCheck {
                        port,
                        code: if local_ready > 0 { 200 } else { 503 },
                        local_endpoints: local_ready,
                    }),
                    has_usable_endpoints: cat.has_any_endpoints,
                    endpoints,
                    endpoints_total: None,
                    endpoints_matched: None,
                    elements,
                    elements_total: None,
                    chains: intent
                        .map(|i| i.chains.iter().map(ToString::to_string).collect())
                        .unwrap_or_default(),
                    counts: None,
                }),
            });
        }
        for (q, reason) in &sf.quarantined_gone {
            port_docs.push(ExplainPort {
                port: q.port.to_string(),
                protocol: q.protocol.into(),
                quarantined: Some(reason.clone()),
                detail: None,
            });
        }
        families.push(ExplainFamily {
            family: cfg.nft_family().into(),
            table: cfg.table.clone(),
            source: kernel.map(|k| k.source),
            read: kernel.map(TableRead::read_kind),
            read_ms: kernel.map(TableRead::read_ms),
            ports: port_docs,
        });
    }
    ExplainAnswer {
        namespace: svc.namespace.to_string(),
        name: svc.name.to_string(),
        found: !families.is_empty(),
        families,
        drift: DriftCounts {
            missing,
            differs,
            extra: extra_checked.then_some(extra),
        },
        counted_at: None,
        other_ports: Vec::new(),
    }
}

/// A page of a Service's endpoints and elements (`explain` for the web
/// view: a Service of thousands of endpoints sends a page of them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExplainPage {
    /// Only the endpoints whose address holds this.
    pub filter: String,
    /// The endpoints with the most connections first (else by address).
    pub by_connections: bool,
    /// Endpoints skipped, and the most sent.
    pub endpoints: (usize, usize),
    /// Elements skipped, and the most sent.
    pub elements: (usize, usize),
}

/// Keeps, of each port of `doc`, the page of endpoints and elements
/// `page` asks for, and says how many there are.
pub fn page_explained(doc: &mut ExplainAnswer, page: &ExplainPage) {
    for d in doc
        .families
        .iter_mut()
        .flat_map(|f| &mut f.ports)
        .filter_map(|p| p.detail.as_mut())
    {
        let total = d.endpoints.len();
        let mut eps: Vec<_> = std::mem::take(&mut d.endpoints)
            .into_iter()
            .filter(|e| page.filter.is_empty() || e.address.contains(&page.filter))
            .collect();
        let key = |e: &answers::ExplainEndpoint| {
            let at: Option<std::net::SocketAddr> = e.address.parse().ok();
            (at.map(|a| a.ip()), at.map(|a| a.port()))
        };
        if page.by_connections {
            eps.sort_by(|a, b| {
                b.connections
                    .unwrap_or(0)
                    .cmp(&a.connections.unwrap_or(0))
                    .then_with(|| key(a).cmp(&key(b)))
            });
        } else {
            eps.sort_by_key(key);
        }
        d.endpoints_total = Some(total);
        d.endpoints_matched = Some(eps.len());
        d.endpoints = eps
            .into_iter()
            .skip(page.endpoints.0)
            .take(page.endpoints.1)
            .collect();
        d.elements_total = Some(d.elements.len());
        d.elements = std::mem::take(&mut d.elements)
            .into_iter()
            .skip(page.elements.0)
            .take(page.elements.1)
            .collect();
    }
}

fn element_text(e: &Element) -> String {
    match &e.value {
        Some(v) => format!("{} : {}", show_key(&e.key), v),
        None => show_key(&e.key),
    }
}

/// The drift of a whole table: elements verdict wants that the kernel
/// lacks or holds with another value, and elements in verdict's sets
/// that it does not want (the sets the data path writes left out:
/// affinity, and the memory of refused connections). What verdict wants is gathered one set at a time, and a
/// table read without its elements (netlink) is read one set at a time,
/// each element compared as it arrives: the answer holds one set of what
/// verdict wants and one reply of the kernel's (it held every set of the
/// first and a whole set of the second: 33 MiB more RSS at 30,000
/// Services).
pub fn drift(
    handle: &NodeHandle,
    f: &FamilyView,
    kernel: &TableRead,
    helper: Option<TableRead>,
) -> FamilyDrift {
    let family = f.config.nft_family().into();
    let Some(t) = &kernel.table else {
        return FamilyDrift {
            family,
            table: false,
            missing: 0,
            differs: 0,
            extra: 0,
            examples: Vec::new(),
            read_ms: kernel.read_ms(),
        };
    };
    // What the family's Services want is gathered one set at a time, as
    // the kernel's side is read: the answer holds one set of each reader,
    // never the whole table.
    let views = handle.all_services();
    let intents = || {
        views
            .iter()
            .flat_map(|v| &v.families)
            .filter(|sf| sf.family == f.config.family)
            .flat_map(|sf| &sf.ports)
            .flat_map(|port| port.intent.iter().flat_map(|i| i.elements()))
    };
    // How many elements each set should hold, to share the sets out.
    // A staged map's staging sets are read with the map.
    let mut wanted: BTreeMap<&str, usize> = t
        .sets
        .keys()
        .filter(|n| layout::map_of_staging(n).is_none())
        // The data path's own writes (affinity, the memory of refused
        // connections) are traffic, not drift.
        .filter(|n| !layout::written_by_the_data_path(n))
        .map(|n| (n.as_str(), 0))
        .collect();
    for e in intents() {
        *wanted.entry(e.set.name()).or_default() += 1;
    }
    let mut found = Found::default();
    let mut helper_read = 0.0;
    match helper.filter(|h| h.reads_by_set() && kernel.reads_by_set()) {
        // Two readers, each on its own socket, read the sets side by side
        // (the kernel walks a set again for each message of its dump, in
        // the reader's own thread): the largest sets first, each to the
        // reader with less to read.
        Some(helper) => {
            let mut by_size: Vec<(&str, usize)> = wanted.into_iter().collect();
            by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            let (mut my_load, mut their_load) = (0, 0);
            for (name, n) in by_size {
                if my_load <= their_load {
                    mine.push(name);
                    my_load += n;
                } else {
                    theirs.push(name);
                    their_load += n;
                }
            }
            let (helped, helper) = std::thread::scope(|scope| {
                let intents = &intents;
                let worker = scope.spawn(move || {
                    let mut out = Found::default();
                    for name in &theirs {
                        drift_of_set(name, t, f, intents, &helper, &mut out);
                    }
                    (out, helper)
                });
                for name in &mine {
                    drift_of_set(name, t, f, &intents, kernel, &mut found);
                }
                // A worker's panic goes on here, as it would have on this
                // thread.
                worker
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            });
            found.absorb(helped);
            kernel.take_failure(&helper);
            helper_read = helper.read_ms();
        }
        None => {
            for name in wanted.keys() {
                drift_of_set(name, t, f, &intents, kernel, &mut found);
            }
        }
    }
    let Found {
        mut missing,
        mut differs,
        mut extra,
    } = found;
    let node_port_ips = &f.node_port_ips;
    if !t.sets.contains_key(layout::NODEPORT_IPS) {
        for ip in node_port_ips {
            missing.push(format!("missing {}: {ip}", layout::NODEPORT_IPS));
        }
    }
    missing.sort();
    differs.sort();
    // An element read twice (the set changed while it was read) is one.
    extra.sort();
    extra.dedup();
    const SHOWN: usize = 20;
    FamilyDrift {
        family,
        table: true,
        missing: missing.len(),
        differs: differs.len(),
        extra: extra.len(),
        examples: missing
            .iter()
            .chain(&differs)
            .chain(&extra)
            .take(SHOWN)
            .cloned()
            .collect(),
        // The readers read side by side: the longer of the two.
        read_ms: helper_read.max(kernel.read_ms()),
    }
}

/// The verdict map whose gate or staging set `set` is; else `set`.
fn map_of(set: &str) -> &str {
    layout::map_of_staging(set).unwrap_or(set)
}

/// What a drift check found wrong, as lines of text.
#[derive(Default)]
struct Found {
    missing: Vec<String>,
    differs: Vec<String>,
    extra: Vec<String>,
}

impl Found {
    /// Adds what another reader found.
    fn absorb(&mut self, other: Found) {
        self.missing.extend(other.missing);
        self.differs.extend(other.differs);
        self.extra.extend(other.extra);
    }
}

/// Compares one set of the table `t` with what the family's Services want
/// of it (`intents`), reading the kernel's side through `kernel`.
fn drift_of_set<'v, I>(
    name: &str,
    t: &verdict_nft::TableState,
    f: &FamilyView,
    intents: &(impl Fn() -> I + ?Sized),
    kernel: &TableRead,
    out: &mut Found,
) where
    I: Iterator<Item = verdict_proxier::IntendedElement<'v>>,
{
    let Found {
        missing,
        differs,
        extra,
    } = out;
    let node_port_ips = &f.node_port_ips;
    // The element programmed for each key of this set (another port's
    // claim on the key names it as programmed_for), and whether the
    // kernel has it.
    let mut want = Wanted::new(
        intents()
            .filter(|e| e.set == name && e.programmed_for.is_none())
            .map(|e| &**e.element),
    );
    // NodePort addresses belong to the node, not to a Service.
    let node_owned = name == layout::NODEPORT_IPS;
    let mut node_ips_seen = vec![false; node_port_ips.len()];
    // The kernel's elements are compared as they are read, one reply at a
    // time.
    let mut see = |e: &Element| {
        let node_ip = match &e.key[..] {
            [Value::Addr(ip)] if node_owned => node_port_ips.iter().position(|n| n == ip),
            _ => None,
        };
        if let Some(i) = node_ip {
            node_ips_seen[i] = true;
        }
        let wanted = match want.get_mut(&e.key) {
            Some((w, seen)) => {
                if !*seen && w.value != e.value {
                    differs.push(format!("differs {name}: {}", element_text(w)));
                }
                *seen = true;
                true
            }
            None => false,
        };
        let wanted = if node_owned {
            node_ip.is_some()
        } else {
            wanted
        };
        if !wanted {
            extra.push(format!("extra {name}: {}", element_text(e)));
        }
    };
    if t.sets.contains_key(name) {
        kernel.each_in_set(name, &mut see);
    }
    // A staged jump is in the map's gate set and in the set of its target
    // chain: the element the map would hold.
    if let Some(gate) = layout::staged_of(name)
        && t.sets.contains_key(gate)
    {
        let mut keys: BTreeMap<Arc<[Value]>, bool> = BTreeMap::new();
        kernel.each_in_set(gate, &mut |e: &Element| {
            keys.insert(e.key.clone(), false);
        });
        let mut stray = Vec::new();
        for set in t.sets.keys() {
            let Some((map, target)) = layout::parse_staging_set(set) else {
                continue;
            };
            if map != name {
                continue;
            }
            kernel.each_in_set(set, &mut |e: &Element| match keys.get_mut(&e.key) {
                Some(used) => {
                    *used = true;
                    see(&Element::map(
                        e.key.clone(),
                        verdict_nft::ElementValue::Verdict(verdict_nft::Verdict::Goto(
                            target.to_owned(),
                        )),
                    ));
                }
                None => stray.push(format!("extra {set}: {}", element_text(e))),
            });
        }
        extra.append(&mut stray);
        for (key, used) in keys {
            if !used {
                extra.push(format!("extra {gate}: {}", show_key(&key)));
            }
        }
    }
    for (e, seen) in &want.entries {
        if !seen {
            missing.push(format!("missing {name}: {}", element_text(e)));
        }
    }
    if node_owned {
        for (ip, seen) in node_port_ips.iter().zip(node_ips_seen) {
            if !seen {
                missing.push(format!("missing {}: {ip}", layout::NODEPORT_IPS));
            }
        }
    }
}

/// What verdict wants of one set, found by key, with whether the kernel
/// was seen to have each: the entries, and an open-addressed table of
/// their places (4 bytes a slot, at most half full). At 30,000 Services
/// the endpoint map's 60,000 keys take 1.5 MB so, where a hash map of
/// references took 4.3 MB, at a drift read's peak.
struct Wanted<'a> {
    entries: Vec<(&'a Element, bool)>,
    slots: Vec<u32>,
    hasher: std::hash::RandomState,
}

impl<'a> Wanted<'a> {
    const EMPTY: u32 = u32::MAX;

    /// The elements, one per key (the first of a key is kept).
    fn new(elements: impl Iterator<Item = &'a Element>) -> Wanted<'a> {
        let elements: Vec<&Element> = elements.collect();
        let n = (elements.len() * 2).next_power_of_two().max(2);
        let mut w = Wanted {
            entries: Vec::with_capacity(elements.len()),
            slots: vec![Self::EMPTY; n],
            hasher: std::hash::RandomState::new(),
        };
        for e in elements {
            if let Err(slot) = w.probe(&e.key) {
                w.slots[slot] = w.entries.len() as u32;
                w.entries.push((e, false));
            }
        }
        w
    }

    /// The slot holding `key`'s entry (`Ok`), or the empty one where it
    /// would go (`Err`).
    fn probe(&self, key: &[Value]) -> Result<usize, usize> {
        use std::hash::BuildHasher;
        let mask = self.slots.len() - 1;
        let mut slot = self.hasher.hash_one(key) as usize & mask;
        loop {
            match self.slots[slot] {
                Self::EMPTY => return Err(slot),
                i if self.entries[i as usize].0.key[..] == *key => return Ok(slot),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    fn get_mut(&mut self, key: &[Value]) -> Option<(&'a Element, &mut bool)> {
        let slot = self.probe(key).ok()?;
        let (e, seen) = &mut self.entries[self.slots[slot] as usize];
        Some((*e, seen))
    }
}

#[cfg(test)]
mod tests;

/// What verdict does about a stale flow of this protocol.
fn stale_policy(proto: verdict_model::Protocol) -> &'static str {
    if proto == verdict_model::Protocol::Udp {
        "deleted by verdict's stale UDP conntrack cleanup after the sync that removed the endpoint, as kube-proxy does; one still listed is about to go, or the cleanup failed (see the log)"
    } else {
        "left to finish or time out: verdict, like kube-proxy, deletes no TCP or SCTP entries; new connections no longer reach the endpoint"
    }
}

/// Whether a conntrack entry in `state` is still a connection: TCP and
/// SCTP entries that are closing or closed (TIME_WAIT, CLOSE, …) are not;
/// UDP entries have no state and are.
pub fn is_open(state: &str) -> bool {
    !matches!(
        state,
        "TIME_WAIT" | "CLOSE" | "CLOSED" | "SHUTDOWN_SENT" | "SHUTDOWN_RECD" | "SHUTDOWN_ACK_SENT"
    )
}

/// Which flows `connections` lists (the counts cover all of them).
#[derive(Clone, Debug, Default)]
pub struct ConnectionFilter {
    /// Only this conntrack state (`ESTABLISHED`, `TIME_WAIT`, …).
    pub state: Option<String>,
    /// Only the stale ones.
    pub stale: bool,
}

/// `verdict connections`: the DNATed connections in the kernel's
/// conntrack table, by Service port and endpoint, with the stale ones
/// (still open, to an endpoint that is gone) flagged; `service` narrows
/// it to one Service, `limit` caps the flows listed and `filter` chooses
/// them (the counts cover all of them).
pub fn connections(
    handle: &NodeHandle,
    flows: &[(IpFamily, Vec<verdict_nft::conntrack::Flow>)],
    service: Option<&NamespacedName>,
    limit: usize,
    filter: &ConnectionFilter,
) -> ConnectionsAnswer {
    let mut total = 0usize;
    let mut other = 0usize;
    // (service port) → (flows, stale, closed to a gone endpoint,
    // endpoint → (flows, gone)).
    type Tally = (usize, usize, usize, BTreeMap<String, (usize, bool)>);
    let mut by_port: BTreeMap<ServicePortName, Tally> = BTreeMap::new();
    let mut listed = Vec::new();
    for (family, list) in flows {
        let Some(fv) = handle.family(*family) else {
            continue;
        };
        for f in list {
            let proto = f.proto.to_ascii_lowercase();
            // The Service port the client sent to: by its address, else by
            // a NodePort on one of the node's NodePort addresses. The
            // first in name order, as the proxier programs a shared entry.
            let by_address = handle.services_at(f.dst);
            let by_node_port = if by_address.is_empty() && fv.node_port_ips.contains(&f.dst) {
                handle.services_at_node_port(*family, f.dport)
            } else {
                Vec::new()
            };
            let port = by_address
                .iter()
                .flat_map(|v| v.ports())
                .filter(|(fam, p)| {
                    *fam == *family
                        && p.port.protocol.as_str() == proto
                        && p.port.port == f.dport
                        && (p.port.cluster_ip == f.dst
                            || p.port.external_ips.contains(&f.dst)
                            || p.port.load_balancer_vips.contains(&f.dst))
                })
                .chain(
                    by_node_port
                        .iter()
                        .flat_map(|v| v.ports())
                        .filter(|(fam, p)| {
                            *fam == *family
                                && p.port.protocol.as_str() == proto
                                && p.port.node_port == Some(f.dport)
                        }),
                )
                .map(|(_, p)| p)
                .min_by(|a, b| a.name.cmp(&b.name));
            let Some(port) = port else {
                other += 1;
                continue;
            };
            if service.is_some_and(|s| port.name.service != *s) {
                continue;
            }
            total += 1;
            let gone = !port
                .endpoints
                .iter()
                .any(|e| e.ip == f.reply_src && e.port == f.reply_sport);
            let open = is_open(&f.state);
            let stale = gone && open;
            let endpoint = show_addr(f.reply_src, f.reply_sport);
            let t = by_port.entry(port.name.clone()).or_default();
            t.0 += 1;
            t.1 += usize::from(stale);
            t.2 += usize::from(gone && !open);
            let e = t.3.entry(endpoint.clone()).or_insert((0, gone));
            e.0 += 1;
            let chosen = (!filter.stale || stale)
                && filter
                    .state
                    .as_deref()
                    .is_none_or(|s| s.eq_ignore_ascii_case(&f.state));
            if chosen && listed.len() < limit {
                listed.push(FlowAnswer {
                    service: port.name.to_string(),
                    proto: port.name.protocol.into(),
                    state: f.state.clone(),
                    client: show_addr(f.src, f.sport),
                    entry: show_addr(f.dst, f.dport),
                    endpoint,
                    stale,
                    open,
                    replied: f.replied,
                    expires_in: f.timeout,
                    packets: f.packets,
                    bytes: f.bytes,
                    what_verdict_does: stale.then(|| stale_policy(port.name.protocol).to_owned()),
                });
            }
        }
    }
    let services = by_port
        .into_iter()
        .map(|(port, (n, stale, closed, eps))| ConnectionsOfPort {
            service: port.service.to_string(),
            port: port.port.to_string(),
            protocol: port.protocol.into(),
            flows: n,
            stale,
            closed_to_gone: closed,
            endpoints: eps
                .into_iter()
                .map(|(endpoint, (flows, stale))| ConnectionsOfEndpoint {
                    endpoint,
                    flows,
                    stale,
                })
                .collect(),
        })
        .collect();
    ConnectionsAnswer {
        total,
        not_services: other,
        services,
        flows: listed,
        limit,
    }
}
