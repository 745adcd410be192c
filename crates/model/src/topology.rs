//! kube-proxy's `CategorizeEndpoints`: which endpoints each traffic policy uses on
//! this node, taking topology hints and terminating endpoints into account.

use crate::endpoints::{Endpoint, cmp_by_display, sort_endpoints};
use crate::service::ServicePort;

/// The node facts topology needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTopology {
    /// This node's name (matched against endpoint `nodeName` and node hints).
    pub node_name: String,
    /// This node's `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
}

/// The result of [`categorize_endpoints`]. Every list is sorted by the endpoint's
/// Display string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CategorizedEndpoints {
    /// Endpoints for Cluster-policy traffic (empty if the port never uses Cluster policy).
    pub cluster: Vec<Endpoint>,
    /// Endpoints for Local-policy traffic (empty if the port never uses Local policy).
    pub local: Vec<Endpoint>,
    /// Union of `cluster` and `local`.
    pub all_reachable: Vec<Endpoint>,
    /// Whether any usable (ready, or serving and terminating) endpoint exists anywhere
    /// in the cluster; decides REJECT (none) versus DROP (none local).
    pub has_any_endpoints: bool,
}

/// Which topology filter applies to cluster endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyMode {
    /// All ready endpoints.
    None,
    /// Only endpoints hinted for this node.
    SameNode,
    /// Only endpoints hinted for this node's zone.
    SameZone,
}

fn hinted(hints: Option<&std::collections::BTreeSet<String>>, value: &str) -> bool {
    hints.is_some_and(|h| h.contains(value))
}

fn has_hints(hints: Option<&std::collections::BTreeSet<String>>) -> bool {
    hints.is_some_and(|h| !h.is_empty())
}

/// `topologyModeFromHints`: PreferSameNode if every ready endpoint has node hints and
/// one names this node; else PreferSameZone if every ready endpoint has zone hints and
/// one names this node's zone; else no filtering.
fn topology_mode(endpoints: &[Endpoint], node: &NodeTopology) -> TopologyMode {
    let ready = || endpoints.iter().filter(|ep| ep.ready);
    if ready().next().is_none() {
        return TopologyMode::None;
    }
    if ready().all(|ep| has_hints(ep.node_hints()))
        && ready().any(|ep| hinted(ep.node_hints(), &node.node_name))
    {
        return TopologyMode::SameNode;
    }
    if let Some(zone) = node.zone.as_deref()
        && ready().all(|ep| has_hints(ep.zone_hints()))
        && ready().any(|ep| hinted(ep.zone_hints(), zone))
    {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

fn available_for_topology(ep: &Endpoint, mode: TopologyMode, node: &NodeTopology) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => hinted(ep.node_hints(), &node.node_name),
        TopologyMode::SameZone => node
            .zone
            .as_deref()
            .is_some_and(|zone| hinted(ep.zone_hints(), zone)),
    }
}

fn filtered(endpoints: &[Endpoint], keep: impl Fn(&Endpoint) -> bool) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = endpoints.iter().filter(|ep| keep(ep)).cloned().collect();
    sort_endpoints(&mut out);
    out
}

