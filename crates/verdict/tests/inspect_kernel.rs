//! Seeing into a running verdict: `verdict trace`, `explain`, `services`
//! and `syncs` against the daemon's API in the node of a network-namespace
//! test bed, with real traffic to compare the trace with; the same
//! commands offline (`--manifests`) give the same answers. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

const MANIFESTS: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 172.30.0.41
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- {addresses: [10.180.0.1], nodeName: test-node}
- {addresses: [10.180.0.2], nodeName: test-node}
- {addresses: [10.180.0.3], nodeName: test-node, conditions: {ready: false, serving: true, terminating: true}}
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 172.30.0.42
  loadBalancerSourceRanges: [203.0.113.0/25]
  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]
status:
  loadBalancer: {ingress: [{ip: 198.51.100.42}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: demo
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- {addresses: [10.180.0.1], nodeName: test-node}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: demo}
spec:
  clusterIP: 172.30.0.43
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: demo}
spec:
  clusterIP: 172.30.0.44
  ports: [{name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: demo
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.180.0.1], nodeName: test-node}
";

/// Runs `verdict ARGS` in the node and parses its JSON output.
fn json(bed: &TestBed, args: &[&str]) -> Json {
    let out = bed
        .node
        .exec(env!("CARGO_BIN_EXE_verdict"), args)
        .unwrap_or_else(|e| panic!("verdict {}: {e}", args.join(" ")));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn text(bed: &TestBed, args: &[&str]) -> String {
    bed.node
        .exec(env!("CARGO_BIN_EXE_verdict"), args)
        .unwrap_or_else(|e| panic!("verdict {}: {e}", args.join(" ")))
}

fn outputs(doc: &Json) -> BTreeSet<String> {
    doc["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["output"].as_str().unwrap().to_owned())
        .collect()
}

const TRACE_POD: [&str; 11] = [
    "--from",
    "pod",
    "--src",
    "10.0.0.2",
    "--dst",
    "172.30.0.41",
    "--proto",
    "tcp",
    "--dport",
    "80",
    "-ojson",
];

/// A node running verdict on [`MANIFESTS`]: pods 10.180.0.1-3 (the
/// endpoints) and 10.0.0.2 (a client), the LoadBalancer VIP routed to the
/// node; returns the bed, the daemon and the manifests' directory once
/// traffic flows (`None`: namespace tests cannot run here).
fn node_running_verdict(tag: &str) -> Option<(TestBed, Process, String)> {
    let mut bed = bed()?;
    for pod in ["10.180.0.1", "10.180.0.2", "10.180.0.3"] {
        bed.add_pod(ip(pod), Placement::Local, &[80], &[53])
            .unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    bed.route_to_node(ip("198.51.100.42")).unwrap();
    let dir = scratch_dir(tag);
    write(&dir, "cluster.yaml", MANIFESTS);
    let dir_s = dir.to_string_lossy().into_owned();
    let mut args: Vec<String> = vec!["run".into()];
    args.extend(node_flags(&dir_s));
    args.extend(["--min-sync-period".into(), "0s".into()]);
    // Every Service of the demo namespace counted per endpoint.
    args.extend([
        "--service-metrics".into(),
        "endpoint".into(),
        "--service-metrics-namespaces".into(),
        "demo".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Process(
        bed.node
            .spawn(env!("CARGO_BIN_EXE_verdict"), &args)
            .unwrap(),
    );
    assert_ne!(wait_for(&bed, "10.180.0.1:80"), "", "programmed");
    Some((bed, daemon, dir_s))
}

#[test]
fn trace_and_explain_answer_from_the_running_daemon_and_offline() {
    let Some((bed, _daemon, dir_s)) = node_running_verdict("inspect") else {
        return;
    };

    // trace: the kernel's table, every candidate with its odds.
    let mut trace_args = vec!["trace"];
    trace_args.extend(TRACE_POD);
    let t0 = Instant::now();
    let live = json(&bed, &trace_args);
    let took = t0.elapsed();
    println!("trace against the live table: {took:?}");
    assert_eq!(live["source"], "kernel", "{live:#}");
    assert_eq!(
        live["read"], "targeted",
        "only what the packet meets is read"
    );
    assert_eq!(live["service"], "demo/web:http");
    assert_eq!(
        outputs(&live),
        BTreeSet::from(["10.180.0.1:80".to_owned(), "10.180.0.2:80".to_owned()]),
        "the terminating endpoint is no candidate: {live:#}"
    );
    for o in live["outcomes"].as_array().unwrap() {
        assert_eq!(o["probability"], 0.5);
    }
    // Real traffic goes where the trace says, and nowhere else.
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        seen.insert(who(&bed));
    }
    assert_eq!(seen, outputs(&live), "real connections");

    // The kernel counted them, per entry point and per endpoint.
    let _ = bed.connect(ip("10.0.0.2"), ip("172.30.0.43"), "tcp", 80, 500);
    // A port the ClusterIP's Service does not have is rejected, and counted.
    let _ = bed.connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 81, 500);
    // One connect from outside the source ranges, left to retry its SYN
    // (at 1 s and 3 s): one connection dropped, however many SYNs.
    let _ = bed.connect(ip("203.0.113.130"), ip("198.51.100.42"), "tcp", 80, 3500);
    std::thread::sleep(Duration::from_secs(6)); // past the counters' cache
    let metrics = http_on(&bed, 10249, "/metrics");
    let base = "ip_family=\"IPv4\",namespace=\"demo\",service=\"web\",port=\"http\"";
    let cluster_ip = sample(
        &metrics,
        &format!("verdict_service_connections_total{{{base},entry=\"ClusterIP\",address=\"172.30.0.41\"}}"),
    )
    .unwrap_or_else(|| panic!("no ClusterIP counter: {metrics}"));
    let per_endpoint: f64 = ["10.180.0.1:80", "10.180.0.2:80"]
        .iter()
        .map(|e| {
            sample(
                &metrics,
                &format!("verdict_endpoint_connections_total{{{base},endpoint=\"{e}\"}}"),
            )
            .unwrap_or(0.0)
        })
        .sum();
    assert!(cluster_ip >= 40.0, "{cluster_ip}: {metrics}");
    assert_eq!(
        per_endpoint, cluster_ip,
        "every connection went to one endpoint"
    );
    let rejected = sample(
        &metrics,
        "verdict_service_rejected_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"empty\",port=\"http\",reason=\"no_endpoints\"}",
    );
    assert_eq!(rejected, Some(1.0), "{metrics}");
    let dropped = sample(
        &metrics,
        "verdict_service_dropped_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"lb\",port=\"http\",reason=\"source_range\"}",
    );
    assert_eq!(dropped, Some(1.0), "one connection, three SYNs: {metrics}");
    // The node's totals say the same.
    let node = |series: &str| sample(&metrics, series).unwrap_or(-1.0);
    assert_eq!(
        node("verdict_dropped_total{ip_family=\"IPv4\",reason=\"source_range\"}"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        node("verdict_rejected_total{ip_family=\"IPv4\",reason=\"no_endpoints\"}"),
        1.0
    );
    assert_eq!(
        node("verdict_rejected_total{ip_family=\"IPv4\",reason=\"invalid_port\"}"),
        1.0,
        "one connection to port 81: {metrics}"
    );
    assert!(
        node("verdict_connections_total{ip_family=\"IPv4\"}") >= cluster_ip,
        "the node's connections hold the ClusterIP's: {metrics}"
    );

    // Every packet of those connections, both ways, in packets and bytes.
    let traffic = |name: &str, labels: &str| sample(&metrics, &format!("{name}{{{labels}}}"));
    let packets = traffic(
        "verdict_service_packets_total",
        &format!("{base},entry=\"ClusterIP\",address=\"172.30.0.41\""),
    )
    .unwrap_or_else(|| panic!("no packet counter: {metrics}"));
    let bytes = traffic(
        "verdict_service_bytes_total",
        &format!("{base},entry=\"ClusterIP\",address=\"172.30.0.41\""),
    )
    .unwrap_or(0.0);
    // A TCP connection that carries a request and an answer is at least
    // 3 packets each way (handshake, data, close); 40-byte headers each.
    assert!(
        packets >= 6.0 * cluster_ip,
        "{packets} packets for {cluster_ip} connections"
    );
    assert!(
        bytes >= 40.0 * packets,
        "{bytes} bytes in {packets} packets"
    );
    let endpoint_packets: f64 = ["10.180.0.1:80", "10.180.0.2:80"]
        .iter()
        .map(|e| {
            traffic(
                "verdict_endpoint_packets_total",
                &format!("{base},endpoint=\"{e}\""),
            )
            .unwrap_or(0.0)
        })
        .sum();
    assert_eq!(
        endpoint_packets, packets,
        "every packet went to one endpoint"
    );
    // UDP: each exchange is one datagram there and one back.
    for sport in 40001..=40005 {
        let answer = bed.connect_from(ip("10.0.0.2"), sport, ip("172.30.0.44"), "udp", 53, 1000);
        assert!(
            answer.is_ok_and(|a| a.contains("10.180.0.1")),
            "udp exchange"
        );
    }
    std::thread::sleep(Duration::from_secs(6)); // past the counters' cache
    let metrics = http_on(&bed, 10249, "/metrics");
    let dns = "ip_family=\"IPv4\",namespace=\"demo\",service=\"dns\",port=\"dns\"";
    assert_eq!(
        sample(
            &metrics,
            &format!(
                "verdict_service_packets_total{{{dns},entry=\"ClusterIP\",address=\"172.30.0.44\"}}"
            )
        ),
        Some(10.0),
        "5 exchanges, one datagram each way: {metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("verdict_endpoint_packets_total{{{dns},endpoint=\"10.180.0.1:53\"}}")
        ),
        Some(10.0),
        "{metrics}"
    );

    // A port the Service does not have, from 10 UDP sockets, 20 datagrams
    // each: 10 connections, for the node and for the Service, which is
    // among the problems.
    let (sent, sockets) = bed
        .send_udp(
            ip("10.0.0.2"),
            ip("172.30.0.41"),
            9999,
            verdict_e2e::bed::How::Each {
                sockets: 10,
                packets: 20,
            },
        )
        .unwrap();
    assert_eq!((sent, sockets), (200, 10));
    std::thread::sleep(Duration::from_secs(6)); // past the counters' cache
    let metrics = http_on(&bed, 10249, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "verdict_rejected_total{ip_family=\"IPv4\",reason=\"invalid_port\"}"
        ),
        Some(11.0),
        "port 81 once, then 10 sockets: {metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "verdict_service_rejected_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"web\",port=\"9999\",reason=\"invalid_port\"}"
        ),
        Some(10.0),
        "{metrics}"
    );
    let answer = http_on(&bed, 10249, "/api/v1/problems");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or(&answer);
    let problems: Json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let listed = problems["refused"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "demo/web" && r["port"] == "9999")
        .unwrap_or_else(|| panic!("demo/web:9999 is not among the problems: {problems:#}"));
    assert_eq!(listed["protocol"], "udp");
    assert_eq!(listed["counts"]["problems"][0]["connections"], 10);
    let listed = text(&bed, &["services", "--search", "demo/web"]);
    assert!(
        listed.contains("(9999)") && listed.contains("10 rejected invalid_port"),
        "{listed}"
    );
    // Only the Services with problems: web (the wrong port), empty (no
    // endpoints) and lb (a source outside its ranges); not dns.
    let problems = text(&bed, &["services", "--problems"]);
    for s in ["demo/web", "demo/empty", "demo/lb"] {
        assert!(problems.contains(s), "{s}: {problems}");
    }
    assert!(!problems.contains("demo/dns"), "{problems}");

    // The drop and the reject say why, naming the Service.
    let mut blocked = vec!["trace", "--from", "external", "--src", "203.0.113.130"];
    blocked.extend([
        "--dst",
        "198.51.100.42",
        "--proto",
        "tcp",
        "--dport",
        "80",
        "-o",
        "json",
    ]);
    let doc = json(&bed, &blocked);
    assert_eq!(
        doc["outcomes"][0]["reason"],
        "dropped: the source is outside the loadBalancerSourceRanges of demo/lb:http",
        "{doc:#}"
    );
    let real = bed
        .connect(ip("203.0.113.130"), ip("198.51.100.42"), "tcp", 80, 500)
        .unwrap_or_default();
    assert!(
        !real.contains("10.180."),
        "the blocked client got through: {real}"
    );
    let allowed = bed
        .connect(ip("203.0.113.2"), ip("198.51.100.42"), "tcp", 80, 500)
        .unwrap_or_default();
    assert!(allowed.contains("10.180.0.1:80"), "{allowed}");
    let mut empty = vec!["trace"];
    empty.extend(TRACE_POD);
    let empty: Vec<&str> = empty
        .into_iter()
        .map(|a| if a == "172.30.0.41" { "172.30.0.43" } else { a })
        .collect();
    let doc = json(&bed, &empty);
    assert_eq!(
        doc["outcomes"][0]["reason"],
        "rejected: demo/empty:http has no usable endpoints"
    );

    // The text form names the steps and the Service of each element.
    let mut trace_text: Vec<&str> = vec!["trace"];
    trace_text.extend(&TRACE_POD[..10]);
    let out = text(&bed, &trace_text);
    assert!(out.contains("verdict: DNAT to 10.180.0.1:80"), "{out}");
    assert!(
        out.contains("@service-ips 172.30.0.41 . tcp . 80 → goto endpoints-2  [demo/web:http]"),
        "{out}"
    );
    println!("{out}");

    // explain: every endpoint, and the kernel holds what verdict intends.
    let t0 = Instant::now();
    let doc = json(&bed, &["explain", "demo/web", "-o", "json"]);
    println!("explain against the live table: {:?}", t0.elapsed());
    assert_eq!(doc["drift"]["missing"], 0, "{doc:#}");
    assert_eq!(doc["drift"]["differs"], 0, "{doc:#}");
    assert_eq!(doc["families"][0]["read"], "targeted", "{doc:#}");
    assert!(
        doc["drift"]["extra"].is_null(),
        "a targeted read does not look for unwanted elements: {doc:#}"
    );
    let full = json(&bed, &["explain", "demo/web", "--full", "-o", "json"]);
    assert_eq!(full["families"][0]["read"], "whole", "{full:#}");
    assert_eq!(full["drift"]["extra"], 0, "{full:#}");
    assert_eq!(
        full["families"][0]["ports"][0]["elements"], doc["families"][0]["ports"][0]["elements"],
        "the Service's elements read alike both ways"
    );
    let eps = doc["families"][0]["ports"][0]["endpoints"]
        .as_array()
        .unwrap();
    assert_eq!(eps.len(), 3);
    let out = text(&bed, &["explain", "demo/web"]);
    assert!(out.contains("drift: none"), "{out}");
    assert!(
        out.contains("serving but terminating: unused while a ready endpoint exists"),
        "{out}"
    );
    println!("{out}");
    let missing = bed
        .node
        .exec(env!("CARGO_BIN_EXE_verdict"), &["explain", "demo/nope"]);
    assert!(
        missing
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not known to verdict")),
        "{missing:?}"
    );

    // services and syncs.
    let list = json(&bed, &["services", "-o", "json", "--search", "demo/"]);
    assert_eq!(list["total"], 4, "{list:#}");
    let syncs = text(&bed, &["syncs"]);
    assert!(syncs.contains("first sync"), "{syncs}");

    // A foreign change is seen, repaired, and both are in the history.
    bed.node
        .exec(
            "nft",
            &[
                "delete",
                "element",
                "ip",
                "verdict",
                "service-ips",
                "{ 172.30.0.41 . tcp . 80 }",
            ],
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let both = json(&bed, &["syncs", "-o", "json"]);
        let foreign = &both[1]["items"];
        let repaired = both[0]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["trigger"] == "repair after a foreign change");
        if foreign[0]["process"] == "nft" && repaired {
            assert!(
                foreign[0]["sample"][0]
                    .as_str()
                    .unwrap()
                    .contains("service-ips"),
                "{foreign:#}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no repair recorded: {both:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let doc = json(&bed, &["explain", "demo/web", "-o", "json"]);
    assert_eq!(doc["drift"]["missing"], 0, "repaired: {doc:#}");

    // --live: one real packet from the node, traced by the kernel, beside
    // verdict's trace.
    let live_args = [
        "trace",
        "--from",
        "node",
        "--src",
        "192.168.0.2",
        "--dst",
        "172.30.0.41",
        "--proto",
        "tcp",
        "--dport",
        "80",
        "--live",
        "-o",
        "json",
    ];
    let doc = json(&bed, &live_args);
    let k = &doc["live"];
    assert_eq!(k["agree"], true, "{k:#}");
    let went = k["kernel"]["dnat"].as_str().unwrap().to_owned();
    assert!(outputs(&live).contains(&went), "{went}: {k:#}");
    let chains: Vec<&str> = k["kernel"]["chains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        chains.contains(&"services") && chains.contains(&"endpoints-2"),
        "{chains:?}"
    );
    let out = text(&bed, &live_args[..12]);
    assert!(
        out.contains("verdict's trace and the kernel's agree"),
        "{out}"
    );
    println!("{out}");
    let tables = bed.node.exec("nft", &["list", "tables"]).unwrap();
    assert!(
        !tables.contains("verdict-trace"),
        "the marking table is gone: {tables}"
    );

    // Offline, from the same manifests: the same candidates.
    let mut offline: Vec<String> = trace_args.iter().map(|s| s.to_string()).collect();
    offline.extend(node_flags(&dir_s));
    let offline: Vec<&str> = offline.iter().map(String::as_str).collect();
    let doc = json(&bed, &offline);
    assert_eq!(doc["source"], "memory");
    assert_eq!(outputs(&doc), outputs(&live));
    let mut explain_offline = vec!["explain".to_owned(), "demo/web".to_owned()];
    explain_offline.extend(node_flags(&dir_s));
    let explain_offline: Vec<&str> = explain_offline.iter().map(String::as_str).collect();
    let out = text(&bed, &explain_offline);
    assert!(
        out.contains("built in memory") || out.contains("memory"),
        "{out}"
    );
    assert!(out.contains("drift: none"), "{out}");
}

#[test]
fn the_commands_say_what_is_wrong() {
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(verdict)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["explain"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("verdict explain needs a Service"), "{err}");
    let (code, err) = run(&["trace", "--from", "pod", "--src", "10.0.0.1"]);
    assert_eq!(code, Some(2), "a missing value is a usage error");
    assert_eq!(
        err, "verdict: verdict trace: missing proto\nRun 'verdict help trace' for usage.\n",
        "no log noise"
    );
    let (code, err) = run(&["run", "--dst", "10.0.0.1"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--dst belongs to verdict trace"), "{err}");
    // Nobody listens there.
    let (code, err) = run(&["services", "--server", "127.0.0.1:9"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot reach verdict at 127.0.0.1:9"), "{err}");
    let (code, err) = run(&["explain", "demo", "--server", "127.0.0.1:9"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("name the Service as NAMESPACE/NAME"), "{err}");
}

#[test]
fn the_counters_can_be_turned_off_and_on_across_a_restart() {
    let dir = scratch_dir("inspect-counters");
    write(&dir, "cluster.yaml", MANIFESTS);
    let dir_s = dir.to_string_lossy().into_owned();
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan".to_owned()];
        args.extend(node_flags(&dir_s));
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let on = plan(&[]);
    let line = |script: &str, what: &str| {
        script
            .lines()
            .find(|l| l.starts_with(&format!("add {what} ")))
            .unwrap_or_else(|| panic!("no {what}: {script}"))
            .to_owned()
    };
    // No map counts per element: the sets that count hold the chosen
    // Services' elements alone (none by default), and the node's totals
    // are rule counters.
    assert!(
        !line(&on, "map ip verdict service-ips").contains(" counter ;"),
        "{on}"
    );
    assert!(!line(&on, "map ip verdict service-endpoints-tcp").contains(" counter ;"));
    assert!(line(&on, "set ip verdict service-connections").contains(" counter ;"));
    assert!(
        !on.contains("add element ip verdict service-connections"),
        "nothing chosen"
    );
    assert!(on.contains("add rule ip verdict nat-postrouting ct status dnat counter"));
    assert!(on.contains("add rule ip verdict reject-chain update @rejected-connections"));
    let chosen = plan(&[
        "--service-metrics",
        "service",
        "--service-metrics-namespaces",
        "demo",
    ]);
    assert!(
        chosen.contains("add element ip verdict service-connections { 172.30.0.41 . tcp . 80"),
        "{chosen}"
    );
    let off = plan(&["--service-counters=false"]);
    assert!(
        !off.lines()
            .filter(|l| l.starts_with("add rule"))
            .any(|l| l.contains("counter") || l.contains("update @rejected")),
        "{off}"
    );
    assert!(
        off.contains("add rule ip verdict reject-chain reject\n"),
        "kube-proxy's rule"
    );

    // On a node: a verdict without counters, then one with them adopts its
    // table: the first full sync writes the counting rules; traffic flows
    // throughout.
    let Some(mut bed) = bed() else {
        return;
    };
    for pod in ["10.180.0.1", "10.180.0.2"] {
        bed.add_pod(ip(pod), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let start = |extra: &[&str]| {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(node_flags(&dir_s));
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Process(
            bed.node
                .spawn(env!("CARGO_BIN_EXE_verdict"), &args)
                .unwrap(),
        )
    };
    let reach_both = |bed: &TestBed| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = BTreeSet::new();
        while seen.len() < 2 && Instant::now() < deadline {
            let got = who(bed);
            if got.starts_with("10.180.") {
                seen.insert(got);
            } else {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        seen
    };
    let both = BTreeSet::from(["10.180.0.1:80".to_owned(), "10.180.0.2:80".to_owned()]);
    let old = start(&["--service-counters=false"]);
    assert_eq!(reach_both(&bed), both);
    let table = bed
        .node
        .exec("nft", &["list", "table", "ip", "verdict"])
        .unwrap();
    assert!(
        !table.contains("counter packets"),
        "nothing counts: {table}"
    );
    drop(old);
    let _new = start(&[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut table = String::new();
    while !table.contains("counter packets") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        table = bed
            .node
            .exec("nft", &["list", "table", "ip", "verdict"])
            .unwrap();
    }
    assert!(
        table.contains("counter packets"),
        "adopted with counters: {table}"
    );
    assert_eq!(reach_both(&bed), both, "after the rebuild:\n{table}");
}

#[test]
fn the_web_view_shows_services_endpoints_and_counters_in_a_real_browser() {
    let Some(browser) = chromium() else {
        return;
    };
    let Some((bed, _daemon, dir)) = node_running_verdict("inspect-ui") else {
        return;
    };
    for _ in 0..30 {
        who(&bed);
    }
    // Three connections to a Service without endpoints (rejected), one
    // from outside the LoadBalancer's source ranges (dropped).
    for _ in 0..3 {
        let _ = bed.connect(ip("10.0.0.2"), ip("172.30.0.43"), "tcp", 80, 500);
    }
    let _ = bed.connect(ip("203.0.113.130"), ip("198.51.100.42"), "tcp", 80, 500);
    // A Service of 2,000 endpoints, in two slices.
    let slice = |n: usize| {
        let eps: String = (0..1000)
            .map(|i| {
                let k = n * 1000 + i;
                format!(
                    "- {{addresses: [10.181.{}.{}], nodeName: other-node}}\n",
                    k / 250,
                    k % 250 + 1
                )
            })
            .collect();
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: big-{n}\n  namespace: bulk\n  labels: {{kubernetes.io/service-name: big}}\naddressType: IPv4\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n{eps}---\n"
        )
    };
    write(
        std::path::Path::new(&dir),
        "big.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: big, namespace: bulk}}\nspec:\n  clusterIP: 172.30.0.45\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n---\n{}{}",
            slice(0),
            slice(1)
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text(&bed, &["services", "--search", "bulk/big"]).contains("2000/2000 ready") {
        assert!(Instant::now() < deadline, "bulk/big was never programmed");
        std::thread::sleep(Duration::from_millis(300));
    }
    let ui = "http://127.0.0.1:10249/ui";

    let list = browse(&bed, &browser, &format!("{ui}#/services"), None);
    for svc in ["demo/web", "demo/lb", "demo/empty"] {
        assert!(
            list.contains(&format!("data-service=\"{svc}\"")),
            "{svc}: {list}"
        );
    }
    // The web row's connections cell holds the kernel's count.
    let row = list
        .split("<tr data-service=\"demo/web\">")
        .nth(1)
        .unwrap()
        .split("</tr>")
        .next()
        .unwrap();
    let connections: u64 = row
        .split("data-connections=\"")
        .nth(1)
        .and_then(|c| c.split('"').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connection count in {row}"));
    assert!(connections >= 30, "{connections}: {row}");
    // And its traffic: every byte of those connections, both ways.
    let bytes: u64 = row
        .split("data-bytes=\"")
        .nth(1)
        .and_then(|c| c.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {row}"));
    assert!(bytes >= 30 * 6 * 40, "{bytes} bytes: {row}");

    let page = browse(&bed, &browser, &format!("{ui}#/service/demo/web"), None);
    for ep in ["10.180.0.1:80", "10.180.0.2:80", "10.180.0.3:80"] {
        assert!(
            page.contains(&format!("data-endpoint=\"{ep}\"")),
            "{ep}: {page}"
        );
    }
    assert!(page.contains("no drift"), "{page}");
    let endpoint_bytes: u64 = page
        .split("data-endpoint=\"10.180.0.1:80\"")
        .nth(1)
        .and_then(|r| r.split("data-bytes=\"").nth(1))
        .and_then(|c| c.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count for 10.180.0.1:80 in {page}"));
    assert!(endpoint_bytes > 0, "{page}");
    assert!(page.contains("id=\"rate-chart\""), "{page}");
    assert!(
        page.contains("unused while a ready endpoint exists"),
        "{page}"
    );
    // Live connections: the closed connections' TIME_WAIT entries.
    assert!(page.contains("id=\"connections\""), "{page}");
    assert!(page.contains("data-flow=\"10.180.0."), "{page}");

    // The drift check's answer stays through the overview's refreshes
    // (every 5 s; they wiped it).
    let checked = browse_for(
        &bed,
        &browser,
        &format!("{ui}#/?check=drift"),
        Duration::from_secs(16),
    );
    let draws: u32 = checked
        .split("data-overview-draws=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(draws >= 3, "{draws} draws: {checked}");
    let answer = checked
        .split("id=\"drift-answer\"")
        .nth(1)
        .and_then(|r| r.split("</p>").next())
        .unwrap_or_default();
    assert!(answer.contains("no drift in any table"), "{answer}");
    assert!(answer.contains("data-checked-at"), "{answer}");
    let overview = browse(&bed, &browser, &format!("{ui}#/"), None);
    assert!(overview.contains("id=\"syncs\""), "{overview}");
    assert!(overview.contains("first sync"), "{overview}");
    // What is wrong comes first: the Service without endpoints that
    // received connections, and the source-range drops, with reasons.
    let problem = |page: &str, svc: &str| -> String {
        page.split(&format!("<li data-problem=\"{svc}\">"))
            .nth(1)
            .and_then(|r| r.split("</li>").next())
            .unwrap_or_else(|| panic!("{svc} is not listed as a problem: {page}"))
            .to_owned()
    };
    assert!(
        overview.find("id=\"problems\"") < overview.find("id=\"syncs\""),
        "problems first: {overview}"
    );
    let empty = problem(&overview, "demo/empty");
    assert!(
        empty.contains("receives traffic with no usable endpoint"),
        "{empty}"
    );
    assert!(empty.contains("no_endpoints: 3 connections"), "{empty}");
    let lb = problem(&overview, "demo/lb");
    assert!(lb.contains("source_range: 1 connection "), "{lb}");
    assert!(lb.contains("loadBalancerSourceRanges"), "{lb}");
    assert!(
        !overview.contains("data-problem=\"demo/web\""),
        "{overview}"
    );

    // Their pages say they are broken, and why; a working one says so.
    for (svc, why) in [
        ("demo/empty", "data-reason=\"no_endpoints\""),
        ("demo/lb", "data-reason=\"source_range\""),
    ] {
        let page = browse(&bed, &browser, &format!("{ui}#/service/{svc}"), None);
        assert!(page.contains("data-broken=\"true\""), "{svc}: {page}");
        assert!(page.contains(why), "{svc}: {page}");
    }
    let empty_page = browse(&bed, &browser, &format!("{ui}#/service/demo/empty"), None);
    assert!(
        empty_page.contains("no usable endpoint: new connections are rejected"),
        "{empty_page}"
    );
    assert!(
        page.contains("data-broken=\"false\""),
        "demo/web works: {page}"
    );
    // explain and services show the same counts as the page.
    let explained = text(&bed, &["explain", "demo/empty"]);
    assert!(
        explained.contains("REJECTED no_endpoints: 3 connections"),
        "{explained}"
    );
    let listed = text(&bed, &["services", "--search", "demo/lb"]);
    assert!(listed.contains("1 dropped source_range"), "{listed}");

    // A Service of 2,000 endpoints: a page of 50 rows per table, sorted by
    // address as numbers, and paged.
    let big = browse(&bed, &browser, &format!("{ui}#/service/bulk/big"), None);
    let rows = big.matches("<tr").count();
    assert!(rows < 200, "{rows} rows");
    assert!(big.contains("1–50 of 2000"), "paged: {big}");
    let first: Vec<&str> = big
        .split("data-endpoint=\"")
        .skip(1)
        .take(3)
        .map(|r| r.split('"').next().unwrap())
        .collect();
    assert_eq!(
        first,
        ["10.181.0.1:80", "10.181.0.2:80", "10.181.0.3:80"],
        "numeric order (as text 10.181.0.10 would come before 10.181.0.2)"
    );
    // The page asks for a page of endpoints and elements, and the server
    // answers 304, no body, while that page has not changed.
    let raw = |path: &str, tag: Option<&str>| -> String {
        let extra = tag.map_or(String::new(), |t| format!("If-None-Match: {t}\\r\\n"));
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/10249 && printf 'GET {path} HTTP/1.1\\r\\nHost: x\\r\\n{extra}Connection: close\\r\\n\\r\\n' >&3 && cat <&3"
        );
        bed.node.exec("bash", &["-c", &script]).unwrap()
    };
    let whole = raw("/api/v1/services/bulk/big", None);
    let paged_path =
        "/api/v1/services/bulk/big?endpoints_offset=50&endpoints_limit=50&elements_limit=50";
    let paged = raw(paged_path, None);
    println!(
        "bulk/big: {} bytes whole, {} bytes a page",
        whole.len(),
        paged.len()
    );
    assert!(
        paged.len() * 10 < whole.len(),
        "{} bytes a page, {} whole",
        paged.len(),
        whole.len()
    );
    let body = paged.split("\r\n\r\n").nth(1).unwrap();
    let doc: Json = serde_json::from_str(body).unwrap();
    let port = &doc["families"][0]["ports"][0];
    assert_eq!(port["endpoints_total"], 2000);
    assert_eq!(port["endpoints"].as_array().unwrap().len(), 50);
    assert_eq!(port["endpoints"][0]["address"], "10.181.0.51:80");
    let tag = paged
        .lines()
        .find_map(|l| {
            l.split_once(": ")
                .filter(|(k, _)| k.eq_ignore_ascii_case("etag"))
                .map(|(_, v)| v)
        })
        .unwrap_or_else(|| panic!("no ETag: {paged}"))
        .trim()
        .to_owned();
    let again = raw(paged_path, Some(&tag));
    assert!(again.starts_with("HTTP/1.1 304"), "{again}");
    assert!(again.ends_with("\r\n\r\n"), "no body: {again}");
    // A page in the browser, left open: its refreshes come back as 304.
    let open = browse_for(
        &bed,
        &browser,
        &format!("{ui}#/service/bulk/big"),
        Duration::from_secs(16),
    );
    let counter = |page: &str, name: &str| -> u64 {
        page.split(&format!("data-{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let (answers, unchanged) = (
        counter(&open, "service-answers"),
        counter(&open, "service-unchanged"),
    );
    assert!(
        answers >= 3 && unchanged >= answers - 1,
        "{answers} answers, {unchanged} unchanged"
    );

    // The list finds a Service by an address.
    let by_ip = browse(
        &bed,
        &browser,
        &format!("{ui}#/services?q=198.51.100"),
        None,
    );
    assert!(by_ip.contains("data-service=\"demo/lb\""), "{by_ip}");
    assert!(!by_ip.contains("data-service=\"demo/web\""), "{by_ip}");
    let past = browse(&bed, &browser, &format!("{ui}#/services?q=demo&p=5"), None);
    assert!(past.contains("past the end (4 Services in all)"), "{past}");

    let traced = browse(
        &bed,
        &browser,
        &format!("{ui}#/trace?from=pod&src=10.0.0.2&dst=172.30.0.41&proto=tcp&dport=80"),
        None,
    );
    for out in ["10.180.0.1:80", "10.180.0.2:80"] {
        assert!(
            traced.contains(&format!("data-outcome=\"{out}\"")),
            "{out}: {traced}"
        );
    }

    // Screenshots, for people (target/ui-screenshots).
    let shots = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    for (name, frag) in [
        ("overview", "#/"),
        ("services", "#/services"),
        ("service", "#/service/demo/web"),
        (
            "trace",
            "#/trace?from=pod&src=10.0.0.2&dst=172.30.0.41&proto=tcp&dport=80",
        ),
    ] {
        let path = shots.join(format!("{name}.png"));
        browse(&bed, &browser, &format!("{ui}{frag}"), Some(&path));
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "{}: {size} bytes", path.display());
        println!("screenshot: {}", path.display());
    }
}

#[test]
fn connections_show_where_traffic_went_and_flag_the_flows_of_a_removed_endpoint() {
    let Some((bed, _daemon, dir_s)) = node_running_verdict("inspect-conns") else {
        return;
    };
    let dir = std::path::PathBuf::from(&dir_s);
    let mut sent = BTreeSet::new();
    for _ in 0..20 {
        sent.insert(who(&bed));
    }
    // Closed TCP connections stay in conntrack (TIME_WAIT) for a while.
    let doc = json(&bed, &["connections", "demo/web", "-o", "json"]);
    let web = &doc["services"][0];
    assert_eq!(web["service"], "demo/web", "{doc:#}");
    assert!(web["flows"].as_u64().unwrap() >= 20, "{doc:#}");
    assert_eq!(web["stale"], 0);
    let endpoints: BTreeSet<String> = web["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(endpoints, sent, "conntrack saw what the clients saw");

    // Connections held open from the client (bash keeps the socket, sleep
    // keeps bash), until one of them reached 10.180.0.2.
    let client = bed.sender(ip("10.0.0.2")).unwrap();
    let mut held = Vec::new();
    // (The echo server answers and closes: a held connection is
    // half-closed, CLOSE_WAIT, and still open.)
    let established = |bed: &TestBed| -> Json {
        let answer = http_on(bed, 10249, "/api/v1/connections?service=demo/web");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or(&answer);
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
    };
    let reached = |doc: &Json| {
        doc["flows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["endpoint"] == "10.180.0.2:80" && f["open"] == true)
    };
    loop {
        let doc = established(&bed);
        if reached(&doc) {
            break;
        }
        assert!(
            held.len() < 30,
            "30 held connections, none to 10.180.0.2: {doc:#}"
        );
        held.push(Process(
            client
                .spawn("bash", &["-c", "exec 3<>/dev/tcp/172.30.0.41/80; sleep 60"])
                .unwrap(),
        ));
        std::thread::sleep(Duration::from_millis(300));
    }

    // 10.180.0.2 leaves: its open flows are stale, its closed ones
    // (TIME_WAIT) are not, and the answer says what happens to them.
    write(
        &dir,
        "cluster.yaml",
        &MANIFESTS.replace("- {addresses: [10.180.0.2], nodeName: test-node}\n", ""),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let doc = json(&bed, &["connections", "demo/web", "-o", "json"]);
        let stale: Vec<&Json> = doc["flows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["stale"] == true)
            .collect();
        if !stale.is_empty() {
            assert!(
                stale
                    .iter()
                    .all(|f| f["endpoint"] == "10.180.0.2:80" && f["open"] == true),
                "{doc:#}"
            );
            assert!(
                doc["services"][0]["closed_to_gone"].as_u64().unwrap() > 0,
                "the closed connections to it are counted apart: {doc:#}"
            );
            assert!(
                stale[0]["what_verdict_does"]
                    .as_str()
                    .unwrap()
                    .contains("deletes no TCP"),
                "{doc:#}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no stale flow: {doc:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = text(&bed, &["connections", "demo/web"]);
    assert!(
        out.contains("GONE: the endpoint is no longer the Service's"),
        "{out}"
    );
    println!("{out}");
}
