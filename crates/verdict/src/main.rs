//! verdict: a Kubernetes Service proxy on nftables, a drop-in replacement
//! for kube-proxy in `nftables` mode.
//!
//! `verdict [run]` programs the node; `verdict plan` prints what it would
//! program; `verdict cleanup` removes verdict's tables; `verdict version`.
//! Flags use kube-proxy's names. Exit codes: 0 success, 1 runtime failure,
//! 2 invalid flags or configuration.

mod config;
mod daemon;
mod leftovers;
mod probe;
mod schedule;
mod setup;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::Flags;

/// Exit code for invalid flags or configuration (runtime failures use 1).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "verdict",
    version,
    about = "Kubernetes Service proxy on nftables (kube-proxy nftables mode, drop-in)"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Subcommand)]
enum Command {
    /// Program this node and keep it programmed (the default).
    Run,
    /// Print the nftables script `run` would program for the given state, and exit.
    Plan,
    /// Remove verdict's nftables tables, and exit.
    Cleanup,
    /// Print the version.
    Version,
}

/// kube-proxy's flags (also accepted after the subcommand).
#[derive(Args, Clone, Debug, Default)]
struct Opts {
    /// KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1).
    #[arg(long, global = true)]
    config: Option<String>,
    /// Proxy mode; verdict implements `nftables`.
    #[arg(long, global = true)]
    proxy_mode: Option<String>,
    /// Node name, instead of the host name.
    #[arg(long, global = true)]
    hostname_override: Option<String>,
    /// The node's primary address, if not 0.0.0.0.
    #[arg(long, global = true)]
    bind_address: Option<String>,
    /// Pod CIDR(s), one per family, for the ClusterCIDR local-traffic detector.
    #[arg(long, global = true)]
    cluster_cidr: Option<String>,
    /// ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.
    #[arg(long, global = true)]
    detect_local_mode: Option<String>,
    /// Pod bridge, for detect-local-mode BridgeInterface.
    #[arg(long, global = true)]
    pod_bridge_interface: Option<String>,
    /// Pod interface prefix, for detect-local-mode InterfaceNamePrefix.
    #[arg(long, global = true)]
    pod_interface_name_prefix: Option<String>,
    /// Comma-separated CIDRs (or `primary`) of the addresses that accept NodePorts.
    #[arg(long, global = true)]
    nodeport_addresses: Option<String>,
    /// Masquerade all traffic to ClusterIPs.
    #[arg(long, global = true)]
    masquerade_all: bool,
    /// Least time between syncs (e.g. 1s).
    #[arg(long, global = true, alias = "iptables-min-sync-period")]
    min_sync_period: Option<String>,
    /// Retry interval after a failed sync (e.g. 30s).
    #[arg(long, global = true, alias = "iptables-sync-period")]
    sync_period: Option<String>,
    /// Where /healthz and /livez are served (IP:port; empty disables).
    #[arg(long, global = true)]
    healthz_bind_address: Option<String>,
    /// Where /metrics is served (IP:port; empty disables).
    #[arg(long, global = true)]
    metrics_bind_address: Option<String>,
    /// kubeconfig of the Kubernetes API.
    #[arg(long, global = true)]
    kubeconfig: Option<String>,
    /// URL of the Kubernetes API server.
    #[arg(long, global = true)]
    master: Option<String>,
    /// Read Services, EndpointSlices and Nodes from this YAML file or
    /// directory instead of the Kubernetes API, and follow its changes.
    #[arg(long, global = true)]
    manifests: Option<String>,
    /// Remove verdict's state and exit (as `verdict cleanup`).
    #[arg(long, global = true)]
    cleanup: bool,
    /// Apply the privileged settings (conntrack sysctls) and exit.
    #[arg(long, global = true)]
    init_only: bool,
    /// Conntrack entries per CPU (0 leaves nf_conntrack_max alone).
    #[arg(long, global = true)]
    conntrack_max_per_core: Option<String>,
    /// Least nf_conntrack_max.
    #[arg(long, global = true)]
    conntrack_min: Option<String>,
    /// Idle timeout of established TCP connections (0 leaves it alone).
    #[arg(long, global = true)]
    conntrack_tcp_timeout_established: Option<String>,
    /// Timeout of TCP connections in CLOSE_WAIT (0 leaves it alone).
    #[arg(long, global = true)]
    conntrack_tcp_timeout_close_wait: Option<String>,
    /// Set nf_conntrack_tcp_be_liberal.
    #[arg(long, global = true)]
    conntrack_tcp_be_liberal: bool,
    /// Idle timeout of UDP flows (0 leaves it alone).
    #[arg(long, global = true)]
    conntrack_udp_timeout: Option<String>,
    /// Idle timeout of UDP streams (0 leaves it alone).
    #[arg(long, global = true)]
    conntrack_udp_timeout_stream: Option<String>,
    /// oom_score_adj of the process, in [-1000, 1000].
    #[arg(long, global = true, allow_hyphen_values = true)]
    oom_score_adj: Option<String>,
    /// Log verbosity (kube-proxy's -v).
    #[arg(short = 'v', long = "v", global = true)]
    verbosity: Option<u8>,
}

