//! The introspection API on the metrics address, and the same answers
//! offline (`verdict trace --manifests …`): one router, fed by the
//! running daemon's node and the kernel, or by a node built in memory
//! from the manifests.
//!
//! | path | answer |
//! |---|---|
//! | `/api/v1/services?q=&problems=&offset=&limit=` | the Services, one page (`q`: a part of `namespace/name` or of an address; `problems=1`: only those with rejects, drops, no ready endpoint or a quarantined port), with their counts |
//! | `/api/v1/problems` | what is wrong on this node: health, Service ports with rejects or drops, quarantined ports, failed syncs, foreign changes |
//! | `/api/v1/services/NAMESPACE/NAME` | `explain`: one Service, with the drift check |
//! | `/api/v1/trace?from=&src=&sport=&dst=&proto=&dport=` | `trace` through the kernel's table |
//! | `/api/v1/syncs` | the last syncs |
//! | `/api/v1/foreign` | the last foreign changes to verdict's tables |
//! | `/api/v1/drift` | the kernel's elements against verdict's intent, per family |
//! | `/api/v1/counters?service=` | the per-service counters (a reading at least 5 s, and ten times its own duration, old at most) |
//! | `/api/v1/connections?service=&limit=&state=&stale=` | the DNATed connections in conntrack, by Service and endpoint, stale ones (open, to an endpoint that is gone) flagged; `state` and `stale=1` choose the flows listed |
//! | `/api/v1/flows?service=&namespace=&ip=&verdict=&since=&after=&limit=` | the flow stream (`--flows`): recent connections through the Services, newest first, each forwarded (with its endpoint and pod), rejected or dropped (with why); `since` in seconds, `after` a flow's number (a follower's last) |
//! | `/api/v1/flows?aggregated=1&service=&namespace=&ip=&verdict=&since=&limit=` | the flows of the last hour in 15 s buckets, keyed without the client's port, summed over the buckets `since` chooses: connections, packets and bytes, the most connections first |
//! | `/ui` | the web view, a page of its own that reads the API |
//!
//! Every answer comes from the read model ([`NodeHandle`]) and the kernel,
//! read and looked up by the request's own thread: nothing here waits for
//! a sync, and no sync waits for a reader.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use verdict_admin::Response;
use verdict_admin::http::{Handler, Request};
use verdict_model::{IpFamily, NamespacedName};
use verdict_nft::conntrack::Flow;
use verdict_nft::{BackendKind, Family, MemoryBackend};

use crate::access::{Exposure, Limiter};
use crate::flows::{FlowFilter, FlowStore, FlowVerdict};
use crate::inspect::counters::{Counted, Snapshot};
use crate::inspect::{self, BadRequest, Kernel, Reading, TraceRequest};
use crate::view::NodeHandle;

/// Reads one table back (family, name, how much of it).
pub type KernelReader = Arc<ReadTable<'static>>;

/// What reads one table back: (family, name, how much of it).
pub type ReadTable<'a> = dyn Fn(Family, &str, Reading) -> Result<Kernel, String> + Send + Sync + 'a;

/// The most flows `/connections` lists (the counts cover them all).
const MAX_FLOWS: usize = 10_000;
/// Flows listed without `limit`.
const DEFAULT_FLOWS: usize = 200;
/// The most flows `/flows` lists, and without `limit`.
const MAX_STREAM: usize = 5000;
const DEFAULT_STREAM: usize = 200;
/// The most Services one page lists.
const MAX_PAGE: usize = 1000;
/// A page without `limit`.
const DEFAULT_PAGE: usize = 100;

