//! verdict's table layout: every chain, set and map name, the fixed rules,
//! and the rules of the shared per-class chains. Pure functions of the
//! configuration; `docs/nftables.md` explains the design.
//!
//! The number of chains, sets and maps does not depend on the number of
//! services: per-service data lives only in map elements, and the few
//! dynamic chains are shared by every service with the same endpoint count
//! (`endpoints-N`) or policy shape (`external-local-C-L`).

use std::fmt::{self, Display, Formatter};
use std::str::FromStr;

use verdict_model::Counting;
use verdict_nft::{
    Chain, ChainType, CmpOp, DataType, DnatTarget, ElementValue, Expr, FibAddr, Hook, KeyPart,
    L4Proto, Rule, Selector, Set, Value, Verdict,
};

use crate::config::{LocalDetector, ProxierConfig};

// === base chains (kube-proxy's names, hooks and priorities) ===
/// LoadBalancer source ranges, before DNAT (prerouting).
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// LoadBalancer source ranges, before DNAT (output).
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// No-endpoint checks for traffic to the node.
pub const FILTER_INPUT: &str = "filter-input";
/// No-endpoint checks for routed traffic.
pub const FILTER_FORWARD: &str = "filter-forward";
/// No-endpoint checks for the node's own traffic.
pub const FILTER_OUTPUT: &str = "filter-output";
/// DNAT of incoming traffic.
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// DNAT of the node's own traffic.
pub const NAT_OUTPUT: &str = "nat-output";
/// Masquerading.
pub const NAT_POSTROUTING: &str = "nat-postrouting";
/// The first packet of connections delivered to the node itself, after
/// DNAT: with `nat-postrouting`, where each DNATed connection is counted
/// once (kube-proxy has no such chain).
pub const NAT_INPUT: &str = "nat-input";

// === fixed regular chains ===
/// Dispatch to services.
pub const SERVICES: &str = "services";
/// Masquerade marked and hairpin traffic.
pub const MASQUERADING: &str = "masquerading";
/// LoadBalancer source-range filtering.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// Reject or drop traffic to services without endpoints.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// Reject or drop traffic to NodePorts without endpoints.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// Reject bad ports of ClusterIPs, drop unallocated ClusterIPs.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// `reject` as a chain, since a verdict map cannot say `reject`.
pub const REJECT_CHAIN: &str = "reject-chain";
/// Records session affinity after DNAT.
pub const AFFINITY_RECORD: &str = "affinity-record";
/// Counts every packet of a Service's connections, in both directions, in
/// the element of its entry and endpoint (for the Services
/// [`ProxierConfig::metrics`] chooses).
pub const COUNT_TRAFFIC: &str = "count-traffic";
/// Drops a new connection from outside `loadBalancerSourceRanges`,
/// counting it once.
pub const DROP_SOURCE_RANGE: &str = "drop-source-range";
/// Drops a new connection to a Service with a Local traffic policy and no
/// local endpoint, counting it once.
pub const DROP_NO_LOCAL_ENDPOINT: &str = "drop-no-local-endpoint";
/// Drops a new connection to an address of the service CIDRs that no
/// Service has, counting it once.
pub const DROP_UNALLOCATED: &str = "drop-unallocated";
/// Rejects a new connection to a ClusterIP on a port no Service has,
/// counting it once (kube-proxy rejects it in `cluster-ips-check`).
pub const REJECT_INVALID_PORT: &str = "reject-invalid-port";

// === sets and maps ===
/// Every proxied ClusterIP.
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Node addresses that accept NodePorts.
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Service address . protocol . port → class chain.
pub const SERVICE_IPS: &str = "service-ips";
/// Protocol . NodePort → class chain.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// Service address . protocol . port → reject or drop.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// Protocol . NodePort → reject or drop.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// LoadBalancer address . protocol . port of services with source ranges.
pub const FIREWALL_IPS: &str = "firewall-ips";
/// LoadBalancer address . protocol . port . allowed source range.
pub const FIREWALL_ALLOW: &str = "firewall-allow";
/// Endpoint . endpoint . protocol . port of local endpoints (hairpin).
pub const HAIRPIN_CONNECTIONS: &str = "hairpin-connections";
/// TCP entry address . port . slot → endpoint address . port.
pub const SERVICE_ENDPOINTS_TCP: &str = "service-endpoints-tcp";
/// UDP entry address . port . slot → endpoint address . port.
pub const SERVICE_ENDPOINTS_UDP: &str = "service-endpoints-udp";
/// SCTP entry address . port . slot → endpoint address . port.
pub const SERVICE_ENDPOINTS_SCTP: &str = "service-endpoints-sctp";

/// The endpoint map of a protocol. One map per protocol, because nft
/// cannot use a map declared `typeof … th dport` from rules added by a
/// later `nft` run ("conflicting protocols specified").
pub fn service_endpoints(p: L4Proto) -> &'static str {
    match p {
        L4Proto::Tcp => SERVICE_ENDPOINTS_TCP,
        L4Proto::Udp => SERVICE_ENDPOINTS_UDP,
        L4Proto::Sctp => SERVICE_ENDPOINTS_SCTP,
    }
}
/// Entry address . protocol . port . endpoint address . port, one element
/// per entry and endpoint, counting the packets and bytes of their
/// connections (looked up by [`COUNT_TRAFFIC`] with the connection's
/// original destination and its replies' source).
pub const SERVICE_TRAFFIC: &str = "service-traffic";
/// Entry address . protocol . port of the counted Services: new
/// connections sent to an endpoint, per entry point.
pub const SERVICE_CONNECTIONS: &str = "service-connections";
/// Entry address . protocol . port . endpoint address . port of the
/// Services counted per endpoint: new connections per endpoint.
pub const ENDPOINT_CONNECTIONS: &str = "endpoint-connections";
/// Client . client port . destination . protocol . port of connections
/// rejected for want of endpoints (dynamic, 3 minutes): each counted once,
/// and told to a reader with its Service.
pub const REJECTED_CONNECTIONS: &str = "rejected-connections";
/// The same for connections dropped by `loadBalancerSourceRanges`.
pub const DROPPED_SOURCE_RANGE: &str = "dropped-source-range";
/// The same for connections dropped for want of a local endpoint.
pub const DROPPED_NO_LOCAL_ENDPOINT: &str = "dropped-no-local-endpoint";
/// The same for connections to unallocated addresses of the service CIDRs.
pub const DROPPED_UNALLOCATED: &str = "dropped-unallocated";
/// The same for connections rejected because the ClusterIP's Service has
/// no such port.
pub const REJECTED_INVALID_PORT: &str = "rejected-invalid-port";
/// How long a rejected or dropped connection is remembered: longer than a
/// TCP client retries its SYN (127 s with Linux's defaults), so that each
/// connection counts once.
pub const PROBLEM_TIMEOUT: u32 = 180;
/// The most connections each of those sets remembers; past it, a drop or
/// reject is counted per packet.
pub const PROBLEM_SIZE: u32 = 65_536;
/// How many rejected or dropped connections a second each reason's rule
/// logs for the flow stream, at most (per IP family): a flood is counted
/// in full, and logged only at this rate.
pub const LOG_RATE: u32 = 200;
/// How many it logs at once after a quiet spell.
pub const LOG_BURST: u32 = 400;
/// The comment of the rule that ends a new connection logged past
/// [`LOG_RATE`]: its counter is what the flow stream did not record.
pub const NOT_LOGGED_COMMENT: &str = "past the log rate limit: counted, not logged";
/// Client . entry address . protocol . port → endpoint (dynamic).
pub const AFFINITY: &str = "affinity";
/// Entry address . protocol . port → affinity-timeout-T chain.
pub const AFFINITY_SERVICES: &str = "affinity-services";

