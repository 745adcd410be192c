//! Per family, what the daemon keeps beside the proxier and the work after
//! a sync: the service health-check node ports and their local endpoint
//! counts, and stale UDP conntrack cleanup, looking only at what the sync
//! touched (all of it after a full sync).

use super::*;
use verdict_proxier::conntrack::{UdpTargets, UdpTracker};

/// Per family, the daemon's state beside the proxier.
#[derive(Default)]
pub(super) struct FamilyExtras {
    /// The UDP services' targets as of the last conntrack cleanup, and the
    /// services touched since.
    pub(super) udp: UdpTracker,
    /// The service health-check servers.
    pub(super) health_checks: Option<ServiceHealthServers>,
    /// The health-check node port of every service that has one.
    pub(super) hc_ports: BTreeMap<(String, String), u16>,
    /// Their local ready endpoints (absent: none).
    pub(super) hc_local: BTreeMap<(String, String), usize>,
    /// The health-check ports that could not be opened (an Event was
    /// posted for each).
    pub(super) hc_failed: BTreeSet<((String, String), u16)>,
}

/// The service ports of one service (a range of the map).
pub(super) fn ports_of<'a>(
    p: &'a Proxier,
    svc: &'a NamespacedName,
) -> impl Iterator<Item = &'a verdict_model::ServicePort> + 'a {
    p.service_ports()
        .range(ServicePortName::first_of(svc)..)
        .take_while(move |(name, _)| name.service == *svc)
        .map(|(_, sp)| &**sp)
}

/// Opens and closes the service health-check node ports of one family
/// (eTP=Local LoadBalancers) and updates their local endpoint counts:
/// for every service after a full sync, else for the `touched` ones.
pub(super) fn sync_health_checks(
    extras: &mut FamilyExtras,
    p: &Proxier,
    health: &Arc<Mutex<Health>>,
    touched: Option<&BTreeSet<NamespacedName>>,
    events: Option<&std::sync::mpsc::Sender<Notice>>,
    node: &str,
) {
    // Where NodePorts are served; v6 link-local addresses cannot be bound
    // without a scope and are skipped.
    let addresses: Vec<IpAddr> = p
        .config()
        .node_port_ips()
        .into_iter()
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80))
        .collect();
    let slot = &mut extras.health_checks;
    if slot.as_ref().is_none_or(|s| s.addresses() != addresses) {
        let h = health.clone();
        let healthy: Healthy = Arc::new(move || {
            h.lock()
                .map(|h| h.healthy(SystemTime::now()))
                .unwrap_or(false)
        });
        *slot = Some(ServiceHealthServers::new(addresses, healthy));
    }
    let Some(servers) = slot else {
        return;
    };
    let services: Vec<NamespacedName> = match touched {
        Some(t) => t.iter().cloned().collect(),
        None => {
            extras.hc_ports.clear();
            extras.hc_local.clear();
            let mut all: Vec<NamespacedName> = p
                .service_ports()
                .iter()
                .filter(|(_, sp)| sp.health_check_node_port.is_some())
                .map(|(name, _)| name.service.clone())
                .collect();
            all.dedup();
            all
        }
    };
    for svc in services {
        let key = (svc.namespace.to_string(), svc.name.to_string());
        extras.hc_ports.remove(&key);
        extras.hc_local.remove(&key);
        let Some(port) = ports_of(p, &svc).find_map(|sp| sp.health_check_node_port) else {
            continue;
        };
        extras.hc_ports.insert(key.clone(), port);
        // A quarantined service is not programmed: no load balancer should
        // send it here.
        let n = if p.quarantined_ports_of(&svc).next().is_some() {
            0
        } else {
            verdict_model::local_ready_endpoints_of(p.endpoints(), &svc)
        };
        if n > 0 {
            extras.hc_local.insert(key, n);
        }
    }
    let mut failing = BTreeSet::new();
    for f in servers.sync_services(&extras.hc_ports) {
        let (ns, name) = &f.service;
        tracing::warn!(
            service = %format!("{ns}/{name}"),
            port = f.port,
            address = %f.address,
            error = %f.error,
            "cannot open the service's health-check node port"
        );
        let key = (f.service.clone(), f.port);
        if !extras.hc_failed.contains(&key)
            && !failing.contains(&key)
            && let Some(tx) = events
        {
            // As kube-proxy's FailedToStartServiceHealthcheck.
            let _ = tx.send(Notice {
                regarding: Regarding::Service {
                    namespace: ns.clone(),
                    name: name.clone(),
                },
                warning: true,
                reason: "FailedToStartServiceHealthcheck",
                action: "Listen",
                note: format!(
                    "node {node} failed to start healthcheck \"{ns}/{name}\" on port {}: {}",
                    f.port, f.error
                ),
            });
        }
        failing.insert(key);
    }
    extras.hc_failed = failing;
    servers.sync_endpoints(extras.hc_local.clone());
}

/// Deletes the UDP conntrack entries `targets` says are stale; returns how
/// many were deleted.
pub(super) fn clean_stale_udp(
    ct: &mut dyn Conntrack,
    family: Family,
    targets: &UdpTargets,
) -> Result<usize, verdict_nft::conntrack::ConntrackError> {
    let t = Instant::now();
    let entries = ct.list_udp(family)?;
    let stale = targets.stale(&entries);
    let mut deleted = 0;
    for e in &stale {
        deleted += ct.delete_udp(family, e)?;
    }
    tracing::info!(%family, entries = entries.len(), deleted, elapsed = ?t.elapsed(), "reconciled UDP conntrack entries");
    Ok(deleted)
}
