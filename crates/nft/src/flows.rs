//! What the kernel reports of connections, for the flow stream: the
//! conntrack table's events (a connection confirmed, a connection gone;
//! ctnetlink's groups `NFNLGRP_CONNTRACK_NEW` and `_DESTROY`) and the
//! packets the table's rules log to an nfnetlink_log group (the first
//! packet of each connection they reject or drop, with a prefix that says
//! why). Both arrive on one netfilter socket, read by one thread.
//!
//! The kernel builds a conntrack event only while some socket listens, and
//! never waits for the reader: when the socket's buffer is full it drops
//! what does not fit and says so once ([`FlowEvent::Lost`]). A logged
//! packet is queued the same way. So reading costs the data path the
//! building of one message per connection, and nothing when the reader
//! falls behind.
//!
//! [`FlowMonitor`] holds the socket; [`decode`] turns a datagram into
//! [`FlowEvent`]s and holds none, so it is tested without a kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use nix::errno::Errno;

use crate::error::NftError;
use crate::netlink::conntrack::{
    IPS_DST_NAT, IPS_SRC_NAT, MSG_CT_DELETE, MSG_CT_NEW, SUBSYS_CTNETLINK, entry,
};
use crate::netlink::socket::{Datagram, Membership, Protocol, Socket};
use crate::netlink::wire::{Writer, messages};

/// `NFNLGRP_CONNTRACK_NEW` and `NFNLGRP_CONNTRACK_DESTROY`.
const GROUP_CT_NEW: u32 = 1;
const GROUP_CT_DESTROY: u32 = 3;
/// `NFNL_SUBSYS_ULOG`, its messages and attributes.
const SUBSYS_ULOG: u16 = 4;
const MSG_ULOG_PACKET: u16 = 0;
const MSG_ULOG_CONFIG: u16 = 1;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_CFG_CMD_UNBIND: u8 = 2;
const NFULNL_COPY_PACKET: u8 = 2;
/// Bytes of each logged packet copied: its IP header (IPv6's 40, IPv4's
/// up to 60) and the ports after it.
const COPY_RANGE: u32 = 96;
/// The kernel sends logged packets in batches of at most this many…
const LOG_BATCH: u32 = 32;
/// …or after this long (hundredths of a second), whichever comes first.
const LOG_FLUSH_CS: u32 = 10;
/// The socket's receive buffer: about 20,000 events.
const BUFFER: usize = 8 << 20;

/// One conntrack entry, as an event reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The kernel's id of the entry: the same in its confirmation and its
    /// destruction.
    pub id: Option<u32>,
    /// The layer-4 protocol number.
    pub proto: u8,
    /// The client (original source).
    pub client: SocketAddr,
    /// Where the client sent it (original destination: the entry point).
    pub dst: SocketAddr,
    /// Who answers (the endpoint, when it was DNATed).
    pub reply_src: SocketAddr,
    /// Whom the answers go to (not the client when it was masqueraded).
    pub reply_dst: SocketAddr,
    /// The destination was translated (`IPS_DST_NAT`).
    pub dnat: bool,
    /// The source was translated (`IPS_SRC_NAT`: masqueraded).
    pub snat: bool,
    /// Packets both ways, when conntrack accounting is on
    /// (`net.netfilter.nf_conntrack_acct`; on a destruction).
    pub packets: Option<u64>,
    /// Bytes both ways, likewise.
    pub bytes: Option<u64>,
}

/// A packet a rule logged, reduced to its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// The rule's log prefix.
    pub prefix: String,
    /// The nfnetlink_log group.
    pub group: u16,
    /// The layer-4 protocol number.
    pub proto: u8,
    /// Its source.
    pub src: SocketAddr,
    /// Its destination (ports are 0 for a protocol without them).
    pub dst: SocketAddr,
}

/// One report of the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlowEvent {
    /// A connection was confirmed: its first packet made it through.
    New(Connection),
    /// A connection's entry is gone (closed, or timed out).
    Destroyed(Connection),
    /// A rule logged a packet.
    Logged(Logged),
    /// The kernel dropped reports: the socket's buffer was full.
    Lost,
}

