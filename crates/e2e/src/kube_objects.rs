//! A conformance scenario's Services and EndpointSlices as the Kubernetes
//! objects an API server stores, so that the real kube-proxy and verdict
//! can be given the same ones (`crates/verdict/tests/differential_kernel.rs`).
//!
//! A scenario is built for kube-proxy's fake proxier, which takes any
//! object; the API server validates them. Where the API would refuse a
//! field that the proxy ignores in that place (a traffic policy on a
//! ClusterIP Service, a health-check node port without
//! `externalTrafficPolicy: Local` on a LoadBalancer), it is left out; a
//! LoadBalancer port without a node port gets none
//! (`allocateLoadBalancerNodePorts: false`), as the fake's.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use verdict_conformance::{Scenario, Step};
use verdict_model::{
    AddressType, EndpointSlice, LoadBalancerIpMode, Service, ServiceType, SessionAffinity,
    TrafficPolicy,
};

/// The objects of a scenario once all its steps are applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Objects {
    /// Services, without their status.
    pub services: Vec<Value>,
    /// The status of each Service that has one (its load balancer's
    /// ingress): (namespace, name, status).
    pub statuses: Vec<(String, String, Value)>,
    /// EndpointSlices.
    pub slices: Vec<Value>,
}

/// The scenario's final Services and EndpointSlices.
pub fn objects(s: &Scenario) -> Objects {
    let mut services: BTreeMap<(String, String), Service> = BTreeMap::new();
    let mut slices: BTreeMap<(String, String), EndpointSlice> = BTreeMap::new();
    for step in &s.setup.steps {
        match step {
            Step::Service(svc) => {
                services.insert((svc.namespace.clone(), svc.name.clone()), svc.clone());
            }
            Step::DeleteService(ns, n) => {
                services.remove(&(ns.clone(), n.clone()));
            }
            Step::Slice(sl) => {
                slices.insert((sl.namespace.clone(), sl.name.clone()), sl.clone());
            }
            Step::DeleteSlice(ns, n) => {
                slices.remove(&(ns.clone(), n.clone()));
            }
            Step::Sync => {}
        }
    }
    let mut out = Objects::default();
    for svc in services.values() {
        out.services.push(service_json(svc));
        if let Some(status) = status_json(svc) {
            out.statuses
                .push((svc.namespace.clone(), svc.name.clone(), status));
        }
    }
    out.slices = slices.values().map(slice_json).collect();
    out
}

fn policy(p: TrafficPolicy) -> &'static str {
    match p {
        TrafficPolicy::Cluster => "Cluster",
        TrafficPolicy::Local => "Local",
    }
}

/// A Service as the API server takes it (its status apart).
pub fn service_json(svc: &Service) -> Value {
    let type_ = match svc.service_type {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
        ServiceType::ExternalName => "ExternalName",
    };
    let external = matches!(
        svc.service_type,
        ServiceType::NodePort | ServiceType::LoadBalancer
    );
    let mut spec = json!({"type": type_});
    if svc.service_type == ServiceType::ExternalName {
        spec["externalName"] = json!("example.com");
    } else {
        let ips: Vec<&String> = svc.cluster_ips.iter().filter(|ip| !ip.is_empty()).collect();
        if let Some(first) = ips.first() {
            spec["clusterIP"] = json!(first);
            spec["clusterIPs"] = json!(ips);
            let families: Vec<&str> = ips
                .iter()
                .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
                .collect();
            spec["ipFamilies"] = json!(families);
            spec["ipFamilyPolicy"] = json!(if families.len() > 1 {
                "RequireDualStack"
            } else {
                "SingleStack"
            });
        }
        spec["ports"] = svc
            .ports
            .iter()
            .map(|p| {
                let mut port = json!({
                    "name": p.name,
                    "protocol": p.protocol.as_str().to_ascii_uppercase(),
                    "port": p.port,
                    "targetPort": p.port,
                });
                if let Some(np) = p.node_port.filter(|np| *np != 0)
                    && external
                {
                    port["nodePort"] = json!(np);
                }
                port
            })
            .collect();
    }
    if !svc.external_ips.is_empty() {
        spec["externalIPs"] = json!(svc.external_ips);
    }
    if !svc.load_balancer_source_ranges.is_empty() {
        spec["loadBalancerSourceRanges"] = json!(svc.load_balancer_source_ranges);
    }
    if svc.session_affinity == SessionAffinity::ClientIP {
        spec["sessionAffinity"] = json!("ClientIP");
        if let Some(t) = svc.session_affinity_timeout_seconds {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
        }
    }
    if external {
        spec["externalTrafficPolicy"] = json!(policy(svc.external_traffic_policy));
    }
    if svc.service_type != ServiceType::ExternalName {
        spec["internalTrafficPolicy"] = json!(policy(svc.internal_traffic_policy));
    }
    if svc.service_type == ServiceType::LoadBalancer {
        let every_port_has_one = svc
            .ports
            .iter()
            .all(|p| p.node_port.is_some_and(|np| np != 0));
        spec["allocateLoadBalancerNodePorts"] = json!(every_port_has_one);
        if svc.external_traffic_policy == TrafficPolicy::Local
            && let Some(hc) = svc.health_check_node_port
        {
            spec["healthCheckNodePort"] = json!(hc);
        }
    }
    if let Some(d) = &svc.traffic_distribution {
        spec["trafficDistribution"] = json!(d);
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": svc.namespace, "labels": svc.labels},
        "spec": spec,
    })
}

