//! Golden ruleset snapshots: the canonical dump of the table for a
//! representative cluster and for each feature on its own. Snapshots live
//! in `tests/golden/*.nft`; `UPDATE_GOLDEN=1 cargo test` rewrites them.
//! Canonical means: rule order inside a chain kept, everything else sorted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::*;
use verdict_model::{IpFamily, LoadBalancerIpMode, ServiceType};
use verdict_proxier::{LocalDetector, NodePortAddresses};

fn check(name: &str, fx: &Fixture) {
    let got = fx.dump();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.nft"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    if got != want {
        let diff: Vec<String> = diff_lines(&want, &got);
        panic!(
            "{name}: ruleset differs from {} (UPDATE_GOLDEN=1 to accept):\n{}",
            path.display(),
            diff.join("\n")
        );
    }
}

fn diff_lines(want: &str, got: &str) -> Vec<String> {
    let w: Vec<&str> = want.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out: Vec<String> = w
        .iter()
        .filter(|l| !g.contains(l))
        .map(|l| format!("- {l}"))
        .collect();
    out.extend(
        g.iter()
            .filter(|l| !w.contains(l))
            .map(|l| format!("+ {l}")),
    );
    out
}

/// The services of kube-proxy's TestOverallNFTablesRules (reference §1.7.1).
fn overall(fx: &mut Fixture) {
    // svc1: plain ClusterIP.
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
    );
    // svc2: eTP=Local with externalIP, LB and NodePort, no local endpoint.
    fx.service(
        svc("ns2", "svc2")
            .cluster_ip("172.30.0.42")
            .port("p80", TCP, 80, 3001)
            .external_ips(&["192.168.99.22"])
            .lb(&["1.2.3.4"])
            .etp_local()
            .hcnp(30000),
    );
    fx.slice(
        slice("ns2", "svc2", "svc2-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.2", ""),
    );
    // svc3: NodePort with a local endpoint.
    fx.service(
        svc("ns3", "svc3")
            .kind(ServiceType::NodePort)
            .cluster_ip("172.30.0.43")
            .port("p80", TCP, 80, 3003),
    );
    fx.slice(
        slice("ns3", "svc3", "svc3-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.3", NODE),
    );
    // svc4: NodePort type without a node port, with an externalIP.
    fx.service(
        svc("ns4", "svc4")
            .kind(ServiceType::NodePort)
            .cluster_ip("172.30.0.44")
            .port("p80", TCP, 80, 0)
            .external_ips(&["192.168.99.33"]),
    );
    fx.slice(
        slice("ns4", "svc4", "svc4-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.4", "")
            .ep("10.180.0.5", NODE),
    );
    // svc5: LoadBalancer with session affinity and a source range.
    fx.service(
        svc("ns5", "svc5")
            .cluster_ip("172.30.0.45")
            .port("p80", TCP, 80, 3002)
            .lb(&["5.6.7.8"])
            .source_ranges(&["203.0.113.0/25"])
            .affinity(10800),
    );
    fx.slice(
        slice("ns5", "svc5", "svc5-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.3", ""),
    );
    // svc6: no endpoints.
    fx.service(
        svc("ns6", "svc6")
            .cluster_ip("172.30.0.46")
            .port("p80", TCP, 80, 0),
    );
}

#[test]
fn overall_ruleset() {
    let mut fx = Fixture::new(IpFamily::V4);
    overall(&mut fx);
    fx.sync();
    check("overall", &fx);
}

#[test]
fn services_counted_per_service_and_per_endpoint() {
    // The same cluster, ns4 counted per endpoint, the rest not: only its
    // Service gets elements in the counting sets, and the NAT chains after
    // DNAT and the filter chains look them up.
    let mut cfg = upstream_config(IpFamily::V4);
    cfg.metrics = verdict_model::MetricsSelection {
        level: verdict_model::Counting::Endpoint,
        namespaces: vec!["ns4".into()],
        ..verdict_model::MetricsSelection::default()
    };
    let mut fx = Fixture::with_config(cfg);
    overall(&mut fx);
    fx.sync();
    check("counted", &fx);
}

#[test]
fn empty_cluster() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.sync();
    check("empty", &fx);
}

#[test]
fn cluster_ip_ipv6() {
    let mut fx = Fixture::new(IpFamily::V6);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("fd00:172:30::41")
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .v6()
            .port("p80", TCP, 80)
            .ep("fd00:10:180::1", "")
            .ep("fd00:10:180::2:1", NODE),
    );
    fx.sync();
    check("clusterip-ipv6", &fx);
}

