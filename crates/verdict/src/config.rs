//! kube-proxy's configuration: the `KubeProxyConfiguration` file
//! (`kubeproxy.config.k8s.io/v1alpha1`) and the flags, merged the way
//! kube-proxy merges them, validated into [`Settings`].
//!
//! As in kube-proxy, when `--config` is given the file wins: only
//! `--hostname-override` and the logging flags still apply, and other
//! flags are reported as ignored.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

/// A setting that cannot be used; the program stops with exit code 2.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The field as kube-proxy names it (`nftables.syncPeriod`, `--cluster-cidr`).
    pub field: String,
    /// Why.
    pub reason: String,
}

fn bad(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// How local (pod) traffic is recognised.
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

/// Where NodePorts are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePorts {
    /// `primary`: the node's primary addresses (nftables mode's default).
    Primary,
    /// Local addresses inside these CIDRs.
    Cidrs(Vec<ipnet::IpNet>),
    /// `all`, `0.0.0.0/0`, `::/0`: every local address but loopback.
    All,
}

/// The validated, effective settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Node name (`hostnameOverride`, else the host name).
    pub hostname_override: Option<String>,
    /// `bindAddress`, when it names a real address: the node's primary IP.
    pub bind_address: Option<IpAddr>,
    /// Masquerade mark bit.
    pub masquerade_bit: u8,
    /// masqueradeAll.
    pub masquerade_all: bool,
    /// Least time between syncs.
    pub min_sync_period: Duration,
    /// Retry interval after a failed sync (and health timeout basis).
    pub sync_period: Duration,
    /// Local traffic detection.
    pub detect_local: DetectLocal,
    /// NodePort addresses.
    pub node_ports: NodePorts,
    /// `/healthz` and `/livez`; `None` disables.
    pub healthz_bind_address: Option<SocketAddr>,
    /// `/metrics`; `None` disables.
    pub metrics_bind_address: Option<SocketAddr>,
    /// `clientConnection.kubeconfig`.
    pub kubeconfig: Option<String>,
    /// Log verbosity (`-v`).
    pub verbosity: u8,
    /// Conntrack sysctls (`conntrack.*`).
    pub conntrack: Conntrack,
    /// `oomScoreAdj`; `None` leaves it alone.
    pub oom_score_adj: Option<i32>,
}

/// kube-proxy's conntrack settings (`conntrack.*`, `--conntrack-*`): the
/// sysctls it sets at start. Zero leaves a value alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conntrack {
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

impl Default for Conntrack {
    fn default() -> Conntrack {
        Conntrack {
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

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            hostname_override: None,
            bind_address: None,
            masquerade_bit: 14,
            masquerade_all: false,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            detect_local: DetectLocal::ClusterCidr(Vec::new()),
            node_ports: NodePorts::Primary,
            healthz_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], 10256))),
            metrics_bind_address: Some(SocketAddr::from(([127, 0, 0, 1], 10249))),
            kubeconfig: None,
            verbosity: 0,
            conntrack: Conntrack::default(),
            oom_score_adj: Some(-999),
        }
    }
}

