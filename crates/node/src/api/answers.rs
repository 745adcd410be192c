//! The answer of each route in [`super::ROUTES`].

use std::time::{Duration, SystemTime};

use serde_json::json;
use verdict_model::{IpFamily, NamespacedName};

use super::{Answer, ApiError, PREFIX, Query, ROUTES, Sources};
use crate::flows::{FlowFilter, FlowVerdict};
use crate::inspect::{self, Reading, TableRead, TraceRequest};

/// The most connections `/connections` lists (the counts cover them all).
const MAX_CONNECTIONS: usize = 10_000;
/// Connections listed without `limit`.
const DEFAULT_CONNECTIONS: usize = 200;
/// The most flows `/flows` lists.
const MAX_FLOWS: usize = 5000;
/// Flows listed without `limit`.
const DEFAULT_FLOWS: usize = 200;
/// The most Services one page lists.
const MAX_PAGE: usize = 1000;
/// A page without `limit`.
const DEFAULT_PAGE: usize = 100;

/// An answer as JSON.
fn to_json<T: serde::Serialize>(t: &T) -> Answer {
    serde_json::to_value(t)
        .map_err(|e| ApiError::Unreadable(format!("cannot encode the answer: {e}")))
}

/// `Ok` if verdict knows the Service.
fn known(s: &Sources<'_>, name: &NamespacedName) -> Result<(), ApiError> {
    match s.node.service(name) {
        Some(_) => Ok(()),
        None => Err(ApiError::UnknownService {
            name: name.clone(),
            answer: None,
        }),
    }
}

/// A family's table read back.
fn read_family(s: &Sources<'_>, family: IpFamily, reading: Reading) -> Result<TableRead, ApiError> {
    let f = s
        .node
        .family(family)
        .ok_or_else(|| ApiError::Off(format!("this node proxies no {family} traffic")))?;
    let t = f.table();
    (s.read)(&t, reading).map_err(|e| ApiError::Unreadable(format!("cannot read table {t}: {e}")))
}

/// `Err` if a lookup in `k` failed: an answer built then would show the
/// kernel wrong, so the failure is the answer.
fn check_read(s: &Sources<'_>, family: IpFamily, k: &TableRead) -> Result<(), ApiError> {
    let Some(e) = k.failed() else {
        return Ok(());
    };
    let what = match s.node.family(family) {
        Some(f) => format!("table {}", f.table()),
        None => "the table".into(),
    };
    Err(ApiError::Unreadable(format!("cannot read {what}: {e}")))
}

/// `/api/v1`: the paths of the other routes.
pub(super) fn index(_: &Sources<'_>, _: &Query) -> Answer {
    let paths: Vec<String> = ROUTES
        .iter()
        .filter(|r| !r.path.is_empty())
        .map(|r| format!("{PREFIX}{}", r.path))
        .collect();
    Ok(json!({ "paths": paths }))
}

/// `/problems`.
pub(super) fn problems(s: &Sources<'_>, _: &Query) -> Answer {
    let snap = s.counters.ok().map(|c| c.snapshot());
    to_json(&inspect::problems(s.node, snap.as_deref()))
}

/// `/services`: one page.
pub(super) fn services(s: &Sources<'_>, q: &Query) -> Answer {
    let offset = q.number("offset", 0)?;
    let limit = q.number("limit", DEFAULT_PAGE)?.min(MAX_PAGE);
    let text = q.get("q").unwrap_or_default();
    let snap = s.counters.ok().map(|c| c.snapshot());
    let mut page = if q.flag("problems")? {
        inspect::services_with_problems(s.node, snap.as_deref(), text, offset, limit)
    } else {
        inspect::services(s.node, text, offset, limit)
    };
    if let Some(snap) = &snap {
        snap.annotate_page(s.node, &mut page);
    }
    to_json(&page)
}

