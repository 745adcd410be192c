//! One service port the backend refuses never stops the others: the sync
//! finds it with dry runs, quarantines it, and applies everything else in
//! the same sync. It is tried again when it changes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use verdict_model::{IpFamily, ServicePortName};
use verdict_nft::{Backend, Family, MemoryBackend, NftError, Op, TableState, Transaction};

/// The in-memory backend, refusing any transaction that adds an element
/// whose comment is `poison`, or whose key and value as nft writes them
/// contain it (as the kernel would refuse, say, an element it cannot
/// store). Counts dry runs.
struct Poisoned {
    inner: MemoryBackend,
    poison: Option<String>,
    checks: usize,
}

impl Poisoned {
    fn refuses(&self, tx: &Transaction) -> Result<(), NftError> {
        let Some(poison) = &self.poison else {
            return Ok(());
        };
        // `set=text` poisons only elements of that set.
        let (only_in, poison) = match poison.split_once('=') {
            Some((set, text)) => (Some(set), text.to_string()),
            None => (None, poison.clone()),
        };
        let poison = &poison;
        let hit = tx.ops().iter().any(|op| match op {
            Op::AddElement(set, _) if only_in.is_some_and(|s| s != tx.set_name(*set)) => false,
            Op::AddElement(_, e) => {
                e.comment.as_deref() == Some(poison.as_str()) || {
                    let mut text = e.key.iter().map(|v| v.to_string()).collect::<Vec<_>>();
                    if let Some(v) = &e.value {
                        text.push(v.to_string());
                    }
                    text.join(" . ").contains(poison.as_str())
                }
            }
            _ => false,
        });
        if hit {
            return Err(NftError::Refused(
                "Error: Could not process rule: Message too long".into(),
            ));
        }
        Ok(())
    }
}

impl Backend for Poisoned {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.refuses(tx)?;
        self.inner.run(tx)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.checks += 1;
        self.refuses(tx)?;
        self.inner.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.inner.table(family, name)
    }
}

fn service(fx: &mut Fixture, ns: &str, name: &str, i: u32, endpoint: &str) {
    fx.service(
        svc(ns, name)
            .cluster_ip(&format!("172.30.{}.{}", i / 200, 1 + i % 200))
            .port("p80", TCP, 80, 0),
    );
    fx.slice(
        slice(ns, name, &format!("{name}-1"))
            .port("p80", TCP, 80)
            .ep(endpoint, ""),
    );
}

fn port(ns: &str, name: &str) -> ServicePortName {
    ServicePortName::new(ns, name, "p80", verdict_model::Protocol::Tcp)
}

fn sync(fx: &mut Fixture, nft: &mut Poisoned) -> verdict_proxier::SyncResult {
    let now = fx.now;
    fx.proxier.sync(nft, now).expect("the sync succeeds")
}

