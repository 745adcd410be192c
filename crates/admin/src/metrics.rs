//! kube-proxy's `kubeproxy_*` metrics (reference §6.1): the same names,
//! types, labels and help texts (with component-base's `[ALPHA]` stability
//! prefix), rendered in Prometheus' text exposition format. A small
//! registry of its own: counters, gauges and histograms with labels.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What kind of metric a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Set to a value.
    Gauge,
    /// Observations counted into buckets.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Clone, Debug)]
enum Series {
    Value(f64),
    Histogram {
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

#[derive(Clone, Debug)]
struct Family {
    help: &'static str,
    /// component-base's stability level (`ALPHA`, `BETA`, `STABLE`),
    /// printed before the help; empty for client_golang's own metrics.
    stability: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    buckets: Vec<f64>,
    series: BTreeMap<Vec<String>, Series>,
}

/// `kubeproxy_sync_proxy_rules_duration_seconds`.
pub const SYNC_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
/// `kubeproxy_sync_full_proxy_rules_duration_seconds`.
pub const SYNC_FULL_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
/// `kubeproxy_sync_partial_proxy_rules_duration_seconds`.
pub const SYNC_PARTIAL_DURATION: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
/// `kubeproxy_network_programming_duration_seconds`.
pub const NETWORK_PROGRAMMING: &str = "kubeproxy_network_programming_duration_seconds";
/// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
pub const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
/// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`.
pub const LAST_QUEUED: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
/// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`.
pub const ENDPOINT_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
/// `kubeproxy_sync_proxy_rules_endpoint_changes_total`.
pub const ENDPOINT_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
/// `kubeproxy_sync_proxy_rules_service_changes_pending`.
pub const SERVICE_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_service_changes_pending";
/// `kubeproxy_sync_proxy_rules_service_changes_total`.
pub const SERVICE_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
/// `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
pub const NO_LOCAL_ENDPOINTS: &str = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
/// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`.
pub const NFTABLES_SYNC_FAILURES: &str = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total";
/// `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`.
pub const NFTABLES_CLEANUP_FAILURES: &str =
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total";
/// `kubeproxy_proxy_healthz_total`.
pub const HEALTHZ_TOTAL: &str = "kubeproxy_proxy_healthz_total";
/// `kubeproxy_proxy_livez_total`.
pub const LIVEZ_TOTAL: &str = "kubeproxy_proxy_livez_total";
/// `kubeproxy_conntrack_reconciler_sync_duration_seconds`.
pub const CONNTRACK_DURATION: &str = "kubeproxy_conntrack_reconciler_sync_duration_seconds";
/// `kubeproxy_conntrack_reconciler_deleted_entries_total`.
pub const CONNTRACK_DELETED: &str = "kubeproxy_conntrack_reconciler_deleted_entries_total";

const FAMILY: &[&str] = &["ip_family"];

/// `verdict_foreign_changes_total`: commits by other processes that
/// changed verdict's tables (each brings a full resync).
pub const FOREIGN_CHANGES: &str = "verdict_foreign_changes_total";
/// `verdict_quarantined_service_port`: 1 for each service port with
/// elements the kernel refused, left out of the rules until it changes.
pub const QUARANTINED: &str = "verdict_quarantined_service_port";
/// `verdict_quarantines_total`: how many times a service port was
/// quarantined.
pub const QUARANTINES_TOTAL: &str = "verdict_quarantines_total";
/// `verdict_destination_conflicts`: 1 for each service port left without
/// a destination (an address and port, or a node port) that another
/// Service holds.
pub const DESTINATION_CONFLICTS: &str = "verdict_destination_conflicts";
/// `verdict_staged_jumps{ip_family}`: jumps an incremental sync put in the
/// staging sets instead of their verdict map (so that the kernel does not
/// validate the whole table), until the compaction moves them there.
pub const STAGED_JUMPS: &str = "verdict_staged_jumps";

/// `verdict_flows_recorded_total{verdict}`: connections the flow stream
/// recorded (`--flows`).
pub const FLOWS_RECORDED: &str = "verdict_flows_recorded_total";
/// `verdict_flows_evicted_total`: recorded flows dropped from the ring to
/// make room for newer ones.
pub const FLOWS_EVICTED: &str = "verdict_flows_evicted_total";
/// `verdict_flows_folded_total`: recorded flows of a client past its share
/// of the full ring, dropped for the same client's newer ones.
pub const FLOWS_FOLDED: &str = "verdict_flows_folded_total";
/// `verdict_flow_log_folded_total`: flows written in the flow log's
/// aggregated lines, past its rate, instead of a line of their own.
pub const FLOW_LOG_FOLDED: &str = "verdict_flow_log_folded_total";
/// `verdict_flow_log_lost_total{reason}`: flows the flow log left out.
pub const FLOW_LOG_LOST: &str = "verdict_flow_log_lost_total";
/// `verdict_flow_log_rotations_total`: flow log files rotated at the cap.
pub const FLOW_LOG_ROTATIONS: &str = "verdict_flow_log_rotations_total";
/// `verdict_flows_not_recorded_total{reason}`: the kernel's reports of
/// connections the stream lost (`kernel_buffer`: the reader fell behind).
pub const FLOWS_NOT_RECORDED: &str = "verdict_flows_not_recorded_total";

/// `kubernetes_build_info`: 1, labelled with what this build is.
pub const BUILD_INFO: &str = "kubernetes_build_info";
/// `kubernetes_feature_enabled`: 1 or 0 per feature gate.
pub const FEATURE_ENABLED: &str = "kubernetes_feature_enabled";
/// `rest_client_requests_total`: API requests by code, method and host.
pub const REST_CLIENT_REQUESTS: &str = "rest_client_requests_total";
/// `rest_client_request_duration_seconds`: API request latency.
pub const REST_CLIENT_DURATION: &str = "rest_client_request_duration_seconds";
/// `kubernetes_healthcheck` (on `/metrics/slis`).
pub const HEALTHCHECK: &str = "kubernetes_healthcheck";
/// `kubernetes_healthchecks_total` (on `/metrics/slis`).
pub const HEALTHCHECKS_TOTAL: &str = "kubernetes_healthchecks_total";

/// The labels of `kubernetes_build_info`, in order.
pub const BUILD_INFO_LABELS: &[&str] = &[
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
];

/// `prometheus.ExponentialBuckets(start, factor, count)`.
fn exponential(start: f64, factor: f64, count: usize) -> Vec<f64> {
    (0..count)
        .scan(start, |b, _| {
            let v = *b;
            *b *= factor;
            Some(v)
        })
        .collect()
}

/// kube-proxy's network-programming buckets: 0, 0.25, 0.5, 1…59, 60…115
/// by 5, 120…300 by 30 (its `merge` starts with a 0 bucket).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..60).map(f64::from));
    b.extend((0..12).map(|i| f64::from(60 + 5 * i)));
    b.extend((0..7).map(|i| f64::from(120 + 30 * i)));
    b
}

/// The registry, holding every kube-proxy metric of nftables mode.
#[derive(Clone, Debug)]
pub struct Metrics {
    families: BTreeMap<&'static str, Family>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric kube-proxy's nftables mode registers.
    pub fn new() -> Metrics {
        let sync = exponential(0.001, 2.0, 15);
        let mut m = Metrics {
            families: BTreeMap::new(),
        };
        let mut add = |name, kind, labels, help, buckets: Vec<f64>| {
            m.families.insert(
                name,
                Family {
                    help,
                    stability: "ALPHA",
                    kind,
                    labels,
                    buckets,
                    series: BTreeMap::new(),
                },
            );
        };
        use Kind::*;
        add(
            SYNC_DURATION,
            Histogram,
            FAMILY,
            "SyncProxyRules latency in seconds",
            sync.clone(),
        );
        add(
            SYNC_FULL_DURATION,
            Histogram,
            FAMILY,
            "SyncProxyRules latency in seconds for full resyncs",
            sync.clone(),
        );
        add(
            SYNC_PARTIAL_DURATION,
            Histogram,
            FAMILY,
            "SyncProxyRules latency in seconds for partial resyncs",
            sync,
        );
        add(
            NETWORK_PROGRAMMING,
            Histogram,
            FAMILY,
            "In Cluster Network Programming Latency in seconds",
            network_programming_buckets(),
        );
        add(
            LAST_SYNC,
            Gauge,
            FAMILY,
            "The last time proxy rules were successfully synced",
            vec![],
        );
        add(
            LAST_QUEUED,
            Gauge,
            FAMILY,
            "The last time a sync of proxy rules was queued",
            vec![],
        );
        add(
            ENDPOINT_CHANGES_PENDING,
            Gauge,
            &[],
            "Pending proxy rules Endpoint changes",
            vec![],
        );
        add(
            ENDPOINT_CHANGES_TOTAL,
            Counter,
            &[],
            "Cumulative proxy rules Endpoint changes",
            vec![],
        );
        add(
            SERVICE_CHANGES_PENDING,
            Gauge,
            &[],
            "Pending proxy rules Service changes",
            vec![],
        );
        add(
            SERVICE_CHANGES_TOTAL,
            Counter,
            &[],
            "Cumulative proxy rules Service changes",
            vec![],
        );
        add(
            NO_LOCAL_ENDPOINTS,
            Gauge,
            &["ip_family", "traffic_policy"],
            "Number of services with a Local traffic policy and no endpoints",
            vec![],
        );
        add(
            NFTABLES_SYNC_FAILURES,
            Counter,
            FAMILY,
            "Cumulative proxy nftables sync failures",
            vec![],
        );
        add(
            NFTABLES_CLEANUP_FAILURES,
            Counter,
            FAMILY,
            "Cumulative proxy nftables cleanup failures",
            vec![],
        );
        add(
            HEALTHZ_TOTAL,
            Counter,
            &["code"],
            "Cumulative proxy healthz HTTP status",
            vec![],
        );
        add(
            LIVEZ_TOTAL,
            Counter,
            &["code"],
            "Cumulative proxy livez HTTP status",
            vec![],
        );
        add(
            CONNTRACK_DURATION,
            Histogram,
            FAMILY,
            "ReconcileConntrackFlowsLatency latency in seconds",
            exponential(0.001, 2.0, 15),
        );
        add(
            CONNTRACK_DELETED,
            Counter,
            FAMILY,
            "Cumulative conntrack flows deleted by conntrack reconciler",
            vec![],
        );
        add(
            FOREIGN_CHANGES,
            Counter,
            FAMILY,
            "Commits by other processes that changed verdict's tables; each is repaired by a full resync",
            vec![],
        );
        add(
            QUARANTINED,
            Gauge,
            &["ip_family", "namespace", "service", "port"],
            "Service ports with elements the kernel refused, left out of the rules until the Service changes (1 each)",
            vec![],
        );
        add(
            DESTINATION_CONFLICTS,
            Gauge,
            &["ip_family", "namespace", "service", "port"],
            "Service ports left without an address and port (or node port) that another Service holds (1 each)",
            vec![],
        );
        add(
            STAGED_JUMPS,
            Gauge,
            FAMILY,
            "Jumps held in the staging sets until the next compaction moves them into their verdict maps",
            vec![],
        );
        add(
            FLOWS_RECORDED,
            Counter,
            &["verdict"],
            "Connections the flow stream recorded, by verdict (forwarded, rejected, dropped)",
            vec![],
        );
        add(
            FLOWS_EVICTED,
            Counter,
            &[],
            "Recorded flows evicted from the flow stream's ring to make room for newer ones",
            vec![],
        );
        add(
            FLOWS_FOLDED,
            Counter,
            &[],
            "Recorded flows of a client past its share of the full ring, dropped for the same client's newer ones instead of evicting other clients' (the aggregated flows still count them)",
            vec![],
        );
        add(
            FLOW_LOG_FOLDED,
            Counter,
            &[],
            "Flows written in the flow log's aggregated lines (one per client, Service, endpoint and outcome every 15 s) instead of a line of their own, past --flow-log-rate",
            vec![],
        );
        add(
            FLOW_LOG_LOST,
            Counter,
            &["reason"],
            "Flows the flow log left out (budget: past its rate, with no room left among the aggregated lines of the window; write_error: the log could not be written)",
            vec![],
        );
        add(
            FLOW_LOG_ROTATIONS,
            Counter,
            &[],
            "Flow log files rotated at --flow-log-max-size",
            vec![],
        );
        add(
            FLOWS_NOT_RECORDED,
            Counter,
            &["reason"],
            "Connections the flow stream did not record (kernel_buffer: the kernel dropped their reports because the reader fell behind; log_rate_limit: refusals the kernel counted past its log rate limit, as of the last reading of its counters; aggregate_budget: flows the aggregated flows had no room for)",
            vec![],
        );
        add(
            QUARANTINES_TOTAL,
            Counter,
            FAMILY,
            "Service ports with elements quarantined because the kernel refused them",
            vec![],
        );
        m.generic();
        for f in m.families.values_mut() {
            if f.labels.is_empty() {
                f.series.insert(Vec::new(), Series::Value(0.0));
            }
        }
        m
    }

