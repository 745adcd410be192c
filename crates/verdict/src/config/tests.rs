use super::*;
use crate::cli;

/// What kubeadm writes into the kube-proxy ConfigMap (`config.conf`): its
/// marshalled v1alpha1 object, zero values included, with `mode: nftables`
/// and kubeadm's clusterCIDR and kubeconfig.
const KUBEADM: &str = include_str!("../../tests/fixtures/kubeadm-config.conf");

const FILE: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
hostnameOverride: node-a
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [192.168.0.0/24]
nftables:
  masqueradeBit: 15
  masqueradeAll: true
  minSyncPeriod: 2s
  syncPeriod: 1m0s
conntrack:
  maxPerCore: 32768
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
"#;

fn args(a: &[&str]) -> cli::Cli {
    cli::parse(a.iter().map(|s| s.to_string())).unwrap()
}

/// The configuration of a command line, with `file` as `--config`.
fn resolve_with(file: Option<&str>, flags: &[&str]) -> Result<Resolved, ConfigError> {
    let cli = args(flags);
    resolve(&cli.input(file))
}

fn ok(file: Option<&str>, flags: &[&str]) -> (Settings, Vec<String>) {
    let r = resolve_with(file, flags).unwrap();
    (r.settings, r.warnings)
}

fn addr(s: &str) -> Option<SocketAddr> {
    Some(s.parse().unwrap())
}

#[test]
fn kubeadms_configuration_starts_with_kube_proxys_defaults() {
    let (s, w) = ok(Some(KUBEADM), &["--hostname-override", "NODE-1 "]);
    assert!(w.is_empty(), "no warnings for kubeadm's file: {w:?}");
    assert_eq!(s.sync_period, Duration::from_secs(30));
    assert_eq!(s.min_sync_period, Duration::from_secs(1));
    assert_eq!(s.healthz_bind_address, addr("0.0.0.0:10256"));
    assert_eq!(s.metrics_bind_address, addr("127.0.0.1:10249"));
    assert_eq!(s.masquerade_bit, 14);
    assert_eq!(s.conntrack, Conntrack::default());
    assert_eq!(s.oom_score_adj, Some(-999));
    assert_eq!(s.node_ports, NodePortAddresses::primary());
    assert_eq!(
        s.detect_local,
        DetectLocal::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()])
    );
    assert_eq!(
        s.client.kubeconfig.as_deref(),
        Some("/var/lib/kube-proxy/kubeconfig.conf")
    );
    assert_eq!((s.client.qps, s.client.burst), (5.0, 10));
    assert_eq!(
        s.hostname_override.as_deref(),
        Some("node-1"),
        "trimmed and lower-cased, as kube-proxy"
    );
    // The effective configuration shows kube-proxy's defaults.
    let e = &s.effective;
    assert_eq!(e["nftables"]["syncPeriod"], "30s");
    assert_eq!(e["configSyncPeriod"], "15m0s");
    assert_eq!(e["logging"]["flushFrequency"], "5s");
    assert_eq!(e["nodePortAddresses"], serde_json::json!(["primary"]));
    assert_eq!(
        e["clientConnection"]["contentType"],
        "application/vnd.kubernetes.protobuf"
    );
}

#[test]
fn ip_only_addresses_get_the_default_port() {
    let file = FILE
        .replace("0.0.0.0:10256", "127.0.0.1")
        .replace("127.0.0.1:10249", "0.0.0.0");
    let (s, _) = ok(Some(&file), &[]);
    assert_eq!(s.healthz_bind_address, addr("127.0.0.1:10256"));
    assert_eq!(s.metrics_bind_address, addr("0.0.0.0:10249"));
    // k3s and RKE2 pass the flag with an IP only.
    let (s, _) = ok(
        None,
        &[
            "--healthz-bind-address=127.0.0.1",
            "--metrics-bind-address",
            "::1",
        ],
    );
    assert_eq!(s.healthz_bind_address, addr("127.0.0.1:10256"));
    assert_eq!(s.metrics_bind_address, addr("[::1]:10249"));
    // The deprecated port flags give the port, and 0 disables.
    let (s, w) = ok(
        None,
        &[
            "--healthz-bind-address=127.0.0.1",
            "--healthz-port=9999",
            "--metrics-port=0",
        ],
    );
    assert_eq!(s.healthz_bind_address, addr("127.0.0.1:9999"));
    assert_eq!(s.metrics_bind_address, None);
    assert!(
        w.iter().any(|w| w.contains("--healthz-port is deprecated")),
        "{w:?}"
    );
    // As kube-proxy, the port only completes an address without one.
    let (s, w) = ok(None, &["--healthz-port=9999"]);
    assert_eq!(s.healthz_bind_address, addr("0.0.0.0:10256"));
    assert!(w.iter().any(|w| w.contains("already has a port")), "{w:?}");
    // An empty flag disables; an empty field means the default.
    let (s, _) = ok(None, &["--metrics-bind-address="]);
    assert_eq!(s.metrics_bind_address, None);
}

