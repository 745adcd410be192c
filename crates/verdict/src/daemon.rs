//! Wiring: kube-proxy's settings mapped to the node runtime's, the kernel
//! and the source opened, the admin servers started, and the run loop
//! given all of it (`verdict-node` owns the loop itself).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use verdict_admin::Metrics;
use verdict_admin::http::Routes;
use verdict_admin::metrics as m;
use verdict_k8s::client::{ClientOptions, Observer, RequestRecord};
use verdict_k8s::events::{Notice, Regarding};
use verdict_k8s::watch::ApiSource;
use verdict_node::access::{Authorization, Authorizer, Exposure};
use verdict_node::api::{self, Offline};
use verdict_node::{Kernel, KernelAddresses, NodeProxy, NodeSettings, input, once};

use crate::config::Settings;
use crate::logging::Verbosity;

/// Where Services, EndpointSlices and the Node come from: `--manifests`
/// if given, else the Kubernetes API (kubeconfig, `--master`, or the
/// in-cluster service account); and what else `run` needs from the
/// command line.
pub struct SourceFlags {
    /// `--manifests`: a YAML file or directory, followed for changes.
    pub manifests: Option<String>,
    /// `--kubeconfig` / `clientConnection.kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `--master`.
    pub master: Option<String>,
    /// `--keep-kube-proxy-nftables`.
    pub keep_kube_proxy_nftables: bool,
    /// `--watch-pods`.
    pub watch_pods: bool,
    /// `--config`'s path and the text read at start: as kube-proxy, verdict
    /// exits when the file changes, so that its pod restarts with it.
    pub config_file: Option<(String, String)>,
}

impl SourceFlags {
    /// The Kubernetes API connection for `node_name`.
    fn api(&self, node_name: &str, client: ClientOptions) -> ApiSource {
        ApiSource {
            kubeconfig: self.kubeconfig.as_ref().map(PathBuf::from),
            master: self.master.clone(),
            node_name: node_name.to_string(),
            client,
            watch_pods: self.watch_pods,
        }
    }

    /// The node runtime's source.
    fn node(&self, node_name: &str, client: ClientOptions) -> verdict_node::Source {
        match &self.manifests {
            Some(p) => verdict_node::Source::Manifests(PathBuf::from(p)),
            None => verdict_node::Source::Api(self.api(node_name, client)),
        }
    }
}

/// The API client's rate limit, and its requests counted in the metrics.
fn client_options(settings: &Settings, metrics: &Arc<Mutex<Metrics>>) -> ClientOptions {
    let x = metrics.clone();
    let observer: Observer = Arc::new(move |r: &RequestRecord| {
        let mut m = x.lock().unwrap_or_else(|e| e.into_inner());
        m.add(m::REST_CLIENT_REQUESTS, &[&r.code, &r.host, &r.method], 1.0);
        m.observe(m::REST_CLIENT_DURATION, &[&r.host, &r.method], r.seconds);
    });
    ClientOptions {
        qps: settings.client.qps,
        burst: settings.client.burst,
        observer: Some(observer),
        user_agent: Some(user_agent()),
    }
}

/// The `User-Agent` of verdict's requests, in client-go's form:
/// `verdict/v0.1.0 (linux/amd64) 292229a`.
pub fn user_agent() -> String {
    let b = crate::version::BUILD;
    let commit = b.git_commit.get(..7).unwrap_or(b.git_commit);
    format!("verdict/{} ({}) {commit}", b.git_version, b.platform)
}

/// The node's name: `hostnameOverride`, else the host name (lower-case).
fn node_name(settings: &Settings) -> String {
    settings.hostname_override.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_lowercase())
            .unwrap_or_default()
    })
}

/// What the node runtime is told.
fn node_settings(settings: &Settings, source: &SourceFlags) -> NodeSettings {
    NodeSettings {
        node_name: node_name(settings),
        bind_address: settings.bind_address,
        masquerade_bit: settings.masquerade_bit,
        masquerade_all: settings.masquerade_all,
        min_sync_period: settings.min_sync_period,
        sync_period: settings.sync_period,
        detect_local: settings.detect_local.clone(),
        node_ports: settings.node_ports.clone(),
        service_counters: settings.service_counters,
        service_metrics: settings.service_metrics.clone(),
        keep_kube_proxy_nftables: source.keep_kube_proxy_nftables,
        flow_log_group: flow_log_group(settings),
    }
}

