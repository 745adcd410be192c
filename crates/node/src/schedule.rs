//! When the daemon syncs, and whether in full. Pure: the caller passes the
//! time in, so every rule is tested without waiting.
//!
//! - The first sync is full and happens at once.
//! - Changes from the source sync no sooner than `minSyncPeriod` after the
//!   previous sync. A failed sync does not hold them back.
//! - A change another process made to verdict's tables (or a lost
//!   announcement) brings a full sync once announcements have been quiet
//!   for [`DEBOUNCE`], without waiting for `minSyncPeriod`: a flush must be
//!   repaired within a second. If another agent keeps changing the tables
//!   back, the repairs back off, doubling up to `syncPeriod`.
//! - A failed sync is retried, in full, after `minSyncPeriod`, then twice
//!   as long each time up to `syncPeriod`.
//! - Every `syncPeriod` a full sync compares the kernel with what it should
//!   hold (it writes nothing when nothing differs), as upstream's periodic
//!   resync did; unless nothing at all was committed since verdict's last
//!   sync ([`resync_unneeded`]), at most for an hour.

use std::time::{Duration, Instant};

/// Whether a periodic resync can be left out, reading nothing: the
/// ruleset's generation (`now`) is still the one verdict's last successful
/// sync left (`synced`), so nobody committed anything since; the listener
/// for foreign changes is running (`listening`), so no change to verdict's
/// tables went unseen; and the last full sync is less than `max_quiet` old
/// (`since_full`), so the proxier still recomputes everything that often.
/// A backend that cannot tell the generation never skips.
pub fn resync_unneeded(
    listening: bool,
    synced: Option<u32>,
    now: Option<u32>,
    since_full: Duration,
    max_quiet: Duration,
) -> bool {
    listening && synced.is_some() && synced == now && since_full < max_quiet
}

/// Whether someone else may have committed to the ruleset while verdict
/// was not listening: the generation was `before` when verdict began,
/// verdict committed `ours` transactions, and it is `after` now that
/// verdict listens. Each commit moves the generation on by one, so
/// anything but `before + ours` means another commit (or a generation
/// that cannot be read: assume one).
pub fn missed_commits(before: Option<u32>, ours: u32, after: Option<u32>) -> bool {
    match (before, after) {
        (Some(b), Some(a)) => a != b.wrapping_add(ours),
        _ => true,
    }
}

/// Quiet time after a foreign change before the repair: a firewall reload
/// arrives as several commits in a row.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// A foreign change this soon after the previous repair counts as a fight
/// with another agent, and the repairs back off.
const FIGHT_WINDOW: Duration = Duration::from_secs(1);

/// What to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing; look again at the given time at the latest.
    Wait(Option<Instant>),
    /// Sync what changed.
    Partial,
    /// Sync everything, comparing with the kernel, for this reason.
    Full(Why),
}

/// Why a sync is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The first sync.
    First,
    /// Another process changed the tables, or announcements were lost.
    Repair,
    /// The previous sync failed.
    Retry,
    /// `syncPeriod` passed since the last full sync.
    Periodic,
}

impl Why {
    /// How the history and the logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::First => "first sync",
            Why::Repair => "repair after a foreign change",
            Why::Retry => "retry after a failure",
            Why::Periodic => "periodic resync",
        }
    }
}

/// The sync schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    min_sync_period: Duration,
    sync_period: Duration,
    last_sync: Option<Instant>,
    /// When the periodic resync was last done or left out.
    last_full: Option<Instant>,
    /// When the last full sync that read the tables back began.
    last_read_back: Option<Instant>,
    /// Source changes wait.
    dirty: bool,
    /// The newest foreign change not yet repaired.
    foreign: Option<Instant>,
    /// The last repair and the current repair delay.
    last_repair: Option<Instant>,
    repair_delay: Duration,
    /// After a failure: when to retry, and the delay after the next one.
    retry_at: Option<Instant>,
    retry_delay: Duration,
    /// When the proxiers want a sync to move their staged jumps into
    /// their maps, with or without changes (`verdict_proxier::staging`).
    compact_at: Option<Instant>,
}

