//! Every setting of kube-proxy's `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`), defined once: its path in the
//! file, the flags that set it, what it holds, its default, and what
//! verdict does with it: applied, or accepted with the reason it has no
//! effect in nftables mode.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use super::value::{Kind, duration_of};
use super::{DetectLocalMode, LogFormat, Settings};

/// A default, as kube-proxy's v1alpha1 defaulting applies it.
#[derive(Clone, Copy, Debug)]
pub enum Default {
    /// None: the zero value stays.
    Zero,
    /// An absent or zero value becomes this (Go's non-pointer fields).
    WhenZero(Literal),
    /// An absent (null) value becomes this; an explicit zero stays (Go's
    /// pointer fields).
    WhenNull(Literal),
    /// Computed from other settings (the bind addresses).
    Computed,
}

/// A default value.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    /// A string (durations in Go's spelling).
    Str(&'static str),
    /// A whole number.
    Int(i64),
    /// A number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A list of strings.
    List(&'static [&'static str]),
}

impl Literal {
    /// As `--help` and the reference write it (`30s`, `14`, `primary`).
    pub fn text(self) -> String {
        match self {
            Literal::Str(t) => t.to_owned(),
            Literal::Int(n) => n.to_string(),
            Literal::Float(f) => f.to_string(),
            Literal::Bool(b) => b.to_string(),
            Literal::List(l) => l.join(","),
        }
    }

    /// As JSON.
    pub fn value(self) -> Value {
        match self {
            Literal::Str(s) => Value::from(s),
            Literal::Int(n) => Value::from(n),
            Literal::Float(f) => Value::from(f),
            Literal::Bool(b) => Value::from(b),
            Literal::List(l) => Value::from(l.to_vec()),
        }
    }
}

/// Turns the effective value into [`Settings`]; an error is the reason,
/// reported under the field or flag it came from. Warnings (a value
/// verdict can only partly honour) go to the list.
pub type Apply = fn(&mut Settings, &Value, &mut Vec<String>) -> Result<(), String>;

/// What verdict does with a setting.
#[derive(Clone, Copy)]
pub enum Effect {
    /// Applied.
    Apply(Apply),
    /// Accepted, with no effect in nftables mode, for this reason (a
    /// warning when the value is not the default).
    None(&'static str),
    /// Checked as kube-proxy checks it (an invalid value is an error), but
    /// with no effect in verdict, for this reason.
    Checked(Apply, &'static str),
}

/// One setting.
pub struct Setting {
    /// Path in the file (`nftables.syncPeriod`).
    pub path: &'static str,
    /// The flags that set it, kube-proxy's first (without `--`).
    pub flags: &'static [&'static str],
    /// What it holds.
    pub kind: Kind,
    /// Its default.
    pub default: Default,
    /// With `--config`, a flag still overrides the file (the logging flags
    /// and `--hostname-override`, as in kube-proxy); other flags are
    /// ignored.
    pub overrides_file: bool,
    /// What it is, for `--help`.
    pub help: &'static str,
    /// What verdict does with it.
    pub effect: Effect,
}

const IPVS_ONLY: &str = "it applies to the IPVS mode only";
const IPTABLES_ONLY: &str =
    "it applies to the iptables mode only; nftables mode uses the nftables section";
const WINDOWS_ONLY: &str = "it applies to Windows (winkernel) only";

fn duration(v: &Value) -> Result<Duration, String> {
    match duration_of(v) {
        Some((false, d)) => Ok(d),
        Some((true, _)) => Err("must be greater than or equal to 0".into()),
        None => Ok(Duration::ZERO),
    }
}

fn string(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or_default()
}

fn non_negative(v: &Value) -> Result<u32, String> {
    u32::try_from(int(v)).map_err(|_| "must be greater than or equal to 0".to_owned())
}

fn list(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str())
        .map(str::to_owned)
        .collect()
}

