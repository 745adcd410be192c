//! verdict: a Kubernetes Service proxy on nftables, a drop-in replacement
//! for kube-proxy in `nftables` mode.
//!
//! `verdict [run]` programs the node; `verdict plan` prints what it would
//! program; `verdict cleanup` removes verdict's tables and kube-proxy's
//! state; `verdict version`. Flags and the configuration file are
//! kube-proxy's. Exit codes: 0 success, 1 runtime failure, 2 invalid flags
//! or configuration.

mod cli;
mod client;
mod config;
mod daemon;
mod doctor;
mod endpoints;
mod logging;
mod out;
mod version;

use std::process::ExitCode;

/// mimalloc (see `verdict_node::memory`).
#[global_allocator]
static ALLOCATOR: verdict_node::memory::Allocator = verdict_node::memory::Allocator;

/// Tunes the allocator when the process loads: mimalloc reserves its first
/// arena at the first allocation, which the Rust runtime makes before
/// `main`, and how an arena is committed is fixed when it is reserved. An
/// `.init_array` entry with a priority runs before the runtime and before
/// the entries without one; it is the only way to run first. The function
/// allocates nothing and takes no argument.
#[used]
#[allow(unsafe_code)]
#[unsafe(link_section = ".init_array.00100")]
static TUNE_ALLOCATOR: extern "C" fn() = verdict_node::memory::tune_allocator;

use crate::cli::{Command, Version};

/// Exit code for invalid flags or configuration (runtime failures use 1).
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    // Made when the process loaded (`TUNE_ALLOCATOR`).
    let allocator = verdict_node::memory::tuning();
    let cli = match cli::parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("verdict: {e}\nRun 'verdict --help' for usage.");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if cli.help {
        let _ = out::print(&cli::help_for(cli.command));
        return ExitCode::SUCCESS;
    }
    // What an introspection command asks is checked before anything runs.
    let query = if cli.command.inspects() {
        match client::query(&cli) {
            Ok(q) => Some(q),
            Err(e) => {
                eprintln!(
                    "verdict: {e}\nRun 'verdict help {}' for usage.",
                    cli.command.name()
                );
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    } else {
        None
    };
    let b = version::BUILD;
    match cli.version {
        Some(Version::Raw) => {
            let _ = out::print(&b.raw());
            return ExitCode::SUCCESS;
        }
        Some(Version::Plain) => {
            let _ = out::println(&b.line());
            return ExitCode::SUCCESS;
        }
        None if cli.command == Command::Version => {
            let _ = out::println(&b.line());
            return ExitCode::SUCCESS;
        }
        None => {}
    }
    let file = match &cli.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) => {
                eprintln!("verdict: invalid configuration: --config {path}: {e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => None,
    };
    let resolved = match config::resolve(&cli.input(file.as_deref())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("verdict: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut settings = resolved.settings;
    settings.service_counters = cli.service_counters;
    settings.flows = cli.flows;
    settings.flows_required = cli.flows_required;
    settings.flow_log = cli.flow_log.clone();
    settings.flow_log_limits = cli.flow_log_limits;
    settings.api_bind_address = cli.api_bind_address;
    settings.hubble_listen_address = cli.hubble_listen_address;
    settings.hubble_tls = cli.hubble_tls.files();
    settings.cluster_name = cli.cluster_name.clone();
    settings.service_metrics = cli.service_metrics.clone();
    settings.nftables_backend = cli.nftables_backend;
    // What the flags alone say, as kube-proxy's /flagz shows them.
    let flags_only = config::resolve(&cli.input(None))
        .ok()
        .map(|r| r.settings.effective);
    settings.flagz = config::render::flagz(flags_only.as_ref(), &cli.given);
    let verbosity = logging::init(&settings.logging);
    // The introspection commands are clients: their output is the answer.
    let daemon_like = !cli.command.inspects();
    if daemon_like {
        tracing::info!(
            version = b.git_version,
            commit = b.git_commit,
            tree = b.git_tree_state,
            built = b.build_date,
            compiler = b.compiler,
            platform = b.platform,
            "Version info"
        );
        tracing::info!(
            configuration = %settings.effective,
            "Using configuration"
        );
        tracing::debug!(
            purge_delay_ms = ?allocator.purge_delay_ms,
            arena_eager_commit = ?allocator.arena_eager_commit,
            "Allocator tuned (none: as the operator set it)"
        );
    }
    for (flag, value) in &cli.given {
        tracing::debug!("FLAG: --{flag}={value:?}");
    }
    for w in resolved.warnings.iter().filter(|_| daemon_like) {
        tracing::warn!("{w}");
    }
    for flag in cli.inert.iter().filter(|_| daemon_like) {
        tracing::info!(
            "--{flag} has no effect (kube-proxy accepts it too, from cAdvisor, and does not use it)"
        );
    }
    if let Some(path) = &cli.write_config_to {
        return match config::render::v1alpha1_yaml(&settings.effective)
            .map_err(|e| e.to_string())
            .and_then(|yaml| std::fs::write(path, yaml).map_err(|e| e.to_string()))
        {
            Ok(()) => {
                tracing::info!(file = %path, "Wrote configuration");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(file = %path, error = %e, "cannot write the configuration");
                ExitCode::FAILURE
            }
        };
    }
    let source = daemon::SourceFlags {
        manifests: cli.manifests.clone(),
        kubeconfig: settings.client.kubeconfig.clone(),
        master: cli.master.clone(),
        keep_kube_proxy_nftables: cli.keep_kube_proxy_nftables,
        watch_pods: cli.watch_pods,
        config_file: cli.config.clone().zip(file),
    };
    let result = match cli.command {
        Command::Run if cli.init_only => daemon::init_only(&settings),
        Command::Run => daemon::run(&settings, &source, &verbosity),
        Command::Plan => daemon::plan(&settings, &source).and_then(|script| out::print(&script)),
        Command::Cleanup => daemon::cleanup(&settings, &source, cli.force),
        Command::Trace
        | Command::Explain
        | Command::Services
        | Command::Syncs
        | Command::Connections
        | Command::Flows => match &query {
            Some(q) => client::run(q, &cli, &settings, &source),
            None => Ok(()),
        },
        Command::Doctor => doctor::run(
            query.as_ref().map_or(client::Output::Text, |q| q.output),
            &cli,
            &settings,
            &source,
        ),
        Command::Version => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): done.
        Err(e) if out::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) if !daemon_like => {
            eprintln!("verdict: {e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "verdict stopped");
            ExitCode::FAILURE
        }
    }
}
