//! Identifiers: protocols, namespaced names and service port names.

use std::fmt;
use std::str::FromStr;

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

/// A namespace-scoped object name.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: String,
    /// The object name.
    pub name: String,
}

impl NamespacedName {
    /// Builds a name from its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
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
    pub port: String,
    /// The port's protocol.
    pub protocol: Protocol,
}

impl ServicePortName {
    /// Builds a service port name from its parts.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        port: impl Into<String>,
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
            port: String::new(),
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
