//! The read model: what the node's readers (the introspection API, the
//! web view, `/metrics`, health, the offline commands) see of it. Only
//! the run loop writes it, after each sync and only for what the sync
//! touched; readers take a lock held just long enough to clone an `Arc`
//! or walk a page, never across a kernel read or a sync. So a reader
//! never waits for the kernel, and the kernel never waits for a reader.
//!
//! Per Service there is one [`ServiceView`]: its ports in each family as
//! the last sync left them (the service port and its endpoints shared with
//! the proxier, what the port asks of the table, whether it is
//! quarantined). Beside them, two indexes that the answers about a packet
//! or a connection need: the Services by address and by NodePort.
//!
//! Compare kube-rs' reflector (`Writer` exclusive, `Store::get` returning
//! an `Arc`): a view is replaced whole, never changed in place.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use verdict_admin::{Health, Metrics};
use verdict_model::{
    Endpoint, IpFamily, Name, NamespacedName, Pod, ServicePort, ServicePortName, Workload,
};
use verdict_proxier::{Intent, Proxier, ProxierConfig};

use crate::history::History;

/// One port of a Service in one family, as the last sync left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortView {
    /// Its name.
    pub name: ServicePortName,
    /// The service port (shared with the proxier).
    pub port: Arc<ServicePort>,
    /// Its endpoints (shared with the proxier).
    pub endpoints: Arc<[Endpoint]>,
    /// What it asks of the table (none while quarantined).
    pub intent: Option<Intent>,
    /// Why the kernel refused it, while it is quarantined.
    pub quarantined: Option<String>,
}

/// A Service in one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFamily {
    /// The family.
    pub family: IpFamily,
    /// Its ports.
    pub ports: Vec<PortView>,
    /// Quarantined ports the Service no longer has, with the reason.
    pub quarantined_gone: Vec<(ServicePortName, String)>,
}

/// A Service as the node proxies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    /// Its name.
    pub name: NamespacedName,
    /// The families it has ports in.
    pub families: Vec<ServiceFamily>,
}

