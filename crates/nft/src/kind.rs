//! Which kernel backend verdict programs nftables through
//! (`--nftables-backend`), and what each can do: opened here, so that
//! callers choose a kind and never name a backend type.

use crate::backend::Backend;
use crate::cli::NftCli;
use crate::conntrack::{Conntrack, ConntrackCli, ConntrackError};
use crate::error::NftError;
use crate::netlink::{NetlinkBackend, NetlinkConntrack};

/// How verdict reaches nftables and conntrack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// nf_tables and ctnetlink messages on netlink sockets: no program
    /// runs.
    #[default]
    Netlink,
    /// The `nft` and `conntrack` programs, once per transaction, read-back
    /// and listing.
    Nft,
}

impl BackendKind {
    /// Opens the backend in this process's network namespace.
    pub fn open(self) -> Result<Box<dyn Backend + Send>, NftError> {
        Ok(match self {
            BackendKind::Netlink => Box::new(NetlinkBackend::new()?),
            BackendKind::Nft => Box::new(NftCli::new()?),
        })
    }

    /// The conntrack table, the same way: ctnetlink with netlink, the
    /// `conntrack` program with nft.
    pub fn conntrack(self) -> Result<Box<dyn Conntrack>, ConntrackError> {
        Ok(match self {
            BackendKind::Netlink => Box::new(NetlinkConntrack::new()?),
            BackendKind::Nft => Box::new(ConntrackCli::new()),
        })
    }

    /// Whether [`Backend::lookup`] finds an element by its key without
    /// listing the set: netlink asks the kernel for the key; `nft` lists
    /// the whole set for any element, so a reader through it is better off
    /// reading the table once.
    pub fn looks_up_keys(self) -> bool {
        self == BackendKind::Netlink
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<BackendKind, String> {
        match s {
            "netlink" => Ok(BackendKind::Netlink),
            "nft" => Ok(BackendKind::Nft),
            other => Err(format!("--nftables-backend {other:?}: use netlink or nft")),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Netlink => "netlink",
            BackendKind::Nft => "nft",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_and_print_as_the_flag_spells_them() {
        for k in [BackendKind::Netlink, BackendKind::Nft] {
            assert_eq!(k.to_string().parse::<BackendKind>(), Ok(k));
        }
        assert!("iptables".parse::<BackendKind>().is_err());
        assert!(BackendKind::Netlink.looks_up_keys() && !BackendKind::Nft.looks_up_keys());
    }
}
