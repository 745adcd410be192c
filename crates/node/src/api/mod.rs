//! The introspection API on the metrics address, and the same answers
//! offline (`verdict trace --manifests …`): one table of routes
//! ([`ROUTES`]), answered from the running daemon's node and the kernel,
//! or from a node built in memory from the manifests.
//!
//! The table drives everything that lists the routes: the index at
//! `/api/v1`, which answers take turns reading whole tables
//! ([`crate::access::Limiter`]) and the table in `docs/api.md`, which a
//! test compares with [`routes_table`]. Adding a route is one entry in
//! [`ROUTES`] and its answer in `answers.rs`.
//!
//! Every answer comes from the read model ([`NodeHandle`]) and the kernel,
//! read and looked up by the request's own thread: nothing here waits for
//! a sync, and no sync waits for a reader.

mod answers;
mod counters;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value as Json, json};
use verdict_admin::Response;
use verdict_admin::http::{Handler, Request};
use verdict_model::NamespacedName;
use verdict_nft::conntrack::{ConntrackError, Flow};
use verdict_nft::{BackendKind, Family, MemoryBackend, NftError, Table};

pub use counters::{COUNTERS_READ_EVERY, CounterCache, NOT_LOGGED, WriteText, counters_fresh_for};

use crate::access::{Exposure, Limiter};
use crate::flows::FlowStore;
use crate::inspect::answers::ReadFrom;
use crate::inspect::{BadRequest, Reading, TableRead};
use crate::view::NodeHandle;

/// Where the API's routes are.
pub const PREFIX: &str = "/api/v1";

/// Reads one table back (which, how much of it).
pub type KernelReader = Arc<ReadTable<'static>>;

/// What reads one table back: (which, how much of it).
pub type ReadTable<'a> = dyn Fn(&Table, Reading) -> Result<TableRead, NftError> + Send + Sync + 'a;

/// Reads the DNATed connections of a family (`Err`: why not).
pub type FlowReader<'a> = &'a ReadConntrack<'a>;

/// Reads the DNATed connections of a family, shared by the handler.
pub type ConntrackReader = Arc<ReadConntrack<'static>>;

/// What reads the DNATed connections of a family (`Err`: why not).
pub type ReadConntrack<'a> = dyn Fn(Family) -> Result<Vec<Flow>, ConntrackError> + Send + Sync + 'a;

/// Why a request is not answered with 200; each has its status and a
/// JSON body `{"error": "…"}`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// A parameter or a name is malformed (400).
    #[error("{0}")]
    BadRequest(String),
    /// No route has this path (404).
    #[error("no such path: {0}")]
    NoSuchPath(String),
    /// The Service named is not known to verdict (404); `answer` is the
    /// answer given anyway (`explain` says what it looked for).
    #[error("no Service {name} is known to verdict")]
    UnknownService {
        /// The Service asked for.
        name: NamespacedName,
        /// The body instead of the error, if any.
        answer: Option<Box<Json>>,
    },
    /// What the route answers is not there on this node (404): the
    /// counters or the flow stream are off, or it is a running node's.
    #[error("{0}")]
    Off(String),
    /// Only GET and HEAD are answered (405).
    #[error("only GET")]
    MethodNotAllowed,
    /// The kernel's tables or conntrack could not be read (500).
    #[error("{0}")]
    Unreadable(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::BadRequest(_) => 400,
            ApiError::NoSuchPath(_) | ApiError::UnknownService { .. } | ApiError::Off(_) => 404,
            ApiError::MethodNotAllowed => 405,
            ApiError::Unreadable(_) => 500,
        }
    }

    /// The body.
    pub fn body(&self) -> Json {
        match self {
            ApiError::UnknownService {
                answer: Some(doc), ..
            } => (**doc).clone(),
            e => json!({ "error": e.to_string() }),
        }
    }

    fn response(&self) -> Response {
        let mut r = Response::json(self.code(), self.body().to_string());
        if *self == ApiError::MethodNotAllowed {
            r.headers.push(("Allow", "GET, HEAD".into()));
        }
        r
    }
}

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> ApiError {
        ApiError::BadRequest(e.0)
    }
}

