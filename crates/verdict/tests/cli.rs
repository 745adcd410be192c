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
