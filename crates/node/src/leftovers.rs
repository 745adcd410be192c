//! Cleanup of what kube-proxy's iptables and IPVS modes leave behind, as
//! kube-proxy does when it starts in nftables mode (reference §5.2 step 4),
//! so that switching a node needs no reboot:
//! - in every iptables table, of both backends (legacy and nft) and both
//!   families, the chains kube-proxy's iptables and IPVS modes create are
//!   flushed and deleted, after the rules of other chains that jump to
//!   them. Only those: kubelet's `KUBE-*` chains, and other programs'
//!   (kube-router's `KUBE-ROUTER-*`, `KUBE-NWPLCY-*`, `KUBE-POD-FW-*`, as on
//!   k3s), stay. iptables-nft keeps its chains as nf_tables chains, which
//!   are removed over netlink, so no program is needed; the legacy
//!   backend has no netlink interface, and its chains are removed through
//!   `iptables-legacy-save`/`-restore` where they are installed (where
//!   legacy tables are in use and they are not, that is reported);
//! - the `kube-ipvs0` dummy device of IPVS mode is deleted (rtnetlink);
//! - IPVS virtual servers are cleared with `ipvsadm -C` when the kernel
//!   has any (IPVS mode owned them all, as in kube-proxy), and IPVS mode's
//!   ipsets are destroyed when `ipset` is installed;
//! - kube-proxy's own nftables tables (`ip kube-proxy`, `ip6 kube-proxy`)
//!   are deleted, unless `--keep-kube-proxy-nftables`. Left in place they
//!   still act on Service traffic: their pre-DNAT firewall drops what
//!   LoadBalancer source ranges allowed when kube-proxy stopped, and a
//!   table loaded after verdict's (a saved ruleset restored at boot, a
//!   kube-proxy that comes back) runs its stale DNATs before verdict's,
//!   since the kernel runs base chains of equal priority newest first. (The
//!   test `a_node_that_ran_kube_proxy_in_nftables_mode_is_migrated` shows
//!   both.) kube-proxy itself deletes the other modes' state when it starts
//!   in one.
//!
//! Each step is independent: a failure is reported and the rest still runs.

use std::collections::BTreeSet;

/// The chains kube-proxy's iptables and IPVS modes create by name.
const OWNED_CHAINS: [&str; 13] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// The prefixes of the chains it creates per Service and endpoint.
const OWNED_PREFIXES: [&str; 6] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-XLB-",
];

