//! The plan's exact operations, without a backend: each test brings a
//! proxier to a state (through syncs into memory), then runs the stages
//! up to the plan by hand and reads the transaction the plan returns.

use std::time::{Duration, Instant};

use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
use verdict_model::IpFamily;
use verdict_nft::{Backend, Family, MemoryBackend, Transaction};

use super::{Plan, ReadBack};
use crate::proxier::{Proxier, SyncResult};
use crate::{ProxierConfig, staging};

fn proxier() -> Proxier {
    let mut c = ProxierConfig::new(IpFamily::V4, "n");
    // Nothing counted: the plans hold the elements of the data path alone.
    c.counters = false;
    Proxier::new(c).unwrap()
}

/// shop/web on 172.30.0.41:80 with endpoints at `ips`.
fn web(p: &mut Proxier, ips: &[&str]) {
    let mut s = slice("shop", "web", "web-1").port("http", TCP, 80);
    for ip in ips {
        s = s.ep(ip, "n");
    }
    p.on_endpoint_slice(&s, false);
}

fn service(p: &mut Proxier, name: &str, ip: &str) {
    p.on_service(
        None,
        Some(&svc("shop", name).cluster_ip(ip).port("http", TCP, 80, 0)),
    );
}

/// The stages of a sync up to the plan, as `sync_inner` runs them, from
/// the changes the trackers hold; `read` is what a full sync read back.
fn plan_of(p: &mut Proxier, full: bool, read: Option<ReadBack>, now: Instant) -> Plan {
    let svc = p.service_changes.apply(&mut p.services);
    let eps = p.endpoint_changes.apply(&mut p.endpoints);
    let mut result = SyncResult {
        updated_services: svc.updated_services,
        ..SyncResult::default()
    };
    result.updated_services.extend(eps.updated_services);
    let rebuild = p.need_rebuild;
    let read = read.unwrap_or(ReadBack {
        table: None,
        replace: false,
    });
    let touched = p.recompute(full, rebuild, &mut result);
    let mut tx = Transaction::new(p.cfg.nft_family(), &p.cfg.table);
    let adopted = p.adopt_read_back(read, &mut tx);
    p.plan(tx, &adopted, touched.as_ref(), full, now)
}

/// What moving shop/web's second endpoint from 10.180.0.2 to 10.180.0.9
/// plans: its slot in the endpoint map and its hairpin element (the
/// endpoints are this node's), nothing else.
const MOVED: [&str; 4] = [
    "delete element ip verdict hairpin-connections { 10.180.0.2 . 10.180.0.2 . tcp . 80 }",
    "delete element ip verdict service-endpoints-tcp { 172.30.0.41 . 80 . 1 }",
    "add element ip verdict hairpin-connections { 10.180.0.9 . 10.180.0.9 . tcp . 80 }",
    "add element ip verdict service-endpoints-tcp { 172.30.0.41 . 80 . 1 : 10.180.0.9 . 80 }",
];

fn ops(plan: &Plan) -> Vec<String> {
    plan.tx.to_string().lines().map(str::to_owned).collect()
}

#[test]
fn a_partial_sync_plans_only_the_elements_of_the_endpoint_that_moved() {
    let (mut p, mut nft, t0) = (proxier(), MemoryBackend::new(), Instant::now());
    service(&mut p, "web", "172.30.0.41");
    web(&mut p, &["10.180.0.1", "10.180.0.2"]);
    p.sync(&mut nft, t0).unwrap();
    // One endpoint replaced by another: the same count, the same chains;
    // its slot in the endpoint map and its hairpin element (the endpoints
    // are this node's) change, nothing else.
    web(&mut p, &["10.180.0.1", "10.180.0.9"]);
    let plan = plan_of(&mut p, false, None, t0 + Duration::from_millis(10));
    assert_eq!(ops(&plan), MOVED, "{}", plan.tx);
    assert!(plan.staged.staged.is_empty() && plan.staged.compacted.is_none());
    assert!(plan.emptied.is_empty());
}

