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
//! - [`apiserver`]: a fake Kubernetes API server (list, watch, bookmarks,
//!   410 Gone) for the Kubernetes source's tests.
//! - [`http`]: decoding answers read off the wire by hand.
//! - [`realapi`]: the real kube-apiserver (on etcd 3.4 or 3.6) and
//!   kube-proxy of `../shared/bin`, the judges of every protocol question.
//! - [`runner`]: replays `verdict-conformance` scenarios as real traffic.

pub mod apiserver;
pub mod bed;
pub mod http;
pub mod kube_objects;
pub mod netns;
pub mod rbac;
pub mod realapi;
pub mod runner;