/// How much of the kernel's tables a route reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tables {
    /// None, or the elements it looks up.
    Lookups,
    /// Whole tables, always: these answers take turns.
    Whole,
    /// Whole tables when this yes/no parameter says so.
    WholeWhen(&'static str),
}

/// What the routes answer from.
pub struct Sources<'a> {
    /// The read model.
    pub node: &'a NodeHandle,
    /// Reads a table back.
    pub read: &'a ReadTable<'a>,
    /// Reads conntrack.
    pub conntrack: FlowReader<'a>,
    /// The per-service counters, or why there are none.
    pub counters: Result<&'a CounterCache, &'static str>,
    /// The flow stream, or why there is none.
    pub flows: Result<&'a FlowStore, &'static str>,
}

/// An answer, or why not.
type Answer = Result<Json, ApiError>;

/// One route of the API.
pub struct Route {
    /// Its path under [`PREFIX`]; `NAMESPACE/NAME` stands for a Service.
    pub path: &'static str,
    /// The query parameters it takes; any other is refused (400).
    pub params: &'static [&'static str],
    /// How much of the tables it reads.
    pub tables: Tables,
    /// What it answers, for the docs.
    pub about: &'static str,
    answer: fn(&Sources<'_>, &Query) -> Answer,
}

/// What stands for a Service in a route's path.
const SERVICE: &str = "NAMESPACE/NAME";

/// Every route of the API, the index first.
pub const ROUTES: &[Route] = &[
    Route {
        path: "",
        params: &[],
        tables: Tables::Lookups,
        about: "this index: the paths below",
        answer: answers::index,
    },
    Route {
        path: "/services",
        params: &["q", "problems", "offset", "limit"],
        tables: Tables::Lookups,
        about: "the Services, one page (`q`: a part of `namespace/name` or of an address; `problems=1`: only those with rejects, drops, no ready endpoint or a quarantined port), with their counts",
        answer: answers::services,
    },
    Route {
        path: "/services/NAMESPACE/NAME",
        params: &[
            "full",
            "endpoints_offset",
            "endpoints_limit",
            "endpoint",
            "sort",
            "elements_offset",
            "elements_limit",
        ],
        tables: Tables::WholeWhen("full"),
        about: "`explain`: one Service, with the drift check (`full=1`: the whole table, with the elements naming it that verdict does not want; the `endpoints_`, `endpoint`, `sort` (`address` or `connections`) and `elements_` parameters choose a page)",
        answer: answers::explain,
    },
    Route {
        path: "/problems",
        params: &[],
        tables: Tables::Lookups,
        about: "what is wrong on this node: health, Service ports with rejects or drops, quarantined ports, failed syncs, foreign changes",
        answer: answers::problems,
    },
    Route {
        path: "/trace",
        params: &["from", "src", "sport", "dst", "proto", "dport"],
        tables: Tables::Lookups,
        about: "`trace`: a packet through the kernel's table (`from`: pod, node or external)",
        answer: answers::trace,
    },
    Route {
        path: "/syncs",
        params: &[],
        tables: Tables::Lookups,
        about: "the last syncs",
        answer: answers::syncs,
    },
    Route {
        path: "/foreign",
        params: &[],
        tables: Tables::Lookups,
        about: "the last foreign changes to verdict's tables",
        answer: answers::foreign,
    },
    Route {
        path: "/drift",
        params: &[],
        tables: Tables::Whole,
        about: "the kernel's elements against verdict's intent, per family",
        answer: answers::drift,
    },
    Route {
        path: "/counters",
        params: &["service"],
        tables: Tables::Lookups,
        about: "the per-service counters (`--service-counters`; a reading at least 5 s, and ten times its own duration, old at most)",
        answer: answers::counters,
    },
    Route {
        path: "/connections",
        params: &["service", "limit", "state", "stale"],
        tables: Tables::Lookups,
        about: "the DNATed connections in conntrack, by Service and endpoint, stale ones (open, to an endpoint that is gone) flagged; `state` and `stale=1` choose the flows listed",
        answer: answers::connections,
    },
    Route {
        path: "/flows",
        params: &[
            "service",
            "namespace",
            "ip",
            "verdict",
            "since",
            "after",
            "limit",
            "aggregated",
        ],
        tables: Tables::Lookups,
        about: "the flow stream (`--flows`): recent connections through the Services, newest first, each forwarded (with its endpoint and pod), rejected or dropped (with why); `since` in seconds, `after` a flow's number (a follower's last); `aggregated=1`: the last hour in 15 s buckets, keyed without the client's port, summed over the buckets `since` chooses",
        answer: answers::flows,
    },
];