fn sock(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

fn connection(a: crate::netlink::wire::Attrs<'_>) -> Option<Connection> {
    let e = entry(a)?;
    Some(Connection {
        id: e.id,
        proto: e.orig.proto,
        client: sock(e.orig.src, e.orig.sport),
        dst: sock(e.orig.dst, e.orig.dport),
        reply_src: sock(e.reply.src, e.reply.sport),
        reply_dst: sock(e.reply.dst, e.reply.dport),
        dnat: e.status & IPS_DST_NAT != 0,
        snat: e.status & IPS_SRC_NAT != 0,
        packets: e.packets,
        bytes: e.bytes,
    })
}

/// The source, destination and protocol of a packet from its network
/// header on (what nfnetlink_log copies).
fn headers(p: &[u8]) -> Option<(u8, SocketAddr, SocketAddr)> {
    let (proto, src, dst, l4) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p.first()? & 0x0f) * 4;
            let src = Ipv4Addr::from(<[u8; 4]>::try_from(p.get(12..16)?).ok()?);
            let dst = Ipv4Addr::from(<[u8; 4]>::try_from(p.get(16..20)?).ok()?);
            (*p.get(9)?, IpAddr::V4(src), IpAddr::V4(dst), p.get(ihl..))
        }
        6 => {
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(p.get(8..24)?).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(p.get(24..40)?).ok()?);
            (*p.get(6)?, IpAddr::V6(src), IpAddr::V6(dst), p.get(40..))
        }
        _ => return None,
    };
    let (sport, dport) = match (proto, l4) {
        (6 | 17 | 132, Some(t)) if t.len() >= 4 => (
            u16::from_be_bytes([t[0], t[1]]),
            u16::from_be_bytes([t[2], t[3]]),
        ),
        (6 | 17 | 132, _) => return None,
        _ => (0, 0),
    };
    Some((proto, sock(src, sport), sock(dst, dport)))
}

/// The reports in one datagram; anything else is skipped.
pub fn decode(buf: &[u8]) -> Vec<FlowEvent> {
    messages(buf)
        .filter_map(|m| {
            let (_, a) = m.nfgen()?;
            let res_id = m
                .payload
                .get(2..4)
                .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
            match m.kind {
                k if k == SUBSYS_CTNETLINK << 8 | MSG_CT_NEW => connection(a).map(FlowEvent::New),
                k if k == SUBSYS_CTNETLINK << 8 | MSG_CT_DELETE => {
                    connection(a).map(FlowEvent::Destroyed)
                }
                k if k == SUBSYS_ULOG << 8 | MSG_ULOG_PACKET => {
                    let (proto, src, dst) = headers(a.get(NFULA_PAYLOAD)?)?;
                    Some(FlowEvent::Logged(Logged {
                        prefix: a.str(NFULA_PREFIX).unwrap_or_default().to_owned(),
                        group: res_id,
                        proto,
                        src,
                        dst,
                    }))
                }
                _ => None,
            }
        })
        .collect()
}

/// The conntrack events and one nfnetlink_log group, in the caller's
/// network namespace (CAP_NET_ADMIN).
#[derive(Debug)]
pub struct FlowMonitor {
    socket: Socket,
    group: Option<u16>,
    /// The socket's membership of conntrack's groups.
    connections: Membership,
    following: bool,
}

/// Conntrack's groups the monitor follows connections with.
const CONNECTION_GROUPS: u32 = 1 << (GROUP_CT_NEW - 1) | 1 << (GROUP_CT_DESTROY - 1);

