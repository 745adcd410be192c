//! `verdict-bench daemon`: the whole `verdict` program at scale, fed by the
//! fake Kubernetes API server or by manifest files. For each size N, in a
//! scratch network namespace:
//! - `--source api`: the fake API server holds N ClusterIP Services and
//!   their EndpointSlices, and `verdict --kubeconfig` is started against it;
//! - `--source manifests`: a directory holds them in one YAML file, as
//!   `kubectl get -o yaml` writes them, beside a small file with one more
//!   Service, and `verdict --manifests DIR` is started on it.
//!
//! Measured:
//! - the initial load (start to "initial lists complete", or to the
//!   manifests read) and the first full sync (start to the IPv4 table
//!   synced, and to both tables synced), with the CPU time and peak memory
//!   of the process;
//! - EndpointSlice changes: from the API server accepting the change, or
//!   from the small file written, to verdict having synced it (p50/p99).
//!   With manifests, each change must have parsed the small file alone.
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

const USAGE: &str = "usage: verdict-bench daemon [--source api|manifests] [--protocol tcp|udp] [--sizes 1000,10000,30000] [--endpoints 2] [--changes 20] [--log DIR] [--under 'heaptrack -o FILE']";

/// Where verdict reads the cluster from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Api,
    Manifests,
}

/// The objects as YAML in block style, as `kubectl get -o yaml` writes
/// them (each a document of its own).
fn yaml(objects: &[Value]) -> String {
    fn scalar(v: &Value) -> String {
        match v {
            // Quoted only where YAML would read another type.
            Value::String(s)
                if s.parse::<f64>().is_ok()
                    || matches!(s.as_str(), "true" | "false" | "null" | "")
                    || s.contains(": ")
                    || s.starts_with(['-', '{', '[', '*', '&', '!', '#']) =>
            {
                Value::String(s.clone()).to_string()
            }
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
    fn emit(v: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match v {
                        Value::Object(o) if !o.is_empty() => {
                            out.push_str(&format!("{pad}{k}:\n"));
                            emit(v, indent + 2, out);
                        }
                        Value::Array(a) if !a.is_empty() => {
                            out.push_str(&format!("{pad}{k}:\n"));
                            emit(v, indent, out);
                        }
                        _ => out.push_str(&format!("{pad}{k}: {}\n", scalar(v))),
                    }
                }
            }
            Value::Array(a) => {
                for item in a {
                    let mut inner = String::new();
                    match item {
                        Value::Object(_) | Value::Array(_) => emit(item, indent + 2, &mut inner),
                        _ => inner = format!("{pad}  {}\n", scalar(item)),
                    }
                    // "- " takes the place of the first line's indentation.
                    out.push_str(&format!("{pad}- {}", &inner[indent + 2..]));
                }
            }
            _ => out.push_str(&format!("{pad}{}\n", scalar(v))),
        }
    }
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        emit(o, 0, &mut out);
    }
    out
}

fn service(i: usize, proto: &str) -> Value {
    let ip = service_ip(30, i).to_string();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc{i}"), "namespace": "bench"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": proto}]}
    })
}

fn slice(i: usize, k: usize, port: u16, proto: &str) -> Value {
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
        "ports": [{"name": "http", "port": port, "protocol": proto}],
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
        self.wait_line(parts, within).map(|(at, _)| at)
    }

    /// The same, with the line.
    fn wait_line(&self, parts: &[&str], within: Duration) -> Result<(Instant, String), String> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((at, line)) if parts.iter().all(|p| line.contains(p)) => return Ok((at, line)),
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

/// The `elapsed="…"` field of a log line (a Rust Duration's Debug form),
/// in milliseconds.
fn elapsed_ms(line: &str) -> Option<f64> {
    let v = line.split("elapsed=\"").nth(1)?.split('"').next()?;
    let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?);
    let x: f64 = num.parse().ok()?;
    Some(match unit {
        "ns" => x / 1e6,
        "µs" => x / 1e3,
        "ms" => x,
        "s" => x * 1e3,
        _ => return None,
    })
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
    /// The API server filled, or the manifests written.
    prepared: Duration,
    /// Start to the initial lists, or to the manifests read.
    loaded: Duration,
    /// Start to the IPv4 table's first full sync.
    cold: Duration,
    /// Start to both tables' first full sync.
    both: Duration,
    cpu: f64,
    rss: f64,
    change_p50: f64,
    change_p99: f64,
    /// verdict's work after each of those syncs (health-check ports, UDP
    /// conntrack), from its log.
    after_p50: f64,
    after_max: f64,
    programmed: usize,
}

