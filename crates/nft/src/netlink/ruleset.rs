//! The ruleset beyond verdict's own tables, over netlink: every table and
//! chain whoever made it (what `nft list tables` and `nft list chains`
//! show, for `verdict doctor`), and the removal of another program's
//! chains from a table, with the rules elsewhere in it that jump to them
//! (kube-proxy's iptables-nft chains, which iptables-nft keeps as plain
//! nf_tables chains). Rules are read only as far as their jumps: whatever
//! else they hold (iptables' `match` and `target` expressions) is not
//! decoded.

use std::collections::BTreeSet;

use nix::errno::Errno;

use super::expr::{NFTA_DATA_VERDICT, read_verdict};
use super::objects::{self, DELCHAIN, DELRULE, GETCHAIN, GETRULE, GETTABLE, NEWCHAIN, NEWRULE};
use super::socket::{NFNL_MSG_BATCH_BEGIN, NLM_F_DUMP, NLM_F_REQUEST};
use super::wire::{Attrs, Writer};
use super::{NFNL_MSG_BATCH_END, NetlinkBackend, refusal};
use crate::error::NftError;
use crate::ir::Verdict;

/// One chain of the ruleset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainInfo {
    /// The table's family as nft names it (`ip`, `ip6`, `inet`, ...).
    pub family: &'static str,
    /// The table.
    pub table: String,
    /// The chain.
    pub name: String,
    /// For a base chain: its type (`filter`, `nat`, `route`), hook and
    /// priority.
    pub base: Option<(String, &'static str, i32)>,
}

/// A table's family, as nft names it, from its `nfproto` number.
pub fn family_name(nfproto: u8) -> &'static str {
    match nfproto {
        0 => "unspec",
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => "other",
    }
}

/// The `nfproto` number of a family nft names (`None`: not one of
/// nftables').
pub fn nfproto_of(family: &str) -> Option<u8> {
    Some(match family {
        "inet" => 1,
        "ip" => 2,
        "arp" => 3,
        "netdev" => 5,
        "bridge" => 7,
        "ip6" => 10,
        _ => return None,
    })
}

fn hook_name(nfproto: u8, hook: u32) -> &'static str {
    match (nfproto, hook) {
        (5, 0) => "ingress",
        (5, 1) => "egress",
        (_, 0) => "prerouting",
        (_, 1) => "input",
        (_, 2) => "forward",
        (_, 3) => "output",
        (_, 4) => "postrouting",
        (_, 5) => "ingress",
        _ => "unknown",
    }
}

/// The chains a rule jumps or goes to.
fn jumps(rule: Attrs<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(list) = rule.nested(4) else {
        return out;
    };
    for (_, e) in list.iter() {
        let e = Attrs(e);
        if e.str(1) != Some("immediate") {
            continue;
        }
        let Some(data) = e.nested(2).and_then(|d| d.nested(2)) else {
            continue;
        };
        if let Some(v) = data.nested(NFTA_DATA_VERDICT)
            && let Ok(Verdict::Jump(c) | Verdict::Goto(c)) = read_verdict(v)
        {
            out.push(c);
        }
    }
    out
}

impl NetlinkBackend {
    /// Every table, of every family: (family, name).
    pub fn tables(&mut self) -> Result<Vec<(&'static str, String)>, NftError> {
        let mut out = Vec::new();
        // Family 0 dumps every family; each message's header says which.
        let r = self.socket.request_raw(
            objects::kind(GETTABLE),
            NLM_F_DUMP,
            |w| w.raw(&[0, 0, 0, 0]),
            |m| {
                if m.kind == objects::kind(objects::NEWTABLE)
                    && let Some((fam, a)) = m.nfgen()
                    && let Some(name) = a.str(1)
                {
                    out.push((fam, name.to_owned()));
                }
                Ok(())
            },
        )?;
        if let Some((_, errno)) = r.errors.first() {
            return Err(refusal(*errno, "listing the ruleset's tables"));
        }
        Ok(out.into_iter().map(|(f, n)| (family_name(f), n)).collect())
    }

