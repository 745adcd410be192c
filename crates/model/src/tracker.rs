//! Change trackers: fold watch events between syncs and apply them to the maps the
//! proxier syncs from (kube-proxy's `servicechangetracker.go` and
//! `endpointschangetracker.go`).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::api::{EndpointSlice, Service};
use crate::endpoints::{Endpoint, EndpointsMap};
use crate::error::ModelError;
use crate::ip::IpFamily;
use crate::names::{NamespacedName, Protocol, ServicePortName};
use crate::selection::{Counting, MetricsSelection};
use crate::service::{ServicePort, ServicePortMap, service_port_map};
use crate::slice_cache::EndpointSliceCache;

/// Removes and returns every entry of `service` from a map keyed by [`ServicePortName`].
fn take_service<V>(
    map: &mut BTreeMap<ServicePortName, V>,
    service: &NamespacedName,
) -> BTreeMap<ServicePortName, V> {
    let keys: Vec<ServicePortName> = map
        .range(ServicePortName::first_of(service)..)
        .take_while(|(k, _)| k.service == *service)
        .map(|(k, _)| k.clone())
        .collect();
    keys.into_iter()
        .filter_map(|k| map.remove_entry(&k))
        .collect()
}

/// The services touched by [`ServiceChangeTracker::apply`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceUpdateResult {
    /// Services added, changed or deleted since the last apply.
    pub updated_services: BTreeSet<NamespacedName>,
}

/// One service's ports before and after, in name order. A sorted list, not
/// a map: a service has one or a few ports, and a `BTreeMap` allocates a
/// whole node (room for 11) for each, which at 30,000 pending services
/// was 94 MiB of a first sync's peak.
type Ports = Vec<(ServicePortName, Arc<ServicePort>)>;

#[derive(Clone, Debug)]
struct ServiceChange {
    previous: Ports,
    current: Ports,
}

/// Folds service events between syncs like kube-proxy's ServiceChangeTracker: keeps
/// the FIRST previous and LATEST current per service; drops the entry when they
/// become equal (add then delete before a sync is a no-op).
#[derive(Clone, Debug)]
pub struct ServiceChangeTracker {
    family: IpFamily,
    items: BTreeMap<NamespacedName, ServiceChange>,
    errors: Vec<ModelError>,
    selection: MetricsSelection,
}

impl ServiceChangeTracker {
    /// An empty tracker for one IP family.
    pub fn new(family: IpFamily) -> Self {
        ServiceChangeTracker::counting(family, MetricsSelection::default())
    }

    /// An empty tracker whose ports are counted as `selection` says
    /// ([`ServicePort::counting`]).
    pub fn counting(family: IpFamily, selection: MetricsSelection) -> Self {
        ServiceChangeTracker {
            family,
            items: BTreeMap::new(),
            errors: Vec::new(),
            selection,
        }
    }

