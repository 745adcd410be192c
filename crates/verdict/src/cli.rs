//! The command line, in kube-proxy's grammar (pflag's): `--flag=value` and
//! `--flag value`, booleans alone or as `--flag=true`/`--flag=false`, `_`
//! read as `-`, the last of a repeated flag wins (lists and feature gates
//! add up), `-v=2`/`-v 2`/`-v2`, and `--help`/`--version` anywhere. The
//! configuration flags come from [`crate::config::table::SETTINGS`]; the
//! others (what to do, where the file is) are defined here.

use crate::config::table::{self, Default, Literal, SETTINGS, Setting};
use crate::config::value::Kind;
use crate::config::{GivenFlag, Input};

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Program the node and keep it programmed (the default).
    Run,
    /// Print the nftables script `run` would program, and exit.
    Plan,
    /// Remove verdict's and kube-proxy's state, and exit.
    Cleanup,
    /// Print the version.
    Version,
    /// Walk a packet through the table (`verdict trace`).
    Trace,
    /// Everything about one Service (`verdict explain NAMESPACE/NAME`).
    Explain,
    /// List the Services (`verdict services`).
    Services,
    /// The last syncs and foreign changes (`verdict syncs`).
    Syncs,
    /// The kernel's connections by Service and endpoint
    /// (`verdict connections [NAMESPACE/NAME]`).
    Connections,
    /// The flow stream (`verdict flows`).
    Flows,
    /// Check the node for what breaks Services (`verdict doctor`).
    Doctor,
}

/// Every command, in the order `--help` lists them.
pub const COMMANDS: [Command; 11] = [
    Command::Run,
    Command::Plan,
    Command::Cleanup,
    Command::Version,
    Command::Trace,
    Command::Explain,
    Command::Services,
    Command::Syncs,
    Command::Connections,
    Command::Flows,
    Command::Doctor,
];

/// The command of that name.
fn command_named(name: &str) -> Option<Command> {
    COMMANDS.into_iter().find(|c| c.name() == name)
}

impl Command {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Command::Run => "run",
            Command::Plan => "plan",
            Command::Cleanup => "cleanup",
            Command::Version => "version",
            Command::Trace => "trace",
            Command::Explain => "explain",
            Command::Services => "services",
            Command::Syncs => "syncs",
            Command::Connections => "connections",
            Command::Flows => "flows",
            Command::Doctor => "doctor",
        }
    }

    /// The introspection commands: clients of the daemon's API, or offline
    /// with `--manifests`.
    pub fn inspects(self) -> bool {
        matches!(
            self,
            Command::Trace
                | Command::Explain
                | Command::Services
                | Command::Syncs
                | Command::Connections
                | Command::Flows
                | Command::Doctor
        )
    }
}

/// `--version`: plain, or `raw` (every build detail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `--version`.
    Plain,
    /// `--version=raw`.
    Raw,
}

