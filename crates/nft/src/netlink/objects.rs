//! Tables, chains, sets, elements and rules as nf_tables messages: the
//! operations of a [`Transaction`] written as the messages nft sends for
//! the same script, and the kernel's dump of a table read back.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::expr::{self, NFTA_DATA_VALUE, NFTA_DATA_VERDICT, type_len, value_bytes, value_of};
use super::socket::NLM_F_REQUEST;
use super::wire::{Attrs, Writer, udata};
use crate::backend::{ChainState, Counter, SetState, TableState};
use crate::error::NftError;
use crate::ir::{
    BaseChain, Chain, ChainType, DataType, Element, ElementValue, Family, Hook, L4Proto, Rule, Set,
    Value,
};
use crate::tx::Op;

/// `NFNL_SUBSYS_NFTABLES`.
pub(crate) const SUBSYS: u16 = 10;

// Message types (`enum nf_tables_msg_types`).
pub(crate) const NEWTABLE: u8 = 0;
pub(crate) const GETTABLE: u8 = 1;
const DELTABLE: u8 = 2;
pub(crate) const NEWCHAIN: u8 = 3;
pub(crate) const GETCHAIN: u8 = 4;
pub(crate) const DELCHAIN: u8 = 5;
pub(crate) const NEWRULE: u8 = 6;
pub(crate) const GETRULE: u8 = 7;
pub(crate) const DELRULE: u8 = 8;
pub(crate) const NEWSET: u8 = 9;
pub(crate) const GETSET: u8 = 10;
const DELSET: u8 = 11;
pub(crate) const NEWSETELEM: u8 = 12;
pub(crate) const GETSETELEM: u8 = 13;
const DELSETELEM: u8 = 14;
pub(crate) const NEWGEN: u8 = 15;
pub(crate) const GETGEN: u8 = 16;

const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

// Set flags.
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT: u32 = 0x10;
const SET_EVAL: u32 = 0x20;
const SET_CONCAT: u32 = 0x80;
/// `NFT_DATA_VERDICT`, the data type of verdict maps.
const DATA_VERDICT: u32 = 0xffff_ff00;

// nft's user data record types.
const UDATA_COMMENT: u8 = 0;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_TYPEOF: u8 = 4;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
const UDATA_SET_COMMENT: u8 = 7;
const BYTEORDER_BIG: u32 = 2;
// nft's expression kinds and protocol descriptions, in typeof records.
const TYPEOF_PAYLOAD: u32 = 7;
const TYPEOF_CONCAT: u32 = 13;
const TYPEOF_NUMGEN: u32 = 23;
const DESC_UDP: u32 = 6;
const DESC_TCP: u32 = 8;
const DESC_SCTP: u32 = 10;
const DESC_IP: u32 = 12;
const DESC_IP6: u32 = 13;
const IP_DADDR: u32 = 12;
const IP6_DADDR: u32 = 9;
/// The destination port field of TCP, UDP and SCTP headers.
const TH_DPORT: u32 = 2;

/// When a message's element list is this long, the next element starts a
/// new message: the list is one attribute, whose length is 16 bits, and
/// one element with the longest comment and chain name stays under 1 KiB.
const LIST_BYTES_MAX: usize = 60 * 1024;

pub(crate) fn nfproto(family: Family) -> u8 {
    match family {
        Family::Ip => NFPROTO_IPV4,
        Family::Ip6 => NFPROTO_IPV6,
    }
}

pub(crate) fn kind(msg: u8) -> u16 {
    SUBSYS << 8 | u16::from(msg)
}

fn hook_number(h: Hook) -> u32 {
    match h {
        Hook::Prerouting => 0,
        Hook::Input => 1,
        Hook::Forward => 2,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    }
}

fn hook_of(n: u32) -> Option<Hook> {
    Some(match n {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        _ => return None,
    })
}

