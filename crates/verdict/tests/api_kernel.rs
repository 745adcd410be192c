//! The real `verdict run --kubeconfig` binary, inside the node of a
//! network-namespace test bed, watching our fake API server (real list and
//! watch protocol, talked to by kube-rs): nothing is programmed before the
//! initial lists, traffic follows Service and EndpointSlice changes, the
//! label filters hold, and a forced watch expiry (410 Gone, relist) picks up
//! what changed meanwhile (added, changed, deleted) without dropping a rule
//! that is still valid. Last, verdict is restarted while the API server
//! cannot list EndpointSlices: the rules in the kernel keep serving until it
//! can, and the new process adopts them without a refused connection.
//! Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::apiserver::ApiServerProcess;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

use common::*;

fn service(name: &str, ip: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "demo", "labels": labels},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    })
}

fn slice(name: &str, service: &str, endpoint: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "demo",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": [endpoint], "conditions": {"ready": true},
                       "nodeName": "test-node"}]
    })
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "test-node", "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}
    })
}

fn has_table(bed: &TestBed) -> bool {
    bed.node
        .exec("nft", &["list", "tables"])
        .unwrap_or_default()
        .contains("table ip verdict")
}

#[test]
fn traffic_follows_the_api_server_across_a_watch_expiry() {
    let Some(mut bed) = bed() else {
        return;
    };
    for pod in ["10.180.0.1", "10.180.0.2"] {
        bed.add_pod(ip(pod), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();

    // The API server runs inside the node's namespace, on its loopback.
    let mut api = fake_api_server(&bed, 16443);
    api.apply(node()).unwrap();
    api.apply(service("web", "172.30.0.41", json!({}))).unwrap();
    api.apply(slice("web-1", "web", "10.180.0.1")).unwrap();
    api.apply(service("gone", "172.30.0.45", json!({})))
        .unwrap();
    api.apply(slice("gone-1", "gone", "10.180.0.2")).unwrap();
    // Served by another proxy, and headless: kube-proxy does not even
    // fetch these.
    api.apply(service(
        "other",
        "172.30.0.43",
        json!({"service.kubernetes.io/service-proxy-name": "someone-else"}),
    ))
    .unwrap();
    api.apply(slice("other-1", "other", "10.180.0.2")).unwrap();
    api.apply(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["172.30.0.0/16"]}
    }))
    .unwrap();
    // EndpointSlices are not served yet: their list fails, so nothing may
    // be programmed.
    api.set_served("EndpointSlice", false).unwrap();

    let dir = scratch_dir("api");
    let kubeconfig_s = fake_kubeconfig(&dir, 16443);
    let args = [
        "--kubeconfig",
        &kubeconfig_s,
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--min-sync-period",
        "0s",
    ];
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let mut daemon = Process(bed.node.spawn(verdict, &args).unwrap());
    let log = |daemon: &mut Process| {
        let _ = daemon.0.kill();
        let _ = daemon.0.wait();
        let mut text = String::new();
        if let Some(mut e) = daemon.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut text);
        }
        text
    };

    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !has_table(&bed),
        "programmed before the EndpointSlices were listed\n{}",
        log(&mut daemon)
    );
    let livez = http(&bed, "/livez");
    assert!(livez.starts_with("HTTP/1.1 200"), "{livez}");
    // As kube-proxy: healthy while starting up, and no family has synced.
    let healthz = http(&bed, "/healthz");
    assert!(!healthz.contains("\"IPv4\""), "not synced yet: {healthz}");

    api.set_served("EndpointSlice", true).unwrap();
    // While EndpointSlices were not served, each streaming list of them
    // failed (404) and fell back to a plain list, which failed too; from
    // here on, every list of them streams.
    let slices_served_at = api.requests().unwrap().len();
    let got = wait_until(
        &bed,
        "172.30.0.41",
        "10.180.0.1:80",
        Duration::from_secs(40),
    );
    assert_eq!(
        got,
        "10.180.0.1:80",
        "programmed after the lists\n{}",
        log(&mut daemon)
    );
    let healthz = http(&bed, "/healthz");
    assert!(
        healthz.starts_with("HTTP/1.1 200"),
        "synced, Node known: {healthz}"
    );
    assert!(healthz.contains("\"IPv4\":{\"lastUpdated\""), "{healthz}");
    assert_eq!(
        who_at(&bed, "172.30.0.43"),
        "",
        "service-proxy-name label honoured"
    );
    assert_eq!(who_at(&bed, "172.30.0.45"), "10.180.0.2:80");
    // The ServiceCIDR's range: unallocated ClusterIPs in it are dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut table = String::new();
    while Instant::now() < deadline {
        table = bed
            .node
            .exec("nft", &["list", "table", "ip", "verdict"])
            .unwrap();
        if table.contains("172.30.0.0/16") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // (It counts what it drops: `counter packets N bytes M` before `drop`.)
    assert!(
        table.lines().any(|l| {
            let l = l.trim();
            l.starts_with("ip daddr 172.30.0.0/16 ") && l.contains(" drop")
        }),
        "ServiceCIDR drop rule:\n{table}"
    );

    // What kube-rs asked for: streaming lists (the API server serves
    // them) and watches, selected as kube-proxy 1.36 selects them
    // (Services by label and spec.clusterIP, slices by the headless
    // label), with bookmarks.
    let requests = api.requests().unwrap();
    let asked = |parts: &[&str]| requests.iter().any(|r| parts.iter().all(|p| r.contains(p)));
    let streamed = [
        "watch=true",
        "sendInitialEvents=true",
        "resourceVersionMatch=NotOlderThan",
    ];
    for (what, parts) in [
        (
            "Services",
            vec![
                "GET /api/v1/services?",
                "fieldSelector=spec.clusterIP%21%3DNone",
                "labelSelector=%21service.kubernetes.io%2Fservice-proxy-name",
            ],
        ),
        (
            "EndpointSlices",
            vec![
                "GET /apis/discovery.k8s.io/v1/endpointslices?",
                "labelSelector=%21service.kubernetes.io%2Fheadless",
            ],
        ),
        (
            "the Node",
            vec![
                "GET /api/v1/nodes?",
                "fieldSelector=metadata.name%3Dtest-node",
            ],
        ),
        (
            "ServiceCIDRs",
            vec!["GET /apis/networking.k8s.io/v1/servicecidrs?"],
        ),
    ] {
        let mut all = parts.clone();
        all.extend(streamed);
        assert!(asked(&all), "{what}: {requests:#?}");
    }
    assert!(asked(&["allowWatchBookmarks=true"]), "{requests:#?}");
    // As client-go's informers: no list where the API server streams
    // (EndpointSlices: once served again, give or take the attempt under
    // way then); watches of 5 to 10 minutes; every request says who
    // sends it.
    for (i, r) in requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.starts_with("GET "))
    {
        if r.contains("/endpointslices?") && i < slices_served_at + 2 {
            continue;
        }
        if r.contains("watch=true") {
            let secs: u32 = r
                .split(['?', '&'])
                .find_map(|p| p.strip_prefix("timeoutSeconds="))
                .and_then(|t| t.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("a watch without timeoutSeconds: {r}"));
            assert!((300..600).contains(&secs), "{r}");
        } else {
            assert!(
                !(r.contains("/services?") || r.contains("/endpointslices?")),
                "a list where the API server streams: {r}"
            );
        }
    }
    // (More requests may have come since: the first ones are compared.)
    let agents = api.user_agents().unwrap();
    assert!(agents.len() >= requests.len());
    let want = format!("verdict/v{} (linux/", env!("CARGO_PKG_VERSION"));
    for (r, a) in requests.iter().zip(&agents) {
        assert!(a.starts_with(&want), "{r}: User-Agent {a:?}");
    }

    // kube-proxy's birth cry, on this node's Node, through the recorder.
    let events = api.events().unwrap();
    let starting = events
        .iter()
        .find(|e| e["reason"] == "Starting")
        .unwrap_or_else(|| panic!("no Starting Event: {events:#?}"));
    assert_eq!(starting["regarding"]["kind"], "Node");
    assert_eq!(starting["regarding"]["name"], "test-node");
    assert_eq!(starting["type"], "Normal");
    assert_eq!(starting["action"], "StartKubeProxy");
    assert_eq!(starting["reportingController"], "verdict");
    assert!(
        asked(&["POST /apis/events.k8s.io/v1/namespaces/default/events"]),
        "cluster-scoped: posted in default\n{requests:#?}"
    );
    // client-go's request metrics, from kube-rs's requests.
    let metrics = http_on(&bed, 10249, "/metrics");
    let listed = metrics.lines().find(|l| {
        l.starts_with("rest_client_requests_total{code=\"200\",") && l.contains("method=\"GET\"")
    });
    assert!(
        listed.is_some_and(|l| l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            >= 4.0),
        "{metrics}"
    );
    assert!(
        metrics.contains("rest_client_request_duration_seconds_count{host=\""),
        "{metrics}"
    );

    // `verdict plan` against the same API server prints what is programmed.
    let plan = bed
        .node
        .exec(verdict, &[&["plan"][..], &args[..]].concat())
        .unwrap();
    assert!(plan.contains("172.30.0.41"), "{plan}");
    assert!(plan.contains("10.180.0.1"), "{plan}");
    assert!(!plan.contains("172.30.0.43"), "{plan}");
    // `--master` alone reaches the same server.
    let by_master = bed
        .node
        .exec(
            verdict,
            &[
                "plan",
                "--master",
                "http://127.0.0.1:16443",
                "--hostname-override",
                "test-node",
                "--cluster-cidr",
                "10.0.0.0/8",
            ],
        )
        .unwrap();
    assert_eq!(by_master, plan, "--master and --kubeconfig plan the same");

    // A watch event.
    api.apply(slice("web-1", "web", "10.180.0.2")).unwrap();
    assert_eq!(
        wait_until(
            &bed,
            "172.30.0.41",
            "10.180.0.2:80",
            Duration::from_secs(10)
        ),
        "10.180.0.2:80",
        "an EndpointSlice change is applied"
    );

    // Watch expiry: history is compacted and every watch drops. A new
    // Service and a changed slice arrive while nobody watches; the
    // clients get 410 Gone, relist, and must apply the difference while
    // the still-valid rules keep working throughout.
    let lists_before = count(&mut api, "GET /api/v1/services?");
    api.expire().unwrap();
    api.apply(service("late", "172.30.0.44", json!({})))
        .unwrap();
    api.apply(slice("late-1", "late", "10.180.0.1")).unwrap();
    api.apply(slice("web-1", "web", "10.180.0.1")).unwrap();
    api.delete("Service", "demo", "gone").unwrap();
    api.delete("EndpointSlice", "demo", "gone-1").unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut answers = Vec::new();
    loop {
        let got = who_at(&bed, "172.30.0.41");
        answers.push(got.clone());
        if got == "10.180.0.1:80" || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(
        answers.last().map(String::as_str),
        Some("10.180.0.1:80"),
        "the relist applied the change\n{}",
        log(&mut daemon)
    );
    assert!(
        answers
            .iter()
            .all(|a| a == "10.180.0.2:80" || a == "10.180.0.1:80"),
        "a valid rule was dropped during the relist: {answers:?}"
    );
    assert_eq!(
        wait_until(
            &bed,
            "172.30.0.44",
            "10.180.0.1:80",
            Duration::from_secs(10)
        ),
        "10.180.0.1:80",
        "a Service created during the expiry"
    );
    assert_eq!(
        wait_until(&bed, "172.30.0.45", "", Duration::from_secs(10)),
        "",
        "a Service deleted during the expiry is removed by the relist"
    );
    assert!(
        count(&mut api, "GET /api/v1/services?") > lists_before,
        "Services were relisted after 410 Gone"
    );

    // Deletion, and a label that takes a Service away from this proxy.
    api.delete("Service", "demo", "late").unwrap();
    assert_eq!(
        wait_until(&bed, "172.30.0.44", "", Duration::from_secs(10)),
        "",
        "a deleted Service is gone"
    );
    api.apply(service(
        "web",
        "172.30.0.41",
        json!({"service.kubernetes.io/service-proxy-name": "someone-else"}),
    ))
    .unwrap();
    assert_eq!(
        wait_until(&bed, "172.30.0.41", "", Duration::from_secs(10)),
        "",
        "a Service that another proxy now serves is removed"
    );

    // SIGTERM leaves the rules, and a verdict started while the API server
    // cannot list EndpointSlices keeps them: traffic flows throughout.
    api.apply(service("web", "172.30.0.41", json!({}))).unwrap();
    assert_eq!(
        wait_until(
            &bed,
            "172.30.0.41",
            "10.180.0.1:80",
            Duration::from_secs(10)
        ),
        "10.180.0.1:80"
    );
    let pid = daemon.0.id().to_string();
    verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
    daemon.0.wait().unwrap();
    assert!(has_table(&bed));
    api.set_served("EndpointSlice", false).unwrap();
    let mut daemon = Process(bed.node.spawn(verdict, &args).unwrap());
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            who_at(&bed, "172.30.0.41"),
            "10.180.0.1:80",
            "during the outage, after {:?}\n{}",
            outage.elapsed(),
            log(&mut daemon)
        );
    }
    // Once listed, the new process adopts the table (a full sync) without
    // a refused connection.
    api.set_served("EndpointSlice", true).unwrap();
    let back = Instant::now();
    let mut synced_at = None;
    while synced_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(1)) {
        assert!(
            back.elapsed() < Duration::from_secs(40),
            "never synced\n{}",
            log(&mut daemon)
        );
        assert_eq!(
            who_at(&bed, "172.30.0.41"),
            "10.180.0.1:80",
            "after the outage"
        );
        if synced_at.is_none() && http(&bed, "/healthz").contains("\"IPv4\":{\"lastUpdated\"") {
            synced_at = Some(Instant::now());
        }
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls until the pod reaches `want` at `ip_` (or `within` passes).
fn wait_until(bed: &TestBed, ip_: &str, want: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let got = who_at(bed, ip_);
        if got == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Initial lists so far of the collection at `prefix`: lists, and
/// streaming lists (watches with `sendInitialEvents`).
fn count(api: &mut ApiServerProcess, prefix: &str) -> usize {
    api.requests()
        .unwrap()
        .iter()
        .filter(|r| {
            r.starts_with(prefix)
                && (!r.contains("watch=true") || r.contains("sendInitialEvents=true"))
        })
        .count()
}

/// A LoadBalancer on 198.51.100.7 with one source range.
fn load_balancer(name: &str, ip: &str, node_port: u16, range: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "LoadBalancer",
                 "loadBalancerSourceRanges": [range],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
    })
}

