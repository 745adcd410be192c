//! kube-proxy's proxy health (`pkg/proxy/healthcheck/proxy_health.go`,
//! reference §6.2):
//! - a family is unhealthy iff it has an update queued for longer than the
//!   health timeout (2 × syncPeriod) without a successful sync;
//! - families that never synced are not listed and do not count;
//! - `/healthz` is 200 iff every family is healthy and the node is eligible
//!   (its Node is known and not being deleted); `/livez` ignores the node.
//!
//! One difference, because verdict knows more: a family is also unhealthy
//! while its rules are known to be missing or stale (another process
//! changed verdict's tables, or a sync failed) for longer than
//! [`REPAIR_WINDOW`]. kube-proxy would answer 200 until the next change
//! had waited 2 × syncPeriod.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use std::{fmt, io};

use crate::time::{Moment, rfc3339_nano};

/// An IP family, as kube-proxy names it in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// How long rules may be known broken before the family counts as
/// unhealthy: a repair normally takes well under a second.
pub const REPAIR_WINDOW: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, Default)]
struct FamilyState {
    last_updated: Option<Moment>,
    oldest_pending: Option<Moment>,
    /// Since when the rules are known missing or stale.
    broken_since: Option<Moment>,
}

/// An HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub code: u16,
    /// The body (empty when it is [`Response::stream`]ed).
    pub body: Vec<u8>,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// More headers.
    pub headers: Vec<(&'static str, String)>,
    /// A body written as it is sent, instead of [`Response::body`].
    pub stream: Option<Stream>,
}

/// A body written piece by piece as the client takes it: a large answer
/// (a scrape of many series) is never held whole. The server sends it
/// chunked and cuts the connection if the writer fails, so a client never
/// takes half an answer for a whole one.
#[derive(Clone)]
pub struct Stream(Arc<StreamWriter>);

/// What writes a [`Stream`]'s body; it may be called more than once.
type StreamWriter = dyn Fn(&mut dyn io::Write) -> io::Result<()> + Send + Sync;

impl Stream {
    /// A body that `write` writes.
    pub fn new(
        write: impl Fn(&mut dyn io::Write) -> io::Result<()> + Send + Sync + 'static,
    ) -> Stream {
        Stream(Arc::new(write))
    }

