//! The reliability suite: the real `verdict run --manifests` binary in the
//! node of a network-namespace test bed, broken the way operators and
//! other agents break it. Each test prints the figures it measured
//! (`cargo test -p verdict --test reliability_kernel -- --nocapture
//! --test-threads 1`); `docs/reliability.md` records them. Needs root.
//!
//! - another process flushes the ruleset, deletes verdict's table or one
//!   of its chains: traffic is back within a second, both families;
//! - two LoadBalancers on one address and port: one has it, as with
//!   kube-proxy, the other keeps its ClusterIP and NodePort and is named
//!   in a warning and the metrics; another Service's change lands in the
//!   same sync;
//! - rules known broken beyond the repair window make `/healthz` fail,
//!   and it recovers with the rules;
//! - `kill -9` during a cold sync, then a restart: the same rules as a
//!   clean start;
//! - rolling endpoint replacement under a continuous client: no failed
//!   connection;
//! - the malformed-input corpus: every invalid object named in the log,
//!   the good Service unaffected, no crash;
//! - a periodic resync reads the tables back only when something was
//!   committed since verdict's last sync.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;
use verdict_nft::{Backend, Family, NftCli, TableState};

/// The tests measure time: they run one at a time, whatever the harness's
/// thread count, so that one test's load does not skew another's figures.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: test-node}\nstatus:\n  addresses: [{type: InternalIP, address: 192.168.0.2}]\n";

fn service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n"
    )
}

fn slice(service: &str, endpoints: &[(&str, &str)]) -> String {
    let mut eps = String::new();
    for (ip, state) in endpoints {
        let cond = match *state {
            "terminating" => "{ready: false, serving: true, terminating: true}",
            _ => "{ready: true, serving: true, terminating: false}",
        };
        eps.push_str(&format!(
            "- {{addresses: [{ip}], nodeName: test-node, conditions: {cond}}}\n"
        ));
    }
    let family = if endpoints.first().is_some_and(|(ip, _)| ip.contains(':')) {
        "IPv6"
    } else {
        "IPv4"
    };
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n  namespace: demo\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n{eps}"
    )
}

/// The web Service (172.30.0.41, which `who` connects to), an IPv6
/// Service so that both tables have content, and the Node.
fn base(dir: &Path, endpoint: &str) {
    write(dir, "node.yaml", NODE);
    write(dir, "web.yaml", &service("web", "172.30.0.41"));
    write(dir, "web-slice.yaml", &slice("web", &[(endpoint, "ready")]));
    write(dir, "web6.yaml", &service("web6", "fd00:30::41"));
    write(
        dir,
        "web6-slice.yaml",
        &slice("web6", &[("fd00:180::1", "ready")]),
    );
}

/// Starts verdict in the node, its log in `log`; `path` replaces `$PATH`.
fn start(bed: &TestBed, dir: &Path, log: &Path, extra: &[&str], path: Option<&str>) -> Process {
    let mut args: Vec<std::ffi::OsString> = vec!["run".into()];
    args.extend(
        node_flags(&dir.to_string_lossy())
            .into_iter()
            .map(Into::into),
    );
    args.extend(extra.iter().map(Into::into));
    spawn_verdict(bed, args, log, path)
}

fn log_of(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// The pod's connection to the web Service, with a short timeout: who
/// answered, or "".
fn quick(bed: &TestBed) -> String {
    bed.connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 80, 100)
        .unwrap_or_default()
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string()
}

