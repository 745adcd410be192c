//! The feed: where Services, EndpointSlices, Nodes and ServiceCIDRs come
//! from (the manifests, polled for edits, or the API source's updates),
//! waited for without the node's lock and then applied to it.

use super::*;

/// How long `plan` waits for the API server's initial lists.
pub(super) const PLAN_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the input comes from, and what was last seen of it.
pub(super) enum Feed {
    /// `--manifests`: polled for edits.
    Manifests {
        path: PathBuf,
        /// The files as last loaded (`None`: not loaded yet).
        seen: Option<Vec<(PathBuf, Option<SystemTime>, u64)>>,
    },
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
            let path = PathBuf::from(p);
            return Ok(Feed::Manifests { seen: None, path });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        verdict_k8s::watch::start(source.api(node_name, client), tx)
            .context("the Kubernetes API source")?;
        Ok(Feed::Api { rx, synced: false })
    }

    /// Whether the node may be programmed: everything has been listed once.
    pub(super) fn ready(&self) -> bool {
        match self {
            Feed::Manifests { .. } => true,
            Feed::Api { synced, .. } => *synced,
        }
    }

    /// Waits up to `wait` for input, without touching the node (the
    /// introspection API may be reading it meanwhile).
    pub(super) fn wait(&mut self, wait: Duration) -> anyhow::Result<Input> {
        match self {
            Feed::Manifests { path, seen } => {
                let current = fingerprint(path);
                if seen.as_ref() == Some(&current) {
                    std::thread::sleep(wait);
                    return Ok(Input::Nothing);
                }
                if seen.is_some() {
                    tracing::info!(manifests = %path.display(), "manifests changed");
                }
                *seen = Some(current);
                Ok(Input::Manifests(verdict_k8s::load(path)))
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
            Input::Manifests(loaded) => node.apply(&loaded),
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
    /// The manifests, read again.
    Manifests(Loaded),
    /// Updates from the API source.
    Updates(Vec<Update>),
}

/// A fingerprint of the manifest files, to notice edits.
pub(super) fn fingerprint(path: &Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    verdict_k8s::manifests::files(path)
        .unwrap_or_default()
        .into_iter()
        .map(|f| {
            let m = std::fs::metadata(&f).ok();
            let modified = m.as_ref().and_then(|m| m.modified().ok());
            let len = m.map_or(0, |m| m.len());
            (f, modified, len)
        })
        .collect()
}
