use std::net::IpAddr;
use std::time::{Duration, Instant};

use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
use verdict_model::{IpFamily, NamespacedName, ServiceType};
use verdict_nft::{Backend, Element, ElementValue, Family, MemoryBackend, Value, Verdict};
use verdict_proxier::{LocalDetector, NodePortAddresses, Proxier, ProxierConfig};

use super::*;
use answers::ReadFrom;
use serde_json::{Value as Json, json};

// The answers as the API serves them, so that these tests read them as a
// client does; the text renderings read them back into their types.
fn as_json<T: serde::Serialize>(t: &T) -> Json {
    serde_json::to_value(t).unwrap()
}

fn typed<T: serde::de::DeserializeOwned>(j: &Json) -> T {
    serde_json::from_value(j.clone()).unwrap()
}

fn trace(h: &NodeHandle, r: &TraceRequest, k: &TableRead) -> Result<Json, BadRequest> {
    super::trace(h, r, k).map(|a| as_json(&a))
}

fn explain(h: &NodeHandle, svc: &NamespacedName, k: &[(IpFamily, TableRead)]) -> Json {
    as_json(&super::explain(h, svc, k))
}

fn services(h: &NodeHandle, q: &str, offset: usize, limit: usize) -> Json {
    as_json(&super::services(h, q, offset, limit))
}

fn connections(
    h: &NodeHandle,
    flows: &[(IpFamily, Vec<verdict_nft::conntrack::Flow>)],
    svc: Option<&NamespacedName>,
    limit: usize,
) -> Json {
    as_json(&super::connections(
        h,
        flows,
        svc,
        limit,
        &super::ConnectionFilter::default(),
    ))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A node like kube-proxy's fake proxier's, with three Services:
/// `ns/web` (a LoadBalancer without an address yet: NodePort 3001, eTP
/// Local, a health-check node port; a local
/// endpoint, a remote one and a serving-terminating one), `ns/lb` (a
/// LoadBalancer with source ranges) and `ns/empty` (no endpoints).
fn node() -> (Vec<Proxier>, MemoryBackend) {
    let mut c = ProxierConfig::new(IpFamily::V4, "test-node");
    c.node_ips = vec![ip("192.168.0.2")];
    c.local_ips = vec![ip("127.0.0.1"), ip("192.168.0.2")];
    c.local_detector = LocalDetector::Cidr("10.0.0.0/8".parse().unwrap());
    c.service_cidrs = vec!["172.30.0.0/16".parse().unwrap()];
    c.node_port_addresses = NodePortAddresses::cidrs(vec!["192.168.0.2/32".parse().unwrap()]);
    // Every Service counted per endpoint: the trace meets the counting
    // rules too.
    c.metrics.level = verdict_model::Counting::Endpoint;
    let mut p = Proxier::new(c).unwrap();
    let services = [
        svc("ns", "web")
            .kind(ServiceType::LoadBalancer)
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 3001)
            .etp_local()
            .hcnp(30000),
        svc("ns", "lb")
            .cluster_ip("172.30.0.42")
            .port("p80", TCP, 80, 3002)
            .lb(&["5.6.7.8"])
            .source_ranges(&["203.0.113.0/25"]),
        svc("ns", "empty")
            .cluster_ip("172.30.0.43")
            .port("p80", TCP, 80, 0),
    ];
    for s in &services {
        p.on_service(None, Some(s));
    }
    let slices = [
        slice("ns", "web", "web-1")
            .port("p80", TCP, 80)
            .ep("10.180.0.1", "test-node")
            .ep("10.180.0.2", "other-node")
            .ep_cond("10.180.0.3", "other-node", false, true, true),
        slice("ns", "lb", "lb-1")
            .port("p80", TCP, 80)
            .ep("10.180.1.1", "other-node"),
    ];
    for s in &slices {
        p.on_endpoint_slice(s, false);
    }
    let mut nft = MemoryBackend::new();
    p.sync(&mut nft, Instant::now()).unwrap();
    (vec![p], nft)
}

