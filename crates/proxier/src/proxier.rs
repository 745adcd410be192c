//! The proxier of one IP family: takes Service and EndpointSlice changes,
//! and on `sync` moves the kernel from what it has to what it should have
//! with the smallest transaction.
//!
//! A partial sync recomputes only the services that changed and emits only
//! the elements whose value changed, so a sync with no change emits nothing.
//! A full sync (the first one, after any failure, and hourly) reads the
//! table back, rewrites every chain and diffs every element.

mod contributions;
mod isolate;
mod ledger;
mod sync;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_model::{
    EndpointSlice, EndpointsChangeTracker, EndpointsMap, NamespacedName, Service,
    ServiceChangeTracker, ServicePortMap, ServicePortName,
};
use verdict_nft::{Backend, Element, ElementValue, Transaction, Value};

use crate::config::ProxierConfig;
use crate::contribution::EndpointSet;
use crate::error::ProxierError;
use crate::layout::{self, DynChain, SetRef};
use crate::staging::Staging;
use contributions::Stored;
use isolate::{MAX_ISOLATION_ROUNDS, isolatable, isolate};
use ledger::{Key, Owner, Owners, Slots, holder};

/// A full sync happens at least this often.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);
/// Chains are deleted this long after they were emptied (a chain must not
/// be deleted in the transaction that removes the last jump to it: packets
/// may still be in it on kernels before 6.2).
pub const REMOVE_STALE_CHAINS_AFTER: Duration = Duration::from_secs(1);

/// What a sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncResult {
    /// Whether it was a full sync.
    pub full: bool,
    /// Operations in the main transaction.
    pub operations: usize,
    /// Stale chains deleted before the main transaction.
    pub stale_chains_deleted: usize,
    /// Stale session-affinity entries removed after it.
    pub affinity_entries_purged: usize,
    /// Service ports with internalTrafficPolicy Local and no local endpoint.
    pub no_local_endpoints_internal: usize,
    /// Service ports with externalTrafficPolicy Local and no local endpoint.
    pub no_local_endpoints_external: usize,
    /// Service ports whose contributions this sync computed or withdrew:
    /// every port when it rebuilt them all, else only those of the
    /// services that changed. A full sync that only repairs the kernel
    /// computes none.
    pub recomputed_ports: usize,
    /// Services touched by this sync.
    pub updated_services: BTreeSet<NamespacedName>,
    /// Every contribution was computed again (a rebuild: the first sync, a
    /// new configuration, hourly, or after a failed sync): what any
    /// service asks of the table may have changed, not only what
    /// `updated_services` names.
    pub rebuilt: bool,
    /// Trigger times of the endpoint changes this sync programmed.
    pub last_change_trigger_times: BTreeMap<NamespacedName, Vec<String>>,
    /// Service ports the backend refused in this sync, with its reason.
    /// They are not programmed (everything else is), and are tried again
    /// when their Service or its endpoints change.
    pub quarantined: Vec<(ServicePortName, String)>,
    /// Quarantined service ports that changed, so this sync tried them again.
    pub retried: Vec<ServicePortName>,
    /// Destinations two Services began to claim in this sync (or whose
    /// holder changed): one of them has it, the others are left without.
    pub conflicts: Vec<Conflict>,
    /// Conflicts that ended in this sync.
    pub conflicts_resolved: Vec<Conflict>,
    /// Jump elements this sync staged instead of adding them to their
    /// verdict map ([`crate::staging`]).
    pub staged: usize,
    /// Staged elements this sync moved into their maps (a compaction).
    pub unstaged: usize,
    /// Jump elements staged once this sync is done.
    pub staged_now: usize,
}

/// What the backend refused of one service port: the elements left out
/// (everything else of the port is programmed), and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quarantine {
    /// The elements left out, by set.
    pub elements: BTreeMap<&'static str, BTreeSet<Arc<[Value]>>>,
    /// Why, naming the elements the kernel refused.
    pub reason: String,
}

