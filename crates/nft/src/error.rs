//! Errors of the nftables layer.

/// What went wrong applying or building a transaction. Backends map the
/// kernel's and nft's answers onto these variants so that callers can react
/// (e.g. "already exists") without parsing messages.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    /// The transaction was built with an invalid object (bad name, comment
    /// too long, empty rule).
    #[error("invalid transaction: {0}")]
    Invalid(String),
    /// An object the transaction refers to does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The object exists in a form that conflicts with the request.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The object is still in use (a referenced chain or set, a non-empty chain).
    #[error("busy: {0}")]
    Busy(String),
    /// The kernel (or nft) refused the transaction for another reason.
    #[error("kernel refused the transaction: {0}")]
    Refused(String),
    /// The `nft` program could not be run.
    #[error("cannot run nft: {0}")]
    NftMissing(String),
    /// The `nft` program is older than verdict supports.
    #[error("nft is too old: {0} (verdict needs nftables v1.0.1 or later)")]
    NftTooOld(String),
    /// What nft printed, or the kernel answered, could not be understood.
    #[error("cannot read the ruleset: {0}")]
    Parse(String),
}

impl NftError {
    /// The same error with `context` before its message.
    pub fn context(self, context: &str) -> NftError {
        let with = |m: String| format!("{context}: {m}");
        match self {
            NftError::Invalid(m) => NftError::Invalid(with(m)),
            NftError::NotFound(m) => NftError::NotFound(with(m)),
            NftError::AlreadyExists(m) => NftError::AlreadyExists(with(m)),
            NftError::Busy(m) => NftError::Busy(with(m)),
            NftError::Refused(m) => NftError::Refused(with(m)),
            NftError::NftMissing(m) => NftError::NftMissing(with(m)),
            NftError::NftTooOld(m) => NftError::NftTooOld(with(m)),
            NftError::Parse(m) => NftError::Parse(with(m)),
        }
    }

    /// Whether the error means something was missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, NftError::NotFound(_))
    }

    /// Whether the error means something already existed.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, NftError::AlreadyExists(_))
    }
}
