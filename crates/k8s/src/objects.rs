//! The Kubernetes objects verdict reads, as types of its own: only the
//! fields the proxy uses, each optional or defaulted as the API server may
//! leave it out or send it as `null`, and nothing else.
//!
//! Why not the full API types: a field verdict never reads must never
//! stop it from reading an object. The API server stores and serves what
//! its Go types accept, and they accept more than a strict schema does
//! (a Service condition without `lastTransitionTime` is served with
//! `"lastTransitionTime": null`, which a type that requires the field
//! cannot decode; Go clients take it). Reading only what is used also
//! decodes a large list faster: everything else is skipped unparsed.
//!
//! [`crate::convert`] turns these into the proxier's model; the manifests
//! source reads the same types after validating a document.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

/// `null` or absent is the type's default (the API server writes `null`
/// for a Go nil slice or map that has no `omitempty`).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The metadata every object has, as far as verdict reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    /// `metadata.name`.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `metadata.namespace` (empty for cluster-scoped objects).
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    /// `metadata.resourceVersion`.
    #[serde(default, deserialize_with = "nullable")]
    pub resource_version: String,
    /// `metadata.labels`.
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`: only the ones verdict reads are kept.
    #[serde(default)]
    pub annotations: Annotations,
    /// Whether `metadata.deletionTimestamp` is set.
    #[serde(default, deserialize_with = "present")]
    pub deletion_timestamp: bool,
    /// `metadata.ownerReferences` (read for Pods).
    #[serde(default, deserialize_with = "nullable")]
    pub owner_references: Vec<OwnerReference>,
}

/// One `metadata.ownerReferences[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct OwnerReference {
    /// `kind`.
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// `name`.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `controller`.
    #[serde(default, deserialize_with = "nullable")]
    pub controller: bool,
}

/// Whether a field is there and not `null`, whatever its value.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<IgnoredAny>::deserialize(d)?.is_some())
}

/// The annotation holding when an EndpointSlice's endpoints last changed.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The annotations verdict reads; the rest (a Service may carry kubectl's
/// whole last-applied configuration) are skipped without being kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations {
    /// [`ANNOTATION_TRIGGER_TIME`].
    pub last_change_trigger_time: Option<String>,
}

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Annotations, D::Error> {
        struct Pick;
        impl<'de> Visitor<'de> for Pick {
            type Value = Annotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Annotations, E> {
                Ok(Annotations::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Annotations, E> {
                Ok(Annotations::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Annotations, D::Error> {
                d.deserialize_map(Pick)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Annotations, A::Error> {
                let mut out = Annotations::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == ANNOTATION_TRIGGER_TIME {
                        out.last_change_trigger_time = map.next_value()?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_option(Pick)
    }
}

/// A `v1` Service.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Service {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `spec`.
    #[serde(default, deserialize_with = "nullable")]
    pub spec: ServiceSpec,
    /// `status`: only its load balancer's ingress points.
    #[serde(default, deserialize_with = "nullable")]
    pub status: ServiceStatus,
}

/// `spec` of a Service.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// `type`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    /// `clusterIP`.
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// `clusterIPs`.
    #[serde(default, rename = "clusterIPs", deserialize_with = "nullable")]
    pub cluster_ips: Vec<String>,
    /// `ports`.
    #[serde(default, deserialize_with = "nullable")]
    pub ports: Vec<ServicePort>,
    /// `externalIPs`.
    #[serde(default, rename = "externalIPs", deserialize_with = "nullable")]
    pub external_ips: Vec<String>,
    /// `loadBalancerSourceRanges`.
    #[serde(default, deserialize_with = "nullable")]
    pub load_balancer_source_ranges: Vec<String>,
    /// `sessionAffinity`.
    #[serde(default)]
    pub session_affinity: Option<String>,
    /// `sessionAffinityConfig`.
    #[serde(default)]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `externalTrafficPolicy`.
    #[serde(default)]
    pub external_traffic_policy: Option<String>,
    /// `internalTrafficPolicy`.
    #[serde(default)]
    pub internal_traffic_policy: Option<String>,
    /// `healthCheckNodePort`.
    #[serde(default)]
    pub health_check_node_port: Option<i32>,
    /// `trafficDistribution`.
    #[serde(default)]
    pub traffic_distribution: Option<String>,
}

/// One `spec.ports[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// `name`.
    #[serde(default)]
    pub name: Option<String>,
    /// `protocol`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// `port` (required by the API: 0 if absent, which validation refuses).
    #[serde(default)]
    pub port: i32,
    /// `nodePort`.
    #[serde(default)]
    pub node_port: Option<i32>,
}

/// `spec.sessionAffinityConfig`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    /// `clientIP`.
    #[serde(default, rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

/// `spec.sessionAffinityConfig.clientIP`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// `timeoutSeconds`.
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
}

/// `status` of a Service, as far as the proxy reads it (not its
/// conditions).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// `loadBalancer`.
    #[serde(default, deserialize_with = "nullable")]
    pub load_balancer: LoadBalancerStatus,
}

/// `status.loadBalancer`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct LoadBalancerStatus {
    /// `ingress`.
    #[serde(default, deserialize_with = "nullable")]
    pub ingress: Vec<LoadBalancerIngress>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    /// `ip`.
    #[serde(default)]
    pub ip: Option<String>,
    /// `ipMode`.
    #[serde(default)]
    pub ip_mode: Option<String>,
}

/// A `discovery.k8s.io/v1` EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `addressType` (required by the API: empty if absent, which is no
    /// IP family).
    #[serde(default, deserialize_with = "nullable")]
    pub address_type: String,
    /// `endpoints` (`null` when there are none).
    #[serde(default, deserialize_with = "nullable")]
    pub endpoints: Vec<Endpoint>,
    /// `ports`.
    #[serde(default, deserialize_with = "nullable")]
    pub ports: Vec<EndpointPort>,
}

