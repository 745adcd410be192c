//! The Kubernetes API source: a [`Reflector`] for each of Services,
//! EndpointSlices, this node's Node and (where served) ServiceCIDRs, turned
//! into [`Update`]s for the daemon.
//!
//! What the daemon can rely on:
//! - [`Update::Synced`] comes once, after Services, EndpointSlices, the
//!   Node and, where the API server serves them, ServiceCIDRs have all
//!   finished their initial list; before it the daemon programs nothing
//!   (as kube-proxy), and its first rules drop unallocated ClusterIPs.
//! - The initial lists of Services, EndpointSlices and the Node are passed
//!   on as they come, in batches of what has arrived, so that the daemon
//!   takes in the objects while the rest are still being listed and
//!   decoded (it programs nothing before [`Update::Synced`] anyway). The
//!   ServiceCIDRs, which may first be listed after that, are not.
//! - A relist (after a watch expired with 410 Gone) is buffered until it
//!   is complete and then reported as the difference from what was
//!   known: objects still there are not deleted and re-added, so no valid
//!   rule is dropped, and objects that disappeared while nobody was
//!   watching are deleted.
//! - An object that cannot be decoded changes nothing: what was known of
//!   it stays, and its deletion is still seen.
//! - Disconnects are retried with backoff; until a watch is back, the last
//!   known state stays programmed. How each request is made:
//!   [`crate::reflector`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::Duration;

use ipnet::IpNet;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use verdict_model::{EndpointSlice, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, Service};

use crate::convert::{NodeInfo, node_info, service, service_cidrs, slice};
use crate::objects::{self, Object};
use crate::reflector::{Collection, Event, Reflector, Sink};

/// Namespace and name of an object.
pub type Key = (String, String);

/// What changed in the cluster, as the daemon applies it.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A Service was added or changed (`Some`), or deleted (`None`).
    Service(Key, Option<Service>),
    /// An EndpointSlice was added or changed (`Some`), or deleted (`None`).
    Slice(Key, Option<EndpointSlice>),
    /// This node's Node object changed (`Some`) or is gone (`None`).
    Node(Option<NodeInfo>),
    /// The CIDRs of every ServiceCIDR object.
    ServiceCidrs(Vec<IpNet>),
    /// A Pod was added or changed (`Some`), or deleted or no longer named
    /// by an address of its own (`None`): only with
    /// [`ApiSource::watch_pods`].
    Pod(Key, Option<verdict_model::Pod>),
    /// Services, EndpointSlices and the Node have finished their initial
    /// list: from now on the daemon may program the node.
    Synced,
}

/// The selectors kube-proxy 1.36 lists and watches Services with: not
/// those another proxy serves (a `service-proxy-name` label), and not
/// headless ones (`spec.clusterIP` `None`), which are not even fetched.
/// (label selector, field selector).
pub fn service_selectors() -> (String, String) {
    (
        format!("!{LABEL_SERVICE_PROXY_NAME}"),
        "spec.clusterIP!=None".to_owned(),
    )
}

/// The label selector kube-proxy 1.36 lists and watches EndpointSlices
/// with: not those of headless Services (the EndpointSlice controller
/// labels them).
pub fn slice_selector() -> String {
    format!("!{LABEL_HEADLESS}")
}

/// Where the API server is and how to authenticate.
#[derive(Clone, Debug, Default)]
pub struct ApiSource {
    /// `--kubeconfig`; without it (and without `master`), the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: the API server's URL, overriding the kubeconfig's.
    pub master: Option<String>,
    /// This node's name (its Node object is watched).
    pub node_name: String,
    /// Rate limit and request metrics.
    pub client: crate::client::ClientOptions,
    /// Also watch every Pod (`--watch-pods`), for the flow stream's names.
    pub watch_pods: bool,
}

/// Why the API source could not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `--master` is not a URL.
    #[error("--master {url}: {message}")]
    Master {
        /// The value given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// Neither flag was given and this is not a pod.
    #[error(
        "no API server: give --kubeconfig or --master, or run in a pod with a service account ({0})"
    )]
    InCluster(String),
    /// The client could not be built (TLS, runtime, thread).
    #[error("Kubernetes client: {0}")]
    Client(String),
}

