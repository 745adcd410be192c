//! Synthetic clusters: N ClusterIP services with K endpoints each, as API
//! objects for the proxier, and the same services in kube-proxy's iptables
//! layout for the baseline.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use verdict_model::{
    AddressType, EndpointSlice, Protocol, Service, ServicePortSpec, SliceEndpoint, SlicePort,
};

use crate::topo::BACKENDS;

/// The service port every synthetic service exposes.
pub const SERVICE_PORT: u16 = 80;
/// First backend port; endpoints use `BACKEND_PORT..BACKEND_PORT+K/2`.
pub const BACKEND_PORT: u16 = 8080;

/// The i-th service address in `172.{second}.0.0/16`.
pub fn service_ip(second: u8, i: usize) -> Ipv4Addr {
    // 64,000 per /16; beyond, the next /16 (100,000 services reach
    // 172.31.143.250 from 172.30).
    let block = i / 250;
    Ipv4Addr::new(
        172,
        second.wrapping_add((block / 256) as u8),
        (block % 256) as u8,
        (i % 250 + 1) as u8,
    )
}

/// The ports the backends serve for K endpoints per service.
pub fn backend_ports(k: usize) -> Vec<u16> {
    (0..k.div_ceil(2) as u16)
        .map(|j| BACKEND_PORT + j)
        .collect()
}

/// The K endpoints (address, port) of every service: both backends, on
/// `ceil(K/2)` ports, so every endpoint is a real listener.
pub fn endpoints(k: usize) -> Vec<(Ipv4Addr, u16)> {
    (0..k)
        .map(|j| (BACKENDS[j % 2], BACKEND_PORT + (j / 2) as u16))
        .collect()
}

/// Service `i`: a ClusterIP service with one TCP port.
pub fn service(i: usize) -> Service {
    Service {
        namespace: "bench".into(),
        name: format!("svc{i}"),
        cluster_ips: vec![service_ip(30, i).to_string()],
        ports: vec![ServicePortSpec {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: SERVICE_PORT.into(),
            node_port: None,
        }],
        ..Service::default()
    }
}

/// The slices of service `i`: one per endpoint port.
pub fn slices(i: usize, eps: &[(Ipv4Addr, u16)], shift: u16) -> Vec<EndpointSlice> {
    let name = format!("svc{i}");
    let mut ports: Vec<u16> = eps.iter().map(|(_, p)| *p).collect();
    ports.sort_unstable();
    ports.dedup();
    ports
        .iter()
        .map(|port| EndpointSlice {
            namespace: "bench".into(),
            name: format!("{name}-{port}"),
            service_name: Some(name.clone()),
            address_type: AddressType::IPv4,
            ports: vec![SlicePort {
                name: Some("http".into()),
                port: Some(i32::from(*port + shift)),
                protocol: Protocol::Tcp,
            }],
            endpoints: eps
                .iter()
                .filter(|(_, p)| p == port)
                .map(|(ip, _)| SliceEndpoint {
                    addresses: vec![ip.to_string()],
                    node_name: Some("bench-node".into()),
                    ..SliceEndpoint::default()
                })
                .collect(),
            last_change_trigger_time: None,
        })
        .collect()
}

