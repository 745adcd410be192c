//! kube-proxy's configuration: the `KubeProxyConfiguration` file
//! (`kubeproxy.config.k8s.io/v1alpha1`) and the flags, decoded, defaulted
//! and merged the way kube-proxy does it, then validated into
//! [`Settings`].
//!
//! - Every setting is defined once, in [`table::SETTINGS`]: path, flags,
//!   kind, default, and what verdict does with it.
//! - The file is decoded strictly first; if that fails only because of
//!   unknown or repeated fields, it is decoded leniently (those fields are
//!   ignored) with a warning, as kube-proxy does. Zero values then take
//!   kube-proxy's v1alpha1 defaults (`syncPeriod: 0s` is 30s, an empty
//!   `healthzBindAddress` is `0.0.0.0:10256`, an IP alone gets the
//!   default port, the default addresses follow an IPv6 `bindAddress`).
//! - Without `--config`, the flags apply over the defaults. With it, the
//!   file wins: only `--hostname-override` and the logging flags still
//!   apply, and the other flags are reported as ignored.
//! - The effective configuration is kept as the v1alpha1 document it
//!   amounts to, for `--write-config-to` and `/configz`.

pub mod gates;
pub mod render;
pub mod table;
pub mod value;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::{Map, Value};
use verdict_proxier::NodePortAddresses;

use self::gates::Gates;
use self::table::{Default, Effect, SETTINGS, Setting};
use self::value::Kind;

/// The API version verdict reads.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The kind verdict reads.
pub const KIND: &str = "KubeProxyConfiguration";
/// kube-proxy's health port (`ports.ProxyHealthzPort`).
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics port (`ports.ProxyStatusPort`).
pub const METRICS_PORT: u16 = 10249;

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

/// How local (pod) traffic is recognised: the node runtime's.
pub use verdict_node::DetectLocal;

/// `detectLocalMode`, before its companion settings are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, std::default::Default)]
pub enum DetectLocalMode {
    /// `ClusterCIDR`.
    #[default]
    ClusterCidr,
    /// `NodeCIDR`.
    NodeCidr,
    /// `BridgeInterface`.
    BridgeInterface,
    /// `InterfaceNamePrefix`.
    InterfaceNamePrefix,
}

/// The log format (`logging.format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, std::default::Default)]
pub enum LogFormat {
    /// klog's text format.
    #[default]
    Text,
    /// component-base's JSON format.
    Json,
}

/// Logging (`logging.*` and the logging flags).
#[derive(Clone, Debug, PartialEq, Eq, std::default::Default)]
pub struct Logging {
    /// Text or JSON.
    pub format: LogFormat,
    /// `-v`.
    pub verbosity: u32,
    /// `--vmodule`: file patterns and their verbosity.
    pub vmodule: Vec<(String, u32)>,
    /// Text format: info to stdout, errors to stderr.
    pub text_split_stream: bool,
    /// JSON format: info to stdout, errors to stderr.
    pub json_split_stream: bool,
}

/// The API client's settings (`clientConnection.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct Client {
    /// `clientConnection.kubeconfig`.
    pub kubeconfig: Option<String>,
    /// Requests per second.
    pub qps: f64,
    /// Burst of requests.
    pub burst: u32,
}

/// kube-proxy's conntrack settings (`conntrack.*`, `--conntrack-*`): the
/// node runtime's.
pub use verdict_node::ConntrackSettings as Conntrack;

