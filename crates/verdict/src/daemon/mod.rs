//! Running verdict: where objects come from, the two per-family proxiers,
//! and the sync loop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use verdict_admin::http::Routes;
use verdict_admin::metrics as m;
use verdict_admin::service_health::{Healthy, ServiceHealthServers};
use verdict_admin::{Family as HealthFamily, Health, Metrics};
use verdict_k8s::client::{ClientOptions, Observer, RequestRecord};
use verdict_k8s::events::{Notice, Regarding};
use verdict_k8s::watch::{ApiSource, Update};
use verdict_k8s::{Manifests, NodeInfo};
use verdict_model::{EndpointSlice, IpFamily, NamespacedName, Service, ServicePortName};
use verdict_nft::conntrack::Conntrack;
use verdict_nft::{Backend, Family, MemoryBackend, Transaction};
use verdict_proxier::{LocalDetector, Proxier, ProxierConfig};

use crate::config::{DetectLocal, Settings};
use crate::inspect::History;
use crate::inspect::history::{self, ForeignRecord, SyncRecord};
use crate::logging::Verbosity;
use crate::schedule::{self, Due, Schedule, Why};

mod api;
mod family;
mod feed;
mod outcome;
mod watchers;
pub use api::offline;
use family::{FamilyExtras, clean_stale_udp, sync_health_checks};
use feed::{Feed, PLAN_LIST_TIMEOUT};
use outcome::{After, HealthChange};
use watchers::{Foreign, our_tables, watch_addresses, watch_foreign_changes};

/// Where Services, EndpointSlices and the Node come from: `--manifests`
/// if given, else the Kubernetes API (kubeconfig, `--master`, or the
/// in-cluster service account); and what else `run` needs from the
/// command line.
pub struct Source {
    /// `--manifests`: a YAML file or directory, followed for changes.
    pub manifests: Option<String>,
    /// `--kubeconfig` / `clientConnection.kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `--master`.
    pub master: Option<String>,
    /// `--keep-kube-proxy-nftables`.
    pub keep_kube_proxy_nftables: bool,
    /// `--config`'s path and the text read at start: as kube-proxy, verdict
    /// exits when the file changes, so that its pod restarts with it.
    pub config_file: Option<(String, String)>,
}

impl Source {
    /// The Kubernetes API connection for `node_name` (when `manifests` is
    /// not given).
    fn api(&self, node_name: &str, client: ClientOptions) -> ApiSource {
        ApiSource {
            kubeconfig: self.kubeconfig.as_ref().map(PathBuf::from),
            master: self.master.clone(),
            node_name: node_name.to_string(),
            client,
        }
    }
}

/// The API client's rate limit, and its requests counted in the metrics.
fn client_options(settings: &Settings, metrics: &Arc<Mutex<Metrics>>) -> ClientOptions {
    let x = metrics.clone();
    let observer: Observer = Arc::new(move |r: &RequestRecord| {
        record(&x, |m| {
            m.add(m::REST_CLIENT_REQUESTS, &[&r.code, &r.host, &r.method], 1.0);
            m.observe(m::REST_CLIENT_DURATION, &[&r.host, &r.method], r.seconds);
        });
    });
    ClientOptions {
        qps: settings.client.qps,
        burst: settings.client.burst,
        observer: Some(observer),
    }
}

/// The node's name: `hostnameOverride`, else the host name (lower-case).
fn node_name(settings: &Settings) -> String {
    settings.hostname_override.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_lowercase())
            .unwrap_or_default()
    })
}

/// Every address on this network namespace's interfaces, sorted, but IPv6
/// link-local ones: they cannot take NodePorts (they need a scope), and
/// every pod interface adds one.
fn local_addresses() -> anyhow::Result<Vec<IpAddr>> {
    let mut ips = verdict_nft::addresses::local_addresses()
        .context("listing the node's addresses (RTM_GETADDR)")?;
    ips.retain(|ip| !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80));
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// The configuration of one family's proxier.
fn proxier_config(
    family: IpFamily,
    settings: &Settings,
    node: &NodeInfo,
    local_ips: &[IpAddr],
    service_cidrs: &[ipnet::IpNet],
) -> anyhow::Result<ProxierConfig> {
    let mut c = ProxierConfig::new(family, node.name.clone());
    c.service_cidrs = service_cidrs
        .iter()
        .filter(|n| IpFamily::of(n.addr()) == family)
        .copied()
        .collect();
    c.node_zone = node.zone.clone();
    c.node_ips = match settings.bind_address {
        Some(ip) => vec![ip],
        None => node
            .addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect(),
    };
    c.local_ips = local_ips.to_vec();
    c.masquerade_all = settings.masquerade_all;
    c.masquerade_bit = settings.masquerade_bit;
    let of_family = |n: &&ipnet::IpNet| IpFamily::of(n.addr()) == family;
    c.local_detector = match &settings.detect_local {
        DetectLocal::ClusterCidr(nets) => nets
            .iter()
            .find(of_family)
            .map_or(LocalDetector::None, |n| LocalDetector::Cidr(*n)),
        DetectLocal::NodeCidr => {
            let nets: Vec<ipnet::IpNet> = node
                .pod_cidrs
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect();
            nets.iter()
                .find(of_family)
                .map_or(LocalDetector::None, |n| LocalDetector::Cidr(*n))
        }
        DetectLocal::BridgeInterface(b) => LocalDetector::BridgeInterface(b.clone()),
        DetectLocal::InterfaceNamePrefix(p) => LocalDetector::InterfaceNamePrefix(p.clone()),
    };
    if c.local_detector == LocalDetector::None {
        tracing::info!(%family, "no local-traffic detector for this family: ClusterIP traffic is not masqueraded");
    }
    c.node_port_addresses = settings.node_ports.clone();
    c.counters = settings.service_counters;
    c.validate()?;
    Ok(c)
}