/// The parsed command line.
#[derive(Clone, Debug)]
pub struct Cli {
    /// What to do.
    pub command: Command,
    /// `--config`.
    pub config: Option<String>,
    /// `--write-config-to`.
    pub write_config_to: Option<String>,
    /// `--init-only`.
    pub init_only: bool,
    /// `--master`.
    pub master: Option<String>,
    /// `--healthz-port` (deprecated).
    pub healthz_port: Option<String>,
    /// `--metrics-port` (deprecated).
    pub metrics_port: Option<String>,
    /// `--manifests` (verdict's own).
    pub manifests: Option<String>,
    /// `--keep-kube-proxy-nftables` (verdict's own).
    pub keep_kube_proxy_nftables: bool,
    /// `--watch-pods`: watch every Pod, for the flow stream's names.
    pub watch_pods: bool,
    /// `--service-counters` (verdict's own; on by default).
    pub service_counters: bool,
    /// `--flows` (verdict's own; on by default).
    pub flows: bool,
    /// `--flows` or `--flow-log` given: a stream that cannot start then
    /// stops verdict, where by default it is left off with a warning.
    pub flows_required: bool,
    /// `--flow-log` (verdict's own): a file, or `-` for standard output.
    pub flow_log: Option<String>,
    /// `--flow-log-max-size`, `--flow-log-max-backups`, `--flow-log-rate`
    /// (verdict's own).
    pub flow_log_limits: verdict_node::flows::FlowLogLimits,
    /// Whether one of those was given (they need `--flow-log`).
    pub flow_log_limits_given: bool,
    /// `--api-bind-address` (verdict's own; none by default: the API and
    /// the web view answer loopback clients on the metrics address).
    pub api_bind_address: Option<std::net::SocketAddr>,
    /// `--hubble-listen-address` (Cilium's name; loopback 4244 by default,
    /// `None`: off).
    pub hubble_listen_address: Option<std::net::SocketAddr>,
    /// `--hubble-tls-cert-file`, `--hubble-tls-key-file`,
    /// `--hubble-tls-client-ca-files` (Cilium's names).
    pub hubble_tls: HubbleTlsFlags,
    /// `--cluster-name` (Cilium's name): the cluster in the TLS names
    /// Hubble's peers are told of.
    pub cluster_name: String,
    /// `--service-metrics`, `--service-metrics-namespaces` and
    /// `--service-metrics-selector` (verdict's own).
    pub service_metrics: verdict_model::MetricsSelection,
    /// `--nftables-backend` (verdict's own; netlink by default).
    pub nftables_backend: crate::config::NftablesBackend,
    /// `--help`.
    pub help: bool,
    /// `--version`.
    pub version: Option<Version>,
    /// The configuration flags, in order.
    pub flags: Vec<GivenFlag>,
    /// Every flag as given (`name`, value), for the start-up log.
    pub given: Vec<(String, String)>,
    /// Flags accepted without effect, as kube-proxy accepts them.
    pub inert: Vec<&'static str>,
    /// `cleanup --force` (verdict's own).
    pub force: bool,
    /// The introspection commands' flags (`server`, `output`, `src`, …),
    /// by name; the last given wins.
    pub inspect: Vec<(&'static str, String)>,
    /// `verdict explain`'s Service.
    pub target: Option<String>,
}

impl Cli {
    /// An introspection flag's value.
    pub fn inspect_flag(&self, name: &str) -> Option<&str> {
        self.inspect
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Cli {
    /// The configuration's input: the file's text and the flags.
    pub fn input<'a>(&'a self, file: Option<&'a str>) -> Input<'a> {
        Input {
            file,
            flags: self.flags.clone(),
            healthz_port: self.healthz_port.as_deref(),
            metrics_port: self.metrics_port.as_deref(),
        }
    }
}

/// A command line that cannot be used (exit code 2).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The flags that are not configuration settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    Config,
    WriteConfigTo,
    Cleanup,
    InitOnly,
    Master,
    HealthzPort,
    MetricsPort,
    Help,
    Version,
    Force,
    /// A flag kube-proxy accepts and does not use (`--boot-id-file`,
    /// `--machine-id-file`, which it inherits from cAdvisor).
    Inert,
    Manifests,
    KeepKubeProxyNftables,
    WatchPods,
    ServiceCounters,
    Flows,
    FlowLog,
    FlowLogMaxSize,
    FlowLogMaxBackups,
    FlowLogRate,
    ServiceMetrics,
    ServiceMetricsNamespaces,
    ServiceMetricsSelector,
    ApiBindAddress,
    HubbleListenAddress,
    HubbleTlsCertFile,
    HubbleTlsKeyFile,
    HubbleTlsClientCaFiles,
    ClusterName,
    NftablesBackend,
    /// A flag of the introspection commands.
    Inspect,
}

struct OptSpec {
    name: &'static str,
    short: Option<char>,
    opt: Opt,
    /// Takes a value (`--name value`); otherwise a boolean-like flag whose
    /// value, if any, comes after `=`.
    takes_value: bool,
    help: &'static str,
    /// kube-proxy has it (verdict's own flags are marked in `--help`).
    kube_proxy: bool,
    /// The commands the flag belongs to (empty: `run`'s, which `plan`,
    /// `cleanup` and `doctor` take too).
    commands: &'static [Command],
}

impl OptSpec {
    /// A flag kube-proxy accepts from cAdvisor and does not use.
    const fn inert(name: &'static str) -> OptSpec {
        OptSpec {
            name,
            short: None,
            opt: Opt::Inert,
            takes_value: true,
            help: "Accepted as kube-proxy accepts it (a cAdvisor flag it inherits); no effect",
            kube_proxy: true,
            commands: &[],
        }
    }
}

/// They and `doctor`, which asks the API for the drift.
const ASKING: &[Command] = &[
    Command::Trace,
    Command::Explain,
    Command::Services,
    Command::Syncs,
    Command::Connections,
    Command::Flows,
    Command::Doctor,
];

const OPTIONS: &[OptSpec] = &[
    OptSpec {
        name: "config",
        short: None,
        opt: Opt::Config,
        takes_value: true,
        help: "KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1); it wins over the other flags but --hostname-override, --master and the logging flags",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "write-config-to",
        short: None,
        opt: Opt::WriteConfigTo,
        takes_value: true,
        help: "Write the effective configuration to this file, and exit",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "cleanup",
        short: None,
        opt: Opt::Cleanup,
        takes_value: false,
        help: "Remove verdict's tables and kube-proxy's iptables, IPVS and nftables state, and exit",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "init-only",
        short: None,
        opt: Opt::InitOnly,
        takes_value: false,
        help: "Apply the privileged settings (conntrack sysctls, OOM score), and exit",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "master",
        short: None,
        opt: Opt::Master,
        takes_value: true,
        help: "The API server's address (overrides the kubeconfig's)",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "healthz-port",
        short: None,
        opt: Opt::HealthzPort,
        takes_value: true,
        help: "Deprecated: the port of an --healthz-bind-address given without one (0 disables)",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "metrics-port",
        short: None,
        opt: Opt::MetricsPort,
        takes_value: true,
        help: "Deprecated: the port of a --metrics-bind-address given without one (0 disables)",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "force",
        short: None,
        opt: Opt::Force,
        takes_value: false,
        help: "cleanup: delete kube-proxy's state even while a kube-proxy process runs in this network namespace",
        kube_proxy: false,
        commands: &[Command::Cleanup],
    },
    OptSpec::inert("boot-id-file"),
    OptSpec::inert("machine-id-file"),
    OptSpec {
        name: "help",
        short: Some('h'),
        opt: Opt::Help,
        takes_value: false,
        help: "Print this help",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "version",
        short: None,
        opt: Opt::Version,
        takes_value: false,
        help: "Print the version (--version=raw: every build detail)",
        kube_proxy: true,
        commands: &[],
    },
    OptSpec {
        name: "manifests",
        short: None,
        opt: Opt::Manifests,
        takes_value: true,
        help: "Read Services, EndpointSlices, Nodes and ServiceCIDRs from this YAML file or directory instead of the API server, and follow its changes",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "watch-pods",
        short: None,
        opt: Opt::WatchPods,
        takes_value: false,
        help: "Watch every Pod (except finished ones) so that flows name any pod by its address, with its labels and workload (Deployment, StatefulSet, ...), in /api/v1/flows, the flow log, verdict flows, the web view and Hubble's API. Without it a pod is named only when an EndpointSlice the node holds does. Costs memory per pod in the cluster (docs/flows.md) and needs RBAC to list and watch pods",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "keep-kube-proxy-nftables",
        short: None,
        opt: Opt::KeepKubeProxyNftables,
        takes_value: false,
        help: "Leave kube-proxy's own nftables tables (ip/ip6 kube-proxy) in place at start and in cleanup",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "service-counters",
        short: None,
        opt: Opt::ServiceCounters,
        takes_value: false,
        help: "Count in the kernel the node's connections sent to endpoints, and each rejected or dropped connection once, by reason (verdict_connections_total, verdict_rejected_total, verdict_dropped_total), and per Service what --service-metrics chooses; --service-counters=false leaves kube-proxy's rules exactly, counting nothing (the flow stream then records forwarded connections only, unless --flows is given)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "flows",
        short: None,
        opt: Opt::Flows,
        takes_value: false,
        help: "The flow stream: record every connection through the node's Services (from conntrack's events) and every one the rules reject or drop (logged once per connection to nfnetlink_log group 7331), with its Service, endpoint, pod and reason, for verdict flows, /api/v1/flows and the web view; on by default, following forwarded connections only while flows are read and 10 minutes after (while it follows them the kernel builds a report in each new connection's path: +0.13x on connect time here, docs/flows.md); --flows follows them from start, --flows=false turns the stream off (a stream that cannot start, its log group held by another program, is then left off with a warning, where --flows stops verdict)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "flow-log",
        short: None,
        opt: Opt::FlowLog,
        takes_value: true,
        help: "Turn the flow stream on, following connections from start as --flows does, and also write each flow as one JSON line to this file (appended to), or to standard output with -, for a log shipper",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "flow-log-max-size",
        short: None,
        opt: Opt::FlowLogMaxSize,
        takes_value: true,
        help: "The size in MiB at which the --flow-log file is rotated (FILE becomes FILE.1, FILE.1 FILE.2, …): the log never holds more than (--flow-log-max-backups + 1) times this (default 10)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "flow-log-max-backups",
        short: None,
        opt: Opt::FlowLogMaxBackups,
        takes_value: true,
        help: "Rotated --flow-log files kept; 0 starts the file over at the cap (default 5)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "flow-log-rate",
        short: None,
        opt: Opt::FlowLogRate,
        takes_value: true,
        help: "Flows a second the --flow-log writes one line each; past it, one aggregated line per client, Service, endpoint and outcome every 15 s, with their counts (default 200)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "service-metrics",
        short: None,
        opt: Opt::ServiceMetrics,
        takes_value: true,
        help: "Series of their own for the Services chosen by --service-metrics-namespaces and --service-metrics-selector (every Service if neither is given): service (connections, packets and bytes per entry point, rejects and drops) or endpoint (also per endpoint); none (the default) keeps /metrics to the node's totals, whatever the number of Services",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "service-metrics-namespaces",
        short: None,
        opt: Opt::ServiceMetricsNamespaces,
        takes_value: true,
        help: "With --service-metrics, only the Services of these namespaces (comma-separated)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "service-metrics-selector",
        short: None,
        opt: Opt::ServiceMetricsSelector,
        takes_value: true,
        help: "With --service-metrics, only the Services whose labels match this label selector (as kubectl -l takes it: app=web,tier in (front,back),!canary)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "api-bind-address",
        short: None,
        opt: Opt::ApiBindAddress,
        takes_value: true,
        help: "Serve the introspection API and the web view on this IP:PORT to other hosts too, each request with a Kubernetes bearer token that the API server authenticates (TokenReview) and RBAC lets get `nodes/verdict` of this node (SubjectAccessReview); without it they answer only loopback clients, on the metrics address",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "hubble-listen-address",
        short: None,
        opt: Opt::HubbleListenAddress,
        takes_value: true,
        help: "Serve Hubble's observer API (gRPC: hubble observe, hubble status) with the flow stream's flows on this IP:PORT; empty turns it off. Off loopback it needs TLS with client certificates (--hubble-tls-cert-file, --hubble-tls-key-file, --hubble-tls-client-ca-files) (default 127.0.0.1:4244)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "hubble-tls-cert-file",
        short: None,
        opt: Opt::HubbleTlsCertFile,
        takes_value: true,
        help: "The certificate (PEM) Hubble's API presents in TLS; with --hubble-tls-key-file and --hubble-tls-client-ca-files",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "hubble-tls-key-file",
        short: None,
        opt: Opt::HubbleTlsKeyFile,
        takes_value: true,
        help: "The private key (PEM) of --hubble-tls-cert-file",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "hubble-tls-client-ca-files",
        short: None,
        opt: Opt::HubbleTlsClientCaFiles,
        takes_value: true,
        help: "Comma-separated CA files (PEM) that a Hubble client's certificate must chain to: with TLS every client shows one, as Hubble Relay does",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "cluster-name",
        short: None,
        opt: Opt::ClusterName,
        takes_value: true,
        help: "The cluster's name, as Cilium's and Hubble Relay's --cluster-name: Hubble's peer service tells Relay each node's TLS name as NODE.CLUSTER.hubble-grpc.cilium.io (default default)",
        kube_proxy: false,
        commands: &[],
    },
    OptSpec {
        name: "nftables-backend",
        short: None,
        opt: Opt::NftablesBackend,
        takes_value: true,
        help: "How verdict programs nftables: netlink (the default: nf_tables messages on a netlink socket, no program needed) or nft (runs the nft program for every transaction and read-back)",
        kube_proxy: false,
        commands: &[],
    },
    inspect(
        "server",
        None,
        ASKING,
        "trace, explain, services, syncs, connections, doctor: the daemon's metrics address (default: this node's --metrics-bind-address, on loopback)",
    ),
    inspect(
        "output",
        Some('o'),
        ASKING,
        "trace, explain, services, syncs, connections, flows, doctor: text (the default), wide (flows: also the entry, the pod, packets and bytes), json or yaml (the API's answer as it is)",
    ),
    inspect(
        "from",
        None,
        &[Command::Trace],
        "trace: where the packet comes from: pod, node or external",
    ),
    OptSpec {
        name: "live",
        short: None,
        opt: Opt::Inspect,
        takes_value: false,
        help: "trace --from node: also send one real packet with nftrace on and set the kernel's own trace beside verdict's",
        kube_proxy: false,
        commands: &[Command::Trace],
    },
    OptSpec {
        name: "full",
        short: None,
        opt: Opt::Inspect,
        takes_value: false,
        help: "explain: read the whole table, not only the Service's own elements, to also find elements that name the Service but that verdict does not want (seconds at 30,000 Services)",
        kube_proxy: false,
        commands: &[Command::Explain],
    },
    inspect("src", None, &[Command::Trace], "trace: the source address"),
    inspect("sport", None, &[Command::Trace], "trace: the source port"),
    inspect(
        "dst",
        None,
        &[Command::Trace],
        "trace: the destination address",
    ),
    inspect("proto", None, &[Command::Trace], "trace: tcp, udp or sctp"),
    inspect(
        "dport",
        None,
        &[Command::Trace],
        "trace: the destination port",
    ),
    OptSpec {
        name: "follow",
        short: Some('f'),
        opt: Opt::Inspect,
        takes_value: false,
        help: "flows: keep printing flows as they arrive",
        kube_proxy: false,
        commands: &[Command::Flows],
    },
    OptSpec {
        name: "aggregated",
        short: Some('a'),
        opt: Opt::Inspect,
        takes_value: false,
        help: "flows: the flows of the last hour, in 15 s buckets without the clients' ports, summed over --since (default: the hour), the most connections first",
        kube_proxy: false,
        commands: &[Command::Flows],
    },
    inspect(
        "service",
        None,
        &[Command::Flows],
        "flows: only this Service's (NAMESPACE/NAME)",
    ),
    inspect(
        "namespace",
        None,
        &[Command::Flows],
        "flows: only the Services of this namespace",
    ),
    inspect(
        "ip",
        None,
        &[Command::Flows],
        "flows: only flows with this address as client, destination or endpoint",
    ),
    inspect(
        "verdict",
        None,
        &[Command::Flows],
        "flows: only forwarded, rejected or dropped flows",
    ),
    inspect(
        "since",
        None,
        &[Command::Flows],
        "flows: only flows seen in this last while (30s, 5m, 1h)",
    ),
    OptSpec {
        name: "problems",
        short: None,
        opt: Opt::Inspect,
        takes_value: false,
        help: "services: only the Services with connections rejected or dropped (counted once each) or a quarantined port, the most refused first",
        kube_proxy: false,
        commands: &[Command::Services],
    },
    inspect(
        "search",
        None,
        &[Command::Services],
        "services: only Services whose namespace/name contains this",
    ),
    inspect(
        "limit",
        None,
        &[Command::Services, Command::Flows],
        "services, flows: how many to list (services: default 100, at most 1000; flows: default 200, at most 5000)",
    ),
    inspect(
        "offset",
        None,
        &[Command::Services],
        "services: how many Services to skip",
    ),
];

/// A flag of the introspection commands (verdict's own; takes a value).
const fn inspect(
    name: &'static str,
    short: Option<char>,
    commands: &'static [Command],
    help: &'static str,
) -> OptSpec {
    OptSpec {
        name,
        short,
        opt: Opt::Inspect,
        takes_value: true,
        help,
        kube_proxy: false,
        commands,
    }
}

/// What a flag name stands for.
enum Target {
    Opt(&'static OptSpec),
    Setting(&'static Setting, &'static str),
}

impl Target {
    fn takes_value(&self) -> bool {
        match self {
            Target::Opt(o) => o.takes_value,
            Target::Setting(s, _) => s.kind != Kind::Bool,
        }
    }
}

fn lookup(name: &str) -> Option<Target> {
    if let Some(o) = OPTIONS.iter().find(|o| o.name == name) {
        return Some(Target::Opt(o));
    }
    SETTINGS.iter().find_map(|s| {
        s.flags
            .iter()
            .find(|f| **f == name)
            .map(|f| Target::Setting(s, f))
    })
}

fn lookup_short(c: char) -> Option<Target> {
    match c {
        'v' => lookup("v"),
        _ => OPTIONS.iter().find(|o| o.short == Some(c)).map(Target::Opt),
    }
}

/// Parses the arguments (without the program name).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Cli, UsageError> {
    let args: Vec<String> = args.into_iter().collect();
    let mut cli = Cli {
        command: Command::Run,
        config: None,
        write_config_to: None,
        init_only: false,
        master: None,
        healthz_port: None,
        metrics_port: None,
        manifests: None,
        keep_kube_proxy_nftables: false,
        watch_pods: false,
        service_counters: true,
        flows: true,
        flows_required: false,
        flow_log: None,
        flow_log_limits: verdict_node::flows::FlowLogLimits::default(),
        flow_log_limits_given: false,
        api_bind_address: None,
        hubble_listen_address: Some(std::net::SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            4244,
        ))),
        hubble_tls: HubbleTlsFlags::default(),
        cluster_name: "default".to_owned(),
        service_metrics: verdict_model::MetricsSelection::default(),
        nftables_backend: crate::config::NftablesBackend::default(),
        help: false,
        version: None,
        flags: Vec::new(),
        given: Vec::new(),
        inert: Vec::new(),
        force: false,
        inspect: Vec::new(),
        target: None,
    };
    let mut cleanup = false;
    let mut positional: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        let (target, spelled, inline) = if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (long, None),
            };
            // pflag's word-separator normalisation: `_` is `-`.
            let name = name.replace('_', "-");
            let target =
                lookup(&name).ok_or_else(|| UsageError(format!("unknown flag: --{name}")))?;
            (target, format!("--{name}"), inline)
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let c = chars.next().unwrap_or_default();
            let rest = chars.as_str();
            let target = lookup_short(c)
                .ok_or_else(|| UsageError(format!("unknown shorthand flag: {c:?} in -{short}")))?;
            let inline = match rest.strip_prefix('=') {
                Some(v) => Some(v.to_owned()),
                None if rest.is_empty() => None,
                None if target.takes_value() => Some(rest.to_owned()),
                None => {
                    return Err(UsageError(format!(
                        "unknown shorthand flag: {:?} in -{short}",
                        rest.chars().next().unwrap_or_default()
                    )));
                }
            };
            (target, format!("-{c}"), inline)
        } else {
            positional.push(arg.clone());
            continue;
        };
        let value = match (inline, target.takes_value()) {
            (Some(v), _) => v,
            (None, true) => {
                let v = args
                    .get(i)
                    .cloned()
                    .ok_or_else(|| UsageError(format!("flag needs an argument: {spelled}")))?;
                i += 1;
                v
            }
            (None, false) => "true".to_owned(),
        };
        let boolean = |v: &str| {
            crate::config::value::parse_bool(v).ok_or_else(|| {
                UsageError(format!(
                    "invalid argument {v:?} for {spelled}: must be true or false"
                ))
            })
        };
        match target {
            Target::Setting(setting, name) => {
                cli.given.push((name.to_owned(), value.clone()));
                cli.flags.push(GivenFlag {
                    setting,
                    name,
                    value,
                });
            }
            Target::Opt(o) => {
                cli.given.push((o.name.to_owned(), value.clone()));
                match o.opt {
                    Opt::Config => cli.config = Some(value),
                    Opt::WriteConfigTo => cli.write_config_to = Some(value),
                    Opt::Cleanup => cleanup = boolean(&value)?,
                    Opt::InitOnly => cli.init_only = boolean(&value)?,
                    Opt::Master => cli.master = Some(value),
                    Opt::HealthzPort => cli.healthz_port = Some(value),
                    Opt::MetricsPort => cli.metrics_port = Some(value),
                    Opt::Inert => cli.inert.push(o.name),
                    Opt::Force => cli.force = boolean(&value)?,
                    Opt::Help => cli.help = boolean(&value)?,
                    Opt::Version => {
                        cli.version = match value.as_str() {
                            "raw" => Some(Version::Raw),
                            v => boolean(v)?.then_some(Version::Plain),
                        }
                    }
                    Opt::Manifests => cli.manifests = Some(value),
                    Opt::KeepKubeProxyNftables => cli.keep_kube_proxy_nftables = boolean(&value)?,
                    Opt::WatchPods => cli.watch_pods = boolean(&value)?,
                    Opt::ServiceCounters => cli.service_counters = boolean(&value)?,
                    Opt::Flows => {
                        cli.flows = boolean(&value)?;
                        cli.flows_required = cli.flows;
                    }
                    Opt::FlowLog => {
                        if value.is_empty() {
                            return Err(UsageError(
                                "--flow-log: give a file, or - for standard output".into(),
                            ));
                        }
                        cli.flow_log = Some(value);
                        cli.flows = true;
                        cli.flows_required = true;
                    }
                    Opt::FlowLogMaxSize => {
                        let mib: u64 = value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                            UsageError(format!(
                                "--flow-log-max-size {value:?}: give a whole number of MiB, at least 1"
                            ))
                        })?;
                        cli.flow_log_limits.max_size = mib.saturating_mul(1024 * 1024);
                        cli.flow_log_limits_given = true;
                    }
                    Opt::FlowLogMaxBackups => {
                        cli.flow_log_limits.max_backups = value.parse().map_err(|_| {
                            UsageError(format!(
                                "--flow-log-max-backups {value:?}: give a whole number (0 keeps none)"
                            ))
                        })?;
                        cli.flow_log_limits_given = true;
                    }
                    Opt::FlowLogRate => {
                        cli.flow_log_limits.rate = value.parse().map_err(|_| {
                            UsageError(format!(
                                "--flow-log-rate {value:?}: give a whole number of flows a second"
                            ))
                        })?;
                        cli.flow_log_limits_given = true;
                    }
                    Opt::ServiceMetrics => {
                        cli.service_metrics.level = value
                            .parse()
                            .map_err(|e| UsageError(format!("--service-metrics {e}")))?
                    }
                    Opt::ServiceMetricsNamespaces => {
                        cli.service_metrics.namespaces = value
                            .split(',')
                            .map(str::trim)
                            .filter(|n| !n.is_empty())
                            .map(str::to_owned)
                            .collect()
                    }
                    Opt::ServiceMetricsSelector => {
                        cli.service_metrics.selector = value.parse().map_err(|e| {
                            UsageError(format!("--service-metrics-selector {e}"))
                        })?
                    }
                    Opt::ApiBindAddress => {
                        cli.api_bind_address = Some(value.parse().map_err(|_| {
                            UsageError(format!(
                                "--api-bind-address {value:?}: give an IP:PORT (0.0.0.0:10259, [::]:10259)"
                            ))
                        })?)
                    }
                    Opt::HubbleListenAddress => {
                        cli.hubble_listen_address = hubble_address(&value)?
                    }
                    Opt::HubbleTlsCertFile => cli.hubble_tls.cert = Some(value.into()),
                    Opt::HubbleTlsKeyFile => cli.hubble_tls.key = Some(value.into()),
                    Opt::HubbleTlsClientCaFiles => {
                        cli.hubble_tls.client_cas = value
                            .split(',')
                            .map(str::trim)
                            .filter(|f| !f.is_empty())
                            .map(std::path::PathBuf::from)
                            .collect()
                    }
                    Opt::ClusterName => cli.cluster_name = cluster_name(&value)?,
                    Opt::NftablesBackend => {
                        cli.nftables_backend = value.parse().map_err(UsageError)?
                    }
                    Opt::Inspect => cli.inspect.push((o.name, value)),
                }
            }
        }
    }
    check_hubble(&cli)?;
    if cli.watch_pods && cli.manifests.is_some() {
        return Err(UsageError(
            "--watch-pods watches the API server's Pods: --manifests has none (flows there are named by the EndpointSlices)".into(),
        ));
    }
    if cli.flow_log_limits_given && cli.flow_log.is_none() {
        return Err(UsageError(
            "--flow-log-max-size, --flow-log-max-backups and --flow-log-rate bound the --flow-log: give it too".into(),
        ));
    }
    if !cli.flows && cli.flow_log.is_some() {
        return Err(UsageError(
            "--flow-log writes the flow stream, which --flows=false turns off: give one or the other".into(),
        ));
    }
    let m = &cli.service_metrics;
    if m.level == verdict_model::Counting::None
        && (!m.namespaces.is_empty() || !m.selector.is_empty())
    {
        return Err(UsageError(
            "--service-metrics-namespaces and --service-metrics-selector choose Services for --service-metrics service|endpoint, which is not given".into(),
        ));
    }
    if let [cmd, target] = positional.as_slice()
        && (cmd == "explain" || cmd == "connections" || cmd == "flows" || cmd == "help")
    {
        cli.target = Some(target.clone());
        positional.truncate(1);
    }
    let subcommand = match positional.as_slice() {
        [] => None,
        [one] => Some(match one.as_str() {
            // `verdict help CMD` is `verdict CMD --help`.
            "help" => {
                cli.help = true;
                match cli.target.take() {
                    None => Command::Run,
                    Some(cmd) => command_named(&cmd).ok_or_else(|| {
                        UsageError(format!("verdict help {cmd:?}: no such command"))
                    })?,
                }
            }
            other => command_named(other)
                .ok_or_else(|| UsageError(format!("unknown command {other:?}")))?,
        }),
        more => {
            return Err(UsageError(format!(
                "verdict takes one command, not {}",
                more.join(" ")
            )));
        }
    };
    cli.command = subcommand.unwrap_or(Command::Run);
    if cli.help {
        return Ok(cli);
    }
    if cli.command == Command::Explain && cli.target.is_none() {
        return Err(UsageError(
            "verdict explain needs a Service: verdict explain NAMESPACE/NAME".into(),
        ));
    }
    for (flag, _) in &cli.inspect {
        let owners = OPTIONS
            .iter()
            .find(|o| o.name == *flag)
            .map_or(&[][..], |o| o.commands);
        if !owners.contains(&cli.command) {
            let names: Vec<&str> = owners.iter().map(|c| c.name()).collect();
            return Err(UsageError(format!(
                "--{flag} belongs to verdict {}, not verdict {}",
                names.join(", "),
                cli.command.name()
            )));
        }
    }
    // kube-proxy's "do this and exit" flags belong to `run`.
    if !matches!(subcommand, None | Some(Command::Run)) {
        for (set, flag) in [
            (cleanup && subcommand != Some(Command::Cleanup), "--cleanup"),
            (cli.init_only, "--init-only"),
            (cli.write_config_to.is_some(), "--write-config-to"),
        ] {
            if set {
                return Err(UsageError(format!(
                    "{flag} cannot be used with `verdict {}`",
                    positional[0]
                )));
            }
        }
    }
    if cleanup {
        cli.command = Command::Cleanup;
    }
    Ok(cli)
}

