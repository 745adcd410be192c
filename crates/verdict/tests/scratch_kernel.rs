//! verdict in a root directory that holds nothing but the binary, the
//! shared libraries it links, `/proc`, `/sys` and `/dev`: what a
//! FROM-scratch image holds, with no program beside verdict and no PATH.
//! It programs the node (real traffic through a Service, in the test
//! bed's namespaces), and `plan`, `explain`, `trace --live`, `doctor` and
//! `cleanup` do their work. CI runs it on the release binary
//! (`VERDICT_SCRATCH_BIN`); `cargo test` on the debug one. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bed, ip, scratch_dir, wait_for, write};
use serde_json::Value as Json;
use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::Process;

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  clusterIP: 172.30.0.41\n  ports: [{name: http, port: 80, protocol: TCP}]\n";
const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: test-node}\nstatus:\n  addresses: [{type: InternalIP, address: 192.168.0.2}]\n";
const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints:\n- {addresses: [10.180.0.1], nodeName: test-node}\n";

/// The binary under test: the release one in CI, else the test build's.
fn binary() -> PathBuf {
    std::env::var_os("VERDICT_SCRATCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_verdict")))
}

/// The shared libraries `bin` links, with the dynamic loader, as `ldd`
/// names them (none for a static binary).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// A root directory with the binary at `/verdict`, its libraries where
/// the loader looks for them, empty `/proc`, `/sys` and `/dev` to mount
/// over, and the manifests at `/manifests`.
fn make_root() -> PathBuf {
    let root = scratch_dir("scratch-root");
    let bin = binary();
    std::fs::copy(&bin, root.join("verdict")).unwrap();
    for lib in libraries(&bin) {
        let to = root.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&lib, &to).unwrap();
    }
    for d in ["proc", "sys", "dev", "manifests"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let m = root.join("manifests");
    write(&m, "service.yaml", SERVICE);
    write(&m, "node.yaml", NODE);
    write(&m, "slice.yaml", SLICE);
    root
}

