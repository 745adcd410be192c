//! Packet traces, as the kernel reports them: the netfilter group
//! `NFNLGRP_NFTRACE` (what `nft monitor trace` reads), one message per
//! rule a packet with `meta nftrace set 1` matches, per chain it returns
//! from and per base chain whose policy decides it. The first message of
//! each base chain the packet enters carries its headers.
//!
//! [`TraceMonitor`] reads the socket; [`decode`] turns a datagram into
//! [`TraceEvent`]s and holds no socket, so it is tested without a kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::netlink::family_name;
use crate::netlink::socket::{Datagram, Protocol, Socket};
use crate::netlink::wire::{Attrs, messages};

/// `NFNLGRP_NFTRACE`.
const GROUP_NFTRACE: u32 = 9;
/// `NFT_MSG_TRACE` of `NFNL_SUBSYS_NFTABLES`.
const MSG_TRACE: u16 = 10 << 8 | 17;
// `enum nft_trace_attributes`.
const TRACE_TABLE: u16 = 1;
const TRACE_CHAIN: u16 = 2;
const TRACE_RULE_HANDLE: u16 = 3;
const TRACE_TYPE: u16 = 4;
const TRACE_VERDICT: u16 = 5;
const TRACE_ID: u16 = 6;
const TRACE_NETWORK_HEADER: u16 = 8;
const TRACE_TRANSPORT_HEADER: u16 = 9;
const TRACE_POLICY: u16 = 16;
// `enum nft_trace_types`.
const TYPE_POLICY: u32 = 1;
const TYPE_RETURN: u32 = 2;
const TYPE_RULE: u32 = 3;

/// What one trace message reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// The packet matched the rule with this handle.
    Rule(u64),
    /// The chain ended without a verdict: back to its caller.
    Return,
    /// The base chain's policy decided.
    Policy,
}

/// The headers the first message of a base chain carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// The destination address.
    pub daddr: IpAddr,
    /// The layer-4 protocol number.
    pub proto: u8,
    /// The destination port (TCP, UDP, SCTP).
    pub dport: Option<u16>,
}

/// One message of a packet's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// The trace's id: the same for every message about one packet (the
    /// kernel derives it from the packet's buffer, so a later packet of a
    /// connection may carry an earlier one's).
    pub id: u32,
    /// The table's family, as nft names it.
    pub family: &'static str,
    /// The table.
    pub table: String,
    /// The chain.
    pub chain: String,
    /// What happened.
    pub kind: TraceKind,
    /// The verdict, as `nft monitor trace` prints it (`accept`, `jump
    /// services`, `continue`, ...), when there is one.
    pub verdict: Option<String>,
    /// The packet's headers, on the first message of a base chain.
    pub headers: Option<Headers>,
}

/// A verdict code and chain as nft prints them.
fn verdict_text(v: Attrs<'_>) -> Option<String> {
    let code = v.i32_be(1)?;
    let chain = v.str(2).unwrap_or_default();
    Some(match code {
        0 => "drop".into(),
        1 => "accept".into(),
        2 => "stolen".into(),
        3 => "queue".into(),
        -1 => "continue".into(),
        -2 => "break".into(),
        -3 => format!("jump {chain}"),
        -4 => format!("goto {chain}"),
        -5 => "return".into(),
        other => format!("verdict {other}"),
    })
}

fn headers(a: Attrs<'_>) -> Option<Headers> {
    let net = a.get(TRACE_NETWORK_HEADER)?;
    let (daddr, proto) = match net.first()? >> 4 {
        4 => (
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(net.get(16..20)?).ok()?)),
            *net.get(9)?,
        ),
        6 => (
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(net.get(24..40)?).ok()?)),
            *net.get(6)?,
        ),
        _ => return None,
    };
    let dport = match proto {
        6 | 17 | 132 => a
            .get(TRACE_TRANSPORT_HEADER)
            .and_then(|t| t.get(2..4))
            .map(|p| u16::from_be_bytes([p[0], p[1]])),
        _ => None,
    };
    Some(Headers {
        daddr,
        proto,
        dport,
    })
}

