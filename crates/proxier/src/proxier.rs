//! The proxier of one IP family: takes Service and EndpointSlice changes,
//! and on `sync` moves the kernel from what it has to what it should have
//! with the smallest transaction.
//!
//! A partial sync recomputes only the services that changed and emits only
//! the elements whose value changed, so a sync with no change emits nothing.
//! A full sync (the first one, after any failure, and hourly) reads the
//! table back, rewrites every chain and diffs every element.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_model::{
    EndpointSlice, EndpointsChangeTracker, EndpointsMap, NamespacedName, Service,
    ServiceChangeTracker, ServicePortMap, ServicePortName,
};
use verdict_nft::{Backend, Chain, Element, ElementValue, Op, Transaction, Value};

use crate::config::ProxierConfig;
use crate::error::ProxierError;
use crate::layout::{self, DynChain};
use crate::plan::{Contribution, EndpointSet, SetKey, contribution};

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
    /// Services touched by this sync.
    pub updated_services: BTreeSet<NamespacedName>,
    /// Trigger times of the endpoint changes this sync programmed.
    pub last_change_trigger_times: BTreeMap<NamespacedName, Vec<String>>,
}

/// A service port, shared by every element it owns.
type Owner = Arc<ServicePortName>;

/// The owners of one element key and what each wants there. The first
/// owner in name order wins, so the outcome never depends on event order.
#[derive(Debug, Default)]
struct Owners(Vec<(Owner, Element)>);

impl Owners {
    fn insert(&mut self, owner: Owner, e: Element) {
        match self.0.binary_search_by(|(o, _)| o.as_ref().cmp(&owner)) {
            Ok(i) => self.0[i].1 = e,
            Err(i) => self.0.insert(i, (owner, e)),
        }
    }

    fn remove(&mut self, owner: &ServicePortName) {
        if let Ok(i) = self.0.binary_search_by(|(o, _)| o.as_ref().cmp(owner)) {
            self.0.remove(i);
        }
    }

    fn winner(&self) -> Option<&Element> {
        self.0.first().map(|(_, e)| e)
    }
}

/// What a service port contributed, without the elements themselves (they
/// live once, in `desired`).
#[derive(Debug)]
struct Stored {
    keys: Vec<SetKey>,
    chains: BTreeSet<DynChain>,
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
    /// Desired elements: set → key → owners.
    desired: BTreeMap<&'static str, BTreeMap<Vec<Value>, Owners>>,
    /// Elements believed to be in the kernel.
    programmed: BTreeMap<&'static str, BTreeMap<Vec<Value>, Element>>,
    chain_refs: BTreeMap<DynChain, usize>,
    /// Shared chains with rules in the kernel.
    programmed_chains: BTreeSet<String>,
    /// Emptied chains awaiting deletion, with when they were emptied.
    stale_chains: BTreeMap<String, Instant>,
    /// Affinity entries → owner → endpoints an affinity element for that
    /// entry may name.
    affinity_allowed: BTreeMap<Vec<Value>, BTreeMap<ServicePortName, EndpointSet>>,
    /// The affinity map may hold entries naming endpoints that are no longer
    /// allowed: check it after the next successful transaction.
    affinity_dirty: bool,
    /// Service ports with internal / external Local policy and no local endpoint.
    no_local: (usize, usize),
    need_full_sync: bool,
    last_full_sync: Option<Instant>,
}

impl Proxier {
    /// A proxier for one family. Nothing is programmed until [`Proxier::sync`].
    pub fn new(cfg: ProxierConfig) -> Result<Proxier, ProxierError> {
        cfg.validate()?;
        Ok(Proxier {
            service_changes: ServiceChangeTracker::new(cfg.family),
            endpoint_changes: EndpointsChangeTracker::new(cfg.family, cfg.node_name.clone()),
            cfg,
            services: ServicePortMap::new(),
            endpoints: EndpointsMap::new(),
            contributions: BTreeMap::new(),
            desired: BTreeMap::new(),
            programmed: BTreeMap::new(),
            chain_refs: BTreeMap::new(),
            programmed_chains: BTreeSet::new(),
            stale_chains: BTreeMap::new(),
            affinity_allowed: BTreeMap::new(),
            affinity_dirty: false,
            no_local: (0, 0),
            need_full_sync: true,
            last_full_sync: None,
        })
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
        Ok(())
    }

