//! The two kernel backends side by side: the same synthetic cluster
//! programmed through `nft` and over netlink, each in a scratch namespace
//! and a process of its own (so each peak memory is its own), timing the
//! control plane only.
//!
//! ```text
//! verdict-bench backends [--sizes 1000,10000,30000] [--endpoints 2] [--changes 50]
//! ```

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::UsageWho;
use verdict_model::IpFamily;
use verdict_nft::{Backend, Family, NetlinkBackend, NftCli};
use verdict_proxier::{Proxier, ProxierConfig};

use crate::workload::{endpoints, service, slices};
use crate::{Timed, flag, max_rss_mib, ms, pct, run_with_peak, sizes};

const BACKENDS: [&str; 2] = ["nft", "netlink"];

/// The rows of the table: key, label, unit.
const ROWS: [(&str, &str); 15] = [
    ("cold_ms", "cold full sync to kernel (ms)"),
    ("cold_backend_ms", "  of which the backend (ms)"),
    (
        "cold_nocounters_ms",
        "cold full sync, `--service-counters=false` (ms)",
    ),
    ("cold_nocounters_backend_ms", "  of which the backend (ms)"),
    ("nochange_ms", "sync with nothing to do (ms)"),
    ("ep_p50_ms", "one endpoint change, p50 (ms)"),
    ("ep_p99_ms", "one endpoint change, p99 (ms)"),
    ("add_p99_ms", "add one service, p99 (ms)"),
    ("del_p99_ms", "delete one service, p99 (ms)"),
    ("readback_ms", "full read-back of the table (ms)"),
    ("full_resync_ms", "full resync, nothing to repair (ms)"),
    (
        "flush_repair_ms",
        "`nft flush ruleset` → table restored (ms)",
    ),
    (
        "flush_repair_nocounters_ms",
        "  the same, `--service-counters=false` (ms)",
    ),
    ("peak_self_mib", "peak RSS of the proxier process (MiB)"),
    ("peak_nft_mib", "peak RSS of nft for the cold sync (MiB)"),
];

pub fn backends(args: &[String]) -> Result<(), String> {
    verdict_e2e::netns::can_run()?;
    let sizes = sizes(args, &[1_000, 10_000, 30_000])?;
    let num = |name: &str, default: usize| -> Result<usize, String> {
        flag(args, name).map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("{name} {v}: {e}"))
        })
    };
    let (k, changes) = (num("--endpoints", 2)?, num("--changes", 50)?);
    if k == 0 || changes == 0 || sizes.iter().any(|n| *n == 0 || *n > 200_000) {
        return Err("sizes must be 1..=200000; --endpoints and --changes at least 1".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut md =
        String::from("| N | what | nft | netlink | nft ÷ netlink |\n|---:|---|---:|---:|---:|\n");
    for n in sizes {
        let mut runs = Vec::new();
        for b in BACKENDS {
            eprintln!("verdict-bench backends: N={n} K={k} {b} …");
            let out = Command::new(&exe)
                .args([
                    "backend-one",
                    &n.to_string(),
                    &k.to_string(),
                    &changes.to_string(),
                    b,
                ])
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("N={n} {b} failed"));
            }
            let figures: BTreeMap<String, f64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_owned(), v.trim().parse().ok()?))
                })
                .collect();
            runs.push(figures);
        }
        for (key, label) in ROWS {
            let a = runs[0].get(key).copied();
            let b = runs[1].get(key).copied();
            let show = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.2}"));
            let ratio = match (a, b) {
                (Some(a), Some(b)) if b > 0.0 && a > 0.0 => format!("{:.1}×", a / b),
                _ => "–".to_owned(),
            };
            md.push_str(&format!(
                "| {n} | {label} | {} | {} | {ratio} |\n",
                show(a),
                show(b)
            ));
        }
    }
    println!("{md}");
    Ok(())
}

/// One backend at one size, in a process of its own.
pub fn backend_one(args: &[String]) -> Result<(), String> {
    crate::on_own_thread(args, backend_one_in_thread)
}