/// Both of verdict's tables, without what the data path writes (the
/// elements of the sets with a timeout: affinity, and the memory of
/// refused connections, which a connection refused while the table was
/// broken leaves there for 3 minutes).
fn tables(nft: &mut NftCli) -> (Option<TableState>, Option<TableState>) {
    let programmed = |t: Option<TableState>| {
        t.map(|mut t| {
            for s in t.sets.values_mut() {
                if s.set.timeout.is_some() {
                    s.elements.clear();
                }
            }
            t
        })
    };
    (
        programmed(nft.table(Family::Ip, "verdict").unwrap()),
        programmed(nft.table(Family::Ip6, "verdict").unwrap()),
    )
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bed_with_pods(pods: &[&str]) -> Option<TestBed> {
    let mut bed = bed()?;
    for p in pods {
        bed.add_pod(ip(p), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    Some(bed)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn foreign_changes_are_repaired_within_a_second() {
    foreign_changes(&[]);
}

#[test]
fn foreign_changes_are_repaired_within_a_second_through_nft() {
    foreign_changes(&["--nftables-backend", "nft"]);
}

fn foreign_changes(backend: &[&str]) {
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1"]) else {
        return;
    };
    let dir = scratch_dir("rel-foreign");
    base(&dir, "10.180.0.1");
    let log = dir.join("verdict.log");
    let _daemon = start(&bed, &dir, &log, backend, None);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        log_of(&log)
    );
    let mut nft = NftCli::in_netns(bed.node.name()).unwrap();
    wait_until("both tables", Duration::from_secs(10), || {
        let (v4, v6) = tables(&mut nft);
        v4.is_some() && v6.is_some()
    });
    let before = tables(&mut nft);

    let breakages: [(&str, &[&str]); 5] = [
        ("nft flush ruleset", &["flush", "ruleset"]),
        (
            "nft delete table ip verdict",
            &["delete", "table", "ip", "verdict"],
        ),
        (
            "nft delete table ip6 verdict",
            &["delete", "table", "ip6", "verdict"],
        ),
        (
            "nft delete chain ip verdict nat-prerouting",
            &["delete", "chain", "ip", "verdict", "nat-prerouting"],
        ),
        (
            "nft flush map ip verdict service-ips",
            &["flush", "map", "ip", "verdict", "service-ips"],
        ),
    ];
    let mut report = Vec::new();
    for (what, args) in breakages {
        let mut times = Vec::new();
        for _ in 0..10 {
            bed.node.exec("nft", args).unwrap();
            let t = Instant::now();
            // Repaired: both tables as they were, and traffic flows.
            loop {
                if quick(&bed) == "10.180.0.1:80" && tables(&mut nft) == before {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{what}: not repaired in 10 s\n{}",
                    log_of(&log)
                );
            }
            times.push(t.elapsed());
            // Settle, so that tries are independent: a change within a
            // second of the last repair counts as an agent fighting back,
            // and repairs back off.
            std::thread::sleep(Duration::from_millis(1100));
        }
        times.sort();
        report.push((what, times));
    }
    println!("\nforeign change -> traffic and both tables restored (10 tries each):");
    println!("{:<46} {:>8} {:>8} {:>8}", "change", "min", "p50", "max");
    for (what, times) in &report {
        println!(
            "{what:<46} {:>6}ms {:>6}ms {:>6}ms",
            times[0].as_millis(),
            percentile(times, 0.5).as_millis(),
            times[times.len() - 1].as_millis()
        );
    }
    for (what, times) in &report {
        let worst = times[times.len() - 1];
        assert!(worst <= Duration::from_secs(1), "{what}: worst {worst:?}");
    }
    let text = log_of(&log);
    assert!(
        text.contains("another process changed verdict's tables"),
        "{text}"
    );
    assert!(
        text.contains("delete chain ip verdict nat-prerouting"),
        "{text}"
    );
    let metrics = http_on(&bed, 10249, "/metrics");
    let v4 = sample(
        &metrics,
        "verdict_foreign_changes_total{ip_family=\"IPv4\"}",
    )
    .unwrap_or(0.0);
    let v6 = sample(
        &metrics,
        "verdict_foreign_changes_total{ip_family=\"IPv6\"}",
    )
    .unwrap_or(0.0);
    assert!(v4 >= 40.0 && v6 >= 20.0, "counted: IPv4 {v4}, IPv6 {v6}");
    // Quick repairs keep the proxy healthy.
    let h = http(&bed, "/healthz");
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rules_known_broken_beyond_the_repair_window_fail_healthz() {
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1"]) else {
        return;
    };
    let dir = scratch_dir("rel-health");
    base(&dir, "10.180.0.1");
    // An `nft` that refuses to commit while `broken` exists: the repair
    // fails until the test lets it through.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v nft"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let gate = dir.join("broken");
    let wrapper = format!(
        "#!/bin/sh\nif [ -e {gate} ] && [ \"$1\" = -f ]; then echo 'Error: injected failure' >&2; exit 1; fi\nexec {real} \"$@\"\n",
        gate = gate.display(),
        real = real.trim()
    );
    std::fs::write(bin.join("nft"), wrapper).unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join("nft"))
        .status()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.join("verdict.log");
    // The failure is injected through the program: this test runs the nft
    // backend.
    let _daemon = start(
        &bed,
        &dir,
        &log,
        &["--nftables-backend", "nft"],
        Some(&path),
    );
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        log_of(&log)
    );
    // Both families synced (not only the IPv4 one the traffic proves), so
    // no first sync is still under way when the gate closes: a sync that
    // began before the test's clock starts and fails at the gate would
    // date the breakage from its own start.
    wait_until(
        "both families synced and healthy",
        Duration::from_secs(10),
        || {
            let h = http(&bed, "/healthz");
            h.starts_with("HTTP/1.1 200") && h.contains("\"IPv6\":{\"lastUpdated\"")
        },
    );

    // The node dates a breakage from when it learns of it (the delete
    // below, or a sync it starts after), on the monotonic clock as the
    // test does.
    let t = Instant::now();
    std::fs::write(&gate, "").unwrap();
    bed.node
        .exec("nft", &["delete", "table", "ip", "verdict"])
        .unwrap();
    // Within the repair window the proxy still counts as healthy; beyond
    // it, not (kube-proxy would answer 200 until a change waited 60 s).
    wait_until("503", Duration::from_secs(10), || {
        http(&bed, "/healthz").starts_with("HTTP/1.1 503")
    });
    let unhealthy_after = t.elapsed();
    let body = http(&bed, "/healthz");
    assert!(body.contains("\"IPv4\":{\"lastUpdated\""), "{body}");
    assert!(body.contains("\"healthy\":false"), "{body}");
    assert!(
        unhealthy_after >= Duration::from_secs(5),
        "unhealthy after {unhealthy_after:?}, inside the repair window"
    );
    std::fs::remove_file(&gate).unwrap();
    let t = Instant::now();
    wait_until("repair and 200", Duration::from_secs(40), || {
        quick(&bed) == "10.180.0.1:80" && http(&bed, "/healthz").starts_with("HTTP/1.1 200")
    });
    println!(
        "\nrepair blocked: /healthz 503 after {} ms; unblocked: traffic and 200 after {} ms",
        unhealthy_after.as_millis(),
        t.elapsed().as_millis()
    );
    let metrics = http_on(&bed, 10249, "/metrics");
    let failures = sample(
        &metrics,
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}",
    )
    .unwrap_or(0.0);
    assert!(failures >= 1.0, "{metrics}");
    // Retries back off (1 s, 2 s, 4 s): a handful in those seconds, not one
    // per loop.
    let retries = log_of(&log).matches("sync failed").count();
    println!("failed syncs while blocked: {retries}");
    assert!((1..=6).contains(&retries), "{retries} failed syncs");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A LoadBalancer whose status claims `vip`, with its own ClusterIP and
