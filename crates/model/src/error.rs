//! Errors of the domain model.

use crate::names::NamespacedName;

/// A value in an API object that the proxy cannot use. Messages name the object
/// (`"ns/name"`) and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A `spec.clusterIPs` entry that is not an IP address of the expected family.
    #[error("service {service}: invalid spec.clusterIPs entry {value:?}")]
    InvalidClusterIp {
        /// The Service.
        service: NamespacedName,
        /// The offending text.
        value: String,
    },
    /// A port number outside 1-65535.
    #[error("service {service}: {field} {value} of port {port_name:?} is out of range 1-65535")]
    InvalidPort {
        /// The Service.
        service: NamespacedName,
        /// The API field, e.g. `spec.ports[].port`.
        field: &'static str,
        /// The name of the service port (`""` if unnamed).
        port_name: String,
        /// The offending number.
        value: i32,
    },
    /// A ClientIP session-affinity timeout that is not a positive number of seconds.
    #[error(
        "service {service}: spec.sessionAffinityConfig.clientIP.timeoutSeconds {value} must be positive"
    )]
    InvalidSessionAffinityTimeout {
        /// The Service.
        service: NamespacedName,
        /// The offending number.
        value: i32,
    },
    /// A protocol name that is not TCP, UDP or SCTP.
    #[error("unknown protocol {value:?} (expected TCP, UDP or SCTP)")]
    UnknownProtocol {
        /// The offending text.
        value: String,
    },
}