impl ServiceView {
    /// The Service as the proxiers have it now (`None`: no family has it).
    pub fn build(name: &NamespacedName, proxiers: &[&Proxier]) -> Option<ServiceView> {
        // Views are kept for every Service (30,000 and more): each list
        // holds what it has and no spare room (a collected or pushed
        // vector starts with room for four).
        let mut families = Vec::with_capacity(proxiers.len());
        for p in proxiers {
            let mut intents: BTreeMap<ServicePortName, Intent> =
                p.intent_of(name).into_iter().collect();
            let mut ports: Vec<PortView> = p
                .service_ports()
                .range(ServicePortName::first_of(name)..)
                .take_while(|(k, _)| k.service == *name)
                .map(|(k, sp)| PortView {
                    name: k.clone(),
                    port: sp.clone(),
                    endpoints: p
                        .endpoints()
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| Arc::from([])),
                    intent: intents.remove(k),
                    quarantined: p.quarantined().get(k).map(|q| q.reason.clone()),
                })
                .collect();
            let quarantined_gone: Vec<(ServicePortName, String)> = p
                .quarantined_ports_of(name)
                .filter(|q| !ports.iter().any(|port| port.name == **q))
                .map(|q| (q.clone(), p.quarantined()[q].reason.clone()))
                .collect();
            if ports.is_empty() && quarantined_gone.is_empty() {
                continue;
            }
            ports.shrink_to_fit();
            families.push(ServiceFamily {
                family: p.config().family,
                ports,
                quarantined_gone,
            });
        }
        families.shrink_to_fit();
        (!families.is_empty()).then(|| ServiceView {
            name: name.clone(),
            families,
        })
    }

    /// Its ports in one family.
    pub fn family(&self, family: IpFamily) -> Option<&ServiceFamily> {
        self.families.iter().find(|f| f.family == family)
    }

    /// One of its ports in one family.
    pub fn port(&self, family: IpFamily, name: &ServicePortName) -> Option<&PortView> {
        self.family(family)
            .and_then(|f| f.ports.iter().find(|p| p.name == *name))
    }

    /// Every port, of every family.
    pub fn ports(&self) -> impl Iterator<Item = (IpFamily, &PortView)> {
        self.families
            .iter()
            .flat_map(|f| f.ports.iter().map(move |p| (f.family, p)))
    }

    /// Whether `query` is a part of its `namespace/name`, of one of its
    /// addresses or of one of its endpoints' addresses.
    pub fn matches(&self, query: &str) -> bool {
        self.name.to_string().contains(query)
            || self.addresses().any(|a| a.to_string().contains(query))
            || self
                .ports()
                .any(|(_, p)| p.endpoints.iter().any(|e| e.ip.to_string().contains(query)))
    }

    /// The addresses its ports take traffic on: ClusterIPs, external IPs,
    /// load-balancer addresses.
    fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ports().flat_map(|(_, p)| {
            std::iter::once(p.port.cluster_ip)
                .chain(p.port.external_ips.iter().copied())
                .chain(p.port.load_balancer_vips.iter().copied())
        })
    }

    fn node_ports(&self) -> impl Iterator<Item = (IpFamily, u16)> + '_ {
        self.ports()
            .filter_map(|(f, p)| p.port.node_port.map(|n| (f, n)))
    }

    /// The addresses of its endpoints on this node that name their pod:
    /// the clients a flow through this node may come from (a pod's
    /// connection to a ClusterIP is DNATed on its own node). Only these
    /// are indexed, so the index grows with the pods of the node, not of
    /// the cluster.
    fn pod_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ports().flat_map(|(_, p)| {
            p.endpoints
                .iter()
                .filter(|e| e.is_local && e.target.is_some())
                .map(|e| e.ip)
        })
    }

    /// The pod at `ip`, when one of its endpoints has that address and
    /// its EndpointSlice names the pod (`targetRef`, in the Service's
    /// namespace).
    pub fn pod_at(&self, ip: IpAddr) -> Option<NamespacedName> {
        self.ports().find_map(|(_, p)| {
            p.endpoints
                .iter()
                .find(|e| e.ip == ip)
                .and_then(|e| e.target.clone())
                .map(|pod| NamespacedName {
                    namespace: self.name.namespace.clone(),
                    name: pod,
                })
        })
    }
}

/// A family's proxier as readers need it.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyView {
    /// Its configuration.
    pub config: ProxierConfig,
    /// The addresses NodePorts are served on.
    pub node_port_ips: Vec<IpAddr>,
    /// The service ports the kernel refused, and why (as many as are
    /// quarantined, whatever the number of Services).
    pub quarantined: Vec<(ServicePortName, String)>,
}

impl FamilyView {
    /// What readers need of a family's proxier.
    pub fn of(p: &Proxier) -> Arc<FamilyView> {
        Arc::new(FamilyView {
            config: p.config().clone(),
            node_port_ips: p.config().node_port_ips(),
            quarantined: p
                .quarantined()
                .iter()
                .map(|(k, v)| (k.clone(), v.reason.clone()))
                .collect(),
        })
    }

    /// The family's nftables table.
    pub fn table(&self) -> verdict_nft::Table {
        self.config.nft_table()
    }
}

/// The Services, by name, and the indexes kept beside them.
#[derive(Default)]
struct Services {
    by_name: BTreeMap<NamespacedName, Arc<ServiceView>>,
    by_address: Index<IpAddr>,
    by_node_port: Index<(IpFamily, u16)>,
    /// The Services with an endpoint at the address that names its pod:
    /// who a client is, for the flow stream.
    by_pod_address: Index<IpAddr>,
}

