//! `verdict doctor`: checks this node for what breaks Services, each with
//! pass, warn or fail and the fix. The checks read the node (`/proc`,
//! `/sys`, the ruleset, the iptables front-ends, conntrack), ask the API
//! server (reachability and RBAC, with SelfSubjectAccessReviews) and, when
//! verdict runs here, its drift check. Each judgement is a pure function
//! of what was read, so the rules are unit-tested.

use std::fmt::Write as _;

use serde_json::{Value as Json, json};

use crate::cli::Cli;
use crate::config::Settings;
use crate::daemon::SourceFlags;

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, but worth a look.
    Warn,
    /// Breaks Services.
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it (warn and fail).
    pub fix: Option<String>,
}

fn check(name: &str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
    }
}

/// kube-proxy's kernel floor for nftables mode: 5.13.
pub fn kernel(release: &str) -> Check {
    if verdict_node::probe::kernel_supported(release) {
        check(
            "kernel",
            Status::Pass,
            format!("{} (5.13 or newer)", release.trim()),
            None,
        )
    } else {
        check(
            "kernel",
            Status::Fail,
            format!("{} is older than 5.13", release.trim()),
            Some(
                "upgrade the kernel: nftables mode needs 5.13 (KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK overrides the check at your risk)",
            ),
        )
    }
}

/// The nf_tables and conntrack modules: loaded, or built in.
pub fn modules(loaded: &str, built_in: impl Fn(&str) -> bool) -> Vec<Check> {
    ["nf_tables", "nf_conntrack", "nf_nat"]
        .into_iter()
        .map(|m| {
            let is_loaded = loaded
                .lines()
                .any(|l| l.split_whitespace().next() == Some(m));
            if is_loaded || built_in(m) {
                check(&format!("module {m}"), Status::Pass, "available", None)
            } else {
                check(
                    &format!("module {m}"),
                    Status::Warn,
                    "not loaded (the kernel loads it on first use when it can)",
                    Some(&format!("modprobe {m}, or add it to /etc/modules-load.d/")),
                )
            }
        })
        .collect()
}

/// CAP_NET_ADMIN in the effective set (`CapEff` of /proc/self/status).
pub fn capability(status: &str) -> Check {
    match verdict_node::probe::net_admin_in(status) {
        Some(true) => check("CAP_NET_ADMIN", Status::Pass, "held", None),
        Some(false) => check(
            "CAP_NET_ADMIN",
            Status::Fail,
            "not held: verdict cannot program nftables or conntrack",
            Some(
                "run as root, or securityContext.capabilities.add: [NET_ADMIN] (kube-proxy's DaemonSet runs privileged)",
            ),
        ),
        None => check(
            "CAP_NET_ADMIN",
            Status::Warn,
            "cannot read /proc/self/status",
            None,
        ),
    }
}

/// A base chain of another table on a hook verdict uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChain {
    /// `ip`, `ip6`, `inet`, …
    pub family: String,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `nat`, `filter`, `route`.
    pub kind: String,
    /// `prerouting`, `output`, …
    pub hook: String,
    /// Its priority.
    pub priority: i64,
}

/// The base chains of the ruleset, as netlink lists them.
pub fn base_chains(chains: &[verdict_nft::netlink::ChainInfo]) -> Vec<BaseChain> {
    chains
        .iter()
        .filter_map(|c| {
            let (kind, hook, priority) = c.base.as_ref()?;
            Some(BaseChain {
                family: c.family.to_owned(),
                table: c.table.clone(),
                name: c.name.clone(),
                kind: kind.clone(),
                hook: (*hook).to_owned(),
                priority: i64::from(*priority),
            })
        })
        .collect()
}

/// verdict's own base chains: (type, hook, priority).
const OURS: [(&str, &str, i64); 8] = [
    ("filter", "prerouting", -110),
    ("filter", "output", -110),
    ("nat", "prerouting", -100),
    ("nat", "output", -100),
    ("filter", "input", 0),
    ("filter", "forward", 0),
    ("filter", "output", 0),
    ("nat", "postrouting", 100),
];

