//! A fake Kubernetes API server for the resources verdict watches:
//! Services, EndpointSlices, Nodes and ServiceCIDRs.
//!
//! It speaks the real protocol that client libraries use, over plain HTTP/1.1:
//! - `GET <collection>` lists, with `labelSelector` and `fieldSelector`, in
//!   pages of `limit` (`continue` fetches the next), and answers the list's
//!   `metadata.resourceVersion`;
//! - `GET <collection>?watch=true&resourceVersion=N` streams newline-delimited
//!   watch events (`ADDED`, `MODIFIED`, `DELETED`, and `BOOKMARK` when
//!   `allowWatchBookmarks=true`) with chunked encoding, from just after `N`,
//!   ending after `timeoutSeconds`;
//! - a watch with `sendInitialEvents=true` (a streaming list, WatchList)
//!   sends the current objects as `ADDED`, then a `BOOKMARK` annotated
//!   `k8s.io/initial-events-end`, then the changes; or is refused with 422,
//!   as by an API server with WatchList off (`set_watch_list(false)`);
//! - a watch from a resourceVersion older than the retained history gets an
//!   `ERROR` event carrying a `410 Gone` Status, as etcd compaction causes;
//! - a selector-filtered watch sees an object that stops matching as
//!   `DELETED` and one that starts matching as `ADDED`.
//!
//! Tests change objects with [`FakeApiServer::apply`] and
//! [`FakeApiServer::delete`], and force every client to relist with
//! [`FakeApiServer::expire`]. The `verdict-e2e-apiserver` binary runs one
//! inside a namespace and takes the same commands on stdin.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::rbac::{Rbac, User};

/// A resource the fake serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// core/v1 Services.
    Services,
    /// discovery.k8s.io/v1 EndpointSlices.
    EndpointSlices,
    /// core/v1 Nodes.
    Nodes,
    /// networking.k8s.io/v1 ServiceCIDRs.
    ServiceCidrs,
}

impl Resource {
    /// Every resource.
    pub const ALL: [Resource; 4] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ServiceCidrs,
    ];

    /// The object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::EndpointSlices => "EndpointSlice",
            Resource::Nodes => "Node",
            Resource::ServiceCidrs => "ServiceCIDR",
        }
    }

    /// The resource of an object kind.
    pub fn of_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }

    fn api_version(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "v1",
            Resource::EndpointSlices => "discovery.k8s.io/v1",
            Resource::ServiceCidrs => "networking.k8s.io/v1",
        }
    }

    fn namespaced(self) -> bool {
        matches!(self, Resource::Services | Resource::EndpointSlices)
    }

    fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::ServiceCidrs => "servicecidrs",
        }
    }

    /// The collection path across namespaces.
    pub fn path(self) -> String {
        match self.api_version() {
            "v1" => format!("/api/v1/{}", self.plural()),
            group => format!("/apis/{group}/{}", self.plural()),
        }
    }

    /// The resource and namespace a request path names.
    fn route(path: &str) -> Option<(Resource, Option<String>)> {
        for r in Resource::ALL {
            if path == r.path() {
                return Some((r, None));
            }
            let prefix = match r.api_version() {
                "v1" => "/api/v1".to_string(),
                group => format!("/apis/{group}"),
            };
            if r.namespaced()
                && let Some(rest) = path.strip_prefix(&format!("{prefix}/namespaces/"))
                && let Some((ns, plural)) = rest.split_once('/')
                && plural == r.plural()
            {
                return Some((r, Some(ns.to_string())));
            }
        }
        None
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
type Key = (Resource, String, String);

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    resource: Resource,
    /// The object before (None: added).
    old: Option<Value>,
    /// The object after (None: deleted; `old` carries the last state).
    new: Option<Value>,
}

/// An object as stored, with its JSON text made once when it was written:
/// whole (for watch events) and as a list's item (without `kind` and
/// `apiVersion`). An API server serves from its watch cache; the fake would
/// otherwise copy and serialize every object for every list and watch, on
/// the CPUs of the node whose proxy a benchmark measures.
#[derive(Debug)]
struct Stored {
    value: Value,
    text: Arc<str>,
    item: Arc<str>,
}

impl Stored {
    fn new(value: Value) -> Stored {
        let text: Arc<str> = value.to_string().into();
        let mut bare = value.clone();
        if let Some(m) = bare.as_object_mut() {
            m.remove("kind");
            m.remove("apiVersion");
        }
        Stored {
            value,
            text,
            item: bare.to_string().into(),
        }
    }
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Stored>,
    /// Changes with `rv > compacted`.
    history: Vec<Change>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Bumped by `expire`: open watches end.
    epoch: u64,
    not_served: BTreeSet<Resource>,
    /// Streaming lists (`sendInitialEvents`, WatchList) are refused, as by
    /// an API server with the WatchList feature off.
    no_watch_list: bool,
    /// Streaming lists start, then fail with an `ERROR` event (code 500),
    /// as on an API server whose etcd lacks RequestWatchProgress.
    watch_list_unsupported_storage: bool,
    /// Silent: open watches send nothing (no events, no bookmarks) and
    /// new requests are read but not answered, as a server or a path to it
    /// that hangs without closing the connection.
    silent: bool,
    requests: Vec<String>,
    /// Each request's `User-Agent`, in the same order.
    user_agents: Vec<String>,
    /// Events created (`POST .../events`), as received.
    events: Vec<Value>,
    /// Permissions a SelfSubjectAccessReview is denied, as `verb resource`.
    denied: BTreeSet<String>,
    /// Tokens, ClusterRoles and ClusterRoleBindings, for TokenReviews and
    /// SubjectAccessReviews.
    rbac: Rbac,
}

