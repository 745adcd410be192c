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
//! - repairs of a foreign `nft flush ruleset`: from the flush to the
//!   last Service answering again (the same client, started once the
//!   flush is in), and to verdict's log line of the repair (which, with
//!   another listener, also waits for the kernel's announcements);
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

const USAGE: &str = "usage: verdict-bench envelope [--sizes 30000,100000] [--sources manifests,api] [--listener absent,present] [--changes 20] [--adds 20] [--flushes 3] [--target-refs] [--log DIR] [--out DIR] | --plot TABLE.md > envelope.svg";

/// Seconds between runs, for the kernel to finish tearing the last one
/// down.
const PAUSE_SECS: u64 = 10;

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
    /// Flush → the last Service answering again, p50 / max (ms).
    pub answers_again_p50: f64,
    pub answers_again_max: f64,
    /// Flush → the IPv4 table repaired (the sync's log line), p50 / max
    /// (ms).
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
    /// every few milliseconds, for at most `within`.
    pub fn start(
        ns: &Netns,
        svc: usize,
        endpoints: &[Ipv4Addr],
        port: u16,
        within: Duration,
    ) -> Result<AnswerProbe, String> {
        loopback_endpoints(ns, endpoints)?;
        AnswerProbe::again(ns, svc, port, within)
    }

    /// Starts connecting again, in a namespace [`AnswerProbe::start`]
    /// prepared (after a flush, say).
    pub fn again(
        ns: &Netns,
        svc: usize,
        port: u16,
        within: Duration,
    ) -> Result<AnswerProbe, String> {
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

/// Makes `endpoints` addresses of `ns`'s loopback, and sends every other
/// address (the ClusterIPs) out of a veth pair within `ns`, from
/// 192.168.0.2: a connection from inside `ns` to a Service reaches an
/// endpoint only through verdict's DNAT.
pub(crate) fn loopback_endpoints(ns: &Netns, endpoints: &[Ipv4Addr]) -> Result<(), String> {
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
    Ok(())
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
    if let Some(table) = flag(args, "--plot") {
        // Only the plot, from a table this command printed.
        let text = std::fs::read_to_string(table).map_err(|e| format!("{table}: {e}"))?;
        let points = parse_table(&text);
        if points.is_empty() {
            return Err(format!("{table}: no envelope rows in it"));
        }
        print!("{}", svg(&points));
        return Ok(());
    }
    can_run()?;
    if args.iter().any(|a| a == "--target-refs") {
        crate::daemon::TARGET_REFS.store(true, std::sync::atomic::Ordering::Relaxed);
    }
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
    let listeners = crate::listeners(args).map_err(|e| format!("{e}\n{USAGE}"))?;
    let log_dir = crate::log_dir(args)?;
    let verdict = crate::daemon::sibling("verdict")?;
    let apiserver = crate::daemon::sibling("verdict-e2e-apiserver")?;
    let out_dir = flag(args, "--out").map(std::path::PathBuf::from);
    // The table as printed, kept for `--out`.
    let mut text = String::new();
    let mut say = |line: String| {
        println!("{line}");
        text.push_str(&line);
        text.push('\n');
    };
    say(format!(
        "### The scale envelope: the verdict program with its default flags, 2 endpoints per ClusterIP Service, {changes} endpoint changes, {adds} Services added, {flushes} foreign flushes, one restart\n"
    ));
    say("| services | source | another nftables listener | start → last Service answers | first full sync (IPv4) | peak RSS | endpoint change p50 / p99 (sync) | p99 (whole path) | add a Service p50 / p99 (sync) | p99 (whole path) | full read of the table | flush → answering again p50 / max | flush → repaired p50 / max | restart → first sync (operations) |".to_owned());
    say("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_owned());
    let mut points: Vec<Point> = Vec::new();
    let mut after_a_run = false;
    for n in sizes {
        for &source in &sources {
            for &listener in &listeners {
                let name = match source {
                    Source::Api => "api",
                    Source::Manifests => "manifests",
                };
                let log_to = log_dir.as_ref().map(|d| {
                    d.join(format!(
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
                if std::mem::replace(&mut after_a_run, true) {
                    // The kernel frees the last run's namespace (its tables,
                    // hundreds of thousands of elements) in a work queue of
                    // its own: measured, a run right after another took 2.3 s
                    // to its first answer instead of 1.2.
                    std::thread::sleep(Duration::from_secs(PAUSE_SECS));
                }
                let Row { cold, changes, .. } =
                    crate::daemon::run_one(source, shape, mode, &programs)?;
                let crate::daemon::Changes::Envelope(e) = changes else {
                    return Err("the envelope run measured something else".into());
                };
                points.push(Point {
                    n,
                    series: format!(
                        "{name}, {}",
                        if listener { "listener" } else { "no listener" }
                    ),
                    answered: e.answered.as_secs_f64(),
                    rss: e.peak_rss,
                });
                say(format!(
                    "| {n} | {name} | {} | {} | {} | {:.0} MiB | {:.2} / {:.2} ms | {:.2} ms | {:.2} / {:.2} ms | {:.2} ms | {:.0} ms | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {} ({}) |",
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
                    e.answers_again_p50,
                    e.answers_again_max,
                    e.repair_p50,
                    e.repair_max,
                    cell_s(e.adopt),
                    e.adopt_ops,
                ));
            }
        }
    }
    say(
        "\nTimes from verdict's start, from the write (API server or file) or from the flush. Answering again: the client connects to the last Service every few milliseconds from the moment `nft flush ruleset` has returned; repaired: verdict's log line of the repair, which also waits for the kernel's announcements of its elements when another process listens. (sync) is the sync's own time in verdict's log, the proxier and the kernel; (whole path) runs from the write to that log line. The full read is `/api/v1/drift`'s reading of the IPv4 table (median of three; each must find no drift). Peak RSS is the first process's, over all of it. The kernel's endpoint map is checked against every Service's endpoints after the first sync, the changes, the adds, each repair and the restart."
            .to_owned(),
    );
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))
        };
        write("envelope.md", &text)?;
        write("envelope.svg", &svg(&points))?;
    }
    Ok(())
}

/// The rows of a table this command printed, as points of the plot.
fn parse_table(text: &str) -> Vec<Point> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "", services, source, listener, answers, first sync, RSS, …
        let (Some(n), Some(source), Some(listener), Some(answered), Some(rss)) = (
            cells.get(1).and_then(|c| c.parse::<usize>().ok()),
            cells.get(2),
            cells.get(3),
            cells
                .get(4)
                .and_then(|c| c.strip_suffix(" s")?.parse::<f64>().ok()),
            cells
                .get(6)
                .and_then(|c| c.strip_suffix(" MiB")?.parse::<f64>().ok()),
        ) else {
            continue;
        };
        let listener = match *listener {
            "present" => "listener",
            _ => "no listener",
        };
        out.push(Point {
            n,
            series: format!("{source}, {listener}"),
            answered,
            rss,
        });
    }
    out
}