/// The trace messages of one datagram; anything else is skipped.
pub fn decode(buf: &[u8]) -> Vec<TraceEvent> {
    messages(buf)
        .filter(|m| m.kind == MSG_TRACE)
        .filter_map(|m| {
            let (nfproto, a) = m.nfgen()?;
            // The end of a chain comes as a rule message without a
            // handle on some kernels, as a return on others.
            let kind = match (a.u32_be(TRACE_TYPE)?, a.u64_be(TRACE_RULE_HANDLE)) {
                (TYPE_RULE, Some(handle)) => TraceKind::Rule(handle),
                (TYPE_RULE | TYPE_RETURN, _) => TraceKind::Return,
                (TYPE_POLICY, _) => TraceKind::Policy,
                _ => return None,
            };
            let verdict = match kind {
                TraceKind::Policy => a
                    .u32_be(TRACE_POLICY)
                    .map(|p| if p == 1 { "accept" } else { "drop" }.to_owned()),
                _ => a.nested(TRACE_VERDICT).and_then(verdict_text),
            };
            Some(TraceEvent {
                id: a.u32_be(TRACE_ID)?,
                family: family_name(nfproto),
                table: a.str(TRACE_TABLE)?.to_owned(),
                chain: a.str(TRACE_CHAIN)?.to_owned(),
                kind,
                verdict,
                headers: headers(a),
            })
        })
        .collect()
}

/// The trace group, in the caller's network namespace (CAP_NET_ADMIN).
#[derive(Debug)]
pub struct TraceMonitor {
    socket: Socket,
}

impl TraceMonitor {
    /// Joins the group: traces of packets marked from now on arrive.
    pub fn open() -> std::io::Result<TraceMonitor> {
        Ok(TraceMonitor {
            socket: Socket::listen(Protocol::NetFilter, 1 << (GROUP_NFTRACE - 1), 4 << 20)?,
        })
    }

    /// The next trace messages, waiting at most `timeout` (`Ok(None)`:
    /// none came). Lost messages (a full buffer) end nothing: what
    /// arrives afterwards is returned.
    pub fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<TraceEvent>>> {
        Ok(match self.socket.next_within(timeout)? {
            Some(Datagram::Messages(buf)) => Some(decode(buf)),
            Some(Datagram::Overflow) => Some(Vec::new()),
            None => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::wire::Writer;

    /// The trace messages the kernel sends, written with the backend's own
    /// writer: (chain, type, handle, verdict code and chain, headers).
    fn message(w: &mut Writer, chain: &str, kind: u32, handle: Option<u64>) {
        w.begin(MSG_TRACE, 0, 0, 2, 0);
        w.u32_be(TRACE_ID, 0x1a2b_3c4d);
        w.str(TRACE_TABLE, "verdict");
        w.str(TRACE_CHAIN, chain);
        w.u32_be(TRACE_TYPE, kind);
        if let Some(h) = handle {
            w.u64_be(TRACE_RULE_HANDLE, h);
        }
    }

    #[test]
    fn a_rule_message_names_its_chain_rule_and_verdict() {
        let mut w = Writer::new();
        message(&mut w, "nat-output", TYPE_RULE, Some(7));
        let v = w.open(TRACE_VERDICT);
        w.u32_be(1, (-3i32) as u32);
        w.str(2, "services");
        w.close(v).unwrap();
        let mut ip = vec![0u8; 20];
        ip[0] = 0x45;
        ip[9] = 6;
        ip[16..20].copy_from_slice(&[172, 30, 0, 41]);
        w.attr(TRACE_NETWORK_HEADER, &ip);
        w.attr(TRACE_TRANSPORT_HEADER, &[0xa0, 0x12, 0, 80, 0, 0, 0, 0]);
        message(&mut w, "filter-output", TYPE_POLICY, None);
        w.u32_be(TRACE_POLICY, 1);
        // The end of a chain, as this kernel reports it: a rule message
        // without a handle.
        message(&mut w, "firewall-check", TYPE_RULE, None);
        w.end();
        let d = w.bytes();
        let events = decode(d);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0].id, 0x1a2b_3c4d);
        assert_eq!(
            (events[0].family, events[0].table.as_str()),
            ("ip", "verdict")
        );
        assert_eq!(events[0].chain, "nat-output");
        assert_eq!(events[0].kind, TraceKind::Rule(7));
        assert_eq!(events[0].verdict.as_deref(), Some("jump services"));
        assert_eq!(
            events[0].headers,
            Some(Headers {
                daddr: "172.30.0.41".parse().unwrap(),
                proto: 6,
                dport: Some(80)
            })
        );
        assert_eq!(events[1].kind, TraceKind::Policy);
        assert_eq!(events[1].verdict.as_deref(), Some("accept"));
        assert_eq!(events[1].headers, None);
        assert_eq!(events[2].kind, TraceKind::Return);
        // Cut anywhere, nothing panics and nothing half-read comes out.
        for cut in 0..d.len() {
            assert!(decode(&d[..cut]).len() <= 2);
        }
    }
}