/// The names of kube-proxy's own flags (not verdict's additions), as
/// `--help` lists them.
#[cfg(test)]
pub fn kube_proxy_flags() -> Vec<&'static str> {
    OPTIONS
        .iter()
        .filter(|o| o.kube_proxy)
        .map(|o| o.name)
        .chain(SETTINGS.iter().filter_map(|s| s.flags.first().copied()))
        .collect()
}

fn default_text(s: &Setting) -> Option<String> {
    let l = match s.default {
        Default::WhenZero(l) | Default::WhenNull(l) => l,
        Default::Computed if s.path == "healthzBindAddress" => Literal::Str("0.0.0.0:10256"),
        Default::Computed if s.path == "metricsBindAddress" => Literal::Str("127.0.0.1:10249"),
        _ => return None,
    };
    Some(l.text())
}

/// What `verdict CMD --help` (and `verdict help CMD`) says of a command
/// other than `run`: a summary, the usage line, more, and its own flags.
struct CommandHelp {
    command: Command,
    summary: &'static str,
    usage: &'static str,
    more: &'static str,
}

const SOURCE_NOTE: &str =
    "Asks the running verdict at --server (default: this node's --metrics-bind-address, on
loopback), or, with --manifests, builds the node in memory from the files, offline.";

const COMMAND_HELP: &[CommandHelp] = &[
    CommandHelp {
        command: Command::Plan,
        summary: "print the nftables script verdict run would program, and change nothing",
        usage: "verdict plan [flags of verdict run]",
        more: "Takes every flag of verdict run (verdict --help) and reads the same source: the
API server, or --manifests. Without the privilege to dry-run the ruleset, the
script assumes every kernel feature works.",
    },
    CommandHelp {
        command: Command::Cleanup,
        summary: "remove verdict's tables and kube-proxy's iptables, IPVS and nftables state, and exit",
        usage: "verdict cleanup [--keep-kube-proxy-nftables] [flags of verdict run]",
        more: "The same as verdict --cleanup. Takes every flag of verdict run (verdict --help).",
    },
    CommandHelp {
        command: Command::Version,
        summary: "print the version",
        usage: "verdict version",
        more: "verdict --version=raw prints every build detail.",
    },
    CommandHelp {
        command: Command::Trace,
        summary: "walk a new connection's first packet through the kernel's table: every path it can take, its odds, the Service and endpoint each element belongs to, and why it ended as it did",
        usage: "verdict trace --from pod|node|external --src IP [--sport N] --dst IP --proto tcp|udp|sctp --dport N [--live] [-o json]",
        more: SOURCE_NOTE,
    },
    CommandHelp {
        command: Command::Explain,
        summary: "everything about one Service: its entry points, endpoints and their categories, the kernel's elements, and drift",
        usage: "verdict explain NAMESPACE/NAME [--full] [-o json]",
        more: SOURCE_NOTE,
    },
    CommandHelp {
        command: Command::Services,
        summary: "the Services verdict proxies, with their endpoints",
        usage: "verdict services [--problems] [--search TEXT] [--limit N] [--offset N] [-o json]",
        more: SOURCE_NOTE,
    },
    CommandHelp {
        command: Command::Syncs,
        summary: "the last syncs and the last foreign changes to verdict's tables",
        usage: "verdict syncs [-o json]",
        more: SOURCE_NOTE,
    },
    CommandHelp {
        command: Command::Connections,
        summary: "the kernel's connections by Service and endpoint, stale ones flagged",
        usage: "verdict connections [NAMESPACE/NAME] [-o json]",
        more:
            "Asks the running verdict at --server (default: this node's --metrics-bind-address, on
loopback); offline there is no conntrack table to read.",
    },
    CommandHelp {
        command: Command::Flows,
        summary: "the flow stream: recent connections through the Services, where each went or why it was refused",
        usage: "verdict flows [NAMESPACE/NAME] [--follow | --aggregated] [--service NS/NAME] [--namespace NS] [--ip IP] [--verdict forwarded|rejected|dropped] [--since DURATION] [--limit N] [-o wide|json|yaml]",
        more: "Asks the running verdict at --server, whose flow stream is on (the default). --follow keeps
printing flows as they arrive (with -o json, one object per line).",
    },
    CommandHelp {
        command: Command::Doctor,
        summary: "check this node for what breaks Services: kernel, capabilities, conflicting rules, kube-proxy's leftovers, sysctls, conntrack, the API server and RBAC, drift",
        usage: "verdict doctor [-o json] [--server HOST:PORT] [flags of verdict run]",
        more: "Exits 1 when any check fails. Takes every flag of verdict run (verdict --help).",
    },
];

