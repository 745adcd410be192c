//! verdict's node runtime: what runs on a node between kube-proxy's
//! configuration (the binary's) and the kernel (`verdict-nft`'s).
//!
//! One writer owns the node: [`run::run`] takes the node ([`NodeProxy`]),
//! the kernel's handles ([`Kernel`]) and one channel of [`Input`]s
//! (the source's updates, the kernel's announcements, a changed
//! `--config`, the request to stop), waits until the [schedule] says a
//! sync is due, syncs both families, does the work after the sync (the
//! service health-check node ports, stale UDP conntrack), and publishes
//! what the sync touched to the read model. Every reader (the
//! introspection API, the web view, `/metrics`, health) sees only the
//! read model ([`NodeHandle`]), which a sync never holds while it talks to
//! the kernel. Decisions are pure functions of what happened, time passed
//! in: [`schedule`] (when to sync, and how) and [`outcome`] (what a sync
//! means for health, metrics and history).
//!
//! # Layout
//! - [`settings`]: [`NodeSettings`], what the binary tells the node.
//! - [`proxy`]: [`NodeProxy`], both families' planes and the objects.
//! - [`family`]: [`FamilyPlane`], one family's proxier and what is kept
//!   beside it for the work after a sync.
//! - [`input`]: [`Input`] and the threads that send it ([`Source`], the
//!   ruleset and address listeners, the `--config` watch).
//! - [`run`]: the loop.
//! - [`view`]: the read model.
//! - [`history`]: the last syncs and foreign changes, bounded.
//! - [`inspect`]: the answers of the introspection API, and the web view.
//! - [`api`]: the API's routes, on a node or offline.
//! - [`once`]: `plan`, `cleanup`, `--init-only`, the offline node.
//! - [`probe`]: the startup checks (kernel, CAP_NET_ADMIN, a dry run).
//! - [`setup`]: the conntrack sysctls and OOM score.
//! - [`leftovers`]: what kube-proxy's other modes left behind.

pub mod access;
pub mod apart;
pub mod api;
pub mod error;
pub mod family;
pub mod flows;
pub mod history;
pub mod hubble;
pub mod input;
pub mod inspect;
pub mod leftovers;
pub mod memory;
pub mod once;
pub mod outcome;
pub mod probe;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod settings;
pub mod setup;
pub mod view;

pub use error::NodeError;
pub use family::FamilyPlane;
pub use input::{Foreign, Input, Source};
pub use proxy::{FixedAddresses, Host, KernelAddresses, NodeAddresses, NodeProxy};
pub use run::{Kernel, run};
pub use settings::{ConntrackSettings, DetectLocal, NodeSettings};
pub use view::{FamilyView, NodeHandle, PortView, ServiceFamily, ServiceView};
