//! What the proxier needs to know about its node and its settings.

use std::net::IpAddr;

use ipnet::IpNet;
use verdict_model::{Counting, IpFamily, MetricsSelection};
use verdict_nft::Family;

use crate::error::ProxierError;

/// The table verdict owns in each family. We never touch anyone else's.
pub const DEFAULT_TABLE: &str = "verdict";
/// kube-proxy's default masquerade bit.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;

/// Which node addresses accept NodePort traffic (`nodePortAddresses`):
/// the node's primary addresses (`primary`), local addresses inside some
/// CIDRs, or both. Loopback addresses never do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePortAddresses {
    /// The node's primary IP of the family (`primary`, nftables mode's
    /// default).
    pub primary: bool,
    /// Every local address inside one of these CIDRs (`0.0.0.0/0` and
    /// `::/0` for `all`).
    pub cidrs: Vec<IpNet>,
}

impl Default for NodePortAddresses {
    fn default() -> Self {
        NodePortAddresses::primary()
    }
}

impl NodePortAddresses {
    /// `primary`.
    pub fn primary() -> Self {
        NodePortAddresses {
            primary: true,
            cidrs: Vec::new(),
        }
    }

    /// `all`: every local address.
    pub fn all() -> Self {
        NodePortAddresses::cidrs(vec![
            IpNet::V4(ipnet::Ipv4Net::default()),
            IpNet::V6(ipnet::Ipv6Net::default()),
        ])
    }

    /// Local addresses inside these CIDRs.
    pub fn cidrs(cidrs: Vec<IpNet>) -> Self {
        NodePortAddresses {
            primary: false,
            cidrs,
        }
    }
}

/// How traffic from local pods is recognised (`detectLocalMode`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detection: ClusterIP traffic is never masqueraded (unless
    /// masqueradeAll) and pods are treated like external clients.
    #[default]
    None,
    /// Source address inside the cluster or node pod CIDR
    /// (`ClusterCIDR` / `NodeCIDR`).
    Cidr(IpNet),
    /// Packets entering through this bridge (`BridgeInterface`).
    BridgeInterface(String),
    /// Packets entering through interfaces with this name prefix
    /// (`InterfaceNamePrefix`).
    InterfaceNamePrefix(String),
}

/// Settings of one family's proxier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxierConfig {
    /// IP family of this proxier.
    pub family: IpFamily,
    /// Our table's name.
    pub table: String,
    /// This node's name (decides which endpoints are local).
    pub node_name: String,
    /// This node's topology zone label, if any.
    pub node_zone: Option<String>,
    /// The node's primary addresses (from the Node object).
    pub node_ips: Vec<IpAddr>,
    /// Every address configured on the node's interfaces.
    pub local_ips: Vec<IpAddr>,
    /// Where NodePorts are served.
    pub node_port_addresses: NodePortAddresses,
    /// Masquerade every packet to a ClusterIP.
    pub masquerade_all: bool,
    /// Bit of the packet mark that requests masquerading.
    pub masquerade_bit: u8,
    /// Local traffic detection.
    pub local_detector: LocalDetector,
    /// Service CIDRs: ClusterIPs inside them that are not allocated are dropped.
    pub service_cidrs: Vec<IpNet>,
    /// Whether ClientIP session affinity can be programmed. Some nft
    /// versions (seen with v1.0.6) abort on the IPv6 form of the rule that
    /// records affinity (`update @affinity { 40-byte key : data }`); the
    /// daemon probes for it and, where it fails, turns affinity off for that
    /// family rather than fail every sync of the table.
    pub session_affinity: bool,
    /// Whether the kernel counts for the node: new connections sent to an
    /// endpoint, and each connection rejected or dropped, by reason, once
    /// (`--service-counters`). Off, the rules are kube-proxy's shape.
    pub counters: bool,
    /// Which Services are also counted per Service (`--service-metrics`):
    /// their entry points' connections, packets and bytes, and at the
    /// endpoint level each endpoint's. Only with [`counters`](Self::counters).
    pub metrics: MetricsSelection,
    /// The nfnetlink_log group the rules that reject or drop a new
    /// connection log it to, once per connection, for the flow stream
    /// (`--flows`); `None`: nothing is logged.
    pub flow_log_group: Option<u16>,
}

impl ProxierConfig {
    /// Defaults for a node, for one family.
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> ProxierConfig {
        ProxierConfig {
            family,
            table: DEFAULT_TABLE.to_owned(),
            node_name: node_name.into(),
            node_zone: None,
            node_ips: Vec::new(),
            local_ips: Vec::new(),
            node_port_addresses: NodePortAddresses::primary(),
            masquerade_all: false,
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            local_detector: LocalDetector::None,
            service_cidrs: Vec::new(),
            session_affinity: true,
            counters: true,
            metrics: MetricsSelection::default(),
            flow_log_group: None,
        }
    }

    /// Whether a rejected or dropped connection goes through the chains
    /// that remember it, so that it is counted and logged once: with the
    /// counters, or with the flow stream.
    pub fn ends_once(&self) -> bool {
        self.counters || self.flow_log_group.is_some()
    }

