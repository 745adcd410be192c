//! Where verdict learns about Services, EndpointSlices and its Node.
//!
//! # Layout
//! - [`convert`]: Kubernetes API objects (k8s-openapi types) to the
//!   proxier's model.
//! - [`events`]: Events about Services (a Service the kernel refused),
//!   posted from a thread of their own.
//! - [`manifests`]: the same objects from YAML files on disk (the no-cluster
//!   source), with a clear error per bad document; an edit parses only the
//!   files that changed and comes out as the same updates the API source
//!   gives.
//! - [`nodes`]: every Node, watched only while Hubble Relay asks for
//!   the peers.
//! - [`validate`]: the API server's validation of those objects, for the
//!   manifests source, which has no API server in front of it: an invalid
//!   object is refused whole, naming the field.
//! - [`watch`]: the same objects from the Kubernetes API (kube-rs
//!   watchers), with relists turned into differences.

pub mod access;
pub mod client;
pub mod convert;
pub mod events;
pub mod manifests;
pub mod nodes;
pub mod objects;
pub mod reflector;
pub mod review;
pub mod validate;
pub mod watch;

pub use convert::{NodeInfo, node_info, pod, service, service_cidrs, slice};
pub use manifests::{Loaded, ManifestError, Manifests, load};
