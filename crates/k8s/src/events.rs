//! Events, as kube-proxy's recorder posts them (`events.k8s.io/v1`):
//! - `Starting` on this node's Node when verdict starts (kube-proxy's
//!   birth cry);
//! - `FailedToStartServiceHealthcheck` on a Service whose health-check node
//!   port cannot be opened;
//! - `FailedToStartProxierHealthcheck` / `FailedToStartMetricServer` on the
//!   Node when the health or metrics port cannot be bound;
//! - `FailedToProgram` on a Service the kernel refused elements of;
//! - `DestinationConflict` on a Service left without an address and port
//!   that another Service holds.
//!
//! Repeats are folded as client-go's recorder (`k8s.io/client-go/tools/
//! events`) folds them, so that a flapping condition costs the API server
//! a bounded number of requests: the Events of one type, reason and action
//! about one object are one series. The first is created; the second
//! patches the series (count 2) at once; later ones are only counted,
//! and the count is written every 30 minutes while the series goes on,
//! and a last time when it has been quiet for 6 minutes (then the next
//! one starts a new Event). The note is the first one's.
//!
//! Posting never holds up the proxy: notices go through a channel of at
//! most [`QUEUE`] to a thread of their own (one that does not fit is
//! dropped, as client-go's broadcaster drops it), and one that cannot be
//! posted is logged and dropped.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use crate::watch::{ApiSource, SourceError};

/// How long one Event may take to post.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// A series quiet this long is finished (client-go's `finishTime`).
const FINISH_AFTER: Duration = Duration::from_secs(6 * 60);
/// A series going on is written this often (client-go's `refreshTime`).
const REFRESH_EVERY: Duration = Duration::from_secs(30 * 60);
/// How often the poster looks for series to finish or refresh.
const HOUSEKEEPING: Duration = Duration::from_secs(30);
/// Notices waiting to be posted, at most (client-go's broadcaster queues
/// 1,000 and drops the rest): a flood of them costs bounded memory, and
/// what cannot wait is still logged where it happened.
pub const QUEUE: usize = 1000;
/// The longest note the API server accepts.
const MAX_NOTE: usize = 1024;
/// The reporting controller, as Events name it.
pub const CONTROLLER: &str = "verdict";

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Regarding {
    /// A Service.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// This node.
    Node,
}

/// One Event to post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// What it is about.
    pub regarding: Regarding,
    /// `true` for `Warning`, `false` for `Normal`.
    pub warning: bool,
    /// A short CamelCase reason, e.g. `FailedToProgram`.
    pub reason: &'static str,
    /// What verdict was doing, e.g. `Programming`.
    pub action: &'static str,
    /// The human-readable note (cut to the API's 1 KiB).
    pub note: String,
}

impl Notice {
    /// The reference of the regarded object, as kube-proxy makes it (a
    /// Node's UID is its name).
    pub fn reference(&self, node: &str) -> ObjectReference {
        match &self.regarding {
            Regarding::Service { namespace, name } => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            },
            Regarding::Node => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_owned()),
                uid: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        }
    }

    /// The note, cut to what the API server accepts.
    pub fn fitted_note(&self) -> String {
        let mut note = self.note.clone();
        if note.len() > MAX_NOTE {
            let mut cut = MAX_NOTE - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        note
    }
}

/// The thread that posts Events.
#[derive(Debug)]
pub struct Events {
    tx: SyncSender<Notice>,
    done: Receiver<()>,
}

impl Events {
    /// Where to send notices.
    pub fn sender(&self) -> SyncSender<Notice> {
        self.tx.clone()
    }

    /// Posts what was sent (waiting up to `timeout`), for a process about
    /// to exit. Other senders must be gone for it to finish early.
    pub fn close(self, timeout: Duration) {
        drop(self.tx);
        let _ = self.done.recv_timeout(timeout);
    }
}

