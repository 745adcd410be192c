//! `verdict flows`: the flow stream of the running node (`--flows`), one
//! page, or followed (`--follow`): the page, then every flow recorded after
//! its newest, asked for twice a second.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use verdict_node::flows::{AggregateRecord, AggregatesAnswer, FlowRecord, FlowsAnswer};

use super::{Output, encode, get, read};
use crate::cli::{Cli, UsageError};

/// How often a follower asks for what is new.
const POLL: Duration = Duration::from_millis(500);
/// The most flows a follower asks for at once (the API's most).
const FOLLOW_LIMIT: usize = 5000;

/// The `/api/v1/flows` query of the command's flags, without `after`.
pub fn target(cli: &Cli) -> Result<String, UsageError> {
    let mut q = Vec::new();
    let service = cli.inspect_flag("service").or(cli.target.as_deref());
    if let Some(s) = service {
        super::service_name("flows", s)?;
        q.push(format!("service={}", encode(s)));
    }
    for k in ["namespace", "ip", "verdict", "limit"] {
        if let Some(v) = cli.inspect_flag(k) {
            q.push(format!("{k}={}", encode(v)));
        }
    }
    if let Some(v) = cli.inspect_flag("verdict")
        && verdict_node::flows::FlowVerdict::parse(v).is_none()
    {
        return Err(UsageError(format!(
            "--verdict {v:?}: give forwarded, rejected or dropped"
        )));
    }
    if let Some(v) = cli.inspect_flag("ip")
        && v.parse::<std::net::IpAddr>().is_err()
    {
        return Err(UsageError(format!("--ip {v:?} is not an address")));
    }
    if let Some(v) = cli.inspect_flag("since") {
        match crate::config::value::parse_duration(v) {
            Some((false, d)) => q.push(format!("since={}", d.as_secs_f64())),
            _ => {
                return Err(UsageError(format!(
                    "--since {v:?}: give a duration (30s, 5m, 1h)"
                )));
            }
        }
    }
    Ok(format!("/api/v1/flows?{}", q.join("&")))
}

/// The columns of the text lines, for the first line printed.
pub fn header(output: Output) -> String {
    let wide = output == Output::Wide;
    let mut h = format!(
        "{:<27}  {:<9} {:<5} CLIENT → DESTINATION  SERVICE  OUTCOME",
        "FIRST SEEN", "VERDICT", "PROTO"
    );
    if wide {
        h.push_str("  [ENTRY, POD, PACKETS, BYTES, LAST SEEN]");
    }
    h.push('\n');
    h
}

/// The client's pod (and workload) after its address, when known.
fn client_pod(pod: Option<&str>, workload: Option<&str>) -> String {
    match (pod, workload) {
        (Some(p), Some(w)) => format!(" ({p}, {w})"),
        (Some(p), None) => format!(" ({p})"),
        _ => String::new(),
    }
}

/// One flow on one line (wide: with its entry, pod, packets, bytes and
/// when it was last seen).
pub fn line(f: &FlowRecord, output: Output) -> String {
    let wide = output == Output::Wide;
    let service = match (&f.service, &f.port) {
        (Some(s), Some(p)) if !p.is_empty() => format!("{s}:{p}"),
        (Some(s), _) => s.clone(),
        (None, _) => "-".into(),
    };
    let outcome = match (&f.endpoint, &f.reason) {
        (Some(e), _) => {
            let pod = match &f.pod {
                Some(p) if !wide => format!(" ({p})"),
                _ => String::new(),
            };
            format!("→ {e}{pod}")
        }
        (None, Some(r)) => r.clone(),
        (None, None) => String::new(),
    };
    let mut extra = Vec::new();
    if wide {
        extra.push(f.entry.map_or("-".to_owned(), |e| format!("{e:?}")));
        extra.push(match (&f.pod, &f.workload) {
            (Some(p), Some(w)) => format!("{p} ({w})"),
            (Some(p), None) => p.clone(),
            _ => "-".into(),
        });
        extra.push(f.packets.map_or("-".to_owned(), |p| format!("{p} packets")));
        extra.push(f.bytes.map_or("-".to_owned(), |b| format!("{b} bytes")));
        extra.push(format!("last {}", f.last_seen));
    }
    if f.masqueraded {
        extra.push("masqueraded".to_owned());
    }
    if !wide && let (Some(p), Some(b)) = (f.packets, f.bytes) {
        extra.push(format!("{p} packets, {b} bytes"));
    }
    if f.open {
        extra.push("open".into());
    }
    if f.retries > 0 {
        extra.push(format!("{} retries", f.retries));
    }
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!("  [{}]", extra.join(", "))
    };
    format!(
        "{:<27}  {:<9} {:<5} {}{} → {}  {}  {}{}\n",
        f.first_seen,
        f.verdict.as_str(),
        f.protocol,
        f.client,
        client_pod(f.client_pod.as_deref(), f.client_workload.as_deref()),
        f.destination,
        service,
        outcome,
        extra
    )
}

