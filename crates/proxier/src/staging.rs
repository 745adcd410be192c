//! Staged jumps: how an incremental sync adds a jump to a verdict map
//! without making the kernel validate the whole table.
//!
//! At the commit of a transaction that adds a jump (a verdict-map element
//! or a rule that goes to a chain), the kernel validates the table's jump
//! graph, walking every element of every verdict map: linear in the number
//! of Services. An incremental sync puts each jump element it would add to
//! one of [`layout::STAGED_MAPS`] into that map's staging instead: the key
//! into the gate set (`staged-service-ips`) and into the set of its target
//! chain (`staged-service-ips-endpoints-2`). The gate rule right after the
//! map's lookup sends a key found there to the staging chain, whose rule
//! for that set goes to the same chain the element would have. Sets of
//! plain keys hold no jump, so adding to them validates nothing.
//!
//! Staged elements move into the map itself (compaction) in the next
//! transaction that validates anyway (one that writes a rule: a new shared
//! chain, a repair), or once staging has been quiet for [`QUIET`] (at the
//! latest [`MAX_AGE`] after it began): one validation for all of them. A
//! full sync that writes no rule keeps what is staged and stages nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verdict_nft::{Element, ElementValue, Transaction};

use crate::layout;

type Key = Arc<[verdict_nft::Value]>;

/// Staging is folded into the maps once no sync has staged anything for
/// this long.
pub const QUIET: Duration = Duration::from_secs(5);
/// ... and at the latest this long after the first element was staged.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// The chain an element of a verdict map jumps or goes to.
pub fn target(e: &Element) -> Option<&str> {
    match &e.value {
        Some(ElementValue::Verdict(v)) => v.target(),
        _ => None,
    }
}

/// The element of a target's staging set for `e`: its key and comment.
pub(crate) fn key_of(e: &Element) -> Element {
    let mut k = Element::key(e.key.clone());
    k.comment = e.comment.clone();
    k
}

