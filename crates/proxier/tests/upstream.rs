//! kube-proxy's non-packet-flow tests worth keeping (reference §4.12):
//! TestNoEndpointsMetric, TestLoadBalancerIngressRouteTypeProxy, TestBadIPs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use verdict_model::{IpFamily, LoadBalancerIpMode, ServiceType};

/// TestNoEndpointsMetric: service ports with a Local policy and no local
/// endpoint, counted per policy.
#[test]
fn no_local_endpoints_are_counted() {
    // (name, iTP Local, eTP Local, endpoints as (ip, local), want (internal, external))
    type Case<'a> = (&'a str, bool, bool, &'a [(&'a str, bool)], (usize, usize));
    let cases: &[Case] = &[
        (
            "iTP Local, local endpoint",
            true,
            false,
            &[("10.0.1.1", true), ("10.0.1.2", false)],
            (0, 0),
        ),
        (
            "eTP Local, local endpoint",
            false,
            true,
            &[("10.0.1.1", true), ("10.0.1.2", false)],
            (0, 0),
        ),
        (
            "both Local, local endpoint",
            true,
            true,
            &[("10.0.1.1", true), ("10.0.1.2", false)],
            (0, 0),
        ),
        (
            "iTP Local, no local endpoint",
            true,
            false,
            &[("10.0.1.1", false), ("10.0.1.2", false)],
            (1, 0),
        ),
        (
            "eTP Local, no local endpoint",
            false,
            true,
            &[("10.0.1.1", false), ("10.0.1.2", false)],
            (0, 1),
        ),
        (
            "both Local, no local endpoint",
            true,
            true,
            &[("10.0.1.1", false), ("10.0.1.2", false)],
            (1, 1),
        ),
        ("both Local, no endpoints at all", true, true, &[], (0, 0)),
    ];
    for (name, itp, etp, eps, want) in cases {
        let mut fx = Fixture::new(IpFamily::V4);
        let mut s = svc("ns1", "svc1")
            .cluster_ip("172.30.1.1")
            .port("", TCP, 80, 0);
        if *etp {
            s = s.kind(ServiceType::NodePort).etp_local();
            s.ports[0].node_port = Some(123);
        }
        if *itp {
            s = s.itp_local();
        }
        fx.service(s);
        let mut sl = slice("ns1", "svc1", "svc1-1").port("", TCP, 80);
        for (ip, local) in *eps {
            sl = sl.ep(ip, if *local { NODE } else { "node2" });
        }
        fx.slice(sl);
        let r = fx.sync();
        assert_eq!(
            (r.no_local_endpoints_internal, r.no_local_endpoints_external),
            *want,
            "{name}"
        );
    }
}

/// TestLoadBalancerIngressRouteTypeProxy: ipMode Proxy VIPs are not programmed.
#[test]
fn ip_mode_proxy_is_not_programmed() {
    for (cip, lb, mode, programmed) in [
        (
            "10.20.30.41",
            "1.2.3.4",
            Some(LoadBalancerIpMode::Proxy),
            false,
        ),
        (
            "10.20.30.42",
            "1.2.3.5",
            Some(LoadBalancerIpMode::Vip),
            true,
        ),
        ("10.20.30.43", "1.2.3.6", None, true),
    ] {
        let mut fx = Fixture::new(IpFamily::V4);
        let mut s = svc("ns1", "svc1")
            .cluster_ip(cip)
            .port("p80", TCP, 80, 3001);
        s = match mode {
            Some(m) => s.lb_mode(lb, m),
            None => s.lb(&[lb]),
        };
        fx.service(s);
        fx.slice(
            slice("ns1", "svc1", "svc1-1")
                .port("p80", TCP, 80)
                .ep("10.180.0.1", ""),
        );
        fx.sync();
        let elem = format!("{lb} . tcp . 80 comment \"ns1/svc1:p80\" : goto external-1");
        assert_eq!(fx.dump().contains(&elem), programmed, "{mode:?}");
        let t = fx.trace(verdict_nft::L4Proto::Tcp, "203.0.113.2", lb, 80);
        assert_eq!(
            t.output(),
            if programmed { "10.180.0.1:80" } else { "" },
            "{mode:?}"
        );
    }
}

/// TestBadIPs: legacy leading-zero addresses program the same rules as
/// their normal spelling.
#[test]
fn leading_zero_addresses_are_read_as_decimal() {
    let build = |cip: &str, lb: &str, ext: &str, range: &str, ep: &str| {
        let mut fx = Fixture::new(IpFamily::V4);
        fx.service(
            svc("ns1", "svc1")
                .cluster_ip(cip)
                .port("p80", TCP, 80, 3001)
                .lb(&[lb])
                .external_ips(&[ext])
                .source_ranges(&[range]),
        );
        fx.slice(
            slice("ns1", "svc1", "svc1-1")
                .port("p80", TCP, 80)
                .ep(ep, ""),
        );
        fx.sync();
        fx.dump()
    };
    let bad = build(
        "172.30.0.041",
        "1.2.3.004",
        "192.168.099.022",
        "203.0.113.000/025",
        "10.180.00.001",
    );
    let good = build(
        "172.30.0.41",
        "1.2.3.4",
        "192.168.99.22",
        "203.0.113.0/25",
        "10.180.0.1",
    );
    assert_eq!(bad, good);
    assert!(good.contains("1.2.3.4 . tcp . 80 . 203.0.113.0/25"));
}

/// Source ranges that overlap each other or contain a VIP are merged: the
/// kernel refuses overlapping interval elements, which would fail every sync.
#[test]
fn overlapping_source_ranges_are_merged() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 0)
            .lb(&["192.168.0.240"])
            .source_ranges(&["192.168.0.0/24", "10.0.0.0/8", "10.1.0.0/16", "10.2.0.0/16"]),
    );
    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
    );
    fx.sync();
    let dump = fx.dump();
    assert!(
        dump.contains(
            "192.168.0.240 . tcp . 80 . 10.0.0.0/8, 192.168.0.240 . tcp . 80 . 192.168.0.0/24 }"
        ),
        "{dump}"
    );
    use verdict_nft::L4Proto::Tcp;
    assert_eq!(
        fx.trace(Tcp, "10.1.2.3", "192.168.0.240", 80).output(),
        "10.180.0.1:80"
    );
    assert_eq!(
        fx.trace(Tcp, "192.168.0.5", "192.168.0.240", 80).output(),
        "10.180.0.1:80"
    );
    assert_eq!(
        fx.trace(Tcp, "203.0.113.2", "192.168.0.240", 80).output(),
        "DROP"
    );
}
