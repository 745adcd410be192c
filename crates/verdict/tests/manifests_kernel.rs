//! The real `verdict run --manifests` binary, inside the node of a
//! network-namespace test bed: traffic reaches the service, follows edits
//! of the manifests, survives a broken document, and the rules stay when
//! verdict is stopped. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::process::Command;
use std::time::{Duration, Instant};

use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  clusterIP: 172.30.0.41\n  ports: [{name: http, port: 80, protocol: TCP}]\n";

const LB_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: lb, namespace: demo}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.42\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30500\n  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]\nstatus:\n  loadBalancer: {ingress: [{ip: 198.51.100.42}]}\n";

/// The LoadBalancer's slice: one endpoint, on this node or another one.
fn lb_slice(local: bool) -> String {
    let node = if local { "test-node" } else { "other-node" };
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: lb-1\n  namespace: demo\n  labels: {{kubernetes.io/service-name: lb}}\naddressType: IPv4\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n- {{addresses: [10.180.0.1], nodeName: {node}}}\n"
    )
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: test-node}\nstatus:\n  addresses: [{type: InternalIP, address: 192.168.0.2}]\n";

fn slice(endpoint: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n- {{addresses: [{endpoint}], nodeName: test-node}}\n"
    )
}

/// A test bed with two endpoint pods (10.180.0.1 and .2, listening on
/// 80) and a client pod (10.0.0.2), and a manifests directory holding the
/// Service `demo/web` with 10.180.0.1 as its endpoint.
fn web_bed(tag: &str) -> Option<(TestBed, std::path::PathBuf)> {
    let mut bed = bed()?;
    for (pod, ports) in [
        ("10.180.0.1", &[80][..]),
        ("10.180.0.2", &[80]),
        ("10.0.0.2", &[]),
    ] {
        bed.add_pod(ip(pod), Placement::Local, ports, &[]).unwrap();
    }
    let dir = scratch_dir(tag);
    write(&dir, "service.yaml", SERVICE);
    write(&dir, "slice.yaml", &slice("10.180.0.1"));
    Some((bed, dir))
}

