//! The test bed: a node, a router, a second node, an external client and
//! pods, all network namespaces.
//!
//! ```text
//!  ext (203.0.113.2, .130 / 2600:5200::1)
//!   │
//!  lan (router) ──── node2 (192.168.5.2 / 2001:db8:5::2) ── remote pods
//!   │
//!  node eth0: 192.168.0.2, 192.168.1.2, 192.168.99.11 / 2001:db8::1, 2001:db8:1::2
//!   └─ cbr0 (bridge, 169.254.1.1 / fe80::1) ── local pods (veth vpN, /32 routes)
//! ```
//!
//! Each node attaches its pods to a bridge `cbr0` that carries the pods'
//! gateway address; pods route everything through it (default route via
//! the gateway), so pod traffic always crosses the node's IP stack, as with
//! kube-proxy on a bridge CNI.
//!
//! The node is the one verdict programs. Addresses are kube-proxy's fake
//! proxier's, so its packet-flow cases run unchanged. Routing is symmetric
//! through the node: pods on the other node reach external clients back
//! through the node that received the connection (a policy route on the
//! router), which is what kube-proxy's expectations for unmasqueraded
//! external traffic assume.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::netns::{CmdError, Netns, Process, unique_prefix, veth, wait_ready};

/// Node interface addresses (both families).
pub const NODE_ADDRS: [&str; 5] = [
    "192.168.0.2/24",
    "192.168.1.2/24",
    "192.168.99.11/24",
    "2001:db8::1/64",
    "2001:db8:1::2/64",
];
const LAN_NODE_SIDE: [&str; 5] = [
    "192.168.0.1/24",
    "192.168.1.1/24",
    "192.168.99.1/24",
    "2001:db8::fe/64",
    "2001:db8:1::fe/64",
];
const NODE_GW: [&str; 2] = ["192.168.0.1", "2001:db8::fe"];
const NODE_VIA: [&str; 2] = ["192.168.0.2", "2001:db8::1"];
const NODE2_ADDRS: [&str; 2] = ["192.168.5.2/24", "2001:db8:5::2/64"];
const LAN_NODE2_SIDE: [&str; 2] = ["192.168.5.1/24", "2001:db8:5::fe/64"];
const NODE2_VIA: [&str; 2] = ["192.168.5.2", "2001:db8:5::2"];
const EXT_ADDRS: [&str; 3] = ["203.0.113.2/24", "203.0.113.130/24", "2600:5200::1/64"];
const LAN_EXT_SIDE: [&str; 2] = ["203.0.113.1/24", "2600:5200::fe/64"];
const EXT_GW: [&str; 2] = ["203.0.113.1", "2600:5200::fe"];

fn fam(ip: IpAddr) -> usize {
    if ip.is_ipv4() { 0 } else { 1 }
}

fn host(ip: IpAddr) -> String {
    if ip.is_ipv4() {
        format!("{ip}/32")
    } else {
        format!("{ip}/128")
    }
}

/// Where a pod lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the node under test.
    Local,
    /// On the other node, behind the router.
    Remote,
}

struct Pod {
    ns: usize,
}

/// A built test bed. Servers are stopped and namespaces deleted on drop.
pub struct TestBed {
    // Dropped first: servers hold their namespaces alive.
    servers: Vec<Process>,
    pods: BTreeMap<IpAddr, Pod>,
    pod_ns: Vec<Netns>,
    /// The node verdict programs.
    pub node: Netns,
    /// The router between node, node2 and the external client.
    pub lan: Netns,
    /// The other node, hosting remote pods.
    pub node2: Netns,
    /// The external client.
    pub ext: Netns,
    prefix: String,
    echo: PathBuf,
}

fn addr(ns: &Netns, cidr: &str, dev: &str) -> Result<(), CmdError> {
    if cidr.contains(':') {
        ns.ip(&["addr", "add", cidr, "dev", dev, "nodad"])
            .map(|_| ())
    } else {
        ns.ip(&["addr", "add", cidr, "dev", dev]).map(|_| ())
    }
}

/// The pods' bridge on a node, with the pods' gateway addresses.
fn pod_bridge(ns: &Netns) -> Result<(), CmdError> {
    ns.ip(&["link", "add", "cbr0", "type", "bridge"])?;
    ns.ip(&["link", "set", "cbr0", "up"])?;
    ns.ip(&["addr", "add", "169.254.1.1/32", "dev", "cbr0"])?;
    ns.ip(&["addr", "add", "fe80::1/64", "dev", "cbr0", "nodad"])?;
    Ok(())
}

fn router(ns: &Netns) -> Result<(), CmdError> {
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    // Interfaces created later (pod links) take the defaults.
    ns.sysctl("net.ipv6.conf.default.forwarding", "1")?;
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
    ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
    Ok(())
}