#[test]
fn an_ipv6_bind_address_moves_the_default_addresses() {
    let file = KUBEADM.replace("bindAddress: 0.0.0.0", "bindAddress: fd00::2");
    let (s, w) = ok(Some(&file), &[]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.healthz_bind_address, addr("[::]:10256"));
    assert_eq!(s.metrics_bind_address, addr("[::1]:10249"));
    assert_eq!(s.bind_address, Some("fd00::2".parse().unwrap()));
}

#[test]
fn strict_decoding_falls_back_to_lenient_with_a_warning() {
    let text = format!("{FILE}frobnicate: 3\nudpIdleTimeout: 250ms\nconntrack:\n  max: 0\n")
        .replace(
            "  masqueradeAll: true",
            "  masqueradeAll: true\n  tableName: x",
        );
    // `conntrack` now appears twice: a duplicate field, also lenient.
    let (s, w) = ok(Some(&text), &[]);
    assert_eq!(s.masquerade_bit, 15, "the rest applies");
    let w = w.join("\n");
    for f in [
        "frobnicate",
        "udpIdleTimeout",
        "nftables.tableName",
        "conntrack.max",
        "duplicate field \"conntrack\"",
    ] {
        assert!(w.contains(f), "{f}: {w}");
    }
    assert!(w.contains("lenient decoding"), "{w}");
}

#[test]
fn wrong_types_are_errors_in_either_decoding() {
    for (from, to, field) in [
        ("syncPeriod: 1m0s", "syncPeriod: 60", "nftables.syncPeriod"),
        (
            "masqueradeAll: true",
            "masqueradeAll: yes please",
            "nftables.masqueradeAll",
        ),
        (
            "maxPerCore: 32768",
            "maxPerCore: lots",
            "conntrack.maxPerCore",
        ),
        (
            "nodePortAddresses: [192.168.0.0/24]",
            "nodePortAddresses: 10.0.0.0/8",
            "nodePortAddresses",
        ),
    ] {
        let text = FILE.replace(from, to);
        assert_ne!(text, FILE, "{from}");
        let e = resolve_with(Some(&text), &[]).unwrap_err();
        assert_eq!(e.field, field, "{to}: {e}");
    }
    let e = resolve_with(Some(&FILE.replace("nftables:\n", "nftables: 5\nx:\n")), &[]).unwrap_err();
    assert_eq!(e.field, "nftables", "{e}");
}

#[test]
fn invalid_values_name_the_field() {
    let cases = [
        ("mode: nftables", "mode: iptables", "mode"),
        ("mode: nftables", "mode: bogus", "mode"),
        (
            "masqueradeBit: 15",
            "masqueradeBit: 40",
            "nftables.masqueradeBit",
        ),
        (
            "syncPeriod: 1m0s",
            "syncPeriod: soon",
            "nftables.syncPeriod",
        ),
        ("syncPeriod: 1m0s", "syncPeriod: 1s", "nftables.syncPeriod"),
        ("syncPeriod: 1m0s", "syncPeriod: -1s", "nftables.syncPeriod"),
        (
            "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
            "clusterCIDR: 10.244.0.0/99",
            "clusterCIDR",
        ),
        (
            "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
            "clusterCIDR: 10.0.0.0/8,10.1.0.0/16",
            "clusterCIDR",
        ),
        (
            "healthzBindAddress: 0.0.0.0:10256",
            "healthzBindAddress: everywhere",
            "healthzBindAddress",
        ),
        (
            "nodePortAddresses: [192.168.0.0/24]",
            "nodePortAddresses: [primary, nowhere]",
            "nodePortAddresses",
        ),
        (
            "kind: KubeProxyConfiguration",
            "kind: KubeletConfiguration",
            "kind",
        ),
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1",
            "apiVersion: kubeproxy.config.k8s.io/v1alpha2",
            "apiVersion",
        ),
        (
            "hostnameOverride: node-a",
            "hostnameOverride: \"  \"",
            "hostnameOverride",
        ),
        (
            "mode: nftables",
            "mode: nftables\noomScoreAdj: -1001",
            "oomScoreAdj",
        ),
        (
            "maxPerCore: 32768",
            "maxPerCore: -1",
            "conntrack.maxPerCore",
        ),
        (
            "maxPerCore: 32768",
            "maxPerCore: 1\n  udpTimeout: often",
            "conntrack.udpTimeout",
        ),
        (
            "mode: nftables",
            "mode: nftables\nlogging: {format: xml}",
            "logging.format",
        ),
        (
            "mode: nftables",
            "mode: nftables\nfeatureGates: {NFTablesProxyMode: false}",
            "featureGates",
        ),
        (
            "mode: nftables",
            "mode: nftables\nlogging: {options: {text: {splitStream: true}}}",
            "logging.options.text.splitStream",
        ),
        (
            "mode: nftables",
            "mode: nftables\nshowHiddenMetricsForVersion: soon",
            "showHiddenMetricsForVersion",
        ),
    ];
    for (from, to, field) in cases {
        let text = FILE.replace(from, to);
        assert_ne!(text, FILE, "{from}");
        let err = resolve_with(Some(&text), &[]).unwrap_err();
        assert_eq!(err.field, field, "{to}: {err}");
    }
    // The kind's message does not leak Rust's Debug form.
    let e = resolve_with(
        Some(&FILE.replace("kind: KubeProxyConfiguration\n", "")),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: kind: must be KubeProxyConfiguration, not nothing"
    );
    let text = FILE.replace(
        "mode: nftables",
        "mode: nftables\ndetectLocalMode: BridgeInterface",
    );
    assert_eq!(
        resolve_with(Some(&text), &[]).unwrap_err().field,
        "detectLocal.bridgeInterface"
    );
    // With the gate, split streams are fine.
    let text = FILE.replace(
        "mode: nftables",
        "mode: nftables\nfeatureGates: {LoggingAlphaOptions: true}\nlogging: {options: {text: {splitStream: true}}}",
    );
    assert!(ok(Some(&text), &[]).0.logging.text_split_stream);
}

