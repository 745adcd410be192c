//! Replays a conformance scenario on a test bed through the real proxier
//! and `nft`, then checks every flow with real connections:
//! - endpoints: every answer comes from an expected endpoint, every expected
//!   endpoint answers within a bounded number of tries, and the source
//!   address and port the endpoint saw show whether it was masqueraded
//!   (`masquerade fully-random` always changes the port);
//! - `REJECT`: the connection is refused; `DROP`: it times out;
//! - `""` (untouched): the original destination answers itself.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use verdict_conformance::{Event, Flow, NODE, Scenario, Step, node_facts};
use verdict_model::{IpFamily, Protocol, parse_ip_legacy};
use verdict_nft::{L4Proto, NftCli};
use verdict_proxier::{LocalDetector, NodePortAddresses, Proxier, ProxierConfig};

use crate::bed::{Placement, TestBed};

/// How one scenario went.
#[derive(Debug, Default)]
pub struct ScenarioResult {
    /// Scenario name.
    pub name: String,
    /// Flows that behaved as expected.
    pub passed: usize,
    /// Flows that did not, with what happened.
    pub failures: Vec<String>,
    /// Flows not run, with the reason.
    pub skipped: Vec<String>,
}

const TIMEOUT_MS: u64 = 1000;

fn parse(s: &str) -> Option<IpAddr> {
    parse_ip_legacy(s)
}

/// The proxier settings of the scenario's node (kube-proxy's fake proxier).
pub fn node_config(s: &Scenario) -> Result<ProxierConfig, String> {
    let family = s.setup.family;
    let facts = node_facts(family);
    let mut c = ProxierConfig::new(family, NODE);
    let ips = |v: &[&str]| v.iter().filter_map(|a| parse(a)).collect::<Vec<_>>();
    c.node_ips = ips(&facts.node_ips);
    c.local_ips = ips(&facts.local_ips);
    let net = |a: &str| a.parse::<ipnet::IpNet>().map_err(|e| format!("{a}: {e}"));
    c.local_detector = if s.setup.tweaks.no_detector {
        LocalDetector::None
    } else {
        LocalDetector::Cidr(net(facts.pod_cidr)?)
    };
    c.service_cidrs = vec![net(facts.service_cidr)?];
    let cidrs: Vec<String> = match &s.setup.tweaks.node_port_cidrs {
        Some(c) => c.clone(),
        None => facts
            .node_port_cidrs
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    c.node_port_addresses =
        NodePortAddresses::cidrs(cidrs.iter().map(|a| net(a)).collect::<Result<_, _>>()?);
    c.masquerade_all = s.setup.tweaks.masquerade_all;
    Ok(c)
}

#[derive(Default)]
struct PodPlan {
    local: bool,
    tcp: BTreeSet<u16>,
    udp: BTreeSet<u16>,
}

/// Runs one scenario on a fresh bed.
/// Which kernel backend programs a test node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelBackend {
    /// The `nft` program.
    Nft,
    /// nf_tables over netlink.
    Netlink,
}

impl KernelBackend {
    /// Both, nft first.
    pub const ALL: [KernelBackend; 2] = [KernelBackend::Nft, KernelBackend::Netlink];

    /// The backend, working in the network namespace `ns`.
    pub fn open(self, ns: &str) -> Result<Box<dyn verdict_nft::Backend>, verdict_nft::NftError> {
        Ok(match self {
            KernelBackend::Nft => Box::new(NftCli::in_netns(ns)?),
            KernelBackend::Netlink => Box::new(verdict_nft::NetlinkBackend::in_netns(ns)?),
        })
    }
}

/// Runs one scenario's flows as real traffic on a node programmed through
/// `kernel`.
pub fn run_scenario(s: &Scenario, echo: PathBuf, kernel: KernelBackend) -> ScenarioResult {
    let mut result = ScenarioResult {
        name: match kernel {
            KernelBackend::Nft => s.name.clone(),
            KernelBackend::Netlink => format!("{} [netlink]", s.name),
        },
        ..ScenarioResult::default()
    };
    match prepare_and_run(s, echo, kernel, &mut result) {
        Ok(()) => {}
        Err(e) => result
            .failures
            .push(format!("{}: setup failed: {e}", s.name)),
    }
    result
}

