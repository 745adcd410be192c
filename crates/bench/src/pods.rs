//! `verdict-bench pods`: what `--watch-pods` costs. A real kube-apiserver
//! (etcd 3.6) holds N Pods, each with three labels, a ReplicaSet owner and
//! an address, as a kubelet leaves them; verdict runs against it as
//! kube-proxy's user (with the right to list and watch Pods), first
//! without the flag and then with it, each process alone, and its RSS is
//! read once the Pods are listed and the node has synced: the difference,
//! over N, is what a pod costs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verdict_e2e::netns::{Netns, can_run, unique_prefix};
use verdict_e2e::realapi::{Etcd, Options, RealApiServer};

use crate::daemon::{Programs, rss_now, usage};
use crate::{flag, num_flag};

const USAGE: &str = "usage: verdict-bench pods [--pods 10000] [--runs 2] [--log DIR] [--out FILE]";

/// `verdict-bench pods …`
pub fn pods(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    can_run()?;
    let n = num_flag(args, "--pods", 10_000).map_err(|e| format!("{e}\n{USAGE}"))?;
    let runs = num_flag(args, "--runs", 2).map_err(|e| format!("{e}\n{USAGE}"))?;
    if n == 0 || runs == 0 {
        return Err(format!("--pods and --runs at least 1\n{USAGE}"));
    }
    let verdict = crate::daemon::sibling("verdict")?;
    let log_dir = crate::log_dir(args)?;
    let ns = Netns::create(&format!("{}-pods", unique_prefix())).map_err(|e| e.0)?;
    ns.ip(&["link", "set", "lo", "up"]).map_err(|e| e.0)?;
    let dir = std::env::temp_dir().join(format!("verdict-bench-pods-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let t = Instant::now();
    let api = RealApiServer::start(&ns, Etcd::V36, &dir.join("api"), &Options::default())?;
    let admin = api.admin()?;
    admin.create(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}),
    )?;
    admin.create(
        "/api/v1/namespaces/bench/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "bench"}}),
    )?;
    admin.create(
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}}),
    )?;
    admin.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "verdict-pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]}),
    )?;
    admin.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "verdict-pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "verdict-pod-reader"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-proxy"}]}),
    )?;
    let creates: Vec<(&str, String, Value)> = (0..n)
        .map(|i| ("POST", "/api/v1/namespaces/bench/pods".to_owned(), pod(i)))
        .collect();
    admin.all(&creates)?;
    let statuses: Vec<(&str, String, Value)> = (0..n)
        .map(|i| {
            let ip = pod_ip(i);
            (
                "PATCH",
                format!("/api/v1/namespaces/bench/pods/{}/status", pod_name(i)),
                json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}),
            )
        })
        .collect();
    admin.all(&statuses)?;
    println!(
        "{n} Pods created and given addresses in {:.1?}",
        t.elapsed()
    );
    let kubeconfig = api.kubeconfig("kube-proxy", &api.kube_proxy_token)?;

    let mut rows = Vec::new();
    let mut by: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for run in 0..runs {
        for watch in [false, true] {
            std::thread::sleep(Duration::from_secs(2));
            let m = measure(&ns, &verdict, &kubeconfig, watch, log_dir.as_deref(), run)?;
            println!(
                "run {run}, --watch-pods={watch}: RSS {:.1} MiB, peak {:.1} MiB, CPU {:.2} s, listed in {:.2} s",
                m.rss, m.peak, m.cpu, m.listed
            );
            by[usize::from(watch)].push(m.rss);
            rows.push(format!(
                "| {run} | {} | {:.1} MiB | {:.1} MiB | {:.2} s | {} |",
                if watch { "on" } else { "off" },
                m.rss,
                m.peak,
                m.cpu,
                if watch {
                    format!("{:.2} s", m.listed)
                } else {
                    "–".into()
                },
            ));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let per_pod = (mean(&by[1]) - mean(&by[0])) * 1024.0 * 1024.0 / n as f64;
    let mut text = format!(
        "### What --watch-pods costs: {n} Pods (3 labels, a ReplicaSet owner, an address each) on a real kube-apiserver 1.36, etcd 3.6\n\n"
    );
    text.push_str("| run | --watch-pods | RSS after the list | peak RSS | CPU to there | Pods listed after |\n");
    text.push_str("|---:|---|---:|---:|---:|---:|\n");
    for r in &rows {
        text.push_str(r);
        text.push('\n');
    }
    text.push_str(&format!(
        "\nOn minus off, the mean of the runs: {:.1} MiB, {per_pod:.0} bytes a pod. RSS (VmRSS) 3 s after the node's first full sync and, with the flag, the Pods' list; peak VmHWM; CPU user + system since start.\n",
        mean(&by[1]) - mean(&by[0])
    ));
    println!("\n{text}");
    if let Some(out) = flag(args, "--out") {
        std::fs::write(out, &text).map_err(|e| format!("{out}: {e}"))?;
    }
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn pod_name(i: usize) -> String {
    format!("app{}-5f6d7c9b8-{:05}", i % 500, i)
}

fn pod_ip(i: usize) -> String {
    let i = i as u32 + 1;
    format!("10.{}.{}.{}", 100 + (i >> 16), (i >> 8) & 0xff, i & 0xff)
}

/// Pod `i`: a Deployment's pod as the API server holds it.
fn pod(i: usize) -> Value {
    let app = format!("app{}", i % 500);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i), "namespace": "bench",
            "labels": {"app": app, "pod-template-hash": "5f6d7c9b8", "tier": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("{app}-5f6d7c9b8"),
                "uid": format!("00000000-0000-4000-8000-{:012}", i % 500), "controller": true}]},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "app"}]}})
}

struct Measured {
    rss: f64,
    peak: f64,
    cpu: f64,
    listed: f64,
}

fn measure(
    ns: &Netns,
    verdict: &std::path::Path,
    kubeconfig: &std::path::Path,
    watch: bool,
    log_dir: Option<&std::path::Path>,
    run: usize,
) -> Result<Measured, String> {
    let log_file: Option<PathBuf> = log_dir.map(|d| {
        d.join(format!(
            "pods-{run}-{}.log",
            if watch { "on" } else { "off" }
        ))
    });
    let extra: &[&str] = if watch { &["--watch-pods"] } else { &[] };
    let programs = Programs {
        listener: false,
        verdict,
        apiserver: std::path::Path::new(""),
        log_to: log_file.as_deref(),
        under: &[],
        extra,
        min_sync_period: "1s",
    };
    let args = vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()];
    let started = Instant::now();
    let (daemon, group, log, pid) =
        crate::daemon::spawn_verdict(ns, &programs, &args, false, log_file.as_deref(), started)?;
    let limit = Duration::from_secs(300);
    log.wait(&["\"synced\"", "family=\"ip\"", "full=true"], limit)?;
    let listed = if watch {
        (log.wait(&["Pods listed"], limit)? - started).as_secs_f64()
    } else {
        0.0
    };
    std::thread::sleep(Duration::from_secs(3));
    let rss = rss_now(pid);
    let (cpu, peak) = usage(pid);
    drop((daemon, group, log));
    Ok(Measured {
        rss,
        peak,
        cpu,
        listed,
    })
}