/// Both proxiers, fed from the manifests or the Kubernetes API.
struct Node {
    settings: Settings,
    name: String,
    info: NodeInfo,
    /// Whether this node's Node object is known.
    node_known: bool,
    /// The CIDRs of the ServiceCIDR objects.
    service_cidrs: Vec<ipnet::IpNet>,
    local_ips: Vec<IpAddr>,
    proxiers: Vec<Proxier>,
    services: BTreeMap<(String, String), Service>,
    slices: BTreeMap<(String, String), EndpointSlice>,
    /// Per proxier, what `run` keeps beside it.
    extras: Vec<FamilyExtras>,
    /// Families whose nft cannot record session affinity (startup probe).
    no_affinity: Vec<IpFamily>,
    /// kube-proxy's metrics.
    metrics: Arc<Mutex<Metrics>>,
    /// The proxy's health (`/healthz`, `/livez`, health-check node ports).
    health: Arc<Mutex<Health>>,
    /// Set by `run`: after syncs, reconcile conntrack and serve the
    /// health-check node ports (`plan` leaves the machine alone).
    live: Option<Box<dyn Conntrack>>,
    /// With the Kubernetes source: where Events go.
    events: Option<std::sync::mpsc::Sender<Notice>>,
    /// The recent syncs and foreign changes, for the introspection API.
    history: History,
}

