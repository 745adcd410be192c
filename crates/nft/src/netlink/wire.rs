//! Netlink framing: messages with an nfnetlink header, attributes and
//! nested attributes, written into one buffer, and read back without
//! copying. Nothing here knows about nftables objects.

/// `NLA_F_NESTED`: the attribute holds attributes.
const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type bits (the top two bits are flags).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Size of `struct nlmsghdr`.
pub(crate) const NLMSG_HDRLEN: usize = 16;
/// Size of `struct nfgenmsg`.
const NFGEN_LEN: usize = 4;

/// Rounds up to netlink's 4-byte alignment.
pub(crate) fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// How large a chunk of a [`Writer::chunked`] writer grows before the
/// next message starts another.
pub(crate) const CHUNK: usize = 1 << 20;

/// A buffer of netlink messages being written: one buffer, or for a
/// large batch ([`Writer::chunked`]) chunks of about [`CHUNK`] bytes, each
/// ending at a message's end, sent together with one `sendmsg`. One
/// buffer grows by doubling, so a batch of 13 MB held up to 24 MiB while
/// the last doubling copied it.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
    /// Where the open message starts (in `buf`).
    msg: Option<usize>,
    /// Chunks already full, in order (only a chunked writer has them).
    full: Vec<Vec<u8>>,
    /// Whether a message that starts after [`CHUNK`] bytes starts a chunk.
    chunked: bool,
}

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer::default()
    }

    /// A writer for a batch of any size, in chunks (the first grows as a
    /// small batch needs; the next ones are made at their full size).
    pub(crate) fn chunked() -> Writer {
        Writer {
            chunked: true,
            ..Writer::default()
        }
    }

    /// The bytes written so far, of a writer that is not chunked.
    pub(crate) fn bytes(&self) -> &[u8] {
        debug_assert!(self.full.is_empty(), "a chunked writer's bytes");
        &self.buf
    }

    /// The bytes written so far, chunk by chunk.
    pub(crate) fn chunks(&self) -> Vec<&[u8]> {
        let mut out: Vec<&[u8]> = self.full.iter().map(Vec::as_slice).collect();
        out.push(&self.buf);
        out
    }

    /// The bytes written so far in the current chunk: only lengths within
    /// one message may be taken from it.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Starts a message: netlink header, then `struct nfgenmsg` with the
    /// family and the resource id (big-endian, as the kernel reads it).
    pub(crate) fn begin(&mut self, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
        self.begin_raw(kind, flags, seq);
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
    }

    /// Starts a message with the netlink header alone: the caller writes
    /// its protocol's own header (rtnetlink's `ifaddrmsg`, say) with
    /// [`Writer::raw`].
    pub(crate) fn begin_raw(&mut self, kind: u16, flags: u16, seq: u32) {
        self.end();
        if self.chunked && self.buf.len() >= CHUNK {
            let next = Vec::with_capacity(CHUNK + CHUNK / 4);
            self.full.push(std::mem::replace(&mut self.buf, next));
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.msg = Some(start);
    }

    /// Bytes written as they are (a protocol header; keep it aligned).
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.pad();
    }

    /// Closes the open message, writing its length.
    pub(crate) fn end(&mut self) {
        if let Some(start) = self.msg.take() {
            let len = (self.buf.len() - start) as u32;
            self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        }
    }

    /// One attribute with raw contents, padded to alignment.
    pub(crate) fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    pub(crate) fn u32_be(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_be_bytes());
    }

    pub(crate) fn u64_be(&mut self, kind: u16, v: u64) {
        self.attr(kind, &v.to_be_bytes());
    }

    pub(crate) fn u8(&mut self, kind: u16, v: u8) {
        self.attr(kind, &[v]);
    }

    /// A NUL-terminated string.
    pub(crate) fn str(&mut self, kind: u16, s: &str) {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.attr(kind, &data);
    }

    /// Opens a nested attribute; close it with [`Writer::close`].
    pub(crate) fn open(&mut self, kind: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        start
    }

    /// Closes a nested attribute opened at `start`. Fails when its length
    /// does not fit netlink's 16-bit attribute length.
    pub(crate) fn close(&mut self, start: usize) -> Result<(), usize> {
        let len = self.buf.len() - start;
        if len > usize::from(u16::MAX) {
            return Err(len);
        }
        self.buf[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
        Ok(())
    }

    fn pad(&mut self) {
        let n = align(self.buf.len()) - self.buf.len();
        self.buf.extend(std::iter::repeat_n(0, n));
    }
}