impl Quarantine {
    /// Whether `key` of `set` is left out.
    pub fn holds(&self, set: &str, key: &[Value]) -> bool {
        self.elements.get(set).is_some_and(|k| k.contains(key))
    }

    /// How many elements are left out.
    pub fn len(&self) -> usize {
        self.elements.values().map(BTreeSet::len).sum()
    }

    /// Whether nothing is left out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One destination (an address, protocol and port, or a node port) that
/// service ports of two Services claim. kube-proxy programs one of them
/// there and nothing of the other; verdict does the same, and gives it to
/// the first in name order so that every node and every sync agrees.
/// Nothing else of the loser is affected: its other addresses and its
/// node port keep working.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// The service port left without the destination.
    pub loser: ServicePortName,
    /// The service port that has it.
    pub winner: ServicePortName,
    /// What the destination is to the loser: `LoadBalancer IP`,
    /// `external IP`, `ClusterIP` or `node port`.
    pub kind: &'static str,
    /// The destination, as nft writes it (`5.6.7.8 . tcp . 80`).
    pub destination: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `198.51.100.7 . tcp . 80` as `198.51.100.7 port 80/TCP`.
        let parts: Vec<&str> = self.destination.split(" . ").collect();
        let what = match parts.as_slice() {
            [addr, proto, port] => format!("{addr} port {port}/{}", proto.to_uppercase()),
            [proto, port] => format!("{port}/{}", proto.to_uppercase()),
            _ => self.destination.clone(),
        };
        write!(
            f,
            "{} {what} is also claimed by {}, which has it on this node (one Service per address and port, as kube-proxy); {}'s other addresses and ports are not affected",
            self.kind, self.winner, self.loser
        )
    }
}

/// One element of a service port, and its set.
type PortElement = (SetRef, Arc<Element>);

/// What one service port asks of the table ([`Proxier::intent_of`]). The
/// read model keeps one per service port (30,000 and more): it holds no
/// copy of the port's name, its chains unformatted, and its elements are
/// the proxier's own list of them, shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    /// Its elements and their sets, in order: the list the proxier keeps
    /// of what the port contributed (16 bytes an element).
    elements: Arc<[PortElement]>,
    /// The elements whose key another service port claims first (its
    /// element is the one programmed): each one's place in `elements`,
    /// and that port. Nearly always empty.
    shared: Vec<(u32, Arc<ServicePortName>)>,
    /// The shared chains its elements jump to, in order.
    pub chains: Box<[DynChain]>,
}

impl Intent {
    /// Its elements, in order.
    pub fn elements(&self) -> impl ExactSizeIterator<Item = IntendedElement<'_>> + '_ {
        self.elements.iter().enumerate().map(|(i, (set, element))| {
            let programmed_for = self
                .shared
                .iter()
                .find(|(at, _)| *at as usize == i)
                .map(|(_, port)| port);
            IntendedElement {
                set: *set,
                element,
                programmed_for,
            }
        })
    }

    /// Whether it asks for no element.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }
}

/// One element a service port wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntendedElement<'a> {
    /// The set or map.
    pub set: SetRef,
    /// The element, shared with the proxier's own record.
    pub element: &'a Arc<Element>,
    /// Another service port claims the key first: its element is the one
    /// programmed.
    pub programmed_for: Option<&'a Arc<ServicePortName>>,
}

/// The maps and sets keyed by a destination: an address . protocol . port
/// or a protocol . node port. Two Services wanting one key there conflict.
const DESTINATIONS: [&str; 5] = [
    layout::SERVICE_IPS,
    layout::NO_ENDPOINT_SERVICES,
    layout::FIREWALL_IPS,
    layout::SERVICE_NODEPORTS,
    layout::NO_ENDPOINT_NODEPORTS,
];