/// The ipsets of IPVS mode (IPv6 ones are `KUBE-6-…`).
const IPVS_SETS: [&str; 17] = [
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// Whether an ipset is one of IPVS mode's.
fn ipvs_set(name: &str) -> bool {
    let v4 = match name.strip_prefix("KUBE-6-") {
        Some(rest) => format!("KUBE-{rest}"),
        None => name.to_owned(),
    };
    IPVS_SETS.contains(&v4.as_str())
}

/// The legacy iptables front-ends, (save, restore), and the file that
/// lists the legacy tables in use in their family.
const IPTABLES_LEGACY: [(&str, &str, &str); 2] = [
    (
        "iptables-legacy-save",
        "iptables-legacy-restore",
        "/proc/net/ip_tables_names",
    ),
    (
        "ip6tables-legacy-save",
        "ip6tables-legacy-restore",
        "/proc/net/ip6_tables_names",
    ),
];

/// The nf_tables tables iptables-nft keeps its chains in, in families
/// `ip` and `ip6`.
pub const IPTABLES_NFT_TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// Whether kube-proxy owns a chain of this name.
pub fn owned(chain: &str) -> bool {
    OWNED_CHAINS.contains(&chain) || OWNED_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// From an `iptables-save` dump, the `iptables-restore --noflush` input
/// that removes kube-proxy's chains: per table, delete the rules of other
/// chains that jump to them, flush them (declaring a chain flushes it) and
/// delete them. `None` if there is nothing to remove.
pub fn removal_script(save: &str) -> Option<String> {
    let mut out = String::new();
    let mut table: Option<&str> = None;
    let mut chains: BTreeSet<&str> = BTreeSet::new();
    let mut jumps: Vec<&str> = Vec::new();
    let flush = |table: Option<&str>,
                 chains: &mut BTreeSet<&str>,
                 jumps: &mut Vec<&str>,
                 out: &mut String| {
        if let Some(t) = table
            && !chains.is_empty()
        {
            out.push_str(&format!("*{t}\n"));
            for j in jumps.iter() {
                out.push_str(&format!("-D {j}\n"));
            }
            for c in chains.iter() {
                out.push_str(&format!(":{c} - [0:0]\n"));
            }
            for c in chains.iter() {
                out.push_str(&format!("-X {c}\n"));
            }
            out.push_str("COMMIT\n");
        }
        chains.clear();
        jumps.clear();
    };
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            flush(table, &mut chains, &mut jumps, &mut out);
            table = Some(t.trim());
        } else if let Some(decl) = line.strip_prefix(':') {
            if let Some(name) = decl.split_whitespace().next()
                && owned(name)
            {
                chains.insert(name);
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or("");
            let words: Vec<&str> = rule.split_whitespace().collect();
            let target = words
                .windows(2)
                .find(|w| w[0] == "-j" || w[0] == "-g")
                .map(|w| w[1]);
            if !owned(chain) && target.is_some_and(owned) {
                jumps.push(rule);
            }
        } else if line.trim() == "COMMIT" {
            flush(table, &mut chains, &mut jumps, &mut out);
            table = None;
        }
    }
    flush(table, &mut chains, &mut jumps, &mut out);
    (!out.is_empty()).then_some(out)
}

/// Runs a program; `Ok(None)` if it is not installed.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<Option<String>, String> {
    let out = match verdict_nft::process::run(program, args, stdin) {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{program}: {e}")),
    };
    if out.status.success() {
        Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// kube-proxy's nftables table, in each family it uses.
pub const KUBE_PROXY_TABLES: [(verdict_nft::Family, &str); 2] = [
    (verdict_nft::Family::Ip, "kube-proxy"),
    (verdict_nft::Family::Ip6, "kube-proxy"),
];

/// The legacy iptables tables in use, from `/proc/net/ip{,6}_tables_names`
/// (empty where the legacy modules are not loaded).
pub fn legacy_tables_in_use(names: &str) -> Vec<&str> {
    names
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// Removes kube-proxy's chains from the tables iptables-nft keeps, over
/// netlink. Returns the problems met.
fn remove_iptables_nft_chains() -> Vec<String> {
    let mut nl = match verdict_nft::NetlinkBackend::new() {
        Ok(nl) => nl,
        Err(e) => return vec![format!("iptables-nft chains: {e}")],
    };
    let mut problems = Vec::new();
    for family in ["ip", "ip6"] {
        for table in IPTABLES_NFT_TABLES {
            match nl.remove_chains(family, table, owned) {
                Ok(removed) if !removed.is_empty() => tracing::info!(
                    family,
                    table,
                    chains = removed.len(),
                    "removed kube-proxy's iptables-nft chains"
                ),
                Ok(_) => {}
                Err(e) => problems.push(format!("iptables-nft {family} {table}: {e}")),
            }
        }
    }
    problems
}

/// Deletes kube-proxy's nftables tables through the backend (deleting a
/// table that is not there is refused as not found, which is fine).
/// Returns the problems met.
fn remove_kube_proxy_tables(backend: &mut dyn verdict_nft::Backend) -> Vec<String> {
    let mut problems = Vec::new();
    for (family, table) in KUBE_PROXY_TABLES {
        let mut tx = verdict_nft::Transaction::new(family, table);
        tx.delete_table();
        match backend.run(&tx) {
            Ok(()) => tracing::info!(
                %family,
                table,
                "deleted kube-proxy's nftables table (its rules would still catch Service traffic)"
            ),
            Err(e) if e.is_not_found() => {}
            Err(e) => problems.push(format!("deleting table {family} {table}: {e}")),
        }
    }
    problems
}

/// A kube-proxy process in this network namespace, if one runs: its pid
/// (the first found). A kube-proxy of another namespace does not count.
pub fn kube_proxy_running() -> Option<u32> {
    let here = std::fs::read_link("/proc/self/ns/net").ok()?;
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        let dir = std::path::Path::new("/proc").join(pid.to_string());
        std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim_end() == "kube-proxy")
            && std::fs::read_link(dir.join("ns/net")).is_ok_and(|ns| ns == here)
    })
}

