//! `verdict-bench flows`: what the flow stream (`verdict run --flows`)
//! costs, on a node of N ClusterIP Services (2 endpoints each) from one
//! manifests file, with verdict's default flags otherwise:
//! - the cold start: start → the IPv4 table's first full sync, and →
//!   both, with the stream off and on, alternately, each process alone
//!   (a second verdict would listen to the first one's commits);
//! - connect time: two nodes side by side, one with the stream off, one
//!   with it on and `verdict flows --follow` attached; new TCP connections
//!   to their Services, one to each node in turn (the order alternating),
//!   timed from `connect` to the handshake's end;
//! - a burst: RATE new connections a second for SECS seconds to each node
//!   in turn: the connections that failed, verdict's RSS (idle before,
//!   peak during), the flows recorded, evicted and not recorded (the
//!   kernel's buffer overflowed), and `/livez` probed every 50 ms.
//!
//! The Services' endpoints are addresses of each node's loopback, with a
//! listener of the benchmark's own on their port: the connections are
//! real, DNATed by verdict's rules, and tracked by conntrack (whose events
//! the stream reads). Each row says whether another process listened to
//! nftables events meanwhile (`nft monitor` in a namespace of its own).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use verdict_e2e::netns::{Netns, Process, can_run, unique_prefix};

use crate::daemon::{Group, HEALTH, Log, METRICS, Monitor, Programs};
use crate::readers::{Prober, summarize};
use crate::workload::service_ip;
use crate::{flag, num_flag, pct};

const USAGE: &str = "usage: verdict-bench flows [--services 30000] [--samples 5000] [--rate 5000] [--duration 30] [--cold-runs 3] [--listener absent,present] [--control] [--log DIR] [--out FILE]";

/// Seconds between processes of the cold runs, for the kernel to tear the
/// last namespace down (see the envelope).
const PAUSE: Duration = Duration::from_secs(10);
/// Services with real listeners behind them, spread over the N.
pub(crate) const TARGETS: usize = 64;
/// The endpoints' port.
const TARGET_PORT: u16 = 8080;
/// Threads that open the burst's connections (each waits up to 1 s for
/// its handshake, `probe::connect_once`).
pub(crate) const WORKERS: usize = 8;

