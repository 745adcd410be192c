//! Round trips through the netlink encoding without a kernel: every
//! expression and object kind verdict writes comes back as it went in, and
//! arbitrary bytes are refused, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::expr;
use super::objects::{self, Batch};
use super::wire::{Attrs, Writer, messages};
use crate::ir::*;
use crate::tx::{Op, Transaction};

fn sets(family: Family) -> BTreeMap<String, Set> {
    let a = family.addr_type();
    let svc = vec![a, DataType::InetProto, DataType::InetService];
    let mut allow = svc.clone();
    allow.push(a);
    let mut aff = vec![a];
    aff.extend(svc.iter().copied());
    [
        Set::set("ips", vec![a]).with_comment("addresses"),
        Set::map("vmap", svc.clone(), vec![DataType::Verdict]).with_counters(),
        Set::set("allow", allow)
            .with_interval()
            .with_comment("ranges"),
        Set::map("affinity", aff, vec![a, DataType::InetService]).with_timeout(10800, 65536),
        Set::map(
            "endpoints",
            vec![a, DataType::PortOf(L4Proto::Udp), DataType::Numgen],
            vec![a, DataType::PortOf(L4Proto::Udp)],
        )
        .with_counters(),
        Set::map(
            "ports",
            vec![DataType::InetProto, DataType::InetService],
            vec![DataType::Verdict],
        ),
        Set::set(
            "traffic",
            vec![
                a,
                DataType::InetProto,
                DataType::InetService,
                a,
                DataType::InetService,
            ],
        )
        .with_counters(),
    ]
    .into_iter()
    .map(|s| (s.name.clone(), s))
    .collect()
}

fn addr(family: Family, n: u8) -> std::net::IpAddr {
    match family {
        Family::Ip => format!("10.0.0.{n}").parse().unwrap(),
        Family::Ip6 => format!("fd00::{n}").parse().unwrap(),
    }
}

fn net(family: Family, bits: u8) -> Value {
    let s = match family {
        Family::Ip => format!("10.128.0.0/{bits}"),
        Family::Ip6 => format!("fd00:8000::/{bits}"),
    };
    Value::Prefix(s.parse::<ipnet::IpNet>().unwrap().trunc())
}