/// The validated, effective settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Node name (`hostnameOverride`, trimmed and lower-cased), else the
    /// host name.
    pub hostname_override: Option<String>,
    /// `bindAddress`, when it names a real address: the node's primary IP.
    pub bind_address: Option<IpAddr>,
    /// Masquerade mark bit.
    pub masquerade_bit: u8,
    /// masqueradeAll.
    pub masquerade_all: bool,
    /// Least time between syncs.
    pub min_sync_period: Duration,
    /// Full resync and retry interval (and health timeout basis).
    pub sync_period: Duration,
    /// Local traffic detection.
    pub detect_local: DetectLocal,
    /// NodePort addresses.
    pub node_ports: NodePortAddresses,
    /// `/healthz` and `/livez`; `None` disables.
    pub healthz_bind_address: Option<SocketAddr>,
    /// `/metrics`; `None` disables.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Exit when a health or metrics port cannot be bound.
    pub bind_address_hard_fail: bool,
    /// `/debug/pprof` and `/debug/flags/v`.
    pub enable_profiling: bool,
    /// The API client.
    pub client: Client,
    /// Logging.
    pub logging: Logging,
    /// Feature gates.
    pub feature_gates: Gates,
    /// Conntrack sysctls (`conntrack.*`).
    pub conntrack: Conntrack,
    /// `oomScoreAdj`.
    pub oom_score_adj: Option<i32>,
    /// The effective configuration, as a v1alpha1 document.
    pub effective: Value,
    /// verdict's per-service and per-endpoint counters
    /// (`--service-counters`, verdict's own flag; on by default).
    pub service_counters: bool,
    /// The flow stream (`--flows`, verdict's own; on by default).
    pub flows: bool,
    /// `--flows` or `--flow-log` given: the stream must start.
    pub flows_required: bool,
    /// Where the flow log goes (`--flow-log`: a file, or `-`).
    pub flow_log: Option<String>,
    /// How the flow log is bounded (`--flow-log-max-size`,
    /// `--flow-log-max-backups`, `--flow-log-rate`).
    pub flow_log_limits: verdict_node::flows::FlowLogLimits,
    /// Where the API and the web view are served to other hosts, with a
    /// bearer token (`--api-bind-address`, verdict's own).
    pub api_bind_address: Option<SocketAddr>,
    /// Where Hubble's observer API is served, on loopback
    /// (`--hubble-listen-address`, Cilium's name; `None`: off).
    pub hubble_listen_address: Option<SocketAddr>,
    /// Hubble's API in TLS with client certificates
    /// (`--hubble-tls-cert-file`, `--hubble-tls-key-file`,
    /// `--hubble-tls-client-ca-files`).
    pub hubble_tls: Option<verdict_hubble::tls::TlsFiles>,
    /// The cluster in the TLS names of Hubble's peers (`--cluster-name`).
    pub cluster_name: String,
    /// Which Services get series of their own (`--service-metrics`,
    /// `--service-metrics-namespaces`, `--service-metrics-selector`,
    /// verdict's own; none by default).
    pub service_metrics: verdict_model::MetricsSelection,
    /// How nftables is programmed (`--nftables-backend`, verdict's own).
    pub nftables_backend: NftablesBackend,
    /// Every flag and its value, for `/flagz`.
    pub flagz: std::collections::BTreeMap<String, String>,
    // What the detector is made of, checked into `detect_local`.
    detect_local_mode: DetectLocalMode,
    detect_bridge: String,
    detect_prefix: String,
    cluster_cidrs: Vec<ipnet::IpNet>,
}

/// How verdict reaches nftables (`--nftables-backend`): the nft crate's
/// [`verdict_nft::BackendKind`].
pub use verdict_nft::BackendKind as NftablesBackend;

impl std::default::Default for Settings {
    fn default() -> Settings {
        Settings {
            hostname_override: None,
            bind_address: None,
            masquerade_bit: 14,
            masquerade_all: false,
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            detect_local: DetectLocal::ClusterCidr(Vec::new()),
            node_ports: NodePortAddresses::primary(),
            healthz_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], HEALTHZ_PORT))),
            metrics_bind_address: Some(SocketAddr::from(([127, 0, 0, 1], METRICS_PORT))),
            bind_address_hard_fail: false,
            enable_profiling: false,
            client: Client {
                kubeconfig: None,
                qps: 5.0,
                burst: 10,
            },
            logging: Logging::default(),
            feature_gates: Gates::default(),
            conntrack: Conntrack::default(),
            oom_score_adj: Some(-999),
            effective: Value::Null,
            service_counters: true,
            flows: true,
            flows_required: false,
            flow_log: None,
            flow_log_limits: verdict_node::flows::FlowLogLimits::default(),
            api_bind_address: None,
            hubble_listen_address: Some(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 4244))),
            hubble_tls: None,
            cluster_name: "default".to_owned(),
            service_metrics: verdict_model::MetricsSelection::default(),
            nftables_backend: NftablesBackend::default(),
            flagz: std::collections::BTreeMap::new(),
            detect_local_mode: DetectLocalMode::ClusterCidr,
            detect_bridge: String::new(),
            detect_prefix: String::new(),
            cluster_cidrs: Vec::new(),
        }
    }
}

