//! An in-memory nftables backend: applies transactions atomically with the
//! kernel's reference rules, and dumps its state canonically. The proxier's
//! tests run against it, and the tracer reads it.

use std::collections::BTreeMap;

use crate::backend::{Backend, ChainState, SetState, TableState, set_elements};
use crate::error::NftError;
use crate::ir::{DataType, Element, ElementValue, Expr, Family, Rule, Value, Verdict};
use crate::tx::{Op, Transaction};

/// How a table changes in memory: the kernel's checks, and each
/// operation's effect.
impl TableState {
    fn chain_mut(&mut self, name: &str) -> Result<&mut ChainState, NftError> {
        self.chains
            .get_mut(name)
            .ok_or_else(|| NftError::NotFound(format!("chain {name}")))
    }

    fn set_mut(&mut self, name: &str) -> Result<&mut SetState, NftError> {
        self.sets
            .get_mut(name)
            .ok_or_else(|| NftError::NotFound(format!("set {name}")))
    }

    /// Whether any rule or verdict-map element jumps to `chain`.
    fn chain_referenced(&self, chain: &str) -> Option<String> {
        for c in self.chains.values() {
            if c.rules
                .iter()
                .any(|r| r.exprs.iter().any(|e| e.chain_ref() == Some(chain)))
            {
                return Some(format!("rule in chain {}", c.chain.name));
            }
        }
        for s in self.sets.values() {
            if s.elements.values().any(
                |e| matches!(&e.value, Some(ElementValue::Verdict(v)) if v.target() == Some(chain)),
            ) {
                return Some(format!("element of map {}", s.set.name));
            }
        }
        None
    }

    fn set_referenced(&self, set: &str) -> Option<String> {
        self.chains
            .values()
            .find(|c| {
                c.rules
                    .iter()
                    .any(|r| r.exprs.iter().any(|e| e.set_refs() == Some(set)))
            })
            .map(|c| format!("rule in chain {}", c.chain.name))
    }

    fn check_rule(&self, chain: &str, rule: &Rule) -> Result<(), NftError> {
        for e in &rule.exprs {
            if let Some(target) = e.chain_ref() {
                let Some(t) = self.chains.get(target) else {
                    return Err(NftError::NotFound(format!(
                        "chain {target} (jumped to from {chain})"
                    )));
                };
                if t.chain.base.is_some() {
                    return Err(NftError::Refused(format!(
                        "cannot jump to base chain {target}"
                    )));
                }
            }
            if let Some(name) = e.set_refs() {
                let Some(s) = self.sets.get(name) else {
                    return Err(NftError::NotFound(format!(
                        "set {name} (used in chain {chain})"
                    )));
                };
                let ok = match e {
                    Expr::Vmap { key, .. } => s.set.is_vmap() && key.len() == s.set.key.len(),
                    Expr::Dnat(crate::ir::DnatTarget::Map { key, .. }) => {
                        s.set.is_map() && !s.set.is_vmap() && key.len() == s.set.key.len()
                    }
                    Expr::Lookup { key, .. } => key.len() == s.set.key.len(),
                    Expr::Update { key, value, .. } => {
                        s.set.timeout.is_some()
                            && key.len() == s.set.key.len()
                            && value.len() == s.set.value.as_ref().map_or(0, Vec::len)
                    }
                    _ => true,
                };
                if !ok {
                    return Err(NftError::Refused(format!(
                        "set {name} does not fit its use in chain {chain}: {}",
                        rule.render(Family::Ip)
                    )));
                }
            }
        }
        Ok(())
    }

    fn check_element(&self, set: &SetState, e: &Element) -> Result<(), NftError> {
        let name = &set.set.name;
        if e.key.len() != set.set.key.len() {
            return Err(NftError::Refused(format!(
                "element {e} does not fit the key of {name}"
            )));
        }
        for (v, t) in e.key.iter().zip(&set.set.key) {
            let ok = matches!(
                (v, t),
                (Value::Addr(std::net::IpAddr::V4(_)), DataType::Ipv4Addr)
                    | (Value::Addr(std::net::IpAddr::V6(_)), DataType::Ipv6Addr)
                    | (Value::Proto(_), DataType::InetProto)
                    | (Value::Port(_), DataType::InetService | DataType::PortOf(_))
                    | (Value::Int(_), DataType::Numgen)
            ) || (set.set.interval
                && matches!(
                    (v, t),
                    (Value::Prefix(ipnet::IpNet::V4(_)), DataType::Ipv4Addr)
                        | (Value::Prefix(ipnet::IpNet::V6(_)), DataType::Ipv6Addr)
                ));
            if !ok {
                return Err(NftError::Refused(format!(
                    "element {e}: {v} is not a {t:?} in {name}"
                )));
            }
        }
        match (&set.set.value, &e.value) {
            (None, None) => Ok(()),
            (Some(t), Some(ElementValue::Verdict(v))) if t.as_slice() == [DataType::Verdict] => {
                match v.target() {
                    Some(c) if !self.chains.contains_key(c) => Err(NftError::NotFound(format!(
                        "chain {c} (element {e} of {name})"
                    ))),
                    _ => Ok(()),
                }
            }
            (Some(t), Some(ElementValue::Data(d)))
                if t.len() == d.len() && t[0] != DataType::Verdict =>
            {
                Ok(())
            }
            _ => Err(NftError::Refused(format!(
                "element {e} does not fit the value of {name}"
            ))),
        }
    }

