//! Parsing manifest files: YAML through libyaml's parser (serde_norway),
//! JSON through serde_json, each document to the API's types (validated as
//! the API server would) and then to the proxier's model.
//!
//! Files are parsed in parallel, and a big YAML file is cut at its
//! document markers into one piece per core. A `---` line opens a new
//! document wherever it stands (YAML forbids it inside a scalar), so the
//! pieces parse to the same documents as the whole file. If a piece meets a
//! syntax error, the file is parsed again whole, so that the error's line
//! numbers are the file's own and nothing after it is used, exactly as
//! with one parser.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use serde::Deserialize;
use serde_json::Value;
use verdict_model::{EndpointSlice, Service};

use super::{FirstDefinitions, ManifestError, Parsed, fast};
use crate::convert::{NodeInfo, node_info, service, slice};
use crate::objects;
use crate::validate;

/// A YAML file at least this big is cut into pieces parsed in parallel.
const SPLIT_AT: usize = 512 * 1024;

/// What one file may cost. A file over a limit is refused whole, with the
/// limit named, before any parser sees it: the cost of a file is then
/// bounded by its size, and no file can hold the others back for long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest file read, in bytes. 30,000 Services with an
    /// EndpointSlice each, as `kubectl get -o yaml` writes them, are
    /// about 40 MiB.
    pub bytes: u64,
    /// The most documents (`---`) in one file.
    pub documents: usize,
    /// The deepest nesting of flow collections (`[…]`, `{…}`) in YAML.
    /// libyaml's work for each token grows with this depth, so a document
    /// nested 100,000 deep (`[[[[…]]]]`) would hold its parser for
    /// minutes; a Kubernetes object is nested a dozen levels at most.
    /// (Block nesting is bounded by the deserializer, 128 levels; JSON
    /// by serde_json, 128.)
    pub flow_depth: usize,
}

impl Limits {
    /// The limits the sources use.
    pub const DEFAULT: Limits = Limits {
        bytes: 256 * 1024 * 1024,
        documents: 1_000_000,
        flow_depth: 100,
    };
}

/// What a document yields, in order.
enum Item {
    Service(Service),
    Slice(EndpointSlice),
    Node(NodeInfo),
    Cidrs(Vec<ipnet::IpNet>),
    Error(ManifestError),
}

/// One piece of work: documents of one file, numbered from `first_doc`.
struct Unit<'a> {
    /// Which of the files.
    file: usize,
    text: &'a str,
    json: bool,
    first_doc: usize,
}

/// What a unit yields: its items, and whether a syntax error ended it.
#[derive(Default)]
struct Out {
    items: Vec<Item>,
    broken: bool,
}

/// How many threads to parse on.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Parses each file; the result is in the files' order.
pub(super) fn files(files: &[PathBuf], limits: Limits) -> Vec<Parsed> {
    let texts: Vec<Result<String, ManifestError>> = files
        .iter()
        .map(|f| {
            let json = f.extension().is_some_and(|e| e == "json");
            let text = read(f, limits.bytes)?;
            within(&text, json, limits).map_err(|message| ManifestError {
                file: f.to_path_buf(),
                object: "file".into(),
                message,
            })?;
            Ok(text)
        })
        .collect();
    let workers = workers();
    let mut units = Vec::new();
    for (i, (file, text)) in files.iter().zip(&texts).enumerate() {
        let Ok(text) = text else { continue };
        let json = file.extension().is_some_and(|e| e == "json");
        if json || text.len() < SPLIT_AT || workers == 1 {
            units.push(Unit {
                file: i,
                text,
                json,
                first_doc: 0,
            });
        } else {
            for (first_doc, piece) in pieces(text, workers) {
                units.push(Unit {
                    file: i,
                    text: piece,
                    json: false,
                    first_doc,
                });
            }
        }
    }
    let outs = parallel(&units, workers, |u| parse_unit(&files[u.file], u));
    let mut per_file: Vec<Vec<Out>> = files.iter().map(|_| Vec::new()).collect();
    for (u, out) in units.iter().zip(outs) {
        per_file[u.file].push(out);
    }
    files
        .iter()
        .zip(texts)
        .zip(per_file)
        .map(|((file, text), outs)| match text {
            Err(e) => Parsed {
                errors: vec![e],
                ..Parsed::default()
            },
            Ok(text) => {
                let split = outs.len() > 1;
                if split && outs.iter().any(|o| o.broken) {
                    let whole = Unit {
                        file: 0,
                        text: &text,
                        json: false,
                        first_doc: 0,
                    };
                    collect(file, vec![parse_unit(file, &whole)])
                } else {
                    collect(file, outs)
                }
            }
        })
        .collect()
}