fn print(flows: &[FlowRecord], output: Output) -> anyhow::Result<()> {
    // The API answers newest first; a terminal reads oldest first.
    for f in flows.iter().rev() {
        if output.structured() {
            let doc = serde_json::to_value(f)?;
            match output {
                // One object per line, to be read as a stream.
                Output::Json => crate::out::println(&serde_json::to_string(&doc)?)?,
                _ => crate::out::print(&format!("---\n{}", super::structured(&doc, output)?))?,
            }
        } else {
            crate::out::print(&line(f, output))?;
        }
    }
    Ok(())
}

fn ask(addr: SocketAddr, target: &str) -> anyhow::Result<FlowsAnswer> {
    let (code, doc) = get(addr, target)?;
    if code != 200 {
        let e = doc["error"].as_str().unwrap_or("unexpected answer");
        bail!("verdict answered {code}: {e}");
    }
    read(&doc)
}

/// One aggregated flow on one line.
fn aggregate_line(a: &AggregateRecord, output: Output) -> String {
    let service = match (&a.service, &a.port) {
        (Some(s), Some(p)) if !p.is_empty() => format!("{s}:{p}"),
        (Some(s), _) => s.clone(),
        (None, _) => "-".into(),
    };
    let outcome = match (&a.endpoint, &a.reason) {
        (Some(e), _) => format!("→ {e}"),
        (None, Some(r)) => r.clone(),
        (None, None) => "-".into(),
    };
    let mut l = format!(
        "{:>11} {:<9} {:<5} {}{} → {}  {service}  {outcome}",
        a.connections,
        a.verdict.as_str(),
        a.protocol,
        a.client,
        client_pod(a.client_pod.as_deref(), None),
        a.destination,
    );
    if output == Output::Wide {
        l.push_str(&format!(
            "  [{}, {}, {} packets, {} bytes, {} – {}]",
            a.entry.map_or_else(|| "-".to_owned(), |e| format!("{e:?}")),
            a.pod.as_deref().unwrap_or("-"),
            a.packets,
            a.bytes,
            a.first_bucket,
            a.last_bucket
        ));
    }
    l.push('\n');
    l
}

/// `verdict flows --aggregated`: the aggregated flows, the most
/// connections first.
pub fn run_aggregated(addr: SocketAddr, target: &str, output: Output) -> anyhow::Result<()> {
    let sep = if target.contains('?') { '&' } else { '?' };
    let (code, doc) = get(addr, &format!("{target}{sep}aggregated=1"))?;
    if code != 200 {
        let e = doc["error"].as_str().unwrap_or("unexpected answer");
        bail!("verdict answered {code}: {e}");
    }
    let page: AggregatesAnswer = read(&doc)?;
    if output.structured() {
        return crate::out::print(&super::structured(&doc, output)?);
    }
    if !page.aggregates.is_empty() {
        let mut h = format!(
            "{:>11} {:<9} {:<5} CLIENT → DESTINATION  SERVICE  OUTCOME",
            "CONNECTIONS", "VERDICT", "PROTO"
        );
        if output == Output::Wide {
            h.push_str("  [ENTRY, POD, PACKETS, BYTES, BUCKETS]");
        }
        h.push('\n');
        crate::out::print(&h)?;
    }
    for a in &page.aggregates {
        crate::out::print(&aggregate_line(a, output))?;
    }
    crate::out::println(&format!(
        "{} of {} aggregated flows shown ({} s buckets, since {}); {} of {} entries held, {} flows without room, {} buckets dropped early",
        page.aggregates.len(),
        page.matched,
        page.bucket_seconds,
        page.oldest_bucket.as_deref().unwrap_or("-"),
        page.entries,
        page.budget,
        page.not_recorded,
        page.dropped_early,
    ))?;
    Ok(())
}

