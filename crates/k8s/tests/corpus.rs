//! The malformed-input corpus: every file under `tests/corpus/` states on
//! its first lines what loading it must report (`# expect: <text>`, or
//! `ok` for an edge case that is valid) and which object the report names
//! (`# object: Service ns/name`). A `.json` file, which cannot carry
//! comments, must load cleanly. The corpus is loaded in one directory
//! together with good Services, as an operator's manifests directory
//! would hold them, plus the cases a repository cannot hold (a symlink
//! loop, a dangling link, a FIFO, a directory with a manifest's name).
//!
//! Checked: nothing panics; every invalid object is reported, naming the
//! file, the object and the field; no invalid object is loaded; every edge
//! case loads without a report; the good Services load exactly as they do
//! alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use verdict_k8s::manifests::{Loaded, load};

const GOOD: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: good}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: good, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.180.0.10], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: good}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.11
  loadBalancerSourceRanges: [192.0.2.0/24]
  ports: [{name: http, port: 80, nodePort: 30011}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.11}]}}
";

struct Case {
    file: String,
    /// `None`: must load cleanly; `Some(text)`: a report containing it.
    expect: Option<String>,
    object: Option<String>,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(corpus_dir()).expect("corpus directory") {
        let path = entry.expect("entry").path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if file == "README.md" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let header = |key: &str| {
            text.lines()
                .take_while(|l| l.starts_with('#'))
                .find_map(|l| l.strip_prefix(&format!("# {key}:")))
                .map(|v| v.trim().to_owned())
        };
        let expect = if file.ends_with(".json") {
            None
        } else {
            let e = header("expect").unwrap_or_else(|| panic!("{file}: no `# expect:` line"));
            (e != "ok").then_some(e)
        };
        out.push(Case {
            object: header("object"),
            expect,
            file,
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    out
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("verdict-corpus-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn by_file(l: &Loaded) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &l.errors {
        let f = e
            .file
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        m.entry(f).or_default().push(e.to_string());
    }
    m
}

#[test]
fn every_invalid_object_is_named_and_nothing_else_is_touched() {
    let cases = cases();
    assert!(cases.len() >= 100, "the corpus holds {} cases", cases.len());

    let alone = scratch("alone");
    std::fs::write(alone.join("000-good.yaml"), GOOD).unwrap();
    let good = load(&alone);
    assert!(good.errors.is_empty(), "{:?}", good.errors);
    assert_eq!(good.services.len(), 2);

    let dir = scratch("all");
    std::fs::write(dir.join("000-good.yaml"), GOOD).unwrap();
    for c in &cases {
        std::fs::copy(corpus_dir().join(&c.file), dir.join(&c.file)).unwrap();
    }
    // What a repository cannot hold.
    let loop_a = dir.join("900-loop-a.yaml");
    std::os::unix::fs::symlink(dir.join("900-loop-b.yaml"), &loop_a).unwrap();
    std::os::unix::fs::symlink(&loop_a, dir.join("900-loop-b.yaml")).unwrap();
    std::os::unix::fs::symlink(dir.join("gone.yaml"), dir.join("901-dangling.yaml")).unwrap();
    let fifo = dir.join("902-fifo.yaml");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    std::fs::create_dir(dir.join("903-directory.yaml")).unwrap();
    std::fs::write(dir.join("904-binary.yaml"), [0xff, 0xfe, 0x00, 0x41, 0x80]).unwrap();
    std::fs::write(dir.join("905-empty.yaml"), "").unwrap();

    let l = load(&dir);
    let reports = by_file(&l);

    let mut failures = Vec::new();
    for c in &cases {
        let got = reports.get(&c.file).cloned().unwrap_or_default();
        match &c.expect {
            None if !got.is_empty() => failures.push(format!("{}: valid, but {got:?}", c.file)),
            None => {}
            Some(want) => {
                let hit = got.iter().find(|m| m.contains(want.as_str()));
                match (hit, &c.object) {
                    (None, _) => failures.push(format!("{}: want {want:?}, got {got:?}", c.file)),
                    (Some(m), Some(obj)) if !m.contains(&format!(": {obj}: ")) => {
                        failures.push(format!("{}: {m:?} does not name {obj}", c.file))
                    }
                    _ => {}
                }
                // The invalid object itself is not loaded (a duplicate's
                // first definition is).
                if let Some(obj) = &c.object
                    && !want.contains("more than once")
                {
                    let name = obj.rsplit(['/', ' ']).next().unwrap();
                    let loaded = l.services.iter().any(|s| s.name == name)
                        || l.slices.iter().any(|s| s.name == name);
                    if loaded {
                        failures.push(format!("{}: {obj} was loaded", c.file));
                    }
                }
            }
        }
    }
    for (file, why) in [
        ("900-loop-a.yaml", "symbolic links"),
        ("900-loop-b.yaml", "symbolic links"),
        ("901-dangling.yaml", "No such file"),
        ("902-fifo.yaml", "is a FIFO, not a regular file"),
        ("903-directory.yaml", "is a directory, not a regular file"),
        ("904-binary.yaml", "valid UTF-8"),
    ] {
        let got = reports.get(file).cloned().unwrap_or_default();
        if !got.iter().any(|m| m.contains(why)) {
            failures.push(format!("{file}: want {why:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Every report names a file that exists in the directory.
    for e in &l.errors {
        assert!(
            e.file.starts_with(&dir) && e.file != dir,
            "a report without its file: {e}"
        );
    }
    // Leading zeros are read as decimal, as kube-proxy reads them.
    let decimal: std::net::IpAddr = "10.96.3.1".parse().unwrap();
    let zeros = l
        .services
        .iter()
        .find(|s| s.cluster_ips == ["010.096.003.001"])
        .expect("the leading-zeros case loads");
    let ports = verdict_model::service_ports(zeros, verdict_model::IpFamily::V4).unwrap();
    assert_eq!(ports[0].cluster_ip, decimal);
    // The good Services load exactly as they do alone.
    for s in &good.services {
        assert!(
            l.services.contains(s),
            "good Service {}/{} changed",
            s.namespace,
            s.name
        );
    }
    for s in &good.slices {
        assert!(
            l.slices.contains(s),
            "good slice {}/{} changed",
            s.namespace,
            s.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&alone);
}
