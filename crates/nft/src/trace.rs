//! A packet tracer over an in-memory table: walks one new packet through the
//! base chains in hook order, interpreting the typed rules, and reports the
//! verdict, the DNAT target, whether it was masqueraded and which rules
//! matched. Where the data path makes a random choice (`numgen`), the trace
//! forks and follows every alternative, so one trace shows every endpoint a
//! packet can reach.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::backend::{SetState, TableState, find};
use crate::ir::{
    CmpOp, DnatTarget, Element, ElementValue, Expr, Family, FibAddr, Hook, KeyPart, L4Proto,
    Selector, Value, Verdict,
};

/// Largest numgen range the tracer enumerates.
const MAX_FORK: u32 = 4096;
/// Deepest chain nesting the tracer follows (guards against loops).
const MAX_DEPTH: usize = 32;

/// The packet to trace: the first packet of a new connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Protocol.
    pub proto: L4Proto,
    /// Destination port.
    pub dport: u16,
    /// Source port (0 when the question does not say).
    pub sport: u16,
    /// Input interface; `None` for a packet sent by the node itself.
    pub iif: Option<String>,
}

/// How a path ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Disposition {
    /// Delivered or forwarded.
    Accept,
    /// Silently dropped.
    Drop,
    /// Rejected (ICMP unreachable / TCP reset).
    Reject,
}

/// One way through the ruleset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePath {
    /// How it ended.
    pub disposition: Disposition,
    /// Where DNAT sent it, if anywhere.
    pub dnat: Option<(IpAddr, u16)>,
    /// Whether postrouting masqueraded it.
    pub masqueraded: bool,
    /// The rules that matched, as `chain: rule`, in order.
    pub rules: Vec<String>,
    /// Elements the data path wrote to dynamic sets (`update @set`).
    pub updates: Vec<(String, Element)>,
    /// The matched rules with their hook, chain and set lookups, in order.
    pub steps: Vec<TraceStep>,
    /// The path's probability is 1 / `one_in`: every random choice
    /// (`numgen random mod N`) on the way divides it by N.
    pub one_in: u64,
}

/// One rule a path matched (or reached a verdict in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceStep {
    /// The hook of the base chain being walked.
    pub hook: Hook,
    /// The chain the rule is in.
    pub chain: String,
    /// The rule, as `nft` prints it.
    pub rule: String,
    /// The set and map lookups the rule made on the way, in order.
    pub lookups: Vec<TraceLookup>,
}

/// A set or map lookup of a traced rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceLookup {
    /// The set or map.
    pub set: String,
    /// The key the packet built.
    pub key: Vec<Value>,
    /// The element found, if any (with its value and comment).
    pub found: Option<Element>,
}

impl TracePath {
    /// The path's result as kube-proxy's tracer prints it: `IP:port`,
    /// `DROP`, `REJECT`, or empty when the packet passed untouched.
    pub fn output(&self) -> String {
        match (self.disposition, self.dnat) {
            (Disposition::Drop, _) => "DROP".into(),
            (Disposition::Reject, _) => "REJECT".into(),
            (Disposition::Accept, Some((IpAddr::V4(a), p))) => format!("{a}:{p}"),
            (Disposition::Accept, Some((IpAddr::V6(a), p))) => format!("[{a}]:{p}"),
            (Disposition::Accept, None) => String::new(),
        }
    }
}

/// Every path a packet can take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The paths, in exploration order.
    pub paths: Vec<TracePath>,
}

impl Trace {
    /// The distinct outputs of all paths, sorted and joined with `", "`
    /// (kube-proxy's format: `"10.180.0.1:80, 10.180.2.1:80"`).
    pub fn output(&self) -> String {
        let outs: BTreeSet<String> = self.paths.iter().map(TracePath::output).collect();
        outs.into_iter().collect::<Vec<_>>().join(", ")
    }

    /// Whether the packet is masqueraded: `Some` when every path agrees.
    pub fn masqueraded(&self) -> Option<bool> {
        let m: BTreeSet<bool> = self.paths.iter().map(|p| p.masqueraded).collect();
        match m.len() {
            1 => m.into_iter().next(),
            _ => None,
        }
    }

