//! Failure isolation against the real kernel: a service port the kernel
//! refuses is quarantined and everything else is programmed in the same
//! sync; names at Kubernetes' maximum lengths are programmed. Needs root.

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

#[test]
fn the_kernel_refuses_one_service_port_and_the_rest_is_programmed() {
    let Some((_ns, mut nft, mut p)) = setup() else {
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
    // Two LoadBalancers on one VIP and port with overlapping source
    // ranges: the kernel refuses their interval elements together.
    lb(&mut p, "a", "172.30.1.1", 30080, "10.0.0.0/8");
    lb(&mut p, "b", "172.30.1.2", 30081, "10.1.0.0/16");
    let r = p.sync(&mut nft, Instant::now()).unwrap();
    let b = ServicePortName::new("ns", "b", "p80", Protocol::Tcp);
    assert_eq!(
        r.quarantined.iter().map(|q| &q.0).collect::<Vec<_>>(),
        vec![&b]
    );
    assert!(
        r.quarantined[0].1.contains("File exists"),
        "the kernel's reason: {:?}",
        r.quarantined
    );
    let table = nft.table(Family::Ip, "verdict").unwrap().unwrap();
    let dump = table.dump(Family::Ip, "verdict");
    assert!(dump.contains("good/s19:p80"), "{dump}");
    assert!(dump.contains("ns/a:p80"), "{dump}");
    assert!(!dump.contains("ns/b:p80"), "{dump}");

    // A later change to another service is a partial sync that lands at
    // once, even with the conflict still there.
    plain(&mut p, "good", "late", "172.30.2.1", "10.180.0.2");
    let t = Instant::now();
    let r = p
        .sync(&mut nft, Instant::now() + Duration::from_secs(2))
        .unwrap();
    let took = t.elapsed();
    assert!(!r.full && r.quarantined.is_empty());
    assert!(took < Duration::from_secs(1), "{took:?}");
    let dump = nft
        .table(Family::Ip, "verdict")
        .unwrap()
        .unwrap()
        .dump(Family::Ip, "verdict");
    assert!(dump.contains("good/late:p80"), "{dump}");

    // Fixing b (a range that does not overlap) programs it.
    p.on_service(
        Some(
            &svc("ns", "b")
                .cluster_ip("172.30.1.2")
                .port("p80", TCP, 80, 30081)
                .lb(&["5.6.7.8"])
                .source_ranges(&["10.1.0.0/16"]),
        ),
        Some(
            &svc("ns", "b")
                .cluster_ip("172.30.1.2")
                .port("p80", TCP, 80, 30081)
                .lb(&["5.6.7.9"])
                .source_ranges(&["10.1.0.0/16"]),
        ),
    );
    let r = p
        .sync(&mut nft, Instant::now() + Duration::from_secs(4))
        .unwrap();
    assert_eq!(r.retried, vec![b]);
    assert!(r.quarantined.is_empty(), "{:?}", r.quarantined);
    assert!(p.quarantined().is_empty());
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