/// The nfnetlink_log group the rules send rejected and dropped connections
/// to: with the flow stream on, unless `--service-counters=false` asked for
/// kube-proxy's rules exactly and `--flows` was not given (the stream then
/// records forwarded connections only, which need no rule).
fn flow_log_group(settings: &Settings) -> Option<u16> {
    (settings.flows && (settings.service_counters || settings.flows_required))
        .then_some(verdict_node::flows::DEFAULT_GROUP)
}

/// The registry, with the per-family counters visible from the start, the
/// build and the feature gates.
fn kube_proxy_metrics(settings: &Settings) -> Arc<Mutex<Metrics>> {
    let mut x = Metrics::new();
    let labels: Vec<&str> = crate::version::BUILD
        .labels()
        .iter()
        .map(|(_, v)| *v)
        .collect();
    x.set(m::BUILD_INFO, &labels, 1.0);
    for (gate, on) in settings.feature_gates.all() {
        x.set(
            m::FEATURE_ENABLED,
            &[gate.name, gate.stage.label()],
            if on { 1.0 } else { 0.0 },
        );
    }
    for f in ["IPv4", "IPv6"] {
        for name in [
            m::NFTABLES_SYNC_FAILURES,
            m::NFTABLES_CLEANUP_FAILURES,
            m::CONNTRACK_DELETED,
        ] {
            x.touch(name, &[f]);
        }
    }
    Arc::new(Mutex::new(x))
}

/// The API source `run` would use, for `verdict doctor`'s questions.
pub fn api_source(settings: &Settings, source: &SourceFlags, node: &str) -> ApiSource {
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    source.api(node, client_options(settings, &metrics))
}

/// The API server's TokenReviews and SubjectAccessReviews, for the API's
/// requests from other hosts.
struct TokenReviews(verdict_k8s::review::Reviewer);

impl Authorizer for TokenReviews {
    fn authorize(&self, token: &str, path: &str, verb: &str) -> Authorization {
        use verdict_k8s::review::Decision;
        match self.0.review(token, verb) {
            Ok(Decision::Allowed { user }) => {
                tracing::debug!(%user, path, "API request admitted");
                Authorization::Allowed
            }
            Ok(Decision::Unauthenticated(why)) => Authorization::Unauthenticated(why),
            Ok(Decision::Forbidden { user, reason }) => Authorization::Forbidden(format!(
                "{user} may not {verb} {path}: RBAC must let them {verb} {}/{} of this node{}",
                verdict_k8s::review::RESOURCE,
                verdict_k8s::review::SUBRESOURCE,
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                }
            )),
            Err(e) => Authorization::Unavailable(e),
        }
    }
}

/// How long a fatal error waits for its Event to be posted.
const EVENT_FLUSH: Duration = Duration::from_secs(5);