/// One `endpoints[]` entry of an EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// `addresses`.
    #[serde(default, deserialize_with = "nullable")]
    pub addresses: Vec<String>,
    /// `conditions`.
    #[serde(default, deserialize_with = "nullable")]
    pub conditions: EndpointConditions,
    /// `nodeName`.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `zone`.
    #[serde(default)]
    pub zone: Option<String>,
    /// `targetRef`: only its name.
    #[serde(default)]
    pub target_ref: Option<TargetRef>,
    /// `hints`.
    #[serde(default)]
    pub hints: Option<EndpointHints>,
}

/// `endpoints[].conditions`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct EndpointConditions {
    /// `ready`.
    #[serde(default)]
    pub ready: Option<bool>,
    /// `serving`.
    #[serde(default)]
    pub serving: Option<bool>,
    /// `terminating`.
    #[serde(default)]
    pub terminating: Option<bool>,
}

/// `endpoints[].targetRef`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct TargetRef {
    /// `name`.
    #[serde(default)]
    pub name: Option<String>,
}

/// `endpoints[].hints`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints {
    /// `forZones`.
    #[serde(default)]
    pub for_zones: Option<Vec<Named>>,
    /// `forNodes`.
    #[serde(default)]
    pub for_nodes: Option<Vec<Named>>,
}

/// An entry that is only a name (`forZones[]`, `forNodes[]`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Named {
    /// `name`.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
}

/// One `ports[]` entry of an EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct EndpointPort {
    /// `name`.
    #[serde(default)]
    pub name: Option<String>,
    /// `port`.
    #[serde(default)]
    pub port: Option<i32>,
    /// `protocol`.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// A `v1` Node.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `spec`.
    #[serde(default, deserialize_with = "nullable")]
    pub spec: NodeSpec,
    /// `status`: only its addresses.
    #[serde(default, deserialize_with = "nullable")]
    pub status: NodeStatus,
}

/// `spec` of a Node.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// `podCIDR`.
    #[serde(default, rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    /// `podCIDRs`.
    #[serde(default, rename = "podCIDRs", deserialize_with = "nullable")]
    pub pod_cidrs: Vec<String>,
    /// `taints`: only their keys.
    #[serde(default, deserialize_with = "nullable")]
    pub taints: Vec<Taint>,
}

/// One `spec.taints[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Taint {
    /// `key`.
    #[serde(default, deserialize_with = "nullable")]
    pub key: String,
}

/// `status` of a Node.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct NodeStatus {
    /// `addresses`.
    #[serde(default, deserialize_with = "nullable")]
    pub addresses: Vec<NodeAddress>,
}

/// One `status.addresses[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct NodeAddress {
    /// `type`.
    #[serde(default, rename = "type", deserialize_with = "nullable")]
    pub type_: String,
    /// `address`.
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
}

/// A `v1` Pod: who it is, its owner, and its addresses.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Pod {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `spec`: whether it shares the node's network.
    #[serde(default, deserialize_with = "nullable")]
    pub spec: PodSpec,
    /// `status`: its addresses.
    #[serde(default, deserialize_with = "nullable")]
    pub status: PodStatus,
}

/// `spec` of a Pod.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// `hostNetwork`: its addresses are the node's.
    #[serde(default, deserialize_with = "nullable")]
    pub host_network: bool,
}

