//! Why the node runtime stopped or could not start.

use std::time::Duration;

use verdict_k8s::watch::SourceError;
use verdict_nft::NftError;
use verdict_proxier::ProxierError;

/// What went wrong, with what it concerned.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node's name is unknown.
    #[error("cannot tell this node's name: set --hostname-override")]
    NoNodeName,
    /// A proxier refused its configuration.
    #[error(transparent)]
    Config(#[from] ProxierError),
    /// The kernel refused or could not answer.
    #[error("{what}: {source}")]
    Kernel {
        /// What was being done.
        what: String,
        /// The kernel's answer.
        #[source]
        source: NftError,
    },
    /// The source of objects could not be used.
    #[error("the Kubernetes API source: {0}")]
    Source(#[from] SourceError),
    /// The API source ended.
    #[error("the Kubernetes API source stopped: {0}")]
    SourceStopped(String),
    /// The initial lists did not come in time (`plan`, offline commands).
    #[error("the API server did not list Services, EndpointSlices and the Node within {0:?}")]
    ListTimeout(Duration),
    /// A sync failed in at least one family.
    #[error("{0}")]
    Sync(String),
    /// `--config` changed: kube-proxy exits so that its pod restarts with it.
    #[error(
        "content of the proxy server's configuration file was updated ({0}): exiting so that it is read again"
    )]
    ConfigChanged(String),
    /// A check before anything is changed failed.
    #[error("{0}")]
    Startup(String),
    /// The cleanup would break a kube-proxy that runs: nothing was done.
    #[error("{0}")]
    CleanupRefused(String),
    /// A step of the cleanup failed (the others ran).
    #[error("cleanup of kube-proxy's leftovers failed: {0}")]
    Cleanup(String),
}

impl NodeError {
    /// The kernel's refusal of `what`.
    pub fn kernel(what: impl Into<String>, source: NftError) -> NodeError {
        NodeError::Kernel {
            what: what.into(),
            source,
        }
    }
}
