//! Failure isolation against the real kernel: an element the kernel
//! refuses is left out and everything else, the rest of its service port
//! too, is programmed in the same sync; two LoadBalancers on one address
//! never reach the kernel as overlapping intervals; names at Kubernetes' maximum lengths are programmed. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use verdict_conformance::*;
use verdict_e2e::netns::{Netns, can_run, unique_prefix};
use verdict_e2e::runner::node_config;
use verdict_model::{IpFamily, Protocol, ServicePortName};
use verdict_nft::{Backend, Family, NftCli};
use verdict_proxier::Proxier;

fn setup() -> Option<(Netns, NftCli, Proxier)> {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return None;
    }
    let ns = Netns::create(&format!("{}-iso", unique_prefix())).unwrap();
    let nft = NftCli::in_netns(ns.name()).unwrap();
    let scenario = Scenario {
        name: "isolation".into(),
        setup: Setup::new(IpFamily::V4),
        flows: Vec::new(),
    };
    let p = Proxier::new(node_config(&scenario).unwrap()).unwrap();
    Some((ns, nft, p))
}

fn plain(p: &mut Proxier, ns: &str, name: &str, ip: &str, ep: &str) {
    p.on_service(
        None,
        Some(&svc(ns, name).cluster_ip(ip).port("p80", TCP, 80, 0)),
    );
    p.on_endpoint_slice(
        &slice(ns, name, &format!("{name}-1"))
            .port("p80", TCP, 80)
            .ep(ep, ""),
        false,
    );
}

fn lb(p: &mut Proxier, name: &str, ip: &str, node_port: i32, range: &str) {
    p.on_service(
        None,
        Some(
            &svc("ns", name)
                .cluster_ip(ip)
                .port("p80", TCP, 80, node_port)
                .lb(&["5.6.7.8"])
                .source_ranges(&[range]),
        ),
    );
    p.on_endpoint_slice(
        &slice("ns", name, &format!("{name}-1"))
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
        false,
    );
}

fn dump(nft: &mut NftCli) -> String {
    nft.table(Family::Ip, "verdict")
        .unwrap()
        .unwrap()
        .dump(Family::Ip, "verdict")
}

#[test]
fn the_kernel_refuses_one_element_and_the_rest_of_its_service_port_is_programmed() {
    let Some((ns, mut nft, mut p)) = setup() else {
        return;
    };
    for i in 0..20 {
        plain(
            &mut p,
            "good",
            &format!("s{i}"),
            &format!("172.30.0.{}", 10 + i),
            "10.180.0.1",
        );
    }
    p.sync(&mut nft, Instant::now()).unwrap();
    // Another agent puts an element of its own where verdict is about to
    // want one: the kernel refuses verdict's ("File exists").
    ns.exec(
        "nft",
        &["add element ip verdict service-ips { 1.2.3.4 . tcp . 80 : drop }"],
    )
    .unwrap();
    p.on_service(
        None,
        Some(
            &svc("ns", "web")
                .cluster_ip("172.30.1.7")
                .port("p80", TCP, 80, 30007)
                .external_ips(&["1.2.3.4", "1.2.3.5"]),
        ),
    );
    p.on_endpoint_slice(
        &slice("ns", "web", "web-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", ""),
        false,
    );
    let r = p
        .sync(&mut nft, Instant::now() + Duration::from_secs(2))
        .unwrap();
    let web = ServicePortName::new("ns", "web", "p80", Protocol::Tcp);
    assert_eq!(
        r.quarantined.iter().map(|q| &q.0).collect::<Vec<_>>(),
        vec![&web]
    );
    let reason = &r.quarantined[0].1;
    assert!(
        reason.contains("service-ips element 1.2.3.4 . tcp . 80 : goto")
            && reason.contains("exists"),
        "the element and the kernel's reason: {reason}"
    );
    assert_eq!(p.quarantined()[&web].len(), 1);
    // The port's other entry points are programmed.
    let table = dump(&mut nft);
    for want in [
        "172.30.1.7 . tcp . 80 comment \"ns/web:p80\" : goto",
        "1.2.3.5 . tcp . 80 comment \"ns/web:p80\" : goto",
        "tcp . 30007 comment \"ns/web:p80\" : goto",
        "good/s19:p80",
    ] {
        assert!(table.contains(want), "{want}: {table}");
    }

    // A later change to another service is a partial sync that lands at
    // once, without trying the refused element again.
    plain(&mut p, "good", "late", "172.30.2.1", "10.180.0.2");
    let t = Instant::now();
    let r = p
        .sync(&mut nft, Instant::now() + Duration::from_secs(4))
        .unwrap();
    let took = t.elapsed();
    assert!(!r.full && r.quarantined.is_empty() && r.retried.is_empty());
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(dump(&mut nft).contains("good/late:p80"));
}