/// The flags kube-proxy defines, as given on the command line (`None`:
/// not given).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--config`.
    pub config: Option<String>,
    /// `--proxy-mode`.
    pub proxy_mode: Option<String>,
    /// `--hostname-override`.
    pub hostname_override: Option<String>,
    /// `--bind-address`.
    pub bind_address: Option<String>,
    /// `--cluster-cidr`.
    pub cluster_cidr: Option<String>,
    /// `--detect-local-mode`.
    pub detect_local_mode: Option<String>,
    /// `--pod-bridge-interface`.
    pub pod_bridge_interface: Option<String>,
    /// `--pod-interface-name-prefix`.
    pub pod_interface_name_prefix: Option<String>,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: Option<String>,
    /// `--masquerade-all`.
    pub masquerade_all: Option<bool>,
    /// `--min-sync-period` / `--iptables-min-sync-period`.
    pub min_sync_period: Option<String>,
    /// `--sync-period` / `--iptables-sync-period`.
    pub sync_period: Option<String>,
    /// `--healthz-bind-address`.
    pub healthz_bind_address: Option<String>,
    /// `--metrics-bind-address`.
    pub metrics_bind_address: Option<String>,
    /// `--kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `-v` / `--v`.
    pub verbosity: Option<u8>,
    /// `--conntrack-max-per-core`.
    pub conntrack_max_per_core: Option<String>,
    /// `--conntrack-min`.
    pub conntrack_min: Option<String>,
    /// `--conntrack-tcp-timeout-established`.
    pub conntrack_tcp_timeout_established: Option<String>,
    /// `--conntrack-tcp-timeout-close-wait`.
    pub conntrack_tcp_timeout_close_wait: Option<String>,
    /// `--conntrack-tcp-be-liberal`.
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// `--conntrack-udp-timeout`.
    pub conntrack_udp_timeout: Option<String>,
    /// `--conntrack-udp-timeout-stream`.
    pub conntrack_udp_timeout_stream: Option<String>,
    /// `--oom-score-adj`.
    pub oom_score_adj: Option<String>,
}

/// Parses one Linux setting's text into the settings; the name is the field
/// or flag to report an error under.
type SetLinux = fn(&mut Settings, &str, &str) -> Result<(), ConfigError>;

/// One of the Linux settings: its field in the file, its flag, the flag's
/// value, and how it is set.
struct LinuxField {
    file: &'static str,
    flag: &'static str,
    given: Option<String>,
    set: SetLinux,
}

fn count(name: &str, v: &str) -> Result<u32, ConfigError> {
    v.trim()
        .parse::<u32>()
        .map_err(|_| bad(name, format!("{v:?} must be a whole number, 0 or more")))
}

fn duration(name: &str, v: &str) -> Result<Duration, ConfigError> {
    parse_duration(v).ok_or_else(|| bad(name, format!("{v:?} is not a duration (like 1h, 30s)")))
}

impl Flags {
    /// The conntrack and OOM settings.
    fn linux(&self) -> Vec<LinuxField> {
        let f = |file, flag, given: &Option<String>, set: SetLinux| LinuxField {
            file,
            flag,
            given: given.clone(),
            set,
        };
        vec![
            f(
                "conntrack.maxPerCore",
                "--conntrack-max-per-core",
                &self.conntrack_max_per_core,
                |s, n, v| count(n, v).map(|x| s.conntrack.max_per_core = x),
            ),
            f(
                "conntrack.min",
                "--conntrack-min",
                &self.conntrack_min,
                |s, n, v| count(n, v).map(|x| s.conntrack.min = x),
            ),
            f(
                "conntrack.tcpEstablishedTimeout",
                "--conntrack-tcp-timeout-established",
                &self.conntrack_tcp_timeout_established,
                |s, n, v| duration(n, v).map(|x| s.conntrack.tcp_established_timeout = x),
            ),
            f(
                "conntrack.tcpCloseWaitTimeout",
                "--conntrack-tcp-timeout-close-wait",
                &self.conntrack_tcp_timeout_close_wait,
                |s, n, v| duration(n, v).map(|x| s.conntrack.tcp_close_wait_timeout = x),
            ),
            f(
                "conntrack.tcpBeLiberal",
                "--conntrack-tcp-be-liberal",
                &self.conntrack_tcp_be_liberal.map(|b| b.to_string()),
                |s, n, v| {
                    s.conntrack.tcp_be_liberal = v
                        .parse()
                        .map_err(|_| bad(n, format!("{v:?} must be true or false")))?;
                    Ok(())
                },
            ),
            f(
                "conntrack.udpTimeout",
                "--conntrack-udp-timeout",
                &self.conntrack_udp_timeout,
                |s, n, v| duration(n, v).map(|x| s.conntrack.udp_timeout = x),
            ),
            f(
                "conntrack.udpStreamTimeout",
                "--conntrack-udp-timeout-stream",
                &self.conntrack_udp_timeout_stream,
                |s, n, v| duration(n, v).map(|x| s.conntrack.udp_stream_timeout = x),
            ),
            f(
                "oomScoreAdj",
                "--oom-score-adj",
                &self.oom_score_adj,
                |s, n, v| {
                    let adj = v
                        .trim()
                        .parse::<i32>()
                        .ok()
                        .filter(|a| (-1000..=1000).contains(a))
                        .ok_or_else(|| {
                            bad(n, format!("{v:?} must be in the range [-1000, 1000]"))
                        })?;
                    s.oom_score_adj = Some(adj);
                    Ok(())
                },
            ),
        ]
    }
}

