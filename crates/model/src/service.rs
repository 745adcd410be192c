//! Processed, per-family service ports (kube-proxy's `serviceport.go` and
//! `ShouldSkipService`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::api::{LoadBalancerIpMode, Service, ServiceType, SessionAffinity, TrafficPolicy};
use crate::error::ModelError;
use crate::ip::{IpFamily, parse_cidr_legacy, parse_ip_legacy};
use crate::names::{Name, NamespacedName, Protocol, ServicePortName};
use crate::selection::Counting;

/// Label whose presence (any value) hands a Service to another proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label whose presence marks a headless Service.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// ClientIP affinity timeout when the Service does not set one (3 hours).
pub const DEFAULT_SESSION_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

/// All service ports currently known, keyed by name.
/// A port is shared, never changed in place: a change replaces it, so a
/// reader may keep the one it has.
pub type ServicePortMap = BTreeMap<ServicePortName, Arc<ServicePort>>;

/// One port of one Service, for one IP family, with every value parsed and filtered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// The port's name.
    pub name: ServicePortName,
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// The service port.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// The NodePort, `None` when 0/absent.
    pub node_port: Option<u16>,
    /// External IPs of this family: parsed, de-duplicated, order kept.
    pub external_ips: Vec<IpAddr>,
    /// LB ingress IPs of this family whose ipMode is unset or VIP (Proxy is skipped).
    pub load_balancer_vips: Vec<IpAddr>,
    /// Source ranges of this family: trimmed, parsed, host bits cleared, de-duplicated.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// Whether `loadBalancerSourceRanges` restrict this family: some entry
    /// is of this family, or cannot be parsed. An entry that cannot be
    /// parsed fails closed: the VIPs are firewalled to the valid ranges of
    /// this family, to none if there are none, and are never left open.
    pub source_ranges_restrict: bool,
    /// `Some(seconds)` iff the Service has ClientIP session affinity.
    pub session_affinity_timeout: Option<u32>,
    /// `externalTrafficPolicy: Local` (only meaningful if externally accessible; see
    /// [`ServicePort::external_policy_local`]).
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// The health-check node port (only for `LoadBalancer` + eTP=Local Services).
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<String>,
    /// How finely the kernel counts this port's traffic
    /// ([`MetricsSelection`](crate::MetricsSelection)): `None` unless the
    /// node's selection chooses its Service.
    pub counting: Counting,
}

impl ServicePort {
    /// Reachable other than via the ClusterIP (NodePort, externalIPs or LB VIPs).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_vips.is_empty()
    }

    /// Whether any traffic is ever sent with the Cluster policy. Even with eTP=Local,
    /// externally accessible services need the cluster endpoints for short-circuiting
    /// pod and node traffic.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether any traffic is ever sent with the Local policy.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || self.external_policy_local()
    }

    /// eTP=Local and externally accessible.
    pub fn external_policy_local(&self) -> bool {
        self.external_policy_local && self.externally_accessible()
    }
}

/// Whether the Service has no cluster IP (`spec.clusterIP` empty or `"None"`).
pub fn is_headless(svc: &Service) -> bool {
    svc.cluster_ips
        .first()
        .is_none_or(|ip| ip.is_empty() || ip == "None")
}

/// Why a service is not proxied at all (headless, ExternalName, label
/// service.kubernetes.io/service-proxy-name present), as kube-proxy 1.36
/// selects Services. The label service.kubernetes.io/headless is the
/// EndpointSlice controller's, on slices: kube-proxy leaves out the slices
/// that carry it, not a Service with a ClusterIP that does.
pub fn should_skip_service(svc: &Service) -> bool {
    svc.service_type == ServiceType::ExternalName
        || is_headless(svc)
        || svc.labels.contains_key(LABEL_SERVICE_PROXY_NAME)
}

