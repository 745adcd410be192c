//! The flow stream (`--flows`) with real traffic, inside the node of a
//! network-namespace test bed: each connection to a ClusterIP is recorded
//! once with its endpoint and pod, each one to a Service without endpoints
//! as rejected, each connect from outside `loadBalancerSourceRanges` once
//! (not once per SYN) as dropped; all within a second, and `verdict flows`
//! filters them. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::time::Duration;

use serde_json::Value as Json;
use verdict_e2e::bed::{Placement, TestBed};

const MANIFESTS: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 172.30.0.41\n  ports: [{name: http, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- addresses: [10.180.0.1]\n  nodeName: test-node\n  targetRef: {kind: Pod, namespace: shop, name: web-7d4b9c-x2x9q}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: empty, namespace: shop}\nspec:\n  clusterIP: 172.30.0.43\n  ports: [{name: http, port: 80, protocol: TCP}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: guarded, namespace: shop}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.44\n  loadBalancerSourceRanges: [203.0.113.0/24]\n  ports: [{name: http, port: 80, nodePort: 30081, protocol: TCP}]\nstatus:\n  loadBalancer: {ingress: [{ip: 198.51.100.44}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: guarded-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: guarded}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- addresses: [10.180.0.1]\n  nodeName: test-node\n---\napiVersion: v1\nkind: Service\nmetadata: {name: ui, namespace: front}\nspec:\n  clusterIP: 172.30.0.45\n  ports: [{name: http, port: 8080, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: ui-1\n  namespace: front\n  labels: {kubernetes.io/service-name: ui}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n- addresses: [10.0.0.2]\n  nodeName: test-node\n  targetRef: {kind: Pod, namespace: front, name: ui-5f6d7-abcde}\n";

/// `verdict run` on the manifests in `dir` as the test node, and `extra`.
fn run_flags(dir: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["run".to_owned()];
    a.extend(node_flags(dir));
    a.extend(
        ["--min-sync-period", "0s"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    a
}

/// The test bed with the web pod and the client, and the manifests in a
/// scratch directory of `tag`.
fn shop(tag: &str) -> Option<(TestBed, std::path::PathBuf)> {
    let mut bed = bed()?;
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir(tag);
    write(&dir, "cluster.yaml", MANIFESTS);
    Some((bed, dir))
}

/// Whether a socket in the node listens to conntrack's new or destroyed
/// connections (netfilter's groups 1 and 3, in `/proc/net/netlink`).
fn conntrack_listened(bed: &TestBed) -> bool {
    let table = bed.node.exec("cat", &["/proc/net/netlink"]).unwrap();
    table.lines().skip(1).any(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        cols.get(1) == Some(&"12")
            && cols
                .get(3)
                .and_then(|g| u32::from_str_radix(g, 16).ok())
                .is_some_and(|g| g & 0b101 != 0)
    })
}

fn body(response: &str) -> Json {
    let (_, body) = response.split_once("\r\n\r\n").expect(response);
    serde_json::from_str(body).expect(body)
}

fn of<'a>(flows: &'a [Json], service: &str, verdict: &str) -> Vec<&'a Json> {
    flows
        .iter()
        .filter(|f| f["service"] == service && f["verdict"] == verdict)
        .collect()
}

#[test]
fn each_connection_is_one_flow_with_its_endpoint_or_its_reason() {
    let Some((bed, dir)) = shop("flows") else {
        return;
    };
    let log = dir.join("verdict.log");
    let flow_log = dir.join("flows.jsonl");
    let dir_s = dir.to_string_lossy().into_owned();
    let flow_log_s = flow_log.to_string_lossy().into_owned();
    let _daemon = spawn_verdict(
        &bed,
        run_flags(&dir_s, &["--flows", "--flow-log", &flow_log_s]),
        &log,
        None,
    );
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The connections wait_for made are flows too: count from here.
    std::thread::sleep(Duration::from_millis(1200));
    let before = body(&http_on(&bed, 10249, "/api/v1/flows?limit=5000"));
    let after = before["last_seq"].as_u64().unwrap();

    let client = ip("10.0.0.2");
    for _ in 0..50 {
        let line = bed
            .connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
        assert!(line.contains("10.180.0.1:80"), "{line}");
    }
    for _ in 0..20 {
        // Refused at once (a reset): nothing answers.
        let _ = bed.connect(client, ip("172.30.0.43"), "tcp", 80, 1000);
    }
    for _ in 0..10 {
        // Dropped: the client sends its SYN again after a second, and
        // gives up after 1.5 s.
        let _ = bed.connect(client, ip("198.51.100.44"), "tcp", 80, 1500);
    }
    // Every flow is there within a second of its connection.
    std::thread::sleep(Duration::from_secs(1));
    let answer = body(&http_on(
        &bed,
        10249,
        &format!("/api/v1/flows?limit=5000&after={after}"),
    ));
    let flows = answer["flows"].as_array().unwrap();

    let forwarded = of(flows, "shop/web", "forwarded");
    assert_eq!(forwarded.len(), 50, "{answer:#}");
    let ports: std::collections::BTreeSet<&str> = forwarded
        .iter()
        .map(|f| f["client"].as_str().unwrap())
        .collect();
    assert_eq!(ports.len(), 50, "each connection once");
    for f in &forwarded {
        assert_eq!(f["endpoint"], "10.180.0.1:80", "{f}");
        assert_eq!(f["pod"], "web-7d4b9c-x2x9q", "{f}");
        // The client: a pod the node's EndpointSlices name.
        assert_eq!(f["client_pod"], "front/ui-5f6d7-abcde", "{f}");
        assert_eq!(f["entry"], "ClusterIP", "{f}");
        assert_eq!(f["destination"], "172.30.0.41:80", "{f}");
    }
    let rejected = of(flows, "shop/empty", "rejected");
    assert_eq!(rejected.len(), 20, "{answer:#}");
    assert!(rejected.iter().all(|f| f["reason"] == "no endpoints"));
    let dropped = of(flows, "shop/guarded", "dropped");
    assert_eq!(
        dropped.len(),
        10,
        "one flow per connect, not per SYN: {answer:#}"
    );
    assert!(
        dropped
            .iter()
            .all(|f| f["reason"] == "source outside loadBalancerSourceRanges"
                && f["entry"] == "LoadBalancer")
    );
    assert_eq!(flows.len(), 80, "nothing else: {answer:#}");

    // `verdict flows` against the running node, with filters.
    let out = bed
        .node
        .exec(
            env!("CARGO_BIN_EXE_verdict"),
            &[
                "flows",
                "--verdict",
                "rejected",
                "--since",
                "1m",
                "-o",
                "json",
            ],
        )
        .unwrap();
    let page: Json = serde_json::from_str(&out).expect(&out);
    let listed = page["flows"].as_array().unwrap();
    assert_eq!(listed.len(), 20, "{out}");
    assert!(listed.iter().all(|f| f["verdict"] == "rejected"));
    let text = bed
        .node
        .exec(
            env!("CARGO_BIN_EXE_verdict"),
            &["flows", "shop/guarded", "--ip", "10.0.0.2"],
        )
        .unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("source outside loadBalancerSourceRanges"))
            .count(),
        10,
        "{text}"
    );

    // `verdict flows --follow`: the page, then each new flow as it comes,
    // the filter applied to both.
    let mut follower = bed
        .node
        .spawn(
            env!("CARGO_BIN_EXE_verdict"),
            &["flows", "--follow", "--service", "shop/empty", "-o", "json"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    for _ in 0..5 {
        let _ = bed.connect(client, ip("172.30.0.43"), "tcp", 80, 1000);
        bed.connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    follower.kill().unwrap();
    let out = follower.wait_with_output().unwrap();
    let followed: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    assert!(
        followed.iter().all(|f| f["service"] == "shop/empty"),
        "{followed:#?}"
    );
    let seqs: Vec<u64> = followed
        .iter()
        .map(|f| f["seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "oldest first, once each: {seqs:?}"
    );
    assert_eq!(
        followed.len(),
        25,
        "the 20 of the page and the 5 followed: {followed:#?}"
    );

    // The web view, in a real browser: the flow view with its filters, and
    // the link to it from the Service's page.
    if let Some(browser) = chromium() {
        let ui = "http://127.0.0.1:10249/ui";
        let page = browse(
            &bed,
            &browser,
            &format!("{ui}#/flows?service=shop%2Fguarded&verdict=dropped&ip=10.0.0.2"),
            None,
        );
        let rows = page
            .matches("data-verdict=\"dropped\" data-service=\"shop/guarded\"")
            .count();
        assert_eq!(rows, 10, "{page}");
        // (The page's script holds the row's template: count real rows.)
        for other in [
            "data-verdict=\"forwarded\"",
            "data-verdict=\"rejected\"",
            "data-service=\"shop/web\"",
            "data-service=\"shop/empty\"",
        ] {
            assert!(!page.contains(other), "{other}: {page}");
        }
        assert!(
            page.contains("source outside loadBalancerSourceRanges"),
            "{page}"
        );
        let all = browse(
            &bed,
            &browser,
            &format!("{ui}#/flows?service=shop%2Fweb"),
            None,
        );
        assert!(all.contains("web-7d4b9c-x2x9q"), "the pod: {all}");
        assert!(
            all.contains("data-client-pod=\"\">(front/ui-5f6d7-abcde)"),
            "the client's pod: {all}"
        );
        assert!(all.contains("data-verdict=\"forwarded\""), "{all}");
        assert!(!all.contains("data-service=\"shop/empty\""), "{all}");
        let svc = browse(&bed, &browser, &format!("{ui}#/service/shop/guarded"), None);
        assert!(
            svc.contains("id=\"service-flows\"")
                && svc.contains("href=\"#/flows?service=shop%2Fguarded\""),
            "{svc}"
        );
        let shots = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        let shot = shots.join("flows.png");
        browse(&bed, &browser, &format!("{ui}#/flows"), Some(&shot));
        let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "{}: {size} bytes", shot.display());
        println!("screenshot: {}", shot.display());
    }

    // The flow log: every flow recorded, forwarded ones again as they close.
    let lines = std::fs::read_to_string(&flow_log).unwrap();
    let logged: Vec<Json> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let new_ones = logged
        .iter()
        .filter(|f| f["seq"].as_u64().unwrap() > after && f["open"] != false)
        .count();
    assert!(new_ones >= 50, "{lines}");
    assert!(
        logged
            .iter()
            .filter(|f| f["seq"].as_u64().unwrap() > after)
            .all(|f| f["client_pod"] == "front/ui-5f6d7-abcde"),
        "the client's pod in every line: {lines}"
    );
    assert!(
        logged
            .iter()
            .any(|f| f["verdict"] == "dropped" && f["service"] == "shop/guarded")
    );
    let metrics = http_on(&bed, 10249, "/metrics");
    assert!(
        sample(
            &metrics,
            "verdict_flows_recorded_total{verdict=\"rejected\"}"
        )
        .is_some_and(|v| v >= 20.0),
        "{metrics}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_stream_is_on_by_default_following_connections_once_asked_and_a_log_group_held_elsewhere_turns_it_off_or_stops_an_explicit_one()
 {
    let Some((bed, dir)) = shop("flows-default") else {
        return;
    };
    let dir_s = dir.to_string_lossy().into_owned();
    let flags = |extra: &[&str]| run_flags(&dir_s, extra);
    let client = ip("10.0.0.2");

    // No flag: the stream is on. Rejected connections are recorded from
    // start; forwarded ones only once a reader asks for flows: until
    // then no socket in the node listens to conntrack's events, so the
    // kernel builds no report in any connection's path.
    let log = dir.join("default.log");
    let daemon = spawn_verdict(&bed, flags(&[]), &log, None);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        !conntrack_listened(&bed),
        "a socket listens before any reader asked"
    );
    let _ = bed.connect(client, ip("172.30.0.43"), "tcp", 80, 1000);
    std::thread::sleep(Duration::from_millis(800));
    let answer = body(&http_on(&bed, 10249, "/api/v1/flows?limit=5000"));
    let flows = answer["flows"].as_array().unwrap();
    assert_eq!(answer["on_demand"], true, "{answer:#}");
    assert!(answer["following_since"].is_null(), "{answer:#}");
    assert!(of(flows, "shop/web", "forwarded").is_empty(), "{answer:#}");
    assert_eq!(of(flows, "shop/empty", "rejected").len(), 1, "{answer:#}");
    // The ask made the recorder follow connections within a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut since = Json::Null;
    while since.is_null() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        since = body(&http_on(&bed, 10249, "/api/v1/flows?limit=1"))["following_since"].clone();
    }
    assert!(since.is_string(), "never followed connections");
    assert!(
        conntrack_listened(&bed),
        "no socket listens to conntrack's events"
    );
    assert_eq!(who(&bed), "10.180.0.1:80");
    std::thread::sleep(Duration::from_millis(800));
    let answer = body(&http_on(&bed, 10249, "/api/v1/flows?limit=5000"));
    let flows = answer["flows"].as_array().unwrap();
    assert_eq!(of(flows, "shop/web", "forwarded").len(), 1, "{answer:#}");
    drop(daemon);

    // Another program holds the log group.
    let mut holder = bed
        .node
        .spawn(&verdict_e2e_echo(), &["hold-log-group", "7331"])
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "ready");
    // Asked for: verdict stops at start, saying why.
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let mut asked = vec![verdict.to_owned()];
    asked.extend(flags(&["--flows"]));
    let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
    let mut with_timeout = vec!["20"];
    with_timeout.extend(asked);
    let refused = bed.node.exec("timeout", &with_timeout);
    let why = refused.expect_err("verdict --flows ran with its log group held elsewhere");
    assert!(why.0.contains("flow stream"), "{}", why.0);
    // By default: verdict runs without the stream, and its rules log
    // nothing to a group another program reads.
    let log = dir.join("held.log");
    let _daemon = spawn_verdict(&bed, flags(&["-v=2"]), &log, None);
    // (The last one's rules are still there: wait for this one's sync.)
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut text = String::new();
    while !text.contains("synced") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    assert!(text.contains("the flow stream is off"), "{text}");
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let off = http_on(&bed, 10249, "/api/v1/flows");
    assert!(off.starts_with("HTTP/1.1 404"), "{off}");
    let table = bed
        .node
        .exec("nft", &["list", "table", "ip", "verdict"])
        .unwrap();
    assert!(!table.contains("log prefix"), "{table}");
    let _ = holder.kill();
    let _ = holder.wait();
    std::fs::remove_dir_all(&dir).ok();
}

/// `verdict flows` as a command line should behave: a Service it does not
/// know is an error; text has a header, `-o wide` more columns, `-o yaml`
/// YAML; a follower whose reader goes away ends quietly, and one whose
/// verdict restarts says so and follows the new stream.
#[test]
fn the_flows_command_behaves_in_a_pipeline_and_across_a_restart() {
    let Some((bed, dir)) = shop("flows-cli") else {
        return;
    };
    let dir_s = dir.to_string_lossy().into_owned();
    let log = dir.join("verdict.log");
    let daemon = spawn_verdict(&bed, run_flags(&dir_s, &["--flows"]), &log, None);
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let client = ip("10.0.0.2");
    let verdict = env!("CARGO_BIN_EXE_verdict");
    let run = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", bed.node.name(), verdict])
            .args(args)
            .output()
            .unwrap()
    };
    // An unknown Service: an error, not an empty page.
    let nope = run(&["flows", "--service", "shop/nope"]);
    assert!(!nope.status.success(), "{nope:?}");
    let said = String::from_utf8_lossy(&nope.stderr);
    assert!(
        said.contains("no Service shop/nope is known to verdict"),
        "{said}"
    );
    // A known Service without flows: an empty page, and success.
    let quiet = run(&["flows", "--service", "shop/guarded"]);
    assert!(quiet.status.success(), "{quiet:?}");

    for _ in 0..3 {
        bed.connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(800));
    let text = String::from_utf8(run(&["flows", "--service", "shop/web"]).stdout).unwrap();
    assert!(text.starts_with("FIRST SEEN"), "a header line: {text}");
    assert!(text.contains(" (front/ui-5f6d7-abcde) → "), "{text}");
    let wide =
        String::from_utf8(run(&["flows", "--service", "shop/web", "-o", "wide"]).stdout).unwrap();
    assert!(wide.lines().next().unwrap().contains("POD"), "{wide}");
    assert!(
        wide.contains("web-7d4b9c-x2x9q") && wide.contains("ClusterIP"),
        "{wide}"
    );
    let yaml =
        String::from_utf8(run(&["flows", "--service", "shop/web", "-o", "yaml"]).stdout).unwrap();
    let doc: Json = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
    assert!(
        doc["flows"].as_array().is_some_and(|f| f.len() >= 3),
        "{yaml}"
    );

    // A follower piped into a reader that stops after one line.
    let mut head = std::process::Command::new("ip")
        .args(["netns", "exec", bed.node.name(), verdict])
        .args(["flows", "--follow", "--service", "shop/web"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(head.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    drop(head.stdout.take());
    // The next flows reach a closed pipe.
    for _ in 0..3 {
        bed.connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
    }
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = head.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the follower goes on"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(head.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("panicked"), "{err}");

    // A follower across a restart of verdict.
    let mut follower = std::process::Command::new("ip")
        .args(["netns", "exec", bed.node.name(), verdict])
        .args(["flows", "--follow", "--service", "shop/web", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    drop(daemon);
    std::thread::sleep(Duration::from_secs(2));
    let _daemon = spawn_verdict(
        &bed,
        run_flags(&dir_s, &["--flows"]),
        &dir.join("verdict2.log"),
        None,
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..2 {
        bed.connect(client, ip("172.30.0.41"), "tcp", 80, 1000)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    follower.kill().unwrap();
    let out = follower.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lost verdict at"), "{err}");
    assert!(err.contains("verdict restarted"), "{err}");
    let followed: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    // The new process's flows, numbered from 1 again, are followed.
    assert!(
        followed
            .windows(2)
            .any(|w| w[1]["seq"].as_u64() < w[0]["seq"].as_u64()),
        "no flow of the new stream: {followed:#?}\n{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A flood of one client (a new UDP socket per datagram, as fast as it
/// can) at a port a Service does not have and at a Service without
/// endpoints: every connection is counted, the kernel logs what its rate
/// allows and counts the rest, the refusals recorded before the flood are
/// all still listed, the flood is two aggregated records with their
/// counts, and the flow log stays small. (`verdict-bench flood` measures
/// the same for 10 s, with RSS and /livez: docs/flows.md.)
#[test]
fn a_flood_is_counted_folded_and_wipes_nothing() {
    let Some((mut bed, dir)) = shop("flows-flood") else {
        return;
    };
    bed.add_pod(ip("10.0.0.3"), Placement::Local, &[], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.66"), Placement::Local, &[], &[])
        .unwrap();
    // A UDP Service without endpoints.
    write(
        &dir,
        "quiet.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: quiet, namespace: shop}\nspec:\n  clusterIP: 172.30.0.45\n  ports: [{name: dns, port: 53, protocol: UDP}]\n",
    );
    let log = dir.join("verdict.log");
    let flow_log = dir.join("flows.jsonl");
    let dir_s = dir.to_string_lossy().into_owned();
    let flow_log_s = flow_log.to_string_lossy().into_owned();
    let _daemon = spawn_verdict(
        &bed,
        run_flags(
            &dir_s,
            &["--flow-log", &flow_log_s, "--flow-log-max-size", "1"],
        ),
        &log,
        None,
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    // Two clients refused before the flood.
    for client in ["10.0.0.2", "10.0.0.3"] {
        let _ = bed.connect(ip(client), ip("172.30.0.43"), "tcp", 80, 500);
    }
    std::thread::sleep(Duration::from_millis(1200));
    let metrics = |bed: &TestBed| http_on(bed, 10249, "/metrics");
    let count = |m: &str, series: &str| sample(m, series).unwrap_or(-1.0);
    const INVALID: &str = "verdict_rejected_total{ip_family=\"IPv4\",reason=\"invalid_port\"}";
    const EMPTY: &str = "verdict_rejected_total{ip_family=\"IPv4\",reason=\"no_endpoints\"}";
    const NOT_LOGGED: &str = "verdict_flows_not_recorded_total{reason=\"log_rate_limit\"}";
    std::thread::sleep(Duration::from_secs(5)); // past the counters' cache
    let before = metrics(&bed);
    let log_before = std::fs::metadata(&flow_log).map(|m| m.len()).unwrap();

    // Two floods at once from one client, 3 s each.
    let flooder = ip("10.0.0.66");
    let (sent_a, sent_b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            bed.send_udp(
                flooder,
                ip("172.30.0.41"),
                9999,
                verdict_e2e::bed::How::Flood { seconds: 3 },
            )
        });
        let b = s.spawn(|| {
            bed.send_udp(
                flooder,
                ip("172.30.0.45"),
                53,
                verdict_e2e::bed::How::Flood { seconds: 3 },
            )
        });
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    println!("sent {sent_a:?} and {sent_b:?} (datagrams, sockets)");
    std::thread::sleep(Duration::from_secs(6)); // past the counters' cache
    let after = metrics(&bed);
    let counted = |series: &str| count(&after, series) - count(&before, series);
    let (invalid, empty, not_logged) = (counted(INVALID), counted(EMPTY), counted(NOT_LOGGED));
    println!("counted {invalid} invalid_port, {empty} no_endpoints, {not_logged} not logged");
    // Each connection once (a port reused within 3 minutes is the same
    // connection), far more than the log's rate lets through in 3 s.
    assert!(invalid > 2000.0 && empty > 2000.0, "{invalid} {empty}");
    assert!(
        invalid <= sent_a.0 as f64 && empty <= sent_b.0 as f64,
        "{invalid} {empty}"
    );
    assert!(
        not_logged > (invalid + empty) / 2.0,
        "{not_logged} of {} not logged",
        invalid + empty
    );
    // The refusals before the flood are all still listed.
    let rejected = body(&http_on(
        &bed,
        10249,
        "/api/v1/flows?verdict=rejected&limit=5000",
    ));
    for client in ["10.0.0.2:", "10.0.0.3:"] {
        assert!(
            rejected["flows"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["client"].as_str().unwrap().starts_with(client)),
            "{client} is gone: {rejected:#}"
        );
    }
    // The flood is two aggregated records, one per destination, each
    // with the connections the stream saw.
    let agg = body(&http_on(
        &bed,
        10249,
        "/api/v1/flows?aggregated=1&ip=10.0.0.66",
    ));
    let records = agg["aggregates"].as_array().unwrap();
    let destinations: std::collections::BTreeSet<&str> = records
        .iter()
        .map(|a| a["destination"].as_str().unwrap())
        .collect();
    assert_eq!(
        destinations,
        ["172.30.0.41:9999", "172.30.0.45:53"].into(),
        "{agg:#}"
    );
    for a in records {
        let n = a["connections"].as_u64().unwrap();
        assert!(n >= 400, "at least the kernel's burst: {a}");
        assert_eq!(a["client"], "10.0.0.66");
    }
    // The flow log holds what was logged, a line each or folded: far
    // less than a line per datagram, and within its cap.
    let log_after = std::fs::metadata(&flow_log).map(|m| m.len()).unwrap();
    println!("flow log {log_before} -> {log_after} bytes");
    assert!(log_after <= 1024 * 1024, "{log_after} bytes");
    assert!(
        log_after - log_before < 400 * (sent_a.0 + sent_b.0) / 100,
        "{} bytes for {} datagrams",
        log_after - log_before,
        sent_a.0 + sent_b.0
    );
}