/// A configuration flag as given on the command line.
#[derive(Clone, Debug)]
pub struct GivenFlag {
    /// The setting it sets.
    pub setting: &'static Setting,
    /// The flag's name (without `--`), as the table spells it.
    pub name: &'static str,
    /// Its value.
    pub value: String,
}

/// What the configuration is made of.
#[derive(Clone, Debug, std::default::Default)]
pub struct Input<'a> {
    /// The text of `--config`, if given.
    pub file: Option<&'a str>,
    /// The configuration flags, in command-line order.
    pub flags: Vec<GivenFlag>,
    /// The deprecated `--healthz-port`, if given.
    pub healthz_port: Option<&'a str>,
    /// The deprecated `--metrics-port`, if given.
    pub metrics_port: Option<&'a str>,
}

/// The settings and what to warn about.
#[derive(Debug)]
pub struct Resolved {
    /// The settings.
    pub settings: Settings,
    /// Warnings, to log once logging is set up.
    pub warnings: Vec<String>,
}

/// Reads, defaults, merges and validates the configuration.
pub fn resolve(input: &Input<'_>) -> Result<Resolved, ConfigError> {
    let mut warnings = Vec::new();
    let mut doc = Value::Object(Map::new());
    // Where each path's value came from, to name it in errors.
    let mut origin: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut from_flags: BTreeSet<&'static str> = BTreeSet::new();
    match input.file {
        Some(text) => {
            let file = decode(text, &mut warnings)?;
            for s in SETTINGS {
                if let Some(v) = get(&file, s.path).filter(|v| !v.is_null()) {
                    let v = s.kind.read_file(v).map_err(|r| bad(s.path, r))?;
                    set(&mut doc, s.path, v);
                }
            }
            let file_vmodule = get(&doc, "logging.vmodule").cloned();
            default_file(&mut doc);
            let (apply, ignored): (Vec<&GivenFlag>, Vec<&GivenFlag>) =
                input.flags.iter().partition(|f| f.setting.overrides_file);
            apply_flags(&mut doc, &apply, &mut origin, &mut from_flags)?;
            // As kube-proxy: the flags' vmodule entries come first, then
            // the file's.
            if from_flags.contains("logging.vmodule")
                && let (Some(Value::Array(mut flags)), Some(Value::Array(file))) =
                    (get(&doc, "logging.vmodule").cloned(), file_vmodule)
            {
                flags.extend(file);
                set(&mut doc, "logging.vmodule", Value::Array(flags));
            }
            let mut names: Vec<String> = ignored.iter().map(|f| format!("--{}", f.name)).collect();
            names.extend(
                [
                    ("healthz-port", input.healthz_port),
                    ("metrics-port", input.metrics_port),
                ]
                .into_iter()
                .filter(|(_, v)| v.is_some())
                .map(|(n, _)| format!("--{n}")),
            );
            let mut seen = BTreeSet::new();
            names.retain(|n| seen.insert(n.clone()));
            if !names.is_empty() {
                warnings.push(format!(
                    "{} ignored because --config is set (as in kube-proxy, the file wins)",
                    names.join(", ")
                ));
            }
        }
        None => {
            // kube-proxy starts from the defaults of an empty configuration
            // and sets the flags over them.
            default_file(&mut doc);
            let flags: Vec<&GivenFlag> = input.flags.iter().collect();
            apply_flags(&mut doc, &flags, &mut origin, &mut from_flags)?;
            deprecated_ports(&mut doc, input, &mut warnings)?;
        }
    }
    platform_defaults(&mut doc);
    let name = |path: &'static str| origin.get(path).cloned().unwrap_or_else(|| path.to_owned());

    let mut s = Settings::default();
    for row in SETTINGS {
        let v = get(&doc, row.path).cloned().unwrap_or(Value::Null);
        let no_effect = match row.effect {
            Effect::Apply(apply) => {
                apply(&mut s, &v, &mut warnings).map_err(|r| bad(&name(row.path), r))?;
                None
            }
            Effect::None(why) => Some(why),
            Effect::Checked(check, why) => {
                check(&mut s, &v, &mut warnings).map_err(|r| bad(&name(row.path), r))?;
                Some(why)
            }
        };
        if let Some(why) = no_effect {
            if from_flags.contains(row.path) {
                warnings.push(format!("{} has no effect: {why}", name(row.path)));
            } else if !same(row.kind, &v, &default_of(row)) {
                warnings.push(format!("{} {v} has no effect: {why}", row.path));
            }
        }
    }
    finish(&mut s, &name)?;
    if get(&doc, "mode").and_then(Value::as_str) == Some("") {
        set(&mut doc, "mode", Value::from("nftables"));
    }
    // The name as it is used (trimmed, lower-cased), as kube-proxy keeps it.
    if let Some(h) = &s.hostname_override {
        set(&mut doc, "hostnameOverride", Value::from(h.as_str()));
    }
    s.effective = doc;
    Ok(Resolved {
        settings: s,
        warnings,
    })
}

