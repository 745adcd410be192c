//! Kubernetes API objects ([`crate::objects`]) to verdict's model: only
//! the fields kube-proxy reads, with the labels it honours.

use std::collections::BTreeMap;

use verdict_model::{
    AddressType, EndpointHints, EndpointSlice, LoadBalancerIngress, LoadBalancerIpMode, Protocol,
    Service, ServicePortSpec, ServiceType, SessionAffinity, SliceEndpoint, SlicePort,
    TrafficPolicy,
};

use crate::objects;
pub use crate::objects::ANNOTATION_TRIGGER_TIME;

/// The EndpointSlice label naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The Node label holding its topology zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

fn protocol(p: Option<&str>) -> Protocol {
    p.and_then(|p| p.parse().ok()).unwrap_or(Protocol::Tcp)
}

fn policy(p: Option<&str>) -> TrafficPolicy {
    match p {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    }
}

/// A Service as the proxier sees it.
pub fn service(svc: objects::Service) -> Service {
    let objects::Service {
        metadata: meta,
        spec,
        status,
    } = svc;
    let mut cluster_ips = spec.cluster_ips;
    if cluster_ips.is_empty()
        && let Some(ip) = spec.cluster_ip
    {
        cluster_ips.push(ip);
    }
    let service_type = match spec.type_.as_deref() {
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        _ => ServiceType::ClusterIP,
    };
    let affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => SessionAffinity::ClientIP,
        _ => SessionAffinity::None,
    };
    let timeout = spec
        .session_affinity_config
        .and_then(|c| c.client_ip)
        .and_then(|c| c.timeout_seconds);
    let ingress = status
        .load_balancer
        .ingress
        .into_iter()
        .map(|i| LoadBalancerIngress {
            ip: i.ip,
            ip_mode: i.ip_mode.as_deref().map(|m| {
                if m == "Proxy" {
                    LoadBalancerIpMode::Proxy
                } else {
                    LoadBalancerIpMode::Vip
                }
            }),
        })
        .collect();
    Service {
        namespace: meta.namespace,
        name: meta.name,
        labels: meta.labels,
        service_type,
        cluster_ips,
        ports: spec
            .ports
            .into_iter()
            .map(|p| ServicePortSpec {
                name: p.name.unwrap_or_default(),
                protocol: protocol(p.protocol.as_deref()),
                port: p.port,
                node_port: p.node_port,
            })
            .collect(),
        external_ips: spec.external_ips,
        load_balancer_source_ranges: spec.load_balancer_source_ranges,
        load_balancer_ingress: ingress,
        session_affinity: affinity,
        session_affinity_timeout_seconds: timeout,
        external_traffic_policy: policy(spec.external_traffic_policy.as_deref()),
        internal_traffic_policy: policy(spec.internal_traffic_policy.as_deref()),
        health_check_node_port: spec.health_check_node_port,
        traffic_distribution: spec.traffic_distribution,
    }
}

/// An EndpointSlice as the proxier sees it.
pub fn slice(s: objects::EndpointSlice) -> EndpointSlice {
    let objects::EndpointSlice {
        metadata: mut meta,
        address_type,
        endpoints,
        ports,
    } = s;
    let address_type = match address_type.as_str() {
        "IPv4" => AddressType::IPv4,
        "IPv6" => AddressType::IPv6,
        _ => AddressType::Fqdn,
    };
    EndpointSlice {
        service_name: meta.labels.remove(LABEL_SERVICE_NAME),
        namespace: meta.namespace,
        name: meta.name,
        address_type,
        endpoints: endpoints
            .into_iter()
            .map(|e| {
                let c = e.conditions;
                SliceEndpoint {
                    addresses: e.addresses,
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                    node_name: e.node_name,
                    zone: e.zone,
                    target_name: e.target_ref.and_then(|t| t.name),
                    hints: e.hints.map(|h| EndpointHints {
                        for_zones: h
                            .for_zones
                            .unwrap_or_default()
                            .into_iter()
                            .map(|z| z.name)
                            .collect(),
                        for_nodes: h
                            .for_nodes
                            .unwrap_or_default()
                            .into_iter()
                            .map(|n| n.name)
                            .collect(),
                    }),
                }
            })
            .collect(),
        ports: ports
            .into_iter()
            .map(|p| SlicePort {
                name: p.name,
                port: p.port,
                protocol: protocol(p.protocol.as_deref()),
            })
            .collect(),
        last_change_trigger_time: meta.annotations.last_change_trigger_time,
    }
}

/// What the proxier needs from its own Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `status.addresses` of type InternalIP, then ExternalIP (the node's
    /// primary addresses, as kube-proxy picks them).
    pub addresses: Vec<String>,
    /// `spec.podCIDRs` (or `spec.podCIDR`).
    pub pod_cidrs: Vec<String>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// All labels.
    pub labels: BTreeMap<String, String>,
    /// The Node is being deleted (deletion timestamp, or the cluster
    /// autoscaler's `ToBeDeletedByClusterAutoscaler` taint): it should stop
    /// taking traffic (`/healthz` turns 503).
    pub being_deleted: bool,
}

