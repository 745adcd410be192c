//! The list-and-watch protocol of one collection, spoken as client-go's
//! reflector speaks it, on kube-rs's HTTP client.
//!
//! - **The first list** is a streaming list (a watch with
//!   `sendInitialEvents=true`, WatchList) asking for a consistent state
//!   (`resourceVersion=""`, `resourceVersionMatch=NotOlderThan`). If it
//!   fails in any way before its last initial event (an error status, an
//!   `ERROR` event such as an API server on an etcd without
//!   RequestWatchProgress sends, a stream that breaks), the collection is
//!   listed with a plain list at once, as client-go falls back; once the
//!   API server has answered a streaming list with an error, this
//!   collection is listed plainly from then on. A plain first list reads
//!   the API server's cache (`resourceVersion=0`), as client-go's first
//!   list does.
//! - **A watch** resumes from the last resourceVersion seen (bookmarks
//!   included), for a time drawn anew for every request (5 to 10
//!   minutes, as client-go draws it), and is resumed when it ends.
//! - **A relist** (after `410 Gone`) asks for a state no older than the
//!   last resourceVersion seen (`resourceVersion=<last>`,
//!   `resourceVersionMatch=NotOlderThan`), so that behind several API
//!   servers the node never goes back in time; if that version is
//!   refused as expired or too large, the next list asks for a
//!   consistent one (`resourceVersion=""`).
//! - **An object that does not decode** is reported as such, with its key
//!   and version ([`Event::Skipped`]): what was known of it stays as it
//!   was, and a later deletion of it still removes it.
//! - **Failures** wait ([`Backoff`]: 0.5 s doubling to 4 s) and are logged
//!   quietly: one warning when a watch starts failing (and a reminder
//!   every 5 minutes while it goes on), one line when it works again, the
//!   retries in between at `-v=4`. A watch that went silent for the read
//!   timeout is resumed without a warning: it is not an outage until the
//!   API server cannot be reached.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use futures::AsyncBufReadExt;
use kube::Client;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::objects::{Head, Object};
use crate::watch::Key;

/// The annotation on the bookmark that ends a streaming list's initial
/// events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Watches last between this many seconds and twice as long (drawn at
/// random for each request, as client-go's reflectors do, so that a
/// thousand nodes do not come back at once).
pub const MIN_WATCH_TIMEOUT_SECS: u64 = 300;
/// The first wait before a failed list or watch is tried again; it
/// doubles with each failure up to [`MAX_BACKOFF`] and starts again after
/// a success.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two tries: once the API server is back, the
/// watches are within this of it.
pub const MAX_BACKOFF: Duration = Duration::from_secs(4);
/// While a watch keeps failing, a reminder is logged this often.
const REMIND_EVERY: Duration = Duration::from_secs(300);

/// One collection to list and watch.
#[derive(Clone, Debug)]
pub struct Collection {
    /// What it is called in the log (`Services`, `EndpointSlices`, ...).
    pub what: &'static str,
    /// Its URL path (`/api/v1/services`).
    pub path: &'static str,
    /// `labelSelector`, if any.
    pub labels: Option<String>,
    /// `fieldSelector`, if any.
    pub fields: Option<String>,
}

/// What a reflector reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Event<O> {
    /// A (re)list starts: what follows up to [`Event::ListDone`] is the
    /// whole collection.
    ListStart,
    /// An object of the list.
    Listed(O),
    /// The list is complete.
    ListDone,
    /// An object was added or changed.
    Applied(O),
    /// An object was deleted.
    Deleted(Key),
    /// An object that did not decode, by its key and resourceVersion
    /// (`listed`: as part of a list).
    Skipped {
        /// Its namespace and name.
        key: Key,
        /// Its resourceVersion.
        version: String,
        /// Whether it came in a list (else as a change).
        listed: bool,
    },
}

/// A number from the process's random keys (no generator needed for
/// spreading timeouts).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// A watch timeout between [`MIN_WATCH_TIMEOUT_SECS`] and twice that,
/// drawn anew at every call.
pub fn watch_timeout() -> u64 {
    MIN_WATCH_TIMEOUT_SECS + random() % MIN_WATCH_TIMEOUT_SECS
}

