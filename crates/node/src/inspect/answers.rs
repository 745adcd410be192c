//! The introspection API's answers as types: built by [`super`], served as
//! JSON, read back by the commands ([`super::text`]) and by the web view.
//! A renamed or misplaced field fails to compile here instead of showing
//! as an empty cell there.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A closed set of values as the answers spell them: an enum with serde
/// and `Display` in that spelling.
macro_rules! closed_set {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $s)] $v),+
        }

        impl $name {
            /// As the answers spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $s),+
                }
            }

            /// The value spelled `s`.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($s => Some($name::$v),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

closed_set! {
    /// The nftables family of a table.
    TableFamily {
        /// IPv4.
        Ip = "ip",
        /// IPv6.
        Ip6 = "ip6",
    }
}

closed_set! {
    /// An L4 protocol, spelled alike in every answer (as nftables,
    /// conntrack and the flow stream spell it).
    Proto {
        /// TCP.
        Tcp = "tcp",
        /// UDP.
        Udp = "udp",
        /// SCTP.
        Sctp = "sctp",
    }
}

closed_set! {
    /// Where a table was read from.
    ReadFrom {
        /// The kernel.
        Kernel = "kernel",
        /// A table built in memory (offline, `--manifests`).
        Memory = "memory",
    }
}

closed_set! {
    /// How much of a table was read.
    ReadHow {
        /// All of it.
        Whole = "whole",
        /// The elements the answer met, looked up.
        Targeted = "targeted",
    }
}

closed_set! {
    /// Where a traced packet comes from.
    Origin {
        /// A pod on this node.
        Pod = "pod",
        /// The node itself.
        Node = "node",
        /// Outside the node.
        External = "external",
    }
}

closed_set! {
    /// How a path through the table ends.
    Disposition {
        /// Accepted (DNATed or untouched).
        Accept = "accept",
        /// Dropped.
        Drop = "drop",
        /// Rejected.
        Reject = "reject",
    }
}

closed_set! {
    /// The level a Service port is counted at.
    CountLevel {
        /// Only its rejects and drops.
        None = "none",
        /// The Service port's connections, packets and bytes.
        Service = "service",
        /// Those of each endpoint too.
        Endpoint = "endpoint",
    }
}

closed_set! {
    /// Why a connection was refused.
    RefusalReason {
        /// The Service port has no usable endpoint (rejected).
        NoEndpoints = "no_endpoints",
        /// A ClusterIP on a port its Service does not have (rejected).
        InvalidPort = "invalid_port",
        /// The client is outside `loadBalancerSourceRanges` (dropped).
        SourceRange = "source_range",
        /// The traffic policy is Local and no endpoint is on this node
        /// (dropped).
        NoLocalEndpoint = "no_local_endpoint",
    }
}

closed_set! {
    /// What was done with a refused connection.
    Refusal {
        /// Refused with a reset or an ICMP error.
        Rejected = "rejected",
        /// Dropped without an answer.
        Dropped = "dropped",
    }
}

closed_set! {
    /// A traffic policy.
    Policy {
        /// Any endpoint in the cluster.
        Cluster = "Cluster",
        /// Only endpoints on the receiving node.
        Local = "Local",
    }
}

closed_set! {
    /// How traffic enters a Service.
    EntryKind {
        /// Its ClusterIP.
        ClusterIP = "ClusterIP",
        /// One of its external IPs.
        ExternalIP = "ExternalIP",
        /// One of its load-balancer addresses.
        LoadBalancer = "LoadBalancer",
        /// Its NodePort, on one of the node's addresses.
        NodePort = "NodePort",
    }
}

impl From<verdict_nft::Family> for TableFamily {
    fn from(f: verdict_nft::Family) -> TableFamily {
        match f {
            verdict_nft::Family::Ip6 => TableFamily::Ip6,
            _ => TableFamily::Ip,
        }
    }
}

