//! kube-proxy's packet-flow test cases (`verdict-conformance`, reference
//! §4), replayed on the proxier with the in-memory backend and traced.
//!
//! This is a `harness = false` test: it runs every case, prints every
//! failure, and ends with `N passed, N failed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

fn main() {
    let mut r = Report::default();
    let mut per_group: Vec<(String, usize)> = Vec::new();
    for scenario in upstream_scenarios() {
        let fx = Fixture::replay(&scenario.setup);
        let before = r.ran;
        r.run(&scenario.name, &fx, &scenario.flows);
        match per_group.last_mut() {
            Some((g, n)) if g == scenario.group() => *n += r.ran - before,
            _ => per_group.push((scenario.group().to_string(), r.ran - before)),
        }
    }
    for (group, n) in &per_group {
        println!("{group}: {n} cases");
    }
    for f in &r.failures {
        println!("FAILED {f}");
    }
    println!(
        "packet-flow cases: {} passed, {} failed",
        r.ran - r.failures.len(),
        r.failures.len()
    );
    if !r.failures.is_empty() {
        std::process::exit(1);
    }
}
