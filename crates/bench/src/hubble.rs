//! `verdict-bench hubble`: what Hubble's followers cost a node. A node of
//! N ClusterIP Services (the flow stream on, Hubble's API on its default
//! loopback address) takes RATE new connections a second for SECS seconds
//! with 0, 1, … `hubble observe --follow` processes attached (the
//! unmodified CLI, its default compact output, which asks for a field
//! mask), a fresh node per row: verdict's CPU over the burst (user +
//! system, from /proc), its RSS idle and at its peak, the flows recorded
//! and the lines the followers printed. verdict runs with its defaults:
//! the stream follows forwarded connections only while someone asks for
//! flows, so with no follower they are not followed at all, and the first
//! row is the node's own cost of the burst.

use std::path::PathBuf;
use std::time::Duration;

use verdict_e2e::netns::can_run;

use crate::daemon::Monitor;
use crate::flows::{Ctx, Follower, Node, TARGETS, burst, stats, write_manifests};
use crate::{flag, num_flag};

const USAGE: &str = "usage: verdict-bench hubble [--services 1000] [--rate 500] [--duration 20] [--followers 0,1,4] [--listener absent,present] [--hubble PATH] [--log DIR] [--out FILE]";

/// Seconds between nodes, for the kernel to tear the last namespace down.
const PAUSE: Duration = Duration::from_secs(5);

/// `verdict-bench hubble …`
pub fn hubble(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let num = |name: &str, default: usize| {
        num_flag(args, name, default).map_err(|e| format!("{e}\n{USAGE}"))
    };
    let n = num("--services", 1000)?;
    let rate = num("--rate", 500)?;
    let secs = num("--duration", 20)?;
    if n < TARGETS || rate == 0 || secs == 0 {
        return Err(format!(
            "--services at least {TARGETS}; --rate and --duration at least 1\n{USAGE}"
        ));
    }
    let followers: Vec<usize> = flag(args, "--followers")
        .unwrap_or("0,1,4")
        .split(',')
        .map(|f| {
            f.trim()
                .parse()
                .map_err(|_| format!("--followers {f:?}: give counts, 0,1,4\n{USAGE}"))
        })
        .collect::<Result<_, _>>()?;
    let listeners = crate::listeners(args).map_err(|e| format!("{e}\n{USAGE}"))?;
    let hubble = match flag(args, "--hubble") {
        Some(p) => PathBuf::from(p),
        None => verdict_e2e::realapi::binaries()
            .map_err(|e| format!("the hubble CLI: {e} (or give --hubble PATH)"))?
            .join("hubble"),
    };
    let verdict = crate::daemon::sibling("verdict")?;
    crate::readers::raise_open_files();
    let dir = std::env::temp_dir().join(format!("verdict-bench-hubble-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    write_manifests(&manifests, n)?;
    let log_dir = crate::log_dir(args)?;

    let mut rows = Vec::new();
    for &listener in &listeners {
        let _monitor = if listener {
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
        for &k in &followers {
            std::thread::sleep(PAUSE);
            // verdict's defaults: the stream on, following connections
            // only while someone asks for flows.
            let node = Node::start_with(&ctx, &[], true, &format!("hubble{k}"))?;
            let attached: Vec<Follower> = (0..k)
                .map(|_| {
                    Follower::start(
                        &node.ns,
                        &hubble,
                        &["observe", "--server", "127.0.0.1:4244", "--follow"],
                    )
                })
                .collect::<Result<_, _>>()?;
            // Each has asked for flows: the node follows connections.
            std::thread::sleep(Duration::from_secs(2));
            let (cpu0, _) = crate::daemon::usage(node.pid);
            let b = burst(&node, rate, secs, false)?;
            let (cpu1, _) = crate::daemon::usage(node.pid);
            let printed: usize = attached.iter().map(Follower::seen).sum();
            // Read once the burst is over (a read asks for flows, from
            // then on).
            let recorded = stats(&node.ns)?.forwarded;
            let window = b.took.as_secs_f64() + 2.0;
            rows.push(format!(
                "| {who} | {k} | {} ({:.0}/s) | {} | {recorded} | {printed} | {:.2} s | {:.1} % | {:.1} MiB | {:.1} MiB | {:+.1} MiB |",
                b.ok,
                b.ok as f64 / b.took.as_secs_f64(),
                b.failed,
                cpu1 - cpu0,
                (cpu1 - cpu0) / window * 100.0,
                b.rss_idle,
                b.rss_peak,
                b.rss_peak - b.rss_idle,
            ));
            println!("{}", rows[rows.len() - 1]);
            drop(attached);
            drop(node);
        }
    }
    let mut text = format!(
        "### What Hubble's followers cost: {n} ClusterIP Services × 2 endpoints (manifests), {rate} new TCP connections a second for {secs} s, `hubble observe --follow` (compact output)\n\n"
    );
    text.push_str("| another nftables listener | followers | connections | failed | flows recorded | lines printed | verdict's CPU | of one core | RSS idle | RSS peak | peak − idle |\n");
    text.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &rows {
        text.push_str(r);
        text.push('\n');
    }
    text.push_str("\nA fresh node per row. CPU: user + system of the verdict process over the burst and the 2 s after it (/proc/PID/stat), and that as a share of one core over the same window. RSS from /proc (VmRSS), sampled every 100 ms; idle is the reading just before the burst, with the followers attached. Flows recorded: forwarded flows the node recorded since it started. Lines printed: every follower's lines added up.\n");
    println!("\n{text}");
    if let Some(out) = flag(args, "--out") {
        std::fs::write(out, &text).map_err(|e| format!("{out}: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
