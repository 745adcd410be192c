//! One family's plane: its proxier, and what the node keeps beside it for
//! the work after a sync: the service health-check node ports and their
//! local endpoint counts, and stale UDP conntrack cleanup. That work looks
//! only at what the sync touched (all of it after a full sync).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use verdict_admin::time::Moment;

use verdict_admin::Health;
use verdict_admin::service_health::{Healthy, ServiceHealthServers};
use verdict_k8s::events::{Notice, Regarding};
use verdict_model::{NamespacedName, ServicePortName};
use verdict_nft::Family;
use verdict_nft::conntrack::{Conntrack, ConntrackError};
use verdict_proxier::Proxier;
use verdict_proxier::conntrack::{OpenedTracker, UdpTargets, UdpTracker};

/// A service, as the health-check servers name it.
type Key = (String, String);

/// One family: its proxier and the state of the work after its syncs.
pub struct FamilyPlane {
    /// The proxier.
    pub proxier: Proxier,
    /// The UDP services' targets as of the last conntrack cleanup, and the
    /// services touched since.
    pub(crate) udp: UdpTracker,
    /// The TCP and SCTP destinations served as of the last sync, to find
    /// those served for the first time.
    pub(crate) opened: OpenedTracker,
    /// The service health-check servers.
    health_checks: Option<ServiceHealthServers>,
    /// The health-check node port of every service that has one.
    hc_ports: BTreeMap<Key, u16>,
    /// Their local ready endpoints (absent: none).
    hc_local: BTreeMap<Key, usize>,
    /// The health-check ports that could not be opened (an Event was
    /// posted for each).
    hc_failed: BTreeSet<(Key, u16)>,
}

/// What stale UDP conntrack cleanup did after a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpCleanup {
    /// No UDP Service was touched.
    Nothing,
    /// The touched Services only gained endpoints: nothing can be stale,
    /// and the table was not read.
    NotNeeded {
        /// Addresses and NodePorts checked.
        targets: usize,
    },
    /// The table was read and the stale entries deleted.
    Cleaned {
        /// Addresses and NodePorts checked.
        targets: usize,
        /// Entries deleted.
        deleted: usize,
        /// How long it took.
        took: std::time::Duration,
    },
}

/// What the work after a sync looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touched<'a> {
    /// Every Service (after a full sync).
    All,
    /// These Services.
    These(&'a BTreeSet<NamespacedName>),
}

fn key(svc: &NamespacedName) -> Key {
    (svc.namespace.to_string(), svc.name.to_string())
}

impl FamilyPlane {
    /// A plane around `proxier`.
    pub fn new(proxier: Proxier) -> FamilyPlane {
        FamilyPlane {
            proxier,
            udp: UdpTracker::default(),
            opened: OpenedTracker::default(),
            health_checks: None,
            hc_ports: BTreeMap::new(),
            hc_local: BTreeMap::new(),
            hc_failed: BTreeSet::new(),
        }
    }

