//! verdict's administrative endpoints: kube-proxy's `/healthz` and
//! `/livez` (metrics come next).
//!
//! # Layout
//! - [`health`]: the health state (pure; time is passed in).
//! - [`http`]: a small HTTP/1.1 server for it.
//! - [`time`]: Go's RFC 3339 time format, as kube-proxy's JSON uses it.

pub mod health;
pub mod http;
pub mod time;

pub use health::{Family, Health, Response};