impl Opts {
    fn flags(&self) -> Flags {
        Flags {
            config: self.config.clone(),
            proxy_mode: self.proxy_mode.clone(),
            hostname_override: self.hostname_override.clone(),
            bind_address: self.bind_address.clone(),
            cluster_cidr: self.cluster_cidr.clone(),
            detect_local_mode: self.detect_local_mode.clone(),
            pod_bridge_interface: self.pod_bridge_interface.clone(),
            pod_interface_name_prefix: self.pod_interface_name_prefix.clone(),
            nodeport_addresses: self.nodeport_addresses.clone(),
            masquerade_all: self.masquerade_all.then_some(true),
            min_sync_period: self.min_sync_period.clone(),
            sync_period: self.sync_period.clone(),
            healthz_bind_address: self.healthz_bind_address.clone(),
            metrics_bind_address: self.metrics_bind_address.clone(),
            kubeconfig: self.kubeconfig.clone(),
            verbosity: self.verbosity,
            conntrack_max_per_core: self.conntrack_max_per_core.clone(),
            conntrack_min: self.conntrack_min.clone(),
            conntrack_tcp_timeout_established: self.conntrack_tcp_timeout_established.clone(),
            conntrack_tcp_timeout_close_wait: self.conntrack_tcp_timeout_close_wait.clone(),
            conntrack_tcp_be_liberal: self.conntrack_tcp_be_liberal.then_some(true),
            conntrack_udp_timeout: self.conntrack_udp_timeout.clone(),
            conntrack_udp_timeout_stream: self.conntrack_udp_timeout_stream.clone(),
            oom_score_adj: self.oom_score_adj.clone(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = if cli.opts.cleanup {
        Command::Cleanup
    } else {
        cli.command.unwrap_or(Command::Run)
    };
    if matches!(command, Command::Version) {
        println!("verdict {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let file = match &cli.opts.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) => {
                eprintln!("verdict: invalid configuration: --config {path}: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => None,
    };
    let (settings, warnings) = match config::resolve(file.as_deref(), &cli.opts.flags()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("verdict: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    daemon::init_logging(settings.verbosity);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let source = daemon::Source {
        manifests: cli.opts.manifests.clone(),
        kubeconfig: settings.kubeconfig.clone(),
        master: cli.opts.master.clone(),
    };
    let result = match command {
        Command::Run if cli.opts.init_only => daemon::init_only(&settings),
        Command::Run => daemon::run(&settings, &source),
        Command::Plan => daemon::plan(&settings, &source).map(|script| print!("{script}")),
        Command::Cleanup => daemon::cleanup(),
        Command::Version => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("verdict: {e:#}");
            ExitCode::FAILURE
        }
    }
}