/// One netlink message as read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Message<'a> {
    pub(crate) kind: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    /// What follows the netlink header.
    pub(crate) payload: &'a [u8],
}

impl<'a> Message<'a> {
    /// The nfgenmsg family byte, and the attributes after that header.
    pub(crate) fn nfgen(&self) -> Option<(u8, Attrs<'a>)> {
        if self.payload.len() < NFGEN_LEN {
            return None;
        }
        Some((self.payload[0], Attrs(&self.payload[NFGEN_LEN..])))
    }
}

/// The messages of one datagram. Stops at the first malformed one.
pub(crate) fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let msg = Message {
            kind: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            payload: &buf[NLMSG_HDRLEN..len],
        };
        buf = &buf[align(len).min(buf.len())..];
        Some(msg)
    })
}

/// A run of attributes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attrs<'a>(pub(crate) &'a [u8]);

impl<'a> Attrs<'a> {
    /// Every attribute as (type, contents), stopping at a malformed one.
    pub(crate) fn iter(self) -> impl Iterator<Item = (u16, &'a [u8])> {
        let mut buf = self.0;
        std::iter::from_fn(move || {
            if buf.len() < 4 {
                return None;
            }
            let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
            let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
            if len < 4 || len > buf.len() {
                return None;
            }
            let data = &buf[4..len];
            buf = &buf[align(len).min(buf.len())..];
            Some((kind, data))
        })
    }

    /// The first attribute of a type.
    pub(crate) fn get(self, kind: u16) -> Option<&'a [u8]> {
        self.iter().find(|(k, _)| *k == kind).map(|(_, d)| d)
    }

    pub(crate) fn nested(self, kind: u16) -> Option<Attrs<'a>> {
        self.get(kind).map(Attrs)
    }

    pub(crate) fn u32_be(self, kind: u16) -> Option<u32> {
        let d = self.get(kind)?;
        Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
    }

    pub(crate) fn i32_be(self, kind: u16) -> Option<i32> {
        self.u32_be(kind).map(|v| v as i32)
    }

    pub(crate) fn u64_be(self, kind: u16) -> Option<u64> {
        let d = self.get(kind)?;
        Some(u64::from_be_bytes(d.get(..8)?.try_into().ok()?))
    }

    pub(crate) fn u8(self, kind: u16) -> Option<u8> {
        self.get(kind)?.first().copied()
    }

    /// A string, without its terminating NUL.
    pub(crate) fn str(self, kind: u16) -> Option<&'a str> {
        let d = self.get(kind)?;
        let end = d.iter().position(|b| *b == 0).unwrap_or(d.len());
        std::str::from_utf8(&d[..end]).ok()
    }
}

/// nftables' user data: a run of (type: u8, length: u8, value) records, as
/// nft stores comments and type descriptions the kernel does not read.
pub(crate) mod udata {
    /// Appends one record. Values longer than 255 bytes are cut.
    pub(crate) fn put(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
        let value = &value[..value.len().min(255)];
        out.push(kind);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
    }

    /// Appends a NUL-terminated string record.
    pub(crate) fn put_str(out: &mut Vec<u8>, kind: u8, s: &str) {
        let mut v = s.as_bytes()[..s.len().min(254)].to_vec();
        v.push(0);
        put(out, kind, &v);
    }

    /// Appends a host-endian u32 record.
    pub(crate) fn put_u32(out: &mut Vec<u8>, kind: u8, v: u32) {
        put(out, kind, &v.to_ne_bytes());
    }

    /// The records, stopping at a malformed one.
    pub(crate) fn records(mut buf: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
        std::iter::from_fn(move || {
            if buf.len() < 2 {
                return None;
            }
            let (kind, len) = (buf[0], usize::from(buf[1]));
            let value = buf.get(2..2 + len)?;
            buf = &buf[2 + len..];
            Some((kind, value))
        })
    }

