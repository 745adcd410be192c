//! Transactions: an ordered list of operations on one table, applied all or
//! nothing. Building one never fails; the first invalid operation is kept and
//! returned when the transaction is run (as knftables does), so callers can
//! write straight-line code.

use std::borrow::Cow;
use std::fmt::{self, Display, Formatter};
use std::sync::Arc;

use crate::error::NftError;
use crate::ir::{
    COMMENT_LENGTH_MAX, Chain, Element, Family, NAME_LENGTH_MAX, Rule, Set, Value, quote,
};

/// A set's name in a transaction: borrowed when it is one of the
/// program's own names, so that a sync of 200,000 elements does not copy
/// the name 200,000 times.
pub type SetName = Cow<'static, str>;

/// The set an element operation names: an index into its transaction's
/// set names ([`Transaction::set_name`]), so that the operation takes 16
/// bytes, not the 40 a name and a key took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SetId(u32);

impl SetId {
    /// Its place in [`Transaction::sets`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A chain's or set's name in the rare operations: boxed whole, one word,
/// so that those operations are no larger than an element's.
#[allow(clippy::box_collection)]
pub type Name = Box<String>;

/// A rule and the chain it is appended to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainRule {
    /// The chain.
    pub chain: String,
    /// The rule.
    pub rule: Rule,
}

/// One operation of a transaction, 16 bytes: a cold sync holds 180,000 of
/// them at 30,000 Services, nearly all elements, each as large as the
/// largest variant, so everything but an element is boxed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `add table` (with the table comment).
    AddTable(Option<Name>),
    /// `delete table`: everything in it goes.
    DeleteTable,
    /// `add chain`: create if missing.
    AddChain(Box<Chain>),
    /// `flush chain`: remove every rule.
    FlushChain(Name),
    /// `delete chain`: the chain must be empty and unreferenced.
    DeleteChain(Name),
    /// `add set` / `add map`: create if missing.
    AddSet(Box<Set>),
    /// `flush set`: remove every element. Through nft this names a set
    /// only (a map needs `flush map`, which verdict never sends); over
    /// netlink it flushes either.
    FlushSet(Name),
    /// `delete set` / `delete map`.
    DeleteSet(Name),
    /// `add rule`: append a rule to a chain.
    AddRule(Box<ChainRule>),
    /// `add element` (the element shared with whoever built it).
    AddElement(SetId, Arc<Element>),
    /// `delete element`: the element with this one's key must exist (only
    /// the key is sent; the element is shared with whoever recorded it).
    DeleteElement(SetId, Arc<Element>),
}

/// A batch of operations on one table, applied atomically by a backend.
/// `Display` renders exactly the script given to `nft -f`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    family: Family,
    table: String,
    ops: Vec<Op>,
    /// The sets element operations name, by [`SetId`].
    sets: Vec<SetName>,
    error: Option<NftError>,
}

impl Transaction {
    /// An empty transaction on `table` of `family`.
    pub fn new(family: Family, table: impl Into<String>) -> Transaction {
        Transaction {
            family,
            table: table.into(),
            ops: Vec::new(),
            sets: Vec::new(),
            error: None,
        }
    }

    /// The sets element operations name, in [`SetId`] order.
    pub fn sets(&self) -> &[SetName] {
        &self.sets
    }

    /// The name of a set an element operation of this transaction names
    /// (empty for an id from elsewhere).
    pub fn set_name(&self, id: SetId) -> &str {
        self.sets.get(id.0 as usize).map_or("", |s| s)
    }

    /// The id of a set's name; a new name is kept as `keep` makes it (so
    /// a name already there is not copied again). Element operations come
    /// in runs on one set, so the last name is tried first, by address
    /// (the program's own names are static).
    fn set_id(&mut self, name: &str, keep: impl FnOnce() -> SetName) -> SetId {
        let same = |s: &SetName| {
            (std::ptr::eq(s.as_ptr(), name.as_ptr()) && s.len() == name.len()) || **s == *name
        };
        if let Some(last) = self.sets.last()
            && same(last)
        {
            return SetId(self.sets.len() as u32 - 1);
        }
        if let Some(i) = self.sets.iter().position(same) {
            return SetId(i as u32);
        }
        self.sets.push(keep());
        SetId(self.sets.len() as u32 - 1)
    }

