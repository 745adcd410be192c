//! What the node runtime is told: the settings of a node's proxy, as the
//! binary maps them from kube-proxy's configuration.

use std::net::IpAddr;
use std::time::Duration;

use verdict_proxier::NodePortAddresses;

/// How local (pod) traffic is recognised (`detectLocalMode` and its
/// companions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetectLocal {
    /// `ClusterCIDR`: `clusterCIDR`, one per family.
    ClusterCidr(Vec<ipnet::IpNet>),
    /// `NodeCIDR`: the Node's pod CIDRs.
    NodeCidr,
    /// `BridgeInterface`.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`.
    InterfaceNamePrefix(String),
}

/// The settings of one node's proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSettings {
    /// The node's name (`hostnameOverride`, else the host name).
    pub node_name: String,
    /// `bindAddress`, when it names a real address: the node's primary IP.
    pub bind_address: Option<IpAddr>,
    /// Masquerade mark bit.
    pub masquerade_bit: u8,
    /// `masqueradeAll`.
    pub masquerade_all: bool,
    /// Least time between syncs.
    pub min_sync_period: Duration,
    /// Full resync and retry interval (and the health timeout's basis).
    pub sync_period: Duration,
    /// Local traffic detection.
    pub detect_local: DetectLocal,
    /// NodePort addresses.
    pub node_ports: NodePortAddresses,
    /// Counting in the kernel: the node's connections, rejects and drops
    /// (`--service-counters`).
    pub service_counters: bool,
    /// Which Services are counted per Service, and how finely
    /// (`--service-metrics`, `--service-metrics-namespaces`,
    /// `--service-metrics-selector`).
    pub service_metrics: verdict_model::MetricsSelection,
    /// Leave kube-proxy's own nftables tables in place.
    pub keep_kube_proxy_nftables: bool,
    /// The flow stream (`--flows`): the nfnetlink_log group the rules
    /// that reject or drop log to; `None`: off.
    pub flow_log_group: Option<u16>,
}

impl NodeSettings {
    /// kube-proxy's defaults for a node of this name.
    pub fn new(node_name: impl Into<String>) -> NodeSettings {
        NodeSettings {
            node_name: node_name.into(),
            bind_address: None,
            masquerade_bit: 14,
            masquerade_all: false,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            detect_local: DetectLocal::ClusterCidr(Vec::new()),
            node_ports: NodePortAddresses::primary(),
            service_counters: true,
            service_metrics: verdict_model::MetricsSelection::default(),
            keep_kube_proxy_nftables: false,
            flow_log_group: None,
        }
    }
}

/// kube-proxy's conntrack settings (`conntrack.*`, `--conntrack-*`): the
/// sysctls it sets at start. Zero leaves a value alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// `maxPerCore`: `nf_conntrack_max` = max(maxPerCore × CPUs, min).
    pub max_per_core: u32,
    /// `min`.
    pub min: u32,
    /// `tcpEstablishedTimeout`: `nf_conntrack_tcp_timeout_established`.
    pub tcp_established_timeout: Duration,
    /// `tcpCloseWaitTimeout`: `nf_conntrack_tcp_timeout_close_wait`.
    pub tcp_close_wait_timeout: Duration,
    /// `tcpBeLiberal`: `nf_conntrack_tcp_be_liberal` = 1 when set.
    pub tcp_be_liberal: bool,
    /// `udpTimeout`: `nf_conntrack_udp_timeout`.
    pub udp_timeout: Duration,
    /// `udpStreamTimeout`: `nf_conntrack_udp_timeout_stream`.
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackSettings {
    /// kube-proxy's defaults.
    fn default() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}