/// What feeds verdict in one run.
enum Feed {
    Api(ApiServerProcess),
    /// The small file of the manifests directory, which the changes go to.
    Files {
        small: PathBuf,
    },
}

impl Feed {
    /// Service `i` gets its endpoints on `port`.
    fn change(&mut self, i: usize, k: usize, port: u16, proto: &str) -> Result<(), String> {
        match self {
            Feed::Api(api) => api.apply(slice(i, k, port, proto)).map(drop),
            Feed::Files { small, .. } => std::fs::write(
                &*small,
                yaml(&[service(i, proto), slice(i, k, port, proto)]),
            )
            .map_err(|e| format!("{}: {e}", small.display())),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    source: Source,
    proto: &str,
    n: usize,
    k: usize,
    changes: usize,
    verdict: &Path,
    apiserver: &Path,
    log_to: Option<&Path>,
    under: &[&str],
) -> Result<Row, String> {
    let ns = Netns::create(&format!("{}-api", unique_prefix())).map_err(|e| e.0)?;
    let dir = std::env::temp_dir().join(format!("verdict-bench-daemon-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "bench-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}});
    let t = Instant::now();
    let (mut feed, source_args) = match source {
        Source::Api => {
            let mut api = ApiServerProcess::spawn(
                &ns,
                &apiserver.to_string_lossy(),
                "127.0.0.1:16443",
                Duration::from_secs(60),
            )
            .map_err(|e| e.0)?;
            api.apply(node)?;
            for i in 0..n {
                api.apply(service(i, proto))?;
                api.apply(slice(i, k, 8080, proto))?;
            }
            let kubeconfig = dir.join("kubeconfig");
            std::fs::write(
                &kubeconfig,
                verdict_e2e::apiserver::kubeconfig("http://127.0.0.1:16443"),
            )
            .map_err(|e| e.to_string())?;
            (
                Feed::Api(api),
                vec!["--kubeconfig".to_string(), kubeconfig.display().to_string()],
            )
        }
        Source::Manifests => {
            let manifests = dir.join("manifests");
            std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
            let mut objects = vec![node];
            for i in 0..n {
                objects.push(service(i, proto));
                objects.push(slice(i, k, 8080, proto));
            }
            let write = |name: &str, objects: &[Value]| {
                let p = manifests.join(name);
                std::fs::write(&p, yaml(objects)).map_err(|e| format!("{}: {e}", p.display()))?;
                Ok::<_, String>(p)
            };
            write("cluster.yaml", &objects)?;
            // One more Service, which the changes edit.
            let small = write("small.yaml", &[service(n, proto), slice(n, k, 8080, proto)])?;
            (
                Feed::Files { small },
                vec!["--manifests".to_string(), manifests.display().to_string()],
            )
        }
    };
    let prepared = t.elapsed();
    let started = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(under)
        .arg(verdict)
        .args(&source_args)
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
    let loaded = match source {
        Source::Api => log.wait(&["initial lists complete"], limit)?,
        Source::Manifests => log.wait(&["manifests read"], limit)?,
    } - started;
    let cold = log.wait(&["\"synced\"", "family=\"ip\"", "full=true"], limit)? - started;
    let both = log.wait(&["\"synced\"", "family=\"ip6\"", "full=true"], limit)? - started;
    let (cpu, rss_cold) = usage(pid);
    // What the kernel has: one service-ips element per Service.
    let table = ns
        .exec("nft", &["list", "map", "ip", "verdict", "service-ips"])
        .map_err(|e| e.0)?;
    let programmed = table.matches(" : goto ").count() + table.matches(" : jump ").count();

    let mut times = Vec::new();
    let mut after = Vec::new();
    for c in 0..changes {
        let i = match feed {
            Feed::Api(_) => (c * 7919) % n,
            Feed::Files { .. } => n,
        };
        // A port no earlier change used: always a real change.
        let port = 8081 + c as u16;
        let t = Instant::now();
        feed.change(i, k, port, proto)?;
        if let Feed::Files { small, .. } = &feed {
            // The edit must have been read alone.
            log.wait(
                &["manifests read", &format!("files=\"{}\"", small.display())],
                Duration::from_secs(60),
            )?;
        }
        let done = log.wait(
            &["\"synced\"", "family=\"ip\"", "full=false"],
            Duration::from_secs(60),
        )?;
        times.push(done.saturating_duration_since(t).as_secs_f64() * 1000.0);
        let (_, line) = log.wait_line(
            &["after the sync", "family=\"ip\""],
            Duration::from_secs(60),
        )?;
        after.push(elapsed_ms(&line).ok_or_else(|| format!("no elapsed in {line}"))?);
    }
    let (_, rss) = usage(pid);
    drop(daemon);
    drop(feed);
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Row {
        n,
        prepared,
        loaded,
        cold,
        both,
        cpu,
        rss: rss.max(rss_cold),
        change_p50: pct(&mut times.clone(), 0.50),
        change_p99: pct(&mut times, 0.99),
        after_p50: pct(&mut after.clone(), 0.50),
        after_max: after.iter().copied().fold(0.0, f64::max),
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
    let source = match flag(args, "--source") {
        None | Some("api") => Source::Api,
        Some("manifests") => Source::Manifests,
        Some(other) => return Err(format!("--source {other}: api or manifests\n{USAGE}")),
    };
    let proto = match flag(args, "--protocol") {
        None | Some("tcp") => "TCP",
        Some("udp") => "UDP",
        Some(other) => return Err(format!("--protocol {other}: tcp or udp\n{USAGE}")),
    };
    let sizes = sizes(args, &[1_000, 10_000, 30_000])?;
    let (k, changes) = (num("--endpoints", 2)?, num("--changes", 20)?);
    if k == 0 || changes == 0 || changes > 1000 || sizes.iter().any(|n| *n == 0 || *n > 200_000) {
        return Err(format!(
            "sizes must be 1..=200000, --endpoints at least 1, --changes 1..=1000\n{USAGE}"
        ));
    }
    // A profiler to run verdict under (its CPU and RSS columns are then
    // the wrapper's, not verdict's).
    let under: Vec<&str> =
        flag(args, "--under").map_or(Vec::new(), |u| u.split_whitespace().collect());
    let verdict = sibling("verdict")?;
    let apiserver = sibling("verdict-e2e-apiserver")?;
    let (title, prepared, loaded, change) = match source {
        Source::Api => (
            "against the fake API server",
            "API server loaded in",
            "initial lists",
            "EndpointSlice change",
        ),
        Source::Manifests => (
            "on manifest files (one file of N Services, one small file)",
            "files written in",
            "files read",
            "small file edited",
        ),
    };
    println!(
        "### The verdict program {title} (K = {k} endpoints, {proto} services, {changes} changes)\n"
    );
    println!(
        "| services | {prepared} | {loaded} | first full sync (IPv4) | both families synced | CPU at first sync | peak RSS | {change} → synced p50 / p99 | work after that sync p50 / max | services programmed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let log_to = flag(args, "--log").map(|d| PathBuf::from(d).join(format!("verdict-{n}.log")));
        let r = run_one(
            source,
            proto,
            n,
            k,
            changes,
            &verdict,
            &apiserver,
            log_to.as_deref(),
            &under,
        )?;
        println!(
            "| {} | {:.1} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.0} MiB | {:.1} / {:.1} ms | {:.3} / {:.3} ms | {} |",
            r.n,
            r.prepared.as_secs_f64(),
            r.loaded.as_secs_f64(),
            r.cold.as_secs_f64(),
            r.both.as_secs_f64(),
            r.cpu,
            r.rss,
            r.change_p50,
            r.change_p99,
            r.after_p50,
            r.after_max,
            r.programmed
        );
        let expected = match source {
            Source::Api => r.n,
            Source::Manifests => r.n + 1,
        };
        if r.programmed != expected {
            return Err(format!(
                "{} services were programmed, not {expected}",
                r.programmed
            ));
        }
    }
    println!(
        "\nTimes from verdict's start (load, first syncs) and from the API server accepting a change \
         or the small file being written (to the partial sync's log line); CPU and peak RSS of the \
         verdict process."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_is_read_in_every_unit() {
        let line = |v: &str| {
            format!("I1202 mod.rs:1] \"after the sync\" family=\"ip\" elapsed=\"{v}\" x=1")
        };
        assert_eq!(elapsed_ms(&line("250ns")), Some(0.00025));
        assert_eq!(elapsed_ms(&line("12.5µs")), Some(0.0125));
        assert_eq!(elapsed_ms(&line("3.25ms")), Some(3.25));
        assert_eq!(elapsed_ms(&line("1.5s")), Some(1500.0));
        assert_eq!(elapsed_ms("no field"), None);
    }

    #[test]
    fn yaml_is_block_style_as_kubectl_writes_it() {
        let text = yaml(&[slice(3, 2, 8080, "UDP")]);
        assert!(text.starts_with("---\naddressType: IPv4\n"), "{text}");
        assert!(
            text.contains(
                "endpoints:\n- addresses:\n  - 10.0.0.7\n  conditions:\n    ready: true\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ports:\n- name: http\n  port: 8080\n  protocol: UDP\n"),
            "{text}"
        );
        assert!(
            text.contains("  labels:\n    kubernetes.io/service-name: svc3\n"),
            "{text}"
        );
    }
}