fn backend_one_in_thread(args: &[String]) -> Result<(), String> {
    let get = |i: usize| -> Result<usize, String> {
        args.get(i)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("backend-one: argument {i}"))
    };
    let (n, k, changes) = (get(0)?, get(1)?, get(2)?);
    let which = args.get(3).map(String::as_str).unwrap_or("nft");
    let ns =
        verdict_e2e::netns::Netns::create(&format!("{}-be", verdict_e2e::netns::unique_prefix()))
            .map_err(|e| e.to_string())?;
    crate::enter_netns(ns.name())?;
    let inner: Box<dyn Backend> = match which {
        "nft" => Box::new(NftCli::new().map_err(|e| e.to_string())?),
        "netlink" => Box::new(NetlinkBackend::new().map_err(|e| e.to_string())?),
        other => return Err(format!("unknown backend {other}")),
    };
    let mut be = Timed::new(inner);
    let mut cfg = ProxierConfig::new(IpFamily::V4, "bench-node");
    cfg.node_ips = vec![std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))];
    cfg.local_ips = cfg.node_ips.clone();
    let mut proxier = Proxier::new(cfg).map_err(|e| e.to_string())?;
    let eps = endpoints(k);
    let start = Instant::now();
    let mut clock = 0u64;
    let mut now = || {
        clock += 1;
        start + Duration::from_millis(clock)
    };
    let mut out: Vec<(String, f64)> = Vec::new();
    let mut put = |k: &str, v: f64| out.push((k.to_owned(), v));

    for i in 0..n {
        proxier.on_service(None, Some(&service(i)));
        for s in slices(i, &eps, 0) {
            proxier.on_endpoint_slice(&s, false);
        }
    }
    let t = Instant::now();
    proxier
        .sync(&mut be, now())
        .map_err(|e| format!("cold sync: {e}"))?;
    put("cold_ms", ms(t.elapsed() - be.overhead));
    put("cold_backend_ms", ms(be.spent));
    // As the daemon does after a full sync.
    verdict_proxier::proxier::settle_allocator();

    let t = Instant::now();
    proxier.sync(&mut be, now()).map_err(|e| e.to_string())?;
    put("nochange_ms", ms(t.elapsed()));

    let mut times = crate::time_changes(&mut proxier, &mut be, n, &eps, changes, &mut now)?;
    if std::env::var_os("VERDICT_BENCH_VERBOSE").is_some() {
        eprintln!("endpoint changes (ms, in order): {:.2?}", times.endpoint);
        eprintln!("service adds (ms, in order): {:.2?}", times.add);
        eprintln!("service deletes (ms, in order): {:.2?}", times.delete);
    }
    put("ep_p50_ms", pct(&mut times.endpoint, 0.5));
    put("ep_p99_ms", pct(&mut times.endpoint, 0.99));
    let (mut add, mut del) = (times.add, times.delete);
    put("add_p99_ms", pct(&mut add, 0.99));
    put("del_p99_ms", pct(&mut del, 0.99));

    let mut reads = Vec::new();
    let mut elements = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let table = be
            .inner
            .table(Family::Ip, "verdict")
            .map_err(|e| format!("read-back: {e}"))?
            .ok_or("read-back: no table")?;
        reads.push(ms(t.elapsed()));
        elements = table.sets.values().map(|s| s.elements.len()).sum::<usize>();
    }
    put("readback_ms", pct(&mut reads, 0.5));
    put("elements", elements as f64);

    proxier.force_full_sync();
    let t = Instant::now();
    let r = proxier.sync(&mut be, now()).map_err(|e| e.to_string())?;
    put("full_resync_ms", ms(t.elapsed()));
    put("full_resync_ops", r.operations as f64);
    verdict_proxier::proxier::settle_allocator();

    // Someone flushes the ruleset; the full sync that follows repairs it.
    let repair = |proxier: &mut Proxier,
                  be: &mut Timed<Box<dyn Backend>>,
                  at: Instant|
     -> Result<f64, String> {
        ns.exec("nft", &["flush", "ruleset"])
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        proxier.force_full_sync();
        proxier.sync(be, at).map_err(|e| format!("repair: {e}"))?;
        Ok(ms(t.elapsed()))
    };
    put("flush_repair_ms", repair(&mut proxier, &mut be, now())?);
    let back = be
        .inner
        .table(Family::Ip, "verdict")
        .map_err(|e| e.to_string())?
        .map_or(0, |t| {
            t.sets.values().map(|s| s.elements.len()).sum::<usize>()
        });
    if back != elements {
        return Err(format!(
            "after the repair {back} elements, before {elements}"
        ));
    }
    verdict_proxier::proxier::settle_allocator();

    // The same cold sync without the element counters: what they cost.
    ns.exec("nft", &["flush", "ruleset"])
        .map_err(|e| e.to_string())?;
    let mut plain = proxier.config().clone();
    plain.counters = false;
    proxier.set_config(plain).map_err(|e| e.to_string())?;
    let (t, spent) = (Instant::now(), be.spent);
    proxier
        .sync(&mut be, now())
        .map_err(|e| format!("sync without counters: {e}"))?;
    put("cold_nocounters_ms", ms(t.elapsed()));
    put("cold_nocounters_backend_ms", ms(be.spent - spent));
    verdict_proxier::proxier::settle_allocator();

    // And the repair of a flush without them.
    put(
        "flush_repair_nocounters_ms",
        repair(&mut proxier, &mut be, now())?,
    );

    put("peak_self_mib", max_rss_mib(UsageWho::RUSAGE_SELF));
    if which == "nft" {
        let scratch = verdict_e2e::netns::Netns::create(&format!(
            "{}-nftpeak",
            verdict_e2e::netns::unique_prefix()
        ))
        .map_err(|e| e.to_string())?;
        let peak = run_with_peak(
            &["ip", "netns", "exec", scratch.name(), "nft", "-f", "-"],
            &be.biggest,
            "nft",
        )?;
        put("peak_nft_mib", peak);
    }
    for (k, v) in out {
        println!("{k} {v:.3}");
    }
    Ok(())
}
