//! verdict's scale benchmark. For each size N it builds a scratch set of
//! network namespaces, drives N synthetic ClusterIP services with K
//! endpoints through the real proxier and `nft`, and measures:
//! - the cold full sync: wall and CPU time, peak memory of verdict and nft;
//! - one endpoint change, one service added, one service deleted: time from
//!   the change entering the proxier to the kernel having it (p50/p99);
//! - a sync with no change: operations sent and time;
//! - the data plane: TCP connect latency (p01/p50/p99) to a service early,
//!   in the middle and late in creation order, to a pod through the node,
//!   and to a pod through a rule-free node (the floor), interleaved.
//!
//! With `--iptables-baseline[=legacy|nft]` the same services are also
//! loaded the way kube-proxy's iptables mode writes them, on a third node,
//! and measured in the same run; with `--upstream-baseline` (up to
//! `--upstream-max`, 10,000 by default: its load grows with the square of
//! N), the way kube-proxy's nftables mode writes them, on a fourth.
//!
//! ```text
//! verdict-bench [--sizes 1000,5000,10000,30000] [--endpoints 2] [--samples 1000]
//!               [--changes 20] [--iptables-baseline[=legacy|nft]] [--iptables-max N]
//!               [--upstream-baseline] [--upstream-max N] [--out DIR]
//! ```
//! Needs root. Prints a Markdown table; with `--out` also writes it, the
//! raw figures and an SVG plot to DIR.

mod backends;
mod daemon;
mod envelope;
mod flood;
mod flows;
mod hubble;
mod pods;
mod probe;
mod readers;
mod report;
mod restarts;
mod topo;
mod workload;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use verdict_model::IpFamily;
use verdict_nft::NftCli;
use verdict_proxier::{LocalDetector, NodePortAddresses, Proxier, ProxierConfig};

use crate::workload::{SERVICE_PORT, endpoints, service, service_ip, slices};

/// The cluster CIDR of the data-plane runs: the pods' network, not the
/// client's (10.201.0.2), whose connections to ClusterIPs are then
/// masqueraded.
const CLUSTER: &str = "10.200.0.0/16";
/// A cluster CIDR that covers the client too, as a pod's connections.
const CLUSTER_WITH_CLIENT: &str = "10.200.0.0/15";

/// The groups of rules `--ablate` takes out of verdict's ruleset (a name,
/// and what a line of `nft list ruleset` holds to be taken out): nothing,
/// each group, then all of them.
pub(crate) const ABLATIONS: [(&str, &[&str]); 8] = [
    ("none", &[]),
    ("gates", &["@staged-"]),
    ("firewall", &["jump firewall-check"]),
    (
        "forward-checks",
        &["jump service-endpoints-check", "jump cluster-ips-check"],
    ),
    ("affinity", &["jump affinity-record"]),
    ("dnat-counter", &["connections sent to an endpoint"]),
    ("hairpin", &["@hairpin-connections masquerade"]),
    (
        "all",
        &[
            "@staged-",
            "jump firewall-check",
            "jump service-endpoints-check",
            "jump cluster-ips-check",
            "jump affinity-record",
            "connections sent to an endpoint",
            "@hairpin-connections masquerade",
        ],
    ),
];

/// The rulesets of the anchor passes (label, `nft -f` text), loaded on
/// verdict's node after its own passes.
const ANCHORS: [(&str, &str); 2] = [
    (
        "ct",
        "table ip anchor {\n  chain forward-check { type filter hook forward priority 0; ct state new counter; }\n}\n",
    ),
    (
        "nat",
        "table ip anchor {\n  chain forward-check { type filter hook forward priority 0; ct state new counter; }\n  chain prerouting-nat { type nat hook prerouting priority -100; }\n  chain postrouting-nat { type nat hook postrouting priority 100; }\n}\n",
    ),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("serve") => probe::serve(&args[1..]),
        Some("probe") => probe::probe(&args[1..]),
        Some("one") => one(&args[1..]),
        Some("daemon") => daemon::daemon(&args[1..]),
        Some("restarts") => restarts::restarts(&args[1..]),
        Some("envelope") => envelope::envelope(&args[1..]),
        Some("flows") => flows::flows(&args[1..]),
        Some("flood") => flood::flood(&args[1..]),
        Some("hubble") => hubble::hubble(&args[1..]),
        Some("pods") => pods::pods(&args[1..]),
        Some("backends") => backends::backends(&args[1..]),
        Some("backend-one") => backends::backend_one(&args[1..]),
        _ => orchestrate(&args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verdict-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Benchmark options.
#[derive(Clone, Debug)]
pub struct Options {
    sizes: Vec<usize>,
    endpoints: usize,
    samples: usize,
    changes: usize,
    baseline: Option<String>,
    baseline_max: usize,
    /// Also load kube-proxy's own nftables layout, up to this size.
    upstream_max: Option<usize>,
    /// Also probe verdict's ruleset with groups of its rules taken out.
    ablate: bool,
    out: Option<PathBuf>,
}

/// `--log DIR`, made if it is missing: a run must not fail at its first
/// log after minutes of setup because the directory was not there.
fn log_dir(args: &[String]) -> Result<Option<PathBuf>, String> {
    let Some(d) = flag(args, "--log") else {
        return Ok(None);
    };
    std::fs::create_dir_all(d).map_err(|e| format!("--log {d}: {e}"))?;
    Ok(Some(PathBuf::from(d)))
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&format!("{name}="))
        }
    })
}

