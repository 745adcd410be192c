//! The effective configuration, written out: as a v1alpha1 file
//! (`--write-config-to`, which kube-proxy writes the same way: every field,
//! defaults filled in) and as `/configz` shows it (kube-proxy's internal
//! configuration under `kubeproxy.config.k8s.io`, with Go's field names).

use serde_json::{Map, Value};

use super::table::SETTINGS;
use super::{API_VERSION, KIND, get};

/// The effective configuration as a `KubeProxyConfiguration` file.
pub fn v1alpha1_yaml(effective: &Value) -> Result<String, String> {
    let mut doc = effective.clone();
    if let Value::Object(m) = &mut doc {
        m.insert("apiVersion".into(), Value::from(API_VERSION));
        m.insert("kind".into(), Value::from(KIND));
    }
    serde_saphyr::to_string(&doc).map_err(|e| e.to_string())
}

/// What `/configz` answers.
pub fn configz(effective: &Value) -> Value {
    let mut internal = Value::Object(Map::new());
    for s in SETTINGS.iter().filter(|s| !s.internal.is_empty()) {
        let mut v = get(effective, s.path).cloned().unwrap_or(Value::Null);
        if s.path == "clusterCIDR" {
            // Internally a list, split on commas.
            v = match v.as_str().filter(|c| !c.is_empty()) {
                Some(text) => Value::from(text.split(',').collect::<Vec<_>>()),
                None => Value::Null,
            };
        }
        super::set(&mut internal, s.internal, v);
    }
    let mut out = Map::new();
    out.insert("kubeproxy.config.k8s.io".into(), internal);
    Value::Object(out)
}
