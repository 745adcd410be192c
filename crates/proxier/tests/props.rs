//! Property tests over random clusters:
//! - every ClusterIP:port and NodePort traces to exactly the endpoints
//!   kube-proxy would use (or is rejected/dropped as kube-proxy would);
//! - any sequence of incremental syncs reaches the same canonical table as
//!   one cold sync of the final state.
//!
//! The expected endpoints come from a small independent oracle, written from
//! the rules in reference §2.7/§2.9, not from the code under test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use verdict_model::{EndpointSlice, IpFamily, Protocol, Service, ServiceType};
use verdict_nft::L4Proto;

#[derive(Clone, Debug)]
struct Ep {
    octet: u8,
    local: bool,
    /// 0 ready, 1 serving+terminating, 2 terminating and not serving.
    state: u8,
}

#[derive(Clone, Debug)]
struct Svc {
    ports: Vec<(u8, u16)>,
    node_port: bool,
    etp_local: bool,
    itp_local: bool,
    eps: Vec<Ep>,
}

fn proto(p: u8) -> (Protocol, L4Proto) {
    match p % 3 {
        0 => (Protocol::Tcp, L4Proto::Tcp),
        1 => (Protocol::Udp, L4Proto::Udp),
        _ => (Protocol::Sctp, L4Proto::Sctp),
    }
}