/// A whole-number flag's value, or `default` when it is not given.
fn num_flag(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    flag(args, name).map_or(Ok(default), |v| {
        v.parse().map_err(|e| format!("{name} {v}: {e}"))
    })
}

/// `--listener absent,present` (both by default): whether another process
/// listens to nftables events, for each run.
fn listeners(args: &[String]) -> Result<Vec<bool>, String> {
    flag(args, "--listener")
        .unwrap_or("absent,present")
        .split(',')
        .map(|s| match s {
            "absent" => Ok(false),
            "present" => Ok(true),
            other => Err(format!("--listener: {other}: absent or present")),
        })
        .collect()
}

/// `--sizes N,N,…`, or `default`.
fn sizes(args: &[String], default: &[usize]) -> Result<Vec<usize>, String> {
    match flag(args, "--sizes") {
        Some(v) => v
            .split(',')
            .map(|s| s.parse().map_err(|e| format!("--sizes {s}: {e}")))
            .collect(),
        None => Ok(default.to_vec()),
    }
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let num = |name: &str, default: usize| -> Result<usize, String> {
        flag(args, name).map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("{name} {v}: {e}"))
        })
    };
    let sizes = sizes(args, &[1_000, 5_000, 10_000, 30_000])?;
    let baseline = if args.iter().any(|a| a == "--iptables-baseline") {
        Some("legacy".to_owned())
    } else {
        flag(args, "--iptables-baseline").map(str::to_owned)
    };
    if let Some(b) = &baseline
        && b != "legacy"
        && b != "nft"
    {
        return Err(format!("--iptables-baseline={b}: use legacy or nft"));
    }
    let o = Options {
        sizes,
        endpoints: num("--endpoints", 2)?,
        samples: num("--samples", 1000)?,
        changes: num("--changes", 20)?,
        baseline,
        baseline_max: num("--iptables-max", usize::MAX)?,
        upstream_max: args
            .iter()
            .any(|a| a == "--upstream-baseline")
            .then(|| num("--upstream-max", 10_000))
            .transpose()?,
        ablate: args.iter().any(|a| a == "--ablate"),
        out: flag(args, "--out").map(PathBuf::from),
    };
    if o.endpoints == 0 || o.sizes.iter().any(|n| *n == 0 || *n > 200_000) {
        return Err("sizes must be 1..=200000 and --endpoints at least 1".into());
    }
    Ok(o)
}

fn orchestrate(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", include_str!("usage.txt"));
        return Ok(());
    }
    verdict_e2e::netns::can_run()?;
    let o = parse_options(args)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut runs = Vec::new();
    for &n in &o.sizes {
        eprintln!("verdict-bench: N={n} K={} …", o.endpoints);
        let baseline = o
            .baseline
            .clone()
            .filter(|_| n <= o.baseline_max)
            .unwrap_or_default();
        let out = Command::new(&exe)
            .args([
                "one",
                &n.to_string(),
                &o.endpoints.to_string(),
                &o.samples.to_string(),
                &o.changes.to_string(),
                &baseline,
                if o.upstream_max.is_some_and(|m| n <= m) {
                    "upstream"
                } else {
                    ""
                },
                if o.ablate { "ablate" } else { "" },
            ])
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("run N={n} failed"));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        runs.push(report::Run::parse(&text));
    }
    let md = report::markdown(&runs, &o.baseline, o.upstream_max);
    println!("{md}");
    if let Some(dir) = &o.out {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let k = o.endpoints;
        let write = |name: &str, body: &str| {
            std::fs::write(dir.join(name), body)
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        write(&format!("results-k{k}.md"), &md)?;
        write(&format!("results-k{k}.svg"), &report::svg(&runs, k))?;
        let raw: String = runs.iter().map(|r| format!("{}\n", r.raw)).collect();
        write(&format!("results-k{k}.txt"), &raw)?;
    }
    Ok(())
}