/// An HTTP answer: the status code, the headers (names lower-case) and
/// the body.
type Answer = (u16, Vec<(String, String)>, String);

/// `GET path` on `addr` (half a second to connect, a second to answer).
fn ask(addr: std::net::SocketAddr, path: &str) -> Option<Answer> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_millis(500);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout * 2)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\n\r\n")
                .as_bytes(),
        )
        .ok()?;
    let mut raw = Vec::new();
    let _ = stream.take(64 << 10).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some((code, headers, body.to_owned()))
}

/// Whether an answer is verdict's own: its admin servers name it in
/// `Server` ([`verdict_admin::http::SERVER`]); kube-proxy's send none.
fn is_verdicts(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "server" && v.starts_with("verdict/"))
}

/// What kube-proxy's health server at `addr` says, if one answers there:
/// `Some(when it last synced its rules)` (`None` inside when it has not
/// yet). Its JSON is verdict's too (verdict is a drop-in, and kube-proxy
/// 1.36 also gives a `status` per family): an answer is verdict's only if
/// it names verdict as its `Server`. (A verdict older than that header
/// is taken for kube-proxy: cleanup then refuses, the safe mistake.)
pub fn kube_proxy_health(addr: std::net::SocketAddr) -> Option<Option<std::time::SystemTime>> {
    let (_, headers, body) = ask(addr, "/healthz")?;
    if is_verdicts(&headers) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    let last = v.get("lastUpdated")?.as_str()?;
    v.get("currentTime")?;
    Some(
        verdict_admin::time::parse_rfc3339(last)
            .filter(|t| *t > std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400)),
    )
}

/// Whether kube-proxy's metrics server answers at `addr`: its
/// `/proxyMode` names a proxy mode, and the answer is not verdict's.
/// (kube-proxy's health server may be off or elsewhere; its metrics
/// server is on 127.0.0.1:10249 by default.)
pub fn kube_proxy_metrics(addr: std::net::SocketAddr) -> Option<String> {
    let (code, headers, body) = ask(addr, "/proxyMode")?;
    let mode = body.trim();
    (code == 200
        && !is_verdicts(&headers)
        && ["iptables", "ipvs", "nftables", "kernelspace"].contains(&mode))
    .then(|| mode.to_owned())
}

