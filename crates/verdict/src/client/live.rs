//! `verdict trace --live`: one real packet, traced by the kernel itself.
//! For packets the node can originate (`--from node`): a table of its own,
//! `verdict-trace`, sets `nftrace` on the first packet to the destination
//! in the output hook before any other chain (priority -400); the
//! kernel's trace group (what `nft monitor trace` reads, here over
//! netlink) reports every chain and rule the packet meets, each rule by
//! its handle, which names it in verdict's table read back; verdict's own
//! table is not touched. The kernel's path is then set beside the typed
//! tracer's: the chains of verdict's table in order, and where the packet
//! went. No program is run.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use verdict_nft::nftrace::{TraceEvent, TraceKind, TraceMonitor};
use verdict_nft::{
    Backend, Chain, ChainType, CmpOp, Expr, Family, Hook, L4Proto, NetlinkBackend, Rule, Selector,
    TableState, Transaction, Value,
};
use verdict_node::inspect::answers::{LiveComparison, LiveKernel, LiveStepAnswer, TraceAnswer};

use verdict_node::inspect::TraceRequest;

/// The table that marks the packet (never verdict's own).
const TABLE: &str = "verdict-trace";
/// How long the kernel's trace is read after the packet is sent.
const LISTEN: Duration = Duration::from_millis(700);

/// One rule of verdict's table the traced packet matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveStep {
    /// The chain.
    pub chain: String,
    /// The rule, as nft prints it (without the handle).
    pub rule: String,
    /// `verdict …`, if the kernel reported one.
    pub verdict: Option<String>,
}

/// What the kernel reported for the first traced packet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveTrace {
    /// The rules of verdict's table it matched, in order.
    pub steps: Vec<LiveStep>,
    /// Every destination address the packet had, in order (after DNAT
    /// the trace shows the endpoint).
    pub daddrs: Vec<String>,
    /// Destination ports, likewise.
    pub dports: Vec<u16>,
}

/// The rules of a table by chain and handle, as nft prints them.
pub fn rules_by_handle(family: Family, table: &TableState) -> BTreeMap<(String, u64), String> {
    let mut out = BTreeMap::new();
    for (name, c) in &table.chains {
        for (rule, handle) in c.rules.iter().zip(&c.handles) {
            out.insert((name.clone(), *handle), rule.render(family));
        }
    }
    out
}

/// The first trace id's steps in `table` of `family`, each rule named by
/// `rules` (chain, handle → text).
pub fn read_events(
    events: &[TraceEvent],
    family: &str,
    table: &str,
    rules: &BTreeMap<(String, u64), String>,
) -> LiveTrace {
    let mut id: Option<u32> = None;
    let mut out = LiveTrace::default();
    // A packet enters each base chain once. The kernel derives a trace
    // id from the packet's buffer, so a later packet of the connection
    // can carry the first one's id: its entering a chain again ends the
    // first packet's trace.
    let mut entered: Vec<(&str, &str, &str)> = Vec::new();
    for e in events {
        match id {
            None => id = Some(e.id),
            Some(first) if first != e.id => continue,
            Some(_) => {}
        }
        if let Some(h) = &e.headers {
            let at = (e.family, e.table.as_str(), e.chain.as_str());
            if entered.contains(&at) {
                break;
            }
            entered.push(at);
            let d = h.daddr.to_string();
            if out.daddrs.last() != Some(&d) {
                out.daddrs.push(d);
            }
            if let Some(p) = h.dport
                && out.dports.last() != Some(&p)
            {
                out.dports.push(p);
            }
        }
        let TraceKind::Rule(handle) = e.kind else {
            continue;
        };
        if e.family != family || e.table != table {
            continue;
        }
        let rule = rules
            .get(&(e.chain.clone(), handle))
            .cloned()
            .unwrap_or_else(|| format!("(rule handle {handle}, not in the table read back)"));
        out.steps.push(LiveStep {
            chain: e.chain.clone(),
            rule,
            verdict: e.verdict.as_ref().map(|v| format!("verdict {v}")),
        });
    }
    out
}

