//! The kernel's counts, as `/metrics` exports them, against a known
//! number of real connections: `verdict run --manifests` with
//! `--service-metrics endpoint --service-metrics-namespaces shop` on 100
//! Services in `shop` and 20 in `other`. Exactly the 100 get series of
//! their own, with exact counts per entry point and per endpoint; the
//! node's total holds every connection; and an endpoint's count survives
//! the removal of its sibling (which moves it to another slot of the
//! endpoint map). Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use verdict_e2e::bed::Placement;

use common::*;

fn service(ns: &str, name: &str, ip: &str, endpoints: &[&str]) -> String {
    let eps: String = endpoints
        .iter()
        .map(|e| format!("- {{addresses: [{e}], nodeName: test-node}}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n{eps}---\n"
    )
}

/// Every Service; `s1` with `s1_endpoints`.
fn manifests(s1_endpoints: &[&str]) -> String {
    let both = ["10.180.0.1", "10.180.0.2"];
    let mut out = String::new();
    for i in 0..100 {
        let eps: &[&str] = if i == 1 { s1_endpoints } else { &both };
        out.push_str(&service(
            "shop",
            &format!("s{i}"),
            &format!("172.30.1.{}", i + 1),
            eps,
        ));
    }
    for i in 0..20 {
        out.push_str(&service(
            "other",
            &format!("o{i}"),
            &format!("172.30.2.{}", i + 1),
            &both,
        ));
    }
    out
}

/// Every sample of `/metrics` whose name is `metric`, by its labels.
fn samples(metrics: &str, metric: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(metric)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once("} ")?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_chosen_namespace_gets_exact_series_and_an_endpoint_keeps_its_count() {
    let Some(mut bed) = bed() else {
        return;
    };
    for pod in ["10.180.0.1", "10.180.0.2"] {
        bed.add_pod(ip(pod), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir("counters");
    write(
        &dir,
        "cluster.yaml",
        &manifests(&["10.180.0.1", "10.180.0.2"]),
    );
    let dir_s = dir.to_string_lossy().into_owned();
    let log = dir.join("verdict.log");
    let _daemon = spawn_verdict(
        &bed,
        [
            "run",
            "--manifests",
            &dir_s,
            "--hostname-override",
            "test-node",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--min-sync-period",
            "0s",
            "--service-metrics",
            "endpoint",
            "--service-metrics-namespaces",
            "shop",
        ],
        &log,
        None,
    );
    let connect = |dst: &str| {
        bed.connect(ip("10.0.0.2"), ip(dst), "tcp", 80, 1000)
            .unwrap_or_default()
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_owned()
    };
    // Programmed: other/o0 answers (its connections are not counted per
    // Service, so the wait counts only in the node's total).
    let deadline = Instant::now() + Duration::from_secs(30);
    // Attempts before the rules are there go nowhere: only the one that
    // answers was sent to an endpoint.
    while !connect("172.30.2.1").starts_with("10.180.0.") {
        assert!(
            Instant::now() < deadline,
            "never programmed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let waited = 1.0;
    let mut sent: BTreeMap<&str, f64> = BTreeMap::new();
    let mut by_endpoint: BTreeMap<String, f64> = BTreeMap::new();
    for (dst, n) in [("172.30.1.1", 10), ("172.30.1.2", 20), ("172.30.2.2", 5)] {
        for _ in 0..n {
            let ep = connect(dst);
            assert!(ep.starts_with("10.180.0."), "{dst}: {ep:?}");
            *sent.entry(dst).or_default() += 1.0;
            if dst == "172.30.1.2" {
                *by_endpoint.entry(ep).or_default() += 1.0;
            }
        }
    }
    let read = || {
        // Past the counters' 5 s cache.
        std::thread::sleep(Duration::from_secs(6));
        http_on(&bed, 10249, "/metrics")
    };
    let metrics = read();
    assert!(
        verdict_e2e::http::is_chunked(metrics.split_once("\r\n\r\n").map_or("", |(h, _)| h)),
        "/metrics is streamed: {}",
        &metrics[..metrics.len().min(300)]
    );
    let per_entry = samples(&metrics, "verdict_service_connections_total");
    let shop: Vec<&String> = per_entry
        .keys()
        .filter(|l| l.contains("namespace=\"shop\""))
        .collect();
    assert_eq!(
        shop.len(),
        100,
        "one series per ClusterIP of shop: {per_entry:#?}"
    );
    assert_eq!(per_entry.len(), 100, "and none of other's: {per_entry:#?}");
    let entry = |svc: &str, ip: &str| {
        per_entry[&format!(
            "ip_family=\"IPv4\",namespace=\"shop\",service=\"{svc}\",port=\"http\",entry=\"ClusterIP\",address=\"{ip}\""
        )]
    };
    assert_eq!(entry("s0", "172.30.1.1"), 10.0);
    assert_eq!(entry("s1", "172.30.1.2"), 20.0);
    assert_eq!(entry("s2", "172.30.1.3"), 0.0);
    let per_endpoint = samples(&metrics, "verdict_endpoint_connections_total");
    assert_eq!(per_endpoint.len(), 200, "two endpoints per Service of shop");
    let s1_endpoint = |per_endpoint: &BTreeMap<String, f64>, ep: &str| {
        per_endpoint
            .get(&format!(
                "ip_family=\"IPv4\",namespace=\"shop\",service=\"s1\",port=\"http\",endpoint=\"{ep}:80\""
            ))
            .copied()
            .unwrap_or(0.0)
    };
    for (ep, n) in &by_endpoint {
        let addr = ep.trim_end_matches(":80");
        assert_eq!(s1_endpoint(&per_endpoint, addr), *n, "{ep}");
    }
    let total = samples(&metrics, "verdict_connections_total")["ip_family=\"IPv4\""];
    assert_eq!(
        total,
        waited + sent.values().sum::<f64>(),
        "the node's total holds every connection"
    );
    let series = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    println!("{series} series at 120 Services, 100 of them counted per endpoint");

    // 10.180.0.1 leaves s1: 10.180.0.2 moves to the first slot of the
    // endpoint map, and keeps its count.
    let kept = by_endpoint.get("10.180.0.2:80").copied().unwrap_or(0.0);
    write(&dir, "cluster.yaml", &manifests(&["10.180.0.2"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut only_two, mut to_two) = (0, 0.0);
    while only_two < 5 {
        assert!(Instant::now() < deadline, "the removal never took effect");
        if connect("172.30.1.2") == "10.180.0.2:80" {
            only_two += 1;
            to_two += 1.0;
        } else {
            only_two = 0;
        }
    }
    let metrics = read();
    let per_endpoint = samples(&metrics, "verdict_endpoint_connections_total");
    assert_eq!(
        s1_endpoint(&per_endpoint, "10.180.0.2"),
        kept + to_two,
        "its count before, and the connections since"
    );
    assert_eq!(
        s1_endpoint(&per_endpoint, "10.180.0.1"),
        0.0,
        "the removed endpoint's series is gone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