/// A Node's facts.
pub fn node_info(n: objects::Node) -> NodeInfo {
    let objects::Node {
        metadata: meta,
        spec,
        status,
    } = n;
    let of_type = |t: &str| -> Vec<String> {
        status
            .addresses
            .iter()
            .filter(|a| a.type_ == t)
            .map(|a| a.address.clone())
            .collect()
    };
    let mut addresses = of_type("InternalIP");
    if addresses.is_empty() {
        addresses = of_type("ExternalIP");
    }
    let mut pod_cidrs = spec.pod_cidrs;
    if pod_cidrs.is_empty()
        && let Some(c) = spec.pod_cidr
    {
        pod_cidrs.push(c);
    }
    let tainted = spec
        .taints
        .iter()
        .any(|t| t.key == "ToBeDeletedByClusterAutoscaler");
    NodeInfo {
        name: meta.name,
        addresses,
        pod_cidrs,
        zone: meta.labels.get(LABEL_ZONE).cloned(),
        labels: meta.labels,
        being_deleted: meta.deletion_timestamp || tainted,
    }
}

/// A Pod as the flow stream names it: `None` for one that shares the
/// node's network (its addresses are the node's) or has no address yet.
pub fn pod(p: objects::Pod) -> Option<verdict_model::Pod> {
    if p.spec.host_network {
        return None;
    }
    let ips: Box<[std::net::IpAddr]> = p
        .status
        .pod_ips
        .iter()
        .filter_map(|a| a.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        return None;
    }
    let meta = p.metadata;
    let workload = meta
        .owner_references
        .iter()
        .find(|o| o.controller)
        .map(|o| {
            std::sync::Arc::new(verdict_model::workload_of(
                &o.kind,
                &o.name,
                meta.labels
                    .get(verdict_model::LABEL_POD_TEMPLATE_HASH)
                    .map(String::as_str),
            ))
        });
    let labels = meta
        .labels
        .iter()
        .map(|(k, v)| verdict_model::Name::from(format!("{k}={v}")))
        .collect();
    Some(verdict_model::Pod {
        name: verdict_model::NamespacedName::new(meta.namespace, meta.name),
        ips,
        labels,
        workload,
    })
}

/// A ServiceCIDR's ranges (`spec.cidrs`); ones that do not parse are
/// skipped with a warning (the API server validates them, so this is a
/// corrupt object).
pub fn service_cidrs(c: &objects::ServiceCidr) -> Vec<ipnet::IpNet> {
    c.spec
        .cidrs
        .iter()
        .filter_map(|s| match s.parse() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(servicecidr = %c.metadata.name, cidr = %s, error = %e, "ignoring an invalid ServiceCIDR range");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    fn pod(doc: serde_json::Value) -> Option<verdict_model::Pod> {
        super::pod(serde_json::from_value(doc).unwrap())
    }

    #[test]
    fn a_pod_is_named_with_its_addresses_labels_and_workload() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web-7d4b9c-x2x9q", "namespace": "shop",
                "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
                "ownerReferences": [
                    {"kind": "Node", "name": "n1"},
                    {"kind": "ReplicaSet", "name": "web-7d4b9c", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"podIP": "10.180.0.1",
                "podIPs": [{"ip": "10.180.0.1"}, {"ip": "fd00::1"}]}
        }))
        .unwrap();
        assert_eq!(p.name.to_string(), "shop/web-7d4b9c-x2x9q");
        assert_eq!(p.ips.len(), 2);
        let labels: Vec<&str> = p.labels.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels, ["app=web", "pod-template-hash=7d4b9c"]);
        assert_eq!(p.workload.unwrap().to_string(), "Deployment/web");
        // The node's network, or no address yet: nothing to name.
        assert!(
            pod(
                serde_json::json!({"metadata": {"name": "a", "namespace": "kube-system"},
                "spec": {"hostNetwork": true}, "status": {"podIPs": [{"ip": "192.168.0.2"}]}})
            )
            .is_none()
        );
        assert!(
            pod(
                serde_json::json!({"metadata": {"name": "b", "namespace": "x"},
                "status": {"phase": "Pending"}})
            )
            .is_none()
        );
        // No controller: no workload; nulls where the API server may put them.
        let bare = pod(
            serde_json::json!({"metadata": {"name": "c", "namespace": "x",
            "labels": null, "ownerReferences": null},
            "spec": null, "status": {"podIPs": [{"ip": "10.0.0.9"}]}}),
        )
        .unwrap();
        assert!(bare.workload.is_none() && bare.labels.is_empty());
    }
}
