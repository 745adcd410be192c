//! Plain mirrors of the Kubernetes API fields the proxy reads.
//!
//! These are filled in by the watcher layer (kube-rs) and are deliberately dumb:
//! IPs and CIDRs stay strings, exactly as the API server returns them, because
//! turning them into addresses is the proxy's job ([`crate::service_ports`],
//! [`crate::EndpointSliceCache`]) and must follow Kubernetes' legacy parsing rules.

use std::collections::BTreeMap;

use crate::ip::IpFamily;
use crate::names::{NamespacedName, Protocol};

/// `spec.type` of a Service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceType {
    /// `ClusterIP` (the default).
    #[default]
    ClusterIP,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName` (never proxied).
    ExternalName,
}

/// `spec.externalTrafficPolicy` / `spec.internalTrafficPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrafficPolicy {
    /// Any endpoint in the cluster (the default).
    #[default]
    Cluster,
    /// Only endpoints on the receiving node.
    Local,
}

/// `spec.sessionAffinity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SessionAffinity {
    /// No affinity (the default).
    #[default]
    None,
    /// Stick each client IP to one endpoint.
    ClientIP,
}

/// `status.loadBalancer.ingress[].ipMode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoadBalancerIpMode {
    /// The LB delivers packets with the LB IP as destination; the proxy programs it.
    #[default]
    Vip,
    /// The LB proxies to the node; the proxy must NOT program the LB IP.
    Proxy,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    /// `ip` (hostname-only ingresses have none).
    pub ip: Option<String>,
    /// `ipMode`; `None` behaves like [`LoadBalancerIpMode::Vip`].
    pub ip_mode: Option<LoadBalancerIpMode>,
}

/// One `spec.ports[]` entry of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServicePortSpec {
    /// `name` (`""` when the Service has a single unnamed port).
    pub name: String,
    /// `protocol`.
    pub protocol: Protocol,
    /// `port`.
    pub port: i32,
    /// `nodePort` (`None` or `Some(0)` when not allocated).
    pub node_port: Option<i32>,
}

/// The fields of a `v1.Service` the proxy reads.
#[derive(Default, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.type`.
    pub service_type: ServiceType,
    /// `spec.clusterIPs` (or `[spec.clusterIP]`); `"None"` or empty means headless.
    pub cluster_ips: Vec<String>,
    /// `spec.ports`.
    pub ports: Vec<ServicePortSpec>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<String>,
    /// `spec.loadBalancerSourceRanges`.
    pub load_balancer_source_ranges: Vec<String>,
    /// `status.loadBalancer.ingress`.
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    /// `spec.sessionAffinity`.
    pub session_affinity: SessionAffinity,
    /// `spec.sessionAffinityConfig.clientIP.timeoutSeconds` (default 10800 when ClientIP).
    pub session_affinity_timeout_seconds: Option<i32>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`.
    pub health_check_node_port: Option<i32>,
    /// `spec.trafficDistribution` (e.g. `"PreferClose"`, `"PreferSameNode"`).
    pub traffic_distribution: Option<String>,
}

impl Service {
    /// The Service's namespace and name.
    pub fn namespaced_name(&self) -> NamespacedName {
        NamespacedName::new(self.namespace.clone(), self.name.clone())
    }
}

/// `addressType` of an EndpointSlice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressType {
    /// IPv4 addresses.
    #[default]
    IPv4,
    /// IPv6 addresses.
    IPv6,
    /// Domain names (ignored by the proxy).
    Fqdn,
}

impl AddressType {
    /// The IP family of the slice's addresses, `None` for FQDN slices.
    pub fn family(self) -> Option<IpFamily> {
        match self {
            AddressType::IPv4 => Some(IpFamily::V4),
            AddressType::IPv6 => Some(IpFamily::V6),
            AddressType::Fqdn => None,
        }
    }
}

/// `endpoints[].hints` of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointHints {
    /// `forZones[].name`.
    pub for_zones: Vec<String>,
    /// `forNodes[].name`.
    pub for_nodes: Vec<String>,
}

/// One `endpoints[]` entry of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SliceEndpoint {
    /// `addresses` (only the first one is used).
    pub addresses: Vec<String>,
    /// `conditions.ready` (`None` means ready).
    pub ready: Option<bool>,
    /// `conditions.serving` (`None` means serving).
    pub serving: Option<bool>,
    /// `conditions.terminating` (`None` means not terminating).
    pub terminating: Option<bool>,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `hints`.
    pub hints: Option<EndpointHints>,
    /// `targetRef.name`: the pod, for the flow stream.
    pub target_name: Option<String>,
}

/// One `ports[]` entry of an EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// `name` (`None` is treated like `""`).
    pub name: Option<String>,
    /// `port` (`None`/0 entries are ignored).
    pub port: Option<i32>,
    /// `protocol`.
    pub protocol: Protocol,
}

/// The fields of a `discovery.k8s.io/v1` EndpointSlice the proxy reads.
#[derive(Default, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointSlice {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Label `kubernetes.io/service-name`; slices without it are ignored.
    pub service_name: Option<String>,
    /// `addressType`.
    pub address_type: AddressType,
    /// `endpoints`.
    pub endpoints: Vec<SliceEndpoint>,
    /// `ports`.
    pub ports: Vec<SlicePort>,
    /// Annotation `endpoints.kubernetes.io/last-change-trigger-time`, kept as text.
    pub last_change_trigger_time: Option<String>,
}

impl EndpointSlice {
    /// The Service this slice belongs to, or `None` if the slice lacks the
    /// `kubernetes.io/service-name` label or its own namespace/name.
    pub fn service(&self) -> Option<NamespacedName> {
        let service = self.service_name.as_deref().filter(|s| !s.is_empty())?;
        if self.namespace.is_empty() || self.name.is_empty() {
            return None;
        }
        Some(NamespacedName::new(self.namespace.clone(), service))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let svc = Service::default();
        assert_eq!(svc.service_type, ServiceType::ClusterIP);
        assert_eq!(svc.session_affinity, SessionAffinity::None);
        assert_eq!(svc.external_traffic_policy, TrafficPolicy::Cluster);
        assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
        assert_eq!(EndpointSlice::default().address_type, AddressType::IPv4);
    }

    #[test]
    fn address_type_family() {
        assert_eq!(AddressType::IPv4.family(), Some(IpFamily::V4));
        assert_eq!(AddressType::IPv6.family(), Some(IpFamily::V6));
        assert_eq!(AddressType::Fqdn.family(), None);
    }

    #[test]
    fn slice_service_key() {
        let mut slice = EndpointSlice {
            namespace: "ns".into(),
            name: "svc-abc".into(),
            service_name: Some("svc".into()),
            ..Default::default()
        };
        assert_eq!(slice.service(), Some(NamespacedName::new("ns", "svc")));
        slice.service_name = Some(String::new());
        assert_eq!(slice.service(), None);
        slice.service_name = None;
        assert_eq!(slice.service(), None);
        slice.service_name = Some("svc".into());
        slice.name = String::new();
        assert_eq!(slice.service(), None);
    }

    #[test]
    fn service_namespaced_name() {
        let svc = Service {
            namespace: "a".into(),
            name: "b".into(),
            ..Default::default()
        };
        assert_eq!(svc.namespaced_name().to_string(), "a/b");
    }
}
