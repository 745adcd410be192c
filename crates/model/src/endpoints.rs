//! Endpoints of service ports, their canonical order and the endpoints map.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::names::{Name, NamespacedName, ServicePortName};

/// All endpoints currently known, per service port. Each list is sorted by the
/// endpoint's Display string and has no two entries with the same IP:port; ports
/// without endpoints have no entry. A list is shared, never changed in place:
/// a change replaces it, so a reader may keep the one it has.
pub type EndpointsMap = BTreeMap<ServicePortName, Arc<[Endpoint]>>;

/// An endpoint's topology hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hints {
    /// `hints.forZones`, `None` when there are none.
    pub zones: Option<BTreeSet<String>>,
    /// `hints.forNodes`, `None` when there are none.
    pub nodes: Option<BTreeSet<String>>,
}

impl Hints {
    /// The hints, or `None` when there are none of either kind.
    pub fn of(
        zones: Option<BTreeSet<String>>,
        nodes: Option<BTreeSet<String>>,
    ) -> Option<Arc<Hints>> {
        (zones.is_some() || nodes.is_some()).then(|| Arc::new(Hints { zones, nodes }))
    }
}

/// One backend (IP:port) of a service port, with the conditions and topology facts
/// the proxy needs.
///
/// The derived `Ord` compares fields in order; kube-proxy's canonical order is by the
/// Display string instead, see [`cmp_by_display`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// The address (first address of the slice endpoint).
    pub ip: IpAddr,
    /// The target port.
    pub port: u16,
    /// Whether the endpoint's `nodeName` is this node.
    pub is_local: bool,
    /// `conditions.ready`, `None` counting as ready.
    pub ready: bool,
    /// `conditions.serving`, `None` counting as serving.
    pub serving: bool,
    /// `conditions.terminating`, `None` counting as not terminating.
    pub terminating: bool,
    /// `nodeName` (shared by every endpoint on that node).
    pub node_name: Option<Name>,
    /// `zone` (shared likewise).
    pub zone: Option<Name>,
    /// Topology hints, `None` when there are none: rare, so kept behind
    /// one pointer, shared by the copies of an endpoint (one per port of
    /// its slice, the cache's and the proxier's).
    pub hints: Option<Arc<Hints>>,
    /// `targetRef.name`: the pod behind the address, when the slice says.
    pub target: Option<Name>,
}

impl Endpoint {
    /// A ready, serving, non-terminating, remote endpoint without topology data.
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Endpoint {
            ip,
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            hints: None,
            target: None,
        }
    }

    /// Zone hints (`hints.forZones`), `None` when there are none.
    pub fn zone_hints(&self) -> Option<&BTreeSet<String>> {
        self.hints.as_ref()?.zones.as_ref()
    }

    /// Node hints (`hints.forNodes`), `None` when there are none.
    pub fn node_hints(&self) -> Option<&BTreeSet<String>> {
        self.hints.as_ref()?.nodes.as_ref()
    }

    /// The endpoint as a socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// Usable as a fallback while terminating (serving and terminating).
    pub fn is_serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

impl fmt::Display for Endpoint {
    /// `"10.0.0.1:80"` or `"[fd00::1]:80"` (also kube-proxy's sort key).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.socket_addr())
    }
}

/// A fixed buffer large enough for any `[IPv6]:port` text, to compare Display strings
/// without allocating.
struct DisplayBuf {
    buf: [u8; 64],
    len: usize,
}