// === staging (adding a jump without validating the table) ===
//
// The kernel validates the whole jump graph of a table at the commit of
// any transaction that adds a jump: every element of every verdict map,
// linear in the number of Services. A jump element that an incremental
// sync would add to one of [`STAGED_MAPS`] goes to its staging instead:
// its key into the map's gate set (`staged-service-ips`), and into the
// set of its target chain (`staged-service-ips-endpoints-2`), which a rule
// of the chain `staged-service-ips` sends there. Plain sets hold no jump,
// so adding to them validates nothing. A later sync that validates anyway
// (or the compaction a few seconds on) moves the staged elements into
// the map itself.
/// The gate set and chain of `service-ips`' staged elements.
pub const STAGED_SERVICE_IPS: &str = "staged-service-ips";
/// The gate set and chain of `service-nodeports`' staged elements.
pub const STAGED_SERVICE_NODEPORTS: &str = "staged-service-nodeports";
/// The gate set and chain of `no-endpoint-services`' staged elements.
pub const STAGED_NO_ENDPOINT_SERVICES: &str = "staged-no-endpoint-services";
/// The gate set and chain of `no-endpoint-nodeports`' staged elements.
pub const STAGED_NO_ENDPOINT_NODEPORTS: &str = "staged-no-endpoint-nodeports";
/// The gate set and chain of `affinity-services`' staged elements.
pub const STAGED_AFFINITY_SERVICES: &str = "staged-affinity-services";
/// Each verdict map whose jumps may be staged, with the name of its gate
/// set and staging chain.
pub const STAGED_MAPS: [(&str, &str); 5] = [
    (SERVICE_IPS, STAGED_SERVICE_IPS),
    (SERVICE_NODEPORTS, STAGED_SERVICE_NODEPORTS),
    (NO_ENDPOINT_SERVICES, STAGED_NO_ENDPOINT_SERVICES),
    (NO_ENDPOINT_NODEPORTS, STAGED_NO_ENDPOINT_NODEPORTS),
    (AFFINITY_SERVICES, STAGED_AFFINITY_SERVICES),
];

/// The gate set and staging chain of a verdict map, if its jumps may be
/// staged.
pub fn staged_of(map: &str) -> Option<&'static str> {
    STAGED_MAPS
        .iter()
        .find(|(m, _)| *m == map)
        .map(|(_, staged)| *staged)
}

/// The map whose gate set or staging chain this is.
pub fn map_of_staged(staged: &str) -> Option<&'static str> {
    STAGED_MAPS
        .iter()
        .find(|(_, s)| *s == staged)
        .map(|(m, _)| *m)
}

/// The set holding the staged keys of `map` that jump to `target`.
pub fn staging_set(map: &str, target: &str) -> Option<String> {
    staged_of(map).map(|staged| format!("{staged}-{target}"))
}

/// The map and target chain of a staging set's name (the longest gate
/// name that prefixes it: `staged-service-ips-endpoints-2`).
pub fn parse_staging_set(name: &str) -> Option<(&'static str, &str)> {
    STAGED_MAPS
        .iter()
        .filter_map(|(m, staged)| {
            let target = name.strip_prefix(staged)?.strip_prefix('-')?;
            (!target.is_empty()).then_some((*m, target))
        })
        .next()
}

/// The map whose gate or staging set `name` is.
pub fn map_of_staging(name: &str) -> Option<&'static str> {
    map_of_staged(name).or_else(|| parse_staging_set(name).map(|(map, _)| map))
}

/// The staging chains whose rules follow the shared chains in the
/// kernel (the others' targets are fixed chains).
pub const DYNAMIC_STAGING: [&str; 3] = [
    STAGED_SERVICE_IPS,
    STAGED_SERVICE_NODEPORTS,
    STAGED_AFFINITY_SERVICES,
];

/// The fixed chains a staged map's elements may jump to (the others jump
/// to shared chains: [`DynChain::staged_in`]).
pub fn fixed_staging_targets(cfg: &ProxierConfig, map: &str) -> Vec<&'static str> {
    match map {
        NO_ENDPOINT_SERVICES | NO_ENDPOINT_NODEPORTS => {
            let mut t = vec![REJECT_CHAIN];
            if cfg.ends_once() {
                t.push(DROP_NO_LOCAL_ENDPOINT);
            }
            t
        }
        _ => Vec::new(),
    }
}

/// Slots of the local-endpoint list start here (the cluster list starts at 0).
pub const LOCAL_SLOT_OFFSET: u32 = 1 << 24;
/// Most elements the shared affinity map holds.
pub const AFFINITY_SIZE: u32 = 1 << 20;
/// Table comment.
pub const TABLE_COMMENT: &str = "rules for verdict, the kube-proxy replacement";

