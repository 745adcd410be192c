//! `verdict-bench envelope`: the scale envelope of the whole `verdict`
//! program in one run per size, source and listener, with the default
//! flags (admin ports served, counters on):
//! - start → the last Service answering: a client in the node's
//!   namespace connects to the last Service's ClusterIP every few
//!   milliseconds from before verdict starts; its endpoints are real
//!   listeners (addresses on the namespace's loopback), so the first
//!   connection accepted is the first moment traffic reaches it;
//! - peak RSS over the cold start and everything after it;
//! - an endpoint change and a Service added, one at a time: p99 of the
//!   sync that programmed each (verdict's own `elapsed`, proxier and
//!   kernel), and of the whole path from the API server or the file;
//! - a full read of the table (the API's `/api/v1/drift`, which reads
//!   both tables whole and diffs them; the run fails on any drift);
//! - repairs of a foreign `nft flush ruleset`;
//! - adoption: SIGTERM, then a new process on the rules in place, start →
//!   its first sync, and what that sync sent.
//!
//! Each with no other process listening to nftables events, and with
//! `nft monitor` listening in a namespace of its own (the kernel then
//! builds an announcement for every element of every commit).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use verdict_e2e::netns::{Netns, can_run};

use crate::daemon::{Log, Programs, Row, Shape, Source};
use crate::workload::service_ip;
use crate::{flag, num_flag, pct, sizes};

const USAGE: &str = "usage: verdict-bench envelope [--sizes 30000,100000] [--sources manifests,api] [--listener absent,present] [--changes 20] [--adds 20] [--flushes 3] [--log DIR]";

/// What one run measured after the cold start.
pub(crate) struct Envelope {
    /// Start → the last Service's first accepted connection.
    pub answered: Duration,
    /// An endpoint change: the sync's own time, p50 / p99 (ms), and the
    /// whole path from the write to the sync's log line, p99.
    pub change_p50: f64,
    pub change_p99: f64,
    pub change_path_p99: f64,
    /// A Service added: the same.
    pub add_p50: f64,
    pub add_p99: f64,
    pub add_path_p99: f64,
    /// A full read of the IPv4 table (ms, median of three).
    pub read_back: f64,
    /// Flush → the IPv4 table repaired, p50 / max (ms).
    pub repair_p50: f64,
    pub repair_max: f64,
    /// Peak RSS of the first process over all of it (MiB).
    pub peak_rss: f64,
    /// A restart on the rules in place: start → first sync, and its
    /// operations.
    pub adopt: Duration,
    pub adopt_ops: usize,
}

/// The answer probe: the last Service's endpoints are addresses of the
/// namespace's loopback with a listener on their port, and a route sends
/// the ClusterIP out of a veth pair within the namespace (where a SYN is
/// lost, the namespace not forwarding, until verdict's DNAT turns it back
/// to the loopback).
pub(crate) struct AnswerProbe {
    rx: Receiver<Result<Instant, String>>,
    /// Set when dropped: the client stops.
    stop: Arc<AtomicBool>,
}

impl Drop for AnswerProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl AnswerProbe {
    /// Prepares `ns` and starts connecting to `svc`'s ClusterIP, port 80,
    /// every `every`, for at most `within`.
    pub fn start(
        ns: &Netns,
        svc: usize,
        endpoints: &[Ipv4Addr],
        port: u16,
        within: Duration,
    ) -> Result<AnswerProbe, String> {
        let setup = [
            "link add verdict-bench0 type veth peer name verdict-bench1",
            "link set verdict-bench0 up",
            "link set verdict-bench1 up",
            "addr add 192.168.0.2/24 dev verdict-bench0",
            "route add default dev verdict-bench0",
        ];
        for cmd in setup {
            ns.exec("ip", &cmd.split(' ').collect::<Vec<_>>())
                .map_err(|e| format!("ip {cmd}: {}", e.0))?;
        }
        for ep in endpoints {
            ns.exec("ip", &["addr", "add", &format!("{ep}/32"), "dev", "lo"])
                .map_err(|e| format!("ip addr add {ep}: {}", e.0))?;
        }
        let (name, target) = (ns.name().to_owned(), service_ip(30, svc));
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let run = || -> Result<Instant, String> {
                crate::enter_netns(&name)?;
                // Bound before verdict starts: the handshake completes in
                // its backlog, nobody needs to accept.
                let _listener = TcpListener::bind(("0.0.0.0", port))
                    .map_err(|e| format!("listening on {port}: {e}"))?;
                let to = SocketAddrV4::new(target, 80).into();
                let deadline = Instant::now() + within;
                while Instant::now() < deadline && !stopped.load(Ordering::Relaxed) {
                    if TcpStream::connect_timeout(&to, Duration::from_millis(5)).is_ok() {
                        return Ok(Instant::now());
                    }
                }
                Err(format!("{target}:80 never answered within {within:?}"))
            };
            let _ = tx.send(run());
        });
        Ok(AnswerProbe { rx, stop })
    }

    /// When the first connection was accepted.
    pub fn answered(self) -> Result<Instant, String> {
        self.rx
            .recv()
            .map_err(|_| "the answer probe died".to_owned())?
    }
}