impl Node {
    fn new(settings: &Settings) -> anyhow::Result<Node> {
        let name = node_name(settings);
        if name.is_empty() {
            bail!("cannot tell this node's name: set --hostname-override");
        }
        let info = NodeInfo {
            name: name.clone(),
            ..NodeInfo::default()
        };
        let local_ips = local_addresses()?;
        let proxiers = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|f| {
                Ok(Proxier::new(proxier_config(
                    f,
                    settings,
                    &info,
                    &local_ips,
                    &[],
                )?)?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Node {
            settings: settings.clone(),
            name,
            info,
            node_known: false,
            service_cidrs: Vec::new(),
            local_ips,
            extras: proxiers.iter().map(|_| FamilyExtras::default()).collect(),
            no_affinity: Vec::new(),
            metrics: Arc::new(Mutex::new(kube_proxy_metrics(settings))),
            health: Arc::new(Mutex::new(Health::new(2 * settings.sync_period))),
            live: None,
            events: None,
            history: History::default(),
            proxiers,
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
        })
    }

    /// The pending-changes gauges (the most any family has pending).
    fn set_pending(&self) {
        let services = self
            .proxiers
            .iter()
            .map(|p| p.pending_service_changes())
            .max();
        let endpoints = self
            .proxiers
            .iter()
            .map(|p| p.pending_endpoint_changes())
            .max();
        record(&self.metrics, |x| {
            x.set(
                m::SERVICE_CHANGES_PENDING,
                &[],
                services.unwrap_or(0) as f64,
            );
            x.set(
                m::ENDPOINT_CHANGES_PENDING,
                &[],
                endpoints.unwrap_or(0) as f64,
            );
        });
    }

    /// Records that a change waits for a sync (both families): health and
    /// `last_queued_timestamp`.
    fn queued(&self) {
        let now = SystemTime::now();
        if let Ok(mut h) = self.health.lock() {
            h.queued_update(HealthFamily::V4, now);
            h.queued_update(HealthFamily::V6, now);
        }
        let secs = unix_seconds(now);
        record(&self.metrics, |x| {
            for f in ["IPv4", "IPv6"] {
                x.set(m::LAST_QUEUED, &[f], secs);
            }
        });
    }

    /// Another process changed verdict's tables (or announcements were
    /// lost): says what, counts it, and marks the families broken until
    /// the repair.
    fn foreign_change(&mut self, event: &Foreign) {
        let now = SystemTime::now();
        let families: Vec<HealthFamily> = match event {
            Foreign::Overflow => {
                tracing::warn!(
                    "ruleset announcements were lost (the kernel's buffer overflowed): resyncing both families in full"
                );
                vec![HealthFamily::V4, HealthFamily::V6]
            }
            Foreign::Commit {
                pid,
                process,
                changes,
            } => {
                const SHOWN: usize = 10;
                let shown: Vec<String> = changes
                    .iter()
                    .take(SHOWN)
                    .map(ToString::to_string)
                    .collect();
                tracing::warn!(
                    %process,
                    pid,
                    changes = changes.len(),
                    what = %shown.join("; "),
                    more = changes.len().saturating_sub(SHOWN),
                    "another process changed verdict's tables: repairing with a full resync"
                );
                let mut f: Vec<HealthFamily> = changes
                    .iter()
                    .map(|c| {
                        if c.family == "ip6" {
                            HealthFamily::V6
                        } else {
                            HealthFamily::V4
                        }
                    })
                    .collect();
                f.sort();
                f.dedup();
                f
            }
        };
        self.history.foreign(match event {
            Foreign::Overflow => ForeignRecord {
                at: now,
                process: None,
                changes: 0,
                sample: Vec::new(),
            },
            Foreign::Commit {
                pid,
                process,
                changes,
            } => {
                let (n, sample) = history::sample(changes.iter().map(ToString::to_string));
                ForeignRecord {
                    at: now,
                    process: Some((process.clone(), *pid)),
                    changes: n,
                    sample,
                }
            }
        });
        for f in families {
            let label = f.to_string();
            record(&self.metrics, |x| x.add(m::FOREIGN_CHANGES, &[&label], 1.0));
            if let Ok(mut h) = self.health.lock() {
                h.broken(f, now);
            }
        }
    }

    /// Rebuilds the proxiers' configurations from the node facts.
    fn reconfigure(&mut self) -> anyhow::Result<()> {
        for p in &mut self.proxiers {
            let family = p.config().family;
            let mut c = proxier_config(
                family,
                &self.settings,
                &self.info,
                &self.local_ips,
                &self.service_cidrs,
            )?;
            c.session_affinity = !self.no_affinity.contains(&family);
            p.set_config(c)?;
        }
        Ok(())
    }

    /// Reads the node's addresses again (kube-proxy does at every full
    /// sync). The proxiers are reconfigured, which brings a full sync, only
    /// when the addresses that take NodePorts changed: a pod's interface
    /// coming or going changes nothing. Returns whether they did.
    fn refresh_addresses(&mut self) -> bool {
        let now = match local_addresses() {
            Ok(ips) => ips,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot read the node's addresses; keeping the last ones");
                return false;
            }
        };
        if now == self.local_ips {
            return false;
        }
        let moved = self.proxiers.iter().any(|p| {
            let mut c = p.config().clone();
            let before = c.node_port_ips();
            c.local_ips = now.clone();
            c.node_port_ips() != before
        });
        let before = std::mem::replace(&mut self.local_ips, now);
        if !moved {
            return false;
        }
        tracing::info!(before = ?before, after = ?self.local_ips, "the node's addresses changed");
        if let Err(e) = self.reconfigure() {
            tracing::error!(error = %format!("{e:#}"), "cannot use the node's new addresses");
            self.local_ips = before;
            let _ = self.reconfigure();
            return false;
        }
        true
    }

    /// Posts an Event (with the Kubernetes source).
    fn notify(&self, notice: Notice) {
        if let Some(tx) = &self.events {
            let _ = tx.send(notice);
        }
    }

    /// Dry-runs every family's probe ruleset through the backend and turns
    /// session affinity off for the families it cannot program.
    fn probe(&mut self, backend: &mut dyn Backend) -> anyhow::Result<()> {
        let configs: Vec<&ProxierConfig> = self.proxiers.iter().map(|p| p.config()).collect();
        self.no_affinity = crate::probe::probe_nftables(backend, &configs)?;
        self.reconfigure()
    }

    /// This node's Node object changed (`Some`) or was deleted (`None`).
    /// A deleted Node, or one being deleted, takes no load-balancer traffic
    /// (`/healthz` answers 503). Returns whether the rules must change.
    fn set_node(&mut self, node: Option<&NodeInfo>) -> anyhow::Result<bool> {
        let eligible = node.is_some_and(|n| !n.being_deleted);
        if let Ok(mut h) = self.health.lock() {
            h.set_node_eligible(eligible);
        }
        self.node_known = node.is_some();
        let Some(me) = node else {
            tracing::warn!(node = %self.name, "this node's Node object was deleted");
            return Ok(false);
        };
        if *me == self.info {
            return Ok(false);
        }
        tracing::info!(node = %me.name, addresses = ?me.addresses, pod_cidrs = ?me.pod_cidrs, "node changed");
        let before = std::mem::replace(&mut self.info, me.clone());
        if let Err(e) = self.reconfigure() {
            // Not taken: the same Node seen again is tried again.
            self.info = before;
            self.reconfigure()?;
            return Err(e);
        }
        Ok(true)
    }