/// The log prefixes of the rules that end a new connection, as the flow
/// stream reads them back (`--flows`): verdict, then reason.
pub const LOG_REJECTED_NO_ENDPOINTS: &str = "verdict rejected no-endpoints";
/// A port of a ClusterIP that no Service has.
pub const LOG_REJECTED_INVALID_PORT: &str = "verdict rejected invalid-port";
/// From outside `loadBalancerSourceRanges`.
pub const LOG_DROPPED_SOURCE_RANGE: &str = "verdict dropped source-range";
/// A Local policy and no local endpoint.
pub const LOG_DROPPED_NO_LOCAL_ENDPOINT: &str = "verdict dropped no-local-endpoint";
/// An address of the service CIDRs that no Service has.
pub const LOG_DROPPED_UNALLOCATED: &str = "verdict dropped unallocated";

/// The comment of the rule rejecting traffic to ports of ClusterIPs that
/// no Service has (kube-proxy's).
pub const INVALID_PORT_COMMENT: &str = "Reject traffic to invalid ports of ClusterIPs";
/// The comment of the rules dropping traffic to addresses of the service
/// CIDRs that no Service has (kube-proxy's).
pub const UNALLOCATED_COMMENT: &str = "Drop traffic to unallocated ClusterIPs";

/// The base chains and fixed regular chains, by name ([`fixed_chains`]
/// writes them).
pub const FIXED_CHAINS: [&str; 27] = [
    FILTER_PREROUTING_PRE_DNAT,
    FILTER_OUTPUT_PRE_DNAT,
    FILTER_INPUT,
    FILTER_FORWARD,
    FILTER_OUTPUT,
    NAT_PREROUTING,
    NAT_OUTPUT,
    NAT_POSTROUTING,
    NAT_INPUT,
    DROP_SOURCE_RANGE,
    DROP_NO_LOCAL_ENDPOINT,
    DROP_UNALLOCATED,
    REJECT_INVALID_PORT,
    SERVICES,
    MASQUERADING,
    FIREWALL_CHECK,
    SERVICE_ENDPOINTS_CHECK,
    NODEPORT_ENDPOINTS_CHECK,
    CLUSTER_IPS_CHECK,
    REJECT_CHAIN,
    AFFINITY_RECORD,
    COUNT_TRAFFIC,
    STAGED_SERVICE_IPS,
    STAGED_SERVICE_NODEPORTS,
    STAGED_NO_ENDPOINT_SERVICES,
    STAGED_NO_ENDPOINT_NODEPORTS,
    STAGED_AFFINITY_SERVICES,
];

/// Every set and map, by name ([`sets`] defines them).
pub const SETS: [&str; 22] = [
    CLUSTER_IPS,
    NODEPORT_IPS,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    FIREWALL_IPS,
    FIREWALL_ALLOW,
    HAIRPIN_CONNECTIONS,
    SERVICE_ENDPOINTS_TCP,
    SERVICE_ENDPOINTS_UDP,
    SERVICE_ENDPOINTS_SCTP,
    AFFINITY,
    AFFINITY_SERVICES,
    SERVICE_TRAFFIC,
    SERVICE_CONNECTIONS,
    ENDPOINT_CONNECTIONS,
    REJECTED_CONNECTIONS,
    DROPPED_SOURCE_RANGE,
    DROPPED_NO_LOCAL_ENDPOINT,
    DROPPED_UNALLOCATED,
    REJECTED_INVALID_PORT,
];

/// One of the sets of [`SETS`], by its place there: one byte where its
/// name takes sixteen (the read model names a set for each of 180,000
/// elements at 30,000 Services).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetRef(u8);

impl SetRef {
    /// The set of that name, if it is one of [`SETS`] (the constants
    /// themselves are found by address).
    pub fn of(name: &str) -> Option<SetRef> {
        let at = SETS
            .iter()
            .position(|n| std::ptr::eq(n.as_ptr(), name.as_ptr()) && n.len() == name.len())
            .or_else(|| SETS.iter().position(|n| *n == name))?;
        Some(SetRef(at as u8))
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        SETS.get(usize::from(self.0)).copied().unwrap_or_default()
    }
}

impl PartialEq<&str> for SetRef {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl Display for SetRef {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Each problem set and the reason it records, as the metrics and the
/// API name it.
pub const PROBLEMS: [(&str, &str); 5] = [
    (REJECTED_CONNECTIONS, "no_endpoints"),
    (REJECTED_INVALID_PORT, "invalid_port"),
    (DROPPED_SOURCE_RANGE, "source_range"),
    (DROPPED_NO_LOCAL_ENDPOINT, "no_local_endpoint"),
    (DROPPED_UNALLOCATED, "unallocated_cluster_ip"),
];

/// Whether the data path writes `set` (the affinity map, each problem
/// set's memory of refused connections): what it holds is traffic, not
/// what verdict programmed, and a drift check leaves it out.
pub fn written_by_the_data_path(set: &str) -> bool {
    set == AFFINITY || PROBLEMS.iter().any(|(s, _)| *s == set)
}

/// The key of a connection in the problem sets: client, destination,
/// protocol, client port, destination port.
pub fn connection_key() -> Vec<Selector> {
    vec![
        Selector::Saddr,
        Selector::Daddr,
        Selector::L4Proto,
        Selector::Sport,
        Selector::Dport,
    ]
}

/// Ends a new connection (`reject` or `drop`), remembering it in `set` so
/// that it counts once: a retry of one already seen ends uncounted; a new
/// one is remembered, counted and, with the flow stream, logged to `log`'s
/// group with its prefix, at most [`LOG_RATE`] a second (past it, the
/// next rule ends it and counts it as not logged); when the set is full,
/// every packet is counted (and none logged: a flood past the set's size
/// is not recorded).
fn end_once(set: &str, end: Expr, log: Option<Expr>) -> Vec<Rule> {
    let key = connection_key();
    let known = || Expr::Lookup {
        key: key.clone(),
        set: set.into(),
        negate: false,
    };
    let mut new = vec![
        Expr::Update {
            set: set.into(),
            key: key.iter().cloned().map(KeyPart::Field).collect(),
            timeout: None,
            value: Vec::new(),
        },
        Expr::Counter,
    ];
    let logged = log.is_some();
    if let Some(log) = log {
        new.push(Expr::Limit {
            rate: LOG_RATE,
            burst: LOG_BURST,
        });
        new.push(log);
    }
    new.push(end.clone());
    let mut rules = vec![
        Rule::new(vec![known(), end.clone()])
            .with_comment("a retry of a connection already counted"),
        Rule::new(new),
    ];
    if logged {
        // Remembered by the rule above, which stopped at its limit.
        rules.push(
            Rule::new(vec![known(), Expr::Counter, end.clone()]).with_comment(NOT_LOGGED_COMMENT),
        );
    }
    rules.push(Rule::new(vec![Expr::Counter, end]).with_comment("the set is full"));
    rules
}

/// The shared chains created on demand. Their names carry their parameters,
/// so a restarted proxier recognises them in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DynChain {
    /// `endpoints-N`: pick one of N endpoints of the packet's entry.
    Endpoints(u32),
    /// `local-endpoints-N`: pick one of N local endpoints.
    LocalEndpoints(u32),
    /// `external-N`: eTP=Cluster external traffic: masquerade, then endpoints-N.
    External(u32),
    /// `external-local-C-L`: eTP=Local external traffic with C cluster and
    /// L local endpoints.
    ExternalLocal(u32, u32),
    /// `affinity-timeout-T`: record affinity for T seconds.
    AffinityTimeout(u32),
}

impl Display for DynChain {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            DynChain::Endpoints(n) => write!(f, "endpoints-{n}"),
            DynChain::LocalEndpoints(n) => write!(f, "local-endpoints-{n}"),
            DynChain::External(n) => write!(f, "external-{n}"),
            DynChain::ExternalLocal(c, l) => write!(f, "external-local-{c}-{l}"),
            DynChain::AffinityTimeout(t) => write!(f, "affinity-timeout-{t}"),
        }
    }
}