    /// Writes the body to `out`.
    pub fn write(&self, out: &mut dyn io::Write) -> io::Result<()> {
        (self.0)(out)
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Stream")
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Stream {}

impl Response {
    /// The body as text (lossy), for checks and logs.
    pub fn text_body(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// The whole body: [`Response::body`], or the stream written out (an
    /// error cuts it where it happened).
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match &self.stream {
            None => Cow::Borrowed(&self.body),
            Some(s) => {
                let mut out = Vec::new();
                if let Err(e) = s.write(&mut out) {
                    tracing::debug!(error = %e, "a streamed body failed");
                }
                Cow::Owned(out)
            }
        }
    }

    /// A JSON answer.
    pub fn json(code: u16, body: String) -> Response {
        Response::text(code, body, "application/json")
    }

    /// A plain-text answer (`text/plain; charset=utf-8`, or Prometheus'
    /// exposition format for metrics).
    pub fn text(code: u16, body: String, content_type: &'static str) -> Response {
        Response {
            code,
            body: body.into_bytes(),
            content_type,
            headers: Vec::new(),
            stream: None,
        }
    }

    /// An answer whose body `stream` writes as it is sent.
    pub fn streamed(code: u16, content_type: &'static str, stream: Stream) -> Response {
        Response {
            code,
            body: Vec::new(),
            content_type,
            headers: Vec::new(),
            stream: Some(stream),
        }
    }
}

/// The proxy's health.
#[derive(Clone, Debug)]
pub struct Health {
    timeout: Duration,
    families: BTreeMap<Family, FamilyState>,
    /// `None` while the Node is unknown.
    node_eligible: Option<bool>,
}

/// Go's zero time, as kube-proxy prints a time that was never set.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

impl Health {
    /// Health with `timeout` = 2 × syncPeriod.
    pub fn new(timeout: Duration) -> Health {
        Health {
            timeout,
            families: BTreeMap::new(),
            node_eligible: None,
        }
    }

    /// A change is waiting for a sync of `family`.
    pub fn queued_update(&mut self, family: Family, now: Moment) {
        let s = self.families.entry(family).or_default();
        if s.oldest_pending.is_none() {
            s.oldest_pending = Some(now);
        }
    }

    /// `family` synced successfully.
    pub fn updated(&mut self, family: Family, now: Moment) {
        let s = self.families.entry(family).or_default();
        s.last_updated = Some(now);
        s.oldest_pending = None;
    }

    /// `family`'s rules are known to be missing or stale since `since`.
    pub fn broken(&mut self, family: Family, since: Moment) {
        let s = self.families.entry(family).or_default();
        if s.broken_since.is_none() {
            s.broken_since = Some(since);
        }
    }

    /// A sync of `family` that began at `started` succeeded: what was
    /// known broken before it began is repaired.
    pub fn repaired(&mut self, family: Family, started: Moment) {
        if let Some(s) = self.families.get_mut(&family)
            && s.broken_since.is_some_and(|t| t <= started)
        {
            s.broken_since = None;
        }
    }

    /// Whether the node may take traffic (its Node is known and not being
    /// deleted).
    pub fn set_node_eligible(&mut self, eligible: bool) {
        self.node_eligible = Some(eligible);
    }

    fn family_healthy(&self, s: &FamilyState, now: Moment) -> bool {
        let within =
            |since: Option<Moment>, limit: Duration| since.is_none_or(|t| now.since(t) <= limit);
        within(s.oldest_pending, self.timeout) && within(s.broken_since, REPAIR_WINDOW)
    }

    /// Whether every family that ever synced is healthy.
    pub fn healthy(&self, now: Moment) -> bool {
        self.families
            .values()
            .filter(|s| s.last_updated.is_some())
            .all(|s| self.family_healthy(s, now))
    }

    fn answer(&self, now: Moment, with_node: bool) -> Response {
        let healthy = self.healthy(now);
        let eligible = self.node_eligible.unwrap_or(false);
        let ok = healthy && (!with_node || eligible);
        let newest = self.families.values().filter_map(|s| s.last_updated).max();
        let last = match (ok, newest) {
            (true, _) => rfc3339_nano(now.wall),
            (false, Some(t)) => rfc3339_nano(t.wall),
            (false, None) => ZERO_TIME.into(),
        };
        let mut body = format!(
            "{{\"lastUpdated\":\"{last}\",\"currentTime\":\"{}\"",
            rfc3339_nano(now.wall)
        );
        if with_node {
            body.push_str(&format!(",\"nodeEligible\":{eligible}"));
        }
        body.push_str(&format!(",\"healthy\":{healthy}"));
        let listed: Vec<String> = self
            .families
            .iter()
            .filter_map(|(f, s)| {
                s.last_updated.map(|t| {
                    format!(
                        "\"{f}\":{{\"lastUpdated\":\"{}\",\"healthy\":{}}}",
                        rfc3339_nano(t.wall),
                        self.family_healthy(s, now)
                    )
                })
            })
            .collect();
        if !listed.is_empty() {
            body.push_str(&format!(",\"status\":{{{}}}", listed.join(",")));
        }
        body.push('}');
        Response::json(if ok { 200 } else { 503 }, body)
    }

    /// `/healthz`.
    pub fn healthz(&self, now: Moment) -> Response {
        self.answer(now, true)
    }

    /// `/livez`.
    pub fn livez(&self, now: Moment) -> Response {
        self.answer(now, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use std::time::{Instant, UNIX_EPOCH};

    /// `s` seconds into a test: both clocks agree.
    fn at(s: u64) -> Moment {
        static START: OnceLock<Instant> = OnceLock::new();
        let d = Duration::from_secs(s);
        Moment {
            wall: UNIX_EPOCH + Duration::from_secs(1_735_787_000) + d,
            mono: *START.get_or_init(Instant::now) + d,
        }
    }

    /// `s` seconds into a test, with the wall clock stepped by `step`
    /// seconds since the start (as NTP steps a clock that was wrong).
    fn stepped(s: u64, step: i64) -> Moment {
        let m = at(s);
        let wall = if step >= 0 {
            m.wall + Duration::from_secs(step.unsigned_abs())
        } else {
            m.wall - Duration::from_secs(step.unsigned_abs())
        };
        Moment { wall, ..m }
    }

    #[test]
    fn a_stepped_wall_clock_changes_no_window() {
        let mut h = Health::new(Duration::from_secs(60));
        h.set_node_eligible(true);
        h.updated(Family::V4, at(0));
        h.queued_update(Family::V4, at(10));
        // The wall clock jumps an hour ahead: the change waited 20 s, not
        // an hour.
        assert_eq!(h.healthz(stepped(30, 3_600)).code, 200);
        // It jumps an hour back: the change still times out on time.
        assert_eq!(h.healthz(stepped(70, -3_600)).code, 200);
        assert_eq!(h.healthz(stepped(71, -3_600)).code, 503);
        h.updated(Family::V4, at(72));
        h.broken(Family::V4, at(80));
        assert_eq!(h.healthz(stepped(85, 3_600)).code, 200, "within the window");
        let r = h.healthz(stepped(86, -3_600));
        assert_eq!(r.code, 503, "beyond it, whatever the wall clock says");
        // What is shown is the wall clock's.
        assert!(
            r.text_body()
                .contains("\"currentTime\":\"2025-01-02T02:04:46Z\""),
            "{}",
            r.text_body()
        );
    }

    #[test]
    fn healthy_while_starting_and_after_syncs() {
        let mut h = Health::new(Duration::from_secs(60));
        h.set_node_eligible(true);
        // Nothing synced yet, an update queued: still healthy (starting up).
        h.queued_update(Family::V4, at(0));
        assert_eq!(h.healthz(at(500)).code, 200);
        h.updated(Family::V4, at(1));
        h.updated(Family::V6, at(2));
        let r = h.healthz(at(10));
        assert_eq!(r.code, 200);
        assert_eq!(
            r.text_body(),
            "{\"lastUpdated\":\"2025-01-02T03:03:30Z\",\"currentTime\":\"2025-01-02T03:03:30Z\",\"nodeEligible\":true,\"healthy\":true,\"status\":{\"IPv4\":{\"lastUpdated\":\"2025-01-02T03:03:21Z\",\"healthy\":true},\"IPv6\":{\"lastUpdated\":\"2025-01-02T03:03:22Z\",\"healthy\":true}}}"
        );
        // A family with nothing pending is healthy however old its last sync.
        assert_eq!(h.healthz(at(100_000)).code, 200);
    }

    #[test]
    fn an_update_pending_too_long_is_unhealthy() {
        let mut h = Health::new(Duration::from_secs(60));
        h.set_node_eligible(true);
        h.updated(Family::V4, at(0));
        h.updated(Family::V6, at(0));
        h.queued_update(Family::V6, at(10));
        h.queued_update(Family::V6, at(50)); // the oldest one counts
        assert_eq!(h.healthz(at(70)).code, 200);
        let r = h.healthz(at(71));
        assert_eq!(r.code, 503);
        assert!(
            r.text_body()
                .contains("\"IPv6\":{\"lastUpdated\":\"2025-01-02T03:03:20Z\",\"healthy\":false}"),
            "{}",
            r.text_body()
        );
        assert!(
            r.text_body().contains("\"healthy\":false,\"status\""),
            "{}",
            r.text_body()
        );
        assert_eq!(h.livez(at(71)).code, 503);
        h.updated(Family::V6, at(72));
        assert_eq!(h.healthz(at(73)).code, 200);
    }

    #[test]
    fn node_eligibility_matters_to_healthz_only() {
        let mut h = Health::new(Duration::from_secs(60));
        h.updated(Family::V4, at(0));
        // Node not known yet.
        let r = h.healthz(at(1));
        assert_eq!(r.code, 503);
        assert!(r.text_body().contains("\"nodeEligible\":false"));
        let r = h.livez(at(1));
        assert_eq!(r.code, 200);
        assert!(!r.text_body().contains("nodeEligible"));
        h.set_node_eligible(true);
        assert_eq!(h.healthz(at(1)).code, 200);
        h.set_node_eligible(false);
        assert_eq!(h.healthz(at(1)).code, 503);
    }

    #[test]
    fn rules_known_broken_beyond_the_repair_window_are_unhealthy() {
        let mut h = Health::new(Duration::from_secs(60));
        h.set_node_eligible(true);
        h.updated(Family::V4, at(0));
        h.updated(Family::V6, at(0));
        h.broken(Family::V6, at(10));
        h.broken(Family::V6, at(12)); // the first one counts
        assert_eq!(h.healthz(at(15)).code, 200, "within the window");
        let r = h.healthz(at(16));
        assert_eq!(r.code, 503);
        assert!(
            r.text_body()
                .contains("\"IPv6\":{\"lastUpdated\":\"2025-01-02T03:03:20Z\",\"healthy\":false}"),
            "{}",
            r.text_body()
        );
        assert!(
            r.text_body()
                .contains("\"IPv4\":{\"lastUpdated\":\"2025-01-02T03:03:20Z\",\"healthy\":true}"),
            "{}",
            r.text_body()
        );
        // A sync that began before the breakage repairs nothing.
        h.repaired(Family::V6, at(9));
        assert_eq!(h.healthz(at(16)).code, 503);
        h.repaired(Family::V6, at(13));
        h.updated(Family::V6, at(14));
        assert_eq!(h.healthz(at(16)).code, 200);
    }

    #[test]
    fn never_synced_means_zero_time() {
        let h = Health::new(Duration::from_secs(60));
        let r = h.healthz(at(0));
        assert!(
            r.text_body()
                .starts_with("{\"lastUpdated\":\"0001-01-01T00:00:00Z\""),
            "{}",
            r.text_body()
        );
        assert!(!r.text_body().contains("status"));
    }
}