    /// Applies one operation of `tx`.
    fn apply(&mut self, tx: &Transaction, op: &Op) -> Result<(), NftError> {
        match op {
            Op::AddTable(_) => Ok(()),
            Op::DeleteTable => Ok(()),
            Op::AddChain(chain) => match self.chains.get(&chain.name) {
                Some(existing) if existing.chain.base != chain.base => {
                    Err(NftError::AlreadyExists(format!(
                        "chain {} exists with a different hook or priority",
                        chain.name
                    )))
                }
                Some(_) => Ok(()),
                None => {
                    self.chains.insert(
                        chain.name.clone(),
                        ChainState {
                            chain: (**chain).clone(),
                            rules: Vec::new(),
                            counters: BTreeMap::new(),
                            handles: Vec::new(),
                        },
                    );
                    Ok(())
                }
            },
            Op::FlushChain(name) => {
                self.chain_mut(name)?.rules.clear();
                Ok(())
            }
            Op::DeleteChain(name) => {
                let c = self.chain_mut(name)?;
                if !c.rules.is_empty() {
                    return Err(NftError::Busy(format!("chain {name} is not empty")));
                }
                if let Some(by) = self.chain_referenced(name) {
                    return Err(NftError::Busy(format!("chain {name} is used by a {by}")));
                }
                self.chains.remove(name.as_str());
                Ok(())
            }
            Op::AddSet(set) => match self.sets.get(&set.name) {
                Some(existing) if !existing.set.same_type(set) => Err(NftError::AlreadyExists(
                    format!("set {} exists with a different type", set.name),
                )),
                Some(_) => Ok(()),
                None => {
                    self.sets.insert(
                        set.name.clone(),
                        SetState {
                            set: (**set).clone(),
                            elements: BTreeMap::new(),
                            counters: BTreeMap::new(),
                        },
                    );
                    Ok(())
                }
            },
            Op::FlushSet(name) => {
                self.set_mut(name)?.elements.clear();
                Ok(())
            }
            Op::DeleteSet(name) => {
                self.set_mut(name)?;
                if let Some(by) = self.set_referenced(name) {
                    return Err(NftError::Busy(format!("set {name} is used by a {by}")));
                }
                self.sets.remove(name.as_str());
                Ok(())
            }
            Op::AddRule(r) => {
                self.chain_mut(&r.chain)?;
                self.check_rule(&r.chain, &r.rule)?;
                self.chain_mut(&r.chain)?.rules.push(r.rule.clone());
                Ok(())
            }
            Op::AddElement(set, element) => {
                let set = tx.set_name(*set);
                let s = self
                    .sets
                    .get(set)
                    .ok_or_else(|| NftError::NotFound(format!("set {set}")))?;
                self.check_element(s, element)?;
                let s = self.set_mut(set)?;
                if s.set.interval
                    && !s.elements.contains_key(&element.key)
                    && let Some(other) =
                        s.elements.values().find(|e| overlaps(&e.key, &element.key))
                {
                    // As the kernel: interval elements may not overlap.
                    return Err(NftError::AlreadyExists(format!(
                        "element {element} of {set} overlaps {other}"
                    )));
                }
                match s.elements.get(&element.key) {
                    // The kernel keeps the existing element (and its comment)
                    // when the value is the same, and refuses a different value.
                    Some(old) if old.value == element.value => Ok(()),
                    Some(old) => Err(NftError::AlreadyExists(format!(
                        "element {old} of {set} exists with a different value"
                    ))),
                    None => {
                        s.elements
                            .insert(element.key.clone(), Element::clone(element));
                        Ok(())
                    }
                }
            }
            Op::DeleteElement(set, element) => {
                let set = tx.set_name(*set);
                let key = &element.key;
                let s = self.set_mut(set)?;
                if s.elements.remove(key.as_ref()).is_none() {
                    return Err(NftError::NotFound(format!(
                        "element {} of {set}",
                        crate::ir::join(key.iter().map(|v| v.to_string()), " . ")
                    )));
                }
                Ok(())
            }
        }
    }
}

