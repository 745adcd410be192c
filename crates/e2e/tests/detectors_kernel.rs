//! Interface-based local-traffic detection on a real kernel: with
//! `BridgeInterface` (`iifname cbr0`) or `InterfaceNamePrefix`
//! (`iifname cbr*`), ClusterIP traffic from pods (which enter the node on
//! the pod bridge) keeps its source, while traffic from outside the cluster
//! is masqueraded. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use verdict_conformance::*;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::can_run;
use verdict_e2e::runner::node_config;
use verdict_model::IpFamily;
use verdict_nft::NftCli;
use verdict_proxier::{LocalDetector, Proxier};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The source address the endpoint saw.
fn seen(bed: &TestBed, src: &str) -> String {
    let line = bed
        .connect(ip(src), ip("172.30.0.41"), "tcp", 80, 1000)
        .unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.first(), Some(&"OK"), "{line}");
    w[2].to_string()
}

#[test]
fn interface_detectors_tell_pods_from_the_outside() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    for detector in [
        LocalDetector::BridgeInterface("cbr0".into()),
        LocalDetector::InterfaceNamePrefix("cbr".into()),
    ] {
        let echo = PathBuf::from(env!("CARGO_BIN_EXE_verdict-e2e-echo"));
        let mut bed = TestBed::new(echo).unwrap();
        bed.add_pod(ip("10.180.1.1"), Placement::Remote, &[80], &[])
            .unwrap();
        bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
            .unwrap();
        bed.route_to_node(ip("172.30.0.41")).unwrap();
        let scenario = Scenario {
            name: "detectors".into(),
            setup: Setup::new(IpFamily::V4),
            flows: Vec::new(),
        };
        let mut cfg = node_config(&scenario).unwrap();
        cfg.local_detector = detector.clone();
        let mut nft = NftCli::in_netns(bed.node.name()).unwrap();
        let mut p = Proxier::new(cfg).unwrap();
        p.on_service(
            None,
            Some(
                &svc("ns1", "svc1")
                    .cluster_ip("172.30.0.41")
                    .port("p80", TCP, 80, 0),
            ),
        );
        p.on_endpoint_slice(
            &slice("ns1", "svc1", "svc1-1")
                .port("p80", TCP, 80)
                .ep("10.180.1.1", "other"),
            false,
        );
        p.sync(&mut nft, Instant::now()).unwrap();

        assert_eq!(
            seen(&bed, "10.0.0.2"),
            "10.0.0.2",
            "{detector:?}: pod traffic keeps its source"
        );
        assert_eq!(
            seen(&bed, "203.0.113.2"),
            "192.168.0.2",
            "{detector:?}: traffic from outside the cluster is masqueraded"
        );
    }
}
