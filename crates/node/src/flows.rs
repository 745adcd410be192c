//! The flow stream (`--flows`): a bounded record of the recent connections
//! through this node's Services, each with where it went or why it was
//! refused.
//!
//! The kernel reports them ([`verdict_nft::flows`]): conntrack's events for
//! the connections it forwarded (confirmed, then destroyed with their
//! packets and bytes), and the first packet of each connection a rule
//! rejected or dropped, logged with a prefix that says why. The
//! [`Recorder`] matches each to a Service by the entry point it was sent
//! to, through the read model's indexes, and keeps it in a [`FlowStore`]: a
//! ring of the most recent flows (older ones are evicted and counted), with
//! two indexes that point only into the ring, so the memory is bounded
//! whatever the rate. Connections to an address no Service has are not
//! recorded (except the unallocated ClusterIPs the table drops, which the
//! operator asked about by having a service CIDR).
//!
//! Readers (`/api/v1/flows`, `verdict flows`, the web view) take the store's
//! lock to copy a page; the recorder takes it to add a batch. Neither
//! waits for the kernel or a sync. The optional flow log writes each flow
//! as one JSON line when it is recorded and, for a forwarded connection,
//! once more when it closes.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use verdict_admin::Metrics;
use verdict_model::{IpFamily, Name, NamespacedName, Protocol, Workload};
use verdict_nft::flows::{Connection, FlowEvent, FlowMonitor, Logged};
use verdict_proxier::layout;

use crate::view::{NodeHandle, PortView, ServiceView};

mod aggregate;
mod log;
pub use aggregate::{AggregateRecord, AggregatesAnswer};
pub use log::{FlowLog, Limits as FlowLogLimits, LogWriter};

/// The nfnetlink_log group the table logs to, unless told otherwise.
pub const DEFAULT_GROUP: u16 = 7331;
/// Flows kept, unless told otherwise (the ring's RSS with it full is in
/// docs/flows.md).
pub const DEFAULT_CAPACITY: usize = 16_384;
/// The share of a full ring one client address may hold: past it, a new
/// flow of that client takes the place of its own oldest, not another
/// client's (1/16: 1,024 flows of the default 16,384).
pub const CLIENT_SHARE: usize = 16;
/// How long connections stay followed, on demand, after a reader last
/// asked for flows.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(600);

/// When the recorder follows connections (reads conntrack's events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Following {
    /// From start to end (`--flows`, `--flow-log`).
    Always,
    /// While a reader asked for flows within `linger` (the default): the
    /// kernel builds a report of each new connection, in the path of its
    /// first packet, only while some socket listens.
    OnDemand {
        /// How long after the last ask.
        linger: Duration,
    },
}

/// How long the recorder lets reports gather after the first one, before it
/// reads them: a flow is recorded at most this late.
const GATHER: Duration = Duration::from_millis(50);
/// How long a logged packet of a connection already recorded counts as
/// its retry: as long as the table remembers a rejected connection.
const RETRY_WINDOW: Duration = Duration::from_secs(layout::PROBLEM_TIMEOUT as u64);

use verdict_admin::metrics::{
    FLOWS_EVICTED as METRIC_EVICTED, FLOWS_FOLDED as METRIC_FOLDED,
    FLOWS_NOT_RECORDED as METRIC_NOT_RECORDED, FLOWS_RECORDED as METRIC_RECORDED,
};
/// The reason of `verdict_flows_not_recorded_total` for the flows the
/// aggregates had no room for (they may still be in the ring).
pub const NOT_AGGREGATED: &str = "aggregate_budget";

/// What became of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowVerdict {
    /// Sent to an endpoint.
    Forwarded,
    /// Refused with a reset or an ICMP error.
    Rejected,
    /// Dropped without an answer.
    Dropped,
}

impl FlowVerdict {
    /// Every verdict.
    pub const ALL: [FlowVerdict; 3] = [
        FlowVerdict::Forwarded,
        FlowVerdict::Rejected,
        FlowVerdict::Dropped,
    ];

    /// Its name, as the API and the metrics spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowVerdict::Forwarded => "forwarded",
            FlowVerdict::Rejected => "rejected",
            FlowVerdict::Dropped => "dropped",
        }
    }

    /// The verdict of this name.
    pub fn parse(s: &str) -> Option<FlowVerdict> {
        FlowVerdict::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// How the connection entered the Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    /// Its ClusterIP.
    ClusterIP,
    /// One of its external IPs.
    ExternalIP,
    /// One of its load-balancer addresses.
    LoadBalancer,
    /// Its NodePort, on one of the node's addresses.
    NodePort,
}

