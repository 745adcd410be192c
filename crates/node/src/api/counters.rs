//! The last reading of the per-service counters, shared by `/metrics`
//! and `/api/v1/counters`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use verdict_admin::metrics::FLOWS_NOT_RECORDED;
use verdict_model::IpFamily;

use super::KernelReader;
use crate::inspect::Reading;
use crate::inspect::counters::{Counted, Snapshot};
use crate::view::NodeHandle;

/// How long one reading of the kernel's counters serves `/metrics` and
/// the API at least: several scrapers in a row read the table once.
const COUNTERS_FRESH: Duration = Duration::from_secs(5);

/// How long a reading that took `took` serves: at least
/// [`COUNTERS_FRESH`], and ten times what it took, so that reading the
/// kernel (seconds through `nft` at 30,000 Services) costs at most a tenth
/// of a core however often `/metrics` is scraped.
pub fn counters_fresh_for(took: Duration) -> Duration {
    COUNTERS_FRESH.max(took.saturating_mul(10))
}

/// How often the counters are read even if nobody asks: more often than
/// the problem sets forget a connection (3 minutes), so that every
/// rejected or dropped connection is attributed to its Service.
pub const COUNTERS_READ_EVERY: Duration = Duration::from_secs(30);

/// The reason of `verdict_flows_not_recorded_total` for the refusals the
/// kernel counted past its log rate limit.
pub const NOT_LOGGED: &str = "log_rate_limit";

/// Writes text (a part of `/metrics`) as it goes.
pub type WriteText = Arc<dyn Fn(&mut dyn std::fmt::Write) -> std::fmt::Result + Send + Sync>;

/// The last reading of the counters (`--service-counters`), shared by
/// `/metrics` and `/api/v1/counters`, and what is carried from one reading
/// to the next.
pub struct CounterCache {
    node: NodeHandle,
    read: KernelReader,
    /// When the last reading began, how long it took, and what it read.
    last: Mutex<Option<(Instant, Duration, Arc<Snapshot>)>>,
    state: Mutex<Counted>,
    /// Where the flow stream's metrics are, when it runs: each reading
    /// sets how many refusals the kernel counted past the log rate limit.
    flow_metrics: Option<Arc<Mutex<verdict_admin::Metrics>>>,
}

impl CounterCache {
    /// A cache over the node's tables; with the flow stream, `flow_metrics`
    /// gets `verdict_flows_not_recorded_total{reason="log_rate_limit"}`.
    pub fn new(
        node: NodeHandle,
        read: KernelReader,
        flow_metrics: Option<Arc<Mutex<verdict_admin::Metrics>>>,
    ) -> Arc<CounterCache> {
        if let Some(m) = &flow_metrics {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .touch(FLOWS_NOT_RECORDED, &[NOT_LOGGED]);
        }
        Arc::new(CounterCache {
            node,
            read,
            last: Mutex::new(None),
            state: Mutex::new(Counted::default()),
            flow_metrics,
        })
    }

    /// Reads the counters every [`COUNTERS_READ_EVERY`] on a thread of its
    /// own, for as long as the cache lives.
    pub fn read_periodically(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("counters".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(COUNTERS_READ_EVERY);
                    let Some(cache) = weak.upgrade() else {
                        return;
                    };
                    cache.snapshot();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the counters reader: rejects and drops are attributed only when /metrics or the API is read");
        }
    }

    /// A reading at most [`counters_fresh_for`] old: the tables are read
    /// back (without the node's lock), then attributed to Service ports.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, took, snap)) = last.as_ref()
            && at.elapsed() < counters_fresh_for(*took)
        {
            return snap.clone();
        }
        let started = Instant::now();
        let families = self.node.families();
        let read: Vec<(IpFamily, Option<verdict_nft::TableState>)> = families
            .iter()
            .map(|f| {
                let t = f.table();
                match (self.read)(&t, Reading::Counters) {
                    Ok(k) => (f.config.family, k.table),
                    Err(e) => {
                        tracing::warn!(table = %t, error = %e, "cannot read the service counters");
                        (f.config.family, None)
                    }
                }
            })
            .collect();
        let pairs: Vec<(IpFamily, Option<&verdict_nft::TableState>)> =
            read.iter().map(|(f, t)| (*f, t.as_ref())).collect();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let snap = Arc::new(Snapshot::of(&self.node, &pairs, &mut state));
        if let Some(m) = &self.flow_metrics {
            m.lock().unwrap_or_else(|e| e.into_inner()).set(
                FLOWS_NOT_RECORDED,
                &[NOT_LOGGED],
                snap.not_logged() as f64,
            );
        }
        *last = Some((started, started.elapsed(), snap.clone()));
        snap
    }

    /// The counters for `/metrics`, written as text.
    pub fn metrics(self: Arc<Self>) -> WriteText {
        Arc::new(move |out| self.snapshot().write(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_counter_reading_serves_ten_times_as_long() {
        assert_eq!(
            counters_fresh_for(Duration::from_millis(30)),
            COUNTERS_FRESH
        );
        assert_eq!(
            counters_fresh_for(Duration::from_secs(8)),
            Duration::from_secs(80),
            "8 s through nft at 30,000 Services: read at most every 80 s"
        );
    }
}