/// Keys to the Services that have them. Nearly every key has one Service
/// (an address, a NodePort, an endpoint's address), kept in the map's own
/// entry; a key's other Services are beside it. 30,000 Services with two
/// endpoints each make about 90,000 keys.
struct Index<K> {
    one: HashMap<K, NamespacedName>,
    more: HashMap<K, Vec<NamespacedName>>,
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Index {
            one: HashMap::new(),
            more: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy> Index<K> {
    fn add(&mut self, key: K, name: &NamespacedName) {
        match self.one.entry(key) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(name.clone());
            }
            std::collections::hash_map::Entry::Occupied(e) if e.get() == name => {}
            std::collections::hash_map::Entry::Occupied(_) => {
                let v = self.more.entry(key).or_default();
                if !v.contains(name) {
                    v.push(name.clone());
                }
            }
        }
    }

    fn remove(&mut self, key: K, name: &NamespacedName) {
        if self.one.get(&key) == Some(name) {
            let next = self.more.get_mut(&key).and_then(Vec::pop);
            if self.more.get(&key).is_some_and(Vec::is_empty) {
                self.more.remove(&key);
            }
            match next {
                Some(n) => {
                    self.one.insert(key, n);
                }
                None => {
                    self.one.remove(&key);
                }
            }
        } else if let Some(v) = self.more.get_mut(&key) {
            v.retain(|n| n != name);
            if v.is_empty() {
                self.more.remove(&key);
            }
        }
    }

    /// The Services with `key`.
    fn get(&self, key: &K) -> impl Iterator<Item = &NamespacedName> {
        self.one
            .get(key)
            .into_iter()
            .chain(self.more.get(key).into_iter().flatten())
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.one.is_empty() && self.more.is_empty()
    }

    /// The bytes its tables hold (hashbrown's layout: a bucket per entry
    /// of capacity × 8/7, each the entry and a control byte) and the
    /// vectors beside them.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        fn table<K, V>(m: &HashMap<K, V>) -> usize {
            let buckets = (m.capacity() * 8 / 7).next_power_of_two();
            buckets * (std::mem::size_of::<(K, V)>() + 1)
        }
        table(&self.one)
            + table(&self.more)
            + self
                .more
                .values()
                .map(|v| v.capacity() * std::mem::size_of::<NamespacedName>())
                .sum::<usize>()
    }
}

impl Services {
    fn put(&mut self, name: NamespacedName, view: Option<Arc<ServiceView>>) {
        if let Some(old) = self.by_name.remove(&name) {
            for a in old.addresses() {
                self.by_address.remove(a, &name);
            }
            for n in old.node_ports() {
                self.by_node_port.remove(n, &name);
            }
            for a in old.pod_addresses() {
                self.by_pod_address.remove(a, &name);
            }
        }
        if let Some(v) = view {
            for a in v.addresses() {
                self.by_address.add(a, &name);
            }
            for n in v.node_ports() {
                self.by_node_port.add(n, &name);
            }
            for a in v.pod_addresses() {
                self.by_pod_address.add(a, &name);
            }
            self.by_name.insert(name, v);
        }
    }
}

/// Every pod the watch of Pods (`--watch-pods`) told of, by name and by
/// address; empty without it. The text pods repeat (namespaces, labels,
/// workloads) is kept once, for as long as a pod holds it.
#[derive(Default)]
struct Pods {
    by_name: HashMap<NamespacedName, Arc<Pod>>,
    by_ip: HashMap<IpAddr, Arc<Pod>>,
    texts: HashSet<Name>,
    workloads: HashSet<Arc<Workload>>,
}

impl Pods {
    /// The shared copy of `t`.
    fn text(&mut self, t: &Name) -> Name {
        if let Some(held) = self.texts.get(t.as_str()) {
            return held.clone();
        }
        self.texts.insert(t.clone());
        t.clone()
    }

    /// `p` with the text and workload other pods hold shared.
    fn shared(&mut self, mut p: Pod) -> Pod {
        p.name.namespace = self.text(&p.name.namespace);
        let labels: Vec<Name> = p.labels.iter().map(|l| self.text(l)).collect();
        p.labels = labels.into_boxed_slice();
        if let Some(w) = p.workload.take() {
            let held = match self.workloads.get(&w) {
                Some(h) => h.clone(),
                None => {
                    let w = Arc::new(Workload {
                        kind: self.text(&w.kind),
                        name: w.name.clone(),
                    });
                    self.workloads.insert(w.clone());
                    w
                }
            };
            p.workload = Some(held);
        }
        p
    }