/// Reads a file that is a regular file (through links), of `max` bytes at
/// most. Reading a FIFO would block the source forever, and a directory or
/// device is not a manifest.
fn read(file: &Path, max: u64) -> Result<String, ManifestError> {
    let err = |message: String| ManifestError {
        file: file.to_path_buf(),
        object: "file".into(),
        message,
    };
    match std::fs::metadata(file) {
        Ok(m) if m.is_file() && m.len() > max => {
            return Err(err(too_big(m.len(), max)));
        }
        Ok(m) if m.is_file() => {}
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory"
            } else if m.file_type().is_fifo() {
                "a FIFO"
            } else if m.file_type().is_socket() {
                "a socket"
            } else {
                "a device"
            };
            return Err(err(format!("is {what}, not a regular file; not read")));
        }
        Err(e) => return Err(err(e.to_string())),
    }
    // The file may grow between the two looks: no more than the limit is
    // read in any case.
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| {
            std::io::Read::read_to_string(&mut std::io::Read::take(f, max + 1), &mut text)
        })
        .map_err(|e| err(e.to_string()))?;
    if text.len() as u64 > max {
        return Err(err(too_big(text.len() as u64, max)));
    }
    Ok(text)
}

fn too_big(len: u64, max: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    let limit = if max.is_multiple_of(MIB) {
        format!("{} MiB", max / MIB)
    } else {
        format!("{max} bytes")
    };
    format!("is {len} bytes, more than the {limit} a manifest file may be; not read")
}

/// Whether a text is within `limits` (its documents and, for YAML, the
/// nesting of its flow collections); the error names the limit and where
/// it was passed. One pass over the bytes, before any parser runs.
///
/// The depth is counted as libyaml would see it: `[` and `{` open a flow
/// collection where a node may start (anywhere inside one; after a space,
/// a line's start, `-`, `:` or `?` outside), quoted scalars and
/// comments are skipped up to their end or the line's. A bracket inside a
/// block scalar or a plain one may be counted: that errs towards refusing
/// a file nested deeper than a hundred levels by its text, never towards
/// handing the parser a deeper one.
pub(crate) fn within(text: &str, json: bool, limits: Limits) -> Result<(), String> {
    if json {
        return Ok(());
    }
    let b = text.as_bytes();
    let mut documents = 1usize;
    let mut line = 1usize;
    let mut depth = 0usize;
    // The last byte that was not a space, outside scalars and comments; a
    // line starts as if after a space.
    let mut last = b' ';
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if (i == 0 || b[i - 1] == b'\n')
            && b[i..].starts_with(b"---")
            && b.get(i + 3).is_none_or(u8::is_ascii_whitespace)
        {
            documents += 1;
            if documents > limits.documents {
                return Err(format!(
                    "has more than {} documents (line {line}); not read",
                    limits.documents
                ));
            }
            // What the last document left open is a syntax error, which
            // the parser reports.
            depth = 0;
            last = b' ';
            i += 3;
            continue;
        }
        let node_may_start = depth > 0 || last.is_ascii_whitespace() || b"-:?".contains(&last);
        match c {
            b'\n' => {
                line += 1;
                last = b' ';
            }
            b' ' | b'\t' | b'\r' => {}
            b'#' if last.is_ascii_whitespace() => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' if node_may_start => {
                i = skip_quoted(b, i);
                last = c;
                continue;
            }
            b'[' | b'{' if node_may_start => {
                depth += 1;
                if depth > limits.flow_depth {
                    return Err(format!(
                        "is nested more than {} levels deep (line {line}); not read",
                        limits.flow_depth
                    ));
                }
                last = c;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                last = c;
            }
            _ => last = c,
        }
        i += 1;
    }
    Ok(())
}

