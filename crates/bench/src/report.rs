//! Turns the per-size figures into a Markdown table and an SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The figures of one size, as printed by `verdict-bench one`.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// key → value.
    pub kv: BTreeMap<String, String>,
    /// The raw lines.
    pub raw: String,
}

impl Run {
    /// Parses `key value` lines.
    pub fn parse(text: &str) -> Run {
        let kv = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Run {
            kv,
            raw: text.trim_end().replace('\n', "; "),
        }
    }

    fn get(&self, k: &str) -> &str {
        self.kv.get(k).map_or("–", String::as_str)
    }

    fn num(&self, k: &str) -> Option<f64> {
        self.kv.get(k).and_then(|v| v.parse().ok())
    }

    /// p01/p50/p99 of a data-plane target.
    fn dp(&self, label: &str) -> Option<[f64; 3]> {
        let v: Vec<f64> = self
            .kv
            .get(&format!("dp_{label}"))?
            .split_whitespace()
            .take(3)
            .filter_map(|x| x.parse().ok())
            .collect();
        <[f64; 3]>::try_from(v).ok()
    }

    fn dp_failures(&self) -> usize {
        self.kv
            .iter()
            .filter(|(k, _)| k.starts_with("dp_"))
            .filter_map(|(_, v)| {
                v.split_whitespace()
                    .nth(3)
                    .and_then(|f| f.parse::<usize>().ok())
            })
            .sum()
    }

    /// p50 ratio of a target to the floor.
    pub fn ratio(&self, label: &str, idx: usize) -> Option<f64> {
        Some(self.dp(label)?[idx] / self.dp("floor")?[idx])
    }
}

/// The table of a baseline layout's loads, from the keys the benchmark
/// wrote under `prefix` (`PREFIX_load_wall_ms`, `PREFIX_load_cpu_ms`,
/// `PREFIX_peak_mib`), with what it counted (its key and column).
fn load_table(
    s: &mut String,
    runs: &[Run],
    prefix: &str,
    (count_key, counted): (&str, &str),
    peak: &str,
) {
    let _ = writeln!(s, "| services | {counted} | cold load (CPU) | {peak} |");
    let _ = writeln!(s, "|---:|---:|---:|---:|");
    let key = |k: &str| format!("{prefix}_{k}");
    for r in runs
        .iter()
        .filter(|r| r.kv.contains_key(&key("load_wall_ms")))
    {
        let _ = writeln!(
            s,
            "| {} | {} | {} ({}) | {} MiB |",
            r.get("size"),
            r.get(count_key),
            secs(r.num(&key("load_wall_ms"))),
            secs(r.num(&key("load_cpu_ms"))),
            r.get(&key("peak_mib"))
        );
    }
}

fn secs(ms: Option<f64>) -> String {
    match ms {
        Some(v) if v >= 1000.0 => format!("{:.2} s", v / 1000.0),
        Some(v) => format!("{v:.0} ms"),
        None => "–".into(),
    }
}

