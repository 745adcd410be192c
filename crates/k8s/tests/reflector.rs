//! The reflector against the fake API server, in process: the faults the
//! real API server cannot be made to show on demand (a streaming list
//! refused or failing, a version expired while watching, a silent
//! server, an object that does not decode). The same protocol against
//! the real kube-apiserver, on both etcds: `crates/verdict/tests/realapi_kernel.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use verdict_e2e::apiserver::FakeApiServer;
use verdict_k8s::objects::Service;
use verdict_k8s::reflector::{Collection, Event, Reflector, Sink};

struct Collect(mpsc::UnboundedSender<Event<Service>>);

impl Sink<Service> for Collect {
    async fn send(&mut self, e: Event<Service>) -> Result<(), ()> {
        self.0.send(e).map_err(|_| ())
    }
}

fn service(name: &str, port: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": port, "protocol": "TCP"}]}
    })
}

/// The fake (a bookmark every 200 ms) and a runtime.
fn start() -> (FakeApiServer, tokio::runtime::Runtime) {
    let api =
        FakeApiServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_millis(200)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (api, rt)
}

/// A reflector of the fake's Services, sending to `tx`, with a read
/// timeout of 2 s.
fn run(
    api: &FakeApiServer,
    rt: &tokio::runtime::Runtime,
    tx: mpsc::UnboundedSender<Event<Service>>,
) {
    let url: http::Uri = format!("http://{}", api.addr()).parse().unwrap();
    let mut config = kube::Config::new(url);
    config.read_timeout = Some(Duration::from_secs(2));
    let _guard = rt.enter();
    let client = kube::Client::try_from(config).unwrap();
    rt.spawn(
        Reflector::new(
            client,
            Collection {
                what: "Services",
                path: "/api/v1/services",
                labels: None,
                fields: None,
            },
        )
        .run(Collect(tx)),
    );
}

/// The next event within `within`, driving the runtime meanwhile.
fn next(
    rt: &tokio::runtime::Runtime,
    rx: &mut mpsc::UnboundedReceiver<Event<Service>>,
    within: Duration,
) -> Option<Event<Service>> {
    rt.block_on(async { tokio::time::timeout(within, rx.recv()).await.ok().flatten() })
}

/// Events up to and including the first that `until` takes.
fn events_until(
    rt: &tokio::runtime::Runtime,
    rx: &mut mpsc::UnboundedReceiver<Event<Service>>,
    until: impl Fn(&Event<Service>) -> bool,
) -> Vec<Event<Service>> {
    let mut out = Vec::new();
    loop {
        let e = next(rt, rx, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no more events after {out:#?}"));
        let done = until(&e);
        out.push(e);
        if done {
            return out;
        }
    }
}

fn names(events: &[Event<Service>]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            Event::ListStart => "start".to_owned(),
            Event::Listed(s) => format!("listed {}", s.metadata.name),
            Event::ListDone => "done".to_owned(),
            Event::Applied(s) => format!("applied {}", s.metadata.name),
            Event::Deleted(k) => format!("deleted {}", k.1),
            Event::Skipped { key, listed, .. } => format!("skipped {} {listed}", key.1),
        })
        .collect()
}

#[test]
fn a_streaming_list_then_changes() {
    let (api, rt) = start();
    api.apply(service("a", 80)).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    run(&api, &rt, tx);
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    assert_eq!(names(&got), ["start", "listed a", "done"]);
    api.apply(service("b", 80)).unwrap();
    api.delete("Service", "demo", "a").unwrap();
    let got = events_until(&rt, &mut rx, |e| matches!(e, Event::Deleted(_)));
    assert_eq!(names(&got), ["applied b", "deleted a"]);
    let requests = api.requests();
    assert!(
        requests[0].contains("sendInitialEvents=true"),
        "{requests:#?}"
    );
    assert!(
        !requests[0].contains("resourceVersion="),
        "a consistent first list: {requests:#?}"
    );
    assert!(
        !requests.iter().any(|r| !r.contains("watch=true")),
        "no plain list: {requests:#?}"
    );
}