/// One connection through a Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Its place in the stream: later flows have larger numbers.
    pub seq: u64,
    /// When it was first seen (RFC 3339).
    pub first_seen: String,
    /// When it was last seen: closed, or its last retry.
    pub last_seen: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The client's address and port.
    pub client: SocketAddr,
    /// The client's pod (`namespace/name`): the pod at the client's
    /// address, as the watch of Pods (`--watch-pods`) or else an
    /// EndpointSlice the node holds names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_pod: Option<String>,
    /// The client pod's workload (`Deployment/web`), with `--watch-pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_workload: Option<String>,
    /// How it entered (`None`: an address of the service CIDRs no Service has).
    pub entry: Option<EntryKind>,
    /// The address and port it was sent to.
    pub destination: SocketAddr,
    /// The Service (`namespace/name`), when one has the destination.
    pub service: Option<String>,
    /// The Service's port name, when the port is one of the Service's.
    pub port: Option<String>,
    /// The endpoint chosen.
    pub endpoint: Option<SocketAddr>,
    /// The endpoint's pod (`targetRef.name`), when the EndpointSlice says.
    pub pod: Option<String>,
    /// The endpoint pod's workload (`Deployment/web`), with `--watch-pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The source was masqueraded (the endpoint saw the node, not the client).
    pub masqueraded: bool,
    /// Packets both ways, when conntrack accounting is on and it closed.
    pub packets: Option<u64>,
    /// Bytes both ways, likewise.
    pub bytes: Option<u64>,
    /// What became of it.
    pub verdict: FlowVerdict,
    /// Why it was rejected or dropped.
    pub reason: Option<String>,
    /// Still open (forwarded, and not yet destroyed in conntrack).
    pub open: bool,
    /// Packets of it the table logged (a rejected connection's retries
    /// seen after the table forgot it, or datagrams to an invalid port).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Which flows a reader wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFilter {
    /// Only this Service's.
    pub service: Option<NamespacedName>,
    /// Only the Services of this namespace.
    pub namespace: Option<String>,
    /// Only flows with this address as client, destination or endpoint.
    pub ip: Option<IpAddr>,
    /// Only flows with this verdict.
    pub verdict: Option<FlowVerdict>,
    /// Only flows seen since then.
    pub since: Option<SystemTime>,
    /// Only flows after this one (a follower's last).
    pub after: Option<u64>,
}

impl FlowFilter {
    /// Whether it admits `f`. ([`FlowStore::query`] stops at
    /// [`after`](Self::after).)
    fn admits(&self, f: &Flow) -> bool {
        let service = f.service.as_ref();
        self.verdict.is_none_or(|v| f.verdict == v)
            && self.since.is_none_or(|t| f.last >= t)
            && self.service.as_ref().is_none_or(|s| service == Some(s))
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| service.is_some_and(|s| s.namespace.as_str() == ns.as_str()))
            && self.ip.is_none_or(|ip| {
                f.client.ip() == ip
                    || f.destination.ip() == ip
                    || f.endpoint.is_some_and(|e| e.ip() == ip)
            })
    }
}

/// A page of the stream, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowsAnswer {
    /// The flows that match, newest first, at most the limit.
    pub flows: Vec<FlowRecord>,
    /// How many match in all.
    pub matched: usize,
    /// The newest flow's number (a follower asks for those after it).
    pub last_seq: u64,
    /// Flows kept at most.
    pub capacity: usize,
    /// Flows recorded since start, by verdict.
    pub recorded: HashMap<FlowVerdict, u64>,
    /// Flows evicted to make room.
    pub evicted: u64,
    /// Flows of a client past its share of the full ring, dropped for the
    /// same client's newer ones rather than evicting other clients' (the
    /// aggregates keep counting them).
    #[serde(default)]
    pub folded: u64,
    /// The most flows one client address keeps in a full ring.
    #[serde(default)]
    pub client_share: usize,
    /// Reports the kernel dropped because the reader fell behind: flows
    /// (or their ends) not recorded.
    pub not_recorded: u64,
    /// Forwarded connections are recorded only while flows are read (the
    /// default: the kernel reports connections only while someone
    /// listens, and each report costs the connection's first packet);
    /// `false`: always (`--flows`). Rejected and dropped ones always are.
    #[serde(default)]
    pub on_demand: bool,
    /// Since when forwarded connections are recorded (RFC 3339); none:
    /// not now (they will be within a second of this answer, if on demand).
    #[serde(default)]
    pub following_since: Option<String>,
    /// Which stream this is: another value is another process's, whose
    /// flows are numbered from 1 again (a follower then starts over).
    #[serde(default)]
    pub stream: String,
}

