//! Every manifest under `deploy/` is a valid Kubernetes object: it parses
//! into the real API types and survives a round trip through them
//! unchanged (so no field is misspelled or misplaced), and the
//! `KubeProxyConfiguration` in the ConfigMap is accepted by verdict itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::promtool;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base")
}

fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut bytes = text.as_bytes();
        for doc in serde_saphyr::read::<_, Value>(&mut bytes) {
            let doc = doc.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if !doc.is_null() {
                out.push((f.display().to_string(), doc));
            }
        }
    }
    out
}

/// Parses into `T` and back; the result must equal the input.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, v: &Value) {
    let typed: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", v["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(&back, v, "{file}: {} changes in a round trip", v["kind"]);
}

#[test]
fn every_manifest_is_a_valid_object() {
    let docs = documents();
    let mut kinds: Vec<String> = Vec::new();
    for (file, v) in &docs {
        let kind = v["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "DaemonSet" => round_trip::<DaemonSet>(file, v),
            "ServiceAccount" => round_trip::<ServiceAccount>(file, v),
            "ClusterRole" => round_trip::<ClusterRole>(file, v),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(file, v),
            "ConfigMap" => round_trip::<ConfigMap>(file, v),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "ServiceAccount"
        ]
    );
}

#[test]
fn the_daemonset_uses_the_configmap_and_the_service_account() {
    let docs = documents();
    let find = |kind: &str| {
        docs.iter()
            .find(|(_, v)| v["kind"] == kind)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let ds: DaemonSet = serde_json::from_value(find("DaemonSet")).unwrap();
    let spec = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("verdict"));
    assert_eq!(spec.host_network, Some(true));
    let cm: ConfigMap = serde_json::from_value(find("ConfigMap")).unwrap();
    let cm_name = cm.metadata.name.clone().unwrap();
    let volume = spec
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.config_map.as_ref().is_some_and(|c| c.name == cm_name))
        .expect("the ConfigMap is mounted");
    let container = &spec.containers[0];
    let mount = container
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == volume.name)
        .unwrap();
    let key = cm.data.as_ref().unwrap().keys().next().unwrap().clone();
    let config_arg = format!("--config={}/{key}", mount.mount_path);
    assert!(
        container.command.as_ref().unwrap().contains(&config_arg),
        "{:?} lacks {config_arg}",
        container.command
    );
    let sa: ServiceAccount = serde_json::from_value(find("ServiceAccount")).unwrap();
    assert_eq!(sa.metadata.name.as_deref(), Some("verdict"));
    assert_eq!(sa.metadata.namespace, ds.metadata.namespace);
}

/// On the host's network a declared containerPort is a host port, which
/// the scheduler reserves: a rollout's new pod would wait for the old one
/// to be gone, and a maxSurge rollout could never place its surge pod.
/// The readiness probe waits past the time verdict takes to answer 10256
/// (realapi_kernel measures it under a second).
#[test]
fn the_daemonset_reserves_no_host_ports_and_probes_once_verdict_answers() {
    let docs = documents();
    let ds = docs
        .iter()
        .find(|(_, v)| v["kind"] == "DaemonSet")
        .map(|(_, v)| v.clone())
        .unwrap();
    let ds: DaemonSet = serde_json::from_value(ds).unwrap();
    let spec = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.host_network, Some(true));
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        assert!(
            c.ports.as_ref().is_none_or(Vec::is_empty),
            "{}: declares {:?}",
            c.name,
            c.ports
        );
    }
    let probe = spec.containers[0].readiness_probe.clone().unwrap();
    assert!(probe.initial_delay_seconds.unwrap_or(0) >= 1, "{probe:?}");
    // The PodMonitor cannot name a port, then: it scrapes the pod's
    // address at 10249.
    let text = std::fs::read_to_string(monitoring_dir().join("podmonitor.yaml")).unwrap();
    let monitor: Value = serde_saphyr::from_str(&text).unwrap();
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert!(endpoint.get("port").is_none(), "{endpoint}");
    let address = endpoint["relabelings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["targetLabel"] == "__address__")
        .expect("a relabeling sets __address__");
    assert_eq!(address["replacement"], "$1:10249");
}

