//! kube-proxy as the reference: every conformance scenario
//! (`verdict-conformance`, kube-proxy's own packet-flow cases) as real
//! objects in the real API server, the real kube-proxy 1.36 in nftables
//! mode on the node of one test bed and verdict on the node of another,
//! both started with the same configuration file, and the same packets
//! sent through both. Every outcome must agree: which endpoints answer, a
//! reject, a drop, an untouched destination answering, whether the
//! endpoint sees the client masqueraded and the source address it sees.
//! The scenario's own expectations are not consulted (only to know how
//! many endpoints to wait for): kube-proxy is the judge.
//!
//! Prints the comparison table. Needs root and the real-API tier's
//! parts (`VERDICT_REQUIRE_REALAPI` makes their absence a failure).
//! `VERDICT_DIFFERENTIAL=NAME` runs the scenarios whose name holds NAME.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_conformance::{Scenario, Tweaks, node_facts, upstream_scenarios};
use verdict_e2e::bed::TestBed;
use verdict_e2e::netns::{Netns, Process, unique_prefix, veth};
use verdict_e2e::realapi::{Etcd, KubeClient, KubeProxy, Options, RealApiServer, http_get};
use verdict_e2e::runner::{Observation, ScenarioResult, furnish, observe_counting, plan};
use verdict_model::IpFamily;

use common::*;

/// The API server's address on each node's link.
const API_A: &str = "100.64.1.1";
const API_B: &str = "100.64.2.1";

