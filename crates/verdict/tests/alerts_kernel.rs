//! The shipped alerts, judged on what a real verdict exports: verdict runs
//! in a network-namespace test bed with two Services without endpoints,
//! one chosen by `--service-metrics` and one not; a client is refused by
//! each once between scrapes of `/metrics`. The scraped series, with the
//! labels the PodMonitor adds, become promtool's input (one scrape a
//! minute), and promtool's rule tests say which alerts fire: the
//! per-Service alert for the chosen Service, naming it, and the node's
//! alert for the other one's rejects. Needs root and promtool.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use verdict_e2e::bed::Placement;
use verdict_e2e::netns::Process;

const MANIFESTS: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 172.30.0.41
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- {addresses: [10.180.0.1], nodeName: test-node}
---
apiVersion: v1
kind: Service
metadata: {name: counted, namespace: shop}
spec:
  clusterIP: 172.30.0.51
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: quiet, namespace: other}
spec:
  clusterIP: 172.30.0.52
  ports: [{name: http, port: 80, protocol: TCP}]
";

/// Scrapes taken, one a minute in promtool's time.
const SCRAPES: usize = 9;

/// The labels Prometheus adds to what it scrapes from the node's verdict
/// (`deploy/monitoring/podmonitor.yaml`).
const TARGET: &str = "job=\"kube-proxy\",instance=\"test-node\",pod=\"verdict-x7k2p\"";

/// The PrometheusRule's groups, as promtool reads them, into `dir`.
fn rules_file(dir: &Path) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring/prometheusrule.yaml");
    let rule: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    std::fs::write(
        dir.join("verdict-rules.yaml"),
        serde_saphyr::to_string(&rule["spec"]).unwrap(),
    )
    .unwrap();
}

