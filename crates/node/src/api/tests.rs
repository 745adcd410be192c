use std::time::{Instant, SystemTime};

use verdict_admin::http::Handler;
use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
use verdict_model::IpFamily;
use verdict_nft::flows::{Connection, FlowEvent};
use verdict_proxier::{Proxier, ProxierConfig};

use super::*;
use crate::flows::Recorder;

const NODE_IP: &str = "192.168.0.2";

/// What a test node serves.
#[derive(Clone, Copy)]
struct Serves {
    counters: bool,
    flows: bool,
    conntrack: bool,
}

const EVERYTHING: Serves = Serves {
    counters: true,
    flows: true,
    conntrack: true,
};

/// The API of a node with shop/web (ClusterIP 172.30.0.41:80, one
/// endpoint) in memory, with one flow recorded.
fn api(serves: Serves) -> Handler {
    let mut c = ProxierConfig::new(IpFamily::V4, "n1");
    c.node_ips = vec![NODE_IP.parse().unwrap()];
    c.local_ips = c.node_ips.clone();
    let mut p = Proxier::new(c).unwrap();
    let web = svc("shop", "web")
        .cluster_ip("172.30.0.41")
        .port("http", TCP, 80, 30080);
    p.on_service(None, Some(&web));
    let s = slice("shop", "web", "web-1")
        .port("http", TCP, 8080)
        .ep("10.180.0.1", "n1");
    p.on_endpoint_slice(&s, false);
    let mut nft = MemoryBackend::new();
    p.sync(&mut nft, Instant::now()).unwrap();
    let node = NodeHandle::of_proxiers(&[&p], &[NODE_IP.parse().unwrap()]);
    let memory = Arc::new(Mutex::new(nft));
    let read: KernelReader = Arc::new(move |t: &Table, _| {
        TableRead::whole(
            &mut *memory.lock().unwrap(),
            t.family,
            &t.name,
            ReadFrom::Memory,
        )
    });
    let conntrack: ConntrackReader = match serves.conntrack {
        true => Arc::new(|_| Ok(Vec::new())),
        false => Arc::new(|_| {
            Err(verdict_nft::conntrack::ConntrackError::Unavailable(
                "permission denied".into(),
            ))
        }),
    };
    let counters = serves
        .counters
        .then(|| CounterCache::new(node.clone(), read.clone(), None));
    let flows = serves.flows.then(|| {
        let store = FlowStore::new(100);
        let metrics = Arc::new(Mutex::new(verdict_admin::Metrics::new()));
        let mut r = Recorder::new(node.clone(), store.clone(), metrics, None);
        let c = Connection {
            id: Some(1),
            proto: 6,
            client: "10.77.0.21:40000".parse().unwrap(),
            dst: "172.30.0.41:80".parse().unwrap(),
            reply_src: "10.180.0.1:8080".parse().unwrap(),
            reply_dst: "10.77.0.21:40000".parse().unwrap(),
            dnat: true,
            snat: false,
            packets: None,
            bytes: None,
        };
        r.record(vec![FlowEvent::New(c)], SystemTime::now(), None);
        store
    });
    handler(node, read, conntrack, counters, flows, Exposure::Loopback)
}

fn ask(api: &Handler, method: &str, target: &str) -> Response {
    let mut req = Request::get(target);
    req.method = method.into();
    api(&req).expect("an API path")
}

fn body(r: &Response) -> Json {
    serde_json::from_slice(&r.body).unwrap_or(Json::Null)
}

