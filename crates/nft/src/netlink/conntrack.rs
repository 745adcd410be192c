//! The connection-tracking table over ctnetlink, instead of the
//! `conntrack` program: the same listings and deletions as
//! [`ConntrackCli`](crate::conntrack::ConntrackCli), from a dump of the
//! family's entries. A stale UDP entry is deleted by its exact original
//! tuple, as the last listing read it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nix::errno::Errno;

use super::socket::Socket;
use super::wire::{Attrs, Writer};
use crate::conntrack::{Conntrack, ConntrackError, Flow, UdpEntry};
use crate::error::NftError;
use crate::ir::Family;

/// `NFNL_SUBSYS_CTNETLINK`.
pub(crate) const SUBSYS_CTNETLINK: u16 = 1;
pub(crate) const MSG_CT_NEW: u16 = 0;
const MSG_CT_GET: u16 = 1;
pub(crate) const MSG_CT_DELETE: u16 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_ID: u16 = 12;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_SCTP: u16 = 3;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
/// `IPS_SEEN_REPLY`, `IPS_SRC_NAT` and `IPS_DST_NAT`.
const IPS_SEEN_REPLY: u32 = 0x2;
pub(crate) const IPS_SRC_NAT: u32 = 0x10;
pub(crate) const IPS_DST_NAT: u32 = 0x20;
const UDP: u8 = 17;
const TCP_PROTO: u8 = 6;
const SCTP_PROTO: u8 = 132;

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) proto: u8,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
}

/// One conntrack entry, as dumped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) orig: Tuple,
    pub(crate) reply: Tuple,
    pub(crate) status: u32,
    pub(crate) timeout: u64,
    pub(crate) state: String,
    pub(crate) packets: Option<u64>,
    pub(crate) bytes: Option<u64>,
    /// The kernel's id of the entry (`CTA_ID`), the same in its events.
    pub(crate) id: Option<u32>,
}

fn addr(a: Attrs<'_>, v4: u16, v6: u16) -> Option<IpAddr> {
    if let Some(b) = a.get(v4) {
        let o: [u8; 4] = b.get(..4)?.try_into().ok()?;
        return Some(IpAddr::V4(Ipv4Addr::from(o)));
    }
    let o: [u8; 16] = a.get(v6)?.get(..16)?.try_into().ok()?;
    Some(IpAddr::V6(Ipv6Addr::from(o)))
}

fn port(a: Attrs<'_>, kind: u16) -> u16 {
    a.get(kind)
        .and_then(|b| Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)))
        .unwrap_or(0)
}

fn tuple(a: Attrs<'_>) -> Option<Tuple> {
    let ip = a.nested(CTA_TUPLE_IP)?;
    let proto = a.nested(CTA_TUPLE_PROTO)?;
    Some(Tuple {
        src: addr(ip, CTA_IP_V4_SRC, CTA_IP_V6_SRC)?,
        dst: addr(ip, CTA_IP_V4_DST, CTA_IP_V6_DST)?,
        proto: proto.u8(CTA_PROTO_NUM)?,
        sport: port(proto, CTA_PROTO_SRC_PORT),
        dport: port(proto, CTA_PROTO_DST_PORT),
    })
}

/// The TCP and SCTP state names `conntrack` prints.
fn state(proto: u8, a: Option<Attrs<'_>>) -> String {
    const TCP: [&str; 10] = [
        "NONE",
        "SYN_SENT",
        "SYN_RECV",
        "ESTABLISHED",
        "FIN_WAIT",
        "CLOSE_WAIT",
        "LAST_ACK",
        "TIME_WAIT",
        "CLOSE",
        "SYN_SENT2",
    ];
    const SCTP: [&str; 10] = [
        "NONE",
        "CLOSED",
        "COOKIE_WAIT",
        "COOKIE_ECHOED",
        "ESTABLISHED",
        "SHUTDOWN_SENT",
        "SHUTDOWN_RECD",
        "SHUTDOWN_ACK_SENT",
        "HEARTBEAT_SENT",
        "HEARTBEAT_ACKED",
    ];
    let (names, kind): (&[&str], u16) = match proto {
        6 => (&TCP, CTA_PROTOINFO_TCP),
        132 => (&SCTP, CTA_PROTOINFO_SCTP),
        _ => return String::new(),
    };
    a.and_then(|a| a.nested(kind))
        .and_then(|p| p.u8(1))
        .and_then(|s| names.get(usize::from(s)))
        .map(|s| (*s).to_owned())
        .unwrap_or_default()
}

