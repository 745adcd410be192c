//! The effective configuration, written out: as a v1alpha1 file
//! (`--write-config-to`, which kube-proxy writes the same way: every field,
//! defaults filled in) and as `/configz` shows it (the same object, under
//! `kubeproxy.config.k8s.io`).

use serde_json::{Map, Value};

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
