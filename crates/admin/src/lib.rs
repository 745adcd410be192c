//! verdict's administrative endpoints: kube-proxy's `/healthz` and
//! `/livez`, and its `kubeproxy_*` metrics.
//!
//! # Layout
//! - [`health`]: the health state (pure; time is passed in).
//! - [`http`]: a small HTTP/1.1 server for it.
//! - [`service_health`]: health-check node ports of eTP=Local LoadBalancers.
//! - [`metrics`]: the metrics registry and its text format.
//! - [`process`]: the `process_*` metrics, from `/proc/self`.
//! - [`time`]: Go's RFC 3339 time format, as kube-proxy's JSON uses it.
//! - [`zpages`]: `/flagz` and `/statusz`, as component-base serves them.

pub mod health;
pub mod http;
pub mod metrics;
pub mod process;
pub mod service_health;
pub mod time;
pub mod zpages;

pub use health::{Family, Health, Response, Stream};
pub use metrics::Metrics;
