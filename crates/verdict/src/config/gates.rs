//! Feature gates (`featureGates`, `--feature-gates`). kube-proxy's binary
//! registers every Kubernetes gate; verdict knows the ones that change
//! what a Service proxy does, the logging gates, and what it does under
//! each. A gate it does not know is accepted with a warning (it belongs to
//! another component, or to another Kubernetes version), so that one
//! `--feature-gates` list can be passed to every component, as k3s does.

use std::collections::BTreeMap;

use serde_json::Value;

/// A feature's maturity, as `kubernetes_feature_enabled{stage}` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Alpha: off by default.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available (and locked on).
    Ga,
}

impl Stage {
    /// The label value (`ALPHA`, `BETA`, empty for GA).
    pub fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
        }
    }
}

/// One known gate.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// Its name.
    pub name: &'static str,
    /// Whether it is on by default.
    pub default: bool,
    /// Its maturity.
    pub stage: Stage,
    /// It cannot be changed from its default.
    pub locked: bool,
    /// What verdict does when it is set against its default; `None` when
    /// verdict follows it.
    pub unsupported: Option<&'static str>,
}

/// `LoggingAlphaOptions`: split log streams.
pub const LOGGING_ALPHA_OPTIONS: &str = "LoggingAlphaOptions";
/// `LoggingBetaOptions`: info buffers.
pub const LOGGING_BETA_OPTIONS: &str = "LoggingBetaOptions";

const fn gate(name: &'static str, default: bool, stage: Stage) -> Gate {
    Gate {
        name,
        default,
        stage,
        locked: matches!(stage, Stage::Ga),
        unsupported: None,
    }
}

/// The gates verdict knows.
pub const KNOWN: &[Gate] = &[
    gate(LOGGING_ALPHA_OPTIONS, false, Stage::Alpha),
    gate(LOGGING_BETA_OPTIONS, true, Stage::Beta),
    gate("NFTablesProxyMode", true, Stage::Ga),
    gate("KubeProxyDrainingTerminatingNodes", true, Stage::Ga),
    gate("LoadBalancerIPMode", true, Stage::Ga),
    gate("MultiCIDRServiceAllocator", true, Stage::Ga),
    gate("TopologyAwareHints", true, Stage::Ga),
    gate("ServiceTrafficDistribution", true, Stage::Ga),
    gate("PreferSameTrafficDistribution", true, Stage::Ga),
    Gate {
        unsupported: Some(
            "verdict never serves NodePorts on localhost; loopback nodePortAddresses are ignored",
        ),
        ..gate("KubeProxyNFTablesLocalhostNodePorts", false, Stage::Alpha)
    },
    Gate {
        unsupported: Some(
            "verdict reads the kernel through its own backend; this gate changes nothing",
        ),
        ..gate("NFTablesNetlink", true, Stage::Beta)
    },
    Gate {
        unsupported: Some("verdict has no contextual logging"),
        ..gate("ContextualLogging", true, Stage::Beta)
    },
    Gate {
        unsupported: Some("verdict serves no /flagz page"),
        ..gate("ComponentFlagz", false, Stage::Alpha)
    },
    Gate {
        unsupported: Some("verdict serves no /statusz page"),
        ..gate("ComponentStatusz", false, Stage::Alpha)
    },
];

/// The effective gates: kube-proxy's defaults and what was set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    set: BTreeMap<String, bool>,
}

impl Gates {
    /// Reads `featureGates`. A locked gate set against its default is an
    /// error, as in kube-proxy; an unknown gate, and a gate verdict does
    /// not follow, are warnings.
    pub fn resolve(v: &Value, warnings: &mut Vec<String>) -> Result<Gates, String> {
        let mut set = BTreeMap::new();
        for (name, on) in v.as_object().into_iter().flatten() {
            let on = on.as_bool().unwrap_or(false);
            if matches!(name.as_str(), "AllAlpha" | "AllBeta") {
                set.insert(name.clone(), on);
                continue;
            }
            match KNOWN.iter().find(|g| g.name == name) {
                Some(g) if g.locked && on != g.default => {
                    return Err(format!(
                        "cannot set feature gate {name} to {on}, feature is locked to {}",
                        g.default
                    ));
                }
                Some(g) => {
                    if let (Some(why), true) = (g.unsupported, on != g.default) {
                        warnings.push(format!("feature gate {name}={on} has no effect: {why}"));
                    }
                    set.insert(name.clone(), on);
                }
                None => warnings.push(format!(
                    "feature gate {name} is not one that changes a Service proxy's behaviour: ignored"
                )),
            }
        }
        Ok(Gates { set })
    }

    /// Whether a known gate is on.
    pub fn enabled(&self, name: &str) -> bool {
        let Some(g) = KNOWN.iter().find(|g| g.name == name) else {
            return false;
        };
        if let Some(on) = self.set.get(name) {
            return *on;
        }
        let all = |key: &str| self.set.get(key).copied().unwrap_or(false);
        match g.stage {
            Stage::Alpha if all("AllAlpha") => true,
            Stage::Beta if self.set.contains_key("AllBeta") => all("AllBeta"),
            _ => g.default,
        }
    }

    /// Every known gate with its state, for `kubernetes_feature_enabled`.
    pub fn all(&self) -> impl Iterator<Item = (&'static Gate, bool)> + '_ {
        KNOWN.iter().map(|g| (g, self.enabled(g.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_follow_kube_proxy() {
        let mut w = Vec::new();
        let g = Gates::resolve(
            &serde_json::json!({"LoggingAlphaOptions": true, "SomeKubeletGate": true}),
            &mut w,
        )
        .unwrap();
        assert!(g.enabled(LOGGING_ALPHA_OPTIONS));
        assert!(g.enabled(LOGGING_BETA_OPTIONS), "beta default");
        assert!(w[0].contains("SomeKubeletGate"), "{w:?}");
        let e = Gates::resolve(&serde_json::json!({"NFTablesProxyMode": false}), &mut w);
        assert!(e.unwrap_err().contains("locked to true"));
        let g = Gates::resolve(&serde_json::json!({"AllAlpha": true}), &mut w).unwrap();
        assert!(g.enabled(LOGGING_ALPHA_OPTIONS));
        let mut w = Vec::new();
        Gates::resolve(
            &serde_json::json!({"KubeProxyNFTablesLocalhostNodePorts": true}),
            &mut w,
        )
        .unwrap();
        assert!(w[0].contains("has no effect"), "{w:?}");
    }
}