/// The `operations=` field of a sync's log line.
pub(crate) fn operations(line: &str) -> usize {
    line.split("operations=")
        .nth(1)
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Waits for the next IPv4 partial sync that sent something; its line's
/// arrival and its own elapsed time (ms).
pub(crate) fn next_sync(log: &Log) -> Result<(Instant, f64), String> {
    loop {
        let (at, line) = log.wait_line(
            &["\"synced\"", "family=\"ip\"", "full=false"],
            Duration::from_secs(60),
        )?;
        if operations(&line) > 0 {
            let took =
                crate::daemon::elapsed_ms(&line).ok_or_else(|| format!("no elapsed in {line}"))?;
            return Ok((at, took));
        }
    }
}

/// Percentiles of sync times and paths.
pub(crate) fn p50_p99(v: &[f64]) -> (f64, f64) {
    (pct(&mut v.to_vec(), 0.50), pct(&mut v.to_vec(), 0.99))
}

/// Milliseconds spent reading the IPv4 table, from `/api/v1/drift`,
/// which must find nothing wrong.
pub(crate) fn read_back(ns: &Netns, metrics: std::net::SocketAddr) -> Result<f64, String> {
    let body = crate::readers::get_body(ns.name(), metrics, "/api/v1/drift")?;
    let doc: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("/api/v1/drift: {e}: {body}"))?;
    let fam = doc["families"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["family"] == "ip"))
        .ok_or_else(|| format!("/api/v1/drift: no IPv4 family: {body}"))?;
    if fam["table"] != true || fam["missing"] != 0 || fam["differs"] != 0 || fam["extra"] != 0 {
        return Err(format!("/api/v1/drift: the IPv4 table drifted: {fam}"));
    }
    fam["read_ms"]
        .as_f64()
        .ok_or_else(|| format!("/api/v1/drift: no read_ms: {fam}"))
}

fn cell_s(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `verdict-bench envelope …`
pub fn envelope(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| {
        num_flag(args, name, default).map_err(|e| format!("{e}\n{USAGE}"))
    };
    let sizes = sizes(args, &[30_000, 100_000])?;
    let (changes, adds, flushes) = (
        num("--changes", 20)?,
        num("--adds", 20)?,
        num("--flushes", 3)?,
    );
    if !(1..=1000).contains(&changes)
        || !(1..=1000).contains(&adds)
        || !(1..=100).contains(&flushes)
    {
        return Err(format!(
            "--changes 1..=1000, --adds 1..=1000, --flushes 1..=100\n{USAGE}"
        ));
    }
    let sources = flag(args, "--sources")
        .unwrap_or("manifests,api")
        .split(',')
        .map(|s| match s {
            "manifests" => Ok(Source::Manifests),
            "api" => Ok(Source::Api),
            other => Err(format!("--sources: {other}: manifests or api\n{USAGE}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let listeners = flag(args, "--listener")
        .unwrap_or("absent,present")
        .split(',')
        .map(|s| match s {
            "absent" => Ok(false),
            "present" => Ok(true),
            other => Err(format!("--listener: {other}: absent or present\n{USAGE}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let verdict = crate::daemon::sibling("verdict")?;
    let apiserver = crate::daemon::sibling("verdict-e2e-apiserver")?;
    println!(
        "### The scale envelope: the verdict program with its default flags, 2 endpoints per ClusterIP Service, {changes} endpoint changes, {adds} Services added, {flushes} foreign flushes, one restart\n"
    );
    println!(
        "| services | source | another nftables listener | start → last Service answers | first full sync (IPv4) | peak RSS | endpoint change p50 / p99 (sync) | p99 (whole path) | add a Service p50 / p99 (sync) | p99 (whole path) | full read of the table | flush → repaired p50 / max | restart → first sync (operations) |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        for &source in &sources {
            for &listener in &listeners {
                let name = match source {
                    Source::Api => "api",
                    Source::Manifests => "manifests",
                };
                let log_to = flag(args, "--log").map(|d| {
                    std::path::PathBuf::from(d).join(format!(
                        "envelope-{n}-{name}-{}.log",
                        if listener { "listener" } else { "alone" }
                    ))
                });
                let programs = Programs {
                    listener,
                    verdict: &verdict,
                    apiserver: &apiserver,
                    log_to: log_to.as_deref(),
                    under: &[],
                    extra: &[],
                    min_sync_period: "0s",
                };
                let shape = Shape {
                    n,
                    k: 2,
                    slice_size: 100,
                    proto: "TCP",
                };
                let mode = crate::daemon::Mode::Envelope {
                    changes,
                    adds,
                    flushes,
                };
                let Row { cold, changes, .. } =
                    crate::daemon::run_one(source, shape, mode, &programs)?;
                let crate::daemon::Changes::Envelope(e) = changes else {
                    return Err("the envelope run measured something else".into());
                };
                println!(
                    "| {n} | {name} | {} | {} | {} | {:.0} MiB | {:.2} / {:.2} ms | {:.2} ms | {:.2} / {:.2} ms | {:.2} ms | {:.0} ms | {:.0} / {:.0} ms | {} ({}) |",
                    if listener { "present" } else { "absent" },
                    cell_s(e.answered),
                    cell_s(cold),
                    e.peak_rss,
                    e.change_p50,
                    e.change_p99,
                    e.change_path_p99,
                    e.add_p50,
                    e.add_p99,
                    e.add_path_p99,
                    e.read_back,
                    e.repair_p50,
                    e.repair_max,
                    cell_s(e.adopt),
                    e.adopt_ops,
                );
            }
        }
    }
    println!(
        "\nTimes from verdict's start, from the write (API server or file) or from the flush. (sync) is the sync's own time in verdict's log, the proxier and the kernel; (whole path) runs from the write to that log line. The full read is `/api/v1/drift`'s reading of the IPv4 table (median of three; each must find no drift). Peak RSS is the first process's, over all of it. The kernel's endpoint map is checked against every Service's endpoints after the first sync, the changes, the adds, each repair and the restart."
    );
    Ok(())
}