/// One run's figures for the plot.
struct Point {
    n: usize,
    series: String,
    answered: f64,
    rss: f64,
}

/// Two panels against the number of Services (log scales): start → the
/// last Service answering, and peak RSS, one line per source and
/// listener, with the targets marked.
fn svg(points: &[Point]) -> String {
    use std::fmt::Write as _;
    let (w, h, pad) = (820.0, 320.0, 56.0);
    let panel_w = (w - 3.0 * pad) / 2.0;
    let mut sizes: Vec<usize> = points.iter().map(|p| p.n).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut series: Vec<&str> = Vec::new();
    for p in points {
        if !series.contains(&p.series.as_str()) {
            series.push(&p.series);
        }
    }
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    ];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    // A panel: its title, what it plots, and the targets (N, value).
    type Panel<'a> = (&'a str, fn(&Point) -> f64, &'a [(f64, f64)]);
    let panels: [Panel; 2] = [
        (
            "start → last Service answers (s)",
            |p| p.answered,
            &[(30_000.0, 1.5), (100_000.0, 5.0)],
        ),
        (
            "peak RSS (MiB)",
            |p| p.rss,
            &[(30_000.0, 150.0), (100_000.0, 500.0)],
        ),
    ];
    for (i, (title, value, targets)) in panels.iter().enumerate() {
        let x0 = pad + i as f64 * (panel_w + pad);
        let (y0, y1) = (pad, h - pad);
        let vals: Vec<f64> = points
            .iter()
            .map(value)
            .chain(targets.iter().map(|t| t.1))
            .filter(|v| *v > 0.0)
            .collect();
        let lo = vals.iter().copied().fold(f64::MAX, f64::min).max(1e-3) / 1.5;
        let hi = vals.iter().copied().fold(f64::MIN, f64::max).max(lo * 2.0) * 1.5;
        let ty = |v: f64| y1 - (v.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln()) * (y1 - y0);
        let at = |n: usize| sizes.iter().position(|x| *x == n).unwrap_or(0);
        let tx = |n: usize| x0 + (at(n) as f64 + 0.5) * panel_w / sizes.len().max(1) as f64;
        let _ = writeln!(
            s,
            "<text x=\"{x0}\" y=\"{}\" font-weight=\"bold\">{title}</text>",
            y0 - 18.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y1}\" x2=\"{}\" y2=\"{y1}\" stroke=\"black\"/><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>",
            x0 + panel_w
        );
        let mut tick = 10f64.powf(lo.log10().floor());
        while tick <= hi {
            for m in [1.0, 2.0, 5.0] {
                let v = tick * m;
                if v >= lo && v <= hi {
                    crate::report::grid_line(&mut s, x0, panel_w, ty(v), &v.to_string());
                }
            }
            tick *= 10.0;
        }
        for n in &sizes {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{n}</text>",
                tx(*n),
                y1 + 15.0
            );
        }
        for (n, target) in targets.iter() {
            if sizes.contains(&(*n as usize)) {
                let (x, y) = (tx(*n as usize), ty(*target));
                let _ = writeln!(
                    s,
                    "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"{:.1}\">target</text>",
                    x - 22.0,
                    x + 22.0,
                    x + 24.0,
                    y + 4.0
                );
            }
        }
        for (k, name) in series.iter().enumerate() {
            let color = colors[k % colors.len()];
            let pts: Vec<String> = points
                .iter()
                .filter(|p| p.series == *name)
                .map(|p| format!("{:.1},{:.1}", tx(p.n), ty(value(p))))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                pts.join(" ")
            );
            for pt in &pts {
                if let Some((x, y)) = pt.split_once(',') {
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/>"
                    );
                }
            }
            if i == 0 {
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{name}</text>",
                    x0 + 8.0,
                    y0 + 12.0 + 13.0 * k as f64
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_reads_the_printed_table() {
        let text = "| services | source | another nftables listener | start → last Service answers | first full sync (IPv4) | peak RSS | x |\n\
                    |---:|---|---|---:|---:|---:|---:|\n\
                    | 30000 | manifests | absent | 1.24 s | 1.32 s | 297 MiB | 1 |\n\
                    | 100000 | api | present | 4.50 s | 15.68 s | 881 MiB | 1 |\n";
        let points = parse_table(text);
        assert_eq!(points.len(), 2);
        assert_eq!(
            (points[0].n, points[0].answered, points[0].rss),
            (30_000, 1.24, 297.0)
        );
        assert_eq!(points[1].series, "api, listener");
        let svg = svg(&points);
        assert!(svg.starts_with("<svg") && svg.contains("manifests, no listener"));
        assert_eq!(
            svg.matches("<polyline").count(),
            4,
            "two series in two panels"
        );
    }
}