/// `verdict-bench flows …`
pub fn flows(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| {
        num_flag(args, name, default).map_err(|e| format!("{e}\n{USAGE}"))
    };
    let n = num("--services", 30_000)?;
    let samples = num("--samples", 5000)?;
    let rate = num("--rate", 5000)?;
    let secs = num("--duration", 30)?;
    let cold_runs = num("--cold-runs", 3)?;
    // Both nodes with the stream off: what the harness's own asymmetry is.
    let control = args.iter().any(|a| a == "--control");
    if n < TARGETS || samples == 0 || rate == 0 || secs == 0 || cold_runs == 0 {
        return Err(format!(
            "--services at least {TARGETS}; --samples, --rate, --duration and --cold-runs at least 1\n{USAGE}"
        ));
    }
    let listeners = crate::listeners(args).map_err(|e| format!("{e}\n{USAGE}"))?;
    let verdict = crate::daemon::sibling("verdict")?;
    crate::readers::raise_open_files();

    let dir = std::env::temp_dir().join(format!("verdict-bench-flows-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    write_manifests(&manifests, n)?;
    let log_dir = crate::log_dir(args)?;

    let mut text = String::new();
    let mut say = |line: String| {
        println!("{line}");
        text.push_str(&line);
        text.push('\n');
    };
    say(format!(
        "### The flow stream's cost: {n} ClusterIP Services × 2 endpoints (manifests), verdict's default flags beside --flows or --flows=false\n"
    ));
    let mut cold_rows = Vec::new();
    let mut connect_rows = Vec::new();
    let mut burst_rows = Vec::new();
    for &listener in &listeners {
        let monitor = if listener {
            Some(Monitor::start()?)
        } else {
            None
        };
        let who = if listener { "present" } else { "absent" };
        let ctx = Ctx {
            verdict: &verdict,
            manifests: &manifests,
            n,
            log_dir: log_dir.as_deref(),
            who,
        };

        // The cold start, each process alone.
        let mut cold: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
        for run in 0..cold_runs {
            for on in [false, true] {
                std::thread::sleep(PAUSE);
                let node = Node::start(&ctx, on, &format!("cold{run}"))?;
                cold[usize::from(on)].push((node.cold_v4, node.cold_both));
            }
        }
        // The median, and the spread around it.
        let cell = |v: &[(f64, f64)], second: bool| {
            let mut x: Vec<f64> = v.iter().map(|p| if second { p.1 } else { p.0 }).collect();
            let m = pct(&mut x, 0.5);
            (m, format!("{m:.2} s ({:.2}–{:.2})", x[0], x[x.len() - 1]))
        };
        let (off4, off4s) = cell(&cold[0], false);
        let (on4, on4s) = cell(&cold[1], false);
        let (off6, off6s) = cell(&cold[0], true);
        let (on6, on6s) = cell(&cold[1], true);
        cold_rows.push(format!(
            "| {who} | {off4s} | {on4s} | {:+.1} % | {off6s} | {on6s} | {:+.1} % |",
            delta(off4, on4),
            delta(off6, on6),
        ));

        // Side by side.
        std::thread::sleep(PAUSE);
        let off = Node::start(&ctx, false, "side")?;
        let on = Node::start(&ctx, !control, "side")?;
        let follower = if on.flows {
            Some(Follower::start(
                &on.ns,
                &verdict,
                &["flows", "--follow", "-o", "json", "--server", METRICS],
            )?)
        } else {
            None
        };
        std::thread::sleep(Duration::from_secs(2));
        let before = on.flows.then(|| stats(&on.ns)).transpose()?;
        let (t_off, t_on) = side_by_side(&off, &on, samples)?;
        std::thread::sleep(Duration::from_secs(1));
        let after = on.flows.then(|| stats(&on.ns)).transpose()?;
        let seen = follower.as_ref().map_or(0, Follower::seen);
        let recorded = match (&before, &after) {
            (Some(b), Some(a)) => a.forwarded - b.forwarded,
            _ => 0,
        };
        if on.flows && recorded < samples as u64 {
            return Err(format!(
                "the stream recorded {recorded} of the {samples} connections timed with it on"
            ));
        }
        let (p50_off, p50_on) = (pct(&mut t_off.clone(), 0.5), pct(&mut t_on.clone(), 0.5));
        connect_rows.push(format!(
            "| {who} | {:.1} µs | {:.1} µs | {:+.1} % | {:.1} / {:.1} µs | {:.1} / {:.1} µs | {recorded} | {seen} |",
            p50_off,
            p50_on,
            delta(p50_off, p50_on),
            pct(&mut t_off.clone(), 0.9),
            pct(&mut t_off.clone(), 0.99),
            pct(&mut t_on.clone(), 0.9),
            pct(&mut t_on.clone(), 0.99),
        ));

        // The burst, to each node in turn (the other idle meanwhile).
        for node in [&off, &on] {
            std::thread::sleep(Duration::from_secs(3));
            let b = burst(node, rate, secs, true)?;
            burst_rows.push(format!(
                "| {who} | {} | {} / {} ({:.0}/s) | {} | {:.0} MiB | {:.0} MiB | {:+.0} MiB | {} | {} | {} | {}/{} ok, max {:.0} ms |",
                if node.flows { "on, followed" } else { "off" },
                b.ok + b.failed,
                rate * secs,
                (b.ok + b.failed) as f64 / b.took.as_secs_f64(),
                b.failed,
                b.rss_idle,
                b.rss_peak,
                b.rss_peak - b.rss_idle,
                b.recorded.map_or("–".into(), |v| v.to_string()),
                b.evicted.map_or("–".into(), |v| v.to_string()),
                b.not_recorded.map_or("–".into(), |v| v.to_string()),
                b.livez.ok,
                b.livez.probes,
                b.livez.max_ms,
            ));
        }
        if let Some(f) = follower
            && f.seen() <= seen
        {
            return Err("the follower printed nothing during the burst".into());
        }
        drop((off, on, monitor));
    }
    say(format!(
        "Cold start, each process alone, {cold_runs} of each in turn: the median (lowest–highest) of start → the IPv4 table's first full sync, and → both tables:\n"
    ));
    say("| another nftables listener | IPv4, stream off | IPv4, stream on | Δ | both, off | both, on | Δ |".into());
    say("|---|---:|---:|---:|---:|---:|---:|".into());
    for r in &cold_rows {
        say(r.clone());
    }
    say(format!(
        "\nConnect time, {samples} new TCP connections to each of the two nodes side by side, in turn (the stream on with `verdict flows --follow` attached):\n"
    ));
    say("| another nftables listener | p50, stream off | p50, stream on | Δ | p90 / p99, off | p90 / p99, on | flows recorded | lines the follower printed |".into());
    say("|---|---:|---:|---:|---:|---:|---:|---:|".into());
    for r in &connect_rows {
        say(r.clone());
    }
    say(format!(
        "\nA burst of {rate} new connections a second for {secs} s to each node in turn, {WORKERS} client threads, each connection reset by the client once established; /livez every 50 ms meanwhile:\n"
    ));
    say("| another nftables listener | stream | connections (asked) | failed | RSS idle | RSS peak | peak − idle | flows recorded | evicted | not recorded | /livez |".into());
    say("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|".into());
    for r in &burst_rows {
        say(r.clone());
    }
    say("\nFailed: not established within 1 s. RSS from /proc (VmRSS), sampled every 100 ms; idle is the reading before the burst, after the connect-time run. Flows recorded, evicted and not recorded are the node's counts over the burst (/api/v1/flows). A follower reads at most 5,000 new flows a time, twice a second: where more came within half a second it printed fewer lines than were recorded.".into());
    if let Some(out) = flag(args, "--out") {
        std::fs::write(out, &text).map_err(|e| format!("{out}: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn delta(base: f64, x: f64) -> f64 {
    (x / base - 1.0) * 100.0
}

/// What every node of a run shares.
pub(crate) struct Ctx<'a> {
    pub(crate) verdict: &'a Path,
    pub(crate) manifests: &'a Path,
    pub(crate) n: usize,
    pub(crate) log_dir: Option<&'a Path>,
    pub(crate) who: &'a str,
}

/// Service `i`'s endpoints.
fn endpoints_of(i: usize) -> [Ipv4Addr; 2] {
    let base = 0x0a00_0000u32 + (i * 2) as u32 + 1;
    [Ipv4Addr::from(base), Ipv4Addr::from(base + 1)]
}

/// The Services that have listeners behind them.
fn targets(n: usize) -> Vec<usize> {
    (0..TARGETS).map(|j| j * n / TARGETS).collect()
}

pub(crate) fn write_manifests(dir: &Path, n: usize) -> Result<(), String> {
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "bench-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}})];
    for i in 0..n {
        let ip = service_ip(30, i).to_string();
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc{i}"), "namespace": "bench"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        }));
        let eps: Vec<Value> = endpoints_of(i)
            .iter()
            .enumerate()
            .map(|(j, ip)| {
                json!({"addresses": [ip.to_string()], "conditions": {"ready": true},
                       "nodeName": "bench-node",
                       "targetRef": {"kind": "Pod", "namespace": "bench", "name": format!("svc{i}-pod{j}")}})
            })
            .collect();
        objects.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("svc{i}-1"), "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": format!("svc{i}")}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
            "endpoints": eps
        }));
    }
    let p = dir.join("cluster.yaml");
    std::fs::write(&p, crate::daemon::yaml(&objects)).map_err(|e| format!("{}: {e}", p.display()))
}