/// node port and the given source ranges.
fn lb(name: &str, ip: &str, node_port: u16, ranges: &str, vip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec:\n  type: LoadBalancer\n  clusterIP: {ip}\n  loadBalancerSourceRanges: [{ranges}]\n  ports: [{{name: http, port: 80, nodePort: {node_port}, protocol: TCP}}]\nstatus:\n  loadBalancer: {{ingress: [{{ip: {vip}}}]}}\n"
    )
}

#[test]
fn two_load_balancers_on_one_address_keep_their_cluster_ips_and_node_ports() {
    // The real-cluster report: two LoadBalancers whose status claims one
    // address and port, with overlapping source ranges. As kube-proxy, one
    // of them has the address (lb-a, the first in name order, with its own
    // ranges only); lb-b keeps its ClusterIP and NodePort; the operator is
    // told which destination lb-b lost and to whom.
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1", "10.180.0.2"]) else {
        return;
    };
    bed.route_to_node(ip("198.51.100.7")).unwrap();
    let dir = scratch_dir("rel-conflict");
    base(&dir, "10.180.0.1");
    write(
        &dir,
        "lb-a.yaml",
        &lb(
            "lb-a",
            "172.30.0.51",
            30051,
            "203.0.113.0/25",
            "198.51.100.7",
        ),
    );
    write(
        &dir,
        "lb-a-slice.yaml",
        &slice("lb-a", &[("10.180.0.1", "ready")]),
    );
    write(
        &dir,
        "lb-b-slice.yaml",
        &slice("lb-b", &[("10.180.0.2", "ready")]),
    );
    let log = dir.join("verdict.log");
    let _daemon = start(&bed, &dir, &log, &[], None);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        log_of(&log)
    );
    std::thread::sleep(Duration::from_millis(1500));

    // Measured twice: an endpoint change alone, then the same kind of
    // change together with lb-b, which conflicts with lb-a.
    let change = |to: &str, with_conflict: bool| -> Duration {
        if with_conflict {
            write(
                &dir,
                "lb-b.yaml",
                &lb(
                    "lb-b",
                    "172.30.0.52",
                    30052,
                    "203.0.113.2/32, 203.0.113.128/25",
                    "198.51.100.7",
                ),
            );
        }
        write(&dir, "web-slice.yaml", &slice("web", &[(to, "ready")]));
        let t = Instant::now();
        while quick(&bed) != format!("{to}:80") {
            assert!(t.elapsed() < Duration::from_secs(10), "{}", log_of(&log));
        }
        t.elapsed()
    };
    let alone = change("10.180.0.2", false);
    std::thread::sleep(Duration::from_millis(1500));
    let with_conflict = change("10.180.0.1", true);
    println!(
        "\nendpoint change to traffic: alone {} ms; with a conflicting LoadBalancer in the same sync {} ms (minSyncPeriod 1 s)",
        alone.as_millis(),
        with_conflict.as_millis()
    );
    assert!(
        with_conflict < Duration::from_millis(1100),
        "the conflict delayed the change: {with_conflict:?}"
    );
    wait_until("the conflict's warning", Duration::from_secs(5), || {
        log_of(&log).contains("is also claimed by")
    });
    let answer = |src: &str, dst: &str, port: u16| -> String {
        bed.connect(ip(src), ip(dst), "tcp", port, 300)
            .unwrap_or_default()
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string()
    };
    // Both ClusterIPs and both NodePorts answer.
    assert_eq!(answer("10.0.0.2", "172.30.0.51", 80), "10.180.0.1:80");
    assert_eq!(answer("10.0.0.2", "172.30.0.52", 80), "10.180.0.2:80");
    assert_eq!(answer("203.0.113.2", "192.168.0.2", 30051), "10.180.0.1:80");
    assert_eq!(answer("203.0.113.2", "192.168.0.2", 30052), "10.180.0.2:80");
    // The address is lb-a's, with lb-a's ranges: a source only lb-b
    // allows is dropped.
    assert_eq!(answer("203.0.113.2", "198.51.100.7", 80), "10.180.0.1:80");
    assert_eq!(answer("203.0.113.130", "198.51.100.7", 80), "");

    let text = log_of(&log);
    let line = text
        .lines()
        .find(|l| l.contains("is also claimed by"))
        .unwrap();
    assert!(
        line.contains("demo/lb-a:http")
            && line.contains("LoadBalancer IP 198.51.100.7 port 80/TCP"),
        "{line}"
    );
    assert!(line.starts_with('W'), "a warning: {line}");
    assert!(
        !text.contains("the kernel refused"),
        "nothing refused: {text}"
    );
    let metrics = http_on(&bed, 10249, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "verdict_destination_conflicts{ip_family=\"IPv4\",namespace=\"demo\",service=\"lb-b\",port=\"http\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        !metrics.contains("verdict_quarantined_service_port{"),
        "{metrics}"
    );
    // lb-b moves to an address of its own: it has it, with its ranges,
    // and the conflict ends.
    bed.route_to_node(ip("198.51.100.8")).unwrap();
    write(
        &dir,
        "lb-b.yaml",
        &lb(
            "lb-b",
            "172.30.0.52",
            30052,
            "203.0.113.2/32, 203.0.113.128/25",
            "198.51.100.8",
        ),
    );
    wait_until("lb-b on its own address", Duration::from_secs(10), || {
        answer("203.0.113.130", "198.51.100.8", 80) == "10.180.0.2:80"
    });
    let metrics = http_on(&bed, 10249, "/metrics");
    assert!(
        !metrics.contains("verdict_destination_conflicts{"),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` ClusterIP Services with two endpoints each, in one file.
fn many(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let ip = format!("172.31.{}.{}", i / 250, i % 250 + 1);
        out.push_str(&service(&format!("s{i}"), &ip));
        out.push_str("---\n");
        out.push_str(&slice(
            &format!("s{i}"),
            &[
                (&format!("10.200.{}.{}", i / 250, i % 250 + 1), "ready"),
                (&format!("10.201.{}.{}", i / 250, i % 250 + 1), "ready"),
            ],
        ));
        out.push_str("---\n");
    }
    out
}

#[test]
fn kill_9_during_a_cold_sync_then_a_restart_gives_the_rules_of_a_clean_start() {
    kill_9(&[]);
}

#[test]
fn kill_9_during_a_cold_sync_through_nft_then_a_restart_gives_the_rules_of_a_clean_start() {
    kill_9(&["--nftables-backend", "nft"]);
}

fn kill_9(backend: &[&str]) {
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1"]) else {
        return;
    };
    let dir = scratch_dir("rel-kill");
    base(&dir, "10.180.0.1");
    const N: usize = 2000;
    write(&dir, "many.yaml", &many(N));
    let log = dir.join("verdict.log");
    let mut nft = NftCli::in_netns(bed.node.name()).unwrap();
    // Both families have synced once (IPv6 syncs after IPv4).
    let synced = |_: &mut NftCli, bed: &TestBed| {
        sample(
            &http_on(bed, 10249, "/metrics"),
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}",
        )
        .is_some_and(|v| v > 0.0)
    };

    // The reference: a clean start.
    let t = Instant::now();
    let daemon = start(&bed, &dir, &log, backend, None);
    wait_until("the clean start", Duration::from_secs(120), || {
        synced(&mut nft, &bed)
    });
    let cold = t.elapsed();
    drop(daemon);
    let reference = tables(&mut nft);
    assert!(reference.0.is_some() && reference.1.is_some());

    let mut rows = Vec::new();
    // Most of a cold start is reading the manifests; the sync is its last
    // part, where most kills land.
    for (i, frac) in [0.5, 0.8, 0.88, 0.92, 0.96, 0.99].into_iter().enumerate() {
        bed.node.exec("nft", &["flush", "ruleset"]).unwrap();
        let mut daemon = start(&bed, &dir, &log, backend, None);
        let at = cold.mul_f64(frac);
        std::thread::sleep(at);
        daemon.0.kill().unwrap(); // SIGKILL
        let _ = daemon.0.wait();
        let partial = nft.table(Family::Ip, "verdict").unwrap().map_or(0, |t| {
            t.sets.values().map(|s| s.elements.len()).sum::<usize>()
        });
        let _again = start(&bed, &dir, &log, backend, None);
        wait_until("the restart", Duration::from_secs(120), || {
            synced(&mut nft, &bed)
        });
        let after = tables(&mut nft);
        let same = after == reference;
        rows.push((i + 1, at, partial, same));
        assert!(
            same,
            "try {}: restarted rules differ from a clean start",
            i + 1
        );
        assert_eq!(quick(&bed), "10.180.0.1:80");
    }
    println!(
        "\nkill -9 during a cold sync of {N} Services (clean start {} ms):",
        cold.as_millis()
    );
    println!(
        "{:>4} {:>10} {:>16} {:>10}",
        "try", "killed at", "ip elements left", "identical"
    );
    for (i, at, partial, same) in rows {
        println!("{i:>4} {:>8}ms {partial:>16} {same:>10}", at.as_millis());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rolling_replacement_under_load_fails_no_connection() {
    let _serial = serial();
    let pods = [
        "10.180.0.1",
        "10.180.0.2",
        "10.180.0.3",
        "10.180.0.4",
        "10.180.0.5",
        "10.180.0.6",
    ];
    let Some(bed) = bed_with_pods(&pods) else {
        return;
    };
    let dir = scratch_dir("rel-rolling");
    base(&dir, "10.180.0.1");
    write(
        &dir,
        "web-slice.yaml",
        &slice("web", &[("10.180.0.1", "ready"), ("10.180.0.2", "ready")]),
    );
    let log = dir.join("verdict.log");
    let _daemon = start(&bed, &dir, &log, &[], None);
    wait_until("programmed", Duration::from_secs(10), || {
        quick(&bed).starts_with("10.180.0.")
    });

    // A rolling update, two replicas, maxSurge 1: a new pod becomes ready,
    // an old one terminates (still serving), then leaves the slice.
    let steps: Vec<Vec<(&str, &str)>> = vec![
        vec![
            ("10.180.0.1", "ready"),
            ("10.180.0.2", "ready"),
            ("10.180.0.3", "ready"),
        ],
        vec![
            ("10.180.0.1", "terminating"),
            ("10.180.0.2", "ready"),
            ("10.180.0.3", "ready"),
        ],
        vec![("10.180.0.2", "ready"), ("10.180.0.3", "ready")],
        vec![
            ("10.180.0.2", "ready"),
            ("10.180.0.3", "ready"),
            ("10.180.0.4", "ready"),
        ],
        vec![
            ("10.180.0.2", "terminating"),
            ("10.180.0.3", "ready"),
            ("10.180.0.4", "ready"),
        ],
        vec![("10.180.0.3", "ready"), ("10.180.0.4", "ready")],
        vec![
            ("10.180.0.3", "ready"),
            ("10.180.0.4", "ready"),
            ("10.180.0.5", "ready"),
        ],
        vec![
            ("10.180.0.3", "terminating"),
            ("10.180.0.4", "ready"),
            ("10.180.0.5", "ready"),
        ],
        vec![("10.180.0.4", "ready"), ("10.180.0.5", "ready")],
        vec![
            ("10.180.0.4", "ready"),
            ("10.180.0.5", "ready"),
            ("10.180.0.6", "ready"),
        ],
        vec![
            ("10.180.0.4", "terminating"),
            ("10.180.0.5", "ready"),
            ("10.180.0.6", "ready"),
        ],
        vec![("10.180.0.5", "ready"), ("10.180.0.6", "ready")],
    ];
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (ok, failed, seen) = std::thread::scope(|s| {
        let client = s.spawn(|| {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let line = bed
                    .connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 80, 1000)
                    .unwrap_or_default();
                match line.split_whitespace().nth(1) {
                    Some(by) if line.starts_with("OK") => {
                        ok += 1;
                        seen.insert(by.to_string());
                    }
                    _ => failed.push(line),
                }
            }
            (ok, failed, seen)
        });
        for step in &steps {
            write(&dir, "web-slice.yaml", &slice("web", step));
            std::thread::sleep(Duration::from_millis(1200));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        client.join().unwrap()
    });
    println!(
        "\nrolling replacement, {} slice updates: {ok} connections, {} failed, answered by {seen:?}",
        steps.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "failed connections: {failed:?}");
    assert!(ok > 100, "too few connections to mean anything: {ok}");
    assert!(seen.len() >= 4, "the client saw the replacement: {seen:?}");
    // At the end only the new pods answer.
    for _ in 0..20 {
        let who = quick(&bed);
        assert!(who == "10.180.0.5:80" || who == "10.180.0.6:80", "{who}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_malformed_corpus_names_every_invalid_object_and_touches_no_good_service() {
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1"]) else {
        return;
    };
    let dir = scratch_dir("rel-corpus");
    base(&dir, "10.180.0.1");
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../k8s/tests/corpus");
    let mut expected = Vec::new();
    for entry in std::fs::read_dir(&corpus).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".yaml") || name.ends_with(".json")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(dir.join(format!("corpus-{name}")), &text).unwrap();
        let invalid = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect:"))
            .is_some_and(|e| e.trim() != "ok");
        if invalid {
            expected.push(format!("corpus-{name}"));
        }
    }
    std::os::unix::fs::symlink(dir.join("loop-b.yaml"), dir.join("loop-a.yaml")).unwrap();
    std::os::unix::fs::symlink(dir.join("loop-a.yaml"), dir.join("loop-b.yaml")).unwrap();
    expected.push("loop-a.yaml".into());
    let log = dir.join("verdict.log");
    let t = Instant::now();
    let mut daemon = start(&bed, &dir, &log, &[], None);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        log_of(&log)
    );
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.0.try_wait().unwrap().is_none(),
        "verdict is still running"
    );
    let text = log_of(&log);
    let unnamed: Vec<&String> = expected
        .iter()
        .filter(|f| !text.contains(f.as_str()))
        .collect();
    println!(
        "\ncorpus: {} files, {} invalid; all named in the log: {}; good Service answered after {} ms",
        std::fs::read_dir(&corpus).unwrap().count() - 1,
        expected.len(),
        unnamed.is_empty(),
        took.as_millis()
    );
    assert!(unnamed.is_empty(), "not named in the log: {unnamed:?}");
    // No corpus object takes over the node's own addresses.
    let rules = bed
        .node
        .exec("nft", &["list", "table", "ip", "verdict"])
        .unwrap();
    for forbidden in ["127.0.0.1", "0.0.0.0 ", "169.254.", "224.0.0.251"] {
        assert!(!rules.contains(forbidden), "{forbidden} programmed");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The periodic resync with nothing committed since the last sync reads
/// nothing; a commit anywhere (another table) brings a real one, and a
/// change to verdict's own table is still repaired at once.
#[test]
fn a_periodic_resync_reads_the_tables_only_after_a_commit() {
    let _serial = serial();
    let Some(bed) = bed_with_pods(&["10.180.0.1"]) else {
        return;
    };
    let dir = scratch_dir("rel-periodic");
    base(&dir, "10.180.0.1");
    let log = dir.join("verdict.log");
    let _daemon = start(
        &bed,
        &dir,
        &log,
        &["--sync-period", "1s", "--min-sync-period", "0s", "-v=2"],
        None,
    );
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        log_of(&log)
    );
    let full = |log: &str| log.matches("full=true").count();
    let skipped = |log: &str| {
        log.matches("periodic resync: nothing was committed")
            .count()
    };
    // Two families per full sync; the first one is the cold sync.
    wait_until(
        "two periodic resyncs left out",
        Duration::from_secs(10),
        || skipped(&log_of(&log)) >= 2,
    );
    let text = log_of(&log);
    assert_eq!(full(&text), 2, "only the first sync was full:\n{text}");

    // A commit to another table: the next periodic resync reads back.
    bed.node
        .exec("nft", &["add", "table", "ip", "someone-else"])
        .unwrap();
    wait_until("a real periodic resync", Duration::from_secs(10), || {
        full(&log_of(&log)) >= 4
    });
    // And after it, quiet again.
    let before = skipped(&log_of(&log));
    wait_until("quiet again", Duration::from_secs(10), || {
        skipped(&log_of(&log)) >= before + 2
    });

    // A change to verdict's table is repaired at once, as always.
    bed.node
        .exec("nft", &["flush", "map", "ip", "verdict", "service-ips"])
        .unwrap();
    wait_until("the repair", Duration::from_secs(5), || {
        quick(&bed) == "10.180.0.1:80"
    });
}