/// Exponential back-off from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`], each
/// wait shortened by up to a fifth at random; reset by every success.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// Back to the first step.
    pub fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        let jitter = wait.mul_f64((random() % 1000) as f64 / 5000.0);
        Some(wait - jitter)
    }
}

/// The API server's `Status`, as far as verdict reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// The HTTP code it stands for.
    #[serde(default)]
    pub code: u16,
    /// `reason` (`Expired`, `Forbidden`, ...).
    #[serde(default)]
    pub reason: String,
    /// `message`.
    #[serde(default)]
    pub message: String,
    /// `details`: only the causes' reasons.
    #[serde(default)]
    pub details: Option<StatusDetails>,
}

/// `details` of a [`Status`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StatusDetails {
    /// `causes`.
    #[serde(default)]
    pub causes: Option<Vec<StatusCause>>,
}

/// One of `details.causes`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StatusCause {
    /// `reason`.
    #[serde(default)]
    pub reason: Option<String>,
}

impl Status {
    /// The version asked for is not there any more (`410`, `Expired` or
    /// `Gone`): list again.
    pub fn gone(&self) -> bool {
        self.code == 410 || self.reason == "Expired" || self.reason == "Gone"
    }

    /// The version asked for is newer than the API server has (a lagging
    /// API server behind a load balancer): list a consistent state.
    pub fn too_large(&self) -> bool {
        self.details
            .iter()
            .flat_map(|d| d.causes.iter().flatten())
            .any(|c| c.reason.as_deref() == Some("ResourceVersionTooLarge"))
            || self.message.contains("Too large resource version")
    }
}

impl From<&kube::core::Status> for Status {
    fn from(s: &kube::core::Status) -> Status {
        let too_large = s
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .any(|c| c.reason == "ResourceVersionTooLarge");
        Status {
            code: s.code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            details: too_large.then(|| StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ResourceVersionTooLarge".into()),
                }]),
            }),
        }
    }
}

/// Why a request of a reflector failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The API server answered with an error status (an HTTP status, or
    /// an `ERROR` event in a watch).
    Answered {
        /// `list` or `watch`.
        step: &'static str,
        /// Its status.
        status: Status,
    },
    /// No answer: the API server could not be reached, or the connection
    /// broke.
    Unreachable {
        /// `list` or `watch`.
        step: &'static str,
        /// The root cause, in a few words.
        cause: String,
    },
    /// The answer could not be read (not the protocol).
    Garbled {
        /// `list` or `watch`.
        step: &'static str,
        /// What was wrong.
        cause: String,
    },
}

impl std::fmt::Display for Failure {
    /// In a few words: `list: Connection refused (os error 111)`,
    /// `watch: 403 Forbidden: services is forbidden …`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Failure::Answered { step, status } => {
                format!(
                    "{step}: {} {}: {}",
                    status.code, status.reason, status.message
                )
            }
            Failure::Unreachable { step, cause } | Failure::Garbled { step, cause } => {
                format!("{step}: {cause}")
            }
        };
        f.write_str(&cut(&text))
    }
}

impl Failure {
    fn of(step: &'static str, e: &kube::Error) -> Failure {
        match e {
            kube::Error::Api(s) => Failure::Answered {
                step,
                status: Status::from(&**s),
            },
            kube::Error::SerdeError(e) => Failure::Garbled {
                step,
                cause: e.to_string(),
            },
            other => Failure::Unreachable {
                step,
                cause: root_cause(other),
            },
        }
    }

    fn status(&self) -> Option<&Status> {
        match self {
            Failure::Answered { status, .. } => Some(status),
            _ => None,
        }
    }
}

