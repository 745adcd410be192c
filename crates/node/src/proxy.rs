//! The node's proxy: both families' planes, the objects they were built
//! from, the node's facts, and what a sync means for health, metrics,
//! history and the read model. Owned by one writer (the run loop, or
//! `plan` and the offline commands building a node in memory); readers see
//! only the read model it publishes ([`NodeHandle`]).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use verdict_admin::time::Moment;

use verdict_admin::metrics as m;
use verdict_admin::{Family as HealthFamily, Health, Metrics};
use verdict_k8s::NodeInfo;
use verdict_k8s::events::{Notice, Regarding};
use verdict_k8s::watch::Update;
use verdict_model::{
    AddressType, EndpointSlice, IpFamily, NamespacedName, Service, ServicePortName,
};
use verdict_nft::conntrack::Conntrack;
use verdict_nft::{Backend, Family, NftError};
use verdict_proxier::{LocalDetector, Proxier, ProxierConfig, SyncResult};

use crate::error::NodeError;
use crate::family::{FamilyPlane, Touched, UdpCleanup};
use crate::history::{self, ForeignRecord, SyncRecord};
use crate::input::{Foreign, Table};
use crate::outcome::{self, After, HealthChange};
use crate::settings::{DetectLocal, NodeSettings};
use crate::view::NodeHandle;

/// Where the node's own addresses come from: rtnetlink on a node, a
/// fixed list in tests.
pub trait NodeAddresses: Send + Sync {
    /// Every address on the node's interfaces.
    fn addresses(&self) -> Result<Vec<IpAddr>, NftError>;
}

/// The addresses of the caller's network namespace, over rtnetlink.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelAddresses;

impl NodeAddresses for KernelAddresses {
    fn addresses(&self) -> Result<Vec<IpAddr>, NftError> {
        verdict_nft::addresses::local_addresses()
    }
}

/// A fixed list of addresses.
#[derive(Clone, Debug, Default)]
pub struct FixedAddresses(pub Vec<IpAddr>);

impl NodeAddresses for FixedAddresses {
    fn addresses(&self) -> Result<Vec<IpAddr>, NftError> {
        Ok(self.0.clone())
    }
}

/// The node's addresses as NodePorts may use them: sorted, without IPv6
/// link-local ones (they cannot take NodePorts without a scope, and every
/// pod interface adds one).
fn node_addresses(source: &dyn NodeAddresses) -> Result<Vec<IpAddr>, NodeError> {
    let mut ips = source
        .addresses()
        .map_err(|e| NodeError::kernel("listing the node's addresses (RTM_GETADDR)", e))?;
    ips.retain(|ip| !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()));
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// The configuration of one family's proxier.
fn proxier_config(
    family: IpFamily,
    settings: &NodeSettings,
    node: &NodeInfo,
    local_ips: &[IpAddr],
    service_cidrs: &[ipnet::IpNet],
) -> Result<ProxierConfig, NodeError> {
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
    c.node_port_addresses = settings.node_ports.clone();
    c.counters = settings.service_counters;
    c.metrics = settings.service_metrics.clone();
    c.flow_log_group = settings.flow_log_group;
    c.validate()?;
    Ok(c)
}

/// The health label of an nftables family.
pub(crate) fn health_family(f: Family) -> HealthFamily {
    match f {
        Family::Ip => HealthFamily::V4,
        Family::Ip6 => HealthFamily::V6,
    }
}

/// Seconds since the epoch.
pub(crate) fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Updates the metrics (a poisoned lock is taken over: every update is
/// whole).
pub(crate) fn record(metrics: &Mutex<Metrics>, f: impl FnOnce(&mut Metrics)) {
    let mut x = metrics.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut x);
}

fn health(h: &Mutex<Health>) -> std::sync::MutexGuard<'_, Health> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the work after a sync may touch on the host: the conntrack table
/// and the service health-check node ports. `plan` and the offline
/// commands leave the host alone.
pub enum Host<'a> {
    /// A node: clean stale UDP entries, serve health-check node ports.
    Node(&'a mut dyn Conntrack),
    /// In memory: neither.
    Memory,
}