/// kube-proxy's deprecated `--healthz-port` and `--metrics-port`, without
/// `--config`: 0 disables the server; another port completes an address
/// given without one (kube-proxy's own port by default), and does nothing
/// to one that has a port.
fn deprecated_ports(
    doc: &mut Value,
    input: &Input<'_>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for (path, flag, given, default) in [
        (
            "healthzBindAddress",
            "--healthz-port",
            input.healthz_port,
            HEALTHZ_PORT,
        ),
        (
            "metricsBindAddress",
            "--metrics-port",
            input.metrics_port,
            METRICS_PORT,
        ),
    ] {
        let port = match given {
            Some(text) => {
                let p: i32 = text
                    .trim()
                    .parse()
                    .map_err(|_| bad(flag, format!("{text:?} is not a port")))?;
                let instead = table::setting(path)
                    .and_then(|s| s.flags.first())
                    .copied()
                    .unwrap_or("");
                warnings.push(format!("{flag} is deprecated: use --{instead}"));
                if p == 0 {
                    set(doc, path, Value::from(""));
                    continue;
                }
                u16::try_from(p).map_err(|_| bad(flag, format!("{p} is not a port")))?
            }
            None => default,
        };
        let addr = get(doc, path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let with_port = append_port_if_needed(&addr, port);
        if given.is_some() && with_port == addr && !addr.is_empty() {
            warnings.push(format!(
                "{flag} has no effect: the address {addr} already has a port"
            ));
        }
        set(doc, path, Value::from(with_port));
    }
    Ok(())
}

/// The checks that involve several settings.
fn finish(s: &mut Settings, name: &dyn Fn(&'static str) -> String) -> Result<(), ConfigError> {
    if s.sync_period < s.min_sync_period {
        return Err(bad(
            &name("nftables.syncPeriod"),
            "must be greater than or equal to nftables.minSyncPeriod",
        ));
    }
    s.detect_local = match s.detect_local_mode {
        DetectLocalMode::ClusterCidr => DetectLocal::ClusterCidr(s.cluster_cidrs.clone()),
        DetectLocalMode::NodeCidr => DetectLocal::NodeCidr,
        DetectLocalMode::BridgeInterface if s.detect_bridge.is_empty() => {
            return Err(bad(
                &name("detectLocal.bridgeInterface"),
                "is required with detectLocalMode BridgeInterface",
            ));
        }
        DetectLocalMode::BridgeInterface => DetectLocal::BridgeInterface(s.detect_bridge.clone()),
        DetectLocalMode::InterfaceNamePrefix if s.detect_prefix.is_empty() => {
            return Err(bad(
                &name("detectLocal.interfaceNamePrefix"),
                "is required with detectLocalMode InterfaceNamePrefix",
            ));
        }
        DetectLocalMode::InterfaceNamePrefix => {
            DetectLocal::InterfaceNamePrefix(s.detect_prefix.clone())
        }
    };
    let alpha = s.feature_gates.enabled(gates::LOGGING_ALPHA_OPTIONS);
    for (on, path) in [
        (
            s.logging.text_split_stream,
            "logging.options.text.splitStream",
        ),
        (
            s.logging.json_split_stream,
            "logging.options.json.splitStream",
        ),
    ] {
        if on && !alpha {
            return Err(bad(
                &name(path),
                "Forbidden: Feature LoggingAlphaOptions is disabled",
            ));
        }
    }
    Ok(())
}

/// Decodes the file: YAML (or JSON), a `KubeProxyConfiguration` of
/// v1alpha1, strictly if it can be, else leniently with a warning.
fn decode(text: &str, warnings: &mut Vec<String>) -> Result<Value, ConfigError> {
    let mut problems = Vec::new();
    let v: Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) if e.to_string().contains("duplicate mapping key") => {
            // Strictly an error; leniently the last one counts.
            let text_of_e = e.to_string();
            let key = text_of_e
                .split("duplicate mapping key: ")
                .nth(1)
                .and_then(|rest| rest.split([',', '\n']).next())
                .unwrap_or("?");
            problems.push(format!("duplicate field {key:?}"));
            let options = serde_saphyr::options! {
                duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
            };
            serde_saphyr::from_str_with_options(text, options)
                .map_err(|e| bad("--config", format!("not valid YAML: {e}")))?
        }
        Err(e) => return Err(bad("--config", format!("not valid YAML: {e}"))),
    };
    if !v.is_object() {
        return Err(bad("--config", "must be a KubeProxyConfiguration object"));
    }
    let text_of = |key: &str| match v.get(key) {
        None | Some(Value::Null) => "nothing".to_owned(),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(other) => other.to_string(),
    };
    if v.get("kind").and_then(Value::as_str) != Some(KIND) {
        return Err(bad(
            "kind",
            format!("must be {KIND}, not {}", text_of("kind")),
        ));
    }
    if v.get("apiVersion").and_then(Value::as_str) != Some(API_VERSION) {
        return Err(bad(
            "apiVersion",
            format!("must be {API_VERSION}, not {}", text_of("apiVersion")),
        ));
    }
    unknown_fields(&v, "", &mut problems)?;
    if !problems.is_empty() {
        warnings.push(format!(
            "using lenient decoding, as strict decoding failed ({}): as in kube-proxy, those fields are ignored",
            problems.join("; ")
        ));
    }
    Ok(v)
}

