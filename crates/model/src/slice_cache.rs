//! Merges EndpointSlices into per-service-port endpoint lists (kube-proxy's
//! `endpointslicecache.go`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::api::{EndpointSlice, SliceEndpoint};
use crate::endpoints::{Endpoint, EndpointsMap, Hints, sort_endpoints};
use crate::ip::{IpFamily, parse_ip_legacy};
use crate::names::{Name, NamespacedName, Protocol, ServicePortName};

/// A slice port the proxy can use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortInfo {
    name: Name,
    protocol: Protocol,
    port: u16,
}

/// A slice endpoint reduced to what the proxy uses (the port comes from the slice).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointInfo {
    ip: IpAddr,
    is_local: bool,
    ready: bool,
    serving: bool,
    terminating: bool,
    node_name: Option<Name>,
    zone: Option<Name>,
    hints: Option<Arc<Hints>>,
    target: Option<Name>,
}

impl EndpointInfo {
    fn endpoint(&self, port: u16) -> Endpoint {
        Endpoint {
            ip: self.ip,
            port,
            is_local: self.is_local,
            ready: self.ready,
            serving: self.serving,
            terminating: self.terminating,
            node_name: self.node_name.clone(),
            zone: self.zone.clone(),
            hints: self.hints.clone(),
            target: self.target.clone(),
        }
    }
}

/// The parts of one EndpointSlice that matter, in canonical order so that
/// re-ordering inside a slice is not a change.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SliceInfo {
    ports: Vec<PortInfo>,
    endpoints: Vec<EndpointInfo>,
}

/// One service's slices by name, as a sorted list: a service has one slice
/// or a few, and a `BTreeMap` allocates room for 11 for each service.
#[derive(Clone, Debug, Default)]
struct Slices(Vec<(String, SliceInfo)>);

impl Slices {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    fn get(&self, name: &str) -> Option<&SliceInfo> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    fn insert(&mut self, name: &str, info: SliceInfo) {
        match self.find(name) {
            Ok(i) => self.0[i].1 = info,
            Err(i) => {
                if self.0.len() == self.0.capacity() && self.0.len() < 4 {
                    self.0.reserve_exact(1);
                }
                self.0.insert(i, (name.to_string(), info))
            }
        }
    }