/// Who owns a table, by its well-known name.
fn owner_of(table: &str, chain: &str) -> &'static str {
    let t = table.to_ascii_lowercase();
    let c = chain.to_ascii_lowercase();
    if t == "kube-proxy" {
        "kube-proxy (nftables mode)"
    } else if t.contains("firewalld") {
        "firewalld"
    } else if t.starts_with("cali") || c.starts_with("cali") {
        "Calico"
    } else if t.contains("cilium") || c.contains("cilium") {
        "Cilium"
    } else if t == "nat" || t == "filter" || t == "mangle" || t == "raw" {
        "iptables-nft"
    } else {
        "another program"
    }
}

/// Whether nft's name of a family is one of verdict's (`ip`, `ip6`).
fn is_ip_family(name: &str) -> bool {
    [verdict_nft::Family::Ip, verdict_nft::Family::Ip6]
        .iter()
        .any(|f| f.as_str() == name)
}

/// Other tables' NAT chains on verdict's hooks, and which runs first.
pub fn other_nat_chains(chains: &[BaseChain], our_table: &str) -> Check {
    let mut found = Vec::new();
    let mut status = Status::Pass;
    for c in chains {
        if c.table == our_table && is_ip_family(&c.family) {
            continue;
        }
        if c.kind != "nat" {
            continue;
        }
        let Some((_, _, ours)) = OURS
            .iter()
            .find(|(k, h, _)| *k == "nat" && *h == c.hook.as_str())
        else {
            continue;
        };
        let order = match c.priority.cmp(ours) {
            std::cmp::Ordering::Less => {
                status = status.max(Status::Warn);
                format!(
                    "runs BEFORE verdict's (priority {} < {ours}): a DNAT there wins",
                    c.priority
                )
            }
            std::cmp::Ordering::Equal => {
                status = status.max(Status::Warn);
                format!(
                    "same priority {ours} as verdict's: the kernel runs the chain registered last first, so the order changes with reloads"
                )
            }
            std::cmp::Ordering::Greater => {
                format!("runs after verdict's (priority {} > {ours})", c.priority)
            }
        };
        found.push(format!(
            "{} {} {} ({}), {} hook: {order}",
            c.family,
            c.table,
            c.name,
            owner_of(&c.table, &c.name),
            c.hook
        ));
    }
    if found.is_empty() {
        check(
            "other NAT chains",
            Status::Pass,
            "no other table has NAT chains on prerouting, output or postrouting",
            None,
        )
    } else {
        check(
            "other NAT chains",
            status,
            found.join("; "),
            (status > Status::Pass).then_some(
                "make sure no other program DNATs Service addresses (kube-proxy, a CNI's own service proxy); give other NAT chains a priority after verdict's (> -100)",
            ),
        )
    }
}

/// kube-proxy's own nftables tables, among the ruleset's (family, name).
pub fn kube_proxy_tables(tables: &[(&str, String)]) -> Check {
    let present: Vec<String> = tables
        .iter()
        .filter(|(f, n)| {
            verdict_node::leftovers::KUBE_PROXY_TABLES
                .iter()
                .any(|(family, name)| family.as_str() == *f && name == n)
        })
        .map(|(family, name)| format!("table {family} {name}"))
        .collect();
    if present.is_empty() {
        check("kube-proxy's nftables table", Status::Pass, "absent", None)
    } else {
        check(
            "kube-proxy's nftables table",
            Status::Warn,
            format!("present: {}", present.join(", ")),
            Some(
                "stop kube-proxy on this node (its DaemonSet); verdict deletes the table after its first full sync, or run verdict cleanup",
            ),
        )
    }
}

