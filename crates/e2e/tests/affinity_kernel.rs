//! ClientIP session affinity on a real kernel: real connections stick to
//! one endpoint (recorded after DNAT from the conntrack original tuple), and
//! when that endpoint goes away the proxier purges its entries and the
//! client moves on. IPv4 through both backends; IPv6 over netlink, the
//! backend that can program it (nft 1.0.6 refuses the IPv6 rule). Needs
//! root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use verdict_conformance::*;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::can_run;
use verdict_e2e::runner::{KernelBackend, node_config};
use verdict_model::IpFamily;
use verdict_nft::{Backend, Family};
use verdict_proxier::Proxier;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The addresses of one family: client pod, service, three endpoints.
struct Plan {
    client: &'static str,
    service: &'static str,
    endpoints: [&'static str; 3],
}

const V4: Plan = Plan {
    client: "10.0.0.2",
    service: "172.30.0.41",
    endpoints: ["10.180.0.1", "10.180.0.2", "10.180.0.3"],
};

const V6: Plan = Plan {
    client: "fd00:10::2",
    service: "fd00:172:30::41",
    endpoints: ["fd00:10:180::1", "fd00:10:180::2", "fd00:10:180::3"],
};

/// Who answered a connection from the client pod to the service.
fn answer(bed: &TestBed, plan: &Plan) -> String {
    let line = bed
        .connect(ip(plan.client), ip(plan.service), "tcp", 80, 1000)
        .unwrap();
    line.split_whitespace().nth(1).unwrap_or(&line).to_string()
}

/// The endpoint address in an echo answer (`ADDR:PORT` or `[ADDR]:PORT`).
fn address_of(answer: &str) -> String {
    match answer.rsplit_once(':') {
        Some((a, _)) => a.trim_matches(['[', ']']).to_string(),
        None => answer.to_string(),
    }
}

#[test]
fn clients_stick_and_move_when_their_endpoint_goes() {
    stick_and_move(IpFamily::V4, &V4, KernelBackend::Nft);
}

#[test]
fn clients_stick_and_move_when_their_endpoint_goes_over_netlink() {
    stick_and_move(IpFamily::V4, &V4, KernelBackend::Netlink);
}

#[test]
fn ipv6_clients_stick_and_move_over_netlink() {
    stick_and_move(IpFamily::V6, &V6, KernelBackend::Netlink);
}

fn stick_and_move(family: IpFamily, plan: &Plan, kernel: KernelBackend) {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let echo = PathBuf::from(env!("CARGO_BIN_EXE_verdict-e2e-echo"));
    let mut bed = TestBed::new(echo).unwrap();
    for ep in plan.endpoints {
        bed.add_pod(ip(ep), Placement::Local, &[80], &[]).unwrap();
    }
    bed.add_pod(ip(plan.client), Placement::Local, &[], &[])
        .unwrap();
    let scenario = Scenario {
        name: "affinity".into(),
        setup: Setup::new(family),
        flows: Vec::new(),
    };
    let mut nft = kernel.open(bed.node.name()).unwrap();
    let mut p = Proxier::new(node_config(&scenario).unwrap()).unwrap();
    let service = svc("ns1", "svc1")
        .cluster_ip(plan.service)
        .port("p80", TCP, 80, 0)
        .affinity(600);
    let slice_of = |eps: &[&str]| {
        let mut s = slice("ns1", "svc1", "svc1-1").port("p80", TCP, 80);
        for e in eps {
            s = s.ep(e, NODE);
        }
        match family {
            IpFamily::V4 => s,
            IpFamily::V6 => s.v6(),
        }
    };
    p.on_service(None, Some(&service));
    p.on_endpoint_slice(&slice_of(&plan.endpoints), false);
    let t0 = Instant::now();
    p.sync(&mut nft, t0).unwrap();

    let first = answer(&bed, plan);
    assert!(
        plan.endpoints
            .iter()
            .any(|e| ip(e).to_string() == address_of(&first)),
        "an endpoint answers: {first}"
    );
    for _ in 0..15 {
        assert_eq!(
            answer(&bed, plan),
            first,
            "every new connection sticks to the first endpoint"
        );
    }
    let nft_family = match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    };
    let recorded = nft.elements(nft_family, "verdict", "affinity").unwrap();
    assert_eq!(
        recorded.len(),
        1,
        "one client, one entry: {recorded:?}\n{}",
        bed.node
            .exec(
                "nft",
                &["list", "table", nft_family.to_string().as_str(), "verdict"]
            )
            .unwrap_or_default()
    );

    // Its endpoint goes away.
    let gone = address_of(&first);
    let rest: Vec<&str> = plan
        .endpoints
        .into_iter()
        .filter(|e| ip(e) != ip(&gone))
        .collect();
    assert_eq!(rest.len(), 2, "{first} is one of {:?}", plan.endpoints);
    p.on_endpoint_slice(&slice_of(&rest), false);
    let r = p
        .sync(&mut nft, t0 + std::time::Duration::from_secs(1))
        .unwrap();
    assert_eq!(r.affinity_entries_purged, 1);
    let second = answer(&bed, plan);
    assert_ne!(second, first);
    for _ in 0..10 {
        assert_eq!(answer(&bed, plan), second, "sticks to the new endpoint");
    }
}