    /// The table's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The operations in order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Number of operations (each element counts as one).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the transaction does nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The first error recorded while building, if any.
    pub fn error(&self) -> Option<&NftError> {
        self.error.as_ref()
    }

    fn fail(&mut self, err: NftError) {
        if self.error.is_none() {
            self.error = Some(err);
        }
    }

    fn check_name(&mut self, what: &str, name: &str) {
        if name.is_empty() || name.len() > NAME_LENGTH_MAX {
            self.fail(NftError::Invalid(format!(
                "{what} name {name:?} must be 1 to {NAME_LENGTH_MAX} bytes"
            )));
        }
    }

    fn check_comment(&mut self, comment: Option<&str>) {
        if let Some(c) = comment
            && c.len() > COMMENT_LENGTH_MAX
        {
            self.fail(NftError::Invalid(format!(
                "comment {c:?} is longer than {COMMENT_LENGTH_MAX} bytes"
            )));
        }
    }

    /// Adds the table (with a comment) if it is missing.
    pub fn add_table(&mut self, comment: Option<&str>) {
        self.push(Op::AddTable(comment.map(|c| Box::new(c.to_owned()))));
    }

    /// Deletes the table and everything in it (within the transaction; a
    /// later `add_table` recreates it, so readers never see it missing).
    pub fn delete_table(&mut self) {
        self.push(Op::DeleteTable);
    }

    /// Adds a chain if it is missing.
    pub fn add_chain(&mut self, chain: Chain) {
        self.push(Op::AddChain(Box::new(chain)));
    }

    /// Removes every rule of a chain.
    pub fn flush_chain(&mut self, name: &str) {
        self.push(Op::FlushChain(Box::new(name.to_owned())));
    }

    /// Deletes an empty, unreferenced chain.
    pub fn delete_chain(&mut self, name: &str) {
        self.push(Op::DeleteChain(Box::new(name.to_owned())));
    }

    /// Adds a set or map if it is missing.
    pub fn add_set(&mut self, set: Set) {
        self.push(Op::AddSet(Box::new(set)));
    }

    /// Removes every element of a set or map.
    pub fn flush_set(&mut self, name: &str) {
        self.push(Op::FlushSet(Box::new(name.to_owned())));
    }

    /// Deletes a set or map.
    pub fn delete_set(&mut self, name: &str) {
        self.push(Op::DeleteSet(Box::new(name.to_owned())));
    }

    /// Appends a rule to a chain.
    pub fn add_rule(&mut self, chain: &str, rule: Rule) {
        self.push(Op::AddRule(Box::new(ChainRule {
            chain: chain.to_owned(),
            rule,
        })));
    }

    /// Adds an element.
    pub fn add_element(&mut self, set: &str, element: Element) {
        let id = self.set_id(set, || Cow::Owned(set.to_owned()));
        self.push(Op::AddElement(id, Arc::new(element)));
    }

    /// Adds an element that the caller keeps too, to a set with a static
    /// name: neither is copied.
    pub fn add_shared_element(&mut self, set: &'static str, element: Arc<Element>) {
        let id = self.set_id(set, || Cow::Borrowed(set));
        self.push(Op::AddElement(id, element));
    }

    /// Deletes an element by key.
    pub fn delete_element(&mut self, set: &str, key: impl Into<Arc<[Value]>>) {
        let id = self.set_id(set, || Cow::Owned(set.to_owned()));
        self.push(Op::DeleteElement(id, Arc::new(Element::key(key))));
    }

    /// Deletes the element with the key of one the caller keeps (say, the
    /// element it recorded as programmed), from a set with a static name:
    /// neither is copied.
    pub fn delete_shared_element(&mut self, set: &'static str, element: Arc<Element>) {
        let id = self.set_id(set, || Cow::Borrowed(set));
        self.push(Op::DeleteElement(id, element));
    }

