//! kube-proxy's packet-flow test cases (`runPacketFlowTests` in
//! `pkg/proxy/nftables/proxier_test.go`; reference/upstream-nftables.md §4),
//! run through verdict's proxier, the in-memory backend and the tracer.
//!
//! This is a `harness = false` test: it runs every case, prints every
//! failure, and ends with `N passed, N failed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use verdict_model::IpFamily;
use verdict_nft::L4Proto;

/// §4.1 TestNoEndpointsReject
fn no_endpoints_reject(r: &mut Report) {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .external_ips(&["192.168.99.11"])
            .port("p80", TCP, 80, 3001)
            .lb(&["1.2.3.4"]),
    );
    fx.sync();
    r.run(
        "TestNoEndpointsReject",
        &fx,
        &[
            flow(
                "pod to cluster IP with no endpoints",
                "10.0.0.2",
                "172.30.0.41",
                80,
                "REJECT",
                false,
            ),
            flow(
                "external to external IP with no endpoints",
                "203.0.113.2",
                "192.168.99.11",
                80,
                "REJECT",
                false,
            ),
            flow(
                "pod to NodePort with no endpoints",
                "10.0.0.2",
                "192.168.0.2",
                3001,
                "REJECT",
                false,
            ),
            flow(
                "external to NodePort with no endpoints",
                "203.0.113.2",
                "192.168.0.2",
                3001,
                "REJECT",
                false,
            ),
            flow(
                "pod to LoadBalancer IP with no endpoints",
                "10.0.0.2",
                "1.2.3.4",
                80,
                "REJECT",
                false,
            ),
            flow(
                "external to LoadBalancer IP with no endpoints",
                "203.0.113.2",
                "1.2.3.4",
                80,
                "REJECT",
                false,
            ),
        ],
    );
}

/// §4.2 TestClusterIPGeneral
fn cluster_ip_general(r: &mut Report) {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("http", TCP, 80, 0),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("http", TCP, 80)
            .ep("10.180.0.1", NODE),
    );
    fx.service(
        svc("ns2", "svc2")
            .cluster_ip("172.30.0.42")
            .port("http", TCP, 80, 0)
            .port("https", TCP, 443, 0)
            .port("dns-udp", UDP, 53, 0)
            .port("dns-tcp", TCP, 53, 0)
            .port("dns-sctp", SCTP, 53, 0),
    );
    fx.slice(
        slice("ns2", "svc2", "svc2-1")
            .port("http", TCP, 80)
            .port("https", TCP, 8443)
            .port("dns-udp", UDP, 53)
            .port("dns-tcp", TCP, 5353)
            .port("dns-sctp", SCTP, 53)
            .ep("10.180.0.1", NODE)
            .ep("10.180.2.1", "node2"),
    );
    fx.sync();
    r.run(
        "TestClusterIPGeneral",
        &fx,
        &[
            flow(
                "simple clusterIP",
                "10.180.0.2",
                "172.30.0.41",
                80,
                "10.180.0.1:80",
                false,
            ),
            flow(
                "hairpin to cluster IP",
                "10.180.0.1",
                "172.30.0.41",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "clusterIP with multiple endpoints",
                "10.180.0.2",
                "172.30.0.42",
                80,
                "10.180.0.1:80, 10.180.2.1:80",
                false,
            ),
            flow(
                "clusterIP with TargetPort",
                "10.180.0.2",
                "172.30.0.42",
                443,
                "10.180.0.1:8443, 10.180.2.1:8443",
                false,
            ),
            flow(
                "clusterIP with TCP, UDP, and SCTP on same port (TCP)",
                "10.180.0.2",
                "172.30.0.42",
                53,
                "10.180.0.1:5353, 10.180.2.1:5353",
                false,
            ),
            flow(
                "clusterIP with TCP, UDP, and SCTP on same port (UDP)",
                "10.180.0.2",
                "172.30.0.42",
                53,
                "10.180.0.1:53, 10.180.2.1:53",
                false,
            )
            .proto(L4Proto::Udp),
            flow(
                "clusterIP with TCP, UDP, and SCTP on same port (SCTP)",
                "10.180.0.2",
                "172.30.0.42",
                53,
                "10.180.0.1:53, 10.180.2.1:53",
                false,
            )
            .proto(L4Proto::Sctp),
            flow(
                "TCP-only port does not match UDP traffic",
                "10.180.0.2",
                "172.30.0.42",
                80,
                "REJECT",
                false,
            )
            .proto(L4Proto::Udp),
            flow(
                "svc1 does not accept svc2's ports",
                "10.180.0.2",
                "172.30.0.41",
                443,
                "REJECT",
                false,
            ),
            flow(
                "packet to unallocated cluster ip",
                "10.180.0.2",
                "172.30.0.50",
                80,
                "DROP",
                false,
            ),
        ],
    );
}

/// A named group of cases (one upstream test function).
type Group = (&'static str, fn(&mut Report));

fn main() {
    let groups: &[Group] = &[
        ("TestNoEndpointsReject", no_endpoints_reject),
        ("TestClusterIPGeneral", cluster_ip_general),
    ];
    let mut r = Report::default();
    for (name, group) in groups {
        let before = r.ran;
        group(&mut r);
        println!("{name}: {} cases", r.ran - before);
    }
    for f in &r.failures {
        println!("FAILED {f}");
    }
    println!(
        "packet-flow cases: {} passed, {} failed",
        r.ran - r.failures.len(),
        r.failures.len()
    );
    if !r.failures.is_empty() {
        std::process::exit(1);
    }
}