    fn family(
        &mut self,
        name: &'static str,
        kind: Kind,
        stability: &'static str,
        labels: &'static [&'static str],
        help: &'static str,
        buckets: Vec<f64>,
    ) {
        self.families.insert(
            name,
            Family {
                help,
                stability,
                kind,
                labels,
                buckets,
                series: BTreeMap::new(),
            },
        );
    }

    /// The metrics every Kubernetes component has: its build, its feature
    /// gates, and its API client's requests.
    fn generic(&mut self) {
        self.family(
            BUILD_INFO,
            Kind::Gauge,
            "BETA",
            BUILD_INFO_LABELS,
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
            vec![],
        );
        self.family(
            FEATURE_ENABLED,
            Kind::Gauge,
            "BETA",
            &["name", "stage"],
            "This metric records the data about the stage and enablement of a k8s feature.",
            vec![],
        );
        self.family(
            REST_CLIENT_REQUESTS,
            Kind::Counter,
            "BETA",
            &["code", "host", "method"],
            "Number of HTTP requests, partitioned by status code, method, and host.",
            vec![],
        );
        self.family(
            REST_CLIENT_DURATION,
            Kind::Histogram,
            "BETA",
            &["host", "verb"],
            "Request latency in seconds. Broken down by verb, and host.",
            vec![
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ],
        );
    }

