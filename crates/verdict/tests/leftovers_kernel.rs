//! `verdict cleanup` removes what kube-proxy's iptables and IPVS modes left
//! in a node (planted here, in a namespace of the test's own), for both
//! iptables backends, and leaves kubelet's chains and everything else.
//! Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use verdict_e2e::netns::{Netns, can_run, unique_prefix};

/// What kube-proxy's iptables mode leaves in the nat and filter tables,
/// with kubelet's chain and a rule of someone else beside it.
const PLANTED: &str = "\
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]
:KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.99.0.0/16 -j MASQUERADE
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABCDEFGHIJKLMNOP
-A KUBE-SVC-ABCDEFGHIJKLMNOP -j KUBE-SEP-ABCDEFGHIJKLMNOP
-A KUBE-SEP-ABCDEFGHIJKLMNOP -s 10.180.0.1/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -s 10.99.0.0/16 -j ACCEPT
-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
";

fn dump(ns: &Netns, save: &str) -> String {
    ns.exec(save, &[]).unwrap()
}

#[test]
fn cleanup_removes_iptables_and_ipvs_leftovers() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let ns = Netns::create(&format!("{}left", unique_prefix())).unwrap();
    for restore in ["iptables-legacy-restore", "iptables-nft-restore"] {
        ns.exec(
            "sh",
            &[
                "-c",
                &format!("printf '%s' '{PLANTED}' | {restore} --noflush"),
            ],
        )
        .unwrap();
    }
    // IPVS mode's device is a dummy; this kernel has no dummy driver, and
    // the cleanup goes by name, so a bridge of that name stands in.
    ns.ip(&["link", "add", "kube-ipvs0", "type", "bridge"])
        .unwrap();
    for save in ["iptables-legacy-save", "iptables-nft-save"] {
        assert!(
            dump(&ns, save).contains("KUBE-SVC-ABCDEFGHIJKLMNOP"),
            "planted"
        );
    }

    let out = ns
        .exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap();
    println!("{out}");

    for save in ["iptables-legacy-save", "iptables-nft-save"] {
        let after = dump(&ns, save);
        for gone in [
            "KUBE-SERVICES",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-SVC-",
            "KUBE-SEP-",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
        ] {
            assert!(!after.contains(gone), "{save}: {gone} left:\n{after}");
        }
        for kept in [
            "-A POSTROUTING -s 10.99.0.0/16 -j MASQUERADE",
            "-A FORWARD -s 10.99.0.0/16 -j ACCEPT",
            "-A INPUT -j KUBE-FIREWALL",
            "-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP",
        ] {
            assert!(after.contains(kept), "{save}: {kept:?} removed:\n{after}");
        }
    }
    let links = ns.ip(&["link", "show"]).unwrap();
    assert!(!links.contains("kube-ipvs0"), "{links}");

    // Nothing left: a second cleanup succeeds and changes nothing.
    let before = dump(&ns, "iptables-nft-save");
    ns.exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap();
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&before), strip(&dump(&ns, "iptables-nft-save")));
}

/// While a kube-proxy runs in the node's network namespace, `cleanup`
/// changes nothing and says why (kube-proxy would not write its rules
/// again for up to an hour); a kube-proxy of another namespace does not
/// count; `--force` cleans up all the same.
#[test]
fn cleanup_refuses_while_kube_proxy_runs_here() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let prefix = unique_prefix();
    let ns = Netns::create(&format!("{prefix}kp")).unwrap();
    let elsewhere = Netns::create(&format!("{prefix}kp2")).unwrap();
    // A process named kube-proxy: a copy of sleep.
    let dir = std::env::temp_dir().join(format!("verdict-kube-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("kube-proxy");
    let sleep = verdict_e2e::netns::run("sh", &["-c", "command -v sleep"]).unwrap();
    std::fs::copy(sleep.trim(), &fake).unwrap();
    let fake = fake.to_string_lossy().into_owned();
    ns.exec("nft", &["add table ip kube-proxy"]).unwrap();
    let has_table = || {
        ns.exec("nft", &["list tables"])
            .unwrap()
            .contains("table ip kube-proxy")
    };

    // In another namespace: not in the way.
    let mut other = elsewhere.spawn(&fake, &["60"]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    ns.exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap();
    assert!(!has_table(), "cleaned up");
    let _ = other.kill();
    let _ = other.wait();

    // Here: refused, nothing changed.
    ns.exec("nft", &["add table ip kube-proxy"]).unwrap();
    let mut here = ns.spawn(&fake, &["60"]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let refused = ns
        .exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup"])
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!(
            "kube-proxy runs in this network namespace (pid {})",
            here.id()
        )),
        "{refused}"
    );
    assert!(has_table(), "nothing changed");
    ns.exec(env!("CARGO_BIN_EXE_verdict"), &["cleanup", "--force"])
        .unwrap();
    assert!(!has_table(), "--force cleans up");
    let _ = here.kill();
    let _ = here.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