/// An entry from a `IPCTNL_MSG_CT_NEW` message of a dump, or of an event.
pub(crate) fn entry(a: Attrs<'_>) -> Option<Entry> {
    let orig = tuple(a.nested(CTA_TUPLE_ORIG)?)?;
    let reply = tuple(a.nested(CTA_TUPLE_REPLY)?)?;
    let counters = |kind: u16| {
        let c = a.nested(kind)?;
        Some((
            c.u64_be(CTA_COUNTERS_PACKETS)?,
            c.u64_be(CTA_COUNTERS_BYTES)?,
        ))
    };
    let (o, r) = (counters(CTA_COUNTERS_ORIG), counters(CTA_COUNTERS_REPLY));
    let both = |f: fn((u64, u64)) -> u64| match (o, r) {
        (None, None) => None,
        _ => Some(o.map_or(0, f) + r.map_or(0, f)),
    };
    Some(Entry {
        orig,
        reply,
        status: a.u32_be(CTA_STATUS).unwrap_or(0),
        timeout: u64::from(a.u32_be(CTA_TIMEOUT).unwrap_or(0)),
        state: state(orig.proto, a.nested(CTA_PROTOINFO)),
        packets: both(|c| c.0),
        bytes: both(|c| c.1),
        id: a.u32_be(CTA_ID),
    })
}

fn proto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        other => format!("proto-{other}"),
    }
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::Ip => 2,
        Family::Ip6 => 10,
    }
}