/// kube-proxy's iptables-mode nat rules for the same services (in
/// 172.32.0.0/15): `KUBE-SERVICES` with one rule per service, a
/// `KUBE-SVC-*` chain with statistic-random jumps, a `KUBE-SEP-*` chain
/// per endpoint doing the DNAT, and the masquerade chains.
pub fn iptables_restore(n: usize, eps: &[(Ipv4Addr, u16)]) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    let _ = writeln!(chains, "*nat");
    for c in ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"] {
        let _ = writeln!(chains, ":{c} - [0:0]");
    }
    let _ = writeln!(
        rules,
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    let _ = writeln!(
        rules,
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    let _ = writeln!(
        rules,
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING"
    );
    let _ = writeln!(
        rules,
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN"
    );
    let _ = writeln!(rules, "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000");
    let _ = writeln!(
        rules,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let _ = writeln!(rules, "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000");
    for i in 0..n {
        let vip = service_ip(32, i);
        let name = format!("bench/svc{i}:http");
        let svc_chain = format!("KUBE-SVC-{i:016X}");
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {SERVICE_PORT} -j {svc_chain}"
        );
        let _ = writeln!(
            rules,
            "-A {svc_chain} ! -s 10.200.0.0/16 -d {vip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {SERVICE_PORT} -j KUBE-MARK-MASQ"
        );
        for (j, (ip, port)) in eps.iter().enumerate() {
            let sep = format!("KUBE-SEP-{i:010X}{j:06X}");
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let left = eps.len() - j;
            if left > 1 {
                let _ = writeln!(
                    rules,
                    "-A {svc_chain} -m comment --comment \"{name} -> {ip}:{port}\" -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(
                    rules,
                    "-A {svc_chain} -m comment --comment \"{name} -> {ip}:{port}\" -j {sep}"
                );
            }
            let _ = writeln!(
                rules,
                "-A {sep} -s {ip}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                rules,
                "-A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {ip}:{port}"
            );
        }
    }
    chains.push_str(&rules);
    chains.push_str("COMMIT\n");
    chains
}

/// kube-proxy's nftables-mode ruleset for the same services (in
/// 172.34.0.0/15), in the layout its proxier writes (upstream §1.6–1.7):
/// the base chains and shared maps, then per service a `service-*` chain
/// with the masquerade rule and a `numgen random mod K vmap { … }` (one
/// anonymous map per service), an `endpoint-*` chain per endpoint doing
/// the DNAT, and the service's elements in `cluster-ips` and
/// `service-ips`. Loaded with `nft -f`, as knftables sends it.
pub fn upstream_nftables(n: usize, eps: &[(Ipv4Addr, u16)]) -> String {
    const T: &str = "ip kube-proxy";
    let mut s = String::new();
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(format!(
        "add table {T} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    line(format!(
        "add set {T} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"
    ));
    line(format!(
        "add set {T} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}"
    ));
    let vmap = "type ipv4_addr . inet_proto . inet_service : verdict";
    for (map, comment) in [
        (
            "firewall-ips",
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            "no-endpoint-services",
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            "service-ips",
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
    ] {
        line(format!(
            "add map {T} {map} {{ {vmap} ; comment \"{comment}\" ; }}"
        ));
    }
    for (map, comment) in [
        (
            "no-endpoint-nodeports",
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        ("service-nodeports", "NodePort traffic"),
    ] {
        line(format!(
            "add map {T} {map} {{ type inet_proto . inet_service : verdict ; comment \"{comment}\" ; }}"
        ));
    }
    for (chain, hook) in [
        (
            "filter-prerouting-pre-dnat",
            "type filter hook prerouting priority -110",
        ),
        (
            "filter-output-pre-dnat",
            "type filter hook output priority -110",
        ),
        ("filter-forward", "type filter hook forward priority 0"),
        ("filter-input", "type filter hook input priority 0"),
        ("filter-output", "type filter hook output priority 0"),
        ("nat-output", "type nat hook output priority -100"),
        ("nat-postrouting", "type nat hook postrouting priority 100"),
        ("nat-prerouting", "type nat hook prerouting priority -100"),
    ] {
        line(format!("add chain {T} {chain} {{ {hook} ; }}"));
    }
    for chain in [
        "cluster-ips-check",
        "firewall-check",
        "mark-for-masquerade",
        "masquerading",
        "nodeport-endpoints-check",
        "reject-chain",
        "services",
        "service-endpoints-check",
    ] {
        line(format!("add chain {T} {chain}"));
    }
    for rule in [
        "cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
        "cluster-ips-check ip daddr { 172.34.0.0/15 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "filter-prerouting-pre-dnat ct state new jump firewall-check",
        "filter-forward ct state new jump service-endpoints-check",
        "filter-forward ct state new jump cluster-ips-check",
        "filter-input ct state new jump nodeport-endpoints-check",
        "filter-input ct state new jump service-endpoints-check",
        "filter-output ct state new jump service-endpoints-check",
        "filter-output-pre-dnat ct state new jump firewall-check",
        "filter-output ct state new jump cluster-ips-check",
        "firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips",
        "mark-for-masquerade mark set mark or 0x4000",
        "masquerading mark and 0x4000 == 0 return",
        "masquerading mark set mark xor 0x4000",
        "masquerading masquerade fully-random",
        "nat-output jump services",
        "nat-postrouting jump masquerading",
        "nat-prerouting jump services",
        "nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        "reject-chain reject",
        "services ip daddr . meta l4proto . th dport vmap @service-ips",
        "services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
    ] {
        line(format!("add rule {T} {rule}"));
    }
    for i in 0..n {
        let vip = service_ip(34, i);
        // Upstream prefixes a hash of the name; any unique prefix does.
        let name = format!("bench/svc{i}/tcp/http");
        let svc = format!("service-{i:08X}-{name}");
        line(format!("add chain {T} {svc}"));
        line(format!(
            "add rule {T} {svc} ip daddr {vip} ip saddr != 10.200.0.0/16 jump mark-for-masquerade"
        ));
        let mut arms = Vec::new();
        for (j, (ip, port)) in eps.iter().enumerate() {
            let ep = format!("endpoint-{i:06X}{j:02X}-{name}__{ip}/{port}");
            line(format!("add chain {T} {ep}"));
            line(format!(
                "add rule {T} {ep} ip saddr {ip} jump mark-for-masquerade"
            ));
            line(format!(
                "add rule {T} {ep} meta l4proto tcp dnat to {ip}:{port}"
            ));
            arms.push(format!("{j} : goto {ep}"));
        }
        line(format!(
            "add rule {T} {svc} numgen random mod {} vmap {{ {} }}",
            eps.len(),
            arms.join(" , ")
        ));
        line(format!("add element {T} cluster-ips {{ {vip} }}"));
        line(format!(
            "add element {T} service-ips {{ {vip} . tcp . {SERVICE_PORT} : goto {svc} }}"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_real_listeners() {
        let e = endpoints(10);
        assert_eq!(e.len(), 10);
        assert_eq!(backend_ports(10), vec![8080, 8081, 8082, 8083, 8084]);
        assert!(e.iter().all(|(_, p)| backend_ports(10).contains(p)));
        let unique: std::collections::BTreeSet<_> = e.iter().collect();
        assert_eq!(unique.len(), 10);
    }

    #[test]
    fn slices_cover_every_endpoint() {
        let e = endpoints(10);
        let s = slices(3, &e, 0);
        assert_eq!(s.len(), 5);
        assert_eq!(s.iter().map(|s| s.endpoints.len()).sum::<usize>(), 10);
        assert_eq!(service_ip(30, 0).to_string(), "172.30.0.1");
        assert_eq!(service_ip(30, 29_999).to_string(), "172.30.119.250");
        assert_eq!(service_ip(30, 63_999).to_string(), "172.30.255.250");
        assert_eq!(service_ip(30, 64_000).to_string(), "172.31.0.1");
        let all: std::collections::BTreeSet<_> = (0..100_000).map(|i| service_ip(30, i)).collect();
        assert_eq!(all.len(), 100_000, "no address twice");
    }

    #[test]
    fn iptables_layout_matches_kube_proxy_shape() {
        let text = iptables_restore(2, &endpoints(2));
        assert_eq!(text.matches("-A KUBE-SERVICES ").count(), 2);
        assert_eq!(text.matches("--probability 0.50000000000").count(), 2);
        assert_eq!(text.matches("-j DNAT --to-destination").count(), 4);
        // 8 nat rules per 2-endpoint service, as kube-proxy writes.
        let per_service = text.lines().filter(|l| l.contains("svc0")).count();
        assert_eq!(per_service, 8);
        assert!(text.ends_with("COMMIT\n"));
    }

    #[test]
    fn upstream_layout_has_a_chain_and_an_anonymous_map_per_service() {
        let text = upstream_nftables(3, &endpoints(2));
        assert_eq!(text.matches("numgen random mod 2 vmap {").count(), 3);
        assert_eq!(text.matches("dnat to 10.200.0.11:8080").count(), 3);
        assert_eq!(text.matches(" : goto endpoint-").count(), 6);
        assert!(text.contains(
            "add element ip kube-proxy service-ips { 172.34.0.3 . tcp . 80 : goto service-00000002-bench/svc2/tcp/http }"
        ));
        // 3 endpoint-chain lines per endpoint, 4 more per service.
        let per_service = text.lines().filter(|l| l.contains("svc1/")).count();
        assert_eq!(per_service, 2 * 3 + 4, "{text}");
    }
}