/// Every setting of v1alpha1, in the order kube-proxy's types declare them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        path: "featureGates",
        flags: &["feature-gates"],
        kind: Kind::Gates,
        default: Default::Zero,
        overrides_file: false,
        help: "Feature gates, as Name=true,Other=false",
        effect: Effect::Apply(|s, v, w| {
            s.feature_gates = super::gates::Gates::resolve(v, w)?;
            Ok(())
        }),
    },
    Setting {
        path: "clientConnection.kubeconfig",
        flags: &["kubeconfig"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "kubeconfig of the Kubernetes API (empty: the in-cluster service account)",
        effect: Effect::Apply(|s, v, _| {
            s.client.kubeconfig = Some(string(v)).filter(|k| !k.is_empty());
            Ok(())
        }),
    },
    Setting {
        path: "clientConnection.acceptContentTypes",
        flags: &[],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Accept header of API requests",
        effect: Effect::None("verdict's client (kube-rs) accepts application/json only"),
    },
    Setting {
        path: "clientConnection.contentType",
        flags: &["kube-api-content-type"],
        kind: Kind::Str,
        default: Default::WhenZero(Literal::Str("application/vnd.kubernetes.protobuf")),
        overrides_file: false,
        help: "Content type of requests to the API server",
        effect: Effect::None(
            "verdict's client (kube-rs) sends application/json, which every API server serves",
        ),
    },
    Setting {
        path: "clientConnection.qps",
        flags: &["kube-api-qps"],
        kind: Kind::Float,
        default: Default::WhenZero(Literal::Float(5.0)),
        overrides_file: false,
        help: "Requests per second to the API server (with kube-api-burst)",
        // As client-go: 0 is its default (5), a negative rate no limit.
        effect: Effect::Apply(|s, v, _| {
            let qps = v.as_f64().unwrap_or_default();
            s.client.qps = if qps == 0.0 { 5.0 } else { qps };
            Ok(())
        }),
    },
    Setting {
        path: "clientConnection.burst",
        flags: &["kube-api-burst"],
        kind: Kind::Int32,
        default: Default::WhenZero(Literal::Int(10)),
        overrides_file: false,
        help: "Burst of requests to the API server",
        // As client-go: 0 is its default (10).
        effect: Effect::Apply(|s, v, _| {
            let burst = non_negative(v)?;
            s.client.burst = if burst == 0 { 10 } else { burst };
            Ok(())
        }),
    },
    Setting {
        path: "logging.format",
        flags: &["logging-format"],
        kind: Kind::Str,
        default: Default::WhenZero(Literal::Str("text")),
        overrides_file: true,
        help: "Log format: text (klog's) or json",
        effect: Effect::Apply(|s, v, _| {
            s.logging.format = match string(v).as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => return Err(format!("Unsupported log format {other:?} (text or json)")),
            };
            Ok(())
        }),
    },
    Setting {
        path: "logging.flushFrequency",
        flags: &["log-flush-frequency"],
        kind: Kind::NanosOrDuration,
        default: Default::WhenZero(Literal::Str("5s")),
        overrides_file: true,
        help: "Longest time between log flushes",
        effect: Effect::None(
            "verdict writes every log line as it happens, so there is nothing to flush",
        ),
    },
    Setting {
        path: "logging.verbosity",
        flags: &["v"],
        kind: Kind::Uint32,
        default: Default::Zero,
        overrides_file: true,
        help: "Log verbosity: 2 logs every sync and Service change, 4 every element change",
        effect: Effect::Apply(|s, v, _| {
            s.logging.verbosity = non_negative(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "logging.vmodule",
        flags: &["vmodule"],
        kind: Kind::VModule,
        default: Default::Zero,
        overrides_file: true,
        help: "Per-file verbosity, as pattern=N,... (patterns match source file names)",
        effect: Effect::Apply(|s, v, _| {
            s.logging.vmodule = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| {
                    (
                        string(&i["filePattern"]),
                        u32::try_from(i["verbosity"].as_u64().unwrap_or_default())
                            .unwrap_or(u32::MAX),
                    )
                })
                .collect();
            Ok(())
        }),
    },
    Setting {
        path: "logging.options.text.splitStream",
        flags: &["log-text-split-stream"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: true,
        help: "Text logs: info to stdout, errors to stderr (needs LoggingAlphaOptions)",
        effect: Effect::Apply(|s, v, _| {
            s.logging.text_split_stream = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "logging.options.text.infoBufferSize",
        flags: &["log-text-info-buffer-size"],
        kind: Kind::Quantity,
        default: Default::WhenNull(Literal::Str("0")),
        overrides_file: true,
        help: "Text logs: buffer for info messages with split streams",
        effect: Effect::None("verdict does not buffer info messages"),
    },
    Setting {
        path: "logging.options.json.splitStream",
        flags: &["log-json-split-stream"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: true,
        help: "JSON logs: info to stdout, errors to stderr (needs LoggingAlphaOptions)",
        effect: Effect::Apply(|s, v, _| {
            s.logging.json_split_stream = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "logging.options.json.infoBufferSize",
        flags: &["log-json-info-buffer-size"],
        kind: Kind::Quantity,
        default: Default::WhenNull(Literal::Str("0")),
        overrides_file: true,
        help: "JSON logs: buffer for info messages with split streams",
        effect: Effect::None("verdict does not buffer info messages"),
    },
    Setting {
        path: "hostnameOverride",
        flags: &["hostname-override"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: true,
        help: "The Node's name, if not the host name",
        effect: Effect::Apply(|s, v, _| {
            let name = string(v);
            if !name.is_empty() {
                let trimmed = name.trim().to_lowercase();
                if trimmed.is_empty() {
                    return Err("empty hostname is invalid".into());
                }
                s.hostname_override = Some(trimmed);
            }
            Ok(())
        }),
    },
    Setting {
        path: "bindAddress",
        flags: &["bind-address"],
        kind: Kind::Str,
        default: Default::WhenZero(Literal::Str("0.0.0.0")),
        overrides_file: false,
        help: "The node's primary IP, if not the Node object's (no socket is bound to it)",
        effect: Effect::Apply(|s, v, _| {
            let text = string(v);
            let ip: IpAddr = text
                .parse()
                .map_err(|_| format!("{text:?} must be an IP address"))?;
            s.bind_address = (!ip.is_unspecified()).then_some(ip);
            Ok(())
        }),
    },
    Setting {
        path: "healthzBindAddress",
        flags: &["healthz-bind-address"],
        kind: Kind::Str,
        default: Default::Computed,
        overrides_file: false,
        help: "IP:port of /healthz and /livez (an IP alone takes port 10256; empty disables)",
        effect: Effect::Apply(|s, v, _| {
            s.healthz_bind_address = super::socket_address(&string(v))?;
            Ok(())
        }),
    },
    Setting {
        path: "metricsBindAddress",
        flags: &["metrics-bind-address"],
        kind: Kind::Str,
        default: Default::Computed,
        overrides_file: false,
        help: "IP:port of /metrics (an IP alone takes port 10249; empty disables)",
        effect: Effect::Apply(|s, v, _| {
            s.metrics_bind_address = super::socket_address(&string(v))?;
            Ok(())
        }),
    },
    Setting {
        path: "bindAddressHardFail",
        flags: &["bind-address-hard-fail"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Exit if the health or metrics port cannot be bound",
        effect: Effect::Apply(|s, v, _| {
            s.bind_address_hard_fail = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "enableProfiling",
        flags: &["profiling"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Serve /debug/pprof and /debug/flags/v on the metrics address",
        effect: Effect::Apply(|s, v, _| {
            s.enable_profiling = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "showHiddenMetricsForVersion",
        flags: &["show-hidden-metrics-for-version"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Show metrics hidden since this version (major.minor)",
        effect: Effect::Checked(
            |_, v, _| {
                let text = string(v);
                let parts: Vec<&str> = text.split('.').collect();
                if !text.is_empty()
                    && (parts.len() != 2 || parts.iter().any(|p| p.parse::<u32>().is_err()))
                {
                    return Err(format!("{text:?} must be major.minor, like 1.35"));
                }
                Ok(())
            },
            "verdict hides no metrics",
        ),
    },
    Setting {
        path: "mode",
        flags: &["proxy-mode"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Proxy mode; verdict implements nftables",
        effect: Effect::Apply(|_, v, w| match string(v).as_str() {
            "nftables" => Ok(()),
            "" => {
                w.push("no proxy mode set (kube-proxy would run iptables): verdict runs the nftables mode and reads the nftables section".into());
                Ok(())
            }
            m @ ("iptables" | "ipvs" | "kernelspace") => Err(format!(
                "verdict implements the nftables mode only; {m:?} is refused (set it to \"nftables\")"
            )),
            other => Err(format!("unknown proxy mode {other:?}")),
        }),
    },
    Setting {
        path: "iptables.masqueradeBit",
        flags: &["iptables-masquerade-bit"],
        kind: Kind::Int32,
        default: Default::WhenNull(Literal::Int(14)),
        overrides_file: false,
        help: "iptables and IPVS modes' masquerade bit",
        effect: Effect::None(
            "it applies to the iptables and IPVS modes only; nftables mode uses nftables.masqueradeBit",
        ),
    },
    Setting {
        path: "iptables.masqueradeAll",
        flags: &[],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "iptables mode's masqueradeAll",
        effect: Effect::None(IPTABLES_ONLY),
    },
    Setting {
        path: "iptables.localhostNodePorts",
        flags: &["iptables-localhost-nodeports"],
        kind: Kind::Bool,
        default: Default::WhenNull(Literal::Bool(true)),
        overrides_file: false,
        help: "iptables mode's NodePorts on localhost",
        effect: Effect::None(
            "it applies to the iptables mode only; in nftables mode NodePorts are never served on localhost",
        ),
    },
    Setting {
        path: "iptables.syncPeriod",
        flags: &[],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "iptables mode's sync period",
        effect: Effect::None(IPTABLES_ONLY),
    },
    Setting {
        path: "iptables.minSyncPeriod",
        flags: &[],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "iptables mode's minimum sync period",
        effect: Effect::None(IPTABLES_ONLY),
    },
    Setting {
        path: "ipvs.syncPeriod",
        flags: &["ipvs-sync-period"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS mode's sync period",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.minSyncPeriod",
        flags: &["ipvs-min-sync-period"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS mode's minimum sync period",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.scheduler",
        flags: &["ipvs-scheduler"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS scheduler",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.excludeCIDRs",
        flags: &["ipvs-exclude-cidrs"],
        kind: Kind::List,
        default: Default::Zero,
        overrides_file: false,
        help: "CIDRs the IPVS cleanup leaves alone",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.strictARP",
        flags: &["ipvs-strict-arp"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS mode's strict ARP",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.tcpTimeout",
        flags: &["ipvs-tcp-timeout"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS TCP idle timeout",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.tcpFinTimeout",
        flags: &["ipvs-tcpfin-timeout"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS TCP FIN timeout",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "ipvs.udpTimeout",
        flags: &["ipvs-udp-timeout"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "IPVS UDP timeout",
        effect: Effect::None(IPVS_ONLY),
    },
    Setting {
        path: "nftables.masqueradeBit",
        flags: &[],
        kind: Kind::Int32,
        default: Default::WhenNull(Literal::Int(14)),
        overrides_file: false,
        help: "Bit of the packet mark that requests masquerading, in [0, 31]",
        effect: Effect::Apply(|s, v, _| {
            s.masquerade_bit = u8::try_from(int(v))
                .ok()
                .filter(|b| *b <= 31)
                .ok_or_else(|| format!("{v} must be in the range [0, 31]"))?;
            Ok(())
        }),
    },
    Setting {
        path: "nftables.masqueradeAll",
        flags: &["masquerade-all"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Masquerade all traffic to ClusterIPs",
        effect: Effect::Apply(|s, v, _| {
            s.masquerade_all = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "nftables.syncPeriod",
        flags: &["iptables-sync-period", "sync-period"],
        kind: Kind::Duration,
        default: Default::WhenZero(Literal::Str("30s")),
        overrides_file: false,
        help: "Full resync and retry interval (health fails after twice this)",
        effect: Effect::Apply(|s, v, _| {
            s.sync_period = duration(v)?;
            if s.sync_period.is_zero() {
                return Err("must be greater than 0".into());
            }
            Ok(())
        }),
    },
    Setting {
        path: "nftables.minSyncPeriod",
        flags: &["iptables-min-sync-period", "min-sync-period"],
        kind: Kind::Duration,
        default: Default::WhenZero(Literal::Str("1s")),
        overrides_file: false,
        help: "Least time between syncs (0: every change at once)",
        effect: Effect::Apply(|s, v, _| {
            s.min_sync_period = duration(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "winkernel.networkName",
        flags: &[],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: HNS network",
        effect: Effect::None(WINDOWS_ONLY),
    },
    Setting {
        path: "winkernel.sourceVip",
        flags: &[],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: source VIP",
        effect: Effect::None(WINDOWS_ONLY),
    },
    Setting {
        path: "winkernel.enableDSR",
        flags: &[],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: direct server return",
        effect: Effect::None(WINDOWS_ONLY),
    },
    Setting {
        path: "winkernel.rootHnsEndpointName",
        flags: &[],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: root HNS endpoint",
        effect: Effect::None(WINDOWS_ONLY),
    },
    Setting {
        path: "winkernel.forwardHealthCheckVip",
        flags: &[],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: forward the health-check VIP",
        effect: Effect::None(WINDOWS_ONLY),
    },
    Setting {
        path: "detectLocalMode",
        flags: &["detect-local-mode"],
        kind: Kind::Str,
        default: Default::WhenZero(Literal::Str("ClusterCIDR")),
        overrides_file: false,
        help: "How pod traffic is told apart: ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix",
        effect: Effect::Apply(|s, v, _| {
            s.detect_local_mode = match string(v).as_str() {
                "ClusterCIDR" => DetectLocalMode::ClusterCidr,
                "NodeCIDR" => DetectLocalMode::NodeCidr,
                "BridgeInterface" => DetectLocalMode::BridgeInterface,
                "InterfaceNamePrefix" => DetectLocalMode::InterfaceNamePrefix,
                other => return Err(format!("unknown mode {other:?}")),
            };
            Ok(())
        }),
    },
    Setting {
        path: "detectLocal.bridgeInterface",
        flags: &["pod-bridge-interface"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Pod bridge, for detect-local-mode BridgeInterface",
        effect: Effect::Apply(|s, v, _| {
            s.detect_bridge = string(v);
            Ok(())
        }),
    },
    Setting {
        path: "detectLocal.interfaceNamePrefix",
        flags: &["pod-interface-name-prefix"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Pod interface prefix, for detect-local-mode InterfaceNamePrefix",
        effect: Effect::Apply(|s, v, _| {
            s.detect_prefix = string(v);
            Ok(())
        }),
    },
    Setting {
        path: "clusterCIDR",
        flags: &["cluster-cidr"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "Pod CIDR(s), one per family, comma-separated",
        effect: Effect::Apply(|s, v, _| {
            let text = string(v);
            let nets = text
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(|c| {
                    c.parse::<ipnet::IpNet>()
                        .map_err(|_| format!("{c:?} is not a CIDR"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if nets.len() > 2
                || (nets.len() == 2 && nets[0].addr().is_ipv4() == nets[1].addr().is_ipv4())
            {
                return Err("must be one CIDR, or one IPv4 and one IPv6 CIDR".into());
            }
            s.cluster_cidrs = nets;
            Ok(())
        }),
    },
    Setting {
        path: "nodePortAddresses",
        flags: &["nodeport-addresses"],
        kind: Kind::List,
        default: Default::WhenZero(Literal::List(&["primary"])),
        overrides_file: false,
        help: "Where NodePorts are served: CIDRs and the keywords primary, all, localhost",
        effect: Effect::Apply(|s, v, w| {
            s.node_ports = super::node_ports(&list(v), w)?;
            Ok(())
        }),
    },
    Setting {
        path: "oomScoreAdj",
        flags: &["oom-score-adj"],
        kind: Kind::Int32,
        default: Default::WhenNull(Literal::Int(-999)),
        overrides_file: false,
        help: "oom_score_adj of the process, in [-1000, 1000]",
        effect: Effect::Apply(|s, v, _| {
            let adj = i32::try_from(int(v))
                .ok()
                .filter(|a| (-1000..=1000).contains(a))
                .ok_or_else(|| format!("{v} must be in the range [-1000, 1000]"))?;
            s.oom_score_adj = Some(adj);
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.maxPerCore",
        flags: &["conntrack-max-per-core"],
        kind: Kind::Int32,
        default: Default::WhenNull(Literal::Int(32768)),
        overrides_file: false,
        help: "Conntrack entries per CPU (0 leaves nf_conntrack_max alone)",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.max_per_core = non_negative(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.min",
        flags: &["conntrack-min"],
        kind: Kind::Int32,
        default: Default::WhenNull(Literal::Int(131072)),
        overrides_file: false,
        help: "Least nf_conntrack_max",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.min = non_negative(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.tcpEstablishedTimeout",
        flags: &["conntrack-tcp-timeout-established"],
        kind: Kind::Duration,
        default: Default::WhenNull(Literal::Str("24h0m0s")),
        overrides_file: false,
        help: "Idle timeout of established TCP connections (0 leaves it alone)",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.tcp_established_timeout = duration(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.tcpCloseWaitTimeout",
        flags: &["conntrack-tcp-timeout-close-wait"],
        kind: Kind::Duration,
        default: Default::WhenNull(Literal::Str("1h0m0s")),
        overrides_file: false,
        help: "Timeout of TCP connections in CLOSE_WAIT (0 leaves it alone)",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.tcp_close_wait_timeout = duration(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.tcpBeLiberal",
        flags: &["conntrack-tcp-be-liberal"],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Set nf_conntrack_tcp_be_liberal",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.tcp_be_liberal = v.as_bool().unwrap_or(false);
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.udpTimeout",
        flags: &["conntrack-udp-timeout"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "Idle timeout of unreplied UDP flows (0 leaves it alone)",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.udp_timeout = duration(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "conntrack.udpStreamTimeout",
        flags: &["conntrack-udp-timeout-stream"],
        kind: Kind::Duration,
        default: Default::Zero,
        overrides_file: false,
        help: "Idle timeout of UDP streams (0 leaves it alone)",
        effect: Effect::Apply(|s, v, _| {
            s.conntrack.udp_stream_timeout = duration(v)?;
            Ok(())
        }),
    },
    Setting {
        path: "configSyncPeriod",
        flags: &["config-sync-period"],
        kind: Kind::Duration,
        default: Default::WhenZero(Literal::Str("15m0s")),
        overrides_file: false,
        help: "How often informers re-deliver cached API objects",
        effect: Effect::Checked(
            |_, v, _| {
                if duration(v)?.is_zero() {
                    return Err("must be greater than 0".into());
                }
                Ok(())
            },
            "verdict's watches deliver every change as it happens, and it compares the kernel with its state every syncPeriod (whenever anything was committed since its last sync), so re-delivering cached objects would change nothing",
        ),
    },
    Setting {
        path: "portRange",
        flags: &["proxy-port-range"],
        kind: Kind::Str,
        default: Default::Zero,
        overrides_file: false,
        help: "The userspace proxy's port range",
        effect: Effect::None("it configured the userspace proxy, which no longer exists"),
    },
    Setting {
        path: "windowsRunAsService",
        flags: &[],
        kind: Kind::Bool,
        default: Default::Zero,
        overrides_file: false,
        help: "Windows: run as a service",
        effect: Effect::None(WINDOWS_ONLY),
    },
];

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path)
    }
}

/// The setting at `path`.
pub fn setting(path: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.path == path)
}