/// A node: its namespace, the listener behind the target Services, and
/// verdict running on the manifests, synced.
pub(crate) struct Node {
    n: usize,
    flows: bool,
    pub(crate) pid: u32,
    cold_v4: f64,
    cold_both: f64,
    // Dropped in this order: verdict, then the listener, then the
    // namespace.
    _group: Group,
    _daemon: Process,
    _log: Log,
    _acceptor: Acceptor,
    pub(crate) ns: Netns,
}

impl Node {
    pub(crate) fn start(ctx: &Ctx, flows: bool, tag: &str) -> Result<Node, String> {
        let extra: &[&str] = if flows {
            &["--flows"]
        } else {
            &["--flows=false"]
        };
        Node::start_with(ctx, extra, flows, tag)
    }

    /// A node with `extra` flags (`flows`: whether they leave the stream
    /// on).
    pub(crate) fn start_with(
        ctx: &Ctx,
        extra: &[&str],
        flows: bool,
        tag: &str,
    ) -> Result<Node, String> {
        let ns = Netns::create(&format!(
            "{}-{}",
            unique_prefix(),
            if flows { "on" } else { "off" }
        ))
        .map_err(|e| e.0)?;
        let eps: Vec<Ipv4Addr> = targets(ctx.n).into_iter().flat_map(endpoints_of).collect();
        crate::envelope::loopback_endpoints(&ns, &eps)?;
        let acceptor = Acceptor::start(&ns)?;
        let log_file = ctx.log_dir.map(|d| {
            d.join(format!(
                "flows-{}-{}-{tag}-{}.log",
                ctx.n,
                ctx.who,
                if flows { "on" } else { "off" }
            ))
        });
        let programs = Programs {
            listener: false,
            verdict: ctx.verdict,
            // Not used: the Services come from the manifests.
            apiserver: Path::new(""),
            log_to: log_file.as_deref(),
            under: &[],
            extra,
            // kube-proxy's default.
            min_sync_period: "1s",
        };
        let args = vec![
            "--manifests".to_string(),
            ctx.manifests.display().to_string(),
        ];
        let started = Instant::now();
        let (daemon, group, log, pid) = crate::daemon::spawn_verdict(
            &ns,
            &programs,
            &args,
            true,
            log_file.as_deref(),
            started,
        )?;
        let limit = Duration::from_secs(300);
        let v4 = log.wait(&["\"synced\"", "family=\"ip\"", "full=true"], limit)? - started;
        let both = log.wait(&["\"synced\"", "family=\"ip6\"", "full=true"], limit)? - started;
        Ok(Node {
            n: ctx.n,
            flows,
            pid,
            cold_v4: v4.as_secs_f64(),
            cold_both: both.as_secs_f64(),
            _group: group,
            _daemon: daemon,
            _log: log,
            _acceptor: acceptor,
            ns,
        })
    }
}