/// What the node remembers of an EndpointSlice it was given.
#[derive(Clone, Debug)]
struct SliceSeen {
    /// The fingerprint of the whole object.
    print: u64,
    /// Its Service (the `kubernetes.io/service-name` label), and its
    /// address type: what the proxiers need of it when it is deleted.
    service_name: Option<String>,
    address_type: AddressType,
}

/// Both families' proxiers, fed from the manifests or the Kubernetes API.
pub struct NodeProxy {
    settings: NodeSettings,
    info: NodeInfo,
    /// The CIDRs of the ServiceCIDR objects.
    service_cidrs: Vec<ipnet::IpNet>,
    local_ips: Vec<IpAddr>,
    planes: Vec<FamilyPlane>,
    /// A fingerprint of each Service as last given, by a fingerprint of
    /// its namespace and name, to drop updates that change nothing: the
    /// proxiers keep what they need of the previous object, so neither it
    /// nor its name is kept here. B-trees rebuilt in one piece after a
    /// batch that at least doubles them (`verdict_model::compact`): 2.6
    /// MiB at 30,000 Services, where hash tables with twice as many slots
    /// as entries took 6.1.
    services: BTreeMap<u128, u64>,
    /// The same for each EndpointSlice, with what a deletion must name.
    slices: BTreeMap<u128, SliceSeen>,
    /// The fingerprints' keyed hashes (SipHash with keys of this
    /// process's own: no object or name can be crafted to collide with
    /// another). Names get 128 bits.
    prints: [RandomState; 2],
    /// Families whose kernel cannot record session affinity (startup probe).
    no_affinity: Vec<IpFamily>,
    /// With the Kubernetes source: where Events go.
    events: Option<SyncSender<Notice>>,
    /// What the readers see.
    view: NodeHandle,
    /// Everything has been listed once: the node may be programmed.
    ready: bool,
    /// When the node started tracking changes: trigger times before it
    /// are not counted as programming latency.
    tracking_since: SystemTime,
}

impl NodeProxy {
    /// A node of this name and these settings; `metrics` is the registry
    /// `/metrics` serves. Nothing is programmed until [`NodeProxy::sync`].
    pub fn new(
        settings: NodeSettings,
        metrics: Arc<Mutex<Metrics>>,
        addresses: &dyn NodeAddresses,
    ) -> Result<NodeProxy, NodeError> {
        if settings.node_name.is_empty() {
            return Err(NodeError::NoNodeName);
        }
        let info = NodeInfo {
            name: settings.node_name.clone(),
            ..NodeInfo::default()
        };
        let local_ips = node_addresses(addresses)?;
        let mut planes = Vec::new();
        for f in [IpFamily::V4, IpFamily::V6] {
            let c = proxier_config(f, &settings, &info, &local_ips, &[])?;
            if c.local_detector == LocalDetector::None {
                tracing::info!(family = %f, "no local-traffic detector for this family: ClusterIP traffic is not masqueraded");
            }
            planes.push(FamilyPlane::new(Proxier::new(c)?));
        }
        let view = NodeHandle::new(
            Arc::new(Mutex::new(Health::new(2 * settings.sync_period))),
            metrics,
        );
        let node = NodeProxy {
            settings,
            info,
            service_cidrs: Vec::new(),
            local_ips,
            planes,
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            prints: [RandomState::new(), RandomState::new()],
            no_affinity: Vec::new(),
            events: None,
            view,
            ready: false,
            tracking_since: SystemTime::now(),
        };
        node.publish_node();
        Ok(node)
    }

    /// Posts Events through `events` from now on (the Kubernetes source).
    pub fn set_events(&mut self, events: Option<SyncSender<Notice>>) {
        self.events = events;
    }

    /// What readers see of this node.
    pub fn handle(&self) -> NodeHandle {
        self.view.clone()
    }

    /// The settings.
    pub fn settings(&self) -> &NodeSettings {
        &self.settings
    }

    /// The node's addresses.
    pub fn local_ips(&self) -> &[IpAddr] {
        &self.local_ips
    }