    fn remove(&mut self, name: &str) -> bool {
        match self.find(name) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// The slices in name order.
    fn values(&self) -> impl Iterator<Item = &SliceInfo> {
        self.0.iter().map(|(_, info)| info)
    }
}

fn hint_set(names: Option<&Vec<String>>) -> Option<BTreeSet<String>> {
    names
        .filter(|n| !n.is_empty())
        .map(|n| n.iter().cloned().collect())
}

/// Merges the EndpointSlices of each service for ONE family (slices of the other
/// family and FQDN slices are ignored). Per slice, per port, per endpoint: first
/// address only; duplicates IP:port across slices de-duplicated preferring the
/// non-terminating copy. Endpoint port matched to service port by port NAME and
/// protocol (key = ServicePortName{service, port name or "", protocol}).
///
/// Slices without a `kubernetes.io/service-name` label, ports without a number (or
/// 0), endpoints without an address and addresses that are invalid or of the other
/// family are ignored, as in kube-proxy.
#[derive(Clone, Debug)]
pub struct EndpointSliceCache {
    family: IpFamily,
    node_name: String,
    /// Service -> slice name -> slice.
    services: BTreeMap<NamespacedName, Slices>,
    /// Node and zone names, each kept once however many endpoints name
    /// it (there are as many as the cluster has nodes and zones).
    names: HashSet<Name>,
}

/// Past this many distinct node and zone names (nodes come and go), the
/// interned ones are let go and interning starts over.
const MAX_NAMES: usize = 100_000;

impl EndpointSliceCache {
    /// An empty cache for `family` on the node called `node_name`.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        EndpointSliceCache {
            family,
            node_name: node_name.into(),
            services: BTreeMap::new(),
            names: HashSet::new(),
        }
    }

    /// The IP family this cache keeps.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The node name endpoints are compared with to decide `is_local`.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The services that currently have at least one slice stored.
    pub fn services(&self) -> impl Iterator<Item = &NamespacedName> {
        self.services.keys()
    }

    /// Adds or replaces a slice. Returns true if the slice changed something that matters.
    pub fn update(&mut self, slice: &EndpointSlice) -> bool {
        let Some(service) = slice.service() else {
            return false;
        };
        if slice.address_type.family() != Some(self.family) {
            // Not ours (address types are immutable, so this only ever drops leftovers).
            return self.remove(&service, &slice.name);
        }
        let info = self.slice_info(slice);
        let slices = self.services.entry(service).or_default();
        if slices.get(&slice.name) == Some(&info) {
            return false;
        }
        slices.insert(&slice.name, info);
        true
    }

    /// Rebuilds the map of services in one piece (see [`crate::compact`]).
    pub fn compact(&mut self) {
        crate::compact(&mut self.services);
    }

    /// Removes a slice. Returns true if it was stored.
    pub fn delete(&mut self, slice: &EndpointSlice) -> bool {
        match slice.service() {
            Some(service) => self.remove(&service, &slice.name),
            None => false,
        }
    }

    fn remove(&mut self, service: &NamespacedName, slice_name: &str) -> bool {
        let Some(slices) = self.services.get_mut(service) else {
            return false;
        };
        let removed = slices.remove(slice_name);
        if slices.0.is_empty() {
            self.services.remove(service);
        }
        removed
    }

    /// The merged endpoints of `service`, per service port: each list sorted by
    /// Display string and de-duplicated; ports without endpoints are absent.
    pub fn endpoints_for(&self, service: &NamespacedName) -> EndpointsMap {
        let mut by_port: BTreeMap<ServicePortName, BTreeMap<(IpAddr, u16), Endpoint>> =
            BTreeMap::new();
        // Slices are visited in name order, so the outcome is deterministic.
        for slice in self
            .services
            .get(service)
            .into_iter()
            .flat_map(Slices::values)
        {
            for port in &slice.ports {
                let key = ServicePortName {
                    service: service.clone(),
                    port: port.name.clone(),
                    protocol: port.protocol,
                };
                let set = by_port.entry(key).or_default();
                for info in &slice.endpoints {
                    let candidate = info.endpoint(port.port);
                    let slot = (candidate.ip, candidate.port);
                    // An IP can be reused by a new pod before the old, terminating
                    // one is gone: prefer the non-terminating copy.
                    let replace = set
                        .get(&slot)
                        .is_none_or(|existing| existing.terminating && !candidate.terminating);
                    if replace {
                        set.insert(slot, candidate);
                    }
                }
            }
        }
        by_port
            .into_iter()
            .filter(|(_, set)| !set.is_empty())
            .map(|(name, set)| {
                let mut list: Vec<Endpoint> = set.into_values().collect();
                sort_endpoints(&mut list);
                (name, list.into())
            })
            .collect()
    }

    /// The merged endpoints of every service (an [`EndpointsMap`] of the whole cache).
    pub fn endpoints_map(&self) -> EndpointsMap {
        self.services
            .keys()
            .flat_map(|svc| self.endpoints_for(svc))
            .collect()
    }

    fn slice_info(&mut self, slice: &EndpointSlice) -> SliceInfo {
        let mut ports: Vec<PortInfo> = slice
            .ports
            .iter()
            .filter_map(|p| {
                Some(PortInfo {
                    name: p.name.as_deref().unwrap_or_default().into(),
                    protocol: p.protocol,
                    port: p
                        .port
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n != 0)?,
                })
            })
            .collect();
        ports.sort();
        ports.dedup();
        let mut endpoints: Vec<EndpointInfo> = slice
            .endpoints
            .iter()
            .filter_map(|ep| self.endpoint_info(ep))
            .collect();
        endpoints.sort();
        // Kept until the slice changes: without the room for four that a
        // filtered collect starts with (a slice of 2 endpoints had twice
        // its size).
        ports.shrink_to_fit();
        endpoints.shrink_to_fit();
        SliceInfo { ports, endpoints }
    }

    /// `s` as a shared name, the same allocation for every endpoint that
    /// names it.
    fn intern(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
        }
        let n = Name::from(s);
        self.names.insert(n.clone());
        n
    }

    fn endpoint_info(&mut self, ep: &SliceEndpoint) -> Option<EndpointInfo> {
        let ip = parse_ip_legacy(ep.addresses.first()?)?;
        if !self.family.matches(ip) {
            return None;
        }
        let is_local =
            !self.node_name.is_empty() && ep.node_name.as_deref() == Some(self.node_name.as_str());
        let hints = ep.hints.as_ref();
        Some(EndpointInfo {
            ip,
            is_local,
            ready: ep.ready.unwrap_or(true),
            serving: ep.serving.unwrap_or(true),
            terminating: ep.terminating.unwrap_or(false),
            node_name: ep.node_name.as_deref().map(|n| self.intern(n)),
            zone: ep.zone.as_deref().map(|z| self.intern(z)),
            hints: Hints::of(
                hint_set(hints.map(|h| &h.for_zones)),
                hint_set(hints.map(|h| &h.for_nodes)),
            ),
            // One pod per endpoint: not interned.
            target: ep.target_name.as_deref().map(Name::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AddressType, EndpointHints, SlicePort};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn svc() -> NamespacedName {
        NamespacedName::new("ns1", "svc1")
    }

    fn spn(port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName {
            service: svc(),
            port: port.into(),
            protocol,
        }
    }

    fn sport(name: &str, port: i32) -> SlicePort {
        SlicePort {
            name: Some(name.into()),
            port: Some(port),
            protocol: Protocol::Tcp,
        }
    }

    fn sep(addr: &str) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![addr.into()],
            ..Default::default()
        }
    }

    fn slice(name: &str, ports: Vec<SlicePort>, endpoints: Vec<SliceEndpoint>) -> EndpointSlice {
        EndpointSlice {
            namespace: "ns1".into(),
            name: name.into(),
            service_name: Some("svc1".into()),
            address_type: AddressType::IPv4,
            endpoints,
            ports,
            last_change_trigger_time: None,
        }
    }

    fn strs(eps: &[Endpoint]) -> Vec<String> {
        eps.iter().map(ToString::to_string).collect()
    }

    /// Endpoints on one node, in two slices, share one copy of its name
    /// and of their zone.
    #[test]
    fn node_and_zone_names_are_kept_once() {
        let mut c = EndpointSliceCache::new(IpFamily::V4, "n1");
        let on = |addr: &str, node: &str| SliceEndpoint {
            node_name: Some(node.into()),
            zone: Some("z1".into()),
            ..sep(addr)
        };
        c.update(&slice(
            "a",
            vec![sport("p", 80)],
            vec![on("10.0.0.1", "n2")],
        ));
        c.update(&slice(
            "b",
            vec![sport("p", 80)],
            vec![on("10.0.0.2", "n2"), on("10.0.0.3", "n3")],
        ));
        let map = c.endpoints_for(&svc());
        let eps = &map[&spn("p", Protocol::Tcp)];
        assert_eq!(eps.len(), 3);
        let text = |n: &Option<Name>| n.as_deref().map(str::as_ptr);
        assert_eq!(text(&eps[0].node_name), text(&eps[1].node_name));
        assert_ne!(text(&eps[0].node_name), text(&eps[2].node_name));
        assert_eq!(eps[2].node_name.as_deref(), Some("n3"));
        assert_eq!(text(&eps[0].zone), text(&eps[2].zone));
    }

    #[test]
    fn conditions_and_locality() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "node1");
        let s = slice(
            "s1",
            vec![sport("p80", 80)],
            vec![
                SliceEndpoint {
                    node_name: Some("node1".into()),
                    zone: Some("z".into()),
                    ..sep("10.0.0.1")
                },
                SliceEndpoint {
                    ready: Some(false),
                    serving: Some(true),
                    terminating: Some(true),
                    node_name: Some("node2".into()),
                    ..sep("10.0.0.2")
                },
                SliceEndpoint {
                    ready: Some(false),
                    serving: Some(false),
                    terminating: Some(false),
                    ..sep("10.0.0.3")
                },
            ],
        );
        assert!(cache.update(&s));
        let map = cache.endpoints_for(&svc());
        let eps = &map[&spn("p80", Protocol::Tcp)];
        assert_eq!(eps.len(), 3);
        let e1 = &eps[0];
        assert!(e1.is_local && e1.ready && e1.serving && !e1.terminating);
        assert_eq!(e1.node_name.as_deref(), Some("node1"));
        assert_eq!(e1.zone.as_deref(), Some("z"));
        let e2 = &eps[1];
        assert!(!e2.is_local && !e2.ready && e2.serving && e2.terminating);
        let e3 = &eps[2];
        assert!(!e3.ready && !e3.serving && !e3.terminating);
    }

    #[test]
    fn empty_node_name_is_never_local() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "");
        cache.update(&slice(
            "s1",
            vec![sport("p", 80)],
            vec![SliceEndpoint {
                node_name: Some(String::new()),
                ..sep("10.0.0.1")
            }],
        ));
        assert!(!cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)][0].is_local);
    }

    #[test]
    fn first_address_only_and_legacy_parsing() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice(
            "s1",
            vec![sport("p", 80)],
            vec![
                SliceEndpoint {
                    addresses: vec!["10.180.00.001".into(), "10.0.0.99".into()],
                    ..Default::default()
                },
                SliceEndpoint::default(),
                sep("not-an-ip"),
                sep("fd00::1"),
            ],
        ));
        let map = cache.endpoints_for(&svc());
        assert_eq!(strs(&map[&spn("p", Protocol::Tcp)]), ["10.180.0.1:80"]);
    }

    #[test]
    fn hints_kept_and_empty_hints_are_none() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice(
            "s1",
            vec![sport("p", 80)],
            vec![
                SliceEndpoint {
                    hints: Some(EndpointHints {
                        for_zones: vec!["a".into(), "b".into()],
                        for_nodes: vec!["n".into()],
                    }),
                    ..sep("10.0.0.1")
                },
                SliceEndpoint {
                    hints: Some(EndpointHints::default()),
                    ..sep("10.0.0.2")
                },
            ],
        ));
        let eps = &cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)];
        assert_eq!(
            eps[0].zone_hints(),
            Some(&["a".to_string(), "b".to_string()].into_iter().collect())
        );
        assert_eq!(
            eps[0].node_hints(),
            Some(&["n".to_string()].into_iter().collect())
        );
        assert_eq!(eps[1].zone_hints(), None);
        assert_eq!(eps[1].node_hints(), None);
        assert_eq!(eps[1].hints, None, "empty hints take no room");
    }

    #[test]
    fn ports_matched_by_name_and_protocol() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice(
            "s1",
            vec![
                sport("http", 8080),
                SlicePort {
                    name: Some("dns".into()),
                    port: Some(5353),
                    protocol: Protocol::Udp,
                },
                SlicePort {
                    name: None,
                    port: Some(9000),
                    protocol: Protocol::Tcp,
                },
                SlicePort {
                    name: Some("noport".into()),
                    port: None,
                    protocol: Protocol::Tcp,
                },
                SlicePort {
                    name: Some("zero".into()),
                    port: Some(0),
                    protocol: Protocol::Tcp,
                },
                SlicePort {
                    name: Some("big".into()),
                    port: Some(70000),
                    protocol: Protocol::Tcp,
                },
            ],
            vec![sep("10.0.0.1")],
        ));
        let map = cache.endpoints_for(&svc());
        assert_eq!(
            map.keys().cloned().collect::<Vec<_>>(),
            vec![
                spn("", Protocol::Tcp),
                spn("dns", Protocol::Udp),
                spn("http", Protocol::Tcp)
            ]
        );
        assert_eq!(strs(&map[&spn("http", Protocol::Tcp)]), ["10.0.0.1:8080"]);
        assert_eq!(strs(&map[&spn("dns", Protocol::Udp)]), ["10.0.0.1:5353"]);
        assert_eq!(strs(&map[&spn("", Protocol::Tcp)]), ["10.0.0.1:9000"]);
        assert!(!map.contains_key(&spn("dns", Protocol::Tcp)));
    }

    #[test]
    fn merge_across_slices_sorted_by_display() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice(
            "s1",
            vec![sport("p", 9898)],
            vec![sep("10.244.0.8")],
        ));
        cache.update(&slice(
            "s2",
            vec![sport("p", 9898)],
            vec![sep("10.244.0.10")],
        ));
        let map = cache.endpoints_for(&svc());
        assert_eq!(
            strs(&map[&spn("p", Protocol::Tcp)]),
            ["10.244.0.10:9898", "10.244.0.8:9898"]
        );
        assert_eq!(cache.endpoints_map(), map);
    }

    #[test]
    fn duplicates_prefer_non_terminating_copy() {
        let terminating = SliceEndpoint {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true),
            node_name: Some("old".into()),
            ..sep("10.0.0.1")
        };
        let running = SliceEndpoint {
            node_name: Some("new".into()),
            ..sep("10.0.0.1")
        };
        // Either slice order: the running copy wins.
        for (a, b) in [(&terminating, &running), (&running, &terminating)] {
            let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
            cache.update(&slice("s1", vec![sport("p", 80)], vec![a.clone()]));
            cache.update(&slice("s2", vec![sport("p", 80)], vec![b.clone()]));
            let eps = &cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)];
            assert_eq!(eps.len(), 1);
            assert!(eps[0].ready && !eps[0].terminating);
            assert_eq!(eps[0].node_name.as_deref(), Some("new"));
        }
        // Same IP on a different port is not a duplicate.
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice("s1", vec![sport("p", 80)], vec![sep("10.0.0.1")]));
        cache.update(&slice("s2", vec![sport("p", 81)], vec![sep("10.0.0.1")]));
        assert_eq!(
            cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)].len(),
            2
        );
    }

    #[test]
    fn family_filtering() {
        let mut v6 = slice("s6", vec![sport("p", 80)], vec![sep("fd00::1")]);
        v6.address_type = AddressType::IPv6;
        let v4 = slice("s4", vec![sport("p", 80)], vec![sep("10.0.0.1")]);
        let mut fqdn = slice("sf", vec![sport("p", 80)], vec![sep("example.com")]);
        fqdn.address_type = AddressType::Fqdn;

        let mut c4 = EndpointSliceCache::new(IpFamily::V4, "n");
        assert!(c4.update(&v4));
        assert!(!c4.update(&v6));
        assert!(!c4.update(&fqdn));
        assert_eq!(
            strs(&c4.endpoints_for(&svc())[&spn("p", Protocol::Tcp)]),
            ["10.0.0.1:80"]
        );

        let mut c6 = EndpointSliceCache::new(IpFamily::V6, "n");
        assert!(!c6.update(&v4));
        assert!(c6.update(&v6));
        assert_eq!(
            strs(&c6.endpoints_for(&svc())[&spn("p", Protocol::Tcp)]),
            ["[fd00::1]:80"]
        );
        assert_eq!(c6.family(), IpFamily::V6);
    }

    #[test]
    fn update_reports_only_relevant_changes() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        let s = slice(
            "s1",
            vec![sport("p", 80)],
            vec![sep("10.0.0.1"), sep("10.0.0.2")],
        );
        assert!(cache.update(&s));
        assert!(!cache.update(&s), "same slice again");

        // Re-ordering endpoints or ports, or a new trigger time, is not a change.
        let mut reordered = s.clone();
        reordered.endpoints.reverse();
        reordered.last_change_trigger_time = Some("2024-01-01T00:00:00Z".into());
        assert!(!cache.update(&reordered));

        let mut changed = s.clone();
        changed.endpoints[0].ready = Some(false);
        assert!(cache.update(&changed));
    }

    #[test]
    fn delete() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        let s1 = slice("s1", vec![sport("p", 80)], vec![sep("10.0.0.1")]);
        let s2 = slice("s2", vec![sport("p", 80)], vec![sep("10.0.0.2")]);
        assert!(!cache.delete(&s1), "not stored yet");
        cache.update(&s1);
        cache.update(&s2);
        assert!(cache.delete(&s1));
        assert!(!cache.delete(&s1));
        assert_eq!(
            strs(&cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)]),
            ["10.0.0.2:80"]
        );
        assert!(cache.delete(&s2));
        assert!(cache.endpoints_for(&svc()).is_empty());
        assert_eq!(cache.services().count(), 0);
    }

    #[test]
    fn slice_turning_into_other_family_is_dropped() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        let mut s = slice("s1", vec![sport("p", 80)], vec![sep("10.0.0.1")]);
        cache.update(&s);
        s.address_type = AddressType::IPv6;
        assert!(cache.update(&s));
        assert!(cache.endpoints_for(&svc()).is_empty());
        assert!(!cache.update(&s));
    }

    #[test]
    fn slices_without_service_label_are_ignored() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        let mut s = slice("s1", vec![sport("p", 80)], vec![sep("10.0.0.1")]);
        s.service_name = None;
        assert!(!cache.update(&s));
        assert!(!cache.delete(&s));
        assert_eq!(cache.services().count(), 0);
    }

    #[test]
    fn slice_with_no_endpoints_gives_no_entry() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        assert!(cache.update(&slice("s1", vec![sport("p", 80)], vec![])));
        assert!(cache.endpoints_for(&svc()).is_empty());
    }

    #[test]
    fn services_are_separate() {
        let mut cache = EndpointSliceCache::new(IpFamily::V4, "n");
        cache.update(&slice("s1", vec![sport("p", 80)], vec![sep("10.0.0.1")]));
        let mut other = slice("o1", vec![sport("p", 80)], vec![sep("10.0.0.2")]);
        other.service_name = Some("svc2".into());
        cache.update(&other);
        assert_eq!(cache.endpoints_for(&svc()).len(), 1);
        assert_eq!(cache.endpoints_map().len(), 2);
        assert_eq!(
            ip("10.0.0.1"),
            cache.endpoints_for(&svc())[&spn("p", Protocol::Tcp)][0].ip
        );
    }
}