#[test]
fn two_load_balancers_on_one_address_reach_the_kernel_without_a_refusal() {
    let Some((_ns, mut nft, mut p)) = setup() else {
        return;
    };
    // Overlapping source ranges on one address and port: the kernel would
    // refuse the overlapping intervals; only the holder's are programmed.
    lb(&mut p, "a", "172.30.1.1", 30080, "10.0.0.0/8");
    lb(&mut p, "b", "172.30.1.2", 30081, "10.1.2.3/32");
    let r = p.sync(&mut nft, Instant::now()).unwrap();
    assert!(r.quarantined.is_empty(), "{:?}", r.quarantined);
    assert_eq!(r.conflicts.len(), 1, "{:?}", r.conflicts);
    let b = ServicePortName::new("ns", "b", "p80", Protocol::Tcp);
    assert_eq!(r.conflicts[0].loser, b);
    let table = dump(&mut nft);
    assert!(table.contains("5.6.7.8 . tcp . 80 . 10.0.0.0/8"), "{table}");
    assert!(!table.contains("10.1.2.3"), "{table}");
    assert!(
        table.contains("172.30.1.2 . tcp . 80"),
        "b's ClusterIP: {table}"
    );
    assert!(table.contains("tcp . 30081"), "b's NodePort: {table}");

    // a goes: b has the address, with its range, in a partial sync.
    p.on_service(
        Some(
            &svc("ns", "a")
                .cluster_ip("172.30.1.1")
                .port("p80", TCP, 80, 30080)
                .lb(&["5.6.7.8"])
                .source_ranges(&["10.0.0.0/8"]),
        ),
        None,
    );
    let r = p
        .sync(&mut nft, Instant::now() + Duration::from_secs(2))
        .unwrap();
    assert!(!r.full && r.quarantined.is_empty());
    assert_eq!(r.conflicts_resolved.len(), 1);
    let table = dump(&mut nft);
    assert!(table.contains("5.6.7.8 . tcp . 80 . 10.1.2.3"), "{table}");
    assert!(!table.contains("80 . 10.0.0.0/8"), "{table}");
}

#[test]
fn names_at_kubernetes_maximum_lengths_reach_the_kernel() {
    let Some((_ns, mut nft, mut p)) = setup() else {
        return;
    };
    // 63-character namespace and names, 15-character port names: 143-byte
    // comments before they are cut to nft's 128.
    let ns = format!("n{}", "s".repeat(62));
    for (i, last) in ["a", "b"].iter().enumerate() {
        let name = format!("{}{last}", "x".repeat(62));
        let port = "p".repeat(15);
        p.on_service(
            None,
            Some(
                &svc(&ns, &name)
                    .cluster_ip(&format!("172.30.0.{}", i + 1))
                    .port(&port, TCP, 80, 30080 + i as i32)
                    .lb(&[&format!("5.6.7.{}", i + 1)])
                    .source_ranges(&["10.0.0.0/8"]),
            ),
        );
        p.on_endpoint_slice(
            &slice(&ns, &name, &format!("{name}-abcde"))
                .port(&port, TCP, 80)
                .ep("10.180.0.1", ""),
            false,
        );
    }
    let r = p.sync(&mut nft, Instant::now()).unwrap();
    assert!(r.quarantined.is_empty(), "{:?}", r.quarantined);
    let dump = nft
        .table(Family::Ip, "verdict")
        .unwrap()
        .unwrap()
        .dump(Family::Ip, "verdict");
    let ours: Vec<&str> = dump
        .lines()
        .flat_map(|l| l.split("comment \"").skip(1))
        .filter_map(|c| c.split('"').next())
        .filter(|c| c.starts_with(&ns))
        .collect();
    assert!(ours.len() >= 4, "{dump}");
    assert!(ours.iter().all(|c| c.len() == 128), "{ours:?}");
    let distinct: std::collections::BTreeSet<&&str> = ours.iter().collect();
    assert_eq!(distinct.len(), 2, "{ours:?}");
}