/// Reads the conntrack and OOM settings from the file (if any, which wins)
/// or the flags. Returns the names of flags ignored because of the file.
fn linux_settings(
    file: Option<&Value>,
    flags: &Flags,
    s: &mut Settings,
) -> Result<Vec<&'static str>, ConfigError> {
    let mut ignored = Vec::new();
    for field in flags.linux() {
        // The value as text, and the name to report it under.
        let (name, value): (&str, Option<String>) = match file {
            Some(v) => {
                if field.given.is_some() {
                    ignored.push(field.flag);
                }
                let value = match get(v, field.file) {
                    None => None,
                    Some(Value::String(t)) => Some(t.clone()),
                    Some(x @ (Value::Number(_) | Value::Bool(_))) => Some(x.to_string()),
                    Some(other) => {
                        return Err(bad(field.file, format!("{other} is not a valid value")));
                    }
                };
                (field.file, value)
            }
            None => (field.flag, field.given),
        };
        if let Some(value) = value {
            (field.set)(s, name, &value)?;
        }
    }
    Ok(ignored)
}

/// Parses a Go duration (`1s`, `1m30s`, `250ms`, `24h`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total))
}

/// The keys a KubeProxyConfiguration may have (v1alpha1), to warn about
/// anything else. Nested objects list their own keys.
const KNOWN: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "apiVersion",
            "kind",
            "featureGates",
            "clientConnection",
            "logging",
            "hostnameOverride",
            "bindAddress",
            "healthzBindAddress",
            "metricsBindAddress",
            "bindAddressHardFail",
            "enableProfiling",
            "showHiddenMetricsForVersion",
            "mode",
            "iptables",
            "ipvs",
            "nftables",
            "winkernel",
            "detectLocalMode",
            "detectLocal",
            "clusterCIDR",
            "nodePortAddresses",
            "oomScoreAdj",
            "conntrack",
            "configSyncPeriod",
            "portRange",
            "windowsRunAsService",
        ],
    ),
    (
        "nftables",
        &[
            "masqueradeBit",
            "masqueradeAll",
            "syncPeriod",
            "minSyncPeriod",
        ],
    ),
    ("detectLocal", &["bridgeInterface", "interfaceNamePrefix"]),
    (
        "conntrack",
        &[
            "maxPerCore",
            "min",
            "tcpEstablishedTimeout",
            "tcpCloseWaitTimeout",
            "tcpBeLiberal",
            "udpTimeout",
            "udpStreamTimeout",
        ],
    ),
    (
        "clientConnection",
        &[
            "kubeconfig",
            "acceptContentTypes",
            "contentType",
            "qps",
            "burst",
        ],
    ),
];

/// Fields of the file verdict does not know; kube-proxy would reject
/// them, verdict warns and goes on.
pub fn unknown_fields(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (section, keys) in KNOWN {
        let obj = if section.is_empty() {
            Some(v)
        } else {
            v.get(section)
        };
        if let Some(Value::Object(m)) = obj {
            for k in m.keys() {
                if !keys.contains(&k.as_str()) {
                    out.push(if section.is_empty() {
                        k.clone()
                    } else {
                        format!("{section}.{k}")
                    });
                }
            }
        }
    }
    out
}

fn get<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .filter(|v| !v.is_null())
}

fn string(v: &Value, path: &str) -> Result<Option<String>, ConfigError> {
    match get(v, path) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(path, format!("must be a string, not {other}"))),
    }
}

