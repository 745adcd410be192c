//! A fast reader for the YAML that `kubectl get -o yaml` writes, and most
//! manifests are written in: block mappings and sequences, one-line plain
//! and quoted scalars, literal block scalars (`|`, `|-`), and empty `{}`
//! and `[]`. It gives the same [`Value`] as libyaml's parser through
//! serde_norway (the scalars resolved by the same YAML 1.2 rules), several
//! times faster, and builds nothing it does not return.
//!
//! It reads a document only when it is sure of that: anything else (flow
//! collections, anchors, aliases, tags, folded or multi-line scalars, a
//! float, a key that is not a plain name, a repeated key, tabs, directives)
//! makes it give up on that document, and libyaml parses the rest of the
//! text from there, as it would have parsed all of it. A document the
//! reader gives up on costs only the part it read. The tests hold the two
//! equal on every document the reader takes.

use serde_json::{Map, Value};

/// The documents of a YAML text, read one at a time.
pub(super) struct Documents<'a> {
    text: &'a str,
    /// Each line, with the byte offset where it starts.
    lines: Vec<(usize, &'a str)>,
    /// The next line to look at.
    at: usize,
    /// Whether the text before the first marker was looked at.
    started: bool,
}

/// What [`Documents::next_document`] found.
pub(super) enum Next<'a> {
    /// A document, read.
    Read(Value),
    /// The reader gives up at this document: libyaml parses this text,
    /// which starts with it, to the end.
    Rest(&'a str),
    /// No more documents.
    End,
}

impl<'a> Documents<'a> {
    /// `None` for a text this reader never takes: tabs, carriage returns,
    /// a byte order mark, directives (`%`) or document ends (`...`).
    pub(super) fn new(text: &'a str) -> Option<Documents<'a>> {
        if text.starts_with('\u{feff}') || text.bytes().any(|b| b == b'\t' || b == b'\r') {
            return None;
        }
        let mut lines = Vec::new();
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let bare = line.strip_suffix('\n').unwrap_or(line);
            if bare.starts_with('%') || bare.starts_with("...") {
                return None;
            }
            lines.push((offset, bare));
            offset += line.len();
        }
        // A text without a document is one null document to libyaml.
        if lines.iter().all(|l| blank(l.1) && !is_marker(l.1)) {
            return None;
        }
        Some(Documents {
            text,
            lines,
            at: 0,
            started: false,
        })
    }

    /// The next document. Documents are numbered as libyaml numbers them:
    /// one for content before the first `---` line, and one for each such
    /// line (an empty document is null).
    pub(super) fn next_document(&mut self) -> Next<'a> {
        if !self.started {
            self.started = true;
            let end = self.marker_from(0);
            if (0..end).any(|i| !blank(self.lines[i].1)) {
                return self.read(0, end);
            }
            self.at = end;
        }
        let Some(&(offset, marker)) = self.lines.get(self.at) else {
            return Next::End;
        };
        // A marker with more than a comment after it (`--- |`, `--- !tag`).
        if !blank(&marker[3..]) {
            return Next::Rest(&self.text[offset..]);
        }
        let end = self.marker_from(self.at + 1);
        self.read(self.at + 1, end)
    }

    /// The first marker line at or after `from` (or the end).
    fn marker_from(&self, from: usize) -> usize {
        (from..self.lines.len())
            .find(|&i| is_marker(self.lines[i].1))
            .unwrap_or(self.lines.len())
    }

    /// Reads the document of lines `from..end` (after its marker, if any).
    fn read(&mut self, from: usize, end: usize) -> Next<'a> {
        // Where libyaml starts if this reader gives up: the marker line.
        let restart = from.checked_sub(1).map_or(0, |m| self.lines[m].0);
        let mut block = Block {
            lines: &self.lines[..end],
            text_len: self.text.len(),
            at: from,
            depth: 0,
        };
        let value = block.document();
        self.at = end;
        match value {
            Some(v) => Next::Read(v),
            None => Next::Rest(&self.text[restart..]),
        }
    }
}