    /// component-base's `/metrics/slis`: the results of health checks.
    pub fn slis() -> Metrics {
        let mut m = Metrics {
            families: BTreeMap::new(),
        };
        m.family(
            HEALTHCHECK,
            Kind::Gauge,
            "STABLE",
            &["name", "type"],
            "This metric records the result of a single healthcheck.",
            vec![],
        );
        m.family(
            HEALTHCHECKS_TOTAL,
            Kind::Counter,
            "STABLE",
            &["name", "status", "type"],
            "This metric records the results of all healthcheck.",
            vec![],
        );
        m
    }

    /// The series of `name` with these label values (created at zero),
    /// and the family's bucket bounds.
    fn series(&mut self, name: &str, labels: &[&str]) -> Option<(&mut Series, &[f64])> {
        let Family {
            kind,
            labels: names,
            buckets,
            series,
            ..
        } = self.families.get_mut(name)?;
        if labels.len() != names.len() {
            return None;
        }
        let key = labels.iter().map(|l| (*l).to_owned()).collect();
        let s = series.entry(key).or_insert_with(|| match kind {
            Kind::Histogram => Series::Histogram {
                counts: vec![0; buckets.len()],
                sum: 0.0,
                count: 0,
            },
            _ => Series::Value(0.0),
        });
        Some((s, buckets.as_slice()))
    }

