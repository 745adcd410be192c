//! The binary's command line, without root: a Kubernetes source that
//! cannot be used is a clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn a_missing_kubeconfig_is_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["plan", "--hostname-override", "n1"])
        .args(["--kubeconfig", "/nonexistent/verdict-kubeconfig"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kubeconfig /nonexistent/verdict-kubeconfig"),
        "{err}"
    );
}

#[test]
fn a_master_that_is_not_a_url_is_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["plan", "--hostname-override", "n1", "--master", "not a url"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--master not a url"), "{err}");
}

fn verdict(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(args)
        .output()
        .unwrap()
}

fn example() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/cluster.yaml")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn write_config_to_writes_what_config_reads_back() {
    let file = std::env::temp_dir().join(format!("verdict-written-{}.yaml", std::process::id()));
    let path = file.to_string_lossy().into_owned();
    let out = verdict(&[
        "--write-config-to",
        &path,
        "--cluster-cidr=10.42.0.0/16",
        "--iptables-sync-period=45s",
        "--masquerade-all",
        "--proxy-mode=nftables",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    for line in [
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1",
        "kind: KubeProxyConfiguration",
        "clusterCIDR: 10.42.0.0/16",
        "syncPeriod: 45s",
        "masqueradeAll: true",
        "healthzBindAddress: 0.0.0.0:10256",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
    // The written file is a configuration verdict accepts unchanged.
    let out = verdict(&[
        "plan",
        "--config",
        &path,
        "--manifests",
        &example(),
        "--hostname-override",
        "node-a",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.lines()
            .any(|l| l.contains("lenient") || l.contains("has no effect")),
        "{err}"
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn logs_are_klogs_text_or_components_json() {
    let out = verdict(&[
        "plan",
        "--manifests",
        &example(),
        "--hostname-override",
        "node-a",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap();
    // I1201 20:43:44.450249   23407 main.rs:75] "Version info" version="v0.1.0" ...
    let b = first.as_bytes();
    assert!(
        b[0] == b'I' && b[5] == b' ' && b[8] == b':' && b[14] == b'.',
        "{first}"
    );
    assert!(
        first.contains(" main.rs:") && first.contains("] \"Version info\" version=\"v"),
        "{first}"
    );
    let out = verdict(&[
        "plan",
        "--manifests",
        &example(),
        "--hostname-override",
        "node-a",
        "--logging-format=json",
        "-v=2",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let mut levels = std::collections::BTreeSet::new();
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["ts"].as_f64().is_some_and(|t| t > 1.6e12),
            "milliseconds: {line}"
        );
        assert!(
            v["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{line}"
        );
        assert!(v["msg"].is_string(), "{line}");
        if let Some(level) = v["v"].as_u64() {
            levels.insert(level);
        }
        assert!(line.starts_with("{\"ts\":"), "ts first: {line}");
    }
    assert!(
        levels.contains(&0) && levels.contains(&2),
        "-v=2 adds V(2) lines: {levels:?}\n{err}"
    );
    // One line per object only from V(4), as kube-proxy.
    assert!(!err.contains("Service added"), "{err}");
    // One-time facts once: the missing detector once per family, not per
    // sync or per Node event.
    for family in ["IPv4", "IPv6"] {
        let n = err
            .lines()
            .filter(|l| l.contains("no local-traffic detector") && l.contains(family))
            .count();
        assert!(n <= 1, "{family}: {n}\n{err}");
    }
    let out = verdict(&[
        "plan",
        "--manifests",
        &example(),
        "--hostname-override",
        "node-a",
        "-v=4",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"Service added\""));
}

#[test]
fn usage_errors_exit_2_and_version_works_anywhere() {
    let out = verdict(&["plan", "--cleanup"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--cleanup cannot be used with `verdict plan`")
    );
    let out = verdict(&["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag: --no-such-flag"));
    let out = verdict(&["plan", "--hostname_override=x", "--version"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("verdict v"));
    let out = verdict(&["--version=raw"]);
    let raw = String::from_utf8_lossy(&out.stdout);
    assert!(
        raw.contains("gitCommit: ") && raw.contains("platform: linux/"),
        "{raw}"
    );
    let out = verdict(&["--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("--ipvs-scheduler string"));
    let out = verdict(&["--config", "/nonexistent/verdict.conf"]);
    assert_eq!(out.status.code(), Some(2));
    let out = verdict(&[
        "plan",
        "--manifests",
        &example(),
        "--hostname-override",
        "node-a",
        "--nftables-sync-period=1s",
    ]);
    assert_eq!(out.status.code(), Some(2), "not a kube-proxy flag");
}

/// An exit code and what was printed on stdout and stderr.
type Exit = (Option<i32>, String, String);

/// Runs verdict and returns its exit code and what it printed, both ways.
fn exit(args: &[&str]) -> Exit {
    let out = verdict(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_invalid_flag_or_value_exits_2_before_anything_runs() {
    let trace = |extra: &[&str]| {
        let mut a = vec![
            "trace",
            "--from",
            "pod",
            "--src",
            "10.0.0.2",
            "--dst",
            "10.96.0.10",
            "--proto",
            "tcp",
            "--dport",
            "80",
        ];
        a.extend_from_slice(extra);
        exit(&a)
    };
    // Each would otherwise try to reach a daemon on 127.0.0.1:1 and fail
    // with 1: exit 2 shows the value was refused first.
    let cases: Vec<(&str, Exit)> = vec![
        (
            "dport",
            trace(&["--dport", "http", "--server", "127.0.0.1:1"]),
        ),
        (
            "proto",
            trace(&["--proto", "icmp", "--server", "127.0.0.1:1"]),
        ),
        ("src", trace(&["--src", "pod-a", "--server", "127.0.0.1:1"])),
        ("live", trace(&["--live", "--server", "127.0.0.1:1"])),
        (
            "live=maybe",
            trace(&["--live=maybe", "--server", "127.0.0.1:1"]),
        ),
        (
            "-o",
            exit(&["services", "-o", "xml", "--server", "127.0.0.1:1"]),
        ),
        (
            "limit",
            exit(&["services", "--limit", "ten", "--server", "127.0.0.1:1"]),
        ),
        (
            "offset",
            exit(&["services", "--offset=-1", "--server", "127.0.0.1:1"]),
        ),
        (
            "explain",
            exit(&["explain", "shop", "--server", "127.0.0.1:1"]),
        ),
        (
            "full",
            exit(&[
                "explain",
                "shop/web",
                "--full=often",
                "--server",
                "127.0.0.1:1",
            ]),
        ),
        (
            "connections",
            exit(&["connections", "a/b/c", "--server", "127.0.0.1:1"]),
        ),
        (
            "another command's flag",
            exit(&["services", "--dport", "80"]),
        ),
        ("run's own", exit(&["run", "--search", "web"])),
        ("doctor -o", exit(&["doctor", "-o", "xml"])),
        (
            "a setting",
            exit(&["plan", "--masquerade-bit=99", "--manifests", "/nonexistent"]),
        ),
        ("backend", exit(&["plan", "--nftables-backend=iptables"])),
        (
            "API address",
            exit(&[
                "plan",
                "--api-bind-address=10262",
                "--manifests",
                "/nonexistent",
            ]),
        ),
        ("command", exit(&["frobnicate"])),
        ("help of nothing", exit(&["help", "frobnicate"])),
    ];
    for (what, (code, _, err)) in &cases {
        assert_eq!(*code, Some(2), "{what}: {err}");
        assert!(err.starts_with("verdict: "), "{what}: {err}");
    }
    let (_, _, err) = &cases[0].1;
    assert!(err.contains("dport \"http\" is not a port"), "{err}");
    assert!(err.contains("verdict help trace"), "{err}");
    let (_, _, err) = &cases[11].1;
    assert!(
        err.contains("--dport belongs to verdict trace, not verdict services"),
        "{err}"
    );
}

#[test]
fn runtime_failures_and_unknown_services_exit_1() {
    let (code, _, err) = exit(&["services", "--server", "127.0.0.1:1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach verdict at 127.0.0.1:1"), "{err}");
    let offline = ["--manifests", &example(), "--hostname-override", "node-a"];
    let (code, out, err) = exit(&[&["explain", "default/no-such-service"][..], &offline].concat());
    assert_eq!(code, Some(1), "{err}");
    assert!(out.contains("not known"), "the answer is printed: {out}");
    let (code, _, err) =
        exit(&[&["connections", "default/no-such-service"][..], &offline].concat());
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no Service default/no-such-service is known to verdict"),
        "{err}"
    );
    let (code, _, err) = exit(&[&["services"][..], &offline].concat());
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn each_command_has_its_own_help() {
    let (code, global, _) = exit(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(global.contains("--masquerade-all"), "{global}");
    assert_eq!(exit(&["help"]).1, global);
    assert_eq!(
        exit(&["run", "--help"]).1,
        global,
        "run's flags are the page"
    );
    for (cmd, has, hasnt) in [
        ("trace", "--dport string", "--search"),
        ("explain", "--full", "--dport"),
        ("services", "--limit string", "--full"),
        ("syncs", "-o, --output string", "--limit"),
        ("connections", "NAMESPACE/NAME", "--limit"),
        ("doctor", "Exits 1 when any check fails", "--dport"),
        ("plan", "Takes every flag of verdict run", "--dport"),
        ("cleanup", "--keep-kube-proxy-nftables", "--dport"),
        ("version", "--version=raw", "--dport"),
    ] {
        let (code, page, err) = exit(&["help", cmd]);
        assert_eq!(code, Some(0), "{cmd}: {err}");
        assert!(
            page.starts_with(&format!("verdict {cmd}: ")),
            "{cmd}: {page}"
        );
        assert!(page.contains(has), "{cmd} lacks {has}: {page}");
        assert!(!page.contains(hasnt), "{cmd} has {hasnt}: {page}");
        assert!(!page.contains("--masquerade-all"), "{cmd}: the global page");
        assert_eq!(exit(&[cmd, "--help"]).1, page, "{cmd} --help");
        assert_eq!(exit(&[cmd, "-h"]).1, page, "{cmd} -h");
    }
}

/// mimalloc's options as it read them when the process loaded
/// (`MIMALLOC_VERBOSE=1` prints each one then).
fn allocator_options(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
    cmd.arg("version")
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_ARENA_EAGER_COMMIT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_allocator_is_tuned_before_it_first_reads_its_options() {
    // The binary's `.init_array` entry runs before mimalloc loads: the
    // options it read at load are verdict's, not its defaults (1000, 2).
    let text = allocator_options(&[]);
    assert!(text.contains("option 'purge_delay': 0"), "{text}");
    assert!(text.contains("option 'arena_eager_commit': 0"), "{text}");
    // The operator's environment wins.
    let text = allocator_options(&[
        ("MIMALLOC_PURGE_DELAY", "25"),
        ("MIMALLOC_ARENA_EAGER_COMMIT", "1"),
    ]);
    assert!(text.contains("option 'purge_delay': 25"), "{text}");
    assert!(text.contains("option 'arena_eager_commit': 1"), "{text}");
}

/// A reader that goes away (`verdict plan ... | head`) ends the command
/// quietly, with success, as a pipeline expects: no panic, no backtrace.
#[test]
fn a_closed_standard_output_ends_the_command_quietly() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml");
    for args in [
        vec![
            "plan",
            "--manifests",
            cluster,
            "--hostname-override",
            "node-a",
        ],
        vec![
            "services",
            "--manifests",
            cluster,
            "--hostname-override",
            "node-a",
        ],
        vec!["--help"],
        vec!["version"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_verdict"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first write.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}: {err}", out.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