impl FromStr for DynChain {
    type Err = ();

    fn from_str(s: &str) -> Result<DynChain, ()> {
        let num = |s: &str| {
            s.parse::<u32>()
                .ok()
                .filter(|n| *n > 0 && !s.starts_with('0'))
        };
        if let Some(rest) = s.strip_prefix("external-local-") {
            let (c, l) = rest.split_once('-').ok_or(())?;
            let l = if l == "0" { Some(0) } else { num(l) };
            return Ok(DynChain::ExternalLocal(num(c).ok_or(())?, l.ok_or(())?));
        }
        let (kind, n) = s.rsplit_once('-').ok_or(())?;
        let n = num(n).ok_or(())?;
        match kind {
            "endpoints" => Ok(DynChain::Endpoints(n)),
            "local-endpoints" => Ok(DynChain::LocalEndpoints(n)),
            "external" => Ok(DynChain::External(n)),
            "affinity-timeout" => Ok(DynChain::AffinityTimeout(n)),
            _ => Err(()),
        }
    }
}

impl DynChain {
    /// The staged maps whose elements may jump to this chain.
    pub fn staged_in(self) -> &'static [&'static str] {
        match self {
            DynChain::Endpoints(_) => &[SERVICE_IPS],
            DynChain::External(_) | DynChain::ExternalLocal(..) => {
                &[SERVICE_IPS, SERVICE_NODEPORTS]
            }
            DynChain::AffinityTimeout(_) => &[AFFINITY_SERVICES],
            DynChain::LocalEndpoints(_) => &[],
        }
    }

    /// Chains this chain jumps to.
    pub fn needs(self) -> Vec<DynChain> {
        match self {
            DynChain::External(n) => vec![DynChain::Endpoints(n)],
            DynChain::ExternalLocal(c, 0) => vec![DynChain::Endpoints(c)],
            DynChain::ExternalLocal(c, l) => {
                vec![DynChain::Endpoints(c), DynChain::LocalEndpoints(l)]
            }
            _ => Vec::new(),
        }
    }

    /// The chain's rules.
    pub fn rules(self, cfg: &ProxierConfig) -> Vec<Rule> {
        let mark = cfg.masquerade_mark();
        let goto = |c: DynChain| Expr::Verdict(Verdict::Goto(c.to_string()));
        match self {
            // meta l4proto tcp dnat ip addr . port to ip saddr . ip daddr . meta l4proto . th dport map @affinity
            // meta l4proto tcp dnat ip addr . port to ip daddr . th dport . numgen random mod N [offset O] map @service-endpoints-tcp
            DynChain::Endpoints(n) | DynChain::LocalEndpoints(n) => {
                let offset = if matches!(self, DynChain::LocalEndpoints(_)) {
                    LOCAL_SLOT_OFFSET
                } else {
                    0
                };
                let mut rules = Vec::new();
                for p in L4Proto::ALL {
                    rules.push(Rule::new(vec![
                        proto_is(p),
                        Expr::Dnat(DnatTarget::Map {
                            key: vec![
                                Selector::Saddr,
                                Selector::Daddr,
                                Selector::L4Proto,
                                Selector::Dport,
                            ],
                            map: AFFINITY.into(),
                        }),
                    ]));
                    rules.push(Rule::new(vec![
                        proto_is(p),
                        Expr::Dnat(DnatTarget::Map {
                            key: vec![
                                Selector::Daddr,
                                Selector::Dport,
                                Selector::Numgen { modulus: n, offset },
                            ],
                            map: service_endpoints(p).into(),
                        }),
                    ]));
                }
                rules
            }
            DynChain::External(n) => vec![
                Rule::new(vec![Expr::MarkOr(mark)]).with_comment("masquerade"),
                Rule::new(vec![goto(DynChain::Endpoints(n))]),
            ],
            DynChain::ExternalLocal(c, l) => {
                let mut rules = Vec::new();
                if let Some(is_local) = detect_local(&cfg.local_detector, false) {
                    rules.push(
                        Rule::new(vec![is_local, goto(DynChain::Endpoints(c))])
                            .with_comment("short-circuit pod traffic"),
                    );
                }
                rules.push(
                    Rule::new(vec![Expr::FibLocal(FibAddr::Saddr), Expr::MarkOr(mark)])
                        .with_comment("masquerade local traffic"),
                );
                rules.push(
                    Rule::new(vec![
                        Expr::FibLocal(FibAddr::Saddr),
                        goto(DynChain::Endpoints(c)),
                    ])
                    .with_comment("short-circuit local traffic"),
                );
                if l > 0 {
                    rules.push(Rule::new(vec![goto(DynChain::LocalEndpoints(l))]));
                }
                rules
            }
            // meta l4proto tcp update @affinity { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout Ts : ip daddr . th dport }
            DynChain::AffinityTimeout(t) => L4Proto::ALL
                .iter()
                .map(|p| {
                    Rule::new(vec![
                        proto_is(*p),
                        Expr::Update {
                            set: AFFINITY.into(),
                            key: vec![
                                KeyPart::Field(Selector::Saddr),
                                KeyPart::Field(Selector::CtOriginalDaddr),
                                KeyPart::Field(Selector::L4Proto),
                                KeyPart::Field(Selector::CtOriginalDport),
                            ],
                            timeout: Some(t),
                            value: vec![
                                KeyPart::Field(Selector::Daddr),
                                KeyPart::Field(Selector::Dport),
                            ],
                        },
                    ])
                })
                .collect(),
        }
    }
}