/// `/services/NAMESPACE/NAME`: `explain`.
pub(super) fn explain(s: &Sources<'_>, q: &Query) -> Answer {
    let Some(svc) = q.service() else {
        return Err(ApiError::BadRequest(
            "name a Service as NAMESPACE/NAME".into(),
        ));
    };
    let page = explain_page(q)?;
    let view = s.node.service(svc);
    // Only the families that proxy the Service are read; `full` reads
    // the whole table, which also shows the elements naming the Service
    // that verdict does not want.
    let reading = match q.flag("full")? {
        true => Reading::Whole,
        false => Reading::Targeted,
    };
    let mut kernels = Vec::new();
    for f in view.iter().flat_map(|v| &v.families) {
        if !f.ports.is_empty() {
            kernels.push((f.family, read_family(s, f.family, reading)?));
        }
    }
    // The Service's elements are looked up set by set before the answer
    // asks for them one by one.
    if let Some(v) = &view {
        inspect::prefetch_explained(&inspect::explained_elements(v), &kernels);
    }
    let mut doc = inspect::explain(s.node, svc, &kernels);
    for (f, k) in &kernels {
        check_read(s, *f, k)?;
    }
    if let Ok(c) = s.counters {
        c.snapshot().annotate_explain(s.node, &mut doc);
    }
    if let Some(page) = page {
        inspect::page_explained(&mut doc, &page);
    }
    let found = doc.found;
    let doc = to_json(&doc)?;
    match found {
        true => Ok(doc),
        false => Err(ApiError::UnknownService {
            name: svc.clone(),
            answer: Some(Box::new(doc)),
        }),
    }
}

/// The page of endpoints and elements an `explain` request asks for
/// (none of its parameters: every one).
fn explain_page(q: &Query) -> Result<Option<inspect::ExplainPage>, ApiError> {
    const KEYS: [&str; 6] = [
        "endpoints_offset",
        "endpoints_limit",
        "endpoint",
        "sort",
        "elements_offset",
        "elements_limit",
    ];
    if !KEYS.iter().any(|k| q.get(k).is_some()) {
        return Ok(None);
    }
    let by_connections = match q.get("sort") {
        None | Some("address") => false,
        Some("connections") => true,
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "sort {v:?}: give address or connections"
            )));
        }
    };
    Ok(Some(inspect::ExplainPage {
        filter: q.get("endpoint").unwrap_or_default().to_owned(),
        by_connections,
        endpoints: (
            q.number("endpoints_offset", 0)?,
            q.number("endpoints_limit", usize::MAX)?,
        ),
        elements: (
            q.number("elements_offset", 0)?,
            q.number("elements_limit", usize::MAX)?,
        ),
    }))
}

/// `/trace`.
pub(super) fn trace(s: &Sources<'_>, q: &Query) -> Answer {
    let t = TraceRequest::parse(|k| q.get(k).map(str::to_owned))?;
    let family = IpFamily::of(t.dst);
    let kernel = read_family(s, family, Reading::Targeted)?;
    let answer = inspect::trace(s.node, &t, &kernel);
    check_read(s, family, &kernel)?;
    to_json(&answer?)
}

/// `/syncs`.
pub(super) fn syncs(s: &Sources<'_>, _: &Query) -> Answer {
    to_json(&s.node.history().syncs())
}

/// `/foreign`.
pub(super) fn foreign(s: &Sources<'_>, _: &Query) -> Answer {
    to_json(&s.node.history().foreign_changes())
}

/// `/drift`: one family at a time, and through netlink one set at a
/// time: never more of the kernel held than its largest set.
pub(super) fn drift(s: &Sources<'_>, _: &Query) -> Answer {
    let mut families = Vec::new();
    for f in s.node.families() {
        let family = f.config.family;
        let k = read_family(s, family, Reading::Targeted)?;
        // A second reader of its own, to read half the sets side by side
        // with the first (set by set readers only).
        let helper = match k.reads_by_set() {
            true => Some(read_family(s, family, Reading::Targeted)?),
            false => None,
        };
        let d = inspect::drift(s.node, &f, &k, helper);
        check_read(s, family, &k)?;
        families.push(d);
    }
    to_json(&inspect::answers::DriftAnswer { families })
}