/// Every expression kind, in the combinations verdict's layout uses.
fn rules(family: Family) -> Vec<Rule> {
    use Expr::*;
    let svc = vec![Selector::Daddr, Selector::L4Proto, Selector::Dport];
    let mut allow = svc.clone();
    allow.push(Selector::Saddr);
    vec![
        Rule::new(vec![
            CtStateNew,
            Verdict(crate::ir::Verdict::Jump("c".into())),
        ]),
        Rule::new(vec![
            CtStateNew,
            CtStatusDnat,
            Verdict(crate::ir::Verdict::Goto("c".into())),
        ]),
        Rule::new(vec![
            Lookup {
                key: vec![Selector::Daddr],
                set: "ips".into(),
                negate: false,
            },
            Cmp {
                selector: Selector::Saddr,
                op: CmpOp::Ne,
                value: net(family, 8),
            },
            MarkOr(0x4000),
        ])
        .with_comment("masquerade"),
        Rule::new(vec![
            Cmp {
                selector: Selector::Daddr,
                op: CmpOp::Eq,
                value: net(family, 20),
            },
            Verdict(crate::ir::Verdict::Drop),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::Saddr,
                op: CmpOp::Eq,
                value: Value::Addr(addr(family, 3)),
            },
            Verdict(crate::ir::Verdict::Accept),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::Daddr,
                op: CmpOp::Eq,
                value: net(family, 0),
            },
            Verdict(crate::ir::Verdict::Return),
        ]),
        Rule::new(vec![Vmap {
            key: svc.clone(),
            map: "vmap".into(),
        }]),
        Rule::new(vec![
            Lookup {
                key: svc.clone(),
                set: "vmap".into(),
                negate: false,
            },
            Lookup {
                key: allow,
                set: "allow".into(),
                negate: true,
            },
            Verdict(crate::ir::Verdict::Drop),
        ]),
        Rule::new(vec![
            Lookup {
                key: vec![Selector::Daddr],
                set: "ips".into(),
                negate: false,
            },
            Reject,
        ]),
        Rule::new(vec![
            MarkAnd {
                mask: 0x4000,
                nonzero: true,
            },
            MarkXor(0x4000),
            Masquerade,
        ]),
        Rule::new(vec![
            MarkAnd {
                mask: 0x8000,
                nonzero: false,
            },
            Verdict(crate::ir::Verdict::Accept),
        ]),
        Rule::new(vec![FibLocal(FibAddr::Saddr), MarkOr(0x4000)]).with_comment("local"),
        Rule::new(vec![
            FibLocal(FibAddr::Daddr),
            Verdict(crate::ir::Verdict::Accept),
        ]),
        Rule::new(vec![
            IifName {
                name: "cbr0".into(),
                negate: false,
            },
            Verdict(crate::ir::Verdict::Goto("c".into())),
        ]),
        Rule::new(vec![
            IifName {
                name: "veth*".into(),
                negate: true,
            },
            Verdict(crate::ir::Verdict::Accept),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Udp),
            },
            Dnat(DnatTarget::Map {
                key: vec![
                    Selector::Daddr,
                    Selector::Dport,
                    Selector::Numgen {
                        modulus: 3,
                        offset: 0,
                    },
                ],
                map: "endpoints".into(),
            }),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Tcp),
            },
            Dnat(DnatTarget::Map {
                key: vec![
                    Selector::Daddr,
                    Selector::Dport,
                    Selector::Numgen {
                        modulus: 1,
                        offset: 1 << 24,
                    },
                ],
                map: "endpoints".into(),
            }),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Sctp),
            },
            Dnat(DnatTarget::Map {
                key: vec![
                    Selector::Saddr,
                    Selector::Daddr,
                    Selector::L4Proto,
                    Selector::Dport,
                ],
                map: "affinity".into(),
            }),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Tcp),
            },
            Dnat(DnatTarget::Addr(addr(family, 9), 8080)),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Tcp),
            },
            Update {
                set: "affinity".into(),
                key: vec![
                    KeyPart::Field(Selector::Saddr),
                    KeyPart::Field(Selector::CtOriginalDaddr),
                    KeyPart::Field(Selector::L4Proto),
                    KeyPart::Field(Selector::CtOriginalDport),
                ],
                timeout: Some(600),
                value: vec![
                    KeyPart::Field(Selector::Daddr),
                    KeyPart::Field(Selector::Dport),
                ],
            },
        ]),
        Rule::new(vec![Update {
            set: "affinity".into(),
            key: vec![
                KeyPart::Field(Selector::Saddr),
                KeyPart::Const(Value::Addr(addr(family, 7))),
                KeyPart::Const(Value::Proto(L4Proto::Tcp)),
                KeyPart::Const(Value::Port(80)),
            ],
            timeout: None,
            value: vec![
                KeyPart::Field(Selector::Daddr),
                KeyPart::Const(Value::Port(81)),
            ],
        }]),
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Udp),
            },
            Lookup {
                key: vec![
                    Selector::CtOriginalDaddr,
                    Selector::L4Proto,
                    Selector::CtOriginalDport,
                ],
                set: "vmap".into(),
                negate: false,
            },
        ]),
        // A rule that counts what it rejects.
        Rule::new(vec![
            Lookup {
                key: vec![Selector::Daddr],
                set: "ips".into(),
                negate: false,
            },
            crate::ir::Expr::Counter,
            Reject,
        ])
        .with_comment("counted"),
        // A rule that tells the flow stream why it rejects, at a bounded
        // rate.
        Rule::new(vec![
            crate::ir::Expr::Limit {
                rate: 200,
                burst: 400,
            },
            crate::ir::Expr::Log {
                prefix: "verdict rejected no-endpoints".into(),
                group: 7331,
            },
            Reject,
        ]),
        // The probe `trace --live` marks.
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Tcp),
            },
            crate::ir::Expr::NftraceOn,
        ]),
        // Per-connection traffic: the entry before DNAT and the endpoint
        // the replies come from.
        Rule::new(vec![
            Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Sctp),
            },
            Lookup {
                key: vec![
                    Selector::CtOriginalDaddr,
                    Selector::L4Proto,
                    Selector::CtOriginalDport,
                    Selector::CtReplySaddr,
                    Selector::CtReplySport,
                ],
                set: "traffic".into(),
                negate: false,
            },
            Verdict(crate::ir::Verdict::Return),
        ]),
        Rule::new(vec![
            Cmp {
                selector: Selector::Dport,
                op: CmpOp::Lt,
                value: Value::Port(1024),
            },
            Verdict(crate::ir::Verdict::Accept),
        ]),
        Rule::new(vec![
            Lookup {
                key: vec![Selector::Daddr],
                set: "ips".into(),
                negate: false,
            },
            Vmap {
                key: vec![Selector::L4Proto, Selector::Dport],
                map: "ports".into(),
            },
        ]),
    ]
}