/// Each route, with a request it answers 200, 400 and 404 for, given
/// what the node serves.
const CASES: &[(&str, u16, &str)] = &[
    ("", 200, "/api/v1"),
    ("", 200, "/api/v1/"),
    ("", 400, "/api/v1?verbose=1"),
    ("", 404, "/api/v1/nothing"),
    ("/services", 200, "/api/v1/services"),
    (
        "/services",
        200,
        "/api/v1/services?q=web&problems=1&offset=0&limit=5",
    ),
    ("/services", 400, "/api/v1/services?limit=ten"),
    ("/services", 400, "/api/v1/services?problems=maybe"),
    ("/services", 400, "/api/v1/services?lmit=5"),
    ("/services", 404, "/api/v1/servicesx"),
    ("/services/NAMESPACE/NAME", 200, "/api/v1/services/shop/web"),
    (
        "/services/NAMESPACE/NAME",
        200,
        "/api/v1/services/shop/web?full=1&sort=connections&endpoints_limit=1&endpoint=10.180",
    ),
    (
        "/services/NAMESPACE/NAME",
        400,
        "/api/v1/services/shop/web?sort=size",
    ),
    (
        "/services/NAMESPACE/NAME",
        400,
        "/api/v1/services/shop/web?full=perhaps",
    ),
    ("/services/NAMESPACE/NAME", 400, "/api/v1/services/shop"),
    (
        "/services/NAMESPACE/NAME",
        400,
        "/api/v1/services/shop/web/extra",
    ),
    (
        "/services/NAMESPACE/NAME",
        404,
        "/api/v1/services/shop/nope",
    ),
    ("/problems", 200, "/api/v1/problems"),
    ("/problems", 400, "/api/v1/problems?service=shop/web"),
    ("/problems", 404, "/api/v1/problems/shop"),
    (
        "/trace",
        200,
        "/api/v1/trace?from=pod&src=10.1.2.3&dst=172.30.0.41&proto=tcp&dport=80",
    ),
    ("/trace", 400, "/api/v1/trace?from=pod"),
    (
        "/trace",
        400,
        "/api/v1/trace?from=space&src=10.1.2.3&dst=172.30.0.41&proto=tcp&dport=80",
    ),
    (
        "/trace",
        404,
        "/api/v1/trace?from=pod&src=fd00::1&dst=fd00::41&proto=tcp&dport=80",
    ),
    ("/syncs", 200, "/api/v1/syncs"),
    ("/syncs", 400, "/api/v1/syncs?limit=1"),
    ("/syncs", 404, "/api/v1/syncs/1"),
    ("/foreign", 200, "/api/v1/foreign"),
    ("/foreign", 400, "/api/v1/foreign?since=1"),
    ("/foreign", 404, "/api/v1/foreign/1"),
    ("/drift", 200, "/api/v1/drift"),
    ("/drift", 400, "/api/v1/drift?full=1"),
    ("/drift", 404, "/api/v1/drift/ip"),
    ("/counters", 200, "/api/v1/counters"),
    ("/counters", 200, "/api/v1/counters?service=shop/web"),
    ("/counters", 400, "/api/v1/counters?service=web"),
    ("/counters", 404, "/api/v1/counters?service=shop/nope"),
    ("/connections", 200, "/api/v1/connections"),
    (
        "/connections",
        200,
        "/api/v1/connections?service=shop/web&limit=5&state=ESTABLISHED&stale=1",
    ),
    ("/connections", 400, "/api/v1/connections?limit=all"),
    ("/connections", 400, "/api/v1/connections?stale=yes"),
    (
        "/connections",
        400,
        "/api/v1/connections?service=shop/web/x",
    ),
    ("/connections", 404, "/api/v1/connections?service=shop/nope"),
    ("/flows", 200, "/api/v1/flows"),
    (
        "/flows",
        200,
        "/api/v1/flows?service=shop/web&namespace=shop&ip=10.77.0.21&verdict=forwarded&since=60&limit=5",
    ),
    ("/flows", 200, "/api/v1/flows?aggregated=1&since=60"),
    ("/flows", 400, "/api/v1/flows?verdict=maybe"),
    ("/flows", 400, "/api/v1/flows?aggregated=1&after=3"),
    ("/flows", 400, "/api/v1/flows?ip=ten"),
    ("/flows", 404, "/api/v1/flows?service=shop/nope"),
];

#[test]
fn every_route_answers_200_400_404_and_405() {
    let api = api(EVERYTHING);
    for (route, code, target) in CASES {
        assert!(
            target.starts_with(&format!("{PREFIX}{}", route.replace(SERVICE, ""))),
            "{target} is not a request of {route}"
        );
        let r = ask(&api, "GET", target);
        let doc = body(&r);
        assert_eq!(r.code, *code, "GET {target}: {doc}");
        assert_eq!(r.content_type, "application/json", "{target}");
        if *code != 200 {
            let said = doc["error"].as_str().unwrap_or_default();
            let explained = doc["found"] == false;
            assert!(!said.is_empty() || explained, "{target}: {doc}");
        }
        let r = ask(&api, "POST", target);
        if r.code != 404 {
            assert_eq!(r.code, 405, "POST {target}");
            assert!(r.headers.contains(&("Allow", "GET, HEAD".into())));
        }
    }
    // Every route has each answer among the cases.
    for r in ROUTES {
        for code in [200, 400, 404] {
            assert!(
                CASES.iter().any(|(p, c, _)| *p == r.path && *c == code),
                "no case of {} answering {code}",
                r.full_path()
            );
        }
        let r = ask(&api, "DELETE", &r.full_path().replace(SERVICE, "shop/web"));
        assert_eq!(r.code, 405);
    }
}