#[test]
fn a_new_service_is_staged_and_a_quiet_staging_compacted() {
    let (mut p, mut nft, t0) = (proxier(), MemoryBackend::new(), Instant::now());
    service(&mut p, "web", "172.30.0.41");
    web(&mut p, &["10.180.0.1", "10.180.0.2"]);
    p.sync(&mut nft, t0).unwrap();
    // A second Service of two endpoints: its jump goes to the chain that
    // exists, through staging (no rule written, nothing validated).
    service(&mut p, "api", "172.30.0.42");
    p.on_endpoint_slice(
        &slice("shop", "api", "api-1")
            .port("http", TCP, 80)
            .ep("10.180.0.3", "n")
            .ep("10.180.0.4", "n"),
        false,
    );
    let t1 = t0 + Duration::from_millis(10);
    let plan = plan_of(&mut p, false, None, t1);
    let staged = ops(&plan);
    assert!(
        staged.contains(
            &"add element ip verdict staged-service-ips { 172.30.0.42 . tcp . 80 }".to_owned()
        ),
        "{}",
        plan.tx
    );
    assert!(
        !staged
            .iter()
            .any(|o| o.starts_with("add element ip verdict service-ips ")),
        "the jump is staged, not in its map: {}",
        plan.tx
    );
    assert_eq!(plan.staged.staged.len(), 1);
    assert!(plan.staged.compacted.is_none());
    // Committed: the next plan, once staging has been quiet, moves it.
    let plan = p.run(&mut nft, plan).map_err(|f| f.error).unwrap();
    p.record(plan, t1, &mut SyncResult::default());
    let quiet = t1 + staging::QUIET + Duration::from_millis(1);
    let plan = plan_of(&mut p, false, None, quiet);
    assert_eq!(
        ops(&plan),
        [
            "delete element ip verdict staged-service-ips-endpoints-2 { 172.30.0.42 . tcp . 80 }",
            "delete element ip verdict staged-service-ips { 172.30.0.42 . tcp . 80 }",
            "add element ip verdict service-ips { 172.30.0.42 . tcp . 80 comment \"shop/api:http\" : goto endpoints-2 }",
        ],
        "{}",
        plan.tx
    );
    assert!(plan.staged.compacted.is_some());
    assert_eq!(plan.staged.unstaged.len(), 1);
}

#[test]
fn a_restart_adopts_the_table_read_back_and_plans_only_what_differs() {
    let (mut first, mut nft, t0) = (proxier(), MemoryBackend::new(), Instant::now());
    service(&mut first, "web", "172.30.0.41");
    web(&mut first, &["10.180.0.1", "10.180.0.2"]);
    first.sync(&mut nft, t0).unwrap();
    let table = nft.table(Family::Ip, "verdict").unwrap();
    assert!(table.is_some());

    // A new process with the same Services: the table as it is.
    let mut again = proxier();
    service(&mut again, "web", "172.30.0.41");
    web(&mut again, &["10.180.0.1", "10.180.0.2"]);
    let read = ReadBack {
        table: Some(table.clone()),
        replace: false,
    };
    let plan = plan_of(&mut again, true, Some(read), t0);
    assert_eq!(ops(&plan), Vec::<String>::new(), "{}", plan.tx);
    assert_eq!(
        again.programmed_chains.len(),
        0,
        "recorded only once committed"
    );

    // One whose endpoint moved while it was down: that element alone.
    let mut moved = proxier();
    service(&mut moved, "web", "172.30.0.41");
    web(&mut moved, &["10.180.0.1", "10.180.0.9"]);
    let read = ReadBack {
        table: Some(table),
        replace: false,
    };
    let plan = plan_of(&mut moved, true, Some(read), t0);
    assert_eq!(ops(&plan), MOVED, "{}", plan.tx);

    // A table that cannot be read is replaced whole, atomically: the
    // plan adds it, deletes it, and writes it from nothing.
    let mut replaced = proxier();
    service(&mut replaced, "web", "172.30.0.41");
    web(&mut replaced, &["10.180.0.1", "10.180.0.2"]);
    let read = ReadBack {
        table: Some(None),
        replace: true,
    };
    let plan = plan_of(&mut replaced, true, Some(read), t0);
    let lines = ops(&plan);
    assert_eq!(
        lines[..2],
        ["add table ip verdict", "delete table ip verdict"]
    );
    assert!(
        lines.contains(&"add element ip verdict service-ips { 172.30.0.41 . tcp . 80 comment \"shop/web:http\" : goto endpoints-2 }".to_owned()),
        "{}",
        plan.tx
    );
}