/// kube-proxy's iptables and IPVS chains: in the tables iptables-nft
/// keeps (from the ruleset's chains), and per legacy front-end (the
/// save output of each).
pub fn kube_proxy_chains(
    chains: &[verdict_nft::netlink::ChainInfo],
    dumps: &[(&str, String)],
) -> Check {
    let mut found = Vec::new();
    let mut nft: std::collections::BTreeMap<(&str, &str), usize> = Default::default();
    for c in chains {
        if is_ip_family(c.family)
            && verdict_node::leftovers::IPTABLES_NFT_TABLES.contains(&c.table.as_str())
            && verdict_node::leftovers::owned(&c.name)
        {
            *nft.entry((c.family, c.table.as_str())).or_default() += 1;
        }
    }
    for ((family, table), n) in nft {
        found.push(format!("{n} in iptables-nft ({family} {table})"));
    }
    for (tool, dump) in dumps {
        if let Some(script) = verdict_node::leftovers::removal_script(dump) {
            let n = script.lines().filter(|l| l.starts_with("-X ")).count();
            found.push(format!("{n} in {tool}"));
        }
    }
    if found.is_empty() {
        check("kube-proxy's iptables chains", Status::Pass, "none", None)
    } else {
        check(
            "kube-proxy's iptables chains",
            Status::Warn,
            found.join(", "),
            Some(
                "they still act on Service traffic: stop kube-proxy; verdict removes them after its first full sync, or run verdict cleanup",
            ),
        )
    }
}

/// A sysctl that must have a value.
pub fn sysctl(name: &str, value: Option<&str>, want: &str, fail: bool, why: &str) -> Check {
    match value.map(str::trim) {
        Some(v) if v == want => check(name, Status::Pass, v.to_owned(), None),
        Some(v) => check(
            name,
            if fail { Status::Fail } else { Status::Warn },
            format!("{v}: {why}"),
            Some(&format!("sysctl -w {name}={want}")),
        ),
        None => check(name, Status::Warn, "absent", None),
    }
}

/// `route_localnet`: verdict never serves NodePorts on 127.0.0.1, so 1 is
/// not needed and lets martian traffic to localhost in.
pub fn route_localnet(value: Option<&str>) -> Check {
    match value.map(str::trim) {
        Some("1") => check(
            "net.ipv4.conf.all.route_localnet",
            Status::Warn,
            "1: verdict, like kube-proxy's nftables mode, does not serve NodePorts on 127.0.0.1, and route_localnet=1 exposes localhost-bound services (CVE-2020-8558)",
            Some(
                "sysctl -w net.ipv4.conf.all.route_localnet=0, unless something else on the node needs it",
            ),
        ),
        Some(v) => check(
            "net.ipv4.conf.all.route_localnet",
            Status::Pass,
            v.to_owned(),
            None,
        ),
        None => check(
            "net.ipv4.conf.all.route_localnet",
            Status::Warn,
            "absent",
            None,
        ),
    }
}

/// `br_netfilter` and `bridge-nf-call-iptables`: pods on a Linux bridge
/// reaching a Service that picks themselves (hairpin) or a pod on the
/// same bridge.
pub fn bridge(loaded: bool, call_iptables: Option<&str>) -> Check {
    let name = "bridge-nf-call-iptables";
    match (loaded, call_iptables.map(str::trim)) {
        (true, Some("1")) => check(name, Status::Pass, "br_netfilter loaded, 1", None),
        (true, v) => check(
            name,
            Status::Fail,
            format!(
                "br_netfilter is loaded but it is {}: bridged pod-to-pod Service traffic skips verdict's rules",
                v.unwrap_or("absent")
            ),
            Some(
                "sysctl -w net.bridge.bridge-nf-call-iptables=1 (and net.bridge.bridge-nf-call-ip6tables=1)",
            ),
        ),
        (false, _) => check(
            name,
            Status::Warn,
            "br_netfilter is not loaded: fine for routed CNIs; on a Linux bridge, a pod reaching a Service that picks a pod on the same bridge needs it",
            Some(
                "with a bridge CNI: modprobe br_netfilter and sysctl -w net.bridge.bridge-nf-call-iptables=1, or enable hairpin mode on the bridge ports",
            ),
        ),
    }
}

/// Conntrack table fill.
pub fn conntrack_fill(count: Option<u64>, max: Option<u64>) -> Check {
    let name = "conntrack table";
    match (count, max) {
        (Some(c), Some(m)) if m > 0 => {
            let pct = c as f64 * 100.0 / m as f64;
            let detail = format!("{c} of {m} entries ({pct:.0}%)");
            let fix = "raise conntrack.maxPerCore / conntrack.min (or net.netfilter.nf_conntrack_max); a full table drops new connections";
            if pct >= 90.0 {
                check(name, Status::Fail, detail, Some(fix))
            } else if pct >= 75.0 {
                check(name, Status::Warn, detail, Some(fix))
            } else {
                check(name, Status::Pass, detail, None)
            }
        }
        _ => check(
            name,
            Status::Warn,
            "cannot read nf_conntrack_count / nf_conntrack_max (is nf_conntrack loaded?)",
            None,
        ),
    }
}

