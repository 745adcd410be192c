//! Hubble's observer API with the unmodified `hubble` CLI of
//! `../shared/bin`: real traffic through a node of the namespace test bed
//! (forwarded, rejected and dropped connections), then `hubble observe`
//! and `hubble status` against verdict's `--hubble-listen-address`.
//! Needs root and the CLI (`VERDICT_REQUIRE_REALAPI` makes it missing a
//! failure).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::time::Duration;

use serde_json::Value as Json;
use verdict_e2e::bed::{Placement, TestBed};

const MANIFESTS: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 172.30.0.41\n  ports: [{name: http, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- addresses: [10.180.0.1]\n  nodeName: test-node\n  targetRef: {kind: Pod, namespace: shop, name: web-7d4b9c-x2x9q}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: empty, namespace: shop}\nspec:\n  clusterIP: 172.30.0.43\n  ports: [{name: dns, port: 53, protocol: UDP}, {name: http, port: 80, protocol: TCP}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: guarded, namespace: shop}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.44\n  loadBalancerSourceRanges: [203.0.113.0/24]\n  ports: [{name: http, port: 80, nodePort: 30081, protocol: TCP}]\nstatus:\n  loadBalancer: {ingress: [{ip: 198.51.100.44}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: guarded-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: guarded}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- addresses: [10.180.0.1]\n  nodeName: test-node\n---\napiVersion: v1\nkind: Service\nmetadata: {name: ui, namespace: front}\nspec:\n  clusterIP: 172.30.0.45\n  ports: [{name: http, port: 8080, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: ui-1\n  namespace: front\n  labels: {kubernetes.io/service-name: ui}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n- addresses: [10.0.0.2]\n  nodeName: test-node\n  targetRef: {kind: Pod, namespace: front, name: ui-5f6d7-abcde}\n";

/// The `hubble` CLI, unpacked; `None` (the test skips) if it is not
/// there and nothing requires it.
fn hubble() -> Option<String> {
    match verdict_e2e::realapi::binaries() {
        Ok(dir) => Some(dir.join("hubble").to_string_lossy().into_owned()),
        Err(why) => {
            assert!(
                std::env::var_os("VERDICT_REQUIRE_REALAPI").is_none(),
                "the hubble CLI is required: {why}"
            );
            println!("skipped: {why}");
            None
        }
    }
}

/// `hubble observe` in the node against verdict, as JSON lines.
fn observe(bed: &TestBed, hubble: &str, args: &[&str]) -> Vec<Json> {
    let mut a = vec!["observe", "--server", "127.0.0.1:4244", "-o", "json"];
    a.extend_from_slice(args);
    let out = bed
        .node
        .exec(hubble, &a)
        .unwrap_or_else(|e| panic!("hubble {a:?}: {e}"));
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Json>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|r| r["flow"].clone())
        .collect()
}

fn verdicts(flows: &[Json]) -> Vec<&str> {
    flows
        .iter()
        .map(|f| f["verdict"].as_str().unwrap())
        .collect()
}

/// A node of the test bed with the web pod and a client pod, verdict
/// running on [`MANIFESTS`] and programmed, and the hubble CLI; `flags`
/// gives verdict's flags beyond the node's, given the scratch directory
/// (for files it writes there first).
struct Node {
    bed: TestBed,
    hubble: String,
    dir: std::path::PathBuf,
    log: std::path::PathBuf,
    _daemon: verdict_e2e::netns::Process,
}

fn node(tag: &str, flags: impl FnOnce(&std::path::Path) -> Vec<String>) -> Option<Node> {
    let mut bed = bed()?;
    let hubble = hubble()?;
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir(tag);
    write(&dir, "cluster.yaml", MANIFESTS);
    let log = dir.join("verdict.log");
    let mut args = vec!["run".to_owned()];
    args.extend(node_flags(&dir.to_string_lossy()));
    args.extend(["--min-sync-period".to_owned(), "0s".to_owned()]);
    args.extend(flags(&dir));
    let daemon = spawn_verdict(&bed, args, &log, None);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    Some(Node {
        bed,
        hubble,
        dir,
        log,
        _daemon: daemon,
    })
}

#[test]
fn hubble_observes_forwarded_rejected_and_dropped_connections() {
    let Some(Node {
        bed,
        hubble,
        log,
        _daemon,
        ..
    }) = node("hubble", |_| Vec::new())
    else {
        return;
    };
    // `hubble status` asks the health service, then ServerStatus.
    let status = bed
        .node
        .exec(&hubble, &["status", "--server", "127.0.0.1:4244"])
        .unwrap_or_else(|e| {
            panic!(
                "hubble status: {e}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
    assert!(
        status.contains("Healthcheck (via 127.0.0.1:4244): Ok"),
        "{status}"
    );
    assert!(status.contains("Max Flows"), "{status}");

    // Asking for flows follows forwarded connections from then on.
    let _ = observe(&bed, &hubble, &["--last", "1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let client = ip("10.0.0.2");
    for _ in 0..5 {
        let line = bed
            .connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
        assert!(line.contains("10.180.0.1:80"), "{line}");
    }
    for _ in 0..3 {
        let _ = bed.connect(client, ip("172.30.0.43"), "tcp", 80, 1000);
    }
    for _ in 0..2 {
        let _ = bed.connect(client, ip("198.51.100.44"), "tcp", 80, 1500);
    }
    std::thread::sleep(Duration::from_secs(1));

    let all = observe(&bed, &hubble, &["--last", "1000"]);
    let to = |service: &str| -> Vec<&Json> {
        all.iter()
            .filter(|f| f["destination_service"]["name"] == service)
            .collect()
    };
    let web = to("web");
    assert!(web.len() >= 5, "{all:#?}");
    for f in &web {
        assert_eq!(f["verdict"], "FORWARDED", "{f}");
        assert_eq!(f["destination"]["pod_name"], "web-7d4b9c-x2x9q", "{f}");
        assert_eq!(f["destination"]["namespace"], "shop", "{f}");
        assert_eq!(f["destination_service"]["namespace"], "shop", "{f}");
        assert_eq!(f["IP"]["destination"], "10.180.0.1", "{f}");
        assert_eq!(f["l4"]["TCP"]["destination_port"], 80, "{f}");
        assert_eq!(f["is_reply"], false, "{f}");
        assert_eq!(f["Type"], "L3_L4", "{f}");
        // The client, named by the EndpointSlice of the Service it serves.
        assert_eq!(f["source"]["pod_name"], "ui-5f6d7-abcde", "{f}");
        assert_eq!(f["source"]["namespace"], "front", "{f}");
        assert!(
            f["node_name"].as_str().is_some_and(|n| !n.is_empty()),
            "{f}"
        );
    }
    let empty = to("empty");
    assert_eq!(empty.len(), 3, "{all:#?}");
    for f in &empty {
        assert_eq!(f["verdict"], "DROPPED", "{f}");
        assert_eq!(f["drop_reason_desc"], "SERVICE_BACKEND_NOT_FOUND", "{f}");
    }
    let guarded = to("guarded");
    assert_eq!(guarded.len(), 2, "{all:#?}");
    assert!(
        guarded
            .iter()
            .all(|f| f["drop_reason_desc"] == "POLICY_DENIED"),
        "{guarded:#?}"
    );
    // In time order, as Hubble sends them.
    let times: Vec<std::time::SystemTime> = all
        .iter()
        .map(|f| verdict_admin::time::parse_rfc3339(f["time"].as_str().unwrap()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{all:#?}");

    // This node, and the namespaces its flows name.
    let nodes = bed
        .node
        .exec(&hubble, &["list", "nodes", "--server", "127.0.0.1:4244"])
        .unwrap();
    assert!(
        nodes.contains("test-node") && nodes.contains("Connected"),
        "{nodes}"
    );
    let namespaces = bed
        .node
        .exec(
            &hubble,
            &["list", "namespaces", "--server", "127.0.0.1:4244"],
        )
        .unwrap();
    assert!(
        namespaces.contains("shop") && namespaces.contains("front"),
        "{namespaces}"
    );

    // The compact lines an operator reads: the type column from the
    // event type, the arrow from is_reply, the Service for the address.
    let compact = bed
        .node
        .exec(
            &hubble,
            &["observe", "--server", "127.0.0.1:4244", "--last", "1000"],
        )
        .unwrap();
    println!("{compact}");
    let line = |needle: &str| compact.lines().find(|l| l.contains(needle)).unwrap_or("");
    let forwarded = line("FORWARDED");
    assert!(
        forwarded.contains("front/ui-5f6d7-abcde:")
            && forwarded.contains("-> shop/web-7d4b9c-x2x9q:80")
            && forwarded.contains("to-endpoint"),
        "{compact}"
    );
    let refused = line("shop/empty");
    assert!(
        refused.contains("Service backend not found") && refused.contains("DROPPED"),
        "{compact}"
    );

    // What each filter flag means to Hubble.
    let dropped = observe(&bed, &hubble, &["--last", "1000", "--verdict", "DROPPED"]);
    assert_eq!(dropped.len(), 5, "{dropped:#?}");
    assert!(verdicts(&dropped).iter().all(|v| *v == "DROPPED"));
    let by_ip = observe(&bed, &hubble, &["--last", "1000", "--ip", "198.51.100.44"]);
    assert_eq!(by_ip.len(), 2, "{by_ip:#?}");
    let by_pod = observe(
        &bed,
        &hubble,
        &["--last", "1000", "--pod", "shop/web-7d4b9c"],
    );
    assert_eq!(by_pod.len(), web.len(), "{by_pod:#?}");
    // A namespace is either end's pod: the client's for every flow, the
    // endpoint's only for forwarded ones.
    let front = observe(&bed, &hubble, &["--last", "1000", "--namespace", "front"]);
    assert_eq!(front.len(), all.len(), "{front:#?}");
    let shop = observe(&bed, &hubble, &["--last", "1000", "--namespace", "shop"]);
    assert_eq!(shop.len(), web.len(), "{shop:#?}");
    let by_client = observe(&bed, &hubble, &["--last", "1000", "--from-pod", "front/ui"]);
    assert_eq!(by_client.len(), all.len(), "{by_client:#?}");
    let by_port = observe(
        &bed,
        &hubble,
        &["--last", "1000", "--port", "80", "--protocol", "tcp"],
    );
    assert_eq!(by_port.len(), all.len());
    let udp = observe(&bed, &hubble, &["--last", "1000", "--protocol", "udp"]);
    assert!(udp.is_empty(), "{udp:#?}");
    let last_two = observe(&bed, &hubble, &["--last", "2"]);
    assert_eq!(last_two, all[all.len() - 2..].to_vec());

    // --follow: flows made after it started, as they come.
    let follower = std::process::Command::new("ip")
        .args(["netns", "exec", bed.node.name(), &hubble])
        .args([
            "observe",
            "--server",
            "127.0.0.1:4244",
            "-o",
            "json",
            "--follow",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    for _ in 0..3 {
        let _ = bed.connect(client, ip("172.30.0.43"), "tcp", 80, 1000);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut follower = follower;
    let _ = follower.kill();
    let out = follower.wait_with_output().unwrap();
    let followed: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .collect();
    let rejected = followed
        .iter()
        .filter(|r| r["flow"]["destination_service"]["name"] == "empty")
        .count();
    assert_eq!(rejected, 3, "{followed:#?}");
}

fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a serving certificate for `names` (`subjectAltName`) and a
/// client certificate, in `dir`.
fn certificates(dir: &std::path::Path, names: &str) {
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &d("ca.key"),
        "-out",
        &d("ca.crt"),
        "-days",
        "2",
        "-subj",
        "/CN=hubble-test-ca",
    ]);
    issue(
        dir,
        "server",
        &format!("subjectAltName={names}\nextendedKeyUsage=serverAuth\n"),
    );
    issue(dir, "client", "extendedKeyUsage=clientAuth\n");
}

/// `NAME.crt` and `NAME.key` in `dir`, signed by its CA, with the
/// extensions `ext`.
fn issue(dir: &std::path::Path, name: &str, ext: &str) {
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &d(&format!("{name}.key")),
        "-out",
        &d(&format!("{name}.csr")),
        "-subj",
        &format!("/CN={name}"),
    ]);
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &d(&format!("{name}.csr")),
        "-CA",
        &d("ca.crt"),
        "-CAkey",
        &d("ca.key"),
        "-CAcreateserial",
        "-out",
        &d(&format!("{name}.crt")),
        "-days",
        "2",
        "-extfile",
        &d(&format!("{name}.ext")),
    ]);
}

#[test]
fn off_loopback_hubble_is_served_in_tls_to_clients_with_a_certificate_only() {
    let Some(Node {
        bed,
        hubble,
        dir,
        log,
        _daemon,
    }) = node("hubble-tls", |dir| {
        certificates(
            dir,
            "IP:192.168.0.2,DNS:test-node.default.hubble-grpc.cilium.io",
        );
        let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
        vec![
            "--hubble-listen-address".to_owned(),
            "192.168.0.2:4244".to_owned(),
            "--hubble-tls-cert-file".to_owned(),
            d("server.crt"),
            "--hubble-tls-key-file".to_owned(),
            d("server.key"),
            "--hubble-tls-client-ca-files".to_owned(),
            d("ca.crt"),
        ]
    })
    else {
        return;
    };
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let server = ["--server", "192.168.0.2:4244"];
    let tls = [
        "--tls",
        "--tls-server-name",
        "test-node.default.hubble-grpc.cilium.io",
        "--tls-ca-cert-files",
        &d("ca.crt"),
    ];
    let client = [
        "--tls-client-cert-file",
        &d("client.crt"),
        "--tls-client-key-file",
        &d("client.key"),
    ];
    // From another host, with a client certificate: answered.
    let run = |args: Vec<&str>| bed.ext.exec(&hubble, &args);
    let mut status: Vec<&str> = vec!["status"];
    status.extend(server);
    status.extend(tls);
    status.extend(client);
    let ok = run(status.clone())
        .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
    assert!(
        ok.contains("Healthcheck (via 192.168.0.2:4244): Ok"),
        "{ok}"
    );
    let _ = bed.connect(ip("10.0.0.2"), ip("172.30.0.43"), "tcp", 80, 1000);
    std::thread::sleep(Duration::from_secs(1));
    let mut observe: Vec<&str> = vec!["observe", "-o", "json", "--last", "10"];
    observe.extend(server);
    observe.extend(tls);
    observe.extend(client);
    let flows = run(observe).unwrap();
    assert!(flows.contains("SERVICE_BACKEND_NOT_FOUND"), "{flows}");
    // Without a client certificate, or in plaintext: refused.
    let without = run(status[..status.len() - 4].to_vec());
    assert!(without.is_err(), "{without:?}");
    let mut plain: Vec<&str> = vec!["status"];
    plain.extend(server);
    assert!(run(plain).is_err());

    // A renewed certificate (another name) swapped in, as a Secret volume
    // swaps its files: served from the next connection on, no restart.
    let renewed_name = "renewed.default.hubble-grpc.cilium.io";
    let ca = d("ca.crt");
    let mut renewed: Vec<&str> = vec!["status"];
    renewed.extend(server);
    renewed.extend([
        "--tls",
        "--tls-server-name",
        renewed_name,
        "--tls-ca-cert-files",
        &ca,
    ]);
    renewed.extend(client);
    assert!(run(renewed.clone()).is_err(), "not the name served yet");
    issue(
        &dir,
        "next",
        &format!("subjectAltName=IP:192.168.0.2,DNS:{renewed_name}\nextendedKeyUsage=serverAuth\n"),
    );
    std::fs::rename(dir.join("next.key"), dir.join("server.key")).unwrap();
    std::fs::rename(dir.join("next.crt"), dir.join("server.crt")).unwrap();
    let answer = until(Duration::from_secs(10), || {
        run(renewed.clone()).map_err(|e| e.0)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
    assert!(answer.contains("Healthcheck"), "{answer}");
    // Files that cannot serve leave the last good ones serving.
    std::fs::write(dir.join("server.crt"), "not a certificate\n").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    run(renewed).unwrap_or_else(|e| panic!("{e}"));
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("serving the new ones") && log.contains("the previous ones still do"),
        "{log}"
    );
}

/// Hubble Relay's arguments in `deploy/components/hubble/relay.yaml`,
/// each `--flag=` given a value of `here` and each path of `here` another.
fn relay_args(here: &[(&str, String)]) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/components/hubble/relay.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut bytes = text.as_bytes();
    let relay = serde_saphyr::read::<_, Json>(&mut bytes)
        .map(Result::unwrap)
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    relay["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_owned();
            for (from, to) in here {
                if from.ends_with('=') && a.starts_with(from) {
                    a = format!("{from}{to}");
                } else {
                    a = a.replace(from, to);
                }
            }
            a
        })
        .collect()
}

/// A Service of one port 80 in the real API server's service range.
fn service(ns: &str, name: &str, cluster_ip: &str) -> Json {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "type": "ClusterIP",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    })
}

/// An EndpointSlice of `service` with one endpoint, on `node`, naming
/// its pod.
fn endpoints(ns: &str, service: &str, address: &str, node: &str, pod: &str) -> Json {
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true}, "nodeName": node,
                       "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}]
    })
}

/// Creates the Node `name` with `address` as its InternalIP (the status
/// subresource, as the kubelet writes it).
fn create_node(admin: &verdict_e2e::realapi::KubeClient, name: &str, address: &str) {
    let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
    admin.create("/api/v1/nodes", &node).unwrap();
    let (code, body) = admin
        .request(
            "PATCH",
            &format!("/api/v1/nodes/{name}/status"),
            Some(&serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": address}]}})),
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

/// Polls `f` until it says yes or `within` passes; the last answer.
fn until(
    within: Duration,
    mut f: impl FnMut() -> Result<String, String>,
) -> Result<String, String> {
    let t = std::time::Instant::now();
    loop {
        let r = f();
        if r.is_ok() || t.elapsed() > within {
            return r;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The unmodified Hubble Relay in front of two verdict nodes found
/// through verdict's `peer.Peer/Notify`: both nodes' flows through one
/// Relay, in time order, each with its node; a node added later is picked
/// up; a node stopped is reported unavailable and the other's flows still
/// come. Relay and the nodes speak TLS with client certificates; the
/// Nodes come from a real kube-apiserver, which verdict watches only while
/// Relay follows `Notify`.
#[test]
fn hubble_relay_merges_the_flows_of_two_verdict_nodes() {
    use verdict_e2e::realapi::{Etcd, Options, RealApiServer};
    if let Err(why) = verdict_e2e::realapi::available() {
        assert!(
            std::env::var_os("VERDICT_REQUIRE_REALAPI").is_none(),
            "the real API server is required: {why}"
        );
        println!("skipped: {why}");
        return;
    }
    let Some(mut bed) = bed() else { return };
    let bin = verdict_e2e::realapi::binaries().unwrap();
    let (hubble, relay_bin) = (
        bin.join("hubble").to_string_lossy().into_owned(),
        bin.join("hubble-relay").to_string_lossy().into_owned(),
    );
    // node-a (the bed's node, 192.168.0.2) and node-b (node2,
    // 192.168.5.2): each a web pod and a client pod of its own.
    for (pod, place, ports) in [
        ("10.180.0.1", Placement::Local, &[80u16][..]),
        ("10.0.0.2", Placement::Local, &[][..]),
        ("10.180.5.1", Placement::Remote, &[80u16][..]),
        ("10.0.5.2", Placement::Remote, &[][..]),
    ] {
        bed.add_pod(ip(pod), place, ports, &[]).unwrap();
    }
    let dir = scratch_dir("hubble-relay");
    certificates(
        &dir,
        "DNS:*.default.hubble-grpc.cilium.io,IP:192.168.0.2,IP:192.168.5.2",
    );
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let api = RealApiServer::start(
        &bed.node,
        Etcd::V36,
        &dir.join("api"),
        &Options {
            bind: "0.0.0.0".into(),
            sans: vec!["192.168.0.2".into()],
            ..Options::default()
        },
    )
    .unwrap();
    let admin = api.admin().unwrap();
    for ns in ["shop", "front"] {
        admin
            .create(
                "/api/v1/namespaces",
                &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .unwrap();
    }
    let create = |path: &str, obj: Json| admin.create(path, &obj).unwrap();
    let services = "/api/v1/namespaces/shop/services";
    let slices = |ns: &str| format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
    create(services, service("shop", "web-a", "10.96.0.10"));
    create(services, service("shop", "web-b", "10.96.0.20"));
    create(services, service("shop", "none", "10.96.0.30"));
    create(
        &slices("shop"),
        endpoints("shop", "web-a", "10.180.0.1", "node-a", "web-a-0"),
    );
    create(
        &slices("shop"),
        endpoints("shop", "web-b", "10.180.5.1", "node-b", "web-b-0"),
    );
    // The clients serve a Service each: their slices name them.
    create(
        "/api/v1/namespaces/front/services",
        service("front", "ui", "10.96.0.40"),
    );
    let mut clients = endpoints("front", "ui", "10.0.0.2", "node-a", "ui-a");
    clients["endpoints"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"addresses": ["10.0.5.2"], "conditions": {"ready": true},
            "nodeName": "node-b", "targetRef": {"kind": "Pod", "namespace": "front", "name": "ui-b"}}));
    create(&slices("front"), clients);
    create_node(&admin, "node-a", "192.168.0.2");
    // The client pod on node-a as the kubelet would have it: a
    // Deployment's pod with labels and an address. node-a runs with
    // --watch-pods and names it from this; node-b does not, and names its
    // client from the EndpointSlice alone.
    // (No controller manager makes the namespace's default ServiceAccount.)
    create(
        "/api/v1/namespaces/front/serviceaccounts",
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "front"}}),
    );
    create(
        "/api/v1/namespaces/front/pods",
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ui-a", "namespace": "front",
                "labels": {"app": "ui", "pod-template-hash": "5f6d7"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "ui-5f6d7", "uid": "8e5a4a5e-0000-4000-8000-000000000001",
                    "controller": true}]},
            "spec": {"nodeName": "node-a", "containers": [{"name": "ui", "image": "ui"}]}}),
    );
    let (code, body) = admin
        .request(
            "PATCH",
            "/api/v1/namespaces/front/pods/ui-a/status",
            Some(&serde_json::json!({"status": {"phase": "Running",
                "podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.2"}]}})),
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
    // The hubble component's RBAC for --watch-pods, bound to the user
    // verdict runs as here.
    let rbac = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/components/hubble/rbac.yaml"),
    )
    .unwrap();
    let mut bytes = rbac.as_bytes();
    for mut doc in serde_saphyr::read::<_, Json>(&mut bytes).map(Result::unwrap) {
        if doc["kind"] == "ClusterRoleBinding" {
            doc["subjects"] = serde_json::json!([{"kind": "User",
                "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-proxy"}]);
            create(
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                doc,
            );
        } else {
            create("/apis/rbac.authorization.k8s.io/v1/clusterroles", doc);
        }
    }

    // verdict as kube-proxy runs: kube-proxy's own user and RBAC.
    let kubeconfig = api
        .kubeconfig_at(
            "kube-proxy",
            &api.kube_proxy_token,
            "https://192.168.0.2:6443",
        )
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (cert, key, ca) = (d("server.crt"), d("server.key"), d("ca.crt"));
    let verdict = |ns: &verdict_e2e::netns::Netns, name: &str, more: &[&str]| {
        let log = dir.join(format!("{name}.log"));
        let mut args = vec![
            "--kubeconfig",
            &kubeconfig,
            "--hostname-override",
            name,
            "--cluster-cidr",
            "10.0.0.0/8",
            "--min-sync-period",
            "0s",
            "--hubble-listen-address",
            "0.0.0.0:4244",
            "--hubble-tls-cert-file",
            &cert,
            "--hubble-tls-key-file",
            &key,
            "--hubble-tls-client-ca-files",
            &ca,
        ];
        args.extend_from_slice(more);
        (spawn_verdict_in(ns, args, &log, None), log)
    };
    let (_a, a_log) = verdict(&bed.node, "node-a", &["--watch-pods"]);
    let answered = |client: &str, service: &str, want: &str| {
        until(Duration::from_secs(30), || {
            let line = bed
                .connect(ip(client), ip(service), "tcp", 80, 1000)
                .unwrap_or_default();
            if line.contains(want) {
                Ok(line)
            } else {
                Err(line)
            }
        })
    };
    answered("10.0.0.2", "10.96.0.10", "10.180.0.1:80").unwrap_or_else(|e| {
        panic!(
            "node-a never answered: {e}\n{}",
            std::fs::read_to_string(&a_log).unwrap_or_default()
        )
    });

    // Until someone follows Notify, verdict asks for no Node but its own.
    let all_nodes = || {
        api.audit()
            .iter()
            .filter(|e| {
                e["userAgent"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("verdict/"))
                    && e["requestURI"].as_str().is_some_and(|u| {
                        u.starts_with("/api/v1/nodes?") && !u.contains("fieldSelector")
                    })
            })
            .count()
    };
    assert_eq!(all_nodes(), 0);

    // Relay in the router's namespace with deploy/'s arguments, told of
    // node-a's peer service, its files and listeners here.
    let relay_log = dir.join("relay.log");
    let relay_args = relay_args(&[
        ("--peer-service=", "192.168.0.2:4244".into()),
        ("--listen-address=", "127.0.0.1:4245".into()),
        ("--health-listen-address=", "127.0.0.1:4222".into()),
        ("/var/lib/hubble-relay/tls/tls.crt", d("client.crt")),
        ("/var/lib/hubble-relay/tls/tls.key", d("client.key")),
        ("/var/lib/hubble-relay/tls/ca.crt", d("ca.crt")),
    ]);
    let relay = std::process::Command::new("ip")
        .args(["netns", "exec", bed.lan.name(), &relay_bin])
        .args(&relay_args)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&relay_log).unwrap())
        .stderr(std::fs::File::create(dir.join("relay.err")).unwrap())
        .spawn()
        .unwrap();
    let _relay = verdict_e2e::netns::Process(relay);
    let logs = || {
        format!(
            "--- relay\n{}{}\n--- node-a\n{}",
            std::fs::read_to_string(&relay_log).unwrap_or_default(),
            std::fs::read_to_string(dir.join("relay.err")).unwrap_or_default(),
            std::fs::read_to_string(&a_log).unwrap_or_default()
        )
    };
    let hubble_at_relay = |args: &[&str]| -> Result<String, String> {
        let mut a = args.to_vec();
        a.extend(["--server", "127.0.0.1:4245"]);
        bed.lan.exec(&hubble, &a).map_err(|e| e.0)
    };
    let connected = |n: usize| {
        until(Duration::from_secs(30), || {
            let s = hubble_at_relay(&["status"])?;
            if s.contains(&format!("Connected Nodes: {n}/{n}")) {
                Ok(s)
            } else {
                Err(s)
            }
        })
    };
    let status = connected(1).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    println!("{status}");
    assert!(
        all_nodes() > 0,
        "Relay follows Notify: every Node is watched"
    );

    // node-b joins: its Node, then verdict on it.
    create_node(&admin, "node-b", "192.168.5.2");
    let (b, b_log) = verdict(&bed.node2, "node-b", &[]);
    answered("10.0.5.2", "10.96.0.20", "10.180.5.1:80").unwrap_or_else(|e| {
        panic!(
            "node-b never answered: {e}\n{}",
            std::fs::read_to_string(&b_log).unwrap_or_default()
        )
    });
    let status = connected(2).unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    println!("{status}");
    let nodes = hubble_at_relay(&["list", "nodes"]).unwrap();
    assert!(
        nodes.contains("node-a") && nodes.contains("node-b"),
        "{nodes}"
    );

    // Asking through Relay asks every node: they follow forwarded
    // connections from then on. Traffic on each node, refusals too.
    hubble_at_relay(&["observe", "--last", "1"]).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..3 {
        answered("10.0.0.2", "10.96.0.10", "10.180.0.1:80").unwrap();
        answered("10.0.5.2", "10.96.0.20", "10.180.5.1:80").unwrap();
    }
    let _ = bed.connect(ip("10.0.0.2"), ip("10.96.0.30"), "tcp", 80, 1000);
    let _ = bed.connect(ip("10.0.5.2"), ip("10.96.0.30"), "tcp", 80, 1000);
    std::thread::sleep(Duration::from_secs(1));

    let flows = |args: &[&str]| -> Vec<Json> {
        let mut a = vec!["observe", "-o", "json"];
        a.extend_from_slice(args);
        hubble_at_relay(&a)
            .unwrap_or_else(|e| panic!("{e}\n{}", logs()))
            .lines()
            .filter_map(|l| serde_json::from_str::<Json>(l).ok())
            .filter(|r| r.get("flow").is_some())
            .map(|r| r["flow"].clone())
            .collect()
    };
    let all = flows(&["--last", "100"]);
    let on = |node: &str| -> Vec<&Json> { all.iter().filter(|f| f["node_name"] == node).collect() };
    let (from_a, from_b) = (on("node-a"), on("node-b"));
    assert!(from_a.len() >= 4 && from_b.len() >= 4, "{all:#?}");
    for f in &from_a {
        // node-a watches Pods: its client's labels and Deployment.
        assert_eq!(f["source"]["pod_name"], "ui-a", "{f}");
        assert_eq!(
            f["source"]["labels"],
            serde_json::json!([
                "k8s:app=ui",
                "k8s:io.kubernetes.pod.namespace=front",
                "k8s:pod-template-hash=5f6d7"
            ]),
            "{f}"
        );
        assert_eq!(
            f["source"]["workloads"],
            serde_json::json!([{"name": "ui", "kind": "Deployment"}]),
            "{f}"
        );
        if f["verdict"] == "FORWARDED" {
            assert_eq!(f["destination"]["pod_name"], "web-a-0", "{f}");
        }
    }
    for f in &from_b {
        // node-b does not: the slice's name, no labels.
        assert!(f["source"].get("labels").is_none(), "{f}");
        if f["verdict"] == "FORWARDED" {
            assert_eq!(f["destination"]["pod_name"], "web-b-0", "{f}");
            assert_eq!(f["source"]["pod_name"], "ui-b", "{f}");
        }
    }
    for node in [&from_a, &from_b] {
        assert!(
            node.iter()
                .any(|f| f["drop_reason_desc"] == "SERVICE_BACKEND_NOT_FOUND"),
            "{node:#?}"
        );
    }
    // Relay orders the nodes' flows by time.
    let times: Vec<std::time::SystemTime> = all
        .iter()
        .map(|f| verdict_admin::time::parse_rfc3339(f["time"].as_str().unwrap()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{all:#?}");
    // A filter reaches every node unchanged.
    let dropped = flows(&["--last", "100", "--verdict", "DROPPED"]);
    assert_eq!(dropped.len(), 2, "{dropped:#?}");

    // node-b stops: reported unavailable, node-a's flows still come.
    drop(b);
    let status = until(Duration::from_secs(60), || {
        let s = hubble_at_relay(&["status"])?;
        if s.contains("Connected Nodes: 1/2") {
            Ok(s)
        } else {
            Err(s)
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert!(status.contains("node-b"), "{status}");
    let still = flows(&["--last", "100"]);
    assert!(
        !still.is_empty() && still.iter().all(|f| f["node_name"] == "node-a"),
        "{still:#?}"
    );
    let compact = hubble_at_relay(&["observe", "--last", "5"]).unwrap_or_else(|e| panic!("{e}"));
    println!("{compact}");

    // Relay gone: so is the watch of every Node.
    drop(_relay);
    until(Duration::from_secs(10), || {
        let log = std::fs::read_to_string(&a_log).unwrap_or_default();
        if log.contains("the Node watch stopped") {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}
