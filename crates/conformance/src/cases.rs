//! The cases, one function per upstream test function.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::type_complexity,
    clippy::too_many_arguments
)]

use verdict_model::{IpFamily, ServiceType};
use verdict_nft::L4Proto;

use crate::*;

/// §4.1 TestNoEndpointsReject
fn no_endpoints_reject(r: &mut Collector) {
    let mut fx = Setup::new(IpFamily::V4);
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
fn cluster_ip_general(r: &mut Collector) {
    let mut fx = Setup::new(IpFamily::V4);
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

/// §4.3 TestLoadBalancer
fn load_balancer(r: &mut Collector) {
    let mut fx = Setup::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001)
            .lb(&["1.2.3.4", "5.6.7.8"])
            .source_ranges(&["192.168.0.0/24", " 203.0.113.0/25"]),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
    );
    fx.sync();
    r.run(
        "TestLoadBalancer",
        &fx,
        &[
            flow(
                "pod to cluster IP",
                "10.0.0.2",
                "172.30.0.41",
                80,
                "10.180.0.1:80",
                false,
            ),
            flow(
                "external to nodePort",
                "203.0.113.2",
                "192.168.0.2",
                3001,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "nodePort bypasses LoadBalancerSourceRanges",
                "203.0.113.130",
                "192.168.0.2",
                3001,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "accepted external to LB1",
                "203.0.113.2",
                "1.2.3.4",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "accepted external to LB2",
                "203.0.113.2",
                "5.6.7.8",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "blocked external to LB1",
                "203.0.113.130",
                "1.2.3.4",
                80,
                "DROP",
                false,
            ),
            flow(
                "blocked external to LB2",
                "203.0.113.130",
                "5.6.7.8",
                80,
                "DROP",
                false,
            ),
            flow(
                "pod to LB1 (blocked by LoadBalancerSourceRanges)",
                "10.0.0.2",
                "1.2.3.4",
                80,
                "DROP",
                false,
            ),
            flow(
                "pod to LB2 (blocked by LoadBalancerSourceRanges)",
                "10.0.0.2",
                "5.6.7.8",
                80,
                "DROP",
                false,
            ),
            flow(
                "node to LB1 (allowed by LoadBalancerSourceRanges)",
                "192.168.0.2",
                "1.2.3.4",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "node to LB2 (allowed by LoadBalancerSourceRanges)",
                "192.168.0.2",
                "5.6.7.8",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "same node to LB1, SNATted to LB1 (implicitly allowed)",
                "1.2.3.4",
                "1.2.3.4",
                80,
                "10.180.0.1:80",
                true,
            ),
            flow(
                "same node to LB2, SNATted to LB2 (implicitly allowed)",
                "5.6.7.8",
                "5.6.7.8",
                80,
                "10.180.0.1:80",
                true,
            ),
        ],
    );
}

/// The `TestNodePorts` fixture: `ns1/svc1` NodePort 3001 with one
/// non-local and one local endpoint, optionally with other
/// nodePortAddresses (also the `TestTracePacketV6` ruleset).
fn node_ports_fixture(family: IpFamily, node_port_addresses: Option<&[&str]>) -> Setup {
    let tweaks = Tweaks {
        node_port_cidrs: node_port_addresses.map(|c| c.iter().map(|s| s.to_string()).collect()),
        ..Tweaks::default()
    };
    let mut fx = Setup::with_tweaks(family, tweaks);
    let v6 = family == IpFamily::V6;
    let (cluster_ip, ep1, ep2) = if v6 {
        ("fd00:172:30::41", "fd00:10:180::1", "fd00:10:180::2:1")
    } else {
        ("172.30.0.41", "10.180.0.1", "10.180.2.1")
    };
    fx.service(
        svc("ns1", "svc1")
            .kind(ServiceType::NodePort)
            .cluster_ip(cluster_ip)
            .port("p80", TCP, 80, 3001),
    );
    let mut s = slice("ns1", "svc1", "svc1-1")
        .port("p80", TCP, 80)
        .ep(ep1, "")
        .ep(ep2, NODE);
    if v6 {
        s = s.v6();
    }
    fx.slice(s);
    fx.sync();
    fx
}