#[test]
fn traffic_follows_the_manifests() {
    let Some((bed, dir)) = web_bed("manifests") else {
        return;
    };

    let verdict = env!("CARGO_BIN_EXE_verdict");
    let dir_s = dir.to_string_lossy().into_owned();
    let args = [
        "run",
        "--manifests",
        &dir_s,
        "--hostname-override",
        "test-node",
        "--bind-address",
        "192.168.0.2",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--proxy-mode",
        "nftables",
        "--min-sync-period",
        "0s",
        // Each sync's summary, which the restart below checks.
        "-v=2",
    ];
    let child = bed.node.spawn(verdict, &args).unwrap();
    let mut daemon = Process(child);

    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "programmed from the manifests"
    );

    // Health, as kube-proxy reports it: alive once synced, but not ready
    // for load-balancer traffic until its Node is known.
    let live = http(&bed, "/livez");
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");
    let healthz = http(&bed, "/healthz");
    assert!(healthz.starts_with("HTTP/1.1 503"), "{healthz}");
    assert!(healthz.contains("\"nodeEligible\":false"), "{healthz}");
    write(&dir, "node.yaml", NODE);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut healthz = http(&bed, "/healthz");
    while !healthz.starts_with("HTTP/1.1 200") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        healthz = http(&bed, "/healthz");
    }
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    assert!(healthz.contains("\"IPv4\":{\"lastUpdated\""), "{healthz}");
    // A new Node means a full sync; wait for it, so that the next edit is
    // synced on its own (partially) rather than together with it.
    let full_syncs = "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&http_on(&bed, 10249, "/metrics"), full_syncs).unwrap_or(0.0) < 2.0 {
        assert!(
            Instant::now() < deadline,
            "no full sync after the Node changed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The edit carries the trigger time the EndpointSlice controller would
    // set; network-programming latency is measured from it.
    let trigger = verdict_admin::time::rfc3339_nano(std::time::SystemTime::now());
    write(
        &dir,
        "slice.yaml",
        &slice("10.180.0.2").replace(
            "  namespace: demo\n",
            &format!(
                "  namespace: demo\n  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{trigger}\"}}\n"
            ),
        ),
    );
    assert_eq!(
        wait_for(&bed, "10.180.0.2:80"),
        "10.180.0.2:80",
        "an edited file is applied"
    );

    // kube-proxy's metrics, on 127.0.0.1:10249.
    let metrics = http_on(&bed, 10249, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let at_least = |series: &str, min: f64| {
        let v = sample(&metrics, series);
        assert!(v.is_some_and(|v| v >= min), "{series} = {v:?}\n{metrics}");
    };
    at_least(
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        2.0,
    );
    at_least(
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        1.0,
    );
    at_least(
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        1.0,
    );
    at_least("kubeproxy_sync_proxy_rules_endpoint_changes_total", 2.0);
    at_least("kubeproxy_sync_proxy_rules_service_changes_total", 1.0);
    at_least(
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}",
        1.0,
    );
    at_least("kubeproxy_proxy_healthz_total{code=\"503\"}", 1.0);
    at_least("kubeproxy_proxy_healthz_total{code=\"200\"}", 1.0);
    at_least("kubeproxy_proxy_livez_total{code=\"200\"}", 1.0);
    at_least(
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
        1.7e9,
    );
    assert_eq!(
        sample(
            &metrics,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
        ),
        Some(0.0)
    );
    assert_eq!(
        http_on(&bed, 10249, "/proxyMode").lines().last(),
        Some("nftables")
    );

    // A LoadBalancer with externalTrafficPolicy Local gets its health-check
    // node port on the node's primary IP: 200 while it has a ready local
    // endpoint, 503 without.
    write(&dir, "lb.yaml", LB_SERVICE);
    write(&dir, "lb-slice.yaml", &lb_slice(true));
    let poll = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = http_at(&bed, "192.168.0.2", 30500, "/anything");
            if r.starts_with(want) || Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let r = poll("HTTP/1.1 200");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 1\r\n"), "{r}");
    assert!(r.contains("\"localEndpoints\": 1"), "{r}");
    write(&dir, "lb-slice.yaml", &lb_slice(false));
    let r = poll("HTTP/1.1 503");
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("X-Load-Balancing-Endpoint-Weight: 0\r\n"), "{r}");

    write(
        &dir,
        "broken.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: demo}\nspec: {ports: [{port: nope}]}\n",
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        who(&bed),
        "10.180.0.2:80",
        "a broken document breaks nothing else"
    );

    std::fs::remove_file(dir.join("service.yaml")).unwrap();
    assert_eq!(
        wait_for(&bed, ""),
        "",
        "a removed Service stops being proxied"
    );
    write(&dir, "service.yaml", SERVICE);
    assert_eq!(wait_for(&bed, "10.180.0.2:80"), "10.180.0.2:80");

    // SIGTERM: verdict ends, the rules stay and traffic keeps flowing.
    let pid = daemon.0.id().to_string();
    verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
    let status = daemon.0.wait().unwrap();
    assert!(!status.success() || status.code() == Some(0));
    assert_eq!(who(&bed), "10.180.0.2:80", "rules outlive the process");

    // Restart: the new process adopts what the kernel has and keeps the
    // service working. (That no connection fails *while* it starts is
    // `restart_keeps_every_connection`, ignored for a known issue.)
    let child = bed.node.spawn(verdict, &args).unwrap();
    let mut daemon = Process(child);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        wait_for(&bed, "10.180.0.2:80"),
        "10.180.0.2:80",
        "after the restart"
    );
    let live = http(&bed, "/livez");
    assert!(
        live.starts_with("HTTP/1.1 200"),
        "the new process synced: {live}"
    );
    let pid = daemon.0.id().to_string();
    verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
    daemon.0.wait().unwrap();
    let mut log = String::new();
    if let Some(mut e) = daemon.0.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut log).unwrap();
    }
    assert!(log.contains("synced"), "{log}");
    for line in log.lines().filter(|l| l.contains("synced")) {
        println!("after restart: {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file nested 100,000 levels deep beside good ones: it is refused at
/// once with the limit named, once; the good files are programmed and
/// their edits keep flowing.
#[test]
fn a_file_nested_too_deep_holds_nothing_back() {
    let Some((bed, dir)) = web_bed("nested") else {
        return;
    };
    write(
        &dir,
        "nested.yaml",
        &format!("spec: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)),
    );
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let dir_s = dir.to_string_lossy().into_owned();
    let args = [
        "--manifests",
        &dir_s,
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--min-sync-period",
        "0s",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
    ];
    let started = Instant::now();
    let mut daemon = Process(bed.node.spawn(verdict, &args).unwrap());
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let served = started.elapsed();
    assert!(served < Duration::from_secs(5), "served after {served:?}");
    write(&dir, "slice.yaml", &slice("10.180.0.2"));
    assert_eq!(
        wait_for(&bed, "10.180.0.2:80"),
        "10.180.0.2:80",
        "an edit beside the bad file"
    );
    // Fixed, the file is read without a restart.
    write(&dir, "nested.yaml", "spec: [[1]]\n");
    std::thread::sleep(Duration::from_millis(500));
    let pid = daemon.0.id().to_string();
    verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
    daemon.0.wait().unwrap();
    let mut log = String::new();
    if let Some(mut e) = daemon.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut log);
    }
    let named: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("nested.yaml: file: is nested more than 100 levels deep"))
        .collect();
    assert_eq!(named.len(), 1, "{log}");
    assert!(
        log.contains("nested.yaml: object (document 1): has no kind"),
        "the fixed file is read: {log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A restart must not refuse a single new connection: a client connects
/// in a loop while a second verdict starts and runs its first full sync.
/// Each round edits the manifests just before the stop, so the stopped
/// process leaves chains it had flushed but not yet deleted, which the next
/// one adopts. `VERDICT_RESTARTS=N` runs N rounds (default 5).
///
/// History: until 2026-12-03 a connection was refused now and then (twice
/// in two CI runs, about once in 40 to 80 rounds alone), not because of
/// the restart: the connections this test made in round 0 before verdict's
/// first sync left conntrack entries without DNAT (SYN_SENT, unreplied,
/// kept 2 minutes); a later connection that reused one's source port was
/// taken for a retransmission of it, so not DNATed, and `cluster-ips-check`
/// rejected it (ICMP port unreachable from the node, whose
/// `IcmpOutDestUnreachs` this test prints). With the client's ports
/// limited to 256 every reuse was refused; the events showed the one
/// un-DNATed entry of each port. Round 0 now waits for the rules before
/// its first connection, and every round is checked.
#[test]
fn restart_keeps_every_connection() {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir("restart");
    write(&dir, "service.yaml", SERVICE);
    write(&dir, "slice.yaml", &slice("10.180.0.1"));
    write(&dir, "node.yaml", NODE);
    write(&dir, "lb.yaml", LB_SERVICE);
    write(&dir, "lb-slice.yaml", &lb_slice(false));
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let dir_s = dir.to_string_lossy().into_owned();
    let args = [
        "--manifests",
        &dir_s,
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--min-sync-period",
        "0s",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
    ];
    bed.add_pod(ip("10.180.0.2"), Placement::Local, &[80], &[])
        .unwrap();
    let rounds: usize = std::env::var("VERDICT_RESTARTS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    for round in 0..rounds {
        let mut daemon = Process(bed.node.spawn(verdict, &args).unwrap());
        if round == 0 {
            // No connection before the first rules: one sent to the
            // ClusterIP before anything DNATs it leaves a conntrack entry
            // without DNAT (unreplied, 2 minutes), and a later connection
            // that happens to reuse its source port would be taken for it
            // and refused (how this test failed until 2026-12-03).
            let deadline = Instant::now() + Duration::from_secs(10);
            while !bed
                .node
                .exec(
                    "nft",
                    &["list", "map", "ip", "verdict", "service-endpoints-tcp"],
                )
                .is_ok_and(|m| m.contains("172.30.0.41 . 80"))
            {
                assert!(Instant::now() < deadline, "never programmed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            let line = bed
                .connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 80, 500)
                .unwrap_or_else(|e| format!("ERROR {e:?}"));
            if !line.starts_with("OK 10.180.0.") {
                let at = started.elapsed();
                // What the kernel held just after: the ruleset, and the
                // connections to the Service.
                let ruleset = bed
                    .node
                    .exec("nft", &["list", "ruleset"])
                    .unwrap_or_else(|e| e.to_string());
                let flows = bed
                    .node
                    .exec("conntrack", &["-L", "-d", "172.30.0.41"])
                    .unwrap_or_else(|e| e.to_string());
                // Who sent resets: each namespace's TCP counters.
                let prefix = bed.node.name().trim_end_matches("-node").to_owned();
                let mut counters = String::new();
                for ns in ["node".to_owned(), "p0".into(), "p1".into(), "p2".into()] {
                    let name = format!("{prefix}-{ns}");
                    let out =
                        verdict_e2e::netns::run("ip", &["netns", "exec", &name, "nstat", "-az"])
                            .unwrap_or_else(|e| e.to_string());
                    counters.push_str(&format!("## {name}\n"));
                    for l in out.lines().filter(|l| {
                        let k = l.split_whitespace().next().unwrap_or("");
                        (k.contains("Rst")
                            || k.contains("Reset")
                            || k.contains("TW")
                            || k.contains("Paws")
                            || k.contains("Refus")
                            || k.contains("Abort")
                            || k.contains("ListenDrop")
                            || k.contains("ListenOverflow")
                            || k.contains("Unreach"))
                            && l.split_whitespace().nth(1) != Some("0")
                    }) {
                        counters.push_str(l);
                        counters.push('\n');
                    }
                }
                let _ = daemon.0.kill();
                let _ = daemon.0.wait();
                let mut log = String::new();
                if let Some(mut e) = daemon.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut log);
                }
                panic!(
                    "restart {round}, after {at:?}: {line}\n{log}\n# the ruleset just after\n{ruleset}\n# conntrack\n{flows}\n# TCP counters\n{counters}"
                );
            }
        }
        // An edit just before the stop leaves the old process with chains
        // it has flushed but not yet deleted: the next one adopts them.
        let endpoint = if round % 2 == 0 {
            "10.180.0.2"
        } else {
            "10.180.0.1"
        };
        write(&dir, "slice.yaml", &slice(endpoint));
        std::thread::sleep(Duration::from_millis(300 + 100 * (round as u64 % 5)));
        let pid = daemon.0.id().to_string();
        verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
        daemon.0.wait().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const UDP_SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: dns, namespace: demo}\nspec:\n  clusterIP: 172.30.0.53\n  ports: [{name: dns, port: 53, protocol: UDP}]\n";

fn udp_slice(endpoints: &[&str]) -> String {
    let list: Vec<String> = endpoints
        .iter()
        .map(|e| format!("- {{addresses: [{e}], nodeName: test-node}}\n"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: demo\n  labels: {{kubernetes.io/service-name: dns}}\naddressType: IPv4\nports: [{{name: dns, port: 53, protocol: UDP}}]\nendpoints:{}\n{}",
        if list.is_empty() { " []" } else { "" },
        list.concat()
    )
}

/// One UDP exchange with the service from the client pod's fixed source
/// port: the same conntrack entry every time, until it is deleted.
fn udp_who(bed: &TestBed) -> String {
    let line = bed
        .connect_from(ip("10.0.0.2"), 40053, ip("172.30.0.53"), "udp", 53, 500)
        .unwrap_or_default();
    let mut words = line.split_whitespace();
    match words.next() {
        Some("OK") => words.next().unwrap_or("").to_string(),
        other => other.unwrap_or("").to_string(),
    }
}

fn udp_wait_for(bed: &TestBed, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = udp_who(bed);
        if got == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// kube-proxy's stale UDP conntrack cleanup: a client that keeps talking
/// from one source port stays in one conntrack entry, which still points at
/// the old endpoint unless verdict deletes it.
#[test]
fn stale_udp_conntrack_entries_are_deleted() {
    stale_udp(&[], None);
}

/// The same through the `nft` and `conntrack` programs.
#[test]
fn stale_udp_conntrack_entries_are_deleted_through_nft_and_conntrack() {
    stale_udp(&["--nftables-backend", "nft"], None);
}

/// With neither `nft` nor `conntrack` on its PATH, verdict programs the
/// node, follows changes and deletes stale UDP entries all the same: the
/// netlink backend needs no program.
#[test]
fn verdict_runs_without_nft_or_conntrack_installed() {
    let bin = scratch_dir("no-nft-bin");
    // Only `ip`, which starts verdict inside the namespace.
    let ip_path = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v ip"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::os::unix::fs::symlink(ip_path.trim(), bin.join("ip")).unwrap();
    let path = bin.to_string_lossy().into_owned();
    for program in ["nft", "conntrack"] {
        let found = Command::new("/bin/sh")
            .args(["-c", &format!("command -v {program}")])
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(!found.success(), "{program} is still on {path}");
    }
    stale_udp(&[], Some(&path));
    let _ = std::fs::remove_dir_all(&bin);
}

fn stale_udp(extra: &[&str], path: Option<&str>) {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[], &[53])
        .unwrap();
    bed.add_pod(ip("10.180.0.2"), Placement::Local, &[], &[53])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir("conntrack");
    write(&dir, "service.yaml", UDP_SERVICE);
    write(&dir, "slice.yaml", &udp_slice(&["10.180.0.1"]));
    let log = dir.join("verdict.log");
    let mut args: Vec<std::ffi::OsString> = vec!["--manifests".into(), dir.clone().into()];
    for a in [
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--min-sync-period",
        "0s",
        "--healthz-bind-address",
        "",
    ]
    .iter()
    .chain(extra)
    {
        args.push(a.into());
    }
    let _daemon = spawn_verdict(&bed, args, &log, path);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        udp_wait_for(&bed, "10.180.0.1:53"),
        "10.180.0.1:53",
        "{}",
        log_text()
    );

    // The endpoint moves; the old pod still answers if asked.
    write(&dir, "slice.yaml", &udp_slice(&["10.180.0.2"]));

    assert_eq!(
        udp_wait_for(&bed, "10.180.0.2:53"),
        "10.180.0.2:53",
        "the entry to the removed endpoint was deleted\n{}",
        log_text()
    );

    // Scale to zero: the service rejects, instead of the entry living on.
    write(&dir, "slice.yaml", &udp_slice(&[]));
    let got = udp_wait_for(&bed, "REFUSED");
    assert_eq!(got, "REFUSED", "scaled to zero\n{}", log_text());
    let text = log_text();
    assert!(!text.contains("cleanup failed"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The keys of one of the node's verdict sets, as `nft` lists them.
fn set_listing(bed: &TestBed, set: &str) -> String {
    bed.node
        .exec("nft", &["list", "set", "ip", "verdict", set])
        .unwrap_or_default()
}

/// The elements of one of the node's verdict maps, as `nft` lists them.
fn map_listing(bed: &TestBed, map: &str) -> String {
    bed.node
        .exec("nft", &["list", "map", "ip", "verdict", map])
        .unwrap_or_default()
}

#[test]
fn a_service_added_is_staged_then_moved_into_its_map() {
    // A Service added to a running node reaches its endpoint through the
    // staging (its key in staged-service-ips and in the set of its chain:
    // no jump is added, so the kernel validates nothing); a few seconds
    // later one transaction moves it into service-ips, and it still
    // answers. nft lists every step.
    let Some((bed, dir)) = web_bed("staging") else {
        return;
    };
    let mut args = vec!["run".to_owned()];
    args.extend(node_flags(&dir.to_string_lossy()));
    args.extend(["--min-sync-period".to_owned(), "0s".to_owned()]);
    let mut daemon = spawn_verdict(&bed, &args, &dir.join("verdict.log"), None);
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");

    // The second Service has one endpoint, as the first: its chain
    // (endpoints-1) is there, so its jump is staged.
    write(
        &dir,
        "api.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: demo}\nspec:\n  clusterIP: 172.30.0.43\n  ports: [{name: http, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: api-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: api}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- {addresses: [10.180.0.2], nodeName: test-node}\n",
    );
    let added = Instant::now();
    let deadline = added + Duration::from_secs(10);
    let mut got = who_at(&bed, "172.30.0.43");
    while got != "10.180.0.2:80" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        got = who_at(&bed, "172.30.0.43");
    }
    assert_eq!(got, "10.180.0.2:80", "the added Service answers");
    let staged = set_listing(&bed, "staged-service-ips-endpoints-1");
    let map = map_listing(&bed, "service-ips");
    assert!(map.contains("172.30.0.41 . tcp . 80"), "{map}");
    if added.elapsed() < verdict_proxier::staging::QUIET {
        assert!(
            staged.contains("172.30.0.43 . tcp . 80") && staged.contains("demo/api:http"),
            "staged, with its Service named: {staged}"
        );
        assert!(!map.contains("172.30.0.43"), "not in the map yet: {map}");
        assert!(
            set_listing(&bed, "staged-service-ips").contains("172.30.0.43 . tcp . 80"),
            "behind the gate"
        );
        let staged = "verdict_staged_jumps{ip_family=\"IPv4\"}";
        let metrics = http_on(&bed, 10249, "/metrics");
        assert_eq!(sample(&metrics, staged), Some(1.0), "{metrics}");
        // The table as verdict reads it back has no drift.
        let drift = http_on(&bed, 10249, "/api/v1/drift");
        assert!(drift.contains("\"missing\":0"), "{drift}");
        assert!(drift.contains("\"extra\":0"), "{drift}");
    }

    // Staging folds into the map once quiet.
    let deadline = Instant::now() + verdict_proxier::staging::QUIET + Duration::from_secs(10);
    let mut map = map_listing(&bed, "service-ips");
    while !map.contains("172.30.0.43 . tcp . 80") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        map = map_listing(&bed, "service-ips");
    }
    assert!(
        map.contains("172.30.0.43 . tcp . 80 comment \"demo/api:http\" : goto endpoints-1"),
        "moved into service-ips: {map}"
    );
    let staged = set_listing(&bed, "staged-service-ips");
    assert!(
        !staged.contains("172.30.0.43"),
        "and out of staging: {staged}"
    );
    assert_eq!(who_at(&bed, "172.30.0.43"), "10.180.0.2:80");
    assert_eq!(who(&bed), "10.180.0.1:80");
    // The gauge follows the sync that moved it (recorded just after).
    let deadline = Instant::now() + Duration::from_secs(2);
    let staged_jumps = || {
        sample(
            &http_on(&bed, 10249, "/metrics"),
            "verdict_staged_jumps{ip_family=\"IPv4\"}",
        )
    };
    let mut now_staged = staged_jumps();
    while now_staged != Some(0.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now_staged = staged_jumps();
    }
    assert_eq!(now_staged, Some(0.0));

    let pid = daemon.0.id().to_string();
    verdict_e2e::netns::run("kill", &["-TERM", &pid]).unwrap();
    daemon.0.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client whose SYN reaches a ClusterIP before its Service's rules
/// exist keeps a conntrack entry that is never DNATed: its retransmitted
/// SYNs keep to it, and it is not answered until the entry expires (2
/// minutes). verdict deletes such entries (never answered, never NATed)
/// when the destination first has a serving endpoint, so the next
/// retransmission is DNATed: answered within 2 s of the rules.
#[test]
fn a_client_that_came_before_the_rules_is_answered_once_they_are_there() {
    unanswered("unanswered", &[]);
}

/// The same through the `nft` and `conntrack` programs.
#[test]
fn a_client_that_came_before_the_rules_is_answered_through_nft_and_conntrack() {
    unanswered("unanswered-nft", &["--nftables-backend", "nft"]);
}

fn unanswered(tag: &str, extra: &[&str]) {
    let Some(mut bed) = bed() else {
        return;
    };
    for (pod, ports) in [("10.180.0.1", &[80][..]), ("10.0.0.2", &[])] {
        bed.add_pod(ip(pod), Placement::Local, ports, &[]).unwrap();
    }
    let dir = scratch_dir(tag);
    write(&dir, "node.yaml", NODE);
    let log = dir.join("verdict.log");
    let mut args: Vec<std::ffi::OsString> = vec!["--manifests".into(), dir.clone().into()];
    for a in [
        "--hostname-override",
        "test-node",
        "--cluster-cidr",
        "10.0.0.0/8",
        "--min-sync-period",
        "0s",
    ]
    .iter()
    .chain(extra)
    {
        args.push(a.into());
    }
    let _daemon = spawn_verdict(&bed, args, &log, None);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let t = Instant::now();
    while !bed
        .node
        .exec("nft", &["list", "tables"])
        .unwrap_or_default()
        .contains("table ip verdict")
    {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The client's SYN leaves before the Service exists: the node
    // forwards it towards its default route, where it is dropped without
    // a word (as where the service range is not routed).
    bed.lan
        .ip(&["route", "add", "blackhole", "172.30.0.0/16"])
        .unwrap();
    let client = {
        let bed = &bed;
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                let line = bed
                    .connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 80, 15_000)
                    .unwrap_or_default();
                (line, Instant::now())
            });
            // Until the SYN has left its entry on the node.
            let t = Instant::now();
            let mut entries = String::new();
            while !entries.contains("UNREPLIED") && t.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(20));
                entries = bed
                    .node
                    .exec(
                        "conntrack",
                        &["-L", "-p", "tcp", "--orig-dst", "172.30.0.41"],
                    )
                    .unwrap_or_else(|e| e.to_string());
            }
            assert!(
                entries.contains("UNREPLIED"),
                "the SYN left no entry: {entries}"
            );
            write(&dir, "service.yaml", SERVICE);
            write(&dir, "slice.yaml", &slice("10.180.0.1"));
            let t = Instant::now();
            while !map_listing(bed, "service-ips").contains("172.30.0.41")
                && !set_listing(bed, "staged-service-ips").contains("172.30.0.41")
            {
                assert!(t.elapsed() < Duration::from_secs(10), "{}", log_text());
                std::thread::sleep(Duration::from_millis(10));
            }
            let programmed = Instant::now();
            let (line, answered) = h.join().unwrap();
            (line, answered.saturating_duration_since(programmed))
        })
    };
    let (line, after) = client;
    println!("the early client was answered {after:?} after the rules: {line}");
    assert!(
        line.split_whitespace().nth(1) == Some("10.180.0.1:80"),
        "not answered: {line:?}\n{}",
        log_text()
    );
    assert!(after < Duration::from_secs(2), "{after:?}\n{}", log_text());
    assert!(
        log_text().contains("clients that reached a Service before its rules"),
        "{}",
        log_text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