/// The Markdown report.
pub fn markdown(runs: &[Run], baseline: &Option<String>, upstream: Option<usize>) -> String {
    let mut s = String::new();
    let k = runs.first().map_or("?", |r| r.get("endpoints"));
    let _ = writeln!(s, "### Control plane ({k} endpoints per service)\n");
    let _ = writeln!(
        s,
        "| services | cold full sync (CPU verdict / nft) | peak RSS verdict / nft | no-change sync | endpoint change p50 / p99 | add service p50 / p99 | delete service p50 / p99 |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let _ = writeln!(
            s,
            "| {} | {} ({} / {}) | {} / {} MiB | {} ops, {} ms | {} / {} ms | {} / {} ms | {} / {} ms |",
            r.get("size"),
            secs(r.num("cold_wall_ms")),
            secs(r.num("cold_cpu_verdict_ms")),
            secs(r.num("cold_cpu_nft_ms")),
            r.get("peak_verdict_mib"),
            r.get("peak_nft_mib"),
            r.get("nochange_ops"),
            r.get("nochange_ms"),
            r.get("ep_change_p50_ms"),
            r.get("ep_change_p99_ms"),
            r.get("svc_add_p50_ms"),
            r.get("svc_add_p99_ms"),
            r.get("svc_del_p50_ms"),
            r.get("svc_del_p99_ms"),
        );
    }
    if let Some(variant) = baseline {
        let _ = writeln!(
            s,
            "\nkube-proxy's iptables layout for the same services, loaded with `iptables-{variant}-restore` in the same run:\n"
        );
        load_table(&mut s, runs, "ipt", ("ipt_rules", "nat rules"), "peak RSS");
    }
    if let Some(max) = upstream {
        let _ = writeln!(
            s,
            "\nkube-proxy's nftables layout for the same services (a chain and an anonymous numgen map per service, a chain per endpoint), loaded with `nft -f` in the same run (sizes up to {max}):\n"
        );
        load_table(
            &mut s,
            runs,
            "up",
            ("up_chains", "chains"),
            "peak RSS of nft",
        );
    }
    let _ = writeln!(
        s,
        "\n### Data plane: TCP connect time in µs, p01 / p50 / p99 (p50 ÷ floor p50)\n"
    );
    let mut header = String::from(
        "| services | floor (no rules) | pod via node | early service | middle service | late service |",
    );
    let mut sep = String::from("|---:|---:|---:|---:|---:|---:|");
    if baseline.is_some() {
        header.push_str(" iptables early | iptables middle | iptables late |");
        sep.push_str("---:|---:|---:|");
    }
    if upstream.is_some() {
        header.push_str(" kube-proxy nftables early | middle | late |");
        sep.push_str("---:|---:|---:|");
    }
    let _ = writeln!(s, "{header}\n{sep}");
    for r in runs {
        let cell = |label: &str| match (r.dp(label), r.ratio(label, 1)) {
            (Some([a, b, c]), Some(x)) if label != "floor" => {
                format!("{a:.0} / {b:.0} / {c:.0} ({x:.2}×)")
            }
            (Some([a, b, c]), _) => format!("{a:.0} / {b:.0} / {c:.0}"),
            _ => "–".into(),
        };
        let _ = write!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.get("size"),
            cell("floor"),
            cell("pod"),
            cell("early"),
            cell("middle"),
            cell("late")
        );
        if baseline.is_some() {
            let _ = write!(
                s,
                " {} | {} | {} |",
                cell("ipt-early"),
                cell("ipt-middle"),
                cell("ipt-late")
            );
        }
        if upstream.is_some() {
            let _ = write!(
                s,
                " {} | {} | {} |",
                cell("up-early"),
                cell("up-middle"),
                cell("up-late")
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\n### Per-service counters: connect p50 ÷ the no-rules floor of the same pass, counters on / off (one run, on first; change)\n"
    );
    let _ = writeln!(
        s,
        "| services | floor p50 on / off (µs) | early service | middle service | late service |\n|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let p50 = |label: &str| r.dp(label).map(|[_, b, _]| b);
        let floors = (p50("floor"), p50("nc-floor"));
        let cell = |label: &str| match (p50(label), p50(&format!("nc-{label}")), floors) {
            (Some(on), Some(off), (Some(f_on), Some(f_off))) => {
                let (a, b) = (on / f_on, off / f_off);
                format!("{a:.2}× / {b:.2}× ({:+.1}%)", (a / b - 1.0) * 100.0)
            }
            _ => "–".into(),
        };
        let floor = match floors {
            (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {floor} | {} | {} | {} |",
            r.get("size"),
            cell("early"),
            cell("middle"),
            cell("late")
        );
    }
    let _ = writeln!(
        s,
        "\n### The client outside the cluster CIDR (masqueraded, the first table) / inside it (a pod: not masqueraded): connect p50 ÷ the no-rules floor of the same pass\n"
    );
    let _ = writeln!(
        s,
        "| services | floor p50 outside / inside (µs) | pod via node | early service | middle service | late service |\n|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let p50 = |label: &str| r.dp(label).map(|[_, b, _]| b);
        let floors = (p50("floor"), p50("in-floor"));
        let cell = |label: &str| match (p50(label), p50(&format!("in-{label}")), floors) {
            (Some(out), Some(inside), (Some(f_out), Some(f_in))) => {
                format!("{:.2}× / {:.2}×", out / f_out, inside / f_in)
            }
            _ => "–".into(),
        };
        let floor = match floors {
            (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {floor} | {} | {} | {} | {} |",
            r.get("size"),
            cell("pod"),
            cell("early"),
            cell("middle"),
            cell("late")
        );
    }
    let _ = writeln!(
        s,
        "\n### A pod through the node, with only conntrack, with conntrack and the NAT hooks (no rules), and with verdict's rules; a Service from a pod; both again while a socket follows the node's connections (the flow stream once a reader asks, or with --flows): connect p50 ÷ the no-rules floor of the same pass\n"
    );
    let _ = writeln!(
        s,
        "| services | conntrack only | conntrack and NAT hooks | verdict's rules | a Service from a pod (late) | verdict's rules, followed | a Service from a pod, followed |\n|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let ratio = |target: &str, floor: &str| match (r.dp(target), r.dp(floor)) {
            (Some([_, t, _]), Some([_, f, _])) => format!("{:.2}×", t / f),
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.get("size"),
            ratio("ct-pod", "ct-floor"),
            ratio("nat-pod", "nat-floor"),
            ratio("pod", "floor"),
            ratio("in-late", "in-floor"),
            ratio("ev-pod", "ev-floor"),
            ratio("ev-late", "ev-floor")
        );
    }
    if runs.iter().any(|r| r.dp("abl-none-floor").is_some()) {
        let _ = writeln!(
            s,
            "\n### `--ablate`: verdict's ruleset (the client inside the cluster CIDR) loaded again with groups of its rules taken out: connect p50 ÷ the no-rules floor of the same pass, a pod via the node / the late Service\n"
        );
        let names = crate::ABLATIONS.map(|(name, _)| name);
        let _ = writeln!(
            s,
            "| services | {} |\n|---:|{}",
            names.join(" | "),
            "---:|".repeat(names.len())
        );
        for r in runs {
            let cell = |name: &str| {
                let p50 = |t: &str| r.dp(&format!("abl-{name}-{t}")).map(|[_, b, _]| b);
                match (p50("pod"), p50("late"), p50("floor")) {
                    (Some(p), Some(l), Some(f)) => format!("{:.2}× / {:.2}×", p / f, l / f),
                    _ => "–".into(),
                }
            };
            let cells: Vec<String> = names.iter().map(|n| cell(n)).collect();
            let _ = writeln!(s, "| {} | {} |", r.get("size"), cells.join(" | "));
        }
    }
    let failures: usize = runs.iter().map(Run::dp_failures).sum();
    let samples = runs.first().map_or("?", |r| r.get("samples"));
    let _ = writeln!(
        s,
        "\n{samples} new connections per target after 50 warm-up, targets interleaved in a shuffled order; {failures} failed connections in all."
    );
    s
}

/// One plotted series: name, colour, and how to read its value from a run.
type Series = (&'static str, &'static str, Box<dyn Fn(&Run) -> Option<f64>>);

/// A two-panel SVG: cold sync time and late-service p50 ratio, per size.
/// A panel's horizontal grid line at `y`, labelled on its left.
pub(crate) fn grid_line(s: &mut String, x0: f64, width: f64, y: f64, label: &str) {
    let _ = writeln!(
        s,
        "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
        x0 + width,
        x0 - 4.0,
        y + 4.0
    );
}

pub fn svg(runs: &[Run], k: usize) -> String {
    let (w, h, pad) = (760.0, 300.0, 50.0);
    let panel_w = (w - 3.0 * pad) / 2.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let panels: [(&str, Vec<Series>); 2] = [
        (
            "cold full sync (s), log scale",
            vec![
                (
                    "verdict",
                    "#1f77b4",
                    Box::new(|r: &Run| r.num("cold_wall_ms").map(|v| v / 1000.0)),
                ),
                (
                    "iptables",
                    "#d62728",
                    Box::new(|r: &Run| r.num("ipt_load_wall_ms").map(|v| v / 1000.0)),
                ),
                (
                    "kube-proxy nftables",
                    "#2ca02c",
                    Box::new(|r: &Run| r.num("up_load_wall_ms").map(|v| v / 1000.0)),
                ),
            ],
        ),
        (
            "late service p50 ÷ floor p50",
            vec![
                ("verdict", "#1f77b4", Box::new(|r: &Run| r.ratio("late", 1))),
                (
                    "iptables",
                    "#d62728",
                    Box::new(|r: &Run| r.ratio("ipt-late", 1)),
                ),
                (
                    "kube-proxy nftables",
                    "#2ca02c",
                    Box::new(|r: &Run| r.ratio("up-late", 1)),
                ),
            ],
        ),
    ];
    for (p, (title, series)) in panels.iter().enumerate() {
        let x0 = pad + p as f64 * (panel_w + pad);
        let (y0, y1) = (pad, h - pad);
        let log = p == 0;
        let vals: Vec<f64> = series
            .iter()
            .flat_map(|(_, _, f)| runs.iter().filter_map(f))
            .collect();
        let max = vals
            .iter()
            .copied()
            .fold(f64::MIN, f64::max)
            .max(if log { 1.0 } else { 2.0 });
        let min = if log {
            vals.iter()
                .copied()
                .fold(f64::MAX, f64::min)
                .clamp(1e-3, 0.01)
        } else {
            0.0
        };
        let ty = |v: f64| {
            let f = if log {
                (v.ln() - min.ln()) / (max.ln() - min.ln())
            } else {
                (v - min) / (max - min)
            };
            y1 - f * (y1 - y0)
        };
        let n = runs.len().max(1) as f64;
        let tx = |i: usize| x0 + (i as f64 + 0.5) * panel_w / n;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{title}</text>",
            x0,
            y0 - 15.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{x0}\" y1=\"{y1}\" x2=\"{}\" y2=\"{y1}\" stroke=\"black\"/><line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"black\"/>",
            x0 + panel_w
        );
        for (tick, label) in if log {
            vec![
                (0.01, "0.01"),
                (0.1, "0.1"),
                (1.0, "1"),
                (10.0, "10"),
                (100.0, "100"),
                (1000.0, "1000"),
            ]
        } else {
            vec![
                (1.0, "1"),
                (2.0, "2"),
                (5.0, "5"),
                (10.0, "10"),
                (20.0, "20"),
            ]
        } {
            if tick >= min && tick <= max {
                grid_line(&mut s, x0, panel_w, ty(tick), label);
            }
        }
        for (i, r) in runs.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                tx(i),
                y1 + 15.0,
                r.get("size")
            );
        }
        for (si, (name, color, f)) in series.iter().enumerate() {
            let pts: Vec<(f64, f64)> = runs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| f(r).map(|v| (tx(i), ty(v))))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                path.join(" ")
            );
            for (x, y) in &pts {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{color}\"/>"
                );
            }
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>",
                x0 + 8.0 + 70.0 * si as f64,
                y0 + 12.0
            );
        }
    }
    let _ = writeln!(
        s,
        "<text x=\"{pad}\" y=\"{}\">services (x), {k} endpoints each</text>\n</svg>",
        h - 10.0
    );
    s
}
