//! Which Services get series of their own on `/metrics`
//! (`--service-metrics`, `--service-metrics-namespaces`,
//! `--service-metrics-selector`), and the Kubernetes label selectors that
//! choose them.
//!
//! By default no Service does: `/metrics` holds the node's totals, whose
//! number does not grow with the cluster. An operator names the level
//! (`service`: per entry point; `endpoint`: also per endpoint) and, to
//! scope it, namespaces and a label selector; the kernel then counts
//! those Services, and only those, per Service.

use std::collections::BTreeMap;
use std::fmt;

use crate::api::Service;

/// How finely a Service's traffic is counted and exported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Counting {
    /// Only in the node's totals.
    #[default]
    None,
    /// Per entry point (ClusterIP, externalIP, LoadBalancer VIP, NodePort
    /// on a node address): connections, packets and bytes; rejects and
    /// drops per Service.
    Service,
    /// Also per endpoint.
    Endpoint,
}

impl Counting {
    /// As the flag spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Counting::None => "none",
            Counting::Service => "service",
            Counting::Endpoint => "endpoint",
        }
    }
}

impl std::str::FromStr for Counting {
    type Err = String;
    fn from_str(s: &str) -> Result<Counting, String> {
        match s {
            "none" => Ok(Counting::None),
            "service" => Ok(Counting::Service),
            "endpoint" => Ok(Counting::Endpoint),
            other => Err(format!(
                "{other:?}: give none, service (per entry point) or endpoint (also per endpoint)"
            )),
        }
    }
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    /// `key` (`true`) or `!key` (`false`).
    Exists(String, bool),
    /// `key in (…)` / `key=v` (`true`), `key notin (…)` / `key!=v`
    /// (`false`).
    In(String, Vec<String>, bool),
}

/// A Kubernetes label selector, as `kubectl -l` takes it: requirements
/// joined by commas, each `key`, `!key`, `key=value` (or `==`),
/// `key!=value`, `key in (a,b)` or `key notin (a,b)`. Every requirement
/// must hold; the empty selector selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    text: String,
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 characters of `[A-Za-z0-9_.-]` that begins and ends with an
/// alphanumeric.
fn valid_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    }) && valid_value(name)
        && !name.is_empty()
}

/// A label value: empty, or at most 63 characters of `[A-Za-z0-9_.-]`
/// that begin and end with an alphanumeric.
fn valid_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced parentheses".into());
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

impl std::str::FromStr for LabelSelector {
    type Err = String;
    fn from_str(s: &str) -> Result<LabelSelector, String> {
        let text = s.trim();
        let mut requirements = Vec::new();
        if text.is_empty() {
            return Ok(LabelSelector::default());
        }
        for part in split_top(text)? {
            let part = part.trim();
            let bad = |why: &str| format!("{part:?}: {why}");
            let key_ok = |k: &str| {
                if valid_key(k) {
                    Ok(k.to_owned())
                } else {
                    Err(bad("not a valid label key"))
                }
            };
            let value_ok = |v: &str| {
                let v = v.trim();
                if valid_value(v) {
                    Ok(v.to_owned())
                } else {
                    Err(bad("not a valid label value"))
                }
            };
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad("a set of values is written (a,b)"))?;
                inner.split(',').map(value_ok).collect()
            };
            let words: Vec<&str> = part.split_whitespace().collect();
            let r = if let Some(k) = part.strip_prefix('!') {
                Requirement::Exists(key_ok(k.trim())?, false)
            } else if words.len() >= 2 && (words[1] == "in" || words[1] == "notin") {
                let rest = part[part.find(words[1]).unwrap_or(0) + words[1].len()..].trim();
                Requirement::In(key_ok(words[0])?, set(rest)?, words[1] == "in")
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::In(key_ok(k.trim())?, vec![value_ok(v)?], false)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::In(key_ok(k.trim())?, vec![value_ok(v)?], true)
            } else {
                Requirement::Exists(key_ok(part)?, true)
            };
            requirements.push(r);
        }
        Ok(LabelSelector {
            requirements,
            text: text.to_owned(),
        })
    }
}

impl LabelSelector {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Exists(k, want) => labels.contains_key(k) == *want,
            Requirement::In(k, values, true) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::In(k, values, false) => labels.get(k).is_none_or(|v| !values.contains(v)),
        })
    }

    /// Whether it has no requirement (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Which Services are counted per Service, and how finely.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSelection {
    /// The level for the Services chosen.
    pub level: Counting,
    /// Only these namespaces (empty: every namespace).
    pub namespaces: Vec<String>,
    /// Only Services whose labels match (empty: every Service).
    pub selector: LabelSelector,
}

impl MetricsSelection {
    /// The level `svc` is counted at.
    pub fn level_for(&self, svc: &Service) -> Counting {
        let chosen = self.level != Counting::None
            && (self.namespaces.is_empty() || self.namespaces.contains(&svc.namespace))
            && self.selector.matches(&svc.labels);
        if chosen { self.level } else { Counting::None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        s.parse().unwrap()
    }

    #[test]
    fn selectors_follow_kubectl() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("example.com/team", "a")]);
        for (s, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (web, db)", true),
            ("app notin (web,db)", false),
            ("app in (db)", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("example.com/team=a", true),
            ("tier in (front),app", true),
        ] {
            assert_eq!(sel(s).matches(&l), want, "{s:?}");
        }
    }

    #[test]
    fn bad_selectors_are_refused_with_the_part_named() {
        for bad in [
            "app in web",
            "app in (web",
            "=web",
            "app=we b",
            "-app=web",
            "app=web-",
            "Example.com/team=a",
        ] {
            let e = bad.parse::<LabelSelector>().unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
        }
        assert_eq!(sel(" app=web ").to_string(), "app=web");
    }

    #[test]
    fn a_selection_chooses_by_namespace_and_labels() {
        let svc = |ns: &str, l: &[(&str, &str)]| Service {
            namespace: ns.into(),
            name: "s".into(),
            labels: labels(l),
            ..Service::default()
        };
        let none = MetricsSelection::default();
        assert_eq!(none.level_for(&svc("shop", &[])), Counting::None);
        let all = MetricsSelection {
            level: Counting::Service,
            ..MetricsSelection::default()
        };
        assert_eq!(all.level_for(&svc("any", &[])), Counting::Service);
        let scoped = MetricsSelection {
            level: Counting::Endpoint,
            namespaces: vec!["shop".into()],
            selector: sel("tier=front"),
        };
        assert_eq!(
            scoped.level_for(&svc("shop", &[("tier", "front")])),
            Counting::Endpoint
        );
        assert_eq!(scoped.level_for(&svc("shop", &[])), Counting::None);
        assert_eq!(
            scoped.level_for(&svc("other", &[("tier", "front")])),
            Counting::None
        );
        assert_eq!("endpoint".parse(), Ok(Counting::Endpoint));
        assert!("all".parse::<Counting>().is_err());
    }
}