#[test]
fn flags_apply_without_a_file_and_are_ignored_with_one() {
    let flags = [
        "--proxy-mode=nftables",
        "--cluster-cidr=10.0.0.0/8",
        "--masquerade-all",
        "--min-sync-period=5s",
        "--sync-period=10s",
        "--nodeport-addresses=0.0.0.0/0",
        "--hostname-override=flag-node",
        "--kubeconfig=/flag/kubeconfig",
        "-v=3",
    ];
    let (s, _) = ok(None, &flags);
    assert!(s.masquerade_all);
    assert_eq!(s.min_sync_period, Duration::from_secs(5));
    assert_eq!(s.sync_period, Duration::from_secs(10));
    assert_eq!(
        s.node_ports,
        NodePortAddresses::cidrs(vec!["0.0.0.0/0".parse().unwrap()])
    );
    assert_eq!(s.hostname_override.as_deref(), Some("flag-node"));
    assert_eq!(s.client.kubeconfig.as_deref(), Some("/flag/kubeconfig"));
    assert_eq!(s.logging.verbosity, 3);

    let (s, w) = ok(Some(FILE), &flags);
    assert_eq!(s.min_sync_period, Duration::from_secs(2), "the file wins");
    assert_eq!(
        s.client.kubeconfig.as_deref(),
        Some("/var/lib/kube-proxy/kubeconfig.conf"),
        "the file wins over --kubeconfig, as in kube-proxy"
    );
    assert_eq!(
        s.hostname_override.as_deref(),
        Some("flag-node"),
        "but not over --hostname-override"
    );
    assert_eq!(s.logging.verbosity, 3, "nor over the logging flags");
    assert!(
        w.iter().any(|w| w.contains("--min-sync-period")
            && w.contains("--kubeconfig")
            && w.contains("ignored")),
        "{w:?}"
    );
    // An empty --hostname-override is no override.
    let (s, _) = ok(Some(FILE), &["--hostname-override="]);
    assert_eq!(s.hostname_override.as_deref(), Some("node-a"));
    // Flag errors name the flag.
    for (flag, name) in [
        ("--sync-period=0s", "--sync-period"),
        ("--healthz-bind-address=nope", "--healthz-bind-address"),
        ("--masquerade-all=perhaps", "--masquerade-all"),
        ("--conntrack-min=lots", "--conntrack-min"),
        ("--feature-gates=Foo", "--feature-gates"),
        ("--config-sync-period=0s", "--config-sync-period"),
        ("--bind-address=here", "--bind-address"),
    ] {
        assert_eq!(
            resolve_with(None, &[flag]).unwrap_err().field,
            name,
            "{flag}"
        );
    }
}

#[test]
fn the_last_flag_wins_and_lists_add_up() {
    let (s, _) = ok(
        None,
        &["--cluster-cidr=10.0.0.0/8", "--cluster-cidr=10.1.0.0/16"],
    );
    assert_eq!(
        s.detect_local,
        DetectLocal::ClusterCidr(vec!["10.1.0.0/16".parse().unwrap()])
    );
    let (s, _) = ok(
        None,
        &[
            "--nodeport-addresses=primary",
            "--nodeport-addresses",
            "10.9.0.0/16",
        ],
    );
    assert!(s.node_ports.primary);
    assert_eq!(
        s.node_ports.cidrs,
        vec!["10.9.0.0/16".parse::<ipnet::IpNet>().unwrap()]
    );
    let (s, _) = ok(
        None,
        &[
            "--feature-gates=LoggingAlphaOptions=true",
            "--feature-gates=LoggingBetaOptions=false",
        ],
    );
    assert!(s.feature_gates.enabled(gates::LOGGING_ALPHA_OPTIONS));
    assert!(!s.feature_gates.enabled(gates::LOGGING_BETA_OPTIONS));
}

#[test]
fn empty_flags_take_kube_proxys_nftables_defaults() {
    let (s, _) = ok(None, &["--nodeport-addresses=", "--detect-local-mode="]);
    assert_eq!(s.node_ports, NodePortAddresses::primary());
    assert_eq!(s.detect_local, DetectLocal::ClusterCidr(vec![]));
    // client-go's defaults and its "no limit".
    let (s, _) = ok(None, &["--kube-api-qps=0", "--kube-api-burst=0"]);
    assert_eq!((s.client.qps, s.client.burst), (5.0, 10));
    let (s, _) = ok(None, &["--kube-api-qps=-1"]);
    assert!(s.client.qps < 0.0, "accepted: no limit");
    let (_, w) = ok(None, &["--proxy-port-range=30000-32767"]);
    assert!(
        w.iter()
            .any(|w| w.contains("--proxy-port-range has no effect")),
        "{w:?}"
    );
    // The effective configuration holds the name as used.
    let (s, _) = ok(None, &["--hostname-override= Node-1 "]);
    assert_eq!(s.effective["hostnameOverride"], "node-1");
}

