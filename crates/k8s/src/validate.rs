//! The API server's validation of the objects verdict reads, for the
//! manifests source, which has no API server in front of it.
//!
//! Each function returns every problem of one object, named by field path
//! in the API server's words (`spec.ports[0].protocol: Unsupported value:
//! "ICMP": supported values: "SCTP", "TCP", "UDP"`). An object with any
//! problem is refused as a whole, as the API server would refuse it.
//!
//! The rules are those of Kubernetes' `ValidateService`,
//! `ValidateEndpointSlice`, `ValidateNode` and `ValidateServiceCIDR` that
//! concern the fields a Service proxy reads, plus the address checks the
//! API server's IP allocators make implicitly: a Service IP is never
//! unspecified, loopback, link-local or multicast, so a manifest cannot
//! hijack the node's own `127.0.0.1:80`.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use verdict_model::{parse_cidr_legacy, parse_ip_legacy};

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `spec.ports[0].port`.
    pub field: String,
    /// What is wrong, in the API server's words.
    pub detail: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Joins an object's problems into one message.
pub fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const POLICIES: &[&str] = &["Cluster", "Local"];
const AFFINITIES: &[&str] = &["ClientIP", "None"];
const FAMILIES: &[&str] = &["IPv4", "IPv6"];
const FAMILY_POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
const DISTRIBUTIONS: &[&str] = &["PreferClose", "PreferSameNode", "PreferSameZone"];
const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];
const IP_MODES: &[&str] = &["Proxy", "VIP"];
/// `MaxClientIPServiceAffinitySeconds`.
const MAX_AFFINITY_SECONDS: i32 = 86400;
/// Endpoints per EndpointSlice, addresses per endpoint, ports per slice.
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_SLICE_PORTS: usize = 20000;
const MAX_HINTS: usize = 8;

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl fmt::Display, detail: String) {
        self.0.push(FieldError {
            field: field.to_string(),
            detail,
        });
    }

    fn invalid(&mut self, field: impl fmt::Display, value: impl fmt::Debug, why: &str) {
        self.push(field, format!("Invalid value: {value:?}: {why}"));
    }

    fn required(&mut self, field: impl fmt::Display) {
        self.push(field, "Required value".into());
    }

    fn forbidden(&mut self, field: impl fmt::Display, why: &str) {
        self.push(field, format!("Forbidden: {why}"));
    }

    fn duplicate(&mut self, field: impl fmt::Display, value: impl fmt::Debug) {
        self.push(field, format!("Duplicate value: {value:?}"));
    }

    fn too_many(&mut self, field: impl fmt::Display, n: usize, max: usize) {
        self.push(
            field,
            format!("Too many: {n}: must have at most {max} items"),
        );
    }

    /// `value` must be one of `supported` (`None` means absent: allowed).
    fn one_of(&mut self, field: impl fmt::Display, value: Option<&str>, supported: &[&str]) {
        if let Some(v) = value
            && !supported.contains(&v)
        {
            let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
            self.push(
                field,
                format!(
                    "Unsupported value: {v:?}: supported values: {}",
                    list.join(", ")
                ),
            );
        }
    }

    fn port(&mut self, field: impl fmt::Display, value: i32) {
        if !(1..=65535).contains(&value) {
            self.invalid(field, value, "must be between 1 and 65535, inclusive");
        }
    }
}

// ---- names ----------------------------------------------------------------

fn is_alnum_lower(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// RFC 1123 label: lower-case alphanumerics and `-`, alphanumeric at both
/// ends, at most 63 characters.
fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.starts_with(is_alnum_lower)
        && s.ends_with(is_alnum_lower)
}