fn skip_reason(s: &Scenario, f: &Flow, pods: &BTreeMap<IpAddr, PodPlan>) -> Option<String> {
    if f.proto == L4Proto::Sctp && !sctp_available() {
        return Some("this kernel has no SCTP support (socket(…, IPPROTO_SCTP) fails)".into());
    }
    let src = parse(f.src)?;
    let facts = node_facts(s.setup.family);
    let pod_cidr: Option<ipnet::IpNet> = facts.pod_cidr.parse().ok();
    let node_or_ext = crate::bed::NODE_ADDRS
        .iter()
        .chain(["203.0.113.2/24", "203.0.113.130/24", "2600:5200::1/64"].iter())
        .any(|a| a.split('/').next() == Some(f.src));
    if node_or_ext || pods.contains_key(&src) || pod_cidr.is_some_and(|n| n.contains(&src)) {
        return None;
    }
    Some(format!(
        "source {} belongs to no host: it stands for the node's own traffic SNATed to its \
         LoadBalancer address by the load balancer, which cannot be sent from outside",
        f.src
    ))
}

fn sctp_available() -> bool {
    socket_probe()
}

fn socket_probe() -> bool {
    // The kernel refuses SCTP sockets when the protocol is not built in.
    std::fs::read_to_string("/proc/net/protocols")
        .map(|p| p.lines().any(|l| l.starts_with("SCTP")))
        .unwrap_or(false)
}

/// What a scenario needs of a test bed: its pods (every endpoint, every
/// client pod, every destination that answers itself), the ports the
/// node itself serves, the service addresses to route to the node, and
/// the flows that can be sent (the others skipped, with why).
#[derive(Default)]
pub struct Plan {
    pods: BTreeMap<IpAddr, PodPlan>,
    node_tcp: BTreeSet<u16>,
    node_udp: BTreeSet<u16>,
    vips: BTreeSet<IpAddr>,
    node_addrs: BTreeSet<IpAddr>,
    /// The flows to send, with their parsed source and destination.
    pub flows: Vec<(Flow, IpAddr, IpAddr)>,
}

/// The plan of `s`; flows that cannot be sent go to `result`.
pub fn plan(s: &Scenario, result: &mut ScenarioResult) -> Plan {
    // Pods: every endpoint of every slice the scenario uses.
    let mut pods: BTreeMap<IpAddr, PodPlan> = BTreeMap::new();
    let mut vips: BTreeSet<IpAddr> = BTreeSet::new();
    for step in &s.setup.steps {
        match step {
            Step::Slice(sl) => {
                for ep in &sl.endpoints {
                    let Some(ip) = ep.addresses.first().and_then(|a| parse(a)) else {
                        continue;
                    };
                    let plan = pods.entry(ip).or_default();
                    plan.local |= ep.node_name.as_deref() == Some(NODE);
                    for p in &sl.ports {
                        let Some(port) = p.port.and_then(|p| u16::try_from(p).ok()) else {
                            continue;
                        };
                        match p.protocol {
                            Protocol::Tcp => plan.tcp.insert(port),
                            Protocol::Udp => plan.udp.insert(port),
                            Protocol::Sctp => false,
                        };
                    }
                }
            }
            Step::Service(svc) => {
                let ingress = svc
                    .load_balancer_ingress
                    .iter()
                    .filter_map(|i| i.ip.clone());
                for a in svc
                    .cluster_ips
                    .iter()
                    .cloned()
                    .chain(svc.external_ips.iter().cloned())
                    .chain(ingress)
                {
                    if let Some(ip) = parse(&a) {
                        vips.insert(ip);
                    }
                }
            }
            _ => {}
        }
    }
    // Clients and untouched destinations.
    let node_addrs: BTreeSet<IpAddr> = crate::bed::NODE_ADDRS
        .iter()
        .filter_map(|a| a.split('/').next().and_then(parse))
        .collect();
    let mut node_tcp = BTreeSet::new();
    let mut node_udp = BTreeSet::new();
    let mut runnable = Vec::new();
    for f in &s.flows {
        if let Some(why) = skip_reason(s, f, &pods) {
            result
                .skipped
                .push(format!("{} / {}: {why}", s.name, f.name));
            continue;
        }
        let (Some(src), Some(dst)) = (parse(f.src), parse(f.dst)) else {
            result
                .failures
                .push(format!("{} / {}: bad address", s.name, f.name));
            continue;
        };
        if !node_addrs.contains(&src)
            && !src.to_string().starts_with("203.0.113.")
            && !src.to_string().starts_with("2600:5200:")
        {
            pods.entry(src).or_insert_with(|| PodPlan {
                local: true,
                ..PodPlan::default()
            });
        }
        if f.output.is_empty() {
            if node_addrs.contains(&dst) {
                insert_port(f.proto, f.dport, &mut node_tcp, &mut node_udp);
            } else {
                let plan = pods.entry(dst).or_insert_with(|| PodPlan {
                    local: true,
                    ..PodPlan::default()
                });
                insert_port(f.proto, f.dport, &mut plan.tcp, &mut plan.udp);
            }
        }
        runnable.push((f.clone(), src, dst));
    }
    Plan {
        pods,
        node_tcp,
        node_udp,
        vips,
        node_addrs,
        flows: runnable,
    }
}