#[test]
fn node_port_keywords_combine() {
    let mut w = Vec::new();
    let np = node_ports(
        &[
            "primary".into(),
            "all".into(),
            "localhost".into(),
            "127.0.0.0/8".into(),
        ],
        &mut w,
    )
    .unwrap();
    assert!(np.primary);
    assert_eq!(np.cidrs, NodePortAddresses::all().cidrs);
    assert!(
        w[0].contains("localhost, 127.0.0.0/8 have no effect"),
        "{w:?}"
    );
}

#[test]
fn logging_flags_join_the_files_vmodule_after_their_own() {
    let text = FILE.replace(
        "mode: nftables",
        "mode: nftables\nlogging:\n  format: json\n  vmodule: [{filePattern: proxier, verbosity: 4}]",
    );
    let (s, _) = ok(Some(&text), &["--vmodule=daemon=2"]);
    assert_eq!(s.logging.format, LogFormat::Json);
    assert_eq!(
        s.logging.vmodule,
        vec![("daemon".into(), 2), ("proxier".into(), 4)]
    );
    let (s, _) = ok(Some(&text), &["--logging-format=text"]);
    assert_eq!(s.logging.format, LogFormat::Text, "the flag wins");
}

#[test]
fn an_empty_mode_runs_nftables_with_a_warning() {
    let (s, w) = ok(Some(&FILE.replace("mode: nftables", "mode: \"\"")), &[]);
    assert!(w.iter().any(|w| w.contains("no proxy mode set")), "{w:?}");
    assert_eq!(s.effective["mode"], "nftables");
}

#[test]
fn conntrack_and_oom_settings_from_the_file_or_the_flags() {
    let text = FILE.replace(
        "conntrack:\n  maxPerCore: 32768\n",
        "oomScoreAdj: -500\nconntrack:\n  maxPerCore: 0\n  min: 1000\n  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 0s\n  tcpBeLiberal: true\n  udpTimeout: 45s\n  udpStreamTimeout: null\n",
    );
    let flags = ["--conntrack-udp-timeout=9s", "--oom-score-adj", "1"];
    let (s, w) = ok(Some(&text), &flags);
    let c = &s.conntrack;
    assert_eq!((c.max_per_core, c.min), (0, 1000), "an explicit 0 stays 0");
    assert_eq!(c.tcp_established_timeout, Duration::from_secs(7200));
    assert_eq!(c.tcp_close_wait_timeout, Duration::ZERO);
    assert!(c.tcp_be_liberal);
    assert_eq!(c.udp_timeout, Duration::from_secs(45), "the file wins");
    assert_eq!(c.udp_stream_timeout, Duration::ZERO);
    assert_eq!(s.oom_score_adj, Some(-500));
    assert!(
        w.join("\n")
            .contains("--conntrack-udp-timeout, --oom-score-adj ignored"),
        "{w:?}"
    );
    let (s, _) = ok(None, &flags);
    assert_eq!(s.conntrack.udp_timeout, Duration::from_secs(9));
    assert_eq!(s.oom_score_adj, Some(1));
    let (s, _) = ok(None, &[]);
    assert_eq!(s.conntrack, Conntrack::default());
    assert_eq!(s.oom_score_adj, Some(-999), "kube-proxy's default");
}

#[test]
fn no_effect_fields_warn_only_when_set() {
    let text = FILE.replace(
        "mode: nftables",
        "mode: nftables\nipvs: {scheduler: rr, syncPeriod: 0s}\niptables: {masqueradeBit: 14, localhostNodePorts: false}\nwinkernel: {enableDSR: false}",
    );
    let (_, w) = ok(Some(&text), &[]);
    let w = w.join("\n");
    assert!(
        w.contains("ipvs.scheduler \"rr\" has no effect: it applies to the IPVS mode only"),
        "{w}"
    );
    assert!(
        w.contains("iptables.localhostNodePorts false has no effect"),
        "{w}"
    );
    assert!(!w.contains("ipvs.syncPeriod"), "the default: {w}");
    assert!(!w.contains("masqueradeBit"), "the default: {w}");
    assert!(!w.contains("winkernel"), "the default: {w}");
}

#[test]
fn the_written_configuration_reads_back_the_same() {
    for (file, flags) in [
        (Some(KUBEADM), vec![]),
        (Some(FILE), vec![]),
        (
            None,
            vec![
                "--cluster-cidr=10.0.0.0/8",
                "--masquerade-all",
                "--sync-period=45s",
                "--feature-gates=LoggingAlphaOptions=true",
                "--vmodule=daemon=4",
            ],
        ),
    ] {
        let (s, _) = ok(file, &flags);
        let yaml = render::v1alpha1_yaml(&s.effective).unwrap();
        let (again, w) = ok(Some(&yaml), &[]);
        assert!(w.is_empty(), "{w:?}\n{yaml}");
        assert_eq!(again, s, "{yaml}");
    }
}