/// Where the quoted scalar opening at `i` ends: just past its closing
/// quote, or at the end of its line (a scalar quoted over several lines is
/// scanned as text from the next one on).
fn skip_quoted(b: &[u8], i: usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() && b[j] != b'\n' {
        if quote == b'"' && b[j] == b'\\' && b.get(j + 1).is_some_and(|n| *n != b'\n') {
            j += 2;
            continue;
        }
        if b[j] == quote {
            // Two single quotes are one, inside the scalar.
            if quote == b'\'' && b.get(j + 1) == Some(&b'\'') {
                j += 2;
                continue;
            }
            return j + 1;
        }
        j += 1;
    }
    j.min(b.len())
}

/// Runs `f` on every unit on up to `workers` threads; the results are in
/// the units' order.
fn parallel<T: Send>(
    units: &[Unit<'_>],
    workers: usize,
    f: impl Fn(&Unit<'_>) -> T + Sync,
) -> Vec<T> {
    if units.len() <= 1 || workers <= 1 {
        return units.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, T)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.min(units.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(u) = units.get(i) else { break };
                        mine.push((i, f(u)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            // A worker's panic goes on in this thread, as it would have
            // without workers: its files' objects are never dropped
            // silently, which would withdraw their Services.
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

/// Cuts a YAML text at document markers into about `n` pieces of similar
/// size, each with the number of documents before it.
fn pieces(text: &str, n: usize) -> Vec<(usize, &str)> {
    let target = text.len().div_ceil(n).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    // Documents before the current position: one per marker, and one for
    // content before the first marker.
    let mut docs = 0;
    let mut docs_at_start = 0;
    let mut content_before_marker = false;
    let mut seen_marker = false;
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        let is_marker =
            line.starts_with("---") && line[3..].chars().next().is_none_or(char::is_whitespace);
        if is_marker {
            if !seen_marker && content_before_marker {
                docs += 1;
            }
            seen_marker = true;
            if line_start - start >= target && line_start > start {
                out.push((docs_at_start, &text[start..line_start]));
                start = line_start;
                docs_at_start = docs;
            }
            docs += 1;
        } else if !seen_marker {
            let t = line.trim();
            if !(t.is_empty() || t.starts_with('#') || t.starts_with('%')) {
                content_before_marker = true;
            }
        }
        line_start += line.len();
    }
    out.push((docs_at_start, &text[start..]));
    out
}

fn parse_unit(file: &Path, u: &Unit<'_>) -> Out {
    let mut out = Out::default();
    let mut doc = u.first_doc;
    let mut each = |v: Result<Value, String>, out: &mut Out| -> bool {
        doc += 1;
        let object = format!("document {doc}");
        match v {
            Ok(Value::Null) => true,
            Ok(v) => {
                document(file, &object, v, &mut out.items);
                true
            }
            Err(message) => {
                // The parser cannot resynchronise after a syntax error.
                out.items.push(Item::Error(ManifestError {
                    file: file.to_path_buf(),
                    object,
                    message,
                }));
                out.broken = true;
                false
            }
        }
    };
    if u.json {
        for v in serde_json::Deserializer::from_str(u.text).into_iter::<Value>() {
            if !each(v.map_err(|e| format!("not valid JSON: {e}")), &mut out) {
                break;
            }
        }
    } else {
        // The fast reader takes what it is sure of; libyaml the rest, from
        // the first document the reader gives up on.
        let mut rest = Some(u.text);
        if let Some(mut docs) = fast::Documents::new(u.text) {
            rest = loop {
                match docs.next_document() {
                    fast::Next::Read(v) => {
                        if !each(Ok(v), &mut out) {
                            break None;
                        }
                    }
                    fast::Next::Rest(text) => break Some(text),
                    fast::Next::End => break None,
                }
            };
        }
        for d in serde_norway::Deserializer::from_str(rest.unwrap_or_default()) {
            let v = Value::deserialize(d).map_err(|e| format!("not valid YAML: {e}"));
            if !each(v, &mut out) {
                break;
            }
        }
    }
    out
}

/// Puts a file's items together: a second definition of a Service or
/// EndpointSlice in the file is refused.
fn collect(file: &Path, outs: Vec<Out>) -> Parsed {
    let mut p = Parsed::default();
    let mut seen = FirstDefinitions::default();
    for out in outs {
        for item in out.items {
            match item {
                Item::Service(s) => {
                    if seen.first(file, "Service", &s.namespace, &s.name, &mut p.errors) {
                        p.services.push(s);
                    }
                }
                Item::Slice(s) => {
                    if seen.first(file, "EndpointSlice", &s.namespace, &s.name, &mut p.errors) {
                        p.slices.push(s);
                    }
                }
                Item::Node(n) => p.nodes.push(n),
                Item::Cidrs(c) => p.service_cidrs.extend(c),
                Item::Error(e) => p.errors.push(e),
            }
        }
        // Nothing after a syntax error is used.
        if out.broken {
            break;
        }
    }
    p
}

fn describe(v: &Value, fallback: &str) -> String {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("object");
    let meta = v.get("metadata");
    let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str);
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str);
    match (ns, name) {
        (Some(ns), Some(n)) => format!("{kind} {ns}/{n}"),
        (None, Some(n)) => format!("{kind} {n}"),
        _ => format!("{kind} ({fallback})"),
    }
}

/// One document (or list item).
fn document(file: &Path, where_: &str, v: Value, out: &mut Vec<Item>) {
    let object = describe(&v, where_);
    let err = |message: String| {
        Item::Error(ManifestError {
            file: file.to_path_buf(),
            object: object.clone(),
            message,
        })
    };
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match kind.as_str() {
        "List" | "ServiceList" | "EndpointSliceList" | "NodeList" | "ServiceCIDRList" => {
            let api = v.get("apiVersion").cloned();
            let items = match v {
                Value::Object(mut o) => match o.remove("items") {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            for (j, mut item) in items.into_iter().enumerate() {
                // Typed lists leave out the item kind and apiVersion.
                if kind != "List"
                    && let Some(obj) = item.as_object_mut()
                {
                    if !obj.contains_key("kind") {
                        obj.insert(
                            "kind".into(),
                            Value::String(kind.trim_end_matches("List").to_owned()),
                        );
                    }
                    if !obj.contains_key("apiVersion")
                        && let Some(api) = &api
                    {
                        obj.insert("apiVersion".into(), api.clone());
                    }
                }
                document(file, &format!("{where_}, item {}", j + 1), item, out);
            }
        }
        "Service" | "EndpointSlice" | "Node" | "ServiceCIDR"
            if !api_version_ok(&kind, v.get("apiVersion")) =>
        {
            out.push(err(format!(
                "apiVersion {} is not served for {kind} (expected {})",
                v.get("apiVersion").map_or("(missing)".into(), Value::to_string),
                expected_api_versions(&kind).join(" or ")
            )))
        }
        "Service" => out.push(match typed::<core::Service, objects::Service>(v) {
            Ok((s, ours)) => match validate::service(&s).as_slice() {
                [] => Item::Service(service(ours)),
                errors => err(validate::describe(errors)),
            },
            Err(e) => err(format!("not a valid Service: {e}")),
        }),
        "EndpointSlice" => out.push(
            match typed::<discovery::EndpointSlice, objects::EndpointSlice>(v) {
                Ok((s, ours)) => match validate::endpoint_slice(&s).as_slice() {
                    [] => {
                        let sl = slice(ours);
                        if sl.service_name.is_none() {
                            err(format!(
                                "metadata.labels: has no {} label, so it belongs to no Service",
                                crate::convert::LABEL_SERVICE_NAME
                            ))
                        } else {
                            Item::Slice(sl)
                        }
                    }
                    errors => err(validate::describe(errors)),
                },
                Err(e) => err(format!("not a valid EndpointSlice: {e}")),
            },
        ),
        "Node" => out.push(match typed::<core::Node, objects::Node>(v) {
            Ok((n, ours)) => match validate::node(&n).as_slice() {
                [] => Item::Node(node_info(ours)),
                errors => err(validate::describe(errors)),
            },
            Err(e) => err(format!("not a valid Node: {e}")),
        }),
        "ServiceCIDR" => out.push(
            match typed::<networking::ServiceCIDR, objects::ServiceCidr>(v) {
                Ok((c, ours)) => match validate::service_cidr(&c).as_slice() {
                    [] => Item::Cidrs(crate::convert::service_cidrs(&ours)),
                    errors => err(validate::describe(errors)),
                },
                Err(e) => err(format!("not a valid ServiceCIDR: {e}")),
            },
        ),
        "" => out.push(err("has no kind".into())),
        other => out.push(err(format!(
            "kind {other} is not used by verdict (Service, EndpointSlice, Node, ServiceCIDR or List)"
        ))),
    }
}

/// A document as the full API type, which validation reads, and as
/// verdict's own type ([`objects`]), which the proxy is given: the same
/// reading the API source makes of an object the API server serves.
fn typed<Full, Ours>(v: Value) -> Result<(Full, Ours), serde_json::Error>
where
    Full: serde::de::DeserializeOwned,
    Ours: serde::de::DeserializeOwned,
{
    // The full type's complaint, when both have one: it names the API's
    // field as validation does.
    let ours = Ours::deserialize(&v);
    let full = serde_json::from_value(v)?;
    Ok((full, ours?))
}

/// The API versions the API server serves each kind at.
fn expected_api_versions(kind: &str) -> &'static [&'static str] {
    match kind {
        "EndpointSlice" => &["discovery.k8s.io/v1"],
        "ServiceCIDR" => &["networking.k8s.io/v1", "networking.k8s.io/v1beta1"],
        _ => &["v1"],
    }
}

fn api_version_ok(kind: &str, v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .is_some_and(|a| expected_api_versions(kind).contains(&a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_nested_too_deep_is_refused_before_it_is_parsed() {
        let deep = format!("spec: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let t = std::time::Instant::now();
        let e = within(&deep, false, Limits::DEFAULT).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(e, "is nested more than 100 levels deep (line 1); not read");
        let at = |n: usize| format!("a: 1\nb: {}{}\n", "{x: [".repeat(n / 2), "]}".repeat(n / 2));
        assert_eq!(within(&at(100), false, Limits::DEFAULT), Ok(()));
        assert!(within(&at(102), false, Limits::DEFAULT).is_err());
        // Closing brackets that are text do not hide the nesting.
        let hidden = format!("a: {}\n", "[[ \"]]\", ".repeat(60));
        assert!(within(&hidden, false, Limits::DEFAULT).is_err(), "{hidden}");
        // Brackets that are text do not count.
        let text = format!(
            "# {}\na: \"{}\"\nb: '{}'\nc: 'it''s [['\nd: x{}y\n",
            "[".repeat(500),
            "[".repeat(500),
            "{".repeat(500),
            "[".repeat(500)
        );
        assert_eq!(within(&text, false, Limits::DEFAULT), Ok(()));
        // A document marker starts again from the top.
        let docs = format!("a: {}\n---\nb: {}\n", "[".repeat(90), "[".repeat(90));
        assert_eq!(within(&docs, false, Limits::DEFAULT), Ok(()));
    }

    #[test]
    fn too_many_documents_or_bytes_are_refused_with_the_limit() {
        let limits = Limits {
            bytes: 1000,
            documents: 3,
            flow_depth: 100,
        };
        assert_eq!(
            within("a: 1\n---\nb: 2\n---\nc: 3\n", false, limits),
            Ok(())
        );
        assert_eq!(
            within("a: 1\n---\nb: 2\n---\nc: 3\n---\nd: 4\n", false, limits),
            Err("has more than 3 documents (line 6); not read".into())
        );
        let dir = std::env::temp_dir().join(format!("verdict-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.yaml");
        std::fs::write(&big, "#".repeat(1001)).unwrap();
        let parsed = files(std::slice::from_ref(&big), limits);
        assert_eq!(parsed[0].errors.len(), 1, "{parsed:?}");
        assert_eq!(
            parsed[0].errors[0].message,
            "is 1001 bytes, more than the 1000 bytes a manifest file may be; not read"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pieces_cut_at_markers_and_count_the_documents_before_them() {
        let text = "# a comment\na: 1\n---\nb: 2\n--- \nc: 3\n----not\n---\nd: 4\n";
        // At most one byte per piece: every marker cuts.
        let p = pieces(text, text.len());
        let joined: String = p.iter().map(|(_, t)| *t).collect();
        assert_eq!(joined, text, "nothing lost or repeated");
        for (_, t) in &p[1..] {
            assert!(t.starts_with("---"), "{t:?}");
        }
        // Documents: a (1), b (2), c with "----not" inside it (3), d (4).
        let firsts: Vec<usize> = p.iter().map(|(n, _)| *n).collect();
        assert_eq!(firsts, [0, 1, 2, 3], "{p:?}");
        // Without content before the first marker, it opens document 1.
        let p = pieces("---\na: 1\n---\nb: 2\n", 2);
        assert_eq!(p.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    #[should_panic(expected = "unit 3")]
    fn a_worker_panic_is_not_swallowed() {
        let units: Vec<Unit<'_>> = (0..8)
            .map(|file| Unit {
                file,
                text: "",
                json: false,
                first_doc: 0,
            })
            .collect();
        let _ = parallel(&units, 2, |u| {
            if u.file == 3 {
                panic!("unit 3");
            }
            u.file
        });
    }

    #[test]
    fn a_big_file_parses_the_same_in_pieces_and_whole() {
        let mut text = String::new();
        for i in 0..3000 {
            text.push_str(&format!(
                "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: n}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n",
                i / 250,
                i % 250 + 1
            ));
            if i == 2000 {
                text.push_str("---\napiVersion: v1\nkind: Service\nspec: {}\n");
            }
        }
        let file = Path::new("big.yaml");
        let whole = collect(
            file,
            vec![parse_unit(
                file,
                &Unit {
                    file: 0,
                    text: &text,
                    json: false,
                    first_doc: 0,
                },
            )],
        );
        let split = collect(
            file,
            pieces(&text, 7)
                .into_iter()
                .map(|(first_doc, t)| {
                    parse_unit(
                        file,
                        &Unit {
                            file: 0,
                            text: t,
                            json: false,
                            first_doc,
                        },
                    )
                })
                .collect(),
        );
        assert_eq!(whole.services.len(), 3000);
        assert_eq!(whole.errors.len(), 1);
        assert_eq!(whole.errors[0].object, "Service (document 2002)");
        assert_eq!(split, whole);
    }
}