/// `/counters`: the last reading, of one Service or all.
pub(super) fn counters(s: &Sources<'_>, q: &Query) -> Answer {
    let c = s.counters.map_err(|why| ApiError::Off(why.into()))?;
    let service = q.service_param("service")?;
    if let Some(svc) = &service {
        known(s, svc)?;
    }
    to_json(&c.snapshot().answer(service.as_ref()))
}

/// `/connections`: conntrack's DNATed connections.
pub(super) fn connections(s: &Sources<'_>, q: &Query) -> Answer {
    let service = q.service_param("service")?;
    if let Some(svc) = &service {
        known(s, svc)?;
    }
    let limit = q.number("limit", DEFAULT_CONNECTIONS)?.min(MAX_CONNECTIONS);
    let filter = inspect::ConnectionFilter {
        state: q.given("state").map(str::to_owned),
        stale: q.flag("stale")?,
    };
    let mut all = Vec::new();
    for f in s.node.families() {
        let flows =
            (s.conntrack)(f.table().family).map_err(|e| ApiError::Unreadable(e.to_string()))?;
        all.push((f.config.family, flows));
    }
    to_json(&inspect::connections(
        s.node,
        &all,
        service.as_ref(),
        limit,
        &filter,
    ))
}

/// `/flows`: a page of the flow stream, or its aggregates. A Service that
/// verdict does not know and that no flow names is 404, as elsewhere.
pub(super) fn flows(s: &Sources<'_>, q: &Query) -> Answer {
    let store = s.flows.map_err(|why| ApiError::Off(why.into()))?;
    let aggregated = q.flag("aggregated")?;
    let (filter, limit) = flow_filter(q)?;
    let unknown = |matched: usize| match &filter.service {
        Some(svc) if matched == 0 && s.node.service(svc).is_none() => {
            Err(ApiError::UnknownService {
                name: svc.clone(),
                answer: None,
            })
        }
        _ => Ok(()),
    };
    if aggregated {
        if filter.after.is_some() {
            return Err(ApiError::BadRequest(
                "after: the aggregated flows have no numbers; give since".into(),
            ));
        }
        let answer = store.aggregated(&filter, limit);
        unknown(answer.matched)?;
        return to_json(&answer);
    }
    let answer = store.query(&filter, limit);
    if filter.after.is_none() {
        unknown(answer.matched)?;
    }
    to_json(&answer)
}

/// The filter and limit of a `/flows` request.
fn flow_filter(q: &Query) -> Result<(FlowFilter, usize), ApiError> {
    let bad = |s: String| ApiError::BadRequest(s);
    let mut f = FlowFilter {
        service: q.service_param("service")?,
        namespace: q.given("namespace").map(str::to_owned),
        ..FlowFilter::default()
    };
    if let Some(ip) = q.given("ip") {
        f.ip = Some(
            ip.parse()
                .map_err(|_| bad(format!("ip {ip:?} is not an address")))?,
        );
    }
    if let Some(v) = q.given("verdict") {
        f.verdict = Some(FlowVerdict::parse(v).ok_or_else(|| {
            bad(format!(
                "verdict {v:?}: give forwarded, rejected or dropped"
            ))
        })?);
    }
    if let Some(s) = q.given("since") {
        let secs: f64 = s
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| bad(format!("since {s:?}: give seconds")))?;
        f.since = SystemTime::now().checked_sub(Duration::from_secs_f64(secs));
    }
    if let Some(a) = q.given("after") {
        f.after = Some(
            a.parse()
                .map_err(|_| bad(format!("after {a:?} is not a flow's number")))?,
        );
    }
    let limit = q.number("limit", DEFAULT_FLOWS)?.min(MAX_FLOWS);
    Ok((f, limit))
}
