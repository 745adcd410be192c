//! The run loop, whole, without root: the in-memory backend stands for
//! the kernel, a fake conntrack table for ctnetlink, and the test sends
//! the inputs a node would get (the source's updates, a foreign commit, a
//! stop). What readers see is asserted through the read model, as the API
//! reads it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verdict_admin::Metrics;
use verdict_conformance::{ServiceExt, SliceExt, TCP, UDP, slice, svc};
use verdict_k8s::NodeInfo;
use verdict_k8s::watch::Update;
use verdict_model::{EndpointSlice, NamespacedName, Service};
use verdict_nft::conntrack::{Conntrack, ConntrackError, Flow, UdpEntry};
use verdict_nft::monitor::{Change, Object};
use verdict_nft::{
    Backend, Element, Family, Found, Listener, MemoryBackend, NftError, TableState, Transaction,
    Value,
};
use verdict_node::{
    FixedAddresses, Foreign, Input, Kernel, NodeError, NodeHandle, NodeProxy, NodeSettings,
};
use verdict_proxier::NodePortAddresses;

/// The in-memory backend, shared with the test so that it can look, and
/// play another process that changes the table; its reads of a table can
/// be held (a read of 180,000 elements takes a while).
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<MemoryBackend>>, Arc<ReadGate>);

/// Held, a read of a table waits until it is let go.
#[derive(Default)]
struct ReadGate {
    held: Mutex<bool>,
    let_go: Condvar,
}

impl ReadGate {
    fn hold(&self, held: bool) {
        *self.held.lock().unwrap() = held;
        self.let_go.notify_all();
    }

    fn pass(&self) {
        let mut held = self.held.lock().unwrap();
        while *held {
            held = self.let_go.wait(held).unwrap();
        }
    }
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut MemoryBackend) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    fn table(&self) -> Option<TableState> {
        self.with(|m| m.get(Family::Ip, "verdict").cloned())
    }

    /// Whether the table holds `key` in `set`, or, for a verdict map whose
    /// jumps may be staged, behind its gate (`verdict_proxier::staging`).
    fn has(&self, set: &str, key: &[Value]) -> bool {
        let t = self.table();
        let holds = |set: &str| {
            t.as_ref()
                .and_then(|t| t.sets.get(set).map(|s| s.elements.contains_key(key)))
                .unwrap_or(false)
        };
        holds(set) || verdict_proxier::layout::staged_of(set).is_some_and(holds)
    }
}

impl Backend for Shared {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.with(|m| m.run(tx))
    }
    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.with(|m| m.check(tx))
    }
    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.1.pass();
        self.with(|m| m.table(family, name))
    }
    fn elements(&mut self, f: Family, t: &str, s: &str) -> Result<Vec<Element>, NftError> {
        self.with(|m| m.elements(f, t, s))
    }
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.with(|m| m.generation())
    }
    fn lookup(
        &mut self,
        f: Family,
        t: &str,
        s: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<Found>>, NftError> {
        self.with(|m| m.lookup(f, t, s, keys))
    }
}

/// A conntrack table with one stale UDP entry to a DNS endpoint that the
/// test removes, recording what the loop asks of it.
#[derive(Clone, Default)]
struct FakeConntrack(Arc<Mutex<(Vec<UdpEntry>, Vec<UdpEntry>)>>);

impl Conntrack for FakeConntrack {
    fn list_udp(&mut self, _: Family) -> Result<Vec<UdpEntry>, ConntrackError> {
        Ok(self.0.lock().unwrap().0.clone())
    }
    fn list_dnat(&mut self, _: Family) -> Result<Vec<Flow>, ConntrackError> {
        Ok(Vec::new())
    }
    fn delete_udp(&mut self, _: Family, e: &UdpEntry) -> Result<usize, ConntrackError> {
        let mut s = self.0.lock().unwrap();
        let before = s.0.len();
        s.0.retain(|x| x != e);
        s.1.push(*e);
        Ok(before - s.0.len())
    }
    fn list_unanswered(&mut self, _: Family) -> Result<Vec<Flow>, ConntrackError> {
        Ok(Vec::new())
    }
    fn delete_flow(&mut self, _: Family, _: &Flow) -> Result<bool, ConntrackError> {
        Ok(false)
    }
}