impl Route {
    /// Its whole path, as the index lists it.
    pub fn full_path(&self) -> String {
        format!("{PREFIX}{}", self.path)
    }

    /// The route of `path`, and the Service it names if its path has one.
    fn find(path: &str) -> Option<(&'static Route, Option<&str>)> {
        let rest = path.strip_prefix(PREFIX)?;
        let rest = rest.trim_end_matches('/');
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        ROUTES
            .iter()
            .find_map(|r| match r.path.strip_suffix(SERVICE) {
                Some(prefix) => rest
                    .strip_prefix(prefix)
                    .filter(|name| !name.is_empty())
                    .map(|name| (r, Some(name))),
                None => (rest == r.path).then_some((r, None)),
            })
    }

    /// Whether answering `query` reads whole tables: those take turns.
    pub fn reads_whole_tables(&self, query: &Query) -> bool {
        match self.tables {
            Tables::Lookups => false,
            Tables::Whole => true,
            Tables::WholeWhen(flag) => query.flag(flag).unwrap_or(false),
        }
    }
}

/// The routes as the Markdown table of `docs/api.md`.
pub fn routes_table() -> String {
    let mut out = String::from("| path | parameters | reads | answer |\n|---|---|---|---|\n");
    for r in ROUTES {
        let params: Vec<String> = r.params.iter().map(|p| format!("`{p}`")).collect();
        let reads = match r.tables {
            Tables::Lookups => "lookups".to_owned(),
            Tables::Whole => "whole tables".to_owned(),
            Tables::WholeWhen(flag) => format!("whole tables with `{flag}=1`"),
        };
        out.push_str(&format!(
            "| `{}` | {} | {reads} | {} |\n",
            r.full_path(),
            if params.is_empty() {
                "none".to_owned()
            } else {
                params.join(", ")
            },
            r.about
        ));
    }
    out
}

/// A request's query parameters, decoded once, and the Service its path
/// names.
#[derive(Debug, Default)]
pub struct Query {
    pairs: Vec<(String, String)>,
    service: Option<NamespacedName>,
}

impl Query {
    /// The query of `req` for `route`: every parameter one it takes, and
    /// the Service in its path (`named`) well formed.
    fn of(req: &Request, route: &Route, named: Option<&str>) -> Result<Query, ApiError> {
        let pairs = req.query_pairs();
        if let Some((k, _)) = pairs
            .iter()
            .find(|(k, _)| !route.params.contains(&k.as_str()))
        {
            let takes = match route.params {
                [] => "none".to_owned(),
                some => some.join(", "),
            };
            return Err(ApiError::BadRequest(format!(
                "{k:?} is not a parameter of {}: it takes {takes}",
                route.full_path()
            )));
        }
        let service = named
            .map(|n| service_name(n).map_err(|e| ApiError::BadRequest(format!("{n:?}: {e}"))))
            .transpose()?;
        Ok(Query { pairs, service })
    }