    /// Adds `by` to a counter (or gauge). Unknown names or a wrong number
    /// of labels are ignored: metrics never break the proxy.
    pub fn add(&mut self, name: &str, labels: &[&str], by: f64) {
        if let Some((Series::Value(v), _)) = self.series(name, labels) {
            *v += by;
        }
    }

    /// Sets a gauge.
    pub fn set(&mut self, name: &str, labels: &[&str], value: f64) {
        if let Some((Series::Value(v), _)) = self.series(name, labels) {
            *v = value;
        }
    }

    /// Removes a series (a gauge about an object that is gone).
    pub fn remove(&mut self, name: &str, labels: &[&str]) {
        if let Some(f) = self.families.get_mut(name) {
            let key: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
            f.series.remove(&key);
        }
    }

    /// Creates the series at zero, so that it is exported before it moves.
    pub fn touch(&mut self, name: &str, labels: &[&str]) {
        let _ = self.series(name, labels);
    }

    /// Records one observation in a histogram.
    pub fn observe(&mut self, name: &str, labels: &[&str], value: f64) {
        if let Some((Series::Histogram { counts, sum, count }, bounds)) = self.series(name, labels)
        {
            for (c, b) in counts.iter_mut().zip(bounds) {
                if value <= *b {
                    *c += 1;
                }
            }
            *sum += value;
            *count += 1;
        }
    }

