//! Runs verdict on the bundled example cluster (`examples/cluster.yaml`)
//! inside a sandbox of network namespaces, sends traffic to the example
//! services and shows where it went. Needs root; touches nothing outside
//! the namespaces it creates, and deletes them when it ends.
//!
//! `sudo cargo run -p verdict-e2e --example sandbox [-- path/to/cluster.yaml]`

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use verdict_e2e::bed::{Placement, TestBed};
use verdict_e2e::netns::{Process, can_run};

fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|e| format!("{s}: {e}"))
}

fn main() -> Result<(), String> {
    can_run()?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifests = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("examples/cluster.yaml"));
    // The daemon and the traffic tool, built from this checkout.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(&cargo)
        .args([
            "build",
            "-q",
            "-p",
            "verdict",
            "-p",
            "verdict-e2e",
            "--bins",
        ])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("building verdict: {e}"))?;
    if !status.success() {
        return Err("building verdict failed".into());
    }
    let target = root.join("target/debug");
    let verdict = target.join("verdict");
    let echo = target.join("verdict-e2e-echo");

    println!("== building the sandbox: node-a (192.168.0.2), a router, node-b, an external client");
    let mut bed = TestBed::new(echo).map_err(|e| e.to_string())?;
    for (pod, place) in [
        ("10.244.0.7", Placement::Local),
        ("10.244.0.8", Placement::Local),
        ("10.244.0.9", Placement::Local),
        ("10.244.1.3", Placement::Remote),
    ] {
        bed.add_pod(ip(pod)?, place, &[8080], &[])
            .map_err(|e| e.to_string())?;
    }
    bed.add_pod(ip("10.244.0.3")?, Placement::Local, &[], &[])
        .map_err(|e| e.to_string())?;
    for vip in ["10.96.0.10", "10.96.0.20", "10.96.0.30", "198.51.100.50"] {
        bed.route_to_node(ip(vip)?).map_err(|e| e.to_string())?;
    }

    println!(
        "== running: verdict run --manifests {} (inside node-a)",
        manifests.display()
    );
    let m = manifests.to_string_lossy().into_owned();
    let child = bed
        .node
        .spawn(
            &verdict.to_string_lossy(),
            &[
                "run",
                "--manifests",
                &m,
                "--hostname-override",
                "node-a",
                "--cluster-cidr",
                "10.244.0.0/16",
                "--proxy-mode",
                "nftables",
            ],
        )
        .map_err(|e| e.to_string())?;
    let _daemon = Process(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while bed
        .node
        .exec("nft", &["list", "table", "ip", "verdict"])
        .is_err()
    {
        if Instant::now() > deadline {
            return Err("verdict did not program the node".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(500));

    let cases: [(&str, &str, &str, &str, u16, usize); 4] = [
        (
            "pod → web ClusterIP",
            "10.244.0.3",
            "10.96.0.20",
            "tcp",
            80,
            8,
        ),
        (
            "external client → shop LoadBalancer (externalTrafficPolicy Local)",
            "203.0.113.2",
            "198.51.100.50",
            "tcp",
            80,
            4,
        ),
        (
            "node → shop NodePort",
            "192.168.0.2",
            "192.168.0.2",
            "tcp",
            30080,
            6,
        ),
        (
            "pod → dns ClusterIP (no endpoints)",
            "10.244.0.3",
            "10.96.0.10",
            "udp",
            53,
            1,
        ),
    ];
    for (what, src, dst, proto, port, tries) in cases {
        println!("\n== {what}: {src} → {dst}:{port}/{proto}");
        for _ in 0..tries {
            let line = bed
                .connect(ip(src)?, ip(dst)?, proto, port, 1000)
                .map_err(|e| e.to_string())?;
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["OK", by, seen, ..] => {
                    println!("   answered by {by:<18} which saw the client as {seen}")
                }
                _ => println!("   {line}"),
            }
        }
    }
    println!("\n== the table verdict programmed: nft list table ip verdict (in node-a)\n");
    let table = bed
        .node
        .exec("nft", &["list", "table", "ip", "verdict"])
        .map_err(|e| e.to_string())?;
    for l in table
        .lines()
        .filter(|l| l.contains("elements") || l.contains("chain ") || l.contains(" : "))
    {
        println!("{l}");
    }
    println!("\n== done; the sandbox is removed");
    Ok(())
}
