//! The [`Backend`] trait, the one door to nftables, and what a backend
//! reads back: a table's chains with their rules and its sets with their
//! elements and counters. [`MemoryBackend`](crate::memory::MemoryBackend),
//! [`NetlinkBackend`](crate::netlink::NetlinkBackend) and
//! [`NftCli`](crate::cli::NftCli) implement it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

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

    /// Calls `each` with every element of one set or map as it is read, in
    /// no particular order: a reader that compares them holds no more of
    /// the set than one reply. An element may come twice if the set
    /// changes while it is read.
    fn each_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        each: &mut dyn FnMut(Element),
    ) -> Result<(), NftError> {
        for e in self.elements(family, table, set)? {
            each(e);
        }
        Ok(())
    }

    /// One set or map with its elements and their counters (`None`: the
    /// table or the set does not exist); cheaper than the whole table.
    fn set(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Option<SetState>, NftError> {
        Ok(self
            .table(family, table)?
            .and_then(|mut t| t.sets.remove(set)))
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

    fn each_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        each: &mut dyn FnMut(Element),
    ) -> Result<(), NftError> {
        (**self).each_element(family, table, set, each)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        (**self).generation()
    }

    fn set(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Option<SetState>, NftError> {
        (**self).set(family, table, set)
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
    pub elements: BTreeMap<Arc<[Value]>, Element>,
    /// What each element's counter says, as read back from the kernel
    /// (empty in memory, where no packet passes, and for sets without
    /// counters).
    pub counters: BTreeMap<Arc<[Value]>, Counter>,
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

/// A listener's membership of the kernel's ruleset announcements
/// ([`crate::monitor::Membership`]), which [`Counting`] leaves while it
/// commits a large transaction.
pub trait Listener: Send {
    /// Stops the announcements to the listener.
    fn leave(&self) -> std::io::Result<()>;
    /// Starts them again.
    fn join(&self) -> std::io::Result<()>;
}

/// Work done around each large commit ([`Counting::around_large`]),
/// before it is sent and once the kernel has answered.
pub trait Around: Send {
    /// Before the commit.
    fn before(&mut self);
    /// After it, whatever its outcome.
    fn after(&mut self);
}

/// A backend that counts the transactions it commits: each moves the
/// ruleset's generation on by one, so the count tells verdict's own
/// commits from others' between two readings of the generation.
///
/// Given the listener ([`Counting::quiet`]), it commits every transaction
/// of at least `at` operations with the listener out of the group: the
/// kernel announces every element of a commit to whoever listens, and at
/// 30,000 Services building those announcements is half the kernel's time
/// in a full repair, spent with the CPU held. Another process's commit
/// made meanwhile goes unheard, but not unnoticed: the generation moved
/// by more than verdict's one, and [`Counting::take_unheard`] says so.
pub struct Counting<B> {
    inner: B,
    commits: u32,
    quiet: Option<Quiet>,
    around: Option<(Box<dyn Around>, usize)>,
    unheard: bool,
    deaf: Option<std::io::Error>,
}

struct Quiet {
    listener: Box<dyn Listener>,
    at: usize,
}

impl<B: std::fmt::Debug> std::fmt::Debug for Counting<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counting")
            .field("inner", &self.inner)
            .field("commits", &self.commits)
            .field("quiet_at", &self.quiet.as_ref().map(|q| q.at))
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Counting<B> {
    /// Counts what `inner` commits.
    pub fn new(inner: B) -> Counting<B> {
        Counting {
            inner,
            commits: 0,
            quiet: None,
            around: None,
            unheard: false,
            deaf: None,
        }
    }

    /// Runs `hook` around every commit of at least `at` operations.
    pub fn around_large(&mut self, hook: Box<dyn Around>, at: usize) {
        self.around = Some((hook, at));
    }

    /// Commits transactions of at least `at` operations with `listener`
    /// out of the group, from now on.
    pub fn quiet(&mut self, listener: Box<dyn Listener>, at: usize) {
        self.quiet = Some(Quiet { listener, at });
    }

    /// Whether another process may have committed, unheard, while the
    /// listener was out of the group since the last call (or the
    /// generation could not be read to tell).
    pub fn take_unheard(&mut self) -> bool {
        std::mem::take(&mut self.unheard)
    }

    /// The listener could not join the group again: it hears nothing
    /// from now on, and is no longer left or joined.
    pub fn take_deaf(&mut self) -> Option<std::io::Error> {
        self.deaf.take()
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

    /// Runs `tx` with the listener out of the group, if it is large
    /// enough and the generation can tell what went unheard; `None` when
    /// it is to run as usual.
    fn run_quietly(&mut self, tx: &Transaction) -> Option<Result<(), NftError>> {
        let quiet = self.quiet.as_ref().filter(|q| tx.len() >= q.at)?;
        let before = self.inner.generation().ok().flatten()?;
        quiet.listener.leave().ok()?;
        let r = self.inner.run(tx);
        if let Err(e) = quiet.listener.join() {
            self.deaf = Some(e);
            self.quiet = None;
        }
        let ours = u32::from(r.is_ok() && !tx.is_empty());
        let after = self.inner.generation().ok().flatten();
        if after != Some(before.wrapping_add(ours)) {
            self.unheard = true;
        }
        Some(r)
    }
}

impl<B: Backend> Backend for Counting<B> {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        let mut hook = self
            .around
            .take_if(|(_, at)| tx.len() >= *at)
            .map(|(mut hook, at)| {
                hook.before();
                (hook, at)
            });
        let r = match self.run_quietly(tx) {
            Some(r) => r,
            None => self.inner.run(tx),
        };
        if let Some((mut h, at)) = hook.take() {
            h.after();
            self.around = Some((h, at));
        }
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

    fn each_element(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        each: &mut dyn FnMut(Element),
    ) -> Result<(), NftError> {
        self.inner.each_element(family, table, set, each)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.inner.generation()
    }

    fn set(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Option<SetState>, NftError> {
        self.inner.set(family, table, set)
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
        fn set(&mut self, _: Family, _: &str, _: &str) -> Result<Option<SetState>, NftError> {
            self.0.push("set");
            Ok(None)
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

    /// A listener that records its calls, and plays another process
    /// committing (moving the recorder's generation on) when it leaves.
    #[derive(Clone, Default)]
    struct Calls(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>, bool);

    impl Listener for Calls {
        fn leave(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().push(if self.1 {
                "leave, and another commits"
            } else {
                "leave"
            });
            Ok(())
        }
        fn join(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().push("join");
            Ok(())
        }
    }

    /// A backend whose generation moves on with each commit, and with
    /// each "other commit" its listener plays.
    struct Generations {
        generation: u32,
        others: std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
        fail: bool,
    }

    impl Backend for Generations {
        fn run(&mut self, _: &Transaction) -> Result<(), NftError> {
            if self.fail {
                return Err(NftError::Refused("no".into()));
            }
            self.generation += 1;
            Ok(())
        }
        fn check(&mut self, _: &Transaction) -> Result<(), NftError> {
            Ok(())
        }
        fn table(&mut self, _: Family, _: &str) -> Result<Option<TableState>, NftError> {
            Ok(None)
        }
        fn generation(&mut self) -> Result<Option<u32>, NftError> {
            let others = self
                .others
                .lock()
                .unwrap()
                .iter()
                .filter(|c| c.contains("another"))
                .count() as u32;
            Ok(Some(self.generation + others))
        }
    }

    fn transaction(elements: usize) -> Transaction {
        let mut tx = Transaction::new(Family::Ip, "t");
        for i in 0..elements {
            tx.add_element("s", Element::key(vec![Value::Port(i as u16)]));
        }
        tx
    }

    #[test]
    fn large_commits_are_made_unheard_and_what_went_unheard_is_told() {
        let calls = Calls::default();
        let mut c = Counting::new(Generations {
            generation: 0,
            others: calls.0.clone(),
            fail: false,
        });
        c.quiet(Box::new(calls.clone()), 3);
        // Small: the listener stays.
        c.run(&transaction(2)).unwrap();
        assert!(calls.0.lock().unwrap().is_empty());
        // Large: out of the group and back; only verdict committed.
        c.run(&transaction(3)).unwrap();
        assert_eq!(*calls.0.lock().unwrap(), ["leave", "join"]);
        assert!(!c.take_unheard());
        assert_eq!(c.commits(), 2);
        // Large, and another process commits meanwhile: told once.
        let mut other = calls.clone();
        other.1 = true;
        c.quiet(Box::new(other), 3);
        c.run(&transaction(5)).unwrap();
        assert!(c.take_unheard());
        assert!(!c.take_unheard(), "told once");
        assert!(c.take_deaf().is_none());
    }

    #[test]
    fn the_hook_runs_around_large_commits_only() {
        struct Hook(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);
        impl Around for Hook {
            fn before(&mut self) {
                self.0.lock().unwrap().push("before");
            }
            fn after(&mut self) {
                self.0.lock().unwrap().push("after");
            }
        }
        let calls = Calls::default();
        let mut c = Counting::new(Generations {
            generation: 0,
            others: calls.0.clone(),
            fail: false,
        });
        c.around_large(Box::new(Hook(calls.0.clone())), 2);
        c.quiet(Box::new(calls.clone()), 2);
        c.run(&transaction(1)).unwrap();
        assert!(calls.0.lock().unwrap().is_empty());
        c.run(&transaction(2)).unwrap();
        c.run(&transaction(3)).unwrap();
        assert_eq!(
            *calls.0.lock().unwrap(),
            [
                "before", "leave", "join", "after", "before", "leave", "join", "after"
            ]
        );
    }

    #[test]
    fn a_failed_large_commit_counts_nothing_of_verdicts() {
        let calls = Calls::default();
        let mut c = Counting::new(Generations {
            generation: 7,
            others: calls.0.clone(),
            fail: true,
        });
        c.quiet(Box::new(calls.clone()), 1);
        assert!(c.run(&transaction(1)).is_err());
        assert_eq!(*calls.0.lock().unwrap(), ["leave", "join"]);
        assert_eq!(c.commits(), 0);
        assert!(!c.take_unheard(), "the generation did not move");
    }

    #[test]
    fn a_listener_that_cannot_join_again_is_reported_deaf_and_left_alone() {
        struct Stuck;
        impl Listener for Stuck {
            fn leave(&self) -> std::io::Result<()> {
                Ok(())
            }
            fn join(&self) -> std::io::Result<()> {
                Err(std::io::Error::other("gone"))
            }
        }
        let calls = Calls::default();
        let mut c = Counting::new(Generations {
            generation: 0,
            others: calls.0.clone(),
            fail: false,
        });
        c.quiet(Box::new(Stuck), 1);
        c.run(&transaction(1)).unwrap();
        assert_eq!(
            c.take_deaf().map(|e| e.to_string()).as_deref(),
            Some("gone")
        );
        // No longer left: a second large commit runs as usual.
        c.run(&transaction(1)).unwrap();
        assert!(c.take_deaf().is_none());
        assert_eq!(c.commits(), 2);
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
        c.set(Family::Ip, "t", "s").unwrap();
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
                "set",
                "skeleton",
                "lookup"
            ]
        );
    }
}