/// A client configuration for `src`, as client-go's
/// `BuildConfigFromFlags(master, kubeconfig)`: the kubeconfig if given
/// (with `master` overriding its server), else `master` alone, else the
/// in-cluster service account.
pub(crate) async fn client_config(src: &ApiSource) -> Result<Config, SourceError> {
    let master = match &src.master {
        Some(url) => {
            // As client-go: a bare host:port means HTTPS.
            let full = if url.contains("://") {
                url.clone()
            } else {
                format!("https://{url}")
            };
            let uri = full.parse::<http::Uri>().map_err(|e| SourceError::Master {
                url: url.clone(),
                message: e.to_string(),
            })?;
            if uri.host().is_none() {
                return Err(SourceError::Master {
                    url: url.clone(),
                    message: "has no host".into(),
                });
            }
            Some(uri)
        }
        None => None,
    };
    let mut config = match (&src.kubeconfig, &master) {
        (Some(path), _) => {
            let bad = |message: String| SourceError::Kubeconfig {
                path: path.clone(),
                message,
            };
            let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        (None, Some(url)) => Config::new(url.clone()),
        (None, None) => Config::incluster().map_err(|e| SourceError::InCluster(e.to_string()))?,
    };
    if let Some(url) = master {
        config.cluster_url = url;
    }
    // kube-rs reads without a timeout: a connection that goes silent in a
    // list would hang it for good.
    config.read_timeout = Some(READ_TIMEOUT);
    Ok(config)
}

/// Keeps what one watch has reported, so that a relist can be turned into
/// the difference from it (see the module documentation). Only each
/// object's name and resourceVersion are kept, not the object: the daemon
/// holds the objects once. The name is one allocation and the version
/// none when it is a number (etcd's are): 60,000 objects at 30,000
/// Services.
#[derive(Debug)]
pub struct Mirror<T> {
    known: BTreeMap<Box<str>, Version>,
    /// A relist under way: what it listed so far (`None`: an object that
    /// did not decode).
    relisting: Option<BTreeMap<Key, (String, Option<T>)>>,
    /// The initial list, passed on object by object as it comes: what it
    /// has listed so far (it becomes `known` once complete).
    streaming: Option<BTreeMap<Box<str>, Version>>,
    /// Whether the initial list is passed on as it comes
    /// ([`Mirror::passing_initial_list`]).
    pass_initial: bool,
    listed: bool,
}

impl<T> Default for Mirror<T> {
    /// A mirror that buffers every list, the first too.
    fn default() -> Self {
        Mirror {
            known: BTreeMap::new(),
            relisting: None,
            streaming: None,
            pass_initial: false,
            listed: false,
        }
    }
}

impl<T> Mirror<T> {
    /// A mirror that passes its initial list on object by object: for a
    /// watch whose initial list the daemon waits for before it programs
    /// anything (Services, EndpointSlices, the Node), so that no half of
    /// it is ever programmed. A watch that may first list after that (the
    /// ServiceCIDRs, once served) buffers it whole instead.
    pub fn passing_initial_list() -> Mirror<T> {
        Mirror {
            pass_initial: true,
            ..Mirror::default()
        }
    }
}

/// An object's namespace and name as one string, `namespace/name` (a
/// slash is in neither).
fn joined((namespace, name): &Key) -> Box<str> {
    format!("{namespace}/{name}").into_boxed_str()
}

fn split(joined: &str) -> Key {
    let (namespace, name) = joined.split_once('/').unwrap_or(("", joined));
    (namespace.to_owned(), name.to_owned())
}

/// A resourceVersion, compared for equality only (it is opaque): a
/// decimal number in its one spelling is kept as a number, anything else
/// as the string.
#[derive(Debug, PartialEq, Eq)]
enum Version {
    Number(u64),
    Other(Box<str>),
}

impl Version {
    fn of(v: &str) -> Version {
        let canonical = v.bytes().all(|b| b.is_ascii_digit()) && (v == "0" || !v.starts_with('0'));
        match v.parse() {
            Ok(n) if canonical => Version::Number(n),
            _ => Version::Other(v.into()),
        }
    }
}

/// An object with its resourceVersion, or `None` for one the proxy does
/// not use (treated as absent).
pub type Versioned<T> = Option<(String, T)>;

/// One watcher event, converted.
#[derive(Clone, Debug, PartialEq)]
pub enum Seen<T> {
    /// A (re)list starts.
    ListStart,
    /// An object of the list.
    Listed(Key, Versioned<T>),
    /// The list is complete.
    ListDone,
    /// An object was added or changed.
    Applied(Key, Versioned<T>),
    /// An object was deleted.
    Deleted(Key),
    /// An object that did not decode, with its version (`listed`: in a
    /// list): what was known of it stays as it was, but its key and
    /// version are known (a later deletion is passed on).
    Skipped(Key, String, bool),
}

impl<T> Mirror<T> {
    /// Whether an initial list has completed.
    pub fn listed(&self) -> bool {
        self.listed
    }

    /// How many objects are known now.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no object is known now.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Takes one event; returns the changes to apply (`None`: deleted).
    ///
    /// A mirror [`passing its initial list`](Mirror::passing_initial_list)
    /// passes each object of that list on at once, and the deletions
    /// (only of what an earlier, broken-off list passed on) when the list
    /// completes. Every other list is buffered and reported as one
    /// difference.
    pub fn see(&mut self, seen: Seen<T>) -> Vec<(Key, Option<T>)> {
        match seen {
            Seen::ListStart if self.pass_initial && !self.listed => {
                // What a list broken off before passed on is known now.
                if let Some(partial) = self.streaming.take() {
                    self.known.extend(partial);
                }
                self.streaming = Some(BTreeMap::new());
                Vec::new()
            }
            Seen::ListStart => {
                self.relisting = Some(BTreeMap::new());
                Vec::new()
            }
            Seen::Listed(key, obj) if self.streaming.is_some() => {
                let (Some(streamed), Some((version, obj))) = (&mut self.streaming, obj) else {
                    return Vec::new();
                };
                let name = joined(&key);
                let version = Version::of(&version);
                let same = self.known.get(&name) == Some(&version);
                streamed.insert(name, version);
                if same {
                    Vec::new()
                } else {
                    vec![(key, Some(obj))]
                }
            }
            Seen::Listed(key, obj) => {
                if let (Some(buf), Some((version, obj))) = (&mut self.relisting, obj) {
                    buf.insert(key, (version, Some(obj)));
                }
                Vec::new()
            }
            Seen::Skipped(key, version, true) if self.streaming.is_some() => {
                if let Some(streamed) = &mut self.streaming {
                    streamed.insert(joined(&key), Version::of(&version));
                }
                Vec::new()
            }
            Seen::Skipped(key, version, true) => {
                if let Some(buf) = &mut self.relisting {
                    buf.insert(key, (version, None));
                }
                Vec::new()
            }
            Seen::Skipped(key, version, false) => {
                self.known.insert(joined(&key), Version::of(&version));
                Vec::new()
            }
            Seen::ListDone if self.streaming.is_some() => {
                let streamed = self.streaming.take().unwrap_or_default();
                // What is known and was not listed: passed on by a list
                // broken off, and deleted since.
                let out = self
                    .known
                    .keys()
                    .filter(|k| !streamed.contains_key(*k))
                    .map(|k| (split(k), None))
                    .collect();
                self.known = streamed;
                self.listed = true;
                out
            }
            Seen::ListDone => {
                let fresh = self.relisting.take().unwrap_or_default();
                let mut known = BTreeMap::new();
                let mut changed = Vec::new();
                for (k, (version, obj)) in fresh {
                    let name = joined(&k);
                    let version = Version::of(&version);
                    let was = self.known.remove(&name);
                    if let Some(obj) = obj
                        && was.as_ref() != Some(&version)
                    {
                        changed.push((k, Some(obj)));
                    }
                    known.insert(name, version);
                }
                // What is left was not listed: deleted meanwhile.
                let mut out: Vec<(Key, Option<T>)> =
                    self.known.keys().map(|k| (split(k), None)).collect();
                out.extend(changed);
                self.known = known;
                self.listed = true;
                out
            }
            Seen::Applied(key, Some((version, obj))) => {
                let name = joined(&key);
                let version = Version::of(&version);
                if self.known.get(&name) == Some(&version) {
                    return Vec::new();
                }
                self.known.insert(name, version);
                vec![(key, Some(obj))]
            }
            Seen::Applied(key, None) | Seen::Deleted(key) => match self.known.remove(&joined(&key))
            {
                Some(_) => vec![(key, None)],
                None => Vec::new(),
            },
        }
    }
}

/// An object's key.
fn key_of(m: &objects::Meta) -> Key {
    (m.namespace.clone(), m.name.clone())
}

/// A reflector's event as the mirror takes it: `convert` makes the
/// proxier's object (`None`: one the proxy does not use).
fn seen<O: Object, T>(e: Event<O>, convert: impl Fn(O) -> Option<T>) -> Seen<T> {
    let versioned = |o: O| {
        let key = key_of(o.meta());
        let version = o.meta().resource_version.clone();
        (key, convert(o).map(|t| (version, t)))
    };
    match e {
        Event::ListStart => Seen::ListStart,
        Event::Listed(o) => {
            let (k, v) = versioned(o);
            Seen::Listed(k, v)
        }
        Event::ListDone => Seen::ListDone,
        Event::Applied(o) => {
            let (k, v) = versioned(o);
            Seen::Applied(k, v)
        }
        Event::Deleted(k) => Seen::Deleted(k),
        Event::Skipped {
            key,
            version,
            listed,
        } => Seen::Skipped(key, version, listed),
    }
}

/// The events of every reflector, on one channel.
#[derive(Debug)]
enum Watched {
    Service(Event<objects::Service>),
    Slice(Event<objects::EndpointSlice>),
    Node(Event<objects::Node>),
    Cidr(Event<objects::ServiceCidr>),
    Pod(Event<objects::Pod>),
    /// ServiceCIDRs are not served (or not allowed): the first sync does
    /// not wait for them.
    CidrsAbsent,
}

/// A reflector's sink: its events, wrapped, onto the shared channel.
struct Forward<F> {
    tx: tokio::sync::mpsc::Sender<Watched>,
    wrap: F,
}

impl<O, F: Fn(Event<O>) -> Watched> Sink<O> for Forward<F> {
    async fn send(&mut self, e: Event<O>) -> Result<(), ()> {
        self.tx.send((self.wrap)(e)).await.map_err(|_| ())
    }
}

/// Connects to the API server and starts watching; updates go to `tx`, in
/// batches that belong together (one watch event, or one relist's
/// difference), until it is dropped. A configuration that cannot be used
/// is an error here; an unreachable server is not (watches retry with
/// backoff).
pub fn start(src: ApiSource, tx: Sender<Vec<Update>>) -> Result<(), SourceError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SourceError::Client(e.to_string()))?;
    let config = rt.block_on(client_config(&src))?;
    tracing::info!(server = %config.cluster_url, node = %src.node_name, "watching the Kubernetes API");
    let client = {
        // The client spawns its connection tasks on the current runtime.
        let _guard = rt.enter();
        crate::client::build(config, &src.client)?
    };
    let node = src.node_name.clone();
    // The thread ends when the receiver is dropped; if it ends otherwise,
    // the receiver sees the channel close.
    std::thread::Builder::new()
        .name("kube-watch".into())
        .spawn(move || rt.block_on(watch_all(client, node, src.watch_pods, tx)))
        .map_err(|e| SourceError::Client(e.to_string()))?;
    Ok(())
}

