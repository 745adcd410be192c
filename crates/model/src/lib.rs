#![doc = r#"
The pure domain model of verdict, a Kubernetes Service proxy that replaces
kube-proxy's nftables mode.

This crate turns the Kubernetes objects the proxy watches (Services and
EndpointSlices) into the per-IP-family service ports and endpoint lists that the
rule builder consumes, with kube-proxy's exact semantics: legacy IP parsing, which
services are proxied, traffic policies, topology hints, terminating endpoints and
change tracking between syncs. It does no I/O, no async and talks to neither the
kernel nor the API server, so every rule here is unit-tested in isolation.

# Layout

* [`api`](crate::api) — plain mirrors of the API fields read (`Service`, `EndpointSlice`, ...).
* `ip` — [`IpFamily`] and the legacy (leading-zeros-are-decimal) IP/CIDR parsers.
* `names` — [`Protocol`], [`NamespacedName`], [`ServicePortName`].
* `service` — [`ServicePort`], [`service_ports`], [`should_skip_service`].
* `endpoints` — [`Endpoint`], its canonical (Display-string) order, [`EndpointsMap`].
* `topology` — [`categorize_endpoints`] (cluster/local endpoint selection).
* `pod` — [`Pod`]: a pod as the flow stream names it (the opt-in watch of Pods).
* `selection` — [`MetricsSelection`]: which Services are counted per Service.
* `slice_cache` — [`EndpointSliceCache`], merging slices per service port.
* `tracker` — [`ServiceChangeTracker`] and [`EndpointsChangeTracker`], folding
  watch events between syncs.
* `error` — [`ModelError`].

Everything is re-exported at the crate root.
"#]

pub mod api;
mod endpoints;
mod error;
mod ip;
mod names;
mod pod;
mod selection;
mod service;
mod slice_cache;
mod topology;
mod tracker;

pub use api::{
    AddressType, EndpointHints, EndpointSlice, LoadBalancerIngress, LoadBalancerIpMode, Service,
    ServicePortSpec, ServiceType, SessionAffinity, SliceEndpoint, SlicePort, TrafficPolicy,
};
pub use endpoints::{
    Endpoint, EndpointsMap, Hints, cmp_by_display, local_ready_endpoints, local_ready_endpoints_of,
    sort_endpoints,
};
pub use error::ModelError;
pub use ip::{IpFamily, parse_cidr_legacy, parse_ip_legacy};
pub use names::{Name, NamespacedName, Protocol, ServicePortName};
pub use pod::{LABEL_POD_TEMPLATE_HASH, Pod, Workload, workload_of};
pub use selection::{Counting, LabelSelector, MetricsSelection};
pub use service::{
    DEFAULT_SESSION_AFFINITY_TIMEOUT_SECONDS, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME,
    ServicePort, ServicePortMap, is_headless, service_port_map, service_ports, should_skip_service,
};
pub use slice_cache::EndpointSliceCache;
pub use topology::{CategorizedEndpoints, NodeTopology, categorize_endpoints};
pub use tracker::{
    EndpointsChangeTracker, EndpointsUpdateResult, ServiceChangeTracker, ServiceUpdateResult,
};

/// Settles the allocator's arena of the calling thread. A thread that
/// frees hundreds of thousands of small allocations, or whose objects
/// another thread frees (a full sync's transaction and read-back, a
/// source's parsed objects once the node has them), leaves them in
/// glibc's fast bins and unsorted list, and the arena's next large
/// requests merge and sort them, at most 10,000 chunks each: 13 ms added
/// to the first endpoint change after a cold sync at 30,000 Services.
/// Call when nothing waits for the thread: enough large requests to sort
/// that many chunks are made now. With another allocator it only
/// allocates and frees 32 KiB 64 times: the `verdict` binary runs on
/// mimalloc and does not call it; a program that runs the proxier on
/// glibc's allocator (`verdict-bench backends`) does.
pub fn settle_allocator() {
    for _ in 0..64 {
        drop(std::hint::black_box(Vec::<u8>::with_capacity(32 << 10)));
    }
}

/// Rebuilds a B-tree from its own entries, in one piece: its nodes are
/// then full. One insert after another in key order leaves each node about
/// half full, and out of order about two thirds; a cold start inserts tens
/// of thousands of entries into maps that stay that size.
pub fn compact<K: Ord, V>(map: &mut std::collections::BTreeMap<K, V>) {
    *map = std::mem::take(map).into_iter().collect();
}

/// Whether a batch of `batch` changes to a map of `len` entries is large
/// enough to [`compact`] it after: it at least doubles what was there, so
/// the rebuild costs no more than the batch did.
pub fn worth_compacting(batch: usize, len: usize) -> bool {
    batch >= 1_000 && batch >= len
}