/// RFC 1035 label: an RFC 1123 label that starts with a letter.
fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`,
/// alphanumeric at both ends.
fn is_label_value(s: &str) -> bool {
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    s.is_empty()
        || (s.len() <= 63
            && s.chars().all(inner)
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// An IANA service name (a named `targetPort`): at most 15 lower-case
/// alphanumerics and `-`, at least one letter, no `-` at either end, no `--`.
fn is_iana_svc_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.chars().all(|c| is_alnum_lower(c) || c == '-')
        && s.chars().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn metadata(e: &mut Errors, meta: &ObjectMeta, namespaced: bool, name_ok: fn(&str) -> bool) {
    match meta.name.as_deref() {
        None | Some("") => e.required("metadata.name"),
        Some(n) if !name_ok(n) => e.invalid(
            "metadata.name",
            n,
            "a lowercase RFC 1123 name of at most 63 characters (a DNS-1035 label for Services)",
        ),
        Some(_) => {}
    }
    if namespaced {
        match meta.namespace.as_deref() {
            None | Some("") => e.required("metadata.namespace"),
            Some(ns) if !is_dns1123_label(ns) => e.invalid(
                "metadata.namespace",
                ns,
                "a lowercase RFC 1123 label of at most 63 characters",
            ),
            Some(_) => {}
        }
    }
    for (k, v) in meta.labels.iter().flatten() {
        if !is_qualified_name(k) {
            e.invalid("metadata.labels", k, "not a valid label key");
        }
        if !is_label_value(v) {
            e.invalid(
                format!("metadata.labels[{k}]"),
                v,
                "a label value is at most 63 alphanumerics, '-', '_' or '.'",
            );
        }
    }
}

// ---- addresses ------------------------------------------------------------

/// Why an address cannot be a Service's: it would take over traffic that
/// is not the Service's (`ValidateNonSpecialIP`, and what the allocators
/// never hand out).
fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_unspecified() {
                Some("may not be unspecified (0.0.0.0)")
            } else if v4.is_loopback() {
                Some("may not be in the loopback range (127.0.0.0/8)")
            } else if v4.is_link_local() {
                Some("may not be in the link-local range (169.254.0.0/16)")
            } else if v4.is_multicast() {
                Some("may not be a multicast address (224.0.0.0/4)")
            } else if v4.is_broadcast() {
                Some("may not be the broadcast address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                Some("may not be unspecified (::)")
            } else if v6.is_loopback() {
                Some("may not be the loopback address (::1)")
            } else if v6.is_unicast_link_local() {
                Some("may not be in the link-local range (fe80::/10)")
            } else if v6.is_multicast() {
                Some("may not be a multicast address (ff00::/8)")
            } else if v6.to_ipv4_mapped().is_some() {
                Some("may not be an IPv4-mapped IPv6 address")
            } else {
                None
            }
        }
    }
}

/// An address a Service may use (ClusterIP, external IP, LoadBalancer IP).
fn service_ip(e: &mut Errors, field: &str, value: &str) -> Option<IpAddr> {
    let Some(ip) = parse_ip_legacy(value) else {
        e.invalid(field, value, "must be a valid IP address");
        return None;
    };
    if let Some(why) = special(ip) {
        e.invalid(field, value, why);
        return None;
    }
    Some(ip)
}

/// `ValidateEndpointIP`: no unspecified, loopback or link-local addresses.
fn endpoint_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) if v4.octets()[..3] == [224, 0, 0] => {
            Some("may not be in the link-local multicast range (224.0.0.0/24)")
        }
        IpAddr::V6(v6) if v6.segments()[0] == 0xff02 => {
            Some("may not be in the link-local multicast range (ff02::/16)")
        }
        _ => special(ip).filter(|_| {
            ip.is_unspecified()
                || ip.is_loopback()
                || matches!(ip, IpAddr::V4(v4) if v4.is_link_local())
                || matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()
                    || v6.to_ipv4_mapped().is_some())
        }),
    }
}

fn family_of(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

// ---- Service --------------------------------------------------------------

/// Every problem of a Service, as the API server would report it.
pub fn service(s: &core::Service) -> Vec<FieldError> {
    let mut e = Errors::default();
    metadata(&mut e, &s.metadata, true, is_dns1035_label);
    let Some(spec) = &s.spec else {
        e.required("spec");
        return e.0;
    };
    e.one_of("spec.type", spec.type_.as_deref(), SERVICE_TYPES);
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    let external_name = kind == "ExternalName";

    // ClusterIPs and families.
    let cluster_ips: Vec<&str> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        (_, Some(ip)) if !ip.is_empty() => vec![ip.as_str()],
        _ => Vec::new(),
    };
    if let (Some(ip), Some(ips)) = (&spec.cluster_ip, &spec.cluster_ips)
        && !ip.is_empty()
        && ips.first().is_some_and(|first| first != ip)
    {
        e.invalid("spec.clusterIPs[0]", &ips[0], "must match `spec.clusterIP`");
    }
    let headless = cluster_ips.first() == Some(&"None");
    let mut families: Vec<&'static str> = Vec::new();
    if external_name {
        if !cluster_ips.is_empty() && !headless {
            e.forbidden(
                "spec.clusterIPs",
                "may not be set when `type` is 'ExternalName'",
            );
        }
        match spec.external_name.as_deref() {
            None | Some("") => e.required("spec.externalName"),
            Some(n) if !is_dns1123_subdomain(n.trim_end_matches('.')) => {
                e.invalid("spec.externalName", n, "must be a DNS-1123 subdomain")
            }
            Some(_) => {}
        }
    } else {
        if cluster_ips.len() > 2 {
            e.too_many("spec.clusterIPs", cluster_ips.len(), 2);
        }
        for (i, ip) in cluster_ips.iter().enumerate() {
            let field = format!("spec.clusterIPs[{i}]");
            if *ip == "None" {
                if i > 0 || cluster_ips.len() > 1 {
                    e.invalid(&field, ip, "'None' must be the only value");
                }
                continue;
            }
            if let Some(ip) = service_ip(&mut e, &field, ip) {
                families.push(family_of(ip));
            }
        }
        if families.len() == 2 && families[0] == families[1] {
            e.invalid(
                "spec.clusterIPs",
                &cluster_ips,
                "two ClusterIPs must be of different IP families",
            );
        }
        if headless && matches!(kind, "NodePort" | "LoadBalancer") {
            e.invalid(
                "spec.clusterIPs[0]",
                "None",
                "may not be set to 'None' for LoadBalancer or NodePort services",
            );
        }
    }
    if let Some(fams) = &spec.ip_families {
        if fams.len() > 2 {
            e.too_many("spec.ipFamilies", fams.len(), 2);
        }
        let mut seen = BTreeSet::new();
        for (i, f) in fams.iter().enumerate() {
            e.one_of(format!("spec.ipFamilies[{i}]"), Some(f), FAMILIES);
            if !seen.insert(f) {
                e.duplicate(format!("spec.ipFamilies[{i}]"), f);
            }
            if let Some(want) = families.get(i)
                && FAMILIES.contains(&f.as_str())
                && f != want
            {
                e.invalid(
                    format!("spec.ipFamilies[{i}]"),
                    f,
                    "must match the IP family of `spec.clusterIPs` at the same index",
                );
            }
        }
    }
    e.one_of(
        "spec.ipFamilyPolicy",
        spec.ip_family_policy.as_deref(),
        FAMILY_POLICIES,
    );
    if spec.ip_family_policy.as_deref() == Some("SingleStack") && families.len() > 1 {
        e.invalid(
            "spec.ipFamilyPolicy",
            "SingleStack",
            "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
        );
    }

    // Ports.
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ports.is_empty() && !external_name && !headless {
        e.required("spec.ports");
    }
    let mut names = BTreeSet::new();
    let mut port_keys = BTreeSet::new();
    let mut node_port_keys = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let f = |x: &str| format!("spec.ports[{i}].{x}");
        match p.name.as_deref() {
            None | Some("") if ports.len() > 1 => e.required(f("name")),
            None | Some("") => {}
            Some(n) => {
                if !is_dns1123_label(n) {
                    e.invalid(f("name"), n, "a lowercase RFC 1123 label");
                }
                if !names.insert(n) {
                    e.duplicate(f("name"), n);
                }
            }
        }
        e.one_of(f("protocol"), p.protocol.as_deref(), PROTOCOLS);
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        e.port(f("port"), p.port);
        if !port_keys.insert((p.port, proto)) {
            e.duplicate(format!("spec.ports[{i}]"), format!("{}/{proto}", p.port));
        }
        match &p.target_port {
            Some(IntOrString::Int(t)) => e.port(f("targetPort"), *t),
            Some(IntOrString::String(t)) if !is_iana_svc_name(t) => e.invalid(
                f("targetPort"),
                t,
                "must be a port number or an IANA service name (at most 15 characters)",
            ),
            _ => {}
        }
        if let Some(np) = p.node_port.filter(|np| *np != 0) {
            if matches!(kind, "ClusterIP" | "ExternalName") {
                e.forbidden(
                    f("nodePort"),
                    &format!("may not be used when `type` is '{kind}'"),
                );
            }
            e.port(f("nodePort"), np);
            if !node_port_keys.insert((np, proto)) {
                e.duplicate(f("nodePort"), np);
            }
        }
    }

    // External addresses.
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        service_ip(&mut e, &format!("spec.externalIPs[{i}]"), ip);
    }
    let ranges = spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default();
    if !ranges.is_empty() && kind != "LoadBalancer" {
        e.forbidden(
            "spec.loadBalancerSourceRanges",
            "may only be used when `type` is 'LoadBalancer'",
        );
    }
    for (i, r) in ranges.iter().enumerate() {
        if parse_cidr_legacy(r).is_none() {
            e.invalid(
                format!("spec.loadBalancerSourceRanges[{i}]"),
                r,
                "must be a valid CIDR (e.g. 10.0.0.0/8 or 2001:db8::/64)",
            );
        }
    }

    // Policies.
    let externally_accessible = matches!(kind, "NodePort" | "LoadBalancer")
        || (kind == "ClusterIP" && !spec.external_ips.as_deref().unwrap_or_default().is_empty());
    e.one_of(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
        POLICIES,
    );
    if let Some(p) = &spec.external_traffic_policy
        && !externally_accessible
    {
        e.invalid(
            "spec.externalTrafficPolicy",
            p,
            "may only be set for externally-accessible services",
        );
    }
    e.one_of(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
        POLICIES,
    );
    if let Some(hc) = spec.health_check_node_port.filter(|p| *p != 0) {
        if kind != "LoadBalancer" || spec.external_traffic_policy.as_deref() != Some("Local") {
            e.invalid(
                "spec.healthCheckNodePort",
                hc,
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            );
        }
        e.port("spec.healthCheckNodePort", hc);
    }
    e.one_of(
        "spec.sessionAffinity",
        spec.session_affinity.as_deref(),
        AFFINITIES,
    );
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    match spec.session_affinity.as_deref() {
        Some("ClientIP") => {
            if let Some(t) = timeout
                && !(1..=MAX_AFFINITY_SECONDS).contains(&t)
            {
                e.invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    t,
                    "must be greater than 0 and less than or equal to 86400",
                );
            }
        }
        _ if spec.session_affinity_config.is_some() => e.invalid(
            "spec.sessionAffinityConfig",
            spec.session_affinity.as_deref().unwrap_or("None"),
            "must not be set when `sessionAffinity` is None",
        ),
        _ => {}
    }
    e.one_of(
        "spec.trafficDistribution",
        spec.traffic_distribution.as_deref(),
        DISTRIBUTIONS,
    );

    // Load-balancer status.
    let ingress = s
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    if !ingress.is_empty() && kind != "LoadBalancer" {
        e.forbidden(
            "status.loadBalancer.ingress",
            "may only be used when `spec.type` is 'LoadBalancer'",
        );
    }
    for (i, ing) in ingress.iter().enumerate() {
        let f = |x: &str| format!("status.loadBalancer.ingress[{i}].{x}");
        if let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) {
            service_ip(&mut e, &f("ip"), ip);
        } else if ing.ip_mode.is_some() {
            e.forbidden(f("ipMode"), "may not be specified when `ip` is not set");
        }
        e.one_of(f("ipMode"), ing.ip_mode.as_deref(), IP_MODES);
        if let Some(h) = ing.hostname.as_deref().filter(|h| !h.is_empty())
            && !is_dns1123_subdomain(h)
        {
            e.invalid(f("hostname"), h, "must be a DNS-1123 subdomain");
        }
    }
    e.0
}

// ---- EndpointSlice --------------------------------------------------------

/// Every problem of an EndpointSlice, as the API server would report it.
pub fn endpoint_slice(s: &discovery::EndpointSlice) -> Vec<FieldError> {
    let mut e = Errors::default();
    metadata(&mut e, &s.metadata, true, is_dns1123_subdomain);
    let at = s.address_type.as_str();
    if at.is_empty() {
        e.required("addressType");
    } else {
        e.one_of("addressType", Some(at), ADDRESS_TYPES);
    }
    if s.endpoints.len() > MAX_ENDPOINTS {
        e.too_many("endpoints", s.endpoints.len(), MAX_ENDPOINTS);
    }
    for (i, ep) in s.endpoints.iter().enumerate() {
        let f = |x: &str| format!("endpoints[{i}].{x}");
        if ep.addresses.is_empty() {
            e.required(f("addresses"));
        } else if ep.addresses.len() > MAX_ADDRESSES {
            e.too_many(f("addresses"), ep.addresses.len(), MAX_ADDRESSES);
        }
        for (j, a) in ep.addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            match at {
                "IPv4" | "IPv6" => match parse_ip_legacy(a) {
                    Some(ip) if family_of(ip) != at => {
                        e.invalid(&field, a, &format!("must be an {at} address"))
                    }
                    Some(ip) => {
                        if let Some(why) = endpoint_ip(ip) {
                            e.invalid(&field, a, why);
                        }
                    }
                    None => e.invalid(&field, a, "must be a valid IP address"),
                },
                "FQDN" if !is_dns1123_subdomain(a) => {
                    e.invalid(&field, a, "must be a DNS-1123 subdomain")
                }
                _ => {}
            }
        }
        if let Some(n) = ep.node_name.as_deref()
            && !is_dns1123_subdomain(n)
        {
            e.invalid(f("nodeName"), n, "must be a DNS-1123 subdomain");
        }
        if let Some(z) = ep.zone.as_deref()
            && !is_label_value(z)
        {
            e.invalid(f("zone"), z, "must be a valid label value");
        }
        if let Some(h) = &ep.hints {
            let zones = h.for_zones.as_deref().unwrap_or_default();
            if zones.len() > MAX_HINTS {
                e.too_many(f("hints.forZones"), zones.len(), MAX_HINTS);
            }
            let nodes = h.for_nodes.as_deref().unwrap_or_default();
            if nodes.len() > MAX_HINTS {
                e.too_many(f("hints.forNodes"), nodes.len(), MAX_HINTS);
            }
        }
    }
    let ports = s.ports.as_deref().unwrap_or_default();
    if ports.len() > MAX_SLICE_PORTS {
        e.too_many("ports", ports.len(), MAX_SLICE_PORTS);
    }
    let mut names = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let f = |x: &str| format!("ports[{i}].{x}");
        let name = p.name.as_deref().unwrap_or_default();
        if !name.is_empty() && !is_dns1123_label(name) {
            e.invalid(f("name"), name, "a lowercase RFC 1123 label");
        }
        if !names.insert(name) {
            e.duplicate(f("name"), name);
        }
        e.one_of(f("protocol"), p.protocol.as_deref(), PROTOCOLS);
        if let Some(port) = p.port {
            e.port(f("port"), port);
        }
    }
    e.0
}

// ---- Node and ServiceCIDR -------------------------------------------------

/// The problems of the Node fields verdict reads (name, addresses, pod CIDRs).
pub fn node(n: &core::Node) -> Vec<FieldError> {
    let mut e = Errors::default();
    metadata(&mut e, &n.metadata, false, is_dns1123_subdomain);
    let addrs = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    for (i, a) in addrs.iter().enumerate() {
        if matches!(a.type_.as_str(), "InternalIP" | "ExternalIP")
            && parse_ip_legacy(&a.address).is_none()
        {
            e.invalid(
                format!("status.addresses[{i}].address"),
                &a.address,
                "must be a valid IP address",
            );
        }
    }
    if let Some(spec) = &n.spec {
        let cidrs = spec.pod_cidrs.as_deref().unwrap_or_default();
        cidr_list(&mut e, "spec.podCIDRs", cidrs);
        if let Some(c) = spec.pod_cidr.as_deref().filter(|c| !c.is_empty()) {
            if parse_cidr_legacy(c).is_none() {
                e.invalid("spec.podCIDR", c, "must be a valid CIDR");
            }
            if cidrs.first().is_some_and(|first| first != c) {
                e.invalid("spec.podCIDRs[0]", &cidrs[0], "must match `spec.podCIDR`");
            }
        }
    }
    e.0
}

/// The problems of a ServiceCIDR.
pub fn service_cidr(c: &networking::ServiceCIDR) -> Vec<FieldError> {
    let mut e = Errors::default();
    metadata(&mut e, &c.metadata, false, is_dns1123_subdomain);
    let cidrs = c
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or_default();
    if cidrs.is_empty() {
        e.required("spec.cidrs");
    }
    cidr_list(&mut e, "spec.cidrs", cidrs);
    e.0
}

/// At most two CIDRs, valid, of different families.
fn cidr_list(e: &mut Errors, field: &str, cidrs: &[String]) {
    if cidrs.len() > 2 {
        e.too_many(field, cidrs.len(), 2);
    }
    let mut families = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        match c.parse::<ipnet::IpNet>() {
            Ok(net) if net.network() != net.addr() => e.invalid(
                format!("{field}[{i}]"),
                c,
                &format!("must be a network address, e.g. {}", net.trunc()),
            ),
            Ok(net) => families.push(family_of(net.addr())),
            Err(_) => e.invalid(format!("{field}[{i}]"), c, "must be a valid CIDR"),
        }
    }
    if families.len() == 2 && families[0] == families[1] {
        e.invalid(
            field,
            cidrs,
            "may specify no more than one CIDR for each IP family",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns1123_label("a-1"));
        assert!(!is_dns1123_label("-a") && !is_dns1123_label("A") && !is_dns1123_label(""));
        assert!(!is_dns1123_label(&"a".repeat(64)) && is_dns1123_label(&"a".repeat(63)));
        assert!(is_dns1035_label("web") && !is_dns1035_label("1web"));
        assert!(is_dns1123_subdomain("web-1.example") && !is_dns1123_subdomain("web..1"));
        assert!(is_label_value("") && is_label_value("Web_1.x") && !is_label_value("-x"));
        assert!(is_qualified_name("kubernetes.io/service-name") && !is_qualified_name("a/b/c"));
        assert!(is_iana_svc_name("http") && !is_iana_svc_name("8080") && !is_iana_svc_name("a--b"));
    }

    #[test]
    fn special_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "169.254.1.1",
            "224.0.0.1",
            "239.1.1.1",
            "::",
            "::1",
            "fe80::1",
            "ff02::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(special(ip(bad)).is_some(), "{bad}");
        }
        for good in ["10.96.0.1", "203.0.113.5", "fd00::1", "2001:db8::1"] {
            assert!(special(ip(good)).is_none(), "{good}");
        }
        // Endpoints may be multicast outside the link-local block, but not
        // loopback or link-local.
        assert!(endpoint_ip(ip("239.1.1.1")).is_none());
        assert!(endpoint_ip(ip("224.0.0.5")).is_some());
        assert!(endpoint_ip(ip("127.0.0.1")).is_some());
        assert!(endpoint_ip(ip("10.244.0.5")).is_none());
    }
}