impl Schedule {
    /// A schedule for kube-proxy's `minSyncPeriod` and `syncPeriod`.
    pub fn new(min_sync_period: Duration, sync_period: Duration) -> Schedule {
        Schedule {
            min_sync_period,
            sync_period: sync_period.max(min_sync_period),
            last_sync: None,
            last_full: None,
            last_read_back: None,
            dirty: false,
            foreign: None,
            last_repair: None,
            repair_delay: DEBOUNCE,
            retry_at: None,
            retry_delay: min_sync_period,
            compact_at: None,
        }
    }

    /// When the proxiers next want a sync with nothing changed, to move
    /// staged jumps into their maps (`None`: never).
    pub fn compact_at(&mut self, at: Option<Instant>) {
        self.compact_at = at;
    }

    /// The source changed something.
    pub fn changed(&mut self) {
        self.dirty = true;
    }

    /// Another process changed verdict's tables (or announcements were
    /// lost).
    pub fn foreign(&mut self, now: Instant) {
        self.foreign = Some(now);
    }

    /// Whether a foreign change waits for its repair.
    #[cfg(test)]
    pub fn repair_pending(&self) -> bool {
        self.foreign.is_some()
    }

    /// What to do at `now`.
    pub fn due(&self, now: Instant) -> Due {
        let Some(last) = self.last_sync else {
            return Due::Full(Why::First);
        };
        let mut wake: Vec<Instant> = Vec::new();
        if let Some(t) = self.foreign {
            // After a failure, the repair is the retry: it waits for it.
            let at = (t + DEBOUNCE)
                .max(self.last_repair.map_or(t, |r| r + self.repair_delay))
                .max(self.retry_at.unwrap_or(t));
            if now >= at {
                return Due::Full(Why::Repair);
            }
            wake.push(at);
        }
        if let Some(at) = self.retry_at {
            if now >= at {
                return Due::Full(Why::Retry);
            }
            wake.push(at);
        }
        let periodic = self.last_full.unwrap_or(last) + self.sync_period;
        if now >= periodic {
            return Due::Full(Why::Periodic);
        }
        wake.push(periodic);
        if self.dirty {
            let at = last + self.min_sync_period;
            if now >= at {
                return Due::Partial;
            }
            wake.push(at);
        }
        if let Some(at) = self.compact_at {
            let at = at.max(last + self.min_sync_period);
            if now >= at {
                return Due::Partial;
            }
            wake.push(at);
        }
        Due::Wait(wake.into_iter().min())
    }