#[test]
fn a_refused_service_port_is_quarantined_and_the_rest_lands_in_the_same_sync() {
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: Some("bad/svc:p80".into()),
        checks: 0,
    };
    for i in 0..40 {
        service(&mut fx, "good", &format!("svc{i}"), i, "10.0.1.1");
    }
    service(&mut fx, "bad", "svc", 100, "10.0.9.9");

    // A cold sync: everything but the refused port is programmed.
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.quarantined.len(), 1, "{:?}", r.quarantined);
    assert_eq!(r.quarantined[0].0, port("bad", "svc"));
    assert!(
        r.quarantined[0].1.contains("Message too long"),
        "the backend's reason is kept: {:?}",
        r.quarantined[0]
    );
    assert!(
        r.quarantined[0]
            .1
            .contains("element 172.30.0.101 . tcp . 80"),
        "the refused element is named: {:?}",
        r.quarantined[0]
    );
    let dump = nft.inner.dump(Family::Ip, "verdict");
    assert!(!dump.contains("bad/svc"), "{dump}");
    for i in 0..40 {
        assert!(dump.contains(&format!("good/svc{i}:p80")), "svc{i} missing");
    }
    // Bisection: a handful of dry runs for 41 ports, not one per port,
    // then a few for the elements of the one found.
    assert!(nft.checks <= 2 * 7 + 2 + 8, "{} dry runs", nft.checks);
    let quarantine = &fx.proxier.quarantined()[&port("bad", "svc")];
    assert!(
        !quarantine.is_empty() && quarantine.len() <= 2,
        "{quarantine:?}"
    );
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.101", 80);
    assert_ne!(t.output(), "10.0.9.9:80", "{t:?}");
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.1", 80);
    assert_eq!(t.output(), "10.0.1.1:80", "{t:?}");
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    assert_eq!(
        fx.proxier.quarantined().keys().collect::<Vec<_>>(),
        vec![&port("bad", "svc")]
    );

    // Other changes keep landing, at once, without dry runs.
    nft.checks = 0;
    service(&mut fx, "good", "svc3", 3, "10.0.3.3");
    let r = sync(&mut fx, &mut nft);
    assert!(!r.full, "a partial sync");
    assert!(r.quarantined.is_empty());
    assert_eq!(nft.checks, 0, "the quarantined port is not tried again");
    assert!(nft.inner.dump(Family::Ip, "verdict").contains("10.0.3.3"));

    // A full sync does not try it again either.
    fx.proxier.force_full_sync();
    let r = sync(&mut fx, &mut nft);
    assert!(r.full && r.quarantined.is_empty() && r.retried.is_empty());
    assert_eq!(nft.checks, 0);

    // When it changes it is tried again; still refused, still quarantined.
    service(&mut fx, "bad", "svc", 100, "10.0.9.8");
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.retried, vec![port("bad", "svc")]);
    assert_eq!(r.quarantined.len(), 1);
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.101", 80);
    assert_ne!(t.output(), "10.0.9.8:80", "{t:?}");
    std::mem::swap(&mut fx.nft, &mut nft.inner);

    // Once the backend takes it, the next change programs it.
    nft.poison = None;
    service(&mut fx, "bad", "svc", 100, "10.0.9.7");
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.retried, vec![port("bad", "svc")]);
    assert!(r.quarantined.is_empty());
    assert!(fx.proxier.quarantined().is_empty());
    let dump = nft.inner.dump(Family::Ip, "verdict");
    assert!(dump.contains("10.0.9.7"), "{dump}");

    // The table is what a clean proxier with the same services programs,
    // once the jump that partial sync staged has moved into its map.
    fx.now += verdict_proxier::staging::MAX_AGE;
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.unstaged, 1, "{r:?}");
    let dump = nft.inner.dump(Family::Ip, "verdict");
    let mut clean = Fixture::new(IpFamily::V4);
    for i in 0..40 {
        let ep = if i == 3 { "10.0.3.3" } else { "10.0.1.1" };
        service(&mut clean, "good", &format!("svc{i}"), i, ep);
    }
    service(&mut clean, "bad", "svc", 100, "10.0.9.7");
    clean.sync();
    assert_eq!(dump, clean.dump());
}

#[test]
fn a_refused_update_removes_the_service_port_and_nothing_else() {
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: None,
        checks: 0,
    };
    service(&mut fx, "ns", "a", 1, "10.0.1.1");
    service(&mut fx, "ns", "b", 2, "10.0.2.2");
    sync(&mut fx, &mut nft);

    // An update the backend refuses (a second endpoint changes b's
    // dispatch element): the port is withdrawn (quarantined ports are not
    // programmed), the other service's change lands.
    nft.poison = Some("ns/b:p80".into());
    fx.slice(
        slice("ns", "b", "b-1")
            .port("p80", TCP, 80)
            .ep("10.0.2.2", "")
            .ep("10.0.2.3", ""),
    );
    service(&mut fx, "ns", "a", 1, "10.0.1.2");
    let r = sync(&mut fx, &mut nft);
    assert!(!r.full);
    assert_eq!(r.quarantined.len(), 1);
    let dump = nft.inner.dump(Family::Ip, "verdict");
    assert!(dump.contains("10.0.1.2"), "{dump}");
    assert!(!dump.contains("ns/b:p80"), "{dump}");
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.2", 80);
    assert!(!t.output().starts_with("10.0.2."), "{t:?}");
}

/// Two LoadBalancers whose status claims one address and port, with
/// overlapping source ranges (as the real-cluster report had them).
fn two_lbs_on_one_address(fx: &mut Fixture, b_ranges: &[&str]) {
    for (name, ip, ranges, ep) in [
        ("lb1", "172.30.0.1", &["10.0.0.0/8"][..], "10.0.1.1"),
        ("lb2", "172.30.0.2", b_ranges, "10.0.2.2"),
    ] {
        fx.service(
            svc("ns", name)
                .cluster_ip(ip)
                .port("p80", TCP, 80, 30080 + i32::from(name == "lb2"))
                .lb(&["5.6.7.8"])
                .source_ranges(ranges),
        );
        fx.slice(
            slice("ns", name, &format!("{name}-1"))
                .port("p80", TCP, 80)
                .ep(ep, ""),
        );
    }
}