/// The `spec.clusterIPs` entry that looks like it belongs to `family` (contains a
/// colon iff IPv6), like `GetClusterIPByFamily`.
fn cluster_ip_text(svc: &Service, family: IpFamily) -> Option<&str> {
    svc.cluster_ips
        .iter()
        .map(String::as_str)
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .find(|ip| ip.contains(':') == (family == IpFamily::V6))
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Validates an optional secondary port (`nodePort`, `healthCheckNodePort`):
/// absent/0 is `None`.
fn optional_port(
    service: &NamespacedName,
    field: &'static str,
    port_name: &str,
    value: Option<i32>,
) -> Result<Option<u16>, ModelError> {
    match value {
        None | Some(0) => Ok(None),
        Some(v) => required_port(service, field, port_name, v).map(Some),
    }
}

fn required_port(
    service: &NamespacedName,
    field: &'static str,
    port_name: &str,
    value: i32,
) -> Result<u16, ModelError> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ModelError::InvalidPort {
            service: service.clone(),
            field,
            port_name: port_name.to_owned(),
            value,
        })
}

/// All service ports of `svc` for one family. Skipped services give an empty Vec.
/// Invalid values (bad cluster IP of that family, port out of range, non-positive
/// affinity timeout) give an Err naming the service and field — never a panic; a
/// service whose ClusterIP has no address of this family gives Ok(empty).
///
/// Unparseable entries of list fields (externalIPs, LB ingress IPs, source ranges)
/// are skipped, as kube-proxy does, rather than failing the whole Service.
pub fn service_ports(svc: &Service, family: IpFamily) -> Result<Vec<ServicePort>, ModelError> {
    if should_skip_service(svc) {
        return Ok(Vec::new());
    }
    let Some(cluster_ip_text) = cluster_ip_text(svc, family) else {
        return Ok(Vec::new());
    };
    let service = svc.namespaced_name();
    let cluster_ip = parse_ip_legacy(cluster_ip_text)
        .filter(|ip| family.matches(*ip))
        .ok_or_else(|| ModelError::InvalidClusterIp {
            service: service.clone(),
            value: cluster_ip_text.to_owned(),
        })?;

    let mut external_ips = Vec::new();
    for ip in svc.external_ips.iter().filter_map(|s| parse_ip_legacy(s)) {
        if family.matches(ip) {
            push_unique(&mut external_ips, ip);
        }
    }

    let mut load_balancer_vips = Vec::new();
    for ingress in &svc.load_balancer_ingress {
        if ingress.ip_mode == Some(LoadBalancerIpMode::Proxy) {
            continue;
        }
        if let Some(ip) = ingress.ip.as_deref().and_then(parse_ip_legacy)
            && family.matches(ip)
        {
            push_unique(&mut load_balancer_vips, ip);
        }
    }

    let mut load_balancer_source_ranges = Vec::new();
    let mut source_ranges_restrict = false;
    for range in &svc.load_balancer_source_ranges {
        match parse_cidr_legacy(range) {
            Some(net) if IpFamily::of_net(&net) == family => {
                push_unique(&mut load_balancer_source_ranges, net);
                source_ranges_restrict = true;
            }
            Some(_) => {}
            None => source_ranges_restrict = true,
        }
    }

    let session_affinity_timeout = match svc.session_affinity {
        SessionAffinity::None => None,
        SessionAffinity::ClientIP => match svc.session_affinity_timeout_seconds {
            None => Some(DEFAULT_SESSION_AFFINITY_TIMEOUT_SECONDS),
            Some(t) => Some(u32::try_from(t).ok().filter(|t| *t > 0).ok_or(
                ModelError::InvalidSessionAffinityTimeout {
                    service: service.clone(),
                    value: t,
                },
            )?),
        },
    };

    let external_policy_local = svc.external_traffic_policy == TrafficPolicy::Local;
    let internal_policy_local = svc.internal_traffic_policy == TrafficPolicy::Local;
    // kube-proxy only serves health checks for services that need them
    // (`apiservice.NeedsHealthCheck`): LoadBalancer with eTP=Local.
    let health_check_node_port =
        if svc.service_type == ServiceType::LoadBalancer && external_policy_local {
            optional_port(
                &service,
                "spec.healthCheckNodePort",
                "",
                svc.health_check_node_port,
            )?
        } else {
            None
        };

    svc.ports
        .iter()
        .map(|spec| {
            Ok(ServicePort {
                name: ServicePortName {
                    service: service.clone(),
                    port: Name::from(&spec.name),
                    protocol: spec.protocol,
                },
                cluster_ip,
                port: required_port(&service, "spec.ports[].port", &spec.name, spec.port)?,
                protocol: spec.protocol,
                node_port: optional_port(
                    &service,
                    "spec.ports[].nodePort",
                    &spec.name,
                    spec.node_port,
                )?,
                external_ips: external_ips.clone(),
                load_balancer_vips: load_balancer_vips.clone(),
                load_balancer_source_ranges: load_balancer_source_ranges.clone(),
                source_ranges_restrict,
                session_affinity_timeout,
                external_policy_local,
                internal_policy_local,
                health_check_node_port,
                traffic_distribution: svc.traffic_distribution.clone(),
                counting: Counting::None,
            })
        })
        .collect()
}