impl FlowMonitor {
    /// Binds, with `group`, that nfnetlink_log group (which one process at
    /// a time may read: another one's is refused, and nothing is listened
    /// to then) and, with `follow`, listens to the conntrack events at
    /// once (else from [`FlowMonitor::follow`] on).
    pub fn open(group: Option<u16>, follow: bool) -> Result<FlowMonitor, NftError> {
        let groups = if follow { CONNECTION_GROUPS } else { 0 };
        let socket = Socket::listen(Protocol::NetFilter, groups, BUFFER)
            .map_err(|e| NftError::Refused(format!("listening to conntrack events: {e}")))?;
        let connections = socket
            .membership(CONNECTION_GROUPS)
            .map_err(|e| NftError::Refused(format!("listening to conntrack events: {e}")))?;
        let mut m = FlowMonitor {
            socket,
            group: None,
            connections,
            following: follow,
        };
        if let Some(g) = group {
            m.configure(g, |w| w.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]))
                .map_err(|e| match e {
                    Errno::EBUSY => NftError::Refused(format!(
                        "nfnetlink_log group {g} is read by another process"
                    )),
                    e => {
                        NftError::Refused(format!("binding nfnetlink_log group {g}: {}", e.desc()))
                    }
                })?;
            m.group = Some(g);
            m.configure(g, |w| {
                let mut mode = COPY_RANGE.to_be_bytes().to_vec();
                mode.extend([NFULNL_COPY_PACKET, 0]);
                w.attr(NFULA_CFG_MODE, &mode);
                w.u32_be(NFULA_CFG_QTHRESH, LOG_BATCH);
                w.u32_be(NFULA_CFG_TIMEOUT, LOG_FLUSH_CS);
            })
            .map_err(|e| {
                NftError::Refused(format!("configuring nfnetlink_log group {g}: {}", e.desc()))
            })?;
        }
        Ok(m)
    }

    /// Starts or stops listening to conntrack's events. While it does, the
    /// kernel builds a report of each new connection in the path of its
    /// first packet (what that costs a connection is measured in
    /// `docs/flows.md`), and of each connection's end; while nothing in
    /// the network namespace listens, it builds none. The nfnetlink_log
    /// group stays bound either way.
    pub fn follow(&mut self, on: bool) -> std::io::Result<()> {
        if on != self.following {
            if on {
                self.connections.join()?;
            } else {
                self.connections.leave()?;
            }
            self.following = on;
        }
        Ok(())
    }

    /// Whether it listens to conntrack's events.
    pub fn following(&self) -> bool {
        self.following
    }

    /// One configuration message of the group, acknowledged.
    fn configure(&mut self, group: u16, attrs: impl FnOnce(&mut Writer)) -> Result<(), Errno> {
        let r = self
            .socket
            .request_for(SUBSYS_ULOG << 8 | MSG_ULOG_CONFIG, 0, group, attrs)
            .map_err(|_| Errno::EIO)?;
        match r.errors.first() {
            Some((_, errno)) => Err(Errno::from_raw(*errno)),
            None => Ok(()),
        }
    }

    /// The next reports, waiting at most `timeout` (`Ok(None)`: none came).
    pub fn next(&mut self, timeout: Duration) -> std::io::Result<Option<Vec<FlowEvent>>> {
        Ok(match self.socket.next_within(timeout)? {
            Some(Datagram::Messages(buf)) => Some(decode(buf)),
            Some(Datagram::Overflow) => Some(vec![FlowEvent::Lost]),
            None => None,
        })
    }
}

impl FlowMonitor {
    /// How many messages the kernel has dropped for this socket since it
    /// opened (its `Drops` in `/proc/net/netlink`): each a conntrack event,
    /// or a batch of logged packets, that was not read.
    pub fn dropped(&self) -> Option<u64> {
        let portid = self.socket.portid().ok()?;
        let table = std::fs::read_to_string("/proc/net/netlink").ok()?;
        drops_of(&table, portid)
    }
}

/// The `Drops` of the socket with this port id in `/proc/net/netlink`'s
/// table (columns: sk, Eth, Pid, Groups, Rmem, Wmem, Dump, Locks, Drops,
/// Inode; netfilter's protocol is 12).
fn drops_of(table: &str, portid: u32) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.get(1) == Some(&"12") && cols.get(2)?.parse::<u32>().ok()? == portid)
            .then(|| cols.get(8)?.parse().ok())
            .flatten()
    })
}