#[test]
fn configz_is_the_versioned_configuration_with_every_field_path() {
    let (s, _) = ok(Some(FILE), &[]);
    let z = render::configz(&s.effective);
    let c = &z["kubeproxy.config.k8s.io"];
    assert_eq!(c["kind"], "KubeProxyConfiguration");
    assert_eq!(c["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1");
    assert_eq!(c["syncPeriod"], serde_json::Value::Null, "{c:#}");
    assert_eq!(c["nftables"]["syncPeriod"], "1m0s");
    assert_eq!(c["nftables"]["minSyncPeriod"], "2s");
    assert_eq!(c["nftables"]["masqueradeBit"], 15);
    assert_eq!(c["conntrack"]["maxPerCore"], 32768);
    assert_eq!(c["clientConnection"]["qps"], 5.0);
    assert_eq!(c["logging"]["format"], "text");
    assert_eq!(c["mode"], "nftables");
    // Every field path of the file kube-proxy would write is there.
    let yaml = render::v1alpha1_yaml(&s.effective).unwrap();
    let file: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    fn paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v.as_object() {
            Some(m) => {
                for (k, v) in m {
                    paths(v, format!("{at}.{k}"), out);
                }
            }
            None => out.push(at),
        }
    }
    let (mut want, mut got) = (Vec::new(), Vec::new());
    paths(&file, String::new(), &mut want);
    paths(c, String::new(), &mut got);
    assert!(want.len() >= 57, "{}", want.len());
    assert_eq!(got, want);
}

