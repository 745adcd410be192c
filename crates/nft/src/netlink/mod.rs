//! The kernel backend without the `nft` program: nf_tables spoken over a
//! netlink socket. A [`Transaction`] is one nfnetlink batch sent in a single
//! `sendmsg`; a dry run is the same batch without its commit, which the
//! kernel validates and then aborts; a table is read back by dumping its
//! chains, sets, elements and rules.
//!
//! What goes on the wire is what nft 1.0.6 sends for the same script
//! (including the user data in which nft keeps comments and `typeof`
//! declarations), so `nft list` shows the same text whichever backend wrote
//! the table, and each backend reads what the other wrote.
//!
//! - [`wire`]: netlink messages and attributes.
//! - [`expr`]: rules as register-machine expressions, both ways.
//! - [`objects`]: tables, chains, sets and elements, both ways.

pub(crate) mod conntrack;
mod expr;
mod objects;
mod ruleset;
pub(crate) mod socket;
pub(crate) mod wire;

pub use conntrack::NetlinkConntrack;
pub use ruleset::{ChainInfo, family_name, nfproto_of};

use std::collections::BTreeMap;

use nix::errno::Errno;

use crate::backend::{Backend, Found, SetState, TableState};
use crate::error::NftError;
use crate::ir::{Element, Family, Set, Value};
use crate::tx::{Op, Transaction};
use objects::{Batch, kind, nfproto};
use socket::{NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, Reply, Socket};
use wire::{Attrs, Writer};

pub(crate) const NFNL_MSG_BATCH_END: u16 = 17;
/// Reads of a table retried when it changed while being read.
const READ_ATTEMPTS: usize = 5;

/// nf_tables over netlink, in the network namespace the socket was opened
/// in.
#[derive(Debug)]
pub struct NetlinkBackend {
    socket: Socket,
    /// The set definitions of tables this backend wrote or read, which the
    /// encoding of rules and elements depends on.
    known: BTreeMap<(Family, String), BTreeMap<String, Set>>,
}

/// The typed error for an errno the kernel returned for `what`, the
/// errno kept.
pub(crate) fn refusal(errno: i32, what: &str) -> NftError {
    NftError::Kernel {
        errno,
        what: what.to_owned(),
    }
}

impl NetlinkBackend {
    /// A socket in the caller's network namespace.
    pub fn new() -> Result<NetlinkBackend, NftError> {
        Ok(NetlinkBackend::with(Socket::open()?))
    }

    /// A socket in the named network namespace (`/run/netns/NAME`, as
    /// `ip netns` keeps them): opened by a thread that joins the namespace,
    /// so the caller's thread stays where it is.
    pub fn in_netns(name: &str) -> Result<NetlinkBackend, NftError> {
        Ok(NetlinkBackend::with(Socket::in_netns(name)?))
    }

    fn with(socket: Socket) -> NetlinkBackend {
        NetlinkBackend {
            socket,
            known: BTreeMap::new(),
        }
    }