/// What the kernel has staged, and which shared chains have a staging set
/// and rule.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    /// Elements held in staging instead of their map, by map and key: each
    /// is the element the map would hold (its target is in its value).
    staged: BTreeMap<(&'static str, Key), Arc<Element>>,
    /// (map, shared chain) with a staging set and a rule in the kernel.
    targets: BTreeSet<(&'static str, String)>,
    /// When folding staging in began to be wanted, and when anything was
    /// last staged.
    first: Option<Instant>,
    last: Option<Instant>,
}

/// What one sync did to the staging, recorded once the kernel has it.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Staged (or staged again with another target).
    pub staged: Vec<(&'static str, Key, Arc<Element>)>,
    /// No longer staged (deleted, or moved into the map).
    pub unstaged: Vec<(&'static str, Key)>,
    /// Every staged element was moved into its map, and the staging chains
    /// and sets are those of `targets`.
    pub compacted: Option<BTreeSet<(&'static str, String)>>,
}

impl Staging {
    /// The element staged for `key` of `map`, if any.
    pub fn get(&self, map: &'static str, key: &Key) -> Option<&Arc<Element>> {
        // Asked for every key of a staged map on a full sync: nothing is
        // staged nearly always, and the key is not even cloned then.
        if self.staged.is_empty() {
            return None;
        }
        self.staged.get(&(map, key.clone()))
    }

    /// How many elements are staged.
    pub fn len(&self) -> usize {
        self.staged.len()
    }

    /// The (map, shared chain) pairs with a staging set and rule.
    pub fn targets(&self) -> &BTreeSet<(&'static str, String)> {
        &self.targets
    }

    /// Whether `chain` has a staging rule (it cannot be deleted before the
    /// rule is).
    pub fn holds_chain(&self, chain: &str) -> bool {
        self.targets.iter().any(|(_, t)| t == chain)
    }

    /// Every staged element, by map and key.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Key, &Arc<Element>)> {
        self.staged.iter().map(|((m, k), e)| (*m, k, e))
    }

    /// When staging should be folded into the maps (`None`: nothing to
    /// fold in).
    pub fn due(&self) -> Option<Instant> {
        let first = self.first?;
        let quiet = self.last.unwrap_or(first) + QUIET;
        Some(quiet.min(first + MAX_AGE))
    }

    /// Adds the key of `e` to `map`'s staging, going to `e`'s target (the
    /// target's set keeps `e`'s comment, which names the Service).
    pub fn add_ops(tx: &mut Transaction, map: &'static str, e: &Element) {
        let (Some(gate), Some(target)) = (layout::staged_of(map), target(e)) else {
            return;
        };
        if let Some(set) = layout::staging_set(map, target) {
            tx.add_element(&set, key_of(e));
        }
        tx.add_shared_element(gate, Arc::new(Element::key(e.key.clone())));
    }

    /// Deletes `key`, going to `target`, from `map`'s staging.
    pub fn delete_ops(tx: &mut Transaction, map: &'static str, key: &Key, target: Option<&str>) {
        let Some(gate) = layout::staged_of(map) else {
            return;
        };
        if let Some(set) = target.and_then(|t| layout::staging_set(map, t)) {
            tx.delete_element(&set, key.clone());
        }
        tx.delete_element(gate, key.clone());
    }

    /// Takes what the table read back has staged (a full sync): every key
    /// behind a map's gate and in exactly one staging set of its targets
    /// is staged, as the element `element_for(map, key, target)`; the
    /// staging sets of shared chains are the targets. Returns the
    /// elements to delete: keys in a staging set but not behind the gate,
    /// behind the gate in no staging set, or in more than one.
    pub fn adopt(
        &mut self,
        table: Option<&verdict_nft::TableState>,
        fixed_target: impl Fn(&str, &str) -> bool,
        element_for: impl Fn(&'static str, &Key, &str) -> Arc<Element>,
    ) -> Vec<(String, Key)> {
        self.staged.clear();
        self.targets.clear();
        let mut junk = Vec::new();
        let Some(t) = table else {
            return junk;
        };
        // Each gate's keys, with the targets whose set holds them.
        let mut found: BTreeMap<(&'static str, Key), Vec<&str>> = BTreeMap::new();
        for (map, gate) in layout::STAGED_MAPS {
            for key in t.sets.get(gate).into_iter().flat_map(|s| s.elements.keys()) {
                found.insert((map, key.clone()), Vec::new());
            }
        }
        for (name, s) in &t.sets {
            let Some((map, target)) = layout::parse_staging_set(name) else {
                continue;
            };
            if !fixed_target(map, target) {
                self.targets.insert((map, target.to_owned()));
            }
            for key in s.elements.keys() {
                match found.get_mut(&(map, key.clone())) {
                    Some(targets) => targets.push(target),
                    None => junk.push((name.clone(), key.clone())),
                }
            }
        }
        for ((map, key), targets) in found {
            match targets[..] {
                [target] => {
                    let e = element_for(map, &key, target);
                    self.staged.insert((map, key), e);
                }
                _ => {
                    for target in targets {
                        if let Some(set) = layout::staging_set(map, target) {
                            junk.push((set, key.clone()));
                        }
                    }
                    if let Some(gate) = layout::staged_of(map) {
                        junk.push((gate.to_owned(), key));
                    }
                }
            }
        }
        junk
    }

    /// Records what a committed sync did: `wanted` tells whether folding
    /// staging in is still to be done (a staging rule of a chain nobody
    /// wants any more goes at the next compaction).
    pub fn record(&mut self, changes: Changes, now: Instant, unwanted_targets: bool) {
        if let Some(targets) = changes.compacted {
            self.staged.clear();
            self.targets = targets;
            self.first = None;
            self.last = None;
        }
        for (m, k) in changes.unstaged {
            self.staged.remove(&(m, k));
        }
        let staged_any = !changes.staged.is_empty();
        for (m, k, e) in changes.staged {
            self.staged.insert((m, k), e);
        }
        if staged_any {
            self.last = Some(now);
        }
        let pending = !self.staged.is_empty() || unwanted_targets;
        if !pending {
            self.first = None;
            self.last = None;
        } else if self.first.is_none() {
            self.first = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use verdict_nft::{Value, Verdict};

    fn key(port: u16) -> Key {
        vec![Value::Port(port)].into()
    }

    #[test]
    fn folding_in_waits_for_quiet_but_not_forever() {
        let t0 = Instant::now();
        let mut s = Staging::default();
        assert_eq!(s.due(), None);
        let e = Arc::new(Element::map(
            key(80),
            ElementValue::Verdict(Verdict::Goto("endpoints-2".into())),
        ));
        let mut c = Changes::default();
        c.staged.push((layout::SERVICE_IPS, key(80), e.clone()));
        s.record(c, t0, false);
        assert_eq!(s.due(), Some(t0 + QUIET));
        // Staging again pushes the fold back, up to MAX_AGE after the first.
        for i in 1..=30u64 {
            let mut c = Changes::default();
            c.staged
                .push((layout::SERVICE_IPS, key(80 + i as u16), e.clone()));
            s.record(c, t0 + Duration::from_secs(3 * i), false);
        }
        assert_eq!(s.due(), Some(t0 + MAX_AGE));
        assert_eq!(s.len(), 31);
        // A compaction empties it, and nothing is due.
        let c = Changes {
            compacted: Some(BTreeSet::new()),
            ..Changes::default()
        };
        s.record(c, t0 + MAX_AGE, false);
        assert_eq!(s.len(), 0);
        assert_eq!(s.due(), None);
        // A staging rule nobody wants makes a fold due, with nothing staged.
        s.record(Changes::default(), t0 + MAX_AGE, true);
        assert_eq!(s.due(), Some(t0 + MAX_AGE + QUIET));
    }

    #[test]
    fn only_jumps_have_a_target() {
        let goto = Element::map(
            key(1),
            ElementValue::Verdict(Verdict::Goto("reject-chain".into())),
        );
        assert_eq!(target(&goto), Some("reject-chain"));
        let drop = Element::map(key(1), ElementValue::Verdict(Verdict::Drop));
        assert_eq!(target(&drop), None);
        assert_eq!(target(&Element::key(key(1))), None);
    }
}