/// What a kube-proxy flag does in verdict.
enum Expect {
    /// Applied: the settings show it.
    Applied(fn(&Settings) -> bool),
    /// Accepted with this warning.
    Warns(&'static str),
    /// A flag about what to do, checked on the command line.
    Cli(fn(&cli::Cli) -> bool),
}

/// Every flag of kube-proxy (options.go, logsapi, -h, --version), with a
/// value, and what verdict does with it.
fn kube_proxy_flags() -> Vec<(&'static str, Vec<&'static str>, Expect)> {
    use Expect::*;
    vec![
        (
            "config",
            vec!["--config=/etc/kube-proxy.conf"],
            Cli(|c| c.config.as_deref() == Some("/etc/kube-proxy.conf")),
        ),
        (
            "write-config-to",
            vec!["--write-config-to", "/tmp/out.yaml"],
            Cli(|c| c.write_config_to.is_some()),
        ),
        (
            "cleanup",
            vec!["--cleanup"],
            Cli(|c| c.command == cli::Command::Cleanup),
        ),
        (
            "boot-id-file",
            vec!["--boot-id-file=/proc/sys/kernel/random/boot_id"],
            Cli(|c| c.inert == ["boot-id-file"]),
        ),
        (
            "machine-id-file",
            vec![
                "--machine-id-file",
                "/etc/machine-id,/var/lib/dbus/machine-id",
            ],
            Cli(|c| c.inert == ["machine-id-file"]),
        ),
        (
            "feature-gates",
            vec!["--feature-gates=LoggingAlphaOptions=true"],
            Applied(|s| s.feature_gates.enabled(gates::LOGGING_ALPHA_OPTIONS)),
        ),
        (
            "kubeconfig",
            vec!["--kubeconfig=/k"],
            Applied(|s| s.client.kubeconfig.as_deref() == Some("/k")),
        ),
        (
            "master",
            vec!["--master=https://10.0.0.1:6443"],
            Cli(|c| c.master.is_some()),
        ),
        (
            "kube-api-content-type",
            vec!["--kube-api-content-type=application/yaml"],
            Warns(
                "--kube-api-content-type has no effect: verdict's client (kube-rs) sends application/json",
            ),
        ),
        (
            "kube-api-burst",
            vec!["--kube-api-burst=30"],
            Applied(|s| s.client.burst == 30),
        ),
        (
            "kube-api-qps",
            vec!["--kube-api-qps=20"],
            Applied(|s| s.client.qps == 20.0),
        ),
        (
            "hostname-override",
            vec!["--hostname-override", " Node-B"],
            Applied(|s| s.hostname_override.as_deref() == Some("node-b")),
        ),
        (
            "bind-address",
            vec!["--bind-address=192.168.0.2"],
            Applied(|s| s.bind_address == Some("192.168.0.2".parse().unwrap())),
        ),
        (
            "healthz-bind-address",
            vec!["--healthz-bind-address=127.0.0.1"],
            Applied(|s| s.healthz_bind_address == addr("127.0.0.1:10256")),
        ),
        (
            "metrics-bind-address",
            vec!["--metrics-bind-address=0.0.0.0:10249"],
            Applied(|s| s.metrics_bind_address == addr("0.0.0.0:10249")),
        ),
        (
            "bind-address-hard-fail",
            vec!["--bind-address-hard-fail"],
            Applied(|s| s.bind_address_hard_fail),
        ),
        (
            "profiling",
            vec!["--profiling=true"],
            Applied(|s| s.enable_profiling),
        ),
        (
            "show-hidden-metrics-for-version",
            vec!["--show-hidden-metrics-for-version=1.35"],
            Warns("verdict hides no metrics"),
        ),
        ("init-only", vec!["--init-only"], Cli(|c| c.init_only)),
        (
            "proxy-mode",
            vec!["--proxy-mode=iptables", "--proxy-mode=nftables"],
            Applied(|s| s.effective["mode"] == "nftables"),
        ),
        (
            "iptables-masquerade-bit",
            vec!["--iptables-masquerade-bit=15"],
            Warns("--iptables-masquerade-bit has no effect"),
        ),
        (
            "masquerade-all",
            vec!["--masquerade-all=true"],
            Applied(|s| s.masquerade_all),
        ),
        (
            "iptables-localhost-nodeports",
            vec!["--iptables-localhost-nodeports=false"],
            Warns("--iptables-localhost-nodeports has no effect"),
        ),
        (
            "iptables-sync-period",
            vec!["--iptables-sync-period=45s"],
            Applied(|s| s.sync_period == Duration::from_secs(45)),
        ),
        (
            "iptables-min-sync-period",
            vec!["--iptables-min-sync-period=3s"],
            Applied(|s| s.min_sync_period == Duration::from_secs(3)),
        ),
        (
            "ipvs-sync-period",
            vec!["--ipvs-sync-period=1m"],
            Warns("--ipvs-sync-period has no effect"),
        ),
        (
            "ipvs-min-sync-period",
            vec!["--ipvs-min-sync-period=1s"],
            Warns("--ipvs-min-sync-period has no effect"),
        ),
        (
            "ipvs-scheduler",
            vec!["--ipvs-scheduler=rr"],
            Warns("--ipvs-scheduler has no effect"),
        ),
        (
            "ipvs-exclude-cidrs",
            vec!["--ipvs-exclude-cidrs=10.0.0.0/8"],
            Warns("--ipvs-exclude-cidrs has no effect"),
        ),
        (
            "ipvs-strict-arp",
            vec!["--ipvs-strict-arp"],
            Warns("--ipvs-strict-arp has no effect"),
        ),
        (
            "ipvs-tcp-timeout",
            vec!["--ipvs-tcp-timeout=900s"],
            Warns("--ipvs-tcp-timeout has no effect"),
        ),
        (
            "ipvs-tcpfin-timeout",
            vec!["--ipvs-tcpfin-timeout=120s"],
            Warns("--ipvs-tcpfin-timeout has no effect"),
        ),
        (
            "ipvs-udp-timeout",
            vec!["--ipvs-udp-timeout=300s"],
            Warns("--ipvs-udp-timeout has no effect"),
        ),
        (
            "detect-local-mode",
            vec!["--detect-local-mode=NodeCIDR"],
            Applied(|s| s.detect_local == DetectLocal::NodeCidr),
        ),
        (
            "pod-bridge-interface",
            vec![
                "--detect-local-mode=BridgeInterface",
                "--pod-bridge-interface=cbr0",
            ],
            Applied(|s| s.detect_local == DetectLocal::BridgeInterface("cbr0".into())),
        ),
        (
            "pod-interface-name-prefix",
            vec![
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=veth",
            ],
            Applied(|s| s.detect_local == DetectLocal::InterfaceNamePrefix("veth".into())),
        ),
        (
            "cluster-cidr",
            vec!["--cluster-cidr=10.42.0.0/16,fd00:42::/56"],
            Applied(|s| matches!(&s.detect_local, DetectLocal::ClusterCidr(n) if n.len() == 2)),
        ),
        (
            "nodeport-addresses",
            vec!["--nodeport-addresses=10.0.0.0/8"],
            Applied(|s| {
                s.node_ports == NodePortAddresses::cidrs(vec!["10.0.0.0/8".parse().unwrap()])
            }),
        ),
        (
            "oom-score-adj",
            vec!["--oom-score-adj=-998"],
            Applied(|s| s.oom_score_adj == Some(-998)),
        ),
        (
            "conntrack-max-per-core",
            vec!["--conntrack-max-per-core=0"],
            Applied(|s| s.conntrack.max_per_core == 0),
        ),
        (
            "conntrack-min",
            vec!["--conntrack-min=65536"],
            Applied(|s| s.conntrack.min == 65536),
        ),
        (
            "conntrack-tcp-timeout-established",
            vec!["--conntrack-tcp-timeout-established=12h"],
            Applied(|s| s.conntrack.tcp_established_timeout == Duration::from_secs(12 * 3600)),
        ),
        (
            "conntrack-tcp-timeout-close-wait",
            vec!["--conntrack-tcp-timeout-close-wait=30m"],
            Applied(|s| s.conntrack.tcp_close_wait_timeout == Duration::from_secs(1800)),
        ),
        (
            "conntrack-tcp-be-liberal",
            vec!["--conntrack-tcp-be-liberal=true"],
            Applied(|s| s.conntrack.tcp_be_liberal),
        ),
        (
            "conntrack-udp-timeout",
            vec!["--conntrack-udp-timeout=30s"],
            Applied(|s| s.conntrack.udp_timeout == Duration::from_secs(30)),
        ),
        (
            "conntrack-udp-timeout-stream",
            vec!["--conntrack-udp-timeout-stream=2m"],
            Applied(|s| s.conntrack.udp_stream_timeout == Duration::from_secs(120)),
        ),
        (
            "config-sync-period",
            vec!["--config-sync-period=5m"],
            Warns("--config-sync-period has no effect"),
        ),
        (
            "healthz-port",
            vec!["--healthz-bind-address=0.0.0.0", "--healthz-port=10257"],
            Applied(|s| s.healthz_bind_address == addr("0.0.0.0:10257")),
        ),
        (
            "metrics-port",
            vec!["--metrics-port=0"],
            Applied(|s| s.metrics_bind_address.is_none()),
        ),
        (
            "logging-format",
            vec!["--logging-format=json"],
            Applied(|s| s.logging.format == LogFormat::Json),
        ),
        (
            "log-flush-frequency",
            vec!["--log-flush-frequency=10s"],
            Warns("--log-flush-frequency has no effect"),
        ),
        ("v", vec!["-v", "4"], Applied(|s| s.logging.verbosity == 4)),
        (
            "vmodule",
            vec!["--vmodule=proxier=4"],
            Applied(|s| s.logging.vmodule == [("proxier".to_owned(), 4)]),
        ),
        (
            "log-json-split-stream",
            vec![
                "--feature-gates=LoggingAlphaOptions=true",
                "--log-json-split-stream",
            ],
            Applied(|s| s.logging.json_split_stream),
        ),
        (
            "log-json-info-buffer-size",
            vec!["--log-json-info-buffer-size=64Ki"],
            Warns("--log-json-info-buffer-size has no effect"),
        ),
        (
            "log-text-split-stream",
            vec![
                "--feature-gates=AllAlpha=true",
                "--log-text-split-stream=true",
            ],
            Applied(|s| s.logging.text_split_stream),
        ),
        (
            "log-text-info-buffer-size",
            vec!["--log-text-info-buffer-size=1Mi"],
            Warns("--log-text-info-buffer-size has no effect"),
        ),
        ("help", vec!["-h"], Cli(|c| c.help)),
        (
            "version",
            vec!["--version=raw"],
            Cli(|c| c.version == Some(cli::Version::Raw)),
        ),
    ]
}

#[test]
fn every_kube_proxy_flag_is_applied_or_accepted_with_its_warning() {
    let table = kube_proxy_flags();
    assert_eq!(table.len(), 59, "kube-proxy 1.36 has 59 flags");
    // `--proxy-port-range` is accepted for older command lines; kube-proxy
    // no longer has it.
    let mut known: Vec<&str> = cli::kube_proxy_flags()
        .into_iter()
        .filter(|f| *f != "proxy-port-range")
        .collect();
    known.sort();
    let mut tested: Vec<&str> = table.iter().map(|(n, _, _)| *n).collect();
    tested.sort();
    assert_eq!(known, tested, "verdict's flag list is kube-proxy's");
    for (name, flags, expect) in &table {
        // With the mode set, as kube-proxy's would be for nftables.
        let mut flags = flags.clone();
        flags.push("--proxy-mode=nftables");
        let cli = args(&flags);
        match expect {
            Expect::Cli(check) => assert!(check(&cli), "--{name}"),
            Expect::Applied(check) => {
                let r = resolve(&cli.input(None)).unwrap_or_else(|e| panic!("--{name}: {e}"));
                assert!(check(&r.settings), "--{name} is not applied");
                if !matches!(*name, "healthz-port" | "metrics-port") {
                    assert!(r.warnings.is_empty(), "--{name}: {:?}", r.warnings);
                }
            }
            Expect::Warns(text) => {
                let r = resolve(&cli.input(None)).unwrap_or_else(|e| panic!("--{name}: {e}"));
                assert!(
                    r.warnings.iter().any(|w| w.contains(text)),
                    "--{name}: {:?}",
                    r.warnings
                );
            }
        }
    }
}

/// The flags k3s passes to its embedded kube-proxy, and RKE2's static pod.
#[test]
fn k3s_and_rke2_command_lines_are_accepted() {
    let k3s = [
        "--cluster-cidr=10.42.0.0/16",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-close-wait=0s",
        "--conntrack-tcp-timeout-established=0s",
        "--healthz-bind-address=127.0.0.1",
        "--hostname-override=k3s-server-1",
        "--kubeconfig=/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig",
        "--proxy-mode=nftables",
    ];
    let (s, w) = ok(None, &k3s);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(s.healthz_bind_address, addr("127.0.0.1:10256"));
    assert_eq!(s.conntrack.max_per_core, 0);
    let rke2 = [
        "--cluster-cidr=10.42.0.0/16",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-close-wait=0s",
        "--conntrack-tcp-timeout-established=0s",
        "--healthz-bind-address=127.0.0.1",
        "--hostname-override=rke2-agent-1",
        "--kubeconfig=/var/lib/rancher/rke2/agent/kubeproxy.kubeconfig",
        "--proxy-mode=nftables",
        "--metrics-bind-address=0.0.0.0",
        "--v=2",
        "--feature-gates=SomeKubeletGate=true",
    ];
    let (s, w) = ok(None, &rke2);
    assert_eq!(s.metrics_bind_address, addr("0.0.0.0:10249"));
    assert_eq!(s.logging.verbosity, 2);
    assert_eq!(w.len(), 1, "only the gate verdict does not know: {w:?}");
}

/// `docs/configuration.md`: every setting and flag, with what verdict does
/// with it, from the table itself (`UPDATE_GOLDEN=1` rewrites it).
#[test]
fn the_configuration_reference_is_current() {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every field of kube-proxy's `KubeProxyConfiguration`\n\
         (`kubeproxy.config.k8s.io/v1alpha1`) and every flag, with what verdict\n\
         does with it. Generated from `crates/verdict/src/config/table.rs` and\n\
         `crates/verdict/src/cli.rs` by the test\n\
         `the_configuration_reference_is_current`\n\
         (`UPDATE_GOLDEN=1 cargo test -p verdict --bin verdict configuration_reference`).\n\n\
         \"Applied\" settings change what verdict does; the others are accepted, and a\n\
         warning says why they have no effect when they are set to anything but\n\
         their default.\n\n\
         ## Fields and their flags\n\n\
         | field | flags | what it is | default | in verdict |\n|---|---|---|---|---|\n",
    );
    let mut fields = 0;
    for s in table::SETTINGS {
        fields += 1;
        let flags: Vec<String> = s
            .flags
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let name = if *f == "v" {
                    "-v, --v".to_owned()
                } else {
                    format!("--{f}")
                };
                if i > 0 {
                    format!("{name} (verdict's)")
                } else {
                    name
                }
            })
            .collect();
        let default = match s.default {
            table::Default::WhenZero(l) | table::Default::WhenNull(l) => l.text(),
            table::Default::Computed if s.path == "healthzBindAddress" => {
                "0.0.0.0:10256 ([::]:10256 with an IPv6 bindAddress)".into()
            }
            table::Default::Computed => {
                "127.0.0.1:10249 ([::1]:10249 with an IPv6 bindAddress)".into()
            }
            table::Default::Zero => "".into(),
        };
        let effect = match s.effect {
            table::Effect::Apply(_) => {
                let mut e = "applied".to_owned();
                if s.overrides_file {
                    e.push_str("; the flag wins over the file");
                }
                e
            }
            table::Effect::None(why) => format!("no effect: {why}"),
            table::Effect::Checked(_, why) => format!("checked, no effect: {why}"),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {effect} |",
            s.path,
            flags.join(", "),
            s.help,
            if default.is_empty() {
                String::new()
            } else {
                format!("`{default}`")
            }
        );
    }
    let _ = write!(
        out,
        "\n{fields} fields, and `apiVersion` and `kind`.\n\n\
         ## Flags that are not fields\n\n\
         | flag | what it does |\n|---|---|\n"
    );
    for line in cli::help()
        .lines()
        .filter(|l| l.starts_with("  ") && l.trim_start().starts_with('-'))
    {
        let (name, help) = line.trim().split_once("  ").unwrap_or((line.trim(), ""));
        let name = name.trim();
        let base = name
            .trim_start_matches("-h, ")
            .split_whitespace()
            .next()
            .unwrap_or("");
        let is_field = table::SETTINGS.iter().any(|s| {
            s.flags
                .iter()
                .any(|f| base == format!("--{f}") || (base == "-v," && *f == "v"))
        });
        if !is_field {
            let _ = writeln!(out, "| `{name}` | {} |", help.trim());
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &out).unwrap();
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == out,
        "docs/configuration.md is stale: run UPDATE_GOLDEN=1 cargo test -p verdict --bin verdict configuration_reference"
    );
}

