//! verdict's network-namespace test bed: builds a small cluster out of
//! network namespaces on one machine, programs its node through the real
//! proxier and the real `nft`, and sends real packets.
//!
//! Everything runs inside namespaces this crate creates (named
//! `vt<pid>-<n>-…`), which are deleted when their guard is dropped, also
//! when a test fails. Nothing touches the machine's own network.
//!
//! # Layout
//! - [`netns`]: namespace guards and command helpers.
//! - [`bed`]: the topology (node, lan router, second node, external client, pods).
//! - [`runner`]: replays `verdict-conformance` scenarios as real traffic.

pub mod bed;
pub mod netns;
pub mod runner;
