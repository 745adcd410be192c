//! The fake API server's authentication and authorization: the bearer
//! tokens a test gave it, and the ClusterRoles and ClusterRoleBindings it
//! was sent, evaluated for TokenReviews and SubjectAccessReviews as the
//! real API server's token authenticator and RBAC authorizer do for what
//! verdict asks (a token's user, and whether that user may `get` a path or
//! a resource). Only cluster-wide RBAC is modelled: verdict's grants are
//! ClusterRoles.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Who a token authenticates as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// `alice`, or `system:serviceaccount:NS:NAME`.
    pub username: String,
    /// Its groups, besides `system:authenticated` (always added).
    pub groups: Vec<String>,
}

/// Tokens, roles and bindings.
#[derive(Debug, Default)]
pub struct Rbac {
    tokens: BTreeMap<String, User>,
    roles: BTreeMap<String, Value>,
    bindings: BTreeMap<String, Value>,
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A rule's list holds `want` (or `*`).
fn holds(list: &Value, want: &str) -> bool {
    strings(list).iter().any(|x| *x == "*" || *x == want)
}

/// A `nonResourceURLs` entry matches `path`: exactly, or as a prefix when
/// it ends in `*`.
fn url_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

impl Rbac {
    /// `token` authenticates as `user`.
    pub fn add_token(&mut self, token: &str, user: User) {
        self.tokens.insert(token.to_owned(), user);
    }

    /// Keeps a ClusterRole or ClusterRoleBinding; `false` for any other
    /// kind (not this module's).
    pub fn apply(&mut self, obj: &Value) -> bool {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match obj["kind"].as_str() {
            Some("ClusterRole") => {
                self.roles.insert(name, obj.clone());
                true
            }
            Some("ClusterRoleBinding") => {
                self.bindings.insert(name, obj.clone());
                true
            }
            _ => false,
        }
    }

    /// Answers a TokenReview: its `status`.
    pub fn token_review(&self, review: &Value) -> Value {
        let token = review["spec"]["token"].as_str().unwrap_or_default();
        match self.tokens.get(token) {
            Some(u) => {
                let mut groups = u.groups.clone();
                groups.push("system:authenticated".into());
                json!({
                    "authenticated": true,
                    "user": {"username": u.username, "uid": format!("uid-{}", u.username), "groups": groups},
                })
            }
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        }
    }

