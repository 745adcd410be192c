//! The kernel's connection-tracking table, as verdict uses it: list the
//! UDP entries of a family, delete entries by original destination and
//! reply source, as kube-proxy's reconciler does, and list the connections
//! that were DNATed (what `verdict connections` and the web view show).
//! [`NetlinkConntrack`](crate::netlink::NetlinkConntrack) speaks ctnetlink
//! (the default); [`ConntrackCli`] runs the `conntrack` program.

mod cli;

pub use cli::ConntrackCli;

use std::net::IpAddr;

use crate::ir::Family;

/// A UDP conntrack entry, reduced to what stale-entry cleanup looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UdpEntry {
    /// Original direction: the address the client sent to.
    pub orig_dst: IpAddr,
    /// Original direction: the port the client sent to.
    pub orig_dport: u16,
    /// Reply direction: who answers (the endpoint, after DNAT).
    pub reply_src: IpAddr,
    /// Reply direction: the port that answers.
    pub reply_sport: u16,
}

/// A connection the kernel DNATed, as `conntrack -L --dst-nat` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// `tcp`, `udp`, `sctp`, …
    pub proto: String,
    /// The TCP or SCTP state (`ESTABLISHED`, `TIME_WAIT`, …); empty for UDP.
    pub state: String,
    /// Seconds until the entry expires.
    pub timeout: u64,
    /// Original direction: the client.
    pub src: IpAddr,
    /// Original direction: the client's port.
    pub sport: u16,
    /// Original direction: the address the client sent to.
    pub dst: IpAddr,
    /// Original direction: the port the client sent to.
    pub dport: u16,
    /// Reply direction: who answers (the endpoint, after DNAT).
    pub reply_src: IpAddr,
    /// Reply direction: the port that answers.
    pub reply_sport: u16,
    /// Packets and bytes both ways, when conntrack accounting is on
    /// (`net.netfilter.nf_conntrack_acct`).
    pub packets: Option<u64>,
    /// See `packets`.
    pub bytes: Option<u64>,
    /// Replies were seen (`[UNREPLIED]` is absent).
    pub replied: bool,
}

/// Why the conntrack table could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The conntrack table cannot be reached: the `conntrack` program
    /// could not be run, or the ctnetlink socket not opened.
    #[error("cannot reach the conntrack table: {0}")]
    Unavailable(String),
    /// conntrack ran and failed.
    #[error("conntrack {args} failed: {message}")]
    Failed {
        /// The arguments it was given.
        args: String,
        /// What it printed.
        message: String,
    },
}

/// What stale-entry cleanup and the connection listings need of the
/// conntrack table: [`ConntrackCli`] runs the `conntrack` program,
/// [`NetlinkConntrack`](crate::netlink::NetlinkConntrack) speaks ctnetlink.
pub trait Conntrack: Send {
    /// The UDP entries of `family`.
    fn list_udp(&mut self, family: Family) -> Result<Vec<UdpEntry>, ConntrackError>;
    /// The connections of `family` that were DNATed.
    fn list_dnat(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError>;
    /// Deletes the UDP entries to `entry.orig_dst:orig_dport` answered by
    /// `entry.reply_src:reply_sport`. Returns how many were deleted.
    fn delete_udp(&mut self, family: Family, entry: &UdpEntry) -> Result<usize, ConntrackError>;
    /// The TCP and SCTP connections of `family` that were never answered
    /// and never NATed: a client whose first packet reached an address
    /// before anything (a Service's rules) took it, and whose
    /// retransmissions keep to that entry.
    fn list_unanswered(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError>;
    /// Deletes the entry of `flow` (by its original direction); `false`
    /// if it was gone already.
    fn delete_flow(&mut self, family: Family, flow: &Flow) -> Result<bool, ConntrackError>;
}
