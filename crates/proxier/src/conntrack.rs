//! Stale UDP conntrack entries, decided as kube-proxy's reconciler does
//! (reference §7.2). UDP has no connection to end: an entry DNATed to an
//! endpoint that is gone keeps sending a client's datagrams into the void
//! for as long as the client keeps talking. After a sync, every UDP entry
//! addressed to a service IP:port (or a NodePort) whose reply comes from
//! something that is not a serving endpoint of that service is stale.
//! TCP and SCTP entries are left alone: they end by themselves, and
//! deleting them would cut terminating endpoints' connections.
//!
//! Pure: the caller lists the entries and deletes what this returns.
//! [`UdpTracker`] keeps the targets per service, so that a sync looks only
//! at the services it touched.
//!
//! Beyond kube-proxy, for TCP and SCTP: a client whose first packet (a
//! SYN) reached a Service's address before its rules existed (the Service
//! was being created, or verdict was starting) has a conntrack entry that
//! was never answered and never DNATed; its retransmissions keep to that
//! entry, so they are not DNATed either, and the client is not answered
//! until the entry expires (2 minutes for a SYN). [`OpenedTracker`] tells
//! which addresses and ports of the touched services have a serving
//! endpoint for the first time; the caller deletes the entries to them
//! that were never answered nor NATed, and the next retransmission is
//! DNATed. An entry that was answered, or DNATed, is never touched.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use verdict_model::{
    EndpointsMap, NamespacedName, Protocol, ServicePort, ServicePortMap, ServicePortName,
};
use verdict_nft::conntrack::UdpEntry;

type Backends = BTreeSet<(IpAddr, u16)>;

/// Where UDP traffic of the services of one family may legitimately go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpTargets {
    /// Cluster IP, external IP or load-balancer IP and port → serving endpoints.
    by_address: BTreeMap<(IpAddr, u16), Backends>,
    /// NodePort → serving endpoints.
    by_node_port: BTreeMap<u16, Backends>,
}

impl UdpTargets {
    /// The UDP service ports of `services` and their serving endpoints
    /// (whatever the traffic policies and topology: an entry to a serving
    /// endpoint is never stale).
    pub fn of(services: &ServicePortMap, endpoints: &EndpointsMap) -> UdpTargets {
        UdpTargets::of_ports(services.iter(), endpoints)
    }

    /// The same for one service.
    pub fn of_service(
        svc: &NamespacedName,
        services: &ServicePortMap,
        endpoints: &EndpointsMap,
    ) -> UdpTargets {
        let ports = services
            .range(ServicePortName::first_of(svc)..)
            .take_while(|(name, _)| name.service == *svc);
        UdpTargets::of_ports(ports, endpoints)
    }

    fn of_ports<'a>(
        services: impl Iterator<Item = (&'a ServicePortName, &'a std::sync::Arc<ServicePort>)>,
        endpoints: &EndpointsMap,
    ) -> UdpTargets {
        let mut t = UdpTargets::default();
        for (name, sp) in services {
            if sp.protocol != Protocol::Udp {
                continue;
            }
            let serving: Backends = endpoints
                .get(name)
                .into_iter()
                .flat_map(|eps| eps.iter())
                .filter(|e| e.serving)
                .map(|e| (e.ip, e.port))
                .collect();
            let addresses = std::iter::once(sp.cluster_ip)
                .chain(sp.external_ips.iter().copied())
                .chain(sp.load_balancer_vips.iter().copied());
            for ip in addresses {
                t.by_address
                    .entry((ip, sp.port))
                    .or_default()
                    .extend(serving.iter().copied());
            }
            if let Some(np) = sp.node_port {
                t.by_node_port
                    .entry(np)
                    .or_default()
                    .extend(serving.iter().copied());
            }
        }
        t
    }

    /// How many addresses and NodePorts are checked.
    pub fn len(&self) -> usize {
        self.by_address.len() + self.by_node_port.len()
    }

    /// Whether there is no UDP service at all.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }

    /// Adds the endpoints `from` has at `key` (a key several services
    /// have gets all of theirs).
    fn add_key(&mut self, from: &UdpTargets, key: UdpKey) {
        match key {
            UdpKey::Address(k) => {
                let b = self.by_address.entry(k).or_default();
                b.extend(from.by_address.get(&k).into_iter().flatten());
            }
            UdpKey::NodePort(p) => {
                let b = self.by_node_port.entry(p).or_default();
                b.extend(from.by_node_port.get(&p).into_iter().flatten());
            }
        }
    }

    fn keys(&self) -> impl Iterator<Item = UdpKey> + '_ {
        self.by_address
            .keys()
            .map(|k| UdpKey::Address(*k))
            .chain(self.by_node_port.keys().map(|p| UdpKey::NodePort(*p)))
    }

    /// The entries to delete, each once.
    pub fn stale(&self, entries: &[UdpEntry]) -> Vec<UdpEntry> {
        let mut out = BTreeSet::new();
        for e in entries {
            let reply = (e.reply_src, e.reply_sport);
            let by_address = self
                .by_address
                .get(&(e.orig_dst, e.orig_dport))
                .is_some_and(|b| !b.contains(&reply));
            let by_node_port = self
                .by_node_port
                .get(&e.orig_dport)
                .is_some_and(|b| !b.contains(&reply));
            if by_address || by_node_port {
                out.insert(*e);
            }
        }
        out.into_iter().collect()
    }
}

