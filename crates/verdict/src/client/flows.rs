//! `verdict flows`: the flow stream of the running node (`--flows`), one
//! page, or followed (`--follow`): the page, then every flow recorded after
//! its newest, asked for twice a second.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use verdict_node::flows::{FlowRecord, FlowsAnswer};

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

/// One flow on one line.
pub fn line(f: &FlowRecord) -> String {
    let service = match (&f.service, &f.port) {
        (Some(s), Some(p)) if !p.is_empty() => format!("{s}:{p}"),
        (Some(s), _) => s.clone(),
        (None, _) => "-".into(),
    };
    let entry = f.entry.map_or("-".to_owned(), |e| format!("{e:?}"));
    let outcome = match (&f.endpoint, &f.reason) {
        (Some(e), _) => {
            let pod = f
                .pod
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default();
            format!("→ {e}{pod}")
        }
        (None, Some(r)) => r.clone(),
        (None, None) => String::new(),
    };
    let mut extra = Vec::new();
    if f.masqueraded {
        extra.push("masqueraded".to_owned());
    }
    if let (Some(p), Some(b)) = (f.packets, f.bytes) {
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
        "{}  {:<9} {:<4} {} → {} {} {}  {}{}\n",
        f.first_seen,
        f.verdict.as_str(),
        f.protocol,
        f.client,
        f.destination,
        entry,
        service,
        outcome,
        extra
    )
}

fn print(flows: &[FlowRecord], output: Output) -> anyhow::Result<()> {
    // The API answers newest first; a terminal reads oldest first.
    for f in flows.iter().rev() {
        match output {
            Output::Text => print!("{}", line(f)),
            Output::Json => println!("{}", serde_json::to_string(f)?),
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

/// Prints one page, or follows the stream until interrupted.
pub fn run(addr: SocketAddr, target: &str, output: Output, follow: bool) -> anyhow::Result<()> {
    let page = ask(addr, target)?;
    if !follow {
        match output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&page)?),
            Output::Text => {
                print(&page.flows, output)?;
                let recorded: u64 = page.recorded.values().sum();
                println!(
                    "{} of {} matching flows shown; {recorded} recorded since start, {} evicted, {} not recorded (kernel buffer)",
                    page.flows.len(),
                    page.matched,
                    page.evicted,
                    page.not_recorded
                );
                if let Some(note) = following_note(&page) {
                    println!("{note}");
                }
            }
        }
        return Ok(());
    }
    if let (Some(note), Output::Text) = (following_note(&page), output) {
        eprintln!("verdict flows: {note}");
    }
    print(&page.flows, output)?;
    let mut last = page.last_seq;
    let next = follow_target(target);
    loop {
        std::thread::sleep(POLL);
        let page = ask(addr, &format!("{next}&after={last}"))?;
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
