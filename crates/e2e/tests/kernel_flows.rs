//! Every kube-proxy packet-flow case (verdict-conformance) as real traffic:
//! each scenario gets its own network-namespace test bed, its node is
//! programmed through the real proxier and a kernel backend (each scenario
//! runs twice: through `nft`, then over netlink), and real connections show
//! where packets went. Needs root; ends with `N passed, N failed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use verdict_conformance::upstream_scenarios;
use verdict_e2e::runner::{KernelBackend, ScenarioResult, run_scenario};

fn main() {
    if let Err(why) = verdict_e2e::netns::can_run() {
        println!("kernel packet-flow cases skipped: {why}");
        return;
    }
    let echo = PathBuf::from(env!("CARGO_BIN_EXE_verdict-e2e-echo"));
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let scenarios: Vec<_> = upstream_scenarios()
        .into_iter()
        .filter(|s| filter.as_deref().is_none_or(|f| s.name.contains(f)))
        .collect();
    let runs: Vec<_> = scenarios
        .into_iter()
        .flat_map(|s| KernelBackend::ALL.map(|k| (s.clone(), k)))
        .enumerate()
        .collect();
    let queue = Arc::new(Mutex::new(runs));
    let results = Arc::new(Mutex::new(Vec::<(usize, ScenarioResult)>::new()));
    let workers: usize = std::env::var("VERDICT_E2E_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (queue, results, echo) = (queue.clone(), results.clone(), echo.clone());
            std::thread::spawn(move || {
                loop {
                    let Some((i, (s, kernel))) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let r = run_scenario(&s, echo.clone(), kernel);
                    results.lock().unwrap().push((i, r));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut results = std::mem::take(&mut *results.lock().unwrap());
    results.sort_by_key(|(i, _)| *i);
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (_, r) in &results {
        println!(
            "{}: {} passed, {} failed, {} skipped",
            r.name,
            r.passed,
            r.failures.len(),
            r.skipped.len()
        );
        passed += r.passed;
        failed += r.failures.len();
        skipped += r.skipped.len();
    }
    for (_, r) in &results {
        for s in &r.skipped {
            println!("SKIPPED {s}");
        }
        for f in &r.failures {
            println!("FAILED {f}");
        }
    }
    println!("kernel packet-flow cases: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}
