//! The in-memory backend and the kernel agree: two proxiers get the same
//! events, one programs `MemoryBackend`, the other real nftables in a
//! network namespace; after every sync the kernel's table, read back with
//! `nft -j list table`, equals the in-memory one. This exercises every kind
//! of transaction the proxier sends (cold and partial syncs, element
//! replacement, new shared chains, stale-chain deletion, restarts, table
//! replacement) against the real kernel. Needs root.
//!
//! Compared after normalising only what nft 1.0.6 does not list back:
//! table and chain comments, and `typeof tcp dport` (listed as inet_service).
//!
//! Every test runs on both kernel backends, and each table is read back by
//! both: by the backend that wrote it and by the other one. So the netlink
//! backend must write what nft reads (comments, `typeof` declarations and
//! byte orders, which live in nft's user data) and read what nft writes,
//! and that reader is compared without normalising anything but the data
//! path's own entries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use verdict_conformance::*;
use verdict_e2e::netns::{Netns, can_run, unique_prefix};
use verdict_e2e::runner::node_config;
use verdict_model::{EndpointSlice, IpFamily, Service};
use verdict_nft::{Backend, DataType, Family, MemoryBackend, NetlinkBackend, NftCli, TableState};
use verdict_proxier::Proxier;

/// Which kernel backend programs the table.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Nft,
    Netlink,
}

/// Only what the data path adds: dynamic entries.
fn without_dynamic(mut t: TableState) -> TableState {
    for s in t.sets.values_mut() {
        if s.set.timeout.is_some() {
            s.elements.clear();
        }
    }
    t
}

fn normalize(mut t: TableState) -> TableState {
    t.comment = None;
    for c in t.chains.values_mut() {
        c.chain.comment = None;
    }
    for s in t.sets.values_mut() {
        for ty in s.set.key.iter_mut().chain(s.set.value.iter_mut().flatten()) {
            if matches!(ty, DataType::PortOf(_)) {
                *ty = DataType::InetService;
            }
        }
        // Dynamic entries are written by the data path, not by us.
        if s.set.timeout.is_some() {
            s.elements.clear();
        }
    }
    t
}

/// A kernel backend of `kind` in the namespace `ns`, knowing nothing yet.
fn open(kind: Kind, ns: &str) -> Box<dyn Backend> {
    match kind {
        Kind::Nft => Box::new(NftCli::in_netns(ns).unwrap()),
        Kind::Netlink => Box::new(NetlinkBackend::in_netns(ns).unwrap()),
    }
}

/// Two proxiers, one per backend, fed the same events.
struct Twin {
    ns: Netns,
    kernel: Box<dyn Backend>,
    nft: NftCli,
    netlink: NetlinkBackend,
    memory: MemoryBackend,
    k: Proxier,
    m: Proxier,
    family: Family,
    start: Instant,
    syncs: usize,
}

impl Twin {
    fn new(scenario: &Scenario, kind: Kind) -> Twin {
        let ns = Netns::create(&format!("{}-fvk", unique_prefix())).unwrap();
        let kernel = open(kind, ns.name());
        let nft = NftCli::in_netns(ns.name()).unwrap();
        let netlink = NetlinkBackend::in_netns(ns.name()).unwrap();
        let mut cfg = node_config(scenario).unwrap();
        // With the flow stream: its rate-limited log rules too.
        cfg.flow_log_group = Some(7331);
        let family = cfg.nft_family();
        Twin {
            ns,
            kernel,
            nft,
            netlink,
            memory: MemoryBackend::new(),
            k: Proxier::new(cfg.clone()).unwrap(),
            m: Proxier::new(cfg).unwrap(),
            family,
            start: Instant::now(),
            syncs: 0,
        }
    }

    fn service(&mut self, prev: Option<&Service>, cur: Option<&Service>) {
        self.k.on_service(prev, cur);
        self.m.on_service(prev, cur);
    }

    fn slice(&mut self, s: &EndpointSlice, removed: bool) {
        self.k.on_endpoint_slice(s, removed);
        self.m.on_endpoint_slice(s, removed);
    }

    fn sync(&mut self, context: &str) {
        self.sync_checking(context, true);
    }