impl DisplayBuf {
    fn of(ep: &Endpoint) -> Option<DisplayBuf> {
        let mut b = DisplayBuf {
            buf: [0; 64],
            len: 0,
        };
        if let IpAddr::V4(ip) = ep.ip {
            // Display's text, written without the formatting machinery:
            // a cold start compares the texts of every Service's endpoints
            // (60,000 at 30,000 Services).
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    b.push(b'.');
                }
                b.push_decimal(u32::from(octet));
            }
            b.push(b':');
            b.push_decimal(u32::from(ep.port));
            return Some(b);
        }
        write!(b, "{ep}").ok()?;
        Some(b)
    }

    fn push(&mut self, c: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = c;
            self.len += 1;
        }
    }

    fn push_decimal(&mut self, mut n: u32) {
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for d in &digits[at..] {
            self.push(*d);
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Write for DisplayBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Compares two endpoints by their Display strings (string order, so
/// `"10.244.0.10:9898" < "10.244.0.8:9898"`), kube-proxy's canonical endpoint order.
pub fn cmp_by_display(a: &Endpoint, b: &Endpoint) -> Ordering {
    match (DisplayBuf::of(a), DisplayBuf::of(b)) {
        (Some(x), Some(y)) => x.bytes().cmp(y.bytes()),
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// Sorts endpoints by their Display strings (stable).
pub fn sort_endpoints(endpoints: &mut [Endpoint]) {
    if !endpoints.is_sorted_by(|a, b| cmp_by_display(a, b) != Ordering::Greater) {
        // Each endpoint's text once, not twice per comparison: a service of
        // 5,000 endpoints sorted 130,000 texts.
        endpoints.sort_by_cached_key(ToString::to_string);
    }
}

/// Local endpoints that are ready (for health-check node ports): count per service.
///
/// Like kube-proxy's `LocalReadyEndpoints`, distinct IPs are counted across all
/// ports of the service, and services with no local ready endpoint are absent.
pub fn local_ready_endpoints(map: &EndpointsMap) -> BTreeMap<NamespacedName, usize> {
    let mut ips: BTreeMap<&NamespacedName, BTreeSet<IpAddr>> = BTreeMap::new();
    for (name, endpoints) in map {
        for ep in endpoints.iter().filter(|ep| ep.is_local && ep.ready) {
            ips.entry(&name.service).or_default().insert(ep.ip);
        }
    }
    ips.into_iter()
        .map(|(svc, ips)| (svc.clone(), ips.len()))
        .collect()
}

/// [`local_ready_endpoints`] for one service: distinct local ready IPs
/// across its ports. Costs O(its ports), whatever the cluster size.
pub fn local_ready_endpoints_of(map: &EndpointsMap, service: &NamespacedName) -> usize {
    map.range(ServicePortName::first_of(service)..)
        .take_while(|(name, _)| name.service == *service)
        .flat_map(|(_, eps)| eps.iter().filter(|ep| ep.is_local && ep.ready))
        .map(|ep| ep.ip)
        .collect::<BTreeSet<IpAddr>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Protocol;

    fn ep(s: &str) -> Endpoint {
        let addr: SocketAddr = s.parse().unwrap();
        Endpoint::new(addr.ip(), addr.port())
    }

    #[test]
    fn display() {
        assert_eq!(ep("10.0.0.1:80").to_string(), "10.0.0.1:80");
        assert_eq!(ep("[fd00::1]:80").to_string(), "[fd00::1]:80");
        assert_eq!(
            ep("[fd00::1]:80").socket_addr(),
            "[fd00::1]:80".parse().unwrap()
        );
    }

    #[test]
    fn new_defaults() {
        let e = ep("10.0.0.1:80");
        assert!(e.ready && e.serving && !e.terminating && !e.is_local);
        assert!(!e.is_serving_terminating());
    }

    #[test]
    fn sort_is_by_display_string() {
        let mut eps = vec![
            ep("10.244.0.8:9898"),
            ep("10.244.0.10:9898"),
            ep("10.244.0.9:80"),
            ep("10.244.0.10:10000"),
        ];
        sort_endpoints(&mut eps);
        let got: Vec<String> = eps.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "10.244.0.10:10000",
                "10.244.0.10:9898",
                "10.244.0.8:9898",
                "10.244.0.9:80"
            ]
        );
        // Differs from the derived (numeric) order.
        assert!(ep("10.244.0.8:9898") < ep("10.244.0.10:9898"));
        assert_eq!(
            cmp_by_display(&ep("10.244.0.8:9898"), &ep("10.244.0.10:9898")),
            Ordering::Greater
        );
    }

    /// The text compared is Display's, IPv4 written by hand included.
    #[test]
    fn endpoint_texts_are_their_display() {
        for text in [
            "0.0.0.0:0",
            "1.2.3.4:5",
            "10.244.0.10:9898",
            "255.255.255.255:65535",
            "100.64.0.9:80",
            "[fd00::10]:80",
            "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535",
        ] {
            let e = ep(text);
            assert_eq!(DisplayBuf::of(&e).unwrap().bytes(), text.as_bytes());
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn cmp_by_display_handles_longest_ipv6() {
        let a = ep("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535");
        let b = ep("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535");
        assert_eq!(cmp_by_display(&a, &b), Ordering::Greater);
        assert_eq!(cmp_by_display(&a, &a), Ordering::Equal);
        let mut v = vec![ep("[fd00::2]:80"), ep("[fd00::10]:80")];
        sort_endpoints(&mut v);
        assert_eq!(v[0].to_string(), "[fd00::10]:80");
    }

    #[test]
    fn local_ready_counts_distinct_ips_per_service() {
        let svc = |port: &str| ServicePortName::new("ns", "svc", port, Protocol::Tcp);
        let local = |s: &str, ready: bool| Endpoint {
            is_local: true,
            ready,
            ..ep(s)
        };
        let mut map = EndpointsMap::new();
        map.insert(
            svc("a"),
            vec![
                local("10.0.0.1:80", true),
                local("10.0.0.2:80", false),
                ep("10.0.0.3:80"),
            ]
            .into(),
        );
        map.insert(svc("b"), vec![local("10.0.0.1:81", true)].into());
        map.insert(
            ServicePortName::new("ns", "other", "", Protocol::Tcp),
            vec![ep("10.0.0.9:80")].into(),
        );
        let counts = local_ready_endpoints(&map);
        assert_eq!(counts.get(&NamespacedName::new("ns", "svc")), Some(&1));
        assert_eq!(counts.get(&NamespacedName::new("ns", "other")), None);
        assert_eq!(counts.len(), 1);
        // The per-service form agrees, for every service.
        for (svc, want) in [("svc", 1), ("other", 0), ("absent", 0)] {
            let name = NamespacedName::new("ns", svc);
            assert_eq!(local_ready_endpoints_of(&map, &name), want, "{svc}");
        }
        map.insert(
            ServicePortName::new("ns", "svc2", "", Protocol::Tcp),
            vec![local("10.0.0.7:80", true)].into(),
        );
        assert_eq!(
            local_ready_endpoints_of(&map, &NamespacedName::new("ns", "svc")),
            1,
            "a neighbour's endpoints are not counted"
        );
    }
}