/// Fields of the file that v1alpha1 does not have (below `prefix`), and an
/// error where an object is expected and something else is there.
fn unknown_fields(v: &Value, prefix: &str, out: &mut Vec<String>) -> Result<(), ConfigError> {
    let Value::Object(map) = v else {
        return Err(bad(prefix, format!("must be an object, not {v}")));
    };
    for (key, child) in map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if prefix.is_empty() && (key == "apiVersion" || key == "kind") {
            continue;
        }
        if SETTINGS.iter().any(|s| s.path == path) {
            continue;
        }
        let inner = format!("{path}.");
        if SETTINGS.iter().any(|s| s.path.starts_with(&inner)) {
            if !child.is_null() {
                unknown_fields(child, &path, out)?;
            }
            continue;
        }
        out.push(format!("unknown field {path:?}"));
    }
    Ok(())
}

/// Sets the flags over `doc`. A repeated list or gates flag adds to what
/// its earlier occurrences gave; otherwise the last one wins.
fn apply_flags(
    doc: &mut Value,
    flags: &[&GivenFlag],
    origin: &mut BTreeMap<&'static str, String>,
    from_flags: &mut BTreeSet<&'static str>,
) -> Result<(), ConfigError> {
    for f in flags {
        let path = f.setting.path;
        // As kube-proxy: an empty --hostname-override is no override.
        if path == "hostnameOverride" && f.value.is_empty() {
            continue;
        }
        let previous = from_flags.contains(path).then(|| get(doc, path)).flatten();
        let v = f
            .setting
            .kind
            .read_flag(&f.value, previous)
            .map_err(|r| bad(&format!("--{}", f.name), r))?;
        set(doc, path, v);
        origin.insert(path, format!("--{}", f.name));
        from_flags.insert(path);
    }
    Ok(())
}

/// kube-proxy's v1alpha1 defaulting (`SetDefaults_KubeProxyConfiguration`
/// and the nftables platform defaults), which also writes out every field,
/// as kube-proxy's encoder does.
fn default_file(doc: &mut Value) {
    for s in SETTINGS {
        let cur = get(doc, s.path).cloned().unwrap_or(Value::Null);
        let new = match s.default {
            Default::WhenZero(l) if s.kind.is_zero(&cur) => l.value(),
            Default::WhenNull(l) if cur.is_null() => l.value(),
            _ if !cur.is_null() => continue,
            _ => zero_of(s.kind),
        };
        if !(new.is_null() && matches!(s.kind, Kind::Gates)) {
            set(doc, s.path, new);
        }
    }
    let bind = get(doc, "bindAddress")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let v6 = matches!(bind.parse::<IpAddr>(), Ok(IpAddr::V6(a)) if a.to_ipv4_mapped().is_none());
    let (healthz, metrics) = if v6 {
        ("[::]", "[::1]")
    } else {
        ("0.0.0.0", "127.0.0.1")
    };
    for (path, host, port) in [
        ("healthzBindAddress", healthz, HEALTHZ_PORT),
        ("metricsBindAddress", metrics, METRICS_PORT),
    ] {
        let cur = get(doc, path).and_then(Value::as_str).unwrap_or_default();
        let new = if cur.is_empty() {
            format!("{host}:{port}")
        } else {
            append_port_if_needed(cur, port)
        };
        set(doc, path, Value::from(new));
    }
}