    /// The finest level any Service is counted at (none without the
    /// counters): which counting rules the table holds.
    pub fn metrics_level(&self) -> Counting {
        if self.counters {
            self.metrics.level
        } else {
            Counting::None
        }
    }

    /// The nftables family of this proxier.
    pub fn nft_family(&self) -> Family {
        match self.family {
            IpFamily::V4 => Family::Ip,
            IpFamily::V6 => Family::Ip6,
        }
    }

    /// The table this proxier programs.
    pub fn nft_table(&self) -> verdict_nft::Table {
        verdict_nft::Table::new(self.nft_family(), self.table.clone())
    }

    /// The masquerade mark value.
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit
    }

    fn of_family(&self, ip: &IpAddr) -> bool {
        IpFamily::of(*ip) == self.family
    }

    /// Checks that every setting fits this family.
    pub fn validate(&self) -> Result<(), ProxierError> {
        let bad = |field: &str, why: String| ProxierError::Config {
            field: field.to_owned(),
            reason: why,
        };
        if self.masquerade_bit > 31 {
            return Err(bad(
                "masqueradeBit",
                format!("{} is not in 0..=31", self.masquerade_bit),
            ));
        }
        if self.table.is_empty() || self.table.len() > verdict_nft::NAME_LENGTH_MAX {
            return Err(bad(
                "table",
                format!("{:?} is not a valid table name", self.table),
            ));
        }
        if let LocalDetector::Cidr(net) = &self.local_detector
            && !self.of_family(&net.addr())
        {
            return Err(bad(
                "detectLocal",
                format!("{net} is not an {} CIDR", self.family),
            ));
        }
        match &self.local_detector {
            LocalDetector::BridgeInterface(n) | LocalDetector::InterfaceNamePrefix(n)
                if n.is_empty() || n.len() > 15 || n.contains(['"', ' ', '*']) =>
            {
                return Err(bad(
                    "detectLocal",
                    format!("{n:?} is not an interface name"),
                ));
            }
            _ => {}
        }
        for n in &self.service_cidrs {
            if !self.of_family(&n.addr()) {
                return Err(bad(
                    "serviceCIDRs",
                    format!("{n} is not an {} CIDR", self.family),
                ));
            }
        }
        Ok(())
    }

    /// The node addresses that accept NodePorts, sorted.
    pub fn node_port_ips(&self) -> Vec<IpAddr> {
        let local = || {
            self.local_ips
                .iter()
                .filter(|ip| self.of_family(ip) && !ip.is_loopback())
                .copied()
        };
        let np = &self.node_port_addresses;
        let mut ips: Vec<IpAddr> = local()
            .filter(|ip| np.cidrs.iter().any(|c| c.contains(ip)))
            .collect();
        if np.primary {
            ips.extend(
                self.node_ips
                    .iter()
                    .filter(|ip| self.of_family(ip) && !ip.is_loopback()),
            );
        }
        ips.sort();
        ips.dedup();
        ips
    }

    /// This family's primary node addresses.
    pub fn primary_ips(&self) -> Vec<IpAddr> {
        self.node_ips
            .iter()
            .filter(|ip| self.of_family(ip))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ProxierConfig {
        let mut c = ProxierConfig::new(IpFamily::V4, "test-node");
        c.node_ips = vec![
            "192.168.0.2".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ];
        c.local_ips = [
            "127.0.0.1",
            "192.168.0.2",
            "192.168.1.2",
            "192.168.99.11",
            "2001:db8::1",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        c
    }

    #[test]
    fn node_port_ips_follow_node_port_addresses() {
        let mut c = cfg();
        assert_eq!(
            c.node_port_ips(),
            vec!["192.168.0.2".parse::<IpAddr>().unwrap()]
        );
        c.node_port_addresses = NodePortAddresses::cidrs(vec![
            "192.168.0.0/24".parse().unwrap(),
            "192.168.1.0/24".parse().unwrap(),
            "2001:db8::/64".parse().unwrap(),
        ]);
        assert_eq!(
            c.node_port_ips(),
            vec![
                "192.168.0.2".parse::<IpAddr>().unwrap(),
                "192.168.1.2".parse().unwrap()
            ]
        );
        c.node_port_addresses = NodePortAddresses::all();
        assert_eq!(
            c.node_port_ips().len(),
            3,
            "all local v4 addresses but loopback"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let mut c = cfg();
        c.masquerade_bit = 40;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("masqueradeBit")
        );
        let mut c = cfg();
        c.local_detector = LocalDetector::Cidr("fd00::/64".parse().unwrap());
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("detectLocal")
        );
        let mut c = cfg();
        c.local_detector = LocalDetector::InterfaceNamePrefix("veth*".into());
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.service_cidrs = vec!["fd00::/112".parse().unwrap()];
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("serviceCIDRs")
        );
        assert!(cfg().validate().is_ok());
        assert_eq!(cfg().masquerade_mark(), 0x4000);
    }
}
