//! `--write-config-to` of verdict against the real kube-proxy 1.36's
//! (`../shared/bin`), for the same command lines: kube-proxy writes its
//! configuration as it defaulted it, which is what `/configz` serves, so
//! this compares the two defaultings field for field without a cluster.
//! No root needed; skipped where `../shared/bin` is missing (CI sets
//! `VERDICT_REQUIRE_REALAPI`, which makes that a failure).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// Writes the configuration `program` makes of `args` and reads it back.
fn written(program: &Path, args: &[String], out: &Path) -> Value {
    let _ = std::fs::remove_file(out);
    let status = Command::new(program)
        .args(args)
        .arg(format!("--write-config-to={}", out.display()))
        .output()
        .unwrap();
    assert!(
        out.exists(),
        "{} {args:?} wrote nothing: {}",
        program.display(),
        String::from_utf8_lossy(&status.stderr)
    );
    read_yaml(out)
}

/// Where two values differ, by path.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(l), Some(r)) => diff(&format!("{path}.{k}"), l, r, out),
                    (l, r) => out.push(format!("{path}.{k}: {l:?} / {r:?}")),
                }
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a != b => out.push(format!("{path}: {a} / {b}")),
        _ => {}
    }
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("verdict-write-config-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn verdict_writes_the_configuration_kube_proxy_writes() {
    let bin = match verdict_e2e::realapi::binaries() {
        Ok(b) => b,
        Err(why) => {
            if std::env::var_os("VERDICT_REQUIRE_REALAPI").is_some() {
                panic!("VERDICT_REQUIRE_REALAPI is set, but: {why}");
            }
            println!("skipped: {why}");
            return;
        }
    };
    let kube_proxy = bin.join("kube-proxy");
    let verdict = PathBuf::from(env!("CARGO_BIN_EXE_verdict"));
    let d = dir();
    let file = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        format!("--config={}", p.display())
    };
    let kubeadm = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-config.conf"),
    )
    .unwrap();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "a file with mode nftables",
            vec![file(
                "min.yaml",
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n",
            )],
        ),
        (
            "kubeadm's file, mode nftables",
            vec![file(
                "kubeadm.yaml",
                &kubeadm.replace("mode: \"\"", "mode: nftables"),
            )],
        ),
        (
            "a file that sets much",
            vec![file(
                "much.yaml",
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
                 clusterCIDR: 10.244.0.0/16,fd00::/108\nnodePortAddresses: [192.168.0.0/16]\n\
                 detectLocalMode: NodeCIDR\nconntrack:\n  maxPerCore: 0\n  tcpBeLiberal: true\n\
                 nftables:\n  syncPeriod: 1m\n  minSyncPeriod: 0s\n  masqueradeAll: true\n\
                 clientConnection:\n  qps: 20\n  burst: 40\nhealthzBindAddress: 127.0.0.1:10256\n\
                 featureGates:\n  LoggingAlphaOptions: true\nlogging:\n  verbosity: 3\n",
            )],
        ),
        (
            "flags, as k3s passes them",
            [
                "--proxy-mode=nftables",
                "--cluster-cidr=10.42.0.0/16",
                // (kube-proxy's --write-config-to refuses an address
                // without a port, which it takes when it runs.)
                "--healthz-bind-address=127.0.0.1:10256",
                "--conntrack-max-per-core=0",
                "--kube-api-qps=7.5",
                "--nodeport-addresses=primary",
            ]
            .map(String::from)
            .to_vec(),
        ),
    ];
    let mut failures = Vec::new();
    for (what, args) in &cases {
        let theirs = written(&kube_proxy, args, &d.join("kube-proxy.yaml"));
        let ours = written(&verdict, args, &d.join("verdict.yaml"));
        let mut out = Vec::new();
        diff("", &theirs, &ours, &mut out);
        println!("{what}: {} differences", out.len());
        if !out.is_empty() {
            failures.push(format!("{what}:\n  {}", out.join("\n  ")));
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
