//! Who may read the introspection API and the web view, and how often the
//! expensive answers are given.
//!
//! They reveal traffic: every client's address and port (`connections`),
//! where any packet goes (`trace`), whole tables (`explain --full`,
//! `drift`). So by default they answer loopback clients only, the node
//! itself. With `--api-bind-address` they are served to others too, and
//! each request from another host needs a Kubernetes bearer token that the
//! API server authenticates (TokenReview) and lets `get` the request's
//! path (SubjectAccessReview), the checks kube-rbac-proxy makes; the RBAC
//! to grant is in `deploy/`. `/metrics`, health and `/configz` are not
//! behind this: they keep kube-proxy's behaviour.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use verdict_admin::Response;
use verdict_admin::http::Request;

/// What the API server says about a request's token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authorization {
    /// Answer it.
    Allowed,
    /// The token is not valid (401).
    Unauthenticated(String),
    /// Its user may not read the path (403).
    Forbidden(String),
    /// The API server could not say (503).
    Unavailable(String),
}

/// Checks a bearer token against the API server.
pub trait Authorizer: Send + Sync {
    /// May the bearer of `token` `verb` the path?
    fn authorize(&self, token: &str, path: &str, verb: &str) -> Authorization;
}

/// Who the API and the web view answer.
#[derive(Clone)]
pub enum Exposure {
    /// Loopback clients only (the default).
    Loopback,
    /// Loopback clients, and others whose bearer token the authorizer
    /// accepts for the path.
    Authenticated(Arc<dyn Authorizer>),
}

impl std::fmt::Debug for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exposure::Loopback => "Loopback",
            Exposure::Authenticated(_) => "Authenticated",
        })
    }
}

fn refusal(code: u16, why: &str) -> Response {
    Response::json(code, serde_json::json!({ "error": why }).to_string())
}

/// The RBAC verb of an HTTP method, as the API server maps them for
/// non-resource requests.
fn verb(method: &str) -> String {
    match method {
        "GET" | "HEAD" => "get".into(),
        "POST" => "create".into(),
        "PUT" => "update".into(),
        "PATCH" => "patch".into(),
        "DELETE" => "delete".into(),
        other => other.to_lowercase(),
    }
}

/// The request's bearer token, if it sent one.
fn bearer(req: &Request) -> Option<&str> {
    let value = req.header("authorization")?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn is_loopback(peer: Option<SocketAddr>) -> bool {
    // No peer: a request made in-process (tests, the offline commands).
    peer.is_none_or(|p| match p.ip() {
        std::net::IpAddr::V4(a) => a.is_loopback(),
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|m| m.is_loopback())
        }
    })
}

/// `Ok` if `req` may be answered, else the refusal to send.
pub fn admit(exposure: &Exposure, req: &Request) -> Result<(), Response> {
    if is_loopback(req.peer) {
        return Ok(());
    }
    let authorizer = match exposure {
        Exposure::Loopback => {
            return Err(refusal(
                403,
                "the API and the web view answer loopback clients only: start verdict with \
                 --api-bind-address to serve them to other hosts, with a Kubernetes bearer token",
            ));
        }
        Exposure::Authenticated(a) => a,
    };
    let Some(token) = bearer(req) else {
        let mut r = refusal(
            401,
            "send a Kubernetes bearer token (Authorization: Bearer TOKEN) that RBAC lets get this path",
        );
        r.headers
            .push(("www-authenticate", "Bearer realm=\"verdict\"".into()));
        return Err(r);
    };
    match authorizer.authorize(token, &req.path, &verb(&req.method)) {
        Authorization::Allowed => Ok(()),
        Authorization::Unauthenticated(why) => {
            let mut r = refusal(401, &format!("the token is not valid: {why}"));
            r.headers
                .push(("www-authenticate", "Bearer realm=\"verdict\"".into()));
            Err(r)
        }
        Authorization::Forbidden(why) => Err(refusal(403, &why)),
        Authorization::Unavailable(why) => Err(refusal(
            503,
            &format!("cannot check the token with the API server: {why}"),
        )),
    }
}

/// Limits answers that read whole tables: one at a time, and no more than
/// a burst of [`Limiter::BURST`] then one every [`Limiter::EVERY`], so a
/// web view left open or a script in a loop cannot keep the node reading
/// its tables. Over the limit, 429 with `Retry-After`.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    busy: bool,
}

/// One answer's turn; the next may start once it is dropped.
#[derive(Debug)]
pub struct Turn<'a>(&'a Limiter);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.bucket().busy = false;
    }
}

impl Default for Limiter {
    fn default() -> Limiter {
        Limiter::new(Instant::now())
    }
}

impl Limiter {
    /// Whole-table answers in a row before the limit.
    pub const BURST: f64 = 3.0;
    /// One more after each of these.
    pub const EVERY: Duration = Duration::from_secs(10);

