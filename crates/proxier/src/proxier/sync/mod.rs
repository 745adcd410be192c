//! One attempt at a sync, in stages:
//!
//! 1. **read back** ([`read_back`]): on a full sync, the table as the
//!    kernel has it, the only I/O before the commit (besides deleting
//!    chains emptied a while ago, in a transaction of their own);
//! 2. **recompute** ([`recompute`]): the contributions of the service
//!    ports that changed (every one on a rebuild), recorded in the slot
//!    ledger, with the keys they touched;
//! 3. **adopt** ([`read_back::Proxier::adopt_read_back`]): what the kernel
//!    has replaces what the ledger believed, and the table's fixed part
//!    (table, base and fixed chains, sets) is written where it differs;
//! 4. **plan** ([`plan`]): pure, from the ledger, the staging and what the
//!    kernel has: the shared chains, the staging, the element diff, and
//!    the chains nobody jumps to any more; returns the transaction;
//! 5. **run**: the transaction, in one commit (if the kernel refuses it,
//!    who wants each operation is found then: [`super::isolate`]);
//! 6. **record** ([`record`]): what the kernel has now, in the ledger and
//!    the staging.

mod plan;
mod read_back;
mod recompute;
mod record;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::time::Instant;

use verdict_nft::{Backend, TableState, Transaction};

use super::isolate::Failure;
use super::ledger::Key;
use super::{Proxier, SyncResult};
use crate::staging;

/// What a full sync read of the kernel's table.
pub(super) struct ReadBack {
    /// The table (`Some(None)`: there is none); `None` on a partial sync,
    /// which reads nothing.
    table: Option<Option<TableState>>,
    /// The table could not be read (a rule verdict cannot parse, say one
    /// added by hand): it is replaced as a whole, atomically.
    replace: bool,
}

/// What adopting a read-back leaves for the plan.
pub(super) struct Adopted {
    /// The shared chains the kernel has (on a partial sync, those
    /// programmed).
    chains_now: BTreeSet<String>,
    /// Elements of the staging sets that stage nothing (a full sync).
    staging_junk: Vec<(String, Key)>,
    /// Every chain was emptied to replace a set or a base chain: the
    /// shared chains are written again too.
    rebuilt: bool,
    /// The chains the kernel has, with their rules (a full sync): the
    /// elements of its sets were taken into the ledger.
    kernel: Option<TableState>,
}

/// A sync's transaction, and what to record once the kernel has it.
pub(super) struct Plan {
    /// The transaction.
    pub(super) tx: Transaction,
    /// Its operations before the element operations (the table's fixed
    /// part, the shared chains, the staging chains and sets).
    fixed_ops: usize,
    /// What moves into, out of and within staging.
    staged: staging::Changes,
    /// The staging targets the wanted chains have (map, chain).
    wanted_targets: BTreeSet<(&'static str, String)>,
    /// The shared chains wanted, by name.
    wanted_chains: BTreeSet<String>,
    /// Chains nobody jumps to any more, emptied by this transaction: they
    /// are deleted a while after it.
    emptied: Vec<String>,
}

impl Proxier {
    /// One attempt at a sync: read back, recompute, adopt, plan, run,
    /// record. A failure of the run carries the transaction and who
    /// wants each of its operations, for [`super::isolate`].
    pub(super) fn sync_inner<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        now: Instant,
        full: bool,
        rebuild: bool,
        result: &mut SyncResult,
    ) -> Result<(), Failure> {
        // The trackers' changes are taken: should this attempt fail before
        // it has computed them, the next sync must compute everything.
        self.need_rebuild |= !result.updated_services.is_empty();
        result.stale_chains_deleted += self.delete_stale_chains(backend, now)?;
        if full {
            // Affinity entries left by an earlier run (or from before a
            // failure) are checked against what every service allows now.
            self.affinity_dirty = true;
        }
        let read = self.read_back(backend, full)?;
        let touched = self.recompute(full, rebuild, result);
        let mut tx = Transaction::new(self.cfg.nft_family(), &self.cfg.table);
        let adopted = self.adopt_read_back(read, &mut tx);
        let plan = self.plan(tx, &adopted, touched.as_ref(), full, now);
        result.operations = plan.tx.len();
        let plan = self.run(backend, plan)?;
        self.record(plan, now, result);
        Ok(())
    }

    /// Commits the plan's transaction (nothing when it is empty).
    fn run<B: Backend + ?Sized>(&self, backend: &mut B, plan: Plan) -> Result<Plan, Failure> {
        let tx = &plan.tx;
        if tx.is_empty() {
            return Ok(plan);
        }
        // kube-proxy's -v=4: every change, as the script that makes it.
        if tracing::enabled!(tracing::Level::TRACE) {
            for line in tx.to_string().lines() {
                tracing::trace!(family = %self.cfg.family, "{line}");
            }
        }
        match backend.run(tx) {
            Ok(()) => Ok(plan),
            Err(e) => {
                // Who wants each operation matters only to a failure, so
                // it is found only then (as the diff chose it: the holder
                // of the key), not kept beside every operation of every
                // sync.
                let owners = self.blame(tx);
                Err(Failure {
                    error: e.into(),
                    attempt: Some(Box::new((plan.tx, owners))),
                })
            }
        }
    }
}