/// Where another process deletes an element: the backend and the key in
/// `service-ips`.
type Damage = (Shared, Vec<Value>);

/// The listener's membership, recording the loop's calls; armed, it
/// plays another process that deletes one of verdict's elements just
/// before the listener joins again, unheard.
#[derive(Clone, Default)]
struct Membership {
    calls: Arc<Mutex<Vec<&'static str>>>,
    armed: Arc<Mutex<Option<Damage>>>,
}

impl Listener for Membership {
    fn leave(&self) -> std::io::Result<()> {
        self.calls.lock().unwrap().push("leave");
        Ok(())
    }
    fn join(&self) -> std::io::Result<()> {
        if let Some((memory, key)) = self.armed.lock().unwrap().take() {
            memory.with(|m| {
                let mut tx = Transaction::new(Family::Ip, "verdict");
                tx.delete_element("service-ips", key);
                m.run(&tx).unwrap();
            });
        }
        self.calls.lock().unwrap().push("join");
        Ok(())
    }
}

/// The loop, running on a thread of its own.
struct Running {
    tx: Sender<Input>,
    handle: NodeHandle,
    memory: Shared,
    conntrack: FakeConntrack,
    /// The tables the loop asked to listen to.
    listened: Arc<Mutex<Vec<String>>>,
    membership: Membership,
    done: Option<JoinHandle<Result<(), NodeError>>>,
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A loop on node `n1`, addresses as given, minSyncPeriod short.
fn start_with(addresses: Vec<IpAddr>, tweak: impl FnOnce(&mut NodeSettings)) -> Running {
    start_posting(addresses, tweak, None)
}

/// The same, posting Events to `events`.
fn start_posting(
    addresses: Vec<IpAddr>,
    tweak: impl FnOnce(&mut NodeSettings),
    events: Option<std::sync::mpsc::SyncSender<verdict_k8s::events::Notice>>,
) -> Running {
    start_on(Shared::default(), addresses, tweak, events)
}

/// The same, on `memory` (the rules in place of an earlier loop, say).
fn start_on(
    memory: Shared,
    addresses: Vec<IpAddr>,
    tweak: impl FnOnce(&mut NodeSettings),
    events: Option<std::sync::mpsc::SyncSender<verdict_k8s::events::Notice>>,
) -> Running {
    let mut settings = NodeSettings::new("n1");
    settings.min_sync_period = Duration::from_millis(20);
    settings.detect_local =
        verdict_node::DetectLocal::ClusterCidr(vec!["10.0.0.0/8".parse().unwrap()]);
    tweak(&mut settings);
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let addresses = Arc::new(FixedAddresses(addresses));
    let mut node = NodeProxy::new(settings, metrics, addresses.as_ref()).unwrap();
    node.set_events(events);
    let handle = node.handle();
    let conntrack = FakeConntrack::default();
    let listened = Arc::new(Mutex::new(Vec::new()));
    let l = listened.clone();
    let membership = Membership::default();
    let m = membership.clone();
    let kernel = Kernel {
        backend: Box::new(memory.clone()),
        conntrack: Box::new(conntrack.clone()),
        addresses,
        listen: Box::new(move |tables| {
            l.lock()
                .unwrap()
                .extend(tables.into_iter().map(|t| t.to_string()));
            Some(Box::new(m.clone()))
        }),
        leftovers: Box::new(|_| Vec::new()),
        around_large: None,
        reader: Some(Box::new(memory.clone())),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let done = std::thread::spawn(move || verdict_node::run(node, kernel, rx));
    Running {
        tx,
        handle,
        memory,
        conntrack,
        listened,
        membership,
        done: Some(done),
    }
}

fn start() -> Running {
    start_with(vec![ip("127.0.0.1"), ip("192.168.0.2")], |_| {})
}

impl Running {
    fn send(&self, updates: Vec<Update>) {
        self.tx.send(Input::Updates(updates)).unwrap();
    }

    fn stop(mut self) -> Result<(), NodeError> {
        self.tx.send(Input::Stop).unwrap();
        self.done.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.tx.send(Input::Stop);
    }
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn key(s: &Service) -> (String, String) {
    (s.namespace.clone(), s.name.clone())
}

fn service(s: Service) -> Update {
    Update::Service(key(&s), Some(s))
}

fn endpoints(s: EndpointSlice) -> Update {
    Update::Slice((s.namespace.clone(), s.name.clone()), Some(s))
}

/// This node's Node object: /healthz counts it (a node being deleted,
/// or not known, takes no load-balancer traffic).
fn this_node() -> Update {
    Update::Node(Some(NodeInfo {
        name: "n1".into(),
        addresses: vec!["192.168.0.2".into()],
        ..NodeInfo::default()
    }))
}

fn web() -> Service {
    svc("ns", "web")
        .cluster_ip("172.30.0.41")
        .port("http", TCP, 80, 0)
}

fn web_slice(ips: &[&str]) -> EndpointSlice {
    let mut s = slice("ns", "web", "web-1").port("http", TCP, 8080);
    for i in ips {
        s = s.ep(i, "n1");
    }
    s
}

fn entry(addr: &str, port: u16) -> Vec<Value> {
    vec![
        Value::Addr(ip(addr)),
        Value::Proto(verdict_nft::L4Proto::Tcp),
        Value::Port(port),
    ]
}

fn metric(h: &NodeHandle, line_start: &str) -> Option<f64> {
    let text = h.metrics().lock().unwrap().render();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `/healthz` as the server answers it now.
fn healthz_now(h: &verdict_node::NodeHandle) -> verdict_admin::Response {
    h.health()
        .lock()
        .unwrap()
        .healthz(verdict_admin::time::Moment::now())
}

#[test]
fn nothing_is_programmed_before_the_lists_then_changes_flow_through_to_readers() {
    let r = start();
    let name = NamespacedName::new("ns", "web");
    r.send(vec![
        service(web()),
        endpoints(web_slice(&["10.180.0.1", "10.180.0.2"])),
    ]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(r.memory.table().is_none(), "programmed before Synced");
    assert!(r.handle.service(&name).is_none());
    r.send(vec![this_node(), Update::Synced]);
    wait_until("the first sync is published", || {
        r.handle.service(&name).is_some()
    });
    assert!(r.memory.has("service-ips", &entry("172.30.0.41", 80)));
    let v = r.handle.service(&name).unwrap();
    let (_, port) = v.ports().next().unwrap();
    assert_eq!(port.endpoints.len(), 2);
    assert_eq!(r.handle.services_at(ip("172.30.0.41")).len(), 1);
    // Health, metrics and history, as the servers read them.
    let healthz = healthz_now(&r.handle);
    assert_eq!(healthz.code, 200, "{}", healthz.text_body());
    assert!(
        metric(
            &r.handle,
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
        )
        .is_some_and(|t| t > 0.0)
    );
    let syncs = r.handle.history().syncs();
    assert!(
        syncs
            .items
            .iter()
            .any(|s| s.trigger == "first sync" && s.full),
        "{syncs:#?}"
    );
    // The listener joins after the first full sync, for both tables.
    assert_eq!(*r.listened.lock().unwrap(), ["ip verdict", "ip6 verdict"]);

    // An endpoint goes: the reader sees the one left.
    r.send(vec![endpoints(web_slice(&["10.180.0.2"]))]);
    wait_until("the endpoint change is published", || {
        r.handle.service(&name).is_some_and(|v| {
            v.ports()
                .next()
                .is_some_and(|(_, p)| p.endpoints.len() == 1)
        })
    });
    // The Service goes: from the kernel, the view and its indexes.
    r.send(vec![Update::Service(key(&web()), None)]);
    wait_until("the deletion is published", || {
        r.handle.service(&name).is_none()
    });
    assert!(!r.memory.has("service-ips", &entry("172.30.0.41", 80)));
    assert!(r.handle.services_at(ip("172.30.0.41")).is_empty());
    // Counted as kube-proxy counts them on a dual-stack node: a Service
    // event by each family's tracker (2 events, 4), an IPv4 slice's by the
    // IPv4 tracker alone (2 events, 2).
    assert_eq!(
        metric(
            &r.handle,
            "kubeproxy_sync_proxy_rules_service_changes_total "
        ),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &r.handle,
            "kubeproxy_sync_proxy_rules_endpoint_changes_total "
        ),
        Some(2.0)
    );
    assert!(r.stop().is_ok(), "a stop leaves the loop cleanly");
}

/// The node keeps a fingerprint of each object, not the object: an
/// unchanged one is still dropped, a changed Service still loses its old
/// ports, and a deleted slice (which comes as its name alone) still takes
/// its endpoints with it.
#[test]
fn objects_are_remembered_by_fingerprint_alone() {
    let r = start();
    let name = NamespacedName::new("ns", "web");
    let changes = |r: &Running| {
        (
            metric(
                &r.handle,
                "kubeproxy_sync_proxy_rules_service_changes_total ",
            ),
            metric(
                &r.handle,
                "kubeproxy_sync_proxy_rules_endpoint_changes_total ",
            ),
        )
    };
    r.send(vec![
        service(web()),
        endpoints(web_slice(&["10.180.0.1", "10.180.0.2"])),
        this_node(),
        Update::Synced,
    ]);
    wait_until("the first sync", || {
        r.memory.has("service-ips", &entry("172.30.0.41", 80))
    });
    assert_eq!(changes(&r), (Some(2.0), Some(1.0)));
    // The same objects again: nothing changed, nothing counted.
    r.send(vec![
        service(web()),
        endpoints(web_slice(&["10.180.0.1", "10.180.0.2"])),
    ]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(changes(&r), (Some(2.0), Some(1.0)));
    // The port moves: the old one goes, though only the new object came.
    let moved = svc("ns", "web")
        .cluster_ip("172.30.0.41")
        .port("http", TCP, 81, 0);
    r.send(vec![service(moved)]);
    wait_until("port 81 is programmed", || {
        r.memory.has("service-ips", &entry("172.30.0.41", 81))
    });
    assert!(!r.memory.has("service-ips", &entry("172.30.0.41", 80)));
    // The slice is deleted by name: the Service has no endpoints left,
    // and rejects.
    r.send(vec![Update::Slice(("ns".into(), "web-1".into()), None)]);
    wait_until("the endpoints are gone", || {
        !r.memory.has("service-ips", &entry("172.30.0.41", 81))
    });
    assert!(
        r.memory
            .has("no-endpoint-services", &entry("172.30.0.41", 81))
    );
    // The read model follows the sync that programmed it (it is
    // published after the sync's metrics are recorded).
    wait_until("the read model shows no endpoints", || {
        r.handle.service(&name).is_some_and(|v| {
            v.ports()
                .next()
                .is_some_and(|(_, p)| p.endpoints.is_empty())
        })
    });
    assert_eq!(changes(&r), (Some(4.0), Some(2.0)));
}

#[test]
fn a_foreign_flush_is_repaired_and_recorded() {
    let r = start();
    r.send(vec![
        service(web()),
        endpoints(web_slice(&["10.180.0.1"])),
        Update::Synced,
    ]);
    wait_until("programmed", || {
        r.memory.has("service-ips", &entry("172.30.0.41", 80))
    });
    // Another process flushes verdict's table and the listener says so.
    r.memory.with(|m| {
        let mut tx = Transaction::new(Family::Ip, "verdict");
        tx.delete_table();
        m.run(&tx).unwrap();
    });
    r.tx.send(flushed_by_nft()).unwrap();
    let t = Instant::now();
    wait_until("repaired", || {
        r.memory.has("service-ips", &entry("172.30.0.41", 80))
    });
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let foreign = r.handle.history().foreign_changes();
    assert_eq!(
        foreign.items[0].process.as_deref(),
        Some("nft"),
        "{foreign:#?}"
    );
    assert_eq!(
        metric(
            &r.handle,
            "verdict_foreign_changes_total{ip_family=\"IPv4\"}"
        ),
        Some(1.0)
    );
}

/// Another process's flush of verdict's table, announced.
fn flushed_by_nft() -> Input {
    Input::Foreign(Foreign::Commit {
        pid: 4242,
        process: "nft".into(),
        changes: vec![Change {
            added: false,
            object: Object::Table,
            family: "ip",
            table: "verdict".into(),
            name: None,
        }],
    })
}

#[test]
fn a_large_commit_is_made_unheard_and_a_commit_it_hid_is_repaired() {
    let r = start();
    // 4,000 Services: a repair writes more than QUIET_AT operations.
    let mut updates = Vec::new();
    for i in 0..4000u32 {
        let addr = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        let name = format!("s{i}");
        updates.push(service(
            svc("ns", &name).cluster_ip(&addr).port("http", TCP, 80, 0),
        ));
        updates.push(endpoints(
            slice("ns", &name, &format!("{name}-1"))
                .port("http", TCP, 8080)
                .ep(&format!("10.{}.{}.1", i / 250, i % 250), "n1"),
        ));
    }
    updates.push(Update::Synced);
    r.send(updates);
    let first = entry("172.30.0.1", 80);
    wait_until("programmed", || r.memory.has("service-ips", &first));
    wait_until("listening", || r.listened.lock().unwrap().len() == 2);
    // A change is small: the listener stays in the group.
    r.send(vec![endpoints(
        slice("ns", "s1", "s1-1")
            .port("http", TCP, 8080)
            .ep("10.0.1.9", "n1"),
    )]);
    wait_until("the change is published", || {
        r.handle
            .service(&NamespacedName::new("ns", "s1"))
            .is_some_and(|v| {
                v.ports()
                    .any(|(_, p)| p.endpoints.iter().any(|e| e.ip == ip("10.0.1.9")))
            })
    });
    assert!(r.membership.calls.lock().unwrap().is_empty());

    // A foreign flush: the repair rewrites everything, unheard, and while
    // the listener is out another process deletes a Service's element.
    *r.membership.armed.lock().unwrap() = Some((r.memory.clone(), first.clone()));
    r.memory.with(|m| {
        let mut tx = Transaction::new(Family::Ip, "verdict");
        tx.delete_table();
        m.run(&tx).unwrap();
    });
    r.tx.send(flushed_by_nft()).unwrap();
    wait_until("the listener left and joined again", || {
        *r.membership.calls.lock().unwrap() == ["leave", "join"]
    });
    assert!(r.membership.armed.lock().unwrap().is_none(), "it played");
    // Nothing announced the deletion; the generation told, and the
    // read-back that followed repaired it (periodic resync: 30 s away).
    let t = Instant::now();
    wait_until("the unheard deletion is repaired", || {
        r.memory.has("service-ips", &first)
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // That repair wrote one element: small, heard.
    let calls = r.membership.calls.lock().unwrap().clone();
    assert_eq!(calls, ["leave", "join"]);
}

#[test]
fn two_load_balancers_on_one_address_are_resolved_once_with_a_warning_on_the_loser() {
    // Two LoadBalancers on one address and port with overlapping source
    // ranges: lb1 (first in name order) has the address, lb2 keeps its
    // ClusterIP; nothing is refused, and lb2 gets one Event, not one per
    // rebuild.
    let (events, notices) = std::sync::mpsc::sync_channel(verdict_k8s::events::QUEUE);
    let r = start_posting(
        vec![ip("127.0.0.1"), ip("192.168.0.2")],
        |_| {},
        Some(events),
    );
    let lb = |name: &str, cidr: &str| {
        svc("ns", name)
            .cluster_ip(if name == "lb1" {
                "172.30.0.51"
            } else {
                "172.30.0.52"
            })
            .port("http", TCP, 80, 0)
            .lb(&["5.6.7.8"])
            .source_ranges(&[cidr])
    };
    r.send(vec![
        service(lb("lb1", "10.0.0.0/8")),
        service(lb("lb2", "10.1.2.3/32")),
        service(web()),
        endpoints(
            slice("ns", "lb1", "a")
                .port("http", TCP, 80)
                .ep("10.180.1.1", "n1"),
        ),
        endpoints(
            slice("ns", "lb2", "b")
                .port("http", TCP, 80)
                .ep("10.180.1.2", "n1"),
        ),
        endpoints(web_slice(&["10.180.0.1"])),
        this_node(),
        Update::Synced,
    ]);
    let conflict = "verdict_destination_conflicts{ip_family=\"IPv4\",namespace=\"ns\",service=\"lb2\",port=\"http\"}";
    wait_until("the conflict is counted", || {
        metric(&r.handle, conflict) == Some(1.0)
    });
    assert!(r.memory.has("service-ips", &entry("172.30.0.41", 80)));
    assert!(
        r.memory.has("service-ips", &entry("172.30.0.52", 80)),
        "lb2's ClusterIP"
    );
    assert_eq!(
        metric(
            &r.handle,
            "verdict_quarantined_service_port{ip_family=\"IPv4\",namespace=\"ns\",service=\"lb2\",port=\"http\"}"
        ),
        None,
        "nothing is quarantined"
    );
    let n = notices.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(n.reason, "DestinationConflict");
    assert!(
        matches!(&n.regarding, verdict_k8s::events::Regarding::Service { name, .. } if name == "lb2"),
        "{n:?}"
    );
    assert!(
        n.note
            .contains("LoadBalancer IP 5.6.7.8 port 80/TCP is also claimed by ns/lb1:http"),
        "{}",
        n.note
    );
    // The Node's labels change: every port is computed again, and nothing
    // is reported again.
    r.send(vec![Update::Node(Some(NodeInfo {
        name: "n1".into(),
        addresses: vec!["192.168.0.2".into()],
        zone: Some("z2".into()),
        labels: [("topology.kubernetes.io/zone".to_string(), "z2".to_string())].into(),
        ..NodeInfo::default()
    }))]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        notices.try_recv().is_err(),
        "no Event again for the same conflict"
    );
    let healthz = healthz_now(&r.handle);
    assert_eq!(healthz.code, 200, "the node is healthy");

    // lb2 also lists lb1's ClusterIP as an externalIP: a second
    // destination it is left without. When the first conflict ends (lb2
    // moves to an address of its own) the gauge stays: the second remains.
    let lb2 = |ingress: &str, external: &[&str]| {
        svc("ns", "lb2")
            .cluster_ip("172.30.0.52")
            .port("http", TCP, 80, 0)
            .lb(&[ingress])
            .external_ips(external)
            .source_ranges(&["10.1.2.3/32"])
    };
    r.send(vec![service(lb2("5.6.7.8", &["172.30.0.51"]))]);
    let n = notices.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        n.note.contains("external IP 172.30.0.51 port 80/TCP"),
        "{}",
        n.note
    );
    r.send(vec![service(lb2("5.6.7.9", &["172.30.0.51"]))]);
    wait_until("lb2 on its own address", || {
        r.memory.has("service-ips", &entry("5.6.7.9", 80))
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        metric(&r.handle, conflict),
        Some(1.0),
        "one conflict remains"
    );
    r.send(vec![service(lb2("5.6.7.9", &[]))]);
    wait_until("no conflict left", || metric(&r.handle, conflict).is_none());
}

#[test]
fn a_full_event_queue_never_holds_up_the_loop() {
    // The Events queue is bounded (as client-go's broadcaster's): with
    // nobody posting, notices beyond it are dropped and syncs go on.
    let (events, _never_read) = std::sync::mpsc::sync_channel(1);
    let r = start_posting(
        vec![ip("127.0.0.1"), ip("192.168.0.2")],
        |_| {},
        Some(events),
    );
    let lb = |name: &str, ip_: &str| {
        svc("ns", name)
            .cluster_ip(ip_)
            .port("http", TCP, 80, 0)
            .external_ips(&["5.6.7.8"])
    };
    // Three Services on one external IP: two notices, one place in the queue.
    r.send(vec![
        service(lb("a", "172.30.0.61")),
        service(lb("b", "172.30.0.62")),
        service(lb("c", "172.30.0.63")),
        service(web()),
        endpoints(web_slice(&["10.180.0.1"])),
        this_node(),
        Update::Synced,
    ]);
    wait_until("web programmed", || {
        r.memory.has("service-ips", &entry("172.30.0.41", 80))
    });
    r.send(vec![endpoints(web_slice(&["10.180.0.2"]))]);
    wait_until("a later change programmed", || {
        r.handle
            .service(&NamespacedName::new("ns", "web"))
            .is_some_and(|v| format!("{v:?}").contains("10.180.0.2"))
    });
}

#[test]
fn stale_udp_conntrack_is_cleaned_after_an_endpoint_goes() {
    let r = start();
    let dns = svc("ns", "dns")
        .cluster_ip("172.30.0.10")
        .port("dns", UDP, 53, 0);
    let dns_slice = |ips: &[&str]| {
        let mut s = slice("ns", "dns", "dns-1").port("dns", UDP, 5353);
        for i in ips {
            s = s.ep(i, "n1");
        }
        s
    };
    r.send(vec![
        service(dns),
        endpoints(dns_slice(&["10.180.0.7", "10.180.0.8"])),
        Update::Synced,
    ]);
    let name = NamespacedName::new("ns", "dns");
    wait_until("programmed", || r.handle.service(&name).is_some());
    let stale = UdpEntry {
        orig_dst: ip("172.30.0.10"),
        orig_dport: 53,
        reply_src: ip("10.180.0.7"),
        reply_sport: 5353,
    };
    let kept = UdpEntry {
        reply_src: ip("10.180.0.8"),
        ..stale
    };
    r.conntrack.0.lock().unwrap().0 = vec![stale, kept];
    r.send(vec![endpoints(dns_slice(&["10.180.0.8"]))]);
    wait_until("the stale entry is deleted", || {
        r.conntrack.0.lock().unwrap().1.contains(&stale)
    });
    assert_eq!(
        r.conntrack.0.lock().unwrap().0,
        [kept],
        "the serving one stays"
    );
    assert_eq!(
        metric(
            &r.handle,
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn health_check_node_ports_are_served_after_the_sync() {
    // A health-check port binds a NodePort address of this host: the
    // first non-loopback IPv4 address it has, as a test without root can
    // bind it.
    let Some(host) = verdict_nft::addresses::local_addresses()
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.is_ipv4() && !a.is_loopback())
    else {
        println!("skipped: this host has no non-loopback IPv4 address");
        return;
    };
    let port = std::net::TcpListener::bind((host, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = start_with(vec![ip("127.0.0.1"), host], |s| {
        s.node_ports = NodePortAddresses::cidrs(vec![ipnet::IpNet::from(host)]);
    });
    let lb = svc("ns", "lb")
        .cluster_ip("172.30.0.60")
        .port("http", TCP, 80, 30060)
        .lb(&["5.6.7.9"])
        .etp_local()
        .hcnp(i32::from(port));
    r.send(vec![
        Update::Node(Some(NodeInfo {
            name: "n1".into(),
            addresses: vec![host.to_string()],
            ..NodeInfo::default()
        })),
        service(lb),
        endpoints(
            slice("ns", "lb", "l")
                .port("http", TCP, 80)
                .ep("10.180.2.1", "n1")
                .ep("10.180.2.2", "other"),
        ),
        Update::Synced,
    ]);
    let get = || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect((host, port)).ok()?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let mut answer = None;
    wait_until("the health-check port answers", || {
        answer = get();
        answer.is_some()
    });
    let answer = answer.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"localEndpoints\": 1"), "{answer}");
}

#[test]
fn a_restart_takes_in_the_objects_while_it_reads_the_rules_in_place() {
    let addresses = || vec![ip("192.168.0.2")];
    let first = start_with(addresses(), |_| {});
    let objects = || {
        vec![
            service(web()),
            endpoints(web_slice(&["10.0.1.1"])),
            this_node(),
        ]
    };
    first.send([objects(), vec![Update::Synced]].concat());
    wait_until("the first loop programs web", || {
        first.memory.has("service-ips", &entry("172.30.0.41", 80))
    });
    let memory = first.memory.clone();
    first.stop().unwrap();

    // A restart whose reading of the rules in place is held: the loop
    // still takes in what the source lists meanwhile.
    memory.1.hold(true);
    let r = start_on(memory.clone(), addresses(), |_| {}, None);
    r.send(objects());
    wait_until("the service taken in while the read is held", || {
        metric(
            &r.handle,
            "kubeproxy_sync_proxy_rules_service_changes_total",
        )
        .unwrap_or(0.0)
            >= 1.0
    });
    let before = memory.with(|m| m.transactions());
    memory.1.hold(false);
    r.send(vec![Update::Synced]);
    wait_until("the first sync", || {
        r.handle.history().syncs().items.iter().any(|s| s.full)
    });
    // The read made at start is adopted: nothing to send.
    let syncs = r.handle.history().syncs().items;
    let first_sync = syncs
        .iter()
        .find(|s| s.full && s.family.as_str() == "ip")
        .unwrap();
    assert_eq!(first_sync.operations, 0, "{first_sync:?}");
    assert_eq!(memory.with(|m| m.transactions()), before);
}

#[test]
fn a_periodic_resync_with_nothing_committed_is_left_out_every_period() {
    let r = start_with(vec![ip("192.168.0.2")], |s| {
        s.sync_period = Duration::from_millis(100);
    });
    r.send(vec![service(web()), this_node(), Update::Synced]);
    let left_out = || {
        r.handle
            .history()
            .syncs()
            .items
            .iter()
            .filter(|s| s.trigger.starts_with("periodic resync, not needed"))
            .count()
    };
    // Two families a period: five periods in a second at the least.
    wait_until("periodic resyncs, each left out", || left_out() >= 10);
    let reads = r
        .handle
        .history()
        .syncs()
        .items
        .iter()
        .filter(|s| {
            s.full
                && s.trigger != "first sync"
                && !s.trigger.starts_with("periodic resync, not needed")
        })
        .count();
    assert_eq!(reads, 0, "nothing was committed: no table was read back");
    // Another commit to the ruleset: the next one reads back.
    r.memory.with(|m| {
        let mut tx = Transaction::new(Family::Ip, "someone-else");
        tx.add_table(None);
        m.run(&tx).unwrap();
    });
    wait_until("a periodic resync that reads back", || {
        r.handle
            .history()
            .syncs()
            .items
            .iter()
            .any(|s| s.trigger == "periodic resync")
    });
}

#[test]
fn a_changed_config_file_or_a_lost_source_stops_the_loop_with_an_error() {
    let r = start();
    r.tx.send(Input::ConfigChanged("/etc/kube-proxy/config.conf".into()))
        .unwrap();
    let mut r = r;
    let e = r.done.take().unwrap().join().unwrap().unwrap_err();
    assert!(matches!(e, NodeError::ConfigChanged(_)), "{e}");
    let r = start();
    r.tx.send(Input::SourceStopped("its thread ended".into()))
        .unwrap();
    let mut r = r;
    let e = r.done.take().unwrap().join().unwrap().unwrap_err();
    assert!(e.to_string().contains("stopped"), "{e}");
}