fn type_id(t: DataType) -> u32 {
    match t {
        DataType::Ipv4Addr => 7,
        DataType::Ipv6Addr => 8,
        DataType::InetProto => 12,
        DataType::InetService | DataType::PortOf(_) => 13,
        DataType::Numgen => 4,
        DataType::Verdict => DATA_VERDICT,
    }
}

/// nft's id for a concatenation: six bits per field.
fn concat_id(types: &[DataType]) -> u32 {
    types.iter().fold(0, |acc, t| acc << 6 | type_id(*t))
}

/// A key's length: one field exactly, several each padded to 32 bits.
fn key_len(types: &[DataType]) -> usize {
    match types {
        [one] => type_len(*one),
        many => many.iter().map(|t| type_len(*t).div_ceil(4) * 4).sum(),
    }
}

/// The bytes of a key or value: one field as is, several each padded.
fn concat_bytes(values: &[Value], end: bool) -> Result<Vec<u8>, NftError> {
    let mut out = Vec::new();
    let many = values.len() > 1;
    for v in values {
        let mut b = match v {
            Value::Prefix(net) => match (net.network(), net.broadcast(), end) {
                (IpAddr::V4(a), _, false) => a.octets().to_vec(),
                (IpAddr::V6(a), _, false) => a.octets().to_vec(),
                (_, IpAddr::V4(a), true) => a.octets().to_vec(),
                (_, IpAddr::V6(a), true) => a.octets().to_vec(),
            },
            other => value_bytes(other)?,
        };
        if many {
            b.resize(b.len().div_ceil(4) * 4, 0);
        }
        out.extend_from_slice(&b);
    }
    Ok(out)
}

fn comment_udata(c: &str) -> Vec<u8> {
    let mut u = Vec::new();
    udata::put_str(&mut u, UDATA_COMMENT, c);
    u
}

/// A typeof record's description of one field, as nft writes it.
fn typeof_member(family: Family, t: DataType) -> Option<Vec<u8>> {
    let mut inner = Vec::new();
    let kind = match t {
        DataType::Ipv4Addr | DataType::Ipv6Addr => {
            let (desc, field) = match family {
                Family::Ip => (DESC_IP, IP_DADDR),
                Family::Ip6 => (DESC_IP6, IP6_DADDR),
            };
            udata::put_u32(&mut inner, 0, desc);
            udata::put_u32(&mut inner, 1, field);
            TYPEOF_PAYLOAD
        }
        DataType::PortOf(p) => {
            let desc = match p {
                L4Proto::Tcp => DESC_TCP,
                L4Proto::Udp => DESC_UDP,
                L4Proto::Sctp => DESC_SCTP,
            };
            udata::put_u32(&mut inner, 0, desc);
            udata::put_u32(&mut inner, 1, TH_DPORT);
            TYPEOF_PAYLOAD
        }
        DataType::Numgen => {
            udata::put_u32(&mut inner, 0, 1);
            udata::put_u32(&mut inner, 1, 1);
            udata::put_u32(&mut inner, 2, 0);
            TYPEOF_NUMGEN
        }
        _ => return None,
    };
    let mut out = Vec::new();
    udata::put_u32(&mut out, 0, kind);
    udata::put(&mut out, 1, &inner);
    Some(out)
}

/// The typeof record of a concatenation (empty members when the set was
/// declared by type names).
fn typeof_concat(family: Family, types: &[DataType], members: bool) -> Vec<u8> {
    let mut list = Vec::new();
    if members {
        for (i, t) in types.iter().enumerate() {
            if let Some(m) = typeof_member(family, *t) {
                udata::put(&mut list, i as u8, &m);
            }
        }
    }
    let mut out = Vec::new();
    udata::put_u32(&mut out, 0, TYPEOF_CONCAT);
    udata::put(&mut out, 1, &list);
    out
}

