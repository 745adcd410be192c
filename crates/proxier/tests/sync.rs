//! Full and partial syncs: exact operation counts (in the spirit of
//! kube-proxy's TestSyncProxyRulesRepeated), stale-chain retirement,
//! recovery after failures, and adopting an existing table on restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use verdict_model::IpFamily;
use verdict_nft::{
    Backend, Chain, Element, Expr, Family, MemoryBackend, NftError, Rule, TableState, Transaction,
    Value,
};
use verdict_proxier::{Proxier, REMOVE_STALE_CHAINS_AFTER};

fn one_ep(fx: &mut Fixture, ns: &str, name: &str, ip: &str, port: u16, eps: &[&str]) {
    fx.service(
        svc(ns, name)
            .cluster_ip(ip)
            .port(&format!("p{port}"), TCP, port as i32, 0),
    );
    let mut s = slice(ns, name, &format!("{name}-1")).port(&format!("p{port}"), TCP, port as i32);
    for ep in eps {
        s = s.ep(ep, "");
    }
    fx.slice(s);
}

/// ns1/svc1 on 172.30.0.41:80, two endpoints: the cluster most tests start from.
fn svc1_two_endpoints(fx: &mut Fixture) {
    one_ep(
        fx,
        "ns1",
        "svc1",
        "172.30.0.41",
        80,
        &["10.0.1.1", "10.0.1.2"],
    );
}

fn chains(fx: &Fixture) -> Vec<String> {
    fx.nft
        .get(Family::Ip, "verdict")
        .unwrap()
        .chains
        .keys()
        .filter(|c| c.parse::<verdict_proxier::layout::DynChain>().is_ok())
        .cloned()
        .collect()
}

