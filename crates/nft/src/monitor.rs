//! Changes to the ruleset, as the kernel announces them: the nftables
//! netlink multicast group (`NFNLGRP_NFTABLES`) that `nft monitor` listens
//! to. Every committed transaction, whoever made it, arrives as the
//! objects it added or deleted followed by a "new generation" message
//! naming the committing process. Packet-path updates (dynamic sets such as
//! session affinity) are not announced.
//!
//! [`Monitor`] reads the socket; [`Decoder`] turns its bytes into
//! [`Event`]s and holds no socket, so it is tested without a kernel.

use crate::netlink::family_name;
use crate::netlink::socket::{Datagram, NLMSG_OVERRUN, Protocol, Socket};
use crate::netlink::wire::messages;

/// `NFNLGRP_NFTABLES`: the group `nft monitor` joins.
const GROUP_NFTABLES: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES`, the high byte of every message type here.
const SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWGEN`: closes each committed transaction.
const MSG_NEWGEN: u8 = 15;
/// The most the kernel may queue on the socket. A cold sync of 30,000
/// services adds 180,000 elements in one commit, and each is announced:
/// 8 MiB overflowed, and the overflow cost a second full sync (6 s with
/// its read-back at 30k). The limit is only memory the kernel may use
/// while announcements wait; it holds nothing when they are read.
const RECV_BUFFER: usize = 64 << 20;

/// What kind of object changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Object {
    /// A table.
    Table,
    /// A chain.
    Chain,
    /// A rule.
    Rule,
    /// A set or map.
    Set,
    /// Set or map elements.
    Element,
    /// A stateful object (counter, quota, ...).
    StatefulObject,
    /// A flowtable.
    Flowtable,
}

/// One announced change.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Change {
    /// `true` for an addition (or replacement), `false` for a deletion.
    pub added: bool,
    /// What changed.
    pub object: Object,
    /// The table's family, as nft names it (`ip`, `ip6`, `inet`, ...).
    pub family: &'static str,
    /// The table.
    pub table: String,
    /// The chain or set concerned, when there is one (not for a table).
    pub name: Option<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.added { "add" } else { "delete" };
        let what = match self.object {
            Object::Table => "table",
            Object::Chain => "chain",
            Object::Rule => "rule in chain",
            Object::Set => "set",
            Object::Element => "element in set",
            Object::StatefulObject => "object",
            Object::Flowtable => "flowtable",
        };
        write!(f, "{verb} {what} {} {}", self.family, self.table)?;
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// What the monitor reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// One committed transaction.
    Commit {
        /// The ruleset's new generation.
        generation: u32,
        /// The committing process (0 when the kernel did not say).
        pid: u32,
        /// Its name (`nft`, `firewalld`, `iptables-nft`, ...).
        process: String,
        /// What it changed, in the kernel's order, a change repeated
        /// in a row (elements of one set) once.
        changes: Vec<Change>,
    },
    /// The kernel dropped announcements because the socket's buffer was
    /// full: anything may have changed.
    Overflow,
}

/// Turns the group's messages into [`Event`]s.
#[derive(Debug, Default)]
pub struct Decoder {
    pending: Vec<Change>,
}

impl Decoder {
    /// Decodes one datagram (one or more netlink messages). Changes are
    /// held until the "new generation" message that closes their commit.
    pub fn feed(&mut self, buf: &[u8], out: &mut Vec<Event>) {
        for m in messages(buf) {
            if m.kind == NLMSG_OVERRUN {
                self.pending.clear();
                out.push(Event::Overflow);
                continue;
            }
            if m.kind >> 8 != SUBSYS_NFTABLES {
                continue;
            }
            let Some((nfproto, attrs)) = m.nfgen() else {
                continue;
            };
            let family = family_name(nfproto);
            let string = |k: u16| attrs.str(k).map(str::to_owned);
            let msg = (m.kind & 0xff) as u8;
            if msg == MSG_NEWGEN {
                out.push(Event::Commit {
                    generation: attrs.u32_be(1).unwrap_or(0),
                    pid: attrs.u32_be(2).unwrap_or(0),
                    process: string(3).unwrap_or_default(),
                    changes: std::mem::take(&mut self.pending),
                });
                continue;
            }
            let Some((object, added)) = classify(msg) else {
                continue;
            };
            // Attribute 1 is the table for every object kind; the object's
            // own name is 3 for a chain, 2 (the chain) for a rule and 2 for
            // a set, its elements, a stateful object or a flowtable.
            let table = string(1).unwrap_or_default();
            let name = match object {
                Object::Table => None,
                Object::Chain => string(3),
                _ => string(2),
            };
            let change = Change {
                added,
                object,
                family,
                table,
                name,
            };
            // A commit announces each element of a set on its own: a cold
            // sync of 30,000 services, 180,000 times. A repeat of the
            // change before it says nothing new.
            if self.pending.last() != Some(&change) {
                self.pending.push(change);
            }
        }
    }
}

