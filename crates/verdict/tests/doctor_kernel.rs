//! `verdict doctor` on a node of the network-namespace test bed, with
//! verdict running against the fake API server: everything passes; a
//! denied permission fails it; kube-proxy's table and a NAT chain of equal
//! priority are pointed out. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde_json::{Value, json};
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

use common::*;

/// Runs `verdict doctor -o json` in the node: its exit code and answer.
fn doctor(bed: &TestBed, kubeconfig: &str) -> (i32, Value) {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            bed.node.name(),
            env!("CARGO_BIN_EXE_verdict"),
        ])
        .args([
            "doctor",
            "--kubeconfig",
            kubeconfig,
            "--hostname-override",
            "test-node",
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

fn find<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {doc:#}"))
}

#[test]
fn doctor_checks_the_node_the_api_server_and_the_rules() {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let mut api = fake_api_server(&bed, 16443);
    api.apply(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}
    }))
    .unwrap();
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"clusterIP": "172.30.0.41", "clusterIPs": ["172.30.0.41"], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    api.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "demo", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.180.0.1"], "conditions": {"ready": true}, "nodeName": "test-node"}]
    }))
    .unwrap();
    let dir = scratch_dir("doctor");
    let kc = fake_kubeconfig(&dir, 16443);
    let _daemon = Process(
        bed.node
            .spawn(
                env!("CARGO_BIN_EXE_verdict"),
                &[
                    "--kubeconfig",
                    &kc,
                    "--hostname-override",
                    "test-node",
                    "--cluster-cidr",
                    "10.0.0.0/8",
                ],
            )
            .unwrap(),
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    // A node that refused traffic: a Service without endpoints, asked
    // anyway. The table remembers each refused connection for 3 minutes,
    // which is traffic, not drift.
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "empty", "namespace": "demo"},
        "spec": {"clusterIP": "172.30.0.43", "clusterIPs": ["172.30.0.43"], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    let t = std::time::Instant::now();
    while !who_at(&bed, "172.30.0.43").is_empty() || t.elapsed() < std::time::Duration::from_secs(1)
    {
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for _ in 0..10 {
        let _ = bed.connect(ip("10.0.0.2"), ip("172.30.0.43"), "tcp", 80, 500);
    }
    let remembered = bed
        .node
        .exec(
            "nft",
            &["list", "set", "ip", "verdict", "rejected-connections"],
        )
        .unwrap();
    assert!(remembered.contains("172.30.0.43"), "{remembered}");

    let (code, doc) = doctor(&bed, &kc);
    println!("{doc:#}");
    for name in [
        "kernel",
        "CAP_NET_ADMIN",
        "kube-proxy's nftables table",
        "other NAT chains",
        "kube-proxy's iptables chains",
        "net.ipv4.ip_forward",
        "conntrack table",
        "API server",
        "RBAC list services",
        "RBAC watch endpointslices.discovery.k8s.io",
        "RBAC create events.events.k8s.io",
        "drift",
    ] {
        assert_eq!(find(&doc, name)["status"], "pass", "{name}: {doc:#}");
    }
    assert_eq!(code, 0, "nothing failed: {doc:#}");
    assert!(
        find(&doc, "API server")["detail"]
            .as_str()
            .unwrap()
            .contains("v1.33.0-verdict-fake")
    );

    // What kube-proxy would leave, and a permission taken away.
    bed.node
        .exec("nft", &["add", "table", "ip", "kube-proxy"])
        .unwrap();
    bed.node
        .exec(
            "nft",
            &[
                "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
            ],
        )
        .unwrap();
    api.command(&json!({"deny": {"verb": "watch", "resource": "endpointslices"}}))
        .unwrap();
    let (code, doc) = doctor(&bed, &kc);
    assert_eq!(code, 1, "a failed check fails doctor: {doc:#}");
    assert_eq!(doc["status"], "fail");
    let rbac = find(&doc, "RBAC watch endpointslices.discovery.k8s.io");
    assert_eq!(rbac["status"], "fail", "{rbac:#}");
    assert!(rbac["fix"].as_str().unwrap().contains("rbac.yaml"));
    assert_eq!(find(&doc, "kube-proxy's nftables table")["status"], "warn");
    let nat = find(&doc, "other NAT chains");
    assert_eq!(nat["status"], "warn", "{nat:#}");
    assert!(
        nat["detail"]
            .as_str()
            .unwrap()
            .contains("same priority -100"),
        "{nat:#}"
    );
}