/// How long one request of the ServiceCIDR check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an API server that does not serve ServiceCIDRs (or does not let
/// verdict list them) is asked again, say after an upgrade.
const RECHECK_EVERY: Duration = Duration::from_secs(600);
/// A response silent for this long is abandoned (a list or a watch): the
/// API server sends every watch a bookmark each minute.
pub const READ_TIMEOUT: Duration = Duration::from_secs(75);

/// How long the first sync waits to know whether ServiceCIDRs are served
/// when the API server will not say (it answers neither the list nor
/// "not found" / "forbidden").
const WAIT_FOR_CIDRS: Duration = Duration::from_secs(10);

/// Returns once the API server serves ServiceCIDRs (networking.k8s.io/v1)
/// and lets verdict list them; until then it asks again now and then.
/// `absent` is called once, when it is first known that they are not
/// served or not allowed (or after [`WAIT_FOR_CIDRS`] of not knowing):
/// the first sync then goes ahead without them.
async fn until_service_cidrs_served(client: &Client, mut absent: impl FnMut()) {
    let mut said = false;
    let started = tokio::time::Instant::now();
    let mut told = false;
    let mut tell = |told: &mut bool| {
        if !*told {
            *told = true;
            absent();
        }
    };
    loop {
        let request =
            http::Request::get("/apis/networking.k8s.io/v1/servicecidrs?limit=1").body(Vec::new());
        let Ok(request) = request else { return };
        let wait = match tokio::time::timeout(CHECK_TIMEOUT, client.request_text(request)).await {
            Ok(Ok(_)) => return,
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 403 => {
                if !said {
                    tracing::info!(
                        code = s.code,
                        "ServiceCIDRs are not served (or not allowed): traffic to unallocated ClusterIPs is not dropped"
                    );
                    said = true;
                }
                tell(&mut told);
                RECHECK_EVERY
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot tell yet whether ServiceCIDRs are served");
                CHECK_TIMEOUT
            }
            Err(_) => CHECK_TIMEOUT,
        };
        if started.elapsed() >= WAIT_FOR_CIDRS {
            tell(&mut told);
        }
        tokio::time::sleep(wait.min(WAIT_FOR_CIDRS)).await;
    }
}