    /// Lets go of what only `old` held.
    fn release(&mut self, old: &Pod) {
        let mut texts: Vec<&Name> = old.labels.iter().collect();
        texts.push(&old.name.namespace);
        if let Some(w) = &old.workload {
            // The set's and `old`'s: no other pod's. Its kind is held by
            // the workload, once however many pods it has.
            if Arc::strong_count(w) <= 2 {
                self.workloads.remove(w);
                texts.push(&w.kind);
            }
        }
        for t in texts {
            // The set's, `old`'s (and a workload's): no other pod's.
            if self
                .texts
                .get(t.as_str())
                .is_some_and(|h| h.strong_count() <= 2)
            {
                self.texts.remove(t.as_str());
            }
        }
    }

    fn put(&mut self, name: NamespacedName, pod: Option<Pod>) {
        if let Some(old) = self.by_name.remove(&name) {
            for ip in &old.ips {
                if self.by_ip.get(ip).is_some_and(|p| Arc::ptr_eq(p, &old)) {
                    self.by_ip.remove(ip);
                }
            }
            self.release(&old);
        }
        if let Some(p) = pod {
            let p = Arc::new(self.shared(p));
            for ip in &p.ips {
                self.by_ip.insert(*ip, p.clone());
            }
            // Keyed by the pod's own (shared) name, not the one asked with.
            self.by_name.insert(p.name.clone(), p);
        }
    }
}

struct ReadModel {
    pods: RwLock<Pods>,
    services: RwLock<Services>,
    families: RwLock<Vec<Arc<FamilyView>>>,
    local_ips: RwLock<Arc<[IpAddr]>>,
    history: Mutex<History>,
    health: Arc<Mutex<Health>>,
    metrics: Arc<Mutex<Metrics>>,
}

/// A reader's handle on the read model: cheap to clone, every query
/// answered from what the last sync published.
#[derive(Clone)]
pub struct NodeHandle(Arc<ReadModel>);