#[test]
fn the_errors_say_what_to_give() {
    let api = api(EVERYTHING);
    let said = |target: &str| body(&ask(&api, "GET", target))["error"].clone();
    assert_eq!(
        said("/api/v1/services?lmit=5"),
        "\"lmit\" is not a parameter of /api/v1/services: it takes q, problems, offset, limit"
    );
    assert_eq!(
        said("/api/v1/services?limit=ten"),
        "limit \"ten\" is not a number"
    );
    assert_eq!(
        said("/api/v1/connections?service=web"),
        "service \"web\": name a Service as NAMESPACE/NAME"
    );
    assert_eq!(
        said("/api/v1/services/shop"),
        "\"shop\": name a Service as NAMESPACE/NAME"
    );
    assert_eq!(
        said("/api/v1/flows?service=shop/nope"),
        "no Service shop/nope is known to verdict"
    );
    assert_eq!(said("/api/v1/nothing"), "no such path: /api/v1/nothing");
    let explained = body(&ask(&api, "GET", "/api/v1/services/shop/nope"));
    assert_eq!(explained["found"], false, "{explained}");
    assert_eq!(explained["name"], "nope");
}

#[test]
fn what_a_node_does_not_serve_is_404_and_a_failed_read_500() {
    let off = api(Serves {
        counters: false,
        flows: false,
        conntrack: false,
    });
    let counters = ask(&off, "GET", "/api/v1/counters");
    assert_eq!(counters.code, 404);
    assert!(
        body(&counters)["error"]
            .as_str()
            .unwrap()
            .contains("--service-counters=false")
    );
    let flows = ask(&off, "GET", "/api/v1/flows");
    assert_eq!(flows.code, 404);
    assert!(
        body(&flows)["error"]
            .as_str()
            .unwrap()
            .contains("--flows=false")
    );
    let conns = ask(&off, "GET", "/api/v1/connections");
    assert_eq!(conns.code, 500);
    assert_eq!(
        body(&conns)["error"],
        "cannot reach the conntrack table: permission denied"
    );
    // The rest do not need them.
    assert_eq!(ask(&off, "GET", "/api/v1/services/shop/web").code, 200);
    assert_eq!(ask(&off, "GET", "/api/v1/problems").code, 200);
}

#[test]
fn the_answers_say_what_the_node_has() {
    let api = api(EVERYTHING);
    let page = body(&ask(&api, "GET", "/api/v1/services?q=web"));
    assert_eq!(page["total"], 1, "{page}");
    // One spelling of a family and a protocol in every answer.
    assert_eq!(page["items"][0]["ports"][0]["protocol"], "tcp", "{page}");
    assert_eq!(page["items"][0]["ports"][0]["family"], "ip", "{page}");
    let flows = body(&ask(&api, "GET", "/api/v1/flows?service=shop/web"));
    assert_eq!(flows["flows"][0]["endpoint"], "10.180.0.1:8080", "{flows}");
    let trace = body(&ask(
        &api,
        "GET",
        "/api/v1/trace?from=pod&src=10.1.2.3&dst=172.30.0.41&proto=tcp&dport=80",
    ));
    assert_eq!(trace["service"], "shop/web:http", "{trace}");
    assert_eq!(trace["packet"]["proto"], "tcp", "{trace}");
    assert_eq!(trace["packet"]["from"], "pod", "{trace}");
    assert_eq!(trace["family"], "ip", "{trace}");
    let explained = body(&ask(&api, "GET", "/api/v1/services/shop/web"));
    let port = &explained["families"][0]["ports"][0];
    assert_eq!(port["protocol"], "tcp", "{explained}");
    assert_eq!(port["entry_points"][0]["kind"], "ClusterIP", "{explained}");
    assert_eq!(port["internal_traffic_policy"], "Cluster", "{explained}");
    assert_eq!(
        port["endpoints"][0]["used_by"],
        json!(["cluster"]),
        "{explained}"
    );
    let counters = body(&ask(&api, "GET", "/api/v1/counters?service=shop/web"));
    assert_eq!(counters["service"], "shop/web", "{counters}");
}