/// §4.4 TestNodePorts
fn node_ports(r: &mut Collector) {
    struct Sub {
        name: &'static str,
        family: IpFamily,
        node_port_addresses: Option<&'static [&'static str]>,
        allow_alt_node_ip: bool,
    }
    let subs = [
        Sub {
            name: "ipv4",
            family: IpFamily::V4,
            node_port_addresses: None,
            allow_alt_node_ip: false,
        },
        Sub {
            name: "ipv4, multiple nodeport-addresses",
            family: IpFamily::V4,
            node_port_addresses: Some(&["192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64"]),
            allow_alt_node_ip: true,
        },
        Sub {
            name: "ipv6",
            family: IpFamily::V6,
            node_port_addresses: None,
            allow_alt_node_ip: false,
        },
        Sub {
            name: "ipv6, multiple nodeport-addresses",
            family: IpFamily::V6,
            node_port_addresses: Some(&[
                "192.168.0.0/24",
                "192.168.1.0/24",
                "2001:db8::/64",
                "2001:db8:1::2/128",
            ]),
            allow_alt_node_ip: true,
        },
    ];
    for sub in &subs {
        let fx = node_ports_fixture(sub.family, sub.node_port_addresses);
        let (pod, cluster_ip, external, node_ip, alt_node_ip, output) = match sub.family {
            IpFamily::V4 => (
                "10.0.0.2",
                "172.30.0.41",
                "203.0.113.2",
                "192.168.0.2",
                "192.168.1.2",
                "10.180.0.1:80, 10.180.2.1:80",
            ),
            IpFamily::V6 => (
                "fd00:10::2",
                "fd00:172:30::41",
                "2600:5200::1",
                "2001:db8::1",
                "2001:db8:1::2",
                "[fd00:10:180::1]:80, [fd00:10:180::2:1]:80",
            ),
        };
        let mut flows = vec![
            flow("pod to cluster IP", pod, cluster_ip, 80, output, false),
            flow(
                "external to nodePort",
                external,
                node_ip,
                3001,
                output,
                true,
            ),
            flow("node to nodePort", node_ip, node_ip, 3001, output, true),
        ];
        if sub.allow_alt_node_ip {
            flows.push(flow(
                "external to nodePort on secondary IP",
                external,
                alt_node_ip,
                3001,
                output,
                true,
            ));
        } else {
            flows.push(flow(
                "secondary nodeIP ignores NodePorts",
                external,
                alt_node_ip,
                3001,
                "",
                false,
            ));
        }
        r.run(&format!("TestNodePorts/{}", sub.name), &fx, &flows);
    }
}

/// The `TestExternalTrafficPolicy{Local,Cluster}` fixture.
fn external_traffic_policy_fixture(local: bool) -> Setup {
    let mut fx = Setup::new(IpFamily::V4);
    let mut s = svc("ns1", "svc1")
        .cluster_ip("172.30.0.41")
        .external_ips(&["192.168.99.11"])
        .port("p80", TCP, 80, 3001)
        .lb(&["1.2.3.4"]);
    if local {
        s = s.etp_local().hcnp(30000);
    }
    fx.service(s);
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", "")
            .ep("10.180.2.1", NODE),
    );
    fx.sync();
    fx
}