    /// The ServiceCIDRs changed. Returns whether the rules must change.
    fn set_service_cidrs(&mut self, cidrs: &[ipnet::IpNet]) -> anyhow::Result<bool> {
        if cidrs == self.service_cidrs.as_slice() {
            return Ok(false);
        }
        tracing::info!(?cidrs, "service CIDRs changed");
        let before = std::mem::replace(&mut self.service_cidrs, cidrs.to_vec());
        if let Err(e) = self.reconfigure() {
            self.service_cidrs = before;
            self.reconfigure()?;
            return Err(e);
        }
        Ok(true)
    }

    /// A Service was added, changed (`Some`) or deleted (`None`).
    fn set_service(&mut self, key: (String, String), new: Option<Service>) -> bool {
        let old = self.services.get(&key);
        if old == new.as_ref() {
            return false;
        }
        record(&self.metrics, |x| x.add(m::SERVICE_CHANGES_TOTAL, &[], 1.0));
        let what = match (old.is_some(), new.is_some()) {
            (false, _) => "added",
            (true, true) => "changed",
            (true, false) => "deleted",
        };
        tracing::debug!(service = %format!("{}/{}", key.0, key.1), "Service {what}");
        let mut changed = false;
        for p in &mut self.proxiers {
            changed |= p.on_service(old, new.as_ref());
        }
        match new {
            Some(n) => self.services.insert(key, n),
            None => self.services.remove(&key),
        };
        changed
    }

    /// An EndpointSlice was added, changed (`Some`) or deleted (`None`).
    fn set_slice(&mut self, key: (String, String), new: Option<EndpointSlice>) -> bool {
        let old = self.slices.get(&key);
        if old == new.as_ref() {
            return false;
        }
        record(&self.metrics, |x| {
            x.add(m::ENDPOINT_CHANGES_TOTAL, &[], 1.0)
        });
        tracing::debug!(
            endpoint_slice = %format!("{}/{}", key.0, key.1),
            endpoints = new.as_ref().map_or(0, |s| s.endpoints.len()),
            "EndpointSlice {}",
            if new.is_some() { "updated" } else { "deleted" }
        );
        let mut changed = false;
        for p in &mut self.proxiers {
            changed |= match (old, &new) {
                (_, Some(n)) => p.on_endpoint_slice(n, false),
                (Some(o), None) => p.on_endpoint_slice(o, true),
                (None, None) => false,
            };
        }
        match new {
            Some(n) => self.slices.insert(key, n),
            None => self.slices.remove(&key),
        };
        changed
    }

    /// Reports what the proxiers refused, and updates the pending gauges.
    fn after_changes(&mut self) {
        self.set_pending();
        for p in &mut self.proxiers {
            for e in p.take_errors() {
                tracing::error!(error = %e, "service ignored");
            }
        }
    }

    /// Applies one change from the Kubernetes API (call `after_changes`
    /// once the batch is in). Returns whether the rules must change. A Node or ServiceCIDR that cannot be used is
    /// logged and skipped; the rest keeps working.
    fn on_update(&mut self, u: Update) -> bool {
        match u {
            Update::Service(key, s) => self.set_service(key, s),
            Update::Slice(key, s) => self.set_slice(key, s),
            Update::Node(n) => self.set_node(n.as_ref()).unwrap_or_else(|e| {
                tracing::error!(error = %format!("{e:#}"), "cannot use this node's Node object");
                false
            }),
            Update::ServiceCidrs(c) => self.set_service_cidrs(&c).unwrap_or_else(|e| {
                tracing::error!(error = %format!("{e:#}"), "cannot use the ServiceCIDRs");
                false
            }),
            Update::Synced => false,
        }
    }

    /// A periodic resync found the ruleset as verdict's last sync left it
    /// (`generation`) and read nothing: with no change waiting (`pending`),
    /// it counts as a sync that had nothing to do, for health and
    /// `last_timestamp`; the history records it either way.
    fn resync_unneeded(&mut self, generation: u32, pending: bool) {
        let now = SystemTime::now();
        tracing::debug!(
            generation,
            pending,
            "periodic resync: nothing was committed since the last sync; the tables were not read"
        );
        for p in &self.proxiers {
            let family = p.config().nft_family();
            let label = health_family(family).to_string();
            if !pending {
                if let Ok(mut h) = self.health.lock() {
                    h.updated(health_family(family), now);
                }
                record(&self.metrics, |x| {
                    x.set(m::LAST_SYNC, &[label.as_str()], unix_seconds(now))
                });
            }
            self.history.sync(SyncRecord {
                at: now,
                family: family.to_string(),
                full: true,
                trigger: "periodic resync, not needed: the ruleset is unchanged since the last sync",
                took: Duration::ZERO,
                operations: 0,
                services: 0,
                sample: Vec::new(),
                quarantined: 0,
                error: None,
            });
        }
    }