#[test]
fn two_load_balancers_on_one_address_and_port_are_resolved_as_kube_proxy_does() {
    // kube-proxy programs one Service at an address and port and nothing
    // of the other there; both keep their ClusterIPs and NodePorts. The
    // first in name order has it, on every node and every sync.
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: None,
        checks: 0,
    };
    two_lbs_on_one_address(&mut fx, &["10.1.2.3/32", "192.168.0.0/16"]);
    for i in 0..10 {
        service(&mut fx, "other", &format!("s{i}"), 10 + i, "10.0.5.5");
    }
    let r = sync(&mut fx, &mut nft);
    assert!(
        r.quarantined.is_empty(),
        "nothing refused: {:?}",
        r.quarantined
    );
    assert_eq!(nft.checks, 0, "no dry runs: the kernel is never asked");
    let lb2 = ServicePortName::new("ns", "lb2", "p80", verdict_model::Protocol::Tcp);
    let lb1 = ServicePortName::new("ns", "lb1", "p80", verdict_model::Protocol::Tcp);
    assert_eq!(r.conflicts.len(), 1, "{:?}", r.conflicts);
    let c = &r.conflicts[0];
    assert_eq!((&c.loser, &c.winner), (&lb2, &lb1));
    assert_eq!(c.kind, "LoadBalancer IP");
    assert_eq!(c.destination, "5.6.7.8 . tcp . 80");
    let dump = nft.inner.dump(Family::Ip, "verdict");
    assert!(dump.contains("5.6.7.8 . tcp . 80 . 10.0.0.0/8"), "{dump}");
    assert!(
        !dump.contains("10.1.2.3"),
        "lb2's ranges are not lb1's: {dump}"
    );
    assert!(!dump.contains("192.168.0.0/16"), "{dump}");

    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let to = |fx: &Fixture, src: &str, dst: &str, port: u16| {
        fx.trace(verdict_nft::L4Proto::Tcp, src, dst, port).output()
    };
    // Both ClusterIPs and both NodePorts answer.
    assert_eq!(to(&fx, "10.0.0.2", "172.30.0.1", 80), "10.0.1.1:80");
    assert_eq!(to(&fx, "10.0.0.2", "172.30.0.2", 80), "10.0.2.2:80");
    assert_eq!(to(&fx, "203.0.113.9", "192.168.0.2", 30080), "10.0.1.1:80");
    assert_eq!(to(&fx, "203.0.113.9", "192.168.0.2", 30081), "10.0.2.2:80");
    // The LoadBalancer IP is lb1's, with lb1's ranges only.
    assert_eq!(to(&fx, "10.2.0.1", "5.6.7.8", 80), "10.0.1.1:80");
    assert_eq!(to(&fx, "192.168.7.7", "5.6.7.8", 80), "DROP");
    std::mem::swap(&mut fx.nft, &mut nft.inner);

    // Nothing changes, nothing is reported again, also on a rebuild (a
    // Node's labels changing, say).
    let cfg = fx.proxier.config().clone();
    fx.proxier.set_config(cfg).unwrap();
    let r = sync(&mut fx, &mut nft);
    assert!(
        r.conflicts.is_empty() && r.conflicts_resolved.is_empty(),
        "{r:?}"
    );
    assert_eq!(fx.proxier.conflicts().count(), 1);

    // lb1 goes: lb2 takes the address, with its own ranges, in a partial
    // sync; the conflict ends.
    fx.delete_service("ns", "lb1");
    let r = sync(&mut fx, &mut nft);
    assert!(!r.full);
    assert_eq!(r.conflicts_resolved.len(), 1, "{r:?}");
    assert_eq!(fx.proxier.conflicts().count(), 0);
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    assert_eq!(to(&fx, "192.168.7.7", "5.6.7.8", 80), "10.0.2.2:80");
    assert_eq!(to(&fx, "10.1.2.3", "5.6.7.8", 80), "10.0.2.2:80");
    assert_eq!(to(&fx, "10.2.0.1", "5.6.7.8", 80), "DROP");
    std::mem::swap(&mut fx.nft, &mut nft.inner);

    // The table is what a proxier that only ever saw lb2 programs, once
    // the jumps that partial sync staged have moved into their maps.
    fx.now += verdict_proxier::staging::MAX_AGE;
    let r = sync(&mut fx, &mut nft);
    assert!(!r.full && r.unstaged > 0, "{r:?}");
    let mut clean = Fixture::new(IpFamily::V4);
    two_lbs_on_one_address(&mut clean, &["10.1.2.3/32", "192.168.0.0/16"]);
    for i in 0..10 {
        service(&mut clean, "other", &format!("s{i}"), 10 + i, "10.0.5.5");
    }
    clean.delete_service("ns", "lb1");
    clean.sync();
    assert_eq!(nft.inner.dump(Family::Ip, "verdict"), clean.dump());
}