    /// Sends one nf_tables request and hands each nf_tables message of the
    /// answer to `each`.
    fn request(
        &mut self,
        msg: u8,
        dump: bool,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        mut each: impl FnMut(u8, Attrs<'_>) -> Result<(), NftError>,
    ) -> Result<Reply, NftError> {
        self.socket.request(kind(msg), dump, family, attrs, |k, a| {
            if k >> 8 == objects::SUBSYS {
                each((k & 0xff) as u8, a)?;
            }
            Ok(())
        })
    }

    /// A table (with its elements, or without), read again while the
    /// ruleset changed under the read.
    fn consistent_read(
        &mut self,
        family: Family,
        name: &str,
        elements: bool,
    ) -> Result<Option<TableState>, NftError> {
        for _ in 0..READ_ATTEMPTS {
            let before = self.read_generation()?;
            let (table, interrupted) = self.read_table(family, name, elements)?;
            if !interrupted && self.read_generation()? == before {
                return Ok(table);
            }
        }
        Err(NftError::Busy(format!(
            "table {family} {name} kept changing while it was read"
        )))
    }

    /// The ruleset's generation, which every commit changes.
    fn read_generation(&mut self) -> Result<u32, NftError> {
        let mut id = None;
        let r = self.request(
            objects::GETGEN,
            false,
            0,
            |_| {},
            |m, a| {
                if m == objects::NEWGEN {
                    id = a.u32_be(1);
                }
                Ok(())
            },
        )?;
        if let Some((_, errno)) = r.errors.first() {
            return Err(refusal(*errno, "reading the ruleset generation"));
        }
        id.ok_or_else(|| NftError::Parse("no generation in the kernel's answer".into()))
    }

    fn batch(&mut self, tx: &Transaction, commit: bool) -> Result<(), NftError> {
        if let Some(e) = tx.error() {
            return Err(e.clone());
        }
        if tx.is_empty() {
            return Ok(());
        }
        let family = tx.family();
        let key = (family, tx.table().to_owned());
        if !self.known.contains_key(&key) {
            // What is there already, for the encoding of rules and elements
            // that use it. A table we cannot read (a set of a type verdict
            // never writes) is no reason to refuse a transaction, which
            // may well replace it.
            if let Ok(sets) = self.read_sets(family, tx.table()) {
                self.known.insert(key.clone(), sets);
            }
        }
        // The sets as the transaction leaves them (a set is one type
        // throughout a transaction unless it is deleted and re-added, and
        // then its new type is the one its elements and rules use).
        let mut sets = self.known.get(&key).cloned().unwrap_or_default();
        apply_sets(&mut sets, tx.ops());
        let mut w = Writer::chunked();
        self.socket.seq = self.socket.seq.wrapping_add(1);
        let begin = self.socket.seq;
        w.begin(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            begin,
            0,
            objects::SUBSYS,
        );
        w.end();
        let mut b = Batch {
            w: &mut w,
            family,
            table: tx.table(),
            seq: begin,
            sets: &sets,
            origin: Vec::new(),
            next_set_id: 0,
        };
        let ops = tx.ops();
        let mut i = 0;
        while i < ops.len() {
            match &ops[i] {
                Op::AddElement(set, _) | Op::DeleteElement(set, _) => {
                    // A run of operations of one kind on one set (a cold
                    // sync's 60,000 endpoints), found in place.
                    let add = matches!(ops[i], Op::AddElement(..));
                    let start = i;
                    while let Some(op) = ops.get(i) {
                        let same = match op {
                            Op::AddElement(s, _) => add && s == set,
                            Op::DeleteElement(s, _) => !add && s == set,
                            _ => false,
                        };
                        if !same {
                            break;
                        }
                        i += 1;
                    }
                    b.elements(tx.set_name(*set), add, start, &ops[start..i])?;
                }
                op => {
                    b.op(i, op)?;
                    i += 1;
                }
            }
        }
        let origin = std::mem::take(&mut b.origin);
        let end = b.seq.wrapping_add(1);
        if commit {
            w.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, objects::SUBSYS);
            w.end();
        }
        self.socket.seq = end;
        self.socket.send_chunks(&w.chunks())?;
        drop(w);
        let reply = self.socket.receive(false, end, end, |_, _, _| Ok(()))?;
        if let Some((seq, errno)) = reply.errors.first() {
            // The kernel undid the whole batch; what it knew of the sets
            // may be stale.
            self.known.remove(&key);
            return Err(refusal(*errno, &describe(tx, &origin, *seq)));
        }
        if commit {
            self.known.insert(key, sets);
        }
        Ok(())
    }