/// [`service_ports`] as a map keyed by port name (a later duplicate name wins).
pub fn service_port_map(svc: &Service, family: IpFamily) -> Result<ServicePortMap, ModelError> {
    Ok(service_ports(svc, family)?
        .into_iter()
        .map(|sp| (sp.name.clone(), Arc::new(sp)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LoadBalancerIngress, ServicePortSpec};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn port(name: &str, port: i32) -> ServicePortSpec {
        ServicePortSpec {
            name: name.into(),
            protocol: Protocol::Tcp,
            port,
            node_port: None,
        }
    }

    fn svc(cluster_ips: &[&str]) -> Service {
        Service {
            namespace: "ns1".into(),
            name: "svc1".into(),
            cluster_ips: cluster_ips.iter().map(|s| s.to_string()).collect(),
            ports: vec![port("p80", 80)],
            ..Default::default()
        }
    }

    fn only(svc: &Service, family: IpFamily) -> ServicePort {
        let mut ports = service_ports(svc, family).unwrap();
        assert_eq!(ports.len(), 1, "{ports:?}");
        ports.remove(0)
    }

    #[test]
    fn basic_cluster_ip_port() {
        let sp = only(&svc(&["172.30.0.41"]), IpFamily::V4);
        assert_eq!(
            sp.name,
            ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp)
        );
        assert_eq!(sp.cluster_ip, ip("172.30.0.41"));
        assert_eq!(sp.port, 80);
        assert_eq!(sp.protocol, Protocol::Tcp);
        assert_eq!(sp.node_port, None);
        assert_eq!(sp.session_affinity_timeout, None);
        assert!(!sp.externally_accessible());
        assert!(sp.uses_cluster_endpoints());
        assert!(!sp.uses_local_endpoints());
    }

    #[test]
    fn bad_ips_are_normalised_like_test_bad_ips() {
        let mut s = svc(&["172.30.0.041"]);
        s.service_type = ServiceType::LoadBalancer;
        s.load_balancer_ingress = vec![LoadBalancerIngress {
            ip: Some("1.2.3.004".into()),
            ip_mode: None,
        }];
        s.external_ips = vec!["192.168.099.022".into()];
        s.load_balancer_source_ranges = vec!["203.0.113.000/025".into()];
        let sp = only(&s, IpFamily::V4);
        assert_eq!(sp.cluster_ip, ip("172.30.0.41"));
        assert_eq!(sp.load_balancer_vips, vec![ip("1.2.3.4")]);
        assert_eq!(sp.external_ips, vec![ip("192.168.99.22")]);
        assert_eq!(sp.load_balancer_source_ranges, vec![net("203.0.113.0/25")]);
    }

    #[test]
    fn source_ranges_trimmed_filtered_normalised_deduplicated() {
        let mut s = svc(&["10.0.0.1"]);
        s.load_balancer_source_ranges = vec![
            " 203.0.113.0/25".into(),
            "192.168.0.7/24 ".into(),
            "fd00::/64".into(),
            "garbage".into(),
            "192.168.0.0/24".into(),
        ];
        let sp = only(&s, IpFamily::V4);
        assert_eq!(
            sp.load_balancer_source_ranges,
            vec![net("203.0.113.0/25"), net("192.168.0.0/24")]
        );
        assert!(sp.source_ranges_restrict);
    }

    #[test]
    fn source_ranges_that_cannot_be_parsed_fail_closed() {
        // Only an invalid range: restricted to nothing, in both families.
        let mut s = svc(&["10.0.0.1"]);
        s.load_balancer_source_ranges = vec!["10.0.0.0/33".into()];
        let sp = only(&s, IpFamily::V4);
        assert!(sp.load_balancer_source_ranges.is_empty());
        assert!(sp.source_ranges_restrict, "never open");
        // Ranges of the other family only leave this family open, as
        // kube-proxy does.
        s.load_balancer_source_ranges = vec!["fd00::/64".into()];
        assert!(!only(&s, IpFamily::V4).source_ranges_restrict);
        s.load_balancer_source_ranges = vec![];
        assert!(!only(&s, IpFamily::V4).source_ranges_restrict);
    }

    #[test]
    fn lb_ip_mode_proxy_is_skipped() {
        let mut s = svc(&["10.0.0.1"]);
        s.service_type = ServiceType::LoadBalancer;
        s.load_balancer_ingress = vec![
            LoadBalancerIngress {
                ip: Some("1.2.3.4".into()),
                ip_mode: Some(LoadBalancerIpMode::Proxy),
            },
            LoadBalancerIngress {
                ip: Some("1.2.3.5".into()),
                ip_mode: Some(LoadBalancerIpMode::Vip),
            },
            LoadBalancerIngress {
                ip: Some("1.2.3.6".into()),
                ip_mode: None,
            },
            LoadBalancerIngress {
                ip: None,
                ip_mode: None,
            },
            LoadBalancerIngress {
                ip: Some("1.2.3.6".into()),
                ip_mode: None,
            },
        ];
        let sp = only(&s, IpFamily::V4);
        assert_eq!(sp.load_balancer_vips, vec![ip("1.2.3.5"), ip("1.2.3.6")]);
        assert!(sp.externally_accessible());
    }

    #[test]
    fn dual_stack_gives_one_port_list_per_family() {
        let mut s = svc(&["10.0.0.1", "fd00::1"]);
        s.external_ips = vec![
            "fd00::e".into(),
            "1.1.1.1".into(),
            "bogus".into(),
            "1.1.1.1".into(),
        ];
        s.load_balancer_ingress = vec![
            LoadBalancerIngress {
                ip: Some("fd00::b".into()),
                ip_mode: None,
            },
            LoadBalancerIngress {
                ip: Some("2.2.2.2".into()),
                ip_mode: None,
            },
        ];
        s.load_balancer_source_ranges = vec!["fd00:1::/48".into(), "3.0.0.0/8".into()];
        let v4 = only(&s, IpFamily::V4);
        let v6 = only(&s, IpFamily::V6);
        assert_eq!(v4.cluster_ip, ip("10.0.0.1"));
        assert_eq!(v4.external_ips, vec![ip("1.1.1.1")]);
        assert_eq!(v4.load_balancer_vips, vec![ip("2.2.2.2")]);
        assert_eq!(v4.load_balancer_source_ranges, vec![net("3.0.0.0/8")]);
        assert_eq!(v6.cluster_ip, ip("fd00::1"));
        assert_eq!(v6.external_ips, vec![ip("fd00::e")]);
        assert_eq!(v6.load_balancer_vips, vec![ip("fd00::b")]);
        assert_eq!(v6.load_balancer_source_ranges, vec![net("fd00:1::/48")]);

        // Primary IPv6 listed first works too.
        let s6 = svc(&["fd00::1", "10.0.0.1"]);
        assert_eq!(only(&s6, IpFamily::V4).cluster_ip, ip("10.0.0.1"));
        assert_eq!(only(&s6, IpFamily::V6).cluster_ip, ip("fd00::1"));
    }

    #[test]
    fn single_stack_gives_nothing_for_other_family() {
        assert_eq!(service_ports(&svc(&["10.0.0.1"]), IpFamily::V6), Ok(vec![]));
        assert_eq!(service_ports(&svc(&["fd00::1"]), IpFamily::V4), Ok(vec![]));
    }

    #[test]
    fn skips() {
        for ips in [&[][..], &[""][..], &["None"][..]] {
            let s = svc(ips);
            assert!(is_headless(&s));
            assert!(should_skip_service(&s));
            assert_eq!(service_ports(&s, IpFamily::V4), Ok(vec![]));
        }

        let mut s = svc(&["10.0.0.1"]);
        assert!(!should_skip_service(&s));
        s.service_type = ServiceType::ExternalName;
        assert!(should_skip_service(&s));
        assert_eq!(service_ports(&s, IpFamily::V4), Ok(vec![]));

        let mut s = svc(&["10.0.0.1"]);
        s.labels
            .insert(LABEL_SERVICE_PROXY_NAME.into(), String::new());
        assert!(should_skip_service(&s));
        assert_eq!(service_ports(&s, IpFamily::V4), Ok(vec![]));
        // The slices' label on a Service with a ClusterIP: proxied, as by
        // kube-proxy 1.36 (which selects Services by spec.clusterIP).
        let mut s = svc(&["10.0.0.1"]);
        s.labels.insert(LABEL_HEADLESS.into(), String::new());
        assert!(!should_skip_service(&s));

        let mut s = svc(&["10.0.0.1"]);
        s.labels.insert("app".into(), "x".into());
        assert!(!should_skip_service(&s));
    }

    #[test]
    fn invalid_cluster_ip_is_an_error_naming_service_and_field() {
        let err = service_ports(&svc(&["10.0.0.300"]), IpFamily::V4).unwrap_err();
        assert_eq!(
            err,
            ModelError::InvalidClusterIp {
                service: NamespacedName::new("ns1", "svc1"),
                value: "10.0.0.300".into()
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("ns1/svc1") && msg.contains("spec.clusterIPs"),
            "{msg}"
        );
        // The bad IPv4 text does not affect the IPv6 proxier.
        assert_eq!(
            service_ports(&svc(&["10.0.0.300", "fd00::1"]), IpFamily::V6)
                .unwrap()
                .len(),
            1
        );
        assert!(service_ports(&svc(&["fd00:::1"]), IpFamily::V6).is_err());
    }

    #[test]
    fn port_range_errors() {
        for bad in [0, -1, 65536] {
            let mut s = svc(&["10.0.0.1"]);
            s.ports = vec![port("p", bad)];
            let err = service_ports(&s, IpFamily::V4).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("ns1/svc1") && msg.contains("spec.ports[].port"),
                "{msg}"
            );
        }
        let mut s = svc(&["10.0.0.1"]);
        s.ports[0].node_port = Some(70000);
        let msg = service_ports(&s, IpFamily::V4).unwrap_err().to_string();
        assert!(msg.contains("nodePort"), "{msg}");
    }

    #[test]
    fn node_port_zero_is_none() {
        let mut s = svc(&["10.0.0.1"]);
        s.service_type = ServiceType::NodePort;
        s.ports[0].node_port = Some(0);
        assert_eq!(only(&s, IpFamily::V4).node_port, None);
        s.ports[0].node_port = Some(30080);
        let sp = only(&s, IpFamily::V4);
        assert_eq!(sp.node_port, Some(30080));
        assert!(sp.externally_accessible());
    }

    #[test]
    fn session_affinity_timeout() {
        let mut s = svc(&["10.0.0.1"]);
        s.session_affinity_timeout_seconds = Some(100);
        assert_eq!(only(&s, IpFamily::V4).session_affinity_timeout, None);
        s.session_affinity = SessionAffinity::ClientIP;
        assert_eq!(only(&s, IpFamily::V4).session_affinity_timeout, Some(100));
        s.session_affinity_timeout_seconds = None;
        assert_eq!(only(&s, IpFamily::V4).session_affinity_timeout, Some(10800));
        s.session_affinity_timeout_seconds = Some(0);
        let msg = service_ports(&s, IpFamily::V4).unwrap_err().to_string();
        assert!(
            msg.contains("timeoutSeconds") && msg.contains("ns1/svc1"),
            "{msg}"
        );
    }

    #[test]
    fn health_check_node_port_only_for_lb_local() {
        let mut s = svc(&["10.0.0.1"]);
        s.health_check_node_port = Some(30000);
        s.external_traffic_policy = TrafficPolicy::Local;
        s.service_type = ServiceType::NodePort;
        assert_eq!(only(&s, IpFamily::V4).health_check_node_port, None);
        s.service_type = ServiceType::LoadBalancer;
        assert_eq!(only(&s, IpFamily::V4).health_check_node_port, Some(30000));
        s.external_traffic_policy = TrafficPolicy::Cluster;
        assert_eq!(only(&s, IpFamily::V4).health_check_node_port, None);
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = Some(-5);
        assert!(service_ports(&s, IpFamily::V4).is_err());
    }

    #[test]
    fn traffic_policy_helpers() {
        let base = only(&svc(&["10.0.0.1"]), IpFamily::V4);

        // iTP=Local, not externally accessible: local only.
        let mut p = base.clone();
        p.internal_policy_local = true;
        assert!(!p.uses_cluster_endpoints());
        assert!(p.uses_local_endpoints());

        // eTP=Local without external access is meaningless.
        let mut p = base.clone();
        p.external_policy_local = true;
        assert!(!p.external_policy_local());
        assert!(p.uses_cluster_endpoints());
        assert!(!p.uses_local_endpoints());

        // eTP=Local with a NodePort uses both.
        p.node_port = Some(30001);
        assert!(p.external_policy_local());
        assert!(p.uses_cluster_endpoints());
        assert!(p.uses_local_endpoints());

        // iTP=Local but externally accessible still needs cluster endpoints.
        let mut p = base.clone();
        p.internal_policy_local = true;
        p.external_ips = vec![ip("1.1.1.1")];
        assert!(p.uses_cluster_endpoints());
        assert!(p.uses_local_endpoints());

        let mut p = base;
        p.load_balancer_vips = vec![ip("1.1.1.2")];
        assert!(p.externally_accessible());
    }

    #[test]
    fn policies_and_distribution_copied() {
        let mut s = svc(&["10.0.0.1"]);
        s.internal_traffic_policy = TrafficPolicy::Local;
        s.external_traffic_policy = TrafficPolicy::Local;
        s.traffic_distribution = Some("PreferSameNode".into());
        let sp = only(&s, IpFamily::V4);
        assert!(sp.internal_policy_local);
        assert!(sp.external_policy_local);
        assert_eq!(sp.traffic_distribution.as_deref(), Some("PreferSameNode"));
    }

    #[test]
    fn multiple_ports_and_map() {
        let mut s = svc(&["10.0.0.1"]);
        s.ports = vec![
            port("http", 80),
            ServicePortSpec {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53,
                node_port: None,
            },
        ];
        let ports = service_ports(&s, IpFamily::V4).unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[1].protocol, Protocol::Udp);
        assert_eq!(ports[1].name.protocol, Protocol::Udp);
        let map = service_port_map(&s, IpFamily::V4).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(
            map[&ServicePortName::new("ns1", "svc1", "dns", Protocol::Udp)].port,
            53
        );
    }
}