    /// A parameter's value (the first if repeated).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A parameter's value, unless it is empty.
    pub fn given(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    /// A yes/no parameter: absent, `0` or `false` is no; `1`, `true` or
    /// no value is yes.
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("0" | "false") => Ok(false),
            Some("1" | "true" | "") => Ok(true),
            Some(v) => Err(ApiError::BadRequest(format!(
                "{key} {v:?}: give true or false"
            ))),
        }
    }

    /// A count (`default` if absent).
    pub fn number(&self, key: &str, default: usize) -> Result<usize, ApiError> {
        match self.given(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| ApiError::BadRequest(format!("{key} {v:?} is not a number"))),
        }
    }

    /// A Service named by a parameter.
    pub fn service_param(&self, key: &str) -> Result<Option<NamespacedName>, ApiError> {
        self.given(key)
            .map(|s| service_name(s).map_err(|e| ApiError::BadRequest(format!("{key} {s:?}: {e}"))))
            .transpose()
    }

    /// The Service the path names.
    pub fn service(&self) -> Option<&NamespacedName> {
        self.service.as_ref()
    }
}

/// A Service's `NAMESPACE/NAME`, as the API and the CLI take it.
pub fn service_name(s: &str) -> Result<NamespacedName, BadRequest> {
    match s.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => {
            Ok(NamespacedName::new(ns, n))
        }
        _ => Err(BadRequest("name a Service as NAMESPACE/NAME".into())),
    }
}

/// Reads tables from the kernel through the configured backend (a socket
/// or an `nft` process per read, so readers never wait on the sync loop).
pub fn kernel_reader(backend: BackendKind) -> KernelReader {
    Arc::new(move |t: &Table, reading| {
        let (family, name) = (t.family, t.name.as_str());
        let mut kernel = backend.open()?;
        // Only netlink looks an element up by its key and dumps one set;
        // `nft` lists the whole set for any element, so through it the
        // table is read whole, once.
        match reading {
            Reading::Targeted if backend.looks_up_keys() => {
                TableRead::targeted(kernel, family, name, ReadFrom::Kernel)
            }
            Reading::Counters if backend.looks_up_keys() => {
                TableRead::counters(&mut *kernel, family, name, ReadFrom::Kernel)
            }
            _ => TableRead::whole(&mut *kernel, family, name, ReadFrom::Kernel),
        }
    })
}

/// Whether `path` is the API's or the web view's.
pub fn is_api_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/") || path == "/api" || path.starts_with("/api/")
}

/// The API's handler, and the web view at `/ui` (`counters`: `None` with
/// `--service-counters=false`; `flows`: `None` with the flow stream off),
/// answering whom `exposure` admits.
pub fn handler(
    node: NodeHandle,
    read: KernelReader,
    conntrack: ConntrackReader,
    counters: Option<Arc<CounterCache>>,
    flows: Option<Arc<FlowStore>>,
    exposure: Exposure,
) -> Handler {
    let limiter = Arc::new(Limiter::default());
    Arc::new(move |req: &Request| {
        if !is_api_path(&req.path) {
            return None;
        }
        if let Err(refused) = crate::access::admit(&exposure, req) {
            return Some(refused);
        }
        if req.path == "/ui" || req.path.starts_with("/ui/") {
            return Some(crate::inspect::ui::page(req));
        }
        let sources = Sources {
            node: &node,
            read: read.as_ref(),
            conntrack: conntrack.as_ref(),
            counters: counters
                .as_deref()
                .ok_or("the per-service counters are off (--service-counters=false)"),
            flows: flows.as_deref().ok_or(
                "the flow stream is off on this node (--flows=false, or it could not start: see verdict's log)",
            ),
        };
        Some(respond(&sources, &limiter, req))
    })
}