    /// Every set of a table, by name (empty when the table is missing).
    fn read_sets(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<BTreeMap<String, Set>, NftError> {
        let mut sets = BTreeMap::new();
        let mut failed = None;
        let r = self.request(
            objects::GETSET,
            true,
            nfproto(family),
            |w| w.str(1, table),
            |m, a| {
                if m == objects::NEWSET && a.str(1) == Some(table) {
                    match objects::set(a) {
                        Ok(s) => {
                            sets.insert(s.name.clone(), s);
                        }
                        Err(e) => failed = Some(e),
                    }
                }
                Ok(())
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
        match r.errors.first() {
            Some((_, errno)) if Errno::from_raw(*errno) == Errno::ENOENT => Ok(BTreeMap::new()),
            Some((_, errno)) => Err(refusal(
                *errno,
                &format!("listing the sets of {family} {table}"),
            )),
            None => Ok(sets),
        }
    }

    /// One set's definition, read with the table's others (kept for the
    /// encoding of later transactions); a set that is not there is named.
    fn known_set(&mut self, family: Family, table: &str, set: &str) -> Result<Set, NftError> {
        let sets = self.read_sets(family, table)?;
        let s = sets
            .get(set)
            .ok_or_else(|| NftError::NotFound(format!("set {family} {table} {set}")))?
            .clone();
        self.known.insert((family, table.to_owned()), sets);
        Ok(s)
    }

    fn read_elements(
        &mut self,
        family: Family,
        table: &str,
        set: &Set,
    ) -> Result<(SetState, bool), NftError> {
        let (items, interrupted) = self.read_items(family, table, set)?;
        Ok((objects::set_state(set, items), interrupted))
    }

    /// Every element of one set with its counter, in the kernel's order,
    /// and whether the set changed while being read.
    fn read_items(
        &mut self,
        family: Family,
        table: &str,
        set: &Set,
    ) -> Result<(objects::Items, bool), NftError> {
        let mut items = objects::Items::new();
        let interrupted = self.read_each(family, table, set, &mut |e, c| items.push((e, c)))?;
        Ok((items, interrupted))
    }

    /// Hands every element of one set with its counter to `each`, one
    /// reply at a time, in the kernel's order; says whether the set
    /// changed while being read.
    fn read_each(
        &mut self,
        family: Family,
        table: &str,
        set: &Set,
        each: &mut dyn FnMut(Element, Option<crate::backend::Counter>),
    ) -> Result<bool, NftError> {
        let mut reply = objects::Items::new();
        let mut failed = None;
        let r = self.request(
            objects::GETSETELEM,
            true,
            nfproto(family),
            |w| {
                w.str(1, table);
                w.str(2, &set.name);
            },
            |m, a| {
                if m == objects::NEWSETELEM
                    && failed.is_none()
                    && let Some(list) = a.nested(3)
                {
                    match objects::element_items(set, list, &mut reply) {
                        Ok(()) => reply.drain(..).for_each(|(e, c)| each(e, c)),
                        Err(e) => failed = Some(e),
                    }
                }
                Ok(())
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some((_, errno)) = r.errors.first() {
            return Err(refusal(
                *errno,
                &format!("listing set {family} {table} {}", set.name),
            ));
        }
        Ok(r.interrupted)
    }

    /// One attempt at reading a table (its elements too, if `elements`);
    /// `Ok(None)` inside means missing, and the flag says whether it
    /// changed while being read.
    fn read_table(
        &mut self,
        family: Family,
        name: &str,
        elements: bool,
    ) -> Result<(Option<TableState>, bool), NftError> {
        let mut comment = None;
        let mut found = false;
        let r = self.request(
            objects::GETTABLE,
            false,
            nfproto(family),
            |w| w.str(1, name),
            |m, a| {
                if m == objects::NEWTABLE && a.str(1) == Some(name) {
                    found = true;
                    comment = objects::table_comment(a);
                }
                Ok(())
            },
        )?;
        match r.errors.first() {
            Some((_, errno)) if Errno::from_raw(*errno) == Errno::ENOENT => {
                return Ok((None, false));
            }
            Some((_, errno)) => {
                return Err(refusal(*errno, &format!("reading table {family} {name}")));
            }
            None if !found => return Ok((None, false)),
            None => {}
        }
        let mut chains = Vec::new();
        let mut failed = None;
        let r = self.request(
            objects::GETCHAIN,
            true,
            nfproto(family),
            |w| w.str(1, name),
            |m, a| {
                if m == objects::NEWCHAIN && a.str(1) == Some(name) {
                    match objects::chain(a) {
                        Ok(c) => chains.push(c),
                        Err(e) => failed = Some(e),
                    }
                }
                Ok(())
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
        let mut interrupted = r.interrupted;
        let sets = self.read_sets(family, name)?;
        let mut states = Vec::new();
        for s in sets.values() {
            if !elements {
                states.push(SetState {
                    set: s.clone(),
                    elements: BTreeMap::new(),
                    counters: BTreeMap::new(),
                });
                continue;
            }
            let (state, intr) = self.read_elements(family, name, s)?;
            interrupted |= intr;
            states.push(state);
        }
        let mut rules = Vec::new();
        let lookup = |n: &str| sets.get(n);
        let r = self.request(
            objects::GETRULE,
            true,
            nfproto(family),
            |w| w.str(1, name),
            |m, a| {
                if m == objects::NEWRULE && a.str(1) == Some(name) && failed.is_none() {
                    match objects::rule(family, a, &lookup) {
                        Ok(r) => rules.push(r),
                        Err(e) => failed = Some(e),
                    }
                }
                Ok(())
            },
        )?;
        if let Some(e) = failed {
            return Err(e.context(&format!("table {family} {name}")));
        }
        interrupted |= r.interrupted;
        self.known.insert((family, name.to_owned()), sets);
        let table = objects::table(comment, chains, states, rules)?;
        Ok((Some(table), interrupted))
    }
}

/// Follows a transaction's effect on a table's set definitions: an added
/// set that exists already keeps its definition, as in the kernel.
fn apply_sets(sets: &mut BTreeMap<String, Set>, ops: &[Op]) {
    for op in ops {
        match op {
            Op::DeleteTable => sets.clear(),
            Op::AddSet(s) => {
                sets.entry(s.name.clone()).or_insert_with(|| (**s).clone());
            }
            Op::DeleteSet(s) => {
                sets.remove(s.as_str());
            }
            _ => {}
        }
    }
}

/// Names the operation behind the failed message `seq`.
fn describe(tx: &Transaction, origin: &[(u32, usize, usize)], seq: u32) -> String {
    let ops: Vec<usize> = origin
        .iter()
        .filter(|(s, _, _)| *s == seq)
        .flat_map(|(_, first, n)| *first..first + n)
        .collect();
    match ops.as_slice() {
        [] => format!(
            "committing the transaction on {} {}",
            tx.family(),
            tx.table()
        ),
        [one] => tx.filtered(|j, _| j == *one).to_string().trim().to_owned(),
        [first, ..] => {
            let text = tx.filtered(|j, _| j == *first).to_string();
            format!(
                "{} (one of {} elements in one message)",
                text.trim(),
                ops.len()
            )
        }
    }
}

impl Backend for NetlinkBackend {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.batch(tx, true)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.read_generation().map(Some)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.batch(tx, false)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.consistent_read(family, name, true)
    }

    fn skeleton(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.consistent_read(family, name, false)
    }

    fn lookup(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<Found>>, NftError> {
        let key = (family, table.to_owned());
        let def = match self.known.get(&key).and_then(|sets| sets.get(set)) {
            Some(def) => def.clone(),
            None => {
                let sets = self.read_sets(family, table)?;
                let def = sets.get(set).cloned();
                self.known.insert(key, sets);
                def.ok_or_else(|| NftError::NotFound(format!("set {family} {table} {set}")))?
            }
        };
        let mut found: Vec<Option<Found>> = vec![None; keys.len()];
        let mut failed = None;
        let refused = self.socket.requests(
            kind(objects::GETSETELEM),
            nfproto(family),
            keys.len(),
            |i, w| objects::lookup_request(w, table, &def, &keys[i]),
            |i, k, a| {
                if k & 0xff != u16::from(objects::NEWSETELEM) || failed.is_some() {
                    return Ok(());
                }
                let mut items = objects::Items::new();
                if let Some(list) = a.nested(3)
                    && let Err(e) = objects::element_items(&def, list, &mut items)
                {
                    failed = Some(e);
                }
                if let (Some(slot), Some((element, counter))) = (found.get_mut(i), items.pop()) {
                    *slot = Some(Found { element, counter });
                }
                Ok(())
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
        match refused
            .iter()
            .find(|(_, errno)| Errno::from_raw(*errno) != Errno::ENOENT)
        {
            Some((_, errno)) => Err(refusal(
                *errno,
                &format!("looking up elements of set {family} {table} {set}"),
            )),
            None => Ok(found),
        }
    }

    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<Element>, NftError> {
        let s = self.known_set(family, table, set)?;
        // Sorted and without duplicates, as a set's state has them, but
        // without building its maps (a copy of every key): a reader of
        // the whole table holds one set at a time, and no more of it.
        let mut items = self.read_items(family, table, &s)?.0;
        objects::sort_items(&mut items);
        Ok(items.into_iter().map(|(e, _)| e).collect())
    }

    fn each_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        each: &mut dyn FnMut(Element),
    ) -> Result<(), NftError> {
        let s = self.known_set(family, table, set)?;
        self.read_each(family, table, &s, &mut |e, _| each(e))?;
        Ok(())
    }

    fn set(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Option<SetState>, NftError> {
        let sets = match self.read_sets(family, table) {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(s) = sets.get(set).cloned() else {
            return Ok(None);
        };
        self.known.insert((family, table.to_owned()), sets);
        let (state, _) = self.read_elements(family, table, &s)?;
        Ok(Some(state))
    }
}

#[cfg(test)]
mod tests;
