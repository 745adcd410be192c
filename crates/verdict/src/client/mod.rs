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

pub mod flows;
pub mod live;

use verdict_node::inspect::answers::TraceAnswer;
use verdict_node::inspect::text;
use verdict_node::inspect::{Origin, TraceRequest};

use crate::cli::{Cli, Command, UsageError};
use crate::config::Settings;
use crate::daemon::{Source, offline};

/// How long the client waits to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long it waits for an answer (reading a large table takes seconds
/// through `nft`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// How the answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// For a terminal.
    Text,
    /// For a wide terminal: what text shows, and more of it where a
    /// command has more (`flows`: the entry, the pod, packets, bytes).
    Wide,
    /// The API's answer as it is.
    Json,
    /// The API's answer as YAML.
    Yaml,
}

impl Output {
    /// Whether the answer is printed as it is (JSON or YAML), not as text.
    pub fn structured(self) -> bool {
        matches!(self, Output::Json | Output::Yaml)
    }
}

/// A document as JSON or YAML, for `-o json` and `-o yaml`.
pub fn structured(doc: &Json, output: Output) -> anyhow::Result<String> {
    Ok(match output {
        Output::Yaml => serde_saphyr::to_string(doc)?,
        _ => format!("{}\n", serde_json::to_string_pretty(doc)?),
    })
}

/// What an introspection command asks, checked before anything runs: a
/// flag with a value it cannot take is a usage error (exit 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// How the answer is printed.
    pub output: Output,
    /// The API paths asked for.
    pub targets: Vec<String>,
    /// `trace --live`: the packet to send and trace.
    pub live: Option<TraceRequest>,
}

/// A boolean introspection flag (`--live`, `--full`).
fn flag_bool(cli: &Cli, name: &str) -> Result<bool, UsageError> {
    match cli.inspect_flag(name) {
        None => Ok(false),
        Some(v) => crate::config::value::parse_bool(v).ok_or_else(|| {
            UsageError(format!(
                "invalid argument {v:?} for --{name}: must be true or false"
            ))
        }),
    }
}

/// Reads and checks what the command asks.
pub fn query(cli: &Cli) -> Result<Query, UsageError> {
    let output = match cli.inspect_flag("output").unwrap_or("text") {
        "text" => Output::Text,
        "wide" => Output::Wide,
        "json" => Output::Json,
        "yaml" => Output::Yaml,
        other => {
            return Err(UsageError(format!(
                "-o {other:?}: must be text, wide, json or yaml"
            )));
        }
    };
    let live = if cli.command == Command::Trace && flag_bool(cli, "live")? {
        let req = trace_request(cli)?;
        if req.from != Origin::Node {
            return Err(UsageError(
                "verdict trace --live sends the packet from this node: use --from node".into(),
            ));
        }
        Some(req)
    } else {
        None
    };
    let targets = if cli.command == Command::Doctor {
        Vec::new()
    } else {
        targets(cli)?
    };
    Ok(Query {
        output,
        targets,
        live,
    })
}

fn trace_request(cli: &Cli) -> Result<TraceRequest, UsageError> {
    TraceRequest::parse(|k| cli.inspect_flag(k).map(str::to_owned))
        .map_err(|e| UsageError(format!("verdict trace: {e}")))
}