/// A `---` line, with at most whitespace or a comment after it (what
/// follows is checked by [`Documents::next_document`]).
fn is_marker(line: &str) -> bool {
    line.starts_with("---") && line[3..].chars().next().is_none_or(|c| c == ' ')
}

/// Spaces only, or a comment.
fn blank(line: &str) -> bool {
    let t = line.trim_start_matches(' ');
    t.is_empty() || t.starts_with('#')
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The deepest nesting of block collections the reader follows: libyaml's
/// deserializer refuses more than 128, and the reader's recursion must
/// not run the thread out of stack first.
const MAX_DEPTH: usize = 128;

/// The lines of one document, read by recursive descent on indentation.
struct Block<'l, 'a> {
    lines: &'l [(usize, &'a str)],
    /// The whole text's length: a line that ends where the text does has
    /// no line break (every other one has).
    text_len: usize,
    at: usize,
    /// Collections open around the current line.
    depth: usize,
}

impl<'a> Block<'_, 'a> {
    fn document(&mut self) -> Option<Value> {
        self.skip_blank();
        let value = match self.peek() {
            None => Value::Null,
            Some(line) => self.node(indent(line))?,
        };
        // Nothing may be left but blank lines and comments.
        self.skip_blank();
        self.peek().is_none().then_some(value)
    }

    fn peek(&self) -> Option<&'a str> {
        self.lines.get(self.at).map(|l| l.1)
    }

    fn skip_blank(&mut self) {
        while self.peek().is_some_and(blank) {
            self.at += 1;
        }
    }

    /// A mapping or a sequence whose lines are indented `n`, at the
    /// current line.
    fn node(&mut self, n: usize) -> Option<Value> {
        let line = self.peek()?;
        if is_item(&line[n..]) {
            self.sequence(n)
        } else {
            self.mapping(n, None)
        }
    }

    /// A block mapping at column `n`; `first` is its first entry when it
    /// starts on a sequence item's line (`- key: value`), already taken.
    fn mapping(&mut self, n: usize, first: Option<&str>) -> Option<Value> {
        self.depth += 1;
        let map = (self.depth <= MAX_DEPTH).then(|| self.entries(n, first));
        self.depth -= 1;
        map.flatten()
    }

    /// The entries of [`Block::mapping`].
    fn entries(&mut self, n: usize, mut first: Option<&str>) -> Option<Value> {
        let mut map = Map::new();
        loop {
            let entry = match first.take() {
                Some(e) => e,
                None => {
                    self.skip_blank();
                    let Some(line) = self.peek() else { break };
                    let i = indent(line);
                    if i < n {
                        break;
                    }
                    let e = &line[n..];
                    // Deeper than its keys, or a sequence where a key was
                    // expected: not for this reader.
                    if i > n || is_item(e) {
                        return None;
                    }
                    self.at += 1;
                    e
                }
            };
            let (key, rest) = key_of(entry)?;
            if map.contains_key(key) {
                return None;
            }
            let value = self.value(n, rest, true)?;
            map.insert(key.to_owned(), value);
        }
        Some(Value::Object(map))
    }

    /// A block sequence whose `-` are at column `n`.
    fn sequence(&mut self, n: usize) -> Option<Value> {
        self.depth += 1;
        let items = (self.depth <= MAX_DEPTH).then(|| self.items(n));
        self.depth -= 1;
        items.flatten()
    }

    /// The items of [`Block::sequence`].
    fn items(&mut self, n: usize) -> Option<Value> {
        let mut items = Vec::new();
        loop {
            self.skip_blank();
            let Some(line) = self.peek() else { break };
            let i = indent(line);
            if i < n || (i == n && !is_item(&line[n..])) {
                break;
            }
            if i > n {
                return None;
            }
            self.at += 1;
            let after = &line[n + 1..];
            let body = after.trim_start_matches(' ');
            let column = n + 1 + (after.len() - body.len());
            let item = if is_item(body) {
                // `- - x`: a sequence in a sequence, on one line.
                return None;
            } else if key_of(body).is_some() {
                self.mapping(column, Some(body))?
            } else {
                // A scalar, or nothing: the item's block follows.
                self.value(n, body, false)?
            };
            items.push(item);
        }
        Some(Value::Array(items))
    }

    /// The value after a key (`rest`: what follows its `:`) or a `-`,
    /// whose line is indented `n`. In a mapping, a sequence may stand at
    /// the key's own column (`ports:` then `- port: 80`).
    fn value(&mut self, n: usize, rest: &str, in_mapping: bool) -> Option<Value> {
        let v = rest.trim_start_matches(' ');
        if blank(v) {
            self.skip_blank();
            return match self.peek() {
                Some(line) if indent(line) > n => self.node(indent(line)),
                Some(line) if in_mapping && indent(line) == n && is_item(&line[n..]) => {
                    self.sequence(n)
                }
                _ => Some(Value::Null),
            };
        }
        let (value, after) = match v.as_bytes()[0] {
            b'|' => return self.literal(n, v),
            b'"' => double_quoted(v)?,
            b'\'' => single_quoted(v)?,
            b'{' | b'[' => {
                if let Some(after) = v.strip_prefix("{}") {
                    (Value::Object(Map::new()), after)
                } else if let Some(after) = v.strip_prefix("[]") {
                    (Value::Array(Vec::new()), after)
                } else {
                    return None;
                }
            }
            _ => {
                let (scalar, comment) = match v.find(" #") {
                    Some(i) => (&v[..i], &v[i..]),
                    None => (v, ""),
                };
                (plain(scalar.trim_end_matches(' '))?, comment)
            }
        };
        if !blank(after) || (!after.is_empty() && !after.starts_with(' ')) {
            return None;
        }
        // A line indented deeper would continue the scalar (or be an
        // error): not for this reader.
        self.skip_blank();
        if self.peek().is_some_and(|l| indent(l) > n) {
            return None;
        }
        Some(value)
    }

    /// A literal block scalar (`|` or `|-`, `header`) under a line
    /// indented `n`.
    fn literal(&mut self, n: usize, header: &str) -> Option<Value> {
        let strip = match header.trim_end_matches(' ') {
            "|" => false,
            "|-" => true,
            _ => return None,
        };
        // Its lines: blank ones, and those indented deeper than `n`.
        let from = self.at;
        while self
            .peek()
            .is_some_and(|l| l.trim_start_matches(' ').is_empty() || indent(l) > n)
        {
            self.at += 1;
        }
        let lines = &self.lines[from..self.at];
        let Some(m) = lines
            .iter()
            .map(|l| l.1)
            .find(|l| !l.trim_start_matches(' ').is_empty())
            .map(indent)
        else {
            return Some(Value::String(String::new()));
        };
        let mut text = String::new();
        for &(_, line) in lines {
            if line.trim_start_matches(' ').is_empty() {
                // A blank line with more spaces than the content's
                // indentation holds those spaces, or is an error.
                if line.len() > m {
                    return None;
                }
            } else if indent(line) < m {
                return None;
            } else {
                text.push_str(&line[m..]);
            }
            text.push('\n');
        }
        let kept = text.trim_end_matches('\n').len();
        text.truncate(kept);
        // Clipped, the last line keeps its line break, if it has one: the
        // text may end right after it.
        let broken = lines
            .iter()
            .rev()
            .find(|l| !l.1.trim_start_matches(' ').is_empty())
            .is_some_and(|&(at, line)| at + line.len() < self.text_len);
        if !strip && broken {
            text.push('\n');
        }
        Some(Value::String(text))
    }
}

