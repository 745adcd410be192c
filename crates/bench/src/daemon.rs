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
//! - EndpointSlice changes, each replacing one endpoint: from the API
//!   server accepting the change, or from the small file written, to
//!   verdict having synced it (p50/p99). With manifests, each change must
//!   have parsed the small file alone;
//! - or, with `--churn RATE --duration SECS`, sustained churn: RATE changes
//!   a second sent on time and not waited for, the syncs verdict made
//!   meanwhile, its RSS, and how soon after the last change the kernel
//!   held exactly every service's current endpoints.
//!
//! - or, with `--inspect N`, N `verdict trace` and N `verdict explain`
//!   commands against the running daemon, each answer checked;
//! - or, with `--heal N`, N foreign `nft flush ruleset`s, each timed from
//!   the flush to verdict's repair of each family, and the kernel's
//!   endpoint map checked against every service's endpoints after each;
//! - or, with `--readers N`, `/livez`, `/healthz` and the Service list
//!   probed every 50 ms through the cold start and through N repairs of a
//!   foreign flush: how long the readers waited while verdict synced;
//! - or, with `--slow-clients C --duration S`, C slow clients on each
//!   admin port (one byte every 3 s, never a whole request) while the
//!   whole `/metrics` is scraped in a loop and `/livez` probed every 50 ms
//!   for S seconds.
//!
//! Big services: `--endpoints K` endpoints per service, cut into slices of
//! `--slice-size` (100, the EndpointSlice controller's default). The
//! kernel's endpoint map is checked against every service's endpoints
//! after the first sync and after the changes; a mismatch fails the run.
//!
//! Times are read from verdict's own log lines, as they arrive.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::apiserver::ApiServerProcess;
use verdict_e2e::netns::{Netns, Process, can_run, unique_prefix};

use crate::readers::{Floor, Prober, Scraper, SlowClients, Summary, first_answer, summarize};
use crate::workload::service_ip;
use crate::{flag, num_flag, pct, sizes};

const USAGE: &str = "usage: verdict-bench daemon [--listener] [--source api|manifests] [--protocol tcp|udp] [--sizes 1000,10000,30000] [--endpoints 2] [--slice-size 100] [--changes 20 | --churn 100 --duration 60 | --inspect 20 | --heal 10 | --readers 5 | --slow-clients 1000 --duration 30 | --scrapes 20] [--min-sync-period 0s] [--log DIR] [--under 'heaptrack -o FILE'] [--verdict-flags '--service-counters=false']";

/// Where verdict reads the cluster from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Api,
    Manifests,
}

impl Source {
    /// How many Services verdict is given for size `n`: the manifests have
    /// the small file's one more.
    fn services(self, n: usize) -> usize {
        match self {
            Source::Api => n,
            Source::Manifests => n + 1,
        }
    }
}

/// The objects as YAML in block style, as `kubectl get -o yaml` writes
/// them (each a document of its own).
pub(crate) fn yaml(objects: &[Value]) -> String {
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

/// The first endpoints of service `i`, K of them: addresses of 10.0.0.0/8,
/// distinct across services.
fn first_endpoints(i: usize, k: usize) -> Vec<Ipv4Addr> {
    (0..k)
        .map(|j| Ipv4Addr::from(0x0a00_0000u32 + (i * k + j) as u32 + 1))
        .collect()
}

/// Whether each endpoint names its pod (`targetRef`), as the EndpointSlice
/// controller writes it (`envelope --target-refs`): off, the workload of
/// the earlier measurements.
pub(crate) static TARGET_REFS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Slice `s` of service `i`: the endpoints `s * size ..` of `eps`.
fn slice_of(i: usize, s: usize, eps: &[Ipv4Addr], size: usize, port: u16, proto: &str) -> Value {
    let named = TARGET_REFS.load(std::sync::atomic::Ordering::Relaxed);
    let endpoints: Vec<Value> = eps
        .iter()
        .skip(s * size)
        .take(size)
        .map(|ip| {
            let mut e = json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                   "nodeName": "bench-node"});
            if named {
                // A Deployment's pod name: the Service's, the template
                // hash, five characters of its own.
                e["targetRef"] = json!({"kind": "Pod", "namespace": "bench",
                    "name": format!("svc{i}-7d4b9c5f6-{:05x}", u32::from(*ip) & 0xf_ffff)});
            }
            e
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc{i}-{}", s + 1), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": proto}],
        "endpoints": endpoints
    })
}

/// Every slice of service `i`, at most `size` endpoints each, as the
/// EndpointSlice controller cuts them (100 by default).
fn slices(i: usize, eps: &[Ipv4Addr], size: usize, port: u16, proto: &str) -> Vec<Value> {
    (0..eps.len().div_ceil(size).max(1))
        .map(|s| slice_of(i, s, eps, size, port, proto))
        .collect()
}

/// The one-slice service of the earlier tables (and of the tests).
#[cfg(test)]
fn slice(i: usize, k: usize, port: u16, proto: &str) -> Value {
    slice_of(i, 0, &first_endpoints(i, k), k, port, proto)
}

