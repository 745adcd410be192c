//! The [`Backend`] trait, the one door to nftables, and what a backend
//! reads back: a table's chains with their rules and its sets with their
//! elements and counters. [`MemoryBackend`](crate::memory::MemoryBackend),
//! [`NetlinkBackend`](crate::netlink::NetlinkBackend) and
//! [`NftCli`](crate::cli::NftCli) implement it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::error::NftError;
use crate::ir::{Chain, Element, Family, Rule, Set, Value, quote};
use crate::tx::Transaction;

/// The only door to nftables. [`MemoryBackend`](crate::memory::MemoryBackend)
/// applies a transaction in memory, the kernel backends send it to the
/// kernel.
pub trait Backend {
    /// Applies every operation of `tx`, or none of them.
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError>;

    /// Validates `tx` as [`Backend::run`] would, without applying it (a dry
    /// run: the kernel checks the batch, then aborts it).
    fn check(&mut self, tx: &Transaction) -> Result<(), NftError>;

    /// The current contents of one table, or `None` if it does not exist.
    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError>;

    /// The elements of one set or map (cheaper than the whole table).
    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<Element>, NftError> {
        set_elements(self.table(family, table)?.as_ref(), family, table, set)
    }

    /// The ruleset's generation, which every commit changes, whoever makes
    /// it; `None` when this backend cannot tell (the `nft` program does not
    /// say). Equal generations mean nothing was committed in between.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(None)
    }

    /// One table without its elements: its chains with their rules and
    /// its sets' definitions, every set empty. What a reader needs before
    /// it [looks up](Backend::lookup) the few elements it wants; unlike
    /// [`Backend::table`], its cost does not grow with the elements.
    fn skeleton(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        Ok(self.table(family, name)?.map(|mut t| {
            for s in t.sets.values_mut() {
                s.elements.clear();
                s.counters.clear();
            }
            t
        }))
    }

    /// Looks each key up in one set as the data path does (in an interval
    /// set, the element whose ranges hold the key), with the element's
    /// counter where it has one; `None` for a key no element matches.
    fn lookup(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<Found>>, NftError> {
        let t = self.table(family, table)?;
        let t = t.ok_or_else(|| NftError::NotFound(format!("table {family} {table}")))?;
        let s = t
            .sets
            .get(set)
            .ok_or_else(|| NftError::NotFound(format!("set {family} {table} {set}")))?;
        Ok(keys
            .iter()
            .map(|k| {
                find(s, k).map(|e| Found {
                    counter: s.counters.get(&e.key).copied(),
                    element: e.clone(),
                })
            })
            .collect())
    }
}

/// An element a [lookup](Backend::lookup) found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The element (its key as the set holds it: a range, in an interval
    /// set).
    pub element: Element,
    /// Its counter, if the set counts.
    pub counter: Option<Counter>,
}

/// The element of `set` a packet's `key` matches: the element with that
/// key, or in an interval set the one whose ranges hold it.
pub fn find<'s>(set: &'s SetState, key: &[Value]) -> Option<&'s Element> {
    if let Some(e) = set.elements.get(key) {
        return Some(e);
    }
    if !set.set.interval {
        return None;
    }
    set.elements
        .values()
        .find(|e| e.key.len() == key.len() && e.key.iter().zip(key).all(|(el, pk)| el.matches(pk)))
}

/// A backend chosen at run time is a backend.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        (**self).run(tx)
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        (**self).check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        (**self).table(family, name)
    }

    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<Element>, NftError> {
        (**self).elements(family, table, set)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        (**self).generation()
    }

    fn skeleton(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        (**self).skeleton(family, name)
    }

    fn lookup(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<Found>>, NftError> {
        (**self).lookup(family, table, set, keys)
    }
}

/// The elements of `set` in `t`, or why there are none.
pub(crate) fn set_elements(
    t: Option<&TableState>,
    family: Family,
    table: &str,
    set: &str,
) -> Result<Vec<Element>, NftError> {
    let t = t.ok_or_else(|| NftError::NotFound(format!("table {family} {table}")))?;
    let s = t
        .sets
        .get(set)
        .ok_or_else(|| NftError::NotFound(format!("set {set}")))?;
    Ok(s.elements.values().cloned().collect())
}

/// A chain and its rules. Two are equal when their definitions and rules
/// are: counters move with every packet.
#[derive(Clone, Debug, Eq)]
pub struct ChainState {
    /// Definition.
    pub chain: Chain,
    /// Rules in order.
    pub rules: Vec<Rule>,
    /// What the `counter` of each counting rule says, by the rule's index,
    /// as read back from the kernel (empty in memory).
    pub counters: BTreeMap<usize, Counter>,
    /// The kernel's handle of each rule, in order, as read back over
    /// netlink (empty otherwise): what a packet trace names a rule by.
    pub handles: Vec<u64>,
}

impl PartialEq for ChainState {
    fn eq(&self, other: &ChainState) -> bool {
        self.chain == other.chain && self.rules == other.rules
    }
}

/// A set or map and its elements. Two are equal when their definitions
/// and elements are: counters move with every packet.
#[derive(Clone, Debug, Eq)]
pub struct SetState {
    /// Definition.
    pub set: Set,
    /// Elements by key.
    pub elements: BTreeMap<Vec<Value>, Element>,
    /// What each element's counter says, as read back from the kernel
    /// (empty in memory, where no packet passes, and for sets without
    /// counters).
    pub counters: BTreeMap<Vec<Value>, Counter>,
}

