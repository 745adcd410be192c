//! The netlink backend against the real kernel, in a network namespace of
//! the test's own (`unshare` on the test's thread: the namespace goes away
//! with the thread). Needs root; says so and passes otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};

use verdict_nft::{
    Backend, DataType, Element, ElementValue, Family, L4Proto, NetlinkBackend, Set, Transaction,
    Value, Verdict,
};

fn root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Element `i` of the test's map: an address, protocol and port, jumping
/// nowhere (drop), with a comment of a Service's name at its longest.
fn element(i: u32) -> Element {
    let [_, b, c, d] = i.to_be_bytes();
    let key = vec![
        Value::Addr(IpAddr::V4(Ipv4Addr::new(10, b, c, d))),
        Value::Proto(L4Proto::Tcp),
        Value::Port(80),
    ];
    Element::map(key, ElementValue::Verdict(Verdict::Drop)).with_comment(format!(
        "{}/{}:http",
        "n".repeat(63),
        "s".repeat(63)
    ))
}

fn keys(mut elements: Vec<Element>) -> Vec<Vec<Value>> {
    elements.sort_by(|a, b| a.key.cmp(&b.key));
    elements.into_iter().map(|e| e.key.to_vec()).collect()
}

#[test]
fn a_batch_of_many_chunks_is_one_transaction_and_a_set_is_read_reply_by_reply() {
    if !root() {
        println!("skipped: needs root");
        return;
    }
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let mut nl = NetlinkBackend::new().unwrap();
        const N: u32 = 30_000;
        let set = Set::map(
            "dispatch",
            vec![
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ],
            vec![DataType::Verdict],
        );
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add_table(None);
        tx.add_set(set);
        for i in 0..N {
            tx.add_element("dispatch", element(i));
        }
        // About 200 bytes an element: several chunks of the batch, which
        // the kernel must take as one message and one transaction.
        nl.run(&tx).unwrap();

        // The kernel grows the set's hash table in a worker after the
        // commit, and a dump that spans a resize skips and repeats
        // elements (each reply walks the table again from its start):
        // read once the table has its size, within a few seconds.
        let mut read = Vec::new();
        for _ in 0..50 {
            read = nl.elements(Family::Ip, "t", "dispatch").unwrap();
            if read.len() == N as usize {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(read.len(), N as usize);
        assert!(read.windows(2).all(|w| w[0].key < w[1].key), "sorted");
        assert_eq!(read[0], element(0));
        let mut streamed = Vec::new();
        nl.each_element(Family::Ip, "t", "dispatch", &mut |e| streamed.push(e))
            .unwrap();
        assert_eq!(streamed.len(), N as usize);
        assert!(streamed.contains(&element(N - 1)));
        assert_eq!(keys(streamed), keys(read));

        // One refused element refuses the whole batch, several chunks
        // long: nothing of it is applied.
        let mut tx = Transaction::new(Family::Ip, "t");
        for i in N..2 * N {
            tx.add_element("dispatch", element(i));
        }
        tx.add_element(
            "dispatch",
            Element::map(
                vec![
                    Value::Addr(IpAddr::V4(Ipv4Addr::new(10, 200, 0, 1))),
                    Value::Proto(L4Proto::Tcp),
                    Value::Port(80),
                ],
                ElementValue::Verdict(Verdict::Goto("no-such-chain".into())),
            ),
        );
        assert!(nl.run(&tx).is_err());
        let mut count = 0;
        nl.each_element(Family::Ip, "t", "dispatch", &mut |_| count += 1)
            .unwrap();
        assert_eq!(count, N as usize);

        // A set that is not there is named.
        let e = nl
            .each_element(Family::Ip, "t", "nope", &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    })
    .join()
    .unwrap();
}
