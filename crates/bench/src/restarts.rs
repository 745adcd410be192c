//! `verdict-bench restarts`: restarts the real verdict program again and
//! again on N Services while clients keep connecting to them, and counts
//! the connections that were refused or failed. A restart that loses
//! nothing leaves both at 0.
//!
//! The namespaces are the benchmark's own ([`Topo`]): the clients connect
//! from `cli` to ClusterIPs routed to `node`, where verdict runs on a
//! manifests directory; every endpoint is a real listener behind the
//! node. Each round starts verdict, waits for its first IPv4 sync, edits
//! one Service's endpoints (so the next process adopts rules the last one
//! changed), lets it run a little, and stops it with SIGTERM, as a
//! DaemonSet rollout does; the next round starts at once.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use verdict_e2e::netns::can_run;

use crate::topo::{BACKENDS, NODE_IP, Topo};
use crate::workload::{BACKEND_PORT, SERVICE_PORT, service_ip};
use crate::{enter_netns, num_flag, pct};

const USAGE: &str = "usage: verdict-bench restarts [--services 1000] [--restarts 1000] [--clients 2] [--rate 500] [--hold-ms 300]";

/// What the clients saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// The first few failures: (when, target, error).
    samples: Mutex<Vec<String>>,
    /// The longest time between two successful connections of one client, µs.
    longest_gap_us: AtomicU64,
    /// Connections that took a second or more (a SYN sent again: the
    /// first was lost), and the first few of them.
    slow: AtomicU64,
    slow_samples: Mutex<Vec<String>>,
    /// When each slow connection began (seconds since the start).
    slow_at: Mutex<Vec<f64>>,
}

/// Service `i` and its slice: both backends, or the first one only.
fn one_service(i: usize, both: bool) -> String {
    let backends = if both { &BACKENDS[..] } else { &BACKENDS[..1] };
    let endpoints: String = backends
        .iter()
        .map(|a| format!("- {{addresses: [{a}], nodeName: bench-node}}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc{i}, namespace: bench}}\nspec:\n  clusterIP: {}\n  ports: [{{name: http, port: {SERVICE_PORT}, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc{i}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_PORT}, protocol: TCP}}]\nendpoints:\n{endpoints}---\n",
        service_ip(30, i)
    )
}

/// The Node and every Service but `alternate` (which is a file of its own,
/// the one the rounds edit).
fn cluster(n: usize, alternate: usize) -> String {
    let mut big = format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: bench-node}}\nstatus:\n  addresses: [{{type: InternalIP, address: {NODE_IP}}}]\n---\n"
    );
    for i in (0..n).filter(|i| *i != alternate) {
        big.push_str(&one_service(i, true));
    }
    big
}