/// An address and port, or a NodePort, that UDP entries are checked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum UdpKey {
    Address((IpAddr, u16)),
    NodePort(u16),
}

/// The UDP targets per service as of the last cleanup, and the services
/// touched since. After a sync, only the touched services are looked at:
/// the check covers the addresses and NodePorts they had or have, with
/// the serving endpoints of every service that shares one (two Services
/// may share an external IP and port), so nothing another service serves
/// is ever called stale.
#[derive(Clone, Debug, Default)]
pub struct UdpTracker {
    by_service: BTreeMap<NamespacedName, UdpTargets>,
    owners: BTreeMap<UdpKey, BTreeSet<NamespacedName>>,
    pending: BTreeSet<NamespacedName>,
}

/// What a cleanup must check, and what the tracker holds once it is done.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UdpCheck {
    /// The entries at these addresses and NodePorts are checked.
    pub targets: UdpTargets,
    /// Whether any entry can have gone stale: an address or NodePort of
    /// a touched service lost a serving endpoint, went away, or had none
    /// before (entries from before it had one were never DNATed). When
    /// the services only gained endpoints, nothing can be stale, and the
    /// conntrack table (a walk of all of it, 14 ms here) need not be read.
    pub cleanup: bool,
    /// The touched services' targets now.
    now: BTreeMap<NamespacedName, UdpTargets>,
}