/// A fresh test bed with what `plan` needs, for a scenario of `family`.
pub fn furnish(plan: &Plan, family: IpFamily, echo: PathBuf) -> Result<TestBed, String> {
    let mut bed = TestBed::new(echo).map_err(|e| e.to_string())?;
    for (ip, p) in &plan.pods {
        let place = if p.local {
            Placement::Local
        } else {
            Placement::Remote
        };
        let tcp: Vec<u16> = p.tcp.iter().copied().collect();
        let udp: Vec<u16> = p.udp.iter().copied().collect();
        bed.add_pod(*ip, place, &tcp, &udp)
            .map_err(|e| e.to_string())?;
    }
    if !plan.node_tcp.is_empty() || !plan.node_udp.is_empty() {
        let addrs: Vec<IpAddr> = plan
            .node_addrs
            .iter()
            .copied()
            .filter(|a| IpFamily::of(*a) == family)
            .collect();
        let tcp: Vec<u16> = plan.node_tcp.iter().copied().collect();
        let udp: Vec<u16> = plan.node_udp.iter().copied().collect();
        bed.serve_node(&addrs, &tcp, &udp)
            .map_err(|e| e.to_string())?;
    }
    for vip in &plan.vips {
        if !plan.node_addrs.contains(vip) && !bed.has_pod(*vip) {
            bed.route_to_node(*vip).map_err(|e| e.to_string())?;
        }
    }
    Ok(bed)
}

fn prepare_and_run(
    s: &Scenario,
    echo: PathBuf,
    kernel: KernelBackend,
    result: &mut ScenarioResult,
) -> Result<(), String> {
    let plan = plan(s, result);
    let bed = furnish(&plan, s.setup.family, echo)?;

    // Program the node through the real proxier and a kernel backend.
    let mut nft = kernel.open(bed.node.name()).map_err(|e| e.to_string())?;
    let mut proxier = Proxier::new(node_config(s)?).map_err(|e| e.to_string())?;
    let start = Instant::now();
    for (i, event) in s.setup.events().into_iter().enumerate() {
        match event {
            Event::Service(prev, cur) => {
                proxier.on_service(prev.as_deref(), cur.as_deref());
            }
            Event::Slice(sl, removed) => {
                proxier.on_endpoint_slice(&sl, removed);
            }
            Event::Sync => {
                let now = start + Duration::from_secs(i as u64);
                proxier
                    .sync(&mut nft, now)
                    .map_err(|e| format!("sync: {e}"))?;
            }
        }
    }

    for (f, src, dst) in &plan.flows {
        let outcome = check_flow(&bed, f, *src, *dst);
        if outcome.is_err()
            && let Ok(secs) = std::env::var("VERDICT_E2E_HOLD")
        {
            // Debugging aid: keep the failing bed for inspection.
            eprintln!(
                "holding {} for {secs}s after {:?}",
                bed.node.name(),
                outcome
            );
            std::thread::sleep(Duration::from_secs(secs.parse().unwrap_or(60)));
        }
        match outcome {
            Ok(()) => result.passed += 1,
            Err(e) => result.failures.push(format!(
                "{} / {}: {} {} -> {}:{}: want {:?} masq={}: {e}",
                s.name, f.name, f.proto, f.src, f.dst, f.dport, f.output, f.masq
            )),
        }
    }
    Ok(())
}