impl OptSpec {
    /// The flag as a help page lists it: `-o, --output string`.
    fn spelled(&self) -> String {
        let name = match self.short {
            Some(c) => format!("-{c}, --{}", self.name),
            None => format!("    --{}", self.name),
        };
        if self.takes_value {
            format!("{name} string")
        } else {
            name
        }
    }
}

/// Flag rows, their names in one column.
fn columns(out: &mut String, rows: Vec<(String, String)>) {
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, help) in rows {
        out.push_str(&format!("  {name:width$}  {help}\n"));
    }
}

/// `verdict CMD --help`: `run`'s is the whole page ([`help`]).
pub fn help_for(command: Command) -> String {
    let Some(h) = COMMAND_HELP.iter().find(|h| h.command == command) else {
        return help();
    };
    let mut out = format!(
        "verdict {}: {}.\n\nUsage:\n  {}\n\n{}\n",
        command.name(),
        h.summary,
        h.usage,
        h.more
    );
    let own: Vec<&OptSpec> = OPTIONS
        .iter()
        .filter(|o| o.commands.contains(&command))
        .chain(
            OPTIONS
                .iter()
                .filter(|o| o.opt == Opt::Manifests && command.inspects() || o.opt == Opt::Help),
        )
        .collect();
    out.push_str("\nFlags:\n");
    let rows: Vec<(String, String)> = own.iter().map(|o| (o.spelled(), o.help.into())).collect();
    columns(&mut out, rows);
    out.push_str(
        "\nExit codes: 0 success; 1 runtime failure, or an unknown Service; 2 invalid flags or values.\n",
    );
    out
}