/// A sequence item: `-` alone or followed by a space.
fn is_item(s: &str) -> bool {
    s == "-" || s.starts_with("- ")
}

/// A mapping entry's key, when it is a plain name (a letter or `_`, then
/// letters, digits, `.`, `_`, `-`, `/`) followed by `:` and a space or
/// the end of the line, and what follows the `:`.
fn key_of(entry: &str) -> Option<(&str, &str)> {
    let b = entry.as_bytes();
    if !b
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        return None;
    }
    let end = b
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || b"._-/".contains(c)))?;
    let key = &entry[..end];
    let rest = entry[end..].strip_prefix(':')?;
    if !(rest.is_empty() || rest.starts_with(' ')) || special_word(key) {
        return None;
    }
    Some((key, rest))
}

/// The plain words YAML 1.2's core schema reads as null or a boolean.
fn special_word(s: &str) -> bool {
    matches!(
        s,
        "null" | "Null" | "NULL" | "true" | "True" | "TRUE" | "false" | "False" | "FALSE"
    )
}

/// A plain scalar (`s` is its whole text), resolved as serde_norway
/// resolves one into a `Value`: null, a boolean, a non-negative integer,
/// or a string. `None` for what might be anything else (a float, a signed
/// or prefixed number) or is not a plain scalar on one line.
fn plain(s: &str) -> Option<Value> {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        _ => {}
    }
    // `: ` would start a mapping, a trailing `:` too.
    if s.contains(": ") || s.ends_with(':') {
        return None;
    }
    let first = s.as_bytes()[0];
    if first.is_ascii_alphabetic() || first == b'_' || first == b'/' {
        // No number starts so (`inf` and `nan` are not finite, so not
        // floats to serde_norway).
        return Some(Value::String(s.to_owned()));
    }
    if !first.is_ascii_digit() {
        return None;
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // A leading zero makes digits a string in YAML 1.2.
        if s.len() > 1 && first == b'0' {
            return Some(Value::String(s.to_owned()));
        }
        return s.parse::<u64>().ok().map(Value::from);
    }
    // `0x…`, `0o…`, `0b…` followed by digits of their base are integers
    // (or too large); followed by anything else, strings (a UID may start
    // `0b0e…`).
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = s.strip_prefix(prefix) {
            if !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix)) {
                return None;
            }
            return Some(Value::String(s.to_owned()));
        }
    }
    // What `f64` reads is a float.
    if s.parse::<f64>().is_ok() {
        return None;
    }
    Some(Value::String(s.to_owned()))
}