impl From<verdict_model::IpFamily> for TableFamily {
    fn from(f: verdict_model::IpFamily) -> TableFamily {
        match f {
            verdict_model::IpFamily::V4 => TableFamily::Ip,
            verdict_model::IpFamily::V6 => TableFamily::Ip6,
        }
    }
}

impl From<verdict_model::Protocol> for Proto {
    fn from(p: verdict_model::Protocol) -> Proto {
        match p {
            verdict_model::Protocol::Tcp => Proto::Tcp,
            verdict_model::Protocol::Udp => Proto::Udp,
            verdict_model::Protocol::Sctp => Proto::Sctp,
        }
    }
}

impl From<verdict_nft::L4Proto> for Proto {
    fn from(p: verdict_nft::L4Proto) -> Proto {
        match p {
            verdict_nft::L4Proto::Tcp => Proto::Tcp,
            verdict_nft::L4Proto::Udp => Proto::Udp,
            verdict_nft::L4Proto::Sctp => Proto::Sctp,
        }
    }
}

impl From<verdict_model::Counting> for CountLevel {
    fn from(c: verdict_model::Counting) -> CountLevel {
        match c {
            verdict_model::Counting::None => CountLevel::None,
            verdict_model::Counting::Service => CountLevel::Service,
            verdict_model::Counting::Endpoint => CountLevel::Endpoint,
        }
    }
}

// Derived only here: `closed_set!` derives the same traits for every set,
// and only this one has a default.
#[allow(clippy::derivable_impls)]
impl Default for CountLevel {
    fn default() -> CountLevel {
        CountLevel::None
    }
}

impl RefusalReason {
    /// What became of the connections refused for this reason, and what
    /// the reason means, in words.
    pub fn words(self) -> (Refusal, &'static str) {
        match self {
            RefusalReason::NoEndpoints => {
                (Refusal::Rejected, "the Service port has no usable endpoint")
            }
            RefusalReason::InvalidPort => (
                Refusal::Rejected,
                "a ClusterIP on a port its Service does not have",
            ),
            RefusalReason::SourceRange => (
                Refusal::Dropped,
                "the client is outside loadBalancerSourceRanges",
            ),
            RefusalReason::NoLocalEndpoint => (
                Refusal::Dropped,
                "the traffic policy is Local and no endpoint is on this node",
            ),
        }
    }
}

impl Policy {
    /// `Local` if `local`, else `Cluster`.
    pub fn of(local: bool) -> Policy {
        if local {
            Policy::Local
        } else {
            Policy::Cluster
        }
    }
}

closed_set! {
    /// The endpoint lists of a Service port.
    EndpointList {
        /// The one for traffic under the Cluster policy.
        Cluster = "cluster",
        /// The one for traffic under the Local policy.
        Local = "local",
    }
}

/// `GET /api/v1/trace`: every path a new connection's first packet can
/// take through the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceAnswer {
    /// The packet traced.
    pub packet: TracePacket,
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// The table.
    pub table: String,
    /// `kernel` or `memory` (offline).
    pub source: ReadFrom,
    /// `whole` or `targeted` (the elements the packet met, looked up).
    pub read: ReadHow,
    /// Milliseconds spent reading the kernel.
    pub read_ms: f64,
    /// The Service port the packet was sent to, if any.
    pub service: Option<String>,
    /// Paths that end alike, with their summed odds.
    pub outcomes: Vec<TraceOutcome>,
    /// Every path.
    pub paths: Vec<TracePath>,
    /// `--live`: the kernel's own trace of one real packet, set beside the
    /// typed one (added by the command, not by the API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveComparison>,
}

/// The packet of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePacket {
    /// `pod`, `node` or `external`.
    pub from: Origin,
    /// Source address.
    pub src: String,
    /// Source port, if given.
    pub sport: Option<u16>,
    /// Destination address.
    pub dst: String,
    /// `tcp`, `udp` or `sctp`.
    pub proto: Proto,
    /// Destination port.
    pub dport: u16,
    /// The input interface the trace assumed (none from the node).
    pub iif: Option<String>,
}

