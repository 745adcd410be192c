//! Test support: a proxier on the in-memory backend, configured like
//! kube-proxy's fake proxier, with builders for Services and EndpointSlices
//! and a packet-flow runner.
//!
//! Address plan (kube-proxy's `NewFakeProxier`):
//! - node `test-node`: 192.168.0.2 (primary), 192.168.1.2, 192.168.99.11 on
//!   eth0; 2001:db8::1 (primary), 2001:db8:1::2; loopback 127.0.0.1, ::1
//! - pods: 10.0.0.0/8, fd00:10::/64 (the local-traffic detector)
//! - services: 172.30.0.0/16, fd00:10:96::/112
//! - external clients: 203.0.113.2 (allowed), 203.0.113.130 (blocked), 2600:5200::1

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use verdict_model::{EndpointSlice, IpFamily, Service};
use verdict_nft::{Family, L4Proto, MemoryBackend, Packet, Trace, Tracer};
use verdict_proxier::{LocalDetector, NodePortAddresses, Proxier, ProxierConfig, SyncResult};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// kube-proxy's fake proxier settings for one family.
pub fn upstream_config(family: IpFamily) -> ProxierConfig {
    let facts = verdict_conformance::node_facts(family);
    let mut c = ProxierConfig::new(family, verdict_conformance::NODE);
    c.node_ips = facts.node_ips.iter().map(|s| ip(s)).collect();
    c.local_ips = facts.local_ips.iter().map(|s| ip(s)).collect();
    c.local_detector = LocalDetector::Cidr(facts.pod_cidr.parse().unwrap());
    c.service_cidrs = vec![facts.service_cidr.parse().unwrap()];
    c.node_port_addresses = NodePortAddresses::cidrs(
        facts
            .node_port_cidrs
            .iter()
            .map(|s| s.parse().unwrap())
            .collect(),
    );
    c
}

/// A proxier on the in-memory backend, with a clock the test moves.
pub struct Fixture {
    pub proxier: Proxier,
    pub nft: MemoryBackend,
    pub now: Instant,
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
}

impl Fixture {
    pub fn new(family: IpFamily) -> Fixture {
        Fixture::with_config(upstream_config(family))
    }

    pub fn with_config(cfg: ProxierConfig) -> Fixture {
        Fixture {
            proxier: Proxier::new(cfg).expect("valid config"),
            nft: MemoryBackend::new(),
            now: Instant::now(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
        }
    }

    pub fn family(&self) -> Family {
        self.proxier.config().nft_family()
    }

    /// Adds or updates a Service.
    pub fn service(&mut self, svc: Service) -> &mut Fixture {
        let key = (svc.namespace.clone(), svc.name.clone());
        let prev = self.services.insert(key, svc.clone());
        self.proxier.on_service(prev.as_ref(), Some(&svc));
        self
    }

    pub fn delete_service(&mut self, ns: &str, name: &str) -> &mut Fixture {
        if let Some(prev) = self.services.remove(&(ns.into(), name.into())) {
            self.proxier.on_service(Some(&prev), None);
        }
        self
    }

    /// Adds or updates an EndpointSlice.
    pub fn slice(&mut self, slice: EndpointSlice) -> &mut Fixture {
        self.slices
            .insert((slice.namespace.clone(), slice.name.clone()), slice.clone());
        self.proxier.on_endpoint_slice(&slice, false);
        self
    }

    pub fn delete_slice(&mut self, ns: &str, name: &str) -> &mut Fixture {
        if let Some(prev) = self.slices.remove(&(ns.into(), name.into())) {
            self.proxier.on_endpoint_slice(&prev, true);
        }
        self
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Syncs and panics on failure.
    pub fn sync(&mut self) -> SyncResult {
        let now = self.now;
        self.proxier.sync(&mut self.nft, now).expect("sync")
    }

    pub fn dump(&self) -> String {
        let cfg = self.proxier.config();
        self.nft.dump(cfg.nft_family(), &cfg.table)
    }

    /// Traces a new connection. Sources that are node addresses are sent by
    /// the node itself; pod sources arrive on a pod interface, others on eth0.
    pub fn trace(&self, proto: L4Proto, src: &str, dst: &str, dport: u16) -> Trace {
        let cfg = self.proxier.config();
        let table = self
            .nft
            .get(cfg.nft_family(), &cfg.table)
            .expect("table exists");
        let local: Vec<IpAddr> = cfg
            .local_ips
            .iter()
            .filter(|a| !a.is_loopback())
            .copied()
            .collect();
        let src = ip(src);
        let iif = if local.contains(&src) {
            None
        } else if matches!(&cfg.local_detector, LocalDetector::Cidr(n) if n.contains(&src)) {
            Some("veth-pod".to_string())
        } else {
            Some("eth0".to_string())
        };
        Tracer::new(table, cfg.nft_family(), &local).trace(&Packet {
            src,
            dst: ip(dst),
            proto,
            dport,
            sport: 40000,
            iif,
        })
    }
}

// === scenarios ===

pub use verdict_conformance::*;

impl Fixture {
    /// A fixture configured and fed as a conformance scenario's setup says.
    pub fn replay(setup: &Setup) -> Fixture {
        let mut cfg = upstream_config(setup.family);
        if let Some(cidrs) = &setup.tweaks.node_port_cidrs {
            cfg.node_port_addresses =
                NodePortAddresses::cidrs(cidrs.iter().map(|c| c.parse().unwrap()).collect());
        }
        cfg.masquerade_all = setup.tweaks.masquerade_all;
        if setup.tweaks.no_detector {
            cfg.local_detector = LocalDetector::None;
        }
        let mut fx = Fixture::with_config(cfg);
        for step in &setup.steps {
            match step {
                Step::Service(s) => {
                    fx.service(s.clone());
                }
                Step::DeleteService(ns, n) => {
                    fx.delete_service(ns, n);
                }
                Step::Slice(s) => {
                    fx.slice(s.clone());
                }
                Step::DeleteSlice(ns, n) => {
                    fx.delete_slice(ns, n);
                }
                Step::Sync => {
                    fx.sync();
                }
            }
        }
        fx
    }
}

/// Counts and collects packet-flow results.
#[derive(Default)]
pub struct Report {
    pub ran: usize,
    pub failures: Vec<String>,
}

impl Report {
    /// Traces every flow on `fx` and records mismatches.
    pub fn run(&mut self, test: &str, fx: &Fixture, flows: &[Flow]) {
        for f in flows {
            self.ran += 1;
            let t = fx.trace(f.proto, f.src, f.dst, f.dport);
            let got = t.output();
            let endpoints = !matches!(f.output.as_str(), "DROP" | "REJECT" | "");
            let masq_ok = !endpoints || t.masqueraded() == Some(f.masq);
            if got != f.output || !masq_ok {
                self.failures.push(format!(
                    "{test} / {}: {} {} -> {}:{}: want {:?} masq={}, got {:?} masq={:?}\n{}",
                    f.name,
                    f.proto,
                    f.src,
                    f.dst,
                    f.dport,
                    f.output,
                    f.masq,
                    got,
                    t.masqueraded(),
                    t.explain()
                ));
            }
        }
    }
}
