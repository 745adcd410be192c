//! nftables for verdict: a typed model of the objects we write, transactions
//! that render to `nft -f` scripts, an in-memory backend with the kernel's
//! all-or-nothing and reference rules, a packet tracer over it, and two
//! kernel backends: netlink and the `nft` program.
//!
//! This crate knows nothing about Kubernetes.
//!
//! # Layout
//! - [`ir`]: tables, chains, sets, maps, elements, rules and their text form.
//! - [`tx`]: [`Transaction`], an ordered batch of operations on one table.
//! - [`backend`]: the [`Backend`] trait and [`TableState`], what a backend
//!   reads back.
//! - [`memory`]: [`MemoryBackend`], nftables in memory.
//! - [`trace`]: [`Tracer`], which walks a packet through a [`TableState`].
//! - [`netlink`]: [`NetlinkBackend`], the kernel backend that speaks
//!   nf_tables over netlink, and [`NetlinkConntrack`], conntrack over
//!   ctnetlink.
//! - [`cli`]: [`NftCli`], the kernel backend that runs the `nft` program.
//! - [`json`]: reads `nft -j list table` back into the IR.
//! - [`kind`]: [`BackendKind`], which kernel backend to open (and its
//!   conntrack), and what it can do.
//! - [`addresses`]: the node's addresses over rtnetlink, announcements of
//!   their changes, and deleting a link.
//! - [`conntrack`]: the [`conntrack::Conntrack`] trait, its types and
//!   `ConntrackCli`, which runs the `conntrack` program.
//! - [`monitor`]: the kernel's announcements of ruleset changes (the
//!   netlink group `nft monitor` reads), to notice other processes' edits.
//! - [`nftrace`]: the kernel's packet traces (`nft monitor trace`).

pub mod addresses;
pub mod backend;
pub mod cli;
pub mod conntrack;
pub mod error;
pub mod flows;
pub mod ir;
pub mod json;
pub mod kind;
pub mod memory;
pub mod monitor;
pub mod netlink;
pub mod nftrace;
pub mod process;
pub mod trace;
pub mod tx;

pub use backend::{
    Around, Backend, ChainState, Counter, Counting, Found, Listener, SetState, TableState,
};
pub use cli::NftCli;
pub use error::NftError;
pub use ir::*;
pub use kind::BackendKind;
pub use memory::{MemoryBackend, goto};
pub use netlink::{NetlinkBackend, NetlinkConntrack};
pub use trace::{
    Disposition, ElementSource, InTable, Packet, Trace, TraceLookup, TracePath, TraceStep, Tracer,
};
pub use tx::{ChainRule, Name, Op, SetId, SetName, Transaction};