#[test]
fn flagz_shows_every_flag_with_the_value_it_stands_for() {
    // Nothing given: kube-proxy's own defaults, all 59 of its flags.
    let z = super::render::flagz(None, &[]);
    assert_eq!(z.len(), 59);
    assert_eq!(z.get("proxy-mode").map(String::as_str), Some(""));
    let flags = [
        "--master",
        "https://api:6443",
        "--nodeport-addresses",
        "primary",
        "--feature-gates",
        "B=false,A=true",
        "--conntrack-max-per-core",
        "0",
        "--kube-api-qps",
        "5",
        "--iptables-sync-period",
        "1m",
        "--flows",
    ];
    let cli = args(&flags);
    let flags_only = super::resolve(&cli.input(None)).unwrap().settings.effective;
    let z = super::render::flagz(Some(&flags_only), &cli.given);
    let at = |k: &str| z.get(k).map(String::as_str);
    assert_eq!(at("master"), Some("https://api:6443"));
    // Not given: the flag's default, not the configuration's.
    assert_eq!(at("proxy-mode"), Some(""));
    // Without --config, the mode kube-proxy defaulted to after parsing.
    assert_eq!(at("detect-local-mode"), Some("ClusterCIDR"));
    assert_eq!(at("nodeport-addresses"), Some("[primary]"));
    assert_eq!(at("feature-gates"), Some("A=true,B=false"));
    assert_eq!(at("conntrack-max-per-core"), Some("0"));
    // As Go writes a float and a duration.
    assert_eq!(at("kube-api-qps"), Some("5"));
    assert_eq!(at("iptables-sync-period"), Some("1m0s"));
    assert_eq!(at("healthz-bind-address"), Some("0.0.0.0:10256"));
    // verdict's own flags, when given.
    assert_eq!(at("flows"), Some("true"));
    assert_eq!(z.len(), 60);
}