/// `status` of a Pod.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct PodStatus {
    /// `podIPs`.
    #[serde(default, rename = "podIPs", deserialize_with = "nullable")]
    pub pod_ips: Vec<PodIp>,
}

/// One `status.podIPs[]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct PodIp {
    /// `ip`.
    #[serde(default, deserialize_with = "nullable")]
    pub ip: String,
}

/// A `networking.k8s.io/v1` ServiceCIDR.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ServiceCidr {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `spec`.
    #[serde(default, deserialize_with = "nullable")]
    pub spec: ServiceCidrSpec,
}

/// `spec` of a ServiceCIDR.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ServiceCidrSpec {
    /// `cidrs`.
    #[serde(default, deserialize_with = "nullable")]
    pub cidrs: Vec<String>,
}

/// Only the metadata of an object: what is left of one that does not
/// decode, so that its key is not lost (a later deletion of it must still
/// remove what was known of it).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Head {
    /// `metadata`, its name, namespace and resourceVersion only.
    #[serde(default)]
    pub metadata: HeadMeta,
}

/// [`Head`]'s metadata.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeadMeta {
    /// `metadata.name`.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `metadata.namespace`.
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    /// `metadata.resourceVersion`.
    #[serde(default, deserialize_with = "nullable")]
    pub resource_version: String,
    /// `metadata.annotations`, for a bookmark's end of the initial events.
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
}

/// An object of the kinds verdict reads: its metadata, for the watch.
pub trait Object: for<'de> Deserialize<'de> {
    /// The object's metadata.
    fn meta(&self) -> &Meta;
}

impl Object for Service {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Object for EndpointSlice {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Object for Node {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Object for Pod {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

impl Object for ServiceCidr {
    fn meta(&self) -> &Meta {
        &self.metadata
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_condition_without_its_transition_time_does_not_matter() {
        // As the API server serves a Service whose status was written
        // without lastTransitionTime.
        let text = r#"{"kind":"Service","apiVersion":"v1",
            "metadata":{"name":"web","namespace":"shop","uid":"u-1","resourceVersion":"42",
                        "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"}},
            "spec":{"clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],
                    "ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]},
            "status":{"loadBalancer":{},"conditions":[{"type":"Ready","status":"True",
                      "lastTransitionTime":null,"reason":"r","message":"m"}]}}"#;
        let s: Service = serde_json::from_str(text).unwrap();
        assert_eq!(s.metadata.uid, "u-1");
        assert_eq!(s.metadata.resource_version, "42");
        assert_eq!(s.spec.ports[0].port, 80);
        assert_eq!(s.metadata.annotations, Annotations::default());
        // The full API type refuses the same text.
        assert!(
            serde_json::from_str::<k8s_openapi::api::core::v1::Service>(text).is_err(),
            "k8s-openapi now takes it: this test no longer shows why own types are needed"
        );
    }

    #[test]
    fn null_lists_and_maps_are_empty() {
        let s: EndpointSlice = serde_json::from_str(
            r#"{"metadata":{"name":"a","namespace":"n","labels":null,"annotations":null},
                "addressType":"IPv4","endpoints":null,"ports":null}"#,
        )
        .unwrap();
        assert!(s.endpoints.is_empty() && s.ports.is_empty());
        assert!(s.metadata.labels.is_empty());
        let n: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n","deletionTimestamp":null},"spec":null,"status":{"addresses":null}}"#,
        )
        .unwrap();
        assert!(!n.metadata.deletion_timestamp);
        let n: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n","deletionTimestamp":"2026-01-01T00:00:00Z"}}"#,
        )
        .unwrap();
        assert!(n.metadata.deletion_timestamp);
    }

    #[test]
    fn only_the_trigger_time_annotation_is_kept() {
        let s: EndpointSlice = serde_json::from_str(
            r#"{"metadata":{"name":"a","annotations":{"x":"y",
                "endpoints.kubernetes.io/last-change-trigger-time":"2026-01-01T00:00:00Z","z":"w"}},
                "addressType":"IPv4"}"#,
        )
        .unwrap();
        assert_eq!(
            s.metadata.annotations.last_change_trigger_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
    }

    #[test]
    fn the_head_of_an_object_that_does_not_decode_is_still_read() {
        let text = r#"{"metadata":{"name":"web","namespace":"shop","resourceVersion":"7"},
                       "spec":{"ports":[{"port":"eighty"}]}}"#;
        assert!(serde_json::from_str::<Service>(text).is_err());
        let h: Head = serde_json::from_str(text).unwrap();
        assert_eq!(
            (h.metadata.namespace.as_str(), h.metadata.name.as_str()),
            ("shop", "web")
        );
        assert_eq!(h.metadata.resource_version, "7");
    }
}