/// The first Event the API server received that `matches` (20 s at most).
fn wait_for_event(
    api: &mut ApiServerProcess,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(e) = api.events().unwrap().into_iter().find(|e| matches(e)) {
            return e;
        }
        assert!(Instant::now() < deadline, "no {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_service_left_without_its_load_balancer_address_gets_an_event() {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let mut api = fake_api_server(&bed, 16444);
    api.apply(node()).unwrap();
    api.apply(service("web", "172.30.0.41", json!({}))).unwrap();
    api.apply(slice("web-1", "web", "10.180.0.1")).unwrap();
    // Valid for the API server, and as the kernel's intervals a conflict:
    // two LoadBalancers on one address and port whose source ranges
    // overlap. One holds the address, as with kube-proxy; the other is told.
    api.apply(load_balancer(
        "lb-a",
        "172.30.0.51",
        30051,
        "203.0.113.0/24",
    ))
    .unwrap();
    api.apply(slice("lb-a-1", "lb-a", "10.180.0.1")).unwrap();
    api.apply(load_balancer(
        "lb-b",
        "172.30.0.52",
        30052,
        "203.0.113.128/25",
    ))
    .unwrap();
    api.apply(slice("lb-b-1", "lb-b", "10.180.0.1")).unwrap();
    // An eTP=Local LoadBalancer whose health-check node port someone else
    // holds on the node's address.
    let mut local = load_balancer("lb-local", "172.30.0.53", 30053, "0.0.0.0/0");
    local["spec"]["externalTrafficPolicy"] = json!("Local");
    local["spec"]["healthCheckNodePort"] = json!(30553);
    local["status"]["loadBalancer"]["ingress"] = json!([{"ip": "198.51.100.8"}]);
    api.apply(local).unwrap();
    api.apply(slice("lb-local-1", "lb-local", "10.180.0.1"))
        .unwrap();
    bed.serve_node(&[ip("192.168.0.2")], &[30553], &[]).unwrap();

    let dir = scratch_dir("api-event");
    let kubeconfig_s = fake_kubeconfig(&dir, 16444);
    let args = [
        "--kubeconfig",
        &kubeconfig_s,
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
    ];
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let _daemon = Process(bed.node.spawn(verdict, &args).unwrap());
    assert_eq!(
        wait_until(
            &bed,
            "172.30.0.41",
            "10.180.0.1:80",
            Duration::from_secs(40)
        ),
        "10.180.0.1:80",
        "the rest is programmed"
    );
    let event = wait_for_event(&mut api, "an Event for demo/lb-b", |e| {
        e["regarding"]["name"] == "lb-b"
    });
    assert_eq!(event["regarding"]["kind"], "Service");
    assert_eq!(event["regarding"]["namespace"], "demo");
    // kubectl describe finds a Service's Events by its uid.
    assert_eq!(event["regarding"]["uid"], "uid-demo-lb-b", "{event}");
    assert!(event["regarding"]["resourceVersion"].is_string(), "{event}");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "DestinationConflict");
    assert_eq!(event["reportingController"], "verdict");
    assert_eq!(event["reportingInstance"], "verdict-test-node");
    let note = event["note"].as_str().unwrap();
    println!(
        "Event for demo/lb-b: {} {}: {note}",
        event["type"], event["reason"]
    );
    assert!(
        note.contains("demo/lb-b:http") && note.contains("is also claimed by demo/lb-a:http"),
        "{note}"
    );
    assert!(
        event["eventTime"]
            .as_str()
            .is_some_and(|t| t.len() == "2026-12-01T10:00:00.000000Z".len()),
        "{event}"
    );
    // kube-proxy's FailedToStartServiceHealthcheck, for the busy port.
    let busy = wait_for_event(&mut api, "FailedToStartServiceHealthcheck", |e| {
        e["reason"] == "FailedToStartServiceHealthcheck"
    });
    assert_eq!(busy["regarding"]["name"], "lb-local");
    assert_eq!(busy["type"], "Warning");
    assert_eq!(busy["action"], "Listen");
    let note = busy["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "node test-node failed to start healthcheck \"demo/lb-local\" on port 30553:"
        ),
        "{note}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bed with two pods for the web Service and a client pod, and the fake
/// API server holding the Node, web and its slice (to 10.180.0.1); with
/// `watch_list` false it refuses streaming lists, as with WatchList off.
fn web_on_fake_api(watch_list: bool) -> Option<(TestBed, ApiServerProcess)> {
    let mut bed = bed()?;
    for pod in ["10.180.0.1", "10.180.0.2"] {
        bed.add_pod(ip(pod), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let mut api = fake_api_server(&bed, 16444);
    if !watch_list {
        api.set_watch_list(false).unwrap();
    }
    api.apply(node()).unwrap();
    api.apply(service("web", "172.30.0.41", json!({}))).unwrap();
    api.apply(slice("web-1", "web", "10.180.0.1")).unwrap();
    Some((bed, api))
}

/// verdict against the fake API server, with `extra` flags; its log is
/// `dir/verdict.log`.
fn verdict_on_fake_api(
    bed: &TestBed,
    dir: &std::path::Path,
    extra: &[&str],
) -> (Process, std::path::PathBuf) {
    let kubeconfig = fake_kubeconfig(dir, 16444);
    let mut args = vec![
        "--kubeconfig",
        &kubeconfig,
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
    ];
    args.extend(extra);
    let log = dir.join("verdict.log");
    (spawn_verdict(bed, args, &log, None), log)
}

/// The API server's port refused (a table of the test's own), or not.
fn refuse_api_port(bed: &TestBed, refused: bool) {
    if !refused {
        bed.node.exec("nft", &["delete table inet outage"]).unwrap();
        return;
    }
    for cmd in [
        "add table inet outage",
        "add chain inet outage input { type filter hook input priority -500; }",
        "add rule inet outage input tcp dport 16444 reject with tcp reset",
    ] {
        bed.node.exec("nft", &[cmd]).unwrap();
    }
}

/// Polls until the web Service is answered by `want`, failing after
/// `within` with `what`; returns how long it took.
fn until_web_is(bed: &TestBed, want: &str, within: Duration, what: &str) -> Duration {
    let t = Instant::now();
    while who_at(bed, "172.30.0.41") != want {
        assert!(t.elapsed() < within, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

#[test]
fn lists_that_keep_failing_back_off_and_the_node_is_programmed_when_the_api_server_appears() {
    // verdict starts while the API server refuses every connection: each
    // watch's list fails again and again, and must back off (0.5 s doubling
    // to 4 s) rather than be tried every 0.5 s (each retry is logged at
    // -v=4, the first failure as a warning); once the API server answers,
    // the node is programmed within the back-off.
    let Some((bed, _api)) = web_on_fake_api(true) else {
        return;
    };
    refuse_api_port(&bed, true);
    let dir = scratch_dir("down-at-start");
    let (_daemon, log) = verdict_on_fake_api(&bed, &dir, &["-v", "4"]);
    std::thread::sleep(Duration::from_secs(20));
    refuse_api_port(&bed, false);
    let took = until_web_is(
        &bed,
        "10.180.0.1:80",
        Duration::from_secs(8),
        "not programmed 8 s after the API server appeared",
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let mut counts = Vec::new();
    for watch in ["Services", "EndpointSlices", "Node"] {
        let tag = format!("watch=\"{watch}\"");
        let of = |what: &str| {
            text.lines()
                .filter(|l| l.contains(what) && l.contains(&tag))
                .count()
        };
        // One warning, then each retry at -v=4.
        let warned = of("cannot reach the API server");
        let n = warned + of("the watch failed again");
        counts.push(format!("{watch} {n}"));
        assert_eq!(warned, 1, "{watch}: {text}");
        // 0.5 + 1 + 2 + 4 + 4 + 4 + 4 s: about 8 tries in 20 s.
        assert!(
            (3..=11).contains(&n),
            "{watch}: {n} failures in 20 s:\n{text}"
        );
    }
    println!(
        "API server away for the first 20 s: {}; programmed {took:?} after it appeared",
        counts.join(", ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_silent_api_server_is_abandoned_within_the_read_timeout() {
    // The API server (or the path to it) hangs without closing anything:
    // open watches go quiet, new requests are never answered. Every
    // request has a read timeout (75 s: the API server sends each watch a
    // bookmark every minute, and a shorter one would cut healthy idle
    // watches), so verdict gives up on the silent connections and asks
    // again, and changes flow once the server speaks.
    let Some((bed, mut api)) = web_on_fake_api(true) else {
        return;
    };
    let dir = scratch_dir("silent");
    let (_daemon, _log) = verdict_on_fake_api(&bed, &dir, &["--min-sync-period", "0s"]);
    until_web_is(
        &bed,
        "10.180.0.1:80",
        Duration::from_secs(15),
        "never programmed",
    );
    std::thread::sleep(Duration::from_secs(1));
    let watches = |api: &mut ApiServerProcess| {
        api.requests()
            .unwrap()
            .iter()
            .filter(|r| r.contains("/api/v1/services?") && r.contains("watch=true"))
            .count()
    };
    let before = watches(&mut api);
    api.set_silent(true).unwrap();
    let silent = Instant::now();
    while watches(&mut api) == before {
        assert!(
            silent.elapsed() < Duration::from_secs(90),
            "the silent Services watch was not abandoned within 90 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let abandoned = silent.elapsed();
    assert!(
        abandoned >= Duration::from_secs(60),
        "abandoned after {abandoned:?}: too early"
    );
    api.set_silent(false).unwrap();
    api.apply(slice("web-1", "web", "10.180.0.2")).unwrap();
    let back = until_web_is(
        &bed,
        "10.180.0.2:80",
        Duration::from_secs(10),
        "no change 10 s after the server spoke again",
    );
    println!(
        "a silent Services watch was abandoned after {abandoned:?}; the change was through {back:?} after the server spoke again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The API server cannot be reached for 60 s (every packet to its port is
/// refused, the open watches too): verdict keeps its rules meanwhile, and
/// a change made as the server is reachable again reaches the data plane
/// within 5 s, since its back-off never waits more than 4 s.
#[test]
fn a_change_flows_within_5_s_of_the_api_server_coming_back() {
    // An API server without streaming lists (WatchList off): verdict lists
    // from its cache instead.
    let Some((bed, mut api)) = web_on_fake_api(false) else {
        return;
    };
    let dir = scratch_dir("outage");
    let (_daemon, log) = verdict_on_fake_api(&bed, &dir, &["--min-sync-period", "0s", "-v", "2"]);
    until_web_is(
        &bed,
        "10.180.0.1:80",
        Duration::from_secs(15),
        "never programmed",
    );
    refuse_api_port(&bed, true);
    // Every watch ends and must relist (its resourceVersion is gone): the
    // lists keep failing for the whole outage.
    api.expire().unwrap();
    let gone = Instant::now();
    while gone.elapsed() < Duration::from_secs(60) {
        assert_eq!(
            who_at(&bed, "172.30.0.41"),
            "10.180.0.1:80",
            "the rules stay while the API server is away"
        );
        std::thread::sleep(Duration::from_secs(5));
    }
    refuse_api_port(&bed, false);
    api.apply(slice("web-1", "web", "10.180.0.2")).unwrap();
    let back = until_web_is(
        &bed,
        "10.180.0.2:80",
        Duration::from_secs(5),
        "the change is not through 5 s after the API server came back",
    );
    println!("the change was through {back:?} after the API server came back");
    // The outage's log at -v=2: one short warning per watch when it
    // starts failing, none of the client's own lines, and one line per
    // watch when it works again (the retries in between are at -v=4).
    std::thread::sleep(Duration::from_millis(500));
    let text = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with('W')).collect();
    let outage: Vec<&str> = warnings
        .iter()
        .copied()
        .filter(|l| l.contains("cannot reach the API server"))
        .collect();
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    let client_lines = text
        .lines()
        .filter(|l| l.contains("failed with error") || l.contains("HyperError"))
        .count();
    let errors = text.lines().filter(|l| l.starts_with('E')).count();
    let again: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("the watch works again"))
        .collect();
    println!(
        "a 60 s outage logged {} warnings ({} of them unreachable), {errors} errors, {client_lines} client lines, {} lines when it ended; the longest line {longest} bytes; the first warning:\n{}",
        warnings.len(),
        outage.len(),
        again.len(),
        outage.first().unwrap_or(&"")
    );
    assert!(!outage.is_empty(), "{text}");
    for watch in ["Services", "EndpointSlices", "Node", "ServiceCIDRs"] {
        let tag = format!("watch=\"{watch}\"");
        let n = warnings.iter().filter(|l| l.contains(&tag)).count();
        assert!(n <= 1, "{watch}: {n} warnings in a 60 s outage: {text}");
        let n = again.iter().filter(|l| l.contains(&tag)).count();
        assert!(n <= 1, "{watch}: {n} lines as it ended: {text}");
    }
    assert_eq!(client_lines, 0, "{text}");
    assert_eq!(errors, 0, "{text}");
    assert!(
        outage.iter().all(|l| l.len() < 400),
        "concise: {}",
        outage.iter().max_by_key(|l| l.len()).unwrap()
    );
    assert!(!again.is_empty(), "{text}");
    // Refused once, each watch lists from the cache (whole, resourceVersion=0).
    assert!(text.contains("does not serve streaming lists"), "{text}");
    let requests = api.requests().unwrap();
    for kind in [
        "/api/v1/services?",
        "/apis/discovery.k8s.io/v1/endpointslices?",
    ] {
        assert!(
            requests.iter().any(|r| r.contains(kind)
                && !r.contains("watch=true")
                && r.contains("resourceVersion=0")
                && !r.contains("limit=")),
            "{kind}: {requests:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