/// Each series of the families the traffic alerts read, with its value
/// in each scrape (`None`: not exported then), its labels as promtool's
/// input gives them (the target's first).
fn series(scrapes: &[String]) -> BTreeMap<String, Vec<Option<f64>>> {
    let mut out: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    for (i, text) in scrapes.iter().enumerate() {
        for line in text.lines() {
            if !(line.starts_with("verdict_rejected_total{")
                || line.starts_with("verdict_service_rejected_total{"))
            {
                continue;
            }
            let (name_labels, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = name_labels.split_once('{').unwrap();
            let key = format!("{name}{{{TARGET},{labels}");
            out.entry(key).or_insert_with(|| vec![None; scrapes.len()])[i] =
                Some(value.parse().unwrap());
        }
    }
    out
}

#[test]
fn the_no_endpoint_alerts_fire_on_what_verdict_exports() {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir("alerts");
    write(&dir, "cluster.yaml", MANIFESTS);
    let dir_s = dir.to_string_lossy().into_owned();
    let mut args: Vec<String> = vec!["run".into()];
    args.extend(node_flags(&dir_s));
    // shop's Services are counted per Service; other/quiet only in the
    // node's totals.
    args.extend(
        [
            "--service-metrics",
            "service",
            "--service-metrics-namespaces",
            "shop",
        ]
        .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _daemon = Process(
        bed.node
            .spawn(env!("CARGO_BIN_EXE_verdict"), &args)
            .unwrap(),
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");

    // A scrape before any reject, then one after each round: a client
    // refused once by each Service (past the counters' 5 s cache).
    let mut scrapes = vec![http_on(&bed, 10249, "/metrics")];
    for _ in 1..SCRAPES {
        for service in ["172.30.0.51", "172.30.0.52"] {
            let answer = bed.connect(ip("10.0.0.2"), ip(service), "tcp", 80, 500);
            assert!(
                answer.as_deref().is_ok_and(|a| a == "REFUSED"),
                "{service}: {answer:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(5200));
        scrapes.push(http_on(&bed, 10249, "/metrics"));
    }
    let series = series(&scrapes);
    let node =
        format!("verdict_rejected_total{{{TARGET},ip_family=\"IPv4\",reason=\"no_endpoints\"}}");
    let counted = format!(
        "verdict_service_rejected_total{{{TARGET},ip_family=\"IPv4\",namespace=\"shop\",service=\"counted\",port=\"http\",reason=\"no_endpoints\"}}"
    );
    // What verdict exported: every reject counted, the chosen Service's
    // from its first one on, the other's nowhere but in the node's.
    assert_eq!(
        series[&node],
        (0..SCRAPES)
            .map(|i| Some(2.0 * i as f64))
            .collect::<Vec<_>>(),
        "{series:#?}"
    );
    assert_eq!(
        series[&counted],
        (0..SCRAPES)
            .map(|i| (i > 0).then_some(i as f64))
            .collect::<Vec<_>>(),
        "{series:#?}"
    );
    assert!(
        !series.keys().any(|k| k.contains("service=\"quiet\"")),
        "{series:#?}"
    );

    let input: Vec<Value> = series
        .iter()
        .map(|(k, values)| {
            let values: Vec<String> = values
                .iter()
                .map(|v| v.map_or("_".to_owned(), |v| v.to_string()))
                .collect();
            serde_json::json!({"series": k, "values": values.join(" ")})
        })
        .collect();
    let runbook = |alert: &str| {
        format!(
            "https://github.com/verdict-proxy/verdict/blob/main/docs/monitoring.md#{}",
            alert.to_lowercase()
        )
    };
    let target_labels = serde_json::json!({"job": "kube-proxy", "instance": "test-node", "pod": "verdict-x7k2p", "ip_family": "IPv4", "severity": "warning"});
    let mut per_service = target_labels.clone();
    for (k, v) in [
        ("namespace", "shop"),
        ("service", "counted"),
        ("port", "http"),
    ] {
        per_service[k] = v.into();
    }
    let tests = serde_json::json!({
        "rule_files": ["verdict-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                // Rejects since minute 1: not yet for 5 minutes.
                {"eval_time": "4m", "alertname": "VerdictServiceNoEndpoints", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "VerdictNoEndpointsTraffic", "exp_alerts": []},
                {"eval_time": "8m", "alertname": "VerdictServiceNoEndpoints", "exp_alerts": [{
                    "exp_labels": per_service,
                    "exp_annotations": {
                        "summary": "Clients keep connecting to shop/counted port http, which has no usable endpoint.",
                        "description": "For 5 minutes node test-node has rejected new IPv4 connections to Service shop/counted, port http (5 in the last 5 minutes): it has no ready or serving endpoint, so clients get a reset or \"port unreachable\".",
                        "runbook_url": runbook("VerdictServiceNoEndpoints"),
                    },
                }]},
                // other/quiet's rejects, which no per-Service series names.
                {"eval_time": "8m", "alertname": "VerdictNoEndpointsTraffic", "exp_alerts": [{
                    "exp_labels": target_labels,
                    "exp_annotations": {
                        "summary": "Node test-node keeps rejecting connections to Services with no usable endpoint.",
                        "description": "For 5 minutes node test-node has rejected new IPv4 connections to Services that have no ready or serving endpoint (5 in the last 5 minutes that no per-Service series names). `verdict services` and `verdict flows --verdict rejected` in its verdict pod name them.",
                        "runbook_url": runbook("VerdictNoEndpointsTraffic"),
                    },
                }]},
            ],
        }],
    });
    let work = scratch_dir("alerts-promtool");
    rules_file(&work);
    std::fs::write(
        work.join("real-series-test.yaml"),
        serde_saphyr::to_string(&tests).unwrap(),
    )
    .unwrap();
    println!(
        "{}",
        std::fs::read_to_string(work.join("real-series-test.yaml")).unwrap()
    );
    promtool(&["test", "rules", "real-series-test.yaml"], &work);
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&dir);
}