fn write_tuple(w: &mut Writer, kind: u16, t: &Tuple) {
    let n = w.open(kind);
    let ip = w.open(CTA_TUPLE_IP);
    match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            w.attr(CTA_IP_V4_SRC, &s.octets());
            w.attr(CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            };
            w.attr(CTA_IP_V6_SRC, &v6(s));
            w.attr(CTA_IP_V6_DST, &v6(d));
        }
    }
    let _ = w.close(ip);
    let p = w.open(CTA_TUPLE_PROTO);
    w.u8(CTA_PROTO_NUM, t.proto);
    w.attr(CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
    w.attr(CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
    let _ = w.close(p);
    let _ = w.close(n);
}

fn failed(what: &str, e: NftError) -> ConntrackError {
    ConntrackError::Failed {
        args: what.to_owned(),
        message: e.to_string(),
    }
}

/// The conntrack table over netlink, in one network namespace.
#[derive(Debug)]
pub struct NetlinkConntrack {
    socket: Socket,
    /// The UDP entries of the last listing, by family, to delete by tuple.
    udp: Vec<(Family, Entry)>,
}

impl NetlinkConntrack {
    /// A socket in the caller's network namespace.
    pub fn new() -> Result<NetlinkConntrack, ConntrackError> {
        Ok(NetlinkConntrack {
            socket: Socket::open().map_err(|e| ConntrackError::Unavailable(e.to_string()))?,
            udp: Vec::new(),
        })
    }

    /// A socket in the named network namespace.
    pub fn in_netns(name: &str) -> Result<NetlinkConntrack, ConntrackError> {
        Ok(NetlinkConntrack {
            socket: Socket::in_netns(name)
                .map_err(|e| ConntrackError::Unavailable(e.to_string()))?,
            udp: Vec::new(),
        })
    }

    fn dump(&mut self, family: Family) -> Result<Vec<Entry>, ConntrackError> {
        let mut out = Vec::new();
        let r = self
            .socket
            .request(
                SUBSYS_CTNETLINK << 8 | MSG_CT_GET,
                true,
                nfproto(family),
                |_| {},
                |kind, a| {
                    if kind == SUBSYS_CTNETLINK << 8 | MSG_CT_NEW
                        && let Some(e) = entry(a)
                    {
                        out.push(e);
                    }
                    Ok(())
                },
            )
            .map_err(|e| failed("listing", e))?;
        match r.errors.first() {
            Some((_, errno)) => Err(ConntrackError::Failed {
                args: format!("listing {family}"),
                message: Errno::from_raw(*errno).desc().to_owned(),
            }),
            None => Ok(out),
        }
    }

    fn delete(&mut self, family: Family, orig: &Tuple) -> Result<bool, ConntrackError> {
        let r = self
            .socket
            .request(
                SUBSYS_CTNETLINK << 8 | MSG_CT_DELETE,
                false,
                nfproto(family),
                |w| write_tuple(w, CTA_TUPLE_ORIG, orig),
                |_, _| Ok(()),
            )
            .map_err(|e| failed("deleting", e))?;
        match r.errors.first().map(|(_, e)| Errno::from_raw(*e)) {
            None => Ok(true),
            // It expired meanwhile.
            Some(Errno::ENOENT) => Ok(false),
            Some(e) => Err(ConntrackError::Failed {
                args: format!("deleting {orig:?}"),
                message: e.desc().to_owned(),
            }),
        }
    }
}

impl Conntrack for NetlinkConntrack {
    fn list_udp(&mut self, family: Family) -> Result<Vec<UdpEntry>, ConntrackError> {
        let udp: Vec<Entry> = self
            .dump(family)?
            .into_iter()
            .filter(|e| e.orig.proto == UDP)
            .collect();
        let out = udp
            .iter()
            .map(|e| UdpEntry {
                orig_dst: e.orig.dst,
                orig_dport: e.orig.dport,
                reply_src: e.reply.src,
                reply_sport: e.reply.sport,
            })
            .collect();
        self.udp.retain(|(f, _)| *f != family);
        self.udp.extend(udp.into_iter().map(|e| (family, e)));
        Ok(out)
    }

    fn list_dnat(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        Ok(self
            .dump(family)?
            .into_iter()
            .filter(|e| e.status & IPS_DST_NAT != 0)
            .map(|e| Flow {
                proto: proto_name(e.orig.proto),
                state: e.state,
                timeout: e.timeout,
                src: e.orig.src,
                sport: e.orig.sport,
                dst: e.orig.dst,
                dport: e.orig.dport,
                reply_src: e.reply.src,
                reply_sport: e.reply.sport,
                packets: e.packets,
                bytes: e.bytes,
                replied: e.status & IPS_SEEN_REPLY != 0,
            })
            .collect())
    }

    fn list_unanswered(&mut self, family: Family) -> Result<Vec<Flow>, ConntrackError> {
        Ok(self
            .dump(family)?
            .into_iter()
            .filter(|e| e.orig.proto == TCP_PROTO || e.orig.proto == SCTP_PROTO)
            .filter(|e| e.status & (IPS_SEEN_REPLY | IPS_DST_NAT) == 0)
            .map(|e| Flow {
                proto: proto_name(e.orig.proto),
                state: e.state,
                timeout: e.timeout,
                src: e.orig.src,
                sport: e.orig.sport,
                dst: e.orig.dst,
                dport: e.orig.dport,
                reply_src: e.reply.src,
                reply_sport: e.reply.sport,
                packets: e.packets,
                bytes: e.bytes,
                replied: false,
            })
            .collect())
    }

    fn delete_flow(&mut self, family: Family, flow: &Flow) -> Result<bool, ConntrackError> {
        let proto = match flow.proto.as_str() {
            "tcp" => TCP_PROTO,
            "sctp" => SCTP_PROTO,
            "udp" => UDP,
            other => {
                return Err(ConntrackError::Failed {
                    args: format!("deleting a {other} entry"),
                    message: "not a protocol verdict deletes entries of".into(),
                });
            }
        };
        self.delete(
            family,
            &Tuple {
                src: flow.src,
                dst: flow.dst,
                proto,
                sport: flow.sport,
                dport: flow.dport,
            },
        )
    }

    fn delete_udp(&mut self, family: Family, target: &UdpEntry) -> Result<usize, ConntrackError> {
        let matches = |e: &Entry| {
            e.orig.dst == target.orig_dst
                && e.orig.dport == target.orig_dport
                && e.reply.src == target.reply_src
                && e.reply.sport == target.reply_sport
        };
        if !self.udp.iter().any(|(f, e)| *f == family && matches(e)) {
            // Not in the last listing: list again.
            self.list_udp(family)?;
        }
        let doomed: Vec<Tuple> = self
            .udp
            .iter()
            .filter(|(f, e)| *f == family && matches(e))
            .map(|(_, e)| e.orig)
            .collect();
        self.udp.retain(|(f, e)| !(*f == family && matches(e)));
        let mut deleted = 0;
        for orig in &doomed {
            deleted += usize::from(self.delete(family, orig)?);
        }
        Ok(deleted)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn message(w: &mut Writer, orig: &Tuple, reply: &Tuple, status: u32) {
        write_tuple(w, CTA_TUPLE_ORIG, orig);
        write_tuple(w, CTA_TUPLE_REPLY, reply);
        w.u32_be(CTA_STATUS, status);
        w.u32_be(CTA_TIMEOUT, 117);
        let p = w.open(CTA_PROTOINFO);
        let t = w.open(CTA_PROTOINFO_TCP);
        w.u8(1, 3);
        let _ = w.close(t);
        let _ = w.close(p);
        let c = w.open(CTA_COUNTERS_ORIG);
        w.u64_be(CTA_COUNTERS_PACKETS, 5);
        w.u64_be(CTA_COUNTERS_BYTES, 300);
        let _ = w.close(c);
    }

    #[test]
    fn entries_round_trip_both_families() {
        for (a, b, c) in [
            ("10.0.0.1", "172.30.0.5", "10.180.0.2"),
            ("fd00::1", "fd00:96::5", "fd00:180::2"),
        ] {
            let ip = |s: &str| s.parse::<IpAddr>().unwrap();
            let orig = Tuple {
                src: ip(a),
                dst: ip(b),
                proto: 6,
                sport: 40000,
                dport: 80,
            };
            let reply = Tuple {
                src: ip(c),
                dst: ip(a),
                proto: 6,
                sport: 8080,
                dport: 40000,
            };
            let mut w = Writer::new();
            message(&mut w, &orig, &reply, IPS_DST_NAT | IPS_SEEN_REPLY);
            let e = entry(Attrs(w.bytes())).unwrap();
            assert_eq!((e.orig, e.reply), (orig, reply));
            assert_eq!(e.state, "ESTABLISHED");
            assert_eq!((e.timeout, e.packets, e.bytes), (117, Some(5), Some(300)));
            assert_eq!(e.status & IPS_DST_NAT, IPS_DST_NAT);
        }
        assert_eq!(entry(Attrs(&[1, 2, 3])), None);
    }
}