    /// Opens and closes the service health-check node ports of this family
    /// (eTP=Local LoadBalancers) and updates their local endpoint counts,
    /// for the `touched` Services.
    pub fn sync_health_checks(
        &mut self,
        health: &Arc<Mutex<Health>>,
        touched: Touched<'_>,
        events: Option<&std::sync::mpsc::SyncSender<Notice>>,
        node: &str,
    ) {
        let p = &self.proxier;
        // Where NodePorts are served; v6 link-local addresses cannot be
        // bound without a scope and are skipped.
        let addresses: Vec<IpAddr> = p
            .config()
            .node_port_ips()
            .into_iter()
            .filter(|ip| !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()))
            .collect();
        if self
            .health_checks
            .as_ref()
            .is_none_or(|s| s.addresses() != addresses)
        {
            let h = health.clone();
            let healthy: Healthy =
                Arc::new(move || h.lock().map(|h| h.healthy(Moment::now())).unwrap_or(false));
            self.health_checks = Some(ServiceHealthServers::new(addresses, healthy));
        }
        let services: Vec<NamespacedName> = match touched {
            Touched::These(t) => t.iter().cloned().collect(),
            Touched::All => {
                self.hc_ports.clear();
                self.hc_local.clear();
                let mut all: Vec<NamespacedName> = p
                    .service_ports()
                    .iter()
                    .filter(|(_, sp)| sp.health_check_node_port.is_some())
                    .map(|(name, _)| name.service.clone())
                    .collect();
                all.dedup();
                all
            }
        };
        for svc in services {
            let k = key(&svc);
            self.hc_ports.remove(&k);
            self.hc_local.remove(&k);
            let Some(port) = p
                .service_ports()
                .range(ServicePortName::first_of(&svc)..)
                .take_while(|(name, _)| name.service == svc)
                .find_map(|(_, sp)| sp.health_check_node_port)
            else {
                continue;
            };
            self.hc_ports.insert(k.clone(), port);
            // A quarantined service is not programmed: no load balancer
            // should send it here.
            let n = if p.quarantined_ports_of(&svc).next().is_some() {
                0
            } else {
                verdict_model::local_ready_endpoints_of(p.endpoints(), &svc)
            };
            if n > 0 {
                self.hc_local.insert(k, n);
            }
        }
        let Some(servers) = &mut self.health_checks else {
            return;
        };
        let mut failing = BTreeSet::new();
        for f in servers.sync_services(&self.hc_ports) {
            let (ns, name) = &f.service;
            tracing::warn!(
                service = %format!("{ns}/{name}"),
                port = f.port,
                address = %f.address,
                error = %f.error,
                "cannot open the service's health-check node port"
            );
            let k = (f.service.clone(), f.port);
            if !self.hc_failed.contains(&k)
                && !failing.contains(&k)
                && let Some(tx) = events
            {
                // As kube-proxy's FailedToStartServiceHealthcheck.
                let _ = tx.try_send(Notice {
                    regarding: Regarding::Service {
                        namespace: ns.clone(),
                        name: name.clone(),
                    },
                    warning: true,
                    reason: "FailedToStartServiceHealthcheck",
                    action: "Listen",
                    note: format!(
                        "node {node} failed to start healthcheck \"{ns}/{name}\" on port {}: {}",
                        f.port, f.error
                    ),
                });
            }
            failing.insert(k);
        }
        self.hc_failed = failing;
        servers.sync_endpoints(self.hc_local.clone());
    }

    /// The health-check node ports served, by service.
    pub fn health_check_ports(&self) -> BTreeMap<Key, u16> {
        self.health_checks
            .as_ref()
            .map(ServiceHealthServers::served)
            .unwrap_or_default()
    }

    /// Notes the Services a sync touched for the next conntrack checks.
    pub fn udp_touched(&mut self, touched: Touched<'_>) {
        match touched {
            Touched::All => {
                self.udp.touched_all(self.proxier.service_ports());
                self.opened.touched_all(self.proxier.service_ports());
            }
            Touched::These(t) => {
                self.udp.touched(t);
                self.opened.touched(t);
            }
        }
    }

    /// Deletes the TCP and SCTP conntrack entries that were never answered
    /// nor NATed to the destinations the touched Services serve for the
    /// first time: clients whose SYN came before the rules, whose
    /// retransmissions would otherwise keep to an entry that is never
    /// DNATed (see `verdict_proxier::conntrack`). The table is read only
    /// when a destination was opened. Returns how many were deleted.
    pub fn clean_unanswered(&mut self, ct: &mut dyn Conntrack) -> Result<usize, ConntrackError> {
        let opened = self
            .opened
            .opened(self.proxier.service_ports(), self.proxier.endpoints());
        if opened.is_empty() {
            return Ok(0);
        }
        let family = self.proxier.config().nft_family();
        let t = Instant::now();
        let entries = ct.list_unanswered(family)?;
        let mut deleted = 0;
        for f in &entries {
            let proto = match f.proto.as_str() {
                "tcp" => verdict_model::Protocol::Tcp,
                "sctp" => verdict_model::Protocol::Sctp,
                _ => continue,
            };
            if opened.contains(&(f.dst, f.dport, proto)) && ct.delete_flow(family, f)? {
                deleted += 1;
            }
        }
        if deleted > 0 {
            tracing::info!(%family, destinations = opened.len(), deleted, elapsed = ?t.elapsed(), "deleted the conntrack entries of clients that reached a Service before its rules");
        }
        Ok(deleted)
    }

    /// Deletes the UDP conntrack entries that the Services touched since
    /// the last cleanup left stale. A failed cleanup leaves the Services
    /// pending: the next sync tries again.
    pub fn clean_stale_udp(
        &mut self,
        ct: &mut dyn Conntrack,
    ) -> Result<UdpCleanup, ConntrackError> {
        let Some(check) = self
            .udp
            .check(self.proxier.service_ports(), self.proxier.endpoints())
        else {
            return Ok(UdpCleanup::Nothing);
        };
        let targets = check.targets.len();
        // Only endpoints gained: nothing can be stale.
        if !check.cleanup {
            self.udp.done(check);
            return Ok(UdpCleanup::NotNeeded { targets });
        }
        let t = Instant::now();
        let deleted = clean(ct, self.proxier.config().nft_family(), &check.targets)?;
        self.udp.done(check);
        Ok(UdpCleanup::Cleaned {
            targets,
            deleted,
            took: t.elapsed(),
        })
    }
}

/// Deletes the UDP conntrack entries `targets` says are stale; returns how
/// many were deleted.
fn clean(
    ct: &mut dyn Conntrack,
    family: Family,
    targets: &UdpTargets,
) -> Result<usize, ConntrackError> {
    let t = Instant::now();
    let entries = ct.list_udp(family)?;
    let stale = targets.stale(&entries);
    let mut deleted = 0;
    for e in &stale {
        deleted += ct.delete_udp(family, e)?;
    }
    tracing::info!(%family, entries = entries.len(), deleted, elapsed = ?t.elapsed(), "reconciled UDP conntrack entries");
    Ok(deleted)
}