/// The proxier of one IP family.
pub struct Proxier {
    cfg: ProxierConfig,
    service_changes: ServiceChangeTracker,
    endpoint_changes: EndpointsChangeTracker,
    services: ServicePortMap,
    endpoints: EndpointsMap,
    contributions: BTreeMap<ServicePortName, Stored>,
    /// Every element key wanted or believed to be in the kernel: who
    /// wants it, and what the kernel has there.
    slots: Slots,
    chain_refs: BTreeMap<DynChain, usize>,
    /// Shared chains with rules in the kernel.
    programmed_chains: BTreeSet<String>,
    /// Emptied chains awaiting deletion, with when they were emptied.
    stale_chains: BTreeMap<String, Instant>,
    /// Jump elements held in staging instead of their maps.
    staging: Staging,
    /// Affinity entries → owner → endpoints an affinity element for that
    /// entry may name.
    affinity_allowed: BTreeMap<Vec<Value>, BTreeMap<ServicePortName, EndpointSet>>,
    /// The affinity map may hold entries naming endpoints that are no longer
    /// allowed: check it after the next successful transaction.
    affinity_dirty: bool,
    /// Service ports with internal / external Local policy and no local endpoint.
    no_local: (usize, usize),
    /// Elements of service ports the backend refused, with its reason:
    /// left out until their Service or its endpoints change.
    quarantined: BTreeMap<ServicePortName, Quarantine>,
    /// Destinations more than one Service claims, with who is left without.
    conflicts: BTreeMap<Key, Vec<Conflict>>,
    /// Destination keys whose owners changed in this sync while another
    /// Service held them too: their conflicts are looked at again.
    contested: BTreeSet<Key>,
    need_full_sync: bool,
    /// The table as read before the first sync ([`Proxier::prefetch_table`]),
    /// with the ruleset's generation then: used by the next full sync if
    /// nothing was committed since.
    prefetched: Option<Prefetched>,
    /// Every contribution must be computed again, not only those of the
    /// services that changed: on the first sync, after a change of
    /// configuration, hourly, and after a sync that failed before it had
    /// computed the changes it had taken from the trackers.
    need_rebuild: bool,
    last_full_sync: Option<Instant>,
}

impl Proxier {
    /// A proxier for one family. Nothing is programmed until [`Proxier::sync`].
    pub fn new(cfg: ProxierConfig) -> Result<Proxier, ProxierError> {
        cfg.validate()?;
        Ok(Proxier {
            service_changes: ServiceChangeTracker::counting(cfg.family, cfg.metrics.clone()),
            endpoint_changes: EndpointsChangeTracker::new(cfg.family, cfg.node_name.clone()),
            cfg,
            services: ServicePortMap::new(),
            endpoints: EndpointsMap::new(),
            contributions: BTreeMap::new(),
            slots: BTreeMap::new(),
            chain_refs: BTreeMap::new(),
            programmed_chains: BTreeSet::new(),
            stale_chains: BTreeMap::new(),
            staging: Staging::default(),
            affinity_allowed: BTreeMap::new(),
            affinity_dirty: false,
            no_local: (0, 0),
            quarantined: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            contested: BTreeSet::new(),
            need_full_sync: true,
            prefetched: None,
            need_rebuild: true,
            last_full_sync: None,
        })
    }

    /// Reads the table now, for the next full sync to use if nothing is
    /// committed meanwhile (the ruleset's generation tells): a restart
    /// reads the rules it adopts while the source is still loading,
    /// instead of after it. Nothing is kept from a backend that cannot
    /// tell the generation, or from a read that fails or that a commit
    /// overlapped.
    pub fn prefetch_table<B: Backend + ?Sized>(&mut self, backend: &mut B) {
        let read = read_table(backend, self.cfg.nft_family(), &self.cfg.table);
        self.set_prefetched(read);
    }

    /// Keeps a read of the table ([`read_table`], on another handle and
    /// thread, say) for the next full sync, as [`Proxier::prefetch_table`].
    pub fn set_prefetched(&mut self, read: Option<Prefetched>) {
        self.prefetched = read;
    }

    /// The configuration.
    pub fn config(&self) -> &ProxierConfig {
        &self.cfg
    }