/// Chains of a step list, with consecutive repeats folded.
fn chains<'a>(it: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for c in it {
        if v.last().map(String::as_str) != Some(c) {
            v.push(c.to_owned());
        }
    }
    v
}

/// Sets the kernel's path beside the typed one (the `trace` answer):
/// which typed path the packet took (the one whose DNAT is where the
/// kernel sent it), and whether the chains agree.
pub fn compare(typed: &TraceAnswer, live: &LiveTrace) -> LiveComparison {
    let dnat = match (live.daddrs.last(), live.dports.last()) {
        (Some(a), Some(p)) if live.daddrs.len() > 1 || live.dports.len() > 1 => {
            Some(match a.parse::<IpAddr>() {
                Ok(ip) => verdict_node::inspect::show_addr(ip, *p),
                Err(_) => format!("{a}:{p}"),
            })
        }
        _ => None,
    };
    let live_chains = chains(live.steps.iter().map(|s| s.chain.as_str()));
    let candidate = typed
        .paths
        .iter()
        .find(|p| p.dnat == dnat)
        .or_else(|| typed.paths.first());
    let typed_chains: Vec<String> = candidate
        .map(|p| chains(p.steps.iter().map(|s| s.chain.as_str())))
        .unwrap_or_default();
    // The kernel reports rules until the packet leaves the node's output
    // and postrouting; the typed walk follows a local destination into
    // input as well. Agreement: the kernel's chains are the typed path's,
    // in order, as far as the kernel saw the packet.
    let agree = !live_chains.is_empty()
        && typed_chains.len() >= live_chains.len()
        && typed_chains[..live_chains.len()] == live_chains[..]
        && candidate.is_some_and(|p| p.dnat == dnat);
    LiveComparison {
        kernel: LiveKernel {
            steps: live
                .steps
                .iter()
                .map(|s| LiveStepAnswer {
                    chain: s.chain.clone(),
                    rule: s.rule.clone(),
                    verdict: s.verdict.clone(),
                })
                .collect(),
            chains: live_chains,
            dnat,
        },
        typed_chains,
        agree,
    }
}

/// The marking table: in the output hook before any other chain, the
/// first packet to the destination gets `nftrace`.
fn marking_table(req: &TraceRequest, family: Family, proto: L4Proto) -> Transaction {
    let mut tx = Transaction::new(family, TABLE);
    tx.add_table(Some(
        "verdict trace --live: marks one probe packet for nftrace",
    ));
    tx.add_chain(Chain::base("output", ChainType::Filter, Hook::Output, -400));
    tx.add_rule(
        "output",
        Rule::new(vec![
            Expr::Cmp {
                selector: Selector::Daddr,
                op: CmpOp::Eq,
                value: Value::Addr(req.dst),
            },
            Expr::Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(proto),
            },
            Expr::Cmp {
                selector: Selector::Dport,
                op: CmpOp::Eq,
                value: Value::Port(req.dport),
            },
            Expr::NftraceOn,
        ]),
    );
    tx
}

/// Deletes the marking table when dropped, whatever happened.
struct MarkTable<'a>(&'a mut NetlinkBackend, Family);

impl Drop for MarkTable<'_> {
    fn drop(&mut self) {
        let mut tx = Transaction::new(self.1, TABLE);
        tx.delete_table();
        let _ = self.0.run(&tx);
    }
}