/// Reads tables from the kernel through the configured backend (a socket
/// or an `nft` process per read, so readers never wait on the sync loop).
pub fn kernel_reader(backend: BackendKind) -> KernelReader {
    Arc::new(move |family, name, reading| {
        let mut kernel = backend.open().map_err(|e| e.to_string())?;
        // Only netlink looks an element up by its key and dumps one set;
        // `nft` lists the whole set for any element, so through it the
        // table is read whole, once.
        match reading {
            Reading::Targeted if backend.looks_up_keys() => {
                Kernel::targeted(kernel, family, name, "kernel")
            }
            Reading::Counters if backend.looks_up_keys() => {
                Kernel::counters(&mut *kernel, family, name, "kernel")
            }
            _ => Kernel::whole(&mut *kernel, family, name, "kernel"),
        }
        .map_err(|e| e.to_string())
    })
}

/// Whether `path` is the API's or the web view's.
pub fn is_api_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/") || path == "/api" || path.starts_with("/api/")
}

/// Whether answering `req` reads whole tables (`drift`, `explain
/// --full`): those take turns ([`crate::access::Limiter`]).
fn reads_whole_tables(req: &Request) -> bool {
    let path = req.path.trim_end_matches('/');
    path == "/api/v1/drift"
        || (path.starts_with("/api/v1/services/")
            && matches!(req.query_param("full").as_deref(), Some("1" | "true" | "")))
}

/// The API's handler, and the web view at `/ui` (`counters`: `None` with
/// `--service-counters=false`), answering whom `exposure` admits.
pub fn handler(
    backend: BackendKind,
    node: NodeHandle,
    read: KernelReader,
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
        let turn = if reads_whole_tables(req) {
            match limiter.turn(Instant::now()) {
                Ok(t) => Some(t),
                Err(refused) => return Some(refused),
            }
        } else {
            None
        };
        if req.path.trim_end_matches('/') == "/api/v1/counters" {
            let Some(c) = &counters else {
                let e =
                    json!({"error": "the per-service counters are off (--service-counters=false)"});
                return Some(Response::json(404, e.to_string()));
            };
            let service = req.query_param("service");
            let service = service.as_deref().and_then(|s| s.split_once('/'));
            return Some(Response::json(200, c.snapshot().json(service).to_string()));
        }
        if req.path.trim_end_matches('/') == "/api/v1/flows" {
            let (code, body) = flow_stream(flows.as_deref(), &node, req);
            return Some(Response::json(code, body.to_string()));
        }
        let conntrack = |family: Family| conntrack_flows(backend, family);
        let (code, body) = answer(&node, read.as_ref(), &conntrack, counters.as_deref(), req)?;
        // A reader that has this answer already gets 304 and no body: the
        // web view asks for a Service every 5 s, and a Service of
        // thousands of endpoints rarely changes between.
        let tag = (code == 200).then(|| entity_tag(&body));
        let mut response = match &tag {
            Some(t) if req.header("if-none-match") == Some(t.as_str()) => {
                Response::json(304, String::new())
            }
            _ => Response::json(code, body.to_string()),
        };
        if let Some(t) = tag {
            response.headers.push(("ETag", t));
            response.headers.push(("Cache-Control", "no-cache".into()));
        }
        if turn.is_some() {
            // The whole tables read are freed now: give their pages back
            // (these reads take turns, a few a minute at most).
            drop(body);
            crate::memory::trim();
        }
        Some(response)
    })
}

/// `/api/v1/flows`: a page of the flow stream. A Service that verdict
/// does not know and that no flow names is 404, as elsewhere in the API.
pub fn flow_stream(store: Option<&FlowStore>, node: &NodeHandle, req: &Request) -> (u16, Json) {
    let Some(store) = store else {
        return (
            404,
            json!({"error": "the flow stream is off on this node (--flows=false, or it could not start: see verdict's log)"}),
        );
    };
    let aggregated = match req.query_param("aggregated").as_deref() {
        None | Some("0" | "false") => false,
        Some("1" | "true" | "") => true,
        Some(v) => {
            return bad(BadRequest(format!("aggregated {v:?}: give true or false")));
        }
    };
    match flow_query(|k| req.query_param(k)) {
        Ok((filter, _)) if aggregated && filter.after.is_some() => bad(BadRequest(
            "after: the aggregated flows have no numbers; give since".into(),
        )),
        Ok((filter, limit)) if aggregated => {
            let answer = store.aggregated(&filter, limit);
            if let Some(svc) = &filter.service
                && answer.matched == 0
                && node.service(svc).is_none()
            {
                return (
                    404,
                    json!({"error": format!("no Service {svc} is known to verdict")}),
                );
            }
            (200, to_json(&answer))
        }
        Ok((filter, limit)) => {
            let answer = store.query(&filter, limit);
            if let Some(svc) = &filter.service
                && answer.matched == 0
                && filter.after.is_none()
                && node.service(svc).is_none()
            {
                return (
                    404,
                    json!({"error": format!("no Service {svc} is known to verdict")}),
                );
            }
            (200, to_json(&answer))
        }
        Err(e) => bad(e),
    }
}