    /// Changes the configuration (node addresses, detector, …); the next
    /// sync is a full one.
    pub fn set_config(&mut self, cfg: ProxierConfig) -> Result<(), ProxierError> {
        cfg.validate()?;
        if cfg.family != self.cfg.family
            || cfg.node_name != self.cfg.node_name
            || cfg.table != self.cfg.table
        {
            return Err(ProxierError::Config {
                field: "family/nodeName/table".into(),
                reason: "cannot change on a running proxier".into(),
            });
        }
        self.cfg = cfg;
        self.need_full_sync = true;
        self.need_rebuild = true;
        // What the backend refused stays out until its Service changes: a
        // new configuration (a Node's labels, say) that makes other
        // elements of the port is tried with them, one that makes the same
        // refused elements is not worth refusing and logging again.
        Ok(())
    }

    /// Service ports with elements the backend refused: those elements
    /// are not programmed until their Service or endpoints change.
    pub fn quarantined(&self) -> &BTreeMap<ServicePortName, Quarantine> {
        &self.quarantined
    }

    /// Destinations claimed by more than one Service, each with the
    /// service ports left without it.
    pub fn conflicts(&self) -> impl Iterator<Item = &Conflict> {
        self.conflicts.values().flatten()
    }

    /// The quarantined ports of one service.
    pub fn quarantined_ports_of<'a>(
        &'a self,
        svc: &'a NamespacedName,
    ) -> impl Iterator<Item = &'a ServicePortName> + 'a {
        self.quarantined
            .range(ServicePortName::first_of(svc)..)
            .map(|(k, _)| k)
            .take_while(move |k| k.service == *svc)
    }

    /// A Service event (`None` before an add or after a delete). Returns
    /// whether a sync is needed.
    pub fn on_service(&mut self, previous: Option<&Service>, current: Option<&Service>) -> bool {
        match current.or(previous) {
            Some(s) => self.on_service_named(s.namespaced_name(), current),
            None => false,
        }
    }

    /// The same, by name: the previous ports are the proxier's own record
    /// of the Service, so the caller need not keep the previous object.
    pub fn on_service_named(&mut self, name: NamespacedName, current: Option<&Service>) -> bool {
        self.service_changes
            .update_applied(&self.services, name, current)
    }

    /// An EndpointSlice event. Returns whether a sync is needed.
    pub fn on_endpoint_slice(&mut self, slice: &EndpointSlice, removed: bool) -> bool {
        self.endpoint_changes.update(slice, removed)
    }

    /// Service changes waiting for a sync.
    pub fn pending_service_changes(&self) -> usize {
        self.service_changes.pending()
    }

    /// Endpoint changes waiting for a sync.
    pub fn pending_endpoint_changes(&self) -> usize {
        self.endpoint_changes.pending()
    }

    /// The service ports currently known.
    pub fn service_ports(&self) -> &ServicePortMap {
        &self.services
    }

    /// The endpoints currently known.
    pub fn endpoints(&self) -> &EndpointsMap {
        &self.endpoints
    }

    /// The service ports that want `key` in `set`, the one whose element
    /// is programmed first (the first in name order).
    pub fn owners_of(&self, set: &str, key: &[Value]) -> Vec<&ServicePortName> {
        self.slots
            .get(set)
            .and_then(|m| m.get(key))
            .map(|s| s.owners.iter().map(|(owner, _)| owner.as_ref()).collect())
            .unwrap_or_default()
    }

    /// Everything the ports of `svc` ask of the table: each element with
    /// whether it is the one programmed for its key (another service may
    /// claim the same key first), and the shared chains they jump to.
    pub fn intent_of(&self, svc: &NamespacedName) -> Vec<(ServicePortName, Intent)> {
        let mut out = Vec::new();
        for (port, stored) in self
            .contributions
            .range(ServicePortName::first_of(svc)..)
            .take_while(|(k, _)| k.service == *svc)
        {
            let mut shared = Vec::new();
            for (at, (set_ref, e)) in stored.elements.iter().enumerate() {
                let set = set_ref.name();
                let Some(owners) = self
                    .slots
                    .get(set)
                    .and_then(|m| m.get(&e.key))
                    .map(|s| &s.owners)
                else {
                    continue;
                };
                if let Some(winner) = self.programmed_for(set, &e.key, owners)
                    && **winner != *port
                {
                    shared.push((at as u32, winner.clone()));
                }
            }
            out.push((
                port.clone(),
                Intent {
                    elements: stored.elements.clone(),
                    shared,
                    chains: stored.chains.clone(),
                },
            ));
        }
        out
    }

    /// Every element the table should hold, set by set (the winner of
    /// each key), to compare with what the kernel has.
    pub fn desired_elements(&self) -> impl Iterator<Item = (&'static str, &Element)> + '_ {
        let slots = &self.slots;
        slots.iter().flat_map(move |(set, m)| {
            m.iter().filter_map(move |(k, s)| {
                holder(slots, set, k, &s.owners).map(|(_, e)| (*set, e.as_ref()))
            })
        })
    }

    /// The service port whose element of `key` is programmed (or, for a
    /// source range nobody holding its destination wants, the holder of
    /// the destination).
    fn programmed_for<'a>(
        &'a self,
        set: &str,
        key: &[Value],
        owners: &'a Owners,
    ) -> Option<&'a Owner> {
        match holder(&self.slots, set, key, owners) {
            Some((o, _)) => Some(o),
            None => self
                .slots
                .get(layout::FIREWALL_IPS)
                .and_then(|m| m.get(key.get(..key.len().saturating_sub(1))?))
                .and_then(|s| s.owners.winner_owner()),
        }
    }

    /// Looks again at the destinations whose owners changed in this sync,
    /// and at every known conflict: records who is left without one, and
    /// reports what began or ended.
    fn review_conflicts(&mut self, result: &mut SyncResult) {
        let mut keys = std::mem::take(&mut self.contested);
        keys.extend(self.conflicts.keys().cloned());
        for key in keys {
            let mut claims: BTreeSet<&Owner> = BTreeSet::new();
            for set in DESTINATIONS {
                if let Some(s) = self.slots.get(set).and_then(|m| m.get(&key)) {
                    claims.extend(s.owners.iter().map(|(o, _)| o));
                }
            }
            let mut now: Vec<Conflict> = Vec::new();
            let mut claims = claims.into_iter();
            if let Some(winner) = claims.next() {
                for loser in claims.filter(|o| o.service != winner.service) {
                    now.push(Conflict {
                        loser: loser.as_ref().clone(),
                        winner: winner.as_ref().clone(),
                        kind: self.kind_of(loser, &key),
                        destination: key
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(" . "),
                    });
                }
            }
            let before = self.conflicts.remove(&key).unwrap_or_default();
            result
                .conflicts
                .extend(now.iter().filter(|c| !before.contains(c)).cloned());
            result
                .conflicts_resolved
                .extend(before.into_iter().filter(|c| !now.contains(c)));
            if !now.is_empty() {
                self.conflicts.insert(key, now);
            }
        }
        result.conflicts.sort();
        result.conflicts_resolved.sort();
    }

    /// What a destination key is to a service port.
    fn kind_of(&self, port: &ServicePortName, key: &[Value]) -> &'static str {
        let (Some(sp), Some(Value::Addr(ip))) = (self.services.get(port), key.first()) else {
            return "node port";
        };
        if sp.load_balancer_vips.contains(ip) {
            "LoadBalancer IP"
        } else if sp.external_ips.contains(ip) {
            "external IP"
        } else if sp.cluster_ip == *ip {
            "ClusterIP"
        } else {
            "address"
        }
    }

    /// Invalid objects seen since the last call (they are proxied as if
    /// they had no ports).
    pub fn take_errors(&mut self) -> Vec<verdict_model::ModelError> {
        self.service_changes.take_errors()
    }

    /// When a sync should move the staged jump elements into their maps
    /// ([`crate::staging`]), even with nothing else to do (`None`: nothing
    /// is staged).
    pub fn compaction_due(&self) -> Option<Instant> {
        self.staging.due()
    }

    /// How many jump elements are staged instead of in their maps.
    pub fn staged_elements(&self) -> usize {
        self.staging.len()
    }

    /// Forces the next sync to be a full one: the table is read back and
    /// every element compared with what it should hold, so whatever else
    /// changed the table is repaired. What each service port should
    /// program is known already and is not computed again (see
    /// [`Proxier::force_rebuild`]).
    pub fn force_full_sync(&mut self) {
        self.need_full_sync = true;
    }

    /// Forces the next sync to be a full one that also computes every
    /// service port's contribution from scratch, as the first sync and the
    /// hourly one do.
    pub fn force_rebuild(&mut self) {
        self.need_full_sync = true;
        self.need_rebuild = true;
    }

    /// Programs the kernel. `now` drives stale-chain ageing and the hourly
    /// full sync.
    pub fn sync<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        now: Instant,
    ) -> Result<SyncResult, ProxierError> {
        let hourly = self
            .last_full_sync
            .is_none_or(|t| now.saturating_duration_since(t) >= FULL_SYNC_PERIOD);
        self.need_rebuild |= hourly;
        let full = self.need_full_sync || self.need_rebuild;
        let svc = self.service_changes.apply(&mut self.services);
        let eps = self.endpoint_changes.apply(&mut self.endpoints);
        let mut result = SyncResult {
            full,
            last_change_trigger_times: eps.last_change_trigger_times,
            ..SyncResult::default()
        };
        result.updated_services = svc.updated_services;
        result.updated_services.extend(eps.updated_services);

        // A quarantined port whose service changed is tried again.
        for svc in &result.updated_services {
            let again: Vec<ServicePortName> = self.quarantined_ports_of(svc).cloned().collect();
            for port in again {
                self.quarantined.remove(&port);
                result.retried.push(port);
            }
        }

        self.contested.clear();
        // Chains emptied by an attempt that failed were not emptied.
        let stale_before = self.stale_chains.clone();
        let mut rounds = 0;
        let outcome = loop {
            let rebuild = self.need_rebuild;
            let failure = match self.sync_inner(backend, now, result.full, rebuild, &mut result) {
                Ok(()) => break Ok(()),
                Err(f) => f,
            };
            self.stale_chains = stale_before.clone();
            rounds += 1;
            let Some(attempt) = failure.attempt.filter(|_| rounds <= MAX_ISOLATION_ROUNDS) else {
                break Err(failure.error);
            };
            let (tx, owners) = *attempt;
            if !isolatable(&failure.error) {
                break Err(failure.error);
            }
            match isolate(backend, &tx, &owners) {
                Ok(bad) if !bad.is_empty() => {
                    // Not programmed until they change; everything else is
                    // applied by the next round, in this same sync.
                    for refused in bad {
                        let port = refused.owner.as_ref().clone();
                        let q = self.quarantined.entry(port.clone()).or_default();
                        let reason = refused.quarantine(&tx, q);
                        result.updated_services.insert(port.service.clone());
                        result.quarantined.push((port, reason));
                    }
                }
                // Not the fault of any service port. A partial sync works
                // from what it believes the kernel has: read it back and
                // try once more, in full.
                _ if !result.full => result.full = true,
                _ => break Err(failure.error),
            }
        };
        match outcome {
            Ok(()) => {
                self.need_full_sync = false;
                self.review_conflicts(&mut result);
                if result.full {
                    self.last_full_sync = Some(now);
                }
                result.affinity_entries_purged = self.purge_affinity(backend);
                Ok(result)
            }
            Err(e) => {
                // The kernel still has what it had; our view of it is no
                // longer trusted. Start over with a full sync.
                self.need_full_sync = true;
                self.stale_chains.clear();
                Err(e)
            }
        }
    }

    /// Deletes chains emptied long enough ago, in their own transaction.
    fn delete_stale_chains<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        now: Instant,
    ) -> Result<usize, ProxierError> {
        let due: Vec<String> = self
            .stale_chains
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= REMOVE_STALE_CHAINS_AFTER)
            // A staging rule still goes there: it goes first, at the next
            // compaction.
            .filter(|(c, _)| !self.staging.holds_chain(c))
            .map(|(c, _)| c.clone())
            .collect();
        if due.is_empty() {
            return Ok(0);
        }
        let mut tx = Transaction::new(self.cfg.nft_family(), &self.cfg.table);
        for c in &due {
            tx.delete_chain(c);
        }
        backend.run(&tx).map_err(ProxierError::Cleanup)?;
        for c in &due {
            self.stale_chains.remove(c);
            self.programmed_chains.remove(c);
        }
        Ok(due.len())
    }

    /// Removes affinity entries that name an endpoint their entry no longer
    /// allows (or whose entry no longer belongs to an affinity service).
    /// Runs after the main transaction has committed, so new random choices
    /// can no longer pick a removed endpoint; a stale entry that is hit in
    /// between only refreshes itself and is removed here. On failure the
    /// check is repeated after the next sync.
    fn purge_affinity<B: Backend + ?Sized>(&mut self, backend: &mut B) -> usize {
        if !self.affinity_dirty {
            return 0;
        }
        let family = self.cfg.nft_family();
        let Ok(elements) = backend.elements(family, &self.cfg.table, layout::AFFINITY) else {
            return 0;
        };
        let mut tx = Transaction::new(family, &self.cfg.table);
        for e in elements {
            let entry = e.key.get(1..).map(<[Value]>::to_vec).unwrap_or_default();
            let target = match &e.value {
                Some(ElementValue::Data(d)) => match d.as_slice() {
                    [Value::Addr(a), Value::Port(p)] => Some((*a, *p)),
                    _ => None,
                },
                _ => None,
            };
            let allowed = self
                .affinity_allowed
                .get(&entry)
                .and_then(|owners| owners.values().next());
            let keep = matches!((allowed, target), (Some(a), Some(t)) if a.contains(&t));
            if !keep {
                tx.delete_element(layout::AFFINITY, e.key.clone());
            }
        }
        let n = tx.len();
        if n == 0 || backend.run(&tx).is_ok() {
            self.affinity_dirty = false;
            n
        } else {
            0
        }
    }
}