/// Takes a lock whoever held it last: a writer that panicked left whole
/// entries behind (each is replaced in one step).
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NodeHandle {
    /// An empty read model over the node's health and metrics.
    pub fn new(health: Arc<Mutex<Health>>, metrics: Arc<Mutex<Metrics>>) -> NodeHandle {
        NodeHandle(Arc::new(ReadModel {
            pods: RwLock::default(),
            services: RwLock::default(),
            families: RwLock::default(),
            local_ips: RwLock::new(Arc::from([])),
            history: Mutex::default(),
            health,
            metrics,
        }))
    }

    /// One Service.
    pub fn service(&self, name: &NamespacedName) -> Option<Arc<ServiceView>> {
        read(&self.0.services).by_name.get(name).cloned()
    }

    /// How many Services there are.
    pub fn service_count(&self) -> usize {
        read(&self.0.services).by_name.len()
    }

    /// One page of the Services whose `namespace/name` contains `query`,
    /// in name order, and how many match in all.
    pub fn services_page(
        &self,
        query: &str,
        offset: usize,
        limit: usize,
    ) -> (usize, Vec<Arc<ServiceView>>) {
        let s = read(&self.0.services);
        if query.is_empty() {
            let page = s
                .by_name
                .values()
                .skip(offset)
                .take(limit)
                .cloned()
                .collect();
            return (s.by_name.len(), page);
        }
        let mut total = 0;
        let mut page = Vec::new();
        for v in s.by_name.values() {
            if !v.matches(query) {
                continue;
            }
            if total >= offset && page.len() < limit {
                page.push(v.clone());
            }
            total += 1;
        }
        (total, page)
    }

    /// Every Service (for the answers that read the whole table anyway:
    /// drift, counters).
    pub fn all_services(&self) -> Vec<Arc<ServiceView>> {
        read(&self.0.services).by_name.values().cloned().collect()
    }

    /// The Services that take traffic on `addr` (a ClusterIP, an external
    /// IP, a load-balancer address).
    pub fn services_at(&self, addr: IpAddr) -> Vec<Arc<ServiceView>> {
        let s = read(&self.0.services);
        s.by_address
            .get(&addr)
            .filter_map(|n| s.by_name.get(n).cloned())
            .collect()
    }

    /// The Services with this NodePort in `family`.
    pub fn services_at_node_port(&self, family: IpFamily, port: u16) -> Vec<Arc<ServiceView>> {
        let s = read(&self.0.services);
        s.by_node_port
            .get(&(family, port))
            .filter_map(|n| s.by_name.get(n).cloned())
            .collect()
    }

    /// The pod at `addr`: as the watch of Pods has it (`--watch-pods`),
    /// else as the EndpointSlices the node holds name it (then a pod no
    /// Service selects is not known).
    pub fn pod_at(&self, addr: IpAddr) -> Option<NamespacedName> {
        if let Some(p) = self.pod(addr) {
            return Some(p.name.clone());
        }
        let s = read(&self.0.services);
        s.by_pod_address
            .get(&addr)
            .filter_map(|n| s.by_name.get(n))
            .find_map(|v| v.pod_at(addr))
    }

    /// The pod at `addr` with its labels and workload, from the watch of
    /// Pods (`None` without `--watch-pods`).
    pub fn pod(&self, addr: IpAddr) -> Option<Arc<Pod>> {
        read(&self.0.pods).by_ip.get(&addr).cloned()
    }

    /// Takes a pod from the watch of Pods: added or changed (`Some`), or
    /// gone (`None`).
    pub fn publish_pod(&self, namespace: &str, name: &str, pod: Option<Pod>) {
        let name = NamespacedName::new(namespace, name);
        self.0
            .pods
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .put(name, pod);
    }

    /// How many pods the watch of Pods holds.
    pub fn pod_count(&self) -> usize {
        read(&self.0.pods).by_name.len()
    }

    /// The families' proxiers.
    pub fn families(&self) -> Vec<Arc<FamilyView>> {
        read(&self.0.families).clone()
    }

    /// One family's proxier.
    pub fn family(&self, family: IpFamily) -> Option<Arc<FamilyView>> {
        read(&self.0.families)
            .iter()
            .find(|f| f.config.family == family)
            .cloned()
    }

    /// The node's addresses.
    pub fn local_ips(&self) -> Arc<[IpAddr]> {
        read(&self.0.local_ips).clone()
    }

    /// The recent syncs and foreign changes.
    pub fn history(&self) -> MutexGuard<'_, History> {
        lock(&self.0.history)
    }

    /// The proxy's health.
    pub fn health(&self) -> &Arc<Mutex<Health>> {
        &self.0.health
    }

    /// kube-proxy's metrics.
    pub fn metrics(&self) -> &Arc<Mutex<Metrics>> {
        &self.0.metrics
    }

    /// A read model of these proxiers, every Service published (tests of
    /// the answers, without a run loop).
    pub fn of_proxiers(proxiers: &[&Proxier], local_ips: &[IpAddr]) -> NodeHandle {
        let h = NodeHandle::new(
            Arc::new(Mutex::new(Health::new(std::time::Duration::from_secs(60)))),
            Arc::new(Mutex::new(Metrics::new())),
        );
        h.publish(proxiers, None, local_ips);
        h
    }

    /// Publishes what readers need of `proxiers`: the families, the node's
    /// addresses, and the Services `touched` (`None`: every one, and
    /// whatever the readers still have that is gone), rebuilt from the
    /// proxiers and replaced in one step.
    pub(crate) fn publish(
        &self,
        proxiers: &[&Proxier],
        touched: Option<&std::collections::BTreeSet<NamespacedName>>,
        local_ips: &[IpAddr],
    ) {
        self.publish_node(
            proxiers.iter().map(|p| FamilyView::of(p)).collect(),
            local_ips,
        );
        let names: Vec<NamespacedName> = match touched {
            Some(t) => t.iter().cloned().collect(),
            None => {
                let mut all: std::collections::BTreeSet<NamespacedName> = proxiers
                    .iter()
                    .flat_map(|p| p.service_ports().keys().chain(p.quarantined().keys()))
                    .map(|k| k.service.clone())
                    .collect();
                all.extend(read(&self.0.services).by_name.keys().cloned());
                all.into_iter().collect()
            }
        };
        let views = names
            .into_iter()
            .map(|n| {
                let v = ServiceView::build(&n, proxiers).map(Arc::new);
                (n, v)
            })
            .collect();
        self.publish_services(views);
    }

    /// Replaces or removes the views of these Services, in one step.
    fn publish_services(&self, views: Vec<(NamespacedName, Option<Arc<ServiceView>>)>) {
        if views.is_empty() {
            return;
        }
        let mut s = self.0.services.write().unwrap_or_else(|e| e.into_inner());
        let compact = verdict_model::worth_compacting(views.len(), s.by_name.len());
        for (name, view) in views {
            s.put(name, view);
        }
        if compact {
            verdict_model::compact(&mut s.by_name);
        }
    }

    /// Replaces the families' views and the node's addresses.
    fn publish_node(&self, families: Vec<Arc<FamilyView>>, local_ips: &[IpAddr]) {
        *self.0.families.write().unwrap_or_else(|e| e.into_inner()) = families;
        let same = **read(&self.0.local_ips) == *local_ips;
        if !same {
            *self.0.local_ips.write().unwrap_or_else(|e| e.into_inner()) = Arc::from(local_ips);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verdict_conformance::{ServiceExt, SliceExt, TCP, slice, svc};
    use verdict_nft::MemoryBackend;

    fn handle() -> NodeHandle {
        NodeHandle::new(
            Arc::new(Mutex::new(Health::new(std::time::Duration::from_secs(60)))),
            Arc::new(Mutex::new(Metrics::new())),
        )
    }

    fn proxier() -> Proxier {
        let mut c = ProxierConfig::new(IpFamily::V4, "n1");
        c.node_ips = vec!["192.168.0.2".parse().unwrap()];
        Proxier::new(c).unwrap()
    }

    #[test]
    fn a_view_shares_the_proxiers_ports_and_endpoints_and_indexes_its_addresses() {
        let mut p = proxier();
        let web = svc("ns", "web")
            .cluster_ip("172.30.0.41")
            .port("p80", TCP, 80, 30080)
            .external_ips(&["192.0.2.9"]);
        p.on_service(None, Some(&web));
        let mut w1 = slice("ns", "web", "w1")
            .port("p80", TCP, 8080)
            .ep("10.180.0.1", "n1")
            .ep("10.180.0.2", "n1")
            .ep("10.180.0.3", "n2");
        w1.endpoints[0].target_name = Some("web-0".into());
        w1.endpoints[2].target_name = Some("web-2".into());
        p.on_endpoint_slice(&w1, false);
        p.sync(&mut MemoryBackend::new(), std::time::Instant::now())
            .unwrap();
        let name = NamespacedName::new("ns", "web");
        let v = ServiceView::build(&name, &[&p]).unwrap();
        let (_, port) = v.ports().next().unwrap();
        let (_, sp) = p.service_ports().iter().next().unwrap();
        assert!(Arc::ptr_eq(&port.port, sp), "shared, not copied");
        // A view is kept per Service: no spare room in its lists.
        assert_eq!(v.families.capacity(), v.families.len());
        assert!(
            v.families
                .iter()
                .all(|f| f.ports.capacity() == f.ports.len())
        );
        assert_eq!(port.endpoints.len(), 3);
        assert!(
            port.intent.as_ref().is_some_and(|i| !i.is_empty()),
            "{port:?}"
        );
        let h = handle();
        h.publish_services(vec![(name.clone(), Some(Arc::new(v)))]);
        let at = |a: &str| h.services_at(a.parse().unwrap()).len();
        assert_eq!(
            (at("172.30.0.41"), at("192.0.2.9"), at("10.0.0.1")),
            (1, 1, 0)
        );
        assert_eq!(h.services_at_node_port(IpFamily::V4, 30080).len(), 1);
        let pod = |a: &str| h.pod_at(a.parse().unwrap()).map(|p| p.to_string());
        assert_eq!(pod("10.180.0.1").as_deref(), Some("ns/web-0"));
        assert_eq!(pod("10.180.0.2"), None, "the slice names no pod");
        assert_eq!(pod("10.180.0.3"), None, "another node's: not a client here");
        {
            // One Service an address: nothing beside the map's entries.
            let s = read(&h.0.services);
            assert!(s.by_address.more.is_empty() && s.by_pod_address.more.is_empty());
        }
        assert_eq!(h.services_page("web", 0, 10).0, 1);
        assert_eq!(h.services_page("nope", 0, 10).0, 0);
        // Gone from the proxier: gone from the view and its indexes.
        p.on_service(Some(&web), None);
        p.sync(&mut MemoryBackend::new(), std::time::Instant::now())
            .unwrap();
        assert_eq!(ServiceView::build(&name, &[&p]), None);
        h.publish_services(vec![(name, None)]);
        assert_eq!((at("172.30.0.41"), h.service_count()), (0, 0));
        assert_eq!(h.services_at_node_port(IpFamily::V4, 30080).len(), 0);
        assert_eq!(pod("10.180.0.1"), None);
        assert!(read(&h.0.services).by_pod_address.is_empty());
        assert!(read(&h.0.services).by_address.is_empty());
    }

    /// What the index of endpoints' addresses costs: 2,000 Services of two
    /// endpoints, each naming its pod, one on this node and one elsewhere.
    #[test]
    fn the_pod_address_index_holds_this_nodes_endpoints_only() {
        let mut p = proxier();
        let n = 2000;
        for i in 0..n {
            let ip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
            let s = svc("ns", &format!("s{i}"))
                .cluster_ip(&ip)
                .port("p", TCP, 80, 0);
            p.on_service(None, Some(&s));
            let mut sl = slice("ns", &format!("s{i}"), &format!("s{i}-1"))
                .port("p", TCP, 8080)
                .ep(&format!("10.1.{}.{}", i / 250, i % 250 + 1), "n1")
                .ep(&format!("10.2.{}.{}", i / 250, i % 250 + 1), "n2");
            for (j, e) in sl.endpoints.iter_mut().enumerate() {
                e.target_name = Some(format!("s{i}-7d4b9c5f6-{j:05}"));
            }
            p.on_endpoint_slice(&sl, false);
        }
        p.sync(&mut MemoryBackend::new(), std::time::Instant::now())
            .unwrap();
        let h = handle();
        let views = (0..n)
            .map(|i| {
                let name = NamespacedName::new("ns", format!("s{i}"));
                let v = ServiceView::build(&name, &[&p]).map(Arc::new);
                (name, v)
            })
            .collect();
        h.publish_services(views);
        let s = read(&h.0.services);
        let (endpoints, bytes) = (s.by_pod_address.one.len(), s.by_pod_address.bytes());
        println!(
            "pod-address index: {endpoints} addresses, {bytes} bytes, {} a pod",
            bytes / endpoints
        );
        // This node's: the clients whose flows it sees.
        assert_eq!(endpoints, n);
        // An entry (an address, a Service's shared name) and its share of
        // the table's spare room: no allocation of its own.
        assert!(bytes / endpoints <= 128, "{bytes}");
        assert!(s.by_pod_address.more.is_empty());
    }

    #[test]
    fn an_index_keeps_every_service_of_a_key_and_promotes_the_next() {
        let mut i: Index<u16> = Index::default();
        let (a, b, c) = (
            NamespacedName::new("ns", "a"),
            NamespacedName::new("ns", "b"),
            NamespacedName::new("ns", "c"),
        );
        for n in [&a, &b, &c, &b] {
            i.add(80, n);
        }
        i.add(81, &a);
        let at = |i: &Index<u16>, k| i.get(&k).map(|n| n.name.to_string()).collect::<Vec<_>>();
        assert_eq!(at(&i, 80), ["a", "b", "c"]);
        i.remove(80, &a);
        let mut left = at(&i, 80);
        left.sort();
        assert_eq!(left, ["b", "c"]);
        i.remove(80, &b);
        i.remove(80, &b);
        assert_eq!(at(&i, 80), ["c"]);
        assert!(i.more.is_empty());
        i.remove(80, &c);
        i.remove(81, &c);
        assert_eq!(at(&i, 81), ["a"]);
        i.remove(81, &a);
        assert!(i.is_empty());
    }

    #[test]
    fn pods_share_what_they_repeat_and_let_go_of_it_with_the_last() {
        let h = handle();
        let pod = |name: &str, ip: &str| Pod {
            name: NamespacedName::new("shop", name),
            ips: Box::new([ip.parse().unwrap()]),
            labels: Box::new(["app=web".into(), "tier=back".into()]),
            workload: Some(Arc::new(Workload {
                kind: "Deployment".into(),
                name: "web".into(),
            })),
        };
        h.publish_pod("shop", "web-1", Some(pod("web-1", "10.180.0.1")));
        h.publish_pod("shop", "web-2", Some(pod("web-2", "10.180.0.2")));
        let (a, b) = (
            h.pod("10.180.0.1".parse().unwrap()).unwrap(),
            h.pod("10.180.0.2".parse().unwrap()).unwrap(),
        );
        assert!(Arc::ptr_eq(
            a.workload.as_ref().unwrap(),
            b.workload.as_ref().unwrap()
        ));
        assert!(std::ptr::eq(a.labels[0].as_str(), b.labels[0].as_str()));
        assert!(std::ptr::eq(
            a.name.namespace.as_str(),
            b.name.namespace.as_str()
        ));
        drop((a, b));
        // A pod that moves to another address leaves the old one.
        h.publish_pod("shop", "web-2", Some(pod("web-2", "10.180.0.3")));
        assert!(h.pod("10.180.0.2".parse().unwrap()).is_none());
        h.publish_pod("shop", "web-1", None);
        {
            let p = read(&h.0.pods);
            assert_eq!(
                (p.by_name.len(), p.by_ip.len(), p.workloads.len()),
                (1, 1, 1)
            );
            // shop, app=web, tier=back, Deployment.
            assert_eq!(p.texts.len(), 4);
        }
        h.publish_pod("shop", "web-2", None);
        let p = read(&h.0.pods);
        assert!(p.by_name.is_empty() && p.by_ip.is_empty());
        assert!(
            p.texts.is_empty() && p.workloads.is_empty(),
            "{:?}",
            p.texts
        );
    }

    #[test]
    fn a_page_past_the_end_is_empty_and_counts_every_match() {
        let h = handle();
        let views: Vec<_> = (0..5)
            .map(|i| {
                let name = NamespacedName::new("ns", format!("s{i}"));
                let v = ServiceView {
                    name: name.clone(),
                    families: Vec::new(),
                };
                (name, Some(Arc::new(v)))
            })
            .collect();
        h.publish_services(views);
        let (total, page) = h.services_page("", 3, 10);
        assert_eq!((total, page.len()), (5, 2));
        let (total, page) = h.services_page("s", 10, 10);
        assert_eq!((total, page.len()), (5, 0));
        let (total, page) = h.services_page("s1", 0, 10);
        assert_eq!((total, page[0].name.name.as_str()), (1, "s1"));
    }
}