fn kernel(nft: &MemoryBackend) -> TableRead {
    TableRead {
        table: nft.get(Family::Ip, "verdict").cloned(),
        lookups: None,
        source: ReadFrom::Memory,
        read: Duration::ZERO,
    }
}

fn request(from: Origin, src: &str, dst: &str, dport: u16) -> TraceRequest {
    TraceRequest {
        from,
        src: ip(src),
        sport: Some(40000),
        dst: ip(dst),
        proto: L4Proto::Tcp,
        dport,
    }
}

fn local() -> Vec<IpAddr> {
    vec![ip("127.0.0.1"), ip("192.168.0.2")]
}

#[test]
fn a_trace_names_the_service_each_element_belongs_to_and_the_odds() {
    let (proxiers, nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let doc = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.41", 80),
        &kernel(&nft),
    )
    .unwrap();
    assert_eq!(doc["service"], "ns/web:p80");
    let outcomes = doc["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2, "{doc:#}");
    for o in outcomes {
        assert_eq!(o["probability"], 0.5);
        assert_eq!(o["masquerade"], false, "pod traffic keeps its source");
        assert!(
            o["reason"]
                .as_str()
                .unwrap()
                .ends_with("an endpoint of ns/web:p80"),
            "{o}"
        );
    }
    assert!(
        !doc.to_string().contains("10.180.0.3"),
        "the terminating endpoint is not a candidate while ready ones exist"
    );
    // The endpoint slot elements carry no comment: their owner comes
    // from the proxier.
    let slot = doc["paths"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["lookups"].as_array().unwrap())
        .find(|l| l["set"] == "service-endpoints-tcp" && l["found"] == true)
        .expect("an endpoint slot was looked up");
    assert_eq!(slot["service"], "ns/web:p80");
    // Its packets are counted in the element of its entry and endpoint.
    let counted = doc["paths"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["lookups"].as_array().unwrap())
        .find(|l| l["set"] == "service-traffic")
        .expect("the packet's traffic was looked up");
    assert_eq!(counted["found"], true, "{counted}");
    assert_eq!(counted["service"], "ns/web:p80");
    let dnat = doc["paths"][0]["dnat"]
        .as_str()
        .unwrap()
        .replace(':', " . ");
    assert!(
        counted["key"]
            .as_str()
            .unwrap()
            .starts_with("172.30.0.41 . tcp . 80 . ")
            && counted["key"].as_str().unwrap().ends_with(&dnat),
        "the entry, then the endpoint it was sent to: {counted}"
    );
    let hooks: Vec<&str> = doc["paths"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hook"].as_str().unwrap())
        .collect();
    assert_eq!(hooks.first(), Some(&"prerouting"), "{hooks:?}");
    let text = text::trace(&typed(&doc));
    assert!(text.contains("service: ns/web:p80"), "{text}");
    assert!(
        text.contains("(steps 1-"),
        "the second path says what it shares: {text}"
    );
}

#[test]
fn a_trace_says_why_a_packet_is_dropped_or_rejected() {
    let (proxiers, nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let k = kernel(&nft);
    let blocked = trace(
        &view,
        &request(Origin::External, "203.0.113.130", "5.6.7.8", 80),
        &k,
    )
    .unwrap();
    assert_eq!(
        blocked["outcomes"][0]["reason"],
        "dropped: the source is outside the loadBalancerSourceRanges of ns/lb:p80",
        "{blocked:#}"
    );
    let allowed = trace(
        &view,
        &request(Origin::External, "203.0.113.2", "5.6.7.8", 80),
        &k,
    )
    .unwrap();
    assert_eq!(allowed["outcomes"][0]["output"], "10.180.1.1:80");
    assert_eq!(
        allowed["outcomes"][0]["masquerade"], true,
        "eTP Cluster masquerades"
    );
    let empty = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.43", 80),
        &k,
    )
    .unwrap();
    assert_eq!(
        empty["outcomes"][0]["reason"],
        "rejected: ns/empty:p80 has no usable endpoints"
    );
    let wrong_port = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.43", 81),
        &k,
    )
    .unwrap();
    assert!(
        wrong_port["outcomes"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("no Service port of it is this protocol and port"),
        "{wrong_port:#}"
    );
    let elsewhere = trace(&view, &request(Origin::Pod, "10.1.2.3", "8.8.8.8", 53), &k).unwrap();
    assert_eq!(elsewhere["outcomes"][0]["output"], "");
    assert!(elsewhere["service"].is_null());
    // eTP Local from outside: only the local endpoint, source kept.
    let nodeport = trace(
        &view,
        &request(Origin::External, "203.0.113.2", "192.168.0.2", 3001),
        &k,
    )
    .unwrap();
    assert_eq!(
        nodeport["outcomes"].as_array().unwrap().len(),
        1,
        "{nodeport:#}"
    );
    assert_eq!(nodeport["outcomes"][0]["output"], "10.180.0.1:80");
    assert_eq!(nodeport["outcomes"][0]["masquerade"], false);
}

#[test]
fn trace_requests_are_checked() {
    let q = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TraceRequest::parse(move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    };
    let ok = [
        ("from", "pod"),
        ("src", "10.0.0.1"),
        ("dst", "172.30.0.1"),
        ("proto", "TCP"),
        ("dport", "80"),
    ];
    let r = q(&ok).unwrap();
    assert_eq!(
        TraceRequest::parse(|k| {
            r.query()
                .split('&')
                .find_map(|p| p.strip_prefix(&format!("{k}=")).map(str::to_owned))
        })
        .unwrap(),
        r,
        "the query reads back"
    );
    for (bad, want) in [
        (("from", "mars"), "must be pod, node or external"),
        (("src", "10.0.0"), "is not an IP address"),
        (("dst", "fd00::1"), "not of the same IP family"),
        (("proto", "icmp"), "must be tcp, udp or sctp"),
        (("dport", "0"), "is not a port"),
        (("dport", "70000"), "is not a port"),
    ] {
        let mut pairs = ok.to_vec();
        pairs.retain(|(k, _)| *k != bad.0);
        pairs.push(bad);
        let e = q(&pairs).unwrap_err();
        assert!(e.0.contains(want), "{bad:?}: {e}");
    }
    let e = q(&ok[1..]).unwrap_err();
    assert_eq!(e.0, "missing from");
}

#[test]
fn explain_shows_every_endpoint_and_checks_the_kernel() {
    let (proxiers, mut nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let web = NamespacedName::new("ns", "web");
    let doc = explain(&view, &web, &[(IpFamily::V4, kernel(&nft))]);
    assert_eq!(doc["found"], true);
    let port = &doc["families"][0]["ports"][0];
    let eps = port["endpoints"].as_array().unwrap();
    let by = |a: &str| eps.iter().find(|e| e["address"] == a).unwrap().clone();
    assert_eq!(by("10.180.0.1:80")["used_by"], json!(["cluster", "local"]));
    assert_eq!(by("10.180.0.2:80")["used_by"], json!(["cluster"]));
    assert_eq!(
        by("10.180.0.3:80")["why"],
        "serving but terminating: unused while a ready endpoint exists"
    );
    assert_eq!(port["health_check_node_port"]["code"], 200);
    assert_eq!(port["health_check_node_port"]["local_endpoints"], 1);
    let kinds: Vec<&str> = port["entry_points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ClusterIP", "NodePort"]);
    assert_eq!(port["entry_points"][1]["addresses"], json!(["192.168.0.2"]));
    assert!(port["elements"].as_array().unwrap().len() > 4);
    assert!(
        port["elements"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kernel"] == "in the kernel"),
        "{port:#}"
    );
    assert_eq!(
        doc["drift"],
        json!({"missing": 0, "differs": 0, "extra": 0})
    );

    // Someone deletes one of its elements and adds one in its name.
    let key = vec![
        Value::Addr(ip("172.30.0.41")),
        Value::Proto(L4Proto::Tcp),
        Value::Port(80),
    ];
    let mut tx = verdict_nft::Transaction::new(Family::Ip, "verdict");
    tx.delete_element(layout::SERVICE_IPS, key);
    tx.add_element(
        layout::NO_ENDPOINT_SERVICES,
        Element::map(
            vec![
                Value::Addr(ip("172.30.0.41")),
                Value::Proto(L4Proto::Tcp),
                Value::Port(81),
            ],
            ElementValue::Verdict(Verdict::Drop),
        )
        .with_comment("ns/web:p80".to_owned()),
    );
    nft.run(&tx).unwrap();
    let doc = explain(&view, &web, &[(IpFamily::V4, kernel(&nft))]);
    assert_eq!(
        doc["drift"],
        json!({"missing": 1, "differs": 0, "extra": 1}),
        "{doc:#}"
    );
    let text = text::explain(&typed(&doc));
    assert!(text.contains("MISSING from the kernel"), "{text}");
    assert!(text.contains("EXTRA in the kernel"), "{text}");
    assert!(
        text.contains("drift: 1 missing, 0 differing, 1 extra"),
        "{text}"
    );
    let whole = as_json(&drift(
        &view,
        &view.family(IpFamily::V4).unwrap(),
        &kernel(&nft),
        None,
    ));
    assert_eq!(whole["missing"], 1, "{whole:#}");
    assert_eq!(whole["extra"], 1, "{whole:#}");
    // Read without its elements, then set by set (as through netlink):
    // the same drift.
    let by_set = TableRead::targeted(
        Box::new(nft.clone()),
        Family::Ip,
        "verdict",
        ReadFrom::Memory,
    )
    .unwrap();
    assert!(
        by_set
            .table
            .as_ref()
            .unwrap()
            .sets
            .values()
            .all(|s| s.elements.is_empty())
    );
    let targeted = as_json(&drift(
        &view,
        &view.family(IpFamily::V4).unwrap(),
        &by_set,
        None,
    ));
    assert_eq!(targeted["examples"], whole["examples"], "{targeted:#}");
    assert_eq!(
        (targeted["missing"].clone(), targeted["extra"].clone()),
        (json!(1), json!(1))
    );
    assert!(by_set.failed().is_none());
    // Two readers, the sets shared out between them: the same drift.
    let reader = || {
        TableRead::targeted(
            Box::new(nft.clone()),
            Family::Ip,
            "verdict",
            ReadFrom::Memory,
        )
    };
    let first = reader().unwrap();
    let two = as_json(&drift(
        &view,
        &view.family(IpFamily::V4).unwrap(),
        &first,
        Some(reader().unwrap()),
    ));
    assert_eq!(two["examples"], whole["examples"], "{two:#}");
    assert_eq!(
        (two["missing"].clone(), two["extra"].clone()),
        (json!(1), json!(1))
    );
    assert!(first.failed().is_none());
    // The second reader's failure is the answer's.
    let helper = TableRead::targeted(
        Box::new(Unreadable(nft.clone())),
        Family::Ip,
        "verdict",
        ReadFrom::Memory,
    )
    .unwrap();
    let first = reader().unwrap();
    drift(
        &view,
        &view.family(IpFamily::V4).unwrap(),
        &first,
        Some(helper),
    );
    assert!(
        first
            .failed()
            .is_some_and(|e| e.contains("cannot read a set")),
        "{:?}",
        first.failed()
    );

    let unknown = explain(&view, &NamespacedName::new("ns", "nope"), &[]);
    assert_eq!(unknown["found"], false);
    assert!(text::explain(&typed(&unknown)).contains("not known to verdict"));
}

#[test]
fn services_are_searched_and_paged() {
    let (proxiers, _nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let all = services(&view, "", 0, 100);
    assert_eq!(all["total"], 3);
    let names: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["empty", "lb", "web"]);
    let page = services(&view, "", 1, 1);
    assert_eq!(page["items"][0]["name"], "lb");
    let web = services(&view, "ns/we", 0, 100);
    assert_eq!(web["total"], 1);
    assert_eq!(web["items"][0]["ports"][0]["ready"], 2);
    assert_eq!(web["items"][0]["ports"][0]["local"], 1);
    assert!(text::services(&typed(&web)).contains("2/3 ready, 1 local"));
}

fn flow(
    proto: &str,
    dst: &str,
    dport: u16,
    ep: &str,
    ep_port: u16,
) -> verdict_nft::conntrack::Flow {
    verdict_nft::conntrack::Flow {
        proto: proto.into(),
        state: if proto == "tcp" {
            "ESTABLISHED".into()
        } else {
            String::new()
        },
        timeout: 100,
        src: ip("10.1.2.3"),
        sport: 40000,
        dst: ip(dst),
        dport,
        reply_src: ip(ep),
        reply_sport: ep_port,
        packets: None,
        bytes: None,
        replied: true,
    }
}

#[test]
fn connections_are_grouped_by_service_and_endpoint_and_stale_ones_flagged() {
    let (proxiers, _nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let flows = vec![(
        IpFamily::V4,
        vec![
            flow("tcp", "172.30.0.41", 80, "10.180.0.1", 80),
            flow("tcp", "172.30.0.41", 80, "10.180.0.2", 80),
            // An endpoint no slice lists any more: one connection still
            // open, one closed that conntrack keeps in TIME_WAIT.
            flow("tcp", "172.30.0.41", 80, "10.180.9.9", 80),
            verdict_nft::conntrack::Flow {
                state: "TIME_WAIT".into(),
                ..flow("tcp", "172.30.0.41", 80, "10.180.9.9", 80)
            },
            // UDP to a port the Service has only for TCP: not a Service's.
            flow("udp", "172.30.0.41", 80, "10.180.9.9", 80),
            // The NodePort, on a NodePort address.
            flow("tcp", "192.168.0.2", 3001, "10.180.0.1", 80),
            flow("tcp", "5.6.7.8", 80, "10.180.1.1", 80),
            // Someone else's DNAT.
            flow("tcp", "192.0.2.1", 8080, "10.99.0.1", 80),
        ],
    )];
    let all = connections(&view, &flows, None, 100);
    assert_eq!(all["total"], 6);
    assert_eq!(all["not_services"], 2);
    let web = all["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == "ns/web")
        .unwrap();
    assert_eq!(web["flows"], 5, "{web:#}");
    assert_eq!(web["stale"], 1, "the closed one is not stale");
    assert_eq!(web["closed_to_gone"], 1);
    let stale: Vec<&Json> = all["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["stale"] == true)
        .collect();
    assert_eq!(stale.len(), 1);
    assert!(stale_policy(verdict_model::Protocol::Udp).contains("stale UDP conntrack cleanup"));
    assert!(stale.iter().any(|f| {
        f["proto"] == "tcp"
            && f["what_verdict_does"]
                .as_str()
                .unwrap()
                .contains("deletes no TCP")
    }));
    let lb = connections(&view, &flows, Some(&NamespacedName::new("ns", "lb")), 100);
    assert_eq!(lb["total"], 1);
    assert_eq!(lb["flows"][0]["endpoint"], "10.180.1.1:80");
    let capped = connections(&view, &flows, None, 2);
    assert_eq!(capped["flows"].as_array().unwrap().len(), 2);
    assert_eq!(capped["total"], 6, "the counts cover every flow");
    // Filters choose the flows listed, not the counts.
    let only = |filter: super::ConnectionFilter| {
        as_json(&super::connections(&view, &flows, None, 100, &filter))
    };
    let stale_only = only(super::ConnectionFilter {
        stale: true,
        ..Default::default()
    });
    assert_eq!(stale_only["flows"].as_array().unwrap().len(), 1);
    assert_eq!(stale_only["total"], 6);
    let waiting = only(super::ConnectionFilter {
        state: Some("time_wait".into()),
        ..Default::default()
    });
    assert_eq!(waiting["flows"].as_array().unwrap().len(), 1);
    assert_eq!(waiting["flows"][0]["open"], false);
    let text = text::connections(&typed(&all));
    assert!(
        text.contains("ns/web:p80 tcp: 5 connections, 1 STALE"),
        "{text}"
    );
    assert!(
        text.contains("GONE: the endpoint is no longer the Service's"),
        "{text}"
    );
}

/// A kernel whose sets cannot be read element by element.
struct Unreadable(MemoryBackend);

impl Backend for Unreadable {
    fn run(&mut self, tx: &verdict_nft::Transaction) -> Result<(), NftError> {
        self.0.run(tx)
    }

    fn check(&mut self, tx: &verdict_nft::Transaction) -> Result<(), NftError> {
        self.0.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.0.table(family, name)
    }

    fn each_element(
        &mut self,
        _: Family,
        _: &str,
        set: &str,
        _: &mut dyn FnMut(Element),
    ) -> Result<(), NftError> {
        Err(NftError::Refused(format!("cannot read a set: {set}")))
    }
}

/// A kernel that counts the keys it is asked for and can be made to fail.
struct Asked {
    inner: MemoryBackend,
    keys: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    fail: bool,
}

impl Backend for Asked {
    fn run(&mut self, tx: &verdict_nft::Transaction) -> Result<(), NftError> {
        self.inner.run(tx)
    }

    fn check(&mut self, tx: &verdict_nft::Transaction) -> Result<(), NftError> {
        self.inner.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.inner.table(family, name)
    }

    fn lookup(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<verdict_nft::Found>>, NftError> {
        self.keys
            .fetch_add(keys.len(), std::sync::atomic::Ordering::SeqCst);
        if self.fail {
            return Err(NftError::Refused(
                "netlink: No buffer space available".into(),
            ));
        }
        self.inner.lookup(family, table, set, keys)
    }
}

/// A targeted read of `nft`, and a count of the keys it asks for.
fn targeted(
    nft: &MemoryBackend,
    fail: bool,
) -> (TableRead, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let keys = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let backend = Asked {
        inner: nft.clone(),
        keys: keys.clone(),
        fail,
    };
    let k =
        TableRead::targeted(Box::new(backend), Family::Ip, "verdict", ReadFrom::Kernel).unwrap();
    (k, keys)
}

/// An answer without the fields that say how the kernel was read.
fn answer_only(mut doc: Json) -> Json {
    for k in ["read", "read_ms", "source"] {
        doc.as_object_mut().unwrap().remove(k);
    }
    doc
}

#[test]
fn a_targeted_read_traces_as_the_whole_table_does_and_asks_only_for_what_the_packet_meets() {
    let (proxiers, nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let table = kernel(&nft).table.unwrap();
    let (skeleton, _) = targeted(&nft, false);
    let skel = skeleton.table.as_ref().unwrap();
    assert!(
        skel.sets.values().all(|s| s.elements.is_empty()),
        "a targeted read holds no elements of its own"
    );
    assert_eq!(skel.chains, table.chains, "but every chain and rule");
    let all: usize = table.sets.values().map(|s| s.elements.len()).sum();
    for req in [
        request(Origin::Pod, "10.1.2.3", "172.30.0.41", 80),
        request(Origin::External, "203.0.113.9", "192.168.0.2", 3001),
        request(Origin::Pod, "10.1.2.3", "172.30.0.43", 80),
        request(Origin::Node, "192.168.0.2", "172.30.0.42", 80),
        request(Origin::Pod, "10.1.2.3", "172.30.0.41", 9999),
        request(Origin::External, "203.0.113.9", "5.6.7.8", 80),
        request(Origin::External, "203.0.113.200", "5.6.7.8", 80),
    ] {
        let whole = trace(&view, &req, &kernel(&nft)).unwrap();
        let (k, keys) = targeted(&nft, false);
        let doc = trace(&view, &req, &k).unwrap();
        assert_eq!(k.failed(), None);
        assert_eq!(doc["read"], "targeted");
        assert_eq!(whole["read"], "whole");
        assert_eq!(answer_only(doc), answer_only(whole), "{req:?}");
        let asked = keys.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            asked > 0 && asked < all,
            "{req:?}: {asked} keys asked of {all} elements"
        );
    }
    // A kernel that cannot answer is not taken for an empty one.
    let (k, _) = targeted(&nft, true);
    let _ = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.41", 80),
        &k,
    );
    let why = k.failed().expect("the failed lookup is reported");
    assert!(why.contains("No buffer space"), "{why}");
}

#[test]
fn a_targeted_explain_finds_missing_and_differing_elements_and_says_what_it_did_not_look_for() {
    let (proxiers, mut nft) = node();
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let web = NamespacedName::new("ns", "web");
    let (k, keys) = targeted(&nft, false);
    let kernels = [(IpFamily::V4, k)];
    prefetch_explained(&explained_elements(&view.service(&web).unwrap()), &kernels);
    let doc = explain(&view, &web, &kernels);
    assert_eq!(
        doc["drift"],
        json!({"missing": 0, "differs": 0, "extra": null}),
        "{doc:#}"
    );
    assert_eq!(doc["families"][0]["read"], "targeted");
    let whole = explain(&view, &web, &[(IpFamily::V4, kernel(&nft))]);
    assert_eq!(
        doc["families"][0]["ports"], whole["families"][0]["ports"],
        "element by element, the answer is the whole table's"
    );
    let wanted = doc["families"][0]["ports"][0]["elements"]
        .as_array()
        .unwrap()
        .len();
    let asked = keys.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked <= wanted, "{asked} keys asked for {wanted} elements");

    // One element goes, one changes its verdict.
    let key = |port| {
        vec![
            Value::Addr(ip("172.30.0.41")),
            Value::Proto(L4Proto::Tcp),
            Value::Port(port),
        ]
    };
    let mut tx = verdict_nft::Transaction::new(Family::Ip, "verdict");
    tx.delete_element(layout::SERVICE_IPS, key(80));
    nft.run(&tx).unwrap();
    let before = kernel(&nft);
    let sets = &before.table.as_ref().unwrap().sets;
    let (set, el) = sets
        .iter()
        .filter(|(n, _)| *n != layout::SERVICE_IPS)
        .flat_map(|(n, s)| s.elements.values().map(move |e| (n.clone(), e.clone())))
        .find(|(_, e)| {
            e.comment.as_deref() == Some("ns/web:p80")
                && matches!(e.value, Some(ElementValue::Verdict(_)))
        })
        .expect("a verdict element of ns/web");
    let mut tx = verdict_nft::Transaction::new(Family::Ip, "verdict");
    tx.delete_element(&set, el.key.clone());
    tx.add_element(
        &set,
        Element::map(el.key.clone(), ElementValue::Verdict(Verdict::Accept))
            .with_comment("ns/web:p80".to_owned()),
    );
    nft.run(&tx).unwrap();
    let (k, _) = targeted(&nft, false);
    let kernels = [(IpFamily::V4, k)];
    prefetch_explained(&explained_elements(&view.service(&web).unwrap()), &kernels);
    let doc = explain(&view, &web, &kernels);
    assert_eq!(
        doc["drift"],
        json!({"missing": 1, "differs": 1, "extra": null}),
        "{doc:#}"
    );
    let text = text::explain(&typed(&doc));
    assert!(
        text.contains("drift: 1 missing, 1 differing") && text.contains("--full"),
        "{text}"
    );
    let whole = explain(&view, &web, &[(IpFamily::V4, kernel(&nft))]);
    assert_eq!(whole["drift"]["extra"], 0, "{whole:#}");
}

#[test]
fn the_wanted_elements_of_a_set_are_found_by_key() {
    let key = |i: u32| {
        vec![
            Value::Addr(IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8])),
            Value::Port(80),
        ]
    };
    let elements: Vec<Element> = (0..5_000)
        .map(|i| Element::map(key(i), ElementValue::Verdict(Verdict::Drop)))
        .chain([Element::map(key(7), ElementValue::Verdict(Verdict::Accept))])
        .collect();
    let mut want = Wanted::new(elements.iter());
    // One entry per key, the first kept; at most half the slots used.
    assert_eq!(want.entries.len(), 5_000);
    assert!(want.slots.len() >= 10_000);
    for i in (0..5_000).step_by(7) {
        let (e, seen) = want.get_mut(&key(i)).unwrap();
        assert_eq!(e.key[..], key(i)[..]);
        assert!(!*seen);
        *seen = true;
    }
    assert_eq!(
        want.get_mut(&key(7))
            .map(|(e, seen)| (e.value.clone(), *seen)),
        Some((Some(ElementValue::Verdict(Verdict::Drop)), true))
    );
    assert!(want.get_mut(&key(5_000)).is_none());
    assert!(want.get_mut(&[Value::Port(80)]).is_none());
    let seen = want.entries.iter().filter(|(_, s)| *s).count();
    assert_eq!(seen, 5_000_usize.div_ceil(7));
    assert!(Wanted::new(std::iter::empty()).get_mut(&key(1)).is_none());
}

#[test]
fn a_staged_service_is_in_the_kernel_for_explain_drift_and_trace() {
    // A Service added after the first sync has its jump staged: explain
    // says so and finds nothing missing, the whole-table drift finds
    // nothing wrong, and a trace reaches its endpoint through the staging
    // chain, naming the Service.
    let (mut proxiers, mut nft) = node();
    let p = &mut proxiers[0];
    p.on_service(
        None,
        Some(
            &svc("ns", "new")
                .cluster_ip("172.30.0.44")
                .port("p80", TCP, 80, 0),
        ),
    );
    p.on_endpoint_slice(
        &slice("ns", "new", "new-1")
            .port("p80", TCP, 80)
            .ep("10.180.2.1", "other-node"),
        false,
    );
    // And one without endpoints: its reject is staged too.
    p.on_service(
        None,
        Some(
            &svc("ns", "idle")
                .cluster_ip("172.30.0.45")
                .port("p80", TCP, 80, 0),
        ),
    );
    let r = p.sync(&mut nft, Instant::now()).unwrap();
    assert_eq!(r.staged, 2, "{r:?}");
    let local = local();
    let view = NodeHandle::of_proxiers(&proxiers.iter().collect::<Vec<_>>(), &local);
    let new = NamespacedName::new("ns", "new");
    let doc = explain(&view, &new, &[(IpFamily::V4, kernel(&nft))]);
    assert_eq!(
        doc["drift"],
        json!({"missing": 0, "differs": 0, "extra": 0}),
        "{doc:#}"
    );
    let elements = doc["families"][0]["ports"][0]["elements"]
        .as_array()
        .unwrap();
    let dispatch = elements
        .iter()
        .find(|e| e["set"] == "service-ips")
        .expect("its service-ips element");
    assert_eq!(
        dispatch["kernel"], "in the kernel, staged: moves into @service-ips shortly",
        "{doc:#}"
    );
    let whole = as_json(&drift(
        &view,
        &view.family(IpFamily::V4).unwrap(),
        &kernel(&nft),
        None,
    ));
    assert_eq!(
        (&whole["missing"], &whole["differs"], &whole["extra"]),
        (&json!(0), &json!(0), &json!(0)),
        "{whole:#}"
    );
    let t = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.44", 80),
        &kernel(&nft),
    )
    .unwrap();
    assert_eq!(t["service"], "ns/new:p80", "{t:#}");
    let outcomes = t["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 1, "{t:#}");
    assert!(
        outcomes[0]["reason"]
            .as_str()
            .unwrap()
            .ends_with("an endpoint of ns/new:p80"),
        "{t:#}"
    );
    assert!(t.to_string().contains("10.180.2.1"), "{t:#}");
    let t = trace(
        &view,
        &request(Origin::Pod, "10.1.2.3", "172.30.0.45", 80),
        &kernel(&nft),
    )
    .unwrap();
    assert_eq!(
        t["outcomes"][0]["reason"], "rejected: ns/idle:p80 has no usable endpoints",
        "{t:#}"
    );
}