/// `--help`.
pub fn help() -> String {
    let mut out = String::from(
        "verdict: a Kubernetes Service proxy on nftables, a drop-in replacement for kube-proxy in nftables mode.

Usage:
  verdict [run] [flags]     program this node and keep it programmed (the default)
  verdict plan [flags]      print the nftables script run would program, change nothing
  verdict cleanup [flags]   remove verdict's tables and kube-proxy's leftovers (as --cleanup)
  verdict version           print the version (as --version)

Seeing into verdict (ask the running verdict's metrics address, or with
--manifests build the node in memory, offline; -o json for scripts):
  verdict trace --from pod|node|external --src IP [--sport N] --dst IP --proto tcp|udp|sctp --dport N [--live]
                            walk a new connection's first packet through the kernel's table
                            (--live, from the node: and send one, traced by the kernel)
  verdict explain NAMESPACE/NAME [--full]
                            a Service's entry points, endpoints, kernel elements and drift
                            (--full: read the whole table, to find unwanted elements too)
  verdict services [--problems] [--search TEXT] [--limit N] [--offset N]
                            the Services and their endpoints
  verdict syncs             the last syncs and foreign changes to verdict's tables
  verdict connections [NAMESPACE/NAME]
                            the kernel's connections by Service and endpoint, stale ones flagged
  verdict flows [--follow | --aggregated] [--service NS/NAME] [--ip IP] [--verdict V] [--since 1m]
                            recent connections through the Services (the flow stream), and why some failed
  verdict doctor            check this node: kernel, capabilities, conflicting rules, sysctls,
                            conntrack, API server and RBAC, drift (exit 1 on any failure)

Flags are kube-proxy's, in its grammar (--flag=value or --flag value). Flags
kube-proxy ignores in nftables mode are accepted with a warning. With
--config the file wins over the other configuration flags.

Exit codes: 0 success; 1 runtime failure, or an unknown Service; 2 invalid
flags, values or configuration. verdict help CMD (or verdict CMD --help)
describes one command.
Environment: KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK skips the kernel
version check, as in kube-proxy.

Flags:
",
    );
    let mut lines: Vec<(String, String)> = Vec::new();
    for o in OPTIONS {
        let mark = if o.kube_proxy { "" } else { " [verdict]" };
        lines.push((o.spelled(), format!("{}{mark}", o.help)));
    }
    for s in SETTINGS {
        for (i, flag) in s.flags.iter().enumerate() {
            let kind = match s.kind {
                Kind::Bool => "",
                Kind::Duration | Kind::NanosOrDuration => " duration",
                Kind::Int32 | Kind::Uint32 => " int",
                Kind::Float => " float",
                Kind::List => " strings",
                Kind::Gates => " mapStringBool",
                Kind::VModule => " pattern=N,...",
                Kind::Quantity => " quantity",
                Kind::Str => " string",
            };
            let name = if *flag == "v" {
                format!("-v, --v{kind}")
            } else {
                format!("    --{flag}{kind}")
            };
            let mut help = s.help.to_owned();
            if i > 0 {
                help = format!("Same as --{} [verdict]", s.flags[0]);
            } else if let table::Effect::None(_) | table::Effect::Checked(..) = s.effect {
                help.push_str(" (no effect in verdict)");
            }
            if let Some(d) = default_text(s).filter(|_| i == 0) {
                help.push_str(&format!(" (default {d})"));
            }
            lines.push((name, help));
        }
    }
    columns(&mut out, lines);
    out
}