impl PartialEq for SetState {
    fn eq(&self, other: &SetState) -> bool {
        self.set == other.set && self.elements == other.elements
    }
}

/// An element's counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets that matched the element.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The contents of one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    /// Table comment.
    pub comment: Option<String>,
    /// Chains by name.
    pub chains: BTreeMap<String, ChainState>,
    /// Sets and maps by name.
    pub sets: BTreeMap<String, SetState>,
}

impl TableState {
    /// Renders the table as an `nft -f` script in canonical order: chains,
    /// sets and maps sorted by name, then rules chain by chain (rule order
    /// kept), then elements sorted by key.
    pub fn dump(&self, family: Family, name: &str) -> String {
        let t = format!("{family} {name}");
        let mut out = String::new();
        match &self.comment {
            Some(c) => {
                let _ = writeln!(out, "add table {t} {{ comment {} ; }}", quote(c));
            }
            None => {
                let _ = writeln!(out, "add table {t}");
            }
        }
        let mut tx = Transaction::new(family, name);
        for c in self.chains.values() {
            tx.add_chain(c.chain.clone());
        }
        for s in self.sets.values() {
            tx.add_set(s.set.clone());
        }
        for c in self.chains.values() {
            for r in &c.rules {
                tx.add_rule(&c.chain.name, r.clone());
            }
        }
        for s in self.sets.values() {
            for e in s.elements.values() {
                tx.add_element(&s.set.name, e.clone());
            }
        }
        out.push_str(&tx.to_string());
        out
    }
}

/// A backend that counts the transactions it commits: each moves the
/// ruleset's generation on by one, so the count tells verdict's own
/// commits from others' between two readings of the generation.
#[derive(Debug)]
pub struct Counting<B> {
    inner: B,
    commits: u32,
}

impl<B: Backend> Counting<B> {
    /// Counts what `inner` commits.
    pub fn new(inner: B) -> Counting<B> {
        Counting { inner, commits: 0 }
    }

    /// Non-empty transactions committed so far (wrapping, as the
    /// generation does).
    pub fn commits(&self) -> u32 {
        self.commits
    }

    /// The backend counted.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }
}

impl<B: Backend> Backend for Counting<B> {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        let r = self.inner.run(tx);
        if r.is_ok() && !tx.is_empty() {
            self.commits = self.commits.wrapping_add(1);
        }
        r
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.inner.check(tx)
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.inner.table(family, name)
    }

    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<Element>, NftError> {
        self.inner.elements(family, table, set)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.inner.generation()
    }

    fn skeleton(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.inner.skeleton(family, name)
    }

    fn lookup(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        keys: &[Vec<Value>],
    ) -> Result<Vec<Option<Found>>, NftError> {
        self.inner.lookup(family, table, set, keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records which of its own methods was called; every default of the
    /// trait is overridden, so a method a wrapper fails to forward shows
    /// up as a default reaching `table` instead.
    #[derive(Default)]
    struct Recorder(Vec<&'static str>);

    impl Backend for Recorder {
        fn run(&mut self, _: &Transaction) -> Result<(), NftError> {
            self.0.push("run");
            Ok(())
        }
        fn check(&mut self, _: &Transaction) -> Result<(), NftError> {
            self.0.push("check");
            Ok(())
        }
        fn table(&mut self, _: Family, _: &str) -> Result<Option<TableState>, NftError> {
            self.0.push("table");
            Ok(None)
        }
        fn elements(&mut self, _: Family, _: &str, _: &str) -> Result<Vec<Element>, NftError> {
            self.0.push("elements");
            Ok(Vec::new())
        }
        fn generation(&mut self) -> Result<Option<u32>, NftError> {
            self.0.push("generation");
            Ok(Some(1))
        }
        fn skeleton(&mut self, _: Family, _: &str) -> Result<Option<TableState>, NftError> {
            self.0.push("skeleton");
            Ok(None)
        }
        fn lookup(
            &mut self,
            _: Family,
            _: &str,
            _: &str,
            keys: &[Vec<Value>],
        ) -> Result<Vec<Option<Found>>, NftError> {
            self.0.push("lookup");
            Ok(vec![None; keys.len()])
        }
    }

    #[test]
    fn counting_forwards_every_method_and_counts_only_commits() {
        let mut c = Counting::new(Recorder::default());
        let mut tx = Transaction::new(Family::Ip, "t");
        c.run(&tx).unwrap();
        assert_eq!(c.commits(), 0, "an empty transaction commits nothing");
        tx.add_table(None);
        c.run(&tx).unwrap();
        c.check(&tx).unwrap();
        c.table(Family::Ip, "t").unwrap();
        c.elements(Family::Ip, "t", "s").unwrap();
        c.generation().unwrap();
        c.skeleton(Family::Ip, "t").unwrap();
        c.lookup(Family::Ip, "t", "s", &[vec![]]).unwrap();
        assert_eq!(c.commits(), 1);
        assert_eq!(
            c.inner_mut().0,
            [
                "run",
                "run",
                "check",
                "table",
                "elements",
                "generation",
                "skeleton",
                "lookup"
            ]
        );
    }
}