/// Removes kube-proxy's iptables and IPVS leftovers, and its nftables
/// tables unless `keep_nftables`. Returns the problems met (each step
/// still ran).
pub fn cleanup(keep_nftables: bool, backend: &mut dyn verdict_nft::Backend) -> Vec<String> {
    let mut problems = Vec::new();
    if keep_nftables {
        tracing::info!(
            "leaving kube-proxy's nftables tables in place (--keep-kube-proxy-nftables)"
        );
    } else {
        problems.extend(remove_kube_proxy_tables(backend));
    }
    problems.extend(remove_iptables_nft_chains());
    for (save, restore, in_use) in IPTABLES_LEGACY {
        let dump = match run(save, &[], None) {
            Ok(Some(d)) => d,
            Ok(None) => {
                let names = std::fs::read_to_string(in_use).unwrap_or_default();
                let tables = legacy_tables_in_use(&names);
                if !tables.is_empty() {
                    problems.push(format!(
                        "legacy iptables tables are in use ({}) and {save} is not installed: \
                         kube-proxy's legacy chains, if any, stay (run verdict cleanup from an image with iptables)",
                        tables.join(", ")
                    ));
                }
                continue;
            }
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let Some(script) = removal_script(&dump) else {
            continue;
        };
        let chains = script.lines().filter(|l| l.starts_with("-X ")).count();
        match run(restore, &["--noflush"], Some(&script)) {
            Ok(_) => tracing::info!(
                tool = restore,
                chains,
                "removed kube-proxy's iptables chains"
            ),
            Err(e) => problems.push(e),
        }
    }

    match verdict_nft::addresses::delete_link("kube-ipvs0") {
        Ok(true) => tracing::info!("deleted the kube-ipvs0 device of IPVS mode"),
        Ok(false) => {}
        Err(e) => problems.push(e.to_string()),
    }

    // /proc/net/ip_vs exists only while IPVS is loaded; lines after the two
    // header lines are virtual servers and their real servers.
    let ipvs = std::fs::read_to_string("/proc/net/ip_vs").unwrap_or_default();
    if ipvs.lines().count() > 3 {
        match run("ipvsadm", &["-C"], None) {
            Ok(Some(_)) => tracing::info!("cleared the IPVS virtual servers of IPVS mode"),
            Ok(None) => problems.push(
                "IPVS virtual servers remain and ipvsadm is not installed to clear them".into(),
            ),
            Err(e) => problems.push(e),
        }
    }

    if let Ok(Some(names)) = run("ipset", &["list", "-n"], None) {
        for set in names.lines().filter(|n| ipvs_set(n)) {
            if let Err(e) = run("ipset", &["destroy", set], None) {
                problems.push(e);
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "\
# Generated by iptables-save v1.8.9
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:USER - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A FORWARD -j USER
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*raw
:PREROUTING ACCEPT [0:0]
-A PREROUTING -j ACCEPT
COMMIT
";

    #[test]
    fn removes_kube_proxy_chains_and_the_jumps_to_them_only() {
        let script = removal_script(SAVE).unwrap();
        assert_eq!(
            script,
            "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n-X KUBE-PROXY-CANARY\nCOMMIT\n\
             *filter\n\
             -D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -D FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             :KUBE-FORWARD - [0:0]\n:KUBE-SERVICES - [0:0]\n\
             -X KUBE-FORWARD\n-X KUBE-SERVICES\nCOMMIT\n"
        );
    }

    #[test]
    fn other_programs_kube_chains_and_sets_stay() {
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-ROUTER-INPUT - [0:0]\n:KUBE-NWPLCY-ABC - [0:0]\n:KUBE-POD-FW-XYZ - [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n-A INPUT -j KUBE-ROUTER-INPUT\n-A INPUT -j KUBE-PROXY-FIREWALL\nCOMMIT\n";
        let script = removal_script(save).unwrap();
        assert!(script.contains("-X KUBE-PROXY-FIREWALL"), "{script}");
        for keep in [
            "KUBE-ROUTER-INPUT",
            "KUBE-NWPLCY-ABC",
            "KUBE-POD-FW-XYZ",
            "KUBE-FIREWALL",
        ] {
            assert!(!script.contains(keep), "{keep}: {script}");
        }
        assert!(ipvs_set("KUBE-CLUSTER-IP") && ipvs_set("KUBE-6-NODE-PORT-TCP"));
        assert!(
            !ipvs_set("KUBE-SRC-ABCDEF") && !ipvs_set("KUBE-DST-ABCDEF"),
            "kube-router's sets"
        );
    }

    #[test]
    fn legacy_tables_in_use_are_read_from_proc() {
        assert_eq!(legacy_tables_in_use("nat\nfilter\n\n"), ["nat", "filter"]);
        assert!(legacy_tables_in_use("").is_empty());
    }

    #[test]
    fn nothing_to_do_without_kube_proxy_chains() {
        assert_eq!(
            removal_script("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n"),
            None
        );
        assert_eq!(removal_script(""), None);
    }
}