fn proto_is(p: L4Proto) -> Expr {
    Expr::Cmp {
        selector: Selector::L4Proto,
        op: CmpOp::Eq,
        value: Value::Proto(p),
    }
}

fn jump(chain: &str) -> Expr {
    Expr::Verdict(Verdict::Jump(chain.into()))
}

/// The local-traffic match, or its negation; `None` without a detector.
fn detect_local(d: &LocalDetector, negate: bool) -> Option<Expr> {
    let op = if negate { CmpOp::Ne } else { CmpOp::Eq };
    match d {
        LocalDetector::None => None,
        LocalDetector::Cidr(net) => Some(Expr::Cmp {
            selector: Selector::Saddr,
            op,
            value: Value::Prefix(*net),
        }),
        LocalDetector::BridgeInterface(name) => Some(Expr::IifName {
            name: name.clone(),
            negate,
        }),
        LocalDetector::InterfaceNamePrefix(prefix) => Some(Expr::IifName {
            name: format!("{prefix}*"),
            negate,
        }),
    }
}

/// A chain with its rules.
pub type ChainWithRules = (Chain, Vec<Rule>);

/// How a rule drops a new connection: through `chain`, which counts it
/// once, with the counters; else at once, as kube-proxy does.
fn drop_verdict(cfg: &ProxierConfig, chain: &str) -> Verdict {
    if cfg.ends_once() {
        Verdict::Goto(chain.into())
    } else {
        Verdict::Drop
    }
}

