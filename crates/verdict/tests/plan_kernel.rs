//! `verdict plan` dry-runs the backend as `run` does. Through nft on an nft
//! that cannot record IPv6 session affinity (nft 1.0.6), the plan leaves it
//! out for IPv6 just as `run` would, and says so, and the plan as printed
//! passes `nft --check`. Over netlink (the default) the kernel takes the
//! IPv6 rule, and the plan has it. Runs inside a namespace of its own;
//! needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use verdict_e2e::netns::{Netns, can_run, unique_prefix};

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: sticky, namespace: demo}\nspec:\n  clusterIPs: [172.30.0.9, \"fd00:30::9\"]\n  ipFamilies: [IPv4, IPv6]\n  sessionAffinity: ClientIP\n  ports: [{name: http, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: sticky-4\n  namespace: demo\n  labels: {kubernetes.io/service-name: sticky}\naddressType: IPv4\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints: [{addresses: [10.180.0.1]}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: sticky-6\n  namespace: demo\n  labels: {kubernetes.io/service-name: sticky}\naddressType: IPv6\nports: [{name: http, port: 80, protocol: TCP}]\nendpoints: [{addresses: [\"fd00:180::1\"]}]\n";

#[test]
fn plan_probes_nft_like_run() {
    plan_probes(true);
}

#[test]
fn plan_probes_the_netlink_backend_like_run() {
    plan_probes(false);
}

fn plan_probes(through_nft: bool) {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let ns = Netns::create(&format!("{}-plan", unique_prefix())).unwrap();
    let dir = common::scratch_dir(if through_nft {
        "plan-nft"
    } else {
        "plan-netlink"
    });
    let file = dir.join("sticky.yaml");
    std::fs::write(&file, SERVICE).unwrap();
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            env!("CARGO_BIN_EXE_verdict"),
            "plan",
        ])
        .args(["--hostname-override", "test-node", "--manifests"])
        .arg(&file)
        .args(if through_nft {
            &["--nftables-backend", "nft"][..]
        } else {
            &[]
        })
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let plan = String::from_utf8_lossy(&out.stdout);
    let records = |family: &str| {
        plan.lines().any(|l| {
            l.starts_with(&format!("add rule {family} verdict affinity-timeout"))
                && l.contains("update @affinity")
        })
    };
    assert!(records("ip"), "IPv4 affinity is programmed:\n{plan}");
    let v6_refused = log.contains("cannot record ClientIP session affinity");
    assert_eq!(
        records("ip6"),
        !v6_refused,
        "the IPv6 plan follows the probe\n{log}\n{plan}"
    );
    if !through_nft {
        assert!(
            records("ip6"),
            "over netlink IPv6 affinity is programmed\n{log}"
        );
        let nft = ns.exec("nft", &["list", "tables"]).unwrap();
        assert!(nft.trim().is_empty(), "plan changes nothing: {nft}");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // The real check: the kernel and this nft accept the plan as printed.
    let script = dir.join("plan.nft");
    std::fs::write(&script, plan.as_bytes()).unwrap();
    let checked = ns.exec("nft", &["-c", "-f", &script.to_string_lossy()]);
    assert!(checked.is_ok(), "nft refuses the plan: {checked:?}");
    let nft = ns.exec("nft", &["list", "tables"]).unwrap();
    assert!(nft.trim().is_empty(), "plan changes nothing: {nft}");
    let _ = std::fs::remove_dir_all(&dir);
}