/// The API server's answers.
pub fn api(access: &Result<verdict_k8s::access::Access, String>) -> Vec<Check> {
    let access = match access {
        Ok(a) => a,
        Err(e) => {
            return vec![check(
                "API server",
                Status::Fail,
                e.clone(),
                Some("check --kubeconfig / --master / clientConnection.kubeconfig"),
            )];
        }
    };
    let mut out = vec![match &access.version {
        Ok(v) => check("API server", Status::Pass, format!("reachable, {v}"), None),
        Err(e) => check(
            "API server",
            Status::Fail,
            format!("unreachable: {e}"),
            Some("check the server address in the kubeconfig, and that this node can reach it"),
        ),
    }];
    for p in &access.permissions {
        let what = if p.group.is_empty() {
            format!("{} {}", p.verb, p.resource)
        } else {
            format!("{} {}.{}", p.verb, p.resource, p.group)
        };
        let optional = p.resource == "servicecidrs" || p.resource == "events";
        out.push(match &p.answer {
            Ok(true) => check(&format!("RBAC {what}"), Status::Pass, "allowed", None),
            Ok(false) => check(
                &format!("RBAC {what}"),
                if optional { Status::Warn } else { Status::Fail },
                format!(
                    "denied{}",
                    p.reason
                        .as_ref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ),
                Some("apply deploy/base/rbac.yaml (verdict's ClusterRole and binding)"),
            ),
            Err(e) => check(
                &format!("RBAC {what}"),
                Status::Warn,
                format!("not checked: {e}"),
                None,
            ),
        });
    }
    out
}