/// `NAMESPACE/NAME`, or why not.
fn service_name<'a>(command: &str, target: &'a str) -> Result<(&'a str, &'a str), UsageError> {
    match target.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(UsageError(format!(
            "verdict {command} {target:?}: name the Service as NAMESPACE/NAME"
        ))),
    }
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
fn targets(cli: &Cli) -> Result<Vec<String>, UsageError> {
    Ok(match cli.command {
        Command::Trace => vec![format!("/api/v1/trace?{}", trace_request(cli)?.query())],
        Command::Explain => {
            let target = cli.target.as_deref().unwrap_or_default();
            let (ns, name) = service_name("explain", target)?;
            let query = if flag_bool(cli, "full")? {
                "?full=true"
            } else {
                ""
            };
            vec![format!(
                "/api/v1/services/{}/{}{query}",
                encode(ns),
                encode(name)
            )]
        }
        Command::Services => {
            let mut q = Vec::new();
            if let Some(v) = cli.inspect_flag("search") {
                q.push(format!("q={}", encode(v)));
            }
            for flag in ["limit", "offset"] {
                if let Some(v) = cli.inspect_flag(flag) {
                    let n: usize = v.parse().map_err(|_| {
                        UsageError(format!("invalid argument {v:?} for --{flag}: not a number"))
                    })?;
                    q.push(format!("{flag}={n}"));
                }
            }
            if flag_bool(cli, "problems")? {
                q.push("problems=1".into());
            }
            vec![format!("/api/v1/services?{}", q.join("&"))]
        }
        Command::Syncs => vec!["/api/v1/syncs".into(), "/api/v1/foreign".into()],
        Command::Flows => vec![flows::target(cli)?],
        Command::Connections => match cli.target.as_deref() {
            None => vec!["/api/v1/connections".into()],
            Some(t) => {
                service_name("connections", t)?;
                vec![format!("/api/v1/connections?service={}", encode(t))]
            }
        },
        other => {
            return Err(UsageError(format!(
                "verdict {} asks the API nothing",
                other.name()
            )));
        }
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

/// An answer read into its type (a daemon of another version may answer
/// otherwise: that is said, not printed as empty cells).
fn read<T: serde::de::DeserializeOwned>(doc: &Json) -> anyhow::Result<T> {
    serde_json::from_value(doc.clone())
        .context("the daemon's answer is not what this verdict reads (another version?)")
}

/// Runs an introspection command; the text or JSON goes to stdout.
pub fn run(query: &Query, cli: &Cli, settings: &Settings, source: &Source) -> anyhow::Result<()> {
    let (output, targets) = (query.output, &query.targets);
    if cli.command == Command::Flows {
        if source.manifests.is_some() {
            bail!("the flow stream is a running node's: ask it (--server), not --manifests");
        }
        let follow = flag_bool(cli, "follow")?;
        let target = targets.first().context("no flows query")?;
        if flag_bool(cli, "aggregated")? {
            if follow {
                bail!(
                    "--aggregated and --follow: the aggregated flows are a summary; follow the stream, or ask for the summary again"
                );
            }
            return flows::run_aggregated(server(cli, settings)?, target, output);
        }
        return flows::run(server(cli, settings)?, target, output, follow);
    }
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
    let mut answers = answers;
    if let Some(req) = &query.live {
        let kernel = live::run(req).context("the live trace")?;
        if let Some((200, doc)) = answers.first_mut() {
            let mut typed: TraceAnswer = read(doc)?;
            typed.live = Some(live::compare(&typed, &kernel));
            *doc = serde_json::to_value(&typed)?;
        }
    }
    let mut failed = None;
    for (code, doc) in &answers {
        // An unknown Service is an answer, printed, and then a failure.
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
        Output::Json | Output::Yaml => {
            let doc = match answers.as_slice() {
                [(_, one)] => one.clone(),
                many => Json::Array(many.iter().map(|(_, d)| d.clone()).collect()),
            };
            crate::out::print(&structured(&doc, output)?)?;
        }
        Output::Text | Output::Wide => {
            for (i, (_, doc)) in answers.iter().enumerate() {
                let page = match (cli.command, i) {
                    (Command::Trace, _) => {
                        let t: TraceAnswer = read(doc)?;
                        text::trace(&t) + &text::live(&t)
                    }
                    (Command::Explain, _) => text::explain(&read(doc)?),
                    (Command::Services, _) => text::services(&read(doc)?),
                    (Command::Connections, _) => text::connections(&read(doc)?),
                    (_, 0) => text::syncs(&read(doc)?),
                    _ => text::foreign(&read(doc)?),
                };
                crate::out::print(&page)?;
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