fn boolean(v: &Value, path: &str) -> Result<Option<bool>, ConfigError> {
    match get(v, path) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(path, format!("must be true or false, not {other}"))),
    }
}

/// Reads and merges the configuration. `file` is the text of `--config`.
/// Returns the settings and the warnings to log.
pub fn resolve(file: Option<&str>, flags: &Flags) -> Result<(Settings, Vec<String>), ConfigError> {
    let mut warnings = Vec::new();
    let mut s = Settings::default();
    // The raw values, file first, flags over them unless a file was given.
    let mode: Option<String>;
    let cluster_cidr: Option<String>;
    let detect_mode: Option<String>;
    let bridge: Option<String>;
    let prefix: Option<String>;
    let node_port_addresses: Option<Vec<String>>;
    let min_sync: Option<(&str, String)>;
    let sync: Option<(&str, String)>;
    let healthz: Option<String>;
    let metrics: Option<String>;
    let bind: Option<String>;
    let mut parsed: Option<Value> = None;
    if let Some(text) = file {
        let v: Value = serde_saphyr::from_str(text)
            .map_err(|e| bad("--config", format!("not valid YAML: {e}")))?;
        parsed = Some(v.clone());
        if !v.is_object() {
            return Err(bad("--config", "must be a KubeProxyConfiguration object"));
        }
        match string(&v, "kind")?.as_deref() {
            Some("KubeProxyConfiguration") => {}
            other => {
                return Err(bad(
                    "kind",
                    format!("must be KubeProxyConfiguration, not {other:?}"),
                ));
            }
        }
        match string(&v, "apiVersion")?.as_deref() {
            Some("kubeproxy.config.k8s.io/v1alpha1") => {}
            other => {
                return Err(bad(
                    "apiVersion",
                    format!("must be kubeproxy.config.k8s.io/v1alpha1, not {other:?}"),
                ));
            }
        }
        for f in unknown_fields(&v) {
            warnings.push(format!(
                "unknown field {f} in the configuration file is ignored"
            ));
        }
        mode = string(&v, "mode")?;
        s.hostname_override = string(&v, "hostnameOverride")?.filter(|h| !h.is_empty());
        bind = string(&v, "bindAddress")?;
        healthz = string(&v, "healthzBindAddress")?;
        metrics = string(&v, "metricsBindAddress")?;
        cluster_cidr = string(&v, "clusterCIDR")?;
        detect_mode = string(&v, "detectLocalMode")?;
        bridge = string(&v, "detectLocal.bridgeInterface")?;
        prefix = string(&v, "detectLocal.interfaceNamePrefix")?;
        node_port_addresses = match get(&v, "nodePortAddresses") {
            None => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| bad("nodePortAddresses", "must be a list of strings"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err(bad("nodePortAddresses", "must be a list of strings")),
        };
        if let Some(b) = get(&v, "nftables.masqueradeBit") {
            let bit = b.as_i64().filter(|b| (0..=31).contains(b));
            s.masquerade_bit = bit.and_then(|b| u8::try_from(b).ok()).ok_or_else(|| {
                bad(
                    "nftables.masqueradeBit",
                    format!("must be in the range [0, 31], not {b}"),
                )
            })?;
        }
        s.masquerade_all = boolean(&v, "nftables.masqueradeAll")?.unwrap_or(false);
        min_sync = string(&v, "nftables.minSyncPeriod")?.map(|d| ("nftables.minSyncPeriod", d));
        sync = string(&v, "nftables.syncPeriod")?.map(|d| ("nftables.syncPeriod", d));
        s.kubeconfig = string(&v, "clientConnection.kubeconfig")?.filter(|k| !k.is_empty());
        let ignored: Vec<&str> = [
            ("--proxy-mode", flags.proxy_mode.is_some()),
            ("--cluster-cidr", flags.cluster_cidr.is_some()),
            ("--detect-local-mode", flags.detect_local_mode.is_some()),
            ("--nodeport-addresses", flags.nodeport_addresses.is_some()),
            ("--masquerade-all", flags.masquerade_all.is_some()),
            ("--min-sync-period", flags.min_sync_period.is_some()),
            ("--sync-period", flags.sync_period.is_some()),
            (
                "--healthz-bind-address",
                flags.healthz_bind_address.is_some(),
            ),
            (
                "--metrics-bind-address",
                flags.metrics_bind_address.is_some(),
            ),
            ("--bind-address", flags.bind_address.is_some()),
            (
                "--pod-bridge-interface",
                flags.pod_bridge_interface.is_some(),
            ),
            (
                "--pod-interface-name-prefix",
                flags.pod_interface_name_prefix.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(f, given)| given.then_some(f))
        .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "{} ignored because --config is set (as in kube-proxy, the file wins)",
                ignored.join(", ")
            ));
        }
    } else {
        mode = flags.proxy_mode.clone();
        bind = flags.bind_address.clone();
        healthz = flags.healthz_bind_address.clone();
        metrics = flags.metrics_bind_address.clone();
        cluster_cidr = flags.cluster_cidr.clone();
        detect_mode = flags.detect_local_mode.clone();
        bridge = flags.pod_bridge_interface.clone();
        prefix = flags.pod_interface_name_prefix.clone();
        node_port_addresses = flags.nodeport_addresses.as_ref().map(|v| {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        });
        s.masquerade_all = flags.masquerade_all.unwrap_or(false);
        min_sync = flags
            .min_sync_period
            .clone()
            .map(|d| ("--min-sync-period", d));
        sync = flags.sync_period.clone().map(|d| ("--sync-period", d));
    }
    let ignored = linux_settings(parsed.as_ref(), flags, &mut s)?;
    if !ignored.is_empty() {
        warnings.push(format!(
            "{} ignored because --config is set (as in kube-proxy, the file wins)",
            ignored.join(", ")
        ));
    }
    // Always from the flags, as in kube-proxy.
    if let Some(h) = flags.hostname_override.clone().filter(|h| !h.is_empty()) {
        s.hostname_override = Some(h);
    }
    if let Some(k) = flags.kubeconfig.clone() {
        s.kubeconfig = Some(k);
    }
    s.verbosity = flags.verbosity.unwrap_or(0);

    // mode: verdict is the nftables mode.
    let mode_field = if file.is_some() {
        "mode"
    } else {
        "--proxy-mode"
    };
    match mode.as_deref() {
        None | Some("") | Some("nftables") => {}
        Some(other @ ("iptables" | "ipvs" | "kernelspace")) => {
            return Err(bad(
                mode_field,
                format!(
                    "verdict implements the nftables mode only; {other:?} is refused (set it to \"nftables\")"
                ),
            ));
        }
        Some(other) => return Err(bad(mode_field, format!("unknown proxy mode {other:?}"))),
    }
    if mode.is_none() || mode.as_deref() == Some("") {
        warnings.push("no proxy mode set: verdict runs the nftables mode".into());
    }

    for (field, value) in [&min_sync, &sync].into_iter().flatten() {
        parse_duration(value).ok_or_else(|| {
            bad(
                field,
                format!("{value:?} is not a duration (like 1s, 30s, 1m)"),
            )
        })?;
    }
    if let Some((_, d)) = &min_sync {
        s.min_sync_period = parse_duration(d).unwrap_or(s.min_sync_period);
    }
    if let Some((_, d)) = &sync {
        s.sync_period = parse_duration(d).unwrap_or(s.sync_period);
    }
    let sync_field = sync.as_ref().map_or("nftables.syncPeriod", |(f, _)| *f);
    if s.sync_period.is_zero() {
        return Err(bad(sync_field, "must be greater than 0"));
    }
    if s.sync_period < s.min_sync_period {
        return Err(bad(
            sync_field,
            "must be greater than or equal to nftables.minSyncPeriod",
        ));
    }

    let addr_field = |f: &str| {
        if file.is_some() {
            f.to_owned()
        } else {
            format!("--{}", kebab(f))
        }
    };
    for (field, value, slot) in [
        ("healthzBindAddress", &healthz, &mut s.healthz_bind_address),
        ("metricsBindAddress", &metrics, &mut s.metrics_bind_address),
    ] {
        match value.as_deref() {
            None => {}
            Some("") => *slot = None,
            Some(v) => {
                *slot = Some(
                    v.parse()
                        .map_err(|_| bad(&addr_field(field), format!("{v:?} must be IP:port")))?,
                );
            }
        }
    }
    if let Some(b) = bind.as_deref().filter(|b| !b.is_empty()) {
        let ip: IpAddr = b.parse().map_err(|_| {
            bad(
                &addr_field("bindAddress"),
                format!("{b:?} must be an IP address"),
            )
        })?;
        if !ip.is_unspecified() {
            s.bind_address = Some(ip);
        }
    }

    let cidrs = |field: &str, list: &[String]| -> Result<Vec<ipnet::IpNet>, ConfigError> {
        list.iter()
            .map(|c| {
                c.trim()
                    .parse::<ipnet::IpNet>()
                    .map_err(|_| bad(field, format!("{c:?} is not a CIDR")))
            })
            .collect()
    };
    let detect_field = if file.is_some() {
        "detectLocalMode"
    } else {
        "--detect-local-mode"
    };
    s.detect_local = match detect_mode.as_deref().unwrap_or("") {
        "" | "ClusterCIDR" => {
            let list: Vec<String> = cluster_cidr
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let field = if file.is_some() {
                "clusterCIDR"
            } else {
                "--cluster-cidr"
            };
            let nets = cidrs(field, &list)?;
            if nets.len() > 2
                || (nets.len() == 2 && nets[0].addr().is_ipv4() == nets[1].addr().is_ipv4())
            {
                return Err(bad(
                    field,
                    "must be one CIDR, or one IPv4 and one IPv6 CIDR",
                ));
            }
            DetectLocal::ClusterCidr(nets)
        }
        "NodeCIDR" => DetectLocal::NodeCidr,
        "BridgeInterface" => {
            DetectLocal::BridgeInterface(bridge.filter(|b| !b.is_empty()).ok_or_else(|| {
                bad(
                    if file.is_some() {
                        "detectLocal.bridgeInterface"
                    } else {
                        "--pod-bridge-interface"
                    },
                    "is required with detectLocalMode BridgeInterface",
                )
            })?)
        }
        "InterfaceNamePrefix" => {
            DetectLocal::InterfaceNamePrefix(prefix.filter(|p| !p.is_empty()).ok_or_else(|| {
                bad(
                    if file.is_some() {
                        "detectLocal.interfaceNamePrefix"
                    } else {
                        "--pod-interface-name-prefix"
                    },
                    "is required with detectLocalMode InterfaceNamePrefix",
                )
            })?)
        }
        other => return Err(bad(detect_field, format!("unknown mode {other:?}"))),
    };

    let np_field = if file.is_some() {
        "nodePortAddresses"
    } else {
        "--nodeport-addresses"
    };
    s.node_ports = match node_port_addresses.as_deref() {
        None | Some([]) => NodePorts::Primary,
        Some(list) if list.iter().any(|a| a == "primary") => {
            if list.len() > 1 {
                return Err(bad(
                    np_field,
                    "\"primary\" cannot be combined with other entries",
                ));
            }
            NodePorts::Primary
        }
        Some(list) if list.iter().any(|a| a == "all") => NodePorts::All,
        Some(list) => {
            let nets = cidrs(np_field, list)?;
            if nets.iter().any(|n| n.prefix_len() == 0) {
                NodePorts::All
            } else {
                NodePorts::Cidrs(nets)
            }
        }
    };
    Ok((s, warnings))
}

