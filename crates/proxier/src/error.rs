//! Errors of the proxier.

use verdict_nft::NftError;

/// What can go wrong in the proxier.
#[derive(Debug, thiserror::Error)]
pub enum ProxierError {
    /// A setting is invalid for this proxier.
    #[error("invalid configuration: {field}: {reason}")]
    Config {
        /// The setting's name as operators know it.
        field: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The backend refused a transaction; the next sync is a full one.
    #[error("failed to apply the nftables transaction: {0}")]
    Nft(#[from] NftError),
    /// Deleting chains that are no longer used failed (kube-proxy's
    /// "cleanup failure"); the next sync is a full one.
    #[error("failed to delete stale chains: {0}")]
    Cleanup(NftError),
}