/// (protocol, client, destination): one connection, before DNAT.
type Key = (u8, SocketAddr, SocketAddr);

/// One connection as the ring keeps it: times as times, names shared with
/// the read model (`Name`s are reference-counted), nothing allocated for
/// it alone. A reader gets it as a [`FlowRecord`].
#[derive(Clone, Debug)]
struct Flow {
    seq: u64,
    first: SystemTime,
    last: SystemTime,
    /// The protocol's number (6, 17, 132), as the kernel reports it.
    proto: u8,
    client: SocketAddr,
    client_pod: Option<NamespacedName>,
    client_workload: Option<Arc<Workload>>,
    entry: Option<EntryKind>,
    destination: SocketAddr,
    service: Option<NamespacedName>,
    port: Option<Name>,
    endpoint: Option<SocketAddr>,
    pod: Option<Name>,
    workload: Option<Arc<Workload>>,
    masqueraded: bool,
    open: bool,
    verdict: FlowVerdict,
    retries: u32,
    reason: Option<&'static str>,
    packets: Option<u64>,
    bytes: Option<u64>,
    conntrack_id: Option<u32>,
}

impl Flow {
    /// A connection first seen at `seen`, nothing known of it yet but
    /// where it was sent and what became of it.
    fn new(
        seen: SystemTime,
        proto: u8,
        client: SocketAddr,
        destination: SocketAddr,
        verdict: FlowVerdict,
    ) -> Flow {
        Flow {
            seq: 0,
            first: seen,
            last: seen,
            proto,
            client,
            client_pod: None,
            client_workload: None,
            entry: None,
            destination,
            service: None,
            port: None,
            endpoint: None,
            pod: None,
            workload: None,
            masqueraded: false,
            open: false,
            verdict,
            retries: 0,
            reason: None,
            packets: None,
            bytes: None,
            conntrack_id: None,
        }
    }

    /// Its key in the ring's index of connections.
    fn key(&self) -> Key {
        (self.proto, self.client, self.destination)
    }

    /// The flow as readers and the flow log see it.
    fn record(&self) -> FlowRecord {
        FlowRecord {
            seq: self.seq,
            first_seen: verdict_admin::time::rfc3339_micro(self.first),
            last_seen: verdict_admin::time::rfc3339_micro(self.last),
            protocol: protocol_name(self.proto),
            client: self.client,
            client_pod: self.client_pod.as_ref().map(ToString::to_string),
            client_workload: self.client_workload.as_ref().map(ToString::to_string),
            entry: self.entry,
            destination: self.destination,
            service: self.service.as_ref().map(ToString::to_string),
            port: self.port.as_ref().map(|p| p.as_str().to_owned()),
            endpoint: self.endpoint,
            pod: self.pod.as_ref().map(|p| p.as_str().to_owned()),
            workload: self.workload.as_ref().map(ToString::to_string),
            masqueraded: self.masqueraded,
            packets: self.packets,
            bytes: self.bytes,
            verdict: self.verdict,
            reason: self.reason.map(str::to_owned),
            open: self.open,
            retries: self.retries,
        }
    }
}

/// A place of the ring: a flow, or the number of one dropped from the
/// middle (past its client's share) until the place reaches the front or
/// the ring is compacted.
#[derive(Debug)]
struct Slot {
    seq: u64,
    flow: Option<Flow>,
}

#[derive(Debug)]
struct Ring {
    /// In the order of their numbers.
    slots: VecDeque<Slot>,
    /// Flows in `slots`.
    live: usize,
    capacity: usize,
    /// The most flows one client address keeps once the ring is full.
    share: usize,
    /// The numbers of each client address's flows in the ring, oldest first.
    by_client: HashMap<IpAddr, VecDeque<u64>>,
    /// The clients holding more than their share (after a flood filled
    /// the ring): their flows make room first.
    over: std::collections::BTreeSet<IpAddr>,
    next_seq: u64,
    by_id: HashMap<u32, u64>,
    by_key: HashMap<Key, u64>,
    recorded: HashMap<FlowVerdict, u64>,
    evicted: u64,
    folded: u64,
    not_recorded: u64,
    /// Every flow, over time, without the client's port.
    aggregates: aggregate::Aggregates,
    /// Connections are followed only while flows are read.
    on_demand: bool,
    /// The last time a reader asked for flows.
    asked: Option<Instant>,
    /// Since when the kernel's conntrack events are read (`None`: not now).
    following_since: Option<SystemTime>,
    /// This stream's name: when it began, to the nanosecond, and the
    /// process.
    stream: String,
}

