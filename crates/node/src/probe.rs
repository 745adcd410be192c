//! Startup checks that probe instead of guessing: the process may change
//! the network (CAP_NET_ADMIN), and the kernel and nft accept, in a dry run
//! (`nft --check`, which the kernel validates and then aborts), the very
//! ruleset verdict programs for a service that uses every feature: numgen
//! DNAT, NodePort and `fib` local-address checks, masquerade, reject,
//! verdict maps with concatenated keys, interval sets for source ranges and
//! a dynamic session-affinity map with timeouts. The probe table has a name
//! of its own and is never committed.

use std::time::Instant;

use crate::error::NodeError;
use verdict_model::{
    AddressType, EndpointSlice, IpFamily, LoadBalancerIngress, Protocol, Service, ServicePortSpec,
    ServiceType, SessionAffinity, SliceEndpoint, SlicePort, TrafficPolicy,
};
use verdict_nft::{Backend, Family, NftError, TableState, Transaction};
use verdict_proxier::{Proxier, ProxierConfig};

/// Name of the dry-run table.
pub const PROBE_TABLE: &str = "verdict-probe";

/// CAP_NET_ADMIN's bit in the capability sets.
const CAP_NET_ADMIN: u32 = 12;

/// Whether a `/proc/…/status` text's effective set holds CAP_NET_ADMIN
/// (`None`: no readable `CapEff` line).
pub fn net_admin_in(status: &str) -> Option<bool> {
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    Some(eff & (1 << CAP_NET_ADMIN) != 0)
}

/// Whether a kernel release (`/proc/sys/kernel/osrelease`) is at least
/// 5.13, kube-proxy's floor for nftables mode.
pub fn kernel_supported(release: &str) -> bool {
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (5, 13)
}

/// Fails with a clear message unless the process has CAP_NET_ADMIN.
pub fn check_net_admin() -> Result<(), NodeError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| {
        NodeError::Startup(format!(
            "reading /proc/self/status to check capabilities: {e}"
        ))
    })?;
    let held = net_admin_in(&status)
        .ok_or_else(|| NodeError::Startup("no CapEff line in /proc/self/status".into()))?;
    if !held {
        return Err(NodeError::Startup(
            "verdict needs CAP_NET_ADMIN to program nftables and conntrack: run it as root \
             or grant the capability (securityContext.capabilities.add: [NET_ADMIN], \
             or privileged: true as kube-proxy's DaemonSet does)"
                .into(),
        ));
    }
    Ok(())
}

/// kube-proxy's kernel floor for nftables mode, overridable as upstream
/// (`KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK`).
pub fn check_kernel() -> Result<(), NodeError> {
    if std::env::var_os("KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK").is_some() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if !kernel_supported(&release) {
        return Err(NodeError::Startup(format!(
            "kernel {} is older than 5.13, which the nftables mode needs \
             (set KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK to try anyway)",
            release.trim()
        )));
    }
    Ok(())
}

/// Records transactions instead of running them.
#[derive(Default)]
struct Recording(Vec<Transaction>);

impl Backend for Recording {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.0.push(tx.clone());
        Ok(())
    }

    fn check(&mut self, _tx: &Transaction) -> Result<(), NftError> {
        Ok(())
    }

    fn table(&mut self, _family: Family, _name: &str) -> Result<Option<TableState>, NftError> {
        Ok(None)
    }
}