/// The innermost error of a chain: it says it shortest.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The kind of the innermost I/O error that says more than `Other`: the
/// client wraps a read timeout (`TimedOut`) and a connection cut in a
/// chunk (`UnexpectedEof`) in errors of its own.
fn io_kind(e: &std::io::Error) -> std::io::ErrorKind {
    let mut kind = e.kind();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|e| e as _);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && io.kind() != std::io::ErrorKind::Other
        {
            kind = io.kind();
        }
        if c.to_string().contains("unexpected EOF during chunk") {
            kind = std::io::ErrorKind::UnexpectedEof;
        }
        cause = c.source();
    }
    kind
}

/// At most 160 characters.
fn cut(s: &str) -> String {
    match s.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Whether a watch of one collection works, for the log: one warning
/// when it starts failing, a reminder every [`REMIND_EVERY`], one line
/// when it works again, and nothing louder than `-v=4` in between.
#[derive(Debug)]
pub struct Health {
    what: &'static str,
    /// Since when it fails, how often, and when that was last said.
    failing: Option<(Instant, u32, Instant)>,
}

impl Health {
    /// A watch of `what` that works.
    pub fn new(what: &'static str) -> Health {
        Health {
            what,
            failing: None,
        }
    }

    /// Whether the watch fails now.
    pub fn failing(&self) -> bool {
        self.failing.is_some()
    }

    /// A request failed.
    pub fn failed(&mut self, why: &Failure, now: Instant) {
        let what = self.what;
        let unreachable = matches!(why, Failure::Unreachable { .. });
        match &mut self.failing {
            None => {
                self.failing = Some((now, 1, now));
                if unreachable {
                    tracing::warn!(watch = what, error = %why, "cannot reach the API server; retrying with back-off, rules stay as they are");
                } else {
                    tracing::warn!(watch = what, error = %why, "the API server refused the request; retrying with back-off, rules stay as they are");
                }
            }
            Some((since, n, said)) => {
                *n += 1;
                if now.saturating_duration_since(*said) >= REMIND_EVERY {
                    *said = now;
                    tracing::warn!(
                        watch = what,
                        error = %why,
                        failures = *n,
                        seconds = now.saturating_duration_since(*since).as_secs(),
                        "the watch still fails; rules stay as they are"
                    );
                } else {
                    tracing::trace!(watch = what, error = %why, failures = *n, "the watch failed again");
                }
            }
        }
    }

    /// Something came through.
    pub fn worked(&mut self, now: Instant) {
        if let Some((since, n, _)) = self.failing.take() {
            tracing::info!(
                watch = self.what,
                failures = n,
                seconds = format!("{:.1}", now.saturating_duration_since(since).as_secs_f64()),
                "the watch works again"
            );
        }
    }
}

/// `key=value&...`, each part percent-encoded as a URL query wants it.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        encode(k, &mut out);
        out.push('=');
        encode(v, &mut out);
    }
    out
}