/// Paths that end alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceOutcome {
    /// Where the packet went: `IP:port` after DNAT, `ACCEPT`, `DROP`,
    /// `REJECT`.
    pub output: String,
    /// It was masqueraded.
    pub masquerade: bool,
    /// Why, in an operator's words.
    pub reason: String,
    /// The odds of this outcome.
    pub probability: f64,
}

/// One path through the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TracePath {
    /// Its odds.
    pub probability: f64,
    /// `accept`, `drop` or `reject`.
    pub disposition: Disposition,
    /// Where DNAT sent it (`IP:port`).
    pub dnat: Option<String>,
    /// It was masqueraded.
    pub masquerade: bool,
    /// Why it ended as it did.
    pub reason: String,
    /// The rules it met, in order.
    pub steps: Vec<TraceStep>,
    /// What the data path wrote (affinity).
    pub updates: Vec<TraceUpdate>,
}

/// One rule a path met.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// The hook.
    pub hook: String,
    /// The chain.
    pub chain: String,
    /// The rule, as nft prints it.
    pub rule: String,
    /// The set lookups it made.
    pub lookups: Vec<TraceLookup>,
}

/// One set lookup of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLookup {
    /// The set or map.
    pub set: String,
    /// The key looked up.
    pub key: String,
    /// It was there.
    pub found: bool,
    /// The element's value.
    pub value: Option<String>,
    /// The Service port the element belongs to.
    pub service: Option<String>,
}

/// An element the data path adds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceUpdate {
    /// The set.
    pub set: String,
    /// The element.
    pub element: String,
}

/// `trace --live`: the kernel's path beside the typed one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveComparison {
    /// What the kernel reported.
    pub kernel: LiveKernel,
    /// The chains of the typed path the packet took.
    pub typed_chains: Vec<String>,
    /// The kernel's chains are the typed path's, in order, and the DNAT is.
    pub agree: bool,
}

/// The kernel's trace of one packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveKernel {
    /// The rules of verdict's table it matched.
    pub steps: Vec<LiveStepAnswer>,
    /// Their chains, repeats folded.
    pub chains: Vec<String>,
    /// Where the kernel sent it.
    pub dnat: Option<String>,
}

/// One rule the kernel reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveStepAnswer {
    /// The chain.
    pub chain: String,
    /// The rule.
    pub rule: String,
    /// Its verdict, if reported.
    pub verdict: Option<String>,
}

fn yes() -> bool {
    true
}

/// `GET /api/v1/services`: one page of Services.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServicesPage {
    /// Services that match, in all.
    pub total: usize,
    /// Skipped.
    pub offset: usize,
    /// The most on a page.
    pub limit: usize,
    /// This page.
    pub items: Vec<ServiceItem>,
    /// When the kernel's counters in `counts` were read (Unix seconds,
    /// the node's clock; `None`: not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_at: Option<f64>,
}

/// What the kernel counted for one Service port (`--service-counters`).
/// Rejects and drops are counted for every Service, each connection
/// once; connections, packets and bytes only for the Services
/// `--service-metrics` chooses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounts {
    /// `service` or `endpoint`: the level it is counted at; `none`: only
    /// its rejects and drops are.
    pub level: CountLevel,
    /// Connections sent to an endpoint (all entry points), when counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Packets and bytes of those connections, both ways, when counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
    /// See `packets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Connections rejected or dropped, by reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ProblemCount>,
}

impl PortCounts {
    /// Connections rejected or dropped, all reasons.
    pub fn refused(&self) -> u64 {
        self.problems.iter().map(|p| p.connections).sum()
    }
}

