//! Kubernetes API objects to verdict's model: only the fields kube-proxy
//! reads, with the labels it honours.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use verdict_model::{
    AddressType, EndpointHints, EndpointSlice, LoadBalancerIngress, LoadBalancerIpMode, Protocol,
    Service, ServicePortSpec, ServiceType, SessionAffinity, SliceEndpoint, SlicePort,
    TrafficPolicy,
};

/// The EndpointSlice label naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The annotation carrying when the endpoints last changed.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
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
pub fn service(svc: &core::Service) -> Service {
    let meta = &svc.metadata;
    let spec = svc.spec.clone().unwrap_or_default();
    let mut cluster_ips = spec.cluster_ips.clone().unwrap_or_default();
    if cluster_ips.is_empty()
        && let Some(ip) = &spec.cluster_ip
    {
        cluster_ips.push(ip.clone());
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
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
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
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        service_type,
        cluster_ips,
        ports: spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| ServicePortSpec {
                name: p.name.unwrap_or_default(),
                protocol: protocol(p.protocol.as_deref()),
                port: p.port,
                node_port: p.node_port,
            })
            .collect(),
        external_ips: spec.external_ips.unwrap_or_default(),
        load_balancer_source_ranges: spec.load_balancer_source_ranges.unwrap_or_default(),
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
pub fn slice(s: &discovery::EndpointSlice) -> EndpointSlice {
    let meta = &s.metadata;
    let labels = meta.labels.clone().unwrap_or_default();
    let address_type = match s.address_type.as_str() {
        "IPv4" => AddressType::IPv4,
        "IPv6" => AddressType::IPv6,
        _ => AddressType::Fqdn,
    };
    EndpointSlice {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        service_name: labels.get(LABEL_SERVICE_NAME).cloned(),
        address_type,
        endpoints: s
            .endpoints
            .iter()
            .map(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                SliceEndpoint {
                    addresses: e.addresses.clone(),
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_name: e.target_ref.as_ref().and_then(|t| t.name.clone()),
                    hints: e.hints.as_ref().map(|h| EndpointHints {
                        for_zones: h
                            .for_zones
                            .clone()
                            .unwrap_or_default()
                            .into_iter()
                            .map(|z| z.name)
                            .collect(),
                        for_nodes: h
                            .for_nodes
                            .clone()
                            .unwrap_or_default()
                            .into_iter()
                            .map(|n| n.name)
                            .collect(),
                    }),
                }
            })
            .collect(),
        ports: s
            .ports
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|p| SlicePort {
                name: p.name,
                port: p.port,
                protocol: protocol(p.protocol.as_deref()),
            })
            .collect(),
        last_change_trigger_time: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
            .cloned(),
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
pub fn node_info(n: &core::Node) -> NodeInfo {
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let addrs = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    let mut addresses: Vec<String> = addrs
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    if addresses.is_empty() {
        addresses = addrs
            .iter()
            .filter(|a| a.type_ == "ExternalIP")
            .map(|a| a.address.clone())
            .collect();
    }
    let spec = n.spec.clone().unwrap_or_default();
    let mut pod_cidrs = spec.pod_cidrs.clone().unwrap_or_default();
    if pod_cidrs.is_empty()
        && let Some(c) = spec.pod_cidr.clone()
    {
        pod_cidrs.push(c);
    }
    let tainted = spec
        .taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "ToBeDeletedByClusterAutoscaler");
    NodeInfo {
        name: n.metadata.name.clone().unwrap_or_default(),
        addresses,
        pod_cidrs,
        zone: labels.get(LABEL_ZONE).cloned(),
        labels,
        being_deleted: n.metadata.deletion_timestamp.is_some() || tainted,
    }
}

/// A ServiceCIDR's ranges (`spec.cidrs`); ones that do not parse are
/// skipped with a warning (the API server validates them, so this is a
/// corrupt object).
pub fn service_cidrs(c: &networking::ServiceCIDR) -> Vec<ipnet::IpNet> {
    let cidrs = c
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default();
    cidrs
        .iter()
        .filter_map(|s| match s.parse() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(servicecidr = ?c.metadata.name, cidr = %s, error = %e, "ignoring an invalid ServiceCIDR range");
                None
            }
        })
        .collect()
}
