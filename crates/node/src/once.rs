//! What verdict does once and exits: `plan` (the node built in memory and
//! its script printed), the offline introspection commands (the same
//! node, answering), `cleanup`, and `--init-only`.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use verdict_admin::Metrics;
use verdict_nft::{Backend, BackendKind, Family, MemoryBackend, Transaction};

use crate::api::Offline;
use crate::error::NodeError;
use crate::input::{Input, Source};
use crate::proxy::{Host, KernelAddresses, NodeProxy};
use crate::settings::{ConntrackSettings, NodeSettings};

/// How long `plan` waits for the API server's initial lists.
pub const PLAN_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The node as `run` would program it for the source's current state,
/// synced into memory (both families). `probe`: the kernel backend whose
/// dry run tells what the kernel supports; without it (or without the
/// privilege to dry-run), every feature is assumed to work.
pub fn in_memory(
    settings: NodeSettings,
    metrics: Arc<Mutex<Metrics>>,
    source: Source,
    probe: Option<BackendKind>,
) -> Result<(NodeProxy, MemoryBackend), NodeError> {
    let mut node = NodeProxy::new(settings, metrics, &KernelAddresses)?;
    if let Some(kind) = probe {
        let probed = kind
            .open()
            .map_err(|e| NodeError::kernel("opening nftables", e))
            .and_then(|mut backend| node.probe(backend.as_mut()));
        if let Err(e) = probed {
            tracing::warn!(
                error = %e,
                "cannot dry-run the ruleset here: the plan assumes every feature works (run would check)"
            );
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = node.settings().node_name.clone();
    source.start(&name, tx)?;
    let deadline = Instant::now() + PLAN_LIST_TIMEOUT;
    let take = |node: &mut NodeProxy, wait: Duration| -> Result<bool, NodeError> {
        match rx.recv_timeout(wait) {
            Ok(Input::Updates(u)) => {
                node.apply(u);
                Ok(true)
            }
            Ok(Input::SourceStopped(why)) => Err(NodeError::SourceStopped(why)),
            Ok(_) => Ok(true),
            Err(RecvTimeoutError::Timeout) => Ok(false),
            Err(RecvTimeoutError::Disconnected) => {
                Err(NodeError::SourceStopped("its thread ended".into()))
            }
        }
    };
    while !node.ready() {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(NodeError::ListTimeout(PLAN_LIST_TIMEOUT));
        };
        take(&mut node, left)?;
    }
    // Whatever else arrived with the lists.
    while take(&mut node, Duration::from_millis(50))? {}
    let mut memory = MemoryBackend::new();
    node.sync(
        &mut memory,
        Host::Memory,
        &KernelAddresses,
        Instant::now(),
        true,
        "first sync",
    )?;
    Ok((node, memory))
}

/// The nftables script `run` would program for the source's current
/// state, both families.
pub fn plan(
    settings: NodeSettings,
    metrics: Arc<Mutex<Metrics>>,
    source: Source,
    probe: Option<BackendKind>,
) -> Result<String, NodeError> {
    let (node, memory) = in_memory(settings, metrics, source, probe)?;
    let mut out = String::new();
    for p in node.proxiers() {
        let c = p.config();
        out.push_str(&memory.dump(c.nft_family(), &c.table));
    }
    Ok(out)
}

/// The node built in memory, answering the introspection API offline.
pub fn offline(
    settings: NodeSettings,
    metrics: Arc<Mutex<Metrics>>,
    source: Source,
    probe: Option<BackendKind>,
) -> Result<Offline, NodeError> {
    let (node, memory) = in_memory(settings, metrics, source, probe)?;
    Ok(Offline::new(node.handle(), memory))
}

/// How `cleanup` looks for a running kube-proxy.
#[derive(Clone, Debug)]
pub struct KubeProxyCheck {
    /// Where kube-proxy's health server would answer (its `/healthz`).
    pub health: Vec<std::net::SocketAddr>,
    /// Where kube-proxy's metrics server would answer (its `/proxyMode`).
    pub metrics: Vec<std::net::SocketAddr>,
    /// kube-proxy's sync period: a health server that says it synced its
    /// rules within it is said to have.
    pub sync_period: std::time::Duration,
}

/// Removes verdict's tables (both families) and kube-proxy's state: its
/// iptables and IPVS leftovers and, unless kept, its nftables tables.
/// Unless `force`, it refuses (and changes nothing) while kube-proxy runs
/// on the node: a process of that name in this network namespace, or
/// kube-proxy's health or metrics server answering (which is how a
/// kube-proxy in a container verdict cannot see the processes of, such
/// as verdict's own pod without hostPID, shows itself, with when it last
/// wrote its rules). verdict's own servers name themselves, and do not
/// count. kube-proxy does not write its rules again
/// until something changes or its periodic resync (up to an hour), and
/// its Services would not work meanwhile.
pub fn cleanup(
    kind: BackendKind,
    keep_kube_proxy_nftables: bool,
    force: bool,
    check: &KubeProxyCheck,
) -> Result<(), NodeError> {
    const AFTER: &str = "deleting its rules now would stop its Services until it writes them \
                         again, which it may not do for an hour. Stop it first (or pass --force); \
                         nothing was changed";
    if !force && let Some(pid) = crate::leftovers::kube_proxy_running() {
        return Err(NodeError::CleanupRefused(format!(
            "kube-proxy runs in this network namespace (pid {pid}): {AFTER}"
        )));
    }
    if !force {
        for addr in &check.health {
            let Some(last) = crate::leftovers::kube_proxy_health(*addr) else {
                continue;
            };
            let when = match last.and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
            {
                Some(ago) if ago <= check.sync_period => format!(
                    "synced its rules {} s ago, within its sync period ({} s)",
                    ago.as_secs(),
                    check.sync_period.as_secs()
                ),
                Some(ago) => format!("last synced its rules {} s ago", ago.as_secs()),
                None => "has not synced its rules yet".to_owned(),
            };
            return Err(NodeError::CleanupRefused(format!(
                "kube-proxy's health server answers at {addr} and {when}: {AFTER}"
            )));
        }
        for addr in &check.metrics {
            if let Some(mode) = crate::leftovers::kube_proxy_metrics(*addr) {
                return Err(NodeError::CleanupRefused(format!(
                    "kube-proxy's metrics server answers at {addr} (proxy mode {mode}): {AFTER}"
                )));
            }
        }
    }
    let mut nft = kind
        .open()
        .map_err(|e| NodeError::kernel("opening nftables", e))?;
    for family in [Family::Ip, Family::Ip6] {
        // Deleted whatever it holds: a table that is not there is refused
        // as not found.
        let mut tx = Transaction::new(family, verdict_proxier::config::DEFAULT_TABLE);
        tx.delete_table();
        match nft.run(&tx) {
            Ok(()) => {
                tracing::info!(%family, "deleted table {}", verdict_proxier::config::DEFAULT_TABLE)
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(NodeError::kernel("deleting verdict's table", e)),
        }
    }
    let problems = crate::leftovers::cleanup(keep_kube_proxy_nftables, nft.as_mut());
    if !problems.is_empty() {
        return Err(NodeError::Cleanup(problems.join("; ")));
    }
    Ok(())
}

/// `--init-only`: the privileged settings (conntrack sysctls, the OOM
/// score), so that the long-running process needs only CAP_NET_ADMIN.
pub fn init_only(
    conntrack: &ConntrackSettings,
    oom_score_adj: Option<i32>,
) -> Result<(), NodeError> {
    crate::probe::check_net_admin()?;
    crate::setup::apply(conntrack, oom_score_adj)?;
    tracing::info!("--init-only: conntrack settings applied");
    Ok(())
}