    fn new(now: Instant) -> Limiter {
        Limiter {
            state: Mutex::new(Bucket {
                tokens: Self::BURST,
                at: now,
                busy: false,
            }),
        }
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A turn now, or the refusal (429) saying when to try again.
    pub fn turn(&self, now: Instant) -> Result<Turn<'_>, Response> {
        let mut b = self.bucket();
        let refill = now.saturating_duration_since(b.at).as_secs_f64() / Self::EVERY.as_secs_f64();
        b.tokens = (b.tokens + refill).min(Self::BURST);
        b.at = now;
        let wait = if b.busy {
            Some(1)
        } else if b.tokens < 1.0 {
            Some(((1.0 - b.tokens) * Self::EVERY.as_secs_f64()).ceil() as u64)
        } else {
            None
        };
        if let Some(secs) = wait {
            let mut r = refusal(
                429,
                &format!(
                    "whole-table answers are limited to one at a time and one every {} s: try again in {secs} s",
                    Self::EVERY.as_secs()
                ),
            );
            r.headers.push(("retry-after", secs.to_string()));
            return Err(r);
        }
        b.tokens -= 1.0;
        b.busy = true;
        drop(b);
        Ok(Turn(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Authorization, Mutex<Vec<String>>);

    impl Authorizer for Fixed {
        fn authorize(&self, token: &str, path: &str, verb: &str) -> Authorization {
            self.1
                .lock()
                .unwrap()
                .push(format!("{token} {verb} {path}"));
            self.0.clone()
        }
    }

    fn from(peer: &str, auth: Option<&str>) -> Request {
        let mut r = Request::get("/api/v1/trace?dst=1.2.3.4");
        r.peer = Some(peer.parse().unwrap());
        if let Some(a) = auth {
            r.headers.push(("authorization".into(), a.into()));
        }
        r
    }

    #[test]
    fn loopback_clients_are_answered_and_others_refused_by_default() {
        for peer in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
            assert!(
                admit(&Exposure::Loopback, &from(peer, None)).is_ok(),
                "{peer}"
            );
        }
        assert!(admit(&Exposure::Loopback, &Request::get("/api/v1/syncs")).is_ok());
        let r = admit(
            &Exposure::Loopback,
            &from("10.0.0.5:5000", Some("Bearer t")),
        )
        .unwrap_err();
        assert_eq!(r.code, 403);
        assert!(
            r.text_body().contains("--api-bind-address"),
            "{}",
            r.text_body()
        );
    }

    #[test]
    fn other_hosts_need_a_token_the_api_server_accepts() {
        let check = |answer: Authorization, auth: Option<&str>| {
            let a = Arc::new(Fixed(answer, Mutex::new(Vec::new())));
            let exposure = Exposure::Authenticated(a.clone());
            let r = admit(&exposure, &from("10.0.0.5:5000", auth));
            let asked = a.1.lock().unwrap().clone();
            (r.err().map(|r| (r.code, r.headers)), asked)
        };
        let (r, asked) = check(Authorization::Allowed, Some("Bearer abc"));
        assert_eq!(r, None);
        assert_eq!(asked, ["abc get /api/v1/trace"], "the path, not the query");
        let (r, asked) = check(Authorization::Allowed, None);
        let (code, headers) = r.unwrap();
        assert_eq!(code, 401);
        assert!(headers.iter().any(|(k, _)| *k == "www-authenticate"));
        assert!(asked.is_empty(), "no token, nothing asked");
        for bad in ["Basic abc", "Bearer ", "abc"] {
            assert_eq!(
                check(Authorization::Allowed, Some(bad)).0.unwrap().0,
                401,
                "{bad}"
            );
        }
        let code = |a| check(a, Some("bearer abc")).0.map(|r| r.0);
        assert_eq!(
            code(Authorization::Unauthenticated("expired".into())),
            Some(401)
        );
        assert_eq!(code(Authorization::Forbidden("RBAC".into())), Some(403));
        assert_eq!(code(Authorization::Unavailable("down".into())), Some(503));
    }

    #[test]
    fn whole_table_answers_take_turns_and_refill() {
        let t = Instant::now();
        let l = Limiter::new(t);
        let first = l.turn(t).unwrap();
        let busy = l.turn(t).unwrap_err();
        assert_eq!(busy.code, 429, "one at a time");
        drop(first);
        drop(l.turn(t).unwrap());
        drop(l.turn(t).unwrap());
        let r = l.turn(t).unwrap_err();
        assert_eq!(r.code, 429, "the burst is spent");
        assert!(
            r.headers.contains(&("retry-after", "10".to_string())),
            "{:?}",
            r.headers
        );
        // One more after ten seconds, and only one.
        let later = t + Limiter::EVERY;
        drop(l.turn(later).unwrap());
        assert_eq!(l.turn(later).unwrap_err().code, 429);
    }
}