impl TestBed {
    /// Builds the fixed part of the topology. `echo` is the path of the
    /// `verdict-e2e-echo` binary.
    pub fn new(echo: PathBuf) -> Result<TestBed, CmdError> {
        let prefix = unique_prefix();
        let node = Netns::create(&format!("{prefix}-node"))?;
        let lan = Netns::create(&format!("{prefix}-lan"))?;
        let node2 = Netns::create(&format!("{prefix}-node2"))?;
        let ext = Netns::create(&format!("{prefix}-ext"))?;
        for ns in [&node, &lan, &node2] {
            router(ns)?;
        }
        pod_bridge(&node)?;
        pod_bridge(&node2)?;
        veth(&node, "eth0", &lan, "tonode")?;
        veth(&node2, "eth0", &lan, "tonode2")?;
        veth(&ext, "eth0", &lan, "toext")?;
        for (a, b) in NODE_ADDRS.iter().zip(LAN_NODE_SIDE) {
            addr(&node, a, "eth0")?;
            addr(&lan, b, "tonode")?;
        }
        for f in 0..2 {
            addr(&node2, NODE2_ADDRS[f], "eth0")?;
            addr(&lan, LAN_NODE2_SIDE[f], "tonode2")?;
            addr(&lan, LAN_EXT_SIDE[f], "toext")?;
        }
        for a in EXT_ADDRS {
            addr(&ext, a, "eth0")?;
        }
        for f in 0..2 {
            let v = if f == 0 { "-4" } else { "-6" };
            node.ip(&[v, "route", "add", "default", "via", NODE_GW[f]])?;
            node2.ip(&[
                v,
                "route",
                "add",
                "default",
                "via",
                LAN_NODE2_SIDE[f].split('/').next().unwrap_or(""),
            ])?;
            ext.ip(&[v, "route", "add", "default", "via", EXT_GW[f]])?;
        }
        // Replies from remote pods to external clients go back through the
        // node that received the traffic (as a cluster network that returns
        // traffic to its ingress node does); without this, unmasqueraded
        // external traffic (no local-traffic detector) would return
        // asymmetrically and never be un-DNATed.
        for (f, ext_net) in [(0, "203.0.113.0/24"), (1, "2600:5200::/64")] {
            let v = if f == 0 { "-4" } else { "-6" };
            lan.ip(&[
                v, "rule", "add", "iif", "tonode2", "to", ext_net, "table", "100",
            ])?;
            lan.ip(&[
                v,
                "route",
                "add",
                "default",
                "via",
                NODE_VIA[f],
                "table",
                "100",
            ])?;
        }
        Ok(TestBed {
            servers: Vec::new(),
            pods: BTreeMap::new(),
            pod_ns: Vec::new(),
            node,
            lan,
            node2,
            ext,
            prefix,
            echo,
        })
    }

    /// Whether `ip` belongs to a pod of this bed.
    pub fn has_pod(&self, ip: IpAddr) -> bool {
        self.pods.contains_key(&ip)
    }

    /// Adds a pod with address `ip`, serving the given ports.
    pub fn add_pod(
        &mut self,
        ip: IpAddr,
        place: Placement,
        tcp: &[u16],
        udp: &[u16],
    ) -> Result<(), CmdError> {
        let n = self.pod_ns.len();
        let ns = Netns::create(&format!("{}-p{n}", self.prefix))?;
        let host_ns = match place {
            Placement::Local => &self.node,
            Placement::Remote => &self.node2,
        };
        let vp = format!("vp{n}");
        veth(host_ns, &vp, &ns, "eth0")?;
        host_ns.ip(&["link", "set", &vp, "master", "cbr0"])?;
        // As a bridge CNI with hairpinMode: a pod may reach itself through
        // a service (the DNATed packet leaves by the port it came in on).
        host_ns.ip(&["link", "set", &vp, "type", "bridge_slave", "hairpin", "on"])?;
        if fam(ip) == 0 {
            ns.ip(&["addr", "add", &host(ip), "dev", "eth0"])?;
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
        } else {
            ns.ip(&["addr", "add", &host(ip), "dev", "eth0", "nodad"])?;
            ns.ip(&[
                "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
            ])?;
        }
        host_ns.ip(&["route", "add", &host(ip), "dev", "cbr0"])?;
        let f = fam(ip);
        let via = match place {
            Placement::Local => NODE_VIA[f],
            Placement::Remote => NODE2_VIA[f],
        };
        self.lan.ip(&["route", "add", &host(ip), "via", via])?;
        if !tcp.is_empty() || !udp.is_empty() {
            let server = self.serve(&ns, &[ip], tcp, udp)?;
            self.servers.push(server);
        }
        self.pod_ns.push(ns);
        self.pods.insert(ip, Pod { ns: n });
        Ok(())
    }