fn ep_strategy() -> impl Strategy<Value = Ep> {
    (
        1u8..40,
        any::<bool>(),
        prop_oneof![4 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
    )
        .prop_map(|(octet, local, state)| Ep {
            octet,
            local,
            state,
        })
}

fn svc_strategy() -> impl Strategy<Value = Svc> {
    (
        prop::collection::vec((0u8..3, 1u16..6), 1..3),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(ep_strategy(), 0..5),
    )
        .prop_map(|(ports, node_port, etp_local, itp_local, eps)| {
            let mut seen = BTreeSet::new();
            let ports = ports
                .into_iter()
                .filter(|(p, n)| seen.insert((p % 3, *n)))
                .collect();
            let mut octets = BTreeSet::new();
            let eps = eps.into_iter().filter(|e| octets.insert(e.octet)).collect();
            Svc {
                ports,
                node_port,
                etp_local,
                itp_local,
                eps,
            }
        })
}

fn cluster_strategy() -> impl Strategy<Value = Vec<Option<Svc>>> {
    prop::collection::vec(prop::option::weighted(0.8, svc_strategy()), 1..7)
}

fn cluster_ip(i: usize) -> String {
    format!("172.30.0.{}", i + 1)
}
fn node_port(i: usize, j: usize) -> u16 {
    30000 + (i * 10 + j) as u16
}
fn svc_port(n: u16) -> u16 {
    n * 100
}
fn ep_ip(i: usize, e: &Ep) -> String {
    format!("10.180.{i}.{}", e.octet)
}

fn service(i: usize, s: &Svc) -> Service {
    let mut v = svc("ns", &format!("svc{i}")).cluster_ip(&cluster_ip(i));
    if s.node_port {
        v = v.kind(ServiceType::NodePort);
    }
    for (j, (p, n)) in s.ports.iter().enumerate() {
        let np = if s.node_port {
            node_port(i, j) as i32
        } else {
            0
        };
        v = v.port(&format!("p{j}"), proto(*p).0, svc_port(*n) as i32, np);
    }
    if s.etp_local {
        v = v.etp_local();
    }
    if s.itp_local {
        v = v.itp_local();
    }
    v
}

fn endpoint_slice(i: usize, s: &Svc) -> EndpointSlice {
    let mut sl = slice("ns", &format!("svc{i}"), &format!("svc{i}-1"));
    for (j, (p, n)) in s.ports.iter().enumerate() {
        sl = sl.port(&format!("p{j}"), proto(*p).0, svc_port(*n) as i32 + 1);
    }
    for e in &s.eps {
        let node = if e.local { NODE } else { "other-node" };
        sl = match e.state {
            0 => sl.ep(&ep_ip(i, e), node),
            1 => sl.ep_cond(&ep_ip(i, e), node, false, true, true),
            _ => sl.ep_cond(&ep_ip(i, e), node, false, false, true),
        };
    }
    sl
}

/// Moves `fx` from whatever it has to `cluster`.
fn apply(fx: &mut Fixture, prev: &[Option<Svc>], cluster: &[Option<Svc>]) {
    for i in 0..prev.len().max(cluster.len()) {
        let name = format!("svc{i}");
        match cluster.get(i).cloned().flatten() {
            Some(s) => {
                fx.service(service(i, &s));
                if s.eps.is_empty() && i % 2 == 0 {
                    fx.delete_slice("ns", &format!("{name}-1"));
                } else {
                    fx.slice(endpoint_slice(i, &s));
                }
            }
            None => {
                fx.delete_service("ns", &name);
                fx.delete_slice("ns", &format!("{name}-1"));
            }
        }
    }
}

/// The oracle: kube-proxy's endpoint choice (§2.7) and no-endpoint
/// verdicts (§2.9) for internal and external traffic.
fn expected(i: usize, s: &Svc, port: u16, external: bool) -> String {
    let usable = |e: &&Ep| e.state < 2;
    let any = s.eps.iter().any(|e| usable(&e));
    fn pick(eps: Vec<&Ep>) -> Vec<&Ep> {
        let ready: Vec<&Ep> = eps.iter().copied().filter(|e| e.state == 0).collect();
        if ready.is_empty() {
            eps.into_iter().filter(|e| e.state == 1).collect()
        } else {
            ready
        }
    }
    let cluster = pick(s.eps.iter().collect());
    let local = pick(s.eps.iter().filter(|e| e.local).collect());
    let chosen = match (external, s.etp_local, s.itp_local) {
        (true, true, _) | (false, _, true) => local,
        _ => cluster,
    };
    if !any {
        return "REJECT".into();
    }
    if chosen.is_empty() {
        return "DROP".into();
    }
    let set: BTreeSet<String> = chosen
        .iter()
        .map(|e| format!("{}:{}", ep_ip(i, e), port + 1))
        .collect();
    set.into_iter().collect::<Vec<_>>().join(", ")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_service_traces_to_its_endpoints(cluster in cluster_strategy()) {
        let mut fx = Fixture::new(IpFamily::V4);
        apply(&mut fx, &[], &cluster);
        fx.sync();
        for (i, s) in cluster.iter().enumerate() {
            let Some(s) = s else { continue };
            for (j, (p, n)) in s.ports.iter().enumerate() {
                let port = svc_port(*n);
                let cip = cluster_ip(i);
                let t = fx.trace(proto(*p).1, "10.0.0.2", Box::leak(cip.into_boxed_str()), port);
                prop_assert_eq!(t.output(), expected(i, s, port, false), "internal svc{} {:?}\n{}", i, s, t.explain());
                if s.node_port {
                    let t = fx.trace(proto(*p).1, "203.0.113.2", "192.168.0.2", node_port(i, j));
                    let want = expected(i, s, port, true);
                    prop_assert_eq!(t.output(), want.clone(), "nodeport svc{} {:?}\n{}", i, s, t.explain());
                    if !matches!(want.as_str(), "DROP" | "REJECT") {
                        // eTP=Cluster masquerades, eTP=Local keeps the client address.
                        prop_assert_eq!(t.masqueraded(), Some(!s.etp_local));
                    }
                }
            }
        }
    }

    #[test]
    fn incremental_syncs_reach_the_cold_state(
        history in prop::collection::vec(cluster_strategy(), 1..5),
        full_every in 0usize..4,
    ) {
        let mut fx = Fixture::new(IpFamily::V4);
        let mut prev: Vec<Option<Svc>> = Vec::new();
        for (step, cluster) in history.iter().enumerate() {
            apply(&mut fx, &prev, cluster);
            if full_every > 0 && step % full_every == 0 {
                fx.proxier.force_full_sync();
            }
            fx.sync();
            fx.advance(Duration::from_millis(300));
            prev = cluster.clone();
        }
        // Let staged jumps move into their maps, then emptied chains age
        // out (a staging rule of one goes with the compaction, the chain
        // in a later transaction).
        fx.advance(verdict_proxier::staging::MAX_AGE);
        fx.sync();
        fx.advance(Duration::from_secs(2));
        fx.sync();
        let last = history.last().unwrap();
        let mut cold = Fixture::new(IpFamily::V4);
        apply(&mut cold, &[], last);
        cold.sync();
        prop_assert_eq!(fx.dump(), cold.dump());
        // And a sync with no change sends nothing.
        prop_assert_eq!(fx.sync().operations, 0);
    }
}