/// `--hubble-listen-address`: an address, or empty (off).
fn hubble_address(value: &str) -> Result<Option<std::net::SocketAddr>, UsageError> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        UsageError(format!(
            "--hubble-listen-address {value:?}: give an IP:PORT (127.0.0.1:4244), or nothing to turn it off"
        ))
    })
}

/// `--cluster-name`: a DNS label, as it becomes part of TLS names.
fn cluster_name(value: &str) -> Result<String, UsageError> {
    let label = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if label {
        Ok(value.to_owned())
    } else {
        Err(UsageError(format!(
            "--cluster-name {value:?}: give a DNS label (lowercase letters, digits and dashes, at most 63), as it is part of the nodes' TLS names"
        )))
    }
}

/// The Hubble TLS flags as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HubbleTlsFlags {
    /// `--hubble-tls-cert-file`.
    pub cert: Option<std::path::PathBuf>,
    /// `--hubble-tls-key-file`.
    pub key: Option<std::path::PathBuf>,
    /// `--hubble-tls-client-ca-files`.
    pub client_cas: Vec<std::path::PathBuf>,
}

impl HubbleTlsFlags {
    /// The files, when all three are given.
    pub fn files(&self) -> Option<verdict_hubble::tls::TlsFiles> {
        Some(verdict_hubble::tls::TlsFiles {
            cert: self.cert.clone()?,
            key: self.key.clone()?,
            client_cas: (!self.client_cas.is_empty()).then(|| self.client_cas.clone())?,
        })
    }
}

