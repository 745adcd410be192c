//! Where verdict learns about Services, EndpointSlices and its Node.
//!
//! # Layout
//! - [`convert`]: Kubernetes API objects (k8s-openapi types) to the
//!   proxier's model.
//! - [`manifests`]: the same objects from YAML files on disk (the no-cluster
//!   source), with a clear error per bad document.

pub mod convert;
pub mod manifests;

pub use convert::{NodeInfo, node_info, service, slice};
pub use manifests::{Loaded, ManifestError, load};