/// The probe cluster of one family: a LoadBalancer with every option, with
/// one endpoint, and a service without endpoints (reject).
fn probe_objects(family: IpFamily) -> (Vec<Service>, EndpointSlice) {
    let (cluster, cluster2, external, lb, range, endpoint, address_type) = match family {
        IpFamily::V4 => (
            "192.0.2.1",
            "192.0.2.2",
            "192.0.2.3",
            "192.0.2.4",
            "198.51.100.0/24",
            "192.0.2.10",
            AddressType::IPv4,
        ),
        IpFamily::V6 => (
            "2001:db8::1",
            "2001:db8::2",
            "2001:db8::3",
            "2001:db8::4",
            "2001:db8:1::/64",
            "2001:db8::10",
            AddressType::IPv6,
        ),
    };
    let port = |name: &str, protocol, node_port| ServicePortSpec {
        name: name.into(),
        protocol,
        port: 80,
        node_port,
    };
    let full = Service {
        namespace: "verdict-probe".into(),
        name: "full".into(),
        service_type: ServiceType::LoadBalancer,
        cluster_ips: vec![cluster.into()],
        ports: vec![
            port("tcp", Protocol::Tcp, Some(30998)),
            port("udp", Protocol::Udp, Some(30999)),
        ],
        external_ips: vec![external.into()],
        load_balancer_source_ranges: vec![range.into()],
        load_balancer_ingress: vec![LoadBalancerIngress {
            ip: Some(lb.into()),
            ip_mode: None,
        }],
        session_affinity: SessionAffinity::ClientIP,
        session_affinity_timeout_seconds: Some(10800),
        external_traffic_policy: TrafficPolicy::Local,
        internal_traffic_policy: TrafficPolicy::Cluster,
        health_check_node_port: Some(30997),
        ..Service::default()
    };
    let empty = Service {
        namespace: "verdict-probe".into(),
        name: "empty".into(),
        cluster_ips: vec![cluster2.into()],
        ports: vec![port("tcp", Protocol::Tcp, None)],
        ..Service::default()
    };
    let slice = EndpointSlice {
        namespace: "verdict-probe".into(),
        name: "full-1".into(),
        service_name: Some("full".into()),
        address_type,
        endpoints: vec![SliceEndpoint {
            addresses: vec![endpoint.into()],
            node_name: Some("verdict-probe-elsewhere".into()),
            ..SliceEndpoint::default()
        }],
        ports: ["tcp", "udp"]
            .iter()
            .zip([Protocol::Tcp, Protocol::Udp])
            .map(|(n, protocol)| SlicePort {
                name: Some((*n).into()),
                port: Some(8080),
                protocol,
            })
            .collect(),
        last_change_trigger_time: None,
    };
    (vec![full, empty], slice)
}

/// The transactions a fresh proxier with `config` (renamed to the probe
/// table) would run for the probe cluster.
pub fn probe_transactions(config: &ProxierConfig) -> Result<Vec<Transaction>, NodeError> {
    let mut cfg = config.clone();
    cfg.table = PROBE_TABLE.into();
    let family = cfg.family;
    let mut proxier = Proxier::new(cfg)?;
    let (services, slice) = probe_objects(family);
    for s in &services {
        proxier.on_service(None, Some(s));
    }
    proxier.on_endpoint_slice(&slice, false);
    let mut recorder = Recording::default();
    proxier.sync(&mut recorder, Instant::now())?;
    Ok(recorder.0)
}

fn check_all(backend: &mut dyn Backend, config: &ProxierConfig) -> Result<(), NodeError> {
    for tx in probe_transactions(config)? {
        backend
            .check(&tx)
            .map_err(|e| NodeError::kernel("the dry run", e))?;
    }
    Ok(())
}