/// The port type a typeof record names for field `i` of a concatenation.
fn typeof_ports(rec: &[u8]) -> BTreeMap<u8, L4Proto> {
    let mut out = BTreeMap::new();
    let Some(list) = udata::get(rec, 1) else {
        return out;
    };
    for (i, member) in udata::records(list) {
        if udata::u32(member, 0) != Some(TYPEOF_PAYLOAD) {
            continue;
        }
        let Some(inner) = udata::get(member, 1) else {
            continue;
        };
        let proto = match udata::u32(inner, 0) {
            Some(DESC_TCP) => L4Proto::Tcp,
            Some(DESC_UDP) => L4Proto::Udp,
            Some(DESC_SCTP) => L4Proto::Sctp,
            _ => continue,
        };
        if udata::u32(inner, 1) == Some(TH_DPORT) {
            out.insert(i, proto);
        }
    }
    out
}

fn set_udata(family: Family, s: &Set) -> Vec<u8> {
    let typeof_ = s.key.contains(&DataType::Numgen)
        || s.value
            .as_ref()
            .is_some_and(|v| v.contains(&DataType::Numgen));
    let order = |types: &[DataType]| match types {
        [DataType::Ipv4Addr | DataType::Ipv6Addr | DataType::InetService | DataType::PortOf(_)] => {
            BYTEORDER_BIG
        }
        [DataType::Numgen] => 1,
        _ => 0,
    };
    let mut u = Vec::new();
    udata::put_u32(&mut u, UDATA_SET_KEYBYTEORDER, order(&s.key));
    if let Some(v) = &s.value {
        udata::put_u32(&mut u, UDATA_SET_DATABYTEORDER, order(v));
    }
    if s.key.len() > 1 {
        udata::put(
            &mut u,
            UDATA_SET_KEY_TYPEOF,
            &typeof_concat(family, &s.key, typeof_),
        );
    }
    if let Some(v) = &s.value
        && v.len() > 1
    {
        udata::put(
            &mut u,
            UDATA_SET_DATA_TYPEOF,
            &typeof_concat(family, v, typeof_),
        );
    }
    if s.value.is_some() {
        udata::put_u32(&mut u, UDATA_SET_DATA_INTERVAL, 0);
    }
    if let Some(c) = &s.comment {
        udata::put_str(&mut u, UDATA_SET_COMMENT, c);
    }
    u
}

/// Writes transactions as nf_tables messages.
pub(crate) struct Batch<'a> {
    pub(crate) w: &'a mut Writer,
    pub(crate) family: Family,
    pub(crate) table: &'a str,
    pub(crate) seq: u32,
    /// The table's sets as the transaction leaves them: how their
    /// elements, and the lookups in rules, are encoded.
    pub(crate) sets: &'a BTreeMap<String, Set>,
    /// The operations each message came from, by sequence number: the
    /// first and how many (a message of elements carries consecutive
    /// ones), so that a cold sync's 180,000 elements cost a few thousand
    /// entries here, not one each.
    pub(crate) origin: Vec<(u32, usize, usize)>,
    pub(crate) next_set_id: u32,
}