struct Shared {
    store: Mutex<Store>,
    changed: Condvar,
    bookmark_every: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panicking request thread leaves consistent data behind (every
        // mutation is a single assignment), so a poisoned lock is still usable.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` for a change (or a command), with the lock
    /// given back meanwhile.
    fn wait<'a>(&'a self, s: MutexGuard<'a, Store>, timeout: Duration) -> MutexGuard<'a, Store> {
        self.changed
            .wait_timeout(s, timeout)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0)
    }
}

/// Why an object could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The object lacks kind, name or namespace.
    #[error("invalid object: {0}")]
    Invalid(String),
    /// No such object.
    #[error("not found: {0}")]
    NotFound(String),
    /// The listener could not be set up.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
}

/// The fake API server; it stops serving when dropped (open connections
/// end when their client goes away).
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl FakeApiServer {
    /// Listens on `addr` (port 0 picks one), with a bookmark on every
    /// open watch each `bookmark_every`.
    pub fn start(addr: SocketAddr, bookmark_every: Duration) -> Result<FakeApiServer, ApiError> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed: Condvar::new(),
            bookmark_every,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                let Ok(conn) = conn else {
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = serve(&shared, conn);
                });
            }
        });
        Ok(FakeApiServer { shared, addr })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Creates or replaces an object (by kind, namespace and name); returns
    /// its new resourceVersion.
    pub fn apply(&self, mut obj: Value) -> Result<u64, ApiError> {
        // RBAC objects are kept for the access reviews, not served.
        if self.shared.lock().rbac.apply(&obj) {
            return Ok(self.resource_version());
        }
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let resource = Resource::of_kind(kind)
            .ok_or_else(|| ApiError::Invalid(format!("kind {kind:?} is not served")))?;
        let key = key_of(resource, &obj)?;
        let mut s = self.shared.lock();
        s.rv += 1;
        let rv = s.rv;
        let meta = obj
            .as_object_mut()
            .and_then(|o| o.get_mut("metadata"))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| ApiError::Invalid("metadata is not an object".into()))?;
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("uid")
            .or_insert_with(|| json!(format!("uid-{}-{}", key.1, key.2)));
        obj["apiVersion"] = json!(resource.api_version());
        let old = s
            .objects
            .insert(key, Stored::new(obj.clone()))
            .map(|o| o.value);
        s.history.push(Change {
            rv,
            resource,
            old,
            new: Some(obj),
        });
        drop(s);
        self.shared.changed.notify_all();
        Ok(rv)
    }

    /// Deletes an object; returns the resourceVersion of the deletion.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> Result<u64, ApiError> {
        let resource = Resource::of_kind(kind)
            .ok_or_else(|| ApiError::Invalid(format!("kind {kind:?} is not served")))?;
        let key = (resource, namespace.to_string(), name.to_string());
        let mut s = self.shared.lock();
        let Some(mut last) = s.objects.remove(&key).map(|o| o.value) else {
            return Err(ApiError::NotFound(format!("{kind} {namespace}/{name}")));
        };
        s.rv += 1;
        let rv = s.rv;
        last["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.history.push(Change {
            rv,
            resource,
            old: Some(last),
            new: None,
        });
        drop(s);
        self.shared.changed.notify_all();
        Ok(rv)
    }

    /// As etcd compaction plus an API server restart: the history so far is
    /// forgotten and every open watch ends, so clients re-watch from their
    /// last resourceVersion, get 410 Gone, and relist.
    pub fn expire(&self) {
        let mut s = self.shared.lock();
        // Every resourceVersion handed out so far becomes too old; a list
        // from now on returns the new one, which can be watched from.
        s.rv += 1;
        s.compacted = s.rv;
        s.history.clear();
        s.epoch += 1;
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Serves a resource or not (answering 404, as an API server without
    /// that API group version).
    pub fn set_served(&self, resource: Resource, served: bool) {
        let mut s = self.shared.lock();
        if served {
            s.not_served.remove(&resource);
        } else {
            s.not_served.insert(resource);
        }
    }

    /// Serves streaming lists (watches with `sendInitialEvents=true`:
    /// the current objects as `ADDED`, then a bookmark annotated
    /// `k8s.io/initial-events-end`), or refuses them with 422, as an API
    /// server whose WatchList feature is off.
    pub fn set_watch_list(&self, served: bool) {
        self.shared.lock().no_watch_list = !served;
    }

    /// Answers streaming lists with 200, then an `ERROR` event with code
    /// 500 (`true`), as an API server 1.36 on etcd 3.4.23 (no
    /// RequestWatchProgress) does; `false` serves them again.
    pub fn set_watch_list_storage_error(&self, failing: bool) {
        self.shared.lock().watch_list_unsupported_storage = failing;
    }

    /// Goes silent (see `silent`) or speaks again.
    pub fn set_silent(&self, silent: bool) {
        self.shared.lock().silent = silent;
        self.shared.changed.notify_all();
    }

    /// Request lines received so far (`GET /path?query`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// The `User-Agent` of each request so far, in the order of
    /// [`FakeApiServer::requests`] (empty for a request without one).
    pub fn user_agents(&self) -> Vec<String> {
        self.shared.lock().user_agents.clone()
    }

    /// Runs commands, one JSON document per line, answering each with one
    /// line: `ok <resourceVersion>` or `error <message>`. Commands:
    /// `{"apply": OBJECT}`, `{"delete": {"kind", "namespace", "name"}}`,
    /// `{"expire": true}`, `{"served": {"kind", "served"}}`,
    /// `{"watch_list": false}`, `{"watch_list_storage_error": true}`,
    /// `{"silent": true}`, `{"requests": true}`,
    /// `{"user_agents": true}`,
    /// `{"events": true}` (answer `ok <json array>`),
    /// `{"deny": {"verb", "resource"}}` (SelfSubjectAccessReviews of it
    /// answer not allowed; everything else is allowed) and
    /// `{"token": {"token", "username", "groups"}}` (a bearer token
    /// TokenReviews authenticate). An applied ClusterRole or
    /// ClusterRoleBinding decides SubjectAccessReviews.
    pub fn command(&self, line: &str) -> String {
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return format!("error not JSON: {e}"),
        };
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let r = if let Some(obj) = v.get("apply") {
            self.apply(obj.clone())
        } else if let Some(d) = v.get("delete") {
            self.delete(&text(d, "kind"), &text(d, "namespace"), &text(d, "name"))
        } else if v.get("expire").is_some() {
            self.expire();
            Ok(self.resource_version())
        } else if let Some(d) = v.get("served") {
            match Resource::of_kind(&text(d, "kind")) {
                Some(r) => {
                    self.set_served(r, d.get("served").and_then(Value::as_bool).unwrap_or(true));
                    Ok(self.resource_version())
                }
                None => Err(ApiError::Invalid(format!("kind {:?}", text(d, "kind")))),
            }
        } else if let Some(d) = v.get("silent") {
            self.set_silent(d.as_bool().unwrap_or(false));
            Ok(self.resource_version())
        } else if let Some(d) = v.get("watch_list") {
            self.set_watch_list(d.as_bool().unwrap_or(true));
            Ok(self.resource_version())
        } else if let Some(d) = v.get("watch_list_storage_error") {
            self.set_watch_list_storage_error(d.as_bool().unwrap_or(false));
            Ok(self.resource_version())
        } else if v.get("requests").is_some() {
            return format!("ok {}", json!(self.requests()));
        } else if v.get("user_agents").is_some() {
            return format!("ok {}", json!(self.user_agents()));
        } else if v.get("events").is_some() {
            return format!("ok {}", json!(self.shared.lock().events));
        } else if let Some(d) = v.get("token") {
            let user = User {
                username: text(d, "username"),
                groups: d
                    .get("groups")
                    .and_then(Value::as_array)
                    .map(|g| {
                        g.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            self.shared.lock().rbac.add_token(&text(d, "token"), user);
            Ok(self.resource_version())
        } else if let Some(d) = v.get("deny") {
            let what = format!("{} {}", text(d, "verb"), text(d, "resource"));
            self.shared.lock().denied.insert(what);
            Ok(self.resource_version())
        } else {
            Err(ApiError::Invalid(format!("unknown command {line}")))
        };
        match r {
            Ok(rv) => format!("ok {rv}"),
            Err(e) => format!("error {e}"),
        }
    }
}

/// A kubeconfig that points at `server` (`http://IP:port`) without
/// credentials, as the fake API server wants.
pub fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{server}\"}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\n"
    )
}

/// The `verdict-e2e-apiserver` program running inside a test namespace,
/// driven through its stdin; killed when dropped.
pub struct ApiServerProcess {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl ApiServerProcess {
    /// Starts `program` (the `verdict-e2e-apiserver` binary) in `ns`,
    /// listening on `listen`, and waits until it listens.
    pub fn spawn(
        ns: &crate::netns::Netns,
        program: &str,
        listen: &str,
        bookmark_every: Duration,
    ) -> Result<ApiServerProcess, crate::netns::CmdError> {
        use std::process::{Command, Stdio};
        let fail =
            |m: String| crate::netns::CmdError(format!("fake API server in {}: {m}", ns.name()));
        let ms = bookmark_every.as_millis().to_string();
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                program,
                "--listen",
                listen,
                "--bookmark-ms",
                &ms,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(fail("no stdio".into()));
        };
        let mut p = ApiServerProcess {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        let first = p.line().map_err(fail)?;
        if !first.starts_with("listening ") {
            return Err(fail(format!("did not start: {first:?}")));
        }
        Ok(p)
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("exited".into()),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs one command (see [`FakeApiServer::command`]); returns what
    /// follows `ok `, or the error.
    pub fn command(&mut self, cmd: &Value) -> Result<String, String> {
        writeln!(self.stdin, "{cmd}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| e.to_string())?;
        let answer = self.line()?;
        match answer.strip_prefix("ok ") {
            Some(rest) => Ok(rest.to_string()),
            None => Err(answer),
        }
    }

    /// Creates or replaces an object.
    pub fn apply(&mut self, obj: Value) -> Result<String, String> {
        self.command(&json!({ "apply": obj }))
    }

    /// Deletes an object.
    pub fn delete(&mut self, kind: &str, namespace: &str, name: &str) -> Result<String, String> {
        self.command(&json!({"delete": {"kind": kind, "namespace": namespace, "name": name}}))
    }

    /// Forgets the history and ends every watch (see [`FakeApiServer::expire`]).
    pub fn expire(&mut self) -> Result<String, String> {
        self.command(&json!({"expire": true}))
    }

    /// Serves a kind or answers 404 for it.
    pub fn set_served(&mut self, kind: &str, served: bool) -> Result<String, String> {
        self.command(&json!({"served": {"kind": kind, "served": served}}))
    }

    /// Goes silent, or speaks again.
    pub fn set_silent(&mut self, silent: bool) -> Result<String, String> {
        self.command(&json!({"silent": silent}))
    }

    /// Serves streaming lists, or refuses them with 422.
    pub fn set_watch_list(&mut self, served: bool) -> Result<String, String> {
        self.command(&json!({"watch_list": served}))
    }

    /// Fails streaming lists after their 200, as on etcd 3.4.23.
    pub fn set_watch_list_storage_error(&mut self, failing: bool) -> Result<String, String> {
        self.command(&json!({"watch_list_storage_error": failing}))
    }

    /// The request lines received so far.
    pub fn requests(&mut self) -> Result<Vec<String>, String> {
        let text = self.command(&json!({"requests": true}))?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    /// Each request's `User-Agent` so far, in the order of the requests.
    pub fn user_agents(&mut self) -> Result<Vec<String>, String> {
        let text = self.command(&json!({"user_agents": true}))?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }

    /// The Events created so far.
    pub fn events(&mut self) -> Result<Vec<Value>, String> {
        let text = self.command(&json!({"events": true}))?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    }
}

impl Drop for ApiServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key_of(resource: Resource, obj: &Value) -> Result<Key, ApiError> {
    let meta = obj.get("metadata");
    let field = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (ns, name) = (field("namespace"), field("name"));
    if name.is_empty() {
        return Err(ApiError::Invalid("metadata.name is missing".into()));
    }
    if resource.namespaced() == ns.is_empty() {
        return Err(ApiError::Invalid(format!(
            "{} {name}: metadata.namespace {}",
            resource.kind(),
            if ns.is_empty() {
                "is missing"
            } else {
                "is not allowed"
            }
        )));
    }
    Ok((resource, ns, name))
}

/// Decodes `%XX` and `+` in a query component.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One term of a label or field selector.
#[derive(Clone, Debug, PartialEq)]
enum Term {
    Exists(String),
    Absent(String),
    Equals(String, String),
    Differs(String, String),
}

fn parse_selector(s: &str) -> Vec<Term> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                Term::Differs(k.into(), v.into())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Term::Equals(k.into(), v.into())
            } else if let Some(k) = t.strip_prefix('!') {
                Term::Absent(k.into())
            } else {
                Term::Exists(t.into())
            }
        })
        .collect()
}

fn matches(obj: &Value, labels: &[Term], fields: &[Term]) -> bool {
    let label = |k: &str| {
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
    };
    let field = |k: &str| {
        let pointer = format!("/{}", k.replace('.', "/"));
        obj.pointer(&pointer).and_then(Value::as_str).unwrap_or("")
    };
    labels.iter().all(|t| match t {
        Term::Exists(k) => label(k).is_some(),
        Term::Absent(k) => label(k).is_none(),
        Term::Equals(k, v) => label(k) == Some(v.as_str()),
        Term::Differs(k, v) => label(k) != Some(v.as_str()),
    }) && fields.iter().all(|t| match t {
        Term::Equals(k, v) => field(k) == v,
        Term::Differs(k, v) => field(k) != v,
        Term::Exists(_) | Term::Absent(_) => false,
    })
}

struct Request {
    line: String,
    /// The `User-Agent` header (empty without one).
    user_agent: String,
    path: String,
    query: BTreeMap<String, String>,
    body: Vec<u8>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let line = line.trim_end().to_string();
    let mut length = 0usize;
    let mut user_agent = String::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            } else if k.eq_ignore_ascii_case("user-agent") {
                user_agent = v.trim().to_owned();
            }
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    std::io::Read::read_exact(reader, &mut body)?;
    let target = line.split(' ').nth(1).unwrap_or("/");
    let (path, q) = target.split_once('?').unwrap_or((target, ""));
    let query = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (unescape(k), unescape(v))
        })
        .collect();
    Ok(Some(Request {
        path: path.to_string(),
        line,
        user_agent,
        query,
        body,
    }))
}

