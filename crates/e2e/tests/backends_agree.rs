//! The two kernel backends agree: random transactions, valid and invalid,
//! drawn from a pool of the kinds of objects verdict writes (a chain of
//! each kind, a set of each kind, rules using them, elements of every
//! set), are applied through
//! `nft` in one network namespace and over netlink in another. After each,
//! both succeeded or both failed (a failure changes nothing), and the two
//! tables read back identical, whether read over netlink or through nft.
//! Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use verdict_e2e::netns::{Netns, can_run, unique_prefix};
use verdict_nft::backend::find;
use verdict_nft::{
    Backend, Chain, ChainType, CmpOp, DataType, DnatTarget, Element, ElementValue, Expr, Family,
    Found, Hook, L4Proto, NetlinkBackend, NftCli, Rule, Selector, Set, TableState, Transaction,
    Value, Verdict,
};

const TABLE: &str = "agree";

fn chains() -> Vec<Chain> {
    vec![
        Chain::regular("c1"),
        Chain::regular("c2").with_comment("second"),
        Chain::base("nat-out", ChainType::Nat, Hook::Output, -100),
        Chain::base("filter-in", ChainType::Filter, Hook::Input, 0),
    ]
}

fn sets() -> Vec<Set> {
    let a = DataType::Ipv4Addr;
    let svc = vec![a, DataType::InetProto, DataType::InetService];
    let mut allow = svc.clone();
    allow.push(a);
    vec![
        Set::set("ips", vec![a]).with_comment("addresses"),
        Set::map("dispatch", svc, vec![DataType::Verdict]).with_counters(),
        Set::set("allow", allow).with_interval(),
        Set::map(
            "eps",
            vec![a, DataType::PortOf(L4Proto::Tcp), DataType::Numgen],
            vec![a, DataType::PortOf(L4Proto::Tcp)],
        )
        .with_counters(),
    ]
}

fn addr(last: u8) -> Value {
    Value::Addr(std::net::Ipv4Addr::new(10, 0, 0, last).into())
}

/// Elements of set `s`, numbered.
fn element(s: usize, n: u8) -> (String, Element) {
    let name = sets()[s].name.clone();
    let e = match s {
        0 => Element::key(vec![addr(n % 4 + 1)]),
        1 => Element::map(
            vec![addr(n % 3 + 1), Value::Proto(L4Proto::Tcp), Value::Port(80)],
            ElementValue::Verdict(match n % 4 {
                0 => Verdict::Goto("c1".into()),
                1 => Verdict::Jump("c2".into()),
                2 => Verdict::Accept,
                _ => Verdict::Drop,
            }),
        )
        .with_comment(format!("svc{}", n % 3)),
        2 => Element::key(vec![
            addr(1),
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
            Value::Prefix(format!("192.168.{}.0/24", n % 3).parse().unwrap()),
        ]),
        _ => Element::map(
            vec![addr(1), Value::Port(80), Value::Int(u32::from(n % 3))],
            ElementValue::Data(vec![addr(100 + n % 2), Value::Port(8080)]),
        ),
    };
    (name, e)
}

/// The keys looked up in set `s` after each transaction: every pool
/// element's key, and for the interval set, packets' points inside and
/// outside its ranges.
fn probes(s: usize) -> Vec<Vec<Value>> {
    let mut keys: Vec<Vec<Value>> = (0..12).map(|n| element(s, n).1.key.to_vec()).collect();
    if s == 2 {
        for (to, from) in [
            (1, "192.168.1.7"),
            (1, "192.168.2.255"),
            (1, "10.9.9.9"),
            (2, "192.168.0.7"),
        ] {
            keys.push(vec![
                addr(to),
                Value::Proto(L4Proto::Tcp),
                Value::Port(80),
                Value::Addr(from.parse().unwrap()),
            ]);
        }
    }
    keys
}

/// What [`Backend::lookup`] must answer for `keys` in `set`, found in a
/// whole table read back (`None`: no such set).
fn expected(
    table: Option<&TableState>,
    set: &str,
    keys: &[Vec<Value>],
) -> Option<Vec<Option<Found>>> {
    let s = table?.sets.get(set)?;
    Some(
        keys.iter()
            .map(|k| {
                find(s, k).map(|e| Found {
                    element: e.clone(),
                    counter: s.counters.get(&e.key).copied(),
                })
            })
            .collect(),
    )
}

