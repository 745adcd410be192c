//! The HTTP endpoints, as kube-proxy serves them.
//! - Health address (`healthzBindAddress`): `/healthz` and `/livez`.
//! - Metrics address (`metricsBindAddress`): `/metrics` (gzip when asked),
//!   `/healthz` and `/healthz/ping` (component-base's `ok`), `/proxyMode`,
//!   `/configz` (the running configuration), `/metrics/slis` (the health
//!   checks' results); with `enableProfiling`, `/debug/pprof/` (memory,
//!   threads) and `/debug/flags/v` (`PUT` a number to change the log
//!   verbosity); verdict's introspection API, `/api/v1/…`, and its web
//!   view, `/ui` (`daemon/api.rs`).
//!
//! A port that cannot be bound is tried again every 5 s, as kube-proxy
//! does, unless `bindAddressHardFail`, which makes it fatal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use std::{fmt, io};
use verdict_admin::time::Moment;

use verdict_admin::http::{Handler, Request, Routes};
use verdict_admin::metrics as m;
use verdict_admin::zpages::ZPages;
use verdict_admin::{Health, Metrics, Response, Stream};

use crate::logging::Verbosity;

const PLAIN: &str = "text/plain; charset=utf-8";
/// Prometheus' text exposition format, with the escaping scheme
/// kube-proxy 1.36's client_golang names (its names need none).
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores";
/// How often a port that could not be bound is tried again.
const REBIND_EVERY: Duration = Duration::from_secs(5);

/// The answers of `/healthz` and `/livez`, by code, counted without the
/// metrics' lock (a probe never waits for a scrape): written into the
/// registry when `/metrics` is rendered.
#[derive(Debug, Default)]
pub struct ProbeCounts {
    /// (`/healthz` 200, 503), (`/livez` 200, 503).
    counts: [[AtomicU64; 2]; 2],
}

impl ProbeCounts {
    fn count(&self, livez: bool, code: u16) {
        let i = usize::from(code != 200);
        self.counts[usize::from(livez)][i].fetch_add(1, Ordering::Relaxed);
    }

    /// Writes the counts into the registry.
    pub fn record(&self, x: &mut Metrics) {
        for (livez, name) in [(false, m::HEALTHZ_TOTAL), (true, m::LIVEZ_TOTAL)] {
            for (i, code) in ["200", "503"].iter().enumerate() {
                let n = self.counts[usize::from(livez)][i].load(Ordering::Relaxed);
                if n > 0 {
                    x.set(name, &[code], n as f64);
                }
            }
        }
    }
}

/// Text written into a byte stream; the stream's error is kept, since
/// `fmt::Error` carries none.
struct Text<'a> {
    out: &'a mut dyn io::Write,
    error: Option<io::Error>,
}

impl fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.out.write_all(s.as_bytes()).map_err(|e| {
            self.error = Some(e);
            fmt::Error
        })
    }
}