#[test]
fn dual_stack_service_splits_by_family() {
    let mk = |fx: &mut Fixture| {
        fx.service(
            svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .cluster_ip("fd00:172:30::41")
                .port("p80", UDP, 53, 0),
        );
        fx.slice(
            slice("ns1", "svc1", "v4")
                .port("p80", UDP, 53)
                .ep("10.180.0.1", ""),
        );
        fx.slice(
            slice("ns1", "svc1", "v6")
                .v6()
                .port("p80", UDP, 53)
                .ep("fd00:10:180::1", ""),
        );
        fx.sync();
    };
    let mut v4 = Fixture::new(IpFamily::V4);
    mk(&mut v4);
    let mut v6 = Fixture::new(IpFamily::V6);
    mk(&mut v6);
    check("dualstack-ipv4", &v4);
    check("dualstack-ipv6", &v6);
    assert!(!v4.dump().contains("fd00"));
    assert!(!v6.dump().contains("10.180"));
}

#[test]
fn protocols() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "dns")
            .cluster_ip("172.30.0.10")
            .port("dns-udp", UDP, 53, 0)
            .port("dns-tcp", TCP, 53, 0)
            .port("sctp", SCTP, 9999, 0),
    );
    fx.slice(
        slice("ns1", "dns", "dns-1")
            .port("dns-udp", UDP, 53)
            .port("dns-tcp", TCP, 5353)
            .port("sctp", SCTP, 9999)
            .ep("10.180.0.1", ""),
    );
    fx.sync();
    check("protocols", &fx);
}

#[test]
fn node_ports_on_all_addresses() {
    let mut cfg = upstream_config(IpFamily::V4);
    cfg.node_port_addresses = NodePortAddresses::all();
    let mut fx = Fixture::with_config(cfg);
    fx.service(
        svc("ns1", "svc1")
            .kind(ServiceType::NodePort)
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
    );
    fx.sync();
    check("nodeport-all", &fx);
    assert!(!fx.dump().contains("127.0.0.1"), "never on loopback");
}

#[test]
fn load_balancer_with_source_ranges_and_ip_modes() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001)
            .lb(&["1.2.3.4", "5.6.7.8"])
            .lb_mode("9.9.9.9", LoadBalancerIpMode::Proxy)
            .source_ranges(&["192.168.0.0/24", " 203.0.113.0/25"]),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
    );
    fx.sync();
    check("loadbalancer", &fx);
    assert!(
        !fx.dump().contains("9.9.9.9"),
        "ipMode Proxy VIPs are not programmed"
    );
}

#[test]
fn traffic_policies_local() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "etp")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001)
            .lb(&["1.2.3.4"])
            .etp_local(),
    );
    fx.slice(
        slice("ns1", "etp", "etp-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", "")
            .ep("10.180.2.1", NODE),
    );
    fx.service(
        svc("ns1", "itp")
            .cluster_ip("172.30.0.42")
            .port("p80", TCP, 80, 0)
            .itp_local(),
    );
    fx.slice(
        slice("ns1", "itp", "itp-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.3", "")
            .ep("10.180.2.3", NODE),
    );
    fx.sync();
    check("traffic-policy-local", &fx);
}

#[test]
fn session_affinity() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001)
            .external_ips(&["192.168.99.11"])
            .affinity(600),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", "")
            .ep("10.180.0.2", ""),
    );
    fx.sync();
    check("affinity", &fx);
}

#[test]
fn terminating_endpoints_and_topology() {
    let mut cfg = upstream_config(IpFamily::V4);
    cfg.node_zone = Some("zone-a".into());
    let mut fx = Fixture::with_config(cfg);
    fx.service(
        svc("ns1", "term")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice("ns1", "term", "term-1")
            .port("p80", TCP, 80)
            .ep_cond("10.180.0.1", "", false, true, true)
            .ep_cond("10.180.0.2", "", false, false, true),
    );
    fx.service(
        svc("ns1", "topo")
            .cluster_ip("172.30.0.42")
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice("ns1", "topo", "topo-1")
            .port("p80", TCP, 80)
            .ep_zone("10.180.1.1", "n1", "zone-a", &["zone-a"])
            .ep_zone("10.180.1.2", "n2", "zone-b", &["zone-b"]),
    );
    fx.sync();
    check("terminating-topology", &fx);
}

#[test]
fn masquerade_modes() {
    for (name, all, detector) in [
        ("masquerade-all", true, None),
        ("detector-none", false, Some(LocalDetector::None)),
        (
            "detector-bridge",
            false,
            Some(LocalDetector::BridgeInterface("cbr0".into())),
        ),
        (
            "detector-prefix",
            false,
            Some(LocalDetector::InterfaceNamePrefix("veth".into())),
        ),
    ] {
        let mut cfg = upstream_config(IpFamily::V4);
        cfg.masquerade_all = all;
        if let Some(d) = detector {
            cfg.local_detector = d;
        }
        let mut fx = Fixture::with_config(cfg);
        fx.service(
            svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .port("p80", TCP, 80, 3001)
                .etp_local(),
        );
        fx.slice(
            slice("ns1", "svc1", "svc1-1")
                .port("p80", TCP, 80)
                .ep("10.180.0.1", NODE),
        );
        fx.sync();
        check(name, &fx);
    }
}