    /// Every chain, of every table and family.
    pub fn chains(&mut self) -> Result<Vec<ChainInfo>, NftError> {
        let mut out = Vec::new();
        let r = self.socket.request_raw(
            objects::kind(GETCHAIN),
            NLM_F_DUMP,
            |w| w.raw(&[0, 0, 0, 0]),
            |m| {
                if m.kind != objects::kind(NEWCHAIN) {
                    return Ok(());
                }
                let Some((fam, a)) = m.nfgen() else {
                    return Ok(());
                };
                let (Some(table), Some(name)) = (a.str(1), a.str(3)) else {
                    return Ok(());
                };
                let base = a.nested(4).map(|h| {
                    (
                        a.str(7).unwrap_or("filter").to_owned(),
                        hook_name(fam, h.u32_be(1).unwrap_or(u32::MAX)),
                        h.i32_be(2).unwrap_or(0),
                    )
                });
                out.push(ChainInfo {
                    family: family_name(fam),
                    table: table.to_owned(),
                    name: name.to_owned(),
                    base,
                });
                Ok(())
            },
        )?;
        if let Some((_, errno)) = r.errors.first() {
            return Err(refusal(*errno, "listing the ruleset's chains"));
        }
        Ok(out)
    }

    /// Removes the chains of table `family` `table` that `owned` names,
    /// in one transaction: first every rule of another chain that jumps or
    /// goes to one of them, then their rules, then the chains. Returns the
    /// chains removed (none when the table has none of them, or is not
    /// there).
    pub fn remove_chains(
        &mut self,
        family: &str,
        table: &str,
        owned: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, NftError> {
        let nfproto = nfproto_of(family)
            .ok_or_else(|| NftError::Refused(format!("no nftables family {family:?}")))?;
        let mut chains = BTreeSet::new();
        let r = self.socket.request(
            objects::kind(GETCHAIN),
            true,
            nfproto,
            |w| w.str(1, table),
            |k, a| {
                if k == objects::kind(NEWCHAIN)
                    && a.str(1) == Some(table)
                    && let Some(name) = a.str(3).filter(|n| owned(n))
                {
                    chains.insert(name.to_owned());
                }
                Ok(())
            },
        )?;
        match r.errors.first() {
            Some((_, errno)) if Errno::from_raw(*errno) == Errno::ENOENT => {
                return Ok(Vec::new());
            }
            Some((_, errno)) => {
                return Err(refusal(*errno, &format!("listing {family} {table}")));
            }
            None => {}
        }
        if chains.is_empty() {
            return Ok(Vec::new());
        }
        // The rules of the other chains that lead into the ones removed.
        let mut into: Vec<(String, u64)> = Vec::new();
        let r = self.socket.request(
            objects::kind(GETRULE),
            true,
            nfproto,
            |w| w.str(1, table),
            |k, a| {
                if k != objects::kind(NEWRULE) || a.str(1) != Some(table) {
                    return Ok(());
                }
                let (Some(chain), Some(handle)) = (a.str(2), a.u64_be(3)) else {
                    return Ok(());
                };
                if !chains.contains(chain) && jumps(a).iter().any(|j| chains.contains(j)) {
                    into.push((chain.to_owned(), handle));
                }
                Ok(())
            },
        )?;
        if let Some((_, errno)) = r.errors.first() {
            return Err(refusal(
                *errno,
                &format!("listing the rules of {family} {table}"),
            ));
        }
        let mut w = Writer::new();
        let mut seq = self.socket.seq.wrapping_add(1);
        w.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, objects::SUBSYS);
        let mut message = |w: &mut Writer, msg: u8, body: &dyn Fn(&mut Writer)| {
            seq = seq.wrapping_add(1);
            w.begin(objects::kind(msg), NLM_F_REQUEST, seq, nfproto, 0);
            body(w);
        };
        for (chain, handle) in &into {
            message(&mut w, DELRULE, &|w| {
                w.str(1, table);
                w.str(2, chain);
                w.u64_be(3, *handle);
            });
        }
        // A DELRULE naming no rule flushes the chain; a chain is deleted
        // once nothing jumps to it, which the flushes see to first.
        for chain in &chains {
            message(&mut w, DELRULE, &|w| {
                w.str(1, table);
                w.str(2, chain);
            });
        }
        for chain in &chains {
            message(&mut w, DELCHAIN, &|w| {
                w.str(1, table);
                w.str(3, chain);
            });
        }
        let end = seq.wrapping_add(1);
        w.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, objects::SUBSYS);
        w.end();
        self.socket.seq = end;
        self.socket.send(w.bytes())?;
        let reply = self.socket.receive(false, end, end, |_, _, _| Ok(()))?;
        if let Some((_, errno)) = reply.errors.first() {
            return Err(refusal(
                *errno,
                &format!("removing {} chains from {family} {table}", chains.len()),
            ));
        }
        Ok(chains.into_iter().collect())
    }
}
