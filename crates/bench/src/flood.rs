//! `verdict-bench flood`: what one client's flood of refused connections
//! does to the flow stream, the flow log and the node. verdict runs on a
//! manifests file (ten Services with endpoints, `shop/web` among them, and
//! `shop/empty` with none) with `--flow-log` capped; nine clients are
//! refused once each; then one client sends, for SECS seconds as fast as
//! it can, one UDP datagram from each new socket (a new connection each),
//! in turn to a port `shop/web` does not have and to `shop/empty`.
//!
//! It prints what was sent, what the kernel counted (rejects by reason,
//! refusals past the log rate limit), what the stream kept (the nine
//! refusals, the flood's aggregated records), how much the flow log grew
//! against its cap, verdict's RSS before, at its peak and after, and
//! `/livez` probed every 50 ms meanwhile. It fails if a refusal recorded
//! before the flood is no longer listed, or the flood has no aggregated
//! record.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::netns::{Netns, can_run, unique_prefix};

use crate::daemon::{HEALTH, METRICS, Monitor, Programs};
use crate::readers::{Prober, summarize};
use crate::{flag, num_flag};

const USAGE: &str = "usage: verdict-bench flood [--seconds 10] [--log-cap-mib 10] [--log-backups 1] [--no-fill] [--listener absent,present] [--log DIR] [--out FILE]";

/// The Services' ClusterIPs: 172.30.0.10 + i; `shop/web` is the first,
/// `shop/empty` the last.
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 30, 0, 10 + i as u8)
}
/// Services with endpoints.
const WITH_ENDPOINTS: usize = 10;
/// `shop/empty`'s port, UDP.
const EMPTY_PORT: u16 = 53;
/// A port `shop/web` does not have.
const WRONG_PORT: u16 = 9999;
/// The clients refused before the flood, 10.99.0.1 … 10.99.0.9.
const EARLY: u8 = 9;
/// The flooding client.
const FLOODER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 100);
/// The UDP Services the fill sends to.
const FILL_SERVICES: [&str; 2] = ["dns-a", "dns-b"];
fn fill_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 30, 1, 10 + i as u8)
}
/// The fill's clients: any address of 10.100.0.0/16 (a local route).
fn fill_client(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 100, (n / 250) as u8, (n % 250) as u8 + 1)
}
/// The fill: this many buckets of the aggregates (15 s each), each with
/// as many clients as fill an eighth of the default budget (32,768
/// entries) with the two Services: 8 × 2,048 × 2 = the whole budget, and
/// the ring (16,384) twice over.
const FILL_BUCKETS: usize = 8;
const FILL_CLIENTS: usize = 2048;