/// Whether two interval-set keys cover a common point: every field must
/// intersect (an address is a host prefix; other fields must be equal).
fn overlaps(a: &[Value], b: &[Value]) -> bool {
    let net = |v: &Value| match v {
        Value::Prefix(n) => Some(*n),
        Value::Addr(a) => Some(ipnet::IpNet::from(*a)),
        _ => None,
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (net(x), net(y)) {
            (Some(n), Some(m)) => n.contains(&m.network()) || m.contains(&n.network()),
            _ => x == y,
        })
}

/// An in-memory nftables: tables keyed by family and name.
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    tables: BTreeMap<(Family, String), TableState>,
    transactions: usize,
    last_ops: usize,
}

impl MemoryBackend {
    /// An empty ruleset.
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// The table, if it exists.
    pub fn get(&self, family: Family, name: &str) -> Option<&TableState> {
        self.tables.get(&(family, name.to_owned()))
    }

    /// Canonical dump of one table (empty string if it does not exist).
    pub fn dump(&self, family: Family, name: &str) -> String {
        self.get(family, name)
            .map(|t| t.dump(family, name))
            .unwrap_or_default()
    }

    /// How many transactions have been applied successfully.
    pub fn transactions(&self) -> usize {
        self.transactions
    }

    /// Number of operations in the last successful transaction.
    pub fn last_operations(&self) -> usize {
        self.last_ops
    }

    /// Writes elements as the data path would (`update @set`), e.g. to
    /// replay what a traced packet recorded in a dynamic set.
    pub fn insert_dynamic(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
        element: Element,
    ) -> Result<(), NftError> {
        let t = self
            .tables
            .get_mut(&(family, table.to_owned()))
            .ok_or_else(|| NftError::NotFound(format!("table {family} {table}")))?;
        let s = t.set_mut(set)?;
        if s.set.timeout.is_none() {
            return Err(NftError::Refused(format!("set {set} is not dynamic")));
        }
        s.elements.insert(element.key.clone(), element);
        Ok(())
    }
}

impl MemoryBackend {
    /// The table as `tx` would leave it (`None`: deleted or never there).
    fn apply(&self, tx: &Transaction) -> Result<Option<TableState>, NftError> {
        if let Some(err) = tx.error() {
            return Err(err.clone());
        }
        // Work on a copy: either every operation applies or none does.
        let mut table = self.get(tx.family(), tx.table()).cloned();
        for op in tx.ops() {
            if *op == Op::DeleteTable {
                if table.is_none() {
                    return Err(NftError::NotFound(format!(
                        "table {} {}",
                        tx.family(),
                        tx.table()
                    )));
                }
                table = None;
                continue;
            }
            match (&mut table, op) {
                (None, Op::AddTable(comment)) => {
                    table = Some(TableState {
                        comment: comment.as_deref().cloned(),
                        ..TableState::default()
                    });
                }
                (None, _) => {
                    return Err(NftError::NotFound(format!(
                        "table {} {}",
                        tx.family(),
                        tx.table()
                    )));
                }
                (Some(t), op) => t.apply(tx, op)?,
            }
        }
        Ok(table)
    }
}

impl Backend for MemoryBackend {
    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        let table = self.apply(tx)?;
        let key = (tx.family(), tx.table().to_owned());
        match table {
            Some(t) => {
                self.tables.insert(key, t);
            }
            None => {
                self.tables.remove(&key);
            }
        }
        self.transactions += 1;
        self.last_ops = tx.len();
        Ok(())
    }

    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.apply(tx).map(|_| ())
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        Ok(self.get(family, name).cloned())
    }

    /// Every transaction applied is a commit.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(Some(self.transactions as u32))
    }

    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<Element>, NftError> {
        set_elements(self.get(family, table), family, table, set)
    }
}