    /// Answers a SubjectAccessReview: its `status`.
    pub fn access_review(&self, review: &Value) -> Value {
        let spec = &review["spec"];
        let user = spec["user"].as_str().unwrap_or_default();
        let groups = strings(&spec["groups"]);
        let subject_is = |s: &Value| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str() {
                Some("User") => name == user,
                Some("Group") => groups.contains(&name),
                Some("ServiceAccount") => {
                    let ns = s["namespace"].as_str().unwrap_or_default();
                    user == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        };
        let rule_allows = |r: &Value| {
            if let Some(attrs) = spec.get("nonResourceAttributes") {
                let path = attrs["path"].as_str().unwrap_or_default();
                let verb = attrs["verb"].as_str().unwrap_or_default();
                holds(&r["verbs"], verb)
                    && strings(&r["nonResourceURLs"])
                        .iter()
                        .any(|p| url_matches(p, path))
            } else {
                let a = &spec["resourceAttributes"];
                let text = |k: &str| a[k].as_str().unwrap_or_default();
                // As RBAC: a subresource is `resource/subresource`, and
                // resourceNames, when given, must hold the name.
                let resource = match text("subresource") {
                    "" => text("resource").to_owned(),
                    sub => format!("{}/{sub}", text("resource")),
                };
                let names = strings(&r["resourceNames"]);
                holds(&r["verbs"], text("verb"))
                    && holds(&r["apiGroups"], text("group"))
                    && holds(&r["resources"], &resource)
                    && (names.is_empty() || names.contains(&text("name")))
            }
        };
        let granted_by = self.bindings.values().find_map(|b| {
            let bound = b["subjects"]
                .as_array()
                .is_some_and(|s| s.iter().any(subject_is));
            let role = b["roleRef"]["name"].as_str().unwrap_or_default();
            let allows = bound
                && b["roleRef"]["kind"].as_str() == Some("ClusterRole")
                && self.roles.get(role).is_some_and(|r| {
                    r["rules"]
                        .as_array()
                        .is_some_and(|rules| rules.iter().any(rule_allows))
                });
            allows.then(|| {
                b["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
        });
        match granted_by {
            Some(binding) => json!({
                "allowed": true,
                "reason": format!("RBAC: allowed by ClusterRoleBinding \"{binding}\""),
            }),
            None => json!({"allowed": false, "reason": ""}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rbac() -> Rbac {
        let mut r = Rbac::default();
        r.add_token(
            "t-alice",
            User {
                username: "alice".into(),
                groups: vec!["ops".into()],
            },
        );
        r.apply(&json!({
            "kind": "ClusterRole", "metadata": {"name": "reader"},
            "rules": [{"nonResourceURLs": ["/api/v1/*", "/ui"], "verbs": ["get"]}],
        }));
        r.apply(&json!({
            "kind": "ClusterRoleBinding", "metadata": {"name": "ops-read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "Group", "name": "ops"}],
        }));
        r
    }

    fn sar(user: &str, groups: &[&str], path: &str, verb: &str) -> Value {
        json!({"spec": {"user": user, "groups": groups, "nonResourceAttributes": {"path": path, "verb": verb}}})
    }

    #[test]
    fn tokens_authenticate_as_their_user() {
        let r = rbac();
        let ok = r.token_review(&json!({"spec": {"token": "t-alice"}}));
        assert_eq!(ok["authenticated"], true);
        assert_eq!(ok["user"]["username"], "alice");
        assert_eq!(ok["user"]["groups"], json!(["ops", "system:authenticated"]));
        let no = r.token_review(&json!({"spec": {"token": "nope"}}));
        assert_eq!(no["authenticated"], false);
    }

    #[test]
    fn non_resource_urls_are_granted_by_binding_and_prefix() {
        let r = rbac();
        assert_eq!(
            r.access_review(&sar("alice", &["ops"], "/api/v1/trace", "get"))["allowed"],
            true
        );
        assert_eq!(
            r.access_review(&sar("alice", &["ops"], "/ui", "get"))["allowed"],
            true
        );
        // Not the verb, not under the prefix, not bound.
        for (user, groups, path, verb) in [
            ("alice", &["ops"][..], "/api/v1/trace", "post"),
            ("alice", &["ops"], "/uix", "get"),
            ("alice", &["ops"], "/metrics", "get"),
            ("bob", &[], "/api/v1/trace", "get"),
        ] {
            assert_eq!(
                r.access_review(&sar(user, groups, path, verb))["allowed"],
                false,
                "{user} {verb} {path}"
            );
        }
    }

    #[test]
    fn service_accounts_and_resource_rules() {
        let mut r = Rbac::default();
        r.apply(&json!({
            "kind": "ClusterRole", "metadata": {"name": "auth-delegator"},
            "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}],
        }));
        r.apply(&json!({
            "kind": "ClusterRoleBinding", "metadata": {"name": "verdict"},
            "roleRef": {"kind": "ClusterRole", "name": "auth-delegator"},
            "subjects": [{"kind": "ServiceAccount", "namespace": "kube-system", "name": "verdict"}],
        }));
        let review = |user: &str| json!({"spec": {"user": user, "resourceAttributes": {"verb": "create", "group": "authentication.k8s.io", "resource": "tokenreviews"}}});
        assert_eq!(
            r.access_review(&review("system:serviceaccount:kube-system:verdict"))["allowed"],
            true
        );
        assert_eq!(
            r.access_review(&review("system:serviceaccount:default:verdict"))["allowed"],
            false
        );
    }

    #[test]
    fn subresources_and_resource_names_are_matched_as_rbac_matches_them() {
        let mut r = Rbac::default();
        r.apply(&json!({
            "kind": "ClusterRole", "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes/verdict"], "verbs": ["get"],
                       "resourceNames": ["node-a"]}],
        }));
        r.apply(&json!({
            "kind": "ClusterRoleBinding", "metadata": {"name": "reader"},
            "roleRef": {"kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "User", "name": "alice"}],
        }));
        let review = |sub: &str, name: &str| {
            json!({"spec": {"user": "alice", "resourceAttributes": {
            "verb": "get", "group": "", "resource": "nodes", "subresource": sub, "name": name}}})
        };
        assert_eq!(
            r.access_review(&review("verdict", "node-a"))["allowed"],
            true
        );
        assert_eq!(
            r.access_review(&review("verdict", "node-b"))["allowed"],
            false
        );
        assert_eq!(
            r.access_review(&review("proxy", "node-a"))["allowed"],
            false
        );
        assert_eq!(r.access_review(&review("", "node-a"))["allowed"], false);
    }
}