#[test]
fn partial_syncs_emit_only_what_changed() {
    let mut fx = Fixture::new(IpFamily::V4);
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    one_ep(&mut fx, "ns2", "svc2", "172.30.0.42", 8080, &["10.0.2.1"]);
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(chains(&fx), ["endpoints-1"]);

    // Add a service with one endpoint: cluster-ips, one service-endpoints
    // slot (no Service is counted per element by default), and its jump
    // staged (its key in staged-service-ips and in the set of its chain):
    // nothing adds a jump, so the kernel validates nothing. The shared
    // chain endpoints-1 already exists.
    one_ep(&mut fx, "ns3", "svc3", "172.30.0.43", 80, &["10.0.3.1"]);
    let r = fx.sync();
    assert!(!r.full);
    assert_eq!(r.operations, 4, "add service");
    assert_eq!(r.staged, 1);
    let t = fx.nft.get(Family::Ip, "verdict").unwrap();
    assert_eq!(t.sets["service-ips"].elements.len(), 2);
    assert_eq!(t.sets["staged-service-ips"].elements.len(), 1);
    assert_eq!(t.sets["staged-service-ips-endpoints-1"].elements.len(), 1);
    let tr = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.43", 80);
    assert_eq!(tr.output(), "10.0.3.1:80", "{tr:?}");

    // Delete a service: its three elements go.
    fx.delete_service("ns2", "svc2")
        .delete_slice("ns2", "svc2-1");
    assert_eq!(fx.sync().operations, 3, "delete service");

    // A service without endpoints: cluster-ips, and its no-endpoint-services
    // jump staged (two elements).
    one_ep(&mut fx, "ns4", "svc4", "172.30.0.44", 80, &[]);
    assert_eq!(fx.sync().operations, 1 + 2, "service without endpoints");
    assert!(fx.dump().contains(
        "add element ip verdict staged-no-endpoint-services-reject-chain { 172.30.0.44 . tcp . 80 comment \"ns4/svc4:p80\" }"
    ));
    let tr = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.44", 80);
    assert_eq!(tr.output(), "REJECT", "{tr:?}");

    // It gets an endpoint: the staged no-endpoint jump out, the dispatch
    // staged and the slot in.
    one_ep(&mut fx, "ns4", "svc4", "172.30.0.44", 80, &["10.0.4.1"]);
    assert_eq!(fx.sync().operations, 2 + 2 + 1, "first endpoint");

    // Replace svc3's endpoint: one slot changes value (delete + add).
    one_ep(&mut fx, "ns3", "svc3", "172.30.0.43", 80, &["10.0.3.2"]);
    assert_eq!(fx.sync().operations, 2, "endpoint replaced");

    // A second endpoint: the new shared chain endpoints-2 is created (add
    // chain + 6 rules), which makes the kernel validate the table anyway,
    // so the staged jumps move into their maps: endpoints-2's staging set
    // is added and the staging chain rewritten (flush + 2 rules); svc3's
    // dispatch, staged, moves to endpoints-2 in service-ips (2 deletes, 1
    // add), and svc4's too (2 deletes, 1 add); slot 1 is added.
    one_ep(
        &mut fx,
        "ns3",
        "svc3",
        "172.30.0.43",
        80,
        &["10.0.3.2", "10.0.3.3"],
    );
    let r = fx.sync();
    assert_eq!(r.operations, 7 + 1 + 3 + 3 + 3 + 1, "second endpoint");
    assert_eq!((r.staged, r.unstaged), (0, 2));
    assert_eq!(chains(&fx), ["endpoints-1", "endpoints-2"]);

    // Scale to zero: dispatch and both slots out, reject staged (two
    // elements); endpoints-2 is no longer used, so it is flushed (and
    // deleted later).
    one_ep(&mut fx, "ns3", "svc3", "172.30.0.43", 80, &[]);
    assert_eq!(fx.sync().operations, 3 + 2 + 1, "scale to zero");

    // Back at once: the chain, emptied but not yet deleted, is refilled
    // (add + 6 rules; it is already empty), plus the elements.
    one_ep(
        &mut fx,
        "ns3",
        "svc3",
        "172.30.0.43",
        80,
        &["10.0.3.2", "10.0.3.3"],
    );
    // The refilled chain's rules validate the table: the staged reject
    // goes (two deletes), the dispatch goes straight into service-ips.
    let r = fx.sync();
    assert_eq!(r.operations, 2 + 1 + 2 + 7, "scale back");
    assert_eq!(r.stale_chains_deleted, 0);

    // Nothing changed: nothing is sent.
    let before = fx.nft.transactions();
    let r = fx.sync();
    assert_eq!(r.operations, 0, "no-op sync");
    assert_eq!(fx.nft.transactions(), before, "no transaction at all");

    // Scale down to one endpoint: endpoints-2 goes stale again, and is
    // deleted by a separate transaction once it has been empty long enough.
    // The dispatch to endpoints-1 is staged (delete + 2 adds).
    one_ep(&mut fx, "ns3", "svc3", "172.30.0.43", 80, &["10.0.3.2"]);
    assert_eq!(fx.sync().operations, 3 + 1 + 1, "scale down");
    fx.advance(REMOVE_STALE_CHAINS_AFTER / 2);
    assert_eq!(fx.sync().stale_chains_deleted, 0, "too early");
    // endpoints-2 keeps its staging rule until the compaction: the
    // staging chain rewritten (flush + 1 rule), endpoints-2's staging set
    // deleted, svc3's dispatch moved (2 deletes, 1 add).
    fx.advance(REMOVE_STALE_CHAINS_AFTER);
    let r = fx.sync();
    assert_eq!((r.stale_chains_deleted, r.operations), (0, 0));
    fx.advance(verdict_proxier::staging::QUIET);
    let r = fx.sync();
    assert_eq!((r.stale_chains_deleted, r.operations), (0, 2 + 1 + 3));
    assert_eq!(fx.proxier.compaction_due(), None);
    // Deleted in a later transaction than the one that removed its rule.
    fx.advance(REMOVE_STALE_CHAINS_AFTER);
    let r = fx.sync();
    assert_eq!((r.stale_chains_deleted, r.operations), (1, 0));
    assert_eq!(chains(&fx), ["endpoints-1"]);
}

#[test]
fn a_full_sync_of_an_unchanged_cluster_changes_nothing() {
    let mut fx = Fixture::new(IpFamily::V4);
    svc1_two_endpoints(&mut fx);
    fx.sync();
    let dump = fx.dump();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(fx.dump(), dump);
    // After an hour the sync is full again by itself.
    fx.advance(verdict_proxier::FULL_SYNC_PERIOD);
    assert!(fx.sync().full);
    assert_eq!(fx.dump(), dump);
}