/// Builds the verdict of a map element that jumps to `chain`.
pub fn goto(chain: &str) -> ElementValue {
    ElementValue::Verdict(Verdict::Goto(chain.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Chain, ChainType, DataType, Hook, L4Proto, Selector, Set};

    const T: &str = "verdict";

    fn base_tx() -> Transaction {
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_table(Some("rules for verdict"));
        tx.add_chain(Chain::base(
            "nat-prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            -100,
        ));
        tx.add_chain(Chain::regular("services"));
        tx.add_chain(Chain::regular("reject-chain"));
        tx.add_set(Set::map(
            "service-ips",
            vec![
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ],
            vec![DataType::Verdict],
        ));
        tx.add_rule(
            "nat-prerouting",
            Rule::new(vec![Expr::Verdict(Verdict::Jump("services".into()))]),
        );
        tx.add_rule(
            "services",
            Rule::new(vec![Expr::Vmap {
                key: vec![Selector::Daddr, Selector::L4Proto, Selector::Dport],
                map: "service-ips".into(),
            }]),
        );
        tx
    }

    fn elem(ip: &str, chain: &str) -> Element {
        Element::map(
            vec![
                Value::Addr(ip.parse().unwrap()),
                Value::Proto(L4Proto::Tcp),
                Value::Port(80),
            ],
            goto(chain),
        )
    }

    #[test]
    fn applies_and_dumps_canonically() {
        let mut nft = MemoryBackend::new();
        let mut tx = base_tx();
        tx.add_element("service-ips", elem("172.30.0.42", "reject-chain"));
        tx.add_element("service-ips", elem("172.30.0.41", "reject-chain"));
        nft.run(&tx).unwrap();
        assert_eq!(nft.last_operations(), 9);
        let dump = nft.dump(Family::Ip, T);
        assert_eq!(
            dump,
            "add table ip verdict { comment \"rules for verdict\" ; }\n\
             add chain ip verdict nat-prerouting { type nat hook prerouting priority -100 ; }\n\
             add chain ip verdict reject-chain\n\
             add chain ip verdict services\n\
             add map ip verdict service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add rule ip verdict nat-prerouting jump services\n\
             add rule ip verdict services ip daddr . meta l4proto . th dport vmap @service-ips\n\
             add element ip verdict service-ips { 172.30.0.41 . tcp . 80 : goto reject-chain, 172.30.0.42 . tcp . 80 : goto reject-chain }\n"
        );
        // As in nft, `add` of existing chains, sets and elements is a no-op,
        // but `add rule` appends again: rewriting a chain needs a flush first.
        nft.run(&tx).unwrap();
        let t = nft.get(Family::Ip, T).unwrap();
        assert_eq!(t.chains["services"].rules.len(), 2);
        assert_eq!(t.sets["service-ips"].elements.len(), 2);
    }

    #[test]
    fn a_failing_transaction_changes_nothing() {
        let mut nft = MemoryBackend::new();
        nft.run(&base_tx()).unwrap();
        let before = nft.dump(Family::Ip, T);
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_chain(Chain::regular("new-chain"));
        tx.add_element("service-ips", elem("172.30.0.41", "missing-chain"));
        let err = nft.run(&tx).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(nft.dump(Family::Ip, T), before);
        assert_eq!(nft.transactions(), 1);
    }

    #[test]
    fn rejects_dangling_references() {
        let mut nft = MemoryBackend::new();
        nft.run(&base_tx()).unwrap();
        type Build = fn(&mut Transaction);
        let cases: Vec<(Build, &str)> = vec![
            (
                |tx| {
                    tx.add_rule(
                        "services",
                        Rule::new(vec![Expr::Verdict(Verdict::Goto("nope".into()))]),
                    )
                },
                "chain nope",
            ),
            (
                |tx| {
                    tx.add_rule(
                        "services",
                        Rule::new(vec![Expr::Lookup {
                            key: vec![Selector::Daddr],
                            set: "nope".into(),
                            negate: false,
                        }]),
                    )
                },
                "set nope",
            ),
            (|tx| tx.flush_chain("nope"), "chain nope"),
            (
                |tx| tx.delete_element("service-ips", vec![Value::Port(1)]),
                "element",
            ),
            (
                |tx| tx.add_rule("nope", Rule::new(vec![Expr::Reject])),
                "chain nope",
            ),
        ];
        for (build, what) in cases {
            let mut tx = Transaction::new(Family::Ip, T);
            build(&mut tx);
            let err = nft.run(&tx).unwrap_err();
            assert!(
                err.is_not_found() && err.to_string().contains(what),
                "{err}"
            );
        }
        let mut tx = Transaction::new(Family::Ip6, T);
        tx.add_chain(Chain::regular("x"));
        assert!(nft.run(&tx).unwrap_err().is_not_found(), "missing table");
    }

    #[test]
    fn deleting_used_objects_is_refused() {
        let mut nft = MemoryBackend::new();
        let mut tx = base_tx();
        tx.add_element("service-ips", elem("172.30.0.41", "reject-chain"));
        tx.add_rule("reject-chain", Rule::new(vec![Expr::Reject]));
        nft.run(&tx).unwrap();
        type Build = fn(&mut Transaction);
        let deletes: [Build; 3] = [
            |tx| tx.delete_chain("reject-chain"),
            |tx| tx.delete_chain("services"),
            |tx| tx.delete_set("service-ips"),
        ];
        for build in deletes {
            let mut tx = Transaction::new(Family::Ip, T);
            build(&mut tx);
            assert!(matches!(nft.run(&tx), Err(NftError::Busy(_))));
        }
        // Flushed and unreferenced, it can go.
        let mut tx = Transaction::new(Family::Ip, T);
        tx.delete_element("service-ips", elem("172.30.0.41", "").key);
        tx.flush_chain("reject-chain");
        tx.delete_chain("reject-chain");
        nft.run(&tx).unwrap();
        assert!(
            !nft.get(Family::Ip, T)
                .unwrap()
                .chains
                .contains_key("reject-chain")
        );
    }

    #[test]
    fn a_table_can_be_replaced_atomically() {
        let mut nft = MemoryBackend::new();
        let mut tx = base_tx();
        tx.add_chain(Chain::regular("junk"));
        nft.run(&tx).unwrap();
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_table(None);
        tx.delete_table();
        tx.add_table(Some("fresh"));
        tx.add_chain(Chain::regular("only"));
        assert!(tx.to_string().contains("delete table ip verdict\n"));
        nft.run(&tx).unwrap();
        let t = nft.get(Family::Ip, T).unwrap();
        assert_eq!(t.chains.keys().collect::<Vec<_>>(), ["only"]);
        assert_eq!(t.comment.as_deref(), Some("fresh"));
        // Deleting a missing table fails, as in nft.
        let mut tx = Transaction::new(Family::Ip6, T);
        tx.delete_table();
        assert!(nft.run(&tx).unwrap_err().is_not_found());
    }

    #[test]
    fn interval_elements_may_not_overlap() {
        let mut nft = MemoryBackend::new();
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_table(None);
        let key = vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
            DataType::Ipv4Addr,
        ];
        tx.add_set(Set::set("allow", key).with_interval());
        nft.run(&tx).unwrap();
        let el = |port: u16, net: &str| {
            Element::key(vec![
                Value::Addr("1.2.3.4".parse().unwrap()),
                Value::Proto(L4Proto::Tcp),
                Value::Port(port),
                Value::Prefix(net.parse().unwrap()),
            ])
        };
        let add = |nft: &mut MemoryBackend, e: Element| {
            let mut tx = Transaction::new(Family::Ip, T);
            tx.add_element("allow", e);
            nft.run(&tx)
        };
        add(&mut nft, el(80, "192.168.0.0/24")).unwrap();
        // Identical: a no-op, as in the kernel.
        add(&mut nft, el(80, "192.168.0.0/24")).unwrap();
        // Inside it: refused, as the kernel refuses it.
        assert!(
            add(&mut nft, el(80, "192.168.0.240/32"))
                .unwrap_err()
                .is_already_exists()
        );
        assert!(
            add(&mut nft, el(80, "192.168.0.0/16"))
                .unwrap_err()
                .is_already_exists()
        );
        // Another port, or a disjoint range: fine.
        add(&mut nft, el(81, "192.168.0.0/16")).unwrap();
        add(&mut nft, el(80, "192.168.1.0/24")).unwrap();
    }

    #[test]
    fn element_values_cannot_change_in_place() {
        let mut nft = MemoryBackend::new();
        let mut tx = base_tx();
        tx.add_chain(Chain::regular("other"));
        tx.add_element("service-ips", elem("172.30.0.41", "reject-chain"));
        nft.run(&tx).unwrap();
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_element("service-ips", elem("172.30.0.41", "other"));
        assert!(nft.run(&tx).unwrap_err().is_already_exists());
        let mut tx = Transaction::new(Family::Ip, T);
        tx.delete_element("service-ips", elem("172.30.0.41", "").key);
        tx.add_element("service-ips", elem("172.30.0.41", "other"));
        nft.run(&tx).unwrap();
    }

    #[test]
    fn elements_must_fit_the_set_type() {
        let mut nft = MemoryBackend::new();
        nft.run(&base_tx()).unwrap();
        let mut tx = Transaction::new(Family::Ip, T);
        tx.add_element(
            "service-ips",
            Element::map(
                vec![
                    Value::Addr("fd00::1".parse().unwrap()),
                    Value::Proto(L4Proto::Tcp),
                    Value::Port(80),
                ],
                ElementValue::Verdict(Verdict::Drop),
            ),
        );
        assert!(matches!(nft.run(&tx), Err(NftError::Refused(_))));
    }
}