/// The base chains and fixed regular chains with their rules.
pub fn fixed_chains(cfg: &ProxierConfig) -> Vec<ChainWithRules> {
    let family = cfg.nft_family();
    let mark = cfg.masquerade_mark();
    let svc_key = || vec![Selector::Daddr, Selector::L4Proto, Selector::Dport];
    let new_jump = |c: &str| Rule::new(vec![Expr::CtStateNew, jump(c)]);
    let affinity_jump = || {
        Rule::new(vec![
            Expr::CtStateNew,
            Expr::CtStatusDnat,
            jump(AFFINITY_RECORD),
        ])
    };
    let base = |n: &str, t: ChainType, h: Hook, p: i32| Chain::base(n, t, h, p);
    // Every packet of a DNATed connection, new or not, is counted first:
    // the filter hooks see both directions of routed, delivered and
    // locally sent traffic.
    let drop_to = |chain: &str| Expr::Verdict(drop_verdict(cfg, chain));
    let level = cfg.metrics_level();
    let counted = |rules: Vec<Rule>| {
        let mut all = Vec::new();
        if level != Counting::None {
            all.push(Rule::new(vec![Expr::CtStatusDnat, jump(COUNT_TRAFFIC)]));
        }
        all.extend(rules);
        all
    };
    // The first packet of each DNATed connection meets the NAT chains of
    // postrouting (routed and locally sent traffic) or of input (traffic
    // delivered to the node itself), never both: each connection sent to
    // an endpoint counts once, for the node and, for the Services chosen,
    // per entry point and endpoint.
    let after_dnat = |mut rules: Vec<Rule>| {
        let mut all = Vec::new();
        if cfg.counters {
            all.push(
                Rule::new(vec![Expr::CtStatusDnat, Expr::Counter])
                    .with_comment("connections sent to an endpoint"),
            );
        }
        for p in L4Proto::ALL {
            let entry = vec![
                Selector::CtOriginalDaddr,
                Selector::L4Proto,
                Selector::CtOriginalDport,
            ];
            if level != Counting::None {
                all.push(Rule::new(vec![
                    Expr::CtStatusDnat,
                    proto_is(p),
                    Expr::Lookup {
                        key: entry.clone(),
                        set: SERVICE_CONNECTIONS.into(),
                        negate: false,
                    },
                ]));
            }
            if level == Counting::Endpoint {
                let mut key = entry;
                key.extend([Selector::Daddr, Selector::Dport]);
                all.push(Rule::new(vec![
                    Expr::CtStatusDnat,
                    proto_is(p),
                    Expr::Lookup {
                        key,
                        set: ENDPOINT_CONNECTIONS.into(),
                        negate: false,
                    },
                ]));
            }
        }
        all.append(&mut rules);
        all
    };

    let mut chains = vec![
        (
            base(
                FILTER_PREROUTING_PRE_DNAT,
                ChainType::Filter,
                Hook::Prerouting,
                -110,
            ),
            vec![new_jump(FIREWALL_CHECK)],
        ),
        (
            base(
                FILTER_OUTPUT_PRE_DNAT,
                ChainType::Filter,
                Hook::Output,
                -110,
            ),
            vec![new_jump(FIREWALL_CHECK)],
        ),
        (
            base(FILTER_INPUT, ChainType::Filter, Hook::Input, 0),
            counted(vec![
                new_jump(NODEPORT_ENDPOINTS_CHECK),
                new_jump(SERVICE_ENDPOINTS_CHECK),
                affinity_jump(),
            ]),
        ),
        (
            base(FILTER_FORWARD, ChainType::Filter, Hook::Forward, 0),
            counted(vec![
                new_jump(SERVICE_ENDPOINTS_CHECK),
                new_jump(CLUSTER_IPS_CHECK),
                affinity_jump(),
            ]),
        ),
        (
            base(FILTER_OUTPUT, ChainType::Filter, Hook::Output, 0),
            counted(vec![
                new_jump(SERVICE_ENDPOINTS_CHECK),
                new_jump(CLUSTER_IPS_CHECK),
                affinity_jump(),
            ]),
        ),
        (
            base(NAT_PREROUTING, ChainType::Nat, Hook::Prerouting, -100),
            vec![Rule::new(vec![jump(SERVICES)])],
        ),
        (
            base(NAT_OUTPUT, ChainType::Nat, Hook::Output, -100),
            vec![Rule::new(vec![jump(SERVICES)])],
        ),
        (
            base(NAT_POSTROUTING, ChainType::Nat, Hook::Postrouting, 100),
            after_dnat(vec![Rule::new(vec![jump(MASQUERADING)])]),
        ),
        (
            base(NAT_INPUT, ChainType::Nat, Hook::Input, 100),
            after_dnat(Vec::new()),
        ),
    ];

    // services
    let mut services = Vec::new();
    let cluster_ip = Expr::Lookup {
        key: vec![Selector::Daddr],
        set: CLUSTER_IPS.into(),
        negate: false,
    };
    if cfg.masquerade_all {
        services.push(
            Rule::new(vec![cluster_ip, Expr::MarkOr(mark)])
                .with_comment("masquerade all clusterIP traffic"),
        );
    } else if let Some(not_local) = detect_local(&cfg.local_detector, true) {
        services.push(
            Rule::new(vec![cluster_ip, not_local, Expr::MarkOr(mark)])
                .with_comment("masquerade clusterIP traffic from outside cluster"),
        );
    }
    services.push(Rule::new(vec![Expr::Vmap {
        key: svc_key(),
        map: SERVICE_IPS.into(),
    }]));
    services.push(Rule::new(vec![
        Expr::Lookup {
            key: vec![Selector::Daddr],
            set: NODEPORT_IPS.into(),
            negate: false,
        },
        Expr::Vmap {
            key: vec![Selector::L4Proto, Selector::Dport],
            map: SERVICE_NODEPORTS.into(),
        },
    ]));
    chains.push((Chain::regular(SERVICES), services));

    chains.push((
        Chain::regular(MASQUERADING),
        vec![
            Rule::new(vec![
                Expr::MarkAnd {
                    mask: mark,
                    nonzero: true,
                },
                Expr::MarkXor(mark),
                Expr::Masquerade,
            ]),
            Rule::new(vec![
                Expr::CtStatusDnat,
                Expr::Lookup {
                    key: vec![
                        Selector::Saddr,
                        Selector::Daddr,
                        Selector::L4Proto,
                        Selector::Dport,
                    ],
                    set: HAIRPIN_CONNECTIONS.into(),
                    negate: false,
                },
                Expr::Masquerade,
            ]),
        ],
    ));

    chains.push((
        Chain::regular(FIREWALL_CHECK),
        vec![Rule::new(vec![
            Expr::Lookup {
                key: svc_key(),
                set: FIREWALL_IPS.into(),
                negate: false,
            },
            Expr::Lookup {
                key: vec![
                    Selector::Daddr,
                    Selector::L4Proto,
                    Selector::Dport,
                    Selector::Saddr,
                ],
                set: FIREWALL_ALLOW.into(),
                negate: true,
            },
            drop_to(DROP_SOURCE_RANGE),
        ])],
    ));

    chains.push((
        Chain::regular(SERVICE_ENDPOINTS_CHECK),
        vec![Rule::new(vec![Expr::Vmap {
            key: svc_key(),
            map: NO_ENDPOINT_SERVICES.into(),
        }])],
    ));
    chains.push((
        Chain::regular(NODEPORT_ENDPOINTS_CHECK),
        vec![Rule::new(vec![
            Expr::Lookup {
                key: vec![Selector::Daddr],
                set: NODEPORT_IPS.into(),
                negate: false,
            },
            Expr::Vmap {
                key: vec![Selector::L4Proto, Selector::Dport],
                map: NO_ENDPOINT_NODEPORTS.into(),
            },
        ])],
    ));

    let log = |prefix: &str| {
        cfg.flow_log_group.map(|group| Expr::Log {
            prefix: prefix.into(),
            group,
        })
    };
    // With the counters or the flow stream, a port no Service has is
    // rejected in a chain that remembers the connection, as every other
    // reason: a UDP client sending datagrams, or one retrying, counts
    // once.
    let invalid_port = vec![
        Expr::Lookup {
            key: vec![Selector::Daddr],
            set: CLUSTER_IPS.into(),
            negate: false,
        },
        if cfg.ends_once() {
            Expr::Verdict(Verdict::Goto(REJECT_INVALID_PORT.into()))
        } else {
            Expr::Reject
        },
    ];
    let mut cluster_ips_check = vec![Rule::new(invalid_port).with_comment(INVALID_PORT_COMMENT)];
    for cidr in &cfg.service_cidrs {
        cluster_ips_check.push(
            Rule::new(vec![
                Expr::Cmp {
                    selector: Selector::Daddr,
                    op: CmpOp::Eq,
                    value: Value::Prefix(*cidr),
                },
                drop_to(DROP_UNALLOCATED),
            ])
            .with_comment(UNALLOCATED_COMMENT),
        );
    }
    chains.push((Chain::regular(CLUSTER_IPS_CHECK), cluster_ips_check));

    chains.push((
        Chain::regular(REJECT_CHAIN)
            .with_comment("helper for @no-endpoint-services / @no-endpoint-nodeports"),
        if cfg.ends_once() {
            end_once(
                REJECTED_CONNECTIONS,
                Expr::Reject,
                log(LOG_REJECTED_NO_ENDPOINTS),
            )
        } else {
            vec![Rule::new(vec![Expr::Reject])]
        },
    ));
    chains.push((
        Chain::regular(REJECT_INVALID_PORT).with_comment(
            "rejects connections to ports of ClusterIPs that no Service has, counting each once",
        ),
        if cfg.ends_once() {
            end_once(
                REJECTED_INVALID_PORT,
                Expr::Reject,
                log(LOG_REJECTED_INVALID_PORT),
            )
        } else {
            Vec::new()
        },
    ));
    for (chain, set, prefix, comment) in [
        (
            DROP_SOURCE_RANGE,
            DROPPED_SOURCE_RANGE,
            LOG_DROPPED_SOURCE_RANGE,
            "drops connections from outside loadBalancerSourceRanges, counting each once",
        ),
        (
            DROP_NO_LOCAL_ENDPOINT,
            DROPPED_NO_LOCAL_ENDPOINT,
            LOG_DROPPED_NO_LOCAL_ENDPOINT,
            "drops connections to Services with a Local policy and no local endpoint, counting each once",
        ),
        (
            DROP_UNALLOCATED,
            DROPPED_UNALLOCATED,
            LOG_DROPPED_UNALLOCATED,
            "drops connections to unallocated ClusterIPs, counting each once",
        ),
    ] {
        let rules = if cfg.ends_once() {
            end_once(set, Expr::Verdict(Verdict::Drop), log(prefix))
        } else {
            Vec::new()
        };
        chains.push((Chain::regular(chain).with_comment(comment), rules));
    }

    // meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst vmap @affinity-services
    chains.push((
        Chain::regular(AFFINITY_RECORD),
        L4Proto::ALL
            .iter()
            .map(|p| {
                Rule::new(vec![
                    proto_is(*p),
                    Expr::Vmap {
                        key: vec![
                            Selector::CtOriginalDaddr,
                            Selector::L4Proto,
                            Selector::CtOriginalDport,
                        ],
                        map: AFFINITY_SERVICES.into(),
                    },
                ])
            })
            .collect(),
    ));
    // meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst . ct reply ip saddr . ct reply proto-src @service-traffic return
    chains.push((
        Chain::regular(COUNT_TRAFFIC).with_comment(
            "counts the packets and bytes of Service connections per entry and endpoint",
        ),
        L4Proto::ALL
            .iter()
            .map(|p| {
                Rule::new(vec![
                    proto_is(*p),
                    Expr::Lookup {
                        key: vec![
                            Selector::CtOriginalDaddr,
                            Selector::L4Proto,
                            Selector::CtOriginalDport,
                            Selector::CtReplySaddr,
                            Selector::CtReplySport,
                        ],
                        set: SERVICE_TRAFFIC.into(),
                        negate: false,
                    },
                    Expr::Verdict(Verdict::Return),
                ])
            })
            .collect(),
    ));
    let _ = family;
    // Each staged map's gate, right after the rule that looks the map up,
    // and its staging chain (the rules to fixed targets written here, the
    // others by the proxier as shared chains come and go).
    for (_, rules) in &mut chains {
        let mut at = 0;
        while at < rules.len() {
            if let Some(gate) = gate_rule(&rules[at]) {
                rules.insert(at + 1, gate);
                at += 1;
            }
            at += 1;
        }
    }
    let dispatch = dispatch_rules(&chains);
    for (map, staged) in STAGED_MAPS {
        let targets = fixed_staging_targets(cfg, map);
        chains.push((
            Chain::regular(staged).with_comment(format!(
                "sends the keys staged for @{map} to their chains until they move there"
            )),
            staging_rules_with(&dispatch, map, targets.iter().copied()),
        ));
    }
    chains
}