    /// Syncs both families (`full`: comparing everything with the kernel).
    /// A family that fails does not keep the other from syncing; the
    /// error names every family that failed.
    fn sync<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        now: Instant,
        full: bool,
        trigger: &'static str,
    ) -> anyhow::Result<()> {
        if full && self.live.is_some() {
            self.refresh_addresses();
        }
        let metrics = &self.metrics;
        let mut failed: Vec<String> = Vec::new();
        for (p, extras) in self.proxiers.iter_mut().zip(&mut self.extras) {
            let family = p.config().nft_family();
            let label = health_family(family).to_string();
            let fam = [label.as_str()];
            let t = Instant::now();
            let started = SystemTime::now();
            if full {
                p.force_full_sync();
            }
            let result = p.sync(backend, now);
            let family_name = family.to_string();
            let outcome = outcome::decide(&outcome::Finished {
                family: &family_name,
                label: &label,
                requested_full: full,
                trigger,
                started,
                took: t.elapsed(),
                ended: SystemTime::now(),
                result: result.as_ref(),
                udp_pending: extras.udp.pending(),
            });
            if let Ok(r) = &result {
                report_quarantine(metrics, self.events.as_ref(), &label, r);
            }
            record(metrics, |x| {
                for change in &outcome.metrics {
                    change.apply(x);
                }
            });
            if let Ok(r) = &result {
                tracing::debug!(
                    %family,
                    full = r.full,
                    operations = r.operations,
                    elapsed = ?outcome.record.took,
                    services = r.updated_services.len(),
                    "synced"
                );
            }
            self.history.sync(outcome.record);
            if let Ok(mut h) = self.health.lock() {
                match outcome.health {
                    HealthChange::Updated { at, started } => {
                        h.updated(health_family(family), at);
                        h.repaired(health_family(family), started);
                    }
                    HealthChange::Broken { since } => h.broken(health_family(family), since),
                }
            }
            if let Some(why) = outcome.failure {
                failed.push(why);
            }
            let Ok(r) = result else {
                continue;
            };
            let Some(ct) = self.live.as_mut() else {
                continue;
            };
            // After a partial sync, only the services it touched are
            // looked at again: O(changed), as the sync itself.
            let t = Instant::now();
            let touched = match outcome.after {
                After::Nothing => continue,
                After::All => {
                    extras.udp.touched_all(p.service_ports());
                    None
                }
                After::Touched => {
                    extras.udp.touched(&r.updated_services);
                    Some(&r.updated_services)
                }
            };
            sync_health_checks(
                extras,
                p,
                &self.health,
                touched,
                self.events.as_ref(),
                &self.name,
            );
            let check = extras.udp.check(p.service_ports(), p.endpoints());
            let checked = check.as_ref().map_or(0, |c| c.targets.len());
            match check {
                None => {}
                // Only endpoints gained: nothing can be stale.
                Some(check) if !check.cleanup => extras.udp.done(check),
                Some(check) => {
                    let t = Instant::now();
                    match clean_stale_udp(ct.as_mut(), family, &check.targets) {
                        Ok(deleted) => {
                            let took = t.elapsed().as_secs_f64();
                            record(metrics, |x| {
                                x.observe(m::CONNTRACK_DURATION, &fam, took);
                                x.add(m::CONNTRACK_DELETED, &fam, deleted as f64);
                            });
                            extras.udp.done(check);
                        }
                        // The services stay pending: the next sync tries again.
                        Err(e) => {
                            tracing::warn!(%family, error = %e, "stale UDP conntrack cleanup failed")
                        }
                    }
                }
            }
            tracing::debug!(
                %family,
                services = r.updated_services.len(),
                udp_targets = checked,
                elapsed = ?t.elapsed(),
                "after the sync: health-check ports and UDP conntrack"
            );
        }
        self.set_pending();
        if failed.is_empty() {
            Ok(())
        } else {
            bail!("{}", failed.join("; "))
        }
    }
}

/// The labels of `verdict_quarantined_service_port` for one port.
fn quarantine_labels<'a>(family: &'a str, port: &'a ServicePortName) -> [&'a str; 4] {
    [
        family,
        &port.service.namespace,
        &port.service.name,
        &port.port,
    ]
}