    /// Everything has been listed once.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// The families' proxiers.
    pub fn proxiers(&self) -> impl Iterator<Item = &Proxier> {
        self.planes.iter().map(|p| &p.proxier)
    }

    /// The families' planes.
    pub fn planes(&self) -> &[FamilyPlane] {
        &self.planes
    }

    /// verdict's tables, one per family.
    pub fn tables(&self) -> Vec<Table> {
        self.proxiers().map(|p| p.config().nft_table()).collect()
    }

    /// Posts an Event (with the Kubernetes source).
    pub fn notify(&self, notice: Notice) {
        if let Some(tx) = &self.events {
            // A full queue drops it (as client-go's broadcaster does).
            let _ = tx.try_send(notice);
        }
    }

    fn metrics(&self) -> &Arc<Mutex<Metrics>> {
        self.view.metrics()
    }

    fn health(&self) -> &Arc<Mutex<Health>> {
        self.view.health()
    }

    /// The pending-changes gauges (the most any family has pending).
    fn set_pending(&self) {
        let services = self.proxiers().map(Proxier::pending_service_changes).max();
        let endpoints = self.proxiers().map(Proxier::pending_endpoint_changes).max();
        record(self.metrics(), |x| {
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
    pub fn queued(&self) {
        let now = Moment::now();
        {
            let mut h = health(self.health());
            h.queued_update(HealthFamily::V4, now);
            h.queued_update(HealthFamily::V6, now);
        }
        let secs = unix_seconds(now.wall);
        record(self.metrics(), |x| {
            for f in ["IPv4", "IPv6"] {
                x.set(m::LAST_QUEUED, &[f], secs);
            }
        });
    }

    /// Another process changed verdict's tables (or announcements were
    /// lost): says what, counts it, and marks the families broken until
    /// the repair.
    pub fn foreign_change(&mut self, event: &Foreign) {
        let now = Moment::now();
        let (families, record_of) = match event {
            Foreign::Overflow => {
                tracing::warn!(
                    "ruleset announcements were lost (the kernel's buffer overflowed): resyncing both families in full"
                );
                (
                    vec![HealthFamily::V4, HealthFamily::V6],
                    ForeignRecord {
                        at: now.wall,
                        process: None,
                        changes: 0,
                        sample: Vec::new(),
                    },
                )
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
                        if c.family == Family::Ip6.as_str() {
                            HealthFamily::V6
                        } else {
                            HealthFamily::V4
                        }
                    })
                    .collect();
                f.sort();
                f.dedup();
                let (n, sample) = history::sample(changes.iter().map(ToString::to_string));
                (
                    f,
                    ForeignRecord {
                        at: now.wall,
                        process: Some((process.clone(), *pid)),
                        changes: n,
                        sample,
                    },
                )
            }
        };
        self.view.history().foreign(record_of);
        for f in families {
            let label = f.to_string();
            record(self.metrics(), |x| {
                x.add(m::FOREIGN_CHANGES, &[&label], 1.0)
            });
            health(self.health()).broken(f, now);
        }
    }

    /// Rebuilds the proxiers' configurations from the node facts.
    fn reconfigure(&mut self) -> Result<(), NodeError> {
        for plane in &mut self.planes {
            let p = &mut plane.proxier;
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
    /// sync). The proxiers are reconfigured, which brings a full sync,
    /// only when the addresses that take NodePorts changed: a pod's
    /// interface coming or going changes nothing. Returns whether they
    /// did.
    pub fn refresh_addresses(&mut self, source: &dyn NodeAddresses) -> bool {
        let now = match node_addresses(source) {
            Ok(ips) => ips,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the node's addresses; keeping the last ones");
                return false;
            }
        };
        if now == self.local_ips {
            return false;
        }
        let moved = self.proxiers().any(|p| {
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
            tracing::error!(error = %e, "cannot use the node's new addresses");
            self.local_ips = before;
            let _ = self.reconfigure();
            return false;
        }
        true
    }

    /// Dry-runs every family's probe ruleset through the backend and turns
    /// session affinity off for the families it cannot program.
    pub fn probe(&mut self, backend: &mut dyn Backend) -> Result<(), NodeError> {
        let configs: Vec<&ProxierConfig> = self.proxiers().map(Proxier::config).collect();
        self.no_affinity = crate::probe::probe_nftables(backend, &configs)?;
        self.reconfigure()
    }

    /// This node's Node object changed (`Some`) or was deleted (`None`).
    /// A deleted Node, or one being deleted, takes no load-balancer
    /// traffic (`/healthz` answers 503). Returns whether the rules must
    /// change.
    fn set_node(&mut self, node: Option<&NodeInfo>) -> Result<bool, NodeError> {
        let eligible = node.is_some_and(|n| !n.being_deleted);
        health(self.health()).set_node_eligible(eligible);
        let Some(me) = node else {
            tracing::warn!(node = %self.settings.node_name, "this node's Node object was deleted");
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
    fn set_service_cidrs(&mut self, cidrs: &[ipnet::IpNet]) -> Result<bool, NodeError> {
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
    /// The 128-bit fingerprint of an object's namespace and name.
    fn name_print(&self, key: &(String, String)) -> u128 {
        let [a, b] = &self.prints;
        (u128::from(a.hash_one(key)) << 64) | u128::from(b.hash_one(key))
    }

    fn set_service(&mut self, key: (String, String), new: Option<Service>) -> bool {
        let print = new.as_ref().map(|s| self.prints[0].hash_one(s));
        let id = self.name_print(&key);
        let old = self.services.get(&id).copied();
        if old == print {
            return false;
        }
        // As kube-proxy, whose change tracker of each family counts the
        // event: twice on a dual-stack node.
        let trackers = self.planes.len() as f64;
        record(self.metrics(), |x| {
            x.add(m::SERVICE_CHANGES_TOTAL, &[], trackers)
        });
        let what = match (old.is_some(), new.is_some()) {
            (false, _) => "added",
            (true, true) => "changed",
            (true, false) => "deleted",
        };
        // One line per object: at V(4), as kube-proxy logs them.
        tracing::trace!(service = %format!("{}/{}", key.0, key.1), "Service {what}");
        let name = NamespacedName::new(key.0.as_str(), key.1.as_str());
        let mut changed = false;
        for plane in &mut self.planes {
            changed |= plane.proxier.on_service_named(name.clone(), new.as_ref());
        }
        match print {
            Some(p) => self.services.insert(id, p),
            None => self.services.remove(&id),
        };
        changed
    }

    /// An EndpointSlice was added, changed (`Some`) or deleted (`None`).
    fn set_slice(&mut self, key: (String, String), new: Option<EndpointSlice>) -> bool {
        let print = new.as_ref().map(|s| self.prints[0].hash_one(s));
        let id = self.name_print(&key);
        let old = self.slices.get(&id).cloned();
        if old.as_ref().map(|o| o.print) == print {
            return false;
        }
        // As kube-proxy: counted by the change tracker of the slice's
        // address family (an FQDN slice by none).
        let address_type = new
            .as_ref()
            .map(|s| s.address_type)
            .or(old.as_ref().map(|o| o.address_type));
        let slice_family = address_type.and_then(|t| match t {
            AddressType::IPv4 => Some(IpFamily::V4),
            AddressType::IPv6 => Some(IpFamily::V6),
            _ => None,
        });
        let trackers = self
            .planes
            .iter()
            .filter(|p| Some(p.proxier.config().family) == slice_family)
            .count() as f64;
        if trackers > 0.0 {
            record(self.metrics(), |x| {
                x.add(m::ENDPOINT_CHANGES_TOTAL, &[], trackers)
            });
        }
        tracing::trace!(
            endpoint_slice = %format!("{}/{}", key.0, key.1),
            endpoints = new.as_ref().map_or(0, |s| s.endpoints.len()),
            "EndpointSlice {}",
            if new.is_some() { "updated" } else { "deleted" }
        );
        // A deleted slice as the proxiers need it: which it was, and whose.
        let gone = match (&old, &new) {
            (Some(o), None) => Some(EndpointSlice {
                namespace: key.0.clone(),
                name: key.1.clone(),
                service_name: o.service_name.clone(),
                address_type: o.address_type,
                ..EndpointSlice::default()
            }),
            _ => None,
        };
        let mut changed = false;
        for plane in &mut self.planes {
            let p = &mut plane.proxier;
            changed |= match (&gone, &new) {
                (_, Some(n)) => p.on_endpoint_slice(n, false),
                (Some(o), None) => p.on_endpoint_slice(o, true),
                (None, None) => false,
            };
        }
        match (new, print) {
            (Some(n), Some(print)) => {
                let seen = SliceSeen {
                    print,
                    service_name: n.service_name,
                    address_type: n.address_type,
                };
                self.slices.insert(id, seen)
            }
            _ => self.slices.remove(&id),
        };
        changed
    }

    /// Reads each family's table before the source has listed anything,
    /// for the first sync to adopt without reading it again
    /// ([`Proxier::prefetch_table`]).
    pub fn prefetch_tables<B: Backend + ?Sized>(&mut self, backend: &mut B) {
        for plane in &mut self.planes {
            plane.proxier.prefetch_table(backend);
        }
    }

    /// What [`NodeProxy::prefetch_tables`] reads, to read it elsewhere:
    /// each family's table.
    pub fn tables_to_read(&self) -> Vec<Table> {
        self.tables()
    }

    /// Hands each family the read of its table made elsewhere, in the
    /// order of [`NodeProxy::tables_to_read`].
    pub fn set_prefetched(&mut self, reads: Vec<Option<verdict_proxier::proxier::Prefetched>>) {
        for (plane, read) in self.planes.iter_mut().zip(reads) {
            plane.proxier.set_prefetched(read);
        }
    }

    /// Applies a batch of updates from the source. Returns whether the
    /// rules must change. A Node or ServiceCIDR that cannot be used is
    /// logged and skipped; the rest keeps working.
    pub fn apply(&mut self, updates: Vec<Update>) -> bool {
        let mut changed = false;
        // (An initial list comes in batches as it is listed: the node's
        // maps are compacted once it is all in.)
        let mut compact =
            verdict_model::worth_compacting(updates.len(), self.services.len() + self.slices.len());
        for u in updates {
            changed |= match u {
                Update::Service(key, s) => self.set_service(key, s),
                Update::Slice(key, s) => self.set_slice(key, s),
                Update::Node(n) => self.set_node(n.as_ref()).unwrap_or_else(|e| {
                    tracing::error!(error = %e, "cannot use this node's Node object");
                    false
                }),
                Update::ServiceCidrs(c) => self.set_service_cidrs(&c).unwrap_or_else(|e| {
                    tracing::error!(error = %e, "cannot use the ServiceCIDRs");
                    false
                }),
                Update::Pod((namespace, name), p) => {
                    // Names for the flow stream; no rule depends on them.
                    self.view.publish_pod(&namespace, &name, p);
                    false
                }
                Update::Synced => {
                    if !self.ready {
                        tracing::info!(
                            "Services and EndpointSlices are listed: programming the node"
                        );
                        compact = true;
                    }
                    self.ready = true;
                    true
                }
            };
        }
        if compact {
            verdict_model::compact(&mut self.services);
            verdict_model::compact(&mut self.slices);
        }
        self.set_pending();
        for plane in &mut self.planes {
            for e in plane.proxier.take_errors() {
                tracing::error!(error = %e, "service ignored");
            }
        }
        changed
    }

    /// A periodic resync found the ruleset as verdict's last sync left it
    /// (`generation`) and read nothing: with no change waiting
    /// (`pending`), it counts as a sync that had nothing to do, for health
    /// and `last_timestamp`; the history records it either way.
    pub fn resync_unneeded(&mut self, generation: u32, pending: bool) {
        let now = Moment::now();
        tracing::debug!(
            generation,
            pending,
            "periodic resync: nothing was committed since the last sync; the tables were not read"
        );
        for p in self.proxiers() {
            let family = p.config().nft_family();
            let label = health_family(family).to_string();
            if !pending {
                health(self.health()).updated(health_family(family), now);
                record(self.metrics(), |x| {
                    x.set(m::LAST_SYNC, &[label.as_str()], unix_seconds(now.wall))
                });
            }
            self.view.history().sync(SyncRecord {
                at: now.wall,
                family: family.into(),
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

    /// Syncs both families (`full`: comparing everything with the kernel),
    /// then does the work after each sync on `host` and publishes what
    /// changed to the read model. A family that fails does not keep the
    /// other from syncing; the error names every family that failed.
    pub fn sync<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        mut host: Host<'_>,
        addresses: &dyn NodeAddresses,
        now: Instant,
        full: bool,
        trigger: &'static str,
    ) -> Result<(), NodeError> {
        if full && matches!(host, Host::Node(_)) {
            self.refresh_addresses(addresses);
        }
        let mut failed: Vec<String> = Vec::new();
        let mut touched: BTreeSet<NamespacedName> = BTreeSet::new();
        let mut everything = false;
        for i in 0..self.planes.len() {
            let (result, after) = self.sync_family(i, backend, full, trigger, now, &mut failed);
            let Ok(r) = result else {
                continue;
            };
            if r.rebuilt {
                everything = true;
            } else {
                touched.extend(r.updated_services.iter().cloned());
            }
            if let Host::Node(ct) = &mut host {
                self.after_sync(i, &r, after, &mut **ct);
            }
        }
        self.set_pending();
        self.publish(everything, &touched);
        if failed.is_empty() {
            Ok(())
        } else {
            Err(NodeError::Sync(failed.join("; ")))
        }
    }

    /// One family's sync, and what it means for the metrics, health and
    /// history.
    fn sync_family<B: Backend + ?Sized>(
        &mut self,
        i: usize,
        backend: &mut B,
        full: bool,
        trigger: &'static str,
        now: Instant,
        failed: &mut Vec<String>,
    ) -> (Result<SyncResult, ()>, After) {
        let plane = &mut self.planes[i];
        let p = &mut plane.proxier;
        let family = p.config().nft_family();
        let label = health_family(family).to_string();
        let started = Moment::now();
        if full {
            p.force_full_sync();
        }
        let result = p.sync(backend, now);
        let outcome = outcome::decide(&outcome::Finished {
            family: family.into(),
            label: &label,
            requested_full: full,
            trigger,
            started,
            took: started.mono.elapsed(),
            ended: Moment::now(),
            result: result.as_ref(),
            udp_pending: plane.udp.pending(),
            tracking_since: self.tracking_since,
        });
        if let Ok(r) = &result {
            let left_out = |port: &ServicePortName| p.conflicts().any(|c| c.loser == *port);
            report_quarantine(
                self.view.metrics(),
                self.events.as_ref(),
                &label,
                r,
                &left_out,
            );
            tracing::debug!(
                %family,
                full = r.full,
                operations = r.operations,
                staged = r.staged,
                unstaged = r.unstaged,
                elapsed = ?outcome.record.took,
                services = r.updated_services.len(),
                "synced"
            );
        }
        record(self.view.metrics(), |x| {
            for change in &outcome.metrics {
                change.apply(x);
            }
        });
        self.view.history().sync(outcome.record);
        {
            let mut h = health(self.view.health());
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
        (result.map_err(|_| ()), outcome.after)
    }

    /// The work after one family's sync: the health-check node ports and
    /// stale UDP conntrack, for what the sync touched (O(changed), as the
    /// sync itself).
    fn after_sync(&mut self, i: usize, r: &SyncResult, after: After, ct: &mut dyn Conntrack) {
        let touched = match after {
            After::Nothing => return,
            After::All => Touched::All,
            After::Touched => Touched::These(&r.updated_services),
        };
        let t = Instant::now();
        let health = self.view.health().clone();
        let metrics = self.view.metrics().clone();
        let plane = &mut self.planes[i];
        let family = plane.proxier.config().nft_family();
        let fam = [health_family(family).to_string()];
        let fam = [fam[0].as_str()];
        plane.udp_touched(touched);
        plane.sync_health_checks(
            &health,
            touched,
            self.events.as_ref(),
            &self.settings.node_name,
        );
        let checked = match plane.clean_stale_udp(ct) {
            Ok(UdpCleanup::Nothing) => 0,
            Ok(UdpCleanup::NotNeeded { targets }) => targets,
            Ok(UdpCleanup::Cleaned {
                targets,
                deleted,
                took,
            }) => {
                record(&metrics, |x| {
                    x.observe(m::CONNTRACK_DURATION, &fam, took.as_secs_f64());
                    x.add(m::CONNTRACK_DELETED, &fam, deleted as f64);
                });
                targets
            }
            // The services stay pending: the next sync tries again.
            Err(e) => {
                tracing::warn!(%family, error = %e, "stale UDP conntrack cleanup failed");
                0
            }
        };
        let unanswered = match plane.clean_unanswered(ct) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(%family, error = %e, "the conntrack cleanup of unanswered connections failed");
                0
            }
        };
        if unanswered > 0 {
            record(&metrics, |x| {
                x.add(m::CONNTRACK_DELETED, &fam, unanswered as f64)
            });
        }
        tracing::debug!(
            %family,
            services = r.updated_services.len(),
            udp_targets = checked,
            unanswered,
            elapsed = ?t.elapsed(),
            "after the sync: health-check ports and UDP conntrack"
        );
    }

    /// Publishes the families and the Services a sync touched (every one
    /// after a rebuild) to the read model.
    fn publish(&self, everything: bool, touched: &BTreeSet<NamespacedName>) {
        let proxiers: Vec<&Proxier> = self.proxiers().collect();
        self.view
            .publish(&proxiers, (!everything).then_some(touched), &self.local_ips);
    }

    fn publish_node(&self) {
        let proxiers: Vec<&Proxier> = self.proxiers().collect();
        self.view
            .publish(&proxiers, Some(&BTreeSet::new()), &self.local_ips);
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
    events: Option<&SyncSender<Notice>>,
    family: &str,
    r: &SyncResult,
    left_out: &dyn Fn(&ServicePortName) -> bool,
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
            "the kernel refused elements of this service port: they are left out of the rules until its Service or endpoints change; everything else was programmed"
        );
        record(metrics, |x| {
            x.set(m::QUARANTINED, &quarantine_labels(family, port), 1.0);
            x.add(m::QUARANTINES_TOTAL, &[family], 1.0);
        });
        if let Some(tx) = events {
            let _ = tx.try_send(Notice {
                regarding: Regarding::Service {
                    namespace: port.service.namespace.to_string(),
                    name: port.service.name.to_string(),
                },
                warning: true,
                reason: "FailedToProgram",
                action: "Programming",
                note: format!(
                    "{family} port {port}: {reason}; left out on this node until the Service or its endpoints change, everything else of it is programmed"
                ),
            });
        }
    }
    for c in &r.conflicts_resolved {
        // Gone, or the loser now holds it: the gauge goes once no other
        // destination of the port is held by another Service.
        if !left_out(&c.loser) {
            record(metrics, |x| {
                x.remove(
                    m::DESTINATION_CONFLICTS,
                    &quarantine_labels(family, &c.loser),
                )
            });
        }
        tracing::info!(
            ip_family = family,
            service_port = %c.loser,
            destination = %c.destination,
            "a destination conflict ended"
        );
    }
    for c in &r.conflicts {
        tracing::warn!(
            ip_family = family,
            service_port = %c.loser,
            holder = %c.winner,
            destination = %c.destination,
            "{c}"
        );
        record(metrics, |x| {
            x.set(
                m::DESTINATION_CONFLICTS,
                &quarantine_labels(family, &c.loser),
                1.0,
            )
        });
        if let Some(tx) = events {
            let _ = tx.try_send(Notice {
                regarding: Regarding::Service {
                    namespace: c.loser.service.namespace.to_string(),
                    name: c.loser.service.name.to_string(),
                },
                warning: true,
                reason: "DestinationConflict",
                action: "Programming",
                note: format!("{family} port {}: {c}", c.loser),
            });
        }
    }
}