/// The collections verdict watches, with kube-proxy's selectors.
fn collections(node: &str) -> [Collection; 4] {
    let (service_labels, service_fields) = service_selectors();
    [
        Collection {
            what: "Services",
            path: "/api/v1/services",
            labels: Some(service_labels),
            fields: Some(service_fields),
        },
        Collection {
            what: "EndpointSlices",
            path: "/apis/discovery.k8s.io/v1/endpointslices",
            labels: Some(slice_selector()),
            fields: None,
        },
        Collection {
            what: "Node",
            path: "/api/v1/nodes",
            labels: None,
            fields: Some(format!("metadata.name={node}")),
        },
        Collection {
            what: "ServiceCIDRs",
            path: "/apis/networking.k8s.io/v1/servicecidrs",
            labels: None,
            fields: None,
        },
    ]
}

/// Every Pod that may hold an address: one that ran to its end gave it
/// back (and it may be another pod's now), so Succeeded and Failed pods
/// are not listed (and leave the watch as deletions).
fn pods_collection() -> Collection {
    Collection {
        what: "Pods",
        path: "/api/v1/pods",
        labels: None,
        fields: Some("status.phase!=Succeeded,status.phase!=Failed".to_owned()),
    }
}

/// Events in flight between the reflectors and the batcher.
const IN_FLIGHT: usize = 4096;