/// How long changes take, in ms, from entering the proxier to the kernel
/// having them.
struct ChangeTimes {
    /// One endpoint of one service moves (a different service each time).
    endpoint: Vec<f64>,
    /// Of that, the backend's part.
    endpoint_backend: Vec<f64>,
    /// A service with its endpoints is added.
    add: Vec<f64>,
    /// The same services are deleted.
    delete: Vec<f64>,
}

/// Times `changes` endpoint changes among services `0..n`, then as many
/// services added after them and deleted again.
fn time_changes<B: verdict_nft::Backend + ?Sized>(
    proxier: &mut Proxier,
    backend: &mut Timed<B>,
    n: usize,
    eps: &[(Ipv4Addr, u16)],
    changes: usize,
    now: &mut impl FnMut() -> Instant,
) -> Result<ChangeTimes, String> {
    let mut out = ChangeTimes {
        endpoint: Vec::new(),
        endpoint_backend: Vec::new(),
        add: Vec::new(),
        delete: Vec::new(),
    };
    for c in 0..changes {
        let spent = backend.spent;
        let i = (c * 7919 + 13) % n;
        let mut moved = eps.to_vec();
        moved[0].0 = Ipv4Addr::new(10, 200, 1, (c % 250 + 1) as u8);
        let t = Instant::now();
        for s in slices(i, &moved, 0) {
            proxier.on_endpoint_slice(&s, false);
        }
        proxier.sync(backend, now()).map_err(|e| e.to_string())?;
        out.endpoint.push(ms(t.elapsed()));
        out.endpoint_backend.push(ms(backend.spent - spent));
    }
    for (added, list) in [(true, &mut out.add), (false, &mut out.delete)] {
        for c in 0..changes {
            let i = n + c;
            let t = Instant::now();
            let svc = service(i);
            if added {
                proxier.on_service(None, Some(&svc));
            } else {
                proxier.on_service(Some(&svc), None);
            }
            for s in slices(i, eps, 0) {
                proxier.on_endpoint_slice(&s, !added);
            }
            proxier.sync(backend, now()).map_err(|e| e.to_string())?;
            list.push(ms(t.elapsed()));
        }
    }
    Ok(out)
}

/// A backend that times how long the kernel backend takes.
struct Timed<B: ?Sized> {
    spent: Duration,
    /// The text of the largest transaction run (the cold sync).
    biggest: String,
    /// Time spent rendering `biggest`, which the proxier's times exclude.
    overhead: Duration,
    inner: B,
}

impl<B> Timed<B> {
    fn new(inner: B) -> Timed<B> {
        Timed {
            spent: Duration::ZERO,
            biggest: String::new(),
            overhead: Duration::ZERO,
            inner,
        }
    }
}

impl<B: verdict_nft::Backend + ?Sized> verdict_nft::Backend for Timed<B> {
    fn run(&mut self, tx: &verdict_nft::Transaction) -> Result<(), verdict_nft::NftError> {
        let t = Instant::now();
        let r = self.inner.run(tx);
        self.spent += t.elapsed();
        if tx.len() > 1000 && self.biggest.is_empty() {
            let t = Instant::now();
            self.biggest = tx.to_string();
            self.overhead += t.elapsed();
        }
        r
    }

    fn check(&mut self, tx: &verdict_nft::Transaction) -> Result<(), verdict_nft::NftError> {
        let t = Instant::now();
        let r = self.inner.check(tx);
        self.spent += t.elapsed();
        r
    }

    fn table(
        &mut self,
        family: verdict_nft::Family,
        name: &str,
    ) -> Result<Option<verdict_nft::TableState>, verdict_nft::NftError> {
        let t = Instant::now();
        let r = self.inner.table(family, name);
        self.spent += t.elapsed();
        r
    }