/// `verdict ARGS` chrooted into `root` inside the node's namespace, with
/// an empty environment: `/proc`, `/sys` and `/dev` are mounted in a mount
/// namespace of the command's own, gone when it ends.
fn in_root(bed: &TestBed, root: &Path, args: &[&str]) -> Command {
    let r = root.display().to_string();
    // `env -i` empties the environment, PATH with it: chroot is named by
    // its path on the host.
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot", "/sbin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chroot (coreutils)");
    let script = format!(
        "mount --rbind /proc {r}/proc && mount --rbind /sys {r}/sys && mount --rbind /dev {r}/dev && exec env -i {chroot} {r} /verdict \"$@\""
    );
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", bed.node.name()])
        .args(["unshare", "--mount", "--propagation", "private", "--"])
        .args(["/bin/sh", "-c", &script, "sh"])
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// Runs `verdict ARGS` in the root and returns its exit code and output.
fn run_in_root(bed: &TestBed, root: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = in_root(bed, root, args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A test bed with the Service's endpoint and a client pod.
fn web_bed() -> Option<TestBed> {
    let mut bed = bed()?;
    bed.add_pod(ip("10.180.0.1"), Placement::Local, &[80], &[])
        .unwrap();
    bed.add_pod(ip("10.0.0.2"), Placement::Local, &[], &[])
        .unwrap();
    Some(bed)
}

#[test]
fn verdict_runs_from_a_root_that_holds_only_itself() {
    let Some(bed) = web_bed() else {
        return;
    };
    let root = make_root();
    // Nothing but verdict and its libraries: no shell, no ip, no nft.
    let programs: Vec<String> = walk(&root)
        .into_iter()
        .filter(|p| {
            std::fs::metadata(p)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                .unwrap_or(false)
                && !p.to_string_lossy().contains(".so")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        programs,
        [root.join("verdict").display().to_string()],
        "the root holds another program"
    );

    let log = root.with_extension("log");
    let _daemon = Process(
        in_root(
            &bed,
            &root,
            &[
                "run",
                "--manifests",
                "/manifests",
                "--hostname-override",
                "test-node",
                "--cluster-cidr",
                "10.0.0.0/8",
                "--healthz-bind-address",
                "127.0.0.1:10256",
                "--metrics-bind-address",
                "127.0.0.1:10249",
            ],
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap(),
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        text()
    );
    // The node's addresses were read (the NodePort addresses follow them)
    // without `ip`.
    let t = Instant::now();
    while !text().contains("node facts") {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", text());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(text().contains("192.168.0.2"), "{}", text());
    for missing in ["No such file or directory", "not installed", "cannot run"] {
        assert!(!text().contains(missing), "{missing}:\n{}", text());
    }

    // plan, explain, trace --live and doctor, from the same root.
    let (code, script, err) = run_in_root(
        &bed,
        &root,
        &[
            "plan",
            "--manifests",
            "/manifests",
            "--hostname-override",
            "test-node",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(script.contains("table ip verdict"), "{script}");
    let (code, out, err) = run_in_root(&bed, &root, &["explain", "demo/web", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let doc: Json = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["found"], true, "{doc:#}");
    assert_eq!(doc["drift"]["missing"], 0, "{doc:#}");
    let (code, out, err) = run_in_root(
        &bed,
        &root,
        &[
            "trace",
            "--from",
            "node",
            "--src",
            "192.168.0.2",
            "--dst",
            "172.30.0.41",
            "--proto",
            "tcp",
            "--dport",
            "80",
            "--live",
            "-o",
            "json",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let doc: Json = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["live"]["agree"], true, "{:#}", doc["live"]);
    assert_eq!(doc["live"]["kernel"]["dnat"], "10.180.0.1:80");
    let (_, out, err) = run_in_root(
        &bed,
        &root,
        &[
            "doctor",
            "--manifests",
            "/manifests",
            "--hostname-override",
            "test-node",
            "-o",
            "json",
        ],
    );
    let doc: Json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let checks = doc["checks"].as_array().unwrap();
    let check = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {doc:#}"))
    };
    assert_eq!(
        check("kube-proxy's nftables table")["status"],
        "pass",
        "{doc:#}"
    );
    assert_eq!(check("other NAT chains")["status"], "pass", "{doc:#}");
    assert!(
        !out.contains("not installed") && !out.contains("install nftables"),
        "{doc:#}"
    );

    // cleanup, from the root, removes verdict's tables.
    drop(_daemon);
    let (code, _, err) = run_in_root(&bed, &root, &["cleanup"]);
    assert_eq!(code, Some(0), "{err}");
    let tables = bed.node.exec("nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("verdict"), "{tables}");
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&log);
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The unprivileged variant's claim (deploy/components/unprivileged):
/// CAP_NET_ADMIN is the one capability `verdict run` needs. Every other
/// capability is dropped from the bounding set before it starts.
#[test]
fn verdict_runs_with_cap_net_admin_alone() {
    let Some(bed) = web_bed() else {
        return;
    };
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("setpriv (util-linux)");
    let dir = scratch_dir("net-admin-only");
    write(&dir, "service.yaml", SERVICE);
    write(&dir, "node.yaml", NODE);
    write(&dir, "slice.yaml", SLICE);
    let log = dir.join("verdict.log");
    let dir_s = dir.display().to_string();
    let _daemon = Process(
        Command::new("ip")
            .args(["netns", "exec", bed.node.name(), setpriv])
            .args([
                "--bounding-set=-all,+net_admin",
                "--inh-caps=-all,+net_admin",
                "--ambient-caps=-all,+net_admin",
                "--",
            ])
            .arg(binary())
            .args([
                "run",
                "--manifests",
                &dir_s,
                "--hostname-override",
                "test-node",
                "--cluster-cidr",
                "10.0.0.0/8",
                "--healthz-bind-address",
                "127.0.0.1:10256",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        wait_for(&bed, "10.180.0.1:80"),
        "10.180.0.1:80",
        "{}",
        text()
    );
    // It held nothing else (`ip netns exec` and setpriv exec verdict in
    // the process spawned): CAP_NET_ADMIN is bit 12.
    let status = std::fs::read_to_string(format!("/proc/{}/status", _daemon.0.id())).unwrap();
    let caps = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap()
    };
    assert!(status.contains("Name:\tverdict"), "{status}");
    assert_eq!(caps("CapBnd:"), 1 << 12, "{status}");
    assert_eq!(caps("CapEff:"), 1 << 12, "{status}");
    assert!(
        text().contains("cannot set the OOM score"),
        "the OOM score needs CAP_SYS_RESOURCE, and only that is given up:\n{}",
        text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