/// Logs and counts the service ports a sync quarantined or tried again,
/// so that an operator finds them by name without reading nft's errors.
fn report_quarantine(
    metrics: &Mutex<Metrics>,
    events: Option<&std::sync::mpsc::Sender<Notice>>,
    family: &str,
    r: &verdict_proxier::SyncResult,
) {
    for port in &r.retried {
        record(metrics, |x| {
            x.remove(m::QUARANTINED, &quarantine_labels(family, port))
        });
        if !r.quarantined.iter().any(|(q, _)| q == port) {
            tracing::info!(
                ip_family = family,
                service_port = %port,
                "a quarantined service port changed and was programmed"
            );
        }
    }
    for (port, reason) in &r.quarantined {
        tracing::error!(
            ip_family = family,
            service_port = %port,
            %reason,
            "the kernel refused this service port: it is left out of the rules until it changes; everything else was programmed"
        );
        record(metrics, |x| {
            x.set(m::QUARANTINED, &quarantine_labels(family, port), 1.0);
            x.add(m::QUARANTINES_TOTAL, &[family], 1.0);
        });
        if let Some(tx) = events {
            let _ = tx.send(Notice {
                regarding: Regarding::Service {
                    namespace: port.service.namespace.to_string(),
                    name: port.service.name.to_string(),
                },
                warning: true,
                reason: "FailedToProgram",
                action: "Programming",
                note: format!(
                    "{family} port {port}: the kernel refused its rules, so it is not programmed on this node until the Service changes: {reason}"
                ),
            });
        }
    }
}

fn health_family(f: Family) -> HealthFamily {
    match f {
        Family::Ip => HealthFamily::V4,
        Family::Ip6 => HealthFamily::V6,
    }
}

/// Updates kube-proxy's metrics (a poisoned lock skips the update).
fn record(metrics: &Mutex<Metrics>, f: impl FnOnce(&mut Metrics)) {
    if let Ok(mut x) = metrics.lock() {
        f(&mut x);
    }
}

