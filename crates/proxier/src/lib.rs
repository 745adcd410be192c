//! The proxier: from Services, EndpointSlices and node facts to the
//! nftables ruleset, and to the smallest transaction that moves the kernel
//! from what it has to what it should have. Pure apart from the
//! [`verdict_nft::Backend`] it is given.
//!
//! # Layout
//! - [`config`]: node facts and settings of one family's proxier.
//! - [`layout`]: names, fixed chains and sets, and the shared chains.
//! - [`contribution`]: what one service port contributes (elements and
//!   chains).
//! - [`proxier`]: [`Proxier`], change intake and full/partial syncs, in
//!   stages (read back, recompute, adopt, plan, run, record), with the
//!   slot ledger, the contributions and the isolation of refused elements
//!   in modules of their own.
//! - [`staging`]: jumps added without validating the table.

pub mod config;
pub mod conntrack;
pub mod contribution;
pub mod error;
pub mod layout;
pub mod proxier;
pub mod staging;

pub use config::{LocalDetector, NodePortAddresses, ProxierConfig};
pub use error::ProxierError;
pub use proxier::{
    Conflict, FULL_SYNC_PERIOD, IntendedElement, Intent, Proxier, Quarantine,
    REMOVE_STALE_CHAINS_AFTER, SyncResult,
};