/// What the metrics address serves.
#[derive(Clone)]
pub struct MetricsSite {
    /// The registry of `/metrics`.
    pub metrics: Arc<Mutex<Metrics>>,
    /// The health probes' answers, counted apart.
    pub probes: Arc<ProbeCounts>,
    /// The registry of `/metrics/slis`.
    pub slis: Arc<Mutex<Metrics>>,
    /// `/configz`'s answer.
    pub configz: String,
    /// `/flagz` and `/statusz`.
    pub zpages: Arc<ZPages>,
    /// `/debug/*` is served.
    pub profiling: bool,
    /// What `/debug/flags/v` changes.
    pub verbosity: Verbosity,
    /// The introspection API (`/api/v1/…`), when the daemon serves it.
    pub api: Option<Handler>,
    /// More of `/metrics`: verdict's per-service counters, read from the
    /// kernel (`--service-counters`).
    pub more_metrics: Option<verdict_node::api::WriteText>,
    /// Reads the kernel's counters (at most every few seconds) before
    /// the registry is written: a reading sets series of the registry
    /// (refusals past the log rate limit), which are then current.
    pub refresh: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// The routes of the health address: every one is fast, answered from
/// the health state alone.
pub fn health_routes(health: Arc<Mutex<Health>>, probes: Arc<ProbeCounts>) -> Routes {
    Routes::fast(Arc::new(move |req: &Request| {
        let (answer, livez) = {
            let h = health.lock().unwrap_or_else(|e| e.into_inner());
            match req.path.as_str() {
                "/healthz" => (h.healthz(Moment::now()), false),
                "/livez" => (h.livez(Moment::now()), true),
                _ => return None,
            }
        };
        probes.count(livez, answer.code);
        Some(answer)
    }))
}

/// The top-level paths the metrics address serves, as `/statusz` lists
/// them.
pub fn metrics_paths(profiling: bool) -> Vec<String> {
    let mut paths: Vec<String> = [
        "/configz",
        "/flagz",
        "/healthz",
        "/metrics",
        "/proxyMode",
        "/statusz",
    ]
    .map(String::from)
    .to_vec();
    if profiling {
        paths.push("/debug".into());
    }
    paths
}

/// The routes of the metrics address: its health paths fast, the rest
/// (metrics, the API, the web view, debug) on the slow pool.
pub fn metrics_routes(site: MetricsSite) -> Routes {
    let fast = site.clone();
    let fast: Handler = Arc::new(move |req: &Request| fast.fast(req));
    let slow: Handler = Arc::new(move |req: &Request| site.answer(req));
    Routes::fast(fast).then_slow(slow)
}

impl MetricsSite {
    /// What is answered without waiting for anything: component-base's
    /// health, the proxy mode.
    fn fast(&self, req: &Request) -> Option<Response> {
        match req.path.as_str() {
            "/healthz" | "/healthz/ping" | "/proxyMode" => self.answer(req),
            _ => None,
        }
    }

    fn answer(&self, req: &Request) -> Option<Response> {
        let text = |body: &str| Some(Response::text(200, body.to_owned(), PLAIN));
        match req.path.as_str() {
            "/metrics" => Some(self.metrics(req)),
            "/healthz" => {
                // component-base's healthz with its one check, ping; the
                // root path records the result as an SLI.
                if let Ok(mut s) = self.slis.lock() {
                    s.set(m::HEALTHCHECK, &["ping", "healthz"], 1.0);
                    s.add(m::HEALTHCHECKS_TOTAL, &["ping", "success", "healthz"], 1.0);
                }
                if req.has_query("verbose") {
                    text("[+]ping ok\nhealthz check passed\n")
                } else {
                    text("ok")
                }
            }
            "/healthz/ping" => text("ok"),
            "/proxyMode" => text("nftables"),
            "/configz" => Some(Response::json(200, self.configz.clone())),
            "/flagz" => Some(self.zpages.flagz(req.header("accept"))),
            "/statusz" => Some(self.zpages.statusz(req.header("accept"), SystemTime::now())),
            "/metrics/slis" => {
                let mut s = self.slis.lock().ok()?;
                if req.method == "DELETE" {
                    *s = Metrics::slis();
                    return text("metrics reset\n");
                }
                let mut text = s.render();
                if let Some(p) = verdict_admin::process::Process::now() {
                    text.push_str(&p.render_start_time());
                }
                Some(Response::text(200, text, EXPOSITION))
            }
            path if self.profiling && path.starts_with("/debug/") => self.debug(req),
            path if path.starts_with("/api/") || path == "/ui" || path.starts_with("/ui/") => {
                self.api.as_ref().and_then(|api| api(req))
            }
            _ => None,
        }
    }

    /// `/metrics`: the registry, the counters and the process, gzipped if
    /// the scraper accepts it, written as the scraper takes it (the text
    /// is never whole in memory: 270,000 series are 35 MB).
    fn metrics(&self, req: &Request) -> Response {
        let gzip = req
            .header("accept-encoding")
            .is_some_and(|e| e.split(',').any(|c| c.trim().starts_with("gzip")));
        let site = self.clone();
        let stream = Stream::new(move |out| {
            if !gzip {
                return site.write_metrics(out);
            }
            let mut zipped = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            site.write_metrics(&mut zipped)?;
            zipped.finish().map(drop)
        });
        let mut r = Response::streamed(200, EXPOSITION, stream);
        if gzip {
            r.headers.push(("Content-Encoding", "gzip".into()));
        }
        r
    }