async fn watch_all(client: Client, node: String, pods: bool, tx: Sender<Vec<Update>>) {
    let (events, mut rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
    let [services, slices, nodes, cidrs] = collections(&node);
    if pods {
        let to_pod = Forward {
            tx: events.clone(),
            wrap: Watched::Pod,
        };
        tokio::spawn(Reflector::new(client.clone(), pods_collection()).run(to_pod));
    }
    let to_service = Forward {
        tx: events.clone(),
        wrap: Watched::Service,
    };
    tokio::spawn(Reflector::new(client.clone(), services).run(to_service));
    let to_slice = Forward {
        tx: events.clone(),
        wrap: Watched::Slice,
    };
    tokio::spawn(Reflector::new(client.clone(), slices).run(to_slice));
    let to_node = Forward {
        tx: events.clone(),
        wrap: Watched::Node,
    };
    tokio::spawn(Reflector::new(client.clone(), nodes).run(to_node));
    // Not every API server serves ServiceCIDRs: this watch starts once it
    // does, without holding up the others.
    let cidr_sink = Forward {
        tx: events.clone(),
        wrap: Watched::Cidr,
    };
    let absent = events.clone();
    tokio::spawn(async move {
        until_service_cidrs_served(&client, || {
            let _ = absent.try_send(Watched::CidrsAbsent);
        })
        .await;
        Reflector::new(client, cidrs).run(cidr_sink).await;
    });
    drop(events);
    let mut mirrors = Mirrors::new(node);
    let mut batch = Vec::new();
    loop {
        // Events already there join the batch (an initial list is one
        // event per object), up to `BATCH` changes; it is sent as soon as
        // nothing more is there.
        let next = match rx.try_recv() {
            Ok(w) if batch.len() < BATCH => Some(w),
            ready => {
                if !batch.is_empty() && tx.send(std::mem::take(&mut batch)).is_err() {
                    return;
                }
                match ready {
                    Ok(w) => Some(w),
                    Err(_) => rx.recv().await,
                }
            }
        };
        let Some(w) = next else {
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            return;
        };
        // One event's changes travel together: a relist's difference is
        // applied as a whole, never half before a sync.
        batch.extend(mirrors.take(w));
    }
}

/// The most changes the watches send in one batch, unless one event makes
/// more (a relist's difference).
const BATCH: usize = 1024;

/// The mirrors of every watch, and the one-time [`Update::Synced`].
struct Mirrors {
    node: String,
    services: Mirror<Service>,
    slices: Mirror<EndpointSlice>,
    nodes: Mirror<NodeInfo>,
    cidrs: Mirror<Vec<IpNet>>,
    pods: Mirror<verdict_model::Pod>,
    /// The ranges of every ServiceCIDR object.
    cidr_values: BTreeMap<Key, Vec<IpNet>>,
    /// ServiceCIDRs are not served (or not allowed).
    cidrs_absent: bool,
    synced: bool,
}

impl Mirrors {
    fn new(node: String) -> Mirrors {
        Mirrors {
            node,
            services: Mirror::passing_initial_list(),
            slices: Mirror::passing_initial_list(),
            nodes: Mirror::passing_initial_list(),
            cidrs: Mirror::default(),
            // Names for flows, which no sync waits for: each pod of the
            // first list is passed on as it comes, not held until the
            // list is whole (tens of thousands of them, decoded twice).
            pods: Mirror::passing_initial_list(),
            cidr_values: BTreeMap::new(),
            cidrs_absent: false,
            synced: false,
        }
    }

    fn take(&mut self, w: Watched) -> Vec<Update> {
        let mut out = Vec::new();
        match w {
            Watched::Service(e) => out.extend(
                self.services
                    .see(seen(e, |s| Some(service(s))))
                    .into_iter()
                    .map(|(k, v)| Update::Service(k, v)),
            ),
            Watched::Slice(e) => out.extend(
                self.slices
                    .see(seen(e, |s| {
                        Some(slice(s)).filter(|s| s.service_name.is_some())
                    }))
                    .into_iter()
                    .map(|(k, v)| Update::Slice(k, v)),
            ),
            Watched::Node(e) => {
                let first = !self.nodes.listed();
                let changes = self.nodes.see(seen(e, |n| Some(node_info(n))));
                if first && self.nodes.listed() && self.nodes.is_empty() {
                    tracing::warn!(node = %self.node, "no Node object of this name: NodePorts use no node address until it appears (set --hostname-override?)");
                }
                out.extend(changes.into_iter().map(|(_, v)| Update::Node(v)));
            }
            Watched::Pod(e) => {
                let first = !self.pods.listed();
                out.extend(
                    self.pods
                        .see(seen(e, crate::convert::pod))
                        .into_iter()
                        .map(|(k, v)| Update::Pod(k, v)),
                );
                if first && self.pods.listed() {
                    tracing::info!(pods = self.pods.len(), "Pods listed: flows name every pod");
                }
            }
            Watched::CidrsAbsent => self.cidrs_absent = true,
            Watched::Cidr(e) => {
                let changes = self.cidrs.see(seen(e, |c| Some(service_cidrs(&c))));
                if !changes.is_empty() {
                    for (k, v) in changes {
                        match v {
                            Some(v) => self.cidr_values.insert(k, v),
                            None => self.cidr_values.remove(&k),
                        };
                    }
                    let mut all: Vec<IpNet> =
                        self.cidr_values.values().flatten().copied().collect();
                    all.sort();
                    all.dedup();
                    out.push(Update::ServiceCidrs(all));
                }
            }
        }
        // As kube-proxy's first sync has them: the ServiceCIDRs too, where
        // they are served (the drop of unallocated ClusterIPs is then in
        // the first rules).
        let cidrs = self.cidrs.listed() || self.cidrs_absent;
        if !self.synced
            && self.services.listed()
            && self.slices.listed()
            && self.nodes.listed()
            && cidrs
        {
            self.synced = true;
            tracing::info!(
                services = self.services.len(),
                endpoint_slices = self.slices.len(),
                "initial lists complete"
            );
            out.push(Update::Synced);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> Key {
        ("ns".into(), n.into())
    }

    /// An object whose resourceVersion is its value.
    fn v(x: u32) -> Versioned<u32> {
        Some((x.to_string(), x))
    }

    fn listed(m: &mut Mirror<u32>, objs: &[(&str, u32)]) -> Vec<(Key, Option<u32>)> {
        let mut out = m.see(Seen::ListStart);
        for (n, x) in objs {
            out.extend(m.see(Seen::Listed(k(n), v(*x))));
        }
        out.extend(m.see(Seen::ListDone));
        out
    }

    #[test]
    fn the_initial_list_is_passed_on_as_it_comes() {
        let mut m = Mirror::passing_initial_list();
        assert!(m.see(Seen::ListStart).is_empty());
        assert_eq!(m.see(Seen::Listed(k("a"), v(1))), vec![(k("a"), Some(1))]);
        assert!(m.see(Seen::Listed(k("b"), None)).is_empty(), "not used");
        assert!(!m.listed());
        assert!(m.see(Seen::ListDone).is_empty());
        assert!(m.listed());
        assert_eq!(m.len(), 1);
        // The next list is a relist: buffered, and only its difference.
        assert!(m.see(Seen::ListStart).is_empty());
        assert!(m.see(Seen::Listed(k("c"), v(3))).is_empty());
        assert_eq!(
            m.see(Seen::ListDone),
            vec![(k("a"), None), (k("c"), Some(3))]
        );
    }

    #[test]
    fn an_initial_list_broken_off_is_made_good_by_the_next() {
        let mut m = Mirror::passing_initial_list();
        m.see(Seen::ListStart);
        assert_eq!(m.see(Seen::Listed(k("a"), v(1))), vec![(k("a"), Some(1))]);
        assert_eq!(m.see(Seen::Listed(k("b"), v(2))), vec![(k("b"), Some(2))]);
        // The list fails, and the watcher lists again: a is unchanged (not
        // passed on again), b is gone, c is new.
        assert!(m.see(Seen::ListStart).is_empty());
        assert!(m.see(Seen::Listed(k("a"), v(1))).is_empty());
        assert_eq!(m.see(Seen::Listed(k("c"), v(3))), vec![(k("c"), Some(3))]);
        assert!(!m.listed());
        assert_eq!(m.see(Seen::ListDone), vec![(k("b"), None)]);
        assert!(m.listed());
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn a_mirror_that_buffers_reports_its_initial_list_once_complete() {
        // The ServiceCIDRs' watch may first list after the daemon
        // programs: no half of that list may be programmed.
        let mut m = Mirror::default();
        assert!(m.see(Seen::ListStart).is_empty());
        assert!(m.see(Seen::Listed(k("a"), v(1))).is_empty());
        assert!(m.see(Seen::Listed(k("b"), v(2))).is_empty());
        assert_eq!(
            m.see(Seen::ListDone),
            vec![(k("a"), Some(1)), (k("b"), Some(2))]
        );
        assert!(m.listed());
    }

    #[test]
    fn relist_reports_only_the_difference() {
        let mut m = Mirror::default();
        listed(&mut m, &[("a", 1), ("b", 2), ("c", 3)]);
        // After a 410: b is unchanged (not re-sent), a changed, c is gone,
        // d is new.
        let got = listed(&mut m, &[("a", 10), ("b", 2), ("d", 4)]);
        assert_eq!(
            got,
            vec![(k("c"), None), (k("a"), Some(10)), (k("d"), Some(4))]
        );
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn nothing_is_deleted_while_a_relist_is_under_way() {
        let mut m = Mirror::default();
        listed(&mut m, &[("a", 1)]);
        assert!(m.see(Seen::ListStart).is_empty());
        assert!(m.see(Seen::Listed(k("b"), v(2))).is_empty());
        // a is still known, at version 1: seeing it so again is no change.
        assert!(m.see(Seen::Applied(k("a"), v(1))).is_empty());
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn versions_are_opaque_and_only_one_spelling_is_a_number() {
        assert_eq!(Version::of("12345"), Version::Number(12345));
        assert_eq!(Version::of("0"), Version::Number(0));
        // Another spelling of the same number is another version.
        assert_ne!(Version::of("012345"), Version::of("12345"));
        assert_ne!(Version::of("+1"), Version::of("1"));
        assert_eq!(Version::of("abc"), Version::Other("abc".into()));
        let huge = "123456789012345678901234567890";
        assert_eq!(Version::of(huge), Version::Other(huge.into()));
        assert_eq!(Version::of(""), Version::Other("".into()));
    }

    #[test]
    fn a_relist_names_what_went_in_every_namespace() {
        let mut m: Mirror<u32> = Mirror::default();
        let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        let max = "n".repeat(253);
        let mut first = m.see(Seen::ListStart);
        for (ns, n) in [
            ("a", "x"),
            ("a-b", "y"),
            ("", "cluster-wide"),
            ("kube-system", max.as_str()),
        ] {
            first.extend(m.see(Seen::Listed(key(ns, n), v(7))));
        }
        first.extend(m.see(Seen::ListDone));
        assert_eq!(first.len(), 4);
        m.see(Seen::ListStart);
        m.see(Seen::Listed(key("a", "x"), v(7)));
        let mut gone = m.see(Seen::ListDone);
        gone.sort();
        assert_eq!(
            gone,
            vec![
                (key("", "cluster-wide"), None),
                (key("a-b", "y"), None),
                (key("kube-system", &max), None)
            ]
        );
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn applies_and_deletes() {
        let mut m = Mirror::default();
        listed(&mut m, &[]);
        assert_eq!(m.see(Seen::Applied(k("a"), v(1))), vec![(k("a"), Some(1))]);
        assert!(
            m.see(Seen::Applied(k("a"), v(1))).is_empty(),
            "no-op update"
        );
        assert_eq!(m.see(Seen::Deleted(k("a"))), vec![(k("a"), None)]);
        assert!(m.see(Seen::Deleted(k("a"))).is_empty(), "unknown delete");
    }

    #[test]
    fn objects_the_proxy_does_not_use_count_as_absent() {
        let mut m = Mirror::default();
        listed(&mut m, &[("a", 1)]);
        assert_eq!(m.see(Seen::Applied(k("a"), None)), vec![(k("a"), None)]);
        let got = {
            let mut out = m.see(Seen::ListStart);
            out.extend(m.see(Seen::Listed(k("b"), None)));
            out.extend(m.see(Seen::ListDone));
            out
        };
        assert!(got.is_empty());
    }

    #[test]
    fn an_object_that_does_not_decode_keeps_what_was_known_and_its_key() {
        let mut m = Mirror::passing_initial_list();
        m.see(Seen::ListStart);
        assert_eq!(m.see(Seen::Listed(k("a"), v(1))), vec![(k("a"), Some(1))]);
        // Listed but undecodable: nothing passed, but known.
        assert!(m.see(Seen::Skipped(k("b"), "2".into(), true)).is_empty());
        assert!(m.see(Seen::ListDone).is_empty());
        assert_eq!(m.len(), 2);
        // A change of a that does not decode: a stays as it was.
        assert!(m.see(Seen::Skipped(k("a"), "3".into(), false)).is_empty());
        // Deleting either is passed on.
        assert_eq!(m.see(Seen::Deleted(k("a"))), vec![(k("a"), None)]);
        assert_eq!(m.see(Seen::Deleted(k("b"))), vec![(k("b"), None)]);
        // An undecodable change of an unknown object makes it known, so
        // that its deletion is passed on too.
        assert!(m.see(Seen::Skipped(k("c"), "4".into(), false)).is_empty());
        assert_eq!(m.see(Seen::Deleted(k("c"))), vec![(k("c"), None)]);
    }

    #[test]
    fn a_relist_keeps_an_object_that_does_not_decode() {
        let mut m = Mirror::default();
        listed(&mut m, &[("a", 1), ("b", 2)]);
        m.see(Seen::ListStart);
        m.see(Seen::Listed(k("a"), v(1)));
        m.see(Seen::Skipped(k("b"), "5".into(), true));
        assert!(
            m.see(Seen::ListDone).is_empty(),
            "b is neither deleted nor changed"
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.see(Seen::Deleted(k("b"))), vec![(k("b"), None)]);
    }

    fn svc(name: &str) -> objects::Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1"},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}
        }))
        .unwrap()
    }

    #[test]
    fn synced_comes_once_after_services_slices_and_node_are_listed() {
        let mut f = Mirrors::new("n1".into());
        let synced = std::cell::Cell::new(0);
        let run = |f: &mut Mirrors, w: Watched| {
            let out = f.take(w);
            synced.set(synced.get() + out.iter().filter(|u| **u == Update::Synced).count());
            out
        };
        run(&mut f, Watched::Service(Event::ListStart));
        let out = run(&mut f, Watched::Service(Event::Listed(svc("a"))));
        assert!(matches!(&out[..], [Update::Service(k, Some(_))] if k.1 == "a"));
        let out = run(&mut f, Watched::Service(Event::ListDone));
        assert!(out.is_empty());
        run(&mut f, Watched::Slice(Event::ListStart));
        run(&mut f, Watched::Slice(Event::ListDone));
        assert_eq!(synced.get(), 0, "the Node is not listed yet");
        run(&mut f, Watched::Node(Event::ListStart));
        let out = run(&mut f, Watched::Node(Event::ListDone));
        assert!(out.is_empty(), "ServiceCIDRs may be served: {out:?}");
        // Not served: the first sync goes ahead without them.
        let out = run(&mut f, Watched::CidrsAbsent);
        assert_eq!(out, vec![Update::Synced]);
        // A later relist of Services does not sync again.
        run(&mut f, Watched::Service(Event::ListStart));
        let out = run(&mut f, Watched::Service(Event::ListDone));
        assert!(matches!(&out[..], [Update::Service(k, None)] if k.1 == "a"));
        assert_eq!(synced.get(), 1);
    }

    #[test]
    fn the_first_sync_waits_for_served_service_cidrs_and_has_them() {
        let mut f = Mirrors::new("n1".into());
        for w in [
            Watched::Service(Event::ListStart),
            Watched::Service(Event::ListDone),
            Watched::Slice(Event::ListStart),
            Watched::Slice(Event::ListDone),
            Watched::Node(Event::ListStart),
        ] {
            f.take(w);
        }
        assert!(f.take(Watched::Node(Event::ListDone)).is_empty());
        let cidr = |name: &str, range: &str| -> objects::ServiceCidr {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "resourceVersion": "1"},
                "spec": {"cidrs": [range]}
            }))
            .unwrap()
        };
        f.take(Watched::Cidr(Event::ListStart));
        let first = f.take(Watched::Cidr(Event::Listed(cidr("a", "10.96.0.0/16"))));
        assert!(first.is_empty(), "half a list: {first:?}");
        f.take(Watched::Cidr(Event::Listed(cidr("b", "10.97.0.0/16"))));
        // The whole list, then the first sync, in one batch.
        let done = f.take(Watched::Cidr(Event::ListDone));
        assert_eq!(
            done,
            vec![
                Update::ServiceCidrs(vec![
                    "10.96.0.0/16".parse().unwrap(),
                    "10.97.0.0/16".parse().unwrap()
                ]),
                Update::Synced
            ]
        );
        // A ServiceCIDR listed later (served after an upgrade) comes whole
        // too, and syncs nothing again.
        f.take(Watched::Cidr(Event::ListStart));
        f.take(Watched::Cidr(Event::Listed(cidr("c", "10.98.0.0/16"))));
        let again = f.take(Watched::Cidr(Event::ListDone));
        assert_eq!(again.len(), 1, "{again:?}");
    }

    fn config_for(master: &str) -> Result<Config, SourceError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(client_config(&ApiSource {
            master: Some(master.into()),
            ..ApiSource::default()
        }))
    }

    #[test]
    fn master_alone_is_the_server_and_https_by_default() {
        let c = config_for("10.0.0.1:6443").unwrap();
        assert_eq!(c.cluster_url.to_string(), "https://10.0.0.1:6443/");
        let c = config_for("http://127.0.0.1:8080").unwrap();
        assert_eq!(c.cluster_url.to_string(), "http://127.0.0.1:8080/");
        let e = config_for("not a url").map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("--master not a url"), "{e}");
    }

    #[test]
    fn selectors_match_kube_proxy_1_36() {
        assert_eq!(
            service_selectors(),
            (
                "!service.kubernetes.io/service-proxy-name".to_string(),
                "spec.clusterIP!=None".to_string()
            )
        );
        assert_eq!(slice_selector(), "!service.kubernetes.io/headless");
    }
}