/// `GET /api/v1/problems`: what is wrong on this node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProblemsAnswer {
    /// When the kernel's counters were read (Unix seconds; `None`: the
    /// counters are off).
    pub counted_at: Option<f64>,
    /// What `/healthz` says now.
    pub healthy: bool,
    /// Its JSON.
    pub health: serde_json::Value,
    /// Service ports with connections rejected or dropped, the most first.
    pub refused: Vec<RefusedPort>,
    /// Service ports the kernel refused.
    pub quarantined: Vec<QuarantinedPort>,
    /// Failed syncs among the last ones kept.
    pub failed_syncs: usize,
    /// Foreign changes to verdict's tables since start, and the last one's
    /// time.
    pub foreign_changes: u64,
    /// See `foreign_changes`.
    pub last_foreign_change: Option<String>,
}

/// A Service port whose connections were rejected or dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedPort {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// `namespace/name`.
    pub service: String,
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// Its endpoints, and the ready ones.
    pub endpoints: usize,
    /// See `endpoints`.
    pub ready: usize,
    /// What was counted.
    pub counts: PortCounts,
}

/// A service port the kernel refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedPort {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// `namespace/name`.
    pub service: String,
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// The kernel's refusal.
    pub why: String,
}

/// Connections of one Service port rejected or dropped for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemCount {
    /// `no_endpoints`, `invalid_port` (rejected), `source_range`,
    /// `no_local_endpoint` (dropped).
    pub reason: RefusalReason,
    /// `rejected` or `dropped`.
    pub verdict: Refusal,
    /// What the reason means, in words.
    pub what: String,
    /// Connections, each once however often it was retried.
    pub connections: u64,
    /// The last clients (`IP:port`), newest last.
    pub recent_clients: Vec<String>,
}

/// A Service of the list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceItem {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its ports, in each family.
    pub ports: Vec<ServiceItemPort>,
    /// Ports of its ClusterIPs it does not have that clients asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_ports: Vec<OtherPort>,
}

/// A port of a Service in the list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceItemPort {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// The ClusterIP.
    pub cluster_ip: String,
    /// The Service port.
    pub service_port: u16,
    /// The NodePort.
    pub node_port: Option<u16>,
    /// Endpoints, ready ones, ready local ones.
    pub endpoints: usize,
    /// See `endpoints`.
    pub ready: usize,
    /// See `endpoints`.
    pub local: usize,
    /// The kernel refused it.
    pub quarantined: bool,
    /// What the kernel counted (`None`: the counters are off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<PortCounts>,
}

/// `GET /api/v1/services/NAMESPACE/NAME`: `explain`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainAnswer {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// verdict knows the Service.
    pub found: bool,
    /// Its families.
    pub families: Vec<ExplainFamily>,
    /// What the kernel lacks or holds otherwise.
    pub drift: DriftCounts,
    /// When the kernel's counters in `counts` were read (Unix seconds,
    /// the node's clock; `None`: not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_at: Option<f64>,
    /// Ports of its ClusterIPs it does not have that clients asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_ports: Vec<OtherPort>,
}

/// A port of a Service's ClusterIP that the Service does not have, and
/// the connections to it, each rejected and counted once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherPort {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// The port number asked for (`other`: any of the ports past the
    /// first eight, per protocol).
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// The connections rejected.
    pub problem: ProblemCount,
}

/// A Service in one family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainFamily {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// The table.
    pub table: String,
    /// `kernel` or `memory`, when the table was read.
    pub source: Option<ReadFrom>,
    /// `whole` or `targeted`.
    pub read: Option<ReadHow>,
    /// Milliseconds spent reading.
    pub read_ms: Option<f64>,
    /// Its ports.
    pub ports: Vec<ExplainPort>,
}

/// One port of a Service: whole, or (a quarantined port the Service no
/// longer has) its name and the kernel's refusal alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainPort {
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// Why the kernel refused it, while it is quarantined.
    pub quarantined: Option<String>,
    /// The port, when the Service has it.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<ExplainPortDetail>,
}