#[test]
fn a_repair_programs_what_is_known_without_computing_it_again() {
    let mut fx = Fixture::new(IpFamily::V4);
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    one_ep(&mut fx, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.1"]);
    let first = fx.sync();
    assert_eq!(
        first.recomputed_ports, 2,
        "the first sync computes every port"
    );
    let dump = fx.dump();

    // Someone deletes the table: the full sync that follows puts it back
    // from what the proxier knows, computing no contribution.
    let mut wipe = Transaction::new(Family::Ip, "verdict");
    wipe.delete_table();
    fx.nft.run(&wipe).unwrap();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(r.recomputed_ports, 0);
    assert!(r.operations > 0);
    assert_eq!(fx.dump(), dump);

    // A change during a repair is computed, and only it.
    one_ep(&mut fx, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.2"]);
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(r.recomputed_ports, 1);
    let mut fresh = Fixture::new(IpFamily::V4);
    one_ep(&mut fresh, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    one_ep(&mut fresh, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.2"]);
    fresh.sync();
    assert_eq!(fx.dump(), fresh.dump());

    // A new configuration, a forced rebuild and the hourly sync compute
    // every port again.
    let cfg = fx.proxier.config().clone();
    fx.proxier.set_config(cfg).unwrap();
    assert_eq!(fx.sync().recomputed_ports, 2);
    fx.proxier.force_rebuild();
    assert_eq!(fx.sync().recomputed_ports, 2);
    fx.advance(verdict_proxier::FULL_SYNC_PERIOD);
    let r = fx.sync();
    assert!(r.full);
    assert_eq!(r.recomputed_ports, 2);
    assert_eq!(fx.dump(), fresh.dump());
}

/// A proxier over a [`Flaky`] backend that has synced `ns1/svc1`, which
/// has no endpoints yet.
fn svc1_without_endpoints() -> (Proxier, Flaky, std::time::Instant) {
    let mut p = Proxier::new(upstream_config(IpFamily::V4)).unwrap();
    let mut nft = Flaky {
        inner: MemoryBackend::new(),
        fail_next: false,
        fail_read: false,
    };
    let t0 = std::time::Instant::now();
    p.on_service(
        None,
        Some(
            &svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .port("p80", TCP, 80, 0),
        ),
    );
    p.sync(&mut nft, t0).unwrap();
    (p, nft, t0)
}

/// `ns1/svc1`'s one endpoint.
fn svc1_slice() -> verdict_model::EndpointSlice {
    slice("ns1", "svc1", "svc1-1")
        .port("p80", TCP, 80)
        .ep("10.0.1.1", "")
}

/// The table a fresh proxier programs for `ns1/svc1` with that endpoint.
fn svc1_with_endpoint_cold() -> String {
    let mut fresh = Fixture::new(IpFamily::V4);
    one_ep(&mut fresh, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    fresh.sync();
    fresh.dump()
}

#[test]
fn changes_taken_by_a_sync_that_failed_before_computing_them_are_not_lost() {
    let (mut p, mut nft, t0) = svc1_without_endpoints();

    // The endpoints arrive with a full sync whose read-back fails: the
    // sync takes them from the tracker, then fails before computing them.
    p.on_endpoint_slice(&svc1_slice(), false);
    p.force_full_sync();
    nft.fail_read = true;
    assert!(p.sync(&mut nft, t0).is_err());
    assert_eq!(p.pending_endpoint_changes(), 0, "the change was taken");

    // The next sync computes everything again, the lost change with it.
    let r = p.sync(&mut nft, t0).unwrap();
    assert!(r.full);
    assert_eq!(r.recomputed_ports, 1);
    assert_eq!(
        nft.inner.dump(Family::Ip, "verdict"),
        svc1_with_endpoint_cold()
    );
}

/// A backend that refuses the next transaction (`fail_next`), or fails
/// the next read of the table (`fail_read`).
struct Flaky {
    inner: MemoryBackend,
    fail_next: bool,
    fail_read: bool,
}

impl Backend for Flaky {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(NftError::Refused("injected failure".into()));
        }
        self.inner.run(tx)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.inner.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        if std::mem::take(&mut self.fail_read) {
            return Err(NftError::Refused("injected read failure".into()));
        }
        self.inner.table(family, name)
    }
}

#[test]
fn a_failed_partial_sync_is_retried_in_full_in_the_same_sync() {
    let (mut p, mut nft, t0) = svc1_without_endpoints();

    p.on_endpoint_slice(&svc1_slice(), false);
    // A refusal no dry run reproduces is nobody's fault: the sync reads
    // the table back and tries again in full, at once.
    nft.fail_next = true;
    let r = p.sync(&mut nft, t0).unwrap();
    assert!(r.full, "retried as a full sync");
    assert!(r.quarantined.is_empty(), "{:?}", r.quarantined);
    assert_eq!(
        nft.inner.dump(Family::Ip, "verdict"),
        svc1_with_endpoint_cold()
    );
}

/// A backend that always refuses: the sync fails, and the next one is full.
struct Broken(MemoryBackend);

impl Backend for Broken {
    fn run(&mut self, _: &Transaction) -> Result<(), NftError> {
        Err(NftError::Refused("no space left on device".into()))
    }

    fn check(&mut self, _: &Transaction) -> Result<(), NftError> {
        Err(NftError::Refused("no space left on device".into()))
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.0.table(family, name)
    }
}

#[test]
fn a_failure_no_service_explains_fails_the_sync_and_blames_nobody() {
    let mut p = Proxier::new(upstream_config(IpFamily::V4)).unwrap();
    let mut nft = Broken(MemoryBackend::new());
    p.on_service(
        None,
        Some(
            &svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .port("p80", TCP, 80, 0),
        ),
    );
    let err = p.sync(&mut nft, std::time::Instant::now()).unwrap_err();
    assert!(err.to_string().contains("no space left"), "{err}");
    assert!(p.quarantined().is_empty());
    let mut ok = nft.0;
    let r = p.sync(&mut ok, std::time::Instant::now()).unwrap();
    assert!(r.full, "the sync after a failure is full");
    assert!(ok.dump(Family::Ip, "verdict").contains("172.30.0.41"));
}

/// A backend whose table cannot be read back.
struct Unreadable(MemoryBackend);

impl Backend for Unreadable {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.0.run(tx)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.0.check(tx)
    }

    fn table(&mut self, _: Family, _: &str) -> Result<Option<TableState>, NftError> {
        Err(NftError::Parse("unknown expression in chain junk".into()))
    }
}

#[test]
fn an_unreadable_table_is_replaced_in_one_transaction() {
    let mut nft = MemoryBackend::new();
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.add_table(None);
    tx.add_chain(Chain::regular("junk"));
    tx.add_rule("junk", Rule::new(vec![Expr::Reject]));
    nft.run(&tx).unwrap();
    let mut nft = Unreadable(nft);
    let mut p = Proxier::new(upstream_config(IpFamily::V4)).unwrap();
    p.on_service(
        None,
        Some(
            &svc("ns1", "svc1")
                .cluster_ip("172.30.0.41")
                .port("p80", TCP, 80, 0),
        ),
    );
    let before = nft.0.transactions();
    p.sync(&mut nft, std::time::Instant::now()).unwrap();
    assert_eq!(nft.0.transactions(), before + 1, "one atomic transaction");
    let mut fresh = Fixture::new(IpFamily::V4);
    fresh.service(
        svc("ns1", "svc1")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 0),
    );
    fresh.sync();
    assert_eq!(nft.0.dump(Family::Ip, "verdict"), fresh.dump());
}

#[test]
fn a_restarted_proxier_adopts_the_table_without_changing_it() {
    let mut fx = Fixture::new(IpFamily::V4);
    svc1_two_endpoints(&mut fx);
    one_ep(&mut fx, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.1"]);
    fx.sync();
    let dump = fx.dump();
    let forced_full_ops = {
        fx.proxier.force_full_sync();
        fx.sync().operations
    };

    // A new process over the same kernel state, fed the same objects.
    let mut restarted = Fixture::with_config(upstream_config(IpFamily::V4));
    restarted.nft = fx.nft.clone();
    svc1_two_endpoints(&mut restarted);
    one_ep(
        &mut restarted,
        "ns2",
        "svc2",
        "172.30.0.42",
        80,
        &["10.0.2.1"],
    );
    let r = restarted.sync();
    assert!(r.full);
    assert_eq!(restarted.dump(), dump);
    // Only the fixed chains are rewritten: no element is deleted or re-added.
    assert_eq!(r.operations, forced_full_ops);
}

/// svc1 with an endpoint; then (`later`) svc2 with one, svc3 with none.
fn three_services(fx: &mut Fixture, later: bool) {
    if !later {
        one_ep(fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
        return;
    }
    one_ep(fx, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.1"]);
    one_ep(fx, "ns3", "svc3", "172.30.0.43", 80, &[]);
}

#[test]
fn staged_jumps_survive_a_full_resync_and_a_restart_and_junk_in_staging_goes() {
    let mut fx = Fixture::new(IpFamily::V4);
    three_services(&mut fx, false);
    fx.sync();
    // Staged: a new Service, and one with no endpoints (its reject).
    three_services(&mut fx, true);
    let r = fx.sync();
    assert_eq!(r.staged, 2);
    let dump = fx.dump();

    // A full resync reads the staging back as it is: nothing to send.
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert!(r.full);
    assert_eq!((r.operations, r.unstaged), (0, 0), "{r:?}");
    assert_eq!(fx.proxier.staged_elements(), 2);
    assert_eq!(fx.dump(), dump);

    // So does a new process over the same kernel state; it moves them
    // into their maps when due, as the first did.
    let mut restarted = Fixture::new(IpFamily::V4);
    restarted.nft = fx.nft.clone();
    three_services(&mut restarted, false);
    three_services(&mut restarted, true);
    let r = restarted.sync();
    assert!(r.full);
    assert_eq!(r.operations, 0, "{r:?}");
    assert_eq!(restarted.proxier.staged_elements(), 2);
    let due = restarted
        .proxier
        .compaction_due()
        .expect("a compaction is due");
    restarted.now = due;
    let r = restarted.sync();
    assert!(!r.full);
    assert_eq!(r.unstaged, 2);
    assert_eq!(restarted.proxier.compaction_due(), None);
    let mut clean = Fixture::new(IpFamily::V4);
    three_services(&mut clean, false);
    three_services(&mut clean, true);
    clean.sync();
    assert_eq!(restarted.dump(), clean.dump());

    // Junk in the staging sets (a key in a staging set but not behind
    // the gate, a key behind the gate in no staging set, and a staged
    // key nobody wants) goes at the next full sync; svc2, staged again,
    // stays staged.
    one_ep(&mut fx, "ns2", "svc2", "172.30.0.42", 80, &["10.0.2.2"]);
    fx.sync();
    let key = |ip: &str| {
        vec![
            Value::Addr(ip.parse().unwrap()),
            Value::Proto(verdict_nft::L4Proto::Tcp),
            Value::Port(80),
        ]
    };
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.add_element(
        "staged-service-ips-endpoints-1",
        Element::key(key("172.30.9.1")),
    );
    tx.add_element("staged-service-ips", Element::key(key("172.30.9.2")));
    tx.add_element("staged-service-ips", Element::key(key("172.30.9.3")));
    tx.add_element(
        "staged-service-ips-endpoints-1",
        Element::key(key("172.30.9.3")),
    );
    fx.nft.run(&tx).unwrap();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert_eq!(r.operations, 4, "{r:?}");
    let t = fx.nft.get(Family::Ip, "verdict").unwrap();
    let gate: Vec<String> = t.sets["staged-service-ips"]
        .elements
        .keys()
        .map(|k| format!("{}", k[0]))
        .collect();
    assert_eq!(gate, ["172.30.0.42"]);
    assert_eq!(t.sets["staged-service-ips-endpoints-1"].elements.len(), 1);
    let tr = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.42", 80);
    assert_eq!(tr.output(), "10.0.2.2:80", "{tr:?}");
    let tr = fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.43", 80);
    assert_eq!(tr.output(), "REJECT", "{tr:?}");
}

#[test]
fn a_repair_puts_jumps_back_into_their_map_not_into_staging() {
    let mut fx = Fixture::new(IpFamily::V4);
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    fx.sync();
    let dump = fx.dump();
    // Someone empties service-ips.
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.flush_set("service-ips");
    fx.nft.run(&tx).unwrap();
    fx.proxier.force_full_sync();
    let r = fx.sync();
    assert_eq!((r.operations, r.staged), (1, 0), "{r:?}");
    assert_eq!(fx.dump(), dump, "the table as it was");
}

#[test]
fn unknown_chains_in_our_table_are_emptied_then_deleted() {
    let mut fx = Fixture::new(IpFamily::V4);
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.add_table(None);
    tx.add_chain(Chain::regular("service-ULMVA6XW-ns1/svc1/tcp/p80"));
    tx.add_rule(
        "service-ULMVA6XW-ns1/svc1/tcp/p80",
        Rule::new(vec![Expr::Reject]),
    );
    fx.nft.run(&tx).unwrap();
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    fx.sync();
    let t = fx.nft.get(Family::Ip, "verdict").unwrap();
    assert!(
        t.chains["service-ULMVA6XW-ns1/svc1/tcp/p80"]
            .rules
            .is_empty()
    );
    fx.advance(Duration::from_secs(2));
    assert_eq!(fx.sync().stale_chains_deleted, 1);
    assert!(!fx.dump().contains("ULMVA6XW"));
}

#[test]
fn a_set_of_the_wrong_type_is_replaced_on_full_sync() {
    let mut fx = Fixture::new(IpFamily::V4);
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.add_table(None);
    tx.add_set(verdict_nft::Set::set(
        "cluster-ips",
        vec![verdict_nft::DataType::InetService],
    ));
    fx.nft.run(&tx).unwrap();
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    fx.sync();
    assert!(
        fx.dump()
            .contains("add set ip verdict cluster-ips { type ipv4_addr ;")
    );
    assert!(
        fx.dump()
            .contains("add element ip verdict cluster-ips { 172.30.0.41 }")
    );
}

#[test]
fn add_then_delete_before_a_sync_is_a_no_op() {
    let mut fx = Fixture::new(IpFamily::V4);
    fx.sync();
    one_ep(&mut fx, "ns1", "svc1", "172.30.0.41", 80, &["10.0.1.1"]);
    fx.delete_service("ns1", "svc1")
        .delete_slice("ns1", "svc1-1");
    assert_eq!(fx.sync().operations, 0);
}

#[test]
fn shared_chains_do_not_grow_with_services() {
    let mut fx = Fixture::new(IpFamily::V4);
    for i in 0..300u32 {
        let ip: &'static str =
            Box::leak(format!("172.30.{}.{}", i / 250, i % 250 + 1).into_boxed_str());
        let eps: Vec<&'static str> = (0..(i % 3 + 1))
            .map(|e| &*Box::leak(format!("10.{}.{}.{}", e, i / 250, i % 250 + 1).into_boxed_str()))
            .collect();
        one_ep(&mut fx, "ns", &format!("svc{i}"), ip, 80, &eps);
    }
    fx.sync();
    let t = fx.nft.get(Family::Ip, "verdict").unwrap();
    // 27 fixed chains + endpoints-1..3; 22 sets and maps, 9 fixed staging
    // sets and one per shared chain, whatever the size.
    assert_eq!(t.chains.len(), 27 + 3);
    assert_eq!(t.sets.len(), 22 + 9 + 3);
    assert_eq!(t.sets["service-ips"].elements.len(), 300);
    assert_eq!(
        t.sets["service-endpoints-tcp"].elements.len(),
        100 * (1 + 2 + 3)
    );
}

#[test]
fn turning_the_counters_off_or_on_rewrites_the_counting_chains_and_keeps_traffic_flowing() {
    let mut fx = Fixture::new(IpFamily::V4);
    one_ep(
        &mut fx,
        "ns",
        "a",
        "172.30.0.41",
        80,
        &["10.180.0.1", "10.180.0.2"],
    );
    one_ep(&mut fx, "ns", "b", "172.30.0.42", 80, &["10.180.0.3"]);
    fx.sync();
    let before = fx.dump();
    // The node's totals are counted by rules, not by elements: no map
    // has a counter per element unless a Service is chosen for it.
    let counting = |dump: &str| {
        [
            "update @rejected-connections",
            "goto drop-unallocated",
            "ct status dnat counter",
        ]
        .map(|rule| dump.contains(rule))
    };
    assert_eq!(counting(&before), [true; 3], "{before}");
    let t = fx.nft.get(Family::Ip, "verdict").unwrap();
    for set in [
        "service-connections",
        "endpoint-connections",
        "service-traffic",
    ] {
        assert!(t.sets[set].elements.is_empty(), "{set}");
    }
    let flows = |fx: &Fixture| {
        [
            fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.41", 80)
                .output(),
            fx.trace(verdict_nft::L4Proto::Tcp, "10.0.0.2", "172.30.0.42", 80)
                .output(),
        ]
    };
    let want = [
        "10.180.0.1:80, 10.180.0.2:80".to_owned(),
        "10.180.0.3:80".to_owned(),
    ];
    assert_eq!(flows(&fx), want);
    for counters in [false, true] {
        let mut cfg = fx.proxier.config().clone();
        cfg.counters = counters;
        fx.proxier.set_config(cfg).unwrap();
        fx.advance(Duration::from_secs(1));
        fx.sync();
        // The chains that count were written again, the maps kept.
        assert_eq!(flows(&fx), want, "counters {counters}:\n{}", fx.dump());
        assert_eq!(counting(&fx.dump()), [counters; 3], "{}", fx.dump());
        let again = fx.sync();
        assert_eq!(again.operations, 0, "and then nothing is left to do");
    }
    assert_eq!(fx.dump(), before, "back where it started");
}

/// Counts whole-table reads.
struct Reads {
    inner: MemoryBackend,
    reads: usize,
}

impl Backend for Reads {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.inner.run(tx)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.inner.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.reads += 1;
        self.inner.table(family, name)
    }

    fn elements(
        &mut self,
        f: Family,
        t: &str,
        s: &str,
    ) -> Result<Vec<verdict_nft::Element>, NftError> {
        self.inner.elements(f, t, s)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.inner.generation()
    }
}

/// A restart reads the table it adopts before its first sync (while the
/// source loads): the sync uses that read, unless something was committed
/// since, and then it reads again and repairs what changed.
#[test]
fn a_table_read_before_the_first_sync_is_used_unless_a_commit_came_between() {
    let mut fx = Fixture::new(IpFamily::V4);
    svc1_two_endpoints(&mut fx);
    fx.sync();
    let dump = fx.dump();
    for foreign_commit in [false, true] {
        let mut restarted = Fixture::new(IpFamily::V4);
        svc1_two_endpoints(&mut restarted);
        let mut nft = Reads {
            inner: fx.nft.clone(),
            reads: 0,
        };
        restarted.proxier.prefetch_table(&mut nft);
        assert_eq!(nft.reads, 1);
        if foreign_commit {
            // Someone empties the endpoint map after the read.
            let mut tx = Transaction::new(Family::Ip, "verdict");
            tx.flush_set("service-endpoints-tcp");
            nft.inner.run(&tx).unwrap();
            assert_ne!(nft.inner.dump(Family::Ip, "verdict"), dump);
        }
        let now = restarted.now;
        let r = restarted.proxier.sync(&mut nft, now).unwrap();
        assert!(r.full);
        assert_eq!(nft.reads, if foreign_commit { 2 } else { 1 });
        assert_eq!(nft.inner.dump(Family::Ip, "verdict"), dump);
    }
}

/// Service `i` of a cluster of varied shapes: ClusterIP, NodePort and
/// LoadBalancer, Local policies, affinity, no endpoints, 1 to 3 endpoints.
fn varied(fx: &mut Fixture, i: usize) {
    let name = format!("s{i}");
    let ip = format!("172.30.{}.{}", i / 250, 1 + i % 250);
    let node_port = 30000 + (i % 2000) as i32;
    let mut s = svc("ns", &name).cluster_ip(&ip);
    s = match i % 7 {
        0 => s
            .kind(verdict_model::ServiceType::LoadBalancer)
            .port("p", TCP, 80, node_port)
            .lb(&[&format!("198.18.{}.{}", i / 250, 1 + i % 250)])
            .etp_local(),
        1 => s
            .kind(verdict_model::ServiceType::NodePort)
            .port("p", UDP, 53, node_port),
        2 => s.port("p", TCP, 80, 0).affinity(300),
        _ => s.port("p", TCP, 80, 0),
    };
    fx.service(s);
    if i % 5 != 4 {
        let proto = if i % 7 == 1 { UDP } else { TCP };
        let mut sl = slice("ns", &name, &format!("{name}-1")).port("p", proto, 8080);
        for k in 0..1 + i % 3 {
            let node = if k == 0 {
                verdict_conformance::NODE
            } else {
                "other"
            };
            sl = sl.ep(&format!("10.{}.{}.{}", 1 + k, i / 250, 1 + i % 250), node);
        }
        fx.slice(sl);
    }
}

#[test]
fn a_rebuild_of_many_services_programs_what_one_at_a_time_does_and_is_adopted() {
    // 5,000 service ports: a first sync computes them on every core.
    const N: usize = 5_000;
    let mut at_once = Fixture::new(IpFamily::V4);
    for i in 0..N {
        varied(&mut at_once, i);
    }
    at_once.sync();

    // The same cluster built in partial syncs of 250 Services, each
    // computed on this thread.
    let mut in_steps = Fixture::new(IpFamily::V4);
    for i in 0..N {
        varied(&mut in_steps, i);
        if i % 250 == 249 {
            in_steps.sync();
        }
    }
    in_steps.sync();
    // Once the jumps the partial syncs staged are in their maps.
    in_steps.advance(verdict_proxier::staging::MAX_AGE);
    assert!(in_steps.sync().unstaged > 0);
    assert_eq!(at_once.dump(), in_steps.dump());
    // A restarted proxier over that table adopts it as it is.
    let dump = at_once.dump();
    let forced_full_ops = {
        at_once.proxier.force_full_sync();
        at_once.sync().operations
    };
    let mut restarted = Fixture::new(IpFamily::V4);
    restarted.nft = at_once.nft.clone();
    for i in 0..N {
        varied(&mut restarted, i);
    }
    let r = restarted.sync();
    assert!(r.full);
    assert_eq!(r.operations, forced_full_ops);
    assert_eq!(restarted.dump(), dump);

    // Each port's contribution is its own: deleting some Services and
    // changing others withdraws exactly theirs, in both.
    for fx in [&mut at_once, &mut in_steps] {
        for i in (0..N).step_by(10) {
            fx.delete_service("ns", &format!("s{i}"));
        }
        for i in (3..N).step_by(13) {
            let name = format!("s{i}");
            fx.slice(
                slice("ns", &name, &format!("{name}-1"))
                    .port("p", if i % 7 == 1 { UDP } else { TCP }, 8080)
                    .ep(&format!("10.9.{}.{}", i / 250, 1 + i % 250), "other"),
            );
        }
        fx.sync();
    }
    assert_eq!(at_once.dump(), in_steps.dump());
}

/// Everything a proxier says about its Services and their keys, to
/// compare two proxiers that should have recorded the same.
fn recorded(fx: &Fixture, services: usize) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..services {
        let name = verdict_model::NamespacedName::new("ns", format!("s{i}"));
        for (port, intent) in fx.proxier.intent_of(&name) {
            out.push(format!("{port} {intent:?}"));
            for e in intent.elements() {
                let owners = fx.proxier.owners_of(e.set.name(), &e.element.key);
                out.push(format!("{} {:?} {owners:?}", e.set, e.element.key));
            }
        }
    }
    let mut conflicts: Vec<String> = fx.proxier.conflicts().map(|c| format!("{c:?}")).collect();
    conflicts.sort();
    out.extend(conflicts);
    out
}

#[test]
fn a_rebuild_records_shared_and_contested_keys_as_one_change_at_a_time_does() {
    // 600 Services, every fifth on the ClusterIP and port of the one
    // before it (two Services claim each of those keys), each third of
    // the kinds `varied` makes, built in partial syncs of 50.
    const N: usize = 600;
    let mut fx = Fixture::new(IpFamily::V4);
    for i in 0..N {
        varied(&mut fx, i);
        if i % 5 == 4 {
            // The previous Service's address, protocol and port, and an
            // endpoint of its own.
            let name = format!("s{i}");
            let ip = format!("172.30.{}.{}", (i - 1) / 250, 1 + (i - 1) % 250);
            let (proto, port) = if (i - 1) % 7 == 1 {
                (UDP, 53)
            } else {
                (TCP, 80)
            };
            fx.service(svc("ns", &name).cluster_ip(&ip).port("p", proto, port, 0));
            fx.slice(
                slice("ns", &name, &format!("{name}-1"))
                    .port("p", proto, 8080)
                    .ep(&format!("10.7.{}.{}", i / 250, 1 + i % 250), "other"),
            );
        }
        if i % 50 == 49 {
            fx.sync();
        }
    }
    fx.sync();
    fx.advance(verdict_proxier::staging::MAX_AGE);
    fx.sync();
    let before = recorded(&fx, N);
    assert_eq!(
        fx.proxier.conflicts().count(),
        N / 5,
        "each shared key conflicts"
    );
    let dump = fx.dump();
    // Rebuilt from nothing, in one piece: the same record, the same table,
    // and nothing to send.
    fx.proxier.force_rebuild();
    let r = fx.sync();
    assert!(r.rebuilt);
    assert_eq!(recorded(&fx, N), before);
    assert_eq!(fx.dump(), dump);
    fx.proxier.force_full_sync();
    assert_eq!(
        fx.sync().operations,
        0,
        "the rebuilt record matches the kernel"
    );
    // And it changes as usual: a contested key's first claimant goes, the
    // other takes it.
    fx.delete_service("ns", "s3");
    fx.sync();
    let owners = fx.proxier.owners_of(
        verdict_proxier::layout::SERVICE_IPS,
        &[
            verdict_nft::Value::Addr("172.30.0.4".parse().unwrap()),
            verdict_nft::Value::Proto(verdict_nft::L4Proto::Tcp),
            verdict_nft::Value::Port(80),
        ],
    );
    assert_eq!(
        owners
            .iter()
            .map(|o| o.service.name.to_string())
            .collect::<Vec<_>>(),
        ["s4"]
    );
}
