//! Runs the proxier on a small example cluster against the in-memory
//! backend, prints the nftables script it programs, and traces a few
//! packets through it.
//!
//! `cargo run -p verdict-proxier --example demo`

use std::net::IpAddr;
use std::time::Instant;

use verdict_model::{
    AddressType, EndpointSlice, IpFamily, LoadBalancerIngress, Protocol, Service, ServicePortSpec,
    ServiceType, SliceEndpoint, SlicePort, TrafficPolicy,
};
use verdict_nft::{L4Proto, MemoryBackend, Packet, Tracer};
use verdict_proxier::{LocalDetector, Proxier, ProxierConfig};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

fn service(name: &str, cluster_ip: &str, port: i32, node_port: Option<i32>) -> Service {
    Service {
        namespace: "demo".into(),
        name: name.into(),
        cluster_ips: vec![cluster_ip.into()],
        ports: vec![ServicePortSpec {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port,
            node_port,
        }],
        ..Service::default()
    }
}

fn slice(service: &str, eps: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice {
        namespace: "demo".into(),
        name: format!("{service}-1"),
        service_name: Some(service.into()),
        address_type: AddressType::IPv4,
        ports: vec![SlicePort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Protocol::Tcp,
        }],
        endpoints: eps
            .iter()
            .map(|(ip, node)| SliceEndpoint {
                addresses: vec![ip.to_string()],
                node_name: Some(node.to_string()),
                ..SliceEndpoint::default()
            })
            .collect(),
        ..EndpointSlice::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = ProxierConfig::new(IpFamily::V4, "node-a");
    cfg.node_ips = vec![ip("192.168.0.10")];
    cfg.local_ips = vec![ip("192.168.0.10")];
    cfg.local_detector = LocalDetector::Cidr("10.244.0.0/16".parse()?);
    cfg.service_cidrs = vec!["10.96.0.0/12".parse()?];
    let mut proxier = Proxier::new(cfg)?;

    let web = service("web", "10.96.0.20", 80, None);
    let mut shop = service("shop", "10.96.0.30", 80, Some(30080));
    shop.service_type = ServiceType::LoadBalancer;
    shop.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: Some("203.0.113.50".into()),
        ip_mode: None,
    }];
    shop.external_traffic_policy = TrafficPolicy::Local;
    let empty = service("empty", "10.96.0.40", 80, None);
    for s in [&web, &shop, &empty] {
        proxier.on_service(None, Some(s));
    }
    proxier.on_endpoint_slice(
        &slice("web", &[("10.244.1.5", "node-b"), ("10.244.0.7", "node-a")]),
        false,
    );
    proxier.on_endpoint_slice(
        &slice(
            "shop",
            &[("10.244.0.9", "node-a"), ("10.244.2.3", "node-c")],
        ),
        false,
    );

    let mut nft = MemoryBackend::new();
    let result = proxier.sync(&mut nft, Instant::now())?;
    println!(
        "# first sync: full={} operations={}\n",
        result.full, result.operations
    );
    println!("{}", nft.dump(verdict_nft::Family::Ip, "verdict"));

    let table = nft
        .get(verdict_nft::Family::Ip, "verdict")
        .ok_or("no table")?;
    let tracer = Tracer::new(table, verdict_nft::Family::Ip, &[ip("192.168.0.10")]);
    for (what, src, dst, port, iif) in [
        (
            "pod to web's ClusterIP",
            "10.244.0.3",
            "10.96.0.20",
            80,
            Some("veth1"),
        ),
        (
            "external client to shop's LoadBalancer (eTP=Local)",
            "198.51.100.7",
            "203.0.113.50",
            80,
            Some("eth0"),
        ),
        (
            "the node to shop's NodePort",
            "192.168.0.10",
            "192.168.0.10",
            30080,
            None,
        ),
        (
            "pod to a service without endpoints",
            "10.244.0.3",
            "10.96.0.40",
            80,
            Some("veth1"),
        ),
        (
            "pod to an unallocated ClusterIP",
            "10.244.0.3",
            "10.96.0.99",
            80,
            Some("veth1"),
        ),
    ] {
        let t = tracer.trace(&Packet {
            src: ip(src),
            dst: ip(dst),
            proto: L4Proto::Tcp,
            dport: port,
            sport: 40000,
            iif: iif.map(str::to_owned),
        });
        println!(
            "# {what}: {src} -> {dst}:{port}\n#   verdict: {:?}   masqueraded: {:?}",
            t.output(),
            t.masqueraded()
        );
        for line in t.explain().lines() {
            println!("#   {line}");
        }
    }
    let again = proxier.sync(&mut nft, Instant::now())?;
    println!(
        "# second sync with no change: operations={}",
        again.operations
    );
    Ok(())
}