/// `verdict-bench flood …`
pub fn flood(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| {
        num_flag(args, name, default).map_err(|e| format!("{e}\n{USAGE}"))
    };
    let secs = num("--seconds", 10)?;
    let cap_mib = num("--log-cap-mib", 10)?;
    let backups = num("--log-backups", 1)?;
    if secs == 0 || cap_mib == 0 {
        return Err(format!("--seconds and --log-cap-mib at least 1\n{USAGE}"));
    }
    let listeners = crate::listeners(args).map_err(|e| format!("{e}\n{USAGE}"))?;
    let verdict = crate::daemon::sibling("verdict")?;
    let dir = std::env::temp_dir().join(format!("verdict-bench-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    write_manifests(&manifests)?;
    let log_dir = crate::log_dir(args)?;

    let mut text = String::new();
    let mut say = |line: String| {
        println!("{line}");
        text.push_str(&line);
        text.push('\n');
    };
    say(format!(
        "### One client's flood of refused connections: {secs} s, a new UDP socket per datagram, to a port shop/web does not have and to shop/empty (no endpoints); --flow-log capped at {cap_mib} MiB × {} files\n",
        backups + 1
    ));
    let mut rows = Vec::new();
    let mut fills = Vec::new();
    let fill_record = !args.iter().any(|a| a == "--no-fill");
    for &listener in &listeners {
        let monitor = listener.then(Monitor::start).transpose()?;
        let who = if listener { "present" } else { "absent" };
        let run = Run {
            verdict: &verdict,
            manifests: &manifests,
            dir: &dir,
            log_dir: log_dir.as_deref(),
            who,
            secs,
            cap_mib,
            backups,
            fill: fill_record && listener == listeners[0],
        };
        let m = run.measure()?;
        rows.push(m.row(who));
        if let Some(f) = &m.fill {
            fills.push(format!(
                "| {who} | {} of 16,384 | {} of {} | {} | {:.1} MiB | {:.1} MiB | {:+.1} MiB |",
                f.flows_kept,
                f.entries,
                f.budget,
                f.not_aggregated,
                f.rss_before,
                f.rss_after,
                f.rss_after - f.rss_before
            ));
        }
        drop(monitor);
    }
    say("| another nftables listener | datagrams sent (per s) | rejected: invalid_port / no_endpoints (kernel) | not logged (past the log rate) | refusals before, still listed | flood's aggregated records: connections | flows recorded / folded / evicted / lost (kernel buffer) | flow log growth (cap × files) | RSS before / peak / after | /livez |".into());
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|".into());
    for r in rows {
        say(r);
    }
    say("\nRejected: `verdict_rejected_total` over the flood, each connection once (a set full of 65,536 connections in 3 minutes counts past it per packet). Not logged: `verdict_flows_not_recorded_total{reason=\"log_rate_limit\"}`, refusals the kernel counted past its log rate limit (200 a second per reason and family, bursts of 400). The flood's aggregated records are those of the flooding client (`/api/v1/flows?aggregated=1`), one per destination, with the connections they count. RSS from /proc (VmRSS), sampled every 100 ms; after: 5 s after the flood. /livez every 50 ms from the flood's start to 2 s after its end.".into());
    if !fills.is_empty() {
        say(format!(
            "\nThe record filled, after the flood: {FILL_BUCKETS} buckets of 15 s, each with {FILL_CLIENTS} clients sending one UDP datagram to each of two Services (forwarded: not rate-limited), {} keys in all; RSS before and 5 s after:\n",
            FILL_BUCKETS * FILL_CLIENTS * FILL_SERVICES.len()
        ));
        say("| another nftables listener | flows in the ring | aggregated entries held | flows without room | RSS before | RSS after | Δ |".into());
        say("|---|---:|---:|---:|---:|---:|---:|".into());
        for f in fills {
            say(f);
        }
    }
    if let Some(out) = flag(args, "--out") {
        std::fs::write(out, &text).map_err(|e| format!("{out}: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn write_manifests(dir: &Path) -> Result<(), String> {
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "bench-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}})];
    for i in 0..=WITH_ENDPOINTS {
        let name = match i {
            0 => "web".to_owned(),
            WITH_ENDPOINTS => "empty".to_owned(),
            _ => format!("svc{i}"),
        };
        let ip = cluster_ip(i).to_string();
        let (port, protocol) = if i == WITH_ENDPOINTS {
            (EMPTY_PORT, "UDP")
        } else {
            (80, "TCP")
        };
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "p", "port": port, "protocol": protocol}]}
        }));
        if i == WITH_ENDPOINTS {
            continue;
        }
        objects.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [format!("10.1.0.{}", i + 1)], "conditions": {"ready": true},
                           "nodeName": "bench-node"}]
        }));
    }
    // Two UDP Services with endpoints, for the fill.
    for (i, name) in FILL_SERVICES.iter().enumerate() {
        let ip = fill_ip(i).to_string();
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}
        }));
        objects.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}],
            "endpoints": [{"addresses": [format!("10.1.0.{}", i + 1)], "conditions": {"ready": true},
                           "nodeName": "bench-node"}]
        }));
    }
    let p = dir.join("cluster.yaml");
    std::fs::write(&p, crate::daemon::yaml(&objects)).map_err(|e| format!("{}: {e}", p.display()))
}

struct Run<'a> {
    verdict: &'a Path,
    manifests: &'a Path,
    dir: &'a Path,
    log_dir: Option<&'a Path>,
    who: &'a str,
    secs: usize,
    cap_mib: usize,
    backups: usize,
    /// Also fill the record after the flood.
    fill: bool,
}

/// What one run measured.
struct Measured {
    sent: u64,
    secs: f64,
    invalid_port: f64,
    no_endpoints: f64,
    not_logged: f64,
    early_listed: usize,
    aggregated: Vec<(String, u64)>,
    recorded: u64,
    folded: u64,
    evicted: u64,
    lost: u64,
    log_growth: u64,
    log_cap: u64,
    rss: (f64, f64, f64),
    livez: crate::readers::Summary,
    fill: Option<Filled>,
}