fn insert_port(p: L4Proto, port: u16, tcp: &mut BTreeSet<u16>, udp: &mut BTreeSet<u16>) {
    match p {
        L4Proto::Tcp => {
            tcp.insert(port);
        }
        L4Proto::Udp => {
            udp.insert(port);
        }
        L4Proto::Sctp => {}
    }
}

/// One answer of the echo tool.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Who answered, the source it saw, and our local port.
    Ok {
        by: String,
        seen: IpAddr,
        seen_port: u16,
        local_port: u16,
    },
    Refused,
    Timeout,
    Other(String),
}

fn answer(line: &str) -> Answer {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["OK", by, seen, seen_port, local_port] => {
            match (seen.parse(), seen_port.parse(), local_port.parse()) {
                (Ok(seen), Ok(seen_port), Ok(local_port)) => Answer::Ok {
                    by: by.to_string(),
                    seen,
                    seen_port,
                    local_port,
                },
                _ => Answer::Other(line.into()),
            }
        }
        ["REFUSED"] => Answer::Refused,
        ["TIMEOUT"] => Answer::Timeout,
        _ => Answer::Other(line.into()),
    }
}

fn check_flow(bed: &TestBed, f: &Flow, src: IpAddr, dst: IpAddr) -> Result<(), String> {
    let proto = match f.proto {
        L4Proto::Tcp => "tcp",
        L4Proto::Udp => "udp",
        L4Proto::Sctp => "sctp",
    };
    let once = || -> Result<Answer, String> {
        bed.connect(src, dst, proto, f.dport, TIMEOUT_MS)
            .map(|l| answer(&l))
            .map_err(|e| e.to_string())
    };
    match f.output.as_str() {
        "DROP" => match once()? {
            Answer::Timeout => Ok(()),
            other => Err(format!("got {other:?}")),
        },
        "REJECT" => match once()? {
            Answer::Refused => Ok(()),
            other => Err(format!("got {other:?}")),
        },
        "" => {
            let me = SocketAddr::new(dst, f.dport).to_string();
            match once()? {
                Answer::Ok { by, .. } if by == me => Ok(()),
                other => Err(format!(
                    "expected the destination itself to answer, got {other:?}"
                )),
            }
        }
        list => {
            let want: BTreeSet<String> = list.split(", ").map(str::to_owned).collect();
            let mut seen = BTreeSet::new();
            let tries = 12 * want.len();
            // A source port that changed while the address did not is
            // either a fully-random masquerade to the client's own address
            // (node-originated traffic) or conntrack moving the port of an
            // unNATed flow off a tuple an earlier case left behind. Seen
            // once, that is ambiguous; a few retries with fresh ports tell.
            let mut port_only = 0;
            for _ in 0..tries {
                match once()? {
                    Answer::Ok {
                        by,
                        seen: saw,
                        seen_port,
                        local_port,
                    } => {
                        if !want.contains(&by) {
                            return Err(format!("answered by {by}, not one of {list}"));
                        }
                        let masq = saw != src || seen_port != local_port;
                        if masq != f.masq && saw == src && port_only < 3 {
                            port_only += 1;
                            continue;
                        }
                        if masq != f.masq {
                            return Err(format!(
                                "{by} saw {saw}:{seen_port} for {src}:{local_port}: masqueraded={masq}"
                            ));
                        }
                        seen.insert(by);
                        if seen == want {
                            return Ok(());
                        }
                    }
                    other => return Err(format!("got {other:?}")),
                }
            }
            Err(format!("only {seen:?} answered in {tries} tries"))
        }
    }
}

/// What became of a flow, as a client and the endpoints saw it: which
/// endpoints answered (over enough tries to see each of the flow's
/// expected ones), whether they saw the client masqueraded, and from which
/// source addresses; or that it was refused, timed out, or failed
/// otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Answered.
    Answered {
        /// Who answered (`IP:port`).
        by: BTreeSet<String>,
        /// Whether the answerers saw another source than the client's
        /// address and port (`None`: some did, some did not).
        masqueraded: Option<bool>,
        /// The source addresses they saw.
        seen: BTreeSet<IpAddr>,
    },
    /// Refused (a reject).
    Refused,
    /// No answer (a drop).
    Timeout,
    /// Anything else (the client's error).
    Other(String),
}