#[test]
fn a_refused_element_leaves_out_only_itself() {
    // The kernel refuses one external IP's element: the port's ClusterIP
    // and NodePort keep working, the message names that element, and a
    // new configuration (a Node's labels) does not try it again; a change
    // of the Service does.
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: Some("1.2.3.4 . tcp . 80".into()),
        checks: 0,
    };
    let web = |fx: &mut Fixture, ep: &str| {
        fx.service(
            svc("ns", "web")
                .cluster_ip("172.30.0.7")
                .port("p80", TCP, 80, 30007)
                .external_ips(&["1.2.3.4", "1.2.3.5"]),
        );
        fx.slice(slice("ns", "web", "web-1").port("p80", TCP, 80).ep(ep, ""));
    };
    web(&mut fx, "10.0.7.7");
    service(&mut fx, "ns", "other", 9, "10.0.9.9");
    let r = sync(&mut fx, &mut nft);
    let web_port = port("ns", "web");
    assert_eq!(r.quarantined.len(), 1, "{:?}", r.quarantined);
    assert_eq!(r.quarantined[0].0, web_port);
    let reason = &r.quarantined[0].1;
    assert!(
        reason.contains("service-ips element 1.2.3.4 . tcp . 80 : goto"),
        "{reason}"
    );
    assert_eq!(fx.proxier.quarantined()[&web_port].len(), 1);
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let to = |fx: &Fixture, src: &str, dst: &str, port: u16| {
        fx.trace(verdict_nft::L4Proto::Tcp, src, dst, port).output()
    };
    assert_eq!(to(&fx, "10.0.0.2", "172.30.0.7", 80), "10.0.7.7:80");
    assert_eq!(to(&fx, "203.0.113.9", "192.168.0.2", 30007), "10.0.7.7:80");
    assert_eq!(to(&fx, "203.0.113.9", "1.2.3.5", 80), "10.0.7.7:80");
    assert_ne!(to(&fx, "203.0.113.9", "1.2.3.4", 80), "10.0.7.7:80");
    std::mem::swap(&mut fx.nft, &mut nft.inner);

    // A new configuration rebuilds everything, without trying it again.
    nft.checks = 0;
    let cfg = fx.proxier.config().clone();
    fx.proxier.set_config(cfg).unwrap();
    let r = sync(&mut fx, &mut nft);
    assert!(r.quarantined.is_empty() && r.retried.is_empty(), "{r:?}");
    assert_eq!(nft.checks, 0);
    assert_eq!(fx.proxier.quarantined()[&web_port].len(), 1);

    // A change of the Service tries it again.
    nft.poison = None;
    web(&mut fx, "10.0.7.8");
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.retried, vec![web_port]);
    assert!(fx.proxier.quarantined().is_empty());
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    assert_eq!(to(&fx, "203.0.113.9", "1.2.3.4", 80), "10.0.7.8:80");
}

#[test]
fn a_refused_firewall_element_closes_its_destination() {
    // Were the firewall element of a LoadBalancer left out and its
    // dispatch kept, the address would be open to every source.
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: Some("firewall-ips=5.6.7.8".into()),
        checks: 0,
    };
    fx.service(
        svc("ns", "lb")
            .cluster_ip("172.30.0.9")
            .port("p80", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&["203.0.113.0/24"]),
    );
    fx.slice(
        slice("ns", "lb", "lb-1")
            .port("p80", TCP, 80)
            .ep("10.0.1.1", ""),
    );
    let r = sync(&mut fx, &mut nft);
    assert_eq!(r.quarantined.len(), 1, "{:?}", r.quarantined);
    assert!(
        r.quarantined[0].1.contains("firewall-ips element"),
        "{:?}",
        r.quarantined
    );
    std::mem::swap(&mut fx.nft, &mut nft.inner);
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "198.51.100.1", "5.6.7.8", 80);
    assert_ne!(
        t.output(),
        "10.0.1.1:80",
        "open to a source outside the ranges: {t:?}"
    );
}

