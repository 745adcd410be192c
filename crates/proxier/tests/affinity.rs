//! ClientIP session affinity with shared maps: the first connection records
//! its endpoint after DNAT, later connections stick to it, and entries that
//! name an endpoint the service no longer has are purged.
//!
//! Address plan: service ns1/svc1 172.30.0.41:80 (externalIP 192.168.99.11,
//! NodePort 3001), endpoints 10.180.0.1 and 10.180.0.2 on port 8080; client
//! pod 10.0.0.2, external client 203.0.113.2.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use verdict_model::IpFamily;
use verdict_nft::{Family, L4Proto, Trace};

fn service(affinity: bool) -> verdict_model::Service {
    let s = svc("ns1", "svc1")
        .cluster_ip("172.30.0.41")
        .external_ips(&["192.168.99.11"])
        .port("p80", TCP, 80, 3001);
    if affinity { s.affinity(600) } else { s }
}

fn endpoints(eps: &[&str]) -> verdict_model::EndpointSlice {
    let mut s = slice("ns1", "svc1", "svc1-1").port("p80", TCP, 8080);
    for e in eps {
        s = s.ep(e, "");
    }
    s
}

/// Replays what the kernel's `update @affinity` would write for one path.
fn record(fx: &mut Fixture, t: &Trace, path: usize) -> String {
    let p = &t.paths[path];
    assert_eq!(
        p.updates.len(),
        1,
        "one affinity update per new connection:\n{}",
        t.explain()
    );
    let (set, e) = p.updates[0].clone();
    assert_eq!(set, "affinity");
    fx.nft
        .insert_dynamic(Family::Ip, "verdict", &set, e)
        .unwrap();
    p.output()
}

fn affinity_entries(fx: &Fixture) -> usize {
    fx.nft.get(Family::Ip, "verdict").unwrap().sets["affinity"]
        .elements
        .len()
}

#[test]
fn clients_stick_to_the_endpoint_they_got_first() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();

    let first = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    assert_eq!(first.output(), "10.180.0.1:8080, 10.180.0.2:8080");
    let chosen = record(&mut fx, &first, 1);

    let again = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    assert_eq!(again.output(), chosen, "sticks:\n{}", again.explain());
    assert!(
        again.paths[0]
            .rules
            .iter()
            .any(|r| r.contains("map @affinity"))
    );
    // The hit is recorded again, which refreshes the timeout.
    assert_eq!(again.paths[0].updates.len(), 1);

    // Another client is not affected.
    let other = fx.trace(L4Proto::Tcp, "10.0.0.3", "172.30.0.41", 80);
    assert_eq!(other.output(), "10.180.0.1:8080, 10.180.0.2:8080");
    // Nor is another protocol or entry point of the same client.
    let ext = fx.trace(L4Proto::Tcp, "10.0.0.2", "192.168.99.11", 80);
    assert_eq!(ext.paths.len(), 2);
}

#[test]
fn only_affinity_services_record() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(false))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    assert!(
        t.paths.iter().all(|p| p.updates.is_empty()),
        "{}",
        t.explain()
    );
}

#[test]
fn entries_for_removed_endpoints_are_purged() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    record(&mut fx, &t, 0);
    let t = fx.trace(L4Proto::Tcp, "10.0.0.3", "172.30.0.41", 80);
    record(&mut fx, &t, 1);
    assert_eq!(affinity_entries(&fx), 2);

    // 10.180.0.1 goes away: only the entry naming it is removed.
    fx.slice(endpoints(&["10.180.0.2"]));
    let r = fx.sync();
    assert_eq!(r.affinity_entries_purged, 1);
    assert_eq!(affinity_entries(&fx), 1);
    assert_eq!(
        fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80)
            .output(),
        "10.180.0.2:8080"
    );

    // Scaling up again purges nothing.
    fx.slice(endpoints(&["10.180.0.2", "10.180.0.3"]));
    assert_eq!(fx.sync().affinity_entries_purged, 0);
    assert_eq!(affinity_entries(&fx), 1);
}

#[test]
fn turning_affinity_off_or_deleting_the_service_purges_its_entries() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    record(&mut fx, &t, 0);
    fx.service(service(false));
    assert_eq!(fx.sync().affinity_entries_purged, 1);
    assert_eq!(affinity_entries(&fx), 0);

    fx.service(service(true));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "203.0.113.2", "192.168.0.2", 3001);
    record(&mut fx, &t, 0);
    fx.delete_service("ns1", "svc1");
    assert_eq!(fx.sync().affinity_entries_purged, 1);
    assert_eq!(affinity_entries(&fx), 0);
}