impl Batch<'_> {
    fn begin(&mut self, msg: u8, flags: u16, op: usize) {
        self.seq += 1;
        self.w.begin(
            kind(msg),
            NLM_F_REQUEST | flags,
            self.seq,
            nfproto(self.family),
            0,
        );
        self.origin.push((self.seq, op, 1));
    }

    fn close(&mut self, at: usize, what: &str) -> Result<(), NftError> {
        self.w.close(at).map_err(|n| too_big(what, n))
    }

    /// Writes operation `i`. Element operations are written by
    /// [`Batch::elements`], which groups consecutive ones.
    pub(crate) fn op(&mut self, i: usize, op: &Op) -> Result<(), NftError> {
        let table = self.table;
        match op {
            Op::AddTable(comment) => {
                self.begin(NEWTABLE, NLM_F_CREATE, i);
                self.w.str(1, table);
                self.w.u32_be(2, 0);
                if let Some(c) = comment {
                    self.w.attr(6, &comment_udata(c));
                }
            }
            Op::DeleteTable => {
                self.begin(DELTABLE, 0, i);
                self.w.str(1, table);
            }
            Op::AddChain(c) => {
                self.begin(NEWCHAIN, NLM_F_CREATE, i);
                self.w.str(1, table);
                self.w.str(3, &c.name);
                if let Some(b) = &c.base {
                    let h = self.w.open(4);
                    self.w.u32_be(1, hook_number(b.hook));
                    self.w.u32_be(2, b.priority as u32);
                    self.close(h, "a hook")?;
                    self.w.str(
                        7,
                        match b.chain_type {
                            ChainType::Filter => "filter",
                            ChainType::Nat => "nat",
                        },
                    );
                }
                if let Some(c) = &c.comment {
                    self.w.attr(12, &comment_udata(c));
                }
            }
            Op::FlushChain(c) => {
                self.begin(DELRULE, 0, i);
                self.w.str(1, table);
                self.w.str(2, c);
            }
            Op::DeleteChain(c) => {
                self.begin(DELCHAIN, 0, i);
                self.w.str(1, table);
                self.w.str(3, c);
            }
            Op::AddSet(s) => self.set(i, s)?,
            Op::FlushSet(s) => {
                self.begin(DELSETELEM, 0, i);
                self.w.str(1, table);
                self.w.str(2, s);
            }
            Op::DeleteSet(s) => {
                self.begin(DELSET, 0, i);
                self.w.str(1, table);
                self.w.str(2, s);
            }
            Op::AddRule(r) => {
                let rule = &r.rule;
                self.begin(NEWRULE, NLM_F_CREATE | NLM_F_APPEND, i);
                self.w.str(1, table);
                self.w.str(2, &r.chain);
                let list = self.w.open(4);
                let sets = self.sets;
                let interval = |name: &str| sets.get(name).is_some_and(|s| s.interval);
                expr::encode(self.w, self.family, &rule.exprs, &interval)?;
                self.close(list, "a rule")?;
                if let Some(c) = &rule.comment {
                    self.w.attr(7, &comment_udata(c));
                }
            }
            Op::AddElement(..) | Op::DeleteElement(..) => {
                return Err(NftError::Invalid("elements are written in groups".into()));
            }
        }
        self.w.end();
        Ok(())
    }

    fn set(&mut self, i: usize, s: &Set) -> Result<(), NftError> {
        let mut flags = 0;
        if s.is_map() {
            flags |= SET_MAP;
        }
        if s.interval {
            flags |= SET_INTERVAL;
            if s.key.len() > 1 {
                flags |= SET_CONCAT;
            }
        }
        if s.timeout.is_some() {
            flags |= SET_TIMEOUT | SET_EVAL;
        }
        self.begin(NEWSET, NLM_F_CREATE, i);
        self.w.str(1, self.table);
        self.w.str(2, &s.name);
        self.w.u32_be(3, flags);
        self.w.u32_be(4, concat_id(&s.key));
        self.w.u32_be(5, key_len(&s.key) as u32);
        if let Some(v) = &s.value {
            if s.is_vmap() {
                self.w.u32_be(6, DATA_VERDICT);
                self.w.u32_be(7, 0);
            } else {
                self.w.u32_be(6, concat_id(v));
                self.w.u32_be(7, key_len(v) as u32);
            }
        }
        if s.size.is_some() || (s.interval && s.key.len() > 1) {
            let d = self.w.open(9);
            if let Some(size) = s.size {
                self.w.u32_be(1, size);
            }
            if s.interval && s.key.len() > 1 {
                let c = self.w.open(2);
                for t in &s.key {
                    let e = self.w.open(1);
                    self.w.u32_be(1, type_len(*t) as u32);
                    self.close(e, "a field")?;
                }
                self.close(c, "a concatenation")?;
            }
            self.close(d, "a set description")?;
        }
        self.next_set_id += 1;
        self.w.u32_be(10, self.next_set_id);
        if let Some(t) = s.timeout {
            self.w.u64_be(11, u64::from(t) * 1000);
        }
        self.w.attr(13, &set_udata(self.family, s));
        if s.counters {
            let e = self.w.open(17);
            self.w.str(1, "counter");
            let d = self.w.open(2);
            self.close(d, "a counter")?;
            self.close(e, "a set expression")?;
        }
        Ok(())
    }

    /// Writes a run of element operations on one set (`add` says which
    /// kind), the transaction's operations from `first` on, starting a
    /// new message whenever the element list nears netlink's 64 KiB
    /// attribute limit.
    pub(crate) fn elements(
        &mut self,
        set: &str,
        add: bool,
        first: usize,
        items: &[Op],
    ) -> Result<(), NftError> {
        let interval = self
            .sets
            .get(set)
            .is_some_and(|s| s.interval && s.key.len() > 1);
        let mut list: Option<usize> = None;
        for (i, op) in (first..).zip(items) {
            if list.is_some_and(|at| self.w.len() - at > LIST_BYTES_MAX) {
                self.end_elements(list.take())?;
            }
            if list.is_some() {
                if let Some(last) = self.origin.last_mut() {
                    last.2 += 1;
                }
            } else {
                self.begin(
                    if add { NEWSETELEM } else { DELSETELEM },
                    if add { NLM_F_CREATE } else { 0 },
                    i,
                );
                self.w.str(1, self.table);
                self.w.str(2, set);
                list = Some(self.w.open(3));
            }
            let (key, element): (&[Value], Option<&Element>) = match op {
                Op::AddElement(_, e) => (&e.key, Some(e)),
                Op::DeleteElement(_, e) => (&e.key, None),
                _ => continue,
            };
            let e = self.w.open(1);
            element_key(self.w, key, interval)?;
            if let Some(el) = element {
                match &el.value {
                    Some(ElementValue::Verdict(v)) => {
                        let d = self.w.open(2);
                        expr::verdict_data(self.w, v);
                        self.close(d, "a verdict")?;
                    }
                    Some(ElementValue::Data(values)) => {
                        let d = self.w.open(2);
                        self.w.attr(NFTA_DATA_VALUE, &concat_bytes(values, false)?);
                        self.close(d, "a value")?;
                    }
                    None => {}
                }
                if let Some(c) = &el.comment {
                    self.w.attr(6, &comment_udata(c));
                }
            }
            self.close(e, "an element")?;
        }
        self.end_elements(list)
    }

    fn end_elements(&mut self, list: Option<usize>) -> Result<(), NftError> {
        if let Some(at) = list {
            self.close(at, "an element list")?;
            self.w.end();
        }
        Ok(())
    }
}