/// The running verdict's drift check (`/api/v1/drift`).
pub fn drift(doc: &Result<Json, String>) -> Check {
    let name = "drift";
    let doc = match doc {
        Ok(d) => d,
        Err(e) => {
            return check(
                name,
                Status::Warn,
                format!("not checked: {e}"),
                Some("run doctor where verdict runs, or give --server"),
            );
        }
    };
    let mut parts = Vec::new();
    let mut bad = false;
    for f in doc["families"].as_array().into_iter().flatten() {
        if f["table"] == false {
            parts.push(format!(
                "{}: no table yet",
                f["family"].as_str().unwrap_or("")
            ));
            continue;
        }
        let n = |k: &str| f[k].as_u64().unwrap_or(0);
        bad |= n("missing") + n("differs") + n("extra") > 0;
        parts.push(format!(
            "{}: {} missing, {} differing, {} extra",
            f["family"].as_str().unwrap_or(""),
            n("missing"),
            n("differs"),
            n("extra")
        ));
    }
    if bad {
        check(
            name,
            Status::Fail,
            parts.join("; "),
            Some(
                "a full sync repairs it (one runs within a second of a foreign change); if it persists, see verdict syncs and the log",
            ),
        )
    } else {
        check(name, Status::Pass, parts.join("; "), None)
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// A program's output (`Err`: not installed, or it failed).
fn program(name: &str, args: &[&str]) -> Result<String, String> {
    verdict_node::leftovers::run(name, args, None)?
        .ok_or_else(|| format!("{name} is not installed"))
}

/// Every check, in order.
pub fn checks(cli: &Cli, settings: &Settings, source: &SourceFlags) -> Vec<Check> {
    let mut out = vec![kernel(
        &read("/proc/sys/kernel/osrelease").unwrap_or_default(),
    )];
    let builtin = read(&format!(
        "/lib/modules/{}/modules.builtin",
        read("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    ))
    .unwrap_or_default();
    // The ruleset over netlink: no program is needed.
    let ruleset =
        verdict_nft::NetlinkBackend::new().and_then(|mut nl| Ok((nl.tables()?, nl.chains()?)));
    let nft_works = ruleset.is_ok();
    let all_chains = ruleset.as_ref().map(|(_, c)| c.clone()).unwrap_or_default();
    let chains = base_chains(&all_chains);
    let nat_works = chains.iter().any(|c| c.kind == "nat");
    out.extend(modules(&read("/proc/modules").unwrap_or_default(), |m| {
        // Built in, or shown working: nft answers, conntrack has a table.
        std::path::Path::new(&format!("/sys/module/{m}")).exists()
            || builtin.lines().any(|l| l.ends_with(&format!("/{m}.ko")))
            || (m == "nf_tables" && nft_works)
            || (m == "nf_nat" && nat_works)
            || (m == "nf_conntrack"
                && std::path::Path::new("/proc/sys/net/netfilter/nf_conntrack_max").exists())
    }));
    out.push(capability(&read("/proc/self/status").unwrap_or_default()));
    match &ruleset {
        Ok((tables, _)) => out.push(kube_proxy_tables(tables)),
        Err(e) => out.push(check(
            "nftables",
            Status::Fail,
            format!("cannot read the ruleset over netlink: {e}"),
            Some("load nf_tables, and run with CAP_NET_ADMIN"),
        )),
    }
    if nft_works {
        out.push(other_nat_chains(&chains, "verdict"));
    }
    // Legacy iptables has no netlink interface: its front-ends, where
    // they are installed.
    let dumps: Vec<(&str, String)> = ["iptables-legacy-save", "ip6tables-legacy-save"]
        .into_iter()
        .filter_map(|t| program(t, &[]).ok().map(|d| (t, d)))
        .collect();
    out.push(kube_proxy_chains(&all_chains, &dumps));
    out.push(sysctl(
        "net.ipv4.ip_forward",
        read("/proc/sys/net/ipv4/ip_forward").as_deref(),
        "1",
        true,
        "the node does not forward: pods' and external clients' Service traffic to other nodes is dropped",
    ));
    out.push(sysctl(
        "net.ipv6.conf.all.forwarding",
        read("/proc/sys/net/ipv6/conf/all/forwarding").as_deref(),
        "1",
        false,
        "IPv6 Service traffic is not forwarded (fine on an IPv4-only cluster)",
    ));
    out.push(route_localnet(
        read("/proc/sys/net/ipv4/conf/all/route_localnet").as_deref(),
    ));
    out.push(bridge(
        std::path::Path::new("/sys/module/br_netfilter").exists(),
        read("/proc/sys/net/bridge/bridge-nf-call-iptables").as_deref(),
    ));
    let num = |p: &str| read(p).and_then(|v| v.trim().parse::<u64>().ok());
    out.push(conntrack_fill(
        num("/proc/sys/net/netfilter/nf_conntrack_count"),
        num("/proc/sys/net/netfilter/nf_conntrack_max"),
    ));
    if source.manifests.is_some() {
        out.push(check(
            "API server",
            Status::Pass,
            "not used: the manifests source (--manifests)",
            None,
        ));
    } else {
        let node = settings
            .hostname_override
            .clone()
            .unwrap_or_else(|| "doctor".into());
        let src = crate::daemon::api_source(settings, source, &node);
        out.extend(api(
            &verdict_k8s::access::check(&src).map_err(|e| e.to_string())
        ));
    }
    let drift_doc = crate::client::server(cli, settings)
        .map_err(|e| format!("{e:#}"))
        .and_then(|addr| {
            crate::client::get(addr, "/api/v1/drift")
                .map_err(|e| format!("{e:#}"))
                .and_then(|(code, doc)| {
                    if code == 200 {
                        Ok(doc)
                    } else {
                        Err(doc["error"]
                            .as_str()
                            .unwrap_or("unexpected answer")
                            .to_owned())
                    }
                })
        });
    out.push(drift(&drift_doc));
    out
}

/// The checks as JSON (`-o json`).
pub fn json(checks: &[Check]) -> Json {
    let worst = checks
        .iter()
        .map(|c| c.status)
        .max()
        .unwrap_or(Status::Pass);
    json!({
        "status": worst.as_str(),
        "checks": checks.iter().map(|c| json!({
            "name": c.name,
            "status": c.status.as_str(),
            "detail": c.detail,
            "fix": c.fix,
        })).collect::<Vec<_>>(),
    })
}

/// The checks as text.
pub fn text(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let mark = match c.status {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        let _ = writeln!(out, "{mark}  {:<34} {}", c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "      {:<34} fix: {fix}", "");
        }
    }
    let n = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "\n{} passed, {} warnings, {} failed",
        n(Status::Pass),
        n(Status::Warn),
        n(Status::Fail)
    );
    out
}

/// `verdict doctor`: prints the checks; fails if any check failed.
pub fn run(
    output: crate::client::Output,
    cli: &Cli,
    settings: &Settings,
    source: &SourceFlags,
) -> anyhow::Result<()> {
    let all = checks(cli, settings, source);
    match output {
        o if o.structured() => crate::out::print(&crate::client::structured(&json(&all), o)?)?,
        _ => crate::out::print(&text(&all))?,
    }
    let failed = all.iter().filter(|c| c.status == Status::Fail).count();
    anyhow::ensure!(failed == 0, "{failed} checks failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_floor_is_5_13() {
        assert_eq!(kernel("6.18.44-fc-v1045").status, Status::Pass);
        assert_eq!(kernel("5.13.0").status, Status::Pass);
        let old = kernel("5.10.0-28-amd64");
        assert_eq!(old.status, Status::Fail);
        assert!(old.fix.unwrap().contains("5.13"));
    }

    #[test]
    fn modules_are_loaded_or_built_in() {
        let loaded =
            "nf_tables 344064 1 nft_chain_nat, Live 0x0\nnf_conntrack 188416 2 - Live 0x0\n";
        let c = modules(loaded, |m| m == "nf_nat");
        assert!(c.iter().all(|c| c.status == Status::Pass), "{c:?}");
        let c = modules("", |_| false);
        assert!(c.iter().all(|c| c.status == Status::Warn));
        assert!(c[0].fix.as_ref().unwrap().contains("modprobe nf_tables"));
    }

    #[test]
    fn net_admin_is_bit_12() {
        assert_eq!(
            capability("CapEff:\t000001ffffffffff\n").status,
            Status::Pass
        );
        assert_eq!(
            capability("CapEff:\t0000000000000000\n").status,
            Status::Fail
        );
        assert_eq!(capability("").status, Status::Warn);
    }

    #[test]
    fn other_nat_chains_say_which_runs_first() {
        let chain = |family, table: &str, name: &str, base: Option<(&str, &'static str, i32)>| {
            verdict_nft::netlink::ChainInfo {
                family,
                table: table.into(),
                name: name.into(),
                base: base.map(|(k, h, p)| (k.to_owned(), h, p)),
            }
        };
        let listed = [
            chain(
                "ip",
                "verdict",
                "nat-prerouting",
                Some(("nat", "prerouting", -100)),
            ),
            chain("ip", "verdict", "services", None),
            chain(
                "inet",
                "firewalld",
                "nat_PREROUTING",
                Some(("nat", "prerouting", -90)),
            ),
            chain(
                "ip",
                "kube-proxy",
                "nat-prerouting",
                Some(("nat", "prerouting", -100)),
            ),
            chain(
                "ip",
                "cali",
                "cali-PREROUTING",
                Some(("nat", "prerouting", -110)),
            ),
            chain("ip", "x", "f", Some(("filter", "input", 0))),
        ];
        let chains = base_chains(&listed);
        assert_eq!(chains.len(), 5, "regular chains are not base chains");
        let c = other_nat_chains(&chains, "verdict");
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.detail.contains(
                "firewalld nat_PREROUTING (firewalld), prerouting hook: runs after verdict's"
            ),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("kube-proxy nat-prerouting (kube-proxy (nftables mode)), prerouting hook: same priority -100"), "{}", c.detail);
        assert!(
            c.detail
                .contains("(Calico), prerouting hook: runs BEFORE verdict's"),
            "{}",
            c.detail
        );
        let only_after = other_nat_chains(&chains[1..2], "verdict");
        assert_eq!(only_after.status, Status::Pass, "{only_after:?}");
        assert_eq!(
            other_nat_chains(&chains[..1], "verdict").detail,
            "no other table has NAT chains on prerouting, output or postrouting"
        );
    }

    #[test]
    fn kube_proxy_leftovers_are_warned_about() {
        let t = |f: &'static str, n: &str| (f, n.to_owned());
        assert_eq!(
            kube_proxy_tables(&[t("ip", "verdict"), t("ip6", "verdict")]).status,
            Status::Pass
        );
        let k = kube_proxy_tables(&[
            t("ip", "verdict"),
            t("ip", "kube-proxy"),
            t("inet", "kube-proxy"),
        ]);
        assert_eq!(k.status, Status::Warn);
        assert_eq!(k.detail, "present: table ip kube-proxy");
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        let c = kube_proxy_chains(
            &[],
            &[
                ("iptables-legacy-save", save.into()),
                ("ip6tables-legacy-save", "*nat\nCOMMIT\n".into()),
            ],
        );
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.detail, "2 in iptables-legacy-save");
        let chain = |table: &str, name: &str| verdict_nft::netlink::ChainInfo {
            family: "ip",
            table: table.into(),
            name: name.into(),
            base: None,
        };
        let nft = [
            chain("nat", "KUBE-SERVICES"),
            chain("nat", "KUBE-SEP-X"),
            chain("filter", "KUBE-FIREWALL"),
            chain("kube-proxy", "KUBE-SERVICES"),
        ];
        assert_eq!(
            kube_proxy_chains(&nft, &[]).detail,
            "2 in iptables-nft (ip nat)"
        );
        assert_eq!(kube_proxy_chains(&[], &[]).status, Status::Pass);
    }

    #[test]
    fn sysctls_are_judged() {
        assert_eq!(
            sysctl("net.ipv4.ip_forward", Some("1\n"), "1", true, "").status,
            Status::Pass
        );
        let off = sysctl(
            "net.ipv4.ip_forward",
            Some("0\n"),
            "1",
            true,
            "not forwarded",
        );
        assert_eq!(off.status, Status::Fail);
        assert_eq!(off.fix.as_deref(), Some("sysctl -w net.ipv4.ip_forward=1"));
        assert_eq!(route_localnet(Some("1")).status, Status::Warn);
        assert_eq!(route_localnet(Some("0")).status, Status::Pass);
        assert_eq!(bridge(true, Some("1")).status, Status::Pass);
        assert_eq!(bridge(true, Some("0")).status, Status::Fail);
        assert_eq!(bridge(false, None).status, Status::Warn);
        assert_eq!(conntrack_fill(Some(10), Some(1000)).status, Status::Pass);
        assert_eq!(conntrack_fill(Some(800), Some(1000)).status, Status::Warn);
        assert_eq!(conntrack_fill(Some(950), Some(1000)).status, Status::Fail);
        assert_eq!(conntrack_fill(None, None).status, Status::Warn);
    }

    #[test]
    fn rbac_denials_fail_what_verdict_cannot_do_without() {
        use verdict_k8s::access::{Access, Permission};
        let p = |verb, resource, allowed| Permission {
            verb,
            group: "",
            resource,
            answer: Ok(allowed),
            reason: (!allowed).then(|| "no".to_owned()),
        };
        let checks = api(&Ok(Access {
            version: Ok("v1.33.0".into()),
            permissions: vec![
                p("watch", "services", false),
                p("create", "events", false),
                p("list", "nodes", true),
            ],
        }));
        assert_eq!(checks[0].status, Status::Pass);
        assert_eq!(checks[1].status, Status::Fail, "{:?}", checks[1]);
        assert_eq!(checks[2].status, Status::Warn, "Events are optional");
        assert_eq!(checks[3].status, Status::Pass);
        let down = api(&Ok(Access {
            version: Err("connection refused".into()),
            permissions: Vec::new(),
        }));
        assert_eq!(down[0].status, Status::Fail);
        assert_eq!(json(&checks)["status"], "fail");
    }

    #[test]
    fn drift_fails_when_the_kernel_differs() {
        let ok = drift(&Ok(
            json!({"families": [{"family": "ip", "table": true, "missing": 0, "differs": 0, "extra": 0}, {"family": "ip6", "table": false}]}),
        ));
        assert_eq!(ok.status, Status::Pass, "{ok:?}");
        let bad = drift(&Ok(
            json!({"families": [{"family": "ip", "table": true, "missing": 2, "differs": 0, "extra": 1}]}),
        ));
        assert_eq!(bad.status, Status::Fail);
        assert_eq!(drift(&Err("cannot reach".into())).status, Status::Warn);
    }
}
