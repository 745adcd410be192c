//! The proxier of one IP family: takes Service and EndpointSlice changes,
//! and on `sync` moves the kernel from what it has to what it should have
//! with the smallest transaction.
//!
//! A partial sync recomputes only the services that changed and emits only
//! the elements whose value changed, so a sync with no change emits nothing.
//! A full sync (the first one, after any failure, and hourly) reads the
//! table back, rewrites every chain and diffs every element.

use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_model::{
    EndpointSlice, EndpointsChangeTracker, EndpointsMap, NamespacedName, Service,
    ServiceChangeTracker, ServicePortMap, ServicePortName,
};
use verdict_nft::{Backend, Chain, Element, ElementValue, Transaction, Value};

use crate::config::ProxierConfig;
use crate::error::ProxierError;
use crate::layout::{self, DynChain, SetRef};
use crate::plan::{Contribution, EndpointSet, contribution};
use crate::staging::{self, Staging};

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

/// A service port, shared by every element it owns.
type Owner = Arc<ServicePortName>;

/// An element's key, kept once and shared by its slot, the elements that
/// have it and the contribution that names it.
type Key = Arc<[Value]>;

/// A set and one of its keys.
type SetKey = (&'static str, Key);

/// The owners of one element key and what each wants there. The first
/// owner in name order wins, so the outcome never depends on event order.
/// The winner's element is the same allocation as the one recorded as
/// programmed, once it is. Nearly every key has one owner, kept inline:
/// only a second one allocates, and the list of others is one pointer
/// while there is none (the map has an entry per element: 180,000 at
/// 30,000 Services).
#[derive(Debug, Default)]
struct Owners {
    /// The first in name order (`None` only when there is none).
    first: Option<Claim>,
    /// The others, in name order; never an empty list.
    /// A box, so that the usual absence is one word, not a `Vec`'s three.
    #[allow(clippy::box_collection)]
    rest: Option<Box<Vec<Claim>>>,
}

/// An owner and the element it wants.
type Claim = (Owner, Arc<Element>);

impl Owners {
    /// Records `owner`'s claim; returns whether it replaced a claim of
    /// the same owner (a port that wants one key twice).
    fn insert(&mut self, owner: Owner, e: Arc<Element>) -> bool {
        let Some(first) = &mut self.first else {
            self.first = Some((owner, e));
            return false;
        };
        match owner.as_ref().cmp(first.0.as_ref()) {
            std::cmp::Ordering::Equal => {
                first.1 = e;
                true
            }
            std::cmp::Ordering::Less => {
                let was = std::mem::replace(first, (owner, e));
                self.rest.get_or_insert_default().insert(0, was);
                false
            }
            std::cmp::Ordering::Greater => {
                let rest = self.rest.get_or_insert_default();
                match rest.binary_search_by(|(o, _)| o.as_ref().cmp(&owner)) {
                    Ok(i) => {
                        rest[i].1 = e;
                        true
                    }
                    Err(i) => {
                        rest.insert(i, (owner, e));
                        false
                    }
                }
            }
        }
    }

    /// `owner`'s claim.
    fn claim_of(&self, owner: &ServicePortName) -> Option<&Arc<Element>> {
        self.iter()
            .find(|(o, _)| o.as_ref() == owner)
            .map(|(_, e)| e)
    }

    fn remove(&mut self, owner: &ServicePortName) {
        if self
            .first
            .as_ref()
            .is_some_and(|(o, _)| o.as_ref() == owner)
        {
            self.first = self.rest.as_mut().map(|r| r.remove(0));
        } else if let Some(rest) = &mut self.rest
            && let Ok(i) = rest.binary_search_by(|(o, _)| o.as_ref().cmp(owner))
        {
            rest.remove(i);
        }
        if self.rest.as_ref().is_some_and(|r| r.is_empty()) {
            self.rest = None;
        }
    }

    /// Every owner, in name order.
    fn iter(&self) -> impl Iterator<Item = &Claim> {
        self.first
            .iter()
            .chain(self.rest.iter().flat_map(|r| r.iter()))
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.as_ref().map_or(0, |r| r.len())
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn winner(&self) -> Option<&Arc<Element>> {
        self.first.as_ref().map(|(_, e)| e)
    }

    fn winner_owner(&self) -> Option<&Owner> {
        self.first.as_ref().map(|(o, _)| o)
    }
}

/// One key of a set: the service ports that want it, and the element the
/// kernel has there. What is wanted and what is programmed share one
/// entry, so each of the 180,000 keys at 30,000 Services is one entry of
/// one map, not one in a map of what is wanted and one more in a record
/// of the kernel. The programmed element is the winner's own allocation
/// whenever that is what the kernel has (nearly always).
#[derive(Debug, Default)]
struct Slot {
    owners: Owners,
    /// The element the kernel has for the key (`None`: none).
    programmed: Option<Arc<Element>>,
}

impl Slot {
    /// Nobody wants the key and the kernel has nothing there: the entry
    /// can go.
    fn is_unused(&self) -> bool {
        self.owners.is_empty() && self.programmed.is_none()
    }

    fn of_kernel(e: Arc<Element>) -> Slot {
        Slot {
            owners: Owners::default(),
            programmed: Some(e),
        }
    }
}

/// Set → key → who wants it and what the kernel has.
type Slots = BTreeMap<&'static str, BTreeMap<Key, Slot>>;

/// Why the main transaction of a sync failed, with what is needed to find
/// the service ports responsible.
struct Failure {
    error: ProxierError,
    /// The transaction that failed, and the owner of each of its
    /// operations (element additions only).
    attempt: Option<Box<(Transaction, Vec<Option<Owner>>)>>,
}

impl From<ProxierError> for Failure {
    fn from(error: ProxierError) -> Failure {
        Failure {
            error,
            attempt: None,
        }
    }
}

impl From<verdict_nft::NftError> for Failure {
    fn from(e: verdict_nft::NftError) -> Failure {
        Failure::from(ProxierError::from(e))
    }
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

/// How many times one sync quarantines and tries again before it gives up.
const MAX_ISOLATION_ROUNDS: usize = 8;
/// The most service ports one isolation blames for conflicts between them.
const MAX_CONFLICTS: usize = 64;

/// What a service port contributed, without the elements themselves (they
/// live once, in the slots).
#[derive(Debug)]
struct Stored {
    /// Each element's set (a byte, where its name takes sixteen) and the
    /// port's own element (its claim on the key), in the contribution's
    /// order: 180,000 at 30,000 Services. The read model's intent of the
    /// port shares the list.
    elements: Arc<[PortElement]>,
    /// In order. A list, not a set: a port jumps to one shared chain or a
    /// few, and a `BTreeSet` allocates room for 11 (30,000 ports).
    chains: Box<[DynChain]>,
    no_local_internal: bool,
    no_local_external: bool,
    affinity: Vec<crate::plan::AffinityEntry>,
}

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

    fn sync_inner<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        now: Instant,
        full: bool,
        rebuild: bool,
        result: &mut SyncResult,
    ) -> Result<(), Failure> {
        let family = self.cfg.nft_family();
        let table = self.cfg.table.clone();
        // The trackers' changes are taken: should this attempt fail before
        // it has computed them, the next sync must compute everything.
        self.need_rebuild |= !result.updated_services.is_empty();
        result.stale_chains_deleted += self.delete_stale_chains(backend, now)?;
        if full {
            // Affinity entries left by an earlier run (or from before a
            // failure) are checked against what every service allows now.
            self.affinity_dirty = true;
        }

        // What the kernel has, on a full sync. A table we cannot read (say,
        // a rule someone added by hand) is replaced as a whole, atomically.
        let mut replace_table = false;
        // Elements of the staging sets that stage nothing (a full sync).
        let mut staging_junk: Vec<(String, Key)> = Vec::new();
        let prefetched = self.prefetched.take();
        let mut existing = if full {
            let read = match prefetched {
                // Read while the source was still loading, and nothing
                // committed since: the table as it is.
                Some((generation, t))
                    if backend.generation().ok().flatten() == Some(generation) =>
                {
                    Ok(t)
                }
                _ => backend.table(family, &table),
            };
            match read {
                Ok(t) => Some(t),
                Err(verdict_nft::NftError::Parse(_)) => {
                    replace_table = true;
                    self.stale_chains.clear();
                    Some(None)
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };

        // Recompute the contributions of the service ports that changed.
        // On a rebuild every contribution is dropped and computed again
        // below, so the ports are the services' (in order, without a set
        // to sort them into). A full sync that is not a rebuild (a repair,
        // a periodic check) diffs every key but computes only what changed.
        let ports: Vec<ServicePortName> = if rebuild {
            self.services.keys().cloned().collect()
        } else {
            // Only the ports of the services that changed: a range per service.
            let mut ports = BTreeSet::new();
            for svc in &result.updated_services {
                let of = |p: &&ServicePortName| p.service == *svc;
                let from = ServicePortName::first_of(svc);
                ports.extend(
                    self.services
                        .range(from.clone()..)
                        .map(|(k, _)| k)
                        .take_while(of)
                        .cloned(),
                );
                ports.extend(
                    self.contributions
                        .range(from..)
                        .map(|(k, _)| k)
                        .take_while(of)
                        .cloned(),
                );
            }
            ports.into_iter().collect()
        };
        let node_port_ips = self.cfg.node_port_ips();
        // A full sync diffs every key anyway; a partial one only the keys
        // the recomputed ports touched.
        let mut touched: Option<BTreeSet<SetKey>> = (!full).then(BTreeSet::new);
        if rebuild {
            // Every port is recomputed: start from nothing rather than
            // withdraw each one. A key many services share (a hairpin entry
            // of an endpoint they all use) keeps its owners in a sorted
            // list, and withdrawing then re-adding them one by one shifts
            // that list once per owner: quadratic at 30,000 services.
            self.contributions.clear();
            // What the kernel has is kept.
            for m in self.slots.values_mut() {
                m.retain(|_, s| {
                    s.owners = Owners::default();
                    s.programmed.is_some()
                });
            }
            self.chain_refs.clear();
            self.affinity_allowed.clear();
            self.no_local = (0, 0);
        }
        if rebuild {
            // Every port's contribution is computed up front, on as many
            // threads as there are cores (each is a pure function of the
            // port, its endpoints and the configuration), then recorded
            // in one piece on this thread.
            let computed = self.compute_all(&ports, &node_port_ips);
            self.contribute_all(&ports, computed);
        } else {
            for port in &ports {
                if let Some(old) = self.contributions.remove(port) {
                    self.withdraw(port, &old, touched.as_mut());
                }
                if let Some(new) = self.compute(port, &node_port_ips) {
                    let stored = self.contribute(Arc::new(port.clone()), new, touched.as_mut());
                    self.contributions.insert(port.clone(), stored);
                }
            }
        }
        if let Some(t) = touched.as_mut() {
            // Which source ranges a firewalled destination allows follows
            // whoever holds it: when that may have changed, every range
            // anyone wants there is looked at again.
            let entries: Vec<Key> = t
                .iter()
                .filter(|(set, _)| *set == layout::FIREWALL_IPS)
                .map(|(_, k)| k.clone())
                .collect();
            let allow = layout::FIREWALL_ALLOW;
            for entry in entries {
                if let Some(m) = self.slots.get(allow) {
                    t.extend(with_prefix(m, &entry).map(|k| (allow, k.clone())));
                }
            }
        }
        self.need_rebuild = false;
        result.recomputed_ports = ports.len();
        result.rebuilt |= rebuild;
        result.no_local_endpoints_internal = self.no_local.0;
        result.no_local_endpoints_external = self.no_local.1;

        let mut tx = Transaction::new(family, &table);
        if replace_table {
            tx.add_table(None);
            tx.delete_table();
        }
        let wanted = self.wanted_chains();
        let mut chains_now: BTreeSet<String> = self.programmed_chains.clone();
        // Whether the full sync rebuilds the table's chains (a set changed
        // type): every chain is emptied, the shared ones too.
        let mut rebuilt = false;
        if let Some(existing) = &mut existing {
            let empty = verdict_nft::TableState::default();
            rebuilt = self.write_fixed(
                &mut tx,
                existing.as_ref(),
                existing.as_ref().unwrap_or(&empty),
            );
            // What is really there replaces what we believed. The elements
            // read back are taken, not copied: the table read is the
            // largest thing a repair holds.
            for m in self.slots.values_mut() {
                m.retain(|_, s| {
                    s.programmed = None;
                    !s.owners.is_empty()
                });
            }
            for set in layout::sets(&self.cfg) {
                let name = static_set_name(&set.name);
                let read = existing.as_mut().and_then(|t| t.sets.get_mut(&set.name));
                if let (Some(name), Some(s)) = (name, read)
                    && name != layout::AFFINITY
                    && s.set.same_type(&set)
                {
                    self.adopt(name, std::mem::take(&mut s.elements));
                }
            }
            // And what it has staged: each staged key as the element its
            // slot's winner is, if that goes to the same chain.
            let slots = &self.slots;
            let cfg = &self.cfg;
            if rebuilt && let Some(t) = existing.as_ref() {
                // Every chain was emptied: staging starts over in the
                // staging sets that stay.
                for (name, s) in &t.sets {
                    let def = layout::staging_set_named(cfg, name);
                    if def.is_some_and(|d| d.same_type(&s.set)) && !s.elements.is_empty() {
                        tx.flush_set(name);
                    }
                }
            }
            staging_junk = self.staging.adopt(
                if rebuilt { None } else { existing.as_ref() },
                |map, target| layout::fixed_staging_targets(cfg, map).contains(&target),
                |map, key, target| {
                    let winner = slots
                        .get(map)
                        .and_then(|m| m.get(key))
                        .and_then(|s| s.owners.winner())
                        .filter(|w| staging::target(w) == Some(target));
                    match winner {
                        Some(w) => w.clone(),
                        None => Arc::new(Element::map(
                            key.clone(),
                            ElementValue::Verdict(verdict_nft::Verdict::Goto(target.to_owned())),
                        )),
                    }
                },
            );
            let existing = existing.as_ref().unwrap_or(&empty);
            chains_now = existing
                .chains
                .keys()
                .filter(|c| !is_fixed_chain(c))
                .cloned()
                .collect();
            self.stale_chains
                .retain(|c, _| existing.chains.contains_key(c));
        }
        let existing_chains = existing
            .as_ref()
            .and_then(Option::as_ref)
            .map(|t| &t.chains);
        // Rules of a chain in the kernel, on a full sync.
        let rules_now = |name: &str| existing_chains.and_then(|c| c.get(name)).map(|c| &c.rules);

        // Shared chains: write new ones, in dependency order; on a full sync
        // rewrite those whose rules differ from what they should be.
        let mut order: Vec<DynChain> = wanted.iter().copied().collect();
        order.sort_by_key(|c| !c.needs().is_empty());
        for chain in order {
            let name = chain.to_string();
            let rules = chain.rules(&self.cfg);
            let fresh = !chains_now.contains(&name) || self.stale_chains.contains_key(&name);
            let differs = rebuilt
                || (full && rules_now(&name).is_none_or(|r| !same_rules(r, &rules, family)));
            if fresh || differs {
                tx.add_chain(Chain::regular(&name));
                if rules_now(&name).is_some_and(|r| !r.is_empty()) {
                    tx.flush_chain(&name);
                }
                for rule in rules {
                    tx.add_rule(&name, rule);
                }
            }
            self.stale_chains.remove(&name);
        }

        // Staging ([`crate::staging`]): a transaction that validates the
        // table anyway (a full sync, a new shared chain), or one whose time
        // has come, moves every staged element into its map and makes the
        // staging chains and sets those of the wanted chains. Any other
        // stages the jumps it adds.
        let wanted_targets: BTreeSet<(&'static str, String)> = wanted
            .iter()
            .flat_map(|c| c.staged_in().iter().map(move |m| (*m, c.to_string())))
            .collect();
        let validates = tx
            .ops()
            .iter()
            .any(|op| matches!(op, verdict_nft::Op::AddRule(_)));
        // On a full sync, a staging chain whose rules are not those of the
        // staging sets the kernel has is rewritten, which validates too.
        let staging_chains_differ = full
            && layout::STAGED_MAPS.iter().any(|(map, chain)| {
                layout::DYNAMIC_STAGING.contains(chain) && {
                    let had = self.staging.targets().iter().filter(|(m, _)| m == map);
                    let rules = layout::staging_rules(&self.cfg, map, had.map(|(_, t)| t.as_str()));
                    rules_now(chain).is_none_or(|r| !same_rules(r, &rules, family))
                }
            });
        let compact = validates
            || staging_chains_differ
            || !wanted_targets.is_subset(self.staging.targets())
            || self.staging.due().is_some_and(|t| now >= t);
        let mut staged = staging::Changes::default();
        let mut staging_sets_gone: Vec<String> = Vec::new();
        if compact {
            // (On a full sync, the staging sets the kernel has.)
            let have_targets = self.staging.targets().clone();
            for (m, t) in wanted_targets.difference(&have_targets) {
                if let Some(set) = layout::staging_set_of(&self.cfg, m, Some(t)) {
                    tx.add_set(set);
                }
            }
            for (map, chain) in layout::STAGED_MAPS {
                if !layout::DYNAMIC_STAGING.contains(&chain) {
                    continue;
                }
                let of = |ts: &BTreeSet<(&'static str, String)>| -> Vec<String> {
                    ts.iter()
                        .filter(|(m, _)| *m == map)
                        .map(|(_, t)| t.clone())
                        .collect()
                };
                let (want, had) = (of(&wanted_targets), of(&have_targets));
                let rules = layout::staging_rules(&self.cfg, map, want.iter().map(String::as_str));
                let differs = rebuilt
                    || want != had
                    || (full && rules_now(chain).is_none_or(|r| !same_rules(r, &rules, family)));
                if differs {
                    let has_rules = match rules_now(chain) {
                        Some(r) => !r.is_empty(),
                        None => !full && !had.is_empty(),
                    };
                    if has_rules && !rebuilt {
                        tx.flush_chain(chain);
                    }
                    for rule in rules {
                        tx.add_rule(chain, rule);
                    }
                }
            }
            staging_sets_gone = have_targets
                .difference(&wanted_targets)
                .filter_map(|(m, t)| layout::staging_set(m, t))
                .collect();
            staged.compacted = Some(wanted_targets.clone());
        }

        // Elements: delete what changed or went away, then add (with the
        // service port that wants it, to blame it if the kernel refuses).
        // Each with its key as the maps keep it, to record what the
        // kernel has once it has it without looking the keys up again.
        // The additions go straight into the transaction, with room for
        // as many as a full sync can make (room never written is never
        // resident); the deletions are put before them once known.
        let fixed_ops = tx.len();
        tx.reserve(match &touched {
            Some(t) => t.len(),
            None => self.slots.values().map(BTreeMap::len).sum::<usize>() + node_port_ips.len(),
        });
        let mut deletes: Vec<(&'static str, Arc<Element>)> = Vec::new();
        match &touched {
            Some(touched) => {
                for (set, key) in touched {
                    let slot = self.slots.get(set).and_then(|m| m.get(key));
                    let want = slot.and_then(|s| holder(&self.slots, set, key, &s.owners));
                    let have = slot.and_then(|s| s.programmed.as_ref());
                    match self.staging.get(set, key) {
                        None if compact || layout::staged_of(set).is_none() => {
                            diff(set, want, have, &mut deletes, &mut tx);
                        }
                        was => staged_diff(
                            (set, key),
                            want,
                            have,
                            was,
                            (!compact, !compact),
                            &mut deletes,
                            &mut tx,
                            &mut staged,
                        ),
                    }
                }
            }
            None => {
                // Full: every slot, set by set. NodePort addresses are
                // the node's, not any service's: they follow.
                for (set, key) in &staging_junk {
                    tx.delete_element(set, key.clone());
                }
                for (set, m) in &self.slots {
                    if *set == layout::NODEPORT_IPS {
                        continue;
                    }
                    let staged_map = layout::staged_of(set).is_some();
                    for (k, s) in m {
                        let want = holder(&self.slots, set, k, &s.owners);
                        let have = s.programmed.as_ref();
                        match self.staging.get(set, k) {
                            None if compact || !staged_map => {
                                diff(set, want, have, &mut deletes, &mut tx);
                            }
                            // A full sync keeps what is staged, but does
                            // not stage: what it adds is a repair.
                            was => staged_diff(
                                (set, k),
                                want,
                                have,
                                was,
                                (!compact, false),
                                &mut deletes,
                                &mut tx,
                                &mut staged,
                            ),
                        }
                    }
                }
                let have = self.slots.get(layout::NODEPORT_IPS);
                for ip in &node_port_ips {
                    let key = [Value::Addr(*ip)];
                    let programmed = have
                        .and_then(|m| m.get(key.as_slice()))
                        .is_some_and(|s| s.programmed.is_some());
                    if !programmed {
                        let e = Arc::new(Element::key(key.to_vec()));
                        tx.add_shared_element(layout::NODEPORT_IPS, e);
                    }
                }
                for (key, s) in have.into_iter().flatten() {
                    if let Some(e) = &s.programmed
                        && !matches!(&key[..], [Value::Addr(ip)] if node_port_ips.contains(ip))
                    {
                        deletes.push((layout::NODEPORT_IPS, e.clone()));
                    }
                }
            }
        }
        // The staged keys the diff did not look at: on a partial sync
        // they are still wanted, and move into their maps on a compaction;
        // on a full one nobody wants them.
        for (set, key, e) in self.staging.iter() {
            let seen = match &touched {
                Some(t) => t.contains(&(set, key.clone())),
                None => self.slots.get(set).is_some_and(|m| m.contains_key(key)),
            };
            if seen || (touched.is_some() && !compact) {
                continue;
            }
            Staging::delete_ops(&mut tx, set, key, staging::target(e));
            if touched.is_some() {
                tx.add_shared_element(set, e.clone());
            }
            staged.unstaged.push((set, key.clone()));
        }
        // The transaction shares the keys and elements this proxier keeps.
        tx.insert_shared_deletes(fixed_ops, deletes);
        // Staging sets of chains nobody wants go once their rules and
        // elements have.
        for set in &staging_sets_gone {
            tx.delete_set(set);
        }

        // Chains nobody jumps to any more: empty them now, delete them later.
        let wanted_names: BTreeSet<String> = wanted.iter().map(|c| c.to_string()).collect();
        for name in chains_now.difference(&wanted_names) {
            if !self.stale_chains.contains_key(name) {
                tx.flush_chain(name);
                self.stale_chains.insert(name.clone(), now);
            } else if full && rules_now(name).is_some_and(|r| !r.is_empty()) {
                tx.flush_chain(name);
            }
        }

        result.operations = tx.len();
        // kube-proxy's -v=4: every change, as the script that makes it.
        if !tx.is_empty() && tracing::enabled!(tracing::Level::TRACE) {
            for line in tx.to_string().lines() {
                tracing::trace!(family = %self.cfg.family, "{line}");
            }
        }
        if !tx.is_empty()
            && let Err(e) = backend.run(&tx)
        {
            // Who wants each operation matters only to a failure, so it
            // is found only then (as the diff chose it: the holder of the
            // key), not kept beside every operation of every sync.
            let owners = self.blame(&tx);
            return Err(Failure {
                error: e.into(),
                attempt: Some(Box::new((tx, owners))),
            });
        }
        // The kernel has it now: record the element changes in their
        // slots (every element operation of the transaction is one of
        // these, the deletions first). An element added is the winner's
        // own allocation, which its slot then shares. What left staging
        // is no longer programmed, unless the map has it now.
        for (set, key) in &staged.unstaged {
            if let Some(m) = self.slots.get_mut(set)
                && let Some(slot) = m.get_mut(key)
            {
                slot.programmed = None;
                if slot.is_unused() {
                    m.remove(key);
                }
            }
        }
        let own = own_sets(&tx);
        for op in tx.ops().get(fixed_ops..).unwrap_or_default() {
            match op {
                verdict_nft::Op::DeleteElement(set, e) => {
                    if let Some(m) = own(*set).and_then(|s| self.slots.get_mut(s))
                        && let Some(slot) = m.get_mut(&e.key)
                    {
                        slot.programmed = None;
                        if slot.is_unused() {
                            m.remove(&e.key);
                        }
                    }
                }
                verdict_nft::Op::AddElement(set, e) => {
                    if let Some(set) = own(*set) {
                        let m = self.slots.entry(set).or_default();
                        match m.get_mut(&e.key) {
                            Some(slot) => slot.programmed = Some(e.clone()),
                            None => {
                                m.insert(e.key.clone(), Slot::of_kernel(e.clone()));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        for (set, key, e) in &staged.staged {
            let m = self.slots.entry(set).or_default();
            match m.get_mut(key) {
                Some(slot) => slot.programmed = Some(e.clone()),
                None => {
                    m.insert(key.clone(), Slot::of_kernel(e.clone()));
                }
            }
        }
        result.staged += staged.staged.len();
        result.unstaged += if staged.compacted.is_some() {
            self.staging.len()
        } else {
            0
        };
        let unwanted_targets = staged.compacted.is_none()
            && self
                .staging
                .targets()
                .iter()
                .any(|t| !wanted_targets.contains(t));
        self.staging.record(staged, now, unwanted_targets);
        result.staged_now = self.staging.len();
        self.programmed_chains = wanted_names;
        Ok(())
    }

    /// The table, base chains, fixed chains and sets of a full sync, given
    /// what the kernel has (`current`: `None` if the table is missing).
    /// Only what differs is written, so a full sync of a table that is as
    /// it should be sends nothing. Returns whether every chain was emptied
    /// to replace a set or a base chain (the caller then rewrites the
    /// shared chains too).
    fn write_fixed(
        &self,
        tx: &mut Transaction,
        current: Option<&verdict_nft::TableState>,
        existing: &verdict_nft::TableState,
    ) -> bool {
        let family = self.cfg.nft_family();
        let fixed = layout::fixed_chains(&self.cfg);
        let mut sets = layout::sets(&self.cfg);
        sets.extend(layout::staging_sets(&self.cfg));
        if current.is_none() {
            tx.add_table(Some(layout::TABLE_COMMENT));
        }
        // A set of another type, or a base chain with another hook or
        // priority, must be replaced. Nothing may refer to it then: empty
        // every chain first and rewrite all of them.
        let replaced_sets: Vec<&String> = existing
            .sets
            .iter()
            .filter(|(name, old)| {
                !sets
                    .iter()
                    .any(|s| s.name == **name && s.same_type(&old.set))
                    // The staging sets of shared chains are the sync's.
                    && !layout::staging_set_named(&self.cfg, name)
                        .is_some_and(|def| def.same_type(&old.set))
            })
            .map(|(name, _)| name)
            .collect();
        let replaced_chains: Vec<&str> = fixed
            .iter()
            .filter(|(chain, _)| {
                existing
                    .chains
                    .get(&chain.name)
                    .is_some_and(|old| old.chain.base != chain.base)
            })
            .map(|(chain, _)| chain.name.as_str())
            .collect();
        let rebuild = !replaced_sets.is_empty() || !replaced_chains.is_empty();
        if rebuild {
            for (name, c) in &existing.chains {
                if !c.rules.is_empty() {
                    tx.flush_chain(name);
                }
            }
            for name in replaced_chains {
                tx.delete_chain(name);
            }
            for name in replaced_sets {
                tx.delete_set(name);
            }
        }
        let have_chain = |name: &str| !rebuild && existing.chains.contains_key(name);
        for (chain, _) in &fixed {
            if !have_chain(&chain.name) {
                tx.add_chain(chain.clone());
            }
        }
        for set in sets {
            if rebuild || !existing.sets.contains_key(&set.name) {
                tx.add_set(set);
            }
        }
        for (chain, rules) in fixed {
            // The staging chains of shared chains: the sync writes their
            // rules, with the shared chains.
            if layout::DYNAMIC_STAGING.contains(&chain.name.as_str()) {
                continue;
            }
            let now = existing.chains.get(&chain.name);
            if !rebuild && now.is_some_and(|c| same_rules(&c.rules, &rules, family)) {
                continue;
            }
            if !rebuild && now.is_some_and(|c| !c.rules.is_empty()) {
                tx.flush_chain(&chain.name);
            }
            for rule in rules {
                tx.add_rule(&chain.name, rule);
            }
        }
        rebuild
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

    fn withdraw(
        &mut self,
        owner: &ServicePortName,
        c: &Stored,
        mut touched: Option<&mut BTreeSet<SetKey>>,
    ) {
        for (entry, _) in &c.affinity {
            if let Some(owners) = self.affinity_allowed.get_mut(entry) {
                owners.remove(owner);
                if owners.is_empty() {
                    self.affinity_allowed.remove(entry);
                }
            }
            self.affinity_dirty = true;
        }
        self.no_local.0 -= usize::from(c.no_local_internal);
        self.no_local.1 -= usize::from(c.no_local_external);
        for (set, e) in c.elements.iter() {
            let (set, key) = (&set.name(), &e.key);
            if let Some(m) = self.slots.get_mut(set)
                && let Some(slot) = m.get_mut(key)
            {
                if slot.owners.len() > 1 && DESTINATIONS.contains(set) {
                    self.contested.insert(key.clone());
                }
                slot.owners.remove(owner);
                if slot.is_unused() {
                    m.remove(key);
                }
            }
            if let Some(t) = touched.as_deref_mut() {
                t.insert((*set, key.clone()));
            }
        }
        for chain in &c.chains {
            if let Some(n) = self.chain_refs.get_mut(chain) {
                *n -= 1;
                if *n == 0 {
                    self.chain_refs.remove(chain);
                }
            }
        }
    }

    /// Every port's contribution at once, on a rebuild (the maps are
    /// empty): each set's elements are sorted once and its map built in
    /// one piece, with full nodes, where adding them one by one searched
    /// the map for each and left its nodes two thirds full (600,000
    /// elements at 100,000 Services). What it records is what
    /// [`contribute`](Self::contribute) for each port in order would: the
    /// owners of a key in name order, a port's keys in its elements' order,
    /// each key stored once.
    fn contribute_all(&mut self, ports: &[ServicePortName], computed: Vec<Option<Contribution>>) {
        /// An element waiting for its set's map: the index of its port (in
        /// `owners`), its place among the port's elements, the element.
        type Staged = (usize, usize, Element);
        let mut owners: Vec<Owner> = Vec::with_capacity(ports.len());
        let mut stored: Vec<Stored> = Vec::with_capacity(ports.len());
        // Each port's elements as they are shared, put in their places.
        let mut lists: Vec<Vec<Option<PortElement>>> = Vec::with_capacity(ports.len());
        // Ports that want a key twice.
        let mut twice: Vec<usize> = Vec::new();
        let mut staged: BTreeMap<SetRef, Vec<Staged>> = BTreeMap::new();
        for (port, c) in ports.iter().zip(computed) {
            let Some(c) = c else { continue };
            let i = owners.len();
            let (elements, s) = self.account(port, c);
            lists.push(vec![None; elements.len()]);
            for (at, (set, e)) in elements.into_iter().enumerate() {
                staged.entry(set).or_default().push((i, at, e));
            }
            owners.push(Arc::new(port.clone()));
            stored.push(s);
        }
        for (set_ref, mut elements) in staged {
            let set = set_ref.name();
            // By key, then port, then place: one port's elements of one
            // key stay in their order, and the last is the one kept, as
            // one insert after another. No two compare equal, so an
            // unstable sort (no scratch copy of the set's elements) gives
            // that order.
            elements.sort_unstable_by(|a, b| {
                a.2.key
                    .cmp(&b.2.key)
                    .then(a.0.cmp(&b.0))
                    .then(a.1.cmp(&b.1))
            });
            let destination = DESTINATIONS.contains(&set);
            let mut entries: Vec<(Key, Owners)> = Vec::with_capacity(elements.len());
            for (i, at, mut e) in elements {
                let owner = &owners[i];
                match entries.last_mut() {
                    Some((k, o)) if *k == e.key => {
                        // Stored once: the element takes the first
                        // allocation of it.
                        e.key = k.clone();
                        if destination && o.iter().any(|(w, _)| w.service != owner.service) {
                            self.contested.insert(k.clone());
                        }
                        let e = Arc::new(e);
                        if o.insert(owner.clone(), e.clone()) {
                            twice.push(i);
                        }
                        lists[i][at] = Some((set_ref, e));
                    }
                    _ => {
                        let mut o = Owners::default();
                        let key = e.key.clone();
                        let e = Arc::new(e);
                        o.insert(owner.clone(), e.clone());
                        lists[i][at] = Some((set_ref, e));
                        entries.push((key, o));
                    }
                }
            }
            // The slots left hold only what the kernel has; the wanted
            // join them, both in key order, into a map built in one piece.
            let kept = self.slots.remove(set).unwrap_or_default();
            self.slots.insert(set, merged(kept, entries));
        }
        for (s, list) in stored.iter_mut().zip(lists) {
            s.elements = list.into_iter().flatten().collect();
        }
        // A port that wants several keys twice is listed once for each.
        twice.sort_unstable();
        twice.dedup();
        for i in twice {
            if let (Some(s), Some(owner)) = (stored.get_mut(i), owners.get(i)) {
                s.elements = self.claims(owner, &s.elements);
            }
        }
        self.contributions = owners
            .iter()
            .map(|o| o.as_ref().clone())
            .zip(stored)
            .collect();
    }

    /// A port's elements, each replaced by the port's claim on its key: a
    /// port that wants one key twice has its last element there, as one
    /// insert after another leaves it.
    fn claims(&self, owner: &ServicePortName, elements: &[PortElement]) -> Arc<[PortElement]> {
        elements
            .iter()
            .map(|(set, e)| {
                let claim = self
                    .slots
                    .get(set.name())
                    .and_then(|m| m.get(&e.key))
                    .and_then(|s| s.owners.claim_of(owner));
                (*set, claim.unwrap_or(e).clone())
            })
            .collect()
    }

    /// Records what `port`'s contribution asks besides its elements (the
    /// affinity entries it allows, the no-local counts, its references to
    /// shared chains), and returns its elements and its record, whose list
    /// of elements the caller fills as it stores them.
    fn account(
        &mut self,
        port: &ServicePortName,
        c: Contribution,
    ) -> (Vec<(SetRef, Element)>, Stored) {
        for (entry, allowed) in &c.affinity {
            self.affinity_allowed
                .entry(entry.clone())
                .or_default()
                .insert(port.clone(), allowed.clone());
            self.affinity_dirty = true;
        }
        self.no_local.0 += usize::from(c.no_local_internal);
        self.no_local.1 += usize::from(c.no_local_external);
        for chain in &c.chains {
            *self.chain_refs.entry(*chain).or_default() += 1;
        }
        let stored = Stored {
            elements: Arc::default(),
            chains: c.chains.into_iter().collect(),
            no_local_internal: c.no_local_internal,
            no_local_external: c.no_local_external,
            affinity: c.affinity,
        };
        let elements = c
            .elements
            .into_iter()
            .filter_map(|(set, e)| match SetRef::of(set) {
                Some(r) => Some((r, e)),
                None => {
                    // Every set the layout defines is one of `SETS` (a unit
                    // test holds them equal): an element of another could
                    // not be programmed, nor withdrawn.
                    tracing::error!(set, port = %port, "an element of a set the layout does not define: left out");
                    None
                }
            })
            .collect();
        (elements, stored)
    }

    fn contribute(
        &mut self,
        owner: Owner,
        c: Contribution,
        mut touched: Option<&mut BTreeSet<SetKey>>,
    ) -> Stored {
        let (elements, mut stored) = self.account(&owner, c);
        let mut list = Vec::with_capacity(elements.len());
        let mut twice = false;
        for (set_ref, mut e) in elements {
            let set = set_ref.name();
            let m = self.slots.entry(set).or_default();
            // The key as the map has it already (other owners, or the
            // element programmed), so that each key is stored once: the
            // element then holds that allocation too. One search of the
            // map finds it or the place for it.
            let (key, slot) = match m.entry(e.key.clone()) {
                btree_map::Entry::Occupied(o) => {
                    let k = o.key().clone();
                    e.key = k.clone();
                    (k, o.into_mut())
                }
                btree_map::Entry::Vacant(v) => (e.key.clone(), v.insert(Slot::default())),
            };
            let e = match &slot.programmed {
                Some(p) if **p == e => p.clone(),
                _ => Arc::new(e),
            };
            if DESTINATIONS.contains(&set)
                && slot.owners.iter().any(|(o, _)| o.service != owner.service)
            {
                self.contested.insert(key.clone());
            }
            twice |= slot.owners.insert(owner.clone(), e.clone());
            if let Some(t) = touched.as_deref_mut() {
                t.insert((set, key));
            }
            list.push((set_ref, e));
        }
        stored.elements = if twice {
            self.claims(&owner, &list)
        } else {
            list.into()
        };
        stored
    }

    /// The service port that wants each operation of `tx`: for an element
    /// addition, the holder of its key (as the diff chose it); none for
    /// the rest (deletions, chains, node-owned elements).
    fn blame(&self, tx: &Transaction) -> Vec<Option<Owner>> {
        let own = own_sets(tx);
        tx.ops()
            .iter()
            .map(|op| {
                let verdict_nft::Op::AddElement(id, e) = op else {
                    return None;
                };
                // A staged key's owner is its map's.
                let set = own(*id).or_else(|| layout::map_of_staging(tx.set_name(*id)))?;
                let slot = self.slots.get(set)?.get(&e.key[..])?;
                holder(&self.slots, set, &e.key, &slot.owners).map(|(o, _)| o.clone())
            })
            .collect()
    }

    /// Records the elements read back from `set` as what the kernel has
    /// (its slots hold nothing programmed yet): each shares its slot's key
    /// and, where it is the winner's element (it nearly always is), the
    /// winner's allocation, so each is stored once. The read-back and the
    /// slots are both in key order, so they are walked side by side
    /// instead of searching one for each of the other (a restart adopts
    /// 180,000 elements at 30,000 Services).
    fn adopt(&mut self, set: &'static str, read: BTreeMap<Key, Element>) {
        let m = self.slots.entry(set).or_default();
        if m.is_empty() {
            *m = read
                .into_iter()
                .map(|(k, e)| (k, Slot::of_kernel(Arc::new(e))))
                .collect();
            return;
        }
        // Keys nobody wants, inserted after the walk.
        let mut unwanted = Vec::new();
        let mut slots = m.iter_mut().peekable();
        for (k, mut e) in read {
            while slots.next_if(|(sk, _)| **sk < k).is_some() {}
            match slots.next_if(|(sk, _)| **sk == k) {
                Some((sk, slot)) => {
                    slot.programmed = Some(match slot.owners.winner() {
                        Some(w) if **w == e => w.clone(),
                        _ => {
                            e.key = sk.clone();
                            Arc::new(e)
                        }
                    });
                }
                None => unwanted.push((k, Slot::of_kernel(Arc::new(e)))),
            }
        }
        m.extend(unwanted);
    }

    /// What `port` contributes now (`None`: it is gone), less what the
    /// backend refused of it.
    fn compute(&self, port: &ServicePortName, node_port_ips: &[IpAddr]) -> Option<Contribution> {
        let sp = self.services.get(port)?;
        let eps: &[verdict_model::Endpoint] = self.endpoints.get(port).map_or(&[], |v| v);
        let mut c = contribution(&self.cfg, sp, eps, node_port_ips);
        if let Some(q) = self.quarantined.get(port) {
            c.elements.retain(|(set, e)| !q.holds(set, &e.key));
        }
        Some(c)
    }

    /// [`compute`](Self::compute) for every port, in order, spread over
    /// the machine's cores in contiguous runs.
    fn compute_all(
        &self,
        ports: &[ServicePortName],
        node_port_ips: &[IpAddr],
    ) -> Vec<Option<Contribution>> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        // Below this many ports a thread costs more than it saves.
        const PER_THREAD: usize = 2_000;
        let threads = threads.min(ports.len() / PER_THREAD).max(1);
        if threads == 1 {
            return ports
                .iter()
                .map(|p| self.compute(p, node_port_ips))
                .collect();
        }
        let run = ports.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = ports
                .chunks(run)
                .skip(1)
                .map(|chunk| {
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|p| self.compute(p, node_port_ips))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut out: Vec<Option<Contribution>> = ports[..run.min(ports.len())]
                .iter()
                .map(|p| self.compute(p, node_port_ips))
                .collect();
            for w in workers {
                // A worker's panic goes on here, as it would have on this
                // thread.
                out.extend(w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            out
        })
    }

    /// Shared chains some element jumps to, and the chains they need.
    fn wanted_chains(&self) -> BTreeSet<DynChain> {
        let mut out = BTreeSet::new();
        for c in self.chain_refs.keys() {
            out.insert(*c);
            out.extend(c.needs());
        }
        out
    }
}

/// The owner whose element of `key` is programmed: the first in name
/// order, except in `firewall-allow`, where a source range is programmed
/// only for the service port that holds the firewalled destination (the
/// first in name order in `firewall-ips`). Two LoadBalancers on one address
/// and port thus never add up their ranges, and never overlap in the
/// interval set (which the kernel would refuse).
fn holder<'a>(
    slots: &'a Slots,
    set: &str,
    key: &[Value],
    owners: &'a Owners,
) -> Option<&'a (Owner, Arc<Element>)> {
    if set != layout::FIREWALL_ALLOW {
        return owners.first.as_ref();
    }
    let entry = key.get(..key.len().saturating_sub(1))?;
    let winner = slots
        .get(layout::FIREWALL_IPS)?
        .get(entry)?
        .owners
        .winner_owner()?;
    owners.iter().find(|(o, _)| o == winner)
}

/// The keys of `m` that begin with `prefix`, in order.
fn with_prefix<'a, V>(
    m: &'a BTreeMap<Key, V>,
    prefix: &'a [Value],
) -> impl Iterator<Item = &'a Key> {
    use std::ops::Bound;
    m.range::<[Value], _>((Bound::Included(prefix), Bound::Unbounded))
        .map(|(k, _)| k)
        .take_while(move |k| k.starts_with(prefix))
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

/// The slots of one set rebuilt: `kept` (only what the kernel has) joined
/// with the wanted `entries`, both in key order, into a map built in one
/// piece (a B-tree built from sorted entries fills its nodes). A kept
/// element equal to its new winner is replaced by the winner's allocation,
/// so that it is stored once.
fn merged(kept: BTreeMap<Key, Slot>, entries: Vec<(Key, Owners)>) -> BTreeMap<Key, Slot> {
    if kept.is_empty() {
        return entries
            .into_iter()
            .map(|(k, owners)| {
                let slot = Slot {
                    owners,
                    programmed: None,
                };
                (k, slot)
            })
            .collect();
    }
    let mut kept = kept.into_iter().peekable();
    let mut out: Vec<(Key, Slot)> = Vec::with_capacity(entries.len());
    for (k, owners) in entries {
        while let Some(old) = kept.next_if(|(ok, _)| *ok < k) {
            out.push(old);
        }
        let programmed = kept
            .next_if(|(ok, _)| *ok == k)
            .and_then(|(_, s)| s.programmed);
        let programmed = match (programmed, owners.winner()) {
            (Some(p), Some(w)) if *p == **w => Some(w.clone()),
            (p, _) => p,
        };
        out.push((k, Slot { owners, programmed }));
    }
    out.extend(kept);
    out.into_iter().collect()
}

/// The diff of one key of a staged map ([`crate::staging`]) that the
/// kernel has staged (`was`), or that this sync may stage: a jump wanted
/// there stays staged if `keep` allows (and goes to its new target if
/// that changed and `stage` allows), and a new one is staged if `stage`
/// allows; anything else leaves staging and is diffed against the map.
#[allow(clippy::too_many_arguments)]
fn staged_diff(
    (set, key): (&'static str, &Key),
    want: Option<&(Owner, Arc<Element>)>,
    have: Option<&Arc<Element>>,
    was: Option<&Arc<Element>>,
    (keep, stage): (bool, bool),
    deletes: &mut Vec<(&'static str, Arc<Element>)>,
    tx: &mut Transaction,
    out: &mut staging::Changes,
) {
    let jump = want
        .map(|(_, w)| w)
        .and_then(|w| staging::target(w).map(|t| (w, t)));
    // What the map itself has there: nothing, unless a full sync read an
    // element there too (the slot of a staged key otherwise records the
    // staged element).
    let in_map = |was: &Arc<Element>| have.filter(|h| !Arc::ptr_eq(h, was));
    match (was, jump) {
        (Some(h), Some((w, t))) if keep && (stage || staging::target(h) == Some(t)) => {
            if let Some(m) = in_map(h) {
                deletes.push((set, m.clone()));
            }
            let old = staging::target(h);
            if old != Some(t) {
                if let Some(s) = old.and_then(|o| layout::staging_set(set, o)) {
                    tx.delete_element(&s, key.clone());
                }
                if let Some(s) = layout::staging_set(set, t) {
                    tx.add_element(&s, staging::key_of(w));
                }
            }
            out.staged.push((set, key.clone(), w.clone()));
        }
        (Some(h), _) => {
            Staging::delete_ops(tx, set, key, staging::target(h));
            out.unstaged.push((set, key.clone()));
            diff(set, want, in_map(h), deletes, tx);
        }
        (None, Some((w, _))) if stage && !have.is_some_and(|h| Arc::ptr_eq(w, h) || **w == **h) => {
            if let Some(h) = have {
                deletes.push((set, h.clone()));
            }
            Staging::add_ops(tx, set, w);
            out.staged.push((set, key.clone(), w.clone()));
        }
        (None, _) => diff(set, want, have, deletes, tx),
    }
}

fn diff(
    set: &'static str,
    want: Option<&(Owner, Arc<Element>)>,
    have: Option<&Arc<Element>>,
    deletes: &mut Vec<(&'static str, Arc<Element>)>,
    tx: &mut Transaction,
) {
    // Additions go straight into the transaction, as they are found (who
    // wants each is found again only if the kernel refuses it:
    // [`Proxier::blame`]).
    let mut add = |(_, w): &(Owner, Arc<Element>)| tx.add_shared_element(set, w.clone());
    match (want, have) {
        (Some((_, w)), Some(h)) if Arc::ptr_eq(w, h) || w == h => {}
        (Some(w), Some(h)) => {
            deletes.push((set, h.clone()));
            add(w);
        }
        (Some(w), None) => add(w),
        (None, Some(h)) => deletes.push((set, h.clone())),
        (None, None) => {}
    }
}

/// Whether a chain's rules in the kernel are the rules it should have
/// (compared as nft text, which is how they were read back).
fn same_rules(
    have: &[verdict_nft::Rule],
    want: &[verdict_nft::Rule],
    family: verdict_nft::Family,
) -> bool {
    have.len() == want.len()
        && have
            .iter()
            .zip(want)
            .all(|(h, w)| h == w || h.render(family) == w.render(family))
}

/// The first line of an error, at most 300 bytes: enough to say why,
/// short enough for a log line, a metric label or an Event.
fn brief(e: &verdict_nft::NftError) -> String {
    let text = e.to_string();
    let mut line = text.lines().next().unwrap_or_default().to_owned();
    if line.len() > 300 {
        let mut cut = 300;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

/// Whether the backend's refusal may be the fault of some service port's
/// elements (and not, say, a missing `nft`).
fn isolatable(e: &ProxierError) -> bool {
    use verdict_nft::NftError as E;
    matches!(
        e,
        ProxierError::Nft(
            E::Invalid(_) | E::NotFound(_) | E::AlreadyExists(_) | E::Busy(_) | E::Refused(_)
        )
    )
}

/// Call after a full sync, once its result has been used: see
/// [`verdict_model::settle_allocator`].
pub fn settle_allocator() {
    verdict_model::settle_allocator();
}

/// Element additions of one service port the backend refused.
struct Refused {
    owner: Owner,
    /// Indices in the transaction of the refused additions.
    ops: Vec<usize>,
    /// The backend's reason.
    reason: String,
}

impl Refused {
    /// Leaves the refused elements out (in `q`) and says which they were
    /// and why. A destination whose `firewall-ips` element is refused is
    /// not forwarded either: it would be open to every source.
    fn quarantine(&self, tx: &Transaction, q: &mut Quarantine) -> String {
        let mut named = Vec::new();
        for &i in &self.ops {
            let Some(verdict_nft::Op::AddElement(set, e)) = tx.ops().get(i) else {
                continue;
            };
            let name = tx.set_name(*set);
            let Some(set) = static_set_name(name).or_else(|| layout::map_of_staging(name)) else {
                continue;
            };
            let key: Arc<[Value]> = e.key.clone();
            if set == layout::FIREWALL_IPS {
                q.elements
                    .entry(layout::SERVICE_IPS)
                    .or_default()
                    .insert(key.clone());
            }
            q.elements.entry(set).or_default().insert(key);
            let mut text = e
                .key
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" . ");
            if let Some(v) = &e.value {
                text.push_str(&format!(" : {v}"));
            }
            named.push(format!("{set} element {text}"));
        }
        let shown = named.len().min(3);
        let mut what = named[..shown].join(", ");
        if named.len() > shown {
            what.push_str(&format!(" and {} more", named.len() - shown));
        }
        let reason = format!("the kernel refused {what}: {}", self.reason);
        if q.reason.is_empty() {
            q.reason = reason.clone();
        } else {
            q.reason = format!("{}; {reason}", q.reason);
        }
        reason
    }
}

/// Finds the element additions that make `tx` fail, and the service ports
/// they belong to, with dry runs (`Backend::check`) of parts of it.
/// Everything that is not an element addition of some port (chains,
/// rules, deletions) is always kept; if that alone fails, no port is to
/// blame and the error is returned. First the ports (each port's additions
/// as one unit), then, for each port found, its additions one by one with
/// everything of the other ports that is not refused: only the elements
/// that fail are left out, so the port's other addresses and node port
/// keep working.
fn isolate<B: Backend + ?Sized>(
    backend: &mut B,
    tx: &Transaction,
    owners: &[Option<Owner>],
) -> Result<Vec<Refused>, verdict_nft::NftError> {
    let mut by_owner: BTreeMap<&Owner, Vec<usize>> = BTreeMap::new();
    for (i, o) in owners.iter().enumerate() {
        if let Some(o) = o {
            by_owner.entry(o).or_default().push(i);
        }
    }
    let (ports, units): (Vec<&Owner>, Vec<Vec<usize>>) = by_owner.into_iter().unzip();
    let mut check = |allowed: &dyn Fn(usize) -> bool| {
        let part = tx.filtered(|i, _| owners[i].is_none() || allowed(i));
        backend.check(&part)
    };
    check(&|_| false)?;

    let bad_ports = refused_units(&mut check, &BTreeSet::new(), &units);
    let bad: BTreeSet<usize> = bad_ports.iter().map(|(u, _)| *u).collect();
    let mut base: BTreeSet<usize> = units
        .iter()
        .enumerate()
        .filter(|(u, _)| !bad.contains(u))
        .flat_map(|(_, ops)| ops.iter().copied())
        .collect();
    let mut out = Vec::new();
    for (u, reason) in bad_ports {
        let singles: Vec<Vec<usize>> = units[u].iter().map(|&i| vec![i]).collect();
        let refused = refused_units(&mut check, &base, &singles);
        let (ops, reason) = match refused.first() {
            // Refused only as a whole (it should not be): all of it.
            None => (units[u].clone(), reason),
            Some((_, first)) => (
                refused.iter().map(|(j, _)| singles[*j][0]).collect(),
                first.clone(),
            ),
        };
        base.extend(units[u].iter().filter(|i| !ops.contains(i)));
        out.push(Refused {
            owner: ports[u].clone(),
            ops,
            reason,
        });
    }
    Ok(out)
}

/// A dry run of the failed transaction with the element additions a
/// predicate allows (everything else is always in it).
type DryRun<'a> = dyn FnMut(&dyn Fn(usize) -> bool) -> Result<(), verdict_nft::NftError> + 'a;

/// Which of `units` (groups of operations, in name order) the backend
/// refuses when added to the operations of `base`, with its reason. A unit
/// refused on its own is found by bisection (about 2·log₂ n dry runs
/// each); units that are refused only together are resolved in order, the
/// later one losing, as `Owners` decides.
fn refused_units(
    check: &mut DryRun<'_>,
    base: &BTreeSet<usize>,
    units: &[Vec<usize>],
) -> Vec<(usize, String)> {
    let unit_of: BTreeMap<usize, usize> = units
        .iter()
        .enumerate()
        .flat_map(|(u, ops)| ops.iter().map(move |&i| (i, u)))
        .collect();
    let mut attempt = |picked: &BTreeSet<usize>| {
        check(&|i| base.contains(&i) || unit_of.get(&i).is_some_and(|u| picked.contains(u)))
    };

    // Refused on their own.
    let all: Vec<usize> = (0..units.len()).collect();
    let mut bad: Vec<(usize, String)> = Vec::new();
    let mut pending: Vec<&[usize]> = vec![&all];
    while let Some(part) = pending.pop() {
        let Err(e) = attempt(&part.iter().copied().collect()) else {
            continue;
        };
        match part {
            [] => {}
            [one] => bad.push((*one, brief(&e))),
            _ => {
                let (a, b) = part.split_at(part.len() / 2);
                pending.push(b);
                pending.push(a);
            }
        }
    }

    // Refused only together with others: the shortest failing prefix ends
    // with one to blame.
    let rest: Vec<usize> = all
        .iter()
        .copied()
        .filter(|u| !bad.iter().any(|(b, _)| b == u))
        .collect();
    let mut blamed: BTreeSet<usize> = BTreeSet::new();
    let prefix = |end: usize, blamed: &BTreeSet<usize>| -> BTreeSet<usize> {
        rest[..end]
            .iter()
            .copied()
            .filter(|u| !blamed.contains(u))
            .collect()
    };
    let mut start = 0;
    while blamed.len() < MAX_CONFLICTS {
        if start >= rest.len() || attempt(&prefix(rest.len(), &blamed)).is_ok() {
            break;
        }
        // prefix(hi) fails, prefix(start) passes.
        let (mut lo, mut hi) = (start + 1, rest.len());
        let mut reason = String::new();
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match attempt(&prefix(mid, &blamed)) {
                Err(e) => {
                    hi = mid;
                    reason = brief(&e);
                }
                Ok(()) => lo = mid + 1,
            }
        }
        if reason.is_empty()
            && let Err(e) = attempt(&prefix(hi, &blamed))
        {
            reason = brief(&e);
        }
        let culprit = rest[hi - 1];
        blamed.insert(culprit);
        bad.push((culprit, format!("refused together with others: {reason}")));
        start = hi;
    }
    bad
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use verdict_model::Protocol;

    fn owner(name: &str) -> Owner {
        Arc::new(ServicePortName::new("ns", name, "p", Protocol::Tcp))
    }

    fn element(port: u16) -> Arc<Element> {
        Arc::new(Element::key(vec![Value::Port(port)]))
    }

    fn names(o: &Owners) -> Vec<String> {
        o.iter().map(|(o, _)| o.service.name.to_string()).collect()
    }

    /// The first owner in name order wins, whatever the order they came
    /// in; one owner is kept without a list.
    #[test]
    fn owners_stay_in_name_order() {
        let mut o = Owners::default();
        assert!(o.is_empty() && o.winner().is_none());
        o.insert(owner("m"), element(1));
        assert_eq!((o.len(), o.rest.is_none()), (1, true));
        o.insert(owner("z"), element(2));
        o.insert(owner("a"), element(3));
        o.insert(owner("q"), element(4));
        assert_eq!(names(&o), ["a", "m", "q", "z"]);
        assert_eq!(o.winner(), Some(&element(3)));
        // Again: replaced in place.
        o.insert(owner("q"), element(5));
        assert_eq!(o.len(), 4);
        assert_eq!(o.iter().nth(2).map(|(_, e)| e), Some(&element(5)));
        // The winner goes: the next in name order wins.
        o.remove(&owner("a"));
        assert_eq!(names(&o), ["m", "q", "z"]);
        assert_eq!(
            o.winner_owner().map(|w| w.service.name.to_string()),
            Some("m".into())
        );
        o.remove(&owner("q"));
        o.remove(&owner("nobody"));
        assert_eq!(names(&o), ["m", "z"]);
        o.remove(&owner("m"));
        // One left: the list of others is gone.
        assert_eq!((names(&o), o.rest.is_none()), (vec!["z".to_string()], true));
        o.remove(&owner("z"));
        assert!(o.is_empty());
        assert_eq!(std::mem::size_of::<Owners>(), 24);
        // A key's owners and what the kernel has, one entry of one map.
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    fn key(port: u16) -> Key {
        Arc::from(vec![Value::Port(port)])
    }

    /// A rebuild joins what the kernel has with what is wanted: every key
    /// of either is kept, a kernel element equal to its new winner becomes
    /// the winner's own allocation, and a different one stays as the
    /// kernel has it (for the diff to replace).
    #[test]
    fn a_rebuild_keeps_what_the_kernel_has_beside_what_is_wanted() {
        let kernel = |port: u16| Slot::of_kernel(element(port));
        let kept: BTreeMap<Key, Slot> = [
            (key(1), kernel(1)),
            (key(2), kernel(2)),
            (
                key(3),
                Slot::of_kernel(Arc::new(Element::key(vec![Value::Int(3)]))),
            ),
        ]
        .into_iter()
        .collect();
        let wanted = |port: u16| {
            let mut o = Owners::default();
            o.insert(owner("a"), element(port));
            o
        };
        let entries = vec![
            (key(1), wanted(1)),
            (key(3), wanted(3)),
            (key(4), wanted(4)),
        ];
        let winner_1 = entries[0].1.winner().cloned().unwrap();
        let m = merged(kept, entries);
        assert_eq!(m.keys().cloned().collect::<Vec<_>>(), [1, 2, 3, 4].map(key));
        // Equal: shared with the winner.
        let s1 = &m[&key(1)];
        assert!(Arc::ptr_eq(s1.programmed.as_ref().unwrap(), &winner_1));
        // Nobody wants it: the kernel's, for the diff to delete.
        assert!(m[&key(2)].owners.is_empty() && m[&key(2)].programmed.is_some());
        // Different: the kernel's stays.
        assert_eq!(
            m[&key(3)].programmed.as_deref(),
            Some(&Element::key(vec![Value::Int(3)]))
        );
        assert_eq!(m[&key(3)].owners.len(), 1);
        // New: not programmed yet.
        assert!(m[&key(4)].programmed.is_none() && !m[&key(4)].is_unused());
    }
}
