//! kube-proxy's privileged start-up settings, applied by the real binary
//! inside a namespace this test creates: `--init-only` sets the conntrack
//! sysctls of its network namespace and exits without programming
//! anything; `run` also sets its OOM score (`--oom-score-adj`). The machine's own values are
//! checked to be untouched. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use verdict_e2e::netns::{Netns, Process, can_run, unique_prefix};

const SYSCTLS: [&str; 5] = [
    "nf_conntrack_max",
    "nf_conntrack_tcp_timeout_established",
    "nf_conntrack_tcp_timeout_close_wait",
    "nf_conntrack_udp_timeout",
    "nf_conntrack_tcp_be_liberal",
];

fn read_in(ns: Option<&Netns>, name: &str) -> String {
    let path = format!("/proc/sys/net/netfilter/{name}");
    match ns {
        Some(ns) => ns.exec("cat", &[&path]).unwrap().trim().to_string(),
        None => std::fs::read_to_string(&path).unwrap().trim().to_string(),
    }
}

#[test]
fn init_only_sets_conntrack_sysctls_in_its_namespace_only() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let host_before: Vec<String> = SYSCTLS.iter().map(|n| read_in(None, n)).collect();
    let ns = Netns::create(&format!("{}-setup", unique_prefix())).unwrap();
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), verdict, "--init-only"])
        .args(["--hostname-override", "test-node"])
        .args([
            "--conntrack-udp-timeout",
            "45s",
            "--conntrack-tcp-be-liberal",
        ])
        .args(["--conntrack-tcp-timeout-close-wait", "2h"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(read_in(Some(&ns), "nf_conntrack_udp_timeout"), "45");
    assert_eq!(read_in(Some(&ns), "nf_conntrack_tcp_be_liberal"), "1");
    assert_eq!(
        read_in(Some(&ns), "nf_conntrack_tcp_timeout_close_wait"),
        "7200"
    );
    assert_eq!(
        read_in(Some(&ns), "nf_conntrack_tcp_timeout_established"),
        "86400",
        "kube-proxy's default"
    );
    // nf_conntrack_max belongs to the host's namespace: a warning, not a
    // failure, and not changed.
    if host_before[0] != "131072" {
        assert!(log.contains("cannot set nf_conntrack_max"), "{log}");
    }
    let nft = ns.exec("nft", &["list", "tables"]).unwrap();
    assert!(
        !nft.contains("verdict"),
        "--init-only programs nothing: {nft}"
    );
    let host_after: Vec<String> = SYSCTLS.iter().map(|n| read_in(None, n)).collect();
    assert_eq!(host_before, host_after, "the machine's own sysctls");

    // A value the file cannot hold is a configuration error (exit 2).
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), verdict, "--init-only"])
        .arg("--conntrack-min=-5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--conntrack-min"));
}

#[test]
fn run_sets_its_oom_score() {
    let Some(bed) = common::bed() else {
        return;
    };
    let dir = common::scratch_dir("oom");
    let dir_s = dir.to_string_lossy().into_owned();
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let args = [
        "--manifests",
        &dir_s,
        "--hostname-override",
        "test-node",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
        // Raising needs no privilege; lowering to kube-proxy's default
        // (-999) needs CAP_SYS_RESOURCE, which a container may lack.
        "--oom-score-adj",
        "500",
    ];
    let daemon = Process(bed.node.spawn(verdict, &args).unwrap());
    let path = format!("/proc/{}/oom_score_adj", daemon.0.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut adj = String::new();
    while Instant::now() < deadline {
        adj = std::fs::read_to_string(&path).unwrap_or_default();
        if adj.trim() == "500" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(adj.trim(), "500", "--oom-score-adj");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