/// Dry-runs the probe ruleset of every family through the backend (a
/// batch without its commit over netlink, `nft --check` through nft).
/// Returns the families for which only session affinity failed (see
/// `ProxierConfig::session_affinity`); any other refusal is an error.
pub fn probe_nftables(
    backend: &mut dyn Backend,
    configs: &[&ProxierConfig],
) -> Result<Vec<IpFamily>, NodeError> {
    let mut without_affinity = Vec::new();
    for config in configs {
        let family = config.nft_family();
        let Err(full) = check_all(backend, config) else {
            continue;
        };
        let mut reduced = (*config).clone();
        reduced.session_affinity = false;
        check_all(backend, &reduced).map_err(|e| {
            NodeError::Startup(format!(
                "the kernel or nft refused verdict's {family} ruleset in a dry run: {e}. \
                 verdict needs nf_tables with fib, numgen, ct, nat (masquerade), reject, \
                 concatenations, verdict maps and dynamic sets with timeouts \
                 (CONFIG_NFT_FIB_INET, CONFIG_NFT_NUMGEN, CONFIG_NFT_CT, CONFIG_NFT_NAT, \
                 CONFIG_NFT_MASQ, CONFIG_NFT_REJECT)"
            ))
        })?;
        tracing::warn!(
            %family,
            error = %full,
            "the backend cannot record ClientIP session affinity for this family (nft 1.0.6 \
             cannot in IPv6; the netlink backend and newer nft can): services with \
             sessionAffinity ClientIP are balanced per connection instead"
        );
        without_affinity.push(config.family);
    }
    Ok(without_affinity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_proxier::{LocalDetector, NodePortAddresses};

    fn config(family: IpFamily) -> ProxierConfig {
        let mut c = ProxierConfig::new(family, "node-a");
        c.node_ips = vec![match family {
            IpFamily::V4 => "192.168.0.2".parse().unwrap(),
            IpFamily::V6 => "fd00::2".parse().unwrap(),
        }];
        c.node_port_addresses = NodePortAddresses::primary();
        c.local_detector = LocalDetector::None;
        c
    }

    /// In a namespace of its own, on each backend: what the probe decides
    /// is what the kernel loads. A family it keeps affinity for loads with
    /// affinity; a family it turns affinity off for loads without it and
    /// is refused with it. Over netlink both families keep affinity: only
    /// nft's userspace refuses the IPv6 rule.
    #[test]
    fn the_probe_decides_what_the_kernel_loads() {
        use verdict_e2e::netns::{Netns, can_run, unique_prefix};
        if let Err(why) = can_run() {
            println!("skipped: {why}");
            return;
        }
        for netlink in [false, true] {
            let ns = Netns::create(&format!("{}probe", unique_prefix())).unwrap();
            let mut backend: Box<dyn Backend> = if netlink {
                Box::new(verdict_nft::NetlinkBackend::in_netns(ns.name()).unwrap())
            } else {
                Box::new(verdict_nft::NftCli::in_netns(ns.name()).unwrap())
            };
            let configs = [config(IpFamily::V4), config(IpFamily::V6)];
            let refs: Vec<&ProxierConfig> = configs.iter().collect();
            let without = probe_nftables(backend.as_mut(), &refs).unwrap();
            for c in &configs {
                let mut decided = c.clone();
                decided.session_affinity = !without.contains(&c.family);
                for tx in probe_transactions(&decided).unwrap() {
                    backend.run(&tx).unwrap();
                }
                if !decided.session_affinity {
                    let with = probe_transactions(c).unwrap();
                    assert!(with.iter().any(|tx| backend.check(tx).is_err()));
                }
            }
            if netlink {
                assert!(
                    without.is_empty(),
                    "over netlink: no affinity for {without:?}"
                );
            }
            println!("netlink {netlink}: session affinity unavailable for {without:?}");
        }
    }

    #[test]
    fn the_probe_uses_every_feature_and_only_its_own_table() {
        for family in [IpFamily::V4, IpFamily::V6] {
            let script: String = probe_transactions(&config(family))
                .unwrap()
                .iter()
                .map(|t| t.to_string())
                .collect();
            for needle in [
                "numgen random mod",
                "fib saddr type local",
                "masquerade",
                "reject",
                "update @affinity",
                "flags interval",
                "timeout",
                "vmap",
                "dnat",
            ] {
                assert!(
                    script.contains(needle),
                    "{family:?}: no {needle:?}\n{script}"
                );
            }
            assert!(script.contains(&format!(" {PROBE_TABLE}")));
            let real = verdict_proxier::config::DEFAULT_TABLE;
            assert!(
                !script.contains(&format!("ip {real} "))
                    && !script.contains(&format!("ip6 {real} ")),
                "{script}"
            );
        }
    }
}