/// The attributes of a get of the element matching `key` in `set` of
/// `table`: in an interval set, the key is a point (its own end).
pub(crate) fn lookup_request(
    w: &mut Writer,
    table: &str,
    set: &Set,
    key: &[Value],
) -> Result<(), NftError> {
    w.str(1, table);
    w.str(2, &set.name);
    let list = w.open(3);
    let e = w.open(1);
    element_key(w, key, set.interval && set.key.len() > 1)?;
    w.close(e).map_err(|n| too_big("an element", n))?;
    w.close(list).map_err(|n| too_big("an element list", n))?;
    Ok(())
}

/// An element's key attributes: the key, and for an interval
/// concatenation its end (a point is its own end; a prefix ends at its
/// last address).
fn element_key(w: &mut Writer, key: &[Value], interval: bool) -> Result<(), NftError> {
    let k = w.open(1);
    w.attr(NFTA_DATA_VALUE, &concat_bytes(key, false)?);
    w.close(k).map_err(|n| too_big("a key", n))?;
    if interval {
        let k = w.open(10);
        w.attr(NFTA_DATA_VALUE, &concat_bytes(key, true)?);
        w.close(k).map_err(|n| too_big("a key", n))?;
    }
    Ok(())
}

/// What a nested attribute over netlink's 64 KiB limit is refused with.
fn too_big(what: &str, n: usize) -> NftError {
    NftError::Invalid(format!("{what} takes {n} bytes, over netlink's 64 KiB"))
}

// ---- Reading a dump back.

