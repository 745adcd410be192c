//! The monitor against the real kernel, in a network namespace of the
//! test's own (`unshare` on the test's thread: the namespace goes away
//! with the thread). Needs root and nft; says so and passes otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use verdict_nft::monitor::{Event, Monitor, Object};
use verdict_nft::{Listener, process};

fn available() -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    });
    root && Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn next(m: &mut Monitor) -> Event {
    m.next_event().expect("an event within the timeout")
}

#[test]
fn sees_commits_names_their_process_and_tells_its_own() {
    if !available() {
        println!("skipped: needs root and nft");
        return;
    }
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let mut m = Monitor::open().unwrap();
        m.set_timeout(Some(Duration::from_secs(5))).unwrap();

        // Our own commit, through the tools runner.
        let script = "table ip verdict {\n\
                      set s { type ipv4_addr; flags dynamic,timeout; timeout 1h; }\n\
                      chain c1 { }\n\
                      chain c2 { type filter hook output priority 0; update @s { ip daddr }; }\n\
                      }\n\
                      table ip6 verdict { chain c1 { }\n}\n\
                      table inet other { chain x { }\n}\n";
        let out = process::run("nft", &["-f", "-"], Some(script)).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let Event::Commit { pid, changes, .. } = next(&mut m) else {
            panic!("expected a commit")
        };
        assert!(process::is_ours(pid), "our nft's pid {pid}");
        assert!(
            changes
                .iter()
                .any(|c| c.added && c.object == Object::Table && c.table == "verdict")
        );

        // Another process deletes one chain.
        let st = Command::new("nft")
            .args(["delete", "chain", "ip", "verdict", "c1"])
            .status()
            .unwrap();
        assert!(st.success());
        let Event::Commit {
            pid,
            process: name,
            changes,
            ..
        } = next(&mut m)
        else {
            panic!("expected a commit")
        };
        assert!(!process::is_ours(pid), "a foreign pid");
        assert_eq!(name, "nft");
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["delete chain ip verdict c1"]);

        // A packet through the dynamic set is not announced: send one,
        // then a marker commit, and the marker is the next event.
        Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let _ = s.send_to(b"x", "127.0.0.1:9");
        let set = Command::new("nft")
            .args(["list", "set", "ip", "verdict", "s"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&set.stdout).contains("127.0.0.1"),
            "the packet went through the set"
        );
        Command::new("nft")
            .args(["add", "table", "ip", "marker"])
            .status()
            .unwrap();
        let Event::Commit { changes, .. } = next(&mut m) else {
            panic!("expected a commit")
        };
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].table, "marker");

        // A flush announces every table of every family.
        Command::new("nft")
            .args(["flush", "ruleset"])
            .status()
            .unwrap();
        let Event::Commit { changes, .. } = next(&mut m) else {
            panic!("expected a commit")
        };
        let tables: Vec<String> = changes
            .iter()
            .filter(|c| c.object == Object::Table && !c.added)
            .map(|c| format!("{} {}", c.family, c.table))
            .collect();
        for t in ["ip verdict", "ip6 verdict", "inet other", "ip marker"] {
            assert!(tables.contains(&t.to_string()), "{t} in {tables:?}");
        }
    })
    .join()
    .unwrap();
}

#[test]
fn hears_nothing_while_it_has_left_and_what_follows_once_back() {
    if !available() {
        println!("skipped: needs root and nft");
        return;
    }
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let mut m = Monitor::open().unwrap();
        m.set_timeout(Some(Duration::from_secs(2))).unwrap();
        let membership = m.membership().unwrap();
        let nft = |args: &[&str]| {
            assert!(Command::new("nft").args(args).status().unwrap().success());
        };
        // Queued before it leaves: still read.
        nft(&["add", "table", "ip", "before"]);
        // Left, from another thread than the reader's: unheard.
        std::thread::scope(|s| {
            s.spawn(|| membership.leave().unwrap());
        });
        nft(&["add", "table", "ip", "unheard"]);
        membership.join().unwrap();
        nft(&["add", "table", "ip", "after"]);
        let mut tables = Vec::new();
        while let Ok(Event::Commit { changes, .. }) = m.next_event() {
            tables.extend(changes.into_iter().map(|c| c.table));
        }
        assert_eq!(tables, ["before", "after"]);
    })
    .join()
    .unwrap();
}