/// Sends one packet of `req` from this node with nftrace on, and returns
/// the kernel's trace of it.
pub fn run(req: &TraceRequest) -> anyhow::Result<LiveTrace> {
    let family = if req.dst.is_ipv4() {
        Family::Ip
    } else {
        Family::Ip6
    };
    let proto = match req.proto {
        L4Proto::Tcp => L4Proto::Tcp,
        L4Proto::Udp => L4Proto::Udp,
        L4Proto::Sctp => bail!("--live sends TCP or UDP packets, not SCTP"),
    };
    let mut nl = NetlinkBackend::new().context("nftables over netlink")?;
    // What verdict's table holds, to name the rules the kernel reports by
    // their handles.
    let rules = match nl
        .skeleton(family, "verdict")
        .context("reading verdict's table")?
    {
        Some(t) => rules_by_handle(family, &t),
        None => {
            bail!("table {family} verdict does not exist: verdict has not programmed this family")
        }
    };
    let mut stale = Transaction::new(family, TABLE);
    stale.delete_table();
    let _ = nl.run(&stale);
    let mut monitor = TraceMonitor::open().context("joining the kernel's trace group")?;
    nl.run(&marking_table(req, family, proto))
        .context("adding the marking table")?;
    let mark = MarkTable(&mut nl, family);
    let dst = SocketAddr::new(req.dst, req.dport);
    match req.proto {
        L4Proto::Udp => {
            let any: IpAddr = if req.dst.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
            sock.send_to(b"verdict trace --live\n", dst)?;
        }
        _ => {
            // The answer does not matter: the first packet is what is traced.
            let _ = TcpStream::connect_timeout(&dst, Duration::from_millis(500));
        }
    }
    let deadline = Instant::now() + LISTEN;
    let mut events = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match monitor.next(left).context("reading the kernel's trace")? {
            Some(more) => events.extend(more),
            None => break,
        }
    }
    drop(mark);
    Ok(read_events(&events, &family.to_string(), "verdict", &rules))
}

#[cfg(test)]
mod tests {
    use super::*;

    use verdict_nft::nftrace::Headers;

    fn event(
        id: u32,
        table: &str,
        chain: &str,
        kind: TraceKind,
        verdict: Option<&str>,
        to: Option<(&str, u16)>,
    ) -> TraceEvent {
        TraceEvent {
            id,
            family: "ip",
            table: table.into(),
            chain: chain.into(),
            kind,
            verdict: verdict.map(str::to_owned),
            headers: to.map(|(a, p)| Headers {
                daddr: a.parse().unwrap(),
                proto: 6,
                dport: Some(p),
            }),
        }
    }

    /// As the kernel reports a connect to a ClusterIP, and then the
    /// connection's next packet under the same id.
    fn monitor() -> Vec<TraceEvent> {
        use TraceKind::{Policy, Return, Rule};
        let v = "verdict";
        vec![
            event(
                1,
                "verdict-trace",
                "output",
                Rule(2),
                Some("continue"),
                Some(("172.30.0.41", 80)),
            ),
            event(1, "verdict-trace", "output", Policy, Some("accept"), None),
            event(
                1,
                v,
                "filter-output-pre-dnat",
                Rule(5),
                Some("jump firewall-check"),
                Some(("172.30.0.41", 80)),
            ),
            event(1, v, "firewall-check", Return, Some("continue"), None),
            event(
                1,
                v,
                "nat-output",
                Rule(9),
                Some("jump services"),
                Some(("172.30.0.41", 80)),
            ),
            event(1, v, "services", Rule(11), Some("goto endpoints-2"), None),
            event(1, v, "endpoints-2", Rule(20), Some("accept"), None),
            event(
                1,
                v,
                "filter-output",
                Rule(7),
                Some("jump service-endpoints-check"),
                Some(("10.180.0.2", 80)),
            ),
            event(9, v, "services", Rule(11), Some("accept"), None),
            event(
                1,
                v,
                "filter-output",
                Rule(8),
                Some("jump count-traffic"),
                Some(("10.180.0.2", 80)),
            ),
        ]
    }

    fn rules() -> BTreeMap<(String, u64), String> {
        [
            ("nat-output", 9, "jump services"),
            (
                "services",
                11,
                "ip daddr . meta l4proto . th dport vmap @service-ips",
            ),
        ]
        .into_iter()
        .map(|(c, h, r)| ((c.to_owned(), h), r.to_owned()))
        .collect()
    }