#[test]
fn names_at_kubernetes_maximum_lengths_are_programmed() {
    // A 63-character namespace and name and a 15-character port name make
    // a 143-byte comment, longer than nft stores.
    let ns = format!("n{}", "s".repeat(62));
    let mut fx = Fixture::new(IpFamily::V4);
    for (i, last) in ["a", "b"].iter().enumerate() {
        let name = format!("{}{last}", "x".repeat(62));
        let port_name = "p".repeat(15);
        fx.service(
            svc(&ns, &name)
                .cluster_ip(&format!("172.30.0.{}", i + 1))
                .port(&port_name, TCP, 80, 0),
        );
        fx.slice(
            slice(&ns, &name, &format!("{name}-1"))
                .port(&port_name, TCP, 80)
                .ep("10.0.1.1", ""),
        );
    }
    let r = fx.sync();
    assert!(r.quarantined.is_empty());
    let dump = fx.dump();
    let comments: Vec<&str> = dump
        .lines()
        .flat_map(|l| l.split("comment \"").skip(1))
        .filter_map(|c| c.split('"').next())
        .filter(|c| c.starts_with(&ns))
        .collect();
    assert!(!comments.is_empty(), "{dump}");
    assert!(comments.iter().all(|c| c.len() <= 128), "{comments:?}");
    let distinct: std::collections::BTreeSet<&&str> = comments.iter().collect();
    assert_eq!(
        distinct.len(),
        2,
        "two services keep two comments: {comments:?}"
    );
}

#[test]
fn a_full_sync_of_a_table_that_is_as_it_should_be_sends_nothing() {
    let mut fx = Fixture::new(IpFamily::V4);
    for i in 0..5 {
        service(&mut fx, "ns", &format!("s{i}"), i, "10.0.1.1");
    }
    fx.service(
        svc("ns", "lb")
            .cluster_ip("172.30.1.1")
            .port("p80", TCP, 80, 30080)
            .lb(&["5.6.7.8"])
            .source_ranges(&["10.0.0.0/8"])
            .etp_local()
            .affinity(100),
    );
    fx.slice(
        slice("ns", "lb", "lb-1")
            .port("p80", TCP, 80)
            .ep("10.0.1.1", "")
            .ep("10.0.1.2", ""),
    );
    fx.sync();
    let dump = fx.dump();
    let before = fx.nft.transactions();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(r.operations, 0, "nothing differs, nothing is sent");
    assert_eq!(fx.nft.transactions(), before);

    // A chain someone emptied is rewritten, and only it.
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.flush_chain("services");
    fx.nft.run(&tx).unwrap();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert_eq!(fx.dump(), dump);
    assert!(
        r.operations > 0 && r.operations < 10,
        "{} operations",
        r.operations
    );

    // A deleted element is put back.
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.delete_element(
        "cluster-ips",
        vec![verdict_nft::Value::Addr("172.30.0.1".parse().unwrap())],
    );
    fx.nft.run(&tx).unwrap();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert_eq!(r.operations, 1);
    assert_eq!(fx.dump(), dump);
}

#[test]
fn a_proxier_on_a_fresh_backend_is_not_blamed_on_services() {
    // Sanity: with nothing refused, nothing is quarantined and no dry run
    // happens.
    let mut fx = Fixture::new(IpFamily::V4);
    let mut nft = Poisoned {
        inner: MemoryBackend::new(),
        poison: Some("nobody".into()),
        checks: 0,
    };
    service(&mut fx, "ns", "a", 1, "10.0.1.1");
    let r = sync(&mut fx, &mut nft);
    assert!(r.quarantined.is_empty());
    assert_eq!(nft.checks, 0);
}

#[test]
fn a_load_balancer_whose_source_ranges_cannot_be_parsed_is_closed() {
    // `10.0.0.0/33` is no range: the LoadBalancer is firewalled to the
    // ranges that are valid (none here), never left open to every source.
    let mut fx = Fixture::new(IpFamily::V4);
    fx.service(
        svc("ns", "lb")
            .cluster_ip("172.30.0.9")
            .port("p80", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&["10.0.0.0/33"]),
    );
    fx.slice(
        slice("ns", "lb", "lb-1")
            .port("p80", TCP, 80)
            .ep("10.0.1.1", ""),
    );
    fx.sync();
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "203.0.113.9", "5.6.7.8", 80);
    assert_eq!(t.output(), "DROP", "{t:?}");
    // A valid range next to it is allowed, and only it.
    fx.service(
        svc("ns", "lb")
            .cluster_ip("172.30.0.9")
            .port("p80", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&["10.0.0.0/33", "203.0.113.0/24"]),
    );
    fx.sync();
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "203.0.113.9", "5.6.7.8", 80);
    assert_eq!(t.output(), "10.0.1.1:80", "{t:?}");
    let t = fx.trace(verdict_nft::L4Proto::Tcp, "198.51.100.1", "5.6.7.8", 80);
    assert_eq!(t.output(), "DROP", "{t:?}");
}