    fn sync_checking(&mut self, context: &str, same_size: bool) {
        self.sync_only(context, same_size);
        self.compare(context);
    }

    fn sync_only(&mut self, context: &str, same_size: bool) {
        self.syncs += 1;
        let now = self.start + Duration::from_millis(700 * self.syncs as u64);
        let rk = self
            .k
            .sync(self.kernel.as_mut(), now)
            .unwrap_or_else(|e| panic!("{context}: kernel sync: {e}"));
        let rm = self.m.sync(&mut self.memory, now).unwrap();
        if same_size {
            assert_eq!(
                rk.operations, rm.operations,
                "{context}: same transaction size"
            );
        }
    }

    fn compare(&mut self, context: &str) {
        let want = self
            .memory
            .get(self.family, "verdict")
            .cloned()
            .unwrap_or_default();
        let by_nft = self
            .nft
            .table(self.family, "verdict")
            .unwrap()
            .unwrap_or_default();
        self.same(
            &format!("{context} (read by nft)"),
            normalize(by_nft).dump(self.family, "verdict"),
            normalize(want.clone()).dump(self.family, "verdict"),
        );
        let by_netlink = self
            .netlink
            .table(self.family, "verdict")
            .unwrap_or_else(|e| panic!("{context}: netlink read: {e}"))
            .unwrap_or_default();
        self.same(
            &format!("{context} (read over netlink)"),
            without_dynamic(by_netlink).dump(self.family, "verdict"),
            without_dynamic(want).dump(self.family, "verdict"),
        );
    }

    fn same(&self, context: &str, got: String, want: String) {
        if got != want {
            let g: Vec<&str> = got.lines().collect();
            let w: Vec<&str> = want.lines().collect();
            let mut diff: Vec<String> = w
                .iter()
                .filter(|l| !g.contains(l))
                .map(|l| format!("- {l}"))
                .collect();
            diff.extend(
                g.iter()
                    .filter(|l| !w.contains(l))
                    .map(|l| format!("+ {l}")),
            );
            panic!(
                "{context}: kernel differs from the in-memory backend in {}:\n{}",
                self.ns.name(),
                diff.join("\n")
            );
        }
    }
}

#[test]
fn every_conformance_scenario_programs_the_same_state() {
    every_scenario(Kind::Nft);
}

#[test]
fn every_conformance_scenario_programs_the_same_state_over_netlink() {
    every_scenario(Kind::Netlink);
}

fn every_scenario(kind: Kind) {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    for s in upstream_scenarios() {
        let mut t = Twin::new(&s, kind);
        for event in s.setup.events() {
            match event {
                Event::Service(prev, cur) => t.service(prev.as_deref(), cur.as_deref()),
                Event::Slice(sl, removed) => t.slice(&sl, removed),
                Event::Sync => t.sync(&s.name),
            }
        }
        // The jumps the scenario's partial syncs staged move into their
        // maps when due, on both sides alike.
        if t.k.compaction_due().is_some() {
            t.syncs += 100;
            t.sync(&format!("{}: staging moved into the maps", s.name));
            assert_eq!(t.k.compaction_due(), None, "{}", s.name);
        }
        // A full resync of a table that is as it should be, read back from
        // the kernel, sends nothing: every chain's rules compare equal.
        let now = t.start + Duration::from_secs(3600);
        t.k.force_full_sync();
        let r = t.k.sync(t.kernel.as_mut(), now).unwrap();
        assert!(r.full);
        assert!(
            r.operations == 0,
            "{}: a full resync with nothing to repair sent {} operations",
            s.name,
            r.operations
        );
    }
}