/// Hubble's API reveals every flow: off loopback it is served only in
/// TLS with client certificates, and the TLS flags come together.
fn check_hubble(cli: &Cli) -> Result<(), UsageError> {
    let t = &cli.hubble_tls;
    let given = t.cert.is_some() || t.key.is_some() || !t.client_cas.is_empty();
    if given && t.files().is_none() {
        return Err(UsageError(
            "--hubble-tls-cert-file, --hubble-tls-key-file and --hubble-tls-client-ca-files go together: every Hubble client shows a certificate".into(),
        ));
    }
    match cli.hubble_listen_address {
        Some(a) if !a.ip().is_loopback() && !given => Err(UsageError(format!(
            "--hubble-listen-address {a}: off loopback, Hubble's API reveals every flow: give --hubble-tls-cert-file, --hubble-tls-key-file and --hubble-tls-client-ca-files, or a loopback address"
        ))),
        None if given => Err(UsageError(
            "the --hubble-tls-* flags are for --hubble-listen-address, which is empty".into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Cli, UsageError> {
        parse(args.iter().map(|s| s.to_string()))
    }

    fn values(cli: &Cli, path: &str) -> Vec<String> {
        cli.flags
            .iter()
            .filter(|f| f.setting.path == path)
            .map(|f| f.value.clone())
            .collect()
    }

    #[test]
    fn the_flow_stream_is_on_by_default_and_required_only_when_asked_for() {
        let default = parse_str(&[]).unwrap();
        assert!(default.flows && !default.flows_required);
        let off = parse_str(&["--flows=false"]).unwrap();
        assert!(!off.flows && !off.flows_required);
        let asked = parse_str(&["--flows"]).unwrap();
        assert!(asked.flows && asked.flows_required);
        let logged = parse_str(&["--flow-log", "-"]).unwrap();
        assert!(logged.flows && logged.flows_required);
        let both = parse_str(&["--flow-log", "/var/log/flows.jsonl", "--flows=false"]);
        assert!(
            both.is_err_and(|e| e.0.contains("--flows=false")),
            "a flow log of a stream turned off"
        );
    }

    #[test]
    fn pods_are_watched_only_when_asked_and_only_from_an_api_server() {
        assert!(!parse_str(&[]).unwrap().watch_pods);
        assert!(parse_str(&["--watch-pods"]).unwrap().watch_pods);
        let e = parse_str(&["--watch-pods", "--manifests", "/tmp/x"]);
        assert!(e.is_err_and(|e| e.0.contains("--manifests has none")));
    }

    #[test]
    fn the_cluster_name_is_a_dns_label() {
        assert_eq!(parse_str(&[]).unwrap().cluster_name, "default");
        let named = parse_str(&["--cluster-name", "prod-eu-1"]).unwrap();
        assert_eq!(named.cluster_name, "prod-eu-1");
        for bad in ["", "Prod", "a.b", "-a", "a-", &"x".repeat(64)] {
            let e = parse_str(&["--cluster-name", bad]);
            assert!(e.is_err_and(|e| e.0.contains("DNS label")), "{bad:?}");
        }
        assert!(parse_str(&["--cluster-name", &"x".repeat(63)]).is_ok());
    }

    #[test]
    fn hubbles_api_is_on_loopback_by_default_and_refused_off_it() {
        let default = parse_str(&[]).unwrap();
        assert_eq!(
            default.hubble_listen_address,
            Some("127.0.0.1:4244".parse().unwrap())
        );
        let off = parse_str(&["--hubble-listen-address="]).unwrap();
        assert_eq!(off.hubble_listen_address, None);
        let v6 = parse_str(&["--hubble-listen-address", "[::1]:4245"]).unwrap();
        assert_eq!(
            v6.hubble_listen_address,
            Some("[::1]:4245".parse().unwrap())
        );
        let open = parse_str(&["--hubble-listen-address", "0.0.0.0:4244"]);
        assert!(
            open.is_err_and(|e| e.0.contains("--hubble-tls-cert-file")),
            "off loopback"
        );
        let tls = [
            "--hubble-listen-address",
            "0.0.0.0:4244",
            "--hubble-tls-cert-file",
            "/etc/hubble/tls.crt",
            "--hubble-tls-key-file",
            "/etc/hubble/tls.key",
            "--hubble-tls-client-ca-files",
            "/etc/hubble/ca.crt, /etc/hubble/ca2.crt",
        ];
        let with = parse_str(&tls).unwrap();
        let files = with.hubble_tls.files().unwrap();
        assert_eq!(files.client_cas.len(), 2);
        let half = parse_str(&tls[..6]);
        assert!(half.is_err_and(|e| e.0.contains("go together")));
        let mut off = tls.to_vec();
        off[1] = "";
        assert!(parse_str(&off).is_err_and(|e| e.0.contains("empty")));
        let junk = parse_str(&["--hubble-listen-address", ":4244"]);
        assert!(junk.is_err_and(|e| e.0.contains("give an IP:PORT")));
    }

    #[test]
    fn pflag_grammar() {
        let cli = parse_str(&[
            "--masquerade-all=true",
            "--hostname_override",
            "node-a",
            "--cluster-cidr=10.0.0.0/8",
            "--cluster-cidr",
            "10.1.0.0/16",
            "-v=2",
            "--conntrack-tcp-be-liberal",
            "--profiling=false",
        ])
        .unwrap();
        assert_eq!(values(&cli, "nftables.masqueradeAll"), ["true"]);
        assert_eq!(values(&cli, "hostnameOverride"), ["node-a"]);
        assert_eq!(
            values(&cli, "clusterCIDR"),
            ["10.0.0.0/8", "10.1.0.0/16"],
            "both kept: the last wins when applied"
        );
        assert_eq!(values(&cli, "logging.verbosity"), ["2"]);
        assert_eq!(values(&cli, "conntrack.tcpBeLiberal"), ["true"]);
        assert_eq!(values(&cli, "enableProfiling"), ["false"]);
        for v in [["-v4"].as_slice(), &["-v", "4"], &["--v=4"], &["--v", "4"]] {
            assert_eq!(values(&parse_str(v).unwrap(), "logging.verbosity"), ["4"]);
        }
    }

    #[test]
    fn commands_and_exits() {
        assert_eq!(parse_str(&[]).unwrap().command, Command::Run);
        assert_eq!(parse_str(&["plan"]).unwrap().command, Command::Plan);
        assert_eq!(parse_str(&["--cleanup"]).unwrap().command, Command::Cleanup);
        assert_eq!(
            parse_str(&["run", "--cleanup=true"]).unwrap().command,
            Command::Cleanup
        );
        assert_eq!(
            parse_str(&["plan", "--version"]).unwrap().version,
            Some(Version::Plain)
        );
        assert_eq!(
            parse_str(&["--version=raw"]).unwrap().version,
            Some(Version::Raw)
        );
        assert_eq!(parse_str(&["--version=false"]).unwrap().version, None);
        assert!(parse_str(&["plan", "-h"]).unwrap().help);
        let e = parse_str(&["plan", "--cleanup"]).unwrap_err();
        assert!(e.0.contains("--cleanup cannot be used"), "{e}");
        assert!(parse_str(&["plan", "--init-only"]).is_err());
        assert!(parse_str(&["frobnicate"]).is_err());
        assert!(parse_str(&["plan", "run"]).is_err());
        let e = parse_str(&["--no-such-flag"]).unwrap_err();
        assert_eq!(e.0, "unknown flag: --no-such-flag");
        let e = parse_str(&["--config"]).unwrap_err();
        assert_eq!(e.0, "flag needs an argument: --config");
        assert!(
            parse_str(&["--masquerade-all=perhaps"]).is_ok(),
            "checked when applied"
        );
        assert!(parse_str(&["--cleanup=perhaps"]).is_err());
        let cli = parse_str(&["--", "plan"]).unwrap();
        assert_eq!(cli.command, Command::Plan);
    }

    #[test]
    fn help_lists_every_flag_with_its_default() {
        let h = help();
        for s in SETTINGS {
            for f in s.flags {
                assert!(h.contains(&format!("--{f}")), "--{f}");
            }
        }
        assert!(h.contains("(default 0.0.0.0:10256)"), "{h}");
        assert!(h.contains("(default 30s)"), "{h}");
        assert!(h.contains("--manifests string"));
    }
}