    /// Deletes elements by key, shared as [`delete_shared_element`](Self::delete_shared_element)
    /// does, inserted before the operation at `at` (the additions a sync
    /// wrote first, as it found them, must follow their deletions).
    pub fn insert_shared_deletes(
        &mut self,
        at: usize,
        deletes: impl IntoIterator<Item = (&'static str, Arc<Element>)>,
    ) {
        let ops: Vec<Op> = deletes
            .into_iter()
            .map(|(set, element)| {
                Op::DeleteElement(self.set_id(set, || Cow::Borrowed(set)), element)
            })
            .collect();
        for op in &ops {
            self.check(op);
        }
        let at = at.min(self.ops.len());
        self.ops.splice(at..at, ops);
    }

    /// Makes room for `additional` more operations at once (a big sync
    /// knows how many it has; doubling as they come leaves up to half the
    /// room unused).
    pub fn reserve(&mut self, additional: usize) {
        self.ops.reserve_exact(additional);
    }

    /// Appends an operation, checking it as the verbs do. An element
    /// operation's [`SetId`] must be this transaction's.
    pub(crate) fn push(&mut self, op: Op) {
        self.check(&op);
        self.ops.push(op);
    }

    /// A transaction on the same table with the operations `keep` accepts,
    /// in order (each checked again).
    pub fn filtered(&self, mut keep: impl FnMut(usize, &Op) -> bool) -> Transaction {
        let mut tx = Transaction::new(self.family, self.table.clone());
        tx.sets = self.sets.clone();
        for (i, op) in self.ops.iter().enumerate() {
            if keep(i, op) {
                tx.push(op.clone());
            }
        }
        tx
    }

    fn check(&mut self, op: &Op) {
        match op {
            Op::AddTable(comment) => self.check_comment(comment.as_deref().map(String::as_str)),
            Op::AddChain(chain) => {
                self.check_name("chain", &chain.name);
                self.check_comment(chain.comment.as_deref());
            }
            Op::AddSet(set) => {
                self.check_name("set", &set.name);
                self.check_comment(set.comment.as_deref());
                if set.key.is_empty() {
                    self.fail(NftError::Invalid(format!(
                        "set {} has no key type",
                        set.name
                    )));
                }
            }
            Op::AddRule(r) => {
                self.check_comment(r.rule.comment.as_deref());
                if r.rule.exprs.is_empty() {
                    self.fail(NftError::Invalid(format!(
                        "empty rule for chain {}",
                        r.chain
                    )));
                }
            }
            Op::AddElement(_, element) => self.check_comment(element.comment.as_deref()),
            Op::DeleteTable
            | Op::FlushChain(_)
            | Op::DeleteChain(_)
            | Op::FlushSet(_)
            | Op::DeleteSet(_)
            | Op::DeleteElement(..) => {}
        }
    }

    fn prefix(&self) -> String {
        format!("{} {}", self.family, self.table)
    }
}

impl Display for Transaction {
    /// One line per operation, except that consecutive element operations of
    /// the same kind on the same set are written as one statement (much faster
    /// for nft to parse than one line per element).
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let t = self.prefix();
        let mut i = 0;
        while i < self.ops.len() {
            match &self.ops[i] {
                Op::AddTable(comment) => match comment {
                    Some(c) => writeln!(f, "add table {t} {{ comment {} ; }}", quote(c))?,
                    None => writeln!(f, "add table {t}")?,
                },
                Op::AddChain(chain) => {
                    write!(f, "add chain {t} {}", chain.name)?;
                    let mut body = String::new();
                    if let Some(b) = &chain.base {
                        body.push_str(&format!(
                            " type {} hook {} priority {} ;",
                            b.chain_type, b.hook, b.priority
                        ));
                    }
                    if let Some(c) = &chain.comment {
                        body.push_str(&format!(" comment {} ;", quote(c)));
                    }
                    if body.is_empty() {
                        writeln!(f)?;
                    } else {
                        writeln!(f, " {{{body} }}")?;
                    }
                }
                Op::DeleteTable => writeln!(f, "delete table {t}")?,
                Op::FlushChain(name) => writeln!(f, "flush chain {t} {name}")?,
                Op::DeleteChain(name) => writeln!(f, "delete chain {t} {name}")?,
                Op::AddSet(set) => writeln!(
                    f,
                    "add {} {t} {} {{ {} }}",
                    set.kind(),
                    set.name,
                    set.spec()
                )?,
                Op::FlushSet(name) => writeln!(f, "flush set {t} {name}")?,
                Op::DeleteSet(name) => writeln!(f, "delete set {t} {name}")?,
                Op::AddRule(r) => {
                    writeln!(f, "add rule {t} {} {}", r.chain, r.rule.render(self.family))?
                }
                Op::AddElement(set, _) => {
                    let mut items = Vec::new();
                    while let Some(Op::AddElement(s, e)) = self.ops.get(i) {
                        if s != set {
                            break;
                        }
                        items.push(e.to_string());
                        i += 1;
                    }
                    let set = self.set_name(*set);
                    writeln!(f, "add element {t} {set} {{ {} }}", items.join(", "))?;
                    continue;
                }
                Op::DeleteElement(set, _) => {
                    let mut items = Vec::new();
                    while let Some(Op::DeleteElement(s, e)) = self.ops.get(i) {
                        if s != set {
                            break;
                        }
                        items.push(crate::ir::join(e.key.iter().map(|v| v.to_string()), " . "));
                        i += 1;
                    }
                    let set = self.set_name(*set);
                    writeln!(f, "delete element {t} {set} {{ {} }}", items.join(", "))?;
                    continue;
                }
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ChainType, DataType, ElementValue, Expr, Hook, L4Proto, Verdict};

    #[test]
    fn renders_the_nft_script_and_coalesces_elements() {
        let mut tx = Transaction::new(Family::Ip, "verdict");
        tx.add_table(Some("rules for verdict"));
        tx.add_chain(Chain::base(
            "nat-output",
            ChainType::Nat,
            Hook::Output,
            -100,
        ));
        tx.add_chain(Chain::regular("services"));
        tx.add_set(Set::set("cluster-ips", vec![DataType::Ipv4Addr]));
        tx.add_rule(
            "nat-output",
            Rule::new(vec![Expr::Verdict(Verdict::Jump("services".into()))]),
        );
        for ip in ["172.30.0.41", "172.30.0.42"] {
            tx.add_element(
                "cluster-ips",
                Element::key(vec![Value::Addr(ip.parse().unwrap())]),
            );
        }
        tx.delete_element(
            "cluster-ips",
            vec![Value::Addr("172.30.0.43".parse().unwrap())],
        );
        tx.add_element(
            "cluster-ips",
            Element::key(vec![Value::Addr("172.30.0.44".parse().unwrap())]),
        );
        assert_eq!(tx.len(), 9);
        assert_eq!(
            tx.to_string(),
            "add table ip verdict { comment \"rules for verdict\" ; }\n\
             add chain ip verdict nat-output { type nat hook output priority -100 ; }\n\
             add chain ip verdict services\n\
             add set ip verdict cluster-ips { type ipv4_addr ; }\n\
             add rule ip verdict nat-output jump services\n\
             add element ip verdict cluster-ips { 172.30.0.41, 172.30.0.42 }\n\
             delete element ip verdict cluster-ips { 172.30.0.43 }\n\
             add element ip verdict cluster-ips { 172.30.0.44 }\n"
        );
        assert!(tx.error().is_none());
    }

    #[test]
    fn an_operation_takes_two_words() {
        // A cold sync at 30,000 Services holds 180,000 of them.
        assert_eq!(std::mem::size_of::<Op>(), 16);
    }

    #[test]
    fn records_the_first_error_and_keeps_going() {
        let mut tx = Transaction::new(Family::Ip6, "verdict");
        tx.add_chain(Chain::regular("x".repeat(300)));
        tx.add_rule("c", Rule::new(vec![]));
        tx.add_element(
            "m",
            Element::map(
                vec![Value::Proto(L4Proto::Tcp), Value::Port(3001)],
                ElementValue::Verdict(Verdict::Drop),
            )
            .with_comment("c".repeat(200)),
        );
        assert_eq!(tx.len(), 3);
        let err = tx.error().unwrap().to_string();
        assert!(err.contains("chain name"), "{err}");
    }
}