impl Measured {
    fn row(&self, who: &str) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "| {who} | {} ({:.0}/s) | {:.0} / {:.0} | {:.0} | {}/{EARLY} | {} | {} / {} / {} / {} | {:.2} MiB ({:.0} MiB) | {:.1} / {:.1} / {:.1} MiB | {}/{} ok, p99 {:.1} ms, max {:.1} ms |",
            self.sent,
            self.sent as f64 / self.secs,
            self.invalid_port,
            self.no_endpoints,
            self.not_logged,
            self.early_listed,
            self.aggregated
                .iter()
                .map(|(d, n)| format!("{d}: {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.recorded,
            self.folded,
            self.evicted,
            self.lost,
            mib(self.log_growth),
            mib(self.log_cap),
            self.rss.0,
            self.rss.1,
            self.rss.2,
            self.livez.ok,
            self.livez.probes,
            self.livez.p99_ms,
            self.livez.max_ms,
        )
    }
}

/// The flow log's files: the log and its backups.
fn log_bytes(path: &Path, backups: usize) -> u64 {
    let mut total = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    for n in 1..=backups + 1 {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        total += std::fs::metadata(PathBuf::from(p))
            .map(|m| m.len())
            .unwrap_or(0);
    }
    total
}

fn get(ns: &Netns, path: &str) -> Result<Value, String> {
    let addr: SocketAddr = METRICS.parse().map_err(|e| format!("{METRICS}: {e}"))?;
    let body = crate::readers::get_body(ns.name(), addr, path)?;
    if path.starts_with("/metrics") {
        return Ok(Value::String(body));
    }
    serde_json::from_str(&body).map_err(|e| format!("{path}: {e}: {body}"))
}

/// A sample of `/metrics`.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn counters(ns: &Netns) -> Result<[f64; 3], String> {
    let m = get(ns, "/metrics")?;
    let m = m.as_str().unwrap_or_default();
    Ok([
        sample(
            m,
            "verdict_rejected_total{ip_family=\"IPv4\",reason=\"invalid_port\"}",
        ),
        sample(
            m,
            "verdict_rejected_total{ip_family=\"IPv4\",reason=\"no_endpoints\"}",
        ),
        sample(
            m,
            "verdict_flows_not_recorded_total{reason=\"log_rate_limit\"}",
        ),
    ])
}

/// Sends one datagram from each new socket bound to `src`, to each of
/// `to` in turn, until `stop`; the datagrams sent.
fn send_until(
    ns: &str,
    src: Ipv4Addr,
    to: &[SocketAddr],
    stop: &AtomicBool,
) -> Result<u64, String> {
    crate::enter_netns(ns)?;
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for dst in to {
            let s = UdpSocket::bind(SocketAddrV4::new(src, 0))
                .map_err(|e| format!("bind {src}: {e}"))?;
            // An ICMP error of an earlier datagram may fail this send: it
            // was sent all the same.
            let _ = s.send_to(b"x", dst);
            sent += 1;
        }
    }
    Ok(sent)
}

