//! `verdict-bench daemon`: the whole `verdict` program against the fake
//! Kubernetes API server, at scale. For each size N, in a scratch network
//! namespace, the fake API server holds N ClusterIP Services and their
//! EndpointSlices; `verdict --kubeconfig` is started against it and
//! measured:
//! - the initial lists (start to "initial lists complete") and the first
//!   full sync (start to the IPv4 table synced), with the CPU time and peak
//!   memory of the process;
//! - EndpointSlice changes through the watch: from the API server accepting
//!   the change to verdict having synced it (p50/p99).
//!
//! Times are read from verdict's own log lines, as they arrive.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::apiserver::ApiServerProcess;
use verdict_e2e::netns::{Netns, Process, can_run, unique_prefix};

use crate::workload::service_ip;
use crate::{flag, pct, sizes};

const USAGE: &str =
    "usage: verdict-bench daemon [--sizes 1000,10000,30000] [--endpoints 2] [--changes 20]";

fn service(i: usize) -> Value {
    let ip = service_ip(30, i).to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc{i}"), "namespace": "bench"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    })
}

fn slice(i: usize, k: usize, port: u16) -> Value {
    let endpoints: Vec<Value> = (0..k)
        .map(|j| {
            let ip = Ipv4Addr::from(0x0a00_0000u32 + (i * k + j) as u32 + 1);
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                   "nodeName": "bench-node"})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc{i}-1"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

/// A program built next to this one.
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.with_file_name(name);
    if !path.exists() {
        return Err(format!(
            "{} is missing: build it first (cargo build --release -p verdict -p verdict-e2e)",
            path.display()
        ));
    }
    Ok(path)
}

/// verdict's log lines, with when they arrived.
struct Log {
    rx: Receiver<(Instant, String)>,
}

impl Log {
    /// Waits for a line containing every one of `parts`.
    fn wait(&self, parts: &[&str], within: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((at, line)) if parts.iter().all(|p| line.contains(p)) => return Ok(at),
                Ok((_, line)) => seen.push(line),
                Err(_) => {
                    let tail = seen[seen.len().saturating_sub(10)..].join("\n");
                    return Err(format!(
                        "no log line with {parts:?} within {within:?}; the last ones:\n{tail}"
                    ));
                }
            }
        }
    }
}

/// CPU seconds (user + system) and peak RSS (MiB) of a live process.
fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 11 and 12 here.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0;
    (cpu, rss)
}

/// One row of the table.
struct Row {
    n: usize,
    load_api: Duration,
    lists: Duration,
    cold: Duration,
    cpu: f64,
    rss: f64,
    change_p50: f64,
    change_p99: f64,
    programmed: usize,
}

fn run_one(
    n: usize,
    k: usize,
    changes: usize,
    verdict: &Path,
    apiserver: &Path,
    log_to: Option<&Path>,
) -> Result<Row, String> {
    let ns = Netns::create(&format!("{}-api", unique_prefix())).map_err(|e| e.0)?;
    let mut api = ApiServerProcess::spawn(
        &ns,
        &apiserver.to_string_lossy(),
        "127.0.0.1:16443",
        Duration::from_secs(60),
    )
    .map_err(|e| e.0)?;
    let t = Instant::now();
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "bench-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}))?;
    for i in 0..n {
        api.apply(service(i))?;
        api.apply(slice(i, k, 8080))?;
    }
    let load_api = t.elapsed();

    let dir = std::env::temp_dir().join(format!("verdict-bench-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        verdict_e2e::apiserver::kubeconfig("http://127.0.0.1:16443"),
    )
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(verdict)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "--hostname-override",
            "bench-node",
            "--cluster-cidr",
            "10.0.0.0/8",
        ])
        .args([
            "--min-sync-period",
            "0s",
            // Each sync's summary, which the times are read from.
            "-v=2",
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting verdict: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let pid = child.id();
    let daemon = Process(child);
    let (tx, rx) = channel();
    let mut keep = match log_to {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(f) = keep.as_mut() {
                let _ = writeln!(f, "{:>9.3} s  {line}", started.elapsed().as_secs_f64());
            }
            let _ = tx.send((Instant::now(), line));
        }
    });
    let log = Log { rx };
    let limit = Duration::from_secs(600);
    let lists = log.wait(&["initial lists complete"], limit)? - started;
    let cold = log.wait(&["\"synced\"", "family=\"ip\"", "full=true"], limit)? - started;
    let (cpu, rss_cold) = usage(pid);
    // What the kernel has: one service-ips element per Service.
    let table = ns
        .exec("nft", &["list", "map", "ip", "verdict", "service-ips"])
        .map_err(|e| e.0)?;
    let programmed = table.matches(" : goto ").count() + table.matches(" : jump ").count();

    let mut times = Vec::new();
    for c in 0..changes {
        let i = (c * 7919) % n;
        // A port no earlier change used: always a real change.
        let port = 8081 + c as u16;
        let t = Instant::now();
        api.apply(slice(i, k, port))?;
        let done = log.wait(
            &["\"synced\"", "family=\"ip\"", "full=false"],
            Duration::from_secs(60),
        )?;
        times.push(done.saturating_duration_since(t).as_secs_f64() * 1000.0);
    }
    let (_, rss) = usage(pid);
    drop(daemon);
    drop(api);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Row {
        n,
        load_api,
        lists,
        cold,
        cpu,
        rss: rss.max(rss_cold),
        change_p50: pct(&mut times.clone(), 0.50),
        change_p99: pct(&mut times, 0.99),
        programmed,
    })
}

/// `verdict-bench daemon …`
pub fn daemon(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| -> Result<usize, String> {
        flag(args, name).map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("{name} {v}: {e}"))
        })
    };
    let sizes = sizes(args, &[1_000, 10_000, 30_000])?;
    let (k, changes) = (num("--endpoints", 2)?, num("--changes", 20)?);
    if k == 0 || changes == 0 || changes > 1000 || sizes.iter().any(|n| *n == 0 || *n > 60_000) {
        return Err(format!(
            "sizes must be 1..=60000, --endpoints at least 1, --changes 1..=1000\n{USAGE}"
        ));
    }
    let verdict = sibling("verdict")?;
    let apiserver = sibling("verdict-e2e-apiserver")?;
    println!(
        "### The verdict program against the fake API server (K = {k} endpoints, {changes} changes)\n"
    );
    println!(
        "| services | API server loaded in | initial lists | first full sync | CPU at first sync | peak RSS | EndpointSlice change → synced p50 / p99 | services programmed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let log_to = flag(args, "--log").map(|d| PathBuf::from(d).join(format!("verdict-{n}.log")));
        let r = run_one(n, k, changes, &verdict, &apiserver, log_to.as_deref())?;
        println!(
            "| {} | {:.1} s | {:.2} s | {:.2} s | {:.2} s | {:.0} MiB | {:.1} / {:.1} ms | {} |",
            r.n,
            r.load_api.as_secs_f64(),
            r.lists.as_secs_f64(),
            r.cold.as_secs_f64(),
            r.cpu,
            r.rss,
            r.change_p50,
            r.change_p99,
            r.programmed
        );
        if r.programmed != r.n {
            return Err(format!(
                "{} services were programmed, not {}",
                r.programmed, r.n
            ));
        }
    }
    println!(
        "\nTimes from verdict's start (lists, first sync) and from the API server accepting a change \
         (to the partial sync's log line); CPU and peak RSS of the verdict process."
    );
    Ok(())
}