/// The nftables netlink group, subscribed to in the caller's network
/// namespace.
#[derive(Debug)]
pub struct Monitor {
    socket: Socket,
    decoder: Decoder,
    ready: std::collections::VecDeque<Event>,
}

impl Monitor {
    /// Joins the group. Needs CAP_NET_ADMIN for the larger receive buffer;
    /// without it, the default buffer is kept (overflows are still
    /// reported).
    pub fn open() -> std::io::Result<Monitor> {
        Ok(Monitor {
            socket: Socket::listen(Protocol::NetFilter, 1 << (GROUP_NFTABLES - 1), RECV_BUFFER)?,
            decoder: Decoder::default(),
            ready: std::collections::VecDeque::new(),
        })
    }

    /// A handle that makes the kernel stop announcing to this monitor and
    /// start again, from any thread: verdict leaves while it commits a
    /// large transaction of its own, whose every element the kernel would
    /// otherwise announce (about half the commit's time in the kernel at
    /// 30,000 Services). Commits made meanwhile go unheard; the
    /// ruleset's generation tells whether there were any.
    pub fn membership(&self) -> std::io::Result<Membership> {
        Ok(Membership(
            self.socket.membership(1 << (GROUP_NFTABLES - 1))?,
        ))
    }

    /// Makes [`Monitor::next_event`] give up after `timeout` with an error
    /// of kind `WouldBlock` (`None`: wait forever).
    pub fn set_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        self.socket.set_timeout(timeout)
    }

    /// Waits for the next event.
    pub fn next_event(&mut self) -> std::io::Result<Event> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            match self.socket.next_datagram()? {
                Datagram::Messages(buf) => {
                    let mut out = Vec::new();
                    self.decoder.feed(buf, &mut out);
                    self.ready.extend(out);
                }
                // The buffer overflowed: what was lost is unknown.
                Datagram::Overflow => {
                    self.decoder = Decoder::default();
                    return Ok(Event::Overflow);
                }
            }
        }
    }
}

/// See [`Monitor::membership`].
#[derive(Debug)]
pub struct Membership(crate::netlink::socket::Membership);

impl crate::Listener for Membership {
    fn leave(&self) -> std::io::Result<()> {
        self.0.leave()
    }

    fn join(&self) -> std::io::Result<()> {
        self.0.join()
    }
}

