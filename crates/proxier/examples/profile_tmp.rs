use std::time::Instant;
use verdict_model::*;
use verdict_nft::{Backend, Family, MemoryBackend, NftError, TableState, Transaction};
use verdict_proxier::*;
struct Capture(MemoryBackend, String);
impl Backend for Capture {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.1 = tx.to_string();
        self.0.run(tx)
    }
    fn table(&mut self, f: Family, n: &str) -> Result<Option<TableState>, NftError> {
        self.0.table(f, n)
    }
}
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(30000);
    let mut cfg = ProxierConfig::new(IpFamily::V4, "node");
    cfg.node_ips = vec!["10.201.0.1".parse().unwrap()];
    let mut p = Proxier::new(cfg).unwrap();
    for i in 0..n {
        let svc = Service {
            namespace: "b".into(),
            name: format!("s{i}"),
            cluster_ips: vec![format!("172.30.{}.{}", i / 250, i % 250 + 1)],
            ports: vec![ServicePortSpec {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: None,
            }],
            ..Service::default()
        };
        p.on_service(None, Some(&svc));
        let sl = EndpointSlice {
            namespace: "b".into(),
            name: format!("s{i}-1"),
            service_name: Some(format!("s{i}")),
            address_type: AddressType::IPv4,
            ports: vec![SlicePort {
                name: Some("http".into()),
                port: Some(8080),
                protocol: Protocol::Tcp,
            }],
            endpoints: vec![
                SliceEndpoint {
                    addresses: vec!["10.200.0.11".into()],
                    ..Default::default()
                },
                SliceEndpoint {
                    addresses: vec!["10.200.0.12".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        p.on_endpoint_slice(&sl, false);
    }
    let mut nft = Capture(MemoryBackend::new(), String::new());
    let t = Instant::now();
    p.sync(&mut nft, Instant::now()).unwrap();
    eprintln!("cold sync {:?}", t.elapsed());
    std::fs::write("/tmp/cold.nft", &nft.1).unwrap();
}