/// A program built next to this one.
pub(crate) fn sibling(name: &str) -> Result<PathBuf, String> {
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
pub(crate) struct Log {
    rx: Receiver<(Instant, String)>,
}

impl Log {
    /// Hands every line already arrived to `f`, without waiting.
    fn drain(&self, f: &mut impl FnMut(Instant, &str)) {
        while let Ok((at, line)) = self.rx.try_recv() {
            f(at, &line);
        }
    }

    /// Waits for a line containing every one of `parts`.
    pub(crate) fn wait(&self, parts: &[&str], within: Duration) -> Result<Instant, String> {
        self.wait_line(parts, within).map(|(at, _)| at)
    }

    /// The same, with the line.
    pub(crate) fn wait_line(
        &self,
        parts: &[&str],
        within: Duration,
    ) -> Result<(Instant, String), String> {
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
pub(crate) fn elapsed_ms(line: &str) -> Option<f64> {
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
pub(crate) fn usage(pid: u32) -> (f64, f64) {
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
    (cpu, status_mib(pid, "VmHWM:"))
}

/// A size line of a live process's `/proc/PID/status` (`VmHWM:`, the peak
/// RSS; `VmRSS:`, the RSS now), in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// One row of the table.
pub(crate) struct Row {
    n: usize,
    /// The API server filled, or the manifests written.
    prepared: Duration,
    /// Start to the initial lists, or to the manifests read.
    loaded: Duration,
    /// Start to the IPv4 table's first full sync.
    pub(crate) cold: Duration,
    /// Start to both tables' first full sync.
    both: Duration,
    cpu: f64,
    rss: f64,
    /// What the changes measured.
    pub(crate) changes: Changes,
    programmed: usize,
}

/// What the changes after the first sync measured.
pub(crate) enum Changes {
    /// One at a time, each waited for.
    Latency {
        p50: f64,
        p99: f64,
        /// verdict's work after each of those syncs (health-check ports,
        /// UDP conntrack), from its log.
        after_p50: f64,
        after_max: f64,
    },
    /// Sustained churn at a rate, not waited for.
    Churn(Churn),
    /// `verdict trace` and `verdict explain` against the running daemon.
    Inspect(Inspect),
    /// The readers, probed through the cold start and the repairs:
    /// `/livez`, `/healthz` (health port), the Service list (metrics port)
    /// and the floor.
    Readers(Box<Readers>),
    /// Slow clients on both admin ports, a scrape loop, `/livez` probed.
    Slow(Slow),
    /// Whole scrapes of `/metrics`.
    Scrapes(Scrapes),
    /// The envelope (`verdict-bench envelope`).
    Envelope(Box<crate::envelope::Envelope>),
    /// Foreign flushes repaired: from the flush to each family synced
    /// again (ms).
    Heal {
        ip_p50: f64,
        ip_max: f64,
        both_p50: f64,
        both_max: f64,
    },
}

/// What `verdict trace` and `verdict explain` took against the running
/// daemon: the whole command (a process, its HTTP request, the daemon's
/// answer), and the daemon's own kernel reads within it (ms).
pub(crate) struct Inspect {
    trace_p50: f64,
    trace_p99: f64,
    trace_read_p50: f64,
    explain_p50: f64,
    explain_p99: f64,
    explain_read_p50: f64,
    /// One `explain --full`, which reads the whole table.
    full: f64,
    /// RSS (MiB) before the first ask and after the last.
    rss_before: f64,
    rss_after: f64,
}

/// The daemon's metrics address in the benchmark's namespace, where the
/// introspection API is served (`--inspect`, `--readers`,
/// `--slow-clients`).
pub(crate) const METRICS: &str = "127.0.0.1:10249";
/// Its health address (`--readers`, `--slow-clients`).
pub(crate) const HEALTH: &str = "127.0.0.1:10256";
/// How often the readers are probed.
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// What the readers' probes saw in each window, in the order probed.
pub(crate) struct Readers {
    cold: [Summary; 4],
    repair: [Summary; 4],
    repairs: usize,
}

/// What whole scrapes of `/metrics` cost.
pub(crate) struct Scrapes {
    /// Samples (lines that are not comments) and bytes of the last.
    series: usize,
    bytes: usize,
    p50_ms: f64,
    max_ms: f64,
    /// verdict's peak RSS (VmHWM) before the first scrape and after the
    /// last, and its RSS after.
    peak_before: f64,
    peak_after: f64,
    rss_after: f64,
}

/// What slow clients did to the admin ports.
pub(crate) struct Slow {
    clients: usize,
    secs: usize,
    /// `/livez` on the health port, `/healthz` on the metrics port.
    livez: Summary,
    healthz: Summary,
    /// Slow connections open at the end, and how many the server closed
    /// (and the client opened again) meanwhile.
    open: usize,
    reopened: usize,
    /// Whole scrapes of `/metrics` in the time, their p50 and size.
    scrapes: usize,
    scrape_p50: f64,
    scrape_bytes: usize,
}

fn addr(a: &str) -> Result<std::net::SocketAddr, String> {
    a.parse().map_err(|e| format!("{a}: {e}"))
}

/// Asks the running daemon `asks` times what `verdict trace` and
/// `verdict explain` say about a service, checking each answer against
/// the service's endpoints.
fn inspect(
    ns: &Netns,
    verdict: &Path,
    eps: &Endpoints,
    pid: u32,
    asks: usize,
    count: usize,
) -> Result<Inspect, String> {
    let verdict = verdict.to_str().ok_or("the verdict path is not UTF-8")?;
    let ask = |args: &[&str]| -> Result<(f64, Value), String> {
        let mut all = args.to_vec();
        all.extend(["--server", METRICS, "-o", "json"]);
        let t = Instant::now();
        let out = ns
            .exec(verdict, &all)
            .map_err(|e| format!("verdict {}: {}", args.join(" "), e.0))?;
        let took = t.elapsed().as_secs_f64() * 1000.0;
        let doc: Value = serde_json::from_str(&out)
            .map_err(|e| format!("verdict {}: {e}: {out}", args.join(" ")))?;
        Ok((took, doc))
    };
    let rss_before = rss_now(pid);
    let (mut trace, mut trace_read, mut explain, mut explain_read) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for q in 0..asks {
        let i = (q * 7919 + 13) % count;
        let dst = service_ip(30, i).to_string();
        let (took, doc) = ask(&[
            "trace",
            "--from",
            "pod",
            "--src",
            "10.255.0.5",
            "--dst",
            &dst,
            "--proto",
            "tcp",
            "--dport",
            "80",
        ])?;
        let mut want: Vec<String> = eps.of(i).iter().map(|a| format!("{a}:8080")).collect();
        want.sort();
        let mut got: Vec<String> = doc["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["output"].as_str().map(str::to_owned))
            .collect();
        got.sort();
        if got != want || doc["read"] != "targeted" {
            return Err(format!("trace of svc{i}: {got:?}, not {want:?}: {doc}"));
        }
        trace.push(took);
        trace_read.push(doc["read_ms"].as_f64().unwrap_or(0.0));
        let name = format!("bench/svc{i}");
        let (took, doc) = ask(&["explain", &name])?;
        let drift = &doc["drift"];
        let listed = doc["families"][0]["ports"][0]["endpoints"]
            .as_array()
            .map_or(0, Vec::len);
        if drift["missing"] != 0 || drift["differs"] != 0 || listed != eps.shape.k {
            return Err(format!("explain {name}: {listed} endpoints, drift {drift}"));
        }
        explain.push(took);
        explain_read.push(doc["families"][0]["read_ms"].as_f64().unwrap_or(0.0));
    }
    let (full, doc) = ask(&["explain", "bench/svc0", "--full"])?;
    if doc["drift"]["extra"] != 0 {
        return Err(format!("explain --full: {}", doc["drift"]));
    }
    Ok(Inspect {
        trace_p50: pct(&mut trace.clone(), 0.50),
        trace_p99: pct(&mut trace, 0.99),
        trace_read_p50: pct(&mut trace_read, 0.50),
        explain_p50: pct(&mut explain.clone(), 0.50),
        explain_p99: pct(&mut explain, 0.99),
        explain_read_p50: pct(&mut explain_read, 0.50),
        full,
        rss_before,
        rss_after: rss_now(pid),
    })
}

/// Sustained churn: what verdict kept up with.
pub(crate) struct Churn {
    sent: usize,
    /// How long sending took (the rate held, or not).
    sending: Duration,
    /// IPv4 syncs while the changes came, and the gaps between them.
    syncs: usize,
    gap_p50: f64,
    gap_max: f64,
    /// How long those syncs took.
    sync_p50: f64,
    sync_p99: f64,
    /// RSS (MiB) when the churn began, the most during it, and at its end.
    rss_start: f64,
    rss_max: f64,
    rss_end: f64,
    /// The last change sent to the kernel holding exactly every service's
    /// current endpoints.
    converged: Duration,
}

/// The shape of the services of one run.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) n: usize,
    /// Endpoints per service.
    pub(crate) k: usize,
    /// Endpoints per EndpointSlice.
    pub(crate) slice_size: usize,
    pub(crate) proto: &'static str,
}

/// Every service's endpoints as they are now (those no change touched
/// have their first ones).
struct Endpoints {
    shape: Shape,
    changed: std::collections::HashMap<usize, Vec<Ipv4Addr>>,
    fresh: u32,
}

impl Endpoints {
    fn new(shape: Shape) -> Endpoints {
        Endpoints {
            shape,
            changed: std::collections::HashMap::new(),
            fresh: 0,
        }
    }

    fn of(&self, i: usize) -> Vec<Ipv4Addr> {
        self.changed
            .get(&i)
            .cloned()
            .unwrap_or_else(|| first_endpoints(i, self.shape.k))
    }

    /// Change `c` replaces one endpoint of service `i` with a new address
    /// (a pod replaced): returns the slice it is in.
    fn replace(&mut self, i: usize, c: usize) -> usize {
        let k = self.shape.k;
        let eps = self
            .changed
            .entry(i)
            .or_insert_with(|| first_endpoints(i, k));
        let j = (c * 7919) % eps.len();
        // 11.0.0.0/8: never one of the first endpoints.
        eps[j] = Ipv4Addr::from(0x0b00_0000u32 + self.fresh + 1);
        self.fresh += 1;
        j / self.shape.slice_size
    }
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
    /// Service `i` has new endpoints in slice `s`.
    fn change(&mut self, i: usize, s: usize, eps: &Endpoints) -> Result<(), String> {
        let Shape {
            slice_size, proto, ..
        } = eps.shape;
        let now = eps.of(i);
        match self {
            Feed::Api(api) => api
                .apply(slice_of(i, s, &now, slice_size, 8080, proto))
                .map(drop),
            Feed::Files { small, .. } => {
                let mut objects = vec![service(i, proto)];
                objects.extend(slices(i, &now, slice_size, 8080, proto));
                std::fs::write(&*small, yaml(&objects))
                    .map_err(|e| format!("{}: {e}", small.display()))
            }
        }
    }

    /// Adds the Services `first..first + count` (the last one new), each
    /// with its first endpoints: through the API server, its slices and
    /// then the Service (one sync programs it whole); in files, the file
    /// `added.yaml` beside the small one, rewritten with all of them.
    fn add(&mut self, first: usize, count: usize, eps: &Endpoints) -> Result<(), String> {
        let Shape {
            slice_size, proto, ..
        } = eps.shape;
        match self {
            Feed::Api(api) => {
                let i = first + count - 1;
                for s in slices(i, &eps.of(i), slice_size, 8080, proto) {
                    api.apply(s)?;
                }
                api.apply(service(i, proto)).map(drop)
            }
            Feed::Files { small, .. } => {
                let path = small.with_file_name("added.yaml");
                let mut objects = Vec::new();
                for i in first..first + count {
                    objects.push(service(i, proto));
                    objects.extend(slices(i, &eps.of(i), slice_size, 8080, proto));
                }
                std::fs::write(&path, yaml(&objects))
                    .map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }

    /// The service the `c`-th change goes to.
    fn target(&self, c: usize, n: usize) -> usize {
        match self {
            Feed::Api(_) => (c * 7919) % n,
            Feed::Files { .. } => n,
        }
    }
}

/// The IPv4 table's endpoint map, by entry address: the endpoint
/// addresses the kernel sends each service's packets to.
fn kernel_endpoints(
    ns: &Netns,
    proto: &str,
) -> Result<std::collections::HashMap<Ipv4Addr, Vec<Ipv4Addr>>, String> {
    let map = format!("service-endpoints-{}", proto.to_ascii_lowercase());
    let text = ns
        .exec("nft", &["list", "map", "ip", "verdict", &map])
        .map_err(|e| e.0)?;
    let body = text
        .split_once("elements = {")
        .map_or("", |(_, b)| b.split('}').next().unwrap_or(""));
    let mut out: std::collections::HashMap<Ipv4Addr, Vec<Ipv4Addr>> =
        std::collections::HashMap::new();
    for element in body.split(',') {
        let Some((key, value)) = element.split_once(':') else {
            continue;
        };
        let addr = |s: &str| s.split('.').count();
        let entry = key.trim().split(" . ").next().unwrap_or("");
        let target = value.trim().split(" . ").next().unwrap_or("");
        if addr(entry) != 4 || addr(target) != 4 {
            return Err(format!("{map}: cannot read the element {element:?}"));
        }
        let (Ok(entry), Ok(target)) = (entry.parse(), target.parse()) else {
            return Err(format!("{map}: cannot read the element {element:?}"));
        };
        out.entry(entry).or_default().push(target);
    }
    Ok(out)
}

/// Whether the kernel sends every service `0..count` to exactly its
/// current endpoints, and nowhere else.
fn kernel_matches(ns: &Netns, eps: &Endpoints, count: usize) -> Result<bool, String> {
    let mut have = kernel_endpoints(ns, eps.shape.proto)?;
    if have.len() != count {
        return Ok(false);
    }
    for i in 0..count {
        let mut want = eps.of(i);
        want.sort();
        let Some(got) = have.get_mut(&service_ip(30, i)) else {
            return Ok(false);
        };
        got.sort();
        if *got != want {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The resident set (MiB) of a live process now.
pub(crate) fn rss_now(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Keeps the time and duration of an IPv4 sync's log line.
fn note_sync(syncs: &mut Vec<(Instant, f64)>, at: Instant, line: &str) {
    if line.contains("\"synced\"") && line.contains("family=\"ip\"") {
        syncs.push((at, elapsed_ms(line).unwrap_or(0.0)));
    }
}

/// `rate` endpoint changes a second for `secs` seconds, sent on time and
/// not waited for; then waits for the kernel to hold every service's
/// current endpoints.
#[allow(clippy::too_many_arguments)]
fn churn(
    feed: &mut Feed,
    eps: &mut Endpoints,
    log: &Log,
    ns: &Netns,
    pid: u32,
    rate: usize,
    secs: usize,
    count: usize,
) -> Result<Churn, String> {
    let total = rate * secs;
    let mut syncs: Vec<(Instant, f64)> = Vec::new();
    let start = Instant::now();
    let rss_start = rss_now(pid);
    let mut rss_max = rss_start;
    let mut next_sample = start;
    for c in 0..total {
        let due = start + Duration::from_secs_f64(c as f64 / rate as f64);
        loop {
            log.drain(&mut |at, line| note_sync(&mut syncs, at, line));
            let now = Instant::now();
            if now >= next_sample {
                rss_max = rss_max.max(rss_now(pid));
                next_sample += Duration::from_millis(250);
            }
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(2)));
        }
        let i = feed.target(c, eps.shape.n);
        let s = eps.replace(i, c);
        feed.change(i, s, eps)?;
    }
    let last = Instant::now();
    let sending = last - start;
    let during = syncs.len();
    // Converged: after a sync that came after the last change, the kernel
    // holds exactly what the last change left. (Reading the map takes
    // seconds at 30,000 services, so the time is the sync's, not the
    // check's.)
    let converged = loop {
        let seen = syncs.len();
        while syncs.len() == seen {
            if last.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "no sync brought the kernel to every service's current endpoints within 60 s of the last change ({} syncs)",
                    syncs.len()
                ));
            }
            log.drain(&mut |at, line| note_sync(&mut syncs, at, line));
            std::thread::sleep(Duration::from_millis(5));
        }
        let at = syncs[syncs.len() - 1].0;
        if at > last && kernel_matches(ns, eps, count)? {
            break at - last;
        }
    };
    let rss_end = rss_now(pid);
    rss_max = rss_max.max(rss_end);
    let in_churn: Vec<(Instant, f64)> = syncs[..during].to_vec();
    let gaps: Vec<f64> = in_churn
        .windows(2)
        .map(|w| (w[1].0 - w[0].0).as_secs_f64() * 1000.0)
        .collect();
    let mut took: Vec<f64> = in_churn.iter().map(|(_, ms)| *ms).collect();
    Ok(Churn {
        sent: total,
        sending,
        syncs: during,
        gap_p50: pct(&mut gaps.clone(), 0.50),
        gap_max: crate::peak(&gaps),
        sync_p50: pct(&mut took.clone(), 0.50),
        sync_p99: pct(&mut took, 0.99),
        rss_start,
        rss_max,
        rss_end,
        converged,
    })
}

/// `nft monitor` in a namespace of its own: it listens to every
/// namespace's commits as far as the kernel's cost goes (the kernel builds
/// an announcement for every element of every commit while it runs).
pub(crate) struct Monitor {
    _child: Process,
    _ns: Netns,
}

impl Monitor {
    pub(crate) fn start() -> Result<Monitor, String> {
        let ns = Netns::create(&format!("{}-mon", unique_prefix())).map_err(|e| e.0)?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "nft", "monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("nft monitor: {e}"))?;
        // It subscribes as it starts.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Monitor {
            _child: Process(child),
            _ns: ns,
        })
    }
}

/// A process group, killed whole when dropped.
pub(crate) struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

/// How the changes are made after the first sync.
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    /// `changes` changes, one at a time, each waited for.
    Latency { changes: usize },
    /// `rate` changes a second for `secs` seconds.
    Churn { rate: usize, secs: usize },
    /// `asks` traces and explains through the running daemon's API.
    Inspect { asks: usize },
    /// `flushes` foreign `nft flush ruleset`s, each repaired.
    Heal { flushes: usize },
    /// The readers probed through the cold start and `repairs` repairs.
    Readers { repairs: usize },
    /// `clients` slow clients on each admin port for `secs` seconds.
    SlowClients { clients: usize, secs: usize },
    /// `scrapes` whole scrapes of `/metrics`, one after another.
    Scrapes { scrapes: usize },
    /// The envelope: `changes` endpoint changes, `adds` Services added,
    /// `flushes` repairs, one restart, with the default flags.
    Envelope {
        changes: usize,
        adds: usize,
        flushes: usize,
    },
}

impl Mode {
    /// Whether verdict serves its admin ports in this mode.
    fn serves(self) -> bool {
        matches!(
            self,
            Mode::Inspect { .. }
                | Mode::Readers { .. }
                | Mode::SlowClients { .. }
                | Mode::Scrapes { .. }
                | Mode::Envelope { .. }
        )
    }
}

/// A foreign `nft flush ruleset`, and when verdict had repaired each
/// family.
fn flush_and_wait(ns: &Netns, log: &Log) -> Result<(Instant, Instant, Instant), String> {
    let (t, v4, v6, ()) = flush_then(ns, log, || Ok(()))?;
    Ok((t, v4, v6))
}

/// [`flush_and_wait`], with `after` run as soon as the flush is in (and
/// its result returned).
fn flush_then<T>(
    ns: &Netns,
    log: &Log,
    after: impl FnOnce() -> Result<T, String>,
) -> Result<(Instant, Instant, Instant, T), String> {
    let t = Instant::now();
    ns.exec("nft", &["flush", "ruleset"]).map_err(|e| e.0)?;
    let then = after()?;
    let within = Duration::from_secs(120);
    log.wait(&["another process changed verdict's tables"], within)?;
    let v4 = log.wait(&["\"synced\"", "family=\"ip\"", "full=true"], within)?;
    let v6 = log.wait(&["\"synced\"", "family=\"ip6\"", "full=true"], within)?;
    Ok((t, v4, v6, then))
}

pub(crate) struct Programs<'a> {
    /// Another process listens to nftables events meanwhile (`--listener`):
    /// the kernel then builds an announcement for every element of every
    /// commit, in any namespace.
    pub(crate) listener: bool,
    pub(crate) verdict: &'a Path,
    pub(crate) apiserver: &'a Path,
    pub(crate) log_to: Option<&'a Path>,
    pub(crate) under: &'a [&'a str],
    /// More flags for verdict (`--verdict-flags`).
    pub(crate) extra: &'a [&'a str],
    pub(crate) min_sync_period: &'a str,
}