/// kube-proxy's CategorizeEndpoints (§2.7).
///
/// * Cluster endpoints (only if [`ServicePort::uses_cluster_endpoints`]): ready endpoints,
///   narrowed by node hints (PreferSameNode: all ready endpoints carry node hints and one
///   names this node) or else zone hints (all ready endpoints carry zone hints and one
///   names this node's zone); if there are no ready endpoints at all, the serving and
///   terminating ones.
/// * Local endpoints (only if [`ServicePort::uses_local_endpoints`]): local ready
///   endpoints, or if none, local serving and terminating ones. Hints are ignored.
/// * `has_any_endpoints`: a usable endpoint exists anywhere (non-serving terminating
///   endpoints do not count).
///
/// Output lists are sorted by the endpoint's Display string.
pub fn categorize_endpoints(
    endpoints: &[Endpoint],
    svc: &ServicePort,
    node: &NodeTopology,
) -> CategorizedEndpoints {
    let mut out = CategorizedEndpoints::default();
    if endpoints.is_empty() {
        return out;
    }

    if svc.uses_cluster_endpoints() {
        let mode = topology_mode(endpoints, node);
        out.cluster = filtered(endpoints, |ep| {
            ep.ready && available_for_topology(ep, mode, node)
        });
        if out.cluster.is_empty() {
            out.cluster = filtered(endpoints, Endpoint::is_serving_terminating);
        }
    }

    if svc.uses_local_endpoints() {
        out.local = filtered(endpoints, |ep| ep.is_local && ep.ready);
        if out.local.is_empty() {
            out.local = filtered(endpoints, |ep| ep.is_local && ep.is_serving_terminating());
        }
    }

    // With Cluster policy in use, a usable endpoint anywhere always lands in `cluster`
    // (topology never filters down to nothing); the explicit scan also covers
    // Local-only ports.
    out.has_any_endpoints = endpoints
        .iter()
        .any(|ep| ep.ready || ep.is_serving_terminating());

    let mut all = out.cluster.clone();
    all.extend(out.local.iter().cloned());
    sort_endpoints(&mut all);
    all.dedup_by(|a, b| cmp_by_display(a, b).is_eq());
    out.all_reachable = all;
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;

    use super::*;
    use crate::endpoints::Hints;
    use crate::names::{Protocol, ServicePortName};

    const NODE: &str = "node1";

    fn node() -> NodeTopology {
        NodeTopology {
            node_name: NODE.into(),
            zone: Some("zone-a".into()),
        }
    }

    fn ep(s: &str) -> Endpoint {
        let addr: SocketAddr = s.parse().unwrap();
        Endpoint::new(addr.ip(), addr.port())
    }

    fn local(s: &str) -> Endpoint {
        Endpoint {
            is_local: true,
            node_name: Some(NODE.into()),
            ..ep(s)
        }
    }

    /// Terminating; `serving` as given; never ready.
    fn term(mut e: Endpoint, serving: bool) -> Endpoint {
        e.ready = false;
        e.serving = serving;
        e.terminating = true;
        e
    }

    fn not_ready(mut e: Endpoint) -> Endpoint {
        e.ready = false;
        e.serving = false;
        e
    }

    fn zones(mut e: Endpoint, zones: &[&str]) -> Endpoint {
        let nodes = e.node_hints().cloned();
        e.hints = Hints::of(
            Some(zones.iter().map(|z| z.to_string()).collect::<BTreeSet<_>>()),
            nodes,
        );
        e
    }

    fn nodes(mut e: Endpoint, nodes: &[&str]) -> Endpoint {
        let zones = e.zone_hints().cloned();
        e.hints = Hints::of(
            zones,
            Some(nodes.iter().map(|z| z.to_string()).collect::<BTreeSet<_>>()),
        );
        e
    }

    fn svc(itp_local: bool, etp_local: bool, node_port: bool) -> ServicePort {
        ServicePort {
            name: ServicePortName::new("ns", "svc", "p80", Protocol::Tcp),
            cluster_ip: "172.30.0.1".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            node_port: node_port.then_some(30080),
            external_ips: vec![],
            load_balancer_vips: vec![],
            load_balancer_source_ranges: vec![],
            source_ranges_restrict: false,
            session_affinity_timeout: None,
            external_policy_local: etp_local,
            internal_policy_local: itp_local,
            health_check_node_port: None,
            traffic_distribution: None,
            counting: crate::Counting::None,
        }
    }

    fn strs(eps: &[Endpoint]) -> Vec<String> {
        eps.iter().map(ToString::to_string).collect()
    }

    fn cat(eps: &[Endpoint], svc: &ServicePort) -> CategorizedEndpoints {
        categorize_endpoints(eps, svc, &node())
    }

    #[test]
    fn no_endpoints() {
        let c = cat(&[], &svc(false, false, false));
        assert_eq!(c, CategorizedEndpoints::default());
        assert!(!c.has_any_endpoints);
    }

    #[test]
    fn cluster_policy_uses_ready_endpoints_sorted() {
        let eps = [
            ep("10.244.0.8:9898"),
            not_ready(ep("10.244.0.9:9898")),
            local("10.244.0.10:9898"),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.244.0.10:9898", "10.244.0.8:9898"]);
        assert!(c.local.is_empty());
        assert_eq!(c.all_reachable, c.cluster);
        assert!(c.has_any_endpoints);
    }

    #[test]
    fn cluster_falls_back_to_serving_terminating() {
        let eps = [
            term(ep("10.0.0.1:80"), true),
            term(ep("10.0.0.2:80"), false),
            not_ready(ep("10.0.0.3:80")),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80"]);
        assert!(c.has_any_endpoints);
    }

    #[test]
    fn terminating_ignored_while_any_ready_exists() {
        let eps = [term(ep("10.0.0.1:80"), true), ep("10.0.0.2:80")];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.2:80"]);
    }

    #[test]
    fn only_non_serving_endpoints_means_no_endpoints() {
        let eps = [
            term(ep("10.0.0.1:80"), false),
            not_ready(local("10.0.0.2:80")),
        ];
        for s in [
            svc(false, false, false),
            svc(true, false, false),
            svc(false, true, true),
        ] {
            let c = cat(&eps, &s);
            assert!(c.cluster.is_empty() && c.local.is_empty() && c.all_reachable.is_empty());
            assert!(!c.has_any_endpoints, "{s:?}");
        }
    }

    #[test]
    fn internal_local_uses_local_ready_only() {
        let eps = [
            ep("10.0.0.1:80"),
            local("10.0.0.2:80"),
            local("10.0.0.3:80"),
        ];
        let c = cat(&eps, &svc(true, false, false));
        assert!(c.cluster.is_empty());
        assert_eq!(strs(&c.local), ["10.0.0.2:80", "10.0.0.3:80"]);
        assert_eq!(c.all_reachable, c.local);
        assert!(c.has_any_endpoints);
    }

    #[test]
    fn internal_local_without_local_endpoints_still_has_any() {
        let eps = [ep("10.0.0.1:80")];
        let c = cat(&eps, &svc(true, false, false));
        assert!(c.cluster.is_empty() && c.local.is_empty() && c.all_reachable.is_empty());
        assert!(c.has_any_endpoints);
    }

    #[test]
    fn local_falls_back_to_local_serving_terminating() {
        let eps = [
            ep("10.0.0.1:80"),
            term(local("10.0.0.2:80"), true),
            term(local("10.0.0.3:80"), false),
        ];
        let c = cat(&eps, &svc(false, true, true));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80"]);
        assert_eq!(strs(&c.local), ["10.0.0.2:80"]);
        assert_eq!(strs(&c.all_reachable), ["10.0.0.1:80", "10.0.0.2:80"]);
    }

    #[test]
    fn local_prefers_ready_over_terminating() {
        let eps = [local("10.0.0.1:80"), term(local("10.0.0.2:80"), true)];
        let c = cat(&eps, &svc(false, true, true));
        assert_eq!(strs(&c.local), ["10.0.0.1:80"]);
    }

    #[test]
    fn external_local_with_both_lists_union() {
        let eps = [ep("10.0.0.9:80"), local("10.0.0.10:80")];
        let c = cat(&eps, &svc(false, true, true));
        assert_eq!(strs(&c.cluster), ["10.0.0.10:80", "10.0.0.9:80"]);
        assert_eq!(strs(&c.local), ["10.0.0.10:80"]);
        assert_eq!(strs(&c.all_reachable), ["10.0.0.10:80", "10.0.0.9:80"]);
    }

    #[test]
    fn external_local_without_external_access_is_ignored() {
        let eps = [ep("10.0.0.1:80"), local("10.0.0.2:80")];
        let c = cat(&eps, &svc(false, true, false));
        assert!(c.local.is_empty());
        assert_eq!(c.cluster.len(), 2);
    }

    #[test]
    fn zone_hints_applied_when_all_have_hints_and_one_matches() {
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(ep("10.0.0.2:80"), &["zone-b"]),
            zones(ep("10.0.0.3:80"), &["zone-a", "zone-c"]),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80", "10.0.0.3:80"]);
        assert_eq!(c.all_reachable, c.cluster);
    }

    #[test]
    fn zone_hints_ignored_when_one_ready_endpoint_lacks_hints() {
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(ep("10.0.0.2:80"), &["zone-b"]),
            ep("10.0.0.3:80"),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(c.cluster.len(), 3);

        // Empty hint set counts as no hints.
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(ep("10.0.0.2:80"), &[]),
        ];
        assert_eq!(cat(&eps, &svc(false, false, false)).cluster.len(), 2);
    }

    #[test]
    fn zone_hints_of_non_ready_endpoints_do_not_matter() {
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(ep("10.0.0.2:80"), &["zone-b"]),
            not_ready(ep("10.0.0.3:80")),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80"]);
    }

    #[test]
    fn zone_hints_ignored_when_none_matches_or_node_has_no_zone() {
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-b"]),
            zones(ep("10.0.0.2:80"), &["zone-c"]),
        ];
        assert_eq!(cat(&eps, &svc(false, false, false)).cluster.len(), 2);

        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(ep("10.0.0.2:80"), &["zone-c"]),
        ];
        let no_zone = NodeTopology {
            node_name: NODE.into(),
            zone: None,
        };
        let c = categorize_endpoints(&eps, &svc(false, false, false), &no_zone);
        assert_eq!(c.cluster.len(), 2);
    }

    #[test]
    fn hints_ignored_for_local_endpoints() {
        let eps = [
            zones(ep("10.0.0.1:80"), &["zone-a"]),
            zones(local("10.0.0.2:80"), &["zone-b"]),
        ];
        let c = cat(&eps, &svc(false, true, true));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80"]);
        assert_eq!(strs(&c.local), ["10.0.0.2:80"]);
        // Union includes the topologically-unavailable local endpoint.
        assert_eq!(strs(&c.all_reachable), ["10.0.0.1:80", "10.0.0.2:80"]);
    }

    #[test]
    fn node_hints_prefer_same_node() {
        let eps = [
            zones(nodes(ep("10.0.0.1:80"), &["node2"]), &["zone-a"]),
            zones(nodes(local("10.0.0.2:80"), &[NODE]), &["zone-a"]),
            zones(nodes(ep("10.0.0.3:80"), &["node3"]), &["zone-b"]),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.2:80"]);
    }

    #[test]
    fn node_hints_fall_back_to_zone_when_none_names_this_node() {
        let eps = [
            zones(nodes(ep("10.0.0.1:80"), &["node2"]), &["zone-a"]),
            zones(nodes(ep("10.0.0.3:80"), &["node3"]), &["zone-b"]),
        ];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80"]);
    }

    #[test]
    fn node_hints_ignored_when_one_lacks_them() {
        let eps = [nodes(ep("10.0.0.1:80"), &[NODE]), ep("10.0.0.2:80")];
        let c = cat(&eps, &svc(false, false, false));
        assert_eq!(c.cluster.len(), 2);
    }

    #[test]
    fn topology_then_terminating_fallback_when_nothing_ready() {
        let eps = [
            zones(term(ep("10.0.0.1:80"), true), &["zone-b"]),
            zones(term(ep("10.0.0.2:80"), true), &["zone-a"]),
        ];
        let c = cat(&eps, &svc(false, false, false));
        // No ready endpoints: hints play no role; all serving-terminating are used.
        assert_eq!(strs(&c.cluster), ["10.0.0.1:80", "10.0.0.2:80"]);
    }

    #[test]
    fn unsorted_input_gives_sorted_output() {
        let eps = [
            local("10.0.0.9:80"),
            local("10.0.0.10:80"),
            ep("10.0.0.100:80"),
        ];
        let c = cat(&eps, &svc(false, true, true));
        assert_eq!(
            strs(&c.cluster),
            ["10.0.0.100:80", "10.0.0.10:80", "10.0.0.9:80"]
        );
        assert_eq!(strs(&c.local), ["10.0.0.10:80", "10.0.0.9:80"]);
        assert_eq!(strs(&c.all_reachable), strs(&c.cluster));
    }
}