fn encode(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Which state a list asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListFrom {
    /// Whatever the API server has cached (`resourceVersion=0`): a plain
    /// first list.
    Any,
    /// The most recent state (`resourceVersion=""`).
    Consistent,
    /// A state no older than this version
    /// (`resourceVersionMatch=NotOlderThan`).
    NotOlderThan(String),
}

/// One line of a watch: `{"type": ..., "object": {...}}`.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// A list answer: its version and its items, undecoded.
#[derive(Deserialize)]
struct List<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// An object, or what is left of one that does not decode.
enum Decoded<O> {
    Object(O),
    Skipped(Key, String),
    /// Not even its metadata could be read.
    Unreadable,
}

fn decode<O: Object>(what: &str, raw: &RawValue) -> Decoded<O> {
    match serde_json::from_str::<O>(raw.get()) {
        Ok(o) => Decoded::Object(o),
        Err(e) => match serde_json::from_str::<Head>(raw.get()) {
            Ok(h) if !h.metadata.name.is_empty() => {
                let m = h.metadata;
                tracing::warn!(
                    watch = what,
                    object = %format!("{}/{}", m.namespace, m.name),
                    resource_version = %m.resource_version,
                    error = %cut(&e.to_string()),
                    "cannot decode this object: what was known of it stays as it was"
                );
                Decoded::Skipped((m.namespace, m.name), m.resource_version)
            }
            _ => {
                tracing::warn!(watch = what, error = %cut(&e.to_string()), "cannot decode an object, not even its name: skipped");
                Decoded::Unreadable
            }
        },
    }
}

/// Where a reflector sends what it sees; `Err` once nobody listens.
pub trait Sink<O> {
    /// Sends one event.
    fn send(&mut self, e: Event<O>) -> impl std::future::Future<Output = Result<(), ()>>;
}

/// How a watch ended.
enum Ended {
    /// Its time was up, or the server closed it: watch again.
    Closed,
    /// Silent for the read timeout: watch again.
    Silent,
    /// `410 Gone`: list again.
    Gone,
    /// Failed.
    Failed(Failure),
    /// Nobody listens any more.
    Stop,
}

/// Lists and watches one collection for good, sending what it sees to
/// `sink`, until the sink is closed.
pub struct Reflector {
    client: Client,
    c: Collection,
    /// Whether the next list may be a streaming list.
    streaming: bool,
    /// The last resourceVersion seen (a list's, an object's, a bookmark's).
    last: Option<String>,
    /// The last version was refused as expired or too large: list a
    /// consistent state next.
    last_unusable: bool,
    health: Health,
    backoff: Backoff,
}

impl std::fmt::Debug for Reflector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflector")
            .field("collection", &self.c)
            .field("streaming", &self.streaming)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl Reflector {
    /// A reflector of `c` that tries streaming lists first.
    pub fn new(client: Client, c: Collection) -> Reflector {
        let health = Health::new(c.what);
        Reflector {
            client,
            c,
            streaming: true,
            last: None,
            last_unusable: false,
            health,
            backoff: Backoff::default(),
        }
    }

    /// Which state the next list asks for: a first streaming list a
    /// consistent one, a first plain list the cache's (as client-go
    /// lists), any later list one no older than the last version seen.
    fn list_from(&self, streaming: bool) -> ListFrom {
        match &self.last {
            Some(v) if !self.last_unusable => ListFrom::NotOlderThan(v.clone()),
            Some(_) => ListFrom::Consistent,
            None if streaming => ListFrom::Consistent,
            None => ListFrom::Any,
        }
    }

    fn url(&self, extra: &[(&str, &str)]) -> String {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        if let Some(l) = &self.c.labels {
            pairs.push(("labelSelector", l));
        }
        if let Some(f) = &self.c.fields {
            pairs.push(("fieldSelector", f));
        }
        pairs.extend_from_slice(extra);
        format!("{}?{}", self.c.path, query(&pairs))
    }

    /// Runs until `sink` is closed.
    pub async fn run<O: Object, S: Sink<O>>(mut self, mut sink: S) {
        let mut listed = false;
        // A streaming list failed this time round: a plain list next.
        let mut plain = false;
        loop {
            let ended = if !listed && self.streaming && !plain {
                match self.streaming_list(&mut sink).await {
                    Some(ended) => {
                        listed = true;
                        ended
                    }
                    None => {
                        plain = true;
                        continue;
                    }
                }
            } else if !listed {
                plain = false;
                match self.list(&mut sink).await {
                    Ok(true) => {
                        listed = true;
                        continue;
                    }
                    Ok(false) => return,
                    Err(f) => Ended::Failed(f),
                }
            } else {
                self.watch(&mut sink).await
            };
            match ended {
                Ended::Stop => return,
                Ended::Closed => {}
                Ended::Silent => {
                    tracing::debug!(
                        watch = self.c.what,
                        "no word from the API server for the read timeout: watching again"
                    );
                }
                Ended::Gone => {
                    if self.health.failing() {
                        tracing::trace!(watch = self.c.what, "watch expired (410 Gone): relisting");
                    } else {
                        tracing::debug!(
                            watch = self.c.what,
                            "watch expired (410 Gone): relisting; rules stay as they are"
                        );
                    }
                    listed = false;
                }
                Ended::Failed(f) => {
                    if let Some(s) = f.status()
                        && !listed
                        && (s.gone() || s.too_large())
                    {
                        // The list's version is gone or not there yet:
                        // ask for a consistent state, at once.
                        self.last_unusable = true;
                        continue;
                    }
                    self.health.failed(&f, Instant::now());
                    let wait = self.backoff.next().unwrap_or(MAX_BACKOFF);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Something came through: the back-off starts over.
    fn worked(&mut self) {
        self.health.worked(Instant::now());
        self.backoff.reset();
    }

    /// A plain list: `Ok(false)` once nobody listens.
    async fn list<O: Object, S: Sink<O>>(&mut self, sink: &mut S) -> Result<bool, Failure> {
        let from = self.list_from(false);
        let mut params: Vec<(&str, &str)> = Vec::new();
        match &from {
            ListFrom::Any => params.push(("resourceVersion", "0")),
            ListFrom::Consistent => {}
            ListFrom::NotOlderThan(v) => {
                params.push(("resourceVersion", v));
                params.push(("resourceVersionMatch", "NotOlderThan"));
            }
        }
        let url = self.url(&params);
        let request = http::Request::get(url)
            .body(Vec::new())
            .map_err(|e| Failure::Garbled {
                step: "list",
                cause: e.to_string(),
            })?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|e| Failure::of("list", &e))?;
        let list: List<'_> = serde_json::from_str(&text).map_err(|e| Failure::Garbled {
            step: "list",
            cause: e.to_string(),
        })?;
        self.worked();
        if sink.send(Event::ListStart).await.is_err() {
            return Ok(false);
        }
        for raw in list.items.unwrap_or_default() {
            let e = match decode::<O>(self.c.what, raw) {
                Decoded::Object(o) => Event::Listed(o),
                Decoded::Skipped(key, version) => Event::Skipped {
                    key,
                    version,
                    listed: true,
                },
                Decoded::Unreadable => continue,
            };
            if sink.send(e).await.is_err() {
                return Ok(false);
            }
        }
        if sink.send(Event::ListDone).await.is_err() {
            return Ok(false);
        }
        self.last = list.metadata.resource_version;
        self.last_unusable = false;
        Ok(true)
    }

    /// A streaming list, then the watch it becomes: `None` if it failed
    /// before its initial events ended (the caller lists plainly), else
    /// how the watch ended.
    async fn streaming_list<O: Object, S: Sink<O>>(&mut self, sink: &mut S) -> Option<Ended> {
        let from = self.list_from(true);
        let timeout = watch_timeout().to_string();
        let mut params: Vec<(&str, &str)> = vec![
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
        ];
        // No version: a consistent state (client-go leaves it out too).
        if let ListFrom::NotOlderThan(v) = &from {
            params.push(("resourceVersion", v));
        }
        params.push(("timeoutSeconds", &timeout));
        let url = self.url(&params);
        let outcome = self.stream(sink, url, true).await;
        match outcome {
            Streamed::Listed(ended) => Some(ended),
            Streamed::Stop => Some(Ended::Stop),
            Streamed::NotListed(f, after_200) => {
                // Refused as not understood (WatchList off), or failed
                // once started (the API server's storage cannot serve
                // one): this API server does not serve streaming lists.
                // Anything else (not served, not allowed, not reached)
                // is this attempt's, and the next list streams again.
                let unsupported =
                    after_200 || f.status().is_some_and(|s| s.code == 400 || s.code == 422);
                if unsupported {
                    self.streaming = false;
                    tracing::info!(
                        watch = self.c.what,
                        error = %f,
                        "the API server does not serve streaming lists: listing instead, as client-go falls back"
                    );
                } else {
                    tracing::trace!(watch = self.c.what, error = %f, "the streaming list failed: listing instead");
                }
                None
            }
        }
    }

    /// A watch from the last version.
    async fn watch<O: Object, S: Sink<O>>(&mut self, sink: &mut S) -> Ended {
        let timeout = watch_timeout().to_string();
        let last = self.last.clone().unwrap_or_default();
        let url = self.url(&[
            ("watch", "true"),
            ("resourceVersion", &last),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", &timeout),
        ]);
        match self.stream(sink, url, false).await {
            Streamed::Listed(ended) => ended,
            Streamed::Stop => Ended::Stop,
            Streamed::NotListed(f, _) => Ended::Failed(f),
        }
    }

    /// Reads one watch response. With `initial`, it is a streaming list:
    /// its initial events are a list, and a failure before they end is
    /// [`Streamed::NotListed`].
    async fn stream<O: Object, S: Sink<O>>(
        &mut self,
        sink: &mut S,
        url: String,
        initial: bool,
    ) -> Streamed {
        let request = match http::Request::get(url).body(Vec::new()) {
            Ok(r) => r,
            Err(e) => {
                let f = Failure::Garbled {
                    step: "watch",
                    cause: e.to_string(),
                };
                return Streamed::NotListed(f, false);
            }
        };
        let mut body = match self.client.request_stream(request).await {
            Ok(b) => Box::pin(b),
            Err(e) => {
                let f = Failure::of("watch", &e);
                if !initial && f.status().is_some_and(Status::gone) {
                    return Streamed::Listed(Ended::Gone);
                }
                return Streamed::NotListed(f, false);
            }
        };
        // The API server answered: whatever comes, it is there.
        self.worked();
        let mut in_list = initial;
        if in_list && sink.send(Event::ListStart).await.is_err() {
            return Streamed::Stop;
        }
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = body.read_until(b'\n', &mut line).await;
            let fail = |f: Failure| {
                if in_list {
                    // A broken connection says nothing of what the API
                    // server serves; an ERROR event or garbage does.
                    let answered = !matches!(f, Failure::Unreachable { .. });
                    Streamed::NotListed(f, answered)
                } else {
                    Streamed::Listed(Ended::Failed(f))
                }
            };
            match read {
                Ok(0) if in_list => {
                    return fail(Failure::Unreachable {
                        step: "watch",
                        cause: "the stream ended before its initial events did".into(),
                    });
                }
                Ok(0) => return Streamed::Listed(Ended::Closed),
                Ok(_) => {}
                Err(e) if io_kind(&e) == std::io::ErrorKind::TimedOut && !in_list => {
                    return Streamed::Listed(Ended::Silent);
                }
                Err(e) if io_kind(&e) == std::io::ErrorKind::UnexpectedEof && !in_list => {
                    return Streamed::Listed(Ended::Closed);
                }
                Err(e) => {
                    return fail(Failure::Unreachable {
                        step: "watch",
                        cause: root_cause(&e),
                    });
                }
            }
            let text = match std::str::from_utf8(&line) {
                Ok(t) => t.trim(),
                Err(e) => {
                    return fail(Failure::Garbled {
                        step: "watch",
                        cause: e.to_string(),
                    });
                }
            };
            if text.is_empty() {
                continue;
            }
            let event: Line<'_> = match serde_json::from_str(text) {
                Ok(l) => l,
                Err(e) => {
                    return fail(Failure::Garbled {
                        step: "watch",
                        cause: cut(&e.to_string()),
                    });
                }
            };
            let out = match event.kind.as_ref() {
                "ADDED" | "MODIFIED" | "DELETED" => {
                    let deleted = event.kind == "DELETED";
                    match decode::<O>(self.c.what, event.object) {
                        Decoded::Object(o) => {
                            self.last = Some(o.meta().resource_version.clone());
                            if deleted {
                                let m = o.meta();
                                Event::Deleted((m.namespace.clone(), m.name.clone()))
                            } else if in_list {
                                Event::Listed(o)
                            } else {
                                Event::Applied(o)
                            }
                        }
                        Decoded::Skipped(key, version) => {
                            self.last = Some(version.clone());
                            if deleted {
                                Event::Deleted(key)
                            } else {
                                Event::Skipped {
                                    key,
                                    version,
                                    listed: in_list,
                                }
                            }
                        }
                        Decoded::Unreadable => continue,
                    }
                }
                "BOOKMARK" => {
                    let head: Head = match serde_json::from_str(event.object.get()) {
                        Ok(h) => h,
                        Err(e) => {
                            return fail(Failure::Garbled {
                                step: "watch",
                                cause: cut(&e.to_string()),
                            });
                        }
                    };
                    if !head.metadata.resource_version.is_empty() {
                        self.last = Some(head.metadata.resource_version);
                    }
                    let end = head
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true");
                    if in_list && end {
                        in_list = false;
                        self.last_unusable = false;
                        Event::ListDone
                    } else {
                        continue;
                    }
                }
                "ERROR" => {
                    let status: Status =
                        serde_json::from_str(event.object.get()).unwrap_or_else(|e| Status {
                            message: format!("an ERROR event without a Status: {e}"),
                            ..Status::default()
                        });
                    if status.gone() && !in_list {
                        return Streamed::Listed(Ended::Gone);
                    }
                    return fail(Failure::Answered {
                        step: "watch",
                        status,
                    });
                }
                other => {
                    return fail(Failure::Garbled {
                        step: "watch",
                        cause: format!("an event of unknown type {other:?}"),
                    });
                }
            };
            if sink.send(out).await.is_err() {
                return Streamed::Stop;
            }
        }
    }
}