/// Writes a transaction's messages and returns them with their types.
fn written(tx: &Transaction, defs: &BTreeMap<String, Set>) -> Vec<u8> {
    let mut w = Writer::new();
    let mut b = Batch {
        w: &mut w,
        family: tx.family(),
        table: tx.table(),
        seq: 0,
        sets: defs,
        origin: Vec::new(),
        next_set_id: 0,
    };
    let ops = tx.ops();
    let is_add = |op: &Op| matches!(op, Op::AddElement(..));
    for (i, op) in ops.iter().enumerate() {
        if !is_add(op) {
            b.op(i, op).unwrap();
        }
    }
    // The additions, one run on one set.
    if let Some(start) = ops.iter().position(is_add) {
        let end = start + ops[start..].iter().take_while(|op| is_add(op)).count();
        assert!(!ops[end..].iter().any(is_add), "the additions are one run");
        if let Op::AddElement(set, _) = &ops[start] {
            b.elements(tx.set_name(*set), true, start, &ops[start..end])
                .unwrap();
        }
    }
    w.bytes().to_vec()
}

#[test]
fn every_expression_kind_round_trips() {
    for family in [Family::Ip, Family::Ip6] {
        let defs = sets(family);
        let mut tx = Transaction::new(family, "t");
        for r in rules(family) {
            tx.add_rule("c", r);
        }
        let bytes = written(&tx, &defs);
        let lookup = |n: &str| defs.get(n);
        let got: Vec<Rule> = messages(&bytes)
            .map(|m| {
                let (_, a) = m.nfgen().unwrap();
                let (chain, r, _, _) = objects::rule(family, a, &lookup).unwrap();
                assert_eq!(chain, "c");
                r
            })
            .collect();
        assert_eq!(got, rules(family), "{family}");
    }
}

#[test]
fn chains_sets_and_elements_round_trip() {
    for family in [Family::Ip, Family::Ip6] {
        let defs = sets(family);
        let mut tx = Transaction::new(family, "t");
        let chains = vec![
            Chain::regular("plain"),
            Chain::regular("noted").with_comment("a comment"),
            Chain::base("nat-pre", ChainType::Nat, Hook::Prerouting, -100),
            Chain::base("filter-out", ChainType::Filter, Hook::Output, -110).with_comment("x"),
            Chain::base("post", ChainType::Nat, Hook::Postrouting, 100),
            Chain::base("in", ChainType::Filter, Hook::Input, 0),
            Chain::base("fwd", ChainType::Filter, Hook::Forward, 0),
        ];
        for c in &chains {
            tx.add_chain(c.clone());
        }
        for s in defs.values() {
            tx.add_set(s.clone());
        }
        let bytes = written(&tx, &defs);
        let mut got_chains = Vec::new();
        let mut got_sets = Vec::new();
        for m in messages(&bytes) {
            let (_, a) = m.nfgen().unwrap();
            match (m.kind & 0xff) as u8 {
                objects::NEWCHAIN => got_chains.push(objects::chain(a).unwrap()),
                objects::NEWSET => got_sets.push(objects::set(a).unwrap()),
                other => panic!("message {other}"),
            }
        }
        assert_eq!(got_chains, chains);
        assert_eq!(got_sets, defs.values().cloned().collect::<Vec<_>>());

        // Elements of every kind of set, with and without comments.
        let a = |n| Value::Addr(addr(family, n));
        let cases: Vec<(&str, Vec<Element>)> = vec![
            (
                "ips",
                vec![
                    Element::key(vec![a(1)]),
                    Element::key(vec![a(2)]).with_comment("two"),
                ],
            ),
            (
                "vmap",
                vec![
                    Element::map(
                        vec![a(1), Value::Proto(L4Proto::Tcp), Value::Port(80)],
                        ElementValue::Verdict(Verdict::Goto("endpoints-2".into())),
                    )
                    .with_comment("ns/svc:http"),
                ],
            ),
            (
                "allow",
                vec![
                    Element::key(vec![
                        a(1),
                        Value::Proto(L4Proto::Tcp),
                        Value::Port(80),
                        net(family, 9),
                    ]),
                    Element::key(vec![
                        a(1),
                        Value::Proto(L4Proto::Sctp),
                        Value::Port(80),
                        Value::Prefix(ipnet::IpNet::from(addr(family, 5))),
                    ]),
                ],
            ),
            (
                "endpoints",
                vec![Element::map(
                    vec![a(1), Value::Port(53), Value::Int(2)],
                    ElementValue::Data(vec![a(4), Value::Port(5353)]),
                )],
            ),
            (
                "ports",
                vec![Element::map(
                    vec![Value::Proto(L4Proto::Udp), Value::Port(30000)],
                    ElementValue::Verdict(Verdict::Jump("x".into())),
                )],
            ),
        ];
        for (set, elements) in cases {
            let mut tx = Transaction::new(family, "t");
            for e in &elements {
                tx.add_element(set, e.clone());
            }
            let bytes = written(&tx, &defs);
            let def = &defs[set];
            let mut items = objects::Items::new();
            for m in messages(&bytes) {
                let (_, a) = m.nfgen().unwrap();
                objects::element_items(def, a.nested(3).unwrap(), &mut items).unwrap();
            }
            let state = objects::set_state(def, items);
            let want: BTreeMap<_, _> = elements.into_iter().map(|e| (e.key.clone(), e)).collect();
            assert_eq!(state.elements, want, "{family} {set}");
        }
    }
}

