//! The recent past the introspection API shows: the last syncs (when,
//! which family, full or partial and why, how long, how many operations,
//! which Services, the error) and the last foreign changes to verdict's
//! tables. Both are bounded rings: the daemon's memory does not grow with
//! its uptime.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::inspect::answers::{ForeignAnswer, ForeignItem, SyncItem, SyncsAnswer};

/// How many syncs and foreign changes are kept.
pub const KEPT: usize = 100;
/// How many names a record keeps (services touched, changes made).
const NAMES: usize = 10;

/// One sync of one family.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncRecord {
    /// When it began.
    pub at: SystemTime,
    /// `ip` or `ip6`.
    pub family: crate::inspect::answers::TableFamily,
    /// Full or partial.
    pub full: bool,
    /// What brought it (`change`, `first sync`, `periodic resync`, …).
    pub trigger: &'static str,
    /// How long it took.
    pub took: Duration,
    /// Operations in its transaction.
    pub operations: usize,
    /// How many Services it touched, and the first few.
    pub services: usize,
    /// The first [`NAMES`] of them.
    pub sample: Vec<String>,
    /// Service ports the kernel refused in it.
    pub quarantined: usize,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// One foreign change (another process's commit, or lost announcements).
#[derive(Clone, Debug, PartialEq)]
pub struct ForeignRecord {
    /// When it was seen.
    pub at: SystemTime,
    /// The committing process (`None`: announcements were lost).
    pub process: Option<(String, u32)>,
    /// How many objects it changed.
    pub changes: usize,
    /// The first [`NAMES`] of them.
    pub sample: Vec<String>,
}

/// The rings.
#[derive(Clone, Debug, Default)]
pub struct History {
    syncs: VecDeque<SyncRecord>,
    foreign: VecDeque<ForeignRecord>,
    /// Syncs and foreign changes ever recorded (the rings forget).
    totals: (u64, u64),
}

fn push<T>(ring: &mut VecDeque<T>, item: T) {
    if ring.len() == KEPT {
        ring.pop_front();
    }
    ring.push_back(item);
}

/// The first [`NAMES`] of an iterator, and how many it had.
pub fn sample<I: IntoIterator<Item = String>>(items: I) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut v = Vec::new();
    for i in items {
        if n < NAMES {
            v.push(i);
        }
        n += 1;
    }
    (n, v)
}

impl History {
    /// Records a sync.
    pub fn sync(&mut self, r: SyncRecord) {
        self.totals.0 += 1;
        push(&mut self.syncs, r);
    }

    /// Records a foreign change.
    pub fn foreign(&mut self, r: ForeignRecord) {
        self.totals.1 += 1;
        push(&mut self.foreign, r);
    }

    /// `GET /api/v1/syncs`: newest first.
    pub fn syncs(&self) -> SyncsAnswer {
        SyncsAnswer {
            total: self.totals.0,
            kept: KEPT,
            items: self
                .syncs
                .iter()
                .rev()
                .map(|r| SyncItem {
                    at: verdict_admin::time::rfc3339_micro(r.at),
                    family: r.family,
                    full: r.full,
                    trigger: r.trigger.into(),
                    ms: r.took.as_secs_f64() * 1e3,
                    operations: r.operations,
                    services: r.services,
                    sample: r.sample.clone(),
                    quarantined: r.quarantined,
                    error: r.error.clone(),
                })
                .collect(),
        }
    }

    /// `GET /api/v1/foreign`: newest first.
    pub fn foreign_changes(&self) -> ForeignAnswer {
        ForeignAnswer {
            total: self.totals.1,
            kept: KEPT,
            items: self
                .foreign
                .iter()
                .rev()
                .map(|r| ForeignItem {
                    at: verdict_admin::time::rfc3339_micro(r.at),
                    process: r.process.as_ref().map(|(p, _)| p.clone()),
                    pid: r.process.as_ref().map(|(_, pid)| *pid),
                    lost: r.process.is_none(),
                    changes: r.changes,
                    sample: r.sample.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize) -> SyncRecord {
        SyncRecord {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(i as u64),
            family: crate::inspect::answers::TableFamily::Ip,
            full: i == 0,
            trigger: if i == 0 { "first sync" } else { "change" },
            took: Duration::from_millis(3),
            operations: i,
            services: 1,
            sample: vec![format!("ns/svc-{i}")],
            quarantined: 0,
            error: None,
        }
    }

    #[test]
    fn the_rings_keep_the_newest_and_count_everything() {
        let mut h = History::default();
        for i in 0..KEPT + 5 {
            h.sync(record(i));
        }
        let j = h.syncs();
        assert_eq!(j.total, (KEPT + 5) as u64);
        assert_eq!(j.items.len(), KEPT);
        assert_eq!(j.items[0].operations, KEPT + 4, "newest first");
        assert_eq!(j.items[KEPT - 1].operations, 5, "the oldest five are gone");
        h.foreign(ForeignRecord {
            at: SystemTime::UNIX_EPOCH,
            process: None,
            changes: 0,
            sample: Vec::new(),
        });
        assert!(h.foreign_changes().items[0].lost);
    }

    #[test]
    fn a_sample_keeps_the_first_names_and_the_count() {
        let (n, v) = sample((0..25).map(|i| i.to_string()));
        assert_eq!(n, 25);
        assert_eq!(v.len(), NAMES);
        assert_eq!(v[0], "0");
    }
}