    /// The IP family this tracker processes.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    fn port_map(&mut self, svc: Option<&Service>, record_errors: bool) -> Ports {
        let level = svc.map_or(Counting::None, |s| self.selection.level_for(s));
        match svc.map(|s| service_port_map(s, self.family)) {
            None => Ports::new(),
            // Collected from an exact-size iterator: no spare room.
            Some(Ok(map)) => map
                .into_iter()
                .map(|(name, mut port)| {
                    if level != Counting::None {
                        // Just made, so not shared: no copy.
                        Arc::make_mut(&mut port).counting = level;
                    }
                    (name, port)
                })
                .collect(),
            Some(Err(err)) => {
                if record_errors {
                    self.errors.push(err);
                }
                Ports::new()
            }
        }
    }

    /// previous/current are the object before/after the event (None for add/delete).
    /// Returns true if a sync is needed (for this or any earlier pending change).
    /// Invalid services are not logged here: the error is stored (see
    /// [`take_errors`](Self::take_errors)) and the service is treated as having no
    /// ports. Errors are only recorded for `current`; `previous` was reported when it
    /// was current.
    pub fn update(&mut self, previous: Option<&Service>, current: Option<&Service>) -> bool {
        let Some(svc) = current.or(previous) else {
            return false;
        };
        let key = svc.namespaced_name();
        let previous_map = if self.items.contains_key(&key) {
            None
        } else {
            Some(self.port_map(previous, false))
        };
        self.record(key, previous_map, current)
    }

    /// The same, for the Service `name`, whose previous ports are those
    /// `applied` holds for it: `applied` is the map this tracker's changes
    /// are applied to ([`apply`](Self::apply)), so without a pending
    /// change it holds exactly the ports of the previous object, and no
    /// copy of that object is needed.
    pub fn update_applied(
        &mut self,
        applied: &ServicePortMap,
        name: NamespacedName,
        current: Option<&Service>,
    ) -> bool {
        let previous_map = if self.items.contains_key(&name) {
            None
        } else {
            Some(
                applied
                    .range(ServicePortName::first_of(&name)..)
                    .take_while(|(k, _)| k.service == name)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        };
        self.record(name, previous_map, current)
    }

    /// Records `current` against `previous_map` (`None`: a change is
    /// pending already, and its previous state stands).
    fn record(
        &mut self,
        key: NamespacedName,
        previous_map: Option<Ports>,
        current: Option<&Service>,
    ) -> bool {
        let current_map = self.port_map(current, true);
        match self.items.entry(key) {
            Entry::Occupied(mut entry) => {
                entry.get_mut().current = current_map;
                if entry.get().previous == entry.get().current {
                    entry.remove();
                }
            }
            Entry::Vacant(entry) => {
                let previous = previous_map.unwrap_or_default();
                if previous != current_map {
                    entry.insert(ServiceChange {
                        previous,
                        current: current_map,
                    });
                }
            }
        }
        !self.items.is_empty()
    }

    /// The number of services with pending changes.
    pub fn pending(&self) -> usize {
        self.items.len()
    }

    /// Applies pending changes to `map`; returns the services touched.
    pub fn apply(&mut self, map: &mut ServicePortMap) -> ServiceUpdateResult {
        let mut result = ServiceUpdateResult::default();
        if map.is_empty() {
            // The first sync: every pending change is a service added.
            // Its ports come in name order, services in name order, so the
            // map and the set are built in one piece each, not inserted
            // into one entry at a time.
            let mut names = Vec::with_capacity(self.items.len());
            let mut ports = Vec::new();
            for (name, change) in std::mem::take(&mut self.items) {
                ports.extend(change.current);
                names.push(name);
            }
            *map = ports.into_iter().collect();
            result.updated_services = names.into_iter().collect();
            return result;
        }
        let compact = crate::worth_compacting(self.items.len(), map.len());
        for (name, change) in std::mem::take(&mut self.items) {
            take_service(map, &name);
            map.extend(change.current);
            result.updated_services.insert(name);
        }
        if compact {
            crate::compact(map);
        }
        result
    }

    /// Returns and clears the errors of invalid services seen since the last call.
    pub fn take_errors(&mut self) -> Vec<ModelError> {
        std::mem::take(&mut self.errors)
    }
}

/// What [`EndpointsChangeTracker::apply`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointsUpdateResult {
    /// Services whose endpoints changed.
    pub updated_services: BTreeSet<NamespacedName>,
    /// Endpoints that were in the map for a service port before and are not any more
    /// (IP:port + the ServicePortName) — used for UDP conntrack cleanup later.
    /// As in kube-proxy, an endpoint that stays but stops serving counts as deleted,
    /// and an endpoint that was not serving before is never listed (it had no traffic).
    /// All protocols are listed; callers filter for UDP.
    pub deleted_endpoints: Vec<(ServicePortName, Endpoint)>,
    /// Trigger-time annotation values of slices applied in this batch (not for
    /// deletions), per service. Kept as text; filtering by tracker start time is up
    /// to the caller.
    pub last_change_trigger_times: BTreeMap<NamespacedName, Vec<String>>,
    /// kube-proxy's `ConntrackCleanupRequired`: a service with a UDP port (before or
    /// after) had its endpoints changed.
    pub conntrack_cleanup_required: bool,
}

/// Wraps an [`EndpointSliceCache`]; tracks which services have pending changes and
/// the trigger times of the slices that changed them.
#[derive(Clone, Debug)]
pub struct EndpointsChangeTracker {
    cache: EndpointSliceCache,
    pending: BTreeSet<NamespacedName>,
    trigger_times: BTreeMap<NamespacedName, Vec<String>>,
}

