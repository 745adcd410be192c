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
    /// The kernel answered a netlink request with an error number, kept
    /// as it came: [`NftError::is_not_found`] (`ENOENT`),
    /// [`NftError::is_already_exists`] (`EEXIST`) and [`NftError::is_busy`]
    /// (`EBUSY`) read it, as they read the variants above.
    #[error("{}", kernel_message(*errno, what))]
    Kernel {
        /// The error number (`errno`).
        errno: i32,
        /// What was asked.
        what: String,
    },
}

/// A kernel refusal in words: its class, what was asked, the errno's
/// description and name.
fn kernel_message(errno: i32, what: &str) -> String {
    use nix::errno::Errno;
    let e = Errno::from_raw(errno);
    let class = match e {
        Errno::ENOENT => "not found",
        Errno::EEXIST => "already exists",
        Errno::EBUSY => "busy",
        _ => "kernel refused the transaction",
    };
    let hint = match e {
        Errno::EPERM | Errno::EACCES => " (verdict needs CAP_NET_ADMIN)",
        _ => "",
    };
    format!("{class}: {what}: {} ({e:?}){hint}", e.desc())
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
            NftError::Kernel { errno, what } => NftError::Kernel {
                errno,
                what: with(what),
            },
        }
    }

    /// The kernel's error number, if the kernel refused a netlink request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    fn is_errno(&self, e: nix::errno::Errno) -> bool {
        self.errno() == Some(e as i32)
    }

    /// Whether the error means the object was still in use.
    pub fn is_busy(&self) -> bool {
        matches!(self, NftError::Busy(_)) || self.is_errno(nix::errno::Errno::EBUSY)
    }

    /// Whether the error means something was missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, NftError::NotFound(_)) || self.is_errno(nix::errno::Errno::ENOENT)
    }

    /// Whether the error means something already existed.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, NftError::AlreadyExists(_)) || self.is_errno(nix::errno::Errno::EEXIST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::errno::Errno;

    #[test]
    fn the_kernels_errno_is_kept_and_classified() {
        let gone = NftError::Kernel {
            errno: Errno::ENOENT as i32,
            what: "listing ip verdict".into(),
        };
        assert_eq!(gone.errno(), Some(Errno::ENOENT as i32));
        assert!(gone.is_not_found() && !gone.is_busy() && !gone.is_already_exists());
        assert_eq!(
            gone.to_string(),
            "not found: listing ip verdict: No such file or directory (ENOENT)"
        );
        let gone = gone.context("reading the table");
        assert_eq!(
            gone.errno(),
            Some(Errno::ENOENT as i32),
            "the context keeps it"
        );
        assert!(
            gone.to_string()
                .contains("reading the table: listing ip verdict")
        );
        let busy = NftError::Kernel {
            errno: Errno::EBUSY as i32,
            what: "deleting chain x".into(),
        };
        assert!(busy.is_busy());
        let denied = NftError::Kernel {
            errno: Errno::EPERM as i32,
            what: "a transaction".into(),
        };
        assert!(
            denied
                .to_string()
                .ends_with("(EPERM) (verdict needs CAP_NET_ADMIN)")
        );
        assert_eq!(NftError::Busy("x".into()).errno(), None);
    }
}