/// §4.5 TestExternalTrafficPolicyLocal
fn external_traffic_policy_local(r: &mut Collector) {
    let fx = external_traffic_policy_fixture(true);
    let both = "10.180.0.1:80, 10.180.2.1:80";
    let local = "10.180.2.1:80";
    r.run(
        "TestExternalTrafficPolicyLocal",
        &fx,
        &[
            flow(
                "pod to cluster IP hits both endpoints, unmasqueraded",
                "10.0.0.2",
                "172.30.0.41",
                80,
                both,
                false,
            ),
            flow(
                "pod to external IP hits both endpoints, unmasqueraded",
                "10.0.0.2",
                "192.168.99.11",
                80,
                both,
                false,
            ),
            flow(
                "external to external IP hits only local endpoint, unmasqueraded",
                "203.0.113.2",
                "192.168.99.11",
                80,
                local,
                false,
            ),
            flow(
                "pod to LB IP hits only both endpoints, unmasqueraded",
                "10.0.0.2",
                "1.2.3.4",
                80,
                both,
                false,
            ),
            flow(
                "external to LB IP hits only local endpoint, unmasqueraded",
                "203.0.113.2",
                "1.2.3.4",
                80,
                local,
                false,
            ),
            flow(
                "pod to NodePort hits both endpoints, unmasqueraded",
                "10.0.0.2",
                "192.168.0.2",
                3001,
                both,
                false,
            ),
            flow(
                "external to NodePort hits only local endpoint, unmasqueraded",
                "203.0.113.2",
                "192.168.0.2",
                3001,
                local,
                false,
            ),
        ],
    );
}

/// §4.6 TestExternalTrafficPolicyCluster
fn external_traffic_policy_cluster(r: &mut Collector) {
    let fx = external_traffic_policy_fixture(false);
    let both = "10.180.0.1:80, 10.180.2.1:80";
    r.run(
        "TestExternalTrafficPolicyCluster",
        &fx,
        &[
            flow(
                "pod to cluster IP hits both endpoints, unmasqueraded",
                "10.0.0.2",
                "172.30.0.41",
                80,
                both,
                false,
            ),
            flow(
                "pod to external IP hits both endpoints, masqueraded",
                "10.0.0.2",
                "192.168.99.11",
                80,
                both,
                true,
            ),
            flow(
                "external to external IP hits both endpoints, masqueraded",
                "203.0.113.2",
                "192.168.99.11",
                80,
                both,
                true,
            ),
            flow(
                "pod to LB IP hits both endpoints, masqueraded",
                "10.0.0.2",
                "1.2.3.4",
                80,
                both,
                true,
            ),
            flow(
                "external to LB IP hits both endpoints, masqueraded",
                "203.0.113.2",
                "1.2.3.4",
                80,
                both,
                true,
            ),
            flow(
                "pod to NodePort hits both endpoints, masqueraded",
                "10.0.0.2",
                "192.168.0.2",
                3001,
                both,
                true,
            ),
            flow(
                "external to NodePort hits both endpoints, masqueraded",
                "203.0.113.2",
                "192.168.0.2",
                3001,
                both,
                true,
            ),
        ],
    );
}