    /// The names and types of every metric, as `name type` lines.
    pub fn catalogue(&self) -> String {
        self.families
            .iter()
            .map(|(n, f)| format!("{n} {}\n", f.kind.as_str()))
            .collect()
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, f) in &self.families {
            if f.series.is_empty() {
                continue;
            }
            if f.stability.is_empty() {
                let _ = writeln!(out, "# HELP {name} {}", f.help);
            } else {
                let _ = writeln!(out, "# HELP {name} [{}] {}", f.stability, f.help);
            }
            let _ = writeln!(out, "# TYPE {name} {}", f.kind.as_str());
            for (values, s) in &f.series {
                let pairs: Vec<String> = f
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let braces = |extra: Option<String>| {
                    let mut all = pairs.clone();
                    all.extend(extra);
                    if all.is_empty() {
                        String::new()
                    } else {
                        format!("{{{}}}", all.join(","))
                    }
                };
                match s {
                    Series::Value(v) => {
                        let _ = writeln!(out, "{name}{} {}", braces(None), number(*v));
                    }
                    Series::Histogram { counts, sum, count } => {
                        for (b, c) in f.buckets.iter().zip(counts) {
                            let le = Some(format!("le=\"{}\"", number(*b)));
                            let _ = writeln!(out, "{name}_bucket{} {c}", braces(le));
                        }
                        let inf = Some("le=\"+Inf\"".to_owned());
                        let _ = writeln!(out, "{name}_bucket{} {count}", braces(inf));
                        let _ = writeln!(out, "{name}_sum{} {}", braces(None), number(*sum));
                        let _ = writeln!(out, "{name}_count{} {count}", braces(None));
                    }
                }
            }
        }
        out
    }
}

/// Label values escape `\`, `"` and newlines.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Numbers as Prometheus writes them (integers without a fraction).
pub(crate) fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names and types kube-proxy's nftables mode exports (reference
    /// §6.1), then verdict's own.
    #[test]
    fn names_and_types_match_kube_proxy() {
        assert_eq!(
            Metrics::new().catalogue(),
            "\
kubeproxy_conntrack_reconciler_deleted_entries_total counter
kubeproxy_conntrack_reconciler_sync_duration_seconds histogram
kubeproxy_network_programming_duration_seconds histogram
kubeproxy_proxy_healthz_total counter
kubeproxy_proxy_livez_total counter
kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_partial_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_total counter
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_total counter
kubernetes_build_info gauge
kubernetes_feature_enabled gauge
rest_client_request_duration_seconds histogram
rest_client_requests_total counter
verdict_destination_conflicts gauge
verdict_flow_log_folded_total counter
verdict_flow_log_lost_total counter
verdict_flow_log_rotations_total counter
verdict_flows_evicted_total counter
verdict_flows_folded_total counter
verdict_flows_not_recorded_total counter
verdict_flows_recorded_total counter
verdict_foreign_changes_total counter
verdict_quarantined_service_port gauge
verdict_quarantines_total counter
verdict_staged_jumps gauge
"
        );
    }

    #[test]
    fn renders_the_text_format() {
        let mut m = Metrics::new();
        m.observe(SYNC_DURATION, &["IPv4"], 0.003);
        m.observe(SYNC_DURATION, &["IPv4"], 20.0);
        m.add(ENDPOINT_CHANGES_TOTAL, &[], 2.0);
        m.add(HEALTHZ_TOTAL, &["200"], 1.0);
        m.set(NO_LOCAL_ENDPOINTS, &["IPv4", "external"], 3.0);
        m.add(HEALTHZ_TOTAL, &["wrong", "arity"], 1.0); // ignored
        let text = m.render();
        for line in [
            "# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds",
            "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"} 0",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.004\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 2",
            "kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 20.003",
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 2",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 2",
            "kubeproxy_sync_proxy_rules_service_changes_pending 0",
            "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("arity"));
        // Families without a series yet are not listed.
        assert!(!text.contains("kubeproxy_proxy_livez_total"));
    }

    #[test]
    fn network_programming_buckets_are_kube_proxys() {
        let b = network_programming_buckets();
        assert_eq!(b.len(), 3 + 59 + 12 + 7);
        assert_eq!(&b[..4], &[0.0, 0.25, 0.5, 1.0]);
        assert_eq!(b[61], 59.0);
        assert_eq!(b[62], 60.0);
        assert_eq!(b[73], 115.0);
        assert_eq!(b[74], 120.0);
        assert_eq!(b[80], 300.0);
    }
}
