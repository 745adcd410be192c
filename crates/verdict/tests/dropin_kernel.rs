//! An operator's own kube-proxy setup, unchanged, with the real `verdict`
//! binary in a network-namespace test bed: kubeadm's generated
//! `KubeProxyConfiguration` and the flag sets k3s and RKE2 pass start
//! verdict, bind kube-proxy's ports and program traffic; a node that ran
//! kube-proxy in nftables mode is migrated (its stale table does not win);
//! NodePorts follow the node's addresses; a changed `--config` file makes
//! verdict exit, as kube-proxy does; and `bindAddressHardFail` makes a
//! busy port fatal. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

use std::io::Read;
use std::time::{Duration, Instant};

use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  type: NodePort\n  clusterIP: 172.30.0.41\n  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]\n";

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: test-node}\nstatus:\n  addresses: [{type: InternalIP, address: 192.168.0.2}]\n";

fn slice(endpoint: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{{name: http, port: 80, protocol: TCP}}]\nendpoints:\n- {{addresses: [{endpoint}], nodeName: test-node}}\n"
    )
}

/// What kubeadm writes for kube-proxy (its zero values), in nftables mode,
/// with the bed's pod network.
fn kubeadm() -> String {
    include_str!("fixtures/kubeadm-config.conf")
        .replace("clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.0.0.0/8")
}

/// A bed with two endpoints pods and a client pod, and manifests for the
/// NodePort service on the first endpoint.
fn setup(tag: &str) -> Option<(TestBed, std::path::PathBuf)> {
    let mut bed = bed()?;
    for ip in ["10.180.0.1", "10.180.0.2"] {
        bed.add_pod(common::ip(ip), Placement::Local, &[80], &[])
            .unwrap();
    }
    bed.add_pod(common::ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    let dir = scratch_dir(tag);
    write(&dir, "service.yaml", SERVICE);
    write(&dir, "slice.yaml", &slice("10.180.0.1"));
    write(&dir, "node.yaml", NODE);
    Some((bed, dir))
}

/// kubeadm's configuration as `config.conf`, and the manifests moved into
/// a folder of their own beside it (so that editing one is not an edit of
/// the other): their paths.
fn kubeadm_layout(dir: &std::path::Path) -> (String, String) {
    let config = dir.join("config.conf");
    std::fs::write(&config, kubeadm()).unwrap();
    let m = dir.join("m");
    std::fs::create_dir_all(&m).unwrap();
    for f in ["service.yaml", "slice.yaml", "node.yaml"] {
        std::fs::rename(dir.join(f), m.join(f)).unwrap();
    }
    (
        config.to_string_lossy().into_owned(),
        m.to_string_lossy().into_owned(),
    )
}

fn start(bed: &TestBed, args: &[&str]) -> Process {
    Process(bed.node.spawn(env!("CARGO_BIN_EXE_verdict"), args).unwrap())
}

/// Stops verdict and returns what it logged.
fn stop(mut daemon: Process) -> String {
    let _ = daemon.0.kill();
    let _ = daemon.0.wait();
    let mut log = String::new();
    if let Some(mut e) = daemon.0.stderr.take() {
        let _ = e.read_to_string(&mut log);
    }
    log
}

/// Warnings in a log other than this machine's: the conntrack limit (not
/// settable outside the host's namespace), the OOM score (where the
/// sandbox withholds CAP_SYS_RESOURCE) and an nft that cannot record IPv6
/// session affinity.
fn unexpected_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.starts_with('W') || l.starts_with('E'))
        .filter(|l| {
            !l.contains("nf_conntrack_max")
                && !l.contains("session affinity")
                && !l.contains("cannot set the OOM score")
        })
        .collect()
}

/// Polls `check` for up to `within`.
fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `promtool check metrics` on a scrape, where promtool is installed (CI
/// installs it; `VERDICT_REQUIRE_PROMTOOL=1` makes its absence a failure).
/// The one finding allowed is kube-proxy's own: a gauge named `_total`.
fn promtool_accepts(bed: &TestBed, metrics: &str) {
    if verdict_e2e::netns::run("promtool", &["--version"]).is_err() {
        assert!(
            std::env::var_os("VERDICT_REQUIRE_PROMTOOL").is_none(),
            "promtool is not installed"
        );
        println!("promtool is not installed: /metrics not checked");
        return;
    }
    let body = metrics.split_once("\r\n\r\n").map_or(metrics, |(_, b)| b);
    let file = std::env::temp_dir().join(format!("verdict-metrics-{}.txt", std::process::id()));
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", file.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let findings: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.contains("kubeproxy_sync_proxy_rules_no_local_endpoints_total non-counter metrics should not have \"_total\" suffix"))
        .collect();
    assert!(
        matches!(out.status.code(), Some(0) | Some(3)) && findings.is_empty(),
        "promtool check metrics: {:?}\n{said}",
        out.status.code()
    );
    let _ = bed;
}