/// A double-quoted scalar that ends on its line, and what follows it.
fn double_quoted(v: &str) -> Option<(Value, &str)> {
    let mut out = String::new();
    let mut chars = v[1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((Value::String(out), &v[1 + i + 1..])),
            '\\' => {
                let (_, e) = chars.next()?;
                out.push(match e {
                    '"' => '"',
                    '\\' => '\\',
                    '/' => '/',
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    'u' => {
                        let mut code = 0u32;
                        for _ in 0..4 {
                            code = code * 16 + chars.next()?.1.to_digit(16)?;
                        }
                        char::from_u32(code)?
                    }
                    _ => return None,
                });
            }
            c => out.push(c),
        }
    }
    None
}

/// A single-quoted scalar that ends on its line, and what follows it.
fn single_quoted(v: &str) -> Option<(Value, &str)> {
    let mut out = String::new();
    let body = &v[1..];
    let mut i = 0;
    loop {
        let j = body[i..].find('\'')? + i;
        out.push_str(&body[i..j]);
        if body[j + 1..].starts_with('\'') {
            out.push('\'');
            i = j + 2;
        } else {
            return Some((Value::String(out), &body[j + 1..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// What libyaml gives for `text`, document by document, up to the
    /// first error (`None`).
    fn libyaml(text: &str) -> Vec<Option<Value>> {
        let mut out = Vec::new();
        for d in serde_norway::Deserializer::from_str(text) {
            match Value::deserialize(d) {
                Ok(v) => out.push(Some(v)),
                Err(_) => {
                    out.push(None);
                    break;
                }
            }
        }
        out
    }

    /// What the reader gives, libyaml taking over where it gives up; and
    /// how many documents the reader read itself.
    fn fast(text: &str) -> (Vec<Option<Value>>, usize) {
        let Some(mut docs) = Documents::new(text) else {
            return (libyaml(text), 0);
        };
        let (mut out, mut read) = (Vec::new(), 0);
        loop {
            match docs.next_document() {
                Next::Read(v) => {
                    out.push(Some(v));
                    read += 1;
                }
                Next::Rest(rest) => {
                    out.extend(libyaml(rest));
                    break;
                }
                Next::End => break,
            }
        }
        (out, read)
    }

    /// The reader and libyaml agree on `text`; the reader read `read`
    /// of its documents itself.
    fn same(text: &str, read: usize) {
        let (got, n) = fast(text);
        assert_eq!(got, libyaml(text), "on:\n{text}");
        assert_eq!(n, read, "documents read without libyaml, on:\n{text}");
    }

    const KUBECTL: &str = "\
---
apiVersion: v1
kind: Service
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {\"apiVersion\":\"v1\",\"kind\":\"Service\"}
    note: |-
      two

      lines
  creationTimestamp: \"2026-12-05T10:00:00Z\"
  labels:
    app.kubernetes.io/name: web
  name: web
  namespace: default
  resourceVersion: \"1234\"
  uid: 0b0e7f3a-1d2c-4e5f-8a9b-0c1d2e3f4a5b
spec:
  clusterIP: 10.96.0.10
  clusterIPs:
  - 10.96.0.10
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  loadBalancerSourceRanges:
  - 0.0.0.0/0
  ports:
  - name: http
    nodePort: 30080
    port: 80
    protocol: TCP
    targetPort: 8080
  - name: dns
    port: 53
    protocol: UDP
    targetPort: dns
  selector: {}
  sessionAffinity: None
  type: NodePort
status:
  loadBalancer: {}
---
addressType: IPv4
apiVersion: discovery.k8s.io/v1
endpoints:
- addresses:
  - 10.0.0.1
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: n1
  targetRef:
    kind: Pod
    name: web-0
  zone: ''
- addresses: []
  conditions:
    ready: false
kind: EndpointSlice
metadata:
  labels:
    kubernetes.io/service-name: web
  name: web-abc
  namespace: default
ports:
- name: http
  port: 8080
  protocol: TCP
";

    #[test]
    fn what_kubectl_writes_is_read_as_libyaml_reads_it() {
        same(KUBECTL, 2);
        // As a List.
        let list = "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: a\n  spec:\n    ports:\n    - port: 80\nkind: List\nmetadata:\n  resourceVersion: \"\"\n";
        same(list, 1);
    }

    #[test]
    fn scalars_resolve_as_in_libyaml() {
        for s in [
            "a",
            "~",
            "null",
            "Null",
            "NULL",
            "true",
            "True",
            "TRUE",
            "false",
            "FALSE",
            "0",
            "7",
            "80",
            "007",
            "0123",
            "18446744073709551615",
            "10.0.0.1",
            "1.2.3",
            "10Gi",
            "0.0.0.0/0",
            "8080/TCP",
            "inf",
            "nan",
            "Infinity",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "_x",
            "/path",
            "a b  c",
            "a#b",
            "http://x:80/y",
            "1a",
            "2026-12-05",
            "12:30",
            "tcp:80",
            "0b0e7f3a-1d2c",
            "0x",
            "0xg",
            "0o9",
            "0x-1",
            "0b+1",
        ] {
            let text = format!("k: {s}\n");
            let (got, _) = fast(&text);
            assert_eq!(got, libyaml(&text), "{s:?}");
        }
        // What the reader leaves to libyaml, and still comes out the same.
        for s in [
            "1.5",
            "1e3",
            "0x1F",
            "0o17",
            "0b11",
            "-1",
            "+1",
            ".5",
            ".inf",
            "-.inf",
            ".nan",
            "18446744073709551616",
            "&a x",
            "*a",
            "!!str 80",
            "[1, 2]",
            "{a: 1}",
            "a: b",
            "'a''b'",
            "\"a\\\"b\\u00e9\\n\"",
            "\"\\x41\"",
            "'x' # c",
            "x # c",
            ">\n  folded",
        ] {
            let text = format!("k: {s}\n");
            let (got, _) = fast(&text);
            assert_eq!(got, libyaml(&text), "{s:?}");
        }
    }

    #[test]
    fn quoted_scalars_are_strings() {
        same(
            "a: '80'\nb: \"true\"\nc: 'it''s'\nd: \"q\\\"\\\\/\\t\\u00e9\"\ne: ''\n",
            1,
        );
        same("a: \"x\" # note\nb: 'y'   \n", 1);
    }

    #[test]
    fn literal_blocks_keep_and_strip_as_libyaml() {
        same("a: |\n  one\n  two\nb: x\n", 1);
        same("a: |-\n  one\n\n  two\n\n\nb: x\n", 1);
        same("a: |\n\n  after a blank\n", 1);
        same("a: |\n    deeper\n  shallower\n", 0);
        same("a: |\nb: empty\n", 1);
        same("- |\n  in a list\n- x\n", 1);
        same("a: |+\n  kept\n\n", 0);
        same("a: |2\n   indented\n", 0);
        same("a: |\n  # not a comment\n  x\n", 1);
        // The text ends right after the block: no line break to keep.
        same("a: |\n  text", 1);
        same("a:\n- |\n  # hash\n  text", 1);
        same("a: |\n  text\n  ", 1);
        same("a: |-\n  text", 1);
    }

    #[test]
    fn nesting_and_layout_as_libyaml() {
        same("a:\n  b:\n    c: 1\n  d: 2\ne: 3\n", 1);
        same("a:\n- 1\n- 2\nb: 3\n", 1);
        same("a:\n  - 1\n  - 2\nb: 3\n", 1);
        same("-   a: 1\n    b: 2\n- c\n-\n  d: 4\n-\n", 1);
        same("- - 1\n", 0);
        same("a:\n# comment\n\n  b: 1 # comment\n", 1);
        same("a:\nb:\n", 1);
        same("a: 1\n  b: 2\n", 0);
        same("a: x\n  continued\n", 0);
        same("a: 1\na: 2\n", 0);
        same("\"quoted key\": 1\n", 0);
        same("80: a\n", 0);
        same("just a scalar\n", 0);
        same("a:b\n", 0);
        same("a:   \n  b: 1\nc: # note\n  d: 2\n", 1);
        same("a: -\nb: - x\n", 0);
        same("- \n- x \n-  y\n", 1);
        same("  a: 1\n  b:\n  - 2\n", 1);
        same("a:\n  - b: 1\n    c:\n    - 2\n  - d\n", 1);
    }

    #[test]
    fn deep_nesting_is_left_to_libyaml() {
        // 200 mappings and 200 sequences deep: libyaml refuses both
        // (128 at most); the reader gives up before its stack would.
        let mut mappings = String::new();
        let mut sequences = String::new();
        for depth in 0..200 {
            mappings.push_str(&format!("{}k{depth}:\n", " ".repeat(depth)));
            sequences.push_str(&format!("{}-\n", " ".repeat(depth)));
        }
        same(&mappings, 0);
        same(&sequences, 0);
        // 100 deep is read.
        let nested: String = (0..100)
            .map(|d| format!("{}k{d}:\n", " ".repeat(d)))
            .collect();
        same(&nested, 1);
        // 2,000 deep is given up, not followed.
        let deep: String = (0..2_000)
            .map(|d| format!("{}k:\n", " ".repeat(d)))
            .collect();
        assert!(matches!(
            Documents::new(&deep).unwrap().next_document(),
            Next::Rest(_)
        ));
    }

    #[test]
    fn documents_are_numbered_as_libyaml_numbers_them() {
        // Content before the first marker is a document; every marker
        // opens one, empty or not.
        same("a: 1\n---\nb: 2\n", 2);
        same("# only a comment\n---\na: 1\n---\n---\nb: 2\n", 3);
        same("---\na: 1\n--- # comment\nb: 2\n", 2);
        same("\n\n---\n", 1);
        same("", 0);
        // The reader gives up at the second document: libyaml reads it
        // and the rest, and the first is not read twice.
        same("---\na: 1\n---\nb: [1]\n---\nc: 3\n", 1);
        same("a: 1\n--- |\n  text\n", 1);
        // Texts it never takes.
        same("a: 1\r\n", 0);
        same("a:\t1\n", 0);
        same("%YAML 1.2\n---\na: 1\n", 0);
        same("a: 1\n...\n", 0);
    }

    #[test]
    fn the_corpus_reads_as_libyaml_reads_it() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // A file libyaml refuses is libyaml's to refuse.
            let want = libyaml(&text);
            let (got, n) = fast(&text);
            assert_eq!(got, want, "{}", path.display());
            read += n;
        }
        assert!(
            read > 50,
            "the reader read only {read} corpus documents itself"
        );
    }

    mod generated {
        use super::{fast, libyaml};
        use proptest::prelude::*;

        /// A document's tree, written out by [`write`] in one of the
        /// layouts YAML allows.
        #[derive(Clone, Debug)]
        enum Tree {
            Scalar(&'static str),
            Literal(Vec<&'static str>, bool),
            Map(Vec<(&'static str, Tree)>),
            Seq(Vec<Tree>),
        }

        /// Scalars the reader takes, and scalars it leaves to libyaml.
        const SCALARS: &[&str] = &[
            "a",
            "80",
            "007",
            "0",
            "true",
            "False",
            "null",
            "~",
            "''",
            "'it''s'",
            "\"q\\\"x\"",
            "\"\\u00e9\\n\"",
            "10.0.0.1",
            "0b0e7",
            "a b",
            "a #c",
            "a#b",
            "http://x:80",
            "inf",
            "2026-12-05",
            "12:30",
            "0.0.0.0/0",
            "x-y.z",
        ];
        const TRICKY: &[&str] = &[
            "\"\\x41\"",
            "1.5",
            "0x1F",
            "-1",
            "+1",
            "x: y",
            "[]",
            "{}",
            "[1]",
            "{a: 1}",
            "&a b",
            "*a",
            "!t x",
            ">",
            "'",
            "\"",
            ":",
            "-",
            "?",
            ".nan",
            "1e3",
            "x:",
            "%x",
            "@x",
            "`x",
            "é",
            "18446744073709551616",
        ];
        /// Keys the reader takes, and keys it leaves to libyaml.
        const KEYS: &[&str] = &["a", "b", "c", "apiVersion", "k.io/x", "_u", "x-y"];
        const ODD_KEYS: &[&str] = &[
            "80", "true", "\"q\"", "'s'", "a b", "<<", "? x", "-x", "x#y",
        ];
        const LINES: &[&str] = &[
            "text", "text", "", "  deeper", "# hash", "a: b", "- x", "'q",
        ];

        fn key() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                20 => prop::sample::select(KEYS),
                1 => prop::sample::select(ODD_KEYS),
            ]
        }

        fn tree() -> impl Strategy<Value = Tree> {
            let leaf = prop_oneof![
                12 => prop::sample::select(SCALARS).prop_map(Tree::Scalar),
                1 => prop::sample::select(TRICKY).prop_map(Tree::Scalar),
                1 => (prop::collection::vec(prop::sample::select(LINES), 0..4), any::<bool>())
                    .prop_map(|(l, strip)| Tree::Literal(l, strip)),
            ];
            leaf.prop_recursive(5, 40, 4, |inner| {
                prop_oneof![
                    prop::collection::vec((key(), inner.clone()), 0..4).prop_map(Tree::Map),
                    prop::collection::vec(inner, 0..4).prop_map(Tree::Seq),
                ]
            })
        }

        /// How a tree is laid out: the indentation step, and whether a
        /// sequence under a key is indented.
        #[derive(Clone, Copy, Debug)]
        struct Style {
            step: usize,
            indent_seqs: bool,
        }

        fn write(t: &Tree, n: usize, style: Style, out: &mut Vec<String>) {
            let pad = " ".repeat(n);
            match t {
                Tree::Map(entries) => {
                    for (k, v) in entries {
                        match v {
                            Tree::Scalar(s) => out.push(format!("{pad}{k}: {s}")),
                            Tree::Literal(lines, strip) => {
                                out.push(format!("{pad}{k}: |{}", if *strip { "-" } else { "" }));
                                literal(lines, n + style.step, out);
                            }
                            Tree::Map(m) if m.is_empty() => out.push(format!("{pad}{k}: {{}}")),
                            Tree::Seq(q) if q.is_empty() => out.push(format!("{pad}{k}: []")),
                            Tree::Map(_) => {
                                out.push(format!("{pad}{k}:"));
                                write(v, n + style.step, style, out);
                            }
                            Tree::Seq(_) => {
                                out.push(format!("{pad}{k}:"));
                                let m = if style.indent_seqs { n + style.step } else { n };
                                write(v, m, style, out);
                            }
                        }
                    }
                }
                Tree::Seq(items) => {
                    for v in items {
                        match v {
                            Tree::Scalar(s) => out.push(format!("{pad}- {s}")),
                            Tree::Literal(lines, strip) => {
                                out.push(format!("{pad}- |{}", if *strip { "-" } else { "" }));
                                literal(lines, n + 2, out);
                            }
                            Tree::Map(m) if !m.is_empty() => {
                                // The compact form: the first entry on
                                // the dash's line.
                                let mut inner = Vec::new();
                                write(v, n + 2, style, &mut inner);
                                if let Some(first) = inner.first_mut() {
                                    *first = format!("{pad}- {}", &first[n + 2..]);
                                }
                                out.extend(inner);
                            }
                            _ => {
                                out.push(format!("{pad}-"));
                                write(v, n + 2, style, out);
                            }
                        }
                    }
                }
                Tree::Scalar(s) => out.push(format!("{pad}{s}")),
                Tree::Literal(lines, _) => literal(lines, n, out),
            }
        }

        fn literal(lines: &[&str], n: usize, out: &mut Vec<String>) {
            let pad = " ".repeat(n);
            out.extend(lines.iter().map(|l| {
                if l.is_empty() {
                    String::new()
                } else {
                    format!("{pad}{l}")
                }
            }));
        }

        fn text(docs: &[(Tree, Style, bool)]) -> String {
            let mut out = Vec::new();
            for (i, (t, style, marker)) in docs.iter().enumerate() {
                if i > 0 || *marker {
                    out.push("---".into());
                }
                write(t, 0, *style, &mut out);
            }
            out.join("\n") + "\n"
        }

        fn style() -> impl Strategy<Value = Style> {
            (prop::sample::select(&[1usize, 2, 4][..]), any::<bool>())
                .prop_map(|(step, indent_seqs)| Style { step, indent_seqs })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3000))]

            /// Whatever the reader takes of a generated text, it reads as
            /// libyaml does, and libyaml reads the rest.
            #[test]
            fn generated_texts_read_as_libyaml_reads_them(
                docs in prop::collection::vec((tree(), style(), any::<bool>()), 1..4),
            ) {
                let text = text(&docs);
                prop_assert_eq!(fast(&text).0, libyaml(&text), "on:\n{}", text);
            }

            /// The same, with one character put in or taken out somewhere.
            #[test]
            fn damaged_texts_read_as_libyaml_reads_them(
                docs in prop::collection::vec((tree(), style(), any::<bool>()), 1..3),
                at in any::<prop::sample::Index>(),
                put in prop::option::of(prop::sample::select(&[' ', ':', '-', '#', '\'', '"', '\n', 'x', '|', '{'][..])),
            ) {
                let mut text = text(&docs);
                let chars: Vec<char> = text.chars().collect();
                let i = at.index(chars.len() + 1);
                let mut damaged: Vec<char> = chars.clone();
                match put {
                    Some(c) => damaged.insert(i, c),
                    None if i < damaged.len() => {
                        damaged.remove(i);
                    }
                    None => {}
                }
                text = damaged.into_iter().collect();
                prop_assert_eq!(fast(&text).0, libyaml(&text), "on:\n{}", text);
            }
        }

        /// The generated texts are mostly the reader's to read: the
        /// properties above test it, not only libyaml against itself.
        #[test]
        fn the_reader_reads_most_generated_texts() {
            use proptest::strategy::ValueTree;
            let mut runner = proptest::test_runner::TestRunner::deterministic();
            let strategy = prop::collection::vec((tree(), style(), any::<bool>()), 1..4);
            let (mut docs, mut read) = (0, 0);
            for _ in 0..500 {
                let value = strategy.new_tree(&mut runner).unwrap().current();
                let text = text(&value);
                let (got, n) = fast(&text);
                docs += got.len();
                read += n;
            }
            assert!(
                read * 4 > docs,
                "the reader read {read} of {docs} documents"
            );
        }
    }
}