    /// A readable account of every path, for test failure messages.
    pub fn explain(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.paths.iter().enumerate() {
            let _ = writeln!(
                s,
                "path {i}: {:?} dnat={:?} masquerade={}",
                p.disposition, p.dnat, p.masqueraded
            );
            for r in &p.rules {
                let _ = writeln!(s, "    {r}");
            }
        }
        s
    }
}

/// Where a chain walk left the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// The rule did not match, or finished without a verdict: next rule.
    Next,
    /// Return to the caller (explicit `return`, or the end of a goto'd chain).
    Return,
    /// Accept in this base chain.
    Accept,
    /// Drop.
    Drop,
    /// Reject.
    Reject,
}

#[derive(Clone, Debug)]
struct State {
    src: IpAddr,
    dst: IpAddr,
    dport: u16,
    sport: u16,
    orig_dst: IpAddr,
    orig_dport: u16,
    proto: L4Proto,
    iif: Option<String>,
    mark: u32,
    dnat: Option<(IpAddr, u16)>,
    masq: bool,
    rules: Vec<String>,
    updates: Vec<(String, Element)>,
    hook: Hook,
    chain: String,
    steps: Vec<TraceStep>,
    /// Lookups of the rule being evaluated, not yet recorded in a step.
    lookups: Vec<TraceLookup>,
    one_in: u64,
}

/// Where the tracer finds the elements a packet's keys match.
pub trait ElementSource {
    /// The element of `set` that each of `keys` matches (`set` as the
    /// table defines it; its own elements are empty when they live
    /// elsewhere, as in a table read without them).
    fn find(&self, set: &SetState, keys: &[Vec<Value>]) -> Vec<Option<Element>>;
}

/// The elements are the ones the traced table holds.
pub struct InTable;

impl ElementSource for InTable {
    fn find(&self, set: &SetState, keys: &[Vec<Value>]) -> Vec<Option<Element>> {
        keys.iter().map(|k| find(set, k).cloned()).collect()
    }
}

/// Traces packets through one table.
pub struct Tracer<'a> {
    table: &'a TableState,
    elements: &'a dyn ElementSource,
    family: Family,
    local: Vec<IpAddr>,
}

impl<'a> Tracer<'a> {
    /// A tracer over `table`; `local_addrs` are the node's own addresses
    /// (what `fib … type local` and routing treat as local).
    pub fn new(table: &'a TableState, family: Family, local_addrs: &[IpAddr]) -> Tracer<'a> {
        Tracer::with_elements(table, &InTable, family, local_addrs)
    }

    /// A tracer over `table`'s chains and set definitions that finds
    /// elements in `elements` (a kernel looked up key by key, say).
    pub fn with_elements(
        table: &'a TableState,
        elements: &'a dyn ElementSource,
        family: Family,
        local_addrs: &[IpAddr],
    ) -> Tracer<'a> {
        Tracer {
            table,
            elements,
            family,
            local: local_addrs.to_vec(),
        }
    }

    fn is_local(&self, a: IpAddr) -> bool {
        a.is_loopback() || self.local.contains(&a)
    }