fn respond(conn: &mut TcpStream, code: u16, reason: &str, body: &Value) -> std::io::Result<()> {
    respond_text(conn, code, reason, &body.to_string())
}

fn respond_text(conn: &mut TcpStream, code: u16, reason: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all((head + body).as_bytes())?;
    conn.flush()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// What an API server answers for a path or API group it does not serve.
fn not_found(conn: &mut TcpStream) -> std::io::Result<()> {
    let body = status(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    respond(conn, 404, "Not Found", &body)
}

fn serve(shared: &Shared, conn: TcpStream) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    let Some(req) = read_request(&mut reader)? else {
        return Ok(());
    };
    {
        let mut s = shared.lock();
        s.requests.push(req.line.clone());
        s.user_agents.push(req.user_agent.clone());
        // Silent: the request is read and never answered (until the
        // server speaks again).
        while s.silent {
            s = shared.wait(s, Duration::from_millis(200));
        }
    }
    // The server's version, and access reviews: allowed unless denied.
    if req.line.starts_with("GET ") && req.path == "/version" {
        let v = json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-verdict-fake"});
        return respond(&mut conn, 200, "OK", &v);
    }
    if req.line.starts_with("POST ")
        && req.path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    {
        let mut review: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let attrs = &review["spec"]["resourceAttributes"];
        let what = format!(
            "{} {}",
            attrs["verb"].as_str().unwrap_or(""),
            attrs["resource"].as_str().unwrap_or("")
        );
        let allowed = !shared.lock().denied.contains(&what);
        review["status"] = if allowed {
            json!({"allowed": true})
        } else {
            json!({"allowed": false, "reason": format!("RBAC: {what} is not granted")})
        };
        return respond(&mut conn, 201, "Created", &review);
    }
    // A token's user, and what RBAC grants a user.
    for (path, review) in [
        ("/apis/authentication.k8s.io/v1/tokenreviews", "token"),
        (
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            "access",
        ),
    ] {
        if req.line.starts_with("POST ") && req.path == path {
            let mut body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let s = shared.lock();
            body["status"] = if review == "token" {
                s.rbac.token_review(&body)
            } else {
                s.rbac.access_review(&body)
            };
            drop(s);
            return respond(&mut conn, 201, "Created", &body);
        }
    }
    // Events are only created, as a recorder does; they are kept for
    // tests to read (`events`).
    if req.line.starts_with("POST ")
        && req.path.starts_with("/apis/events.k8s.io/v1/namespaces/")
        && req.path.ends_with("/events")
    {
        return match serde_json::from_slice::<Value>(&req.body) {
            Ok(event) => {
                shared.lock().events.push(event.clone());
                respond(&mut conn, 201, "Created", &event)
            }
            Err(e) => respond(
                &mut conn,
                400,
                "Bad Request",
                &status(400, "BadRequest", &format!("not JSON: {e}")),
            ),
        };
    }
    // A recorder folds a repeated Event into a series: a merge patch of
    // the Event it created.
    if req.line.starts_with("PATCH ") && req.path.starts_with("/apis/events.k8s.io/v1/namespaces/")
    {
        let mut parts = req.path.rsplit('/');
        let name = parts.next().unwrap_or_default().to_owned();
        let patch: Value = match serde_json::from_slice(&req.body) {
            Ok(p) => p,
            Err(e) => {
                return respond(
                    &mut conn,
                    400,
                    "Bad Request",
                    &status(400, "BadRequest", &format!("not JSON: {e}")),
                );
            }
        };
        let merged = {
            let mut s = shared.lock();
            let found = s
                .events
                .iter_mut()
                .find(|e| e["metadata"]["name"] == name.as_str());
            found.map(|event| {
                if let (Some(e), Some(p)) = (event.as_object_mut(), patch.as_object()) {
                    for (k, v) in p {
                        e.insert(k.clone(), v.clone());
                    }
                }
                event.clone()
            })
        };
        return match merged {
            Some(event) => respond(&mut conn, 200, "OK", &event),
            None => not_found(&mut conn),
        };
    }
    let Some((resource, namespace)) = Resource::route(&req.path) else {
        return not_found(&mut conn);
    };
    if shared.lock().not_served.contains(&resource) {
        return not_found(&mut conn);
    }
    let q = |k: &str| req.query.get(k).cloned().unwrap_or_default();
    let labels = parse_selector(&q("labelSelector"));
    let fields = parse_selector(&q("fieldSelector"));
    // The fields the API server selects on: every kind's name and
    // namespace, and a Service's `spec.clusterIP` and `spec.type`.
    let selectable = |k: &str| {
        k == "metadata.name"
            || k == "metadata.namespace"
            || (resource == Resource::Services && (k == "spec.clusterIP" || k == "spec.type"))
    };
    if let Some(bad) = fields
        .iter()
        .find(|t| !matches!(t, Term::Equals(k, _) | Term::Differs(k, _) if selectable(k)))
    {
        return respond(
            &mut conn,
            400,
            "Bad Request",
            &status(
                400,
                "BadRequest",
                &format!("field selector {bad:?} is not supported"),
            ),
        );
    }
    let in_scope = |key: &Key, obj: &Value| {
        key.0 == resource
            && namespace.as_ref().is_none_or(|ns| *ns == key.1)
            && matches(obj, &labels, &fields)
    };
    if q("watch") != "true" && q("watch") != "1" {
        // Pages: `limit`, and `continue` naming the first object of the
        // next page (`rv|namespace/name`), so a page costs O(its size).
        let limit: usize = q("limit").parse().unwrap_or(0);
        // The token also carries the first page's resourceVersion, which
        // every page reports, as the API server serves one snapshot: a
        // watch from it replays whatever changed while paging.
        let token = q("continue");
        let (version, from) = match token.split_once('|') {
            Some((rv, rest)) => (
                rv.parse::<u64>().ok(),
                rest.split_once('/')
                    .map_or((resource, String::new(), String::new()), |(ns, name)| {
                        (resource, ns.to_string(), name.to_string())
                    }),
            ),
            None => (None, (resource, String::new(), String::new())),
        };
        let s = shared.lock();
        let version = version.unwrap_or(s.rv);
        let mut matching = s
            .objects
            .range(from..)
            .take_while(|(k, _)| k.0 == resource)
            .filter(|(k, o)| in_scope(k, &o.value));
        // Lists carry the kind once, not per item.
        let mut items: Vec<Arc<str>> = Vec::new();
        let mut next: Option<String> = None;
        for (k, o) in matching.by_ref() {
            if limit > 0 && items.len() == limit {
                next = Some(format!("{version}|{}/{}", k.1, k.2));
                break;
            }
            items.push(o.item.clone());
        }
        drop(s);
        let mut meta = json!({"resourceVersion": version.to_string()});
        if let Some(next) = next {
            meta["continue"] = json!(next);
        }
        let mut body = json!({
            "kind": format!("{}List", resource.kind()),
            "apiVersion": resource.api_version(),
            "metadata": meta,
        })
        .to_string();
        // The items, spliced in as stored: `{…,"items":[a,b]}`.
        body.pop();
        body.push_str(",\"items\":[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(item);
        }
        body.push_str("]}");
        return respond_text(&mut conn, 200, "OK", &body);
    }
    watch(shared, conn, resource, &req, &in_scope)
}

fn chunk(conn: &mut TcpStream, event: &Value) -> std::io::Result<()> {
    chunk_text(conn, &format!("{event}\n"))
}

/// How much of a watch's initial events goes into one chunk.
const INITIAL_CHUNK: usize = 64 * 1024;

/// One chunk of a chunked response, holding whole lines.
fn chunk_text(conn: &mut TcpStream, lines: &str) -> std::io::Result<()> {
    // One write per chunk: split writes would wait on Nagle's algorithm.
    conn.write_all(format!("{:x}\r\n{lines}\r\n", lines.len()).as_bytes())?;
    conn.flush()
}

fn watch(
    shared: &Shared,
    mut conn: TcpStream,
    resource: Resource,
    req: &Request,
    in_scope: &dyn Fn(&Key, &Value) -> bool,
) -> std::io::Result<()> {
    let q = |k: &str| req.query.get(k).cloned().unwrap_or_default();
    let bookmarks = q("allowWatchBookmarks") == "true";
    let timeout = Duration::from_secs(q("timeoutSeconds").parse().unwrap_or(1800));
    // A streaming list: as the API server, only with bookmarks and
    // `resourceVersionMatch=NotOlderThan`, and only where WatchList is on.
    let initial_events = q("sendInitialEvents") == "true";
    if initial_events {
        let refused = if shared.lock().no_watch_list {
            Some(
                "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            )
        } else if !bookmarks || q("resourceVersionMatch") != "NotOlderThan" {
            Some(
                "sendInitialEvents needs allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan",
            )
        } else {
            None
        };
        if let Some(why) = refused {
            return respond(
                &mut conn,
                422,
                "Unprocessable Entity",
                &status(422, "Invalid", why),
            );
        }
    }
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let deadline = Instant::now() + timeout;
    let asked = q("resourceVersion");
    if initial_events && shared.lock().watch_list_unsupported_storage {
        // As an API server whose etcd has no RequestWatchProgress (etcd
        // before 3.4.31 and 3.5.13): the stream starts, then fails.
        chunk(
            &mut conn,
            &json!({"type": "ERROR", "object": status(500, "InternalError",
                "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled")}),
        )?;
        return write!(conn, "0\r\n\r\n");
    }
    let mut s = shared.lock();
    let epoch = s.epoch;
    // A streaming list from a version: the state no older than it, so the
    // current one, unless the version is not there yet.
    let start_with_state = match asked.parse::<u64>() {
        _ if asked.is_empty() || asked == "0" => true,
        Ok(v) if initial_events && v > s.rv => {
            let msg = format!("Too large resource version: {v}, current: {}", s.rv);
            drop(s);
            chunk(
                &mut conn,
                &json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "message": format!("Timeout: {msg}"), "reason": "Timeout",
                    "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]},
                    "code": 504}}),
            )?;
            return write!(conn, "0\r\n\r\n");
        }
        Ok(_) => initial_events,
        Err(_) => false,
    };
    let mut cursor = match asked.as_str() {
        // "Any", or a streaming list: start with the current state as
        // ADDED events.
        _ if start_with_state => {
            let current: Vec<Arc<str>> = s
                .objects
                .iter()
                .filter(|(k, o)| in_scope(k, &o.value))
                .map(|(_, o)| o.text.clone())
                .collect();
            let rv = s.rv;
            drop(s);
            // Many events to a chunk, as an API server's buffered writer
            // sends them, not a write each.
            let mut out = String::new();
            for o in current {
                out.push_str("{\"type\":\"ADDED\",\"object\":");
                out.push_str(&o);
                out.push_str("}\n");
                if out.len() >= INITIAL_CHUNK {
                    chunk_text(&mut conn, &out)?;
                    out.clear();
                }
            }
            if !out.is_empty() {
                chunk_text(&mut conn, &out)?;
            }
            if initial_events {
                let end = json!({"type": "BOOKMARK", "object": {
                    "kind": resource.kind(), "apiVersion": resource.api_version(),
                    "metadata": {"resourceVersion": rv.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"}}}});
                chunk(&mut conn, &end)?;
            }
            s = shared.lock();
            rv
        }
        v => match v.parse::<u64>() {
            Ok(rv) if rv >= s.compacted => rv,
            Ok(rv) => {
                let msg = format!("too old resource version: {rv} ({})", s.compacted);
                drop(s);
                chunk(
                    &mut conn,
                    &json!({"type": "ERROR", "object": status(410, "Expired", &msg)}),
                )?;
                return write!(conn, "0\r\n\r\n");
            }
            Err(_) => {
                drop(s);
                let msg = format!("invalid resourceVersion {v:?}");
                chunk(
                    &mut conn,
                    &json!({"type": "ERROR", "object": status(400, "BadRequest", &msg)}),
                )?;
                return write!(conn, "0\r\n\r\n");
            }
        },
    };
    // Without bookmarks, nothing is due before the deadline.
    let every = shared.bookmark_every.max(Duration::from_millis(10));
    let mut next_bookmark = if bookmarks {
        Instant::now() + every
    } else {
        deadline
    };
    loop {
        if s.epoch != epoch {
            // Expired: the connection drops, as when the server restarts.
            return Ok(());
        }
        if s.silent {
            // Nothing at all, and the connection stays open.
            s = shared.wait(s, Duration::from_millis(200));
            continue;
        }
        // History is in resourceVersion order: skip what was sent.
        let from = s.history.partition_point(|c| c.rv <= cursor);
        let events: Vec<Value> = s.history[from..]
            .iter()
            .filter(|c| c.resource == resource)
            .filter_map(|c| {
                let was = c
                    .old
                    .as_ref()
                    .is_some_and(|o| in_scope(&key_from(resource, o), o));
                let is = c
                    .new
                    .as_ref()
                    .is_some_and(|o| in_scope(&key_from(resource, o), o));
                match (was, is, &c.new) {
                    (false, true, Some(n)) => Some(json!({"type": "ADDED", "object": n})),
                    (true, true, Some(n)) => Some(json!({"type": "MODIFIED", "object": n})),
                    (true, false, Some(n)) => Some(json!({"type": "DELETED", "object": n})),
                    (true, false, None) => c
                        .old
                        .as_ref()
                        .map(|o| json!({"type": "DELETED", "object": o})),
                    _ => None,
                }
            })
            .collect();
        cursor = s.rv;
        drop(s);
        for e in events {
            chunk(&mut conn, &e)?;
        }
        let now = Instant::now();
        if now >= deadline {
            return write!(conn, "0\r\n\r\n");
        }
        if bookmarks && now >= next_bookmark {
            let mark = json!({"type": "BOOKMARK", "object": {
                "kind": resource.kind(), "apiVersion": resource.api_version(),
                "metadata": {"resourceVersion": cursor.to_string()}}});
            chunk(&mut conn, &mark)?;
            next_bookmark = now + every;
        }
        let wait = deadline.min(next_bookmark).saturating_duration_since(now);
        s = shared.lock();
        if s.rv == cursor && s.epoch == epoch {
            s = shared.wait(s, wait);
        }
    }
}

fn key_from(resource: Resource, obj: &Value) -> Key {
    let f = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (resource, f("namespace"), f("name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_follow_kubernetes_syntax() {
        let obj = json!({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}}});
        let ok = |l: &str, f: &str| matches(&obj, &parse_selector(l), &parse_selector(f));
        assert!(ok("x", ""));
        assert!(ok("x=1,!y", ""));
        assert!(!ok("!x", ""));
        assert!(ok("x!=2", "metadata.name=a"));
        assert!(!ok("", "metadata.name=b"));
        assert!(ok("", "metadata.namespace!=kube-system"));
    }

    #[test]
    fn query_components_are_unescaped() {
        assert_eq!(
            unescape("%21service.kubernetes.io%2Fheadless"),
            "!service.kubernetes.io/headless"
        );
        assert_eq!(unescape("a%3D%3Db+c%"), "a==b c%");
    }

    /// A GET's status line and body (a chunked body de-chunked), and how
    /// many chunks it came in.
    fn get(addr: SocketAddr, path: &str) -> (String, String, usize) {
        use std::io::Read;
        let mut c = TcpStream::connect(addr).unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
        if !head.contains("Transfer-Encoding: chunked") {
            return (head.lines().next().unwrap().into(), rest.into(), 0);
        }
        let mut body = String::new();
        let mut chunks = 0;
        loop {
            let (size, after) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size, 16).unwrap();
            if n == 0 {
                break;
            }
            body.push_str(&after[..n]);
            chunks += 1;
            rest = &after[n + 2..];
        }
        (head.lines().next().unwrap().into(), body, chunks)
    }

    fn service(i: usize) -> Value {
        json!({"kind": "Service", "apiVersion": "v1",
               "metadata": {"name": format!("s{i:05}"), "namespace": "n"},
               "spec": {"clusterIP": format!("10.0.{}.{}", i / 250, i % 250 + 1)}})
    }

    #[test]
    fn lists_and_initial_events_carry_every_object_as_written() {
        let api =
            FakeApiServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(60)).unwrap();
        // Enough objects for the initial events to take several chunks.
        let n = 2_000;
        for i in 0..n {
            api.apply(service(i)).unwrap();
        }
        api.apply(service(7)).unwrap();
        api.delete("Service", "n", "s00009").unwrap();
        let rv = api.resource_version();

        let (status, body, _) = get(api.addr(), "/api/v1/services");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let list: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(list["kind"], "ServiceList");
        assert_eq!(list["metadata"]["resourceVersion"], rv.to_string());
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), n - 1);
        assert!(
            items
                .iter()
                .all(|o| o.get("kind").is_none() && o.get("apiVersion").is_none())
        );
        assert_eq!(items[7]["metadata"]["resourceVersion"], (n + 1).to_string());
        assert_eq!(items[7]["spec"]["clusterIP"], "10.0.0.8");
        assert!(items.iter().all(|o| o["metadata"]["name"] != "s00009"));

        let (status, body, _) = get(api.addr(), "/api/v1/services?limit=500&resourceVersion=0");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let page: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(page["items"].as_array().unwrap().len(), 500);
        assert!(page["metadata"]["continue"].is_string());

        let (_, body, chunks) = get(
            api.addr(),
            "/api/v1/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true\
             &resourceVersionMatch=NotOlderThan&resourceVersion=&timeoutSeconds=1",
        );
        // Many events to a chunk (the bookmark in one of its own).
        assert!(body.len() > 2 * INITIAL_CHUNK, "{} bytes", body.len());
        assert!(chunks < n / 20, "{chunks} chunks");
        let events: Vec<Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let added: Vec<&Value> = events.iter().filter(|e| e["type"] == "ADDED").collect();
        assert_eq!(added.len(), n - 1);
        assert!(added.iter().all(|e| e["object"]["kind"] == "Service"));
        assert_eq!(added[7]["object"]["spec"]["clusterIP"], "10.0.0.8");
        let end = &events[added.len()];
        assert_eq!(end["type"], "BOOKMARK");
        assert_eq!(end["object"]["metadata"]["resourceVersion"], rv.to_string());
    }

    #[test]
    fn routes_cover_collections_and_namespaces() {
        assert_eq!(
            Resource::route("/api/v1/services"),
            Some((Resource::Services, None))
        );
        assert_eq!(
            Resource::route("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices"),
            Some((Resource::EndpointSlices, Some("x".into())))
        );
        assert_eq!(
            Resource::route("/apis/networking.k8s.io/v1/servicecidrs"),
            Some((Resource::ServiceCidrs, None))
        );
        assert_eq!(Resource::route("/api/v1/pods"), None);
    }
}
