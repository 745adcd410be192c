//! The introspection commands: `trace`, `explain`, `services`, `syncs`.
//! Each is a thin client of the daemon's API (`--server`, by default this
//! node's metrics address) or, with `--manifests`, answers offline from a
//! node built in memory. Text by default; `-o json` prints the API's
//! answer as it is.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, bail};
use hyper::body::Bytes;
use serde_json::Value as Json;
use verdict_model::NamespacedName;

pub mod flows;
pub mod live;

use verdict_node::inspect::answers::TraceAnswer;
use verdict_node::inspect::text;
use verdict_node::inspect::{Origin, TraceRequest};

use crate::cli::{Cli, Command, UsageError};
use crate::config::Settings;
use crate::daemon::{SourceFlags, offline};

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
fn service_name(command: &str, target: &str) -> Result<NamespacedName, UsageError> {
    verdict_node::api::service_name(target).map_err(|_| {
        UsageError(format!(
            "verdict {command} {target:?}: name the Service as NAMESPACE/NAME"
        ))
    })
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
            let svc = service_name("explain", target)?;
            let query = if flag_bool(cli, "full")? {
                "?full=true"
            } else {
                ""
            };
            vec![format!(
                "/api/v1/services/{}/{}{query}",
                encode(svc.namespace.as_str()),
                encode(svc.name.as_str())
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

/// One GET: the status and the JSON body, through hyper's HTTP/1.1
/// client (a runtime of one thread for the request).
pub fn get(addr: SocketAddr, target: &str) -> anyhow::Result<(u16, Json)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the HTTP client")?;
    let (code, body) = runtime.block_on(fetch(addr, target))?;
    let json = serde_json::from_slice(&body).with_context(|| {
        format!(
            "{addr} answered {code} without JSON (is it verdict? {:?})",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        )
    })?;
    Ok((code, json))
}

/// The status and the whole body (chunked or not) of a GET of `target`.
async fn fetch(addr: SocketAddr, target: &str) -> anyhow::Result<(u16, Bytes)> {
    use http_body_util::BodyExt;
    let unreachable = || format!("cannot reach verdict at {addr} (is it running? --server)");
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("timed out after {CONNECT_TIMEOUT:?}"))
        .with_context(unreachable)?
        .with_context(unreachable)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(unreachable)?;
    // The connection is driven beside the request; it ends with it.
    tokio::spawn(connection);
    let request = hyper::Request::get(target)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::ACCEPT, "application/json")
        .body(http_body_util::Empty::<Bytes>::new())
        .with_context(|| format!("{target:?} is not a request target"))?;
    let answer = async {
        let response = sender.send_request(request).await?;
        let code = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((code, body))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, answer)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {addr} within {ANSWER_TIMEOUT:?}"))?
        .with_context(|| format!("reading the answer from {addr}"))
}

/// An answer read into its type (a daemon of another version may answer
/// otherwise: that is said, not printed as empty cells).
fn read<T: serde::de::DeserializeOwned>(doc: &Json) -> anyhow::Result<T> {
    serde_json::from_value(doc.clone())
        .context("the daemon's answer is not what this verdict reads (another version?)")
}

/// Runs an introspection command; the text or JSON goes to stdout.
pub fn run(
    query: &Query,
    cli: &Cli,
    settings: &Settings,
    source: &SourceFlags,
) -> anyhow::Result<()> {
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

    /// A server that answers one request with `answer`, and what it was
    /// asked.
    fn answering(answer: &'static str) -> (SocketAddr, std::thread::JoinHandle<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut asked = Vec::new();
            let mut buf = [0u8; 1024];
            while !asked.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                asked.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).unwrap();
            String::from_utf8(asked).unwrap()
        });
        (addr, server)
    }

    #[test]
    fn a_chunked_answer_is_read_whole() {
        let (addr, server) = answering(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
             6\r\n{\"a\": \r\n5\r\n[1, 2\r\n2\r\n]}\r\n0\r\n\r\n",
        );
        let (code, doc) = get(addr, "/api/v1/services?q=a%20b").unwrap();
        assert_eq!((code, doc), (200, serde_json::json!({"a": [1, 2]})));
        let asked = server.join().unwrap();
        assert!(
            asked.starts_with("GET /api/v1/services?q=a%20b HTTP/1.1\r\n"),
            "{asked}"
        );
        assert!(
            asked.to_lowercase().contains("accept: application/json"),
            "{asked}"
        );
        assert!(
            asked.to_lowercase().contains(&format!("host: {addr}")),
            "{asked}"
        );
    }

    #[test]
    fn an_error_status_is_returned_with_its_body_and_junk_is_said() {
        let (addr, _server) = answering(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 20\r\n\r\n{\"error\": \"no such\"}",
        );
        assert_eq!(
            get(addr, "/api/v1/x").unwrap(),
            (404, serde_json::json!({"error": "no such"}))
        );
        let (addr, _server) = answering("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        let e = format!("{:#}", get(addr, "/api/v1").unwrap_err());
        assert!(e.contains("without JSON") && e.contains("hello"), "{e}");
        let nobody = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = format!("{:#}", get(nobody, "/api/v1").unwrap_err());
        assert!(e.contains("cannot reach verdict"), "{e}");
    }
}
