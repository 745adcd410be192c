//! Everything that reaches the run loop, on one channel: the source's
//! updates, the kernel's announcements (other processes' commits to
//! verdict's tables, the node's address changes), a changed `--config`,
//! and the request to stop. Each producer is a thread of its own that
//! only sends; the loop is the only one that changes the node.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use verdict_k8s::Manifests;
use verdict_k8s::watch::{ApiSource, Update};
use verdict_nft::Listener;
use verdict_nft::monitor::{Change, Event, Monitor};

use crate::error::NodeError;

/// One input of the run loop.
#[derive(Debug)]
pub enum Input {
    /// Updates from the manifests or the API source, in batches that
    /// belong together.
    Updates(Vec<Update>),
    /// The source ended (the API source's thread stopped).
    SourceStopped(String),
    /// Another process changed verdict's tables, or announcements were
    /// lost.
    Foreign(Foreign),
    /// The node's addresses changed (or announcements of them were lost).
    AddressesChanged,
    /// `--config` changed on disk.
    ConfigChanged(String),
    /// Stop, leaving the rules in place.
    Stop,
}

/// A commit by another process that touched verdict's tables, or lost
/// announcements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// One commit.
    Commit {
        /// The committing process (0 when the kernel did not say).
        pid: u32,
        /// Its name.
        process: String,
        /// What it changed in verdict's tables.
        changes: Vec<Change>,
    },
    /// Announcements were lost: anything may have changed.
    Overflow,
}

pub use verdict_nft::Table;

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> bool {
    match std::thread::Builder::new().name(name.into()).spawn(f) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(thread = name, error = %e, "cannot start a thread");
            false
        }
    }
}

/// Follows the manifests under `path`: the first load, then every edit,
/// as updates. The first batch ends with [`Update::Synced`]: the files
/// are the whole truth as soon as they are read.
pub fn manifests(path: &Path, node_name: &str, tx: Sender<Input>) -> bool {
    let mut m = Manifests::new(path, node_name);
    spawn("manifests", move || {
        let mut first = true;
        loop {
            let Some(r) = m.changes(Duration::from_secs(1)) else {
                continue;
            };
            for e in &r.errors {
                tracing::error!(error = %e, "skipping a manifest");
            }
            for (file, took) in &r.slow {
                tracing::warn!(file = %file.display(), elapsed = ?took, "a manifest is still being parsed; the other files are not held back, and it is applied once parsed");
            }
            if !r.parsed.is_empty() {
                let files: Vec<String> = r.parsed.iter().map(|f| f.display().to_string()).collect();
                tracing::info!(
                    files = %files.join(" "),
                    updates = r.updates.len(),
                    watched = m.watched(),
                    elapsed = ?r.took,
                    "manifests read"
                );
            }
            let mut updates = r.updates;
            if std::mem::take(&mut first) {
                updates.push(Update::Synced);
            }
            if updates.is_empty() {
                continue;
            }
            if tx.send(Input::Updates(updates)).is_err() {
                return;
            }
        }
    })
}

/// Connects to the API server and forwards its updates. A configuration
/// that cannot be used is an error here; an unreachable server is not
/// (watches retry with back-off).
pub fn api(source: ApiSource, tx: Sender<Input>) -> Result<(), NodeError> {
    let (updates, rx) = std::sync::mpsc::channel();
    verdict_k8s::watch::start(source, updates)?;
    spawn("kube-updates", move || {
        for batch in rx {
            if tx.send(Input::Updates(batch)).is_err() {
                return;
            }
        }
        let _ = tx.send(Input::SourceStopped("its thread ended".into()));
    });
    Ok(())
}

/// Reads `path` every second and says when it no longer holds `text`.
pub fn config_file(path: PathBuf, text: String, tx: Sender<Input>) -> bool {
    spawn("config-file", move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if std::fs::read_to_string(&path).is_ok_and(|now| now != text) {
                let _ = tx.send(Input::ConfigChanged(path.display().to_string()));
                return;
            }
        }
    })
}

/// Says when the node's addresses change. `false` if the kernel does not
/// let us listen: then they are read again at each full sync only.
pub fn addresses(tx: Sender<Input>) -> bool {
    let mut monitor = match verdict_nft::addresses::AddressMonitor::open() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for address changes; the node's addresses are read again at each full sync (syncPeriod)");
            return false;
        }
    };
    spawn("addr-monitor", move || {
        loop {
            if let Err(e) = monitor.wait() {
                tracing::error!(error = %e, "the address monitor stopped; the node's addresses are read again at each full sync only");
                return;
            }
            if tx.send(Input::AddressesChanged).is_err() {
                return;
            }
        }
    })
}

/// Passes on the commits of other processes that touched `ours`, from the
/// kernel's ruleset announcements; the listener's membership, for the run
/// loop to leave while it commits a large transaction. `None` if the
/// kernel does not let us listen (then only the periodic resync repairs).
pub fn foreign_changes(ours: Vec<Table>, tx: Sender<Input>) -> Option<Box<dyn Listener>> {
    let opened = Monitor::open().and_then(|m| {
        let membership = m.membership()?;
        Ok((m, membership))
    });
    let (mut monitor, membership) = match opened {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for changes other processes make to the ruleset; only the periodic resync (syncPeriod) repairs them");
            return None;
        }
    };
    let started = spawn("nft-monitor", move || {
        loop {
            let event = match monitor.next_event() {
                Ok(Event::Overflow) => Foreign::Overflow,
                Ok(Event::Commit {
                    pid,
                    process,
                    changes,
                    ..
                }) => {
                    if verdict_nft::process::is_ours(pid) {
                        continue;
                    }
                    let changes: Vec<Change> = changes
                        .into_iter()
                        .filter(|c| ours.iter().any(|t| t.is(c.family, &c.table)))
                        .collect();
                    if changes.is_empty() {
                        continue;
                    }
                    Foreign::Commit {
                        pid,
                        process,
                        changes,
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "the ruleset monitor stopped; only the periodic resync repairs foreign changes now");
                    return;
                }
            };
            if tx.send(Input::Foreign(event)).is_err() {
                return;
            }
        }
    });
    started.then(|| Box::new(membership) as Box<dyn Listener>)
}

/// Waits up to `wait` for the first input, then takes every one already
/// queued. `None`: every sender is gone.
pub(crate) fn next_batch(rx: &Receiver<Input>, wait: Duration) -> Option<Vec<Input>> {
    use std::sync::mpsc::RecvTimeoutError;
    let first = match rx.recv_timeout(wait) {
        Ok(i) => i,
        Err(RecvTimeoutError::Timeout) => return Some(Vec::new()),
        Err(RecvTimeoutError::Disconnected) => return None,
    };
    let mut all = vec![first];
    all.extend(rx.try_iter());
    Some(all)
}

/// Where Services, EndpointSlices, the Node and ServiceCIDRs come from.
pub enum Source {
    /// `--manifests`: a YAML file or directory, followed for edits.
    Manifests(PathBuf),
    /// The Kubernetes API.
    Api(ApiSource),
}

impl Source {
    /// Starts the source's thread, sending its updates on `tx`.
    pub fn start(self, node_name: &str, tx: Sender<Input>) -> Result<(), NodeError> {
        match self {
            Source::Manifests(path) => {
                if manifests(&path, node_name, tx) {
                    Ok(())
                } else {
                    Err(NodeError::Startup(
                        "cannot start the thread that reads the manifests".into(),
                    ))
                }
            }
            Source::Api(api_source) => api(api_source, tx),
        }
    }
}