/// How one watch response went.
enum Streamed {
    /// Its initial events (if any) were all read; then the watch ended so.
    Listed(Ended),
    /// It failed before its initial events ended (`true`: after the API
    /// server had answered 200).
    NotListed(Failure, bool),
    /// Nobody listens any more.
    Stop,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn queries_are_encoded() {
        assert_eq!(
            query(&[
                ("labelSelector", "!service.kubernetes.io/service-proxy-name"),
                ("fieldSelector", "spec.clusterIP!=None"),
                ("resourceVersion", ""),
            ]),
            "labelSelector=%21service.kubernetes.io%2Fservice-proxy-name&fieldSelector=spec.clusterIP%21%3DNone&resourceVersion="
        );
    }

    #[test]
    fn watch_timeouts_are_drawn_anew_within_the_range() {
        let drawn: std::collections::BTreeSet<u64> = (0..64).map(|_| watch_timeout()).collect();
        assert!(drawn.iter().all(|t| (300..600).contains(t)));
        assert!(drawn.len() > 8, "the same few timeouts again: {drawn:?}");
    }

    #[test]
    fn a_backoff_doubles_to_its_ceiling_and_starts_over() {
        let mut b = Backoff::default();
        let waits: Vec<Duration> = (0..6).map(|_| b.next().unwrap()).collect();
        assert!(waits[0] <= FIRST_BACKOFF && waits[0] >= FIRST_BACKOFF.mul_f64(0.8));
        assert!(waits[5] <= MAX_BACKOFF && waits[5] >= MAX_BACKOFF.mul_f64(0.8));
        b.reset();
        assert!(b.next().unwrap() <= FIRST_BACKOFF);
    }

    #[test]
    fn gone_and_too_large_versions_are_told_apart() {
        let gone: Status = serde_json::from_str(
            r#"{"kind":"Status","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}"#,
        )
        .unwrap();
        assert!(gone.gone() && !gone.too_large());
        let large: Status = serde_json::from_str(
            r#"{"kind":"Status","status":"Failure","message":"Timeout: Too large resource version: 99, current: 5","reason":"Timeout",
                "details":{"causes":[{"reason":"ResourceVersionTooLarge","message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}"#,
        )
        .unwrap();
        assert!(large.too_large() && !large.gone());
    }

    #[test]
    fn failures_are_told_in_a_few_words() {
        let f = Failure::Answered {
            step: "watch",
            status: Status {
                code: 500,
                reason: "InternalError".into(),
                message: "x".repeat(300),
                details: None,
            },
        };
        let text = f.to_string();
        assert!(text.starts_with("watch: 500 InternalError: xxx"));
        assert_eq!(text.chars().count(), 161);
    }
}
