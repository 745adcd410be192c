//! ClientIP session affinity on a real kernel: real connections stick to
//! one endpoint (recorded after DNAT from the conntrack original tuple), and
//! when that endpoint goes away the proxier purges its entries and the
//! client moves on. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use verdict_conformance::*;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::can_run;
use verdict_e2e::runner::node_config;
use verdict_model::IpFamily;
use verdict_nft::{Backend, Family, NftCli};
use verdict_proxier::Proxier;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Who answered a connection from the pod at 10.0.0.2 to the service.
fn answer(bed: &TestBed) -> String {
    let line = bed
        .connect(ip("10.0.0.2"), ip("172.30.0.41"), "tcp", 80, 1000)
        .unwrap();
    line.split_whitespace().nth(1).unwrap_or(&line).to_string()
}

#[test]
fn clients_stick_and_move_when_their_endpoint_goes() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let echo = PathBuf::from(env!("CARGO_BIN_EXE_verdict-e2e-echo"));
    let mut bed = TestBed::new(echo).unwrap();
    for ep in ["10.180.0.1", "10.180.0.2", "10.180.0.3"] {
        bed.add_pod(ip(ep), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let scenario = Scenario {
        name: "affinity".into(),
        setup: Setup::new(IpFamily::V4),
        flows: Vec::new(),
    };
    let mut nft = NftCli::in_netns(bed.node.name()).unwrap();
    let mut p = Proxier::new(node_config(&scenario).unwrap()).unwrap();
    let service = svc("ns1", "svc1")
        .cluster_ip("172.30.0.41")
        .port("p80", TCP, 80, 0)
        .affinity(600);
    let slice_of = |eps: &[&str]| {
        let mut s = slice("ns1", "svc1", "svc1-1").port("p80", TCP, 80);
        for e in eps {
            s = s.ep(e, NODE);
        }
        s
    };
    p.on_service(None, Some(&service));
    p.on_endpoint_slice(
        &slice_of(&["10.180.0.1", "10.180.0.2", "10.180.0.3"]),
        false,
    );
    let t0 = Instant::now();
    p.sync(&mut nft, t0).unwrap();

    let first = answer(&bed);
    for _ in 0..15 {
        assert_eq!(
            answer(&bed),
            first,
            "every new connection sticks to the first endpoint"
        );
    }
    let recorded = nft.elements(Family::Ip, "verdict", "affinity").unwrap();
    assert_eq!(recorded.len(), 1, "one client, one entry: {recorded:?}");

    // Its endpoint goes away.
    let gone: String = first.split(':').next().unwrap().to_string();
    let rest: Vec<&str> = ["10.180.0.1", "10.180.0.2", "10.180.0.3"]
        .into_iter()
        .filter(|e| *e != gone)
        .collect();
    p.on_endpoint_slice(&slice_of(&rest), false);
    let r = p
        .sync(&mut nft, t0 + std::time::Duration::from_secs(1))
        .unwrap();
    assert_eq!(r.affinity_entries_purged, 1);
    let second = answer(&bed);
    assert_ne!(second, first);
    for _ in 0..10 {
        assert_eq!(answer(&bed), second, "sticks to the new endpoint");
    }
}
