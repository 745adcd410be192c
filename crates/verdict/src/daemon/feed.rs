//! The feed: where Services, EndpointSlices, Nodes and ServiceCIDRs come
//! from (the manifests, polled for edits, or the API source's updates),
//! waited for without the node's lock and then applied to it.

use super::*;

/// How long `plan` waits for the API server's initial lists.
pub(super) const PLAN_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the input comes from, and what was last seen of it.
pub(super) enum Feed {
    /// `--manifests`: the files, watched for edits.
    Manifests(Box<Manifests>),
    /// The Kubernetes API: updates from the watch thread.
    Api {
        rx: Receiver<Vec<Update>>,
        /// Services, EndpointSlices and the Node have been listed.
        synced: bool,
    },
}

impl Feed {
    pub(super) fn open(
        source: &Source,
        node_name: &str,
        client: ClientOptions,
    ) -> anyhow::Result<Feed> {
        if let Some(p) = &source.manifests {
            return Ok(Feed::Manifests(Box::new(Manifests::new(
                Path::new(p),
                node_name,
            ))));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        verdict_k8s::watch::start(source.api(node_name, client), tx)
            .context("the Kubernetes API source")?;
        Ok(Feed::Api { rx, synced: false })
    }

    /// Whether the node may be programmed: everything has been listed once.
    pub(super) fn ready(&self) -> bool {
        match self {
            Feed::Manifests(_) => true,
            Feed::Api { synced, .. } => *synced,
        }
    }

    /// Waits up to `wait` for input, without touching the node (the
    /// introspection API may be reading it meanwhile).
    pub(super) fn wait(&mut self, wait: Duration) -> anyhow::Result<Input> {
        match self {
            Feed::Manifests(m) => {
                let Some(r) = m.changes(wait) else {
                    return Ok(Input::Nothing);
                };
                for e in &r.errors {
                    tracing::error!(error = %e, "skipping a manifest");
                }
                if !r.parsed.is_empty() {
                    let files: Vec<String> =
                        r.parsed.iter().map(|f| f.display().to_string()).collect();
                    tracing::info!(
                        files = %files.join(" "),
                        updates = r.updates.len(),
                        watched = m.watched(),
                        elapsed = ?r.took,
                        "manifests read"
                    );
                }
                Ok(Input::Updates(r.updates))
            }
            Feed::Api { rx, .. } => {
                let first = match rx.recv_timeout(wait) {
                    Ok(u) => u,
                    Err(RecvTimeoutError::Timeout) => return Ok(Input::Nothing),
                    Err(RecvTimeoutError::Disconnected) => {
                        bail!("the Kubernetes API source stopped")
                    }
                };
                let mut all = first;
                for more in rx.try_iter() {
                    all.extend(more);
                }
                Ok(Input::Updates(all))
            }
        }
    }

    /// Applies what [`Feed::wait`] brought to `node`. Returns whether the
    /// rules must change.
    pub(super) fn apply(&mut self, node: &mut Node, input: Input) -> anyhow::Result<bool> {
        match input {
            Input::Nothing => Ok(false),
            Input::Updates(updates) => {
                let mut changed = false;
                for u in updates {
                    if u == Update::Synced {
                        tracing::info!(
                            "Services and EndpointSlices are listed: programming the node"
                        );
                        if let Feed::Api { synced, .. } = self {
                            *synced = true;
                        }
                        changed = true;
                    }
                    changed |= node.on_update(u);
                }
                node.after_changes();
                Ok(changed)
            }
        }
    }

    /// Waits up to `wait` for input and applies it to `node`. Returns
    /// whether the rules must change.
    pub(super) fn poll(&mut self, node: &mut Node, wait: Duration) -> anyhow::Result<bool> {
        let input = self.wait(wait)?;
        self.apply(node, input)
    }
}

/// What the feed brought.
pub(super) enum Input {
    /// Nothing new.
    Nothing,
    /// Updates from the manifests or the API source.
    Updates(Vec<Update>),
}