/// What a port is and what it asks of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainPortDetail {
    /// The Service port.
    pub service_port: u16,
    /// Where traffic enters.
    pub entry_points: Vec<EntryPoint>,
    /// `Local` or `Cluster`.
    pub internal_traffic_policy: Policy,
    /// `Local` or `Cluster`.
    pub external_traffic_policy: Policy,
    /// ClientIP affinity's timeout.
    pub session_affinity_seconds: Option<u32>,
    /// The health-check node port and what it answers.
    pub health_check_node_port: Option<HealthCheck>,
    /// Some endpoint is usable.
    pub has_usable_endpoints: bool,
    /// Every endpoint, with its category (a page of them, when the
    /// request asked for one: `endpoints_total` says how many in all).
    pub endpoints: Vec<ExplainEndpoint>,
    /// With a page of endpoints: how many the port has, and how many
    /// match the filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_total: Option<usize>,
    /// See `endpoints_total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_matched: Option<usize>,
    /// The elements it asks for, and what the kernel holds (a page of
    /// them, when the request asked for one).
    pub elements: Vec<ExplainElement>,
    /// With a page of elements: how many in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements_total: Option<usize>,
    /// The shared chains its elements jump to.
    pub chains: Vec<String>,
    /// What the kernel counted (`None`: the counters are off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<PortCounts>,
}

/// Where a port takes traffic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryPoint {
    /// `ClusterIP`, `ExternalIP`, `LoadBalancer`, `NodePort`.
    pub kind: EntryKind,
    /// `IP:port` (not for a NodePort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The NodePort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The node's addresses that take the NodePort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<String>>,
    /// `loadBalancerSourceRanges`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<String>>,
    /// `Local` or `Cluster`.
    pub traffic_policy: Policy,
    /// When it is masqueraded.
    pub masquerade: String,
}

/// A health-check node port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// The port.
    pub port: u16,
    /// What it answers: 200 or 503.
    pub code: u16,
    /// Ready local endpoints.
    pub local_endpoints: usize,
}

/// An endpoint of a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainEndpoint {
    /// `IP:port`.
    pub address: String,
    /// Its conditions.
    pub ready: bool,
    /// See `ready`.
    pub serving: bool,
    /// See `ready`.
    pub terminating: bool,
    /// On this node.
    pub local: bool,
    /// Its node.
    pub node: Option<String>,
    /// Its zone.
    pub zone: Option<String>,
    /// Its topology hints.
    pub zone_hints: Option<BTreeSet<String>>,
    /// See `zone_hints`.
    pub node_hints: Option<BTreeSet<String>>,
    /// `cluster`, `local`: the lists that use it.
    pub used_by: Vec<EndpointList>,
    /// Why it is used, or not.
    pub why: String,
    /// Connections sent to it, and their packets and bytes, when its
    /// Service is counted at `endpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// See `connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
    /// See `connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// An element a port asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainElement {
    /// The set or map.
    pub set: String,
    /// The element as nft prints it.
    pub element: String,
    /// What the kernel holds.
    pub kernel: String,
    /// Another port claims the key first.
    pub programmed_for: Option<String>,
}

/// Drift of one Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftCounts {
    /// Elements the kernel lacks.
    pub missing: usize,
    /// Elements it holds with another value.
    pub differs: usize,
    /// Elements that name the Service but that verdict does not want
    /// (`None`: not looked for, the table was not read whole).
    pub extra: Option<usize>,
}

/// `GET /api/v1/drift`: every family's table against verdict's intent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DriftAnswer {
    /// Per family.
    pub families: Vec<FamilyDrift>,
}

/// One family's drift.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FamilyDrift {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// The table exists.
    pub table: bool,
    /// Elements the kernel lacks, holds otherwise, holds unwanted.
    #[serde(default)]
    pub missing: usize,
    /// See `missing`.
    #[serde(default)]
    pub differs: usize,
    /// See `missing`.
    #[serde(default)]
    pub extra: usize,
    /// The first of them.
    #[serde(default)]
    pub examples: Vec<String>,
    /// Milliseconds spent reading.
    pub read_ms: f64,
}