/// Where each staged map is looked up: the rule's expressions before the
/// lookup, and its key.
type Dispatch = Vec<(&'static str, Vec<Expr>, Vec<Selector>)>;

fn dispatch_rules(chains: &[ChainWithRules]) -> Dispatch {
    let mut out = Vec::new();
    for (_, rules) in chains {
        for rule in rules {
            if let Some((Expr::Vmap { key, map }, prefix)) = rule.exprs.split_last()
                && let Some((m, _)) = STAGED_MAPS.iter().find(|(m, _)| *m == map.as_str())
            {
                out.push((*m, prefix.to_vec(), key.clone()));
            }
        }
    }
    out
}

/// The gate after a rule looking up a staged map: the same match, the key
/// in the gate set, on to the staging chain.
fn gate_rule(rule: &Rule) -> Option<Rule> {
    let (Expr::Vmap { key, map }, prefix) = rule.exprs.split_last()? else {
        return None;
    };
    let staged = staged_of(map)?;
    Some(lookup_goto(prefix, key, staged, staged))
}

/// `prefix`, `key` looked up in `set`, `goto chain`.
fn lookup_goto(prefix: &[Expr], key: &[Selector], set: &str, chain: &str) -> Rule {
    let mut exprs = prefix.to_vec();
    exprs.push(Expr::Lookup {
        key: key.to_vec(),
        set: set.into(),
        negate: false,
    });
    exprs.push(Expr::Verdict(Verdict::Goto(chain.into())));
    Rule::new(exprs)
}

fn staging_rules_with<'a>(
    dispatch: &Dispatch,
    map: &str,
    targets: impl Iterator<Item = &'a str>,
) -> Vec<Rule> {
    let mut rules = Vec::new();
    for target in targets {
        let Some(set) = staging_set(map, target) else {
            continue;
        };
        for (_, prefix, key) in dispatch.iter().filter(|(m, ..)| *m == map) {
            rules.push(lookup_goto(prefix, key, &set, target));
        }
    }
    rules
}

/// The rules of a staging chain whose map's elements jump to `targets`
/// (shared chains, and the map's fixed targets).
pub fn staging_rules<'a>(
    cfg: &ProxierConfig,
    map: &str,
    targets: impl Iterator<Item = &'a str>,
) -> Vec<Rule> {
    let chains = fixed_chains(cfg);
    let dispatch = dispatch_rules(&chains);
    let fixed = fixed_staging_targets(cfg, map);
    staging_rules_with(&dispatch, map, fixed.into_iter().chain(targets))
}

/// The gate sets of the staged maps and the staging sets of their fixed
/// targets (each of a map's key type). Those of shared chains come and go
/// with the chains ([`staging_set_of`]).
pub fn staging_sets(cfg: &ProxierConfig) -> Vec<Set> {
    let mut out = Vec::new();
    for (map, _) in STAGED_MAPS {
        if let Some(gate) = staging_set_of(cfg, map, None) {
            out.push(gate.with_comment(format!("keys staged for @{map}")));
        }
        for target in fixed_staging_targets(cfg, map) {
            out.extend(staging_set_of(cfg, map, Some(target)));
        }
    }
    out
}

/// How verdict declares the gate or staging set `name`, if it is one.
pub fn staging_set_named(cfg: &ProxierConfig, name: &str) -> Option<Set> {
    match parse_staging_set(name) {
        Some((map, target)) => staging_set_of(cfg, map, Some(target)),
        None => staging_set_of(cfg, map_of_staged(name)?, None),
    }
}

/// The gate set of a staged map (`target` `None`), or the staging set of
/// one of its targets.
pub fn staging_set_of(cfg: &ProxierConfig, map: &str, target: Option<&str>) -> Option<Set> {
    let def = sets(cfg).into_iter().find(|s| s.name == map)?;
    let name = match target {
        None => staged_of(map)?.to_owned(),
        Some(t) => staging_set(map, t)?,
    };
    Some(Set::set(name, def.key))
}

