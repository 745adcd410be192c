//! Reading the kernel's table back (a full sync), and adopting it: what
//! the kernel has replaces what the ledger believed.

use std::sync::Arc;

use verdict_nft::{Backend, Element, ElementValue, Transaction};

use super::{Adopted, ReadBack};
use crate::layout;
use crate::proxier::isolate::Failure;
use crate::proxier::{Proxier, is_fixed_chain, static_set_name};
use crate::staging;

impl Proxier {
    /// What the kernel has, on a full sync (nothing on a partial one): the
    /// table read before the first sync if nothing was committed since,
    /// else read now. A table that cannot be read is to be replaced.
    pub(super) fn read_back<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        full: bool,
    ) -> Result<ReadBack, Failure> {
        let prefetched = self.prefetched.take();
        if !full {
            return Ok(ReadBack {
                table: None,
                replace: false,
            });
        }
        let read = match prefetched {
            // Read while the source was still loading, and nothing
            // committed since: the table as it is.
            Some((generation, t)) if backend.generation().ok().flatten() == Some(generation) => {
                Ok(t)
            }
            _ => backend.table(self.cfg.nft_family(), &self.cfg.table),
        };
        match read {
            Ok(t) => Ok(ReadBack {
                table: Some(t),
                replace: false,
            }),
            Err(verdict_nft::NftError::Parse(_)) => {
                self.stale_chains.clear();
                Ok(ReadBack {
                    table: Some(None),
                    replace: true,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Adopts a read-back into the ledger and the staging, and writes
    /// into `tx` the table's fixed part where the kernel's differs (on a
    /// partial sync: nothing). The elements read back are taken, not
    /// copied: the table read is the largest thing a repair holds.
    pub(super) fn adopt_read_back(&mut self, read: ReadBack, tx: &mut Transaction) -> Adopted {
        if read.replace {
            tx.add_table(None);
            tx.delete_table();
        }
        let Some(mut existing) = read.table else {
            return Adopted {
                chains_now: self.programmed_chains.clone(),
                staging_junk: Vec::new(),
                rebuilt: false,
                kernel: None,
            };
        };
        let empty = verdict_nft::TableState::default();
        // Whether the full sync rebuilds the table's chains (a set changed
        // type): every chain is emptied, the shared ones too.
        let rebuilt = self.plan_table(tx, existing.as_ref(), existing.as_ref().unwrap_or(&empty));
        // What is really there replaces what we believed.
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
        let staging_junk = self.adopt_staging(existing.as_ref(), rebuilt, tx);
        let kernel = existing.unwrap_or_default();
        let chains_now = kernel
            .chains
            .keys()
            .filter(|c| !is_fixed_chain(c))
            .cloned()
            .collect();
        self.stale_chains
            .retain(|c, _| kernel.chains.contains_key(c));
        Adopted {
            chains_now,
            staging_junk,
            rebuilt,
            kernel: Some(kernel),
        }
    }

    /// Adopts what the kernel has staged: each staged key as the element
    /// its slot's winner is, if that goes to the same chain. When every
    /// chain was emptied (`rebuilt`), staging starts over in the staging
    /// sets that stay. Returns the staged elements that stage nothing.
    fn adopt_staging(
        &mut self,
        existing: Option<&verdict_nft::TableState>,
        rebuilt: bool,
        tx: &mut Transaction,
    ) -> Vec<(String, super::Key)> {
        let slots = &self.slots;
        let cfg = &self.cfg;
        if rebuilt && let Some(t) = existing {
            for (name, s) in &t.sets {
                let def = layout::staging_set_named(cfg, name);
                if def.is_some_and(|d| d.same_type(&s.set)) && !s.elements.is_empty() {
                    tx.flush_set(name);
                }
            }
        }
        self.staging.adopt(
            if rebuilt { None } else { existing },
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
        )
    }
}