#[test]
fn verdict_accepts_the_configuration_in_the_configmap() {
    let (_, cm) = documents()
        .into_iter()
        .find(|(_, v)| v["kind"] == "ConfigMap")
        .unwrap();
    let cm: ConfigMap = serde_json::from_value(cm).unwrap();
    let config = cm.data.unwrap()["config.conf"].clone();
    let file = std::env::temp_dir().join(format!("verdict-deploy-{}.conf", std::process::id()));
    std::fs::write(&file, config).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["plan", "--config"])
        .arg(&file)
        .arg("--manifests")
        .arg(&example)
        .args(["--hostname-override", "node-a"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The nft probe may warn about this machine's nft; nothing else may
    // (warnings are klog's `W` lines).
    assert!(
        !stderr.lines().any(|l| l.starts_with('W')
            && !l.contains(" probe.rs:")
            && !l.contains("cannot dry-run nft here")),
        "warnings about the file:\n{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("add table ip verdict"));
}

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring")
}

/// The PrometheusRule's groups as a plain rule file, as promtool reads them.
fn rules_file(dir: &Path) {
    let text = std::fs::read_to_string(monitoring_dir().join("prometheusrule.yaml")).unwrap();
    let rule: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    let yaml = serde_saphyr::to_string(&rule["spec"]).unwrap();
    std::fs::write(dir.join("verdict-rules.yaml"), yaml).unwrap();
}

#[test]
fn the_alerts_pass_promtool_and_their_unit_tests() {
    let dir = std::env::temp_dir().join(format!("verdict-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    rules_file(&dir);
    std::fs::copy(
        monitoring_dir().join("rules-test.yaml"),
        dir.join("rules-test.yaml"),
    )
    .unwrap();
    if let Some(out) = promtool(&["check", "rules", "verdict-rules.yaml"], &dir) {
        assert!(out.contains("SUCCESS"), "{out}");
        promtool(&["test", "rules", "rules-test.yaml"], &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node that exports more than it should must not load Prometheus
/// without bound: the PodMonitor caps the samples of one scrape, well
/// above what a node exports with the defaults (about 124 series).
#[test]
fn the_podmonitor_limits_the_samples_of_a_scrape() {
    let text = std::fs::read_to_string(monitoring_dir().join("podmonitor.yaml")).unwrap();
    let monitor: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(monitor["kind"], "PodMonitor");
    let limit = monitor["spec"]["sampleLimit"]
        .as_u64()
        .expect("sampleLimit");
    assert!((1_000..=100_000).contains(&limit), "sampleLimit {limit}");
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let text = std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    // Grafana's variables, as a dashboard fills them in.
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e
                .replace("$__rate_interval", "5m")
                .replace("$job", "kube-proxy")
                .replace("$instance", "node-a");
            serde_json::json!({"record": format!("dashboard:query{i}"), "expr": e})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = std::env::temp_dir().join(format!("verdict-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("queries.yaml"),
        serde_saphyr::to_string(&file).unwrap(),
    )
    .unwrap();
    promtool(&["check", "rules", "queries.yaml"], &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Applies JSON-patch operations (`add`, `replace`; an object key or an
/// array's `-`) as kustomize does.
fn json_patch(doc: &mut Value, ops: &Value) {
    for op in ops.as_array().unwrap() {
        let path = op["path"].as_str().unwrap();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{parent}"));
        let value = op["value"].clone();
        match (op["op"].as_str().unwrap(), target) {
            ("add", Value::Array(a)) if last == "-" => a.push(value),
            ("add" | "replace", Value::Object(o)) => {
                if op["op"] == "replace" {
                    assert!(o.contains_key(last), "replace of a missing {path}");
                }
                o.insert(last.to_owned(), value);
            }
            (other, _) => panic!("unsupported op {other} at {path}"),
        }
    }
}

#[test]
fn the_unprivileged_component_keeps_a_valid_daemonset_with_net_admin_alone() {
    let dir = deploy_dir().join("../components/unprivileged");
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let component: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(component["kind"], "Component");
    let mut ds = documents()
        .into_iter()
        .find(|(_, v)| v["kind"] == "DaemonSet")
        .unwrap()
        .1;
    for p in component["patches"].as_array().unwrap() {
        assert_eq!(p["target"]["name"], "verdict");
        let ops: Value = serde_saphyr::from_str(p["patch"].as_str().unwrap()).unwrap();
        json_patch(&mut ds, &ops);
    }
    round_trip::<DaemonSet>("unprivileged", &ds);
    let spec = &ds["spec"]["template"]["spec"];
    let main = &spec["containers"][0];
    assert_eq!(main["securityContext"]["privileged"], false);
    assert_eq!(
        main["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN"])
    );
    assert_eq!(
        main["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    let init = &spec["initContainers"][0];
    assert_eq!(init["securityContext"]["privileged"], true);
    let args: Vec<&str> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--init-only"), "{args:?}");
    // The init container reads the same configuration, from the same
    // volume, as the main one.
    assert_eq!(init["volumeMounts"][0]["name"], "config");
    assert_eq!(args[1], main["command"][1], "the same --config");
}

/// The YAML documents of one file under `deploy/`.
fn file_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut bytes = text.as_bytes();
    serde_saphyr::read::<_, Value>(&mut bytes)
        .map(|d| d.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn the_remote_api_component_adds_the_flag_and_valid_rbac() {
    let dir = deploy_dir().join("../components/remote-api");
    let (component, ds) = patched_daemonset(&dir);
    round_trip::<DaemonSet>("remote-api", &ds);
    let command = &ds["spec"]["template"]["spec"]["containers"][0]["command"];
    assert!(
        command
            .as_array()
            .unwrap()
            .contains(&Value::from("--api-bind-address=0.0.0.0:10262")),
        "{command}"
    );
    let mut kinds = Vec::new();
    for r in component["resources"].as_array().unwrap() {
        for doc in file_documents(&dir.join(r.as_str().unwrap())) {
            match doc["kind"].as_str().unwrap() {
                "ClusterRole" => round_trip::<ClusterRole>("remote-api", &doc),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>("remote-api", &doc),
                other => panic!("unexpected {other}"),
            }
            kinds.push(format!(
                "{} {}",
                doc["kind"].as_str().unwrap(),
                doc["metadata"]["name"].as_str().unwrap()
            ));
        }
    }
    assert_eq!(
        kinds,
        [
            "ClusterRoleBinding verdict-auth-delegator",
            "ClusterRole verdict-api-reader"
        ]
    );
}

/// Every query of the dashboard, and every alert's expression.
fn queries() -> (Vec<String>, Vec<(String, String)>) {
    let text = std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => m.iter().for_each(|(k, v)| match (k.as_str(), v) {
                ("expr", Value::String(e)) => out.push(e.clone()),
                _ => walk(v, out),
            }),
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    let text = std::fs::read_to_string(monitoring_dir().join("prometheusrule.yaml")).unwrap();
    let rule: Value = serde_saphyr::from_str(&text).unwrap();
    let alerts = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_owned(),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (exprs, alerts)
}

/// The series a node exports by default (no --service-metrics) that say
/// what went wrong: the dashboard shows each, and an alert reads each.
#[test]
fn the_dashboard_and_the_alerts_use_the_series_exported_by_default() {
    let (dashboard, alerts) = queries();
    for series in [
        "verdict_rejected_total",
        "verdict_dropped_total",
        "verdict_flows_not_recorded_total",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    ] {
        assert!(
            dashboard.iter().any(|q| q.contains(series)),
            "no dashboard query reads {series}"
        );
        assert!(
            alerts.iter().any(|(_, e)| e.contains(series)),
            "no alert reads {series}"
        );
    }
    // Traffic to a Service with no usable endpoint alerts with or without
    // per-Service series (alerts_kernel.rs fires both on a real node's).
    let no_endpoints: Vec<&str> = alerts
        .iter()
        .filter(|(_, e)| e.contains("reason=\"no_endpoints\""))
        .map(|(a, _)| a.as_str())
        .collect();
    assert_eq!(
        no_endpoints,
        ["VerdictServiceNoEndpoints", "VerdictNoEndpointsTraffic"]
    );
}

/// Each alert's runbook is a heading of docs/monitoring.md, and the
/// runbooks run nothing in the verdict pod but verdict: its image holds
/// nothing else (no shell, no nft).
#[test]
fn every_alert_has_a_runbook_that_runs_only_verdict_in_the_pod() {
    let (_, alerts) = queries();
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/monitoring.md"),
    )
    .unwrap();
    for (alert, _) in &alerts {
        assert!(
            doc.lines().any(|l| l == format!("### {alert}")),
            "no runbook heading for {alert}"
        );
    }
    let mut execs = 0;
    for (i, line) in doc.lines().enumerate() {
        for (at, _) in line.match_indices(" exec ") {
            let rest = &line[at..];
            let Some(cmd) = rest.split(" -- ").nth(1) else {
                continue;
            };
            execs += 1;
            let program = cmd.split_whitespace().next().unwrap_or("");
            assert_eq!(
                program,
                "verdict",
                "docs/monitoring.md line {}: {line}",
                i + 1
            );
        }
    }
    assert!(execs >= 5, "{execs} commands in the pod");
}

fn hubble_dir() -> PathBuf {
    deploy_dir().join("../components/hubble")
}

/// A kustomize component's `kustomization.yaml`.
fn component(dir: &Path) -> Value {
    let c: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    assert_eq!(c["kind"], "Component");
    c
}

/// The component in `dir`, and the base's DaemonSet with its patches
/// applied.
fn patched_daemonset(dir: &Path) -> (Value, Value) {
    let component = component(dir);
    let mut ds = documents()
        .into_iter()
        .find(|(_, v)| v["kind"] == "DaemonSet")
        .unwrap()
        .1;
    for p in component["patches"].as_array().unwrap() {
        let ops: Value = serde_saphyr::from_str(p["patch"].as_str().unwrap()).unwrap();
        json_patch(&mut ds, &ops);
    }
    (component, ds)
}

/// The documents of the hubble component's resources, by kind and name.
fn hubble_documents() -> Vec<Value> {
    component(&hubble_dir())["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| file_documents(&hubble_dir().join(r.as_str().unwrap())))
        .collect()
}

/// `--name=value` of an argument list.
fn flag<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    args.iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

#[test]
fn the_hubble_component_wires_verdict_relay_and_ui_together() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    let docs = hubble_documents();
    let find = |kind: &str, name: &str| -> Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let mut kinds = Vec::new();
    for d in &docs {
        let kind = d["kind"].as_str().unwrap();
        match kind {
            "Deployment" => round_trip::<Deployment>("hubble", d),
            "Service" => round_trip::<Service>("hubble", d),
            "ServiceAccount" => round_trip::<ServiceAccount>("hubble", d),
            "ConfigMap" => round_trip::<ConfigMap>("hubble", d),
            "ClusterRole" => round_trip::<ClusterRole>("hubble", d),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>("hubble", d),
            // cert-manager's kinds: no types here; their fields are checked
            // below.
            "Issuer" | "Certificate" => assert_eq!(d["apiVersion"], "cert-manager.io/v1"),
            other => panic!("unexpected {other}"),
        }
        kinds.push(format!(
            "{kind} {}",
            d["metadata"]["name"].as_str().unwrap()
        ));
    }
    println!("{kinds:#?}");

    // verdict: the component's patch on the base DaemonSet, accepted by
    // verdict's own flag parser.
    let (_, ds) = patched_daemonset(&hubble_dir());
    round_trip::<DaemonSet>("hubble", &ds);
    let pod = &ds["spec"]["template"];
    let command = pod["spec"]["containers"][0]["command"].as_array().unwrap();
    let listen = flag(command, "hubble-listen-address").unwrap();
    let port: u16 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let hubble_flags: Vec<&str> = command
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--hubble-"))
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
        .arg("plan")
        .arg("--manifests")
        .arg(&example)
        .args(["--hostname-override", "node-a"])
        .args(&hubble_flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "verdict refuses {hubble_flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The serving certificate is the Secret the server Certificate writes,
    // mounted where the flags look, and names what Relay checks.
    let mount = pod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "hubble-tls")
        .unwrap();
    let dir = mount["mountPath"].as_str().unwrap();
    for f in ["cert-file", "key-file", "client-ca-files"] {
        let path = flag(command, &format!("hubble-tls-{f}")).unwrap();
        assert!(path.starts_with(&format!("{dir}/")), "{f}: {path}");
    }
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "hubble-tls")
        .unwrap();
    let server = find("Certificate", "hubble-server-certs");
    assert_eq!(volume["secret"]["secretName"], server["spec"]["secretName"]);
    let names: Vec<&str> = server["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let covers = |host: &str| {
        names.iter().any(|n| match n.strip_prefix("*.") {
            Some(rest) => host.split_once('.').is_some_and(|(_, h)| h == rest),
            None => *n == host,
        })
    };
    // Relay's --cluster-name and verdict's (default) agree.
    let relay = find("Deployment", "hubble-relay");
    let container = &relay["spec"]["template"]["spec"]["containers"][0];
    let args = container["args"].as_array().unwrap();
    let cluster = flag(args, "cluster-name").unwrap();
    assert_eq!(cluster, "default");
    assert!(covers(&format!(
        "hubble-peer.{cluster}.hubble-grpc.cilium.io"
    )));
    assert!(covers(&format!(
        "{}.{cluster}.hubble-grpc.cilium.io",
        "node-a.example.com".replace('.', "-")
    )));
    assert!(
        server["spec"]["usages"]
            .as_array()
            .unwrap()
            .contains(&Value::from("server auth"))
    );

    // hubble-peer: verdict's pods (in the base and the replace-kube-proxy
    // overlay, which keeps app.kubernetes.io/name), at its listener.
    let peer = find("Service", "hubble-peer");
    for (k, v) in peer["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][k], v, "selector {k}");
        assert_eq!(k, "app.kubernetes.io/name", "a label the overlay keeps");
    }
    assert_eq!(peer["spec"]["ports"][0]["targetPort"], port);
    assert_eq!(
        flag(args, "peer-service").unwrap(),
        format!(
            "hubble-peer.{}.svc.cluster.local:{}",
            peer["metadata"]["namespace"].as_str().unwrap(),
            peer["spec"]["ports"][0]["port"]
        )
    );
    // Relay's client certificate: its Secret, mounted where its flags look.
    let client = find("Certificate", "hubble-relay-client-certs");
    assert!(
        client["spec"]["usages"]
            .as_array()
            .unwrap()
            .contains(&Value::from("client auth"))
    );
    let relay_volume = &relay["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(
        relay_volume["secret"]["secretName"],
        client["spec"]["secretName"]
    );
    let security = &relay["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(
        security["fsGroup"], security["runAsUser"],
        "the non-root Relay reads its key through fsGroup"
    );
    let relay_dir = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    for f in [
        "tls-hubble-client-cert-file",
        "tls-hubble-client-key-file",
        "tls-hubble-server-ca-files",
    ] {
        assert!(
            flag(args, f).unwrap().starts_with(&format!("{relay_dir}/")),
            "{f}"
        );
    }
    // Both certificates come from the one CA issuer.
    for c in [&server, &client] {
        assert_eq!(c["spec"]["issuerRef"]["name"], "hubble-ca");
    }
    assert_eq!(
        find("Issuer", "hubble-ca")["spec"]["ca"]["secretName"],
        find("Certificate", "hubble-ca")["spec"]["secretName"]
    );
    // Relay's Service reaches its listener; the UI's backend reaches Relay's
    // Service.
    let relay_service = find("Service", "hubble-relay");
    let relay_port: u16 = flag(args, "listen-address")
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert_eq!(relay_service["spec"]["ports"][0]["targetPort"], relay_port);
    let ui = find("Deployment", "hubble-ui");
    let backend = ui["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "backend")
        .unwrap();
    let flows_api = backend["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "FLOWS_API_ADDR")
        .unwrap()["value"]
        .as_str()
        .unwrap();
    assert_eq!(
        flows_api,
        format!(
            "hubble-relay.kube-system.svc.cluster.local:{}",
            relay_service["spec"]["ports"][0]["port"]
        )
    );
    // --watch-pods, and the right to do it for verdict's ServiceAccount.
    assert!(
        command.contains(&Value::from("--watch-pods")),
        "{command:?}"
    );
    let reader = find("ClusterRole", "verdict-pod-reader");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}])
    );
    let bound = find("ClusterRoleBinding", "verdict-pod-reader");
    assert_eq!(
        bound["subjects"][0]["name"],
        pod["spec"]["serviceAccountName"]
    );
    let binding = find("ClusterRoleBinding", "verdict-hubble-ui");
    assert_eq!(
        binding["subjects"][0]["name"],
        ui["spec"]["template"]["spec"]["serviceAccountName"]
    );
}