/// Starts verdict in `ns` on `source_args` (its admin ports served if
/// `serves`), its log lines on a channel (and in `log_to`, stamped from
/// `started`): the process, its group, the log and its pid.
pub(crate) fn spawn_verdict(
    ns: &Netns,
    p: &Programs,
    source_args: &[String],
    serves: bool,
    log_to: Option<&Path>,
    started: Instant,
) -> Result<(Process, Group, Log, u32), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(p.under)
        .arg(p.verdict)
        .args(source_args)
        .args(p.extra)
        .args([
            "--hostname-override",
            "bench-node",
            "--cluster-cidr",
            "10.0.0.0/8",
        ])
        .args([
            "--min-sync-period",
            p.min_sync_period,
            // Each sync's summary, which the times are read from.
            "-v=2",
            "--healthz-bind-address",
            if serves { HEALTH } else { "" },
            "--metrics-bind-address",
            if serves { METRICS } else { "" },
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // A group of its own, ended whole: a profiler it runs under
        // (`--under`) must not leave verdict running when it is killed.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting verdict: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let pid = child.id();
    let daemon = Process(child);
    let group = Group(pid);
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
    Ok((daemon, group, Log { rx }, pid))
}

pub(crate) fn run_one(
    source: Source,
    shape: Shape,
    mode: Mode,
    p: &Programs,
) -> Result<Row, String> {
    let Shape {
        n,
        slice_size,
        proto,
        ..
    } = shape;
    let mut eps = Endpoints::new(shape);
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
                &p.apiserver.to_string_lossy(),
                "127.0.0.1:16443",
                Duration::from_secs(60),
            )
            .map_err(|e| e.0)?;
            api.apply(node)?;
            for i in 0..n {
                api.apply(service(i, proto))?;
                for s in slices(i, &eps.of(i), slice_size, 8080, proto) {
                    api.apply(s)?;
                }
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
                objects.extend(slices(i, &eps.of(i), slice_size, 8080, proto));
            }
            let write = |name: &str, objects: &[Value]| {
                let p = manifests.join(name);
                std::fs::write(&p, yaml(objects)).map_err(|e| format!("{}: {e}", p.display()))?;
                Ok::<_, String>(p)
            };
            write("cluster.yaml", &objects)?;
            // One more Service, which the changes edit.
            let mut more = vec![service(n, proto)];
            more.extend(slices(n, &eps.of(n), slice_size, 8080, proto));
            let small = write("small.yaml", &more)?;
            (
                Feed::Files { small },
                vec!["--manifests".to_string(), manifests.display().to_string()],
            )
        }
    };
    let count = source.services(n);
    let prepared = t.elapsed();
    let _listener = if p.listener {
        Some(Monitor::start()?)
    } else {
        None
    };
    // The readers are probed from before verdict starts: the cold start's
    // window opens at the first answer.
    // The floor, a server of the benchmark's own beside them, is probed
    // the same way.
    let floor = match mode {
        Mode::Readers { .. } => Some(Floor::start(ns.name())?),
        _ => None,
    };
    let prober = match &floor {
        Some(floor) => Some(Prober::start(
            ns.name(),
            &[
                (addr(HEALTH)?, "/livez"),
                (addr(HEALTH)?, "/healthz"),
                (addr(METRICS)?, "/api/v1/services?limit=10"),
                (floor.addr, "/"),
            ],
            PROBE_EVERY,
        )),
        None => None,
    };
    // The envelope's client, connecting to the last Service from before
    // verdict starts.
    let mut answer = match mode {
        Mode::Envelope { .. } => Some(crate::envelope::AnswerProbe::start(
            &ns,
            n - 1,
            &eps.of(n - 1),
            8080,
            Duration::from_secs(600),
        )?),
        _ => None,
    };
    let started = Instant::now();
    let (mut daemon, group, log, pid) =
        spawn_verdict(&ns, p, &source_args, mode.serves(), p.log_to, started)?;
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
    if !kernel_matches(&ns, &eps, count)? {
        return Err(
            "after the first sync, the kernel does not hold every service's endpoints".into(),
        );
    }

    let changes = match mode {
        Mode::Latency { changes } => {
            let mut times = Vec::new();
            let mut after = Vec::new();
            for c in 0..changes {
                let i = feed.target(c, n);
                let s = eps.replace(i, c);
                let t = Instant::now();
                feed.change(i, s, &eps)?;
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
            if !kernel_matches(&ns, &eps, count)? {
                return Err(
                    "after the changes, the kernel does not hold every service's current endpoints"
                        .into(),
                );
            }
            Changes::Latency {
                p50: pct(&mut times.clone(), 0.50),
                p99: pct(&mut times, 0.99),
                after_p50: pct(&mut after.clone(), 0.50),
                after_max: crate::peak(&after),
            }
        }
        Mode::Churn { rate, secs } => Changes::Churn(churn(
            &mut feed, &mut eps, &log, &ns, pid, rate, secs, count,
        )?),
        Mode::Inspect { asks } => {
            Changes::Inspect(inspect(&ns, p.verdict, &eps, pid, asks, count)?)
        }
        Mode::Readers { repairs } => {
            let both_at = started + both;
            let mut windows = Vec::new();
            for _ in 0..repairs {
                // Repairs closer than a second apart back off.
                std::thread::sleep(Duration::from_secs(2));
                let (t, v4, v6) = flush_and_wait(&ns, &log)?;
                windows.push((t, v4.max(v6)));
                if !kernel_matches(&ns, &eps, count)? {
                    return Err(
                        "after a repair, the kernel does not hold every service's endpoints".into(),
                    );
                }
            }
            let samples = prober.ok_or("no prober")?.finish();
            let from = first_answer(&samples[0]).ok_or("/livez never answered")?;
            let cold: Vec<Summary> = samples
                .iter()
                .map(|s| summarize(s, from, both_at))
                .collect();
            let repair: Vec<Summary> = samples
                .iter()
                .map(|s| {
                    let within: Vec<crate::readers::Sample> = windows
                        .iter()
                        .flat_map(|(a, b)| s.iter().filter(|x| x.at >= *a && x.at <= *b).copied())
                        .collect();
                    let (a, b) = windows
                        .first()
                        .zip(windows.last())
                        .map_or((from, from), |(f, l)| (f.0, l.1));
                    summarize(&within, a, b)
                })
                .collect();
            drop(floor);
            Changes::Readers(Box::new(Readers {
                cold: [cold[0], cold[1], cold[2], cold[3]],
                repair: [repair[0], repair[1], repair[2], repair[3]],
                repairs,
            }))
        }
        Mode::SlowClients { clients, secs } => {
            crate::readers::raise_open_files();
            let (health, metrics) = (addr(HEALTH)?, addr(METRICS)?);
            let slow = SlowClients::start(
                ns.name(),
                &[health, metrics],
                clients,
                Duration::from_secs(3),
            );
            // Let them connect and start trickling.
            std::thread::sleep(Duration::from_secs(4));
            let scraper = Scraper::start(ns.name(), metrics);
            let probe = Prober::start(
                ns.name(),
                &[(health, "/livez"), (metrics, "/healthz")],
                PROBE_EVERY,
            );
            let from = Instant::now();
            std::thread::sleep(Duration::from_secs(secs as u64));
            let to = Instant::now();
            let samples = probe.finish();
            let (mut scrapes, scrape_bytes) = scraper.finish();
            let open = slow.open.load(std::sync::atomic::Ordering::Relaxed);
            let reopened = slow.reopened.load(std::sync::atomic::Ordering::Relaxed);
            drop(slow);
            Changes::Slow(Slow {
                clients,
                secs,
                livez: summarize(&samples[0], from, to),
                healthz: summarize(&samples[1], from, to),
                open,
                reopened,
                scrapes: scrapes.len(),
                scrape_p50: pct(&mut scrapes, 0.5),
                scrape_bytes,
            })
        }
        Mode::Scrapes { scrapes } => {
            // Let the first reading of the counters and the sync settle.
            std::thread::sleep(Duration::from_secs(3));
            let metrics = addr(METRICS)?;
            let peak_before = status_mib(pid, "VmHWM:");
            let (mut took, mut series, mut bytes) = (Vec::new(), 0, 0);
            for _ in 0..scrapes {
                let t = Instant::now();
                let body = crate::readers::get_body(ns.name(), metrics, "/metrics")?;
                took.push(t.elapsed().as_secs_f64() * 1000.0);
                series = body
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .count();
                bytes = body.len();
            }
            Changes::Scrapes(Scrapes {
                series,
                bytes,
                p50_ms: pct(&mut took.clone(), 0.5),
                max_ms: crate::peak(&took),
                peak_before,
                peak_after: status_mib(pid, "VmHWM:"),
                rss_after: rss_now(pid),
            })
        }
        Mode::Envelope {
            changes,
            adds,
            flushes,
        } => {
            let answered = answer.take().ok_or("no answer probe")?.answered()? - started;
            let (mut change, mut change_path) = (Vec::new(), Vec::new());
            for c in 0..changes {
                let i = feed.target(c, n);
                let s = eps.replace(i, c);
                let t = Instant::now();
                feed.change(i, s, &eps)?;
                let (at, took) = crate::envelope::next_sync(&log)?;
                change.push(took);
                change_path.push(at.saturating_duration_since(t).as_secs_f64() * 1000.0);
            }
            let (mut add, mut add_path) = (Vec::new(), Vec::new());
            for a in 0..adds {
                let t = Instant::now();
                feed.add(count, a + 1, &eps)?;
                let (at, took) = crate::envelope::next_sync(&log)?;
                add.push(took);
                add_path.push(at.saturating_duration_since(t).as_secs_f64() * 1000.0);
            }
            let total = count + adds;
            if !kernel_matches(&ns, &eps, total)? {
                return Err(
                    "after the changes and adds, the kernel does not hold every service's endpoints"
                        .into(),
                );
            }
            let mut reads = Vec::new();
            for _ in 0..3 {
                reads.push(crate::envelope::read_back(&ns, addr(METRICS)?)?);
            }
            let (mut repairs, mut back) = (Vec::new(), Vec::new());
            for _ in 0..flushes {
                // Repairs closer than a second apart back off.
                std::thread::sleep(Duration::from_secs(2));
                // The last Service stops answering with the flush, and
                // answers again once the repair's commit is live.
                let (t, v4, _, probe) = flush_then(&ns, &log, || {
                    crate::envelope::AnswerProbe::again(&ns, n - 1, 8080, Duration::from_secs(120))
                })?;
                let answered = probe.answered()?;
                back.push(answered.saturating_duration_since(t).as_secs_f64() * 1000.0);
                repairs.push(v4.saturating_duration_since(t).as_secs_f64() * 1000.0);
                if !kernel_matches(&ns, &eps, total)? {
                    return Err(
                        "after a repair, the kernel does not hold every service's endpoints".into(),
                    );
                }
            }
            let peak_rss = status_mib(pid, "VmHWM:");
            // A restart on the rules in place.
            Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .map_err(|e| format!("kill: {e}"))?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while daemon.0.try_wait().map_err(|e| e.to_string())?.is_none() {
                if Instant::now() > deadline {
                    return Err("verdict did not stop within 60 s of SIGTERM".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let again = Instant::now();
            let restart_log = p.log_to.map(|l| l.with_extension("restart.log"));
            let (second, second_group, log2, _) =
                spawn_verdict(&ns, p, &source_args, true, restart_log.as_deref(), again)?;
            let (at, line) = log2.wait_line(
                &["\"synced\"", "family=\"ip\"", "full=true"],
                Duration::from_secs(600),
            )?;
            if !kernel_matches(&ns, &eps, total)? {
                return Err(
                    "after the restart, the kernel does not hold every service's endpoints".into(),
                );
            }
            drop(second_group);
            drop(second);
            let (change_p50, change_p99) = crate::envelope::p50_p99(&change);
            let (add_p50, add_p99) = crate::envelope::p50_p99(&add);
            Changes::Envelope(Box::new(crate::envelope::Envelope {
                answered,
                change_p50,
                change_p99,
                change_path_p99: crate::envelope::p50_p99(&change_path).1,
                add_p50,
                add_p99,
                add_path_p99: crate::envelope::p50_p99(&add_path).1,
                read_back: pct(&mut reads, 0.5),
                answers_again_p50: pct(&mut back.clone(), 0.5),
                answers_again_max: crate::peak(&back),
                repair_p50: pct(&mut repairs.clone(), 0.5),
                repair_max: crate::peak(&repairs),
                peak_rss,
                adopt: at.saturating_duration_since(again),
                adopt_ops: crate::envelope::operations(&line),
            }))
        }
        Mode::Heal { flushes } => {
            let (mut ip, mut both) = (Vec::new(), Vec::new());
            for _ in 0..flushes {
                // Repairs closer than a second apart back off.
                std::thread::sleep(Duration::from_secs(2));
                let (t, v4, v6) = flush_and_wait(&ns, &log)?;
                ip.push(v4.saturating_duration_since(t).as_secs_f64() * 1000.0);
                both.push(v4.max(v6).saturating_duration_since(t).as_secs_f64() * 1000.0);
                if !kernel_matches(&ns, &eps, count)? {
                    return Err(
                        "after a repair, the kernel does not hold every service's endpoints".into(),
                    );
                }
            }
            Changes::Heal {
                ip_p50: pct(&mut ip.clone(), 0.5),
                ip_max: crate::peak(&ip),
                both_p50: pct(&mut both.clone(), 0.5),
                both_max: crate::peak(&both),
            }
        }
    };
    let (_, rss) = usage(pid);
    drop(group);
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
        changes,
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
    let num = |name: &str, default: usize| num_flag(args, name, default);
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
    let slice_size = num("--slice-size", 100)?;
    if k == 0
        || k > 10_000
        || slice_size == 0
        || slice_size > 1000
        || changes == 0
        || changes > 1000
        || sizes
            .iter()
            .any(|n| *n == 0 || *n > 200_000 || n * k > 10_000_000)
    {
        return Err(format!(
            "sizes must be 1..=200000, --endpoints 1..=10000 (at most 10,000,000 in all), --slice-size 1..=1000, --changes 1..=1000\n{USAGE}"
        ));
    }
    let given: Vec<&str> = [
        "--churn",
        "--inspect",
        "--heal",
        "--readers",
        "--slow-clients",
        "--scrapes",
    ]
    .into_iter()
    .filter(|m| flag(args, m).is_some())
    .collect();
    let mode = match given.as_slice() {
        [] => Mode::Latency { changes },
        ["--churn"] => {
            let (rate, secs) = (num("--churn", 100)?, num("--duration", 60)?);
            if rate == 0 || rate > 1000 || secs == 0 || secs > 3600 {
                return Err(format!(
                    "--churn 1..=1000 a second, --duration 1..=3600 s\n{USAGE}"
                ));
            }
            Mode::Churn { rate, secs }
        }
        ["--inspect"] => {
            let asks = num("--inspect", 20)?;
            if asks == 0 || asks > 10_000 {
                return Err(format!("--inspect 1..=10000\n{USAGE}"));
            }
            Mode::Inspect { asks }
        }
        ["--heal"] => {
            let flushes = num("--heal", 10)?;
            if flushes == 0 || flushes > 1000 {
                return Err(format!("--heal 1..=1000\n{USAGE}"));
            }
            Mode::Heal { flushes }
        }
        ["--readers"] => {
            let repairs = num("--readers", 5)?;
            if repairs > 1000 {
                return Err(format!("--readers 0..=1000\n{USAGE}"));
            }
            Mode::Readers { repairs }
        }
        ["--slow-clients"] => {
            let (clients, secs) = (num("--slow-clients", 1000)?, num("--duration", 30)?);
            if clients == 0 || clients > 4000 || secs == 0 || secs > 3600 {
                return Err(format!(
                    "--slow-clients 1..=4000 per port, --duration 1..=3600 s\n{USAGE}"
                ));
            }
            Mode::SlowClients { clients, secs }
        }
        ["--scrapes"] => {
            let scrapes = num("--scrapes", 20)?;
            if scrapes == 0 || scrapes > 10_000 {
                return Err(format!("--scrapes 1..=10000\n{USAGE}"));
            }
            Mode::Scrapes { scrapes }
        }
        _ => {
            return Err(format!(
                "--churn, --inspect, --heal, --readers, --slow-clients or --scrapes, one of them\n{USAGE}"
            ));
        }
    };
    // kube-proxy's default, which churn is meant to be measured with; one
    // change at a time is measured without it.
    let min_sync_period = flag(args, "--min-sync-period").unwrap_or(match mode {
        Mode::Churn { .. } => "1s",
        _ => "0s",
    });
    // A profiler to run verdict under (its CPU and RSS columns are then
    // the wrapper's, not verdict's).
    let under: Vec<&str> =
        flag(args, "--under").map_or(Vec::new(), |u| u.split_whitespace().collect());
    // More of verdict's own flags (`--service-counters=false`, say).
    let extra: Vec<&str> =
        flag(args, "--verdict-flags").map_or(Vec::new(), |u| u.split_whitespace().collect());
    let verdict = sibling("verdict")?;
    let apiserver = sibling("verdict-e2e-apiserver")?;
    let listener = args.iter().any(|a| a == "--listener");
    let title_listener = if listener {
        ", another process listening to nftables events (`nft monitor`, in a namespace of its own)"
    } else {
        ", no other process listening to nftables events"
    };
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
    let slices_per = k.div_ceil(slice_size);
    match mode {
        Mode::Envelope { .. } => {
            return Err("the envelope is `verdict-bench envelope`".into());
        }
        Mode::Latency { changes } => {
            println!(
                "### The verdict program {title} (K = {k} endpoints in {slices_per} slice(s), {proto} services, {changes} changes, minSyncPeriod {min_sync_period}{title_listener})\n"
            );
            println!(
                "| services | {prepared} | {loaded} | first full sync (IPv4) | both families synced | CPU at first sync | peak RSS | {change} → synced p50 / p99 | work after that sync p50 / max | services programmed |"
            );
            println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        }
        Mode::Churn { rate, secs } => {
            println!(
                "### The verdict program {title} under churn: {rate} endpoint changes a second for {secs} s (K = {k} endpoints in {slices_per} slice(s), {proto} services, minSyncPeriod {min_sync_period}{title_listener})\n"
            );
            println!(
                "| services | {loaded} | first full sync (IPv4) | peak RSS at first sync | changes sent in | syncs during churn | gap between syncs p50 / max | sync p50 / p99 | RSS at start / most / end of churn | kernel exact after the last change | services programmed |"
            );
            println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        }
        Mode::Inspect { asks } => {
            println!(
                "### `verdict trace` and `verdict explain` against the verdict program {title}, {asks} of each (K = {k} endpoints in {slices_per} slice(s), {proto} services{title_listener})\n"
            );
            println!(
                "| services | first full sync (IPv4) | trace p50 / p99 | of which kernel reads p50 | explain p50 / p99 | of which kernel reads p50 | explain --full (whole table) | RSS before / after the asks |"
            );
            println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        }
        Mode::Readers { repairs } => {
            println!(
                "### The readers while the verdict program {title} syncs: /livez, /healthz and /api/v1/services?limit=10 every 50 ms through the cold start and {repairs} repairs of a foreign `nft flush ruleset` (K = {k} endpoints in {slices_per} slice(s), {proto} services{title_listener})\n"
            );
            println!(
                "| services | window | first full sync (IPv4) | /livez p50 / p99 / max | /healthz p50 / p99 / max | services list p50 / p99 / max | floor p50 / p99 / max | probes answered (2xx) |"
            );
            println!("|---:|---|---:|---:|---:|---:|---:|---:|");
        }
        Mode::SlowClients { clients, secs } => {
            println!(
                "### {clients} slow clients on each admin port of the verdict program {title} (one byte every 3 s, never a whole request), the whole /metrics scraped in a loop, /livez and the metrics port's /healthz probed every 50 ms for {secs} s (K = {k} endpoints in {slices_per} slice(s), {proto} services{title_listener})\n"
            );
            println!(
                "| services | /livez p50 / p99 / max | metrics port /healthz p50 / p99 / max | probes answered (2xx) | slow connections open at the end / closed by the server and opened again | whole scrapes, p50, size |"
            );
            println!("|---:|---:|---:|---:|---:|---:|");
        }
        Mode::Scrapes { scrapes } => {
            println!(
                "### {scrapes} whole scrapes of /metrics from the verdict program {title}, one after another, after the first full sync (K = {k} endpoints in {slices_per} slice(s), {proto} services{title_listener}; verdict's flags: {flags})\n",
                flags = if extra.is_empty() {
                    "the defaults".to_owned()
                } else {
                    extra.join(" ")
                },
            );
            println!(
                "| services | first full sync (IPv4) | series | bytes | scrape p50 / max | peak RSS before / after the scrapes | RSS after |"
            );
            println!("|---:|---:|---:|---:|---:|---:|---:|");
        }
        Mode::Heal { flushes } => {
            println!(
                "### Foreign `nft flush ruleset` repaired by the verdict program {title}, {flushes} flushes (K = {k} endpoints in {slices_per} slice(s), {proto} services{title_listener})\n"
            );
            println!(
                "| services | first full sync (IPv4) | flush → IPv4 table repaired p50 / max | flush → both families repaired p50 / max | peak RSS |"
            );
            println!("|---:|---:|---:|---:|---:|");
        }
    }
    let log_dir = crate::log_dir(args)?;
    for n in sizes {
        let log_to = log_dir.as_ref().map(|d| d.join(format!("verdict-{n}.log")));
        let shape = Shape {
            n,
            k,
            slice_size,
            proto,
        };
        let programs = Programs {
            listener,
            verdict: &verdict,
            apiserver: &apiserver,
            log_to: log_to.as_deref(),
            under: &under,
            extra: &extra,
            min_sync_period,
        };
        let r = run_one(source, shape, mode, &programs)?;
        match &r.changes {
            Changes::Latency {
                p50,
                p99,
                after_p50,
                after_max,
            } => println!(
                "| {} | {:.1} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.0} MiB | {:.1} / {:.1} ms | {:.3} / {:.3} ms | {} |",
                r.n,
                r.prepared.as_secs_f64(),
                r.loaded.as_secs_f64(),
                r.cold.as_secs_f64(),
                r.both.as_secs_f64(),
                r.cpu,
                r.rss,
                p50,
                p99,
                after_p50,
                after_max,
                r.programmed
            ),
            Changes::Churn(c) => println!(
                "| {} | {:.2} s | {:.2} s | {:.0} MiB | {} in {:.1} s | {} | {:.0} / {:.0} ms | {:.1} / {:.1} ms | {:.0} / {:.0} / {:.0} MiB | {:.2} s | {} |",
                r.n,
                r.loaded.as_secs_f64(),
                r.cold.as_secs_f64(),
                r.rss,
                c.sent,
                c.sending.as_secs_f64(),
                c.syncs,
                c.gap_p50,
                c.gap_max,
                c.sync_p50,
                c.sync_p99,
                c.rss_start,
                c.rss_max,
                c.rss_end,
                c.converged.as_secs_f64(),
                r.programmed
            ),
            Changes::Scrapes(x) => println!(
                "| {} | {:.2} s | {} | {} | {:.1} / {:.1} ms | {:.0} / {:.0} MiB | {:.0} MiB |",
                r.n,
                r.cold.as_secs_f64(),
                x.series,
                x.bytes,
                x.p50_ms,
                x.max_ms,
                x.peak_before,
                x.peak_after,
                x.rss_after,
            ),
            Changes::Envelope(_) => {
                return Err("the envelope is `verdict-bench envelope`".into());
            }
            Changes::Inspect(q) => println!(
                "| {} | {:.2} s | {:.1} / {:.1} ms | {:.2} ms | {:.1} / {:.1} ms | {:.2} ms | {:.0} ms | {:.0} / {:.0} MiB |",
                r.n,
                r.cold.as_secs_f64(),
                q.trace_p50,
                q.trace_p99,
                q.trace_read_p50,
                q.explain_p50,
                q.explain_p99,
                q.explain_read_p50,
                q.full,
                q.rss_before,
                q.rss_after,
            ),
            Changes::Readers(x) => {
                let Readers {
                    cold,
                    repair,
                    repairs,
                } = &**x;
                let cell =
                    |x: &Summary| format!("{:.1} / {:.1} / {:.1} ms", x.p50_ms, x.p99_ms, x.max_ms);
                let answered = |w: &[Summary; 4]| {
                    w[..3]
                        .iter()
                        .map(|x| format!("{}/{} ({})", x.answered, x.probes, x.ok))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                for (window, w) in [
                    ("cold start", cold),
                    (&*format!("{repairs} repairs"), repair),
                ] {
                    println!(
                        "| {} | {window} | {:.2} s | {} | {} | {} | {} | {} |",
                        r.n,
                        r.cold.as_secs_f64(),
                        cell(&w[0]),
                        cell(&w[1]),
                        cell(&w[2]),
                        cell(&w[3]),
                        answered(w),
                    );
                }
            }
            Changes::Slow(x) => {
                let cell =
                    |s: &Summary| format!("{:.1} / {:.1} / {:.1} ms", s.p50_ms, s.p99_ms, s.max_ms);
                println!(
                    "| {} | {} | {} | {}/{} ({}), {}/{} ({}) | {} of {} / {} | {} in {} s, {:.0} ms, {:.1} MB |",
                    r.n,
                    cell(&x.livez),
                    cell(&x.healthz),
                    x.livez.answered,
                    x.livez.probes,
                    x.livez.ok,
                    x.healthz.answered,
                    x.healthz.probes,
                    x.healthz.ok,
                    x.open,
                    2 * x.clients,
                    x.reopened,
                    x.scrapes,
                    x.secs,
                    x.scrape_p50,
                    x.scrape_bytes as f64 / 1e6,
                );
            }
            Changes::Heal {
                ip_p50,
                ip_max,
                both_p50,
                both_max,
            } => println!(
                "| {} | {:.2} s | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.0} MiB |",
                r.n,
                r.cold.as_secs_f64(),
                ip_p50,
                ip_max,
                both_p50,
                both_max,
                r.rss,
            ),
        }
        let expected = source.services(r.n);
        if r.programmed != expected {
            return Err(format!(
                "{} services were programmed, not {expected}",
                r.programmed
            ));
        }
    }
    match mode {
        Mode::Envelope { .. } => {}
        Mode::Latency { .. } => println!(
            "\nTimes from verdict's start (load, first syncs) and from the API server accepting a change \
             or the small file being written (to the partial sync's log line); CPU and peak RSS of the \
             verdict process. Each change replaces one endpoint; the kernel's endpoint map is checked \
             against every service's endpoints after the first sync and after the changes."
        ),
        Mode::Churn { .. } => println!(
            "\nEach change replaces one endpoint of a service (through the API server: a different \
             service each time; manifests: the small file's service, the file rewritten). Changes are \
             sent on time and not waited for; the syncs are verdict's IPv4 ones while they came. \
             \"Kernel exact\": from the last change to the kernel's endpoint map holding every \
             service's current endpoints and nothing else, read with `nft list map`."
        ),
        Mode::Inspect { .. } => println!(
            "\nEach ask runs the verdict command (`trace --from pod … -o json`, `explain bench/svcI \
             -o json`) against the daemon's metrics address, a different service each time; its time is \
             the whole command's, process start included. The daemon reads the kernel's table without \
             its elements, then looks up only the elements the packet meets or the Service owns; \
             \"kernel reads\" is that part of its answer. Every trace must reach exactly the \
             service's endpoints, every explain must find no drift."
        ),
        Mode::Heal { .. } => println!(
            "\nEach flush is `nft flush ruleset` in verdict's namespace, 2 s after the last repair \
             (closer ones back off); the time runs from just before it to verdict's log line of each \
             family's full sync, which includes its 100 ms wait for the announcements to go quiet. \
             After each repair the kernel's endpoint map must hold every service's endpoints."
        ),
        Mode::Readers { .. } => println!(
            "\nThree probes, each on a thread of its own inside verdict's namespace, one request every \
             50 ms over a new connection: /livez and /healthz on the health port, and \
             /api/v1/services?limit=10 on the metrics port; and the floor, a minimal HTTP server of the \
             benchmark's own in the same namespace (the same machine and loopback path, none of verdict's \
             code: what it sees is the machine's share). The cold start's window runs from the first \
             /livez answer (the servers up, before the first sync) to both families' first full sync; a \
             repair's from just before `nft flush ruleset` to both families repaired. An unanswered probe \
             counts as its 10 s timeout; \"answered\" counts any status, \"2xx\" the healthy ones \
             (/healthz is 503 while a family's rules are missing beyond the repair window)."
        ),
        Mode::SlowClients { .. } => println!(
            "\nThe slow clients each open a connection and send one byte of a request every 3 s, never \
             the whole header; a connection the server closes (its 10 s header timeout) is opened again \
             at once. Meanwhile a loop scrapes the whole /metrics (with the flags given, e.g. --service-metrics) and \
             two probes ask /livez (health port) and /healthz (metrics port) every 50 ms over a new \
             connection each."
        ),
        Mode::Scrapes { .. } => println!(
            "\nEach scrape is a GET of the whole /metrics over a new connection from inside verdict's \
             namespace, 3 s after both families' first full sync; a scrape reads the kernel's counters \
             at most every 5 s, so the first of a series of scrapes reads them and the others are \
             served from that reading. \"series\" counts the samples of the last scrape; the peak RSS \
             is VmHWM, which the cold sync sets before any scrape."
        ),
    }
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