/// `GET /api/v1/connections`: the DNATed connections by Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsAnswer {
    /// Connections to a Service.
    pub total: usize,
    /// DNATed connections to no Service verdict knows.
    pub not_services: usize,
    /// Per Service port.
    pub services: Vec<ConnectionsOfPort>,
    /// The connections, at most `limit`.
    pub flows: Vec<FlowAnswer>,
    /// The most listed.
    pub limit: usize,
}

/// The connections of one Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsOfPort {
    /// `namespace/name`.
    pub service: String,
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: Proto,
    /// Connections, and how many of them are stale: still open, to an
    /// endpoint that is gone.
    pub flows: usize,
    /// See `flows`.
    pub stale: usize,
    /// Entries of closed connections (TIME_WAIT, …) to an endpoint that is
    /// gone, which conntrack still lists.
    #[serde(default)]
    pub closed_to_gone: usize,
    /// Per endpoint.
    pub endpoints: Vec<ConnectionsOfEndpoint>,
}

/// The connections to one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionsOfEndpoint {
    /// `IP:port`.
    pub endpoint: String,
    /// Connections.
    pub flows: usize,
    /// The endpoint is gone.
    pub stale: bool,
}

/// One connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowAnswer {
    /// The Service port.
    pub service: String,
    /// `tcp`, `udp`, `sctp`.
    pub proto: Proto,
    /// The TCP or SCTP state.
    pub state: String,
    /// `IP:port` of the client, of the entry point, of the endpoint.
    pub client: String,
    /// See `client`.
    pub entry: String,
    /// See `client`.
    pub endpoint: String,
    /// Still open, to an endpoint that is gone.
    pub stale: bool,
    /// Still a connection (not closing or closed: TIME_WAIT, CLOSE, …).
    #[serde(default = "yes")]
    pub open: bool,
    /// Replies were seen.
    pub replied: bool,
    /// Seconds until the entry expires.
    pub expires_in: u64,
    /// Packets and bytes, both ways, when accounting is on.
    pub packets: Option<u64>,
    /// See `packets`.
    pub bytes: Option<u64>,
    /// For a stale one: what verdict does about it.
    pub what_verdict_does: Option<String>,
}

/// `GET /api/v1/syncs`: the last syncs, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncsAnswer {
    /// Syncs ever recorded.
    pub total: u64,
    /// How many are kept.
    pub kept: usize,
    /// The kept ones.
    pub items: Vec<SyncItem>,
}

/// One sync of one family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncItem {
    /// When it began (RFC 3339).
    pub at: String,
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// Full or partial.
    pub full: bool,
    /// What brought it.
    pub trigger: String,
    /// How long it took.
    pub ms: f64,
    /// Operations in its transaction.
    pub operations: usize,
    /// Services it touched, and the first few.
    pub services: usize,
    /// See `services`.
    pub sample: Vec<String>,
    /// Service ports the kernel refused in it.
    pub quarantined: usize,
    /// Why it failed.
    pub error: Option<String>,
}

/// `GET /api/v1/foreign`: the last foreign changes, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignAnswer {
    /// Foreign changes ever recorded.
    pub total: u64,
    /// How many are kept.
    pub kept: usize,
    /// The kept ones.
    pub items: Vec<ForeignItem>,
}

/// One foreign change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignItem {
    /// When it was seen (RFC 3339).
    pub at: String,
    /// The committing process.
    pub process: Option<String>,
    /// Its pid.
    pub pid: Option<u32>,
    /// Announcements were lost instead.
    pub lost: bool,
    /// Objects it changed, and the first few.
    pub changes: usize,
    /// See `changes`.
    pub sample: Vec<String>,
}

/// An answer that could not be given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// Why.
    pub error: String,
}
