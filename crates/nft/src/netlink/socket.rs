//! The one netlink socket type: nf_tables and ctnetlink requests (the
//! netfilter protocol), the node's addresses and links (rtnetlink), and
//! the multicast groups verdict listens to (ruleset announcements, packet
//! traces, address changes). One request and its answer at a time, a
//! batch in a single send; a listener reads whole datagrams.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, getsockname,
    recv, sendmsg, setsockopt, socket, sockopt,
};

use super::wire::{Attrs, Message, Writer, messages};
use crate::error::NftError;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `NLMSG_OVERRUN`: announcements were lost.
pub(crate) const NLMSG_OVERRUN: u16 = 4;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
/// The receive buffer: large enough for the errors of a failed batch (each
/// echoes its message) and for dump datagrams.
const RECV_BUFFER: usize = 16 << 20;
/// Bytes read per `recv`: more than the kernel puts in one dump datagram.
const DATAGRAM_MAX: usize = 1 << 20;

/// Which netlink protocol a socket speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// nfnetlink: nf_tables, ctnetlink, their groups.
    NetFilter,
    /// rtnetlink: addresses and links, their groups.
    Route,
}

impl Protocol {
    fn sock(self) -> SockProtocol {
        match self {
            Protocol::NetFilter => SockProtocol::NetlinkNetFilter,
            Protocol::Route => SockProtocol::NetlinkRoute,
        }
    }

    /// The bytes of the family header that follows every netlink header
    /// of this protocol in a request (`nfgenmsg`; `ifaddrmsg`, the largest
    /// rtnetlink request header verdict sends, is written by the caller).
    fn header_len(self) -> usize {
        match self {
            Protocol::NetFilter => 4,
            Protocol::Route => 0,
        }
    }
}

/// One answer to a request: the messages of a dump, or of a batch's errors.
pub(crate) struct Reply {
    /// (sequence number, errno) of every error the kernel reported.
    pub(crate) errors: Vec<(u32, i32)>,
    /// The dump was interrupted by a change: read again.
    pub(crate) interrupted: bool,
}

/// What a listener read.
pub(crate) enum Datagram<'a> {
    /// The messages of one datagram.
    Messages(&'a [u8]),
    /// The kernel dropped messages: the socket's buffer was full.
    Overflow,
}

pub(crate) fn io(e: Errno) -> NftError {
    match e {
        Errno::EPERM | Errno::EACCES => {
            NftError::Refused(format!("{} (verdict needs CAP_NET_ADMIN)", e.desc()))
        }
        other => NftError::Refused(format!("netlink: {}", other.desc())),
    }
}

/// A netlink socket of `protocol`, bound to `groups`, with a receive
/// buffer of `buffer` bytes (forced where the caller may, else as large
/// as the kernel lets an unprivileged process ask for).
fn open_socket(protocol: Protocol, groups: u32, buffer: usize) -> Result<OwnedFd, Errno> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        protocol.sock(),
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    if setsockopt(&fd, sockopt::RcvBufForce, &buffer).is_err() {
        let _ = setsockopt(&fd, sockopt::RcvBuf, &buffer);
    }
    Ok(fd)
}

/// A listening socket's membership of its multicast groups, through a
/// descriptor of its own: while it has left, the kernel sends the socket
/// nothing of those groups (and, if no other socket anywhere listens to
/// them, builds no announcements at all); what was queued before stays
/// queued.
#[derive(Debug)]
pub(crate) struct Membership {
    fd: OwnedFd,
    portid: u32,
    groups: u32,
}

impl Membership {
    /// Leaves the groups (binding again to none of them).
    pub(crate) fn leave(&self) -> std::io::Result<()> {
        bind(self.fd.as_raw_fd(), &NetlinkAddr::new(self.portid, 0))?;
        Ok(())
    }

    /// Joins them again.
    pub(crate) fn join(&self) -> std::io::Result<()> {
        bind(
            self.fd.as_raw_fd(),
            &NetlinkAddr::new(self.portid, self.groups),
        )?;
        Ok(())
    }
}

