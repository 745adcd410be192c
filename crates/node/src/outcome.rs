//! What one family's sync means for everything around it, decided without
//! I/O: the record that the history (and so `/ui` and `verdict syncs`)
//! shows, the metrics, the node's health, and whether the work after the
//! sync (health-check node ports, stale UDP conntrack) must look at every
//! Service, at the ones the sync touched, or at none. `NodeProxy::sync`
//! only carries the decisions out.

use std::time::{Duration, SystemTime};

use verdict_admin::Metrics;
use verdict_admin::metrics as m;
use verdict_admin::time::Moment;
use verdict_proxier::{ProxierError, SyncResult};

use crate::history::{self, SyncRecord};
use crate::proxy::unix_seconds;

/// One family's finished sync, as the daemon saw it.
pub struct Finished<'a> {
    /// `ip` or `ip6`.
    pub family: crate::inspect::answers::TableFamily,
    /// The family's metric label (`IPv4`, `IPv6`).
    pub label: &'a str,
    /// The daemon asked for a full sync.
    pub requested_full: bool,
    /// Why the daemon synced.
    pub trigger: &'static str,
    /// When the sync began.
    pub started: Moment,
    /// How long it took.
    pub took: Duration,
    /// When it ended.
    pub ended: Moment,
    /// What the proxier reported.
    pub result: Result<&'a SyncResult, &'a ProxierError>,
    /// UDP Services whose stale conntrack entries still wait for a
    /// cleanup from an earlier sync.
    pub udp_pending: usize,
    /// When the node started tracking changes.
    pub tracking_since: SystemTime,
}

/// A change to the metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    /// A histogram observation.
    Observe(&'static str, Vec<String>, f64),
    /// A gauge's value.
    Set(&'static str, Vec<String>, f64),
    /// A counter's increment.
    Add(&'static str, Vec<String>, f64),
}

impl Metric {
    /// Applies the change.
    pub fn apply(&self, x: &mut Metrics) {
        fn labels(l: &[String]) -> Vec<&str> {
            l.iter().map(String::as_str).collect()
        }
        match self {
            Metric::Observe(name, l, v) => x.observe(name, &labels(l), *v),
            Metric::Set(name, l, v) => x.set(name, &labels(l), *v),
            Metric::Add(name, l, v) => x.add(name, &labels(l), *v),
        }
    }
}

/// What the sync means for the node's health (`/healthz`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthChange {
    /// The family is programmed as of `at`; a breakage seen before
    /// `started` is over.
    Updated {
        /// When it was programmed.
        at: Moment,
        /// When the sync that programmed it began.
        started: Moment,
    },
    /// The family's rules could not be programmed, since `since`.
    Broken {
        /// Since when.
        since: Moment,
    },
}

/// What the work after the sync looks at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing: the sync touched no Service and no cleanup waits.
    Nothing,
    /// The Services the sync touched (a partial sync: O(changed)).
    Touched,
    /// Every Service (a full sync).
    All,
}

/// Every decision about one family's sync.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// What the history keeps.
    pub record: SyncRecord,
    /// The metrics to change, in order.
    pub metrics: Vec<Metric>,
    /// The node's health.
    pub health: HealthChange,
    /// The work after the sync.
    pub after: After,
    /// Why the family failed, as the daemon reports it.
    pub failure: Option<String>,
}