/// A table as [`Backend::skeleton`] reads it: every set emptied.
fn emptied(table: Option<TableState>) -> Option<TableState> {
    table.map(|mut t| {
        for s in t.sets.values_mut() {
            s.elements.clear();
            s.counters.clear();
        }
        t
    })
}

fn rule(n: u8) -> Rule {
    let svc = vec![Selector::Daddr, Selector::L4Proto, Selector::Dport];
    match n % 6 {
        0 => Rule::new(vec![
            Expr::Lookup {
                key: vec![Selector::Daddr],
                set: "ips".into(),
                negate: false,
            },
            Expr::MarkOr(0x4000),
        ])
        .with_comment("mark"),
        1 => Rule::new(vec![Expr::Vmap {
            key: svc,
            map: "dispatch".into(),
        }]),
        2 => Rule::new(vec![
            Expr::Lookup {
                key: {
                    let mut k = svc;
                    k.push(Selector::Saddr);
                    k
                },
                set: "allow".into(),
                negate: true,
            },
            Expr::Verdict(Verdict::Drop),
        ]),
        3 => Rule::new(vec![
            Expr::Cmp {
                selector: Selector::L4Proto,
                op: CmpOp::Eq,
                value: Value::Proto(L4Proto::Tcp),
            },
            Expr::Dnat(DnatTarget::Map {
                key: vec![
                    Selector::Daddr,
                    Selector::Dport,
                    Selector::Numgen {
                        modulus: 3,
                        offset: 0,
                    },
                ],
                map: "eps".into(),
            }),
        ]),
        4 => Rule::new(vec![
            Expr::CtStateNew,
            Expr::Verdict(Verdict::Jump("c2".into())),
        ]),
        _ => Rule::new(vec![
            Expr::Cmp {
                selector: Selector::Saddr,
                op: CmpOp::Ne,
                value: Value::Prefix("10.0.0.0/8".parse().unwrap()),
            },
            Expr::Reject,
        ]),
    }
}

/// One operation, by pool index.
#[derive(Clone, Debug)]
enum Choice {
    AddChain(u8),
    AddSet(u8),
    AddRule(u8, u8),
    AddElement(u8, u8),
    DeleteElement(u8, u8),
    FlushChain(u8),
    FlushSet(u8),
    DeleteChain(u8),
    DeleteSet(u8),
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        2 => any::<u8>().prop_map(Choice::AddChain),
        2 => any::<u8>().prop_map(Choice::AddSet),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(c, r)| Choice::AddRule(c, r)),
        5 => (any::<u8>(), any::<u8>()).prop_map(|(s, e)| Choice::AddElement(s, e)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(s, e)| Choice::DeleteElement(s, e)),
        1 => any::<u8>().prop_map(Choice::FlushChain),
        1 => any::<u8>().prop_map(Choice::FlushSet),
        1 => any::<u8>().prop_map(Choice::DeleteChain),
        1 => any::<u8>().prop_map(Choice::DeleteSet),
    ]
}

fn transaction(choices: &[Choice]) -> Transaction {
    let (chains, sets) = (chains(), sets());
    let chain = |i: u8| &chains[usize::from(i) % chains.len()];
    let set = |i: u8| usize::from(i) % sets.len();
    let mut tx = Transaction::new(Family::Ip, TABLE);
    // One known difference is left out: adding an element the interval
    // set `allow` already holds, in a transaction that then deletes the
    // set, is accepted through nft (which drops the duplicate itself) and
    // refused by the kernel over netlink ("File exists"). verdict never
    // sends that: its syncs add only elements that are missing.
    let deletes_allow = choices
        .iter()
        .any(|c| matches!(*c, Choice::DeleteSet(i) if set(i) == 2));
    for c in choices {
        if deletes_allow && matches!(*c, Choice::AddElement(s, _) if set(s) == 2) {
            continue;
        }
        match *c {
            Choice::AddChain(i) => tx.add_chain(chain(i).clone()),
            Choice::AddSet(i) => tx.add_set(sets[set(i)].clone()),
            Choice::AddRule(c, r) => tx.add_rule(&chain(c).name, rule(r)),
            Choice::AddElement(s, e) => {
                let (name, el) = element(set(s), e);
                tx.add_element(&name, el);
            }
            Choice::DeleteElement(s, e) => {
                let (name, el) = element(set(s), e);
                tx.delete_element(&name, el.key);
            }
            Choice::FlushChain(i) => tx.flush_chain(&chain(i).name),
            // nft's `flush set` cannot name a map (and verdict flushes
            // none): only the plain sets are flushed.
            Choice::FlushSet(i) => tx.flush_set(&sets[[0, 2][usize::from(i) % 2]].name),
            Choice::DeleteChain(i) => tx.delete_chain(&chain(i).name),
            Choice::DeleteSet(i) => tx.delete_set(&sets[set(i)].name),
        }
    }
    tx
}