/// The filter and limit of a `/flows` request.
pub fn flow_query(
    param: impl Fn(&str) -> Option<String>,
) -> Result<(FlowFilter, usize), BadRequest> {
    let given = |k: &str| param(k).filter(|v| !v.is_empty());
    let mut f = FlowFilter::default();
    if let Some(s) = given("service") {
        match s.split_once('/') {
            Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => {
                f.service = Some(NamespacedName::new(ns, n));
            }
            _ => {
                return Err(BadRequest(format!(
                    "service {s:?}: name it as NAMESPACE/NAME"
                )));
            }
        }
    }
    f.namespace = given("namespace");
    if let Some(ip) = given("ip") {
        f.ip = Some(
            ip.parse()
                .map_err(|_| BadRequest(format!("ip {ip:?} is not an address")))?,
        );
    }
    if let Some(v) = given("verdict") {
        f.verdict = Some(FlowVerdict::parse(&v).ok_or_else(|| {
            BadRequest(format!(
                "verdict {v:?}: give forwarded, rejected or dropped"
            ))
        })?);
    }
    if let Some(s) = given("since") {
        let secs: f64 = s
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| BadRequest(format!("since {s:?}: give seconds")))?;
        f.since = std::time::SystemTime::now().checked_sub(Duration::from_secs_f64(secs));
    }
    if let Some(a) = given("after") {
        f.after = Some(
            a.parse()
                .map_err(|_| BadRequest(format!("after {a:?} is not a flow's number")))?,
        );
    }
    let limit = match given("limit") {
        None => DEFAULT_STREAM,
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| BadRequest(format!("limit {l:?} is not a number")))?
            .min(MAX_STREAM),
    };
    Ok((f, limit))
}

/// The page of endpoints and elements an `explain` request asks for
/// (`endpoints_offset`, `endpoints_limit`, `endpoint`, `sort=connections`,
/// `elements_offset`, `elements_limit`; none: every one).
fn explain_page(req: &Request) -> Result<Option<inspect::ExplainPage>, BadRequest> {
    const KEYS: [&str; 6] = [
        "endpoints_offset",
        "endpoints_limit",
        "endpoint",
        "sort",
        "elements_offset",
        "elements_limit",
    ];
    if !KEYS.iter().any(|k| req.query_param(k).is_some()) {
        return Ok(None);
    }
    let num = |k: &str, default: usize| -> Result<usize, BadRequest> {
        match req.query_param(k) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| BadRequest(format!("{k} {v:?} is not a number"))),
        }
    };
    let by_connections = match req.query_param("sort").as_deref() {
        None | Some("address") => false,
        Some("connections") => true,
        Some(v) => {
            return Err(BadRequest(format!(
                "sort {v:?}: give address or connections"
            )));
        }
    };
    Ok(Some(inspect::ExplainPage {
        filter: req.query_param("endpoint").unwrap_or_default(),
        by_connections,
        endpoints: (
            num("endpoints_offset", 0)?,
            num("endpoints_limit", usize::MAX)?,
        ),
        elements: (
            num("elements_offset", 0)?,
            num("elements_limit", usize::MAX)?,
        ),
    }))
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