impl std::fmt::Display for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Observation::Answered {
                by,
                masqueraded,
                seen,
            } => {
                let by: Vec<&str> = by.iter().map(String::as_str).collect();
                let seen: Vec<String> = seen.iter().map(IpAddr::to_string).collect();
                let masq = match masqueraded {
                    Some(true) => "masqueraded",
                    Some(false) => "not masqueraded",
                    None => "masqueraded sometimes",
                };
                write!(f, "{} ({masq}, seen as {})", by.join(", "), seen.join(", "))
            }
            Observation::Refused => f.write_str("REJECT"),
            Observation::Timeout => f.write_str("DROP"),
            Observation::Other(e) => write!(f, "error: {e}"),
        }
    }
}

/// Sends `f` from `src` to `dst` on `bed` and says what became of it:
/// as many tries as it takes to see every endpoint the flow expects (12
/// per endpoint at most), one for a reject, a drop or an untouched flow.
pub fn observe(bed: &TestBed, f: &Flow, src: IpAddr, dst: IpAddr) -> Observation {
    observe_counting(bed, f, src, dst, &mut false)
}

/// [`observe`], saying in `retried` whether a first try that got no
/// answer, or a client error, was tried again.
pub fn observe_counting(
    bed: &TestBed,
    f: &Flow,
    src: IpAddr,
    dst: IpAddr,
    retried: &mut bool,
) -> Observation {
    let proto = match f.proto {
        L4Proto::Tcp => "tcp",
        L4Proto::Udp => "udp",
        L4Proto::Sctp => "sctp",
    };
    let once = || match bed.connect(src, dst, proto, f.dport, TIMEOUT_MS) {
        Ok(l) => answer(&l),
        Err(e) => Answer::Other(e.to_string()),
    };
    let want: BTreeSet<String> = match f.output.as_str() {
        "" | "DROP" | "REJECT" => BTreeSet::new(),
        list => list.split(", ").map(str::to_owned).collect(),
    };
    let tries = 12 * want.len().max(1);
    let mut by = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut masq = BTreeSet::new();
    let mut port_only = 0;
    for _ in 0..tries {
        match once() {
            Answer::Ok {
                by: who,
                seen: saw,
                seen_port,
                local_port,
            } => {
                let m = saw != src || seen_port != local_port;
                // A source port moved while the address did not: either a
                // fully-random masquerade to the client's own address or
                // conntrack moving an unNATed flow off a tuple an earlier
                // connection left behind. A fresh try tells.
                if m && saw == src && port_only < 3 {
                    port_only += 1;
                    continue;
                }
                masq.insert(m);
                seen.insert(saw);
                by.insert(who);
                if want.is_empty() || by == want {
                    break;
                }
            }
            Answer::Refused if by.is_empty() => return Observation::Refused,
            // The first packet through a node that was just programmed
            // is now and then lost or answered EHOSTUNREACH (seen beside
            // kube-proxy only, 2 to 4 flows of 215): one more try after a
            // pause tells that from a drop, which drops again.
            Answer::Timeout | Answer::Other(_) if by.is_empty() && !*retried => {
                *retried = true;
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            Answer::Timeout if by.is_empty() => return Observation::Timeout,
            Answer::Other(e) if by.is_empty() => return Observation::Other(e),
            other => {
                by.insert(format!("{other:?}"));
                break;
            }
        }
    }
    if by.is_empty() {
        return Observation::Other(format!("{port_only} answers with only the port moved"));
    }
    Observation::Answered {
        by,
        masqueraded: match (masq.contains(&true), masq.contains(&false)) {
            (true, false) => Some(true),
            (false, _) => Some(false),
            (true, true) => None,
        },
        seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_answers() {
        assert_eq!(
            answer("OK 10.180.0.1:80 10.0.0.2 40000 40000"),
            Answer::Ok {
                by: "10.180.0.1:80".into(),
                seen: "10.0.0.2".parse().unwrap(),
                seen_port: 40000,
                local_port: 40000
            }
        );
        assert_eq!(answer("REFUSED"), Answer::Refused);
        assert_eq!(answer("TIMEOUT"), Answer::Timeout);
        assert!(matches!(
            answer("ERROR Network is unreachable"),
            Answer::Other(_)
        ));
    }
}