/// Answers `req` from `sources`; whole-table answers take turns at
/// `limiter`.
fn respond(sources: &Sources<'_>, limiter: &Limiter, req: &Request) -> Response {
    let (route, query) = match resolve(req) {
        Ok(found) => found,
        Err(e) => return e.response(),
    };
    let turn = match route.reads_whole_tables(&query) {
        true => match limiter.turn(Instant::now()) {
            Ok(t) => Some(t),
            Err(refused) => return refused,
        },
        false => None,
    };
    let body = match (route.answer)(sources, &query) {
        Ok(body) => body,
        Err(e) => return e.response(),
    };
    // A reader that has this answer already gets 304 and no body: the
    // web view asks for a Service every 5 s, and a Service of thousands
    // of endpoints rarely changes between.
    let tag = entity_tag(&body);
    let mut response = if req.header("if-none-match") == Some(tag.as_str()) {
        Response::json(304, String::new())
    } else {
        Response::json(200, body.to_string())
    };
    response.headers.push(("ETag", tag));
    response.headers.push(("Cache-Control", "no-cache".into()));
    if turn.is_some() {
        // The whole tables read are freed now: give their pages back
        // (these reads take turns, a few a minute at most).
        drop(body);
        crate::memory::trim();
    }
    response
}

/// The route `req` asks for and its query, or why it cannot be answered.
fn resolve(req: &Request) -> Result<(&'static Route, Query), ApiError> {
    let (route, named) =
        Route::find(&req.path).ok_or_else(|| ApiError::NoSuchPath(req.path.clone()))?;
    if req.method != "GET" && req.method != "HEAD" {
        return Err(ApiError::MethodNotAllowed);
    }
    Ok((route, Query::of(req, route, named)?))
}

/// Fields that say when or how fast an answer was made, not what it
/// says: an entity tag leaves them out.
const VOLATILE: [&str; 2] = ["counted_at", "read_ms"];

/// A weak entity tag of an answer: the same for answers that say the
/// same, whenever the counters or the kernel were read ([`VOLATILE`]).
pub fn entity_tag(doc: &Json) -> String {
    use std::hash::{Hash, Hasher};
    fn walk(v: &Json, h: &mut std::collections::hash_map::DefaultHasher) {
        match v {
            Json::Object(m) => {
                b'{'.hash(h);
                for (k, v) in m {
                    if !VOLATILE.contains(&k.as_str()) {
                        k.hash(h);
                        walk(v, h);
                    }
                }
            }
            Json::Array(a) => {
                b'['.hash(h);
                a.len().hash(h);
                a.iter().for_each(|v| walk(v, h));
            }
            other => other.to_string().hash(h),
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    walk(doc, &mut h);
    format!("W/\"{:016x}\"", h.finish())
}

/// Reads the kernel's connections the way the backend reaches conntrack
/// (a socket or a `conntrack` process per read).
pub fn conntrack_reader(backend: BackendKind) -> ConntrackReader {
    Arc::new(move |family| backend.conntrack().and_then(|mut ct| ct.list_dnat(family)))
}

/// A node built in memory from the source, as `plan` builds it, for the
/// offline mode of the introspection commands.
pub struct Offline {
    node: NodeHandle,
    memory: Mutex<MemoryBackend>,
}

impl Offline {
    /// The read model of `node`, whose tables `memory` holds.
    pub fn new(node: NodeHandle, memory: MemoryBackend) -> Offline {
        Offline {
            node,
            memory: Mutex::new(memory),
        }
    }

    /// Answers `target` (`/api/v1/…?…`) as the daemon would.
    pub fn get(&self, target: &str) -> (u16, Json) {
        // The table is in memory: reading it whole costs nothing.
        let read = |t: &Table, _: Reading| -> Result<TableRead, NftError> {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            TableRead::whole(&mut *memory, t.family, &t.name, ReadFrom::Memory)
        };
        let conntrack = |_: Family| -> Result<Vec<Flow>, ConntrackError> {
            Err(ConntrackError::Unavailable(
                "offline (--manifests) there is none to read".into(),
            ))
        };
        let sources = Sources {
            node: &self.node,
            read: &read,
            conntrack: &conntrack,
            counters: Err("the counters are a running node's: ask it (--server), not --manifests"),
            flows: Err("the flow stream is a running node's (--flows): ask it, not --manifests"),
        };
        match resolve(&Request::get(target)).and_then(|(route, q)| (route.answer)(&sources, &q)) {
            Ok(body) => (200, body),
            Err(e) => (e.code(), e.body()),
        }
    }
}