/// An answer as JSON.
fn to_json<T: serde::Serialize>(t: &T) -> Json {
    serde_json::to_value(t)
        .unwrap_or_else(|e| json!({"error": format!("cannot encode the answer: {e}")}))
}

fn bad(e: BadRequest) -> (u16, Json) {
    (400, json!({"error": e.0}))
}

/// Reads the DNATed connections of a family (`Err`: why not).
pub type FlowReader<'a> = &'a (dyn Fn(Family) -> Result<Vec<Flow>, String> + Send + Sync);

/// The kernel's connections, the way the backend reaches conntrack.
fn conntrack_flows(backend: BackendKind, family: Family) -> Result<Vec<Flow>, String> {
    backend
        .conntrack()
        .and_then(|mut ct| ct.list_dnat(family))
        .map_err(|e| e.to_string())
}

/// Answers one API request (`None`: not an API path).
pub fn answer(
    node: &NodeHandle,
    read: &ReadTable<'_>,
    flows: FlowReader,
    counted: Option<&CounterCache>,
    req: &Request,
) -> Option<(u16, Json)> {
    let rest = req.path.strip_prefix("/api/v1")?;
    if req.method != "GET" && req.method != "HEAD" {
        return Some((405, json!({"error": "only GET"})));
    }
    // The tables each family's proxier programs.
    let tables: Vec<(IpFamily, Family, String)> = node
        .families()
        .iter()
        .map(|f| {
            let c = &f.config;
            (c.family, c.nft_family(), c.table.clone())
        })
        .collect();
    let table_of = |f: IpFamily| tables.iter().find(|(x, _, _)| *x == f);
    let read_family = |f: IpFamily, reading: Reading| -> Result<Kernel, (u16, Json)> {
        let (_, nf, name) =
            table_of(f).ok_or_else(|| (404, json!({"error": "no proxier for this family"})))?;
        read(*nf, name, reading).map_err(|e| {
            (
                500,
                json!({"error": format!("cannot read table {nf} {name}: {e}")}),
            )
        })
    };
    // An answer built while a lookup failed would show the kernel
    // wrong: the failure is the answer.
    let failed = |f: IpFamily, k: &Kernel| -> Option<(u16, Json)> {
        let e = k.failed()?;
        let what = table_of(f).map(|(_, nf, name)| format!("table {nf} {name}"));
        let what = what.unwrap_or_else(|| "the table".into());
        Some((500, json!({"error": format!("cannot read {what}: {e}")})))
    };
    let answer = match rest.trim_end_matches('/') {
        "" => json!({"paths": [
            "/api/v1/services", "/api/v1/services/NAMESPACE/NAME", "/api/v1/trace",
            "/api/v1/syncs", "/api/v1/foreign", "/api/v1/drift", "/api/v1/counters",
            "/api/v1/connections", "/api/v1/problems", "/api/v1/flows",
        ]}),
        "/problems" => to_json(&inspect::problems(
            node,
            counted.map(|c| c.snapshot()).as_deref(),
        )),
        "/services" => {
            let num = |k: &str, default: usize| -> Result<usize, BadRequest> {
                match req.query_param(k) {
                    None => Ok(default),
                    Some(v) => v
                        .parse()
                        .map_err(|_| BadRequest(format!("{k} {v:?} is not a number"))),
                }
            };
            let (offset, limit) = match (num("offset", 0), num("limit", DEFAULT_PAGE)) {
                (Ok(o), Ok(l)) => (o, l.min(MAX_PAGE)),
                (Err(e), _) | (_, Err(e)) => return Some(bad(e)),
            };
            let q = req.query_param("q").unwrap_or_default();
            let snap = counted.map(|c| c.snapshot());
            let only_problems = match req.query_param("problems").as_deref() {
                None | Some("0" | "false") => false,
                Some("1" | "true" | "") => true,
                Some(v) => {
                    return Some(bad(BadRequest(format!(
                        "problems {v:?}: give true or false"
                    ))));
                }
            };
            let mut page = if only_problems {
                inspect::services_with_problems(node, snap.as_deref(), &q, offset, limit)
            } else {
                inspect::services(node, &q, offset, limit)
            };
            if let Some(snap) = &snap {
                snap.annotate_page(node, &mut page);
            }
            to_json(&page)
        }
        "/syncs" => to_json(&node.history().syncs()),
        // A running node answers this before it gets here.
        "/flows" => {
            return Some((
                404,
                json!({"error": "the flow stream is a running node's (--flows): ask it, not --manifests"}),
            ));
        }
        "/connections" => {
            let service = match req.query_param("service") {
                None => None,
                Some(s) => match s.split_once('/') {
                    Some((ns, n)) if !ns.is_empty() && !n.is_empty() => {
                        Some(NamespacedName::new(ns, n))
                    }
                    _ => {
                        return Some(bad(BadRequest(format!(
                            "service {s:?}: name it as NAMESPACE/NAME"
                        ))));
                    }
                },
            };
            if let Some(svc) = &service
                && node.service(svc).is_none()
            {
                return Some((
                    404,
                    json!({"error": format!("no Service {svc} is known to verdict")}),
                ));
            }
            let limit = match req.query_param("limit").map(|v| v.parse::<usize>()) {
                None => DEFAULT_FLOWS,
                Some(Ok(n)) => n.min(MAX_FLOWS),
                Some(Err(_)) => return Some(bad(BadRequest("limit is not a number".into()))),
            };
            let mut all = Vec::new();
            for (f, nf, _) in &tables {
                match flows(*nf) {
                    Ok(list) => all.push((*f, list)),
                    Err(e) => {
                        return Some((
                            500,
                            json!({"error": format!("cannot read the conntrack table: {e}")}),
                        ));
                    }
                }
            }
            let filter = inspect::FlowFilter {
                state: req.query_param("state").filter(|s| !s.is_empty()),
                stale: matches!(req.query_param("stale").as_deref(), Some("1" | "true" | "")),
            };
            to_json(&inspect::connections(
                node,
                &all,
                service.as_ref(),
                limit,
                &filter,
            ))
        }
        "/foreign" => to_json(&node.history().foreign_changes()),
        "/trace" => {
            let t = match TraceRequest::parse(|k| req.query_param(k)) {
                Ok(t) => t,
                Err(e) => return Some(bad(e)),
            };
            let family = IpFamily::of(t.dst);
            let kernel = match read_family(family, Reading::Targeted) {
                Ok(k) => k,
                Err(e) => return Some(e),
            };
            let answer = inspect::trace(node, &t, &kernel);
            if let Some(e) = failed(family, &kernel) {
                return Some(e);
            }
            match answer {
                Ok(j) => to_json(&j),
                Err(e) => return Some(bad(e)),
            }
        }
        "/drift" => {
            // One family at a time, and through netlink one set at a
            // time: never more of the kernel held than its largest set.
            let mut families = Vec::new();
            for (f, (family, _, _)) in node.families().iter().zip(&tables) {
                let k = match read_family(*family, Reading::Targeted) {
                    Ok(k) => k,
                    Err(e) => return Some(e),
                };
                // A second reader of its own, to read half the sets side
                // by side with the first (set by set readers only).
                let helper = if k.reads_by_set() {
                    match read_family(*family, Reading::Targeted) {
                        Ok(h) => Some(h),
                        Err(e) => return Some(e),
                    }
                } else {
                    None
                };
                let d = inspect::drift(node, f, &k, helper);
                if let Some(e) = failed(*family, &k) {
                    return Some(e);
                }
                families.push(d);
            }
            to_json(&inspect::answers::DriftAnswer { families })
        }
        path => {
            let Some(name) = path.strip_prefix("/services/") else {
                return Some((404, json!({"error": format!("no such path: {}", req.path)})));
            };
            let Some((ns, n)) = name
                .split_once('/')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains('/'))
            else {
                return Some(bad(BadRequest(format!(
                    "{name:?}: name a Service as NAMESPACE/NAME"
                ))));
            };
            let svc = NamespacedName::new(ns, n);
            let view = node.service(&svc);
            // Only the families that proxy the Service are read.
            let wanted: Vec<IpFamily> = view
                .iter()
                .flat_map(|v| &v.families)
                .filter(|f| !f.ports.is_empty())
                .map(|f| f.family)
                .collect();
            // `full` reads the whole table, which also shows the
            // elements naming the Service that verdict does not want.
            let reading = match req.query_param("full").as_deref() {
                None | Some("0" | "false") => Reading::Targeted,
                Some("1" | "true" | "") => Reading::Whole,
                Some(v) => {
                    return Some(bad(BadRequest(format!("full {v:?}: give true or false"))));
                }
            };
            let mut kernels = Vec::new();
            for f in wanted {
                match read_family(f, reading) {
                    Ok(k) => kernels.push((f, k)),
                    Err(e) => return Some(e),
                }
            }
            // The Service's elements are looked up set by set before the
            // answer asks for them one by one.
            if let Some(v) = &view {
                inspect::prefetch_explained(&inspect::explained_elements(v), &kernels);
            }
            let mut doc = inspect::explain(node, &svc, &kernels);
            if let Some(e) = kernels.iter().find_map(|(f, k)| failed(*f, k)) {
                return Some(e);
            }
            if let Some(c) = counted {
                c.snapshot().annotate_explain(node, &mut doc);
            }
            match explain_page(req) {
                Ok(Some(page)) => inspect::page_explained(&mut doc, &page),
                Ok(None) => {}
                Err(e) => return Some(bad(e)),
            }
            let code = if doc.found { 200 } else { 404 };
            return Some((code, to_json(&doc)));
        }
    };
    Some((200, answer))
}

