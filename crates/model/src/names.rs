//! Identifiers: protocols, namespaced names and service port names.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::ModelError;

/// An L4 protocol a Service port can use.
///
/// The derived order (`Tcp < Udp < Sctp`) is relied upon for range queries over maps
/// keyed by [`ServicePortName`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the Kubernetes default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Lower-case name as nftables spells it (`"tcp"`, `"udp"`, `"sctp"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Upper-case name as the Kubernetes API spells it (`"TCP"`, ...).
    pub fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = ModelError;

    /// Accepts the protocol name in any letter case (`"TCP"`, `"tcp"`, `"Tcp"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ModelError::UnknownProtocol {
                value: s.to_owned(),
            })
    }
}

/// A namespace, object or port name: shared text, so that the many maps
/// keyed by a service port share one copy of its names (a clone is a
/// reference count, not an allocation). It reads, compares, orders and
/// hashes as the `str` it holds.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

impl Name {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// How many hold this copy of the text.
    pub fn strong_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name(Arc::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name(Arc::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name(Arc::from(s.as_str()))
    }
}

impl From<&Name> for Name {
    fn from(s: &Name) -> Name {
        s.clone()
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A namespace-scoped object name.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: Name,
    /// The object name.
    pub name: Name,
}

impl NamespacedName {
    /// Builds a name from its parts.
    pub fn new(namespace: impl Into<Name>, name: impl Into<Name>) -> Self {
        NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Identifies one port of one Service: kube-proxy's `ServicePortName`.
///
/// Ordered by service, then port name, then protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name (`""` for an unnamed port).
    pub port: Name,
    /// The port's protocol.
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Builds a service port name from its parts.
    pub fn new(
        namespace: impl Into<Name>,
        name: impl Into<Name>,
        port: impl Into<Name>,
        protocol: Protocol,
    ) -> Self {
        ServicePortName {
            service: NamespacedName::new(namespace, name),
            port: port.into(),
            protocol,
        }
    }

    /// The smallest possible key of `service`, for range queries over ordered maps.
    pub fn first_of(service: &NamespacedName) -> Self {
        ServicePortName {
            service: service.clone(),
            port: Name::default(),
            protocol: Protocol::Tcp,
        }
    }
}

impl fmt::Display for ServicePortName {
    /// `"ns/name:port"`, or `"ns/name"` for an unnamed port (kube-proxy's `String()`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_orders_and_shares_as_its_text() {
        let a = Name::from("web");
        let b = a.clone();
        // A clone is the same text, not a copy of it.
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(a, "web");
        assert_eq!(a, String::from("web"));
        let (x, y) = (Name::from("a"), Name::from("b"));
        assert!(x < y);
        assert_eq!(format!("{a} {a:?}"), "web \"web\"");
        // Maps keyed by names are searched by text.
        let m: std::collections::BTreeMap<Name, u8> = [(a, 1)].into();
        assert_eq!(m.get("web"), Some(&1));
        let port = ServicePortName::new("default", "web", "", Protocol::Tcp);
        let copy = port.clone();
        assert!(std::ptr::eq(
            port.service.name.as_str(),
            copy.service.name.as_str()
        ));
        assert_eq!(port.to_string(), "default/web");
    }

    #[test]
    fn protocol_display_and_parse() {
        assert_eq!(Protocol::Tcp.to_string(), "tcp");
        assert_eq!(Protocol::Udp.to_string(), "udp");
        assert_eq!(Protocol::Sctp.to_string(), "sctp");
        assert_eq!(Protocol::Sctp.api_name(), "SCTP");
        assert_eq!("TCP".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("tcp".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("Udp".parse::<Protocol>().unwrap(), Protocol::Udp);
        assert_eq!("SCTP".parse::<Protocol>().unwrap(), Protocol::Sctp);
        let err = "ICMP".parse::<Protocol>().unwrap_err();
        assert!(err.to_string().contains("ICMP"), "{err}");
        assert!("".parse::<Protocol>().is_err());
    }

    #[test]
    fn protocol_order_starts_with_tcp() {
        assert!(Protocol::Tcp < Protocol::Udp && Protocol::Udp < Protocol::Sctp);
        assert_eq!(Protocol::default(), Protocol::Tcp);
    }

    #[test]
    fn names_display() {
        assert_eq!(NamespacedName::new("ns1", "svc1").to_string(), "ns1/svc1");
        assert_eq!(
            ServicePortName::new("ns1", "svc1", "p80", Protocol::Tcp).to_string(),
            "ns1/svc1:p80"
        );
        assert_eq!(
            ServicePortName::new("ns1", "svc1", "", Protocol::Udp).to_string(),
            "ns1/svc1"
        );
    }

    #[test]
    fn first_of_is_minimal_for_its_service() {
        let svc = NamespacedName::new("ns", "a");
        let first = ServicePortName::first_of(&svc);
        for port in ["", "a", "p80"] {
            for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                let k = ServicePortName {
                    service: svc.clone(),
                    port: port.into(),
                    protocol: proto,
                };
                assert!(first <= k);
            }
        }
        // ...and greater than every key of a smaller service.
        let before = ServicePortName::new("ns", "", "zzz", Protocol::Sctp);
        assert!(before < first);
    }
}
