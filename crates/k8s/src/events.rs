//! Events about the objects verdict proxies, as kube-proxy's recorder
//! posts them (`events.k8s.io/v1`): today, a Service the kernel refused.
//! Posting never holds up the proxy: notices go through a channel to a
//! thread of their own, and one that cannot be posted is logged and
//! dropped.

use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use kube::Client;
use serde_json::{Value, json};

use crate::watch::{ApiSource, SourceError, client_config};

/// How long one Event may take to post.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest note the API server accepts.
const MAX_NOTE: usize = 1024;

/// One Event to post about a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// `Warning` or `Normal`.
    pub kind: &'static str,
    /// A short CamelCase reason, e.g. `FailedToProgram`.
    pub reason: &'static str,
    /// What verdict was doing, e.g. `Programming`.
    pub action: &'static str,
    /// The human-readable note (cut to the API's 1 KiB).
    pub note: String,
    /// The time, as MicroTime (`2006-01-02T15:04:05.000000Z`).
    pub time: String,
}

/// The Event object for `notice`, reported by verdict on `node`.
pub fn event(notice: &Notice, node: &str, unique: u64) -> Value {
    let mut note = notice.note.clone();
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{}.{unique:x}", notice.name),
            "namespace": notice.namespace,
        },
        "eventTime": notice.time,
        "reportingController": "verdict",
        "reportingInstance": format!("verdict-{node}"),
        "action": notice.action,
        "reason": notice.reason,
        "type": notice.kind,
        "note": note,
        "regarding": {
            "apiVersion": "v1",
            "kind": "Service",
            "namespace": notice.namespace,
            "name": notice.name,
        },
    })
}

/// Starts the thread that posts Events for `node`; send it notices.
pub fn start(src: &ApiSource) -> Result<Sender<Notice>, SourceError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SourceError::Client(e.to_string()))?;
    let config = rt.block_on(client_config(src))?;
    let client = {
        let _guard = rt.enter();
        Client::try_from(config).map_err(|e| SourceError::Client(e.to_string()))?
    };
    let node = src.node_name.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kube-events".into())
        .spawn(move || post_all(&rt, &client, &node, &rx))
        .map_err(|e| SourceError::Client(e.to_string()))?;
    Ok(tx)
}

fn post_all(rt: &tokio::runtime::Runtime, client: &Client, node: &str, rx: &Receiver<Notice>) {
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    for (i, notice) in rx.iter().enumerate() {
        let body = event(&notice, node, start + i as u64);
        let path = format!(
            "/apis/events.k8s.io/v1/namespaces/{}/events",
            notice.namespace
        );
        let request = http::Request::post(path)
            .header("Content-Type", "application/json")
            .body(body.to_string().into_bytes());
        let result = match request {
            Ok(r) => rt
                .block_on(async {
                    tokio::time::timeout(POST_TIMEOUT, client.request::<Value>(r)).await
                })
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = result {
            tracing::warn!(
                service = %format!("{}/{}", notice.namespace, notice.name),
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
    fn an_event_names_its_service_and_fits_the_api() {
        let n = Notice {
            namespace: "demo".into(),
            name: "lb".into(),
            kind: "Warning",
            reason: "FailedToProgram",
            action: "Programming",
            note: "é".repeat(600),
            time: "2026-12-01T10:00:00.000001Z".into(),
        };
        let e = event(&n, "node-1", 0xabc);
        assert_eq!(e["metadata"]["name"], "lb.abc");
        assert_eq!(e["regarding"]["kind"], "Service");
        assert_eq!(e["regarding"]["name"], "lb");
        assert_eq!(e["reportingInstance"], "verdict-node-1");
        let note = e["note"].as_str().unwrap();
        assert!(
            note.len() <= MAX_NOTE && note.ends_with("..."),
            "{}",
            note.len()
        );
    }
}
