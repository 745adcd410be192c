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

/// A CA, the node's serving certificate (for its address and the name
/// Hubble Relay would expect) and a client certificate, in `dir`.
fn certificates(dir: &std::path::Path) {
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let ssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    ssl(&[
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
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:192.168.0.2,DNS:test-node.default.hubble-grpc.cilium.io\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        ssl(&[
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
        ssl(&[
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
        certificates(dir);
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
}