/// How long one reading of the kernel's counters serves `/metrics` and
/// the API at least: several scrapers in a row read the table once.
const COUNTERS_FRESH: Duration = Duration::from_secs(5);

/// How long a reading that took `took` serves: at least
/// [`COUNTERS_FRESH`], and ten times what it took, so that reading the
/// kernel (seconds through `nft` at 30,000 Services) costs at most a tenth
/// of a core however often `/metrics` is scraped.
pub fn counters_fresh_for(took: Duration) -> Duration {
    COUNTERS_FRESH.max(took.saturating_mul(10))
}

/// How often the counters are read even if nobody asks: more often than
/// the problem sets forget a connection (3 minutes), so that every
/// rejected or dropped connection is attributed to its Service.
pub const COUNTERS_READ_EVERY: Duration = Duration::from_secs(30);

use verdict_admin::metrics::FLOWS_NOT_RECORDED;
/// The reason of `verdict_flows_not_recorded_total` for the refusals the
/// kernel counted past its log rate limit.
pub const NOT_LOGGED: &str = "log_rate_limit";

/// Writes text (a part of `/metrics`) as it goes.
pub type WriteText = Arc<dyn Fn(&mut dyn std::fmt::Write) -> std::fmt::Result + Send + Sync>;

/// The last reading of the counters (`--service-counters`), shared by
/// `/metrics` and `/api/v1/counters`, and what is carried from one reading
/// to the next.
pub struct CounterCache {
    node: NodeHandle,
    read: KernelReader,
    /// When the last reading began, how long it took, and what it read.
    last: Mutex<Option<(Instant, Duration, Arc<Snapshot>)>>,
    state: Mutex<Counted>,
    /// Where the flow stream's metrics are, when it runs: each reading
    /// sets how many refusals the kernel counted past the log rate limit.
    flow_metrics: Option<Arc<Mutex<verdict_admin::Metrics>>>,
}