#[test]
fn the_index_lists_every_route() {
    let api = api(EVERYTHING);
    let index = body(&ask(&api, "GET", "/api/v1"));
    let listed: Vec<&str> = index["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let routes: Vec<String> = ROUTES[1..].iter().map(Route::full_path).collect();
    assert_eq!(listed, routes);
    assert!(listed.contains(&"/api/v1/services/NAMESPACE/NAME"));
    assert_eq!(ROUTES[0].path, "", "the index first");
}

#[test]
fn only_whole_table_answers_take_turns() {
    for route in ROUTES {
        let target = route.full_path().replace(SERVICE, "shop/web");
        let asks = |target: &str| {
            let api = api(EVERYTHING);
            (0..=Limiter::BURST as usize)
                .map(|_| ask(&api, "GET", target).code)
                .collect::<Vec<u16>>()
        };
        let target = match route.path {
            "/trace" => {
                format!("{target}?from=pod&src=10.1.2.3&dst=172.30.0.41&proto=tcp&dport=80")
            }
            _ => target,
        };
        let codes = asks(&target);
        match route.tables {
            Tables::Whole => assert_eq!(codes, [200, 200, 200, 429], "{target}"),
            Tables::Lookups => assert!(codes.iter().all(|c| *c == 200), "{target}: {codes:?}"),
            Tables::WholeWhen(flag) => {
                assert!(codes.iter().all(|c| *c == 200), "{target}: {codes:?}");
                let whole = asks(&format!("{target}?{flag}=1"));
                assert_eq!(whole, [200, 200, 200, 429], "{target}?{flag}=1");
            }
        }
    }
}

#[test]
fn a_reader_with_the_answer_gets_304() {
    let api = api(EVERYTHING);
    let first = ask(&api, "GET", "/api/v1/services/shop/web");
    let (_, tag) = first.headers.iter().find(|(k, _)| *k == "ETag").unwrap();
    let mut req = Request::get("/api/v1/services/shop/web");
    req.headers.push(("if-none-match".into(), tag.clone()));
    let again = api(&req).unwrap();
    assert_eq!(again.code, 304);
    assert!(again.body.is_empty());
}

#[test]
fn offline_answers_as_the_daemon_and_says_what_only_a_running_node_has() {
    let mut c = ProxierConfig::new(IpFamily::V4, "n1");
    c.node_ips = vec![NODE_IP.parse().unwrap()];
    let mut p = Proxier::new(c).unwrap();
    p.on_service(
        None,
        Some(
            &svc("shop", "web")
                .cluster_ip("172.30.0.41")
                .port("http", TCP, 80, 0),
        ),
    );
    let mut nft = MemoryBackend::new();
    p.sync(&mut nft, Instant::now()).unwrap();
    let node = NodeHandle::of_proxiers(&[&p], &[NODE_IP.parse().unwrap()]);
    let offline = Offline::new(node, nft);
    assert_eq!(offline.get("/api/v1/services/shop/web").0, 200);
    assert_eq!(offline.get("/api/v1/drift").0, 200);
    let (code, doc) = offline.get("/api/v1/flows");
    assert_eq!(code, 404);
    assert!(
        doc["error"].as_str().unwrap().contains("running node"),
        "{doc}"
    );
    let (code, doc) = offline.get("/api/v1/counters");
    assert_eq!(code, 404);
    assert!(
        doc["error"].as_str().unwrap().contains("running node"),
        "{doc}"
    );
    assert_eq!(offline.get("/api/v1/connections").0, 500);
    assert_eq!(offline.get("/api/v1/nothing").0, 404);
}

#[test]
fn an_entity_tag_changes_with_what_an_answer_says_not_when_it_was_made() {
    let a = json!({"counted_at": 1.0, "families": [{"read_ms": 2.5, "ports": [1, 2]}]});
    let b = json!({"counted_at": 9.0, "families": [{"read_ms": 7.0, "ports": [1, 2]}]});
    let c = json!({"counted_at": 1.0, "families": [{"read_ms": 2.5, "ports": [1, 3]}]});
    assert_eq!(entity_tag(&a), entity_tag(&b));
    assert_ne!(entity_tag(&a), entity_tag(&c));
    assert!(entity_tag(&a).starts_with("W/\""));
}

/// `docs/api.md` lists the routes as [`routes_table`] does
/// (`UPDATE_GOLDEN=1` rewrites it).
#[test]
fn the_docs_list_every_route() {
    const BEGIN: &str = "<!-- routes: generated from ROUTES -->\n";
    const END: &str = "<!-- end of routes -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc.find(BEGIN).expect("the routes' marker in docs/api.md") + BEGIN.len();
    let end = doc[start..].find(END).expect("the end marker") + start;
    let table = routes_table();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    assert_eq!(
        &doc[start..end],
        table,
        "docs/api.md is not the route table: UPDATE_GOLDEN=1 cargo test -p verdict-node the_docs_list_every_route"
    );
    for r in ROUTES {
        assert!(doc[start..end].contains(&format!("| `{}` |", r.full_path())));
    }
}
