//! A pod as the flow stream names it, from the opt-in watch of Pods
//! (`--watch-pods`): who it is, its addresses, its labels and the
//! workload that owns it. Nothing of the proxy's rules depends on it.

use std::net::IpAddr;
use std::sync::Arc;

use crate::names::{Name, NamespacedName};

/// The workload a pod belongs to: its controller, or the Deployment of
/// its ReplicaSet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Workload {
    /// `Deployment`, `StatefulSet`, `DaemonSet`, `Job`, ...
    pub kind: Name,
    /// Its name.
    pub name: Name,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// One pod: kept once per pod, shared by reference with the flows that
/// name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// Its namespace and name.
    pub name: NamespacedName,
    /// `status.podIPs`.
    pub ips: Box<[IpAddr]>,
    /// `metadata.labels`, `key=value`, in key order (shared text: pods of
    /// one workload have the same labels).
    pub labels: Box<[Name]>,
    /// Its workload, when an owner says.
    pub workload: Option<Arc<Workload>>,
}

/// The label a ReplicaSet gives its pods, and the suffix it adds to its
/// Deployment's name.
pub const LABEL_POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The workload of a pod whose controller is `(kind, name)`: a
/// ReplicaSet named `<deployment>-<pod-template-hash>` is its Deployment,
/// any other controller itself.
pub fn workload_of(kind: &str, name: &str, template_hash: Option<&str>) -> Workload {
    if kind == "ReplicaSet"
        && let Some(hash) = template_hash
        && let Some(deployment) = name.strip_suffix(hash).and_then(|n| n.strip_suffix('-'))
        && !deployment.is_empty()
    {
        return Workload {
            kind: "Deployment".into(),
            name: deployment.into(),
        };
    }
    Workload {
        kind: kind.into(),
        name: name.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicasets_pods_belong_to_its_deployment() {
        let w = workload_of("ReplicaSet", "web-7d4b9c", Some("7d4b9c"));
        assert_eq!(w.to_string(), "Deployment/web");
        // Without the hash label, or a name that does not end in it, the
        // ReplicaSet is all that is known.
        assert_eq!(
            workload_of("ReplicaSet", "web-7d4b9c", None).to_string(),
            "ReplicaSet/web-7d4b9c"
        );
        assert_eq!(
            workload_of("ReplicaSet", "web", Some("7d4b9c")).to_string(),
            "ReplicaSet/web"
        );
        assert_eq!(
            workload_of("StatefulSet", "db", Some("x")).to_string(),
            "StatefulSet/db"
        );
    }
}
