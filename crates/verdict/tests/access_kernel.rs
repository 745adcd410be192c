//! The introspection API and the web view from another host, against the
//! real binary and the fake API server (its TokenReviews and
//! SubjectAccessReviews evaluate the RBAC of `deploy/components/remote-api`
//! as the real authorizer does): by default another host gets 403 on the
//! metrics port; on `--api-bind-address` it needs a bearer token the API
//! server authenticates and RBAC lets `get` the path (401 without one or
//! with a bad one, 403 for a user the role is not bound to, the answer for
//! one it is); the node's own loopback needs none; `/metrics` and
//! `/healthz` answer as kube-proxy's do. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::bed::Placement;

use common::*;

fn rbac_documents() -> Vec<Value> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/components/remote-api/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut bytes = text.as_bytes();
    serde_saphyr::read::<_, Value>(&mut bytes)
        .map(Result::unwrap)
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn other_hosts_need_a_token_that_rbac_grants() {
    let Some(mut bed) = bed() else {
        return;
    };
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let mut api = fake_api_server(&bed, 16446);
    api.apply(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "test-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}
    }))
    .unwrap();
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"clusterIP": "172.30.0.41", "clusterIPs": ["172.30.0.41"], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    api.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "demo",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.180.0.1"], "conditions": {"ready": true}, "nodeName": "test-node"}]
    }))
    .unwrap();
    // The component's RBAC, and the binding an operator would add.
    for doc in rbac_documents() {
        api.apply(doc).unwrap();
    }
    api.apply(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "verdict-api-oncall"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "verdict-api-reader"},
        "subjects": [{"kind": "Group", "name": "oncall"}]
    }))
    .unwrap();
    api.command(&json!({"token": {"token": "t-alice", "username": "alice", "groups": ["oncall"]}}))
        .unwrap();
    api.command(&json!({"token": {"token": "t-bob", "username": "bob", "groups": ["dev"]}}))
        .unwrap();

    let dir = scratch_dir("access");
    let kubeconfig = fake_kubeconfig(&dir, 16446);
    let log = dir.join("verdict.log");
    let _daemon = spawn_verdict(
        &bed,
        [
            "--kubeconfig",
            &kubeconfig,
            "--hostname-override",
            "test-node",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--metrics-bind-address",
            "0.0.0.0:10249",
            "--api-bind-address",
            "0.0.0.0:10262",
        ],
        &log,
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    while get_from(&bed.node, "127.0.0.1", 10256, "/healthz", None).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never healthy: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ext = &bed.ext;
    let node = "192.168.0.2";
    let list = "/api/v1/services";

    // The metrics port: the API answers the node itself only.
    let (code, body) = get_from(&bed.node, "127.0.0.1", 10249, list, None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"web\""), "{body}");
    let (code, body) = get_from(ext, node, 10249, list, Some("t-alice"));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("--api-bind-address"), "{body}");
    assert_eq!(get_from(ext, node, 10249, "/ui", None).0, 403);
    // kube-proxy's endpoints are as they were.
    let (code, metrics) = get_from(ext, node, 10249, "/metrics", None);
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds"),
        "{metrics}"
    );
    let (code, healthz) = get_from(ext, node, 10256, "/healthz", None);
    assert_eq!(code, 200, "{healthz}");
    assert!(healthz.contains("lastUpdated"), "{healthz}");

    // The API port: a token RBAC grants, and nothing less.
    let (code, body) = get_from(ext, node, 10262, list, None);
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = get_from(ext, node, 10262, list, Some("t-nobody"));
    assert_eq!(code, 401, "a token the API server does not know: {body}");
    let (code, body) = get_from(ext, node, 10262, list, Some("t-bob"));
    assert_eq!(code, 403, "a user the role is not bound to: {body}");
    assert!(body.contains("bob"), "{body}");
    let (code, body) = get_from(ext, node, 10262, list, Some("t-alice"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"web\""), "{body}");
    let (code, page) = get_from(ext, node, 10262, "/ui", Some("t-alice"));
    assert_eq!(code, 200);
    assert!(page.contains("<html"), "{page}");
    let (code, _) = get_from(ext, node, 10262, "/metrics", Some("t-alice"));
    assert_eq!(code, 404, "the API port serves the API only");
    // The node itself needs no token there either.
    assert_eq!(get_from(&bed.node, "127.0.0.1", 10262, list, None).0, 200);
    // Whole-table answers take turns: asked in a row, some are refused.
    let codes: Vec<u16> = (0..6)
        .map(|_| get_from(ext, node, 10262, "/api/v1/drift", Some("t-alice")).0)
        .collect();
    assert!(codes[..3].iter().all(|c| *c == 200), "{codes:?}");
    assert!(codes[3..].contains(&429), "{codes:?}");

    // Reviews were asked, and kept: not one per request.
    let reviews = api
        .requests()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"))
        .count();
    assert!((1..=3).contains(&reviews), "{reviews} TokenReviews");
    let _ = std::fs::remove_dir_all(&dir);
}