/// The configuration file both proxies are given for a scenario's node.
fn config_file(dir: &Path, name: &str, kubeconfig: &Path, tweaks: &Tweaks) -> PathBuf {
    let mut text = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
         clientConnection:\n  kubeconfig: {}\nhostnameOverride: test-node\n\
         conntrack:\n  maxPerCore: 0\nnftables:\n  minSyncPeriod: 0s\n  masqueradeAll: {}\n",
        kubeconfig.display(),
        tweaks.masquerade_all
    );
    if !tweaks.no_detector {
        let v4 = node_facts(IpFamily::V4).pod_cidr;
        let v6 = node_facts(IpFamily::V6).pod_cidr;
        text.push_str(&format!("clusterCIDR: {v4},{v6}\n"));
    }
    match &tweaks.node_port_cidrs {
        Some(c) => text.push_str(&format!("nodePortAddresses: [{}]\n", c.join(", "))),
        None => text.push_str("nodePortAddresses: [primary]\n"),
    }
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Whether the proxy on `ns` has synced both families (its health says
/// when each last synced).
fn synced(ns: &Netns) -> bool {
    let Some((_, body)) = http_get(ns.name(), "127.0.0.1:10256".parse().unwrap(), "/healthz")
    else {
        return false;
    };
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    // kube-proxy lists a family before its first sync, with Go's zero
    // time.
    let synced = |f: &str| {
        v["status"][f]["lastUpdated"]
            .as_str()
            .is_some_and(|t| !t.starts_with("0001-"))
    };
    synced("IPv4") && synced("IPv6")
}

fn until_synced(ns: &Netns, what: &str, log: &Path) {
    let t = Instant::now();
    while !synced(ns) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what} never synced: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A request that must succeed: its body.
fn ok(
    client: &KubeClient,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let (code, text) = client.request(method, path, body)?;
    if !(200..300).contains(&code) {
        return Err(format!("{method} {path}: {code} {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

/// Creates `obj` in `collection`, trying again while the API server
/// still holds an address or port of an object deleted just before.
fn create(client: &KubeClient, collection: &str, obj: &Value) -> Result<(), String> {
    let t = Instant::now();
    loop {
        match client.request("POST", collection, Some(obj))? {
            (200 | 201, _) => return Ok(()),
            (422, text)
                if (text.contains("already allocated")
                    || text.contains("provided port is already"))
                    && t.elapsed() < Duration::from_secs(20) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            (code, text) => return Err(format!("{code} {text}")),
        }
    }
}

/// Deletes every Service and EndpointSlice of the namespaces scenarios
/// use, and waits until they are gone.
fn clear(client: &KubeClient) {
    for (collection, kind) in [
        ("/apis/discovery.k8s.io/v1/endpointslices", "endpointslices"),
        ("/api/v1/services", "services"),
    ] {
        let list = ok(client, "GET", collection, None).unwrap();
        for item in list["items"].as_array().into_iter().flatten() {
            let ns = item["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            if ns == "default" && name == "kubernetes" {
                continue;
            }
            let path = if kind == "services" {
                format!("/api/v1/namespaces/{ns}/services/{name}")
            } else {
                format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{name}")
            };
            let _ = client.request("DELETE", &path, None);
        }
    }
}

/// Puts a scenario's objects into the API server; `Err` says what it
/// refused.
fn apply(client: &KubeClient, s: &Scenario) -> Result<(), String> {
    let o = verdict_e2e::kube_objects::objects(s);
    let namespaces: BTreeSet<String> = o
        .services
        .iter()
        .chain(&o.slices)
        .filter_map(|v| v["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect();
    for ns in namespaces {
        let _ = client.request(
            "POST",
            "/api/v1/namespaces",
            Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
        );
    }
    for svc in &o.services {
        let ns = svc["metadata"]["namespace"].as_str().unwrap_or_default();
        create(client, &format!("/api/v1/namespaces/{ns}/services"), svc)
            .map_err(|e| format!("Service {ns}/{}: {e}", svc["metadata"]["name"]))?;
    }
    for (ns, name, status) in &o.statuses {
        ok(
            client,
            "PATCH",
            &format!("/api/v1/namespaces/{ns}/services/{name}/status"),
            Some(status),
        )
        .map_err(|e| format!("Service {ns}/{name} status: {e}"))?;
    }
    for sl in &o.slices {
        let ns = sl["metadata"]["namespace"].as_str().unwrap_or_default();
        create(
            client,
            &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            sl,
        )
        .map_err(|e| format!("EndpointSlice {ns}/{}: {e}", sl["metadata"]["name"]))?;
    }
    Ok(())
}

/// A bed's node joined to the API server's namespace by a link of its
/// own: `api_if` on the API's side with `api_ip`, the next address on
/// the node's.
fn link(api_ns: &Netns, api_if: &str, api_ip: &str, bed: &TestBed) {
    veth(api_ns, api_if, &bed.node, "api0").unwrap();
    api_ns
        .ip(&["addr", "add", &format!("{api_ip}/30"), "dev", api_if])
        .unwrap();
    let (net, _) = api_ip.rsplit_once('.').unwrap();
    bed.node
        .ip(&["addr", "add", &format!("{net}.2/30"), "dev", "api0"])
        .unwrap();
}

/// One row of the comparison.
struct Row {
    scenario: String,
    flow: String,
    kube_proxy: String,
    verdict: String,
    same: bool,
}

#[test]
fn kube_proxy_and_verdict_treat_every_packet_alike() {
    if let Err(why) = verdict_e2e::realapi::available() {
        println!("skipped: {why}");
        return;
    }
    let filter = std::env::var("VERDICT_DIFFERENTIAL").ok();
    let scenarios: Vec<Scenario> = upstream_scenarios()
        .into_iter()
        .filter(|s| filter.as_deref().is_none_or(|f| s.name.contains(f)))
        .collect();
    let echo = PathBuf::from(verdict_e2e_echo());
    let api_ns = Netns::create(&format!("{}api", unique_prefix())).unwrap();
    let dir = scratch_dir("differential");
    let v4 = node_facts(IpFamily::V4);
    let api = RealApiServer::start(
        &api_ns,
        Etcd::V36,
        &dir.join("api"),
        &Options {
            bind: "0.0.0.0".into(),
            sans: vec![API_A.into(), API_B.into()],
            // The conformance cases' IPv6 ClusterIPs are in fd00:172:30::/112.
            service_cidr: format!("{},fd00:172:30::/112", v4.service_cidr),
            node_port_range: Some("1-32767".into()),
            ..Options::default()
        },
    )
    .unwrap();
    let admin = api.admin().unwrap();
    // The node both proxies run as (kube-proxy's fake proxier's).
    create(
        &admin,
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"}}),
    )
    .unwrap();
    let addresses: Vec<Value> = v4
        .node_ips
        .iter()
        .map(|a| json!({"type": "InternalIP", "address": a}))
        .collect();
    ok(
        &admin,
        "PATCH",
        "/api/v1/nodes/test-node/status",
        Some(&json!({"status": {"addresses": addresses}})),
    )
    .unwrap();
    let kc_a = api
        .kubeconfig_at(
            "kube-proxy-a",
            &api.kube_proxy_token,
            &format!("https://{API_A}:6443"),
        )
        .unwrap();
    let kc_b = api
        .kubeconfig_at(
            "kube-proxy-b",
            &api.kube_proxy_token,
            &format!("https://{API_B}:6443"),
        )
        .unwrap();

    let mut rows: Vec<Row> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    // Flows whose first try got no answer or a client error, and was
    // tried again (kube-proxy's, verdict's).
    let mut retries = [0usize; 2];
    let started = Instant::now();
    for (n, s) in scenarios.iter().enumerate() {
        clear(&admin);
        if let Err(e) = apply(&admin, s) {
            refused.push(format!("{}: the API server refuses {e}", s.name));
            continue;
        }
        let mut result = ScenarioResult::default();
        let plan = plan(s, &mut result);
        skipped.extend(result.skipped);
        let bed_a = furnish(&plan, s.setup.family, echo.clone()).unwrap();
        let bed_b = furnish(&plan, s.setup.family, echo.clone()).unwrap();
        // Names of their own: a namespace deleted a moment ago may still
        // hold its end of the last scenario's links.
        let (to_a, to_b) = (format!("to-a{n}"), format!("to-b{n}"));
        link(&api_ns, &to_a, API_A, &bed_a);
        link(&api_ns, &to_b, API_B, &bed_b);
        let tweaks = &s.setup.tweaks;
        let conf_a = config_file(&dir, "kube-proxy", &kc_a, tweaks);
        let conf_b = config_file(&dir, "verdict", &kc_b, tweaks);
        let kp = KubeProxy::with_args(
            &bed_a.node,
            &dir.join("kube-proxy"),
            &[format!("--config={}", conf_a.display()), "--v=2".into()],
            "127.0.0.1:10256".parse::<SocketAddr>().unwrap(),
        )
        .unwrap();
        let vlog = dir.join("verdict.log");
        let config_b = format!("--config={}", conf_b.display());
        let verdict: Process = spawn_verdict(&bed_b, [config_b.as_str(), "--v=2"], &vlog, None);
        until_synced(&bed_a.node, "kube-proxy", &kp.log);
        until_synced(&bed_b.node, "verdict", &vlog);
        for (f, src, dst) in &plan.flows {
            let (mut ra, mut rb) = (false, false);
            let (theirs, ours) = std::thread::scope(|sc| {
                let a = sc.spawn(|| observe_counting(&bed_a, f, *src, *dst, &mut ra));
                let b = sc.spawn(|| observe_counting(&bed_b, f, *src, *dst, &mut rb));
                (a.join().unwrap(), b.join().unwrap())
            });
            retries[0] += usize::from(ra);
            retries[1] += usize::from(rb);
            if theirs != ours
                && let Ok(secs) = std::env::var("VERDICT_E2E_HOLD")
            {
                // Debugging aid: keep both beds for inspection.
                eprintln!(
                    "holding {} (kube-proxy) and {} (verdict) for {secs}s: {} / {}",
                    bed_a.node.name(),
                    bed_b.node.name(),
                    theirs,
                    ours
                );
                std::thread::sleep(Duration::from_secs(secs.parse().unwrap_or(60)));
            }
            rows.push(Row {
                scenario: s.name.clone(),
                flow: format!("{} ({} {} → {}:{})", f.name, f.proto, f.src, f.dst, f.dport),
                same: theirs == ours,
                kube_proxy: theirs.to_string(),
                verdict: ours.to_string(),
            });
            // A sanity check on the judge: it did something.
            assert!(
                !matches!(theirs, Observation::Other(_)) || !matches!(ours, Observation::Other(_)),
                "{}: both failed to send: {theirs}",
                s.name
            );
        }
        drop(verdict);
        drop(kp);
        for l in [&to_a, &to_b] {
            let _ = api_ns.ip(&["link", "del", l]);
        }
    }
    let differing: Vec<&Row> = rows.iter().filter(|r| !r.same).collect();
    let mut table =
        String::from("| scenario | flow | kube-proxy 1.36 | verdict | |\n|---|---|---|---|---|\n");
    for r in &rows {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.flow,
            r.kube_proxy,
            r.verdict,
            if r.same { "same" } else { "DIFFERENT" }
        ));
    }
    println!("{table}");
    println!(
        "{} scenarios, {} flows compared in {:?}: {} the same, {} different; {} flows not sendable, {} scenarios the API server refuses",
        scenarios.len(),
        rows.len(),
        started.elapsed(),
        rows.len() - differing.len(),
        differing.len(),
        skipped.len(),
        refused.len()
    );
    println!(
        "a first try without an answer tried again after 300 ms: {} flows beside kube-proxy, {} beside verdict",
        retries[0], retries[1]
    );
    for s in &skipped {
        println!("not sendable: {s}");
    }
    for r in &refused {
        println!("refused: {r}");
    }
    assert!(!rows.is_empty(), "nothing compared");
    assert!(
        differing.is_empty(),
        "{}",
        differing
            .iter()
            .map(|r| format!(
                "{} / {}: kube-proxy {} / verdict {}",
                r.scenario, r.flow, r.kube_proxy, r.verdict
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