/// Starts the thread that posts Events for `src.node_name`.
pub fn start(src: &ApiSource) -> Result<Events, SourceError> {
    let (rt, client) = crate::client::on_own_runtime(src)?;
    let node = src.node_name.clone();
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kube-events".into())
        .spawn(move || {
            let mut sink = ApiSink { rt, client };
            let mut series = Series::new(&node);
            post_all(&mut series, &mut sink, &rx);
            let _ = done_tx.send(());
        })
        .map_err(|e| SourceError::Client(e.to_string()))?;
    Ok(Events { tx, done })
}

/// Where Events go: the API server, or a test's record.
trait Sink {
    /// The uid and resourceVersion of the Service `namespace/name`, for
    /// the Event's reference (`kubectl describe` finds a Service's Events
    /// by its uid); `None` if it cannot be told.
    fn identify(&mut self, namespace: &str, name: &str) -> Option<(String, String)>;
    /// Creates `event`.
    fn create(&mut self, event: &K8sEvent) -> Result<(), String>;
    /// Writes `event`'s series; `Ok(false)` if the Event is gone.
    fn patch_series(&mut self, event: &K8sEvent) -> Result<bool, String>;
}

struct ApiSink {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl ApiSink {
    fn api(&self, event: &K8sEvent) -> Api<K8sEvent> {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        Api::namespaced(self.client.clone(), ns)
    }
}

impl Sink for ApiSink {
    fn identify(&mut self, namespace: &str, name: &str) -> Option<(String, String)> {
        // A list by name, not a get: kube-proxy's RBAC
        // (system:node-proxier) lets list and watch Services, not get them.
        let url = format!(
            "/api/v1/namespaces/{namespace}/services?{}",
            crate::reflector::query(&[("fieldSelector", &format!("metadata.name={name}"))])
        );
        let request = http::Request::get(url).body(Vec::new()).ok()?;
        let text = self
            .rt
            .block_on(async {
                tokio::time::timeout(POST_TIMEOUT, self.client.request_text(request)).await
            })
            .map_err(|_| "timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let text = match text {
            Ok(t) => t,
            Err(error) => {
                tracing::debug!(service = %format!("{namespace}/{name}"), %error, "cannot read the Service's uid for its Event");
                return None;
            }
        };
        #[derive(serde::Deserialize)]
        struct Item {
            #[serde(default)]
            metadata: crate::objects::Meta,
        }
        #[derive(serde::Deserialize)]
        struct Found {
            #[serde(default)]
            items: Vec<Item>,
        }
        let found: Found = serde_json::from_str(&text).ok()?;
        let m = found.items.into_iter().next()?.metadata;
        (!m.uid.is_empty()).then_some((m.uid, m.resource_version))
    }