impl UdpTracker {
    /// These services changed (added, updated or deleted).
    pub fn touched<'a>(&mut self, services: impl IntoIterator<Item = &'a NamespacedName>) {
        self.pending.extend(services.into_iter().cloned());
    }

    /// Everything may have changed (a full sync): every service with a UDP
    /// port now or at the last cleanup.
    pub fn touched_all(&mut self, services: &ServicePortMap) {
        let udp = services
            .iter()
            .filter(|(_, sp)| sp.protocol == Protocol::Udp)
            .map(|(name, _)| name.service.clone());
        self.pending.extend(udp);
        self.pending.extend(self.by_service.keys().cloned());
    }

    /// The services touched and not yet cleaned.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// What to check for the touched services, or `None` when their UDP
    /// targets did not change (then they are done).
    pub fn check(
        &mut self,
        services: &ServicePortMap,
        endpoints: &EndpointsMap,
    ) -> Option<UdpCheck> {
        let mut now = BTreeMap::new();
        let mut keys = BTreeSet::new();
        let mut cleanup = false;
        for svc in &self.pending {
            let t = UdpTargets::of_service(svc, services, endpoints);
            let before = self.by_service.get(svc);
            if before.is_none_or(|b| *b != t) && !(before.is_none() && t.is_empty()) {
                let empty = UdpTargets::default();
                cleanup |= lost(before.unwrap_or(&empty), &t);
                keys.extend(t.keys());
                keys.extend(before.into_iter().flat_map(UdpTargets::keys));
                now.insert(svc.clone(), t);
            }
        }
        if now.is_empty() {
            self.pending.clear();
            return None;
        }
        // Every key gets the serving endpoints of every service that has it
        // now: the touched ones as they are, the others as last cleaned.
        let empty = UdpTargets::default();
        let mut targets = UdpTargets::default();
        for key in &keys {
            // Present even with no endpoints at all: then every entry there
            // is stale.
            targets.add_key(&empty, *key);
            for owner in self.owners.get(key).into_iter().flatten() {
                if !now.contains_key(owner)
                    && let Some(t) = self.by_service.get(owner)
                {
                    targets.add_key(t, *key);
                }
            }
        }
        for t in now.values() {
            for key in t.keys() {
                targets.add_key(t, key);
            }
        }
        Some(UdpCheck {
            targets,
            cleanup,
            now,
        })
    }

    /// The cleanup of `check` succeeded: its services are done.
    pub fn done(&mut self, check: UdpCheck) {
        for (svc, t) in check.now {
            if let Some(before) = self.by_service.remove(&svc) {
                for key in before.keys() {
                    if let Some(o) = self.owners.get_mut(&key) {
                        o.remove(&svc);
                        if o.is_empty() {
                            self.owners.remove(&key);
                        }
                    }
                }
            }
            if !t.is_empty() {
                for key in t.keys() {
                    self.owners.entry(key).or_default().insert(svc.clone());
                }
                self.by_service.insert(svc, t);
            }
        }
        self.pending.clear();
    }
}

/// Whether going from `before` to `now` can leave a stale entry: a key
/// lost a serving endpoint or went away, or is new or had none.
fn lost(before: &UdpTargets, now: &UdpTargets) -> bool {
    let grew = |old: Option<&Backends>, new: Option<&Backends>| match (old, new) {
        (Some(o), Some(n)) => !o.is_empty() && o.is_subset(n),
        _ => false,
    };
    let keys: BTreeSet<UdpKey> = before.keys().chain(now.keys()).collect();
    keys.into_iter().any(|k| match k {
        UdpKey::Address(a) => !grew(before.by_address.get(&a), now.by_address.get(&a)),
        UdpKey::NodePort(p) => !grew(before.by_node_port.get(&p), now.by_node_port.get(&p)),
    })
}

/// A TCP or SCTP destination of a service port: an address (cluster IP,
/// external IP or load-balancer IP), a port and the protocol.
pub type Destination = (IpAddr, u16, Protocol);

/// The TCP and SCTP destinations with a serving endpoint, per service, as
/// of the last sync; and the services touched since.
#[derive(Clone, Debug, Default)]
pub struct OpenedTracker {
    /// Each service's served destinations, sorted: a boxed slice, since a
    /// service has one or two and every service has an entry (a set per
    /// service took about 300 bytes each, 9 MB at 30,000 Services).
    served: HashMap<NamespacedName, Box<[Destination]>>,
    /// How many services of `served` serve each destination.
    serving: HashMap<Destination, u32>,
    pending: BTreeSet<NamespacedName>,
}