fn write_atomically(path: &std::path::Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// One client: connects to the Services in turn until `stop`.
fn client(
    cli: String,
    n: usize,
    offset: usize,
    rate: u32,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    started: Instant,
) -> Result<(), String> {
    enter_netns(&cli)?;
    let mut last_ok = Instant::now();
    let mut i = offset;
    // Paced: unpaced, the backends' accept queues overflow now and then
    // (a SYN dropped, sent again a second later) with no restart at all.
    let every = Duration::from_secs(1) / rate.max(1);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        i = (i + 7919) % n;
        let target = SocketAddr::from((service_ip(30, i), SERVICE_PORT));
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| e.to_string())?;
        // A reset at close: no TIME_WAIT piling up, no port reuse issue.
        let _ = sock.set_linger(Some(Duration::ZERO));
        let began = Instant::now();
        match sock.connect_timeout(&SockAddr::from(target), Duration::from_secs(3)) {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                let took = began.elapsed();
                if took >= Duration::from_millis(900) {
                    tally.slow.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut at) = tally.slow_at.lock() {
                        at.push(began.duration_since(started).as_secs_f64());
                    }
                    if let Ok(mut s) = tally.slow_samples.lock()
                        && s.len() < 10
                    {
                        s.push(format!(
                            "{:.1} s: {target}: {} ms",
                            began.duration_since(started).as_secs_f64(),
                            took.as_millis()
                        ));
                    }
                }
                let gap = last_ok.elapsed().as_micros() as u64;
                tally.longest_gap_us.fetch_max(gap, Ordering::Relaxed);
                last_ok = Instant::now();
            }
            Err(e) => {
                let refused = e.kind() == std::io::ErrorKind::ConnectionRefused;
                if refused {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(mut s) = tally.samples.lock()
                    && s.len() < 10
                {
                    s.push(format!(
                        "{:.1} s: {target}: {e}",
                        started.elapsed().as_secs_f64()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// verdict in the node, its log lines on a channel.
fn spawn(
    node: &str,
    verdict: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(Child, Receiver<String>), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", node])
        .arg(verdict)
        .args(["run", "--manifests"])
        .arg(dir)
        .args([
            "--hostname-override",
            "bench-node",
            "--cluster-cidr",
            "10.200.0.0/16",
            "--min-sync-period",
            "0s",
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
            "-v",
            "2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", verdict.display()))?;
    let err = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx))
}

/// Waits for verdict's first IPv4 sync.
/// Waits for verdict's first IPv4 sync; returns its operations and how
/// long it took (ms), as its log line says.
fn synced(log: &Receiver<String>, within: Duration) -> Result<(usize, f64), String> {
    let deadline = Instant::now() + within;
    let mut last = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match log.recv_timeout(left) {
            Ok(l) if l.contains("\"synced\"") && l.contains("family=\"ip\"") => {
                let ops = l
                    .split("operations=")
                    .nth(1)
                    .and_then(|v| v.split(' ').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                return Ok((ops, crate::daemon::elapsed_ms(&l).unwrap_or(f64::NAN)));
            }
            Ok(l) => {
                last.push(l);
                if last.len() > 10 {
                    last.remove(0);
                }
            }
            Err(_) => {
                return Err(format!(
                    "no IPv4 sync within {within:?}; the last lines:\n{}",
                    last.join("\n")
                ));
            }
        }
    }
}

/// `verdict-bench restarts …`
pub fn restarts(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| {
        num_flag(args, name, default).map_err(|e| format!("{e}\n{USAGE}"))
    };
    let n = num("--services", 1000)?;
    let rounds = num("--restarts", 1000)?;
    let clients = num("--clients", 2)?;
    let hold = num("--hold-ms", 300)? as u64;
    let rate = num("--rate", 500)?.clamp(1, 100_000) as u32;
    if !(2..=60_000).contains(&n) || rounds == 0 || !(1..=16).contains(&clients) {
        return Err(format!(
            "--services 2..60000, --restarts ≥ 1, --clients 1..16\n{USAGE}"
        ));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let verdict = exe.with_file_name("verdict");
    if !verdict.exists() {
        return Err(format!(
            "{} is missing: build it first (cargo build --release -p verdict -p verdict-bench)",
            verdict.display()
        ));
    }
    let topo = Topo::new(&exe, &[BACKEND_PORT], false, false).map_err(|e| e.0)?;
    let dir = std::env::temp_dir().join(format!("verdict-bench-restarts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let alternate = n / 2;
    write_atomically(&dir.join("cluster.yaml"), &cluster(n, alternate))?;
    write_atomically(&dir.join("small.yaml"), &one_service(alternate, true))?;

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut starts_ms = Vec::with_capacity(rounds);
    // The first sync of each process after the first: what adopting the
    // rules the last one left cost (operations, and the sync's own time).
    let mut adoption_ops = Vec::with_capacity(rounds);
    let mut adoption_ms = Vec::with_capacity(rounds);
    // What happened when: (seconds since the start, what, round).
    let mut timeline: Vec<(f64, &'static str, usize)> = Vec::with_capacity(4 * rounds);
    let mut threads = Vec::new();
    let mut outcome = Ok(());
    for round in 0..rounds {
        let t = Instant::now();
        if round < 10 {
            eprintln!("restart {round} at {:.1} s", t0.elapsed().as_secs_f64());
        }
        timeline.push((t0.elapsed().as_secs_f64(), "started", round));
        let (mut child, log) = spawn(topo.node.name(), &verdict, &dir)?;
        let first = synced(&log, Duration::from_secs(120));
        timeline.push((t0.elapsed().as_secs_f64(), "synced", round));
        match first {
            Ok((ops, took)) => {
                if round > 0 {
                    adoption_ops.push(ops as f64);
                    adoption_ms.push(took);
                }
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                outcome = Err(format!("restart {round}: {e}"));
                break;
            }
        }
        starts_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if round == 0 {
            // The clients begin once the rules are there: a connection
            // sent before anything DNATs it is no restart's doing.
            for c in 0..clients {
                let (cli, stop, tally) = (topo.cli.name().to_owned(), stop.clone(), tally.clone());
                threads.push(std::thread::spawn(move || {
                    client(cli, n, c * 131, rate, stop, tally, t0)
                }));
            }
        }
        // An edit while it runs: the next process adopts what this one
        // changed (flushed chains, a changed dispatch).
        write_atomically(
            &dir.join("small.yaml"),
            &one_service(alternate, round % 2 != 0),
        )?;
        std::thread::sleep(Duration::from_millis(hold + 50 * (round as u64 % 5)));
        timeline.push((t0.elapsed().as_secs_f64(), "sent SIGTERM", round));
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        timeline.push((t0.elapsed().as_secs_f64(), "exited", round));
        drop(log);
        if (round + 1) % 100 == 0 {
            eprintln!(
                "{} restarts, {:.0} s: {} connections, {} refused, {} failed",
                round + 1,
                t0.elapsed().as_secs_f64(),
                tally.ok.load(Ordering::Relaxed),
                tally.refused.load(Ordering::Relaxed),
                tally.failed.load(Ordering::Relaxed)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome = outcome.and(Err(e)),
            Err(_) => outcome = outcome.and(Err("a client panicked".into())),
        }
    }
    // The last process's rules stay, as after any stop; the namespaces go.
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    let (ok, refused, failed) = (
        tally.ok.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
    );
    println!(
        "\nverdict restarted {rounds} times on {n} Services (SIGTERM, then a new process at once; one Service's endpoints edited each round), {clients} clients connecting throughout ({rate} a second each), {:.0} s\n",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "| services | restarts | connections | refused | failed | slow (≥ 0.9 s: a SYN sent again) | longest gap between connections | start → first sync p50 / p99 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {rounds} | {} | {refused} | {failed} | {} | {:.0} ms | {:.0} / {:.0} ms |",
        ok + refused + failed,
        tally.slow.load(Ordering::Relaxed),
        tally.longest_gap_us.load(Ordering::Relaxed) as f64 / 1e3,
        pct(&mut starts_ms.clone(), 0.5),
        pct(&mut starts_ms, 0.99)
    );
    if !adoption_ops.is_empty() {
        println!(
            "\nthe first sync after a restart (adopting the last process's rules, one Service's endpoints changed): {:.0} operations p50, {:.0} max; {:.1} ms p50, {:.1} ms p99",
            pct(&mut adoption_ops.clone(), 0.5),
            adoption_ops.iter().copied().fold(0.0, f64::max),
            pct(&mut adoption_ms.clone(), 0.5),
            pct(&mut adoption_ms, 0.99)
        );
    }
    if let Ok(s) = tally.samples.lock()
        && !s.is_empty()
    {
        println!("\nthe first failures:\n{}", s.join("\n"));
    }
    if let Ok(s) = tally.slow_samples.lock()
        && !s.is_empty()
    {
        println!("\nthe first slow connections:\n{}", s.join("\n"));
    }
    // Where in a restart each slow connection began.
    if let Ok(at) = tally.slow_at.lock() {
        for t in at.iter() {
            if let Some((when, what, round)) = timeline.iter().rev().find(|(w, _, _)| w <= t) {
                println!(
                    "a slow connection began {:.0} ms after restart {round} {what}",
                    (t - when) * 1e3
                );
            }
        }
    }
    Ok(())
}