impl Drop for FlowMonitor {
    fn drop(&mut self) {
        // The group is freed when the socket closes; unbinding first says
        // so at once.
        if let Some(g) = self.group {
            let _ = self.configure(g, |w| w.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_UNBIND]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::conntrack::tests::message;
    use crate::netlink::conntrack::{IPS_DST_NAT, Tuple};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_sockets_drops_are_read_from_proc() {
        let table = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
            ffff8a0c41b1e000 0   4242       00000111 0        0        0     2        0        1\n\
            ffff8a0c41b1e800 12  4242       00000005 0        0        0     2        17       2\n";
        assert_eq!(drops_of(table, 4242), Some(17));
        assert_eq!(drops_of(table, 1), None);
    }

    #[test]
    fn conntrack_events_and_logged_packets_are_read() {
        let orig = Tuple {
            src: ip("10.77.0.21"),
            dst: ip("172.30.0.41"),
            proto: 6,
            sport: 40000,
            dport: 80,
        };
        let reply = Tuple {
            src: ip("10.180.0.2"),
            dst: ip("10.0.0.1"),
            proto: 6,
            sport: 8080,
            dport: 40000,
        };
        let mut w = Writer::new();
        w.begin(SUBSYS_CTNETLINK << 8 | MSG_CT_NEW, 0, 0, 2, 0);
        message(&mut w, &orig, &reply, IPS_DST_NAT | IPS_SRC_NAT);
        w.u32_be(12, 77);
        w.begin(SUBSYS_CTNETLINK << 8 | MSG_CT_DELETE, 0, 0, 2, 0);
        message(&mut w, &orig, &reply, IPS_DST_NAT);
        w.begin(SUBSYS_ULOG << 8 | MSG_ULOG_PACKET, 0, 0, 10, 7331);
        w.str(NFULA_PREFIX, "verdict dropped source-range");
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[6] = 6;
        p[8..24].copy_from_slice(&"fd00::21".parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"fd00:96::9".parse::<Ipv6Addr>().unwrap().octets());
        p.extend([0x9c, 0x40, 0, 80, 0, 0, 0, 0]);
        w.attr(NFULA_PAYLOAD, &p);
        // An IPv4 packet with options (a 24-byte header).
        w.begin(SUBSYS_ULOG << 8 | MSG_ULOG_PACKET, 0, 0, 2, 7331);
        w.str(NFULA_PREFIX, "verdict rejected no-endpoints");
        let mut p = vec![0u8; 24];
        p[0] = 0x46;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 77, 0, 21]);
        p[16..20].copy_from_slice(&[172, 30, 0, 42]);
        p.extend([0x9c, 0x41, 0, 53]);
        w.attr(NFULA_PAYLOAD, &p);
        w.end();
        let events = decode(w.bytes());
        assert_eq!(events.len(), 4, "{events:?}");
        let FlowEvent::New(c) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(c.id, Some(77));
        assert_eq!(c.client, "10.77.0.21:40000".parse().unwrap());
        assert_eq!(c.dst, "172.30.0.41:80".parse().unwrap());
        assert_eq!(c.reply_src, "10.180.0.2:8080".parse().unwrap());
        assert!(c.dnat && c.snat);
        assert_eq!((c.packets, c.bytes), (Some(5), Some(300)));
        assert!(matches!(&events[1], FlowEvent::Destroyed(d) if !d.snat && d.id.is_none()));
        let FlowEvent::Logged(l) = &events[2] else {
            panic!("{events:?}")
        };
        assert_eq!(l.prefix, "verdict dropped source-range");
        assert_eq!((l.group, l.proto), (7331, 6));
        assert_eq!(l.src, "[fd00::21]:40000".parse().unwrap());
        assert_eq!(l.dst, "[fd00:96::9]:80".parse().unwrap());
        let FlowEvent::Logged(l) = &events[3] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (l.src, l.dst),
            (
                "10.77.0.21:40001".parse().unwrap(),
                "172.30.0.42:53".parse().unwrap()
            )
        );
        // Cut anywhere, nothing panics and nothing half-read comes out.
        let d = w.bytes();
        for cut in 0..d.len() {
            assert!(decode(&d[..cut]).len() <= 3);
        }
    }
}