#[test]
fn random_transactions_leave_both_backends_with_the_same_table() {
    if let Err(why) = can_run() {
        println!("skipped: {why}");
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(proptest::collection::vec(choice(), 1..10), 1..6);
    let (committed, refused) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    let lookups = std::cell::Cell::new(0usize);
    runner
        .run(&strategy, |batches| {
            let a = Netns::create(&format!("{}-agn", unique_prefix())).unwrap();
            let b = Netns::create(&format!("{}-agl", unique_prefix())).unwrap();
            let mut nft = NftCli::in_netns(a.name()).unwrap();
            let mut netlink = NetlinkBackend::in_netns(b.name()).unwrap();
            let mut readers = (
                NetlinkBackend::in_netns(a.name()).unwrap(),
                NftCli::in_netns(b.name()).unwrap(),
            );
            // Every chain and set exists to begin with, so that most
            // random transactions can succeed.
            let mut start = Transaction::new(Family::Ip, TABLE);
            start.add_table(Some("agreement"));
            for c in chains() {
                start.add_chain(c);
            }
            for s in sets() {
                start.add_set(s);
            }
            nft.run(&start).unwrap();
            netlink.run(&start).unwrap();
            for choices in &batches {
                let tx = transaction(choices);
                let (x, y) = (nft.run(&tx), netlink.run(&tx));
                prop_assert_eq!(
                    x.is_ok(),
                    y.is_ok(),
                    "{}\nnft: {:?}\nnetlink: {:?}",
                    tx,
                    x,
                    y
                );
                let count = if x.is_ok() { &committed } else { &refused };
                count.set(count.get() + 1);
                // Each table as both readers see it: netlink's reader on
                // the nft namespace and on the netlink one, then nft's.
                let over_netlink_a = readers.0.table(Family::Ip, TABLE).unwrap();
                let over_netlink_b = netlink.table(Family::Ip, TABLE).unwrap();
                prop_assert_eq!(
                    &over_netlink_a,
                    &over_netlink_b,
                    "over netlink after\n{}",
                    tx
                );
                let by_nft_a = nft.table(Family::Ip, TABLE).unwrap();
                let by_nft_b = readers.1.table(Family::Ip, TABLE).unwrap();
                prop_assert_eq!(&by_nft_a, &by_nft_b, "through nft after\n{}", tx);
                // The targeted reads over netlink answer what the whole
                // table says: the skeleton is the table without elements,
                // and each key finds the element the data path would.
                let skeleton = readers.0.skeleton(Family::Ip, TABLE).unwrap();
                prop_assert_eq!(
                    &skeleton,
                    &emptied(over_netlink_a.clone()),
                    "skeleton after\n{}",
                    tx
                );
                for (i, def) in sets().iter().enumerate() {
                    let keys = probes(i);
                    let want = expected(over_netlink_a.as_ref(), &def.name, &keys);
                    let got = readers.0.lookup(Family::Ip, TABLE, &def.name, &keys);
                    prop_assert_eq!(
                        got.as_ref().ok(),
                        want.as_ref(),
                        "lookups in {} after\n{}\n{:?}",
                        def.name,
                        tx,
                        got
                    );
                    lookups.set(lookups.get() + keys.len());
                }
            }
            Ok(())
        })
        .unwrap();
    let (committed, refused) = (committed.get(), refused.get());
    println!("{committed} transactions committed and {refused} refused alike by both backends");
    println!(
        "{} keys looked up over netlink as the whole table says",
        lookups.get()
    );
    assert!(
        committed > 20 && refused > 20,
        "{committed} committed, {refused} refused"
    );
}
