//! The netfilter netlink socket that the nf_tables backend and the
//! conntrack client share: one request and its answer at a time, a batch
//! in a single send.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, socket, sockopt,
};

use super::wire::{Attrs, Writer, messages};
use crate::error::NftError;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
/// The receive buffer: large enough for the errors of a failed batch (each
/// echoes its message) and for dump datagrams.
const RECV_BUFFER: usize = 16 << 20;
/// Bytes read per `recv`: more than the kernel puts in one dump datagram.
const DATAGRAM_MAX: usize = 1 << 20;

/// One answer to a request: the messages of a dump, or of a batch's errors.
pub(crate) struct Reply {
    /// (sequence number, errno) of every error the kernel reported.
    pub(crate) errors: Vec<(u32, i32)>,
    /// The dump was interrupted by a change: read again.
    pub(crate) interrupted: bool,
}

pub(crate) fn io(e: Errno) -> NftError {
    match e {
        Errno::EPERM | Errno::EACCES => {
            NftError::Refused(format!("{} (verdict needs CAP_NET_ADMIN)", e.desc()))
        }
        other => NftError::Refused(format!("netlink: {}", other.desc())),
    }
}

fn open_socket() -> Result<OwnedFd, NftError> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(io)?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(io)?;
    if setsockopt(&fd, sockopt::RcvBufForce, &RECV_BUFFER).is_err() {
        let _ = setsockopt(&fd, sockopt::RcvBuf, &RECV_BUFFER);
    }
    Ok(fd)
}

/// A netfilter netlink socket in one network namespace.
#[derive(Debug)]
pub(crate) struct Socket {
    fd: OwnedFd,
    /// The last sequence number used.
    pub(crate) seq: u32,
    buf: Vec<u8>,
    send_buffer: usize,
}

impl Socket {
    /// A socket in the caller's network namespace.
    pub(crate) fn open() -> Result<Socket, NftError> {
        Ok(Socket::with(open_socket()?))
    }

    /// A socket in the named network namespace (`/run/netns/NAME`, as
    /// `ip netns` keeps them). The socket is opened by a thread that joins
    /// the namespace; the caller's thread stays where it is.
    pub(crate) fn in_netns(name: &str) -> Result<Socket, NftError> {
        let path = format!("/run/netns/{name}");
        let fd = std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(&path)
                    .map_err(|e| NftError::Refused(format!("{path}: {e}")))?;
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| NftError::Refused(format!("joining {path}: {}", e.desc())))?;
                open_socket()
            })
            .join()
            .map_err(|_| NftError::Refused("the thread opening the socket panicked".into()))?
        })?;
        Ok(Socket::with(fd))
    }

    fn with(fd: OwnedFd) -> Socket {
        Socket {
            fd,
            seq: 0,
            buf: vec![0; DATAGRAM_MAX],
            send_buffer: 0,
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) -> Result<(), NftError> {
        self.drain();
        // The kernel refuses a message larger than the send buffer, and
        // reads a batch only from one message: grow the buffer to fit.
        let need = bytes.len() + 4096;
        if need > self.send_buffer {
            let size = need.max(1 << 20);
            if setsockopt(&self.fd, sockopt::SndBufForce, &size).is_err() {
                setsockopt(&self.fd, sockopt::SndBuf, &size).map_err(io)?;
            }
            self.send_buffer = size;
        }
        let sent = send(self.fd.as_raw_fd(), bytes, MsgFlags::empty()).map_err(io)?;
        if sent != bytes.len() {
            return Err(NftError::Refused(format!(
                "netlink took {sent} of {} bytes",
                bytes.len()
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
    /// an error or the end of a dump (sequence number, type, attributes)
    /// to `each`. Waiting is for the answers to the requests `first_seq
    /// ..= last_seq`, and only their messages count; a batch's
    /// replies are already queued when `send` returns, so those are read
    /// without waiting. An error from `each` is returned once the answer
    /// has been read to its end.
    pub(crate) fn receive(
        &mut self,
        wait: bool,
        first_seq: u32,
        last_seq: u32,
        mut each: impl FnMut(u32, u16, Attrs<'_>) -> Result<(), NftError>,
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
                        if let Some((_, attrs)) = m.nfgen() {
                            failed = each(m.seq, k, attrs).err();
                        }
                    }
                    _ => {}
                }
            }
            if finished {
                return failed.map_or(Ok(reply), Err);
            }
        }
    }

    /// Sends one request (a dump, or a get with an acknowledgement) and
    /// hands each message of the answer to `each`.
    pub(crate) fn request(
        &mut self,
        kind: u16,
        dump: bool,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        each: impl FnMut(u16, Attrs<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
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
