//! The run loop: the one writer. It owns the node ([`NodeProxy`]) and the
//! kernel's handles, waits on one channel of [`Input`]s until the
//! schedule says a sync is due, syncs, and publishes what the sync
//! touched to the read model; nothing else changes the node. The kernel,
//! conntrack, the node's addresses and the ruleset listener are given by
//! the caller, so the whole loop runs in tests on the in-memory backend
//! without root.

use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use verdict_nft::conntrack::Conntrack;
use verdict_nft::{Around, Backend, Counting, Listener};

use crate::error::NodeError;
use crate::input::{Input, Table, next_batch};
use crate::proxy::{Host, NodeAddresses, NodeProxy};
use crate::schedule::{self, Due, Schedule, Why};

/// Starts listening to the kernel's announcements of changes to these
/// tables, sending them as [`Input::Foreign`]; returns, if it listens,
/// the listener's membership, which the loop leaves while it commits a
/// large transaction.
pub type Listen = Box<dyn FnMut(Vec<Table>) -> Option<Box<dyn Listener>> + Send>;

/// A commit of at least this many operations is made with the listener
/// out of the kernel's group ([`Counting::quiet`]): a full sync's (a
/// repair after a flush writes every element), not a change's. Below it
/// the announcements cost little, and a foreign commit in the window
/// would cost a read-back to rule out.
pub const QUIET_AT: usize = 10_000;

/// Removes what kube-proxy left behind, once verdict's rules serve every
/// Service; returns the problems met.
pub type Leftovers = Box<dyn FnMut(&mut dyn Backend) -> Vec<String> + Send>;

/// What the loop reaches the host through.
pub struct Kernel {
    /// nftables.
    pub backend: Box<dyn Backend + Send>,
    /// The conntrack table.
    pub conntrack: Box<dyn Conntrack>,
    /// The node's addresses.
    pub addresses: Arc<dyn NodeAddresses>,
    /// The ruleset listener.
    pub listen: Listen,
    /// The cleanup of kube-proxy's leftovers.
    pub leftovers: Leftovers,
    /// What is done around each commit of at least [`QUIET_AT`]
    /// operations ([`crate::apart::Apart`] on a node: the admin servers'
    /// threads kept off the CPU the commit holds).
    pub around_large: Option<Box<dyn Around>>,
    /// A second handle on nftables, to read the rules in place at start
    /// on a thread of its own while the loop takes in what the source
    /// sends (`None`: the loop reads them itself before it starts).
    pub reader: Option<Box<dyn Backend + Send>>,
}

/// The longest the loop sleeps with nothing due: the schedule always has
/// a periodic resync ahead, so this only bounds a wait it did not ask for.
const IDLE: Duration = Duration::from_secs(3600);

/// A batch of this many updates (an initial list, a relist, a large
/// manifest) is followed by [`crate::memory::trim`].
const TRIM_AFTER_UPDATES: usize = 10_000;

/// The reads of the rules in place: each family's table in order, or
/// `None` for one that cannot be used (`verdict_proxier::proxier::read_table`).
type InPlace = Vec<Option<verdict_proxier::proxier::Prefetched>>;

/// Reads `tables` through `reader` on a thread of its own; `None` if the
/// thread cannot start (the caller then reads them itself).
fn read_in_place(
    mut reader: Box<dyn Backend + Send>,
    tables: Vec<verdict_nft::Table>,
) -> Option<std::thread::JoinHandle<InPlace>> {
    let read = move || {
        tables
            .iter()
            .map(|t| verdict_proxier::proxier::read_table(reader.as_mut(), t.family, &t.name))
            .collect()
    };
    std::thread::Builder::new()
        .name("read-in-place".into())
        .spawn(read)
        .inspect_err(|e| tracing::warn!(error = %e, "cannot start a thread to read the rules in place: reading them first"))
        .ok()
}

