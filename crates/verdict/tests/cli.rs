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
