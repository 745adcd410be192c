//! The benchmark's namespaces.
//!
//! ```text
//!            ┌─ eth1 10.201.0.1 ─ node  [verdict]   ── be1 10.200.0.11, be2 10.200.0.12
//!  cli ──────┼─ eth2 10.202.0.1 ─ node0 [no rules]  ── fb  10.203.0.11           (the floor)
//!            ├─ eth3 10.204.0.1 ─ nodei [iptables]  ── ib1 10.200.0.11, ib2 10.200.0.12 (baseline)
//!            └─ eth5 10.205.0.1 ─ nodeu [kube-proxy nftables] ── ub1, ub2 (the same)  (baseline)
//! ```
//!
//! Services live in 172.30.0.0/15 (verdict), 172.32.0.0/15 (iptables) and
//! 172.34.0.0/15 (upstream's nftables layout), room for 128,000 each;
//! the client routes each range to its node. Every namespace belongs to
//! this run and is deleted on drop.

use std::net::Ipv4Addr;
use std::path::Path;

use verdict_e2e::netns::{CmdError, Netns, Process, unique_prefix, veth, wait_ready};

/// Backend addresses behind the node under test (and behind the baseline).
pub const BACKENDS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 200, 0, 11), Ipv4Addr::new(10, 200, 0, 12)];
/// The floor's backend, behind the rule-free node.
pub const FLOOR: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 11);
/// The node's own address on the client link.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);

/// The namespaces of one benchmark run.
pub struct Topo {
    // Servers first: they are stopped before their namespaces go.
    servers: Vec<Process>,
    /// The client.
    pub cli: Netns,
    /// The node verdict programs.
    pub node: Netns,
    /// The rule-free node (floor).
    pub node0: Netns,
    /// The iptables baseline node, if any.
    pub nodei: Option<Netns>,
    /// The node with kube-proxy's own nftables layout, if any.
    pub nodeu: Option<Netns>,
    backends: Vec<Netns>,
}

impl Topo {
    /// Builds the topology and starts the backends' servers (`self_exe serve`).
    pub fn new(
        self_exe: &Path,
        ports: &[u16],
        baseline: bool,
        upstream: bool,
    ) -> Result<Topo, CmdError> {
        let p = unique_prefix();
        let cli = Netns::create(&format!("{p}-cli"))?;
        let node = Netns::create(&format!("{p}-node"))?;
        let node0 = Netns::create(&format!("{p}-node0"))?;
        let nodei = if baseline {
            Some(Netns::create(&format!("{p}-nodei"))?)
        } else {
            None
        };
        let nodeu = if upstream {
            Some(Netns::create(&format!("{p}-nodeu"))?)
        } else {
            None
        };
        let mut topo = Topo {
            servers: Vec::new(),
            cli,
            node,
            node0,
            nodei,
            nodeu,
            backends: Vec::new(),
        };
        let mut nodes: Vec<(&Netns, &str, u8, &str, Vec<Ipv4Addr>)> = vec![
            (&topo.node, "eth1", 1, "172.30.0.0/15", BACKENDS.to_vec()),
            (&topo.node0, "eth2", 2, "", vec![FLOOR]),
        ];
        if let Some(ni) = &topo.nodei {
            nodes.push((ni, "eth3", 4, "172.32.0.0/15", BACKENDS.to_vec()));
        }
        if let Some(nu) = &topo.nodeu {
            nodes.push((nu, "eth5", 5, "172.34.0.0/15", BACKENDS.to_vec()));
        }
        let mut backends = Vec::new();
        let mut servers = Vec::new();
        for (k, (n, cli_if, net, svc_cidr, bes)) in nodes.iter().enumerate() {
            n.sysctl("net.ipv4.ip_forward", "1")?;
            n.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            n.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
            veth(&topo.cli, cli_if, n, "eth0")?;
            topo.cli
                .ip(&["addr", "add", &format!("10.20{net}.0.2/24"), "dev", cli_if])?;
            n.ip(&["addr", "add", &format!("10.20{net}.0.1/24"), "dev", "eth0"])?;
            let gw = format!("10.20{net}.0.1");
            if !svc_cidr.is_empty() {
                topo.cli.ip(&["route", "add", svc_cidr, "via", &gw])?;
            }
            for (j, be) in bes.iter().enumerate() {
                let ns = Netns::create(&format!("{p}-b{k}{j}"))?;
                let vp = format!("vp{j}");
                veth(n, &vp, &ns, "eth0")?;
                n.ip(&["addr", "add", "169.254.1.1/32", "dev", &vp])?;
                n.ip(&["route", "add", &format!("{be}/32"), "dev", &vp])?;
                ns.ip(&["addr", "add", &format!("{be}/32"), "dev", "eth0"])?;
                ns.ip(&[
                    "route",
                    "add",
                    "default",
                    "via",
                    "169.254.1.1",
                    "dev",
                    "eth0",
                    "onlink",
                ])?;
                // Direct pod routes from the client: the floor, and the
                // "pod through the node" target.
                if k < 2 {
                    topo.cli
                        .ip(&["route", "replace", &format!("{be}/32"), "via", &gw])?;
                }
                servers.push(serve(self_exe, &ns, *be, ports)?);
                backends.push(ns);
            }
        }
        topo.backends = backends;
        topo.servers = servers;
        Ok(topo)
    }

    /// Number of backend namespaces (for the report).
    pub fn backends(&self) -> usize {
        self.backends.len()
    }
}

fn serve(self_exe: &Path, ns: &Netns, addr: Ipv4Addr, ports: &[u16]) -> Result<Process, CmdError> {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let exe = self_exe.to_string_lossy().into_owned();
    wait_ready(
        ns.spawn(&exe, &["serve", &addr.to_string(), &ports.join(",")])?,
        &format!("server in {}", ns.name()),
    )
}