/// §4.7 TestInternalTrafficPolicy
fn internal_traffic_policy(r: &mut Collector) {
    struct Sub {
        name: &'static str,
        local: bool,
        endpoints: [(&'static str, &'static str); 3],
        flow: Flow,
    }
    let subs = [
        Sub {
            name: "internalTrafficPolicy is cluster",
            local: false,
            endpoints: [
                ("10.0.1.1", NODE),
                ("10.0.1.2", "node1"),
                ("10.0.1.3", "node2"),
            ],
            flow: flow(
                "pod to ClusterIP hits all endpoints",
                "10.0.0.2",
                "172.30.1.1",
                80,
                "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80",
                false,
            ),
        },
        Sub {
            name: "internalTrafficPolicy is local and there is one local endpoint",
            local: true,
            endpoints: [
                ("10.0.1.1", NODE),
                ("10.0.1.2", "node1"),
                ("10.0.1.3", "node2"),
            ],
            flow: flow(
                "pod to ClusterIP hits only local endpoint",
                "10.0.0.2",
                "172.30.1.1",
                80,
                "10.0.1.1:80",
                false,
            ),
        },
        Sub {
            name: "internalTrafficPolicy is local and there are multiple local endpoints",
            local: true,
            endpoints: [
                ("10.0.1.1", NODE),
                ("10.0.1.2", NODE),
                ("10.0.1.3", "node2"),
            ],
            flow: flow(
                "pod to ClusterIP hits all local endpoints",
                "10.0.0.2",
                "172.30.1.1",
                80,
                "10.0.1.1:80, 10.0.1.2:80",
                false,
            ),
        },
        Sub {
            name: "internalTrafficPolicy is local and there are no local endpoints",
            local: true,
            endpoints: [
                ("10.0.1.1", "node0"),
                ("10.0.1.2", "node1"),
                ("10.0.1.3", "node2"),
            ],
            flow: flow("no endpoints", "10.0.0.2", "172.30.1.1", 80, "DROP", false),
        },
    ];
    for sub in subs {
        let test = format!("TestInternalTrafficPolicy/{}", sub.name);
        let mut fx = Setup::new(IpFamily::V4);
        let mut s = svc("ns1", "svc1")
            .cluster_ip("172.30.1.1")
            .port("", TCP, 80, 0);
        if sub.local {
            s = s.itp_local();
        }
        fx.service(s);
        let mut sl = slice("ns1", "svc1", "svc1-1").port("", TCP, 80);
        for (ip, node) in sub.endpoints {
            sl = sl.ep_cond(ip, node, true, true, false);
        }
        fx.slice(sl);
        fx.sync();
        r.run(&test, &fx, &[sub.flow]);

        fx.delete_slice("ns1", "svc1-1");
        fx.sync();
        r.run(
            &test,
            &fx,
            &[flow(
                "endpoints deleted",
                "10.0.0.2",
                "172.30.1.1",
                80,
                "REJECT",
                false,
            )],
        );
    }
}

/// An endpoint of the terminating-endpoints tests:
/// `(ip, node, ready, serving, terminating)`.
type CondEp = (&'static str, &'static str, bool, bool, bool);

/// One sub-test of `TestTerminatingEndpointsTrafficPolicy{Local,Cluster}`.
struct TerminatingSub {
    name: &'static str,
    endpoints: Vec<CondEp>,
    flows: Vec<Flow>,
}

/// Runs the terminating-endpoints sub-tests on `ns1/svc1` (LoadBalancer
/// 1.2.3.4, HCNP 30000, no nodePort), each followed by deleting the slice.
fn run_terminating(r: &mut Collector, test: &str, etp_local: bool, subs: Vec<TerminatingSub>) {
    for sub in subs {
        let test = format!("{test}/{}", sub.name);
        let mut fx = Setup::new(IpFamily::V4);
        let mut s = svc("ns1", "svc1")
            .cluster_ip("172.30.1.1")
            .port("", TCP, 80, 0)
            .hcnp(30000)
            .lb(&["1.2.3.4"]);
        if etp_local {
            s = s.etp_local();
        }
        fx.service(s);
        let mut sl = slice("ns1", "svc1", "svc1-1").port("", TCP, 80);
        for (ip, node, ready, serving, terminating) in sub.endpoints {
            sl = sl.ep_cond(ip, node, ready, serving, terminating);
        }
        fx.slice(sl);
        fx.sync();
        r.run(&test, &fx, &sub.flows);

        fx.delete_slice("ns1", "svc1-1");
        fx.sync();
        r.run(
            &test,
            &fx,
            &[
                flow(
                    "pod to clusterIP after endpoints deleted",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "REJECT",
                    false,
                ),
                flow(
                    "external to LB after endpoints deleted",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "REJECT",
                    false,
                ),
            ],
        );
    }
}

