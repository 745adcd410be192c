//! The plan: pure, from the ledger, the staging and what the kernel has
//! (read back on a full sync), the transaction that moves the kernel to
//! what it should have, and what to record once it has it. Nothing here
//! reads or writes the kernel, or changes the proxier.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use verdict_nft::{Chain, Element, Rule, Transaction, Value};

use super::{Adopted, Plan};
use crate::layout::{self, DynChain};
use crate::proxier::Proxier;
use crate::proxier::ledger::{Key, Owner, SetKey, holder};
use crate::staging::{self, Staging};

/// The rules a chain has in the kernel (`None`: no such chain, or a
/// partial sync, which reads nothing).
type RulesNow<'a> = dyn Fn(&str) -> Option<&'a [Rule]> + 'a;

impl Proxier {
    /// The transaction of a sync that began with `tx` (the adopted
    /// read-back's), and what to record once the kernel has it: the
    /// shared chains, the staging, the elements of the keys `touched`
    /// (every key, on a `full` sync), and the chains nobody jumps to.
    pub(super) fn plan(
        &self,
        mut tx: Transaction,
        adopted: &Adopted,
        touched: Option<&BTreeSet<SetKey>>,
        full: bool,
        now: Instant,
    ) -> Plan {
        let kernel = adopted.kernel.as_ref();
        let rules_now = |name: &str| {
            kernel
                .and_then(|t| t.chains.get(name))
                .map(|c| c.rules.as_slice())
        };
        let wanted = self.wanted_chains();
        self.plan_chains(&mut tx, &wanted, adopted, full, &rules_now);
        let wanted_targets: BTreeSet<(&'static str, String)> = wanted
            .iter()
            .flat_map(|c| c.staged_in().iter().map(move |m| (*m, c.to_string())))
            .collect();
        let compact = self.compacts(&tx, &wanted_targets, full, now, &rules_now);
        let mut staged = staging::Changes::default();
        let mut staging_sets_gone = Vec::new();
        if compact {
            staging_sets_gone =
                self.plan_compaction(&mut tx, &wanted_targets, adopted.rebuilt, full, &rules_now);
            staged.compacted = Some(wanted_targets.clone());
        }
        let fixed_ops = tx.len();
        self.plan_elements(
            &mut tx,
            touched,
            compact,
            &adopted.staging_junk,
            &mut staged,
        );
        // Staging sets of chains nobody wants go once their rules and
        // elements have.
        for set in &staging_sets_gone {
            tx.delete_set(set);
        }
        let wanted_chains: BTreeSet<String> = wanted.iter().map(|c| c.to_string()).collect();
        let emptied = self.plan_unwanted_chains(&mut tx, adopted, &wanted_chains, full, &rules_now);
        Plan {
            tx,
            fixed_ops,
            staged,
            wanted_targets,
            wanted_chains,
            emptied,
        }
    }

    /// Shared chains: new ones written, in dependency order; on a full
    /// sync, those whose rules differ from what they should be rewritten.
    fn plan_chains(
        &self,
        tx: &mut Transaction,
        wanted: &BTreeSet<DynChain>,
        adopted: &Adopted,
        full: bool,
        rules_now: &RulesNow<'_>,
    ) {
        let family = self.cfg.nft_family();
        let mut order: Vec<DynChain> = wanted.iter().copied().collect();
        order.sort_by_key(|c| !c.needs().is_empty());
        for chain in order {
            let name = chain.to_string();
            let rules = chain.rules(&self.cfg);
            let fresh =
                !adopted.chains_now.contains(&name) || self.stale_chains.contains_key(&name);
            let differs = adopted.rebuilt
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
        }
    }

    /// Whether this transaction compacts staging ([`crate::staging`]): one
    /// that validates the table anyway (it writes a rule: a full sync, a
    /// new shared chain), one whose staging chains must be rewritten, or
    /// one whose time has come. Any other stages the jumps it adds.
    fn compacts(
        &self,
        tx: &Transaction,
        wanted_targets: &BTreeSet<(&'static str, String)>,
        full: bool,
        now: Instant,
        rules_now: &RulesNow<'_>,
    ) -> bool {
        let family = self.cfg.nft_family();
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
        validates
            || staging_chains_differ
            || !wanted_targets.is_subset(self.staging.targets())
            || self.staging.due().is_some_and(|t| now >= t)
    }

    /// A compaction: the staging chains and sets become those of the
    /// wanted chains (every staged element moves into its map in the
    /// element diff). Returns the staging sets to delete after.
    fn plan_compaction(
        &self,
        tx: &mut Transaction,
        wanted_targets: &BTreeSet<(&'static str, String)>,
        rebuilt: bool,
        full: bool,
        rules_now: &RulesNow<'_>,
    ) -> Vec<String> {
        let family = self.cfg.nft_family();
        // (On a full sync, the staging sets the kernel has.)
        let have_targets = self.staging.targets();
        for (m, t) in wanted_targets.difference(have_targets) {
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
            let (want, had) = (of(wanted_targets), of(have_targets));
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
        have_targets
            .difference(wanted_targets)
            .filter_map(|(m, t)| layout::staging_set(m, t))
            .collect()
    }

    /// Elements: delete what changed or went away, then add (each addition
    /// the element of the service port that holds its key, to blame it if
    /// the kernel refuses it). The additions go straight into the
    /// transaction, with room for as many as a full sync can make (room
    /// never written is never resident); the deletions are put before
    /// them once known.
    fn plan_elements(
        &self,
        tx: &mut Transaction,
        touched: Option<&BTreeSet<SetKey>>,
        compact: bool,
        staging_junk: &[(String, Key)],
        staged: &mut staging::Changes,
    ) {
        let fixed_ops = tx.len();
        let node_port_ips = self.cfg.node_port_ips();
        tx.reserve(match touched {
            Some(t) => t.len(),
            None => self.slots.values().map(BTreeMap::len).sum::<usize>() + node_port_ips.len(),
        });
        let mut deletes: Vec<(&'static str, Arc<Element>)> = Vec::new();
        match touched {
            Some(touched) => self.diff_touched(tx, touched, compact, &mut deletes, staged),
            None => {
                for (set, key) in staging_junk {
                    tx.delete_element(set, key.clone());
                }
                self.diff_all(tx, compact, &mut deletes, staged);
                self.diff_node_port_ips(tx, &node_port_ips, &mut deletes);
            }
        }
        // The staged keys the diff did not look at: on a partial sync
        // they are still wanted, and move into their maps on a compaction;
        // on a full one nobody wants them.
        for (set, key, e) in self.staging.iter() {
            let seen = match touched {
                Some(t) => t.contains(&(set, key.clone())),
                None => self.slots.get(set).is_some_and(|m| m.contains_key(key)),
            };
            if seen || (touched.is_some() && !compact) {
                continue;
            }
            Staging::delete_ops(tx, set, key, staging::target(e));
            if touched.is_some() {
                tx.add_shared_element(set, e.clone());
            }
            staged.unstaged.push((set, key.clone()));
        }
        // The transaction shares the keys and elements this proxier keeps.
        tx.insert_shared_deletes(fixed_ops, deletes);
    }

    /// The element diff of a partial sync: the keys it touched.
    fn diff_touched(
        &self,
        tx: &mut Transaction,
        touched: &BTreeSet<SetKey>,
        compact: bool,
        deletes: &mut Vec<(&'static str, Arc<Element>)>,
        staged: &mut staging::Changes,
    ) {
        for (set, key) in touched {
            let slot = self.slots.get(set).and_then(|m| m.get(key));
            let want = slot.and_then(|s| holder(&self.slots, set, key, &s.owners));
            let have = slot.and_then(|s| s.programmed.as_ref());
            match self.staging.get(set, key) {
                None if compact || layout::staged_of(set).is_none() => {
                    diff(set, want, have, deletes, tx);
                }
                was => staged_diff(
                    (set, key),
                    want,
                    have,
                    was,
                    (!compact, !compact),
                    deletes,
                    tx,
                    staged,
                ),
            }
        }
    }

    /// The element diff of a full sync: every slot, set by set (the
    /// NodePort addresses, which are the node's and no Service's, apart).
    fn diff_all(
        &self,
        tx: &mut Transaction,
        compact: bool,
        deletes: &mut Vec<(&'static str, Arc<Element>)>,
        staged: &mut staging::Changes,
    ) {
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
                        diff(set, want, have, deletes, tx);
                    }
                    // A full sync keeps what is staged, but does not
                    // stage: what it adds is a repair.
                    was => staged_diff(
                        (set, k),
                        want,
                        have,
                        was,
                        (!compact, false),
                        deletes,
                        tx,
                        staged,
                    ),
                }
            }
        }
    }

    /// The node's NodePort addresses in `nodeport-ips`, on a full sync.
    fn diff_node_port_ips(
        &self,
        tx: &mut Transaction,
        node_port_ips: &[std::net::IpAddr],
        deletes: &mut Vec<(&'static str, Arc<Element>)>,
    ) {
        let have = self.slots.get(layout::NODEPORT_IPS);
        for ip in node_port_ips {
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

    /// Chains nobody jumps to any more: emptied now, deleted later.
    /// Returns those emptied now (the others were already).
    fn plan_unwanted_chains(
        &self,
        tx: &mut Transaction,
        adopted: &Adopted,
        wanted: &BTreeSet<String>,
        full: bool,
        rules_now: &RulesNow<'_>,
    ) -> Vec<String> {
        let mut emptied = Vec::new();
        for name in adopted.chains_now.difference(wanted) {
            if !self.stale_chains.contains_key(name) {
                tx.flush_chain(name);
                emptied.push(name.clone());
            } else if full && rules_now(name).is_some_and(|r| !r.is_empty()) {
                tx.flush_chain(name);
            }
        }
        emptied
    }

    /// The table, base chains, fixed chains and sets of a full sync, given
    /// what the kernel has (`current`: `None` if the table is missing).
    /// Only what differs is written, so a full sync of a table that is as
    /// it should be sends nothing. Returns whether every chain was emptied
    /// to replace a set or a base chain (the caller then rewrites the
    /// shared chains too).
    pub(super) fn plan_table(
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