#[test]
fn kubeadms_configuration_runs_unchanged() {
    let Some((bed, dir)) = setup("kubeadm") else {
        return;
    };
    let (c, manifests) = kubeadm_layout(&dir);
    let daemon = start(
        &bed,
        &[
            "--config",
            &c,
            "--hostname-override=test-node",
            "--manifests",
            &manifests,
        ],
    );
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "programmed"
    );
    // kube-proxy's ports, from kubeadm's empty addresses.
    let healthz = http_at(&bed, "192.168.0.2", 10256, "/healthz");
    assert!(
        healthz.starts_with("HTTP/1.1 200"),
        "0.0.0.0:10256: {healthz}"
    );
    let metrics = http_on(&bed, 10249, "/metrics");
    assert!(
        metrics.starts_with("HTTP/1.1 200"),
        "127.0.0.1:10249: {metrics}"
    );
    assert!(
        !http_at(&bed, "192.168.0.2", 10249, "/metrics").starts_with("HTTP/1.1 200"),
        "metrics stay on loopback"
    );
    for family in [
        "kubernetes_build_info{",
        "kubernetes_feature_enabled{",
        "process_resident_memory_bytes ",
        "process_start_time_seconds ",
    ] {
        assert!(metrics.contains(family), "{family}\n{metrics}");
    }
    promtool_accepts(&bed, &metrics);
    // The running configuration: kube-proxy's defaults filled in.
    let configz = http_on(&bed, 10249, "/configz");
    let body = configz.split_once("\r\n\r\n").unwrap().1;
    let z: serde_json::Value = serde_json::from_str(body).unwrap();
    let c = &z["kubeproxy.config.k8s.io"];
    assert_eq!(c["kind"], "KubeProxyConfiguration", "{body}");
    assert_eq!(c["nftables"]["syncPeriod"], "30s", "{body}");
    assert_eq!(c["nftables"]["minSyncPeriod"], "1s");
    assert_eq!(c["healthzBindAddress"], "0.0.0.0:10256");
    assert_eq!(c["nftables"]["masqueradeBit"], 14);
    // kube-proxy 1.36's z-pages: the flags as the command line set them
    // (what the file says is /configz's), and the process's status, in
    // text by default.
    let flagz = http_on(&bed, 10249, "/flagz");
    assert!(flagz.starts_with("HTTP/1.1 200"), "{flagz}");
    let body = flagz.split_once("\r\n\r\n").unwrap().1;
    assert!(
        body.starts_with(
            "\nkube-proxy flagz\nWarning: This endpoint is not meant to be machine parseable"
        ),
        "{body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("config") && l.ends_with("/config.conf")),
        "{body}"
    );
    assert!(
        body.lines()
            .any(|l| l.trim_end_matches([':', '=', ' ']) == "proxy-mode"),
        "the flag's own default, as kube-proxy shows it: {body}"
    );
    let statusz = http_on(&bed, 10249, "/statusz");
    let body = statusz.split_once("\r\n\r\n").unwrap().1;
    assert!(body.starts_with("\nkube-proxy statusz\n"), "{body}");
    assert!(
        body.contains("Binary version") && body.contains(env!("CARGO_PKG_VERSION")),
        "{body}"
    );
    assert!(body.contains("Emulation version"), "{body}");
    assert!(
        body.contains("/configz /flagz /healthz /metrics /proxyMode\n"),
        "{body}"
    );
    // The structured object, to who asks for it.
    let script = "exec 3<>/dev/tcp/127.0.0.1/10249 && printf 'GET /statusz HTTP/1.1\\r\\nHost: x\\r\\nAccept: application/json;v=v1beta1;g=config.k8s.io;as=Statusz\\r\\nConnection: close\\r\\n\\r\\n' >&3 && cat <&3";
    let raw = bed.node.exec("bash", &["-c", script]).unwrap();
    let body = raw.split_once("\r\n\r\n").unwrap().1;
    let z: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        (z["kind"].as_str(), z["apiVersion"].as_str()),
        (Some("Statusz"), Some("config.k8s.io/v1beta1")),
        "{body}"
    );
    assert!(z["uptimeSeconds"].as_u64().is_some(), "{body}");
    // The metrics address's own /healthz records its result as an SLI.
    assert!(http_on(&bed, 10249, "/healthz").ends_with("ok"));
    let slis = http_on(&bed, 10249, "/metrics/slis");
    assert!(
        slis.contains(
            "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"}"
        ),
        "{slis}"
    );
    assert!(http_on(&bed, 10249, "/healthz/ping").ends_with("ok"));
    // Profiling is off, as in the file.
    assert!(http_on(&bed, 10249, "/debug/pprof/").starts_with("HTTP/1.1 404"));
    let log = stop(daemon);
    assert!(
        unexpected_warnings(&log).is_empty(),
        "warnings for kubeadm's file:\n{log}"
    );
    assert!(
        log.lines()
            .next()
            .is_some_and(|l| l.contains("\"Version info\"")),
        "the version comes first:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn k3s_and_rke2_flags_run_unchanged() {
    let Some((bed, dir)) = setup("k3s") else {
        return;
    };
    let manifests = dir.to_string_lossy().into_owned();
    // k3s's embedded kube-proxy flags (its kubeconfig is unused with
    // --manifests, but must be accepted).
    let k3s = start(
        &bed,
        &[
            "--cluster-cidr=10.0.0.0/8",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-close-wait=0s",
            "--conntrack-tcp-timeout-established=0s",
            "--healthz-bind-address=127.0.0.1",
            "--hostname-override=test-node",
            "--kubeconfig=/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig",
            "--proxy-mode=nftables",
            "--manifests",
            &manifests,
        ],
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    assert!(
        http_on(&bed, 10256, "/healthz").starts_with("HTTP/1.1 200"),
        "127.0.0.1:10256"
    );
    assert!(
        !http_at(&bed, "192.168.0.2", 10256, "/healthz").starts_with("HTTP/1.1 200"),
        "health only on loopback"
    );
    let log = stop(k3s);
    assert!(unexpected_warnings(&log).is_empty(), "{log}");
    // RKE2's static pod adds metrics on every address, -v and a gate list.
    let rke2 = start(
        &bed,
        &[
            "--cluster-cidr=10.0.0.0/8",
            "--conntrack-max-per-core=0",
            "--healthz-bind-address=127.0.0.1",
            "--hostname-override=test-node",
            "--metrics-bind-address=0.0.0.0",
            "--proxy-mode=nftables",
            "--v=2",
            "--manifests",
            &manifests,
        ],
    );
    let got = eventually(Duration::from_secs(10), || {
        http_at(&bed, "192.168.0.2", 10249, "/metrics").starts_with("HTTP/1.1 200")
    });
    assert!(got, "metrics on 0.0.0.0:10249");
    // The rules of the first run are still there: wait for this run's sync.
    let synced = eventually(Duration::from_secs(10), || {
        let m = http_at(&bed, "192.168.0.2", 10249, "/metrics");
        sample(
            &m,
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
        )
        .is_some_and(|t| t > 0.0)
    });
    assert!(synced, "the RKE2 run synced");
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let log = stop(rke2);
    assert!(log.contains("\"synced\""), "-v=2 logs each sync:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A LoadBalancer whose source ranges were changed after kube-proxy
/// stopped: the client network 203.0.113.0/24 is allowed now.
const LB: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: lb, namespace: demo}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.42\n  loadBalancerSourceRanges: [203.0.113.0/24]\n  ports: [{name: http, port: 80, nodePort: 30081, protocol: TCP}]\nstatus:\n  loadBalancer: {ingress: [{ip: 198.51.100.42}]}\n";

fn lb_slice() -> String {
    slice("10.180.0.1")
        .replace("name: web-1", "name: lb-1")
        .replace("service-name: web", "service-name: lb")
}

/// kube-proxy's nftables table as its nftables mode leaves it (the shape
/// of its base chains and its LoadBalancer firewall): the LoadBalancer's
/// old source range (198.18.0.0/15), and a DNAT of the web service to an
/// endpoint that is no longer current.
const KUBE_PROXY_TABLE: &str = "table ip kube-proxy {
  chain firewall-lb {
    ip saddr != 198.18.0.0/15 drop
  }
  chain firewall-check {
    ip daddr 198.51.100.42 tcp dport 80 jump firewall-lb
  }
  chain filter-prerouting-pre-dnat {
    type filter hook prerouting priority -110; policy accept;
    ct state new jump firewall-check
  }
  chain services {
    ip daddr 172.30.0.41 tcp dport 80 dnat to 10.180.0.2:80
  }
  chain nat-prerouting {
    type nat hook prerouting priority -100; policy accept;
    jump services
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
}
table ip6 kube-proxy {
  chain nat-prerouting {
    type nat hook prerouting priority -100; policy accept;
  }
}
";

fn tables(bed: &TestBed) -> String {
    bed.node.exec("nft", &["list", "tables"]).unwrap()
}

#[test]
fn a_node_that_ran_kube_proxy_in_nftables_mode_is_migrated() {
    let Some((bed, dir)) = setup("migrate") else {
        return;
    };
    write(&dir, "lb.yaml", LB);
    write(&dir, "lb-slice.yaml", &lb_slice());
    bed.route_to_node(common::ip("198.51.100.42")).unwrap();
    let plant = || {
        let script = dir.join("kube-proxy.nft");
        std::fs::write(&script, KUBE_PROXY_TABLE).unwrap();
        bed.node
            .exec("nft", &["-f", &script.to_string_lossy()])
            .unwrap();
    };
    let lb = || {
        bed.connect(
            common::ip("203.0.113.2"),
            common::ip("198.51.100.42"),
            "tcp",
            80,
            500,
        )
        .unwrap_or_default()
    };
    plant();
    assert_eq!(who(&bed), "10.180.0.2:80", "the planted table answers");
    let manifests = dir.to_string_lossy().into_owned();
    let base = [
        "--hostname-override=test-node",
        "--cluster-cidr=10.0.0.0/8",
        "--proxy-mode=nftables",
        "--min-sync-period=0s",
        "--healthz-bind-address=",
        "--metrics-bind-address=",
        "--manifests",
        &manifests,
    ];
    let programmed = || {
        eventually(Duration::from_secs(10), || {
            bed.node
                .exec("nft", &["list", "table", "ip", "verdict"])
                .is_ok_and(|t| t.contains("172.30.0.41") && t.contains("198.51.100.42"))
        })
    };

    // Kept, kube-proxy's table still acts on Service traffic.
    let mut kept = base.to_vec();
    kept.push("--keep-kube-proxy-nftables");
    let daemon = start(&bed, &kept);
    assert!(programmed(), "verdict programmed the services");
    assert!(tables(&bed).contains("table ip kube-proxy"));
    // Its pre-DNAT firewall still drops what the new source range allows.
    let dropped = lb();
    assert!(
        !dropped.contains("10.180.0.1"),
        "the stale source range drops the client: {dropped}"
    );
    // verdict's NAT chains, registered after kube-proxy's, run first at
    // equal priority (the kernel puts the newest first)...
    assert_eq!(
        who(&bed),
        "10.180.0.1:80",
        "verdict's DNAT, registered later"
    );
    // ...but a table loaded after verdict's, as a saved ruleset restored at
    // boot would be, runs its stale DNATs first.
    bed.node
        .exec("nft", &["delete", "table", "ip", "kube-proxy"])
        .unwrap();
    plant();
    assert_eq!(
        who(&bed),
        "10.180.0.2:80",
        "the stale DNAT, registered later, wins"
    );
    stop(daemon);

    // By default it is removed at start: the new source range and the
    // current endpoint apply.
    let daemon = start(&bed, &base);
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "verdict's endpoint"
    );
    let t = tables(&bed);
    assert!(!t.contains("kube-proxy"), "{t}");
    assert!(
        eventually(Duration::from_secs(5), || lb().contains("10.180.0.1")),
        "the client in the new source range reaches the LoadBalancer"
    );
    let log = stop(daemon);
    assert!(log.contains("deleted kube-proxy's nftables table"), "{log}");

    // `verdict cleanup` removes it too (and verdict's own tables).
    plant();
    let out = bed
        .node
        .exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap_or_else(|e| e.to_string());
    let t = tables(&bed);
    assert!(
        !t.contains("kube-proxy") && !t.contains("verdict"),
        "{t}\n{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// kube-proxy's table as kube-proxy writes it when it comes back after
/// verdict (newer base chains): the web Service's current endpoint; the
/// Service `quiet` has no endpoints any more, so kube-proxy DNATs nothing
/// for it.
const KUBE_PROXY_BACK: &str = "table ip kube-proxy {
  chain services {
    ip daddr 172.30.0.41 tcp dport 80 dnat to 10.180.0.2:80
  }
  chain nat-prerouting {
    type nat hook prerouting priority -100; policy accept;
    jump services
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
}
";

/// A stand-in for kube-proxy's health server on 127.0.0.1:10256: its
/// `/healthz` body, with `lastUpdated` now.
const KUBE_PROXY_HEALTHZ: &str = r#"
import datetime, http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = json.dumps({"lastUpdated": now, "currentTime": now, "nodeEligible": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 10256), H).serve_forever()
"#;

#[test]
fn the_way_back_to_kube_proxy_keeps_every_service_answering() {
    // docs/migrate.md's way back, on a kernel: verdict stops (its rules
    // stay), kube-proxy comes back and writes its table, verdict's tables
    // are deleted by hand. `verdict cleanup` refuses while kube-proxy runs,
    // even when only its health server shows it (a container verdict
    // cannot see the processes of).
    let Some((bed, dir)) = setup("way-back") else {
        return;
    };
    write(
        &dir,
        "quiet.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: quiet, namespace: demo}\nspec:\n  clusterIP: 172.30.0.43\n  ports: [{name: http, port: 80, protocol: TCP}]\n",
    );
    write(
        &dir,
        "quiet-slice.yaml",
        &slice("10.180.0.1")
            .replace("name: web-1", "name: quiet-1")
            .replace("service-name: web", "service-name: quiet"),
    );
    let manifests = dir.to_string_lossy().into_owned();
    let daemon = start(
        &bed,
        &[
            "--hostname-override=test-node",
            "--cluster-cidr=10.0.0.0/8",
            "--min-sync-period=0s",
            "--healthz-bind-address=",
            "--metrics-bind-address=",
            "--manifests",
            &manifests,
        ],
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let quiet = || {
        bed.connect(
            common::ip("10.0.0.2"),
            common::ip("172.30.0.43"),
            "tcp",
            80,
            500,
        )
        .unwrap_or_default()
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string()
    };
    assert!(eventually(Duration::from_secs(5), || quiet() == "10.180.0.1:80"));

    // 1. verdict stops; its rules stay and keep serving.
    stop(daemon);
    assert_eq!(who(&bed), "10.180.0.1:80", "verdict's rules stay");

    // 2. kube-proxy comes back (its health server first, then its table).
    let mut health = bed
        .node
        .spawn("python3", &["-c", KUBE_PROXY_HEALTHZ])
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            bed.node
                .exec("bash", &["-c", "exec 3<>/dev/tcp/127.0.0.1/10256"])
                .is_ok()
        }),
        "the stand-in health server listens"
    );
    let script = dir.join("kube-proxy-back.nft");
    std::fs::write(&script, KUBE_PROXY_BACK).unwrap();
    bed.node
        .exec("nft", &["-f", &script.to_string_lossy()])
        .unwrap();
    // kube-proxy's chains are newer: its DNAT wins where it DNATs...
    assert_eq!(who(&bed), "10.180.0.2:80", "kube-proxy's current endpoint");
    // ...and what it leaves alone, verdict's stale rules still answer.
    assert_eq!(quiet(), "10.180.0.1:80", "verdict's stale DNAT");

    // `verdict cleanup` would delete kube-proxy's rules too: refused.
    let refused = bed
        .node
        .exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap_err()
        .to_string();
    assert!(
        refused
            .contains("kube-proxy's health server answers at 127.0.0.1:10256 and synced its rules")
            && refused.contains("nothing was changed"),
        "{refused}"
    );
    let t = tables(&bed);
    assert!(
        t.contains("table ip kube-proxy") && t.contains("table ip verdict"),
        "{t}"
    );

    // 3. verdict's tables deleted by hand, as the guide says: kube-proxy's
    // rules alone decide, the Service without endpoints is not answered.
    bed.node
        .exec("nft", &["delete", "table", "ip", "verdict"])
        .unwrap();
    let _ = bed.node.exec("nft", &["delete", "table", "ip6", "verdict"]);
    assert_eq!(who(&bed), "10.180.0.2:80");
    let after = quiet();
    assert!(
        !after.starts_with("10.180.0."),
        "no stale answer once verdict's tables are gone: {after}"
    );
    let _ = health.kill();
    let _ = health.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn node_ports_follow_the_nodes_addresses() {
    let Some((bed, dir)) = setup("addresses") else {
        return;
    };
    let manifests = dir.to_string_lossy().into_owned();
    let daemon = start(
        &bed,
        &[
            "--hostname-override=test-node",
            "--cluster-cidr=10.0.0.0/8",
            "--proxy-mode=nftables",
            "--min-sync-period=0s",
            "--nodeport-addresses=192.168.0.0/24",
            "--healthz-bind-address=",
            "--metrics-bind-address=",
            "--manifests",
            &manifests,
        ],
    );
    let node_port = |addr: &str| {
        bed.connect(
            common::ip("203.0.113.2"),
            common::ip(addr),
            "tcp",
            30080,
            500,
        )
        .unwrap_or_default()
    };
    let map = || {
        bed.node
            .exec("nft", &["list", "set", "ip", "verdict", "nodeport-ips"])
            .unwrap_or_default()
    };
    assert!(eventually(Duration::from_secs(10), || node_port(
        "192.168.0.2"
    )
    .contains("10.180.0.1")));
    assert!(!map().contains("192.168.0.77"));
    // An address outside nodePortAddresses changes nothing (no full sync).
    bed.node
        .ip(&["addr", "add", "192.168.77.5/24", "dev", "eth0", "nodad"])
        .unwrap();
    // (Given time to be seen on its own, not with the next one.)
    std::thread::sleep(Duration::from_secs(1));
    // A new address inside nodePortAddresses takes NodePorts, without a
    // restart and before the next periodic resync.
    bed.node
        .ip(&["addr", "add", "192.168.0.77/24", "dev", "eth0", "nodad"])
        .unwrap();
    let t = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || node_port("192.168.0.77")
            .contains("10.180.0.1")),
        "NodePort on the new address\n{}",
        map()
    );
    println!("new address served after {:?}", t.elapsed());
    // And one that goes away is dropped.
    bed.node
        .ip(&["addr", "del", "192.168.0.77/24", "dev", "eth0"])
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !map().contains("192.168.0.77")),
        "{}",
        map()
    );
    let log = stop(daemon);
    assert_eq!(
        log.matches("the node's addresses changed").count(),
        2,
        "the NodePort address came and went; the other one did not count\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_changed_configuration_file_restarts_verdict() {
    let Some((bed, dir)) = setup("config-watch") else {
        return;
    };
    let (c, manifests) = kubeadm_layout(&dir);
    let mut daemon = start(
        &bed,
        &[
            "--config",
            &c,
            "--hostname-override=test-node",
            "--manifests",
            &manifests,
        ],
    );
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    // As a ConfigMap update lands: a new file renamed over the old one.
    write(
        &dir,
        "config.conf",
        &kubeadm().replace(
            "masqueradeAll: false\n  masqueradeBit: null",
            "masqueradeAll: true\n  masqueradeBit: null",
        ),
    );
    let exited = eventually(Duration::from_secs(5), || {
        daemon.0.try_wait().unwrap().is_some()
    });
    assert!(exited, "verdict exits when its configuration changes");
    let status = daemon.0.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let log = stop(daemon);
    assert!(log.contains("configuration file was updated"), "{log}");
    assert_eq!(
        who(&bed),
        "10.180.0.1:80",
        "the rules stay for the next process"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bind_address_hard_fail_makes_a_busy_port_fatal() {
    let Some((mut bed, dir)) = setup("hardfail") else {
        return;
    };
    bed.serve_node(&[common::ip("127.0.0.1")], &[10256], &[])
        .unwrap();
    let manifests = dir.to_string_lossy().into_owned();
    let args = [
        "--hostname-override=test-node",
        "--cluster-cidr=10.0.0.0/8",
        "--proxy-mode=nftables",
        "--manifests",
        &manifests,
    ];
    // By default verdict keeps going and tries the port again.
    let daemon = start(&bed, &args);
    assert_eq!(wait_for(&bed, "10.180.0.1:80"), "10.180.0.1:80");
    let log = stop(daemon);
    assert!(
        log.contains("cannot serve /healthz and /livez: trying again every 5s"),
        "{log}"
    );
    // With bindAddressHardFail it stops.
    let mut hard = args.to_vec();
    hard.push("--bind-address-hard-fail");
    let out = bed
        .node
        .spawn(env!("CARGO_BIN_EXE_verdict"), &hard)
        .unwrap()
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("healthz server failed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