    /// The exposition of `/metrics`, written to `out`.
    fn write_metrics(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(refresh) = &self.refresh {
            refresh();
        }
        let registry = self
            .metrics
            .lock()
            .map(|mut x| {
                self.probes.record(&mut x);
                x.render()
            })
            .unwrap_or_default();
        out.write_all(registry.as_bytes())?;
        drop(registry);
        if let Some(more) = &self.more_metrics {
            let mut text = Text { out, error: None };
            if more(&mut text).is_err() {
                return Err(text
                    .error
                    .unwrap_or_else(|| io::Error::other("the counters could not be written")));
            }
        }
        if let Some(p) = verdict_admin::process::Process::now() {
            out.write_all(p.render().as_bytes())?;
        }
        Ok(())
    }

    /// `/debug/*`, with `enableProfiling`.
    fn debug(&self, req: &Request) -> Option<Response> {
        let text = |code: u16, body: String| Some(Response::text(code, body, PLAIN));
        match req.path.as_str() {
            "/debug/flags/v" => {
                if req.method != "PUT" {
                    return text(406, "unsupported http method\n".into());
                }
                let body = String::from_utf8_lossy(&req.body);
                match body.parse::<i32>() {
                    Ok(level) if level >= 0 => {
                        self.verbosity.set(level.unsigned_abs());
                        tracing::info!(verbosity = level, "log verbosity changed");
                        text(
                            200,
                            format!("successfully set klog.logging.verbosity to {level}\n"),
                        )
                    }
                    Ok(level) => text(
                        400,
                        format!("failed set klog.logging.verbosity {level}: must be 0 or more\n"),
                    ),
                    Err(e) => text(
                        400,
                        format!("failed set klog.logging.verbosity {body}: {e}\n"),
                    ),
                }
            }
            "/debug/pprof/" | "/debug/pprof" => text(
                200,
                "verdict profiles:\n  /debug/pprof/heap     memory of the process (/proc/self/status and smaps_rollup)\n  /debug/pprof/threads  the process's threads and their CPU time\n  /debug/flags/v        PUT a number to change the log verbosity\n".into(),
            ),
            "/debug/pprof/heap" => text(200, memory_report()),
            "/debug/pprof/threads" | "/debug/pprof/goroutine" => text(200, threads_report()),
            _ => None,
        }
    }
}

/// The memory lines of `/proc/self/status` and `/proc/self/smaps_rollup`.
fn memory_report() -> String {
    let mut out = String::from("# /proc/self/status\n");
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in status
        .lines()
        .filter(|l| l.starts_with("Vm") || l.starts_with("Rss"))
    {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("# /proc/self/smaps_rollup\n");
    out.push_str(&std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default());
    out
}

/// Every thread with its name and CPU time.
fn threads_report() -> String {
    let mut rows: Vec<(String, String, f64)> = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = entry.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let cpu = verdict_admin::process::cpu_seconds(&stat).unwrap_or(0.0);
        rows.push((
            entry.file_name().to_string_lossy().into_owned(),
            name.trim().to_owned(),
            cpu,
        ));
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut out = format!(
        "threads: {}\n{:>8}  {:<16} {:>10}\n",
        rows.len(),
        "tid",
        "name",
        "cpu_s"
    );
    for (tid, name, cpu) in rows {
        out.push_str(&format!("{tid:>8}  {name:<16} {cpu:>10.2}\n"));
    }
    out
}

/// Serves `handler` on `addr` (what it is, for the log). A port that
/// cannot be bound is an error with `hard_fail`; otherwise it is logged
/// and tried again every 5 s in the background.
pub fn serve(
    addr: SocketAddr,
    routes: Routes,
    what: &'static str,
    hard_fail: bool,
) -> std::io::Result<()> {
    match verdict_admin::http::serve(addr, routes.clone()) {
        Ok(bound) => {
            tracing::info!(%bound, "serving {what}");
            Ok(())
        }
        Err(e) if hard_fail => Err(e),
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot serve {what}: trying again every 5s");
            let retry = std::thread::Builder::new()
                .name(format!("bind-{}", addr.port()))
                .spawn(move || {
                    loop {
                        std::thread::sleep(REBIND_EVERY);
                        match verdict_admin::http::serve(addr, routes.clone()) {
                            Ok(bound) => {
                                tracing::info!(%bound, "serving {what}");
                                return;
                            }
                            Err(e) => tracing::debug!(%addr, error = %e, "cannot serve {what} yet"),
                        }
                    }
                });
            if let Err(e) = retry {
                tracing::error!(error = %e, "cannot start the thread that retries {what}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(profiling: bool) -> MetricsSite {
        MetricsSite {
            metrics: Arc::new(Mutex::new(Metrics::new())),
            probes: Arc::default(),
            slis: Arc::new(Mutex::new(Metrics::slis())),
            configz: "{\"kubeproxy.config.k8s.io\":{}}".into(),
            zpages: Arc::new(ZPages::new(
                "kube-proxy",
                [("proxy-mode".to_string(), "nftables".to_string())].into(),
                SystemTime::now(),
                "test",
                "rustc test",
                metrics_paths(profiling),
            )),
            profiling,
            verbosity: crate::logging::Verbosity::for_tests(1),
            api: None,
            more_metrics: None,
            refresh: None,
        }
    }

    #[test]
    fn the_metrics_address_serves_what_kube_proxys_does() {
        let s = site(false);
        let get = |t: &str| s.answer(&Request::get(t));
        assert_eq!(get("/healthz").unwrap().text_body(), "ok");
        assert_eq!(get("/healthz/ping").unwrap().text_body(), "ok");
        assert!(
            get("/healthz?verbose")
                .unwrap()
                .text_body()
                .contains("[+]ping ok")
        );
        assert_eq!(get("/proxyMode").unwrap().text_body(), "nftables");
        let c = get("/configz").unwrap();
        assert_eq!(c.content_type, "application/json");
        let f = get("/flagz").unwrap().text_body();
        assert!(
            f.starts_with("\nkube-proxy flagz\n") && f.contains("proxy-mode"),
            "{f}"
        );
        let z = get("/statusz").unwrap().text_body();
        assert!(
            z.contains("/configz /flagz /healthz /metrics /proxyMode\n"),
            "{z}"
        );
        let slis = get("/metrics/slis").unwrap().text_body();
        assert!(
            slis.contains(
                "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 2"
            ),
            "{slis}"
        );
        assert!(
            slis.contains("# HELP kubernetes_healthcheck [STABLE]"),
            "{slis}"
        );
        assert!(
            slis.lines()
                .any(|l| l.starts_with("process_start_time_seconds ")),
            "{slis}"
        );
        let metrics = get("/metrics").unwrap().text_body();
        assert!(
            metrics.contains("process_resident_memory_bytes "),
            "{metrics}"
        );
        assert!(get("/debug/pprof/heap").is_none(), "profiling is off");
        assert!(get("/nope").is_none());
    }

    #[test]
    fn metrics_are_gzipped_when_asked() {
        let s = site(false);
        let mut req = Request::get("/metrics");
        req.headers
            .push(("accept-encoding".into(), "gzip, deflate".into()));
        let r = s.answer(&req).unwrap();
        assert!(
            r.headers
                .iter()
                .any(|(k, v)| *k == "Content-Encoding" && v == "gzip")
        );
        let mut plain = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(&r.bytes()[..]),
            &mut plain,
        )
        .unwrap();
        assert!(
            plain.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total 0"),
            "{plain}"
        );
    }

    #[test]
    fn profiling_serves_debug_and_changes_verbosity() {
        let s = site(true);
        assert!(
            s.answer(&Request::get("/debug/pprof/heap"))
                .unwrap()
                .text_body()
                .contains("VmRSS")
        );
        assert!(
            s.answer(&Request::get("/debug/pprof/threads"))
                .unwrap()
                .text_body()
                .contains("threads: ")
        );
        let get = s.answer(&Request::get("/debug/flags/v")).unwrap();
        assert_eq!(get.code, 406);
        let mut put = Request::get("/debug/flags/v");
        put.method = "PUT".into();
        put.body = b"4".to_vec();
        let r = s.answer(&put).unwrap();
        assert_eq!(
            r.text_body(),
            "successfully set klog.logging.verbosity to 4\n"
        );
        assert_eq!(s.verbosity.get(), 4);
        put.body = b"4\n".to_vec();
        assert_eq!(
            s.answer(&put).unwrap().code,
            400,
            "no trimming, as upstream"
        );
    }
}