    /// How long ago the last successful full sync, which read the tables
    /// back, began (`Duration::MAX` before the first).
    pub fn since_read_back(&self, now: Instant) -> Duration {
        self.last_read_back
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t))
    }

    /// Whether changes wait for a sync.
    pub fn changes_pending(&self) -> bool {
        self.dirty
    }

    /// The periodic resync due at `now` was left out ([`resync_unneeded`]):
    /// the next one is a `syncPeriod` away, and changes waiting for a sync
    /// still get theirs.
    pub fn resync_left_out(&mut self, now: Instant) {
        self.last_full = Some(now);
    }

    /// A sync began at `started` (full or not) and succeeded or failed.
    pub fn synced(&mut self, started: Instant, full: bool, ok: bool) {
        self.last_sync = Some(started);
        self.dirty = false;
        if ok {
            self.retry_at = None;
            self.retry_delay = self.min_sync_period;
            if full {
                self.last_full = Some(started);
                self.last_read_back = Some(started);
                // A foreign change after the sync began is not repaired yet.
                if self.foreign.is_some_and(|t| t <= started) {
                    self.foreign = None;
                    self.repair_delay = match self.last_repair {
                        Some(r) if started.duration_since(r) < FIGHT_WINDOW => {
                            (self.repair_delay * 2).min(self.sync_period)
                        }
                        _ => DEBOUNCE,
                    };
                    self.last_repair = Some(started);
                }
            }
        } else {
            self.retry_at = Some(started + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.sync_period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_jumps_get_a_sync_of_their_own_when_due() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Duration::from_secs(1), Duration::from_secs(30));
        s.synced(t0, true, true);
        assert_eq!(s.due(t0), Due::Wait(Some(t0 + Duration::from_secs(30))));
        let at = t0 + Duration::from_secs(5);
        s.compact_at(Some(at));
        assert_eq!(s.due(t0), Due::Wait(Some(at)));
        assert_eq!(s.due(at), Due::Partial);
        // Not sooner than minSyncPeriod after the last sync.
        s.synced(at, false, true);
        s.compact_at(Some(at));
        assert_eq!(s.due(at), Due::Wait(Some(at + Duration::from_secs(1))));
        s.compact_at(None);
        assert_eq!(s.due(at), Due::Wait(Some(t0 + Duration::from_secs(30))));
    }

    #[test]
    fn commits_missed_while_not_listening_are_told_from_verdicts_own() {
        // Two commits of verdict's own (one per family), nobody else's.
        assert!(!missed_commits(Some(10), 2, Some(12)));
        // Someone committed too.
        assert!(missed_commits(Some(10), 2, Some(13)));
        assert!(missed_commits(Some(10), 2, Some(11)));
        // Unknown generations: assume the worst.
        assert!(missed_commits(None, 2, Some(12)));
        assert!(missed_commits(Some(10), 2, None));
    }

    #[test]
    fn a_resync_left_out_keeps_waiting_changes() {
        let t0 = Instant::now();
        let period = Duration::from_secs(30);
        let mut s = Schedule::new(Duration::from_secs(1), period);
        s.synced(t0, true, true);
        let t = t0 + period;
        s.changed();
        assert_eq!(s.due(t), Due::Full(Why::Periodic));
        s.resync_left_out(t);
        assert!(s.changes_pending());
        assert_eq!(s.due(t), Due::Partial, "the change still syncs");
        s.synced(t, false, true);
        assert_eq!(
            s.due(t),
            Due::Wait(Some(t + period)),
            "the next resync a period on"
        );
    }

    #[test]
    fn a_resync_is_left_out_only_when_nothing_can_have_changed() {
        let hour = Duration::from_secs(3600);
        let recent = Duration::from_secs(30);
        assert!(resync_unneeded(true, Some(7), Some(7), recent, hour));
        // Someone committed (to any table).
        assert!(!resync_unneeded(true, Some(7), Some(8), recent, hour));
        // The listener is not running: a change could have gone unseen.
        assert!(!resync_unneeded(false, Some(7), Some(7), recent, hour));
        // The backend cannot tell, or the last sync failed.
        assert!(!resync_unneeded(true, None, None, recent, hour));
        assert!(!resync_unneeded(true, None, Some(7), recent, hour));
        // An hour without a full sync: one happens anyway.
        assert!(!resync_unneeded(true, Some(7), Some(7), hour, hour));
    }

    const MIN: Duration = Duration::from_secs(1);
    const PERIOD: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_sync_is_full_and_at_once() {
        let s = Schedule::new(MIN, PERIOD);
        assert_eq!(s.due(Instant::now()), Due::Full(Why::First));
    }

    #[test]
    fn changes_are_spaced_by_min_sync_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        assert_eq!(s.due(t0 + ms(10)), Due::Wait(Some(t0 + PERIOD)));
        s.changed();
        assert_eq!(s.due(t0 + ms(500)), Due::Wait(Some(t0 + MIN)));
        assert_eq!(s.due(t0 + MIN), Due::Partial);
        s.synced(t0 + MIN, false, true);
        assert!(matches!(s.due(t0 + MIN + ms(1)), Due::Wait(_)));
    }

    #[test]
    fn a_foreign_change_is_repaired_after_the_debounce_not_min_sync_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        s.foreign(t0 + ms(50));
        assert_eq!(s.due(t0 + ms(100)), Due::Wait(Some(t0 + ms(150))));
        // More announcements push the repair back (one reload, one repair).
        s.foreign(t0 + ms(120));
        assert_eq!(s.due(t0 + ms(150)), Due::Wait(Some(t0 + ms(220))));
        assert_eq!(s.due(t0 + ms(220)), Due::Full(Why::Repair));
        s.synced(t0 + ms(220), true, true);
        assert!(!s.repair_pending());
        assert!(matches!(s.due(t0 + ms(300)), Due::Wait(_)));
    }

    #[test]
    fn a_change_during_the_repair_brings_another() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        s.foreign(t0 + ms(10));
        let started = t0 + ms(110);
        s.foreign(t0 + ms(150)); // while the repair runs
        s.synced(started, true, true);
        assert!(s.repair_pending());
    }

    #[test]
    fn an_agent_that_fights_back_gets_slower_repairs() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        let mut t = t0;
        let mut gaps = Vec::new();
        for _ in 0..12 {
            s.foreign(t + ms(1));
            let mut at = t + ms(1);
            while s.due(at) != Due::Full(Why::Repair) {
                at += ms(10);
            }
            gaps.push(at.duration_since(t + ms(1)));
            s.synced(at, true, true);
            t = at;
        }
        assert!(gaps[0] <= ms(110), "{gaps:?}");
        assert!(gaps[4] >= ms(700), "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= PERIOD + ms(10)), "{gaps:?}");
        // Once quiet for a while, repairs are quick again.
        let later = t + Duration::from_secs(60);
        s.synced(later, true, true);
        s.foreign(later + ms(1));
        s.synced(later + ms(101), true, true);
        s.foreign(later + Duration::from_secs(20));
        assert_eq!(
            s.due(later + Duration::from_secs(20) + ms(100)),
            Due::Full(Why::Repair)
        );
    }

    #[test]
    fn a_failure_retries_with_backoff_and_holds_nothing_back() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, false);
        assert_eq!(s.due(t0 + MIN), Due::Full(Why::Retry));
        s.synced(t0 + MIN, true, false);
        assert_eq!(s.due(t0 + MIN + ms(1500)), Due::Wait(Some(t0 + MIN * 3)));
        // A new change still goes at the normal spacing.
        s.changed();
        assert_eq!(s.due(t0 + MIN * 2), Due::Partial);
        s.synced(t0 + MIN * 2, false, false);
        // Backoff is capped at syncPeriod.
        let mut at = t0 + MIN * 2;
        for _ in 0..10 {
            s.synced(at, true, false);
            at += PERIOD;
        }
        assert!(matches!(s.due(at - ms(1)), Due::Wait(_)));
        assert_eq!(s.due(at), Due::Full(Why::Retry));
        s.synced(at, true, true);
        s.changed();
        assert_eq!(s.due(at + MIN), Due::Partial);
    }

    #[test]
    fn a_repair_that_fails_is_retried_with_the_backoff() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        s.foreign(t0 + ms(10));
        assert_eq!(s.due(t0 + ms(110)), Due::Full(Why::Repair));
        s.synced(t0 + ms(110), true, false);
        // Still pending, but not before the retry.
        assert_eq!(s.due(t0 + ms(300)), Due::Wait(Some(t0 + ms(1110))));
        assert_eq!(s.due(t0 + ms(1110)), Due::Full(Why::Repair));
        s.synced(t0 + ms(1110), true, false);
        assert_eq!(s.due(t0 + ms(2000)), Due::Wait(Some(t0 + ms(3110))));
    }

    #[test]
    fn a_full_resync_every_sync_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(MIN, PERIOD);
        s.synced(t0, true, true);
        for i in 1..5u32 {
            s.changed();
            s.synced(t0 + MIN * i, false, true);
        }
        assert!(matches!(s.due(t0 + PERIOD - ms(1)), Due::Wait(_)));
        assert_eq!(s.due(t0 + PERIOD), Due::Full(Why::Periodic));
    }
}