/// §4.8 TestTerminatingEndpointsTrafficPolicyLocal
fn terminating_endpoints_traffic_policy_local(r: &mut Collector) {
    let subs = vec![
        TerminatingSub {
            name: "ready endpoints exist",
            endpoints: vec![
                ("10.0.1.1", NODE, true, true, false),
                ("10.0.1.2", NODE, true, true, false),
                ("10.0.1.3", NODE, false, true, true),
                ("10.0.1.4", NODE, false, false, true),
                ("10.0.1.5", "node-1", true, true, false),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "10.0.1.1:80, 10.0.1.2:80",
                    false,
                ),
            ],
        },
        TerminatingSub {
            name: "only terminating endpoints exist",
            endpoints: vec![
                ("10.0.1.2", NODE, false, true, true),
                ("10.0.1.3", NODE, false, true, true),
                ("10.0.1.4", NODE, false, false, true),
                ("10.0.1.5", "node-1", true, true, false),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "10.0.1.2:80, 10.0.1.3:80",
                    false,
                ),
            ],
        },
        TerminatingSub {
            name: "terminating endpoints on remote node",
            endpoints: vec![("10.0.1.5", "node-1", false, true, true)],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB, no locally-usable endpoints",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "DROP",
                    false,
                ),
            ],
        },
        TerminatingSub {
            name: "no usable endpoints on any node",
            endpoints: vec![
                ("10.0.1.5", NODE, false, false, true),
                ("10.0.1.5", "node-1", false, false, true),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP, no usable endpoints",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "REJECT",
                    false,
                ),
                flow(
                    "external to LB, no usable endpoints",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "REJECT",
                    false,
                ),
            ],
        },
    ];
    run_terminating(r, "TestTerminatingEndpointsTrafficPolicyLocal", true, subs);
}

/// §4.9 TestTerminatingEndpointsTrafficPolicyCluster
fn terminating_endpoints_traffic_policy_cluster(r: &mut Collector) {
    let subs = vec![
        TerminatingSub {
            name: "ready endpoints exist",
            endpoints: vec![
                ("10.0.1.1", NODE, true, true, false),
                ("10.0.1.2", NODE, true, true, false),
                ("10.0.1.3", "another-node", false, true, true),
                ("10.0.1.4", "another-node", false, false, true),
                ("10.0.1.5", "another-node", true, true, false),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80",
                    true,
                ),
            ],
        },
        TerminatingSub {
            name: "only terminating endpoints exist",
            endpoints: vec![
                ("10.0.1.2", NODE, false, true, true),
                ("10.0.1.3", NODE, false, true, true),
                ("10.0.1.4", "another-node", false, false, true),
                ("10.0.1.5", "another-node", false, true, true),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.2:80, 10.0.1.3:80, 10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "10.0.1.2:80, 10.0.1.3:80, 10.0.1.5:80",
                    true,
                ),
            ],
        },
        TerminatingSub {
            name: "terminating endpoints on remote node",
            endpoints: vec![("10.0.1.5", "node-1", false, true, true)],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "10.0.1.5:80",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "10.0.1.5:80",
                    true,
                ),
            ],
        },
        TerminatingSub {
            name: "no usable endpoints on any node",
            endpoints: vec![
                ("10.0.1.5", NODE, false, false, true),
                ("10.0.1.5", "node-1", false, false, true),
            ],
            flows: vec![
                flow(
                    "pod to clusterIP",
                    "10.0.0.2",
                    "172.30.1.1",
                    80,
                    "REJECT",
                    false,
                ),
                flow(
                    "external to LB",
                    "203.0.113.2",
                    "1.2.3.4",
                    80,
                    "REJECT",
                    false,
                ),
            ],
        },
    ];
    run_terminating(
        r,
        "TestTerminatingEndpointsTrafficPolicyCluster",
        false,
        subs,
    );
}