/// A table read back with the ruleset's generation it was read at.
pub type Prefetched = (u32, Option<verdict_nft::TableState>);

/// Reads `table` of `family` for a later full sync to adopt
/// ([`Proxier::set_prefetched`]): `None` from a backend that cannot tell
/// the generation, or if the read fails or a commit overlapped it.
pub fn read_table<B: Backend + ?Sized>(
    backend: &mut B,
    family: verdict_nft::Family,
    table: &str,
) -> Option<Prefetched> {
    let generation = backend.generation().ok().flatten()?;
    let started = Instant::now();
    let read = backend.table(family, table).ok()?;
    if backend.generation().ok().flatten() != Some(generation) {
        return None;
    }
    if let Some(t) = &read {
        tracing::info!(
            %family,
            elements = t.sets.values().map(|s| s.elements.len()).sum::<usize>(),
            elapsed = ?started.elapsed(),
            "read the rules in place while the source loads"
        );
    }
    Some((generation, read))
}

/// Call after a full sync, once its result has been used: see
/// [`verdict_model::settle_allocator`].
pub fn settle_allocator() {
    verdict_model::settle_allocator();
}

fn is_fixed_chain(name: &str) -> bool {
    layout::FIXED_CHAINS.contains(&name)
}

/// Our static name for a set, if it is one of ours.
/// The name of one of verdict's sets as a transaction holds it: the
/// shared name itself when the proxier wrote it.
fn own_set_name(name: &verdict_nft::SetName) -> Option<&'static str> {
    match name {
        std::borrow::Cow::Borrowed(s) => Some(s),
        std::borrow::Cow::Owned(s) => static_set_name(s),
    }
}

fn static_set_name(name: &str) -> Option<&'static str> {
    layout::SetRef::of(name).map(layout::SetRef::name)
}

/// Our static name for each set `tx` names, by its id.
fn own_sets(tx: &Transaction) -> impl Fn(verdict_nft::SetId) -> Option<&'static str> + use<> {
    let names: Vec<Option<&'static str>> = tx.sets().iter().map(own_set_name).collect();
    move |id| names.get(id.index()).copied().flatten()
}