#[test]
fn a_restarted_proxier_purges_entries_naming_endpoints_that_are_gone() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    record(&mut fx, &t, 0);
    let t = fx.trace(L4Proto::Tcp, "10.0.0.3", "172.30.0.41", 80);
    record(&mut fx, &t, 1);

    // verdict restarts while 10.180.0.1 goes away: the new process never
    // saw it, but its first (full) sync checks every affinity entry.
    let mut restarted = Fixture::new(IpFamily::V4);
    restarted.nft = fx.nft.clone();
    restarted
        .service(service(true))
        .slice(endpoints(&["10.180.0.2"]));
    let r = restarted.sync();
    assert_eq!(r.affinity_entries_purged, 1);
    assert_eq!(affinity_entries(&restarted), 1);
}

#[test]
fn an_entry_that_stops_recording_affinity_is_purged() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "203.0.113.2", "192.168.99.11", 80);
    record(&mut fx, &t, 0);
    // The externalIP is dropped; endpoints and policies are unchanged.
    let s = svc("ns1", "svc1")
        .cluster_ip("172.30.0.41")
        .port("p80", TCP, 80, 3001)
        .affinity(600);
    fx.service(s);
    assert_eq!(fx.sync().affinity_entries_purged, 1);
    assert_eq!(affinity_entries(&fx), 0);
}

#[test]
fn each_entry_may_only_stick_to_its_own_list() {
    // eTP=Local: the ClusterIP uses the cluster list, external clients the
    // local one. The local endpoint becomes terminating while a remote one
    // is ready: it stays in the local list, leaves the cluster list, and
    // ClusterIP clients stuck to it are released.
    let s = || {
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .lb(&["1.2.3.4"])
            .port("p80", TCP, 80, 3001)
            .etp_local()
            .affinity(600)
    };
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(s()).slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 8080)
            .ep("10.180.0.1", NODE)
            .ep("10.180.0.2", "other"),
    );
    fx.sync();
    let pod = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    let i = pod
        .paths
        .iter()
        .position(|p| p.output() == "10.180.0.1:8080")
        .unwrap();
    record(&mut fx, &pod, i);
    let ext = fx.trace(L4Proto::Tcp, "203.0.113.2", "1.2.3.4", 80);
    assert_eq!(ext.output(), "10.180.0.1:8080");
    record(&mut fx, &ext, 0);
    assert_eq!(affinity_entries(&fx), 2);

    fx.slice(
        slice("ns1", "svc1", "svc1-1")
            .port("p80", TCP, 8080)
            .ep_cond("10.180.0.1", NODE, false, true, true)
            .ep("10.180.0.2", "other"),
    );
    let r = fx.sync();
    assert_eq!(r.affinity_entries_purged, 1, "only the ClusterIP entry");
    assert_eq!(
        fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80)
            .output(),
        "10.180.0.2:8080"
    );
    assert_eq!(
        fx.trace(L4Proto::Tcp, "203.0.113.2", "1.2.3.4", 80)
            .output(),
        "10.180.0.1:8080"
    );
}

/// Where the nft in use cannot record affinity, the service still balances
/// (nothing is recorded and nothing refers to a chain that records).
#[test]
fn without_affinity_support_the_service_still_balances() {
    let mut cfg = upstream_config(IpFamily::V4);
    cfg.session_affinity = false;
    let mut fx = Fixture::with_config(cfg);
    fx.service(service(true))
        .slice(endpoints(&["10.180.0.1", "10.180.0.2"]));
    fx.sync();
    let t = fx.trace(L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80);
    assert_eq!(t.output(), "10.180.0.1:8080, 10.180.0.2:8080");
    assert!(
        t.paths.iter().all(|p| p.updates.is_empty()),
        "{}",
        t.explain()
    );
    let table = fx.nft.get(Family::Ip, "verdict").unwrap();
    assert!(table.sets["affinity-services"].elements.is_empty());
    assert!(
        !table
            .chains
            .keys()
            .any(|c| c.starts_with("affinity-timeout-")),
        "{:?}",
        table.chains.keys()
    );
}