fn classify(msg: u8) -> Option<(Object, bool)> {
    // NFT_MSG_* numbers: NEW/GET/DEL per object, then DESTROY* from 26.
    Some(match msg {
        0 => (Object::Table, true),
        2 | 26 => (Object::Table, false),
        3 => (Object::Chain, true),
        5 | 27 => (Object::Chain, false),
        6 => (Object::Rule, true),
        8 | 28 => (Object::Rule, false),
        9 => (Object::Set, true),
        11 | 29 => (Object::Set, false),
        12 => (Object::Element, true),
        14 | 30 => (Object::Element, false),
        18 => (Object::StatefulObject, true),
        20 | 31 => (Object::StatefulObject, false),
        22 => (Object::Flowtable, true),
        24 | 32 => (Object::Flowtable, false),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend(((4 + value.len()) as u16).to_ne_bytes());
        a.extend(kind.to_ne_bytes());
        a.extend(value);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    fn cstr(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    fn msg(msg: u8, family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = [family, 0, 0, 0]
            .into_iter()
            .chain(attrs.iter().flatten().copied())
            .collect();
        let mut m = Vec::new();
        m.extend(((16 + body.len()) as u32).to_ne_bytes());
        m.extend(((SUBSYS_NFTABLES << 8) | u16::from(msg)).to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        m
    }

    fn newgen(id: u32, pid: u32, name: &str) -> Vec<u8> {
        msg(
            MSG_NEWGEN,
            0,
            &[
                attr(1, &id.to_be_bytes()),
                attr(2, &pid.to_be_bytes()),
                attr(3, &cstr(name)),
            ],
        )
    }

    #[test]
    fn a_commit_is_its_changes_then_the_new_generation() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        // As `nft flush ruleset` announces a table with one chain.
        let datagram: Vec<u8> = [
            msg(
                5,
                2,
                &[attr(1, &cstr("verdict")), attr(3, &cstr("nat-prerouting"))],
            ),
            msg(2, 2, &[attr(1, &cstr("verdict"))]),
            msg(
                8,
                10,
                &[attr(1, &cstr("verdict")), attr(2, &cstr("services"))],
            ),
        ]
        .concat();
        d.feed(&datagram, &mut out);
        assert!(out.is_empty(), "held until the commit closes");
        d.feed(&newgen(5, 4242, "nft"), &mut out);
        let [
            Event::Commit {
                generation,
                pid,
                process,
                changes,
            },
        ] = out.as_slice()
        else {
            panic!("{out:?}")
        };
        assert_eq!((*generation, *pid, process.as_str()), (5, 4242, "nft"));
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "delete chain ip verdict nat-prerouting",
                "delete table ip verdict",
                "delete rule in chain ip6 verdict services",
            ]
        );
    }

    #[test]
    fn elements_and_sets_name_their_set() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        let datagram: Vec<u8> = [
            msg(
                12,
                2,
                &[attr(1, &cstr("verdict")), attr(2, &cstr("service-ips"))],
            ),
            msg(
                11,
                10,
                &[
                    attr(1, &cstr("verdict")),
                    attr(2, &cstr("no-endpoint-services")),
                ],
            ),
            newgen(6, 1, "firewalld"),
        ]
        .concat();
        d.feed(&datagram, &mut out);
        let Event::Commit { changes, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(changes[0].object, Object::Element);
        assert_eq!(changes[0].name.as_deref(), Some("service-ips"));
        assert!(changes[0].added);
        assert_eq!(
            changes[1].to_string(),
            "delete set ip6 verdict no-endpoint-services"
        );
    }

    #[test]
    fn elements_of_one_set_in_a_row_are_one_change() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        let element = |set: &str| msg(12, 2, &[attr(1, &cstr("verdict")), attr(2, &cstr(set))]);
        let mut datagram: Vec<u8> = Vec::new();
        for _ in 0..1000 {
            datagram.extend(element("service-ips"));
        }
        datagram.extend(element("cluster-ips"));
        datagram.extend(element("service-ips"));
        datagram.extend(newgen(7, 1, "nft"));
        d.feed(&datagram, &mut out);
        let Event::Commit { changes, .. } = &out[0] else {
            panic!("{out:?}")
        };
        let sets: Vec<_> = changes.iter().map(|c| c.name.as_deref()).collect();
        assert_eq!(
            sets,
            [
                Some("service-ips"),
                Some("cluster-ips"),
                Some("service-ips")
            ]
        );
    }

    #[test]
    fn truncated_or_foreign_messages_are_skipped_without_panic() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        let good = newgen(1, 2, "nft");
        for cut in 0..good.len() {
            d.feed(&good[..cut], &mut out);
        }
        // A message of another subsystem, and a lying attribute length.
        let mut other = msg(0, 2, &[attr(1, &cstr("x"))]);
        other[5] = 3;
        d.feed(&other, &mut out);
        let mut liar = msg(0, 2, &[attr(1, &cstr("verdict"))]);
        liar[20] = 0xff;
        d.feed(&liar, &mut out);
        assert!(out.is_empty(), "{out:?}");
        d.feed(&good, &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn an_overrun_is_reported() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        let mut m = vec![0u8; 16];
        m[..4].copy_from_slice(&16u32.to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_OVERRUN.to_ne_bytes());
        d.feed(&m, &mut out);
        assert_eq!(out, [Event::Overflow]);
    }
}
