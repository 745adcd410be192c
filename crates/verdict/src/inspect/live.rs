//! `verdict trace --live`: one real packet, traced by the kernel itself.
//! For packets the node can originate (`--from node`): a table of its own,
//! `verdict-trace`, sets `nftrace` on the first packet to the destination
//! in the output hook before any other chain (priority -400); `nft monitor
//! trace` reports every chain and rule the packet meets; verdict's own
//! table is not touched. The kernel's path is then set beside the typed
//! tracer's: the chains of verdict's table in order, and where the packet
//! went.

use std::io::{BufRead as _, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};
use verdict_nft::L4Proto;

use super::TraceRequest;

/// The table that marks the packet (never verdict's own).
const TABLE: &str = "verdict-trace";
/// How long the kernel's trace is read after the packet is sent.
const LISTEN: Duration = Duration::from_millis(700);

/// One line of `nft monitor trace` about a rule of verdict's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveStep {
    /// The chain.
    pub chain: String,
    /// The rule, as nft prints it (without the handle).
    pub rule: String,
    /// `(verdict …)`, if printed.
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

/// Reads `nft monitor trace` lines: the first trace id's steps in `table`.
pub fn parse(lines: &[String], family: &str, table: &str) -> LiveTrace {
    let mut id: Option<&str> = None;
    let mut out = LiveTrace::default();
    // A packet enters each base chain once. The kernel derives a trace
    // id from the packet's buffer, so a later packet of the connection
    // can carry the first one's id: its entering a chain again ends the
    // first packet's trace.
    let mut entered: Vec<(&str, &str, &str)> = Vec::new();
    for line in lines {
        let mut w = line.split_whitespace();
        if w.next() != Some("trace") || w.next() != Some("id") {
            continue;
        }
        let Some(this) = w.next() else { continue };
        match id {
            None => id = Some(this),
            Some(first) if first != this => continue,
            Some(_) => {}
        }
        let (Some(fam), Some(tab), Some(chain), Some(kind)) =
            (w.next(), w.next(), w.next(), w.next())
        else {
            continue;
        };
        let rest: Vec<&str> = w.collect();
        if kind == "packet:" {
            if entered.contains(&(fam, tab, chain)) {
                break;
            }
            entered.push((fam, tab, chain));
            for pair in rest.windows(3) {
                if (pair[0] == "ip" || pair[0] == "ip6") && pair[1] == "daddr" {
                    let d = pair[2].to_owned();
                    if out.daddrs.last() != Some(&d) {
                        out.daddrs.push(d);
                    }
                }
                if (pair[0] == "tcp" || pair[0] == "udp" || pair[0] == "sctp")
                    && pair[1] == "dport"
                    && let Ok(p) = pair[2].parse::<u16>()
                    && out.dports.last() != Some(&p)
                {
                    out.dports.push(p);
                }
            }
            continue;
        }
        if kind != "rule" || fam != family || tab != table {
            continue;
        }
        let text = rest.join(" ");
        let (rule, verdict) = match text.rfind(" (verdict ") {
            Some(i) => (
                text[..i].to_owned(),
                Some(text[i + 2..].trim_end_matches(')').to_owned()),
            ),
            None => (text.clone(), None),
        };
        // nft prints `… comment "…"` and may add `handle N`: keep the rule.
        let rule = match rule.find(" handle ") {
            Some(i) if rule[i + 8..].chars().all(|c| c.is_ascii_digit()) => rule[..i].to_owned(),
            _ => rule,
        };
        out.steps.push(LiveStep {
            chain: chain.to_owned(),
            rule,
            verdict,
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
pub fn compare(typed: &Json, live: &LiveTrace) -> Json {
    let dnat = match (live.daddrs.last(), live.dports.last()) {
        (Some(a), Some(p)) if live.daddrs.len() > 1 || live.dports.len() > 1 => {
            Some(match a.parse::<IpAddr>() {
                Ok(ip) => super::show_addr(ip, *p),
                Err(_) => format!("{a}:{p}"),
            })
        }
        _ => None,
    };
    let live_chains = chains(live.steps.iter().map(|s| s.chain.as_str()));
    let paths = typed["paths"].as_array().cloned().unwrap_or_default();
    let candidate = paths
        .iter()
        .find(|p| p["dnat"].as_str().map(str::to_owned) == dnat)
        .or_else(|| paths.first());
    let typed_chains: Vec<String> = candidate
        .map(|p| {
            chains(
                p["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["chain"].as_str()),
            )
        })
        .unwrap_or_default();
    // The kernel reports rules until the packet leaves the node's output
    // and postrouting; the typed walk follows a local destination into
    // input as well. Agreement: the kernel's chains are the typed path's,
    // in order, as far as the kernel saw the packet.
    let agree = !live_chains.is_empty()
        && typed_chains.len() >= live_chains.len()
        && typed_chains[..live_chains.len()] == live_chains[..]
        && candidate.is_some_and(|p| p["dnat"].as_str().map(str::to_owned) == dnat);
    json!({
        "kernel": {
            "steps": live.steps.iter().map(|s| json!({
                "chain": s.chain, "rule": s.rule, "verdict": s.verdict,
            })).collect::<Vec<_>>(),
            "chains": live_chains,
            "dnat": dnat,
        },
        "typed_chains": typed_chains,
        "agree": agree,
    })
}

fn nft(args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let out = verdict_nft::process::run("nft", args, stdin).context("running nft")?;
    if !out.status.success() {
        bail!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes the marking table when dropped, whatever happened.
struct MarkTable(&'static str);

impl Drop for MarkTable {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", self.0, TABLE], None);
    }
}

/// Sends one packet of `req` from this node with nftrace on, and returns
/// the kernel's trace of it.
pub fn run(req: &TraceRequest) -> anyhow::Result<LiveTrace> {
    let family = if req.dst.is_ipv4() { "ip" } else { "ip6" };
    let proto = match req.proto {
        L4Proto::Tcp => "tcp",
        L4Proto::Udp => "udp",
        L4Proto::Sctp => bail!("--live sends TCP or UDP packets, not SCTP"),
    };
    let _ = nft(&["delete", "table", family, TABLE], None);
    let script = format!(
        "table {family} {TABLE} {{\n  comment \"verdict trace --live: marks one probe packet for nftrace\"\n  chain output {{\n    type filter hook output priority -400; policy accept;\n    {family} daddr {} {proto} dport {} meta nftrace set 1\n  }}\n}}\n",
        req.dst, req.dport
    );
    let mut monitor = Command::new("nft")
        .args(["monitor", "trace"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("running nft monitor trace")?;
    let stdout = monitor.stdout.take().context("nft monitor has no output")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    nft(&["-f", "-"], Some(&script)).context("adding the marking table")?;
    let _mark = MarkTable(family);
    // nft monitor subscribes as it starts; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
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
    let mut lines = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    Ok(parse(&lines, family, "verdict"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MONITOR: &str = r#"trace id 1a2b3c4d ip verdict-trace output packet: oif "eth0" ip saddr 192.168.0.2 ip daddr 172.30.0.41 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 1 ip length 60 tcp sport 41234 tcp dport 80 tcp flags == syn tcp window 64240
trace id 1a2b3c4d ip verdict-trace output rule ip daddr 172.30.0.41 tcp dport 80 meta nftrace set 1 (verdict continue)
trace id 1a2b3c4d ip verdict-trace output verdict continue
trace id 1a2b3c4d ip verdict-trace output policy accept
trace id 1a2b3c4d ip verdict filter-output-pre-dnat packet: oif "eth0" ip saddr 192.168.0.2 ip daddr 172.30.0.41 tcp sport 41234 tcp dport 80
trace id 1a2b3c4d ip verdict filter-output-pre-dnat rule ct state new jump firewall-check (verdict jump firewall-check)
trace id 1a2b3c4d ip verdict firewall-check verdict continue
trace id 1a2b3c4d ip verdict filter-output-pre-dnat verdict continue
trace id 1a2b3c4d ip verdict nat-output packet: oif "eth0" ip saddr 192.168.0.2 ip daddr 172.30.0.41 tcp sport 41234 tcp dport 80
trace id 1a2b3c4d ip verdict nat-output rule jump services (verdict jump services)
trace id 1a2b3c4d ip verdict services rule ip daddr . meta l4proto . th dport vmap @service-ips (verdict goto endpoints-2)
trace id 1a2b3c4d ip verdict endpoints-2 rule meta l4proto tcp dnat ip addr . port to ip daddr . tcp dport . numgen random mod 2 map @service-endpoints-tcp (verdict accept)
trace id 1a2b3c4d ip verdict filter-output packet: oif "eth0" ip saddr 192.168.0.2 ip daddr 10.180.0.2 tcp sport 41234 tcp dport 80
trace id 1a2b3c4d ip verdict filter-output rule ct state new jump service-endpoints-check (verdict jump service-endpoints-check)
trace id 9f9f9f9f ip verdict services rule something else (verdict accept)
trace id 1a2b3c4d ip verdict filter-output packet: oif "eth0" ip saddr 192.168.0.2 ip daddr 10.180.0.2 tcp sport 41234 tcp dport 80 tcp flags == ack
trace id 1a2b3c4d ip verdict filter-output rule ct status dnat jump count-traffic (verdict jump count-traffic)"#;

    #[test]
    fn the_kernels_trace_is_read_for_the_first_packet_only() {
        let lines: Vec<String> = MONITOR.lines().map(str::to_owned).collect();
        let t = parse(&lines, "ip", "verdict");
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
        assert_eq!(t.daddrs, ["172.30.0.41", "10.180.0.2"]);
        assert_eq!(t.dports, [80]);
    }

    #[test]
    fn the_paths_agree_when_the_chains_and_the_dnat_do() {
        let lines: Vec<String> = MONITOR.lines().map(str::to_owned).collect();
        let live = parse(&lines, "ip", "verdict");
        let step = |c: &str| json!({"chain": c});
        let typed = json!({"paths": [
            {"dnat": "10.180.0.1:80", "steps": [step("filter-output-pre-dnat"), step("nat-output"), step("services"), step("endpoints-2"), step("filter-output")]},
            {"dnat": "10.180.0.2:80", "steps": [step("filter-output-pre-dnat"), step("nat-output"), step("services"), step("endpoints-2"), step("filter-output"), step("nat-postrouting")]},
        ]});
        let c = compare(&typed, &live);
        assert_eq!(c["kernel"]["dnat"], "10.180.0.2:80");
        assert_eq!(c["agree"], true, "{c:#}");
        let other = json!({"paths": [{"dnat": "10.180.0.2:80", "steps": [step("nat-output"), step("services")]}]});
        assert_eq!(compare(&other, &live)["agree"], false);
        assert_eq!(compare(&typed, &LiveTrace::default())["agree"], false);
    }
}