impl EndpointsChangeTracker {
    /// An empty tracker for `family` on the node called `node_name`.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        EndpointsChangeTracker {
            cache: EndpointSliceCache::new(family, node_name),
            pending: BTreeSet::new(),
            trigger_times: BTreeMap::new(),
        }
    }

    /// The underlying slice cache (latest state of every slice, applied or not).
    pub fn cache(&self) -> &EndpointSliceCache {
        &self.cache
    }

    /// Records a slice add/update (`removed == false`) or delete (`removed == true`).
    /// Returns true if the slice changed something, i.e. a sync is needed.
    pub fn update(&mut self, slice: &EndpointSlice, removed: bool) -> bool {
        let Some(service) = slice.service() else {
            return false;
        };
        let changed = if removed {
            self.cache.delete(slice)
        } else {
            self.cache.update(slice)
        };
        if changed {
            if removed {
                // A deleted slice's trigger time is that of its last update, which is
                // not what the latency metric measures.
                self.trigger_times.remove(&service);
            } else if let Some(t) = slice
                .last_change_trigger_time
                .as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
            {
                self.trigger_times
                    .entry(service.clone())
                    .or_default()
                    .push(t.to_owned());
            }
            self.pending.insert(service);
        }
        changed
    }

    /// The number of services with pending changes.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Applies pending changes to `map` and reports what changed.
    pub fn apply(&mut self, map: &mut EndpointsMap) -> EndpointsUpdateResult {
        let mut result = EndpointsUpdateResult {
            last_change_trigger_times: std::mem::take(&mut self.trigger_times),
            ..Default::default()
        };
        if map.is_empty() {
            // The first sync: nothing was there, so nothing is deleted, and
            // the map and the set are built in one piece each (services and
            // their ports in name order), not inserted into one at a time.
            let compact = crate::worth_compacting(self.pending.len(), 0);
            let mut names = Vec::with_capacity(self.pending.len());
            let mut entries = Vec::new();
            for service in std::mem::take(&mut self.pending) {
                let current = self.cache.endpoints_for(&service);
                if current.is_empty() {
                    continue;
                }
                if current.keys().any(|k| k.protocol == Protocol::Udp) {
                    result.conntrack_cleanup_required = true;
                }
                entries.extend(current);
                names.push(service);
            }
            *map = entries.into_iter().collect();
            result.updated_services = names.into_iter().collect();
            if compact {
                self.cache.compact();
            }
            return result;
        }
        let compact = crate::worth_compacting(self.pending.len(), map.len());
        for service in std::mem::take(&mut self.pending) {
            let previous = take_service(map, &service);
            let current = self.cache.endpoints_for(&service);
            if previous != current {
                for (name, old) in &previous {
                    let new: &[Endpoint] = current.get(name).map_or(&[], |v| v);
                    // A set, not a scan of the new list for each old endpoint:
                    // quadratic at 5,000 endpoints.
                    let serving: std::collections::HashSet<(IpAddr, u16)> = new
                        .iter()
                        .filter(|n| n.serving)
                        .map(|n| (n.ip, n.port))
                        .collect();
                    for ep in old.iter().filter(|ep| ep.serving) {
                        if !serving.contains(&(ep.ip, ep.port)) {
                            result.deleted_endpoints.push((name.clone(), ep.clone()));
                        }
                    }
                }
                if previous
                    .keys()
                    .chain(current.keys())
                    .any(|k| k.protocol == Protocol::Udp)
                {
                    result.conntrack_cleanup_required = true;
                }
                result.updated_services.insert(service);
            }
            map.extend(current);
        }
        if compact {
            crate::compact(map);
            self.cache.compact();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::api::{AddressType, ServicePortSpec, SliceEndpoint, SlicePort};
    use crate::endpoints::local_ready_endpoints;

    // ---- services ----

    fn svc(name: &str, cluster_ip: &str, port: i32) -> Service {
        Service {
            namespace: "ns".into(),
            name: name.into(),
            cluster_ips: vec![cluster_ip.into()],
            ports: vec![ServicePortSpec {
                name: "p".into(),
                protocol: Protocol::Tcp,
                port,
                node_port: None,
            }],
            ..Default::default()
        }
    }

    fn nn(name: &str) -> NamespacedName {
        NamespacedName::new("ns", name)
    }

    #[test]
    fn service_add_and_apply() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let a = svc("a", "10.0.0.1", 80);
        assert!(t.update(None, Some(&a)));
        assert_eq!(t.pending(), 1);
        let mut map = ServicePortMap::new();
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
        assert_eq!(map.len(), 1);
        assert_eq!(t.pending(), 0);
        // Nothing pending: nothing touched.
        assert_eq!(t.apply(&mut map), ServiceUpdateResult::default());
        assert_eq!(map.len(), 1);
    }

    #[test]
    fn service_add_then_delete_is_noop() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let a = svc("a", "10.0.0.1", 80);
        assert!(t.update(None, Some(&a)));
        assert!(!t.update(Some(&a), None));
        assert_eq!(t.pending(), 0);
        let mut map = ServicePortMap::new();
        assert!(t.apply(&mut map).updated_services.is_empty());
        assert!(map.is_empty());
    }

    #[test]
    fn service_update_then_revert_is_noop() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let a1 = svc("a", "10.0.0.1", 80);
        t.update(None, Some(&a1));
        t.apply(&mut map);
        let a2 = svc("a", "10.0.0.1", 81);
        assert!(t.update(Some(&a1), Some(&a2)));
        assert!(!t.update(Some(&a2), Some(&a1)));
        assert_eq!(t.pending(), 0);
        assert!(t.apply(&mut map).updated_services.is_empty());
    }

    #[test]
    fn service_previous_ports_come_from_the_applied_map() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let (a1, a2) = (svc("a", "10.0.0.1", 80), svc("a", "10.0.0.1", 81));
        assert!(t.update_applied(&map, nn("a"), Some(&a1)));
        t.apply(&mut map);
        // The same object again, by name only: nothing to do.
        assert!(!t.update_applied(&map, nn("a"), Some(&a1)));
        assert_eq!(t.pending(), 0);
        // A change, then back: the previous state is the applied one.
        assert!(t.update_applied(&map, nn("a"), Some(&a2)));
        assert!(!t.update_applied(&map, nn("a"), Some(&a1)));
        assert!(t.update_applied(&map, nn("a"), Some(&a2)));
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
        assert_eq!(map.values().map(|p| p.port).collect::<Vec<_>>(), [81]);
        // A delete by name removes what was applied; another Service
        // beside it ("ab" sorts right after "a") is not touched.
        t.update_applied(&map, nn("ab"), Some(&svc("ab", "10.0.0.2", 90)));
        t.apply(&mut map);
        assert!(t.update_applied(&map, nn("a"), None));
        t.apply(&mut map);
        assert_eq!(map.values().map(|p| p.port).collect::<Vec<_>>(), [90]);
    }

    #[test]
    fn service_update_without_relevant_change_is_noop() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let a1 = svc("a", "10.0.0.1", 80);
        let mut a2 = a1.clone();
        a2.labels.insert("irrelevant".into(), "x".into());
        assert!(!t.update(Some(&a1), Some(&a2)));
        // An IPv6-only service does not matter to the IPv4 tracker.
        assert!(!t.update(None, Some(&svc("b", "fd00::1", 80))));
    }

    #[test]
    fn service_keeps_first_previous_and_latest_current() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let v1 = svc("a", "10.0.0.1", 80);
        t.update(None, Some(&v1));
        t.apply(&mut map);

        let v2 = svc("a", "10.0.0.1", 81);
        let v3 = svc("a", "10.0.0.1", 82);
        assert!(t.update(Some(&v1), Some(&v2)));
        // The "previous" passed here (v1, stale) is ignored: the first one is kept.
        assert!(t.update(Some(&v1), Some(&v3)));
        // Going back to v1 (the FIRST previous) cancels everything, even though the
        // last step was v3 -> v1.
        assert!(!t.update(Some(&v3), Some(&v1)));
        assert_eq!(t.pending(), 0);

        assert!(t.update(Some(&v1), Some(&v2)));
        assert!(t.update(Some(&v2), Some(&v3)));
        assert_eq!(t.pending(), 1);
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
        assert_eq!(map.values().map(|p| p.port).collect::<Vec<_>>(), [82]);
    }

    #[test]
    fn service_apply_removes_deleted_and_renamed_ports() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let a = svc("a", "10.0.0.1", 80);
        let b = svc("b", "10.0.0.2", 80);
        t.update(None, Some(&a));
        t.update(None, Some(&b));
        t.apply(&mut map);
        assert_eq!(map.len(), 2);

        let mut a2 = a.clone();
        a2.ports[0].name = "renamed".into();
        t.update(Some(&a), Some(&a2));
        t.update(Some(&b), None);
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a"), nn("b")]));
        assert_eq!(
            map.keys().cloned().collect::<Vec<_>>(),
            [ServicePortName::new("ns", "a", "renamed", Protocol::Tcp)]
        );
    }

    #[test]
    fn service_becoming_headless_removes_ports() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let a = svc("a", "10.0.0.1", 80);
        t.update(None, Some(&a));
        t.apply(&mut map);
        let mut headless = a.clone();
        headless.cluster_ips = vec!["None".into()];
        assert!(t.update(Some(&a), Some(&headless)));
        t.apply(&mut map);
        assert!(map.is_empty());
    }

    #[test]
    fn invalid_service_is_recorded_and_has_no_ports() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let mut map = ServicePortMap::new();
        let good = svc("a", "10.0.0.1", 80);
        t.update(None, Some(&good));
        t.apply(&mut map);

        let bad = svc("a", "10.0.0.1", 70000);
        assert!(t.update(Some(&good), Some(&bad)));
        let errors = t.take_errors();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].to_string().contains("ns/a"), "{}", errors[0]);
        assert!(t.take_errors().is_empty());
        t.apply(&mut map);
        assert!(map.is_empty());

        // Deleting the invalid service does not report it again.
        assert!(!t.update(Some(&bad), None));
        assert!(t.take_errors().is_empty());
    }

    #[test]
    fn service_update_with_no_objects() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        assert!(!t.update(None, None));
        assert_eq!(t.family(), IpFamily::V4);
    }

    #[test]
    fn service_update_return_reflects_any_pending() {
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        let a = svc("a", "10.0.0.1", 80);
        t.update(None, Some(&a));
        // An irrelevant event still reports that a sync is needed (a is pending).
        assert!(t.update(None, Some(&svc("b", "fd00::1", 80))));
    }

    // ---- endpoints ----

    fn sep(addr: &str) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![addr.into()],
            ..Default::default()
        }
    }

    fn slice(
        service: &str,
        name: &str,
        port: i32,
        protocol: Protocol,
        endpoints: Vec<SliceEndpoint>,
    ) -> EndpointSlice {
        EndpointSlice {
            namespace: "ns".into(),
            name: name.into(),
            service_name: Some(service.into()),
            address_type: AddressType::IPv4,
            endpoints,
            ports: vec![SlicePort {
                name: Some("p".into()),
                port: Some(port),
                protocol,
            }],
            last_change_trigger_time: None,
        }
    }

    fn spn(service: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName::new("ns", service, "p", protocol)
    }

    fn deleted(r: &EndpointsUpdateResult) -> Vec<String> {
        r.deleted_endpoints
            .iter()
            .map(|(n, e)| format!("{n}={e}"))
            .collect()
    }

    fn addr(e: &Endpoint) -> SocketAddr {
        e.socket_addr()
    }

    #[test]
    fn endpoints_add_apply() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "node1");
        let mut map = EndpointsMap::new();
        let s = slice(
            "a",
            "a-1",
            80,
            Protocol::Tcp,
            vec![sep("10.0.0.1"), sep("10.0.0.2")],
        );
        assert!(t.update(&s, false));
        assert!(!t.update(&s, false), "no change");
        assert_eq!(t.pending(), 1);
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
        assert!(r.deleted_endpoints.is_empty());
        assert!(!r.conntrack_cleanup_required);
        assert_eq!(
            map[&spn("a", Protocol::Tcp)]
                .iter()
                .map(addr)
                .collect::<Vec<_>>(),
            [
                "10.0.0.1:80".parse().unwrap(),
                "10.0.0.2:80".parse().unwrap()
            ] as [SocketAddr; 2]
        );
        assert_eq!(t.pending(), 0);
        assert_eq!(t.apply(&mut map), EndpointsUpdateResult::default());
    }

    #[test]
    fn endpoints_deleted_endpoints_reported() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "node1");
        let mut map = EndpointsMap::new();
        t.update(
            &slice(
                "a",
                "a-1",
                53,
                Protocol::Udp,
                vec![sep("10.0.0.1"), sep("10.0.0.2")],
            ),
            false,
        );
        t.update(
            &slice("b", "b-1", 80, Protocol::Tcp, vec![sep("10.0.1.1")]),
            false,
        );
        t.apply(&mut map);

        // Remove one endpoint of a; delete b's slice entirely.
        assert!(t.update(
            &slice("a", "a-1", 53, Protocol::Udp, vec![sep("10.0.0.2")]),
            false
        ));
        assert!(t.update(&slice("b", "b-1", 80, Protocol::Tcp, vec![]), true));
        let r = t.apply(&mut map);
        assert_eq!(r.updated_services, BTreeSet::from([nn("a"), nn("b")]));
        assert_eq!(deleted(&r), ["ns/a:p=10.0.0.1:53", "ns/b:p=10.0.1.1:80"]);
        assert!(r.conntrack_cleanup_required);
        assert!(!map.contains_key(&spn("b", Protocol::Tcp)));
        assert_eq!(map[&spn("a", Protocol::Udp)].len(), 1);
    }

    #[test]
    fn endpoints_renumber_and_rename_count_as_deleted() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        t.update(
            &slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]),
            false,
        );
        t.apply(&mut map);

        t.update(
            &slice("a", "a-1", 81, Protocol::Tcp, vec![sep("10.0.0.1")]),
            false,
        );
        let r = t.apply(&mut map);
        assert_eq!(deleted(&r), ["ns/a:p=10.0.0.1:80"]);
        assert!(!r.conntrack_cleanup_required, "TCP only");

        let mut renamed = slice("a", "a-1", 81, Protocol::Tcp, vec![sep("10.0.0.1")]);
        renamed.ports[0].name = Some("q".into());
        t.update(&renamed, false);
        let r = t.apply(&mut map);
        assert_eq!(deleted(&r), ["ns/a:p=10.0.0.1:81"]);
        assert_eq!(
            map.keys().cloned().collect::<Vec<_>>(),
            [ServicePortName::new("ns", "a", "q", Protocol::Tcp)]
        );
    }

    #[test]
    fn endpoints_stopping_serving_counts_as_deleted_but_not_serving_before_does_not() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        let not_serving = SliceEndpoint {
            ready: Some(false),
            serving: Some(false),
            ..sep("10.0.0.2")
        };
        t.update(
            &slice(
                "a",
                "a-1",
                53,
                Protocol::Udp,
                vec![sep("10.0.0.1"), not_serving],
            ),
            false,
        );
        t.apply(&mut map);

        let stopped = SliceEndpoint {
            ready: Some(false),
            serving: Some(false),
            terminating: Some(true),
            ..sep("10.0.0.1")
        };
        t.update(&slice("a", "a-1", 53, Protocol::Udp, vec![stopped]), false);
        let r = t.apply(&mut map);
        assert_eq!(deleted(&r), ["ns/a:p=10.0.0.1:53"]);

        // Ready -> serving+terminating keeps serving: not deleted.
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        t.update(
            &slice("a", "a-1", 53, Protocol::Udp, vec![sep("10.0.0.1")]),
            false,
        );
        t.apply(&mut map);
        let terminating = SliceEndpoint {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true),
            ..sep("10.0.0.1")
        };
        t.update(
            &slice("a", "a-1", 53, Protocol::Udp, vec![terminating]),
            false,
        );
        let r = t.apply(&mut map);
        assert!(r.deleted_endpoints.is_empty());
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
    }

    #[test]
    fn endpoints_add_then_delete_before_sync() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        let s = slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]);
        assert!(t.update(&s, false));
        assert!(t.update(&s, true));
        let r = t.apply(&mut map);
        assert!(r.updated_services.is_empty());
        assert!(r.deleted_endpoints.is_empty());
        assert!(map.is_empty());
        // Deleting an unknown slice needs no sync.
        assert!(!t.update(&s, true));
    }

    #[test]
    fn endpoints_update_then_revert_before_sync() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        let s1 = slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]);
        t.update(&s1, false);
        t.apply(&mut map);
        let s2 = slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.2")]);
        assert!(t.update(&s2, false));
        assert!(t.update(&s1, false));
        let r = t.apply(&mut map);
        assert!(r.updated_services.is_empty());
        assert!(r.deleted_endpoints.is_empty());
        assert_eq!(map[&spn("a", Protocol::Tcp)].len(), 1);
    }

    #[test]
    fn endpoints_endpoint_moves_between_slices() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        t.update(
            &slice("a", "a-1", 80, Protocol::Udp, vec![sep("10.0.0.1")]),
            false,
        );
        t.apply(&mut map);
        // Added to a-2 first, then removed from a-1: never "deleted".
        t.update(
            &slice("a", "a-2", 80, Protocol::Udp, vec![sep("10.0.0.1")]),
            false,
        );
        let r = t.apply(&mut map);
        assert!(r.updated_services.is_empty());
        t.update(&slice("a", "a-1", 80, Protocol::Udp, vec![]), false);
        let r = t.apply(&mut map);
        assert!(r.deleted_endpoints.is_empty());
        assert_eq!(map[&spn("a", Protocol::Udp)].len(), 1);
    }

    #[test]
    fn endpoints_trigger_times() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut map = EndpointsMap::new();
        let mut s1 = slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]);
        s1.last_change_trigger_time = Some("2024-01-01T00:00:01Z".into());
        let mut s2 = slice("a", "a-2", 80, Protocol::Tcp, vec![sep("10.0.0.2")]);
        s2.last_change_trigger_time = Some("2024-01-01T00:00:02Z".into());
        let mut b = slice("b", "b-1", 80, Protocol::Tcp, vec![sep("10.0.0.3")]);
        b.last_change_trigger_time = Some("2024-01-01T00:00:03Z".into());
        t.update(&s1, false);
        t.update(&s2, false);
        t.update(&b, false);
        // An update that changes nothing does not record its trigger time.
        let mut unchanged = s1.clone();
        unchanged.last_change_trigger_time = Some("2024-01-01T00:00:09Z".into());
        assert!(!t.update(&unchanged, false));

        let r = t.apply(&mut map);
        assert_eq!(
            r.last_change_trigger_times,
            BTreeMap::from([
                (
                    nn("a"),
                    vec![
                        "2024-01-01T00:00:01Z".to_string(),
                        "2024-01-01T00:00:02Z".to_string()
                    ]
                ),
                (nn("b"), vec!["2024-01-01T00:00:03Z".to_string()]),
            ])
        );
        // Consumed by apply.
        assert!(t.apply(&mut map).last_change_trigger_times.is_empty());

        // A deletion drops the service's pending trigger times.
        let mut s3 = slice("a", "a-3", 80, Protocol::Tcp, vec![sep("10.0.0.4")]);
        s3.last_change_trigger_time = Some("2024-01-01T00:00:04Z".into());
        t.update(&s3, false);
        t.update(&s1, true);
        let r = t.apply(&mut map);
        assert!(r.last_change_trigger_times.is_empty());
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
    }

    #[test]
    fn endpoints_blank_trigger_time_ignored() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "n");
        let mut s = slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]);
        s.last_change_trigger_time = Some(" ".into());
        assert!(t.update(&s, false));
        let r = t.apply(&mut EndpointsMap::new());
        assert!(r.last_change_trigger_times.is_empty());
        assert_eq!(r.updated_services, BTreeSet::from([nn("a")]));
    }

    #[test]
    fn endpoints_other_family_slices_ignored() {
        let mut t = EndpointsChangeTracker::new(IpFamily::V6, "n");
        assert!(!t.update(
            &slice("a", "a-1", 80, Protocol::Tcp, vec![sep("10.0.0.1")]),
            false
        ));
        assert_eq!(t.pending(), 0);
        assert_eq!(t.cache().family(), IpFamily::V6);
    }

    #[test]
    fn health_check_local_ready_goes_to_zero_when_terminating() {
        // TestHealthCheckNodePortWhenTerminating.
        let mut t = EndpointsChangeTracker::new(IpFamily::V4, "node1");
        let mut map = EndpointsMap::new();
        let local = |addr: &str, terminating: bool| SliceEndpoint {
            node_name: Some("node1".into()),
            ready: Some(!terminating),
            serving: Some(true),
            terminating: Some(terminating),
            ..sep(addr)
        };
        t.update(
            &slice(
                "a",
                "a-1",
                80,
                Protocol::Tcp,
                vec![local("10.0.0.1", false), sep("10.0.0.2")],
            ),
            false,
        );
        t.apply(&mut map);
        assert_eq!(local_ready_endpoints(&map).get(&nn("a")), Some(&1));

        t.update(
            &slice(
                "a",
                "a-1",
                80,
                Protocol::Tcp,
                vec![local("10.0.0.1", true), sep("10.0.0.2")],
            ),
            false,
        );
        t.apply(&mut map);
        assert_eq!(
            local_ready_endpoints(&map)
                .get(&nn("a"))
                .copied()
                .unwrap_or(0),
            0
        );
    }

    /// A batch that at least doubles a map is applied, then the map is
    /// rebuilt in one piece: what it holds, and what later batches do to
    /// it, are as if it had not been.
    #[test]
    fn a_large_batch_is_applied_whole_then_changed_as_usual() {
        const N: usize = 2_500;
        let mut services = ServiceChangeTracker::new(IpFamily::V4);
        let mut endpoints = EndpointsChangeTracker::new(IpFamily::V4, "node1");
        let ip = |i: usize| format!("10.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256);
        for i in (0..N).rev() {
            let name = format!("s{i:05}");
            services.update(None, Some(&svc(&name, &ip(i), 80)));
            let eps = vec![sep(&ip(100_000 + i))];
            endpoints.update(
                &slice(&name, &format!("{name}-1"), 8080, Protocol::Tcp, eps),
                false,
            );
        }
        let (mut ports, mut eps) = (ServicePortMap::new(), EndpointsMap::new());
        assert_eq!(services.apply(&mut ports).updated_services.len(), N);
        assert_eq!(endpoints.apply(&mut eps).updated_services.len(), N);
        assert_eq!((ports.len(), eps.len()), (N, N));
        assert!(ports.keys().zip(ports.keys().skip(1)).all(|(a, b)| a < b));
        assert_eq!(
            eps[&spn("s01234", Protocol::Tcp)][0].ip.to_string(),
            ip(101_234)
        );
        // Then one Service and one slice change, and one of each goes.
        services.update(None, Some(&svc("s00007", "10.9.9.9", 81)));
        services.update(Some(&svc("s00008", &ip(8), 80)), None);
        let moved = vec![sep("10.250.0.1")];
        endpoints.update(
            &slice("s00009", "s00009-1", 8080, Protocol::Tcp, moved),
            false,
        );
        endpoints.update(
            &slice("s00010", "s00010-1", 8080, Protocol::Tcp, vec![]),
            true,
        );
        services.apply(&mut ports);
        let r = endpoints.apply(&mut eps);
        assert_eq!(ports.len(), N - 1);
        assert_eq!(ports[&spn("s00007", Protocol::Tcp)].port, 81);
        assert_eq!(eps.len(), N - 1);
        assert_eq!(
            eps[&spn("s00009", Protocol::Tcp)][0].ip.to_string(),
            "10.250.0.1"
        );
        assert_eq!(r.updated_services.len(), 2);
        assert_eq!(endpoints.cache().services().count(), N - 1);
    }

    #[test]
    fn only_a_batch_that_at_least_doubles_a_map_rebuilds_it() {
        assert!(crate::worth_compacting(30_000, 0));
        assert!(crate::worth_compacting(30_000, 30_000));
        assert!(!crate::worth_compacting(29_999, 30_000));
        // Small maps are left as they are.
        assert!(!crate::worth_compacting(999, 0));
        let mut m: BTreeMap<u32, u32> = (0..5_000).map(|i| (i, i * 2)).collect();
        m.insert(7, 1);
        let before: Vec<(u32, u32)> = m.clone().into_iter().collect();
        crate::compact(&mut m);
        assert_eq!(m.into_iter().collect::<Vec<_>>(), before);
    }

    #[test]
    fn take_service_only_touches_that_service() {
        let mut map: BTreeMap<ServicePortName, u8> = BTreeMap::new();
        map.insert(ServicePortName::new("ns", "a", "", Protocol::Sctp), 1);
        map.insert(ServicePortName::new("ns", "a", "x", Protocol::Tcp), 2);
        map.insert(ServicePortName::new("ns", "ab", "", Protocol::Tcp), 3);
        map.insert(ServicePortName::new("ns", "", "z", Protocol::Udp), 4);
        map.insert(ServicePortName::new("n", "a", "", Protocol::Tcp), 5);
        let taken = take_service(&mut map, &nn("a"));
        assert_eq!(taken.values().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            map.values().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([3, 4, 5])
        );
    }

    #[test]
    fn the_first_apply_builds_what_applying_change_by_change_builds() {
        // The same events into two pairs of trackers: one applies them to
        // an empty map (the first sync's path), the other to a map that
        // holds another service (one change at a time), which is then
        // taken out again.
        let (mut st_a, mut st_b) = (
            ServiceChangeTracker::new(IpFamily::V4),
            ServiceChangeTracker::new(IpFamily::V4),
        );
        let (mut et_a, mut et_b) = (
            EndpointsChangeTracker::new(IpFamily::V4, "node1"),
            EndpointsChangeTracker::new(IpFamily::V4, "node1"),
        );
        for i in 0..1_500 {
            let name = format!("s{i:04}");
            let s = svc(
                &name,
                &format!("172.30.{}.{}", i / 200, i % 200 + 1),
                80 + i % 3,
            );
            let protocol = if i % 7 == 0 {
                Protocol::Udp
            } else {
                Protocol::Tcp
            };
            let mut sl = slice(
                &name,
                &format!("{name}-1"),
                8080,
                protocol,
                // Some without endpoints, one address twice.
                (0..i % 4)
                    .map(|k| sep(&format!("10.1.{}.{}", i / 200, k % 3 + 1)))
                    .collect(),
            );
            if i % 11 == 0 {
                sl.last_change_trigger_time = Some(format!("2026-12-05T17:00:{:02}Z", i % 60));
            }
            for (st, et) in [(&mut st_a, &mut et_a), (&mut st_b, &mut et_b)] {
                st.update(None, Some(&s));
                et.update(&sl, false);
                if i % 13 == 0 {
                    // Gone again before the sync.
                    st.update(Some(&s), None);
                    et.update(&sl, true);
                }
            }
        }
        let other = spn("zz-other", Protocol::Tcp);
        let (mut sm_a, mut sm_b) = (ServicePortMap::new(), ServicePortMap::new());
        let mut t = ServiceChangeTracker::new(IpFamily::V4);
        t.update(None, Some(&svc("zz-other", "172.30.99.1", 80)));
        t.apply(&mut sm_b);
        assert!(sm_b.contains_key(&other));
        let (ra, rb) = (st_a.apply(&mut sm_a), st_b.apply(&mut sm_b));
        sm_b.remove(&other);
        assert_eq!(ra, rb);
        assert_eq!(sm_a, sm_b);
        assert!(
            ra.updated_services.len() > 1_000,
            "{}",
            ra.updated_services.len()
        );

        let (mut em_a, mut em_b) = (EndpointsMap::new(), EndpointsMap::new());
        em_b.insert(other.clone(), Arc::from(Vec::new()));
        let (ra, rb) = (et_a.apply(&mut em_a), et_b.apply(&mut em_b));
        em_b.remove(&other);
        assert_eq!(ra, rb);
        assert_eq!(em_a, em_b);
        assert!(ra.conntrack_cleanup_required);
        assert!(!ra.last_change_trigger_times.is_empty());
        assert!(em_a.len() > 1_000, "{}", em_a.len());
        // And both go on the same from there.
        let gone = slice(
            "s0001",
            "s0001-1",
            8080,
            Protocol::Tcp,
            vec![sep("10.1.0.2")],
        );
        et_a.update(&gone, true);
        et_b.update(&gone, true);
        assert_eq!(et_a.apply(&mut em_a), et_b.apply(&mut em_b));
        assert_eq!(em_a, em_b);
    }
}
