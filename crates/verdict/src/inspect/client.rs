//! The introspection commands: `trace`, `explain`, `services`, `syncs`.
//! Each is a thin client of the daemon's API (`--server`, by default this
//! node's metrics address) or, with `--manifests`, answers offline from a
//! node built in memory. Text by default; `-o json` prints the API's
//! answer as it is.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value as Json;

use super::TraceRequest;
use super::text;
use crate::cli::{Cli, Command};
use crate::config::Settings;
use crate::daemon::{Source, offline};

/// How long the client waits to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long it waits for an answer (reading a large table takes seconds
/// through `nft`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// How the answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Text,
    Json,
}

/// Encodes a query value.
fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The API paths a command asks for.
fn targets(cli: &Cli) -> anyhow::Result<Vec<String>> {
    Ok(match cli.command {
        Command::Trace => {
            let req = TraceRequest::parse(|k| cli.inspect_flag(k).map(str::to_owned))
                .map_err(|e| anyhow::anyhow!("verdict trace: {e}"))?;
            vec![format!("/api/v1/trace?{}", req.query())]
        }
        Command::Explain => {
            let target = cli.target.as_deref().unwrap_or_default();
            match target.split_once('/') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                    let full = cli
                        .inspect_flag("full")
                        .is_some_and(|v| crate::config::value::parse_bool(v) == Some(true));
                    let query = if full { "?full=true" } else { "" };
                    vec![format!(
                        "/api/v1/services/{}/{}{query}",
                        encode(ns),
                        encode(name)
                    )]
                }
                _ => bail!("verdict explain {target:?}: name the Service as NAMESPACE/NAME"),
            }
        }
        Command::Services => {
            let mut q = Vec::new();
            for (flag, key) in [("search", "q"), ("limit", "limit"), ("offset", "offset")] {
                if let Some(v) = cli.inspect_flag(flag) {
                    q.push(format!("{key}={}", encode(v)));
                }
            }
            vec![format!("/api/v1/services?{}", q.join("&"))]
        }
        Command::Syncs => vec!["/api/v1/syncs".into(), "/api/v1/foreign".into()],
        Command::Connections => match cli.target.as_deref() {
            None => vec!["/api/v1/connections".into()],
            Some(t)
                if t.split_once('/')
                    .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty()) =>
            {
                vec![format!("/api/v1/connections?service={}", encode(t))]
            }
            Some(t) => bail!("verdict connections {t:?}: name the Service as NAMESPACE/NAME"),
        },
        other => bail!("{other:?} is not an introspection command"),
    })
}

/// Where the daemon's API is: `--server`, or the metrics address
/// (an unspecified address means loopback).
pub fn server(cli: &Cli, settings: &Settings) -> anyhow::Result<SocketAddr> {
    if let Some(s) = cli.inspect_flag("server") {
        let hostport = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
        return hostport
            .to_socket_addrs()
            .with_context(|| format!("--server {s}"))?
            .next()
            .with_context(|| format!("--server {s}: no address"));
    }
    let Some(mut addr) = settings.metrics_bind_address else {
        bail!("the metrics server is disabled (--metrics-bind-address): give --server");
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// One GET: the status and the JSON body.
pub fn get(addr: SocketAddr, target: &str) -> anyhow::Result<(u16, Json)> {
    let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .with_context(|| format!("cannot reach verdict at {addr} (is it running? --server)"))?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .with_context(|| format!("reading the answer from {addr}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the answer has no HTTP header")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("the answer has no HTTP status")?;
    let body = &raw[split + 4..];
    let json = serde_json::from_slice(body).with_context(|| {
        format!(
            "{addr} answered {code} without JSON (is it verdict? {:?})",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        )
    })?;
    Ok((code, json))
}

/// Runs an introspection command; the text or JSON goes to stdout.
pub fn run(cli: &Cli, settings: &Settings, source: &Source) -> anyhow::Result<()> {
    let output = match cli.inspect_flag("output").unwrap_or("text") {
        "text" => Output::Text,
        "json" => Output::Json,
        other => bail!("-o {other}: must be text or json"),
    };
    let targets = targets(cli)?;
    let answers: Vec<(u16, Json)> = if source.manifests.is_some() {
        let node = offline(settings, source)?;
        targets.iter().map(|t| node.get(t)).collect()
    } else {
        let addr = server(cli, settings)?;
        targets
            .iter()
            .map(|t| get(addr, t))
            .collect::<anyhow::Result<_>>()?
    };
    let live = cli.command == Command::Trace
        && cli
            .inspect_flag("live")
            .is_some_and(|v| crate::config::value::parse_bool(v) == Some(true));
    let mut answers = answers;
    if live {
        let req = TraceRequest::parse(|k| cli.inspect_flag(k).map(str::to_owned))
            .map_err(|e| anyhow::anyhow!("verdict trace: {e}"))?;
        if req.from != super::Origin::Node {
            bail!("verdict trace --live sends the packet from this node: use --from node");
        }
        let kernel = super::live::run(&req).context("the live trace")?;
        if let Some((200, doc)) = answers.first_mut() {
            doc["live"] = super::live::compare(doc, &kernel);
        }
    }
    let mut failed = None;
    for (code, doc) in &answers {
        let explained_404 =
            cli.command == Command::Explain && *code == 404 && doc.get("found").is_some();
        if *code != 200 && !explained_404 {
            let e = doc["error"].as_str().unwrap_or("unexpected answer");
            bail!("verdict answered {code}: {e}");
        }
        if explained_404 {
            failed = Some("the Service is not known to verdict");
        }
    }
    match output {
        Output::Json => {
            let doc = match answers.as_slice() {
                [(_, one)] => one.clone(),
                many => Json::Array(many.iter().map(|(_, d)| d.clone()).collect()),
            };
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Output::Text => {
            for (i, (_, doc)) in answers.iter().enumerate() {
                let page = match (cli.command, i) {
                    (Command::Trace, _) => text::trace(doc) + &text::live(doc),
                    (Command::Explain, _) => text::explain(doc),
                    (Command::Services, _) => text::services(doc),
                    (Command::Connections, _) => text::connections(doc),
                    (_, 0) => text::syncs(doc),
                    _ => text::foreign(doc),
                };
                print!("{page}");
            }
        }
    }
    match failed {
        Some(why) => bail!(why),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("kube-system/dns"), "kube-system/dns");
        assert_eq!(encode("a b&c#"), "a%20b%26c%23");
        assert_eq!(encode("fd00::1"), "fd00::1");
    }
}