/// Programs the node and keeps it programmed, until [`Input::Stop`] (or
/// every sender of `inputs` is gone): `Ok`, the rules left in place. An
/// input the loop cannot go on without (the API source ended, `--config`
/// changed) is an error.
pub fn run(mut node: NodeProxy, kernel: Kernel, inputs: Receiver<Input>) -> Result<(), NodeError> {
    let Kernel {
        backend,
        mut conntrack,
        addresses,
        mut listen,
        mut leftovers,
        around_large,
        reader,
    } = kernel;
    let mut nft = Counting::new(backend);
    if let Some(hook) = around_large {
        nft.around_large(hook, QUIET_AT);
    }
    let settings = node.settings().clone();
    // The kernel announces every element of every commit to whoever
    // listens, and at 30,000 Services the first sync's announcements cost
    // the commit about as much as the elements themselves. So verdict
    // starts listening once its first full sync is in, and then asks the
    // ruleset's generation whether anyone committed in between. A backend
    // that cannot tell the generation (`nft`) listens from the start.
    let tables = node.tables();
    let mut listening = false;
    let mut start_listening = |nft: &mut Counting<_>| match listen(tables.clone()) {
        Some(listener) => {
            nft.quiet(listener, QUIET_AT);
            true
        }
        None => false,
    };
    let tells_generation = nft.generation().ok().flatten().is_some();
    if !tells_generation {
        listening = start_listening(&mut nft);
    }
    // The rules a restart adopts are read while the source loads (its
    // threads parse or list meanwhile), not after it; on a handle and a
    // thread of their own if there is one, so that the loop takes in the
    // objects listed meanwhile.
    let mut prefetch = reader
        .filter(|_| tells_generation)
        .and_then(|reader| read_in_place(reader, node.tables_to_read()));
    if prefetch.is_none() {
        node.prefetch_tables(&mut nft);
    }
    let mut leftovers_pending = true;
    let mut schedule = Schedule::new(settings.min_sync_period, settings.sync_period);
    // The ruleset's generation after verdict's last successful sync.
    let mut synced_generation: Option<u32> = None;
    let mut wait = IDLE;
    loop {
        let Some(batch) = next_batch(&inputs, wait) else {
            return Ok(());
        };
        for input in batch {
            match input {
                Input::Updates(u) => {
                    // (The API source passes an initial list on in
                    // batches as it comes: its end counts as many.)
                    let was_ready = node.ready();
                    let large = u.len() >= TRIM_AFTER_UPDATES;
                    let changed = node.apply(u);
                    let many = large || (!was_ready && node.ready());
                    if many {
                        // The source's threads made these objects, and the
                        // node has just freed them into their arenas: give
                        // those pages back before the sync allocates its
                        // own, or both are resident at its peak.
                        crate::memory::trim();
                    }
                    if changed {
                        schedule.changed();
                        // As kube-proxy, changes count as queued (for
                        // /healthz) only once the initial lists are in.
                        if node.ready() {
                            node.queued();
                        }
                    }
                }
                Input::Foreign(event) => {
                    node.foreign_change(&event);
                    schedule.foreign(Instant::now());
                }
                Input::AddressesChanged => {
                    if node.refresh_addresses(addresses.as_ref()) {
                        schedule.changed();
                    }
                }
                Input::ConfigChanged(path) => return Err(NodeError::ConfigChanged(path)),
                Input::SourceStopped(why) => return Err(NodeError::SourceStopped(why)),
                Input::Stop => return Ok(()),
            }
        }
        wait = IDLE;
        if !node.ready() {
            // As kube-proxy: nothing is programmed before the initial lists.
            continue;
        }
        if let Some(reading) = prefetch.take() {
            match reading.join() {
                Ok(reads) => node.set_prefetched(reads),
                // The first full sync reads the table itself.
                Err(_) => tracing::warn!(
                    "the thread reading the rules in place panicked: the first sync reads them"
                ),
            }
        }
        let now = Instant::now();
        let (full, why) = match schedule.due(now) {
            Due::Wait(until) => {
                wait = until.map_or(IDLE, |t| {
                    t.saturating_duration_since(now)
                        .max(Duration::from_millis(1))
                });
                continue;
            }
            Due::Partial => (false, None),
            Due::Full(why) => (true, Some(why)),
        };
        if why == Some(Why::Periodic) {
            // Nothing was committed since verdict's last sync, and the
            // listener would have said so: the tables are what verdict
            // wrote, and reading them back (seconds at 100,000 Services)
            // would find nothing to repair. Changes waiting for a sync
            // still get their partial sync on the next turn.
            let current = nft.generation().ok().flatten();
            if schedule::resync_unneeded(
                listening,
                synced_generation,
                current,
                schedule.since_read_back(now),
                verdict_proxier::proxier::FULL_SYNC_PERIOD,
            ) {
                node.resync_unneeded(current.unwrap_or_default(), schedule.changes_pending());
                schedule.resync_left_out(now);
                // The schedule says next what is due: a waiting change's
                // partial sync at once, else the next period.
                wait = Duration::ZERO;
                continue;
            }
        }
        let trigger = why.map_or("change", Why::as_str);
        let before = if listening {
            None
        } else {
            nft.generation().ok().flatten()
        };
        let commits = nft.commits();
        let result = node.sync(
            &mut nft,
            Host::Node(conntrack.as_mut()),
            addresses.as_ref(),
            now,
            full,
            trigger,
        );
        if !listening && full && result.is_ok() {
            listening = start_listening(&mut nft);
            let after = nft.generation().ok().flatten();
            let ours = nft.commits().wrapping_sub(commits);
            if listening && schedule::missed_commits(before, ours, after) {
                tracing::info!(
                    ?before,
                    ?after,
                    ours,
                    "the ruleset changed while verdict was not yet listening: repairing"
                );
                schedule.foreign(Instant::now());
            }
        }
        if nft.take_unheard() {
            tracing::info!(
                "the ruleset changed while verdict committed a large transaction unheard: repairing"
            );
            schedule.foreign(Instant::now());
        }
        if let Some(e) = nft.take_deaf() {
            tracing::error!(error = %e, "the ruleset listener cannot rejoin the kernel's announcements; only the periodic resync repairs foreign changes now");
            listening = false;
        }
        synced_generation = match &result {
            Ok(()) => nft.generation().ok().flatten(),
            Err(_) => None,
        };
        if full {
            crate::memory::trim();
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "sync failed; retrying with backoff, and new changes still go through");
        }
        schedule.synced(now, full, result.is_ok());
        schedule.compact_at(node.proxiers().filter_map(|p| p.compaction_due()).min());
        // What kube-proxy's iptables and IPVS modes (and, for verdict, its
        // nftables mode) left would still act on Service traffic: remove it
        // once verdict's rules serve every Service, so the swap drops no
        // traffic, as kube-proxy removes the other modes' state when it
        // starts in one.
        if leftovers_pending && full && result.is_ok() {
            leftovers_pending = false;
            for problem in leftovers(&mut nft) {
                tracing::warn!(%problem, "cleaning up kube-proxy's leftovers");
            }
        }
        // Whatever came in meanwhile is looked at before the next wait.
        wait = Duration::ZERO;
    }
}
