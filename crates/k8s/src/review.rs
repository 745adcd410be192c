//! Who a bearer token belongs to, and whether they may read this node's
//! verdict API: a TokenReview and a SubjectAccessReview, as
//! kube-rbac-proxy checks a request before it passes it on (with its
//! `--resource-attributes`). The introspection API asks this for every
//! request from another host.
//!
//! The review asks for a resource of verdict's own, the subresource
//! `verdict` of this node's Node ([`RESOURCE`], [`SUBRESOURCE`], named
//! after the node), not for the request's URL path: Kubernetes' bootstrap
//! role `system:discovery`, bound to every authenticated user, lets `get`
//! any non-resource URL under `/api/`, so a path review let any service
//! account (the default one every pod mounts) read every node's traffic.
//! No bootstrap role an ordinary user or service account holds grants
//! `nodes/verdict`; `deploy/`'s `verdict-api-reader` does.
//!
//! Answers are kept for a short time (a token's user for a minute, a
//! decision for 30 s, a refusal for 10 s) so that a web view polling every
//! few seconds costs the API server a review now and then, not one per
//! request; at most [`CACHED`] of each are kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::watch::{ApiSource, SourceError};

/// The resource a reader of the API needs `get` on: a subresource of this
/// node's Node (core group), as the kubelet's API is `nodes/proxy`.
pub const RESOURCE: &str = "nodes";
/// See [`RESOURCE`].
pub const SUBRESOURCE: &str = "verdict";

/// Entries kept per cache; a full cache is emptied.
pub const CACHED: usize = 4096;
/// How long one review may take.
const TIMEOUT: Duration = Duration::from_secs(5);
const USER_TTL: Duration = Duration::from_secs(60);
const ALLOWED_TTL: Duration = Duration::from_secs(30);
const REFUSED_TTL: Duration = Duration::from_secs(10);

/// The API server's answer about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `user` may.
    Allowed {
        /// The token's user.
        user: String,
    },
    /// The token is not one the API server knows (or has expired).
    Unauthenticated(String),
    /// The token's user may not.
    Forbidden {
        /// The token's user.
        user: String,
        /// The authorizer's reason, when it gave one.
        reason: String,
    },
}

#[derive(Clone, Debug)]
struct Identity {
    user: String,
    uid: String,
    groups: Vec<String>,
    /// The authenticator's extra facts (a service account token's pod),
    /// passed on to the access review as the API server would.
    extra: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

/// A cache of answers that expire.
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache {
            entries: HashMap::new(),
        }
    }

    fn get(&self, k: &K, now: Instant) -> Option<V> {
        self.entries
            .get(k)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    fn put(&mut self, k: K, v: V, until: Instant) {
        if self.entries.len() >= CACHED {
            self.entries.clear();
        }
        self.entries.insert(k, (v, until));
    }
}

/// Asks the API server of the source verdict watches, on a runtime of its
/// own; callable from any thread.
pub struct Reviewer {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    /// This node's name: the Node the reviews are about.
    node: String,
    users: Mutex<Cache<String, Result<Identity, String>>>,
    decisions: Mutex<Cache<(String, String), Decision>>,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewer").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Reviewer {
    /// A reviewer for `src`'s API server.
    pub fn new(src: &ApiSource) -> Result<Reviewer, SourceError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("api-review")
            .enable_all()
            .build()
            .map_err(|e| SourceError::Client(e.to_string()))?;
        let config = rt.block_on(crate::watch::client_config(src))?;
        let client = {
            let _guard = rt.enter();
            crate::client::build(config, &src.client)?
        };
        Ok(Reviewer {
            rt,
            client,
            node: src.node_name.clone(),
            users: Mutex::new(Cache::new()),
            decisions: Mutex::new(Cache::new()),
        })
    }

    /// May the bearer of `token` `verb` (`get`) this node's
    /// `nodes/verdict`? `Err`: the API server could not say.
    pub fn review(&self, token: &str, verb: &str) -> Result<Decision, String> {
        let now = Instant::now();
        let cached = lock(&self.users).get(&token.to_owned(), now);
        let identity = match cached {
            Some(i) => i,
            None => {
                let i = self.token_review(token)?;
                let ttl = if i.is_ok() { USER_TTL } else { REFUSED_TTL };
                lock(&self.users).put(token.to_owned(), i.clone(), now + ttl);
                i
            }
        };
        let id = match identity {
            Ok(id) => id,
            Err(why) => return Ok(Decision::Unauthenticated(why)),
        };
        let key = (id.user.clone(), verb.to_owned());
        if let Some(d) = lock(&self.decisions).get(&key, now) {
            return Ok(d);
        }
        let d = self.access_review(&id, verb)?;
        let ttl = if matches!(d, Decision::Allowed { .. }) {
            ALLOWED_TTL
        } else {
            REFUSED_TTL
        };
        lock(&self.decisions).put(key, d.clone(), now + ttl);
        Ok(d)
    }

    fn token_review(&self, token: &str) -> Result<Result<Identity, String>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = self
            .rt
            .block_on(async {
                tokio::time::timeout(TIMEOUT, api.create(&PostParams::default(), &review)).await
            })
            .map_err(|_| "the TokenReview took too long".to_owned())?
            .map_err(|e| format!("TokenReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Err(status
                .error
                .unwrap_or_else(|| "the token is not authenticated".into())));
        }
        let user = status.user.unwrap_or_default();
        Ok(Ok(Identity {
            user: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra,
        }))
    }

    fn access_review(&self, id: &Identity, verb: &str) -> Result<Decision, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(id.user.clone()),
                uid: Some(id.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(id.groups.clone()),
                extra: id.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(String::new()),
                    resource: Some(RESOURCE.to_owned()),
                    subresource: Some(SUBRESOURCE.to_owned()),
                    name: Some(self.node.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = self
            .rt
            .block_on(async {
                tokio::time::timeout(TIMEOUT, api.create(&PostParams::default(), &review)).await
            })
            .map_err(|_| "the SubjectAccessReview took too long".to_owned())?
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        Ok(if status.allowed {
            Decision::Allowed {
                user: id.user.clone(),
            }
        } else {
            Decision::Forbidden {
                user: id.user.clone(),
                reason: status.reason.unwrap_or_default(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_expires_and_empties_when_full() {
        let mut c: Cache<u32, u32> = Cache::new();
        let t = Instant::now();
        c.put(1, 10, t + Duration::from_secs(1));
        assert_eq!(c.get(&1, t), Some(10));
        assert_eq!(c.get(&1, t + Duration::from_secs(2)), None, "expired");
        for k in 0..CACHED as u32 {
            c.put(k, k, t + Duration::from_secs(9));
        }
        assert_eq!(c.entries.len(), CACHED);
        c.put(99_999, 1, t + Duration::from_secs(9));
        assert_eq!(c.entries.len(), 1, "a full cache starts again");
    }
}