/// Decides what a finished sync means.
pub fn decide(f: &Finished) -> Outcome {
    let fam = vec![f.label.to_owned()];
    let r = match f.result {
        Ok(r) => r,
        Err(e) => {
            let counter = match e {
                ProxierError::Cleanup(_) => m::NFTABLES_CLEANUP_FAILURES,
                _ => m::NFTABLES_SYNC_FAILURES,
            };
            return Outcome {
                record: SyncRecord {
                    at: f.started.wall,
                    family: f.family,
                    full: f.requested_full,
                    trigger: f.trigger,
                    took: f.took,
                    operations: 0,
                    services: 0,
                    sample: Vec::new(),
                    quarantined: 0,
                    error: Some(e.to_string()),
                },
                metrics: vec![Metric::Add(counter, fam, 1.0)],
                health: HealthChange::Broken { since: f.started },
                after: After::Nothing,
                failure: Some(format!("syncing the {} table: {e}", f.family)),
            };
        }
    };
    let secs = f.took.as_secs_f64();
    let kind = if r.full {
        m::SYNC_FULL_DURATION
    } else {
        m::SYNC_PARTIAL_DURATION
    };
    let mut metrics = vec![
        Metric::Observe(m::SYNC_DURATION, fam.clone(), secs),
        Metric::Observe(kind, fam.clone(), secs),
        Metric::Set(m::LAST_SYNC, fam.clone(), unix_seconds(f.ended.wall)),
        Metric::Set(
            m::NO_LOCAL_ENDPOINTS,
            vec![f.label.to_owned(), "internal".into()],
            r.no_local_endpoints_internal as f64,
        ),
        Metric::Set(
            m::NO_LOCAL_ENDPOINTS,
            vec![f.label.to_owned(), "external".into()],
            r.no_local_endpoints_external as f64,
        ),
        Metric::Set(m::STAGED_JUMPS, fam.clone(), r.staged_now as f64),
    ];
    // Network programming latency: from each change's trigger time (the
    // EndpointSlice's annotation) to the end of the sync. As kube-proxy, a
    // trigger time from before the node started tracking changes is not
    // counted: the first sync would count how long the object had existed.
    for t in r.last_change_trigger_times.values().flatten() {
        if let Some(at) = verdict_admin::time::parse_rfc3339(t)
            && at >= f.tracking_since
            && let Ok(d) = f.ended.wall.duration_since(at)
        {
            metrics.push(Metric::Observe(
                m::NETWORK_PROGRAMMING,
                fam.clone(),
                d.as_secs_f64(),
            ));
        }
    }
    let (services, sample) = history::sample(r.updated_services.iter().map(ToString::to_string));
    let after = if r.full {
        After::All
    } else if r.updated_services.is_empty() && f.udp_pending == 0 {
        After::Nothing
    } else {
        After::Touched
    };
    Outcome {
        record: SyncRecord {
            at: f.started.wall,
            family: f.family,
            full: r.full,
            // The proxier makes a sync full on its own once an hour.
            trigger: if r.full && !f.requested_full {
                "hourly full sync"
            } else {
                f.trigger
            },
            took: f.took,
            operations: r.operations,
            services,
            sample,
            quarantined: r.quarantined.len(),
            error: None,
        },
        metrics,
        health: HealthChange::Updated {
            at: f.ended,
            started: f.started,
        },
        after,
        failure: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_model::{NamespacedName, ServicePortName};

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// `secs` on both clocks (the monotonic one from the test's start).
    fn moment(secs: u64) -> Moment {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        Moment {
            wall: at(secs),
            mono: *START.get_or_init(std::time::Instant::now) + Duration::from_secs(secs),
        }
    }

    fn finished<'a>(result: Result<&'a SyncResult, &'a ProxierError>) -> Finished<'a> {
        Finished {
            family: crate::inspect::answers::TableFamily::Ip,
            label: "IPv4",
            requested_full: false,
            trigger: "change",
            started: moment(1_000),
            took: Duration::from_millis(250),
            ended: moment(1_001),
            result,
            udp_pending: 0,
            tracking_since: at(900),
        }
    }

    fn partial(services: &[&str]) -> SyncResult {
        SyncResult {
            full: false,
            operations: 4,
            updated_services: services
                .iter()
                .map(|s| NamespacedName::new("ns", *s))
                .collect(),
            ..SyncResult::default()
        }
    }

    #[test]
    fn a_partial_sync_is_recorded_and_timed_and_looks_again_only_at_what_it_touched() {
        let mut r = partial(&["web", "db"]);
        r.no_local_endpoints_external = 2;
        r.staged_now = 3;
        r.quarantined = vec![(
            ServicePortName::new("ns", "bad", "p", verdict_model::Protocol::Tcp),
            "refused".into(),
        )];
        // The change was made 3 s before the sync ended; another one
        // before the node started tracking changes (at 900 s) is not
        // counted.
        r.last_change_trigger_times.insert(
            NamespacedName::new("ns", "web"),
            vec!["1970-01-01T00:16:38Z".into(), "1970-01-01T00:13:20Z".into()],
        );
        let o = decide(&finished(Ok(&r)));
        assert_eq!(o.after, After::Touched);
        assert_eq!(o.failure, None);
        assert_eq!(
            o.health,
            HealthChange::Updated {
                at: moment(1_001),
                started: moment(1_000)
            }
        );
        assert_eq!(o.record.trigger, "change");
        assert_eq!((o.record.services, o.record.operations), (2, 4));
        assert_eq!(o.record.sample, ["ns/db", "ns/web"]);
        assert_eq!(o.record.quarantined, 1);
        let ipv4 = || vec!["IPv4".to_owned()];
        assert_eq!(
            o.metrics,
            [
                Metric::Observe(m::SYNC_DURATION, ipv4(), 0.25),
                Metric::Observe(m::SYNC_PARTIAL_DURATION, ipv4(), 0.25),
                Metric::Set(m::LAST_SYNC, ipv4(), 1_001.0),
                Metric::Set(
                    m::NO_LOCAL_ENDPOINTS,
                    vec!["IPv4".into(), "internal".into()],
                    0.0
                ),
                Metric::Set(
                    m::NO_LOCAL_ENDPOINTS,
                    vec!["IPv4".into(), "external".into()],
                    2.0
                ),
                Metric::Set(m::STAGED_JUMPS, ipv4(), 3.0),
                Metric::Observe(m::NETWORK_PROGRAMMING, ipv4(), 3.0),
            ]
        );
    }

    #[test]
    fn the_work_after_a_sync_is_skipped_only_when_nothing_was_touched_and_nothing_waits() {
        let none = partial(&[]);
        assert_eq!(decide(&finished(Ok(&none))).after, After::Nothing);
        let mut waiting = finished(Ok(&none));
        waiting.udp_pending = 1;
        assert_eq!(
            decide(&waiting).after,
            After::Touched,
            "an earlier cleanup that failed is tried again"
        );
        let full = SyncResult {
            full: true,
            ..SyncResult::default()
        };
        let o = decide(&finished(Ok(&full)));
        assert_eq!(o.after, After::All);
        assert!(o.metrics.contains(&Metric::Observe(
            m::SYNC_FULL_DURATION,
            vec!["IPv4".into()],
            0.25
        )));
    }

    #[test]
    fn a_full_sync_the_daemon_did_not_ask_for_is_the_hourly_one() {
        let full = SyncResult {
            full: true,
            ..SyncResult::default()
        };
        assert_eq!(
            decide(&finished(Ok(&full))).record.trigger,
            "hourly full sync"
        );
        let mut asked = finished(Ok(&full));
        asked.requested_full = true;
        asked.trigger = "periodic resync";
        assert_eq!(decide(&asked).record.trigger, "periodic resync");
    }

    #[test]
    fn a_failed_sync_counts_its_kind_breaks_health_and_does_no_work_after() {
        let e = ProxierError::Cleanup(verdict_nft::NftError::Busy("stale chain busy".into()));
        let o = decide(&finished(Err(&e)));
        assert_eq!(
            o.metrics,
            [Metric::Add(
                m::NFTABLES_CLEANUP_FAILURES,
                vec!["IPv4".into()],
                1.0
            )]
        );
        assert_eq!(
            o.health,
            HealthChange::Broken {
                since: moment(1_000)
            }
        );
        assert_eq!(o.after, After::Nothing);
        assert!(o.record.error.is_some());
        assert!(
            o.failure
                .as_deref()
                .is_some_and(|f| f.starts_with("syncing the ip table: ")),
            "{:?}",
            o.failure
        );
        let e = ProxierError::Nft(verdict_nft::NftError::Refused("no".into()));
        assert_eq!(
            decide(&finished(Err(&e))).metrics,
            [Metric::Add(
                m::NFTABLES_SYNC_FAILURES,
                vec!["IPv4".into()],
                1.0
            )]
        );
    }
}