    fn elements(
        &mut self,
        family: verdict_nft::Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<verdict_nft::Element>, verdict_nft::NftError> {
        let t = Instant::now();
        let r = self.inner.elements(family, table, set);
        self.spent += t.elapsed();
        r
    }
}

fn cpu_ms(who: UsageWho) -> f64 {
    getrusage(who)
        .map(|u| {
            let t =
                |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 * 1e3 + tv.tv_usec() as f64 / 1e3;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(f64::NAN)
}

fn max_rss_mib(who: UsageWho) -> f64 {
    getrusage(who)
        .map(|u| u.max_rss() as f64 / 1024.0)
        .unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    probe::quantile(v, q)
}

/// The largest of some non-negative figures (0 for none).
fn peak(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// One size, in its own process: prints `key value` lines.
fn one(args: &[String]) -> Result<(), String> {
    on_own_thread(args, one_in_thread)
}

/// Runs `run(args)` on a thread of its own: the control plane moves into
/// a node's namespace, and the rest of the process keeps its own.
fn on_own_thread(args: &[String], run: fn(&[String]) -> Result<(), String>) -> Result<(), String> {
    std::thread::spawn({
        let args = args.to_vec();
        move || run(&args)
    })
    .join()
    .map_err(|_| "benchmark thread panicked".to_string())?
}

/// A socket in a node's namespace that listens to conntrack's new and
/// destroyed connections and reads them as the flow stream's recorder
/// does: woken by the first report, it lets the next ones gather for
/// 50 ms, then reads them all. Stops when dropped.
struct Follower {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Follower {
    fn start(netns: &str) -> Result<Follower, String> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let name = netns.to_owned();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let opened = enter_netns(&name).and_then(|()| {
                verdict_nft::flows::FlowMonitor::open(None, true).map_err(|e| e.to_string())
            });
            let mut monitor = match opened {
                Ok(m) => {
                    let _ = ready_tx.send(Ok(()));
                    m
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            while !stopping.load(Ordering::Relaxed) {
                if let Ok(Some(_)) = monitor.next(Duration::from_millis(200)) {
                    std::thread::sleep(Duration::from_millis(50));
                    while let Ok(Some(_)) = monitor.next(Duration::ZERO) {}
                }
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "the follower's thread ended".to_owned())??;
        Ok(Follower {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Moves this thread into the network namespace `name`, as the daemon
/// runs inside a node's (the programs it starts inherit it).
fn enter_netns(name: &str) -> Result<(), String> {
    let ns = std::fs::File::open(format!("/run/netns/{name}")).map_err(|e| e.to_string())?;
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))
}

fn one_in_thread(args: &[String]) -> Result<(), String> {
    let get = |i: usize| -> Result<usize, String> {
        args.get(i)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("one: argument {i}"))
    };
    let (n, k, samples, changes) = (get(0)?, get(1)?, get(2)?, get(3)?);
    let baseline = args.get(4).filter(|s| !s.is_empty()).cloned();
    let upstream = args.get(5).is_some_and(|s| s == "upstream");
    let ablate = args.get(6).is_some_and(|s| s == "ablate");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let topo = topo::Topo::new(
        &exe,
        &workload::backend_ports(k),
        baseline.is_some(),
        upstream,
    )
    .map_err(|e| e.to_string())?;
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        out.insert(k.to_owned(), v);
    };
    put("size", n.to_string());
    put("endpoints", k.to_string());
    put("backends", topo.backends().to_string());

    let mut cfg = ProxierConfig::new(IpFamily::V4, "bench-node");
    cfg.node_ips = vec![topo::NODE_IP.into()];
    cfg.local_ips = vec![topo::NODE_IP.into()];
    cfg.local_detector = LocalDetector::Cidr(CLUSTER.parse().map_err(|e| format!("{e}"))?);
    cfg.service_cidrs = vec!["172.30.0.0/15".parse().map_err(|e| format!("{e}"))?];
    cfg.node_port_addresses = NodePortAddresses::primary();
    let mut proxier = Proxier::new(cfg).map_err(|e| e.to_string())?;
    // Run nft the way the daemon does: directly, from inside the node's
    // network namespace.
    enter_netns(topo.node.name())?;
    let mut nft = Timed::new(NftCli::new().map_err(|e| e.to_string())?);
    let eps = endpoints(k);
    let start = Instant::now();
    let mut clock = 0u64;
    let mut now = || {
        clock += 1;
        start + Duration::from_millis(clock)
    };

    // Cold full sync.
    let (cpu0, nft0) = (
        cpu_ms(UsageWho::RUSAGE_SELF),
        cpu_ms(UsageWho::RUSAGE_CHILDREN),
    );
    let t0 = Instant::now();
    for i in 0..n {
        proxier.on_service(None, Some(&service(i)));
        for s in slices(i, &eps, 0) {
            proxier.on_endpoint_slice(&s, false);
        }
    }
    put("cold_feed_ms", format!("{:.1}", ms(t0.elapsed())));
    let r = proxier
        .sync(&mut nft, now())
        .map_err(|e| format!("cold sync: {e}"))?;
    put("cold_backend_ms", format!("{:.1}", ms(nft.spent)));
    put("cold_wall_ms", format!("{:.1}", ms(t0.elapsed())));
    put(
        "cold_cpu_verdict_ms",
        format!("{:.1}", cpu_ms(UsageWho::RUSAGE_SELF) - cpu0),
    );
    put(
        "cold_cpu_nft_ms",
        format!("{:.1}", cpu_ms(UsageWho::RUSAGE_CHILDREN) - nft0),
    );
    put("cold_ops", r.operations.to_string());
    put(
        "peak_verdict_mib",
        format!("{:.1}", max_rss_mib(UsageWho::RUSAGE_SELF)),
    );
    // nft's own peak: getrusage(RUSAGE_CHILDREN) would report our size (a
    // child shares our address space until it execs), so replay the same
    // script into a scratch namespace and sample the nft process itself.
    let scratch = verdict_e2e::netns::Netns::create(&format!(
        "{}-nftpeak",
        verdict_e2e::netns::unique_prefix()
    ))
    .map_err(|e| e.to_string())?;
    let peak = run_with_peak(
        &["ip", "netns", "exec", scratch.name(), "nft", "-f", "-"],
        &nft.biggest,
        "nft",
    )?;
    drop(scratch);
    put("peak_nft_mib", format!("{peak:.1}"));

    // A sync with nothing to do.
    let t = Instant::now();
    let r = proxier.sync(&mut nft, now()).map_err(|e| e.to_string())?;
    put("nochange_ops", r.operations.to_string());
    put("nochange_ms", format!("{:.3}", ms(t.elapsed())));

    let mut times = time_changes(&mut proxier, &mut nft, n, &eps, changes, &mut now)?;
    put(
        "ep_change_backend_p50_ms",
        format!("{:.2}", pct(&mut times.endpoint_backend, 0.5)),
    );
    put(
        "ep_change_p50_ms",
        format!("{:.2}", pct(&mut times.endpoint, 0.5)),
    );
    put(
        "ep_change_p99_ms",
        format!("{:.2}", pct(&mut times.endpoint, 0.99)),
    );
    let (mut add, mut del) = (times.add, times.delete);
    put("svc_add_p50_ms", format!("{:.2}", pct(&mut add, 0.5)));
    put("svc_add_p99_ms", format!("{:.2}", pct(&mut add, 0.99)));
    put("svc_del_p50_ms", format!("{:.2}", pct(&mut del, 0.5)));
    put("svc_del_p99_ms", format!("{:.2}", pct(&mut del, 0.99)));

    // The iptables baseline, loaded as kube-proxy's iptables mode would.
    if let (Some(variant), Some(nodei)) = (&baseline, &topo.nodei) {
        let text = workload::iptables_restore(n, &eps);
        let program = if variant == "legacy" {
            "iptables-legacy-restore"
        } else {
            "iptables-nft-restore"
        };
        put("ipt_variant", variant.clone());
        let load = load_layout(nodei.name(), &[program], &text)?;
        load.put("ipt", &mut put);
        put("ipt_rules", count_lines(&text, "-A"));
    }

    // kube-proxy's own nftables layout, loaded as knftables sends it.
    if let Some(nodeu) = &topo.nodeu {
        let text = workload::upstream_nftables(n, &eps);
        let load = load_layout(nodeu.name(), &["nft", "-f", "-"], &text)?;
        load.put("up", &mut put);
        put("up_chains", count_lines(&text, "add chain"));
    }

    // Data plane.
    let mut targets = vec![
        format!("floor={}:8080", topo::FLOOR),
        format!("pod={}:8080", topo::BACKENDS[0]),
    ];
    for (label, i) in [("early", 0), ("middle", n / 2), ("late", n - 1)] {
        targets.push(format!("{label}={}:{SERVICE_PORT}", service_ip(30, i)));
        if baseline.is_some() {
            targets.push(format!("ipt-{label}={}:{SERVICE_PORT}", service_ip(32, i)));
        }
        if upstream {
            targets.push(format!("up-{label}={}:{SERVICE_PORT}", service_ip(34, i)));
        }
    }
    let exe_s = exe.to_string_lossy().into_owned();
    let mut argv = vec!["probe".to_owned(), samples.to_string(), "50".to_owned()];
    argv.extend(targets);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    probe_pass(&topo, &exe_s, &argv, "", &mut put)?;
    // The same services without the element counters (the maps are
    // replaced by a full sync), probed again in the same run: what the
    // counters cost the data path.
    let first = proxier.config().clone();
    let mut plain = first.clone();
    plain.counters = false;
    proxier.set_config(plain).map_err(|e| e.to_string())?;
    let t = Instant::now();
    proxier
        .sync(&mut nft, now())
        .map_err(|e| format!("sync without counters: {e}"))?;
    put("nocounters_sync_ms", format!("{:.1}", ms(t.elapsed())));
    probe_pass(&topo, &exe_s, &argv, "nc-", &mut put)?;
    // The client as a pod: the cluster CIDR covers it too, so its
    // connections to ClusterIPs are not masqueraded (the passes above
    // come from outside the cluster CIDR, as an external client's do).
    let mut inside = first;
    inside.local_detector =
        LocalDetector::Cidr(CLUSTER_WITH_CLIENT.parse().map_err(|e| format!("{e}"))?);
    proxier.set_config(inside).map_err(|e| e.to_string())?;
    proxier
        .sync(&mut nft, now())
        .map_err(|e| format!("sync with the client inside the cluster CIDR: {e}"))?;
    probe_pass(&topo, &exe_s, &argv, "in-", &mut put)?;
    // The same while a socket in the node follows its connections, as
    // verdict's flow stream does once a reader asks for flows (from start
    // with `--flows`): the kernel then builds a report of each new
    // connection in the path of its first packet.
    {
        let _follower = Follower::start(topo.node.name())?;
        probe_pass(&topo, &exe_s, &argv, "ev-", &mut put)?;
    }
    // What verdict's rules cost, group by group: its ruleset as this last
    // pass had it (the client inside the cluster CIDR), loaded again with
    // one group of rules taken out, then with all of them. An experiment
    // on the cost, not a ruleset that keeps kube-proxy's behaviour.
    if ablate {
        let full = topo
            .node
            .exec("nft", &["list", "ruleset"])
            .map_err(|e| format!("nft list ruleset: {}", e.0))?;
        let floor_pod_service: Vec<&str> = argv
            .iter()
            .take(3)
            .chain(argv.iter().filter(|a| {
                a.starts_with("floor=") || a.starts_with("pod=") || a.starts_with("late=")
            }))
            .copied()
            .collect();
        for (name, out) in ABLATIONS {
            let text: String = full
                .lines()
                .filter(|l| !out.iter().any(|o| l.contains(o)))
                .map(|l| format!("{l}\n"))
                .collect();
            topo.node
                .exec("nft", &["flush", "ruleset"])
                .map_err(|e| format!("nft flush ruleset: {}", e.0))?;
            load_layout(topo.node.name(), &["nft", "-f", "-"], &text)?;
            probe_pass(
                &topo,
                &exe_s,
                &floor_pod_service,
                &format!("abl-{name}-"),
                &mut put,
            )?;
        }
    }
    // Anchors for the pod path: the same node with no rules of verdict's,
    // only what any proxy that NATs brings: conntrack (a filter chain that
    // asks the connection's state), then conntrack and the NAT hooks
    // (empty nat chains). The floor and the pod only: no Service answers.
    let floor_and_pod: Vec<&str> = argv.iter().take(5).copied().collect();
    for (label, text) in ANCHORS {
        topo.node
            .exec("nft", &["flush", "ruleset"])
            .map_err(|e| format!("nft flush ruleset: {}", e.0))?;
        load_layout(topo.node.name(), &["nft", "-f", "-"], text)?;
        probe_pass(
            &topo,
            &exe_s,
            &floor_and_pod,
            &format!("{label}-"),
            &mut put,
        )?;
    }
    put("samples", samples.to_string());
    put("changes", changes.to_string());
    for (k, v) in &out {
        println!("{k} {v}");
    }
    let _ = std::io::stdout().flush();
    Ok(())
}

/// Runs a command with `input` on stdin and returns its peak resident
/// memory in MiB, sampled from /proc while it runs (only once the process
/// has become `comm`, so the pre-exec copy of our own image is not counted).
/// How loading a baseline layout went.
struct Load {
    wall_ms: f64,
    cpu_ms: f64,
    peak_mib: f64,
}

impl Load {
    /// Records it under `prefix` (`PREFIX_load_wall_ms`, `PREFIX_load_cpu_ms`,
    /// `PREFIX_peak_mib`, the keys the report reads).
    fn put(&self, prefix: &str, put: &mut impl FnMut(&str, String)) {
        put(
            &format!("{prefix}_load_wall_ms"),
            format!("{:.1}", self.wall_ms),
        );
        put(
            &format!("{prefix}_load_cpu_ms"),
            format!("{:.1}", self.cpu_ms),
        );
        put(
            &format!("{prefix}_peak_mib"),
            format!("{:.1}", self.peak_mib),
        );
    }
}

/// Loads a baseline layout's `text` with `argv` run in the namespace `ns`:
/// the wall time, the loader's CPU time and its peak RSS.
fn load_layout(ns: &str, argv: &[&str], text: &str) -> Result<Load, String> {
    let program = argv.first().ok_or("empty command")?;
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(argv);
    let c0 = cpu_ms(UsageWho::RUSAGE_CHILDREN);
    let t = Instant::now();
    let peak_mib = run_with_peak(&full, text, program)?;
    Ok(Load {
        wall_ms: ms(t.elapsed()),
        cpu_ms: cpu_ms(UsageWho::RUSAGE_CHILDREN) - c0,
        peak_mib,
    })
}

/// One pass of the probe from the client (`argv`: its arguments and
/// targets), from an empty conntrack table on the node (the last pass's
/// connections, thousands in TIME_WAIT, would slow its lookups); each
/// target's figures recorded as `dp_<prefix><target>`.
fn probe_pass(
    topo: &topo::Topo,
    exe: &str,
    argv: &[&str],
    prefix: &str,
    put: &mut impl FnMut(&str, String),
) -> Result<(), String> {
    topo.node
        .exec("conntrack", &["-F"])
        .map_err(|e| format!("conntrack -F: {}", e.0))?;
    let probe_out = topo.cli.exec(exe, argv).map_err(|e| e.to_string())?;
    for (target, p) in probe::parse_probe(&probe_out) {
        put(
            &format!("dp_{prefix}{target}"),
            format!("{:.1} {:.1} {:.1} {}", p.p01, p.p50, p.p99, p.failures),
        );
    }
    Ok(())
}

/// How many lines of `text` start with `prefix`.
fn count_lines(text: &str, prefix: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .count()
        .to_string()
}

fn run_with_peak(argv: &[&str], input: &str, comm: &str) -> Result<f64, String> {
    let (program, rest) = argv.split_first().ok_or("empty command")?;
    let mut child = Command::new(program)
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let input = input.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let mut peak_kib = 0u64;
    loop {
        // `ip netns exec` execs the program in place, so the pid is the loader's.
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.starts_with(name.trim())
            && !name.trim().is_empty()
            && let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        {
            peak_kib = peak_kib.max(kib);
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                let _ = writer.join();
                if !status.success() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    return Err(format!("{program} failed: {}", err.trim()));
                }
                return Ok(peak_kib as f64 / 1024.0);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_directory_is_made_or_named_in_the_error() {
        let args = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(log_dir(&args(&["--sizes", "10"])), Ok(None));
        let base = std::env::temp_dir().join(format!("verdict-bench-log-{}", std::process::id()));
        let deep = base.join("a/b");
        let d = deep.to_str().unwrap();
        assert_eq!(log_dir(&args(&["--log", d])), Ok(Some(deep.clone())));
        assert!(deep.is_dir());
        // A file where a directory should be.
        let file = base.join("file");
        std::fs::write(&file, "").unwrap();
        let under = file.join("logs");
        let e = log_dir(&args(&[&format!("--log={}", under.display())])).unwrap_err();
        assert!(
            e.starts_with(&format!("--log {}: ", under.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