/// A Service's status (its load balancer's ingress), if it has one.
pub fn status_json(svc: &Service) -> Option<Value> {
    if svc.load_balancer_ingress.is_empty() {
        return None;
    }
    let ingress: Vec<Value> = svc
        .load_balancer_ingress
        .iter()
        .map(|i| {
            let mut v = json!({});
            if let Some(ip) = &i.ip {
                v["ip"] = json!(ip);
                // The API requires a mode with an IP (Vip by default).
                v["ipMode"] = json!(match i.ip_mode {
                    Some(LoadBalancerIpMode::Proxy) => "Proxy",
                    _ => "VIP",
                });
            }
            v
        })
        .collect();
    Some(json!({"status": {"loadBalancer": {"ingress": ingress}}}))
}

/// An EndpointSlice as the API server takes it.
pub fn slice_json(sl: &EndpointSlice) -> Value {
    let address_type = match sl.address_type {
        AddressType::IPv4 => "IPv4",
        AddressType::IPv6 => "IPv6",
        AddressType::Fqdn => "FQDN",
    };
    let endpoints: Vec<Value> = sl
        .endpoints
        .iter()
        .map(|e| {
            let mut conditions = json!({});
            for (k, v) in [
                ("ready", e.ready),
                ("serving", e.serving),
                ("terminating", e.terminating),
            ] {
                if let Some(v) = v {
                    conditions[k] = json!(v);
                }
            }
            let mut ep = json!({"addresses": e.addresses, "conditions": conditions});
            if let Some(n) = &e.node_name {
                ep["nodeName"] = json!(n);
            }
            if let Some(z) = &e.zone {
                ep["zone"] = json!(z);
            }
            if let Some(h) = &e.hints {
                ep["hints"] = json!({
                    "forZones": h.for_zones.iter().map(|z| json!({"name": z})).collect::<Vec<_>>(),
                    "forNodes": h.for_nodes.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
                });
            }
            ep
        })
        .collect();
    let ports: Vec<Value> = sl
        .ports
        .iter()
        .map(|p| {
            let mut v = json!({"protocol": p.protocol.as_str().to_ascii_uppercase()});
            if let Some(n) = &p.name {
                v["name"] = json!(n);
            }
            if let Some(port) = p.port {
                v["port"] = json!(port);
            }
            v
        })
        .collect();
    let mut labels = serde_json::Map::new();
    if let Some(s) = &sl.service_name {
        labels.insert("kubernetes.io/service-name".into(), json!(s));
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": sl.name, "namespace": sl.namespace, "labels": labels},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_conformance::upstream_scenarios;

    #[test]
    fn every_scenario_has_named_objects_with_their_fields() {
        for s in upstream_scenarios() {
            let o = objects(&s);
            assert!(!o.services.is_empty() || !o.slices.is_empty(), "{}", s.name);
            for v in o.services.iter().chain(&o.slices) {
                assert!(v["metadata"]["name"].is_string(), "{}: {v}", s.name);
                assert!(v["metadata"]["namespace"].is_string(), "{}: {v}", s.name);
            }
            for svc in &o.services {
                if svc["spec"]["type"] != "ExternalName" {
                    assert!(svc["spec"]["ports"].is_array(), "{}: {svc}", s.name);
                }
            }
        }
    }

    #[test]
    fn a_load_balancer_without_node_ports_asks_for_none() {
        use verdict_conformance::ServiceExt;
        use verdict_model::Protocol;
        let svc = verdict_conformance::svc("ns", "lb")
            .cluster_ip("172.30.0.41")
            .port("p80", Protocol::Tcp, 80, 0)
            .lb(&["1.2.3.4"])
            .hcnp(30000);
        let v = service_json(&svc);
        assert_eq!(v["spec"]["allocateLoadBalancerNodePorts"], false);
        assert!(
            v["spec"].get("healthCheckNodePort").is_none(),
            "not Local: {v}"
        );
        assert_eq!(
            status_json(&svc).unwrap()["status"]["loadBalancer"]["ingress"][0]["ipMode"],
            "VIP"
        );
    }
}