/// A small deterministic generator (no dependency needed for this).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn churn_service(i: u64, r: &mut Lcg) -> (Service, EndpointSlice) {
    let ip = format!("172.30.1.{}", i + 1);
    let (proto, port) = [(TCP, 80), (UDP, 53), (TCP, 443)][r.next(3) as usize];
    let mut s = svc("ns", &format!("s{i}"))
        .cluster_ip(&ip)
        .port("p", proto, port, 0);
    match r.next(6) {
        0 => {
            s = s
                .kind(verdict_model::ServiceType::NodePort)
                .port("np", TCP, 8080, 30000 + i as i32)
        }
        1 => {
            s = s
                .lb(&[&format!("1.2.3.{}", i + 1)])
                .port("lb", TCP, 8443, 31000 + i as i32)
                .etp_local()
        }
        2 => {
            s = s
                .lb(&[&format!("5.6.7.{}", i + 1)])
                .source_ranges(&["203.0.113.0/25", "192.168.0.0/24"])
        }
        3 => {
            s = s
                .affinity(60 + 60 * r.next(3) as i32)
                .external_ips(&[&format!("192.168.99.{}", 100 + i)])
        }
        4 => s = s.itp_local(),
        _ => {}
    }
    let mut sl = slice("ns", &format!("s{i}"), &format!("s{i}-1")).port("p", proto, port + 1000);
    sl = sl.port("np", TCP, 9080).port("lb", TCP, 9443);
    for e in 0..r.next(4) {
        let node = if r.next(2) == 0 { NODE } else { "other" };
        sl = sl.ep(&format!("10.{}.{}.{}", 180 + e, i / 200, i % 200 + 1), node);
    }
    (s, sl)
}

#[test]
fn partial_syncs_restarts_and_replacement_agree_with_the_kernel() {
    churn(Kind::Nft);
}

#[test]
fn partial_syncs_restarts_and_replacement_agree_with_the_kernel_over_netlink() {
    churn(Kind::Netlink);
}

fn churn(kind: Kind) {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let scenario = Scenario {
        name: "churn".into(),
        setup: Setup::new(IpFamily::V4),
        flows: Vec::new(),
    };
    let mut t = Twin::new(&scenario, kind);
    let mut r = Lcg(7);
    let mut live: std::collections::BTreeMap<u64, (Service, EndpointSlice)> = Default::default();
    for round in 0..25 {
        for _ in 0..4 {
            let i = r.next(12);
            match (live.remove(&i), r.next(4)) {
                (Some((s, sl)), 0) => {
                    t.service(Some(&s), None);
                    t.slice(&sl, true);
                }
                (prev, _) => {
                    let (s, sl) = churn_service(i, &mut r);
                    t.service(prev.as_ref().map(|p| &p.0), Some(&s));
                    t.slice(&sl, false);
                    live.insert(i, (s, sl));
                }
            }
        }
        if round % 9 == 8 {
            t.k.force_full_sync();
            t.m.force_full_sync();
        }
        t.sync(&format!("churn round {round}"));
    }
    // A restarted proxier adopts the kernel's table without changing it.
    let cfg = t.k.config().clone();
    t.k = Proxier::new(cfg.clone()).unwrap();
    t.m = Proxier::new(cfg).unwrap();
    for (s, sl) in live.values() {
        t.service(None, Some(s));
        t.slice(sl, false);
    }
    let before = t.kernel.table(t.family, "verdict").unwrap();
    t.sync("restart");
    assert_eq!(
        normalize(t.kernel.table(t.family, "verdict").unwrap().unwrap()),
        normalize(before.unwrap()),
        "restart changed the kernel's table"
    );
    // Something we cannot read in our table: the kernel side replaces the
    // whole table in one transaction (the in-memory side has nothing to
    // replace, so only the resulting state is compared).
    t.ns.exec("nft", &["add rule ip verdict services counter"])
        .unwrap();
    // And a set of a type verdict never writes, which neither reader
    // understands: the backend still replaces the table.
    t.ns.exec("nft", &["add set ip verdict foreign { type ether_addr ; }"])
        .unwrap();
    // A backend that has not read the table yet (a restarted verdict).
    t.kernel = open(kind, t.ns.name());
    t.k.force_full_sync();
    t.m.force_full_sync();
    t.sync_only("replace unreadable table", false);
    // The in-memory side still has emptied chains waiting to be deleted
    // (after the compaction that removes their staging rules); once they
    // are, both agree.
    t.syncs += 100;
    t.sync_only("settle", false);
    t.sync_only("settle", false);
    t.sync_checking("after replacement", false);
}