#[test]
fn a_streaming_list_that_fails_after_its_200_falls_back_to_a_list_at_once() {
    let (api, rt) = start();
    api.apply(service("a", 80)).unwrap();
    api.set_watch_list_storage_error(true);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t = std::time::Instant::now();
    run(&api, &rt, tx);
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    // The streaming list announced a list, then failed: the plain list
    // is a new list (the mirror takes the second start as the first
    // list's replacement).
    assert_eq!(names(&got).last().unwrap(), "done");
    assert!(names(&got).contains(&"listed a".to_owned()), "{got:#?}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "not at once: {:?}",
        t.elapsed()
    );
    let requests = api.requests();
    assert!(
        requests[0].contains("sendInitialEvents=true"),
        "{requests:#?}"
    );
    assert!(
        requests[1].starts_with("GET /api/v1/services?resourceVersion=0 "),
        "then a plain list from the cache: {requests:#?}"
    );
    // And from then on it is not asked again: a relist is a plain list,
    // no older than what was seen.
    api.apply(service("b", 80)).unwrap();
    events_until(&rt, &mut rx, |e| matches!(e, Event::Applied(_)));
    let last = api.resource_version();
    api.expire();
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    assert_eq!(names(&got), ["start", "listed a", "listed b", "done"]);
    let requests = api.requests();
    let relist = requests
        .iter()
        .rev()
        .find(|r| !r.contains("watch=true"))
        .unwrap();
    assert!(
        relist.contains(&format!(
            "resourceVersion={last}&resourceVersionMatch=NotOlderThan"
        )),
        "{requests:#?}"
    );
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.contains("sendInitialEvents"))
            .count(),
        1
    );
}

#[test]
fn a_streaming_list_refused_with_422_falls_back_too() {
    let (api, rt) = start();
    api.set_watch_list(false);
    let (tx, mut rx) = mpsc::unbounded_channel();
    run(&api, &rt, tx);
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    assert_eq!(names(&got), ["start", "done"]);
}

#[test]
fn after_410_a_streaming_relist_asks_for_no_older_than_the_last_version() {
    let (api, rt) = start();
    api.apply(service("a", 80)).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    run(&api, &rt, tx);
    events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    api.apply(service("b", 80)).unwrap();
    events_until(&rt, &mut rx, |e| matches!(e, Event::Applied(_)));
    // Bookmarks move the last version on, too.
    std::thread::sleep(Duration::from_millis(500));
    let last = api.resource_version();
    api.expire();
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    assert_eq!(names(&got), ["start", "listed a", "listed b", "done"]);
    let requests = api.requests();
    let relist = requests.last().unwrap();
    assert!(relist.contains("sendInitialEvents=true"), "{requests:#?}");
    assert!(
        relist.contains(&format!(
            "resourceVersionMatch=NotOlderThan&resourceVersion={last}&"
        )),
        "{requests:#?}"
    );
}

#[test]
fn an_object_that_does_not_decode_is_skipped_with_its_key() {
    let (api, rt) = start();
    api.apply(service("a", 80)).unwrap();
    // A port that is not a number: the fake stores what it is given.
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bad", "namespace": "demo"},
        "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": "eighty"}]}
    }))
    .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    run(&api, &rt, tx);
    let got = events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    assert_eq!(
        names(&got),
        ["start", "listed a", "skipped bad true", "done"]
    );
    api.delete("Service", "demo", "bad").unwrap();
    let got = events_until(&rt, &mut rx, |e| matches!(e, Event::Deleted(_)));
    assert_eq!(names(&got), ["deleted bad"]);
}

#[test]
fn a_silent_watch_is_resumed_without_a_relist() {
    let (api, rt) = start();
    api.apply(service("a", 80)).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    run(&api, &rt, tx);
    events_until(&rt, &mut rx, |e| *e == Event::ListDone);
    api.set_silent(true);
    // The read timeout is 2 s here.
    std::thread::sleep(Duration::from_secs(3));
    api.set_silent(false);
    api.apply(service("b", 80)).unwrap();
    let got = events_until(&rt, &mut rx, |e| matches!(e, Event::Applied(_)));
    assert_eq!(names(&got), ["applied b"]);
    let requests = api.requests();
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.contains("sendInitialEvents"))
            .count(),
        1,
        "relisted: {requests:#?}"
    );
}