    /// Serves ports on node addresses (traffic that is not DNATed).
    pub fn serve_node(
        &mut self,
        addrs: &[IpAddr],
        tcp: &[u16],
        udp: &[u16],
    ) -> Result<(), CmdError> {
        let server = self.serve(&self.node, addrs, tcp, udp)?;
        self.servers.push(server);
        Ok(())
    }

    /// Routes a service address (ClusterIP, externalIP, LoadBalancer VIP)
    /// from the router to the node, as a real network would.
    pub fn route_to_node(&self, ip: IpAddr) -> Result<(), CmdError> {
        self.lan
            .ip(&["route", "replace", &host(ip), "via", NODE_VIA[fam(ip)]])
            .map(|_| ())
    }

    fn serve(
        &self,
        ns: &Netns,
        addrs: &[IpAddr],
        tcp: &[u16],
        udp: &[u16],
    ) -> Result<Process, CmdError> {
        let echo = self.echo.to_string_lossy().into_owned();
        let mut args: Vec<String> = vec!["serve".into()];
        for a in addrs {
            args.push("--addr".into());
            args.push(a.to_string());
        }
        for p in tcp {
            args.push("--tcp".into());
            args.push(p.to_string());
        }
        for p in udp {
            args.push("--udp".into());
            args.push(p.to_string());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        wait_ready(
            ns.spawn(&echo, &argv)?,
            &format!("echo server in {}", ns.name()),
        )
    }

    /// The namespace a packet from `src` is sent from, if there is one.
    pub fn sender(&self, src: IpAddr) -> Option<&Netns> {
        let is = |list: &[&str]| {
            list.iter()
                .any(|a| a.split('/').next() == Some(src.to_string().as_str()))
        };
        if is(&NODE_ADDRS) {
            Some(&self.node)
        } else if is(&EXT_ADDRS) {
            Some(&self.ext)
        } else {
            self.pods.get(&src).and_then(|p| self.pod_ns.get(p.ns))
        }
    }

    /// Makes one connection and returns the echo tool's answer line.
    pub fn connect(
        &self,
        src: IpAddr,
        dst: IpAddr,
        proto: &str,
        port: u16,
        timeout_ms: u64,
    ) -> Result<String, CmdError> {
        self.connect_from(src, 0, dst, proto, port, timeout_ms)
    }

    /// As [`TestBed::connect`], from source port `sport` (0: any), so that
    /// repeated UDP exchanges share one conntrack entry.
    pub fn connect_from(
        &self,
        src: IpAddr,
        sport: u16,
        dst: IpAddr,
        proto: &str,
        port: u16,
        timeout_ms: u64,
    ) -> Result<String, CmdError> {
        let ns = self
            .sender(src)
            .ok_or_else(|| CmdError(format!("no namespace owns source {src}")))?;
        let echo = self.echo.to_string_lossy().into_owned();
        let out = ns.exec(
            &echo,
            &[
                "connect",
                "--proto",
                proto,
                "--src",
                &src.to_string(),
                "--dst",
                &dst.to_string(),
                "--port",
                &port.to_string(),
                "--timeout-ms",
                &timeout_ms.to_string(),
                "--sport",
                &sport.to_string(),
            ],
        )?;
        Ok(out.trim().to_owned())
    }

    /// Sends UDP datagrams from `src` to `dst`:`port` without reading an
    /// answer, as [`How`] says; returns the datagrams and sockets used.
    pub fn send_udp(
        &self,
        src: IpAddr,
        dst: IpAddr,
        port: u16,
        how: How,
    ) -> Result<(u64, u64), CmdError> {
        let ns = self
            .sender(src)
            .ok_or_else(|| CmdError(format!("no namespace owns source {src}")))?;
        let echo = self.echo.to_string_lossy().into_owned();
        let mut args = vec![
            "send".to_owned(),
            "--src".into(),
            src.to_string(),
            "--dst".into(),
            dst.to_string(),
            "--port".into(),
            port.to_string(),
        ];
        match how {
            How::Each { sockets, packets } => args.extend([
                "--sockets".into(),
                sockets.to_string(),
                "--packets".into(),
                packets.to_string(),
            ]),
            How::Flood { seconds } => args.extend(["--seconds".into(), seconds.to_string()]),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ns.exec(&echo, &args)?;
        let mut words = out.split_whitespace().skip(1).map(str::parse::<u64>);
        match (words.next(), words.next()) {
            (Some(Ok(d)), Some(Ok(s))) => Ok((d, s)),
            _ => Err(CmdError(format!("unexpected answer of send: {out}"))),
        }
    }
}

/// How [`TestBed::send_udp`] sends.
#[derive(Clone, Copy, Debug)]
pub enum How {
    /// `packets` datagrams from each of `sockets` sockets.
    Each {
        /// Sockets, one after another.
        sockets: u64,
        /// Datagrams from each.
        packets: u64,
    },
    /// For `seconds`, as fast as one client can, a new socket per datagram.
    Flood {
        /// How long.
        seconds: u64,
    },
}