impl Run<'_> {
    fn measure(&self) -> Result<Measured, String> {
        let ns = Netns::create(&format!("{}-flood", unique_prefix())).map_err(|e| e.0)?;
        let eps: Vec<Ipv4Addr> = (0..WITH_ENDPOINTS)
            .map(|i| Ipv4Addr::new(10, 1, 0, i as u8 + 1))
            .collect();
        crate::envelope::loopback_endpoints(&ns, &eps)?;
        for c in (1..=EARLY)
            .map(|i| Ipv4Addr::new(10, 99, 0, i))
            .chain([FLOODER])
        {
            ns.exec("ip", &["addr", "add", &format!("{c}/32"), "dev", "lo"])
                .map_err(|e| format!("ip addr add {c}: {}", e.0))?;
        }
        let flow_log = self.dir.join(format!("flows-{}.jsonl", self.who));
        let _ = std::fs::remove_file(&flow_log);
        let cap = self.cap_mib.to_string();
        let backups = self.backups.to_string();
        let flow_log_s = flow_log.display().to_string();
        let extra: Vec<&str> = vec![
            "--flow-log",
            &flow_log_s,
            "--flow-log-max-size",
            &cap,
            "--flow-log-max-backups",
            &backups,
        ];
        let log_file = self
            .log_dir
            .map(|d| d.join(format!("flood-{}.log", self.who)));
        let programs = Programs {
            listener: false,
            verdict: self.verdict,
            apiserver: Path::new(""),
            log_to: log_file.as_deref(),
            under: &[],
            extra: &extra,
            min_sync_period: "1s",
        };
        let args = vec![
            "--manifests".to_string(),
            self.manifests.display().to_string(),
        ];
        let started = Instant::now();
        let (_daemon, _group, log, pid) = crate::daemon::spawn_verdict(
            &ns,
            &programs,
            &args,
            true,
            log_file.as_deref(),
            started,
        )?;
        log.wait(
            &["\"synced\"", "family=\"ip\"", "full=true"],
            Duration::from_secs(60),
        )?;
        std::thread::sleep(Duration::from_secs(1));

        // Nine clients refused once each.
        let empty = SocketAddr::from(SocketAddrV4::new(cluster_ip(WITH_ENDPOINTS), EMPTY_PORT));
        let wrong = SocketAddr::from(SocketAddrV4::new(cluster_ip(0), WRONG_PORT));
        {
            let name = ns.name().to_owned();
            std::thread::spawn(move || -> Result<(), String> {
                crate::enter_netns(&name)?;
                for i in 1..=EARLY {
                    let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, i), 0))
                        .map_err(|e| e.to_string())?;
                    let _ = s.send_to(b"x", empty);
                }
                Ok(())
            })
            .join()
            .map_err(|_| "the client thread panicked")??;
        }
        let early_listed = |ns: &Netns| -> Result<usize, String> {
            let doc = get(ns, "/api/v1/flows?verdict=rejected&limit=5000")?;
            let flows = doc["flows"].as_array().cloned().unwrap_or_default();
            Ok((1..=EARLY)
                .filter(|i| {
                    let c = format!("10.99.0.{i}:");
                    flows
                        .iter()
                        .any(|f| f["client"].as_str().is_some_and(|x| x.starts_with(&c)))
                })
                .count())
        };
        let t = Instant::now();
        while early_listed(&ns)? < usize::from(EARLY) {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "the {EARLY} refusals before the flood were not all recorded"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // Past the counters' cache, then the readings before.
        std::thread::sleep(Duration::from_secs(6));
        let before = counters(&ns)?;
        let flows_before = get(&ns, "/api/v1/flows?limit=1")?;
        let log_before = log_bytes(&flow_log, self.backups);
        let rss_before = crate::daemon::rss_now(pid);

        // The flood, with RSS sampled and /livez probed meanwhile.
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut peak: f64 = 0.0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(crate::daemon::rss_now(pid));
                    std::thread::sleep(Duration::from_millis(100));
                }
                peak
            })
        };
        let health: SocketAddr = HEALTH.parse().map_err(|e| format!("{HEALTH}: {e}"))?;
        let prober = Prober::start(ns.name(), &[(health, "/livez")], Duration::from_millis(50));
        let flooding = Arc::new(AtomicBool::new(false));
        let from = Instant::now();
        let sender = {
            let (name, flooding) = (ns.name().to_owned(), flooding.clone());
            std::thread::spawn(move || send_until(&name, FLOODER, &[wrong, empty], &flooding))
        };
        std::thread::sleep(Duration::from_secs(self.secs as u64));
        flooding.store(true, Ordering::Relaxed);
        let sent = sender
            .join()
            .map_err(|_| "the flooding thread panicked")??;
        let took = from.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        let livez = summarize(&prober.finish()[0], from, Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let rss_peak = sampler.join().map_err(|_| "the RSS sampler panicked")?;
        let rss_after = crate::daemon::rss_now(pid);
        // Past the counters' cache again.
        std::thread::sleep(Duration::from_secs(2));
        let after = counters(&ns)?;
        let flows_after = get(&ns, "/api/v1/flows?limit=1")?;
        let listed = early_listed(&ns)?;
        let agg = get(
            &ns,
            &format!("/api/v1/flows?aggregated=1&ip={FLOODER}&limit=100"),
        )?;
        let aggregated: Vec<(String, u64)> = agg["aggregates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|a| a["client"] == FLOODER.to_string())
            .map(|a| {
                (
                    a["destination"].as_str().unwrap_or("?").to_owned(),
                    a["connections"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        let log_after = log_bytes(&flow_log, self.backups);
        let fill = if self.fill {
            Some(fill(&ns, pid)?)
        } else {
            None
        };
        if std::env::var_os("VERDICT_BENCH_SHOW_CHAINS").is_some() {
            for chain in ["reject-invalid-port", "reject-chain"] {
                let listed = ns
                    .exec("nft", &["list", "chain", "ip", "verdict", chain])
                    .map_err(|e| e.0)?;
                println!("{listed}");
            }
            let m = get(&ns, "/metrics")?;
            for l in m.as_str().unwrap_or_default().lines() {
                if l.starts_with("verdict_flows") || l.starts_with("verdict_rejected") {
                    println!("{l}");
                }
            }
        }
        drop(log);
        if listed < usize::from(EARLY) {
            return Err(format!(
                "{listed} of the {EARLY} refusals recorded before the flood are still listed"
            ));
        }
        if aggregated.is_empty() {
            return Err(format!("the flood has no aggregated record: {agg}"));
        }
        let count = |doc: &Value, k: &str| doc[k].as_u64().unwrap_or(0);
        let recorded = |doc: &Value| -> u64 {
            doc["recorded"]
                .as_object()
                .map(|m| m.values().filter_map(Value::as_u64).sum())
                .unwrap_or(0)
        };
        Ok(Measured {
            sent,
            secs: took.as_secs_f64(),
            invalid_port: after[0] - before[0],
            no_endpoints: after[1] - before[1],
            not_logged: after[2] - before[2],
            early_listed: listed,
            aggregated,
            recorded: recorded(&flows_after) - recorded(&flows_before),
            folded: count(&flows_after, "folded") - count(&flows_before, "folded"),
            evicted: count(&flows_after, "evicted") - count(&flows_before, "evicted"),
            lost: count(&flows_after, "not_recorded") - count(&flows_before, "not_recorded"),
            log_growth: log_after.saturating_sub(log_before),
            log_cap: (self.cap_mib * 1024 * 1024 * (self.backups + 1)) as u64,
            rss: (rss_before, rss_peak.max(rss_before), rss_after),
            livez,
            fill,
        })
    }
}

/// What the record holds once full, and the RSS it took.
struct Filled {
    rss_before: f64,
    rss_after: f64,
    flows_kept: u64,
    entries: u64,
    budget: u64,
    not_aggregated: u64,
}

/// Fills the ring and the aggregates: FILL_BUCKETS buckets of
/// FILL_CLIENTS clients, each sending one datagram to each fill Service
/// (forwarded connections, recorded without a rate limit), one batch
/// early in each 15 s bucket.
fn fill(ns: &Netns, pid: u32) -> Result<Filled, String> {
    ns.exec(
        "ip",
        &["route", "add", "local", "10.100.0.0/16", "dev", "lo"],
    )
    .map_err(|e| format!("ip route add local: {}", e.0))?;
    let rss_before = crate::daemon::rss_now(pid);
    let to: Vec<SocketAddr> = (0..FILL_SERVICES.len())
        .map(|i| SocketAddr::from(SocketAddrV4::new(fill_ip(i), 53)))
        .collect();
    for b in 0..FILL_BUCKETS {
        // One second into the next bucket.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?;
        let into = now.as_secs_f64() % 15.0;
        std::thread::sleep(Duration::from_secs_f64(15.0 - into + 1.0));
        let (name, to) = (ns.name().to_owned(), to.clone());
        std::thread::spawn(move || -> Result<(), String> {
            crate::enter_netns(&name)?;
            for c in 0..FILL_CLIENTS {
                let src = fill_client(b * FILL_CLIENTS + c);
                let s = UdpSocket::bind(SocketAddrV4::new(src, 0))
                    .map_err(|e| format!("bind {src}: {e}"))?;
                for dst in &to {
                    let _ = s.send_to(b"x", dst);
                }
            }
            Ok(())
        })
        .join()
        .map_err(|_| "the fill thread panicked")??;
    }
    std::thread::sleep(Duration::from_secs(5));
    let rss_after = crate::daemon::rss_now(pid);
    let flows = get(ns, "/api/v1/flows?limit=1")?;
    let agg = get(ns, "/api/v1/flows?aggregated=1&limit=1")?;
    let n = |doc: &Value, k: &str| doc[k].as_u64().unwrap_or(0);
    let recorded: u64 = flows["recorded"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    Ok(Filled {
        rss_before,
        rss_after,
        flows_kept: recorded.min(n(&flows, "capacity")),
        entries: n(&agg, "entries"),
        budget: n(&agg, "budget"),
        not_aggregated: n(&agg, "not_recorded"),
    })
}