/// How long a follower waits before asking a node it lost again.
const RECONNECT: Duration = Duration::from_secs(1);

/// Prints one page, or follows the stream until interrupted (or its
/// reader goes away). A follower that loses the node (verdict restarts)
/// says so on standard error, asks again every second, and follows the
/// new stream once it answers.
pub fn run(addr: SocketAddr, target: &str, output: Output, follow: bool) -> anyhow::Result<()> {
    let page = ask(addr, target)?;
    if !follow {
        if output.structured() {
            let doc = serde_json::to_value(&page)?;
            return crate::out::print(&super::structured(&doc, output)?);
        }
        if !page.flows.is_empty() {
            crate::out::print(&header(output))?;
        }
        print(&page.flows, output)?;
        let recorded: u64 = page.recorded.values().sum();
        crate::out::println(&format!(
            "{} of {} matching flows shown; {recorded} recorded since start, {} evicted, {} folded past their client's share of {}, {} not recorded (kernel buffer)",
            page.flows.len(),
            page.matched,
            page.evicted,
            page.folded,
            page.client_share,
            page.not_recorded
        ))?;
        if let Some(note) = following_note(&page) {
            crate::out::println(&note)?;
        }
        return Ok(());
    }
    if let (Some(note), false) = (following_note(&page), output.structured()) {
        eprintln!("verdict flows: {note}");
    }
    if !output.structured() {
        crate::out::print(&header(output))?;
    }
    print(&page.flows, output)?;
    let mut last = page.last_seq;
    let mut stream = page.stream;
    let next = follow_target(target);
    let mut lost = false;
    loop {
        std::thread::sleep(if lost { RECONNECT } else { POLL });
        let page = match ask(addr, &format!("{next}&after={last}")) {
            Ok(p) => p,
            Err(e) => {
                if !lost {
                    eprintln!(
                        "verdict flows: lost verdict at {addr} ({e:#}); asking again every second"
                    );
                    lost = true;
                }
                continue;
            }
        };
        if lost {
            lost = false;
            eprintln!("verdict flows: verdict at {addr} answers again");
        }
        if page.stream != stream {
            // A new process, with a new stream numbered from 1 again.
            eprintln!(
                "verdict flows: verdict restarted; following its new stream from its first flow"
            );
            stream = page.stream;
            last = 0;
            continue;
        }
        if page.matched > page.flows.len() {
            eprintln!(
                "verdict flows: {} flows arrived faster than a follower reads them; skipped",
                page.matched - page.flows.len()
            );
        }
        print(&page.flows, output)?;
        last = last.max(page.last_seq);
    }
}

/// What the answer says of forwarded connections recorded on demand
/// (none when they are recorded always).
fn following_note(page: &FlowsAnswer) -> Option<String> {
    if !page.on_demand {
        return None;
    }
    Some(match &page.following_since {
        Some(since) => format!(
            "forwarded connections recorded since {since}, while flows are read (verdict run --flows records them always); rejected and dropped ones always"
        ),
        None => "forwarded connections are recorded while flows are read, from within a second of now (verdict run --flows records them always); rejected and dropped ones always".to_owned(),
    })
}

/// What a follower asks for after the first page: everything new, up to
/// the API's most per answer, whatever `--limit` chose for the first.
fn follow_target(target: &str) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut q: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("limit="))
        .collect();
    let limit = format!("limit={FOLLOW_LIMIT}");
    q.push(&limit);
    format!("{path}?{}", q.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_asks_for_all_that_is_new_whatever_the_first_page_limit() {
        assert_eq!(
            follow_target("/api/v1/flows?service=shop%2Fweb&limit=10&verdict=rejected"),
            "/api/v1/flows?service=shop%2Fweb&verdict=rejected&limit=5000"
        );
        assert_eq!(follow_target("/api/v1/flows?"), "/api/v1/flows?limit=5000");
    }
}