/// `healthzBindAddress` → `healthz-bind-address`.
fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
hostnameOverride: node-a
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [192.168.0.0/24]
nftables:
  masqueradeBit: 15
  masqueradeAll: true
  minSyncPeriod: 2s
  syncPeriod: 1m0s
conntrack:
  maxPerCore: 32768
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
"#;

    #[test]
    fn reads_a_kubeadm_style_file() {
        let (s, w) = resolve(Some(FILE), &Flags::default()).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(s.masquerade_bit, 15);
        assert!(s.masquerade_all);
        assert_eq!(s.min_sync_period, Duration::from_secs(2));
        assert_eq!(s.sync_period, Duration::from_secs(60));
        assert_eq!(s.hostname_override.as_deref(), Some("node-a"));
        assert_eq!(
            s.node_ports,
            NodePorts::Cidrs(vec!["192.168.0.0/24".parse().unwrap()])
        );
        assert!(matches!(&s.detect_local, DetectLocal::ClusterCidr(n) if n.len() == 2));
        assert_eq!(
            s.kubeconfig.as_deref(),
            Some("/var/lib/kube-proxy/kubeconfig.conf")
        );
    }

    #[test]
    fn unknown_fields_warn_and_the_rest_applies() {
        let text = format!("{FILE}frobnicate: 3\nnftables2: {{}}\n").replace(
            "  masqueradeAll: true",
            "  masqueradeAll: true\n  tableName: x",
        );
        let (s, w) = resolve(Some(&text), &Flags::default()).unwrap();
        assert_eq!(s.masquerade_bit, 15);
        let w = w.join("\n");
        for f in ["frobnicate", "nftables2", "nftables.tableName"] {
            assert!(w.contains(f), "{w}");
        }
    }

    #[test]
    fn invalid_values_name_the_field() {
        let cases = [
            ("mode: nftables", "mode: iptables", "mode"),
            ("mode: nftables", "mode: bogus", "mode"),
            (
                "masqueradeBit: 15",
                "masqueradeBit: 40",
                "nftables.masqueradeBit",
            ),
            (
                "syncPeriod: 1m0s",
                "syncPeriod: soon",
                "nftables.syncPeriod",
            ),
            ("syncPeriod: 1m0s", "syncPeriod: 1s", "nftables.syncPeriod"),
            (
                "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
                "clusterCIDR: 10.244.0.0/99",
                "clusterCIDR",
            ),
            (
                "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
                "clusterCIDR: 10.0.0.0/8,10.1.0.0/16",
                "clusterCIDR",
            ),
            (
                "healthzBindAddress: 0.0.0.0:10256",
                "healthzBindAddress: everywhere",
                "healthzBindAddress",
            ),
            (
                "nodePortAddresses: [192.168.0.0/24]",
                "nodePortAddresses: [primary, 10.0.0.0/8]",
                "nodePortAddresses",
            ),
            (
                "masqueradeAll: true",
                "masqueradeAll: yes please",
                "nftables.masqueradeAll",
            ),
            (
                "kind: KubeProxyConfiguration",
                "kind: KubeletConfiguration",
                "kind",
            ),
        ];
        for (from, to, field) in cases {
            let text = FILE.replace(from, to);
            assert_ne!(text, FILE, "{from}");
            let err = resolve(Some(&text), &Flags::default()).unwrap_err();
            assert_eq!(err.field, field, "{to}: {err}");
        }
        let text = FILE.replace(
            "mode: nftables",
            "mode: nftables\ndetectLocalMode: BridgeInterface",
        );
        assert_eq!(
            resolve(Some(&text), &Flags::default()).unwrap_err().field,
            "detectLocal.bridgeInterface"
        );
    }

    #[test]
    fn flags_apply_without_a_file_and_are_ignored_with_one() {
        let flags = Flags {
            proxy_mode: Some("nftables".into()),
            cluster_cidr: Some("10.0.0.0/8".into()),
            masquerade_all: Some(true),
            min_sync_period: Some("5s".into()),
            sync_period: Some("10s".into()),
            nodeport_addresses: Some("0.0.0.0/0".into()),
            hostname_override: Some("flag-node".into()),
            metrics_bind_address: Some("".into()),
            ..Flags::default()
        };
        let (s, _) = resolve(None, &flags).unwrap();
        assert!(s.masquerade_all);
        assert_eq!(s.min_sync_period, Duration::from_secs(5));
        assert_eq!(s.node_ports, NodePorts::All);
        assert_eq!(s.metrics_bind_address, None);
        assert_eq!(s.hostname_override.as_deref(), Some("flag-node"));

        let (s, w) = resolve(Some(FILE), &flags).unwrap();
        assert_eq!(s.min_sync_period, Duration::from_secs(2), "the file wins");
        assert_eq!(
            s.hostname_override.as_deref(),
            Some("flag-node"),
            "except --hostname-override"
        );
        assert!(
            w.iter()
                .any(|w| w.contains("--min-sync-period") && w.contains("ignored")),
            "{w:?}"
        );

        let bad = Flags {
            sync_period: Some("0s".into()),
            ..Flags::default()
        };
        assert_eq!(resolve(None, &bad).unwrap_err().field, "--sync-period");
        let bad = Flags {
            healthz_bind_address: Some("nope".into()),
            ..Flags::default()
        };
        assert_eq!(
            resolve(None, &bad).unwrap_err().field,
            "--healthz-bind-address"
        );
    }

    #[test]
    fn conntrack_and_oom_settings_from_the_file_or_the_flags() {
        let text = FILE.replace(
            "conntrack:\n  maxPerCore: 32768\n",
            "oomScoreAdj: -500\nconntrack:\n  maxPerCore: 0\n  min: 1000\n  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 0s\n  tcpBeLiberal: true\n  udpTimeout: 45s\n  udpStreamTimeout: null\n",
        );
        let flags = Flags {
            conntrack_udp_timeout: Some("9s".into()),
            oom_score_adj: Some("1".into()),
            ..Flags::default()
        };
        let (s, w) = resolve(Some(&text), &flags).unwrap();
        let c = &s.conntrack;
        assert_eq!((c.max_per_core, c.min), (0, 1000));
        assert_eq!(c.tcp_established_timeout, Duration::from_secs(7200));
        assert_eq!(c.tcp_close_wait_timeout, Duration::ZERO);
        assert!(c.tcp_be_liberal);
        assert_eq!(c.udp_timeout, Duration::from_secs(45), "the file wins");
        assert_eq!(c.udp_stream_timeout, Duration::ZERO, "null is the default");
        assert_eq!(s.oom_score_adj, Some(-500));
        let w = w.join("\n");
        assert!(
            w.contains("--conntrack-udp-timeout, --oom-score-adj ignored"),
            "{w}"
        );

        let (s, _) = resolve(None, &flags).unwrap();
        assert_eq!(s.conntrack.udp_timeout, Duration::from_secs(9));
        assert_eq!(s.oom_score_adj, Some(1));
        let (s, _) = resolve(None, &Flags::default()).unwrap();
        assert_eq!(s.conntrack, Conntrack::default());
        assert_eq!(s.oom_score_adj, Some(-999), "kube-proxy's default");
    }

    #[test]
    fn invalid_conntrack_and_oom_values_name_the_field() {
        for (from, to, field) in [
            (
                "maxPerCore: 32768",
                "maxPerCore: -1",
                "conntrack.maxPerCore",
            ),
            (
                "maxPerCore: 32768",
                "maxPerCore: 1\n  udpTimeout: often",
                "conntrack.udpTimeout",
            ),
            (
                "maxPerCore: 32768",
                "maxPerCore: 1\n  tcpBeLiberal: maybe",
                "conntrack.tcpBeLiberal",
            ),
            (
                "mode: nftables",
                "mode: nftables\noomScoreAdj: -1001",
                "oomScoreAdj",
            ),
        ] {
            let text = FILE.replace(from, to);
            let e = resolve(Some(&text), &Flags::default()).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
        let flags = Flags {
            conntrack_min: Some("lots".into()),
            ..Flags::default()
        };
        assert_eq!(resolve(None, &flags).unwrap_err().field, "--conntrack-min");
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("24h"), Some(Duration::from_secs(86400)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        for bad in ["", "s", "10", "1x", "-1s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