/// Accepts and closes every connection to the endpoints' port.
struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    fn start(ns: &Netns) -> Result<Acceptor, String> {
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, name) = (stop.clone(), ns.name().to_owned());
        let thread = std::thread::spawn(move || {
            let listener = crate::enter_netns(&name).and_then(|()| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
                    .map_err(|e| e.to_string())?;
                s.set_reuse_address(true).map_err(|e| e.to_string())?;
                let at = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, TARGET_PORT);
                s.bind(&SockAddr::from(at))
                    .map_err(|e| format!("{at}: {e}"))?;
                s.listen(4096).map_err(|e| e.to_string())?;
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                Ok(s)
            });
            let listener = match listener {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        rx.recv().map_err(|_| "the acceptor died".to_owned())??;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A following client (`verdict flows --follow`, `hubble observe
/// --follow`) run in a node's namespace, its lines counted.
pub(crate) struct Follower {
    _child: Process,
    lines: Arc<AtomicUsize>,
}

impl Follower {
    /// `program args` in `ns`.
    pub(crate) fn start(ns: &Netns, program: &Path, args: &[&str]) -> Result<Follower, String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{} {}: {e}", program.display(), args.join(" ")))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let lines = Arc::new(AtomicUsize::new(0));
        let counted = lines.clone();
        std::thread::spawn(move || {
            for _ in BufReader::new(out).lines().map_while(Result::ok) {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Follower {
            _child: Process(child),
            lines,
        })
    }

    /// The lines it printed so far.
    pub(crate) fn seen(&self) -> usize {
        self.lines.load(Ordering::Relaxed)
    }
}

/// A node's flow counts.
pub(crate) struct Stats {
    pub(crate) forwarded: u64,
    pub(crate) evicted: u64,
    pub(crate) not_recorded: u64,
}

pub(crate) fn stats(ns: &Netns) -> Result<Stats, String> {
    let addr: SocketAddr = METRICS.parse().map_err(|e| format!("{METRICS}: {e}"))?;
    let body = crate::readers::get_body(ns.name(), addr, "/api/v1/flows?limit=1")?;
    let doc: Value =
        serde_json::from_str(&body).map_err(|e| format!("/api/v1/flows: {e}: {body}"))?;
    let num = |v: &Value| {
        v.as_u64()
            .ok_or_else(|| format!("/api/v1/flows: not a count: {body}"))
    };
    Ok(Stats {
        forwarded: doc["recorded"]["forwarded"].as_u64().unwrap_or(0),
        evicted: num(&doc["evicted"])?,
        not_recorded: num(&doc["not_recorded"])?,
    })
}

fn target_addr(i: usize) -> SocketAddr {
    SocketAddrV4::new(service_ip(30, i), 80).into()
}

/// `samples` connections to each node, in turn; their times in µs. One
/// thread makes them all, moving into the node's namespace before each
/// (outside the time taken): both nodes' connections run on the same
/// thread, with the same caches and the same scheduling. (With a client
/// thread per node, three runs with another nftables listener gave the
/// stream on -19 %, +1 % and +11 % at p50: the threads' placement, not the
/// stream.)
fn side_by_side(off: &Node, on: &Node, samples: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let open = |ns: &Netns| {
        std::fs::File::open(format!("/run/netns/{}", ns.name()))
            .map_err(|e| format!("{}: {e}", ns.name()))
    };
    let nets = [open(&off.ns)?, open(&on.ns)?];
    let to = targets(off.n);
    std::thread::spawn(move || {
        let mut times = [Vec::new(), Vec::new()];
        let mut failed = 0;
        for k in 0..samples + 100 {
            let addr = target_addr(to[k % to.len()]);
            // Alternate which node goes first.
            let order = if k % 2 == 0 { [0, 1] } else { [1, 0] };
            for node in order {
                nix::sched::setns(&nets[node], nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns: {e}"))?;
                match crate::probe::connect_once(addr) {
                    // The first 100 warm the caches.
                    Some(d) if k >= 100 => times[node].push(d.as_secs_f64() * 1e6),
                    Some(_) => {}
                    None => failed += 1,
                }
            }
        }
        if failed > 0 {
            return Err(format!("{failed} timed connections failed"));
        }
        let [t_off, t_on] = times;
        Ok((t_off, t_on))
    })
    .join()
    .map_err(|_| "the client thread panicked".to_owned())?
}

/// What a burst measured.
pub(crate) struct Burst {
    pub(crate) ok: usize,
    pub(crate) failed: usize,
    pub(crate) took: Duration,
    pub(crate) rss_idle: f64,
    pub(crate) rss_peak: f64,
    pub(crate) recorded: Option<u64>,
    pub(crate) evicted: Option<u64>,
    pub(crate) not_recorded: Option<u64>,
    pub(crate) livez: crate::readers::Summary,
}

/// RATE new connections a second for SECS seconds to `node`; with
/// `counts`, the node's flow counts read before and after (a read asks
/// for flows: the node follows connections from then on).
pub(crate) fn burst(node: &Node, rate: usize, secs: usize, counts: bool) -> Result<Burst, String> {
    let counts = counts && node.flows;
    let before = if counts { Some(stats(&node.ns)?) } else { None };
    let rss_idle = crate::daemon::rss_now(node.pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (stop.clone(), node.pid);
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
    let prober = Prober::start(
        node.ns.name(),
        &[(health, "/livez")],
        Duration::from_millis(50),
    );
    let to: Vec<SocketAddr> = targets(node.n).into_iter().map(target_addr).collect();
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let start = Instant::now() + Duration::from_millis(100);
    let total = rate * secs;
    let workers: Vec<JoinHandle<Result<(), String>>> = (0..WORKERS)
        .map(|w| {
            let (ok, failed, to, name) = (
                ok.clone(),
                failed.clone(),
                to.clone(),
                node.ns.name().to_owned(),
            );
            std::thread::spawn(move || {
                crate::enter_netns(&name)?;
                // Worker w opens connections w, w + WORKERS, …, each at its
                // time on the whole burst's schedule.
                let mut c = w;
                while c < total {
                    let due = start + Duration::from_secs_f64(c as f64 / rate as f64);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    match crate::probe::connect_once(to[c % to.len()]) {
                        Some(_) => ok.fetch_add(1, Ordering::Relaxed),
                        None => failed.fetch_add(1, Ordering::Relaxed),
                    };
                    c += WORKERS;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a client thread panicked")??;
    }
    let took = start.elapsed();
    let end = Instant::now();
    // The last ones' events, read.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let rss_peak = sampler.join().map_err(|_| "the RSS sampler panicked")?;
    let livez = summarize(&prober.finish()[0], start, end);
    let after = if counts { Some(stats(&node.ns)?) } else { None };
    let (recorded, evicted, not_recorded) = match (before, after) {
        (Some(b), Some(a)) => (
            Some(a.forwarded - b.forwarded),
            Some(a.evicted - b.evicted),
            Some(a.not_recorded - b.not_recorded),
        ),
        _ => (None, None, None),
    };
    Ok(Burst {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        took,
        rss_idle,
        rss_peak: rss_peak.max(rss_idle),
        recorded,
        evicted,
        not_recorded,
        livez,
    })
}
