//! Events, as kube-proxy's recorder posts them (`events.k8s.io/v1`),
//! through kube-rs's recorder, which folds repeats of one event into a
//! series (a patch) instead of posting it again:
//! - `Starting` on this node's Node when verdict starts (kube-proxy's
//!   birth cry);
//! - `FailedToStartServiceHealthcheck` on a Service whose health-check node
//!   port cannot be opened;
//! - `FailedToStartProxierHealthcheck` / `FailedToStartMetricServer` on the
//!   Node when the health or metrics port cannot be bound;
//! - `FailedToProgram` on a Service the kernel refused.
//!
//! Posting never holds up the proxy: notices go through a channel to a
//! thread of their own, and one that cannot be posted is logged and
//! dropped.

use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::watch::{ApiSource, SourceError};

/// How long one Event may take to post.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest note the API server accepts.
const MAX_NOTE: usize = 1024;
/// The reporting controller, as Events name it.
pub const CONTROLLER: &str = "verdict";

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    tx: Sender<Notice>,
    done: Receiver<()>,
}

impl Events {
    /// Where to send notices.
    pub fn sender(&self) -> Sender<Notice> {
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
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: CONTROLLER.into(),
            instance: Some(format!("{CONTROLLER}-{node}")),
        },
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kube-events".into())
        .spawn(move || {
            post_all(&rt, &recorder, &node, &rx);
            let _ = done_tx.send(());
        })
        .map_err(|e| SourceError::Client(e.to_string()))?;
    Ok(Events { tx, done })
}

fn post_all(rt: &tokio::runtime::Runtime, recorder: &Recorder, node: &str, rx: &Receiver<Notice>) {
    for notice in rx.iter() {
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason.into(),
            note: Some(notice.fitted_note()),
            action: notice.action.into(),
            secondary: None,
        };
        let reference = notice.reference(node);
        let result = rt
            .block_on(async {
                tokio::time::timeout(POST_TIMEOUT, recorder.publish(&event, &reference)).await
            })
            .map_err(|_| "timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(error) = result {
            tracing::warn!(
                regarding = ?notice.regarding,
                reason = notice.reason,
                %error,
                "cannot post an Event"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