/// A netlink socket in one network namespace.
#[derive(Debug)]
pub(crate) struct Socket {
    fd: OwnedFd,
    protocol: Protocol,
    /// The last sequence number used.
    pub(crate) seq: u32,
    buf: Vec<u8>,
    send_buffer: usize,
}

impl Socket {
    /// A netfilter socket in the caller's network namespace.
    pub(crate) fn open() -> Result<Socket, NftError> {
        Socket::open_protocol(Protocol::NetFilter)
    }

    /// A socket of `protocol` for requests, in the caller's namespace.
    pub(crate) fn open_protocol(protocol: Protocol) -> Result<Socket, NftError> {
        let fd = open_socket(protocol, 0, RECV_BUFFER).map_err(io)?;
        Ok(Socket::with(fd, protocol, DATAGRAM_MAX))
    }

    /// A socket that listens to the multicast `groups` of `protocol`
    /// (a bit mask: group N is bit N-1), with a receive buffer of
    /// `buffer` bytes.
    pub(crate) fn listen(
        protocol: Protocol,
        groups: u32,
        buffer: usize,
    ) -> std::io::Result<Socket> {
        let fd = open_socket(protocol, groups, buffer)?;
        Ok(Socket::with(fd, protocol, 1 << 16))
    }

    /// A netfilter socket in the named network namespace
    /// (`/run/netns/NAME`, as `ip netns` keeps them). The socket is opened
    /// by a thread that joins the namespace; the caller's thread stays
    /// where it is.
    pub(crate) fn in_netns(name: &str) -> Result<Socket, NftError> {
        let path = format!("/run/netns/{name}");
        let fd = std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path)
                    .map_err(|e| NftError::Refused(format!("{path}: {e}")))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| NftError::Refused(format!("joining {path}: {}", e.desc())))?;
                open_socket(Protocol::NetFilter, 0, RECV_BUFFER).map_err(io)
            })
            .join()
            .map_err(|_| NftError::Refused("the thread opening the socket panicked".into()))?
        })?;
        Ok(Socket::with(fd, Protocol::NetFilter, DATAGRAM_MAX))
    }

    /// A handle on this listening socket's membership of `groups`,
    /// usable from another thread while this one reads.
    pub(crate) fn membership(&self, groups: u32) -> std::io::Result<Membership> {
        let portid = getsockname::<NetlinkAddr>(self.fd.as_raw_fd())?.pid();
        Ok(Membership {
            fd: self.fd.try_clone()?,
            portid,
            groups,
        })
    }

    /// The socket's netlink port id.
    pub(crate) fn portid(&self) -> std::io::Result<u32> {
        Ok(getsockname::<NetlinkAddr>(self.fd.as_raw_fd())?.pid())
    }

    fn with(fd: OwnedFd, protocol: Protocol, datagram: usize) -> Socket {
        Socket {
            fd,
            protocol,
            seq: 0,
            buf: vec![0; datagram],
            send_buffer: 0,
        }
    }

    /// Makes [`Socket::next_datagram`] give up after `timeout` with an
    /// error of kind `WouldBlock` (`None`: wait forever).
    pub(crate) fn set_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let tv = nix::sys::time::TimeVal::new(
            timeout.map_or(0, |t| t.as_secs() as nix::libc::time_t),
            timeout.map_or(0, |t| t.subsec_micros() as nix::libc::suseconds_t),
        );
        setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv)?;
        Ok(())
    }

    /// Waits for the next datagram of a listening socket.
    pub(crate) fn next_datagram(&mut self) -> std::io::Result<Datagram<'_>> {
        self.recv_datagram(MsgFlags::empty())
    }

    fn recv_datagram(&mut self, flags: MsgFlags) -> std::io::Result<Datagram<'_>> {
        loop {
            match recv(self.fd.as_raw_fd(), &mut self.buf, flags) {
                Ok(n) => return Ok(Datagram::Messages(&self.buf[..n])),
                Err(Errno::ENOBUFS) => return Ok(Datagram::Overflow),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The next datagram of a listening socket, waiting at most `timeout`
    /// (`Ok(None)`: none came). A zero `timeout` does not wait at all: the
    /// reader is then never a sleeper the kernel must wake.
    pub(crate) fn next_within(
        &mut self,
        timeout: Duration,
    ) -> std::io::Result<Option<Datagram<'_>>> {
        let got = if timeout.is_zero() {
            self.recv_datagram(MsgFlags::MSG_DONTWAIT)
        } else {
            self.set_timeout(Some(timeout.max(Duration::from_millis(1))))?;
            self.next_datagram()
        };
        match got {
            Ok(d) => Ok(Some(d)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) -> Result<(), NftError> {
        self.send_chunks(&[bytes])
    }

    /// Sends `chunks` as one datagram (one `sendmsg` gathering them): the
    /// kernel reads a batch only from one.
    pub(crate) fn send_chunks(&mut self, chunks: &[&[u8]]) -> Result<(), NftError> {
        self.drain();
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        // The kernel refuses a message larger than the send buffer: grow
        // the buffer to fit.
        let need = total + 4096;
        if need > self.send_buffer {
            let size = need.max(1 << 20);
            if setsockopt(&self.fd, sockopt::SndBufForce, &size).is_err() {
                setsockopt(&self.fd, sockopt::SndBuf, &size).map_err(io)?;
            }
            self.send_buffer = size;
        }
        let iov: Vec<std::io::IoSlice<'_>> =
            chunks.iter().map(|c| std::io::IoSlice::new(c)).collect();
        let sent =
            sendmsg::<()>(self.fd.as_raw_fd(), &iov, &[], MsgFlags::empty(), None).map_err(io)?;
        if sent != total {
            return Err(NftError::Refused(format!(
                "netlink took {sent} of {total} bytes"
            )));
        }
        Ok(())
    }

    /// Discards whatever an earlier answer left queued (one cut short by a
    /// full buffer), so that it cannot be read as the next one's.
    fn drain(&mut self) {
        loop {
            match recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::MSG_DONTWAIT) {
                Ok(_) | Err(Errno::EINTR) | Err(Errno::ENOBUFS) => {}
                Err(_) => return,
            }
        }
    }

    /// Reads replies until the answer to `last_seq` is complete (or, not
    /// waiting, until none are queued), handing every message that is not
    /// an error or the end of a dump to `each`. Waiting is for the answers
    /// to the requests `first_seq ..= last_seq`, and only their messages
    /// count; a batch's replies are already queued when `send` returns, so
    /// those are read without waiting. An error from `each` is returned
    /// once the answer has been read to its end.
    pub(crate) fn receive_messages(
        &mut self,
        wait: bool,
        first_seq: u32,
        last_seq: u32,
        mut each: impl FnMut(&Message<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
        let ours = |seq: u32| seq.wrapping_sub(first_seq) <= last_seq.wrapping_sub(first_seq);
        let mut reply = Reply {
            errors: Vec::new(),
            interrupted: false,
        };
        let flags = if wait {
            MsgFlags::empty()
        } else {
            MsgFlags::MSG_DONTWAIT
        };
        let mut failed: Option<NftError> = None;
        loop {
            let n = match recv(self.fd.as_raw_fd(), &mut self.buf, flags) {
                Ok(n) => n,
                Err(Errno::EAGAIN) if !wait => return failed.map_or(Ok(reply), Err),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => {
                    return Err(NftError::Refused(
                        "the kernel's replies overflowed the socket's buffer".into(),
                    ));
                }
                Err(e) => return Err(io(e)),
            };
            let mut finished = false;
            for m in messages(&self.buf[..n]) {
                if wait && !ours(m.seq) {
                    continue;
                }
                if m.flags & NLM_F_DUMP_INTR != 0 {
                    reply.interrupted = true;
                }
                match m.kind {
                    NLMSG_ERROR => {
                        let errno = m
                            .payload
                            .get(..4)
                            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        let seq = m
                            .payload
                            .get(12..16)
                            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        if errno != 0 {
                            reply.errors.push((seq, -errno));
                        }
                        if wait && seq == last_seq {
                            finished = true;
                        }
                    }
                    NLMSG_DONE if wait && m.seq == last_seq => finished = true,
                    k if k >= NFNL_MSG_BATCH_BEGIN && failed.is_none() => {
                        failed = each(&m).err();
                    }
                    _ => {}
                }
            }
            if finished {
                return failed.map_or(Ok(reply), Err);
            }
        }
    }

    /// [`Socket::receive_messages`] for nfnetlink: each message's sequence
    /// number, type and the attributes after its `nfgenmsg`.
    pub(crate) fn receive(
        &mut self,
        wait: bool,
        first_seq: u32,
        last_seq: u32,
        mut each: impl FnMut(u32, u16, Attrs<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
        self.receive_messages(wait, first_seq, last_seq, |m| match m.nfgen() {
            Some((_, attrs)) => each(m.seq, m.kind, attrs),
            None => Ok(()),
        })
    }

    /// Sends one nfnetlink request (a dump, or a get with an
    /// acknowledgement) and hands each message of the answer to `each`.
    pub(crate) fn request(
        &mut self,
        kind: u16,
        dump: bool,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        each: impl FnMut(u16, Attrs<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
        debug_assert_eq!(self.protocol.header_len(), 4);
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut w = Writer::new();
        let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        w.begin(kind, flags, seq, family, 0);
        attrs(&mut w);
        w.end();
        self.send(w.bytes())?;
        let mut each = each;
        self.receive(true, seq, seq, |_, k, a| each(k, a))
    }

    /// Sends one nfnetlink command for the resource `res_id` (an
    /// nfnetlink_log group, say), acknowledged.
    pub(crate) fn request_for(
        &mut self,
        kind: u16,
        family: u8,
        res_id: u16,
        attrs: impl FnOnce(&mut Writer),
    ) -> Result<Reply, NftError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut w = Writer::new();
        w.begin(kind, NLM_F_REQUEST | NLM_F_ACK, seq, family, res_id);
        attrs(&mut w);
        w.end();
        self.send(w.bytes())?;
        self.receive(true, seq, seq, |_, _, _| Ok(()))
    }

    /// Sends one request of any protocol: `body` writes what follows the
    /// netlink header (the protocol's own header, then attributes); each
    /// message of the answer goes to `each`.
    pub(crate) fn request_raw(
        &mut self,
        kind: u16,
        flags: u16,
        body: impl FnOnce(&mut Writer),
        each: impl FnMut(&Message<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut w = Writer::new();
        w.begin_raw(kind, NLM_F_REQUEST | flags, seq);
        body(&mut w);
        w.end();
        self.send(w.bytes())?;
        self.receive_messages(true, seq, seq, each)
    }

    /// Sends `count` requests of one kind (gets, each acknowledged) in a
    /// single send, `attrs` writing the attributes of each, and hands
    /// every message of their answers to `each` with the index of the
    /// request it answers. Returns the (index, errno) of every request the
    /// kernel refused; the kernel answers each on its own, so one refusal
    /// does not stop the others.
    pub(crate) fn requests(
        &mut self,
        kind: u16,
        family: u8,
        count: usize,
        mut attrs: impl FnMut(usize, &mut Writer) -> Result<(), NftError>,
        mut each: impl FnMut(usize, u16, Attrs<'_>) -> Result<(), NftError>,
    ) -> Result<Vec<(usize, i32)>, NftError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let first = self.seq.wrapping_add(1);
        let mut w = Writer::new();
        for i in 0..count {
            self.seq = self.seq.wrapping_add(1);
            w.begin(kind, NLM_F_REQUEST | NLM_F_ACK, self.seq, family, 0);
            attrs(i, &mut w)?;
            w.end();
        }
        let last = self.seq;
        self.send(w.bytes())?;
        let index = |seq: u32| seq.wrapping_sub(first) as usize;
        let reply = self.receive(true, first, last, |seq, k, a| each(index(seq), k, a))?;
        Ok(reply
            .errors
            .into_iter()
            .map(|(seq, errno)| (index(seq), errno))
            .collect())
    }
}