#[test]
fn long_element_lists_are_split_below_netlink_s_attribute_limit() {
    let defs = sets(Family::Ip);
    let mut tx = Transaction::new(Family::Ip, "t");
    for i in 0..5000u32 {
        let [_, b, c, d] = i.to_be_bytes();
        tx.add_element(
            "vmap",
            Element::map(
                vec![
                    Value::Addr(std::net::Ipv4Addr::new(10, b, c, d).into()),
                    Value::Proto(L4Proto::Tcp),
                    Value::Port(80),
                ],
                ElementValue::Verdict(Verdict::Goto("endpoints-12345".into())),
            )
            .with_comment("x".repeat(COMMENT_LENGTH_MAX)),
        );
    }
    let bytes = written(&tx, &defs);
    let msgs: Vec<_> = messages(&bytes).collect();
    assert!(msgs.len() > 5, "{} messages", msgs.len());
    let mut items = objects::Items::new();
    for m in &msgs {
        assert!(m.payload.len() < 65536, "{}", m.payload.len());
        let (_, a) = m.nfgen().unwrap();
        objects::element_items(&defs["vmap"], a.nested(3).unwrap(), &mut items).unwrap();
    }
    let state = objects::set_state(&defs["vmap"], items);
    assert_eq!(state.elements.len(), 5000);
    assert!(
        state
            .elements
            .keys()
            .zip(state.elements.keys().skip(1))
            .all(|(a, b)| a < b),
        "sorted by key"
    );
}

#[test]
fn foreign_expressions_are_refused() {
    // `log` in a rule: not verdict's.
    let mut w = Writer::new();
    let n = w.open(1);
    w.str(1, "log");
    let d = w.open(2);
    w.close(d).unwrap();
    w.close(n).unwrap();
    let lookup = |_: &str| None;
    let e = expr::decode(Family::Ip, Attrs(w.bytes()), &lookup).unwrap_err();
    assert!(e.to_string().contains("log"), "{e}");
}

proptest! {
    #[test]
    fn arbitrary_bytes_are_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let defs = sets(Family::Ip);
        let lookup = |n: &str| defs.get(n);
        let _ = expr::decode(Family::Ip, Attrs(&bytes), &lookup);
        let _ = expr::decode(Family::Ip6, Attrs(&bytes), &lookup);
        let _ = objects::set(Attrs(&bytes));
        let _ = objects::chain(Attrs(&bytes));
        let _ = objects::rule(Family::Ip, Attrs(&bytes), &lookup);
        for def in defs.values() {
            let mut items = objects::Items::new();
            let _ = objects::element_items(def, Attrs(&bytes), &mut items);
            let _ = objects::set_state(def, items);
        }
        for m in messages(&bytes) {
            let _ = m.nfgen();
        }
    }

    #[test]
    fn mutated_rules_are_refused_without_a_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let defs = sets(Family::Ip6);
        let mut tx = Transaction::new(Family::Ip6, "t");
        for r in rules(Family::Ip6) {
            tx.add_rule("c", r);
        }
        let mut bytes = written(&tx, &defs);
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= b;
        }
        let lookup = |n: &str| defs.get(n);
        for m in messages(&bytes) {
            if let Some((_, a)) = m.nfgen() {
                let _ = objects::rule(Family::Ip6, a, &lookup);
            }
        }
    }
}

#[test]
fn a_refused_message_names_the_operations_it_carried() {
    let mut tx = Transaction::new(Family::Ip, "verdict");
    tx.add_table(None);
    for port in [80, 81, 82] {
        tx.add_element("ports", Element::key(vec![Value::Port(port)]));
    }
    tx.add_element("other", Element::key(vec![Value::Port(90)]));
    // Message 1 the table, 2 the three elements of `ports`, 3 the last.
    let origin = [(1, 0, 1), (2, 1, 3), (3, 4, 1)];
    let table = super::describe(&tx, &origin, 1);
    assert_eq!(table, "add table ip verdict");
    let three = super::describe(&tx, &origin, 2);
    assert!(three.contains("ports { 80 }"), "{three}");
    assert!(
        three.ends_with("(one of 3 elements in one message)"),
        "{three}"
    );
    let one = super::describe(&tx, &origin, 3);
    assert!(
        one.contains("other { 90 }") && !one.contains("one of"),
        "{one}"
    );
    let unknown = super::describe(&tx, &origin, 9);
    assert_eq!(unknown, "committing the transaction on ip verdict");
}
