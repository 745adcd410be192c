//! Hubble's APIs, served by verdict: `observer.Observer` (`GetFlows`,
//! `ServerStatus`) and the gRPC health service, wire-compatible with
//! Hubble's protocol definitions so that the unmodified `hubble` CLI
//! reads a node's flows (`hubble observe`, `hubble status`).
//!
//! * [`wire`]: protocol buffers' wire format, by hand.
//! * [`proto`]: the messages, with Hubble's field numbers.
//! * [`select`]: which flows a request selects.
//! * [`peer`]: `peer.Peer/Notify`, the nodes Relay connects to.
//! * [`grpc`]: the server (HTTP/2 through hyper); the node's flows come
//!   through [`grpc::FlowSource`].
//! * [`tls`]: TLS with client certificates, off loopback.

pub mod grpc;
pub mod peer;
pub mod proto;
pub mod select;
pub mod tls;
pub mod wire;