/// kube-proxy's defaults for nftables mode, applied after the flags
/// (`platformApplyDefaults`): no NodePort addresses means the node's
/// primary ones, no detector mode means ClusterCIDR.
fn platform_defaults(doc: &mut Value) {
    for (path, default) in [
        ("nodePortAddresses", Value::from(vec!["primary"])),
        ("detectLocalMode", Value::from("ClusterCIDR")),
    ] {
        let kind = table::setting(path).map_or(Kind::Str, |s| s.kind);
        if get(doc, path).is_none_or(|v| kind.is_zero(v)) {
            set(doc, path, default);
        }
    }
}

/// A kind's zero value, as Go writes it.
fn zero_of(kind: Kind) -> Value {
    match kind {
        Kind::Str => Value::from(""),
        Kind::Bool => Value::from(false),
        Kind::Int32 | Kind::Uint32 => Value::from(0),
        Kind::Float => Value::from(0.0),
        Kind::Duration | Kind::NanosOrDuration => Value::from("0s"),
        Kind::Quantity => Value::from("0"),
        Kind::List | Kind::Gates | Kind::VModule => Value::Null,
    }
}

/// A setting's default value.
fn default_of(s: &Setting) -> Value {
    match s.default {
        Default::WhenZero(l) | Default::WhenNull(l) => l.value(),
        Default::Zero | Default::Computed => zero_of(s.kind),
    }
}

/// Whether two values of a kind are the same setting.
fn same(kind: Kind, a: &Value, b: &Value) -> bool {
    a == b || (kind.is_zero(a) && kind.is_zero(b))
}

/// kube-proxy's `AppendPortIfNeeded`: an IP alone gets `port` (IPv6 in
/// brackets); anything else is left for validation.
pub fn append_port_if_needed(addr: &str, port: u16) -> String {
    if addr.parse::<SocketAddr>().is_ok() {
        return addr.to_owned();
    }
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Err(_) => addr.to_owned(),
    }
}

/// A bind address: `IP:port`, or empty for none.
fn socket_address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| format!("{text:?} must be IP:port"))
}

/// `nodePortAddresses`: CIDRs and the keywords `primary`, `all` and
/// `localhost`, in any combination (loopback never takes NodePorts in
/// nftables mode).
fn node_ports(list: &[String], warnings: &mut Vec<String>) -> Result<NodePortAddresses, String> {
    let mut out = NodePortAddresses::cidrs(Vec::new());
    let mut loopback = Vec::new();
    for entry in list {
        match entry.as_str() {
            "primary" => out.primary = true,
            "all" => out.cidrs.extend(NodePortAddresses::all().cidrs),
            "localhost" => loopback.push(entry.clone()),
            cidr => {
                let net: ipnet::IpNet = cidr.parse().map_err(|_| {
                    format!("{cidr:?} is not a CIDR or one of primary, all, localhost")
                })?;
                if net.network().is_loopback() && net.prefix_len() > 0 {
                    loopback.push(entry.clone());
                } else {
                    out.cidrs.push(net);
                }
            }
        }
    }
    if !loopback.is_empty() {
        warnings.push(format!(
            "nodePortAddresses {} have no effect: in nftables mode NodePorts are never served on loopback addresses",
            loopback.join(", ")
        ));
    }
    Ok(out)
}

/// The value at a dotted path (`None` if absent).
pub fn get<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Sets the value at a dotted path, creating objects on the way.
fn set(doc: &mut Value, path: &str, value: Value) {
    let mut cur = doc;
    let mut parts = path.split('.').peekable();
    while let Some(key) = parts.next() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else {
            return;
        };
        if parts.peek().is_none() {
            map.insert(key.to_owned(), value);
            return;
        }
        cur = map
            .entry(key.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

#[cfg(test)]
mod tests;