/// Programs the node and keeps it programmed. Returns only on error; on
/// SIGTERM the process ends and the rules stay, so traffic keeps flowing.
pub fn run(settings: &Settings, source: &SourceFlags, verbosity: &Verbosity) -> anyhow::Result<()> {
    verdict_node::probe::check_kernel()?;
    verdict_node::probe::check_net_admin()?;
    match verdict_admin::process::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(limit, "open files"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the limit of open files"),
    }
    let metrics = kube_proxy_metrics(settings);
    // The flow stream's kernel side first: the rules log rejected and
    // dropped connections to its group only if verdict holds that group.
    let flow_source = open_flows(settings)?;
    let mut wanted = node_settings(settings, source);
    if flow_source.is_none() {
        wanted.flow_log_group = None;
    }
    let mut node = NodeProxy::new(wanted, metrics.clone(), &KernelAddresses)?;
    let name = node.settings().node_name.clone();
    tracing::info!(
        node = %name,
        addresses = ?node.local_ips(),
        kernel = %std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "node facts"
    );
    // As kube-proxy, the API client comes first: a kubeconfig or --master
    // that cannot be used stops verdict before it changes anything.
    let client = client_options(settings, &metrics);
    let (tx, inputs) = std::sync::mpsc::channel();
    source
        .node(&name, client.clone())
        .start(&name, tx.clone())?;
    let mut events = None;
    if source.manifests.is_none() {
        match verdict_k8s::events::start(&source.api(&name, client.clone())) {
            Ok(e) => {
                node.set_events(Some(e.sender()));
                events = Some(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot post Events; what they would say is still logged and counted")
            }
        }
    }
    node.notify(Notice {
        regarding: Regarding::Node,
        warning: false,
        reason: "Starting",
        action: "StartKubeProxy",
        note: format!("Starting verdict {}.", crate::version::BUILD.git_version),
    });
    let kind = settings.nftables_backend;
    let mut backend = kind.open().context("nftables")?;
    tracing::info!(backend = %kind, node = %name, "starting");
    node.probe(backend.as_mut()).context("startup check")?;
    tracing::info!("nftables dry run passed: the kernel accepts verdict's ruleset");
    verdict_node::setup::apply(&settings.conntrack, settings.oom_score_adj)?;
    let conntrack = kind.conntrack().context("conntrack")?;
    let handle = node.handle();
    // kube-proxy's two servers; with bindAddressHardFail, one that cannot
    // listen stops verdict, after its Event.
    let mut servers: Vec<(SocketAddr, Routes, &str, &'static str, &str)> = Vec::new();
    let probes = Arc::new(crate::endpoints::ProbeCounts::default());
    if let Some(addr) = settings.healthz_bind_address {
        servers.push((
            addr,
            crate::endpoints::health_routes(handle.health().clone(), probes.clone()),
            "/healthz and /livez",
            "FailedToStartProxierHealthcheck",
            "healthz server failed",
        ));
    }
    let counters = settings.service_counters.then(|| {
        api::CounterCache::new(
            handle.clone(),
            api::kernel_reader(kind),
            flow_source.is_some().then(|| metrics.clone()),
        )
    });
    if let Some(c) = &counters {
        c.read_periodically();
    }
    let flows = match flow_source {
        Some(opened) => Some(start_flows(settings, opened, &handle, &metrics)?),
        None => None,
    };
    let peers = match (&settings.hubble_listen_address, &source.manifests) {
        (Some(addr), None) => hubble_peers(
            &source.api(&name, client.clone()),
            *addr,
            settings
                .hubble_tls
                .is_some()
                .then_some(settings.cluster_name.as_str()),
        ),
        _ => None,
    };
    serve_hubble(settings, flows.as_ref(), &handle, peers, &name);
    let api_for = |exposure: Exposure| {
        api::handler(
            handle.clone(),
            api::kernel_reader(kind),
            api::conntrack_reader(kind),
            counters.clone(),
            flows.clone(),
            exposure,
        )
    };
    // The API and the web view reveal traffic: other hosts get answers only
    // on --api-bind-address, and only with a token the API server accepts.
    if let Some(addr) = settings.api_bind_address {
        let exposure = match &source.manifests {
            None => match verdict_k8s::review::Reviewer::new(&source.api(&name, client.clone())) {
                Ok(r) => Exposure::Authenticated(Arc::new(TokenReviews(r))),
                Err(e) => {
                    tracing::warn!(error = %e, %addr, "cannot check bearer tokens with the API server: the API there answers loopback clients only");
                    Exposure::Loopback
                }
            },
            Some(_) => {
                tracing::warn!(%addr, "with --manifests there is no API server to check bearer tokens with: the API there answers loopback clients only");
                Exposure::Loopback
            }
        };
        servers.push((
            addr,
            Routes::slow(api_for(exposure)),
            "the API and the web view",
            "FailedToStartApiServer",
            "starting the API server failed",
        ));
    }
    if let Some(addr) = settings.metrics_bind_address {
        let site = crate::endpoints::MetricsSite {
            metrics: metrics.clone(),
            probes: probes.clone(),
            slis: Arc::new(Mutex::new(Metrics::slis())),
            api: Some(api_for(Exposure::Loopback)),
            more_metrics: counters.clone().map(api::CounterCache::metrics),
            refresh: counters.clone().map(|c| {
                Arc::new(move || {
                    c.snapshot();
                }) as Arc<dyn Fn() + Send + Sync>
            }),
            configz: crate::config::render::configz(&settings.effective).to_string(),
            zpages: Arc::new(verdict_admin::zpages::ZPages::new(
                "kube-proxy",
                settings.flagz.clone(),
                verdict_admin::process::Process::now().map_or_else(
                    std::time::SystemTime::now,
                    |p| {
                        std::time::UNIX_EPOCH
                            + std::time::Duration::from_secs_f64(p.start_time.max(0.0))
                    },
                ),
                // As component-base gives it: the version without its `v`.
                crate::version::BUILD.git_version.trim_start_matches('v'),
                crate::version::BUILD.compiler,
                crate::endpoints::metrics_paths(settings.enable_profiling),
            )),
            profiling: settings.enable_profiling,
            verbosity: verbosity.clone(),
        };
        servers.push((
            addr,
            crate::endpoints::metrics_routes(site),
            "/metrics",
            "FailedToStartMetricServer",
            "starting metrics server failed",
        ));
    }
    for (addr, routes, what, reason, failed) in servers {
        if let Err(e) = crate::endpoints::serve(addr, routes, what, settings.bind_address_hard_fail)
        {
            let note = format!("{failed}: {e}");
            node.notify(Notice {
                regarding: Regarding::Node,
                warning: true,
                reason,
                action: "StartKubeProxy",
                note: note.clone(),
            });
            // The poster finishes once every sender is gone.
            node.set_events(None);
            if let Some(e) = events.take() {
                e.close(EVENT_FLUSH);
            }
            bail!(note);
        }
    }
    input::addresses(tx.clone());
    if let Some((path, text)) = &source.config_file {
        input::config_file(PathBuf::from(path), text.clone(), tx.clone());
    }
    let keep = source.keep_kube_proxy_nftables;
    // The rules in place are read at start on a handle of their own
    // (without one, the loop reads them itself first). A backend that
    // cannot tell the ruleset's generation (`nft`) reads nothing ahead,
    // so it gets none.
    let reader = match backend.generation() {
        Ok(Some(_)) => kind
            .open()
            .inspect_err(|e| tracing::warn!(error = %e, "cannot open a second nftables handle: the rules in place are read before the source's objects are taken in"))
            .ok(),
        _ => None,
    };
    let kernel = Kernel {
        backend,
        conntrack,
        addresses: Arc::new(KernelAddresses),
        listen: Box::new(move |tables| input::foreign_changes(tables, tx.clone())),
        leftovers: Box::new(move |b| verdict_node::leftovers::cleanup(keep, b)),
        around_large: Some(Box::new(verdict_node::apart::Apart::default())),
        reader,
    };
    verdict_node::run(node, kernel, inputs)?;
    Ok(())
}

/// Hubble's observer API on `--hubble-listen-address`, over the flow
/// stream's store: a listener that cannot start is a warning, as the
/// flow stream's own is.
fn serve_hubble(
    settings: &Settings,
    flows: Option<&Arc<verdict_node::flows::FlowStore>>,
    handle: &verdict_node::NodeHandle,
    peers: Option<Arc<dyn verdict_hubble::peer::PeerSource>>,
    node_name: &str,
) {
    let Some(addr) = settings.hubble_listen_address else {
        return;
    };
    let Some(store) = flows else {
        tracing::info!(%addr, "the flow stream is off: Hubble's API is not served");
        return;
    };
    let tls = match settings
        .hubble_tls
        .as_ref()
        .cloned()
        .map(verdict_hubble::tls::Reloading::new)
    {
        None => None,
        Some(Ok(config)) => Some(config),
        Some(Err(e)) => {
            tracing::warn!(%addr, error = %e, "cannot serve Hubble's observer API in TLS (--hubble-tls-*): it is not served");
            return;
        }
    };
    let in_tls = tls.is_some();
    let source = Arc::new(verdict_node::hubble::HubbleFlows::new(
        store.clone(),
        handle.clone(),
        node_name,
    ));
    match verdict_hubble::grpc::serve(addr, source, peers, tls) {
        Ok(bound) => {
            tracing::info!(address = %bound, tls = in_tls, "serving Hubble's observer API (hubble observe --server {bound})")
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "cannot serve Hubble's observer API (--hubble-listen-address; empty turns it off)")
        }
    }
}

/// Hubble's peers: every Node, at its first address (InternalIP, else
/// ExternalIP) of the listener's family and the listener's port, with its
/// TLS name when `cluster` (TLS is on). The Nodes are watched only while
/// Relay follows `Notify`.
struct NodePeers(verdict_k8s::nodes::NodeWatch<verdict_hubble::peer::Peer>);

impl verdict_hubble::peer::PeerSource for NodePeers {
    fn subscribe(&self) -> tokio::sync::watch::Receiver<verdict_hubble::peer::Peers> {
        self.0.subscribe()
    }
}

fn hubble_peers(
    api: &ApiSource,
    listen: SocketAddr,
    cluster: Option<&str>,
) -> Option<Arc<dyn verdict_hubble::peer::PeerSource>> {
    let cluster = cluster.map(str::to_owned);
    let peer = move |n: &verdict_k8s::NodeInfo| {
        let ip = n
            .addresses
            .iter()
            .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
            .find(|ip| ip.is_ipv4() == listen.is_ipv4())?;
        Some(verdict_hubble::peer::Peer {
            name: n.name.clone(),
            address: SocketAddr::new(ip, listen.port()).to_string(),
            tls_server_name: cluster
                .as_deref()
                .map(|c| verdict_hubble::peer::tls_server_name(&n.name, c)),
        })
    };
    match verdict_k8s::nodes::NodeWatch::start(api, peer) {
        Ok(w) => Some(Arc::new(NodePeers(w))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch Nodes for Hubble's peer service: peer.Peer/Notify is not served");
            None
        }
    }
}

/// The flow stream's sources, opened (`None`: the stream is off): the
/// kernel's reports and the flow log. A flow log that cannot be opened, or
/// a stream that cannot start when `--flows` or `--flow-log` asked for it,
/// stops verdict at start with the reason, before it changes anything; the
/// stream on by default is left off instead, with a warning (another
/// program holding its nfnetlink_log group must not stop the proxy, nor be
/// sent verdict's logged packets).
fn open_flows(
    settings: &Settings,
) -> anyhow::Result<
    Option<(
        verdict_nft::flows::FlowMonitor,
        Option<verdict_node::flows::FlowLog>,
    )>,
> {
    use verdict_node::flows::FlowLog;
    if !settings.flows {
        return Ok(None);
    }
    let log = match &settings.flow_log {
        Some(target) => {
            Some(FlowLog::open(target).with_context(|| format!("--flow-log {target}"))?)
        }
        None => None,
    };
    let group = flow_log_group(settings);
    // Asked for (`--flows`, `--flow-log`): connections are followed from
    // start; by default only once a reader asks for flows.
    match verdict_nft::flows::FlowMonitor::open(group, settings.flows_required) {
        Ok(monitor) => Ok(Some((monitor, log))),
        Err(e) if !settings.flows_required => {
            tracing::warn!(
                error = %e,
                group,
                "the flow stream is off: it cannot start (--flows=false turns it off without this warning; --flows makes this an error)"
            );
            Ok(None)
        }
        Err(e) => Err(e).context("the flow stream (--flows)"),
    }
}

/// The flow stream: the kernel's reports read on a thread of their own
/// into a bounded store.
fn start_flows(
    settings: &Settings,
    (monitor, log): (
        verdict_nft::flows::FlowMonitor,
        Option<verdict_node::flows::FlowLog>,
    ),
    handle: &verdict_node::NodeHandle,
    metrics: &Arc<Mutex<Metrics>>,
) -> anyhow::Result<Arc<verdict_node::flows::FlowStore>> {
    use verdict_node::flows::{
        DEFAULT_CAPACITY, DEFAULT_LINGER, FlowStore, Following, LogWriter, Recorder,
    };
    let store = FlowStore::new(DEFAULT_CAPACITY);
    let log = log.map(|l| LogWriter::new(l, settings.flow_log_limits, metrics.clone()));
    let recorder = Recorder::new(handle.clone(), store.clone(), metrics.clone(), log);
    let following = if settings.flows_required {
        Following::Always
    } else {
        Following::OnDemand {
            linger: DEFAULT_LINGER,
        }
    };
    verdict_node::flows::spawn(monitor, recorder, following).context("starting the flow stream")?;
    tracing::info!(
        log_group = flow_log_group(settings),
        capacity = DEFAULT_CAPACITY,
        log = settings.flow_log.as_deref().unwrap_or(""),
        log_max_bytes = settings.flow_log_limits.max_size,
        log_max_backups = settings.flow_log_limits.max_backups,
        log_rate = settings.flow_log_limits.rate,
        connections = %match following {
            Following::Always => "always (--flows)".to_owned(),
            Following::OnDemand { linger } => {
                format!("while flows are read, and {} s after", linger.as_secs())
            }
        },
        "flow stream on"
    );
    Ok(store)
}

/// The node built in memory from the source, as `run` would program it.
fn node_parts(
    settings: &Settings,
    source: &SourceFlags,
) -> (NodeSettings, Arc<Mutex<Metrics>>, verdict_node::Source) {
    let node = node_settings(settings, source);
    let metrics = kube_proxy_metrics(settings);
    let src = source.node(&node.node_name, client_options(settings, &metrics));
    (node, metrics, src)
}

/// The nftables script `run` would program for the source's current
/// state, both families.
pub fn plan(settings: &Settings, source: &SourceFlags) -> anyhow::Result<String> {
    let (node, metrics, src) = node_parts(settings, source);
    Ok(once::plan(
        node,
        metrics,
        src,
        Some(settings.nftables_backend),
    )?)
}

/// The node built in memory, for the offline introspection commands.
pub fn offline(settings: &Settings, source: &SourceFlags) -> anyhow::Result<Offline> {
    let (node, metrics, src) = node_parts(settings, source);
    Ok(once::offline(
        node,
        metrics,
        src,
        Some(settings.nftables_backend),
    )?)
}

/// Removes verdict's tables and kube-proxy's leftovers (unless `force`,
/// not while kube-proxy runs).
pub fn cleanup(settings: &Settings, source: &SourceFlags, force: bool) -> anyhow::Result<()> {
    // kube-proxy's health server binds 0.0.0.0:10256 by default, its
    // metrics server 127.0.0.1:10249; and where this configuration puts
    // them, if elsewhere (its address if one is named, else loopback).
    let at = |a: std::net::SocketAddr| {
        let ip = if a.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            a.ip()
        };
        std::net::SocketAddr::new(ip, a.port())
    };
    let mut health = vec![std::net::SocketAddr::from(([127, 0, 0, 1], 10256))];
    let mut metrics = vec![std::net::SocketAddr::from(([127, 0, 0, 1], 10249))];
    for (list, configured) in [
        (&mut health, settings.healthz_bind_address),
        (&mut metrics, settings.metrics_bind_address),
    ] {
        if let Some(a) = configured.filter(|a| a.port() != 0).map(at)
            && !list.contains(&a)
        {
            list.push(a);
        }
    }
    let check = once::KubeProxyCheck {
        health,
        metrics,
        sync_period: settings.sync_period,
    };
    Ok(once::cleanup(
        settings.nftables_backend,
        source.keep_kube_proxy_nftables,
        force,
        &check,
    )?)
}

/// `--init-only`.
pub fn init_only(settings: &Settings) -> anyhow::Result<()> {
    Ok(once::init_only(
        &settings.conntrack,
        settings.oom_score_adj,
    )?)
}
