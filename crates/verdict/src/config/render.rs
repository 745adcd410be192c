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

/// The effective configuration with its `apiVersion` and `kind`.
fn versioned(effective: &Value) -> Value {
    let mut doc = effective.clone();
    if let Value::Object(m) = &mut doc {
        m.insert("apiVersion".into(), Value::from(API_VERSION));
        m.insert("kind".into(), Value::from(KIND));
    }
    doc
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

/// What `/flagz` shows: every flag of a setting with the setting's
/// effective value (as kube-proxy's flags show the configuration they are
/// bound to, defaults included), and every other flag given, with its
/// value as given. Values as pflag writes them: lists as `[a,b]`, feature
/// gates as `Name=true,Other=false`.
pub fn flagz(effective: &Value, given: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for setting in SETTINGS.iter().filter(|s| !s.flags.is_empty()) {
        let value = setting
            .path
            .split('.')
            .try_fold(effective, |v, part| v.get(part))
            .map_or_else(String::new, flag_text);
        for flag in setting.flags {
            out.insert((*flag).to_owned(), value.clone());
        }
    }
    for (flag, value) in given {
        out.entry(flag.clone()).or_insert_with(|| value.clone());
    }
    out
}

fn flag_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
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