/// The value of a `no-endpoint-*` element whose Service drops for want of
/// a local endpoint: through [`DROP_NO_LOCAL_ENDPOINT`], which counts the
/// connection once, with the counters.
pub fn no_local_endpoint_drop(cfg: &ProxierConfig) -> ElementValue {
    ElementValue::Verdict(drop_verdict(cfg, DROP_NO_LOCAL_ENDPOINT))
}

/// Every set and map of the table. The sets that count
/// (`service-connections`, `endpoint-connections`, `service-traffic`) hold
/// elements only for the Services [`ProxierConfig::metrics`] chooses, so
/// the kernel allocates counters for those alone; the others count
/// nothing per element.
pub fn sets(cfg: &ProxierConfig) -> Vec<Set> {
    let addr = cfg.nft_family().addr_type();
    let svc = vec![addr, DataType::InetProto, DataType::InetService];
    let port = vec![DataType::InetProto, DataType::InetService];
    let mut allow = svc.clone();
    allow.push(addr);
    let mut affinity_key = vec![addr];
    affinity_key.extend(svc.iter().copied());
    let mut entry_endpoint = svc.clone();
    entry_endpoint.extend([addr, DataType::InetService]);
    let connection = vec![
        addr,
        addr,
        DataType::InetProto,
        DataType::InetService,
        DataType::InetService,
    ];
    let mut sets = vec![
        Set::set(CLUSTER_IPS, vec![addr]).with_comment("Active ClusterIPs"),
        Set::set(NODEPORT_IPS, vec![addr]).with_comment("IPs that accept NodePort traffic"),
        Set::map(SERVICE_IPS, svc.clone(), vec![DataType::Verdict])
            .with_comment("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        Set::map(SERVICE_NODEPORTS, port.clone(), vec![DataType::Verdict])
            .with_comment("NodePort traffic"),
        Set::map(NO_ENDPOINT_SERVICES, svc.clone(), vec![DataType::Verdict])
            .with_comment("vmap to drop or reject packets to services with no endpoints"),
        Set::map(NO_ENDPOINT_NODEPORTS, port, vec![DataType::Verdict])
            .with_comment("vmap to drop or reject packets to service nodeports with no endpoints"),
        Set::set(FIREWALL_IPS, svc.clone())
            .with_comment("destinations that are subject to LoadBalancerSourceRanges"),
        Set::set(FIREWALL_ALLOW, allow)
            .with_interval()
            .with_comment("sources allowed by LoadBalancerSourceRanges"),
        Set::set(
            HAIRPIN_CONNECTIONS,
            vec![addr, addr, DataType::InetProto, DataType::InetService],
        )
        .with_comment("service hairpin connections"),
        Set::map(AFFINITY, affinity_key, vec![addr, DataType::InetService])
            .with_timeout(10800, AFFINITY_SIZE)
            .with_comment("ClientIP session affinity"),
        Set::map(AFFINITY_SERVICES, svc.clone(), vec![DataType::Verdict])
            .with_comment("entries of services with ClientIP session affinity"),
        Set::set(SERVICE_TRAFFIC, entry_endpoint.clone())
            .with_counters()
            .with_comment(
                "packets and bytes of counted Services' connections per entry and endpoint",
            ),
        Set::set(SERVICE_CONNECTIONS, svc)
            .with_counters()
            .with_comment("connections of counted Services per entry"),
        Set::set(ENDPOINT_CONNECTIONS, entry_endpoint)
            .with_counters()
            .with_comment("connections of counted Services per entry and endpoint"),
    ];
    for (name, _) in PROBLEMS {
        sets.push(
            Set::set(name, connection.clone())
                .with_timeout(PROBLEM_TIMEOUT, PROBLEM_SIZE)
                .with_comment("connections ended here in the last 3 minutes, each counted once"),
        );
    }
    for p in L4Proto::ALL {
        let port = DataType::PortOf(p);
        sets.push(
            Set::map(
                service_endpoints(p),
                vec![addr, port, DataType::Numgen],
                vec![addr, port],
            )
            .with_comment(format!("{p} service entry and slot to endpoint")),
        );
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_ref_names_each_set_and_nothing_else() {
        for name in SETS {
            let r = SetRef::of(name).unwrap();
            assert_eq!(r.name(), name);
            assert!(r == name);
            // A name that is not the constant itself is found too.
            let copy = String::from(name);
            assert_eq!(SetRef::of(copy.as_str()), Some(r));
        }
        assert_eq!(SetRef::of("services"), None);
        // What an element of a port costs the proxier's record, which the
        // read model shares: 180,000 times at 30,000 Services.
        assert_eq!(
            std::mem::size_of::<(SetRef, std::sync::Arc<verdict_nft::Element>)>(),
            16
        );
    }

    #[test]
    fn dynamic_chain_names_round_trip() {
        for c in [
            DynChain::Endpoints(1),
            DynChain::Endpoints(37),
            DynChain::LocalEndpoints(2),
            DynChain::External(3),
            DynChain::ExternalLocal(4, 0),
            DynChain::ExternalLocal(4, 12),
            DynChain::AffinityTimeout(10800),
        ] {
            assert_eq!(c.to_string().parse::<DynChain>(), Ok(c), "{c}");
        }
        for bad in [
            "services",
            "endpoints-0",
            "endpoints-01",
            "endpoints-x",
            "external-local-3",
            "service-ULMVA6XW-ns1/svc1/tcp/p80",
        ] {
            assert!(bad.parse::<DynChain>().is_err(), "{bad}");
        }
    }

    #[test]
    fn chain_and_set_counts_are_fixed() {
        let cfg = ProxierConfig::new(verdict_model::IpFamily::V4, "n");
        let mut chains: Vec<String> = fixed_chains(&cfg)
            .into_iter()
            .map(|(c, _)| c.name)
            .collect();
        let mut names: Vec<&str> = FIXED_CHAINS.to_vec();
        chains.sort();
        names.sort();
        assert_eq!(chains, names, "FIXED_CHAINS names what fixed_chains writes");
        let mut set_names: Vec<String> = sets(&cfg).into_iter().map(|s| s.name).collect();
        let mut names: Vec<&str> = SETS.to_vec();
        set_names.sort();
        names.sort();
        assert_eq!(set_names, names, "SETS names what sets defines");
    }
}