    #[test]
    fn the_kernels_trace_is_read_for_the_first_packet_only() {
        let t = read_events(&monitor(), "ip", "verdict", &rules());
        let chains: Vec<&str> = t.steps.iter().map(|s| s.chain.as_str()).collect();
        assert_eq!(
            chains,
            [
                "filter-output-pre-dnat",
                "nat-output",
                "services",
                "endpoints-2",
                "filter-output"
            ]
        );
        assert_eq!(
            t.steps[2].verdict.as_deref(),
            Some("verdict goto endpoints-2")
        );
        assert_eq!(t.steps[1].rule, "jump services");
        assert_eq!(
            t.steps[0].rule,
            "(rule handle 5, not in the table read back)"
        );
        assert_eq!(t.daddrs, ["172.30.0.41", "10.180.0.2"]);
        assert_eq!(t.dports, [80]);
    }

    #[test]
    fn the_marking_table_marks_only_the_probe() {
        let req = TraceRequest {
            from: verdict_node::inspect::Origin::Node,
            src: "10.0.0.1".parse().unwrap(),
            sport: None,
            dst: "172.30.0.41".parse().unwrap(),
            proto: L4Proto::Tcp,
            dport: 80,
        };
        let script = marking_table(&req, Family::Ip, L4Proto::Tcp).to_string();
        assert!(
            script.contains("type filter hook output priority -400"),
            "{script}"
        );
        assert!(
            script.contains("ip daddr 172.30.0.41 meta l4proto tcp th dport 80 meta nftrace set 1"),
            "{script}"
        );
    }

    #[test]
    fn the_paths_agree_when_the_chains_and_the_dnat_do() {
        let live = read_events(&monitor(), "ip", "verdict", &rules());
        let path = |dnat: &str, chains: &[&str]| verdict_node::inspect::answers::TracePath {
            probability: 0.5,
            disposition: verdict_node::inspect::answers::Disposition::Accept,
            dnat: Some(dnat.into()),
            masquerade: false,
            reason: String::new(),
            steps: chains
                .iter()
                .map(|c| verdict_node::inspect::answers::TraceStep {
                    hook: "output".into(),
                    chain: (*c).into(),
                    rule: String::new(),
                    lookups: Vec::new(),
                })
                .collect(),
            updates: Vec::new(),
        };
        let answer = |paths| TraceAnswer {
            packet: verdict_node::inspect::answers::TracePacket {
                from: verdict_node::inspect::answers::Origin::Node,
                src: "192.168.0.2".into(),
                sport: None,
                dst: "172.30.0.41".into(),
                proto: verdict_node::inspect::answers::Proto::Tcp,
                dport: 80,
                iif: None,
            },
            family: verdict_node::inspect::answers::TableFamily::Ip,
            table: "verdict".into(),
            source: verdict_node::inspect::answers::ReadFrom::Kernel,
            read: verdict_node::inspect::answers::ReadHow::Targeted,
            read_ms: 0.0,
            service: None,
            outcomes: Vec::new(),
            paths,
            live: None,
        };
        let chains = [
            "filter-output-pre-dnat",
            "nat-output",
            "services",
            "endpoints-2",
            "filter-output",
        ];
        let typed = answer(vec![
            path("10.180.0.1:80", &chains),
            path(
                "10.180.0.2:80",
                &[&chains[..], &["nat-postrouting"]].concat(),
            ),
        ]);
        let c = compare(&typed, &live);
        assert_eq!(c.kernel.dnat.as_deref(), Some("10.180.0.2:80"));
        assert!(c.agree, "{c:#?}");
        let other = answer(vec![path("10.180.0.2:80", &["nat-output", "services"])]);
        assert!(!compare(&other, &live).agree);
        assert!(!compare(&typed, &LiveTrace::default()).agree);
    }
}