/// A table's comment from a `NEWTABLE` message.
pub(crate) fn table_comment(a: Attrs<'_>) -> Option<String> {
    udata::string(a.get(6)?, UDATA_COMMENT)
}

/// A chain from a `NEWCHAIN` message.
pub(crate) fn chain(a: Attrs<'_>) -> Result<Chain, NftError> {
    let name = a
        .str(3)
        .ok_or_else(|| NftError::Parse("a chain without a name".into()))?;
    let mut c = Chain::regular(name);
    if let Some(h) = a.nested(4) {
        let hook = h
            .u32_be(1)
            .and_then(hook_of)
            .ok_or_else(|| NftError::Parse(format!("chain {name}: hook {:?}", h.u32_be(1))))?;
        let priority = h
            .i32_be(2)
            .ok_or_else(|| NftError::Parse(format!("chain {name}: no priority")))?;
        let chain_type = match a.str(7) {
            Some("filter") => ChainType::Filter,
            Some("nat") => ChainType::Nat,
            other => return Err(NftError::Parse(format!("chain {name}: type {other:?}"))),
        };
        if a.u32_be(5).is_some_and(|p| p != 1) {
            return Err(NftError::Parse(format!("chain {name}: policy drop")));
        }
        c.base = Some(BaseChain {
            chain_type,
            hook,
            priority,
        });
    }
    c.comment = a.get(12).and_then(|u| udata::string(u, UDATA_COMMENT));
    Ok(c)
}

fn type_of(id: u32) -> Option<DataType> {
    Some(match id {
        7 => DataType::Ipv4Addr,
        8 => DataType::Ipv6Addr,
        12 => DataType::InetProto,
        13 => DataType::InetService,
        4 => DataType::Numgen,
        _ => return None,
    })
}

/// The fields of a concatenated type id.
fn types_of(mut id: u32, what: &str) -> Result<Vec<DataType>, NftError> {
    let mut out = Vec::new();
    while id != 0 {
        out.push(
            type_of(id & 63).ok_or_else(|| NftError::Parse(format!("{what}: type {}", id & 63)))?,
        );
        id >>= 6;
    }
    out.reverse();
    if out.is_empty() {
        return Err(NftError::Parse(format!("{what}: no type")));
    }
    Ok(out)
}

/// A set from a `NEWSET` message.
pub(crate) fn set(a: Attrs<'_>) -> Result<Set, NftError> {
    let name = a
        .str(2)
        .ok_or_else(|| NftError::Parse("a set without a name".into()))?;
    let what = format!("set {name}");
    let flags = a.u32_be(3).unwrap_or(0);
    let ud = a.get(13).unwrap_or(&[]);
    let ports = |rec: u8| udata::get(ud, rec).map(typeof_ports).unwrap_or_default();
    let with_ports = |mut types: Vec<DataType>, ports: BTreeMap<u8, L4Proto>| {
        for (i, p) in ports {
            if let Some(t) = types.get_mut(usize::from(i))
                && *t == DataType::InetService
            {
                *t = DataType::PortOf(p);
            }
        }
        types
    };
    let key = with_ports(
        types_of(a.u32_be(4).unwrap_or(0), &what)?,
        ports(UDATA_SET_KEY_TYPEOF),
    );
    let mut s = Set::set(name, key);
    if flags & SET_MAP != 0 {
        let id = a
            .u32_be(6)
            .ok_or_else(|| NftError::Parse(format!("{what}: a map without a value type")))?;
        s.value = Some(if id == DATA_VERDICT {
            vec![DataType::Verdict]
        } else {
            with_ports(types_of(id, &what)?, ports(UDATA_SET_DATA_TYPEOF))
        });
    }
    if flags & !(SET_MAP | SET_INTERVAL | SET_TIMEOUT | SET_EVAL | SET_CONCAT) != 0 {
        return Err(NftError::Parse(format!("{what}: flags {flags:#x}")));
    }
    s.interval = flags & SET_INTERVAL != 0;
    if flags & SET_TIMEOUT != 0 {
        s.timeout = Some((a.u64_be(11).unwrap_or(0) / 1000) as u32);
    }
    s.size = a.nested(9).and_then(|d| d.u32_be(1));
    s.counters = a.nested(17).is_some_and(|e| e.str(1) == Some("counter"))
        || a.nested(18)
            .is_some_and(|list| list.iter().any(|(_, e)| Attrs(e).str(1) == Some("counter")));
    s.comment = udata::string(ud, UDATA_SET_COMMENT);
    Ok(s)
}

