//! The effective configuration, written out: as a v1alpha1 file
//! (`--write-config-to`, which kube-proxy writes the same way: every field,
//! defaults filled in) and as `/configz` shows it (the same object, under
//! `kubeproxy.config.k8s.io`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::table::SETTINGS;
use super::{API_VERSION, KIND};

/// The effective configuration as a `KubeProxyConfiguration` file.
pub fn v1alpha1_yaml(effective: &Value) -> Result<String, String> {
    serde_saphyr::to_string(&versioned(effective)).map_err(|e| e.to_string())
}

/// The fields kube-proxy's v1alpha1 type leaves out when they hold their
/// zero value (`omitempty`).
const OMITTED_WHEN_ZERO: [&str; 4] = [
    "logging.vmodule",
    "logging.options.text.splitStream",
    "logging.options.json.splitStream",
    "windowsRunAsService",
];

/// The effective configuration with its `apiVersion` and `kind`, as
/// kube-proxy 1.36 writes its object: the `omitempty` fields left out
/// when zero, whole numbers written whole (`qps: 5`, as Go writes a
/// float32 of 5).
fn versioned(effective: &Value) -> Value {
    let mut doc = effective.clone();
    for path in OMITTED_WHEN_ZERO {
        let (parent, leaf) = path.rsplit_once('.').unwrap_or(("", path));
        let holder = if parent.is_empty() {
            Some(&mut doc)
        } else {
            parent
                .split('.')
                .try_fold(&mut doc, |v, part| v.get_mut(part))
        };
        if let Some(Value::Object(m)) = holder
            && m.get(leaf).is_some_and(is_zero)
        {
            m.remove(leaf);
        }
    }
    whole_numbers(&mut doc);
    if let Value::Object(m) = &mut doc {
        m.insert("apiVersion".into(), Value::from(API_VERSION));
        m.insert("kind".into(), Value::from(KIND));
    }
    doc
}

/// Go's zero value: null, false, 0, "" or an empty list or map.
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
    }
}

/// Floats that are whole become integers (`5.0` is written `5`).
fn whole_numbers(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 && f.abs() < 1e15 {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(whole_numbers),
        Value::Object(m) => m.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// What `/configz` answers: as kube-proxy 1.36, the running
/// configuration as the versioned object a file holds (`kind`,
/// `apiVersion`, camelCase fields, every default filled in), under the
/// component's name.
pub fn configz(effective: &Value) -> Value {
    let mut out = Map::new();
    out.insert("kubeproxy.config.k8s.io".into(), versioned(effective));
    Value::Object(out)
}

/// kube-proxy 1.36's flags, each with what its `/flagz` shows when the
/// command line does not give it: recorded from the real kube-proxy
/// (`../shared/bin`, `crates/verdict/tests/realapi_kernel.rs` checks it
/// against the running binary). These are the flags' own defaults, not
/// the configuration's: kube-proxy's `/flagz` shows what the command line
/// set, whatever `--config` holds (`proxy-mode` stays empty, for one).
pub const KUBE_PROXY_FLAGS: [(&str, &str); 59] = [
    ("bind-address", "0.0.0.0"),
    ("bind-address-hard-fail", "false"),
    ("boot-id-file", "/proc/sys/kernel/random/boot_id"),
    ("cleanup", "false"),
    ("cluster-cidr", ""),
    ("config", ""),
    ("config-sync-period", "15m0s"),
    ("conntrack-max-per-core", "32768"),
    ("conntrack-min", "131072"),
    ("conntrack-tcp-be-liberal", "false"),
    ("conntrack-tcp-timeout-close-wait", "1h0m0s"),
    ("conntrack-tcp-timeout-established", "24h0m0s"),
    ("conntrack-udp-timeout", "0s"),
    ("conntrack-udp-timeout-stream", "0s"),
    ("detect-local-mode", ""),
    ("feature-gates", ""),
    ("healthz-bind-address", "0.0.0.0:10256"),
    ("healthz-port", "10256"),
    ("help", "false"),
    ("hostname-override", ""),
    ("init-only", "false"),
    ("iptables-localhost-nodeports", "true"),
    ("iptables-masquerade-bit", "14"),
    ("iptables-min-sync-period", "1s"),
    ("iptables-sync-period", "30s"),
    ("ipvs-exclude-cidrs", "[]"),
    ("ipvs-min-sync-period", "1s"),
    ("ipvs-scheduler", ""),
    ("ipvs-strict-arp", "false"),
    ("ipvs-sync-period", "30s"),
    ("ipvs-tcp-timeout", "0s"),
    ("ipvs-tcpfin-timeout", "0s"),
    ("ipvs-udp-timeout", "0s"),
    ("kube-api-burst", "10"),
    (
        "kube-api-content-type",
        "application/vnd.kubernetes.protobuf",
    ),
    ("kube-api-qps", "5"),
    ("kubeconfig", ""),
    ("log-flush-frequency", "5s"),
    ("log-json-info-buffer-size", "0"),
    ("log-json-split-stream", "false"),
    ("log-text-info-buffer-size", "0"),
    ("log-text-split-stream", "false"),
    ("logging-format", "text"),
    (
        "machine-id-file",
        "/etc/machine-id,/var/lib/dbus/machine-id",
    ),
    ("masquerade-all", "false"),
    ("master", ""),
    ("metrics-bind-address", "127.0.0.1:10249"),
    ("metrics-port", "10249"),
    ("nodeport-addresses", "[]"),
    ("oom-score-adj", "-999"),
    ("pod-bridge-interface", ""),
    ("pod-interface-name-prefix", ""),
    ("profiling", "false"),
    ("proxy-mode", ""),
    ("show-hidden-metrics-for-version", ""),
    ("v", "0"),
    ("version", "false"),
    ("vmodule", ""),
    ("write-config-to", ""),
];

/// What `/flagz` shows, as kube-proxy's does: every one of kube-proxy's
/// flags with its own default ([`KUBE_PROXY_FLAGS`]), and each flag given
/// on the command line (verdict's own too) with its value as the flag's
/// type writes it (`1m` as `1m0s`, a list as `[a,b]`, feature gates
/// sorted), read from `flags_only`: the configuration the flags alone
/// make, without `--config` (the file does not change what a flag says).
///
/// Without `--config`, kube-proxy's flags are bound to the configuration
/// it runs, which it defaults after parsing them: `detect-local-mode`
/// then shows the mode it defaulted to (`ClusterCIDR` with a cluster
/// CIDR), as here. (It also shows `nodeport-addresses` as the node
/// addresses it resolved `primary` to, which verdict does not:
/// docs/configuration.md.)
pub fn flagz(flags_only: Option<&Value>, given: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = KUBE_PROXY_FLAGS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let with_file = given.iter().any(|(k, _)| k == "config");
    if !with_file
        && let Some(mode) = flags_only
            .and_then(|v| v.get("detectLocalMode"))
            .and_then(Value::as_str)
    {
        out.insert("detect-local-mode".into(), mode.to_owned());
    }
    for (flag, raw) in given {
        let typed = SETTINGS
            .iter()
            .find(|s| s.flags.contains(&flag.as_str()))
            .and_then(|s| {
                s.path
                    .split('.')
                    .try_fold(flags_only?, |v, part| v.get(part))
            })
            .map(flag_text);
        out.insert(flag.clone(), typed.unwrap_or_else(|| raw.clone()));
    }
    out
}

fn flag_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        // As Go prints a float: `5`, not `5.0`.
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 && f.abs() < 1e15 {
                format!("{}", f as i64)
            } else {
                f.to_string()
            }
        }
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(flag_text).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", flag_text(v)))
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}