    fn create(&mut self, event: &K8sEvent) -> Result<(), String> {
        let api = self.api(event);
        self.rt
            .block_on(async {
                tokio::time::timeout(POST_TIMEOUT, api.create(&PostParams::default(), event)).await
            })
            .map_err(|_| "timed out".to_string())?
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn patch_series(&mut self, event: &K8sEvent) -> Result<bool, String> {
        let api = self.api(event);
        let name = event.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({ "series": event.series });
        let result = self
            .rt
            .block_on(async {
                tokio::time::timeout(
                    POST_TIMEOUT,
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await
            })
            .map_err(|_| "timed out".to_string())?;
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The key that folds Events into one series, as client-go's: type,
/// reason, action and the object (the reporter is this process).
type Key = (bool, &'static str, &'static str, Regarding);

/// One Event posted, and how its series stands.
struct Posted {
    event: K8sEvent,
    /// When it was last seen.
    last_seen: SystemTime,
    /// When its series was last written (or the Event created).
    written: SystemTime,
    /// The count written last (1 for none).
    written_count: i32,
}

/// client-go's folding of repeated Events into series.
struct Series {
    node: String,
    cache: BTreeMap<Key, Posted>,
}

impl Series {
    fn new(node: &str) -> Series {
        Series {
            node: node.to_owned(),
            cache: BTreeMap::new(),
        }
    }

    /// One notice, at `now`.
    fn record(&mut self, notice: &Notice, now: SystemTime, sink: &mut dyn Sink) {
        let key: Key = (
            notice.warning,
            notice.reason,
            notice.action,
            notice.regarding.clone(),
        );
        if let Some(p) = self.cache.get_mut(&key) {
            p.last_seen = now;
            let count = p.event.series.as_ref().map_or(2, |s| s.count + 1);
            p.event.series = Some(EventSeries {
                count,
                last_observed_time: MicroTime(timestamp(now)),
            });
            // The second is written at once, the rest by housekeeping.
            if count == 2 {
                write_series(p, now, sink, &self.node);
            }
            return;
        }
        let mut event = self.event_of(notice, now);
        if let (Regarding::Service { namespace, name }, Some(r)) =
            (&notice.regarding, event.regarding.as_mut())
            && let Some((uid, version)) = sink.identify(namespace, name)
        {
            r.uid = Some(uid);
            r.resource_version = Some(version);
        }
        if let Err(error) = sink.create(&event) {
            log_failure(notice, &error);
        }
        self.cache.insert(
            key,
            Posted {
                event,
                last_seen: now,
                written: now,
                written_count: 1,
            },
        );
    }

    /// Finishes series quiet for 6 minutes (writing their last count) and
    /// forgets single Events as old; writes the count of series going on
    /// every 30 minutes.
    fn housekeeping(&mut self, now: SystemTime, sink: &mut dyn Sink) {
        let since = |t: SystemTime| now.duration_since(t).unwrap_or_default();
        let node = self.node.clone();
        self.cache.retain(|_, p| {
            let quiet = since(p.last_seen) >= FINISH_AFTER;
            let count = p.event.series.as_ref().map_or(1, |s| s.count);
            if quiet {
                if count != p.written_count {
                    write_series(p, now, sink, &node);
                }
                return false;
            }
            if p.event.series.is_some() && since(p.written) >= REFRESH_EVERY {
                write_series(p, now, sink, &node);
            }
            true
        });
    }

    fn event_of(&self, notice: &Notice, now: SystemTime) -> K8sEvent {
        let reference = notice.reference(&self.node);
        let at = timestamp(now);
        let nanos = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{nanos:x}",
                    reference.name.as_deref().unwrap_or(CONTROLLER)
                )),
                namespace: Some(
                    reference
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(at)),
            action: Some(notice.action.into()),
            reason: Some(notice.reason.into()),
            note: Some(notice.fitted_note()),
            type_: Some(if notice.warning { "Warning" } else { "Normal" }.into()),
            regarding: Some(reference),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(format!("{CONTROLLER}-{}", self.node)),
            ..K8sEvent::default()
        }
    }
}

/// Writes a series' count (creating the Event again if it is gone, as
/// client-go does).
fn write_series(p: &mut Posted, now: SystemTime, sink: &mut dyn Sink, node: &str) {
    let result = match sink.patch_series(&p.event) {
        Ok(true) => Ok(()),
        Ok(false) => sink.create(&p.event),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => {
            p.written = now;
            p.written_count = p.event.series.as_ref().map_or(1, |s| s.count);
        }
        Err(error) => tracing::warn!(
            event = p.event.metadata.name.as_deref().unwrap_or_default(),
            node,
            %error,
            "cannot write an Event's series"
        ),
    }
}

fn log_failure(notice: &Notice, error: &str) {
    tracing::warn!(
        regarding = ?notice.regarding,
        reason = notice.reason,
        %error,
        "cannot post an Event"
    );
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn post_all(series: &mut Series, sink: &mut dyn Sink, rx: &Receiver<Notice>) {
    loop {
        match rx.recv_timeout(HOUSEKEEPING) {
            Ok(notice) => series.record(&notice, SystemTime::now(), sink),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        series.housekeeping(SystemTime::now(), sink);
    }
    // Closing: what is counted but not written yet is written now.
    let mut later = SystemTime::now() + FINISH_AFTER;
    later += Duration::from_secs(1);
    series.housekeeping(later, sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What was sent: ("create" | "patch", series count).
    #[derive(Default)]
    struct Record(Vec<(&'static str, i32)>, Vec<K8sEvent>);

    impl Sink for Record {
        fn identify(&mut self, namespace: &str, name: &str) -> Option<(String, String)> {
            (name != "unknown").then(|| (format!("uid-{namespace}-{name}"), "7".into()))
        }
        fn create(&mut self, e: &K8sEvent) -> Result<(), String> {
            self.1.push(e.clone());
            self.0
                .push(("create", e.series.as_ref().map_or(1, |s| s.count)));
            Ok(())
        }
        fn patch_series(&mut self, e: &K8sEvent) -> Result<bool, String> {
            self.0
                .push(("patch", e.series.as_ref().map_or(1, |s| s.count)));
            Ok(true)
        }
    }

    fn notice(name: &str, note: &str) -> Notice {
        Notice {
            regarding: Regarding::Service {
                namespace: "demo".into(),
                name: name.into(),
            },
            warning: true,
            reason: "DestinationConflict",
            action: "Programming",
            note: note.into(),
        }
    }

    #[test]
    fn repeats_are_one_series_written_as_client_go_writes_it() {
        let mut sink = Record::default();
        let mut series = Series::new("node-1");
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // 100 repeats in a minute: one create, one patch (count 2).
        for i in 0..100 {
            series.record(
                &notice("lb2", &format!("note {i}")),
                at(i * 60 / 100),
                &mut sink,
            );
            series.housekeeping(at(i * 60 / 100), &mut sink);
        }
        assert_eq!(sink.0, vec![("create", 1), ("patch", 2)]);
        // Another object is another Event.
        series.record(&notice("lb3", "x"), at(61), &mut sink);
        assert_eq!(sink.0.len(), 3);
        // Going on for 40 minutes, once a minute: the count is written
        // every 30 minutes, not per repeat.
        for m in 1..=40 {
            series.record(&notice("lb2", "again"), at(60 * m), &mut sink);
            series.housekeeping(at(60 * m), &mut sink);
        }
        let patches: Vec<i32> = sink.0[3..].iter().map(|(_, c)| *c).collect();
        assert_eq!(patches.len(), 1, "{:?}", sink.0);
        assert!(patches[0] > 100, "the count so far: {patches:?}");
        // Quiet for 6 minutes: the last count is written and the series
        // ends; the next one is a new Event.
        series.housekeeping(at(60 * 40 + 6 * 60), &mut sink);
        assert_eq!(sink.0.last(), Some(&("patch", 140)));
        let n = sink.0.len();
        series.record(&notice("lb2", "later"), at(60 * 50), &mut sink);
        assert_eq!(&sink.0[n..], &[("create", 1)]);
    }

    #[test]
    fn an_event_about_a_service_carries_its_uid_and_version() {
        let mut sink = Record::default();
        let mut series = Series::new("node-1");
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        series.record(&notice("lb2", "x"), t0, &mut sink);
        series.record(&notice("unknown", "x"), t0, &mut sink);
        let r = sink.1[0].regarding.as_ref().unwrap();
        assert_eq!(r.uid.as_deref(), Some("uid-demo-lb2"));
        assert_eq!(r.resource_version.as_deref(), Some("7"));
        let r = sink.1[1].regarding.as_ref().unwrap();
        assert_eq!(
            (r.uid.as_deref(), r.name.as_deref()),
            (None, Some("unknown"))
        );
    }

    #[test]
    fn notices_name_their_object_and_fit_the_api() {
        let n = Notice {
            regarding: Regarding::Service {
                namespace: "demo".into(),
                name: "lb".into(),
            },
            warning: true,
            reason: "FailedToProgram",
            action: "Programming",
            note: "é".repeat(600),
        };
        let r = n.reference("node-1");
        assert_eq!(r.kind.as_deref(), Some("Service"));
        assert_eq!(r.namespace.as_deref(), Some("demo"));
        let note = n.fitted_note();
        assert!(
            note.len() <= MAX_NOTE && note.ends_with("..."),
            "{}",
            note.len()
        );
        let node = Notice {
            regarding: Regarding::Node,
            ..n
        };
        let r = node.reference("node-1");
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("Node"), Some("node-1"), Some("node-1"))
        );
        assert_eq!(r.namespace, None, "cluster-scoped: posted in default");
    }
}