/// Splits a key's bytes into its fields' bytes.
fn split<'b>(types: &[DataType], b: &'b [u8]) -> Result<Vec<&'b [u8]>, NftError> {
    let many = types.len() > 1;
    let mut out = Vec::new();
    let mut at = 0;
    for t in types {
        let len = type_len(*t);
        let part = b
            .get(at..at + len)
            .ok_or_else(|| NftError::Parse(format!("{} bytes for {types:?}", b.len())))?;
        out.push(part);
        at += if many { len.div_ceil(4) * 4 } else { len };
    }
    Ok(out)
}

/// The network spanning `start..=end`, if it is one.
fn network(start: &Value, end: &Value) -> Option<Value> {
    let (Value::Addr(s), Value::Addr(e)) = (start, end) else {
        return None;
    };
    let max = if s.is_ipv4() { 32 } else { 128 };
    (0..=max).rev().find_map(|bits| {
        let net = ipnet::IpNet::new(*s, bits).ok()?;
        (net.network() == *s && net.broadcast() == *e).then_some(Value::Prefix(net))
    })
}

/// Elements of a dump with their counters, in the kernel's (hash) order:
/// one `NEWSETELEM` message's, or a whole set's.
pub(crate) type Items = Vec<(Element, Option<Counter>)>;

/// A dump's elements in key order, each key once (a dump that spans a
/// change of the set can repeat one).
pub(crate) fn sort_items(items: &mut Items) {
    items.sort_unstable_by(|a, b| a.0.key.cmp(&b.0.key));
    items.dedup_by(|a, b| a.0.key == b.0.key);
}

/// A set's state from the elements of its whole dump: sorted once and
/// built in bulk, rather than inserted one by one into the maps.
pub(crate) fn set_state(set: &Set, mut items: Items) -> SetState {
    sort_items(&mut items);
    let counters = items
        .iter()
        .filter_map(|(e, c)| c.map(|c| (e.key.clone(), c)))
        .collect();
    let elements = items.into_iter().map(|(e, _)| (e.key.clone(), e)).collect();
    SetState {
        set: set.clone(),
        elements,
        counters,
    }
}

