//! The contributions of the service ports: what each one asks of the
//! table, recorded in the slot ledger ([`super::ledger`]) with who wants
//! each key, and withdrawn when it changes. A rebuild computes every
//! port's contribution on all cores and records them in one piece; a
//! partial sync withdraws and records only the ports that changed, noting
//! the keys it touched for the plan to diff.

use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::net::IpAddr;
use std::sync::Arc;

use verdict_model::ServicePortName;
use verdict_nft::Element;

use super::ledger::{Key, Owner, Owners, SetKey, Slot, merged};
use super::{DESTINATIONS, PortElement, Proxier};
use crate::contribution::{Contribution, contribution};
use crate::layout::{DynChain, SetRef};

/// What a service port contributed, without the elements themselves (they
/// live once, in the slots).
#[derive(Debug)]
pub(super) struct Stored {
    /// Each element's set (a byte, where its name takes sixteen) and the
    /// port's own element (its claim on the key), in the contribution's
    /// order: 180,000 at 30,000 Services. The read model's intent of the
    /// port shares the list.
    pub(super) elements: Arc<[PortElement]>,
    /// In order. A list, not a set: a port jumps to one shared chain or a
    /// few, and a `BTreeSet` allocates room for 11 (30,000 ports).
    pub(super) chains: Box<[DynChain]>,
    pub(super) no_local_internal: bool,
    pub(super) no_local_external: bool,
    pub(super) affinity: Vec<crate::contribution::AffinityEntry>,
}

impl Proxier {
    pub(super) fn withdraw(
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
    pub(super) fn contribute_all(
        &mut self,
        ports: &[ServicePortName],
        computed: Vec<Option<Contribution>>,
    ) {
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
    pub(super) fn claims(
        &self,
        owner: &ServicePortName,
        elements: &[PortElement],
    ) -> Arc<[PortElement]> {
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
    pub(super) fn account(
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

    pub(super) fn contribute(
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

    /// Records the elements read back from `set` as what the kernel has
    /// (its slots hold nothing programmed yet): each shares its slot's key
    /// and, where it is the winner's element (it nearly always is), the
    /// winner's allocation, so each is stored once. The read-back and the
    /// slots are both in key order, so they are walked side by side
    /// instead of searching one for each of the other (a restart adopts
    /// 180,000 elements at 30,000 Services).
    pub(super) fn adopt(&mut self, set: &'static str, read: BTreeMap<Key, Element>) {
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
    pub(super) fn compute(
        &self,
        port: &ServicePortName,
        node_port_ips: &[IpAddr],
    ) -> Option<Contribution> {
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
    pub(super) fn compute_all(
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
    pub(super) fn wanted_chains(&self) -> BTreeSet<DynChain> {
        let mut out = BTreeSet::new();
        for c in self.chain_refs.keys() {
            out.insert(*c);
            out.extend(c.needs());
        }
        out
    }
}
