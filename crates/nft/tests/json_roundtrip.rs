//! Reading tables back from nft: every golden script of the proxier is
//! loaded, listed with `nft -j list table`, parsed into the IR, dumped again
//! and compared with the golden text.
//!
//! Two tests:
//! - `fixtures_match_goldens` parses JSON captured from nft 1.0.6
//!   (`tests/fixtures/*.json`) and needs nothing special.
//! - `kernel_roundtrip` (tier 4) runs nft for real, each golden in a fresh
//!   network namespace; it needs root, `ip` and `nft`, and is skipped with a
//!   message otherwise.
//!
//! The comparison normalises exactly what nft 1.0.6 does not report back:
//! - the table comment and chain comments (`nft -j` lists neither), which
//!   are stripped from the `add table` / `add chain` lines of the golden;
//! - how a port field of a set was declared: `typeof … tcp dport` is listed
//!   as plain `inet_service`, which the IR renders as `th dport`, so in
//!   `add set` / `add map` declarations `tcp|udp|sctp dport` is compared as
//!   `th dport` (the same equivalence as `Set::same_type`).
//!
//! Everything else (rules, elements, comments on rules, sets and elements,
//! flags, timeouts, sizes) must match exactly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use verdict_nft::{Backend, Family, NftCli, json::parse_table};

const TABLE: &str = "verdict";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxier/tests/golden")
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn goldens() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "nft"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {:?}", golden_dir());
    files
}

/// The family of a golden script (`add table ip6 verdict …`).
fn family_of(script: &str) -> Family {
    if script.starts_with("add table ip6 ") {
        Family::Ip6
    } else {
        Family::Ip
    }
}

/// Removes ` comment "…" ;` from a line, and the braces if nothing is left.
fn strip_comment(line: &str) -> String {
    let mut out = line.to_owned();
    if let Some(start) = out.find(" comment \"")
        && let Some(len) = out[start + 10..].find('"')
    {
        let mut end = start + 10 + len + 1;
        if out[end..].starts_with(" ;") {
            end += 2;
        }
        out.replace_range(start..end, "");
    }
    match out.strip_suffix(" { }") {
        Some(bare) => bare.to_owned(),
        None => out,
    }
}

/// Spells the port fields of a set declaration as nft lists them back.
fn port_spelling(line: &str) -> String {
    let (spec, comment) = match line.find(" comment \"") {
        Some(i) => line.split_at(i),
        None => (line, ""),
    };
    let mut spec = spec.to_owned();
    for p in ["tcp", "udp", "sctp"] {
        spec = spec.replace(&format!("{p} dport"), "th dport");
    }
    spec + comment
}

fn normalise(script: &str) -> String {
    script
        .lines()
        .map(|l| {
            if l.starts_with("add table ") || l.starts_with("add chain ") {
                strip_comment(l)
            } else if l.starts_with("add set ") || l.starts_with("add map ") {
                port_spelling(l)
            } else {
                l.to_owned()
            }
        })
        .map(|l| l + "\n")
        .collect()
}

/// A readable difference of two scripts, line by line, or `None`.
fn diff(name: &str, want: &str, got: &str) -> Option<String> {
    if want == got {
        return None;
    }
    let mut out = format!("{name}: read-back table differs from the golden\n");
    for l in want.lines().filter(|l| !got.lines().any(|g| g == *l)) {
        out.push_str(&format!("  - {l}\n"));
    }
    for l in got.lines().filter(|l| !want.lines().any(|w| w == *l)) {
        out.push_str(&format!("  + {l}\n"));
    }
    if out.lines().count() == 1 {
        out.push_str("  (same lines, different order)\n");
    }
    Some(out)
}

#[test]
fn normalisation_strips_only_what_nft_does_not_report() {
    assert_eq!(
        normalise(
            "add table ip verdict { comment \"rules for verdict\" ; }\n\
             add chain ip verdict reject-chain { comment \"helper\" ; }\n\
             add chain ip verdict nat-output { type nat hook output priority -100 ; comment \"x\" ; }\n\
             add map ip verdict m { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; comment \"tcp dport map\" ; }\n\
             add rule ip verdict c ip daddr . tcp dport @s comment \"keep\"\n"
        ),
        "add table ip verdict\n\
         add chain ip verdict reject-chain\n\
         add chain ip verdict nat-output { type nat hook output priority -100 ; }\n\
         add map ip verdict m { typeof ip daddr . th dport . numgen random mod 1 : ip daddr . th dport ; comment \"tcp dport map\" ; }\n\
         add rule ip verdict c ip daddr . tcp dport @s comment \"keep\"\n"
    );
}

#[test]
fn fixtures_match_goldens() {
    let mut failures = Vec::new();
    let mut compared = 0;
    for golden in goldens() {
        let name = golden.file_stem().unwrap().to_string_lossy().into_owned();
        let Ok(json) = std::fs::read_to_string(fixture_dir().join(format!("{name}.json"))) else {
            continue;
        };
        let script = std::fs::read_to_string(&golden).unwrap();
        let family = family_of(&script);
        let got = match parse_table(&json, family, TABLE) {
            Ok(t) => t.dump(family, TABLE),
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        compared += 1;
        failures.extend(diff(&name, &normalise(&script), &normalise(&got)));
    }
    assert!(compared >= 9, "only {compared} fixtures found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A network namespace, deleted when dropped (also on panic).
struct Netns(String);

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Netns {
    fn new() -> Result<Netns, String> {
        let name = format!(
            "vjson-{}-{}",
            std::process::id(),
            NETNS_COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| format!("ip netns add: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Netns(name))
    }

    fn nft_file(&self, path: &Path) -> Result<(), String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft", "-f"])
            .arg(path)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why the kernel test cannot run here, if it cannot.
fn kernel_unavailable() -> Option<String> {
    if !is_root() || !runs("nft", "--version") || !runs("ip", "-V") {
        return Some("needs root and nft".into());
    }
    Netns::new().err()
}

#[test]
fn kernel_roundtrip() {
    if let Some(why) = kernel_unavailable() {
        println!("kernel_roundtrip skipped: {why}");
        return;
    }
    let mut failures = Vec::new();
    let files = goldens();
    for golden in &files {
        let name = golden.file_stem().unwrap().to_string_lossy().into_owned();
        let script = std::fs::read_to_string(golden).unwrap();
        let family = family_of(&script);
        let ns = Netns::new().unwrap();
        if let Err(e) = ns.nft_file(golden) {
            failures.push(format!("{name}: nft -f refused the golden: {e}"));
            continue;
        }
        let table = NftCli::in_netns(&ns.0).and_then(|mut nft| nft.table(family, TABLE));
        let got = match table {
            Ok(Some(t)) => t.dump(family, TABLE),
            Ok(None) => {
                failures.push(format!("{name}: table {family} {TABLE} not found"));
                continue;
            }
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        failures.extend(diff(&name, &normalise(&script), &normalise(&got)));
    }
    println!("kernel_roundtrip: {} goldens read back", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