impl Ring {
    fn new(capacity: usize, aggregate_budget: usize) -> Ring {
        Ring {
            slots: VecDeque::new(),
            live: 0,
            capacity,
            share: (capacity / CLIENT_SHARE).max(1),
            by_client: HashMap::new(),
            over: std::collections::BTreeSet::new(),
            // Numbers start at 1: a follower that has seen nothing asks
            // for those after 0.
            next_seq: 1,
            by_id: HashMap::new(),
            by_key: HashMap::new(),
            recorded: HashMap::new(),
            evicted: 0,
            folded: 0,
            not_recorded: 0,
            aggregates: aggregate::Aggregates::new(aggregate_budget),
            on_demand: false,
            asked: None,
            following_since: None,
            stream: format!(
                "{}-{}",
                std::process::id(),
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
            ),
        }
    }

    /// The place of flow `seq` in `slots`.
    fn index(&self, seq: u64) -> Option<usize> {
        self.slots.binary_search_by_key(&seq, |s| s.seq).ok()
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Flow> {
        let i = self.index(seq)?;
        self.slots.get_mut(i)?.flow.as_mut()
    }

    /// The flows, newest first.
    fn newest_first(&self) -> impl Iterator<Item = &Flow> {
        self.slots.iter().rev().filter_map(|s| s.flow.as_ref())
    }

    /// Takes flow `seq` out of the ring and its indexes.
    fn take(&mut self, seq: u64) -> Option<Flow> {
        let i = self.index(seq)?;
        let old = self.slots.get_mut(i)?.flow.take()?;
        self.live -= 1;
        let key = old.key();
        if self.by_key.get(&key) == Some(&seq) {
            self.by_key.remove(&key);
        }
        if let Some(id) = old.conntrack_id
            && self.by_id.get(&id) == Some(&seq)
        {
            self.by_id.remove(&id);
        }
        let client = old.client.ip();
        if let Some(q) = self.by_client.get_mut(&client) {
            // Flows leave from a client's front (its oldest), except a
            // flow evicted as the ring's oldest, which may not be.
            if q.front() == Some(&seq) {
                q.pop_front();
            } else {
                q.retain(|s| *s != seq);
            }
            if q.len() <= self.share {
                self.over.remove(&client);
            }
            if q.is_empty() {
                self.by_client.remove(&client);
            }
        }
        // Places of flows taken from the front go; those from the middle
        // wait there until they reach it or the ring is compacted.
        while self.slots.front().is_some_and(|s| s.flow.is_none()) {
            self.slots.pop_front();
        }
        Some(old)
    }

    /// Keeps `flow`. In a full ring it takes the place of its client's
    /// oldest flow if the client holds its share; else of the oldest flow
    /// of a client holding more than its share (a flood's); else of the
    /// oldest flow.
    fn push(&mut self, mut flow: Flow) -> u64 {
        if self.capacity == 0 {
            self.evicted += 1;
            return 0;
        }
        let client = flow.client.ip();
        if self.live >= self.capacity {
            let own = self
                .by_client
                .get(&client)
                .filter(|q| q.len() >= self.share)
                .map(|_| client);
            let past_share = own.or_else(|| self.over.first().copied());
            let oldest_of = past_share
                .and_then(|c| self.by_client.get(&c))
                .and_then(|q| q.front().copied());
            match oldest_of {
                Some(seq) => {
                    self.take(seq);
                    self.folded += 1;
                }
                None => {
                    let oldest = self
                        .slots
                        .iter()
                        .find_map(|s| s.flow.as_ref().map(|f| f.seq));
                    if let Some(seq) = oldest {
                        self.take(seq);
                        self.evicted += 1;
                    }
                }
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        flow.seq = seq;
        *self.recorded.entry(flow.verdict).or_default() += 1;
        self.by_key.insert(flow.key(), seq);
        if let Some(id) = flow.conntrack_id {
            self.by_id.insert(id, seq);
        }
        let held = self.by_client.entry(client).or_default();
        held.push_back(seq);
        if held.len() > self.share {
            self.over.insert(client);
        }
        self.slots.push_back(Slot {
            seq,
            flow: Some(flow),
        });
        self.live += 1;
        // Places left in the middle cost memory: compact when they are as
        // many as the flows (each compaction moves the ring once, after
        // at least `capacity` drops).
        if self.slots.len() > 2 * self.capacity {
            self.slots.retain(|s| s.flow.is_some());
        }
        seq
    }
}

/// The recent flows, shared by the recorder and the readers.
#[derive(Debug)]
pub struct FlowStore {
    ring: Mutex<Ring>,
}

impl FlowStore {
    /// An empty store keeping at most `capacity` flows, and
    /// [`aggregate::DEFAULT_ENTRIES`] aggregated ones.
    pub fn new(capacity: usize) -> Arc<FlowStore> {
        FlowStore::with_budget(capacity, aggregate::DEFAULT_ENTRIES)
    }

    /// An empty store keeping at most `capacity` flows and
    /// `aggregate_budget` aggregated entries.
    pub fn with_budget(capacity: usize, aggregate_budget: usize) -> Arc<FlowStore> {
        Arc::new(FlowStore {
            ring: Mutex::new(Ring::new(capacity, aggregate_budget)),
        })
    }

    /// The aggregated flows `filter` admits, the most connections first,
    /// at most `limit`.
    pub fn aggregated(&self, filter: &FlowFilter, limit: usize) -> AggregatesAnswer {
        let mut r = self.lock();
        r.asked = Some(Instant::now());
        let mut answer = r.aggregates.query(filter, limit);
        answer.stream = r.stream.clone();
        answer
    }

    /// Whether the recorder should follow connections now: always, or
    /// (on demand) while a reader asked for flows within `linger`.
    fn wanted(&self, following: Following, now: Instant) -> bool {
        match following {
            Following::Always => true,
            Following::OnDemand { linger } => self
                .lock()
                .asked
                .is_some_and(|a| now.saturating_duration_since(a) < linger),
        }
    }

    /// Records whether the recorder follows connections, and how.
    fn set_following(&self, following: Following, since: Option<SystemTime>) {
        let mut r = self.lock();
        r.on_demand = matches!(following, Following::OnDemand { .. });
        r.following_since = since;
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The flows `filter` admits, newest first, at most `limit`. The lock
    /// is held only to copy the flows (no allocation but the page's);
    /// they are written out as records after.
    pub fn query(&self, filter: &FlowFilter, limit: usize) -> FlowsAnswer {
        let (page, mut answer) = {
            let mut r = self.lock();
            r.asked = Some(Instant::now());
            let mut page: Vec<Flow> = Vec::new();
            let mut matched = 0;
            for f in r.newest_first() {
                if filter.after.is_some_and(|a| f.seq <= a) {
                    break;
                }
                if !filter.admits(f) {
                    continue;
                }
                matched += 1;
                if page.len() < limit {
                    page.push(f.clone());
                }
            }
            let answer = FlowsAnswer {
                flows: Vec::new(),
                matched,
                last_seq: r.next_seq - 1,
                capacity: r.capacity,
                recorded: r.recorded.clone(),
                evicted: r.evicted,
                folded: r.folded,
                client_share: r.share,
                not_recorded: r.not_recorded,
                on_demand: r.on_demand,
                following_since: r.following_since.map(verdict_admin::time::rfc3339_micro),
                stream: r.stream.clone(),
            };
            (page, answer)
        };
        answer.flows = page.iter().map(Flow::record).collect();
        answer
    }
}

/// A flow's `reason`: the Service port has no usable endpoint.
pub const NO_ENDPOINTS: &str = "no endpoints";
/// A flow's `reason`: a port of a ClusterIP its Service does not have.
pub const INVALID_PORT: &str = "a port the Service does not have";
/// A flow's `reason`: the client is outside `loadBalancerSourceRanges`.
pub const SOURCE_RANGE: &str = "source outside loadBalancerSourceRanges";
/// A flow's `reason`: the traffic policy is Local and no endpoint is here.
pub const NO_LOCAL_ENDPOINT: &str = "no local endpoint for a Local traffic policy";
/// A flow's `reason`: an address of the service CIDRs no Service has.
pub const UNALLOCATED: &str = "unallocated ClusterIP";

/// The reason in words, and the verdict, of a log prefix of verdict's
/// table (`None`: not one of verdict's).
pub fn reason_of(prefix: &str) -> Option<(FlowVerdict, &'static str)> {
    Some(match prefix {
        layout::LOG_REJECTED_NO_ENDPOINTS => (FlowVerdict::Rejected, NO_ENDPOINTS),
        layout::LOG_REJECTED_INVALID_PORT => (FlowVerdict::Rejected, INVALID_PORT),
        layout::LOG_DROPPED_SOURCE_RANGE => (FlowVerdict::Dropped, SOURCE_RANGE),
        layout::LOG_DROPPED_NO_LOCAL_ENDPOINT => (FlowVerdict::Dropped, NO_LOCAL_ENDPOINT),
        layout::LOG_DROPPED_UNALLOCATED => (FlowVerdict::Dropped, UNALLOCATED),
        _ => return None,
    })
}

/// A protocol's name as the answers spell it (its number if unknown).
fn protocol_name(p: u8) -> String {
    protocol_of(p).map_or_else(|| p.to_string(), |p| p.as_str().to_owned())
}

fn protocol_of(p: u8) -> Option<Protocol> {
    match p {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The Service port a connection to `dst` enters, and how.
struct Entered {
    view: Arc<ServiceView>,
    port: Option<PortView>,
    kind: EntryKind,
}

/// The Service port that `dst` is an entry point of, for `proto`: an
/// address and port of a Service (ClusterIP, external IP, load-balancer
/// address), else a NodePort on one of the node's addresses; with
/// `any_port`, the Service whose ClusterIP it is even if the port is none
/// of its own.
fn entered(node: &NodeHandle, proto: Protocol, dst: SocketAddr, any_port: bool) -> Option<Entered> {
    let family = IpFamily::of(dst.ip());
    let (ip, port) = (dst.ip(), dst.port());
    let views = node.services_at(ip);
    for v in &views {
        for (f, p) in v.ports() {
            let sp = &p.port;
            if f != family || sp.protocol != proto || sp.port != port {
                continue;
            }
            let kind = if sp.cluster_ip == ip {
                EntryKind::ClusterIP
            } else if sp.external_ips.contains(&ip) {
                EntryKind::ExternalIP
            } else if sp.load_balancer_vips.contains(&ip) {
                EntryKind::LoadBalancer
            } else {
                continue;
            };
            return Some(Entered {
                view: v.clone(),
                port: Some(p.clone()),
                kind,
            });
        }
    }
    if any_port
        && let Some(v) = views
            .iter()
            .find(|v| v.ports().any(|(_, p)| p.port.cluster_ip == ip))
    {
        return Some(Entered {
            view: v.clone(),
            port: None,
            kind: EntryKind::ClusterIP,
        });
    }
    let on_node = node.local_ips().contains(&ip)
        || node
            .family(family)
            .is_some_and(|f| f.node_port_ips.contains(&ip));
    if !on_node {
        return None;
    }
    for v in node.services_at_node_port(family, port) {
        let found = v
            .ports()
            .find(|(f, p)| {
                *f == family && p.port.protocol == proto && p.port.node_port == Some(port)
            })
            .map(|(_, p)| p.clone());
        if let Some(p) = found {
            return Some(Entered {
                view: v,
                port: Some(p),
                kind: EntryKind::NodePort,
            });
        }
    }
    None
}

/// Matches the kernel's reports to Services and records them.
pub struct Recorder {
    node: NodeHandle,
    store: Arc<FlowStore>,
    metrics: Arc<Mutex<Metrics>>,
    log: Option<LogWriter>,
}

impl Recorder {
    /// A recorder into `store`, resolving through `node`.
    pub fn new(
        node: NodeHandle,
        store: Arc<FlowStore>,
        metrics: Arc<Mutex<Metrics>>,
        log: Option<LogWriter>,
    ) -> Recorder {
        {
            let mut m = metrics.lock().unwrap_or_else(|e| e.into_inner());
            for v in FlowVerdict::ALL {
                m.touch(METRIC_RECORDED, &[v.as_str()]);
            }
            m.touch(METRIC_EVICTED, &[]);
            m.touch(METRIC_FOLDED, &[]);
            m.touch(METRIC_NOT_RECORDED, &["kernel_buffer"]);
            m.touch(METRIC_NOT_RECORDED, &[NOT_AGGREGATED]);
        }
        Recorder {
            node,
            store,
            metrics,
            log,
        }
    }

    /// Records one batch of the kernel's reports, seen at `now`; `lost`
    /// says how many reports the kernel dropped in all, when it dropped
    /// some.
    pub fn record(&mut self, events: Vec<FlowEvent>, now: SystemTime, lost: Option<u64>) {
        let mut added: HashMap<FlowVerdict, u64> = HashMap::new();
        let (evicted, folded, not_recorded, not_aggregated) = {
            let store = self.store.clone();
            let mut ring = store.lock();
            let before = ring.evicted;
            let folded_before = ring.folded;
            let lost_before = ring.not_recorded;
            let unaggregated_before = ring.aggregates.not_recorded();
            for e in events {
                let verdict = match e {
                    FlowEvent::New(c) => self.forwarded(&mut ring, &c, now),
                    FlowEvent::Destroyed(c) => {
                        self.destroyed(&mut ring, &c, now);
                        None
                    }
                    FlowEvent::Logged(l) => self.logged(&mut ring, &l, now),
                    FlowEvent::Lost => None,
                };
                if let Some(v) = verdict {
                    *added.entry(v).or_default() += 1;
                }
            }
            if let Some(n) = lost {
                ring.not_recorded = ring.not_recorded.max(n);
            }
            (
                ring.evicted - before,
                ring.folded - folded_before,
                ring.not_recorded - lost_before,
                ring.aggregates.not_recorded() - unaggregated_before,
            )
        };
        {
            let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
            for (v, n) in added {
                m.add(METRIC_RECORDED, &[v.as_str()], n as f64);
            }
            if evicted > 0 {
                m.add(METRIC_EVICTED, &[], evicted as f64);
            }
            if folded > 0 {
                m.add(METRIC_FOLDED, &[], folded as f64);
            }
            if not_aggregated > 0 {
                m.add(
                    METRIC_NOT_RECORDED,
                    &[NOT_AGGREGATED],
                    not_aggregated as f64,
                );
            }
            if not_recorded > 0 {
                m.add(METRIC_NOT_RECORDED, &["kernel_buffer"], not_recorded as f64);
            }
        }
        self.flush_log();
    }

    /// Keeps a new flow, and logs it with its number.
    fn push(&mut self, ring: &mut Ring, flow: Flow) {
        let seen = flow.first;
        ring.aggregates.connection(&flow, seen);
        let seq = ring.push(flow);
        if let Some(log) = &mut self.log
            && let Some(f) = ring.get_mut(seq)
        {
            let r = f.record();
            log.flow(&r, || aggregate::Key::of(f), false, seen);
        }
    }

    fn flush_log(&mut self) {
        if let Some(log) = &mut self.log {
            log.flush();
        }
    }

    /// Called when no report came for a while: the flow log's aggregated
    /// lines of a window that ended are written.
    pub fn tick(&mut self, now: SystemTime) {
        if let Some(log) = &mut self.log {
            log.end_window(now);
            log.flush();
        }
    }

    fn forwarded(
        &mut self,
        ring: &mut Ring,
        c: &Connection,
        now: SystemTime,
    ) -> Option<FlowVerdict> {
        let f = self.forwarded_flow(c, now)?;
        self.push(ring, f);
        Some(FlowVerdict::Forwarded)
    }

    /// Names a flow's client: its pod and workload, when known.
    fn name_client(&self, f: &mut Flow) {
        let ip = f.client.ip();
        match self.node.pod(ip) {
            Some(p) => {
                f.client_pod = Some(p.name.clone());
                f.client_workload = p.workload.clone();
            }
            None => f.client_pod = self.node.pod_at(ip),
        }
    }

    /// The flow of a connection sent to an endpoint of a Service.
    fn forwarded_flow(&self, c: &Connection, now: SystemTime) -> Option<Flow> {
        if !c.dnat {
            return None;
        }
        let proto = protocol_of(c.proto)?;
        let e = entered(&self.node, proto, c.dst, false)?;
        let mut f = Flow::new(now, c.proto, c.client, c.dst, FlowVerdict::Forwarded);
        self.name_client(&mut f);
        f.workload = self
            .node
            .pod(c.reply_src.ip())
            .and_then(|p| p.workload.clone());
        f.entry = Some(e.kind);
        f.service = Some(e.view.name.clone());
        f.endpoint = Some(c.reply_src);
        // Masqueraded when the endpoint answers another address than the
        // client's: conntrack also marks a connection whose source port
        // alone it remapped (another connection held it).
        f.masqueraded = c.reply_dst.ip() != c.client.ip();
        f.open = true;
        f.conntrack_id = c.id;
        if let Some(p) = &e.port {
            f.port = Some(p.name.port.clone());
            f.pod = p
                .endpoints
                .iter()
                .find(|ep| ep.ip == c.reply_src.ip() && ep.port == c.reply_src.port())
                .and_then(|ep| ep.target.clone());
        }
        Some(f)
    }

    fn destroyed(&mut self, ring: &mut Ring, c: &Connection, now: SystemTime) {
        let seq = match c.id {
            Some(id) => ring.by_id.remove(&id),
            None => ring.by_key.get(&(c.proto, c.client, c.dst)).copied(),
        };
        let (packets, bytes) = (c.packets.unwrap_or(0), c.bytes.unwrap_or(0));
        let Some(f) = seq.and_then(|s| ring.get_mut(s)) else {
            // No longer in the ring (evicted, or folded past its client's
            // share): its aggregate gets what it carried all the same.
            if packets > 0
                && let Some(f) = self.forwarded_flow(c, now)
            {
                ring.aggregates
                    .closed(aggregate::Key::of(&f), now, packets, bytes);
            }
            return;
        };
        if !f.open {
            return;
        }
        f.last = now;
        f.open = false;
        f.packets = c.packets;
        f.bytes = c.bytes;
        let record = self
            .log
            .is_some()
            .then(|| (f.record(), aggregate::Key::of(f)));
        let key = (packets > 0).then(|| aggregate::Key::of(f));
        if let Some(key) = key {
            ring.aggregates.closed(key, now, packets, bytes);
        }
        if let (Some(log), Some((r, key))) = (&mut self.log, record) {
            log.flow(&r, || key, true, now);
        }
    }

    fn logged(&mut self, ring: &mut Ring, l: &Logged, now: SystemTime) -> Option<FlowVerdict> {
        let (verdict, reason) = reason_of(&l.prefix)?;
        let proto = protocol_of(l.proto)?;
        let key = (l.proto, l.src, l.dst);
        if let Some(seq) = ring.by_key.get(&key).copied()
            && let Some(f) = ring.get_mut(seq)
            && f.verdict == verdict
            && now.duration_since(f.last).unwrap_or_default() < RETRY_WINDOW
        {
            f.last = now;
            f.retries = f.retries.saturating_add(1);
            return None;
        }
        let unallocated = l.prefix == layout::LOG_DROPPED_UNALLOCATED;
        let invalid_port = l.prefix == layout::LOG_REJECTED_INVALID_PORT;
        let e = entered(&self.node, proto, l.dst, invalid_port);
        if e.is_none() && !unallocated {
            return None;
        }
        let mut f = Flow::new(now, l.proto, l.src, l.dst, verdict);
        self.name_client(&mut f);
        f.reason = Some(reason);
        if let Some(e) = &e {
            f.entry = Some(e.kind);
            f.service = Some(e.view.name.clone());
            f.port = e.port.as_ref().map(|p| p.name.port.clone());
        }
        self.push(ring, f);
        Some(verdict)
    }
}

/// Reads the kernel's reports on a thread of its own until the process
/// ends, recording each batch.
pub fn spawn(
    mut monitor: FlowMonitor,
    mut recorder: Recorder,
    following: Following,
) -> std::io::Result<()> {
    let store = recorder.store.clone();
    store.set_following(following, monitor.following().then(SystemTime::now));
    std::thread::Builder::new()
        .name("flows".into())
        .spawn(move || {
            // Blocks until a report comes; then lets the next ones gather
            // for a while and reads all that did without waiting for more:
            // the recorder is woken some 20 times a second at most, not once
            // per connection (measured: a reader woken for each report
            // costs each new connection on this 2-core VM about 9 µs, half
            // its connect time).
            let mut wait = Duration::from_secs(1);
            loop {
                follow_as_asked(&mut monitor, &store, following);
                match monitor.next(wait) {
                    Ok(Some(events)) => {
                        let lost = events
                            .iter()
                            .any(|e| matches!(e, FlowEvent::Lost))
                            .then(|| monitor.dropped())
                            .flatten();
                        recorder.record(events, SystemTime::now(), lost);
                        if !wait.is_zero() {
                            std::thread::sleep(GATHER);
                        }
                        wait = Duration::ZERO;
                    }
                    Ok(None) if wait.is_zero() => {
                        // All that gathered is read: gather again, unless
                        // nothing came meanwhile.
                        wait = Duration::from_secs(1);
                    }
                    Ok(None) => recorder.tick(SystemTime::now()),
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the kernel's flow reports failed; the flow stream stops");
                        return;
                    }
                }
            }
        })?;
    Ok(())
}

/// Starts or stops following connections as the readers' asks say
/// (checked at least once a second, the recorder's longest wait).
fn follow_as_asked(monitor: &mut FlowMonitor, store: &FlowStore, following: Following) {
    let wanted = store.wanted(following, Instant::now());
    if wanted == monitor.following() {
        return;
    }
    match monitor.follow(wanted) {
        Ok(()) => {
            store.set_following(following, wanted.then(SystemTime::now));
            if wanted {
                tracing::info!("a reader asked for flows: following the node's connections");
            } else if let Following::OnDemand { linger } = following {
                tracing::info!(
                    idle = ?linger,
                    "no reader asked for flows: no longer following the node's connections (rejected and dropped ones are still recorded)"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, wanted, "cannot change whether the flow stream follows connections");
        }
    }
}

#[cfg(test)]
mod tests;