    /// A Service event (`None` before an add or after a delete). Returns
    /// whether a sync is needed.
    pub fn on_service(&mut self, previous: Option<&Service>, current: Option<&Service>) -> bool {
        self.service_changes.update(previous, current)
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

    /// Invalid objects seen since the last call (they are proxied as if
    /// they had no ports).
    pub fn take_errors(&mut self) -> Vec<verdict_model::ModelError> {
        self.service_changes.take_errors()
    }

    /// Forces the next sync to be a full one.
    pub fn force_full_sync(&mut self) {
        self.need_full_sync = true;
    }

    /// Programs the kernel. `now` drives stale-chain ageing and the hourly
    /// full sync.
    pub fn sync<B: Backend>(
        &mut self,
        backend: &mut B,
        now: Instant,
    ) -> Result<SyncResult, ProxierError> {
        let full = self.need_full_sync
            || self
                .last_full_sync
                .is_none_or(|t| now.saturating_duration_since(t) >= FULL_SYNC_PERIOD);
        let svc = self.service_changes.apply(&mut self.services);
        let eps = self.endpoint_changes.apply(&mut self.endpoints);
        let mut result = SyncResult {
            full,
            last_change_trigger_times: eps.last_change_trigger_times,
            ..SyncResult::default()
        };
        result.updated_services = svc.updated_services;
        result.updated_services.extend(eps.updated_services);

        match self.sync_inner(backend, now, full, &mut result) {
            Ok(()) => {
                self.need_full_sync = false;
                if full {
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

    fn sync_inner<B: Backend>(
        &mut self,
        backend: &mut B,
        now: Instant,
        full: bool,
        result: &mut SyncResult,
    ) -> Result<(), ProxierError> {
        let family = self.cfg.nft_family();
        let table = self.cfg.table.clone();
        result.stale_chains_deleted = self.delete_stale_chains(backend, now)?;
        if full {
            // Affinity entries left by an earlier run (or from before a
            // failure) are checked against what every service allows now.
            self.affinity_dirty = true;
        }

        // What the kernel has, on a full sync. A table we cannot read (say,
        // a rule someone added by hand) is replaced as a whole, atomically.
        let mut replace_table = false;
        let existing = if full {
            match backend.table(family, &table) {
                Ok(t) => Some(t.unwrap_or_default()),
                Err(verdict_nft::NftError::Parse(_)) => {
                    replace_table = true;
                    self.stale_chains.clear();
                    Some(verdict_nft::TableState::default())
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };

        // Recompute the contributions of the service ports that changed.
        let ports: BTreeSet<ServicePortName> = if full {
            self.services
                .keys()
                .chain(self.contributions.keys())
                .cloned()
                .collect()
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
            ports
        };
        let node_port_ips = self.cfg.node_port_ips();
        // A full sync diffs every key anyway; a partial one only the keys
        // the recomputed ports touched.
        let mut touched: Option<BTreeSet<SetKey>> = (!full).then(BTreeSet::new);
        for port in &ports {
            if let Some(old) = self.contributions.remove(port) {
                self.withdraw(port, &old, touched.as_mut());
            }
            let new = self.services.get(port).map(|sp| {
                let eps = self.endpoints.get(port).map(Vec::as_slice).unwrap_or(&[]);
                contribution(&self.cfg, sp, eps, &node_port_ips)
            });
            if let Some(new) = new {
                let stored = self.contribute(Arc::new(port.clone()), new, touched.as_mut());
                self.contributions.insert(port.clone(), stored);
            }
        }
        result.no_local_endpoints_internal = self.no_local.0;
        result.no_local_endpoints_external = self.no_local.1;

        let mut tx = Transaction::new(family, &table);
        if replace_table {
            tx.add_table(None);
            tx.delete_table();
        }
        let wanted = self.wanted_chains();
        let mut chains_now: BTreeSet<String> = self.programmed_chains.clone();
        if let Some(existing) = &existing {
            self.write_fixed(&mut tx, existing);
            // What is really there replaces what we believed.
            self.programmed = BTreeMap::new();
            for set in layout::sets(&self.cfg) {
                let name = static_set_name(&set.name);
                if let (Some(name), Some(s)) = (name, existing.sets.get(&set.name))
                    && name != layout::AFFINITY
                    && s.set.same_type(&set)
                {
                    self.programmed.insert(name, s.elements.clone());
                }
            }
            chains_now = existing
                .chains
                .keys()
                .filter(|c| !is_fixed_chain(c))
                .cloned()
                .collect();
            // Everything in the table is ours: rewrite every chain we keep.
            self.stale_chains
                .retain(|c, _| existing.chains.contains_key(c));
        }

        // Shared chains: (re)write new ones, in dependency order.
        let mut order: Vec<DynChain> = wanted.iter().copied().collect();
        order.sort_by_key(|c| !c.needs().is_empty());
        for chain in order {
            let name = chain.to_string();
            let fresh = !chains_now.contains(&name) || self.stale_chains.contains_key(&name);
            if full || fresh {
                tx.add_chain(Chain::regular(&name));
                if !fresh || full {
                    tx.flush_chain(&name);
                }
                for rule in chain.rules(&self.cfg) {
                    tx.add_rule(&name, rule);
                }
                self.stale_chains.remove(&name);
            }
        }

        // Elements: delete what changed or went away, then add.
        let mut deletes: Vec<(&'static str, Vec<Value>)> = Vec::new();
        let mut adds: Vec<(&'static str, Element)> = Vec::new();
        match &touched {
            Some(touched) => {
                for (set, key) in touched {
                    let want = self
                        .desired
                        .get(set)
                        .and_then(|m| m.get(key))
                        .and_then(Owners::winner);
                    let have = self.programmed.get(set).and_then(|m| m.get(key));
                    diff(set, key, want, have, &mut deletes, &mut adds);
                }
            }
            None => {
                // Full: walk desired and programmed side by side, set by set.
                let empty = BTreeMap::new();
                let mut names: BTreeSet<&'static str> = self.desired.keys().copied().collect();
                names.extend(
                    self.programmed
                        .keys()
                        .filter(|s| **s != layout::NODEPORT_IPS),
                );
                for set in names {
                    let want = self.desired.get(set).unwrap_or(&empty);
                    let have = self.programmed.get(set);
                    let mut w = want.iter().peekable();
                    let mut h = have.into_iter().flatten().peekable();
                    loop {
                        let order = match (w.peek(), h.peek()) {
                            (None, None) => break,
                            (Some(_), None) => std::cmp::Ordering::Less,
                            (None, Some(_)) => std::cmp::Ordering::Greater,
                            (Some((wk, _)), Some((hk, _))) => wk.cmp(hk),
                        };
                        match order {
                            std::cmp::Ordering::Less => {
                                if let Some((k, o)) = w.next() {
                                    diff(set, k, o.winner(), None, &mut deletes, &mut adds);
                                }
                            }
                            std::cmp::Ordering::Greater => {
                                if let Some((k, e)) = h.next() {
                                    diff(set, k, None, Some(e), &mut deletes, &mut adds);
                                }
                            }
                            std::cmp::Ordering::Equal => {
                                if let (Some((k, o)), Some((_, e))) = (w.next(), h.next()) {
                                    diff(set, k, o.winner(), Some(e), &mut deletes, &mut adds);
                                }
                            }
                        }
                    }
                }
                // NodePort addresses are owned by the node, not by services.
                let have = self
                    .programmed
                    .get(layout::NODEPORT_IPS)
                    .cloned()
                    .unwrap_or_default();
                let want: BTreeMap<Vec<Value>, Element> = node_port_ips
                    .iter()
                    .map(|ip| (vec![Value::Addr(*ip)], Element::key(vec![Value::Addr(*ip)])))
                    .collect();
                for k in have.keys().chain(want.keys()).collect::<BTreeSet<_>>() {
                    diff(
                        layout::NODEPORT_IPS,
                        k,
                        want.get(k),
                        have.get(k),
                        &mut deletes,
                        &mut adds,
                    );
                }
            }
        }
        for (set, key) in deletes {
            tx.delete_element(set, key);
        }
        for (set, e) in adds {
            tx.add_element(set, e);
        }

        // Chains nobody jumps to any more: empty them now, delete them later.
        let wanted_names: BTreeSet<String> = wanted.iter().map(|c| c.to_string()).collect();
        for name in chains_now.difference(&wanted_names) {
            if !self.stale_chains.contains_key(name) {
                tx.flush_chain(name);
                self.stale_chains.insert(name.clone(), now);
            } else if full {
                tx.flush_chain(name);
            }
        }

        result.operations = tx.len();
        if !tx.is_empty() {
            backend.run(&tx)?;
        }
        // The kernel has it now: record the element changes.
        for op in tx.into_ops() {
            match op {
                Op::DeleteElement(set, key) => {
                    if let Some(m) = static_set_name(&set).and_then(|s| self.programmed.get_mut(s))
                    {
                        m.remove(&key);
                    }
                }
                Op::AddElement(set, e) => {
                    if let Some(s) = static_set_name(&set) {
                        self.programmed
                            .entry(s)
                            .or_default()
                            .insert(e.key.clone(), e);
                    }
                }
                _ => {}
            }
        }
        self.programmed_chains = wanted_names;
        Ok(())
    }

    /// The table, base chains, fixed chains and sets of a full sync.
    fn write_fixed(&self, tx: &mut Transaction, existing: &verdict_nft::TableState) {
        tx.add_table(Some(layout::TABLE_COMMENT));
        // Rewrite everything: empty every chain first, so that sets can be
        // replaced and base chains re-created with the right priorities.
        for name in existing.chains.keys() {
            tx.flush_chain(name);
        }
        let fixed = layout::fixed_chains(&self.cfg);
        for (chain, _) in &fixed {
            if let Some(old) = existing.chains.get(&chain.name)
                && old.chain.base != chain.base
            {
                tx.delete_chain(&chain.name);
            }
        }
        let sets = layout::sets(&self.cfg);
        for (name, old) in &existing.sets {
            if !sets
                .iter()
                .any(|s| s.name == *name && s.same_type(&old.set))
            {
                tx.delete_set(name);
            }
        }
        for (chain, _) in &fixed {
            tx.add_chain(chain.clone());
        }
        for set in sets {
            tx.add_set(set);
        }
        for (chain, rules) in fixed {
            if !existing.chains.contains_key(&chain.name) {
                tx.flush_chain(&chain.name);
            }
            for rule in rules {
                tx.add_rule(&chain.name, rule);
            }
        }
    }

    /// Deletes chains emptied long enough ago, in their own transaction.
    fn delete_stale_chains<B: Backend>(
        &mut self,
        backend: &mut B,
        now: Instant,
    ) -> Result<usize, ProxierError> {
        let due: Vec<String> = self
            .stale_chains
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= REMOVE_STALE_CHAINS_AFTER)
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
    fn purge_affinity<B: Backend>(&mut self, backend: &mut B) -> usize {
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
                tx.delete_element(layout::AFFINITY, e.key);
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
        for (set, key) in &c.keys {
            if let Some(m) = self.desired.get_mut(set)
                && let Some(owners) = m.get_mut(key)
            {
                owners.remove(owner);
                if owners.0.is_empty() {
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

    fn contribute(
        &mut self,
        owner: Owner,
        c: Contribution,
        mut touched: Option<&mut BTreeSet<SetKey>>,
    ) -> Stored {
        for (entry, allowed) in &c.affinity {
            self.affinity_allowed
                .entry(entry.clone())
                .or_default()
                .insert(owner.as_ref().clone(), allowed.clone());
            self.affinity_dirty = true;
        }
        self.no_local.0 += usize::from(c.no_local_internal);
        self.no_local.1 += usize::from(c.no_local_external);
        let mut keys = Vec::with_capacity(c.elements.len());
        for (set, e) in c.elements {
            if let Some(t) = touched.as_deref_mut() {
                t.insert((set, e.key.clone()));
            }
            keys.push((set, e.key.clone()));
            self.desired
                .entry(set)
                .or_default()
                .entry(e.key.clone())
                .or_default()
                .insert(owner.clone(), e);
        }
        for chain in &c.chains {
            *self.chain_refs.entry(*chain).or_default() += 1;
        }
        Stored {
            keys,
            chains: c.chains,
            no_local_internal: c.no_local_internal,
            no_local_external: c.no_local_external,
            affinity: c.affinity,
        }
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

fn diff(
    set: &'static str,
    key: &[Value],
    want: Option<&Element>,
    have: Option<&Element>,
    deletes: &mut Vec<(&'static str, Vec<Value>)>,
    adds: &mut Vec<(&'static str, Element)>,
) {
    match (want, have) {
        (Some(w), Some(h)) if w == h => {}
        (Some(w), Some(_)) => {
            deletes.push((set, key.to_vec()));
            adds.push((set, w.clone()));
        }
        (Some(w), None) => adds.push((set, w.clone())),
        (None, Some(_)) => deletes.push((set, key.to_vec())),
        (None, None) => {}
    }
}

fn is_fixed_chain(name: &str) -> bool {
    [
        layout::FILTER_PREROUTING_PRE_DNAT,
        layout::FILTER_OUTPUT_PRE_DNAT,
        layout::FILTER_INPUT,
        layout::FILTER_FORWARD,
        layout::FILTER_OUTPUT,
        layout::NAT_PREROUTING,
        layout::NAT_OUTPUT,
        layout::NAT_POSTROUTING,
        layout::SERVICES,
        layout::MASQUERADING,
        layout::FIREWALL_CHECK,
        layout::SERVICE_ENDPOINTS_CHECK,
        layout::NODEPORT_ENDPOINTS_CHECK,
        layout::CLUSTER_IPS_CHECK,
        layout::REJECT_CHAIN,
        layout::AFFINITY_RECORD,
    ]
    .contains(&name)
}

/// Our static name for a set, if it is one of ours.
fn static_set_name(name: &str) -> Option<&'static str> {
    [
        layout::CLUSTER_IPS,
        layout::NODEPORT_IPS,
        layout::SERVICE_IPS,
        layout::SERVICE_NODEPORTS,
        layout::NO_ENDPOINT_SERVICES,
        layout::NO_ENDPOINT_NODEPORTS,
        layout::FIREWALL_IPS,
        layout::FIREWALL_ALLOW,
        layout::HAIRPIN_CONNECTIONS,
        layout::SERVICE_ENDPOINTS_TCP,
        layout::SERVICE_ENDPOINTS_UDP,
        layout::SERVICE_ENDPOINTS_SCTP,
        layout::AFFINITY,
        layout::AFFINITY_SERVICES,
    ]
    .into_iter()
    .find(|n| *n == name)
}