impl CounterCache {
    /// A cache over the node's tables; with the flow stream, `flow_metrics`
    /// gets `verdict_flows_not_recorded_total{reason="log_rate_limit"}`.
    pub fn new(
        node: NodeHandle,
        read: KernelReader,
        flow_metrics: Option<Arc<Mutex<verdict_admin::Metrics>>>,
    ) -> Arc<CounterCache> {
        if let Some(m) = &flow_metrics {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .touch(FLOWS_NOT_RECORDED, &[NOT_LOGGED]);
        }
        Arc::new(CounterCache {
            node,
            read,
            last: Mutex::new(None),
            state: Mutex::new(Counted::default()),
            flow_metrics,
        })
    }

    /// Reads the counters every [`COUNTERS_READ_EVERY`] on a thread of its
    /// own, for as long as the cache lives.
    pub fn read_periodically(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("counters".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(COUNTERS_READ_EVERY);
                    let Some(cache) = weak.upgrade() else {
                        return;
                    };
                    cache.snapshot();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the counters reader: rejects and drops are attributed only when /metrics or the API is read");
        }
    }

    /// A reading at most [`counters_fresh_for`] old: the tables are read
    /// back (without the node's lock), then attributed to Service ports.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, took, snap)) = last.as_ref()
            && at.elapsed() < counters_fresh_for(*took)
        {
            return snap.clone();
        }
        let started = Instant::now();
        let families = self.node.families();
        let read: Vec<(IpFamily, Option<verdict_nft::TableState>)> = families
            .iter()
            .map(|f| {
                let (nf, name) = f.table();
                match (self.read)(nf, name, Reading::Counters) {
                    Ok(k) => (f.config.family, k.table),
                    Err(e) => {
                        tracing::warn!(family = %nf, error = %e, "cannot read the service counters");
                        (f.config.family, None)
                    }
                }
            })
            .collect();
        let pairs: Vec<(IpFamily, Option<&verdict_nft::TableState>)> =
            read.iter().map(|(f, t)| (*f, t.as_ref())).collect();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let snap = Arc::new(Snapshot::of(&self.node, &pairs, &mut state));
        if let Some(m) = &self.flow_metrics {
            m.lock().unwrap_or_else(|e| e.into_inner()).set(
                FLOWS_NOT_RECORDED,
                &[NOT_LOGGED],
                snap.not_logged() as f64,
            );
        }
        *last = Some((started, started.elapsed(), snap.clone()));
        snap
    }

    /// The counters for `/metrics`, written as text.
    pub fn metrics(self: Arc<Self>) -> WriteText {
        Arc::new(move |out| self.snapshot().write(out))
    }
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
        let read = |family: Family, name: &str, _: Reading| -> Result<Kernel, String> {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            Kernel::whole(&mut *memory, family, name, "memory").map_err(|e| e.to_string())
        };
        let flows = |_: Family| -> Result<Vec<Flow>, String> {
            Err("offline (--manifests) there is no conntrack table to read".into())
        };
        answer(&self.node, &read, &flows, None, &Request::get(target))
            .unwrap_or_else(|| (404, json!({"error": format!("no such path: {target}")})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_tag_changes_with_what_an_answer_says_not_when_it_was_made() {
        let a = json!({"counted_at": 1.0, "families": [{"read_ms": 2.5, "ports": [1, 2]}]});
        let b = json!({"counted_at": 9.0, "families": [{"read_ms": 7.0, "ports": [1, 2]}]});
        let c = json!({"counted_at": 1.0, "families": [{"read_ms": 2.5, "ports": [1, 3]}]});
        assert_eq!(entity_tag(&a), entity_tag(&b));
        assert_ne!(entity_tag(&a), entity_tag(&c));
        assert!(entity_tag(&a).starts_with("W/\""));
    }

    #[test]
    fn a_slow_counter_reading_serves_ten_times_as_long() {
        assert_eq!(
            counters_fresh_for(Duration::from_millis(30)),
            COUNTERS_FRESH
        );
        assert_eq!(
            counters_fresh_for(Duration::from_secs(8)),
            Duration::from_secs(80),
            "8 s through nft at 30,000 Services: read at most every 80 s"
        );
    }
}