/// The elements of one `NEWSETELEM` message of a dump, appended to `out`.
pub(crate) fn element_items(set: &Set, list: Attrs<'_>, out: &mut Items) -> Result<(), NftError> {
    let what = || format!("set {}", set.name);
    for (_, e) in list.iter() {
        let e = Attrs(e);
        let key_bytes = e
            .nested(1)
            .and_then(|k| k.get(NFTA_DATA_VALUE))
            .ok_or_else(|| NftError::Parse(format!("{}: an element without a key", what())))?;
        let starts = split(&set.key, key_bytes)?;
        let ends = match e.nested(10).and_then(|k| k.get(NFTA_DATA_VALUE)) {
            Some(b) => Some(split(&set.key, b)?),
            None => None,
        };
        let mut key = Vec::new();
        for (i, (t, b)) in set.key.iter().zip(&starts).enumerate() {
            let start = value_of(*t, b)?;
            let v = match &ends {
                Some(ends)
                    if set.interval && matches!(t, DataType::Ipv4Addr | DataType::Ipv6Addr) =>
                {
                    let end = value_of(*t, ends[i])?;
                    if i == 0 && start == end {
                        start
                    } else {
                        network(&start, &end).ok_or_else(|| {
                            NftError::Parse(format!("{}: range {start}-{end}", what()))
                        })?
                    }
                }
                Some(ends) => {
                    if value_of(*t, ends[i])? != start {
                        return Err(NftError::Parse(format!("{}: a range of {t:?}", what())));
                    }
                    start
                }
                None => start,
            };
            key.push(v);
        }
        let value = match &set.value {
            Some(types) if set.is_vmap() => {
                let _ = types;
                let v = e
                    .nested(2)
                    .and_then(|d| d.nested(NFTA_DATA_VERDICT))
                    .ok_or_else(|| {
                        NftError::Parse(format!("{}: an element without a verdict", what()))
                    })?;
                Some(ElementValue::Verdict(expr::read_verdict(v)?))
            }
            Some(types) => {
                let b = e
                    .nested(2)
                    .and_then(|d| d.get(NFTA_DATA_VALUE))
                    .ok_or_else(|| {
                        NftError::Parse(format!("{}: an element without a value", what()))
                    })?;
                Some(ElementValue::Data(
                    split(types, b)?
                        .into_iter()
                        .zip(types)
                        .map(|(b, t)| value_of(*t, b))
                        .collect::<Result<_, _>>()?,
                ))
            }
            None => None,
        };
        let comment = e.get(6).and_then(|u| udata::string(u, UDATA_COMMENT));
        out.push((
            Element {
                key: key.into(),
                value,
                comment: comment.map(String::into_boxed_str),
            },
            element_counter(e),
        ));
    }
    Ok(())
}

fn counter_of(expr: Attrs<'_>) -> Option<Counter> {
    if expr.str(1) != Some("counter") {
        return None;
    }
    let d = expr.nested(2)?;
    Some(Counter {
        bytes: d.u64_be(1).unwrap_or(0),
        packets: d.u64_be(2).unwrap_or(0),
    })
}

fn element_counter(e: Attrs<'_>) -> Option<Counter> {
    if let Some(x) = e.nested(7) {
        return counter_of(x);
    }
    e.nested(11)?.iter().find_map(|(_, x)| counter_of(Attrs(x)))
}

/// A rule read back: its chain, the rule, what its `counter` says, and
/// its handle.
pub(crate) type ReadRule = (String, Rule, Option<Counter>, u64);

/// A rule from a `NEWRULE` message: its chain, the rule, and what its
/// `counter` says.
pub(crate) fn rule(
    family: Family,
    a: Attrs<'_>,
    sets: expr::SetLookup<'_>,
) -> Result<ReadRule, NftError> {
    let chain = a
        .str(2)
        .ok_or_else(|| NftError::Parse("a rule without a chain".into()))?
        .to_owned();
    let (exprs, counter) = expr::decode(family, a.nested(4).unwrap_or(Attrs(&[])), sets)
        .map_err(|e| e.context(&format!("a rule in chain {chain}")))?;
    let mut r = Rule::new(exprs);
    r.comment = a.get(7).and_then(|u| udata::string(u, UDATA_COMMENT));
    Ok((chain, r, counter, a.u64_be(3).unwrap_or(0)))
}

/// Assembles a table from what was read.
pub(crate) fn table(
    comment: Option<String>,
    chains: Vec<Chain>,
    sets: Vec<SetState>,
    rules: Vec<ReadRule>,
) -> Result<TableState, NftError> {
    let mut t = TableState {
        comment,
        ..TableState::default()
    };
    for c in chains {
        t.chains.insert(
            c.name.clone(),
            ChainState {
                chain: c,
                rules: Vec::new(),
                counters: BTreeMap::new(),
                handles: Vec::new(),
            },
        );
    }
    for s in sets {
        t.sets.insert(s.set.name.clone(), s);
    }
    for (chain, r, counter, handle) in rules {
        let c = t
            .chains
            .get_mut(&chain)
            .ok_or_else(|| NftError::Parse(format!("a rule in unknown chain {chain}")))?;
        if let Some(counter) = counter {
            c.counters.insert(c.rules.len(), counter);
        }
        c.rules.push(r);
        c.handles.push(handle);
    }
    Ok(t)
}
