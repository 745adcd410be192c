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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use verdict_model::{EndpointsMap, Protocol, ServicePortMap};
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
        let mut t = UdpTargets::default();
        for (name, sp) in services {
            if sp.protocol != Protocol::Udp {
                continue;
            }
            let serving: Backends = endpoints
                .get(name)
                .into_iter()
                .flatten()
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

    /// Whether there is no UDP service at all.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }

    /// Adds what `previous` served and `self` no longer does, with no
    /// endpoints: entries to a deleted service (or a removed IP or port)
    /// are stale too.
    pub fn with_removed(mut self, previous: &UdpTargets) -> UdpTargets {
        for key in previous.by_address.keys() {
            self.by_address.entry(*key).or_default();
        }
        for key in previous.by_node_port.keys() {
            self.by_node_port.entry(*key).or_default();
        }
        self
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

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_model::{Endpoint, ServicePort, ServicePortName};

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
            BTreeMap::from([(name.clone(), sp)]),
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
        assert_eq!(
            after.with_removed(&before).stale(&entries),
            entries.to_vec(),
            "the service was deleted"
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
}
