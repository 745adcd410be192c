use std::time::Instant;

use verdict_conformance::{ServiceExt, SliceExt, TCP, UDP, slice, svc};
use verdict_nft::MemoryBackend;
use verdict_proxier::{Proxier, ProxierConfig};

use super::*;

const NODE_IP: &str = "192.168.0.2";

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A node with shop/web (ClusterIP 172.30.0.41:80, NodePort 30080, two
/// endpoints, the first with its pod named) and shop/empty (no endpoints).
fn node() -> (NodeHandle, Proxier) {
    let mut c = ProxierConfig::new(IpFamily::V4, "n1");
    c.node_ips = vec![NODE_IP.parse().unwrap()];
    c.local_ips = c.node_ips.clone();
    let mut p = Proxier::new(c).unwrap();
    let web = svc("shop", "web")
        .cluster_ip("172.30.0.41")
        .port("http", TCP, 80, 30080)
        .external_ips(&["192.0.2.9"]);
    let empty = svc("shop", "empty")
        .cluster_ip("172.30.0.42")
        .port("dns", UDP, 53, 0);
    p.on_service(None, Some(&web));
    p.on_service(None, Some(&empty));
    let mut s = slice("shop", "web", "web-1")
        .port("http", TCP, 8080)
        .ep("10.180.0.1", "n1")
        .ep("10.180.0.2", "n2");
    s.endpoints[0].target_name = Some("web-7d4b9c-x2x9q".into());
    p.on_endpoint_slice(&s, false);
    p.sync(&mut MemoryBackend::new(), Instant::now()).unwrap();
    let h = NodeHandle::of_proxiers(&[&p], &[NODE_IP.parse().unwrap()]);
    (h, p)
}

fn recorder(capacity: usize) -> (Recorder, Arc<FlowStore>, Arc<Mutex<Metrics>>) {
    let (h, _) = node();
    let store = FlowStore::new(capacity);
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    (
        Recorder::new(h, store.clone(), metrics.clone(), None),
        store,
        metrics,
    )
}

fn conn(id: u32, client: &str, dst: &str, endpoint: &str) -> Connection {
    Connection {
        id: Some(id),
        proto: 6,
        client: sock(client),
        dst: sock(dst),
        reply_src: sock(endpoint),
        reply_dst: sock(client),
        dnat: true,
        snat: false,
        packets: None,
        bytes: None,
    }
}

fn logged(prefix: &str, proto: u8, src: &str, dst: &str) -> FlowEvent {
    FlowEvent::Logged(Logged {
        prefix: prefix.into(),
        group: DEFAULT_GROUP,
        proto,
        src: sock(src),
        dst: sock(dst),
    })
}

fn all(store: &FlowStore) -> Vec<FlowRecord> {
    store.query(&FlowFilter::default(), 1000).flows
}

#[test]
fn a_forwarded_connection_names_its_service_endpoint_and_pod_and_closes() {
    let (mut r, store, metrics) = recorder(100);
    let t0 = SystemTime::now();
    let mut c = conn(7, "10.77.0.21:40000", "172.30.0.41:80", "10.180.0.1:8080");
    // Masqueraded: the answers go to the node's address.
    c.snat = true;
    c.reply_dst = sock("10.180.0.100:61000");
    r.record(vec![FlowEvent::New(c)], t0, None);
    let f = &all(&store)[0];
    assert_eq!(f.seq, 1);
    assert_eq!(f.service.as_deref(), Some("shop/web"));
    assert_eq!(f.port.as_deref(), Some("http"));
    assert_eq!(f.entry, Some(EntryKind::ClusterIP));
    assert_eq!(f.endpoint, Some(sock("10.180.0.1:8080")));
    assert_eq!(f.pod.as_deref(), Some("web-7d4b9c-x2x9q"));
    assert!(f.masqueraded && f.open);
    assert_eq!(f.verdict, FlowVerdict::Forwarded);
    let mut gone = c;
    (gone.packets, gone.bytes) = (Some(12), Some(3400));
    r.record(
        vec![FlowEvent::Destroyed(gone)],
        t0 + Duration::from_secs(2),
        None,
    );
    let f = &all(&store)[0];
    assert!(!f.open);
    assert_eq!((f.packets, f.bytes), (Some(12), Some(3400)));
    assert_ne!(f.first_seen, f.last_seen);
    // The other endpoint has no pod named; the NodePort and the external
    // IP are entry points too.
    r.record(
        vec![
            FlowEvent::New(conn(
                8,
                "10.77.0.22:40001",
                "192.168.0.2:30080",
                "10.180.0.2:8080",
            )),
            FlowEvent::New(conn(
                9,
                "10.77.0.22:40002",
                "192.0.2.9:80",
                "10.180.0.2:8080",
            )),
        ],
        t0,
        None,
    );
    let flows = all(&store);
    assert_eq!(flows.len(), 3);
    // Conntrack remapped only the source port (another connection of the
    // node held it): the endpoint still sees the client's address.
    let mut remapped = conn(10, "10.77.0.23:40003", "172.30.0.41:80", "10.180.0.1:8080");
    remapped.snat = true;
    remapped.reply_dst = sock("10.77.0.23:1024");
    assert_eq!(flows[0].entry, Some(EntryKind::ExternalIP));
    assert_eq!(flows[1].entry, Some(EntryKind::NodePort));
    assert_eq!((flows[1].pod.as_deref(), flows[1].seq), (None, 2));
    r.record(vec![FlowEvent::New(remapped)], t0, None);
    let f = &all(&store)[0];
    assert_eq!(f.client, sock("10.77.0.23:40003"));
    assert!(!f.masqueraded, "{f:?}");
    let text = metrics.lock().unwrap().render();
    assert!(
        text.contains("verdict_flows_recorded_total{verdict=\"forwarded\"} 4"),
        "{text}"
    );
}

#[test]
fn connections_to_no_service_and_connections_not_dnated_are_not_recorded() {
    let (mut r, store, _) = recorder(100);
    let now = SystemTime::now();
    let mut plain = conn(1, "10.77.0.21:40000", "172.30.0.41:80", "172.30.0.41:80");
    plain.dnat = false;
    r.record(
        vec![
            FlowEvent::New(plain),
            // DNATed by someone else, to an address no Service has.
            FlowEvent::New(conn(
                2,
                "10.77.0.21:40000",
                "10.9.9.9:80",
                "10.180.0.1:8080",
            )),
            // The Service's address, another port.
            FlowEvent::New(conn(
                3,
                "10.77.0.21:40000",
                "172.30.0.41:81",
                "10.180.0.1:8080",
            )),
            // A NodePort number on an address that is not the node's.
            FlowEvent::New(conn(
                4,
                "10.77.0.21:40000",
                "10.9.9.9:30080",
                "10.180.0.1:8080",
            )),
            // A prefix that is not verdict's.
            logged("someone else", 6, "10.77.0.21:40000", "172.30.0.42:53"),
            logged(
                layout::LOG_DROPPED_SOURCE_RANGE,
                6,
                "10.77.0.21:40000",
                "10.9.9.9:80",
            ),
            // The end of a connection never recorded.
            FlowEvent::Destroyed(conn(
                99,
                "10.77.0.21:1",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
        ],
        now,
        None,
    );
    assert_eq!(all(&store), Vec::new());
}

#[test]
fn a_rejected_connection_is_one_flow_however_often_it_is_logged() {
    let (mut r, store, _) = recorder(100);
    let t0 = SystemTime::now();
    let syn = || {
        logged(
            layout::LOG_REJECTED_NO_ENDPOINTS,
            17,
            "10.77.0.21:40000",
            "172.30.0.42:53",
        )
    };
    r.record(vec![syn()], t0, None);
    r.record(vec![syn(), syn()], t0 + Duration::from_secs(1), None);
    let flows = all(&store);
    assert_eq!(flows.len(), 1, "{flows:?}");
    let f = &flows[0];
    assert_eq!(f.verdict, FlowVerdict::Rejected);
    assert_eq!(f.reason.as_deref(), Some("no endpoints"));
    assert_eq!(f.service.as_deref(), Some("shop/empty"));
    assert_eq!((f.protocol.as_str(), f.retries), ("udp", 2));
    // Long after, the same tuple is a new connection.
    r.record(vec![syn()], t0 + RETRY_WINDOW * 2, None);
    assert_eq!(all(&store).len(), 2);
    // Another port of a ClusterIP names the Service, not a port.
    r.record(
        vec![logged(
            layout::LOG_REJECTED_INVALID_PORT,
            6,
            "10.77.0.21:40001",
            "172.30.0.41:8443",
        )],
        t0,
        None,
    );
    let f = &all(&store)[0];
    assert_eq!(
        (f.service.as_deref(), f.port.as_deref(), f.reason.as_deref()),
        (
            Some("shop/web"),
            None,
            Some("a port the Service does not have")
        )
    );
    // An unallocated ClusterIP has no Service, and is recorded.
    r.record(
        vec![logged(
            layout::LOG_DROPPED_UNALLOCATED,
            6,
            "10.77.0.21:40002",
            "172.30.0.99:80",
        )],
        t0,
        None,
    );
    let f = &all(&store)[0];
    assert_eq!(
        (f.verdict, f.service.as_deref()),
        (FlowVerdict::Dropped, None)
    );
    assert_eq!(f.reason.as_deref(), Some("unallocated ClusterIP"));
}

#[test]
fn the_ring_keeps_the_newest_flows_and_counts_the_rest() {
    let (mut r, store, metrics) = recorder(3);
    let now = SystemTime::now();
    // Five clients: the ring keeps the newest three.
    let events = (0..5u16)
        .map(|i| {
            FlowEvent::New(conn(
                u32::from(i),
                &format!("10.77.0.{}:{}", 21 + i, 40000 + i),
                "172.30.0.41:80",
                "10.180.0.1:8080",
            ))
        })
        .collect();
    r.record(events, now, Some(4));
    let a = store.query(&FlowFilter::default(), 10);
    let seqs: Vec<u64> = a.flows.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, [5, 4, 3]);
    assert_eq!((a.evicted, a.last_seq, a.not_recorded), (2, 5, 4));
    {
        let ring = store.lock();
        assert_eq!((ring.by_id.len(), ring.by_key.len()), (3, 3));
    }
    // The end of an evicted connection finds nothing; a kept one closes.
    r.record(
        vec![
            FlowEvent::Destroyed(conn(
                0,
                "10.77.0.21:40000",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
            FlowEvent::Destroyed(conn(
                4,
                "10.77.0.25:40004",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
        ],
        now,
        Some(4),
    );
    let a = store.query(&FlowFilter::default(), 10);
    assert!(!a.flows[0].open && a.flows[1].open);
    let text = metrics.lock().unwrap().render();
    assert!(text.contains("verdict_flows_evicted_total 2"), "{text}");
    assert!(text.contains("verdict_flows_folded_total 0"), "{text}");
    assert!(
        text.contains("verdict_flows_not_recorded_total{reason=\"kernel_buffer\"} 4"),
        "{text}"
    );
}

#[test]
fn filters_choose_by_service_namespace_address_verdict_time_and_position() {
    let (mut r, store, _) = recorder(100);
    let t0 = SystemTime::now();
    r.record(
        vec![
            FlowEvent::New(conn(
                1,
                "10.77.0.21:40000",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
            logged(
                layout::LOG_REJECTED_NO_ENDPOINTS,
                17,
                "10.77.0.22:40000",
                "172.30.0.42:53",
            ),
        ],
        t0,
        None,
    );
    r.record(
        vec![FlowEvent::New(conn(
            3,
            "10.77.0.23:40000",
            "172.30.0.41:80",
            "10.180.0.2:8080",
        ))],
        t0 + Duration::from_secs(60),
        None,
    );
    let count = |f: FlowFilter| store.query(&f, 100).flows.len();
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    assert_eq!(count(FlowFilter::default()), 3);
    assert_eq!(
        count(FlowFilter {
            service: Some(NamespacedName::new("shop", "web")),
            ..FlowFilter::default()
        }),
        2
    );
    assert_eq!(
        count(FlowFilter {
            namespace: Some("shop".into()),
            ..FlowFilter::default()
        }),
        3
    );
    assert_eq!(
        count(FlowFilter {
            namespace: Some("other".into()),
            ..FlowFilter::default()
        }),
        0
    );
    assert_eq!(
        count(FlowFilter {
            ip: ip("10.77.0.22"),
            ..FlowFilter::default()
        }),
        1
    );
    assert_eq!(
        count(FlowFilter {
            ip: ip("10.180.0.2"),
            ..FlowFilter::default()
        }),
        1
    );
    assert_eq!(
        count(FlowFilter {
            verdict: Some(FlowVerdict::Rejected),
            ..FlowFilter::default()
        }),
        1
    );
    assert_eq!(
        count(FlowFilter {
            since: Some(t0 + Duration::from_secs(30)),
            ..FlowFilter::default()
        }),
        1
    );
    let after = store.query(
        &FlowFilter {
            after: Some(1),
            ..FlowFilter::default()
        },
        100,
    );
    assert_eq!(
        after.flows.iter().map(|f| f.seq).collect::<Vec<_>>(),
        [3, 2]
    );
    let limited = store.query(&FlowFilter::default(), 1);
    assert_eq!((limited.flows.len(), limited.matched), (1, 3));
}

#[test]
fn the_flow_log_has_a_line_when_a_flow_is_recorded_and_when_it_closes() {
    let (h, _) = node();
    let dir = std::env::temp_dir().join(format!("verdict-flowlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("flows.jsonl");
    let log = FlowLog::open(path.to_str().unwrap()).unwrap();
    let store = FlowStore::new(10);
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let log = LogWriter::new(log, FlowLogLimits::default(), metrics.clone());
    let mut r = Recorder::new(h, store, metrics, Some(log));
    let c = conn(1, "10.77.0.21:40000", "172.30.0.41:80", "10.180.0.1:8080");
    let now = SystemTime::now();
    r.record(
        vec![
            FlowEvent::New(c),
            logged(
                layout::LOG_REJECTED_NO_ENDPOINTS,
                17,
                "10.77.0.22:40000",
                "172.30.0.42:53",
            ),
        ],
        now,
        None,
    );
    r.record(vec![FlowEvent::Destroyed(c)], now, None);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<FlowRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].open && !lines[2].open);
    assert_eq!(lines[0].seq, lines[2].seq);
    assert_eq!(lines[1].verdict, FlowVerdict::Rejected);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_kept_flow_shares_its_names_and_allocates_nothing_of_its_own() {
    let (mut r, store, _) = recorder(100);
    r.record(
        vec![
            FlowEvent::New(conn(
                7,
                "10.77.0.21:40000",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
            FlowEvent::New(conn(
                8,
                "10.77.0.21:40001",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
        ],
        SystemTime::now(),
        None,
    );
    let ring = store.lock();
    let (a, b) = (
        ring.slots[0].flow.as_ref().unwrap(),
        ring.slots[1].flow.as_ref().unwrap(),
    );
    let same = |x: Option<&Name>, y: Option<&Name>| {
        let (x, y) = (x.expect("named"), y.expect("named"));
        std::ptr::eq(x.as_str().as_ptr(), y.as_str().as_ptr())
    };
    // The read model's names, not a copy per flow: 16,384 flows of one
    // Service hold its name once.
    let (sa, sb) = (a.service.as_ref().unwrap(), b.service.as_ref().unwrap());
    assert!(same(Some(&sa.name), Some(&sb.name)));
    assert!(same(Some(&sa.namespace), Some(&sb.namespace)));
    assert!(same(a.port.as_ref(), b.port.as_ref()));
    assert!(same(a.pod.as_ref(), b.pod.as_ref()));
    // What a kept flow costs in the ring, besides its two index entries.
    assert!(
        std::mem::size_of::<Flow>() <= 320,
        "{} bytes",
        std::mem::size_of::<Flow>()
    );
}

#[test]
fn on_demand_connections_are_followed_while_a_reader_asks_and_a_while_after() {
    let store = FlowStore::new(16);
    let linger = Duration::from_secs(600);
    let demand = Following::OnDemand { linger };
    store.set_following(demand, None);
    let start = Instant::now();
    // Nobody asked yet: the kernel is not to report connections.
    assert!(!store.wanted(demand, start));
    assert!(store.wanted(Following::Always, start));
    // A reader asks: the answer says so, and that nothing is followed yet.
    let first = store.query(&FlowFilter::default(), 10);
    assert!(first.on_demand);
    assert_eq!(first.following_since, None);
    let asked = Instant::now();
    assert!(store.wanted(demand, asked));
    assert!(store.wanted(demand, asked + linger - Duration::from_secs(1)));
    // Long after the last ask, no more.
    assert!(!store.wanted(demand, asked + linger + Duration::from_secs(1)));
    // Once followed, the answer says since when.
    let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    store.set_following(demand, Some(since));
    let now = store.query(&FlowFilter::default(), 10);
    assert_eq!(
        now.following_since.as_deref(),
        Some(verdict_admin::time::rfc3339_micro(since).as_str())
    );
    // Always (`--flows`): the answer does not say "on demand".
    store.set_following(Following::Always, Some(since));
    assert!(!store.query(&FlowFilter::default(), 10).on_demand);
}

#[test]
fn a_client_past_its_share_of_a_full_ring_replaces_its_own_flows() {
    // 32 flows, 2 a client once full.
    let (mut r, store, metrics) = recorder(32);
    let t0 = SystemTime::now();
    // Five refusals of five clients, then one client's flood of 1,000
    // connections, each from a new port.
    let refusals: Vec<FlowEvent> = (0..5)
        .map(|i| {
            logged(
                layout::LOG_REJECTED_NO_ENDPOINTS,
                17,
                &format!("10.77.1.{i}:5353"),
                "172.30.0.42:53",
            )
        })
        .collect();
    r.record(refusals, t0, None);
    let flood: Vec<FlowEvent> = (0..1000u32)
        .map(|i| {
            FlowEvent::New(conn(
                100 + i,
                &format!("10.77.0.99:{}", 20000 + i),
                "172.30.0.41:80",
                "10.180.0.1:8080",
            ))
        })
        .collect();
    r.record(flood, t0 + Duration::from_secs(1), None);
    let a = store.query(&FlowFilter::default(), 100);
    assert_eq!(a.flows.len(), 32);
    let rejected = a
        .flows
        .iter()
        .filter(|f| f.verdict == FlowVerdict::Rejected)
        .count();
    assert_eq!(
        rejected, 5,
        "the refusals recorded before the flood are all kept"
    );
    assert_eq!((a.evicted, a.folded, a.client_share), (0, 1000 - 27, 2));
    // The newest of the flood are the ones kept.
    assert_eq!(a.flows[0].client, sock("10.77.0.99:20999"));
    // Another client, once the ring is full: below its share, it takes
    // the place of the flood's oldest flow, not of a refusal.
    r.record(
        vec![FlowEvent::New(conn(
            5000,
            "10.77.0.7:1",
            "172.30.0.41:80",
            "10.180.0.2:8080",
        ))],
        t0 + Duration::from_secs(2),
        None,
    );
    let a = store.query(&FlowFilter::default(), 100);
    assert_eq!((a.flows.len(), a.evicted, a.folded), (32, 0, 974));
    assert_eq!(
        a.flows
            .iter()
            .filter(|f| f.verdict == FlowVerdict::Rejected)
            .count(),
        5
    );
    {
        let ring = store.lock();
        assert!(ring.slots.len() <= 64, "{} places", ring.slots.len());
        assert_eq!(
            ring.by_client.values().map(VecDeque::len).sum::<usize>(),
            32
        );
        assert_eq!(
            ring.by_client[&"10.77.0.99".parse::<IpAddr>().unwrap()].len(),
            26
        );
        assert!(ring.by_key.len() <= 32 && ring.by_id.len() <= 32);
    }
    // The closing of a folded connection still counts in its aggregate.
    let mut gone = conn(100, "10.77.0.99:20000", "172.30.0.41:80", "10.180.0.1:8080");
    (gone.packets, gone.bytes) = (Some(6), Some(400));
    r.record(
        vec![FlowEvent::Destroyed(gone)],
        t0 + Duration::from_secs(3),
        None,
    );
    // The aggregates: the flood is one entry, with every connection.
    let agg = store.aggregated(&FlowFilter::default(), 10);
    let top = &agg.aggregates[0];
    assert_eq!(top.client, "10.77.0.99".parse::<IpAddr>().unwrap());
    assert_eq!((top.connections, top.packets, top.bytes), (1000, 6, 400));
    assert_eq!(top.service.as_deref(), Some("shop/web"));
    assert_eq!(top.endpoint, Some(sock("10.180.0.1:8080")));
    assert_eq!(agg.matched, 7, "the flood, 5 refusals, the other client");
    let refused = store.aggregated(
        &FlowFilter {
            verdict: Some(FlowVerdict::Rejected),
            ..FlowFilter::default()
        },
        10,
    );
    assert_eq!(refused.matched, 5);
    assert!(
        refused
            .aggregates
            .iter()
            .all(|a| a.connections == 1 && a.reason.as_deref() == Some("no endpoints"))
    );
    let text = metrics.lock().unwrap().render();
    assert!(text.contains("verdict_flows_folded_total 974"), "{text}");
    assert!(text.contains("verdict_flows_evicted_total 0"), "{text}");
}

#[test]
fn the_aggregates_keep_an_hour_within_their_budget_and_count_the_rest() {
    let (h, _) = node();
    let store = FlowStore::with_budget(100, 16);
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let mut r = Recorder::new(h, store.clone(), metrics.clone(), None);
    // A bucket holds at most 16 / 8 = 2 keys.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let clients = |from: u32, n: u32| -> Vec<FlowEvent> {
        (from..from + n)
            .map(|i| {
                FlowEvent::New(conn(
                    i,
                    &format!("10.77.2.{}:40000", i % 250),
                    "172.30.0.41:80",
                    "10.180.0.1:8080",
                ))
            })
            .collect()
    };
    r.record(clients(0, 3), t0, None);
    let a = store.aggregated(&FlowFilter::default(), 10);
    assert_eq!((a.matched, a.entries, a.not_recorded), (2, 2, 1));
    assert_eq!(
        store.query(&FlowFilter::default(), 10).flows.len(),
        3,
        "the ring has them all"
    );
    // Seven more buckets of 2: 16 entries, the budget.
    for b in 1..8u32 {
        r.record(clients(10 * b, 2), t0 + BUCKET_TIME * b, None);
    }
    let a = store.aggregated(&FlowFilter::default(), 100);
    assert_eq!((a.entries, a.dropped_early), (16, 0));
    // One more: the oldest bucket makes room.
    r.record(clients(90, 1), t0 + BUCKET_TIME * 8, None);
    let a = store.aggregated(&FlowFilter::default(), 100);
    assert_eq!((a.entries, a.dropped_early), (15, 1));
    // `since` chooses the buckets.
    let recent = store.aggregated(
        &FlowFilter {
            since: Some(t0 + BUCKET_TIME * 7),
            ..FlowFilter::default()
        },
        100,
    );
    assert_eq!(recent.matched, 3);
    // An hour later, all of it is gone but the new bucket.
    r.record(clients(200, 1), t0 + Duration::from_secs(2 * 3600), None);
    let a = store.aggregated(&FlowFilter::default(), 100);
    assert_eq!(a.entries, 1);
    let text = metrics.lock().unwrap().render();
    assert!(
        text.contains("verdict_flows_not_recorded_total{reason=\"aggregate_budget\"} 1"),
        "{text}"
    );
}

const BUCKET_TIME: Duration = Duration::from_secs(15);

/// A recorder writing its flow log to a new file, bounded by `limits`.
fn logging(
    name: &str,
    limits: FlowLogLimits,
) -> (Recorder, Arc<Mutex<Metrics>>, std::path::PathBuf) {
    let (h, _) = node();
    let dir = std::env::temp_dir().join(format!("verdict-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("flows.jsonl");
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let log = FlowLog::open(path.to_str().unwrap()).unwrap();
    let log = LogWriter::new(log, limits, metrics.clone());
    let r = Recorder::new(h, FlowStore::new(100), metrics.clone(), Some(log));
    (r, metrics, path)
}

/// `n` rejected connections of one client, each from a new port.
fn refusals(from: u16, n: u16) -> Vec<FlowEvent> {
    (from..from + n)
        .map(|port| {
            logged(
                layout::LOG_REJECTED_NO_ENDPOINTS,
                17,
                &format!("10.77.0.30:{port}"),
                "172.30.0.42:53",
            )
        })
        .collect()
}

#[test]
fn the_flow_log_is_rotated_at_its_cap_and_keeps_its_backups() {
    let limits = FlowLogLimits {
        max_size: 4096,
        max_backups: 2,
        rate: 1_000_000,
    };
    let (mut r, metrics, path) = logging("flowlog-rotate", limits);
    let t0 = SystemTime::now();
    // About 300 bytes a line: 200 lines are some 60 KB, fifteen caps.
    for i in 0..20u16 {
        r.record(refusals(10_000 + 10 * i, 10), t0, None);
    }
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let backup = |n: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        std::path::PathBuf::from(p)
    };
    assert!(size(&path) > 0 && size(&path) <= 4096, "{}", size(&path));
    assert!(size(&backup(1)) > 0 && size(&backup(1)) <= 4096);
    assert!(size(&backup(2)) > 0 && size(&backup(2)) <= 4096);
    assert!(!backup(3).exists(), "two backups kept");
    // Whole lines in every file.
    for p in [path.clone(), backup(1), backup(2)] {
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.ends_with('\n'));
        for l in text.lines() {
            serde_json::from_str::<FlowRecord>(l).unwrap();
        }
    }
    let text = metrics.lock().unwrap().render();
    let rotations: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("verdict_flow_log_rotations_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(rotations >= 10.0, "{text}");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn past_its_rate_the_flow_log_writes_aggregated_lines_and_counts_them() {
    let limits = FlowLogLimits {
        rate: 5,
        ..FlowLogLimits::default()
    };
    let (mut r, metrics, path) = logging("flowlog-rate", limits);
    // Inside one second, and one 15 s window.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    r.record(refusals(20_000, 1000), t0, None);
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(
        lines().len(),
        5,
        "5 lines of their own; the rest wait for the window's end"
    );
    // The window ends: one aggregated line for the 995 others.
    r.tick(t0 + Duration::from_secs(15));
    let all = lines();
    assert_eq!(all.len(), 6);
    let folded = &all[5];
    assert_eq!(folded["aggregated"], true);
    assert_eq!(folded["connections"], 995);
    assert_eq!(folded["client"], "10.77.0.30");
    assert_eq!(folded["service"], "shop/empty");
    assert_eq!(folded["verdict"], "rejected");
    assert_eq!(folded["from"], verdict_admin::time::rfc3339_micro(t0));
    let text = metrics.lock().unwrap().render();
    assert!(text.contains("verdict_flow_log_folded_total 995"), "{text}");
    assert!(
        text.contains("verdict_flow_log_lost_total{reason=\"budget\"} 0"),
        "{text}"
    );
    // The next second writes lines of their own again.
    r.record(refusals(30_000, 2), t0 + Duration::from_secs(16), None);
    assert_eq!(lines().len(), 8);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn a_client_is_named_by_the_endpoint_slices_the_node_holds() {
    let (mut r, store, _) = recorder(100);
    let t0 = SystemTime::now();
    // The web pod (its slice names it) asks web itself, then the Service
    // without endpoints; the second endpoint's slice names no pod, and an
    // address no slice has is a client without a name.
    r.record(
        vec![
            FlowEvent::New(conn(
                1,
                "10.180.0.1:40000",
                "172.30.0.41:80",
                "10.180.0.2:8080",
            )),
            logged(
                layout::LOG_REJECTED_NO_ENDPOINTS,
                17,
                "10.180.0.1:40001",
                "172.30.0.42:53",
            ),
            FlowEvent::New(conn(
                2,
                "10.180.0.2:40002",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
            FlowEvent::New(conn(
                3,
                "10.77.0.21:40003",
                "172.30.0.41:80",
                "10.180.0.1:8080",
            )),
        ],
        t0,
        None,
    );
    let by_client: Vec<(u16, Option<String>)> = all(&store)
        .iter()
        .rev()
        .map(|f| (f.client.port(), f.client_pod.clone()))
        .collect();
    let web = Some("shop/web-7d4b9c-x2x9q".to_owned());
    assert_eq!(
        by_client,
        [
            (40000, web.clone()),
            (40001, web),
            (40002, None),
            (40003, None)
        ]
    );
    // The aggregated flow keeps the name.
    let a = store.aggregated(&FlowFilter::default(), 10);
    assert!(
        a.aggregates
            .iter()
            .any(|a| a.client_pod.as_deref() == Some("shop/web-7d4b9c-x2x9q")),
        "{a:?}"
    );
}

#[test]
fn the_watch_of_pods_names_any_client_and_both_workloads() {
    let (h, _p) = node();
    let store = FlowStore::new(100);
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    let mut r = Recorder::new(h.clone(), store.clone(), metrics, None);
    let workload = |kind: &str, name: &str| {
        Some(Arc::new(Workload {
            kind: kind.into(),
            name: name.into(),
        }))
    };
    // A client no EndpointSlice names, and the endpoint's pod.
    h.publish_pod(
        "batch",
        "report-28a1",
        Some(verdict_model::Pod {
            name: NamespacedName::new("batch", "report-28a1"),
            ips: Box::new([sock("10.77.0.21:0").ip()]),
            labels: Box::new([]),
            workload: workload("Job", "report"),
        }),
    );
    h.publish_pod(
        "shop",
        "web-7d4b9c-x2x9q",
        Some(verdict_model::Pod {
            name: NamespacedName::new("shop", "web-7d4b9c-x2x9q"),
            ips: Box::new([sock("10.180.0.1:0").ip()]),
            labels: Box::new([]),
            workload: workload("Deployment", "web"),
        }),
    );
    r.record(
        vec![FlowEvent::New(conn(
            1,
            "10.77.0.21:40000",
            "172.30.0.41:80",
            "10.180.0.1:8080",
        ))],
        SystemTime::now(),
        None,
    );
    let f = &all(&store)[0];
    assert_eq!(f.client_pod.as_deref(), Some("batch/report-28a1"));
    assert_eq!(f.client_workload.as_deref(), Some("Job/report"));
    assert_eq!(f.workload.as_deref(), Some("Deployment/web"));
    // In the record as readers and the flow log get it.
    let doc = serde_json::to_value(f).unwrap();
    assert_eq!(doc["client_workload"], "Job/report");
    assert_eq!(doc["workload"], "Deployment/web");
}