    /// The first record of a type.
    pub(crate) fn get(buf: &[u8], kind: u8) -> Option<&[u8]> {
        records(buf).find(|(k, _)| *k == kind).map(|(_, v)| v)
    }

    /// A string record, without its NUL.
    pub(crate) fn string(buf: &[u8], kind: u8) -> Option<String> {
        let v = get(buf, kind)?;
        let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
        std::str::from_utf8(&v[..end]).ok().map(str::to_owned)
    }

    /// A host-endian u32 record.
    pub(crate) fn u32(buf: &[u8], kind: u8) -> Option<u32> {
        Some(u32::from_ne_bytes(
            get(buf, kind)?.get(..4)?.try_into().ok()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes the same messages, of 1..=5000 bytes each, into `w`.
    fn fill(w: &mut Writer) {
        for i in 0..3000u32 {
            w.begin(0x0a0c, 1, i, 2, 0);
            let n = w.open(3);
            w.attr(1, &vec![i as u8; (i as usize * 7919) % 5000 + 1]);
            w.close(n).unwrap();
        }
        w.end();
    }

    #[test]
    fn a_chunked_writer_cuts_only_between_messages_and_writes_the_same_bytes() {
        let (mut one, mut chunked) = (Writer::new(), Writer::chunked());
        fill(&mut one);
        fill(&mut chunked);
        let chunks = chunked.chunks();
        assert!(chunks.len() >= 5, "{} chunks", chunks.len());
        // Each chunk is whole messages, the last one a little over CHUNK.
        let mut seqs = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            if i + 1 < chunks.len() {
                assert!(c.len() >= CHUNK && c.len() < CHUNK + 5100, "{}", c.len());
            }
            let mut len = 0;
            for m in messages(c) {
                seqs.push(m.seq);
                len += align(NLMSG_HDRLEN + m.payload.len());
            }
            assert_eq!(len, c.len(), "chunk {i} ends inside a message");
        }
        assert_eq!(seqs, (0..3000).collect::<Vec<u32>>());
        assert_eq!(chunks.concat(), one.bytes());
    }

    #[test]
    fn messages_and_attributes_round_trip() {
        let mut w = Writer::new();
        w.begin(0x0a00, 1, 7, 2, 0);
        w.str(1, "verdict");
        let n = w.open(4);
        w.u32_be(1, 3);
        w.u32_be(2, (-100i32) as u32);
        w.close(n).unwrap();
        w.u8(9, 5);
        w.begin(0x0a03, 5, 8, 10, 0);
        w.u64_be(2, 1 << 40);
        w.end();
        let msgs: Vec<_> = messages(w.bytes()).collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!((msgs[0].kind, msgs[0].flags, msgs[0].seq), (0x0a00, 1, 7));
        let (family, a) = msgs[0].nfgen().unwrap();
        assert_eq!(family, 2);
        assert_eq!(a.str(1), Some("verdict"));
        let hook = a.nested(4).unwrap();
        assert_eq!(hook.u32_be(1), Some(3));
        assert_eq!(hook.i32_be(2), Some(-100));
        assert_eq!(a.u8(9), Some(5));
        let (family, b) = msgs[1].nfgen().unwrap();
        assert_eq!((family, b.u64_be(2)), (10, Some(1 << 40)));
    }

    #[test]
    fn oversized_nests_are_refused_and_garbage_stops_parsing() {
        let mut w = Writer::new();
        let n = w.open(1);
        w.attr(2, &vec![0; 70_000 - 8]);
        assert_eq!(w.close(n), Err(70_000));
        assert_eq!(Attrs(&[0xff, 0xff, 1, 0, 9]).iter().count(), 0);
        assert_eq!(messages(&[1, 2, 3]).count(), 0);
        let mut u = Vec::new();
        udata::put_str(&mut u, 7, "c");
        udata::put_u32(&mut u, 0, 2);
        assert_eq!(udata::string(&u, 7).as_deref(), Some("c"));
        assert_eq!(udata::u32(&u, 0), Some(2));
        assert_eq!(udata::records(&[3, 9, 1]).count(), 0);
    }
}