/// One row of §4.10's table: case name, source, destination, port, and
/// the expected `(output, masq)` for the sub-tests base, no detector,
/// masqueradeAll and masqueradeAll without a detector.
type MasqRow = (
    &'static str,
    &'static str,
    &'static str,
    u16,
    [(&'static str, bool); 4],
);

/// §4.10 TestInternalExternalMasquerade
fn internal_external_masquerade(r: &mut Collector) {
    const POD: &str = "10.0.0.2";
    const NODE_IP: &str = "192.168.0.2";
    const EXT: &str = "203.0.113.2";
    const S1: &str = "10.180.0.1:80, 10.180.1.1:80";
    const S2: &str = "10.180.0.2:80, 10.180.1.2:80";
    const S3: &str = "10.180.0.3:80, 10.180.1.3:80";
    const L2: &str = "10.180.0.2:80";
    const L3: &str = "10.180.0.3:80";
    #[rustfmt::skip]
    let rows: [MasqRow; 27] = [
        ("pod to ClusterIP", POD, "172.30.0.41", 80,
            [(S1, false), (S1, false), (S1, true), (S1, true)]),
        ("pod to NodePort", POD, NODE_IP, 3001,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("pod to LB", POD, "1.2.3.4", 80,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("node to ClusterIP", NODE_IP, "172.30.0.41", 80,
            [(S1, true), (S1, false), (S1, true), (S1, true)]),
        ("node to NodePort", NODE_IP, NODE_IP, 3001,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("node to LB", NODE_IP, "1.2.3.4", 80,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("external to ClusterIP", EXT, "172.30.0.41", 80,
            [(S1, true), (S1, false), (S1, true), (S1, true)]),
        ("external to NodePort", EXT, NODE_IP, 3001,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("external to LB", EXT, "1.2.3.4", 80,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("pod to ClusterIP with eTP:Local", POD, "172.30.0.42", 80,
            [(S2, false), (S2, false), (S2, true), (S2, true)]),
        ("pod to NodePort with eTP:Local", POD, NODE_IP, 3002,
            [(S2, false), (L2, false), (S2, false), (L2, false)]),
        ("pod to LB with eTP:Local", POD, "5.6.7.8", 80,
            [(S2, false), (L2, false), (S2, false), (L2, false)]),
        ("node to ClusterIP with eTP:Local", NODE_IP, "172.30.0.42", 80,
            [(S2, true), (S2, false), (S2, true), (S2, true)]),
        // Upstream really uses port 3001 (svc1's NodePort) here.
        ("node to NodePort with eTP:Local", NODE_IP, NODE_IP, 3001,
            [(S1, true), (S1, true), (S1, true), (S1, true)]),
        ("node to LB with eTP:Local", NODE_IP, "5.6.7.8", 80,
            [(S2, true), (S2, true), (S2, true), (S2, true)]),
        ("external to ClusterIP with eTP:Local", EXT, "172.30.0.42", 80,
            [(S2, true), (S2, false), (S2, true), (S2, true)]),
        ("external to NodePort with eTP:Local", EXT, NODE_IP, 3002,
            [(L2, false), (L2, false), (L2, false), (L2, false)]),
        ("external to LB with eTP:Local", EXT, "5.6.7.8", 80,
            [(L2, false), (L2, false), (L2, false), (L2, false)]),
        ("pod to ClusterIP with iTP:Local", POD, "172.30.0.43", 80,
            [(L3, false), (L3, false), (L3, true), (L3, true)]),
        ("pod to NodePort with iTP:Local", POD, NODE_IP, 3003,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
        ("pod to LB with iTP:Local", POD, "9.10.11.12", 80,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
        ("node to ClusterIP with iTP:Local", NODE_IP, "172.30.0.43", 80,
            [(L3, true), (L3, false), (L3, true), (L3, true)]),
        ("node to NodePort with iTP:Local", NODE_IP, NODE_IP, 3003,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
        ("node to LB with iTP:Local", NODE_IP, "9.10.11.12", 80,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
        ("external to ClusterIP with iTP:Local", EXT, "172.30.0.43", 80,
            [(L3, true), (L3, false), (L3, true), (L3, true)]),
        ("external to NodePort with iTP:Local", EXT, NODE_IP, 3003,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
        ("external to LB with iTP:Local", EXT, "9.10.11.12", 80,
            [(S3, true), (S3, true), (S3, true), (S3, true)]),
    ];
    let subs = [
        ("base", false, true),
        ("no LocalTrafficDetector", false, false),
        ("masqueradeAll", true, true),
        ("masqueradeAll, no LocalTrafficDetector", true, false),
    ];
    for (i, (name, masquerade_all, detector)) in subs.into_iter().enumerate() {
        let tweaks = Tweaks {
            masquerade_all,
            no_detector: !detector,
            ..Tweaks::default()
        };
        let mut fx = Setup::with_tweaks(IpFamily::V4, tweaks);
        fx.service(
            svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .port("p80", TCP, 80, 3001)
                .hcnp(30001)
                .lb(&["1.2.3.4"]),
        );
        fx.slice(
            slice("ns1", "svc1", "svc1-1")
                .port("p80", TCP, 80)
                .ep("10.180.0.1", NODE)
                .ep("10.180.1.1", "remote"),
        );
        fx.service(
            svc("ns2", "svc2")
                .cluster_ip("172.30.0.42")
                .port("p80", TCP, 80, 3002)
                .hcnp(30002)
                .lb(&["5.6.7.8"])
                .etp_local(),
        );
        fx.slice(
            slice("ns2", "svc2", "svc2-1")
                .port("p80", TCP, 80)
                .ep("10.180.0.2", NODE)
                .ep("10.180.1.2", "remote"),
        );
        fx.service(
            svc("ns3", "svc3")
                .cluster_ip("172.30.0.43")
                .port("p80", TCP, 80, 3003)
                .hcnp(30003)
                .lb(&["9.10.11.12"])
                .itp_local(),
        );
        fx.slice(
            slice("ns3", "svc3", "svc3-1")
                .port("p80", TCP, 80)
                .ep("10.180.0.3", NODE)
                .ep("10.180.1.3", "remote"),
        );
        fx.sync();
        let flows: Vec<Flow> = rows
            .iter()
            .map(|&(case, src, dst, port, expect)| {
                let (output, masq) = expect[i];
                flow(case, src, dst, port, output, masq)
            })
            .collect();
        r.run(
            &format!("TestInternalExternalMasquerade/{name}"),
            &fx,
            &flows,
        );
    }
}

/// §4.11 TestTracePacketV4, on the §1.7.1 (`TestOverallNFTablesRules`)
/// services.
fn trace_packet_v4(r: &mut Collector) {
    let mut fx = Setup::new(IpFamily::V4);
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
    fx.service(
        svc("ns2", "svc2")
            .cluster_ip("172.30.0.42")
            .external_ips(&["192.168.99.22"])
            .port("p80", TCP, 80, 3001)
            .hcnp(30000)
            .lb(&["1.2.3.4"])
            .etp_local(),
    );
    fx.slice(
        slice("ns2", "svc2", "svc2-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.2", ""),
    );
    fx.service(
        svc("ns3", "svc3")
            .kind(ServiceType::NodePort)
            .cluster_ip("172.30.0.43")
            .port("p80", TCP, 80, 3003),
    );
    fx.slice(
        slice("ns3", "svc3", "svc3-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.3", ""),
    );
    fx.service(
        svc("ns4", "svc4")
            .kind(ServiceType::NodePort)
            .cluster_ip("172.30.0.44")
            .external_ips(&["192.168.99.33"])
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice("ns4", "svc4", "svc4-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.4", "")
            .ep("10.180.0.5", NODE),
    );
    fx.service(
        svc("ns5", "svc5")
            .cluster_ip("172.30.0.45")
            .port("p80", TCP, 80, 3002)
            .hcnp(30000)
            .lb(&["5.6.7.8"])
            .source_ranges(&[" 203.0.113.0/25"])
            .affinity(10800),
    );
    fx.slice(
        slice("ns5", "svc5", "svc5-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.3", ""),
    );
    fx.service(
        svc("ns6", "svc6")
            .cluster_ip("172.30.0.46")
            .port("p80", TCP, 80, 0),
    );
    fx.sync();
    r.run(
        "TestTracePacketV4",
        &fx,
        &[
            flow("no match", "10.0.0.2", "10.0.0.3", 80, "", false),
            flow(
                "single endpoint",
                "10.0.0.2",
                "172.30.0.41",
                80,
                "10.180.0.1:80",
                false,
            ),
            flow(
                "multiple endpoints",
                "10.0.0.2",
                "172.30.0.44",
                80,
                "10.180.0.4:80, 10.180.0.5:80",
                false,
            ),
            flow(
                "local, mark for masquerade",
                "192.168.0.2",
                "192.168.99.22",
                80,
                "10.180.0.2:80",
                true,
            ),
            flow("DROP", "203.0.113.2", "192.168.99.22", 80, "DROP", false),
            flow("REJECT", "10.0.0.2", "172.30.0.46", 80, "REJECT", false),
            flow(
                "blocked external to loadbalancer IP",
                "203.0.113.130",
                "5.6.7.8",
                80,
                "DROP",
                false,
            ),
            flow(
                "pod to nodePort",
                "10.0.0.2",
                "192.168.0.2",
                3001,
                "10.180.0.2:80",
                false,
            ),
        ],
    );
}

/// §4.11 TestTracePacketV6, on the `TestNodePorts` "ipv6" ruleset.
fn trace_packet_v6(r: &mut Collector) {
    let fx = node_ports_fixture(IpFamily::V6, None);
    let both = "[fd00:10:180::1]:80, [fd00:10:180::2:1]:80";
    r.run(
        "TestTracePacketV6",
        &fx,
        &[
            flow(
                "pod to cluster IP",
                "fd00:10::2",
                "fd00:172:30::41",
                80,
                both,
                false,
            ),
            flow(
                "external to nodePort",
                "2600:5200::1",
                "2001:db8::1",
                3001,
                both,
                true,
            ),
            flow(
                "node to nodePort",
                "2001:db8::1",
                "2001:db8::1",
                3001,
                both,
                true,
            ),
        ],
    );
}

/// A named group of cases (one upstream test function).
type Group = (&'static str, fn(&mut Collector));

/// Every scenario of every upstream packet-flow test function, in order.
pub fn upstream_scenarios() -> Vec<Scenario> {
    let groups: &[Group] = &[
        ("TestNoEndpointsReject", no_endpoints_reject),
        ("TestClusterIPGeneral", cluster_ip_general),
        ("TestLoadBalancer", load_balancer),
        ("TestNodePorts", node_ports),
        (
            "TestExternalTrafficPolicyLocal",
            external_traffic_policy_local,
        ),
        (
            "TestExternalTrafficPolicyCluster",
            external_traffic_policy_cluster,
        ),
        ("TestInternalTrafficPolicy", internal_traffic_policy),
        (
            "TestTerminatingEndpointsTrafficPolicyLocal",
            terminating_endpoints_traffic_policy_local,
        ),
        (
            "TestTerminatingEndpointsTrafficPolicyCluster",
            terminating_endpoints_traffic_policy_cluster,
        ),
        (
            "TestInternalExternalMasquerade",
            internal_external_masquerade,
        ),
        ("TestTracePacketV4", trace_packet_v4),
        ("TestTracePacketV6", trace_packet_v6),
    ];
    let mut c = Collector::default();
    for (_, group) in groups {
        group(&mut c);
    }
    c.scenarios
}