    /// Base chains of a hook, by priority.
    fn chains_of(&self, hook: Hook) -> Vec<&'a str> {
        let mut v: Vec<(i32, &str)> = self
            .table
            .chains
            .values()
            .filter_map(|c| {
                c.chain
                    .base
                    .filter(|b| b.hook == hook)
                    .map(|b| (b.priority, c.chain.name.as_str()))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// Traces `pkt` through every hook it crosses.
    pub fn trace(&self, pkt: &Packet) -> Trace {
        let start = State {
            src: pkt.src,
            dst: pkt.dst,
            dport: pkt.dport,
            sport: pkt.sport,
            orig_dst: pkt.dst,
            orig_dport: pkt.dport,
            proto: pkt.proto,
            iif: pkt.iif.clone(),
            mark: 0,
            dnat: None,
            masq: false,
            rules: Vec::new(),
            updates: Vec::new(),
            hook: Hook::Prerouting,
            chain: String::new(),
            steps: Vec::new(),
            lookups: Vec::new(),
            one_in: 1,
        };
        let first = if pkt.iif.is_some() {
            Hook::Prerouting
        } else {
            Hook::Output
        };
        let mut paths = Vec::new();
        self.walk_hooks(first, start, &mut paths);
        Trace { paths }
    }

    fn walk_hooks(&self, hook: Hook, st: State, out: &mut Vec<TracePath>) {
        let mut live = vec![st];
        for chain in self.chains_of(hook) {
            let mut next = Vec::new();
            for mut s in live {
                s.hook = hook;
                for (flow, s) in self.eval_chain(chain, s, 0) {
                    match flow {
                        Flow::Drop => out.push(finish(s, Disposition::Drop)),
                        Flow::Reject => out.push(finish(s, Disposition::Reject)),
                        _ => next.push(s),
                    }
                }
            }
            live = next;
        }
        for s in live {
            let local = self.is_local(s.dst);
            match hook {
                Hook::Prerouting if local => self.walk_hooks(Hook::Input, s, out),
                Hook::Prerouting => self.walk_hooks(Hook::Forward, s, out),
                Hook::Forward | Hook::Output => self.walk_hooks(Hook::Postrouting, s, out),
                Hook::Postrouting if local && s.iif.is_none() => {
                    let mut s = s;
                    s.iif = Some("lo".into());
                    self.walk_hooks(Hook::Input, s, out)
                }
                Hook::Postrouting | Hook::Input => out.push(finish(s, Disposition::Accept)),
            }
        }
    }

    fn eval_chain(&self, name: &str, st: State, depth: usize) -> Vec<(Flow, State)> {
        let Some(chain) = self.table.chains.get(name) else {
            return vec![(Flow::Drop, note(st, format!("{name}: MISSING CHAIN")))];
        };
        if depth > MAX_DEPTH {
            return vec![(Flow::Drop, note(st, format!("{name}: TOO DEEP")))];
        }
        let mut live = vec![st];
        let mut done = Vec::new();
        for rule in &chain.rules {
            let mut next = Vec::new();
            for mut s in live {
                let text = format!("{name}: {}", rule.render(self.family));
                s.chain = name.to_owned();
                s.lookups.clear();
                for (flow, s) in self.eval_rule(&rule.exprs, s, &text, depth) {
                    match flow {
                        Flow::Next => next.push(s),
                        other => done.push((other, s)),
                    }
                }
            }
            live = next;
            if live.is_empty() {
                break;
            }
        }
        done.extend(live.into_iter().map(|s| (Flow::Return, s)));
        done
    }

    /// Evaluates one rule; the rule's text is recorded once it matches fully
    /// or reaches a verdict.
    fn eval_rule(&self, exprs: &[Expr], st: State, text: &str, depth: usize) -> Vec<(Flow, State)> {
        let Some((expr, rest)) = exprs.split_first() else {
            return vec![(Flow::Next, note(st, text.to_owned()))];
        };
        let mut out = Vec::new();
        for step in self.eval_expr(expr, st, text, depth) {
            match step {
                Step::NoMatch(s) => out.push((Flow::Next, s)),
                Step::Match(s) => out.extend(self.eval_rule(rest, s, text, depth)),
                Step::End(flow, s) => out.push((flow, s)),
            }
        }
        out
    }

    fn eval_expr(&self, expr: &Expr, mut st: State, text: &str, depth: usize) -> Vec<Step> {
        let test = |ok: bool, st: State| {
            if ok {
                Step::Match(st)
            } else {
                Step::NoMatch(st)
            }
        };
        match expr {
            Expr::Cmp {
                selector,
                op,
                value,
            } => self
                .values(*selector, &st)
                .into_iter()
                .map(|v| {
                    let ok = match op {
                        CmpOp::Eq => value.matches(&v),
                        CmpOp::Ne => !value.matches(&v),
                        CmpOp::Lt => matches!((v, value), (Value::Int(a), Value::Int(b)) if a < *b),
                    };
                    test(ok, st.clone())
                })
                .collect(),
            Expr::Lookup { key, set, negate } => {
                let keys = self.keys(key, &st);
                let found = self.lookup(set, &keys);
                keys.into_iter()
                    .zip(found)
                    .map(|(k, found)| {
                        let hit = found.is_some();
                        let st = looked_up(st.clone(), set, k, found, 1);
                        test(hit != *negate, st)
                    })
                    .collect()
            }
            Expr::FibLocal(FibAddr::Saddr) => vec![test(self.is_local(st.src), st)],
            Expr::FibLocal(FibAddr::Daddr) => vec![test(self.is_local(st.dst), st)],
            Expr::IifName { name, negate } => {
                let iif = st.iif.clone().unwrap_or_default();
                let hit = match name.strip_suffix('*') {
                    Some(prefix) => iif.starts_with(prefix),
                    None => iif == *name,
                };
                vec![test(hit != *negate, st)]
            }
            Expr::CtStateNew => vec![Step::Match(st)],
            Expr::CtStatusDnat => vec![test(st.dnat.is_some(), st)],
            Expr::MarkAnd { mask, nonzero } => vec![test((st.mark & mask != 0) == *nonzero, st)],
            Expr::MarkOr(bits) => {
                st.mark |= bits;
                vec![Step::Match(st)]
            }
            Expr::MarkXor(bits) => {
                st.mark ^= bits;
                vec![Step::Match(st)]
            }
            Expr::Verdict(v) => self.verdict(v, note(st, text.to_owned()), depth),
            Expr::Vmap { key, map } => {
                let mut out = Vec::new();
                let keys = self.keys(key, &st);
                let forks = keys.len() as u64;
                let found = self.lookup(map, &keys);
                for (k, found) in keys.into_iter().zip(found) {
                    let shown = show_key(&k);
                    let value = found.as_ref().and_then(|e| e.value.clone());
                    let s = looked_up(st.clone(), map, k, found, forks);
                    match &value {
                        Some(ElementValue::Verdict(v)) => {
                            let s = note(s, format!("{text}  [{shown} → {v}]"));
                            out.extend(self.verdict(v, s, depth));
                        }
                        _ => out.push(Step::NoMatch(s)),
                    }
                }
                out
            }
            Expr::Reject => vec![Step::End(Flow::Reject, note(st, text.to_owned()))],
            Expr::Counter | Expr::NftraceOn | Expr::Log { .. } => vec![Step::Match(st)],
            // A trace is one packet: within any rate.
            Expr::Limit { .. } => vec![Step::Match(st)],
            Expr::Masquerade => {
                st.masq = true;
                vec![Step::End(Flow::Accept, note(st, text.to_owned()))]
            }
            Expr::Dnat(DnatTarget::Addr(a, p)) => {
                st.dst = *a;
                st.dport = *p;
                st.dnat = Some((*a, *p));
                vec![Step::End(Flow::Accept, note(st, text.to_owned()))]
            }
            Expr::Dnat(DnatTarget::Map { key, map }) => {
                let mut out = Vec::new();
                let keys = self.keys(key, &st);
                let forks = keys.len() as u64;
                let found = self.lookup(map, &keys);
                for (k, found) in keys.into_iter().zip(found) {
                    let target = found.as_ref().and_then(|e| match &e.value {
                        Some(ElementValue::Data(d)) => match d.as_slice() {
                            [Value::Addr(a), Value::Port(p)] => Some((*a, *p)),
                            _ => None,
                        },
                        _ => None,
                    });
                    let shown = show_key(&k);
                    let s = looked_up(st.clone(), map, k, found, forks);
                    match target {
                        Some((a, p)) => {
                            let mut s = note(s, format!("{text}  [{shown} → {a} . {p}]"));
                            s.dst = a;
                            s.dport = p;
                            s.dnat = Some((a, p));
                            out.push(Step::End(Flow::Accept, s));
                        }
                        None => out.push(Step::NoMatch(s)),
                    }
                }
                out
            }
            Expr::Update {
                set,
                key,
                timeout: _,
                value,
            } => {
                let resolve = |parts: &[KeyPart], st: &State| -> Vec<Value> {
                    parts
                        .iter()
                        .map(|p| match p {
                            KeyPart::Const(v) => *v,
                            KeyPart::Field(s) => self
                                .values(*s, st)
                                .into_iter()
                                .next()
                                .unwrap_or(Value::Int(0)),
                        })
                        .collect()
                };
                let k = resolve(key, &st);
                let v = resolve(value, &st);
                let element = if v.is_empty() {
                    Element::key(k)
                } else {
                    Element::map(k, ElementValue::Data(v))
                };
                st.updates.push((set.clone(), element));
                vec![Step::Match(st)]
            }
        }
    }

    fn verdict(&self, v: &Verdict, st: State, depth: usize) -> Vec<Step> {
        match v {
            Verdict::Accept => vec![Step::End(Flow::Accept, st)],
            Verdict::Drop => vec![Step::End(Flow::Drop, st)],
            Verdict::Return => vec![Step::End(Flow::Return, st)],
            Verdict::Jump(c) => self
                .eval_chain(c, st, depth + 1)
                .into_iter()
                .map(|(flow, s)| match flow {
                    Flow::Return | Flow::Next => Step::End(Flow::Next, s),
                    other => Step::End(other, s),
                })
                .collect(),
            Verdict::Goto(c) => self
                .eval_chain(c, st, depth + 1)
                .into_iter()
                .map(|(flow, s)| match flow {
                    Flow::Next => Step::End(Flow::Return, s),
                    other => Step::End(other, s),
                })
                .collect(),
        }
    }

    /// The element each key matches in the set `name` (none if the
    /// table has no such set).
    fn lookup(&self, name: &str, keys: &[Vec<Value>]) -> Vec<Option<Element>> {
        match self.table.sets.get(name) {
            Some(s) => self.elements.find(s, keys),
            None => vec![None; keys.len()],
        }
    }

    /// The possible values of a selector (several for numgen).
    fn values(&self, sel: Selector, st: &State) -> Vec<Value> {
        match sel {
            Selector::Saddr => vec![Value::Addr(st.src)],
            Selector::Daddr => vec![Value::Addr(st.dst)],
            Selector::L4Proto => vec![Value::Proto(st.proto)],
            Selector::Dport => vec![Value::Port(st.dport)],
            Selector::Sport => vec![Value::Port(st.sport)],
            Selector::CtOriginalDaddr => vec![Value::Addr(st.orig_dst)],
            Selector::CtOriginalDport => vec![Value::Port(st.orig_dport)],
            // After DNAT the replies come from the endpoint.
            Selector::CtReplySaddr => vec![Value::Addr(st.dnat.map_or(st.orig_dst, |(a, _)| a))],
            Selector::CtReplySport => vec![Value::Port(st.dnat.map_or(st.orig_dport, |(_, p)| p))],
            Selector::Numgen { modulus, offset } => (0..modulus.min(MAX_FORK))
                .map(|i| Value::Int(offset.saturating_add(i)))
                .collect(),
        }
    }

    /// Every possible key (the cartesian product over numgen alternatives).
    fn keys(&self, sels: &[Selector], st: &State) -> Vec<Vec<Value>> {
        let mut keys = vec![Vec::new()];
        for s in sels {
            let vals = self.values(*s, st);
            keys = keys
                .into_iter()
                .flat_map(|k| {
                    vals.iter().map(move |v| {
                        let mut k = k.clone();
                        k.push(*v);
                        k
                    })
                })
                .collect();
        }
        keys
    }
}

enum Step {
    NoMatch(State),
    Match(State),
    End(Flow, State),
}

fn note(mut st: State, line: String) -> State {
    if st.rules.last() != Some(&line) {
        // The step keeps the rule as nft prints it, without the chain
        // name and the matched element that `rules` carry.
        let rule = line
            .strip_prefix(&format!("{}: ", st.chain))
            .unwrap_or(&line);
        let rule = rule.split("  [").next().unwrap_or(rule).to_owned();
        st.steps.push(TraceStep {
            hook: st.hook,
            chain: st.chain.clone(),
            rule,
            lookups: std::mem::take(&mut st.lookups),
        });
        st.rules.push(line);
    }
    st
}

/// Records a lookup; `forks` is how many keys the packet could build (a
/// random choice among them divides the path's probability).
fn looked_up(
    mut st: State,
    set: &str,
    key: Vec<Value>,
    found: Option<Element>,
    forks: u64,
) -> State {
    st.one_in = st.one_in.saturating_mul(forks.max(1));
    st.lookups.push(TraceLookup {
        set: set.to_owned(),
        key,
        found,
    });
    st
}

fn finish(st: State, disposition: Disposition) -> TracePath {
    TracePath {
        disposition,
        dnat: st.dnat,
        masqueraded: st.masq,
        rules: st.rules,
        updates: st.updates,
        steps: st.steps,
        one_in: st.one_in,
    }
}

fn show_key(k: &[Value]) -> String {
    crate::ir::join(k.iter().map(|v| v.to_string()), " . ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::ir::{Chain, ChainType, DataType, Rule, Set};
    use crate::memory::{MemoryBackend, goto};
    use crate::tx::Transaction;

    // Address plan: node 192.168.0.2; pods 10.0.0.0/8; service 172.30.0.41:80
    // with endpoints 10.180.0.1:80 and 10.180.0.2:80; external client 203.0.113.2.

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn svc_key(a: &str, port: u16) -> Vec<Value> {
        vec![
            Value::Addr(ip(a)),
            Value::Proto(L4Proto::Tcp),
            Value::Port(port),
        ]
    }

    fn ruleset() -> MemoryBackend {
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add_table(None);
        tx.add_chain(Chain::base("filter-in", ChainType::Filter, Hook::Input, 0));
        tx.add_chain(Chain::base(
            "filter-fwd",
            ChainType::Filter,
            Hook::Forward,
            0,
        ));
        tx.add_chain(Chain::base(
            "nat-pre",
            ChainType::Nat,
            Hook::Prerouting,
            -100,
        ));
        tx.add_chain(Chain::base("nat-out", ChainType::Nat, Hook::Output, -100));
        tx.add_chain(Chain::base(
            "nat-post",
            ChainType::Nat,
            Hook::Postrouting,
            100,
        ));
        tx.add_chain(Chain::regular("services"));
        tx.add_chain(Chain::regular("pick-2"));
        tx.add_chain(Chain::regular("rej"));
        let svc = vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ];
        tx.add_set(Set::map("vips", svc.clone(), vec![DataType::Verdict]));
        let mut epkey = svc.clone();
        epkey.push(DataType::Numgen);
        tx.add_set(Set::map(
            "eps",
            epkey,
            vec![DataType::Ipv4Addr, DataType::InetService],
        ));
        tx.add_set(Set::map("blocked", svc.clone(), vec![DataType::Verdict]));
        tx.add_set(Set::set("pods", vec![DataType::Ipv4Addr]).with_interval());
        let sel = vec![Selector::Daddr, Selector::L4Proto, Selector::Dport];
        for chain in ["nat-pre", "nat-out"] {
            tx.add_rule(
                chain,
                Rule::new(vec![Expr::Verdict(Verdict::Jump("services".into()))]),
            );
        }
        tx.add_rule(
            "services",
            Rule::new(vec![
                Expr::Lookup {
                    key: vec![Selector::Saddr],
                    set: "pods".into(),
                    negate: true,
                },
                Expr::MarkOr(0x4000),
            ]),
        );
        tx.add_rule(
            "services",
            Rule::new(vec![Expr::Vmap {
                key: sel.clone(),
                map: "vips".into(),
            }]),
        );
        let mut k = sel.clone();
        k.push(Selector::Numgen {
            modulus: 2,
            offset: 0,
        });
        tx.add_rule(
            "pick-2",
            Rule::new(vec![
                Expr::Cmp {
                    selector: Selector::L4Proto,
                    op: CmpOp::Eq,
                    value: Value::Proto(L4Proto::Tcp),
                },
                Expr::Dnat(DnatTarget::Map {
                    key: k,
                    map: "eps".into(),
                }),
            ]),
        );
        tx.add_rule("rej", Rule::new(vec![Expr::Reject]));
        for chain in ["filter-in", "filter-fwd"] {
            tx.add_rule(
                chain,
                Rule::new(vec![
                    Expr::CtStateNew,
                    Expr::Vmap {
                        key: sel.clone(),
                        map: "blocked".into(),
                    },
                ]),
            );
        }
        tx.add_rule(
            "nat-post",
            Rule::new(vec![
                Expr::MarkAnd {
                    mask: 0x4000,
                    nonzero: true,
                },
                Expr::Masquerade,
            ]),
        );
        tx.add_element(
            "pods",
            Element::key(vec![Value::Prefix("10.0.0.0/8".parse().unwrap())]),
        );
        tx.add_element(
            "vips",
            Element::map(svc_key("172.30.0.41", 80), goto("pick-2")),
        );
        for (slot, ep) in [(0, "10.180.0.1"), (1, "10.180.0.2")] {
            let mut key = svc_key("172.30.0.41", 80);
            key.push(Value::Int(slot));
            tx.add_element(
                "eps",
                Element::map(
                    key,
                    ElementValue::Data(vec![Value::Addr(ip(ep)), Value::Port(80)]),
                ),
            );
        }
        tx.add_element(
            "blocked",
            Element::map(svc_key("172.30.0.50", 80), goto("rej")),
        );
        tx.add_element(
            "blocked",
            Element::map(
                svc_key("192.168.0.2", 9999),
                ElementValue::Verdict(Verdict::Drop),
            ),
        );
        let mut nft = MemoryBackend::new();
        nft.run(&tx).unwrap();
        nft
    }

    fn trace(nft: &MemoryBackend, src: &str, dst: &str, dport: u16, iif: Option<&str>) -> Trace {
        let t = nft.get(Family::Ip, "t").unwrap();
        Tracer::new(t, Family::Ip, &[ip("192.168.0.2")]).trace(&Packet {
            src: ip(src),
            dst: ip(dst),
            proto: L4Proto::Tcp,
            dport,
            sport: 40000,
            iif: iif.map(str::to_owned),
        })
    }

    #[test]
    fn forks_over_every_endpoint() {
        let nft = ruleset();
        let t = trace(&nft, "10.0.0.2", "172.30.0.41", 80, Some("eth0"));
        assert_eq!(
            t.output(),
            "10.180.0.1:80, 10.180.0.2:80",
            "{}",
            t.explain()
        );
        assert_eq!(t.masqueraded(), Some(false));
        assert_eq!(t.paths.len(), 2);
        assert!(
            t.paths[0].rules.iter().any(|r| r.starts_with("services: ")),
            "{}",
            t.explain()
        );
    }

    #[test]
    fn steps_name_hook_chain_lookups_and_each_choice_halves_the_path() {
        let nft = ruleset();
        let t = trace(&nft, "10.0.0.2", "172.30.0.41", 80, Some("eth0"));
        assert_eq!(t.paths.len(), 2, "{}", t.explain());
        for p in &t.paths {
            assert_eq!(p.one_in, 2, "one of two endpoints: {}", t.explain());
            let dispatch = p
                .steps
                .iter()
                .find(|s| s.chain == "services" && s.rule.contains("vmap @vips"))
                .expect("the service dispatch is a step");
            assert_eq!(dispatch.hook, Hook::Prerouting);
            assert_eq!(dispatch.lookups.len(), 1);
            assert_eq!(dispatch.lookups[0].set, "vips");
            assert_eq!(dispatch.lookups[0].key, svc_key("172.30.0.41", 80));
            assert!(dispatch.lookups[0].found.is_some());
            let pick = p.steps.iter().find(|s| s.chain == "pick-2").unwrap();
            assert!(
                !pick.rule.contains("  ["),
                "the rule as nft prints it: {}",
                pick.rule
            );
            let chosen = pick.lookups[0].found.as_ref().unwrap();
            assert_eq!(
                chosen.value,
                Some(ElementValue::Data(vec![
                    Value::Addr(p.dnat.unwrap().0),
                    Value::Port(80)
                ]))
            );
        }
        // A pod source matches the mark rule's negated lookup: the step
        // records the lookup that found nothing.
        let marks = trace(&nft, "192.168.9.9", "172.30.0.41", 80, Some("eth0"));
        let mark = marks.paths[0]
            .steps
            .iter()
            .find(|s| s.lookups.iter().any(|l| l.set == "pods"))
            .expect("the masquerade mark rule matched");
        assert!(
            mark.lookups
                .iter()
                .any(|l| l.set == "pods" && l.found.is_none())
        );
        // Untouched traffic is certain.
        let other = trace(&nft, "10.0.0.2", "172.30.0.99", 80, Some("eth0"));
        assert_eq!(other.paths[0].one_in, 1);
    }

    #[test]
    fn marks_become_masquerade_in_postrouting() {
        let nft = ruleset();
        let t = trace(&nft, "203.0.113.2", "172.30.0.41", 80, Some("eth0"));
        assert_eq!(t.masqueraded(), Some(true), "{}", t.explain());
        // Node-originated traffic goes through the output hook.
        let t = trace(&nft, "192.168.0.2", "172.30.0.41", 80, None);
        assert_eq!(t.output(), "10.180.0.1:80, 10.180.0.2:80");
        assert_eq!(t.masqueraded(), Some(true));
    }

    #[test]
    fn reports_reject_drop_and_untouched() {
        let nft = ruleset();
        assert_eq!(
            trace(&nft, "10.0.0.2", "172.30.0.50", 80, Some("eth0")).output(),
            "REJECT"
        );
        assert_eq!(
            trace(&nft, "10.0.0.2", "192.168.0.2", 9999, Some("eth0")).output(),
            "DROP"
        );
        let t = trace(&nft, "10.0.0.2", "10.0.0.3", 80, Some("eth0"));
        assert_eq!(t.output(), "");
        assert_eq!(t.paths.len(), 1);
        assert_eq!(t.paths[0].disposition, Disposition::Accept);
    }

    #[test]
    fn goto_returns_to_the_caller_of_the_jump() {
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add_table(None);
        tx.add_chain(Chain::base("f", ChainType::Filter, Hook::Input, 0));
        tx.add_chain(Chain::regular("a"));
        tx.add_chain(Chain::regular("b"));
        tx.add_rule(
            "f",
            Rule::new(vec![Expr::Verdict(Verdict::Jump("a".into()))]),
        );
        tx.add_rule("f", Rule::new(vec![Expr::Reject]));
        tx.add_rule(
            "a",
            Rule::new(vec![Expr::Verdict(Verdict::Goto("b".into()))]),
        );
        tx.add_rule("a", Rule::new(vec![Expr::Verdict(Verdict::Drop)]));
        tx.add_rule("b", Rule::new(vec![Expr::MarkOr(1)]));
        let mut nft = MemoryBackend::new();
        nft.run(&tx).unwrap();
        // a's drop is skipped (goto does not come back), f's reject runs.
        assert_eq!(
            trace(&nft, "1.1.1.1", "192.168.0.2", 1, Some("eth0")).output(),
            "REJECT"
        );
    }

    #[test]
    fn iifname_wildcards_and_updates() {
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add_table(None);
        tx.add_chain(Chain::base("f", ChainType::Filter, Hook::Input, 0));
        tx.add_set(
            Set::map("aff", vec![DataType::Ipv4Addr], vec![DataType::InetService])
                .with_timeout(60, 1024),
        );
        tx.add_rule(
            "f",
            Rule::new(vec![
                Expr::IifName {
                    name: "veth*".into(),
                    negate: false,
                },
                Expr::Update {
                    set: "aff".into(),
                    key: vec![KeyPart::Field(Selector::Saddr)],
                    timeout: None,
                    value: vec![KeyPart::Const(Value::Port(7))],
                },
                Expr::Verdict(Verdict::Drop),
            ]),
        );
        let mut nft = MemoryBackend::new();
        nft.run(&tx).unwrap();
        let t = trace(&nft, "10.0.0.2", "192.168.0.2", 1, Some("veth12"));
        assert_eq!(t.output(), "DROP");
        assert_eq!(
            t.paths[0].updates,
            vec![(
                "aff".to_string(),
                Element::map(
                    vec![Value::Addr(ip("10.0.0.2"))],
                    ElementValue::Data(vec![Value::Port(7)])
                )
            )]
        );
        assert_eq!(
            trace(&nft, "10.0.0.2", "192.168.0.2", 1, Some("eth0")).output(),
            ""
        );
    }
}
