//! The admin servers' threads kept off the CPU a large commit holds.
//!
//! The kernel takes a commit inside the writer's one `sendmsg`, and takes
//! a full sync's (240,000 operations at 30,000 Services) without giving
//! the CPU up for most of a second; the rhashtable resize work it queues
//! then runs on the same CPU. A thread that was queued there waits for
//! all of it: measured, `/livez` answers of 40 to 55 ms where the rest
//! take 1 ms. So while verdict commits a large transaction, its thread
//! stays on the CPU it is on and the admin servers' threads may run on
//! every other CPU it is allowed; after it, both get their CPUs back.
//! With one CPU allowed there is nowhere else to go, and nothing is done.

use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::unistd::Pid;
use verdict_nft::Around;

/// The [`Around`] hook that does it; see the module.
#[derive(Debug, Default)]
pub struct Apart {
    /// The CPUs the writer was allowed before the commit: given back to
    /// it and to the admin threads after.
    allowed: Option<CpuSet>,
}

/// The CPUs in `set`.
fn cpus(set: &CpuSet) -> Vec<usize> {
    (0..CpuSet::count())
        .filter(|c| set.is_set(*c).unwrap_or(false))
        .collect()
}

impl Apart {
    /// Moves the admin threads off the calling thread's CPU and keeps
    /// the calling thread on it; `None` (nothing done) with fewer than
    /// two CPUs allowed or a kernel that refuses.
    fn separate() -> Option<CpuSet> {
        let me = Pid::from_raw(0);
        let allowed = sched_getaffinity(me).ok()?;
        if cpus(&allowed).len() < 2 {
            return None;
        }
        let here = sched_getcpu().ok()?;
        let mut only = CpuSet::new();
        only.set(here).ok()?;
        let mut rest = allowed;
        rest.unset(here).ok()?;
        sched_setaffinity(me, &only).ok()?;
        verdict_admin::http::with_threads(|threads| {
            for t in threads {
                // A thread that refuses keeps its CPUs: it only waits
                // longer.
                let _ = sched_setaffinity(*t, &rest);
            }
        });
        Some(allowed)
    }
}

impl Around for Apart {
    fn before(&mut self) {
        self.allowed = Apart::separate();
    }

    fn after(&mut self) {
        if let Some(allowed) = self.allowed.take() {
            verdict_admin::http::with_threads(|threads| {
                for t in threads {
                    let _ = sched_setaffinity(*t, &allowed);
                }
            });
            if let Err(e) = sched_setaffinity(Pid::from_raw(0), &allowed) {
                tracing::warn!(error = %e, "cannot give the run loop its CPUs back after a large commit");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity(t: Pid) -> Vec<usize> {
        cpus(&sched_getaffinity(t).unwrap())
    }

    #[test]
    fn the_admin_threads_leave_the_committing_cpu_and_come_back() {
        // A server, so that the admin runtime's threads exist.
        let server = verdict_admin::http::serve_until_dropped(
            "127.0.0.1:0".parse().unwrap(),
            verdict_admin::http::Routes::fast(std::sync::Arc::new(|_| None)),
        )
        .unwrap();
        // The threads list themselves as they start.
        let listed = std::time::Instant::now();
        let threads = loop {
            let t = verdict_admin::http::with_threads(<[Pid]>::to_vec);
            if !t.is_empty() {
                break t;
            }
            assert!(
                listed.elapsed() < std::time::Duration::from_secs(5),
                "the runtime's threads are listed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        std::thread::spawn(move || {
            let me = Pid::from_raw(0);
            let allowed = affinity(me);
            let before: Vec<Vec<usize>> = threads.iter().map(|t| affinity(*t)).collect();
            let mut apart = Apart::default();
            apart.before();
            let during_me = affinity(me);
            let during: Vec<Vec<usize>> = threads.iter().map(|t| affinity(*t)).collect();
            apart.after();
            if allowed.len() < 2 {
                assert_eq!(during_me, allowed, "one CPU: nothing moves");
                return;
            }
            assert_eq!(during_me.len(), 1, "the writer stays where it is");
            for d in &during {
                assert!(!d.contains(&during_me[0]), "{d:?} holds {during_me:?}");
                assert_eq!(d.len(), allowed.len() - 1);
            }
            assert_eq!(affinity(me), allowed, "the writer's CPUs come back");
            let after: Vec<Vec<usize>> = threads.iter().map(|t| affinity(*t)).collect();
            assert_eq!(after, before, "and the admin threads'");
        })
        .join()
        .unwrap();
        drop(server);
    }
}