impl OpenedTracker {
    /// These services changed.
    pub fn touched<'a>(&mut self, services: impl IntoIterator<Item = &'a NamespacedName>) {
        self.pending.extend(services.into_iter().cloned());
    }

    /// Everything may have changed (a full sync): every service now, and
    /// every one known.
    pub fn touched_all(&mut self, services: &ServicePortMap) {
        self.pending
            .extend(services.keys().map(|name| name.service.clone()));
        self.pending.extend(self.served.keys().cloned());
    }

    /// The destinations of the touched services that have a serving
    /// endpoint now and had none at the last call (a destination another
    /// service served already does not count); the touched services are
    /// then done. O(the touched services' ports).
    pub fn opened(
        &mut self,
        services: &ServicePortMap,
        endpoints: &EndpointsMap,
    ) -> BTreeSet<Destination> {
        let pending = std::mem::take(&mut self.pending);
        // What the touched services served is taken out first: `serving`
        // then counts the other services alone.
        let mut was = Vec::with_capacity(pending.len());
        for svc in &pending {
            let before: Box<[Destination]> = self.served.remove(svc).unwrap_or_default();
            for d in &before {
                if let Some(n) = self.serving.get_mut(d) {
                    *n -= 1;
                    if *n == 0 {
                        self.serving.remove(d);
                    }
                }
            }
            was.push(before);
        }
        let mut opened = BTreeSet::new();
        let mut now_served = Vec::with_capacity(pending.len());
        for (svc, before) in pending.into_iter().zip(was) {
            let now = served_destinations(&svc, services, endpoints);
            // A destination another service serves (two Services on one
            // external IP and port) was answered all along.
            opened.extend(
                now.iter()
                    .filter(|d| before.binary_search(d).is_err())
                    .filter(|d| !self.serving.contains_key(*d))
                    .copied(),
            );
            now_served.push((svc, now));
        }
        for (svc, now) in now_served {
            for d in &now {
                *self.serving.entry(*d).or_default() += 1;
            }
            if !now.is_empty() {
                // In order: a BTreeSet iterates sorted.
                self.served.insert(svc, now.into_iter().collect());
            }
        }
        opened
    }
}

