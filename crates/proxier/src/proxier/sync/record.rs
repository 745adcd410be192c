//! Recording what the kernel has once it has committed a plan.

use std::time::Instant;

use super::Plan;
use crate::proxier::ledger::Slot;
use crate::proxier::{Proxier, SyncResult, own_sets};

impl Proxier {
    /// Records the committed `plan`: the element changes in their slots
    /// (every element operation after the plan's fixed part is one of
    /// them, the deletions first; an element added is the winner's own
    /// allocation, which its slot then shares), what moved into, out of
    /// and within staging, the shared chains programmed, and the chains
    /// emptied (deleted a while after `now`).
    pub(super) fn record(&mut self, plan: Plan, now: Instant, result: &mut SyncResult) {
        // What left staging is no longer programmed, unless the map has
        // it now.
        for (set, key) in &plan.staged.unstaged {
            if let Some(m) = self.slots.get_mut(set)
                && let Some(slot) = m.get_mut(key)
            {
                slot.programmed = None;
                if slot.is_unused() {
                    m.remove(key);
                }
            }
        }
        let own = own_sets(&plan.tx);
        for op in plan.tx.ops().get(plan.fixed_ops..).unwrap_or_default() {
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
        for (set, key, e) in &plan.staged.staged {
            let m = self.slots.entry(set).or_default();
            match m.get_mut(key) {
                Some(slot) => slot.programmed = Some(e.clone()),
                None => {
                    m.insert(key.clone(), Slot::of_kernel(e.clone()));
                }
            }
        }
        result.staged += plan.staged.staged.len();
        result.unstaged += if plan.staged.compacted.is_some() {
            self.staging.len()
        } else {
            0
        };
        let unwanted_targets = plan.staged.compacted.is_none()
            && self
                .staging
                .targets()
                .iter()
                .any(|t| !plan.wanted_targets.contains(t));
        self.staging.record(plan.staged, now, unwanted_targets);
        result.staged_now = self.staging.len();
        // A chain wanted again is no longer on its way out; one emptied
        // now is deleted a while after.
        self.stale_chains
            .retain(|c, _| !plan.wanted_chains.contains(c));
        for name in plan.emptied {
            self.stale_chains.insert(name, now);
        }
        self.programmed_chains = plan.wanted_chains;
    }
}