/// The registry, with the per-family counters visible from the start, the
/// build and the feature gates.
fn kube_proxy_metrics(settings: &Settings) -> Metrics {
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
    x
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The node as `run` would program it for the source's current state,
/// synced into memory (both families).
fn in_memory(settings: &Settings, source: &Source) -> anyhow::Result<(Node, MemoryBackend)> {
    let mut node = Node::new(settings)?;
    // What `run` would find out about this kernel; without the privilege
    // to dry-run, the script assumes every feature works.
    let probed = settings
        .nftables_backend
        .open()
        .map_err(anyhow::Error::from)
        .and_then(|mut backend| node.probe(backend.as_mut()));
    if let Err(e) = probed {
        tracing::warn!(
            error = %format!("{e:#}"),
            "cannot dry-run the ruleset here: the plan assumes every feature works (run would check)"
        );
    }
    let client = client_options(settings, &node.metrics);
    let mut feed = Feed::open(source, &node.name, client)?;
    let deadline = Instant::now() + PLAN_LIST_TIMEOUT;
    feed.poll(&mut node, Duration::ZERO)?;
    while !feed.ready() {
        if Instant::now() > deadline {
            bail!(
                "the API server did not list Services, EndpointSlices and the Node within {PLAN_LIST_TIMEOUT:?}"
            );
        }
        feed.poll(&mut node, Duration::from_millis(200))?;
    }
    // Whatever else arrived with the lists.
    while feed.poll(&mut node, Duration::from_millis(50))? {}
    let mut memory = MemoryBackend::new();
    node.sync(&mut memory, Instant::now(), true, "first sync")?;
    Ok((node, memory))
}

/// The nftables script `run` would program for the source's current
/// state, both families.
pub fn plan(settings: &Settings, source: &Source) -> anyhow::Result<String> {
    let (node, memory) = in_memory(settings, source)?;
    let mut out = String::new();
    for p in &node.proxiers {
        let c = p.config();
        out.push_str(&memory.dump(c.nft_family(), &c.table));
    }
    Ok(out)
}

/// kube-proxy's kernel floor for nftables mode, overridable as upstream.
fn check_kernel() -> anyhow::Result<()> {
    if std::env::var_os("KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK").is_some() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if !crate::probe::kernel_supported(&release) {
        bail!(
            "kernel {} is older than 5.13, which the nftables mode needs \
             (set KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK to try anyway)",
            release.trim()
        );
    }
    Ok(())
}

/// Programs the node and keeps it programmed. Returns only on error; on
/// SIGTERM the process ends and the rules stay, so traffic keeps flowing.
pub fn run(settings: &Settings, source: &Source, verbosity: &Verbosity) -> anyhow::Result<()> {
    check_kernel()?;
    crate::probe::check_net_admin()?;
    match verdict_admin::process::raise_open_files_limit() {
        Ok(limit) => tracing::debug!(limit, "open files"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the limit of open files"),
    }
    let mut node = Node::new(settings)?;
    tracing::info!(
        node = %node.name,
        addresses = ?node.local_ips,
        kernel = %std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "node facts"
    );
    // As kube-proxy, the API client comes first: a kubeconfig or --master
    // that cannot be used stops verdict before it changes anything.
    let client = client_options(settings, &node.metrics);
    let mut feed = Feed::open(source, &node.name, client.clone())?;
    let mut events = None;
    if source.manifests.is_none() {
        match verdict_k8s::events::start(&source.api(&node.name, client)) {
            Ok(e) => {
                node.events = Some(e.sender());
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
    let mut nft = verdict_nft::Counting::new(settings.nftables_backend.open().context("nftables")?);
    tracing::info!(backend = %settings.nftables_backend, node = %node.name, "starting");
    node.probe(&mut nft).context("startup check")?;
    tracing::info!("nftables dry run passed: the kernel accepts verdict's ruleset");
    crate::setup::apply(settings)?;
    node.live = Some(settings.nftables_backend.conntrack().context("conntrack")?);
    // The kernel announces every element of every commit to whoever
    // listens, and at 30,000 Services the first sync's announcements cost
    // the commit about as much as the elements themselves. So verdict
    // starts listening once its first full sync is in, and then asks the
    // ruleset's generation whether anyone committed in between. A backend
    // that cannot tell the generation (`nft`) listens from the start.
    let tables = our_tables(&node.proxiers);
    let mut foreign = None;
    let mut listening = false;
    if nft.generation().ok().flatten().is_none() {
        foreign = watch_foreign_changes(tables.clone());
        listening = true;
    }
    let min_sync_period = node.settings.min_sync_period;
    let sync_period = node.settings.sync_period;
    let (health, metrics) = (node.health.clone(), node.metrics.clone());
    // The sync loop and the introspection API share the node; the loop
    // holds it only to apply input and to sync, never while it waits.
    let node = Arc::new(Mutex::new(node));
    // kube-proxy's two servers; with bindAddressHardFail, one that cannot
    // listen stops verdict, after its Event.
    let mut servers: Vec<(SocketAddr, Routes, &str, &'static str, &str)> = Vec::new();
    let probes = Arc::new(crate::endpoints::ProbeCounts::default());
    if let Some(addr) = settings.healthz_bind_address {
        let routes = crate::endpoints::health_routes(health.clone(), probes.clone());
        servers.push((
            addr,
            routes,
            "/healthz and /livez",
            "FailedToStartProxierHealthcheck",
            "healthz server failed",
        ));
    }
    let counters = settings.service_counters.then(|| {
        api::CounterCache::new(node.clone(), api::kernel_reader(settings.nftables_backend))
    });
    if let Some(addr) = settings.metrics_bind_address {
        let site = crate::endpoints::MetricsSite {
            metrics: metrics.clone(),
            probes: probes.clone(),
            slis: Arc::new(Mutex::new(Metrics::slis())),
            api: Some(api::handler(
                settings.nftables_backend,
                node.clone(),
                api::kernel_reader(settings.nftables_backend),
                counters.clone(),
            )),
            more_metrics: counters.clone().map(api::CounterCache::metrics),
            configz: crate::config::render::configz(&settings.effective).to_string(),
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
            let mut node = lock(&node);
            node.notify(Notice {
                regarding: Regarding::Node,
                warning: true,
                reason,
                action: "StartKubeProxy",
                note: note.clone(),
            });
            // The poster finishes once every sender is gone.
            node.events = None;
            if let Some(e) = events.take() {
                e.close(EVENT_FLUSH);
            }
            bail!(note);
        }
    }
    let addresses = watch_addresses();
    let mut config_checked = Instant::now();
    let mut leftovers_pending = true;

    let mut schedule = Schedule::new(min_sync_period, sync_period);
    // The ruleset's generation after verdict's last successful sync.
    let mut synced_generation: Option<u32> = None;
    let mut wait = POLL;
    loop {
        let applied = match feed.wait(wait) {
            Ok(input) => feed.apply(&mut lock(&node), input),
            Err(e) => Err(e),
        };
        match applied {
            Ok(true) => {
                schedule.changed();
                // As kube-proxy, changes count as queued (for /healthz)
                // only once the initial lists are in.
                if feed.ready() {
                    lock(&node).queued();
                }
            }
            Ok(false) => {}
            Err(e) if matches!(feed, Feed::Api { .. }) => return Err(e),
            Err(e) => tracing::error!(error = %format!("{e:#}"), "cannot use the manifests"),
        }
        for event in foreign
            .as_ref()
            .map(|rx| rx.try_iter())
            .into_iter()
            .flatten()
        {
            lock(&node).foreign_change(&event);
            schedule.foreign(Instant::now());
        }
        if addresses
            .as_ref()
            .is_some_and(|rx| rx.try_iter().count() > 0)
            && lock(&node).refresh_addresses()
        {
            schedule.changed();
        }
        if config_checked.elapsed() >= CONFIG_CHECK {
            config_checked = Instant::now();
            if let Some((path, text)) = &source.config_file
                && std::fs::read_to_string(path).is_ok_and(|now| now != *text)
            {
                bail!(
                    "content of the proxy server's configuration file was updated ({path}): exiting so that it is read again"
                );
            }
        }
        if !feed.ready() {
            // As kube-proxy: nothing is programmed before the initial lists.
            continue;
        }
        let now = Instant::now();
        let (full, why) = match schedule.due(now) {
            Due::Wait(until) => {
                wait = until.map_or(POLL, |t| {
                    t.saturating_duration_since(now)
                        .clamp(Duration::from_millis(1), POLL)
                });
                continue;
            }
            Due::Partial => (false, None),
            Due::Full(why) => (true, Some(why)),
        };
        wait = POLL;
        if why == Some(Why::Periodic) {
            // Nothing was committed since verdict's last sync, and the
            // listener would have said so: the tables are what verdict
            // wrote, and reading them back (seconds at 100,000 Services)
            // would find nothing to repair. Changes waiting for a sync
            // still get their partial sync on the next turn.
            let current = nft.generation().ok().flatten();
            if schedule::resync_unneeded(
                foreign.is_some(),
                synced_generation,
                current,
                schedule.since_read_back(now),
                verdict_proxier::proxier::FULL_SYNC_PERIOD,
            ) {
                lock(&node)
                    .resync_unneeded(current.unwrap_or_default(), schedule.changes_pending());
                schedule.resync_left_out(now);
                if schedule.changes_pending() {
                    wait = Duration::ZERO;
                }
                continue;
            }
        }
        let trigger = why.map_or("change", Why::as_str);
        let (before, commits) = if listening {
            (None, nft.commits())
        } else {
            (nft.generation().ok().flatten(), nft.commits())
        };
        let result = lock(&node).sync(&mut nft, now, full, trigger);
        if !listening && full && result.is_ok() {
            foreign = watch_foreign_changes(tables.clone());
            listening = true;
            let after = nft.generation().ok().flatten();
            let ours = nft.commits().wrapping_sub(commits);
            if foreign.is_some() && schedule::missed_commits(before, ours, after) {
                tracing::info!(
                    ?before,
                    ?after,
                    ours,
                    "the ruleset changed while verdict was not yet listening: repairing"
                );
                schedule.foreign(Instant::now());
            }
        }
        synced_generation = match &result {
            Ok(()) => nft.generation().ok().flatten(),
            Err(_) => None,
        };
        if full {
            verdict_proxier::proxier::settle_allocator();
        }
        if let Err(e) = &result {
            tracing::error!(error = %format!("{e:#}"), "sync failed; retrying with backoff, and new changes still go through");
        }
        schedule.synced(now, full, result.is_ok());
        // What kube-proxy's iptables and IPVS modes (and, for verdict, its
        // nftables mode) left would still act on Service traffic: remove it
        // once verdict's rules serve every Service, so the swap drops no
        // traffic, as kube-proxy removes the other modes' state when it
        // starts in one.
        if leftovers_pending && full && result.is_ok() {
            leftovers_pending = false;
            for problem in crate::leftovers::cleanup(source.keep_kube_proxy_nftables, &mut nft) {
                tracing::warn!(%problem, "cleaning up kube-proxy's leftovers");
            }
        }
    }
}

/// The API source `run` would use, for `verdict doctor`'s questions.
pub fn api_source(settings: &Settings, source: &Source, node: &str) -> ApiSource {
    let metrics = Arc::new(Mutex::new(Metrics::new()));
    source.api(node, client_options(settings, &metrics))
}

/// The node, whoever held it last (a panic while holding it leaves it
/// usable: every change to it is made whole before the lock is released).
fn lock(node: &Mutex<Node>) -> std::sync::MutexGuard<'_, Node> {
    node.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often `--config` is read again to notice a change.
const CONFIG_CHECK: Duration = Duration::from_secs(1);
/// How long a fatal error waits for its Event to be posted.
const EVENT_FLUSH: Duration = Duration::from_secs(5);

/// How long the loop waits for input at most: a foreign change is noticed
/// within this (plus the debounce).
const POLL: Duration = Duration::from_millis(100);

/// `--init-only`: the privileged settings (conntrack sysctls), then exit,
/// so that the long-running process needs only CAP_NET_ADMIN.
pub fn init_only(settings: &Settings) -> anyhow::Result<()> {
    crate::probe::check_net_admin()?;
    crate::setup::apply(settings)?;
    tracing::info!("--init-only: conntrack settings applied");
    Ok(())
}

/// Removes verdict's tables (both families) and kube-proxy's state: its
/// iptables and IPVS leftovers and, unless kept, its nftables tables.
pub fn cleanup(settings: &Settings, source: &Source) -> anyhow::Result<()> {
    let mut nft = settings.nftables_backend.open().context("nftables")?;
    for family in [Family::Ip, Family::Ip6] {
        // Deleted whatever it holds: a table that is not there is refused
        // as not found.
        let mut tx = Transaction::new(family, verdict_proxier::config::DEFAULT_TABLE);
        tx.delete_table();
        match nft.run(&tx) {
            Ok(()) => {
                tracing::info!(%family, "deleted table {}", verdict_proxier::config::DEFAULT_TABLE)
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let problems = crate::leftovers::cleanup(source.keep_kube_proxy_nftables, nft.as_mut());
    if !problems.is_empty() {
        bail!(
            "cleanup of kube-proxy's leftovers failed: {}",
            problems.join("; ")
        );
    }
    Ok(())
}