/// The TCP and SCTP destinations of `svc` that have a serving endpoint.
fn served_destinations(
    svc: &NamespacedName,
    services: &ServicePortMap,
    endpoints: &EndpointsMap,
) -> BTreeSet<Destination> {
    let mut out = BTreeSet::new();
    let ports = services
        .range(ServicePortName::first_of(svc)..)
        .take_while(|(name, _)| name.service == *svc);
    for (name, sp) in ports {
        if sp.protocol == Protocol::Udp {
            continue;
        }
        let serving = endpoints
            .get(name)
            .is_some_and(|eps| eps.iter().any(|e| e.serving));
        if !serving {
            continue;
        }
        let addresses = std::iter::once(sp.cluster_ip)
            .chain(sp.external_ips.iter().copied())
            .chain(sp.load_balancer_vips.iter().copied());
        out.extend(addresses.map(|ip| (ip, sp.port, sp.protocol)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_model::Endpoint;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entry(dst: &str, dport: u16, src: &str, sport: u16) -> UdpEntry {
        UdpEntry {
            orig_dst: ip(dst),
            orig_dport: dport,
            reply_src: ip(src),
            reply_sport: sport,
        }
    }

    fn cluster(protocol: Protocol, endpoints: &[(&str, bool)]) -> (ServicePortMap, EndpointsMap) {
        let name = ServicePortName::new("ns", "dns", "dns", protocol);
        let sp = ServicePort {
            name: name.clone(),
            cluster_ip: ip("172.30.0.10"),
            port: 53,
            protocol,
            node_port: Some(30053),
            external_ips: vec![ip("192.0.2.10")],
            load_balancer_vips: vec![],
            load_balancer_source_ranges: vec![],
            source_ranges_restrict: false,
            session_affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            traffic_distribution: None,
            counting: verdict_model::Counting::None,
        };
        let eps = endpoints
            .iter()
            .map(|(a, serving)| Endpoint {
                serving: *serving,
                ready: *serving,
                ..Endpoint::new(ip(a), 5353)
            })
            .collect();
        (
            BTreeMap::from([(name.clone(), std::sync::Arc::new(sp))]),
            BTreeMap::from([(name, eps)]),
        )
    }

    #[test]
    fn entries_to_gone_endpoints_are_stale() {
        let (s, e) = cluster(
            Protocol::Udp,
            &[("10.180.0.1", true), ("10.180.0.2", false)],
        );
        let t = UdpTargets::of(&s, &e);
        let entries = [
            entry("172.30.0.10", 53, "10.180.0.1", 5353), // serving: kept
            entry("172.30.0.10", 53, "10.180.0.2", 5353), // not serving
            entry("172.30.0.10", 53, "10.180.0.9", 5353), // gone
            entry("172.30.0.10", 53, "172.30.0.10", 53),  // never DNATed
            entry("192.0.2.10", 53, "10.180.0.9", 5353),  // external IP
            entry("192.168.0.2", 30053, "10.180.0.9", 5353), // NodePort
            entry("192.168.0.2", 30053, "10.180.0.1", 5353), // NodePort, serving
            entry("172.30.0.10", 54, "10.180.0.9", 5353), // another port: not ours
            entry("8.8.8.8", 53, "8.8.8.8", 53),          // not a service
        ];
        let stale = t.stale(&entries);
        assert_eq!(
            stale,
            vec![
                entry("172.30.0.10", 53, "10.180.0.2", 5353),
                entry("172.30.0.10", 53, "10.180.0.9", 5353),
                entry("172.30.0.10", 53, "172.30.0.10", 53),
                entry("192.0.2.10", 53, "10.180.0.9", 5353),
                entry("192.168.0.2", 30053, "10.180.0.9", 5353),
            ]
        );
    }

    #[test]
    fn scale_to_zero_and_deleted_services_clear_everything() {
        let (s, e) = cluster(Protocol::Udp, &[]);
        let zero = UdpTargets::of(&s, &e);
        let entries = [entry("172.30.0.10", 53, "10.180.0.1", 5353)];
        assert_eq!(zero.stale(&entries).len(), 1, "no serving endpoint left");

        let (s, e) = cluster(Protocol::Udp, &[("10.180.0.1", true)]);
        let before = UdpTargets::of(&s, &e);
        assert!(before.stale(&entries).is_empty());
        let after = UdpTargets::of(&BTreeMap::new(), &BTreeMap::new());
        assert!(
            after.stale(&entries).is_empty(),
            "unknown address: not ours"
        );
    }

    #[test]
    fn tcp_services_are_left_alone() {
        let (s, e) = cluster(Protocol::Tcp, &[]);
        let t = UdpTargets::of(&s, &e);
        assert!(t.is_empty());
        assert!(
            t.stale(&[entry("172.30.0.10", 53, "10.180.0.1", 5353)])
                .is_empty()
        );
    }

    /// `n` UDP services `svc{i}` on 172.30.1.i:53 with one endpoint each;
    /// svc0 and svc1 also share the external IP 192.0.2.10:53.
    fn many(n: usize) -> (ServicePortMap, EndpointsMap) {
        let mut services = ServicePortMap::new();
        let mut endpoints = EndpointsMap::new();
        for i in 0..n {
            let (s, e) = cluster(Protocol::Udp, &[(&format!("10.180.1.{i}"), true)]);
            let (_, sp) = s.into_iter().next().unwrap();
            let mut sp = std::sync::Arc::unwrap_or_clone(sp);
            let eps = e.into_values().next().unwrap();
            let name = ServicePortName::new("ns", format!("svc{i}"), "dns", Protocol::Udp);
            sp.name = name.clone();
            sp.cluster_ip = ip(&format!("172.30.1.{i}"));
            sp.node_port = None;
            if i >= 2 {
                sp.external_ips.clear();
            }
            services.insert(name.clone(), std::sync::Arc::new(sp));
            endpoints.insert(name, eps);
        }
        (services, endpoints)
    }

    fn svc(i: usize) -> NamespacedName {
        NamespacedName::new("ns", format!("svc{i}"))
    }

    #[test]
    fn the_tracker_checks_only_the_touched_services() {
        let (s, mut e) = many(200);
        let mut t = UdpTracker::default();
        t.touched_all(&s);
        let all = t.check(&s, &e).unwrap();
        assert_eq!(
            all.targets,
            UdpTargets::of(&s, &e),
            "a full sync checks everything"
        );
        t.done(all);
        t.touched_all(&s);
        assert!(t.check(&s, &e).is_none(), "nothing changed since");

        // svc7's endpoint moves: only its address is checked.
        let name = ServicePortName::new("ns", "svc7", "dns", Protocol::Udp);
        e.insert(
            name,
            vec![Endpoint {
                serving: true,
                ready: true,
                ..Endpoint::new(ip("10.180.2.7"), 5353)
            }]
            .into(),
        );
        t.touched([&svc(7), &svc(8)]);
        let c = t.check(&s, &e).unwrap();
        assert_eq!(c.targets.len(), 1, "{:?}", c.targets);
        let entries = [
            entry("172.30.1.7", 53, "10.180.1.7", 5353), // the old endpoint
            entry("172.30.1.7", 53, "10.180.2.7", 5353), // the new one
            entry("172.30.1.8", 53, "10.180.9.9", 5353), // svc8: not touched in effect
        ];
        assert_eq!(c.targets.stale(&entries), [entries[0]]);
        // Not done (the cleanup failed): asked again at the next sync.
        t.touched([]);
        assert_eq!(t.check(&s, &e).map(|c| c.targets.len()), Some(1));
    }

    #[test]
    fn a_service_that_only_gains_endpoints_needs_no_cleanup() {
        let (s, mut e) = many(3);
        let mut t = UdpTracker::default();
        t.touched_all(&s);
        let c = t.check(&s, &e).unwrap();
        assert!(c.cleanup, "new services: entries from before may exist");
        t.done(c);
        let name = ServicePortName::new("ns", "svc2", "dns", Protocol::Udp);
        let serving = |a: &str| Endpoint {
            serving: true,
            ready: true,
            ..Endpoint::new(ip(a), 5353)
        };
        // A second endpoint: nothing can be stale.
        e.insert(
            name.clone(),
            vec![serving("10.180.1.2"), serving("10.180.2.2")].into(),
        );
        t.touched([&svc(2)]);
        let c = t.check(&s, &e).unwrap();
        assert!(!c.cleanup);
        t.done(c);
        // One of them goes: entries to it are.
        e.insert(name.clone(), vec![serving("10.180.2.2")].into());
        t.touched([&svc(2)]);
        let c = t.check(&s, &e).unwrap();
        assert!(c.cleanup);
        t.done(c);
        // From none to one: entries made while it had none were never
        // DNATed.
        e.insert(name.clone(), vec![].into());
        t.touched([&svc(2)]);
        let c = t.check(&s, &e).unwrap();
        assert!(c.cleanup);
        t.done(c);
        e.insert(name, vec![serving("10.180.2.2")].into());
        t.touched([&svc(2)]);
        assert!(t.check(&s, &e).unwrap().cleanup);
    }

    #[test]
    fn a_shared_address_keeps_the_other_services_endpoints() {
        let (mut s, e) = many(3);
        let mut t = UdpTracker::default();
        t.touched_all(&s);
        let c = t.check(&s, &e).unwrap();
        t.done(c);
        // svc0 is deleted: its addresses are checked; the external IP it
        // shared with svc1 keeps svc1's endpoint.
        s.remove(&ServicePortName::new("ns", "svc0", "dns", Protocol::Udp));
        t.touched([&svc(0)]);
        let c = t.check(&s, &e).unwrap();
        let entries = [
            entry("172.30.1.0", 53, "10.180.1.0", 5353),
            entry("192.0.2.10", 53, "10.180.1.0", 5353),
            entry("192.0.2.10", 53, "10.180.1.1", 5353),
        ];
        assert_eq!(c.targets.stale(&entries), [entries[0], entries[1]]);
        t.done(c);
        // And it is forgotten: svc1 alone owns the external IP now.
        t.touched([&svc(1)]);
        assert!(t.check(&s, &e).is_none());
    }

    #[test]
    fn a_tcp_destination_is_opened_when_it_first_has_a_serving_endpoint() {
        let svc = NamespacedName::new("ns", "dns");
        let mut t = OpenedTracker::default();
        // Created without endpoints: nothing is served yet.
        let (services, endpoints) = cluster(Protocol::Tcp, &[]);
        t.touched([&svc]);
        assert!(t.opened(&services, &endpoints).is_empty());
        // Its first serving endpoint: the cluster IP and the external IP.
        let (services, endpoints) = cluster(Protocol::Tcp, &[("10.1.0.1", true)]);
        t.touched([&svc]);
        assert_eq!(
            t.opened(&services, &endpoints),
            BTreeSet::from([
                (ip("172.30.0.10"), 53, Protocol::Tcp),
                (ip("192.0.2.10"), 53, Protocol::Tcp)
            ])
        );
        // More endpoints: nothing new.
        let (services, endpoints) =
            cluster(Protocol::Tcp, &[("10.1.0.1", true), ("10.1.0.2", true)]);
        t.touched([&svc]);
        assert!(t.opened(&services, &endpoints).is_empty());
        // None serving, then one again: opened again.
        let (services, endpoints) = cluster(Protocol::Tcp, &[("10.1.0.1", false)]);
        t.touched([&svc]);
        assert!(t.opened(&services, &endpoints).is_empty());
        let (services, endpoints) = cluster(Protocol::Tcp, &[("10.1.0.3", true)]);
        t.touched([&svc]);
        assert_eq!(t.opened(&services, &endpoints).len(), 2);
        // Untouched: not looked at.
        assert!(t.opened(&services, &endpoints).is_empty());
    }

    #[test]
    fn a_destination_another_service_serves_is_not_opened() {
        let (services, endpoints) = cluster(Protocol::Tcp, &[("10.1.0.1", true)]);
        let mut t = OpenedTracker::default();
        t.touched_all(&services);
        assert_eq!(t.opened(&services, &endpoints).len(), 2);
        // A second Service on the same external IP and port: only its
        // own cluster IP is new; the external IP was answered all along.
        let mut services = services;
        let mut endpoints = endpoints;
        let other = ServicePortName::new("ns", "dns-2", "dns", Protocol::Tcp);
        let mut sp = services.values().next().map(|sp| (**sp).clone()).unwrap();
        sp.cluster_ip = ip("172.30.0.11");
        sp.name = other.clone();
        services.insert(other.clone(), std::sync::Arc::new(sp));
        let eps = endpoints.values().next().cloned().unwrap();
        endpoints.insert(other.clone(), eps);
        t.touched([&other.service]);
        assert_eq!(
            t.opened(&services, &endpoints),
            BTreeSet::from([(ip("172.30.0.11"), 53, Protocol::Tcp)])
        );
        // Both touched at once, the first losing its endpoints: the
        // external IP is still served by the other, never opened again.
        endpoints.remove(&other);
        t.touched([&other.service, &NamespacedName::new("ns", "dns")]);
        assert!(t.opened(&services, &endpoints).is_empty());
    }

    /// A full sync looks at every service once: 20,000 services (40,000
    /// destinations) take milliseconds, where comparing each opened
    /// destination with every service took minutes (at 30,000 the run
    /// loop was busy for 2 minutes after each full sync).
    #[test]
    fn a_full_pass_is_linear_in_the_services() {
        let (mut services, mut endpoints) = cluster(Protocol::Tcp, &[("10.1.0.1", true)]);
        let (name, sp) = services
            .iter()
            .next()
            .map(|(n, s)| (n.clone(), s.clone()))
            .unwrap();
        let eps = endpoints[&name].clone();
        for i in 0..20_000u32 {
            let n = ServicePortName::new("ns", format!("s{i}"), "dns", Protocol::Tcp);
            let mut s = (*sp).clone();
            s.cluster_ip = IpAddr::from(std::net::Ipv4Addr::from(0xac1f_0000 + i));
            s.name = n.clone();
            services.insert(n.clone(), std::sync::Arc::new(s));
            endpoints.insert(n, eps.clone());
        }
        let mut t = OpenedTracker::default();
        let started = std::time::Instant::now();
        t.touched_all(&services);
        // Every cluster IP, and the external IP they share once.
        assert_eq!(t.opened(&services, &endpoints).len(), 20_002);
        t.touched_all(&services);
        assert!(t.opened(&services, &endpoints).is_empty());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn udp_is_left_to_the_udp_cleanup_and_sctp_is_opened_too() {
        let svc = NamespacedName::new("ns", "dns");
        let (services, endpoints) = cluster(Protocol::Udp, &[("10.1.0.1", true)]);
        let mut t = OpenedTracker::default();
        t.touched_all(&services);
        assert!(t.opened(&services, &endpoints).is_empty());
        let (services, endpoints) = cluster(Protocol::Sctp, &[("10.1.0.1", true)]);
        t.touched([&svc]);
        assert_eq!(t.opened(&services, &endpoints).len(), 2);
    }
}
