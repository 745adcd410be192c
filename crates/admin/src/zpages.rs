//! `/flagz` and `/statusz`, as kube-proxy 1.36 serves them on its metrics
//! address (component-base's z-pages, beta and on by default there): plain
//! text for people by default, and the versioned objects
//! (`config.k8s.io/v1alpha1` or `v1beta1`, kinds `Flagz` and `Statusz`)
//! for tools that ask for them with
//! `Accept: application/json;v=v1beta1;g=config.k8s.io;as=Statusz` (or
//! `application/yaml;...`), answered with that media type and its
//! parameters, indented as kube-proxy indents them. A bare
//! `application/json`, or anything else, is 406 Not Acceptable with a
//! `Status` (YAML when YAML was asked for), as kube-proxy answers.
//!
//! The text is not meant to be parsed, and says so: as component-base
//! does, the separator between a name and its value is picked at random
//! from `:`, `: `, `=` and ` ` for each process.
//!
//! Where verdict cannot say what kube-proxy says: `goVersion` names the
//! compiler verdict was built with, `binaryVersion` verdict's version;
//! `emulationVersion` is the kube-proxy version whose behaviour verdict
//! follows (`docs/configuration.md`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use crate::health::Response;
use crate::service_health::quote as json;
use crate::time::{Utc, rfc3339_nano};

const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";
const PLAIN: &str = "text/plain; charset=utf-8";
/// The versions of the structured objects served.
const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];
const GROUP: &str = "config.k8s.io";
/// The Kubernetes minor version whose kube-proxy verdict follows.
pub const EMULATION_VERSION: &str = "1.36";

/// What the z-pages show of this process.
#[derive(Clone, Debug)]
pub struct ZPages {
    /// The component's name in the pages (`kube-proxy`).
    pub component: String,
    /// Every flag and its value.
    pub flags: BTreeMap<String, String>,
    /// When the process started.
    pub started: SystemTime,
    /// The binary's version.
    pub binary_version: String,
    /// The compiler it was built with (kube-proxy's `goVersion`).
    pub compiler: String,
    /// The paths the address serves, for `/statusz` (top-level only).
    pub paths: Vec<String>,
    /// The separator of the text pages, picked once.
    separator: &'static str,
}

/// The media types of the structured objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
}

/// How a request wants a page.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    Text,
    /// The structured object, of this version and media type.
    Object(&'static str, Format),
}

/// A value of the structured objects.
enum Doc {
    Str(String),
    Num(u64),
    List(Vec<String>),
    Map(Vec<(String, Doc)>),
}

impl Doc {
    fn map(entries: Vec<(&str, Doc)>) -> Doc {
        Doc::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        )
    }

    /// As Go's `json.MarshalIndent(v, "", "  ")`.
    fn json(&self, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent + 1);
        let close = "  ".repeat(indent);
        match self {
            Doc::Str(s) => out.push_str(&json(s)),
            Doc::Num(n) => {
                let _ = write!(out, "{n}");
            }
            Doc::List(items) if items.is_empty() => out.push_str("[]"),
            Doc::List(items) => {
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    let comma = if i + 1 < items.len() { "," } else { "" };
                    let _ = writeln!(out, "{pad}{}{comma}", json(item));
                }
                let _ = write!(out, "{close}]");
            }
            Doc::Map(entries) if entries.is_empty() => out.push_str("{}"),
            Doc::Map(entries) => {
                out.push_str("{\n");
                for (i, (k, v)) in entries.iter().enumerate() {
                    let _ = write!(out, "{pad}{}: ", json(k));
                    v.json(indent + 1, out);
                    out.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
                }
                let _ = write!(out, "{close}}}");
            }
        }
    }

    /// As sigs.k8s.io/yaml writes it: keys sorted, block style.
    fn yaml(&self, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent);
        if let Doc::Map(entries) = self {
            let mut sorted: Vec<&(String, Doc)> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in sorted {
                match v {
                    Doc::Str(s) => {
                        let _ = writeln!(out, "{pad}{}: {}", yaml_scalar(k), yaml_scalar(s));
                    }
                    Doc::Num(n) => {
                        let _ = writeln!(out, "{pad}{}: {n}", yaml_scalar(k));
                    }
                    Doc::List(items) if items.is_empty() => {
                        let _ = writeln!(out, "{pad}{}: []", yaml_scalar(k));
                    }
                    Doc::List(items) => {
                        let _ = writeln!(out, "{pad}{}:", yaml_scalar(k));
                        for item in items {
                            let _ = writeln!(out, "{pad}- {}", yaml_scalar(item));
                        }
                    }
                    Doc::Map(m) if m.is_empty() => {
                        let _ = writeln!(out, "{pad}{}: {{}}", yaml_scalar(k));
                    }
                    Doc::Map(_) => {
                        let _ = writeln!(out, "{pad}{}:", yaml_scalar(k));
                        v.yaml(indent + 1, out);
                    }
                }
            }
        }
    }
}

/// A YAML plain scalar, double-quoted where a reader would take it for
/// something else than a string (a number, a boolean, null, a time) or
/// could not read it plain.
fn yaml_scalar(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let looks_typed = s.parse::<f64>().is_ok()
        || [
            "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", ".inf", "-.inf",
            ".nan",
        ]
        .contains(&lower.as_str())
        || (s.len() >= 10
            && s.as_bytes()[..4].iter().all(u8::is_ascii_digit)
            && s.as_bytes()[4] == b'-');
    let awkward = s.is_empty()
        || s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@` ".contains(c))
        || s.ends_with(' ')
        || s.contains(": ")
        || s.contains(" #")
        || s.chars().any(|c| (c as u32) < 0x20);
    if looks_typed || awkward {
        json(s)
    } else {
        s.to_owned()
    }
}

/// The 406 answer's `Status`, as kube-proxy writes it in JSON.
const NOT_ACCEPTABLE_JSON: &str = "{\n  \"kind\": \"Status\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {},\n  \"status\": \"Failure\",\n  \"message\": \"only the following media types are accepted: application/json, application/yaml, text/plain\",\n  \"reason\": \"NotAcceptable\",\n  \"code\": 406\n}";
/// The same in YAML, for a request that asked for YAML.
const NOT_ACCEPTABLE_YAML: &str = "apiVersion: v1\ncode: 406\nkind: Status\nmessage: 'only the following media types are accepted: application/json, application/yaml,\n  text/plain'\nmetadata: {}\nreason: NotAcceptable\nstatus: Failure\n";

/// The media type (with its parameters) of a structured answer.
fn media_type(kind: &str, version: &str, format: Format) -> &'static str {
    match (kind, version, format) {
        ("Flagz", "v1alpha1", Format::Json) => {
            "application/json;g=config.k8s.io;v=v1alpha1;as=Flagz"
        }
        ("Flagz", "v1alpha1", Format::Yaml) => {
            "application/yaml;g=config.k8s.io;v=v1alpha1;as=Flagz"
        }
        ("Flagz", _, Format::Json) => "application/json;g=config.k8s.io;v=v1beta1;as=Flagz",
        ("Flagz", _, Format::Yaml) => "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz",
        (_, "v1alpha1", Format::Json) => "application/json;g=config.k8s.io;v=v1alpha1;as=Statusz",
        (_, "v1alpha1", Format::Yaml) => "application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz",
        (_, _, Format::Json) => "application/json;g=config.k8s.io;v=v1beta1;as=Statusz",
        (_, _, Format::Yaml) => "application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz",
    }
}

impl ZPages {
    /// The pages of a process started at `started`, built by `compiler`.
    /// `/statusz` does not list itself (kube-proxy's does not).
    pub fn new(
        component: &str,
        flags: BTreeMap<String, String>,
        started: SystemTime,
        binary_version: &str,
        compiler: &str,
        mut paths: Vec<String>,
    ) -> ZPages {
        paths.retain(|p| p != "/statusz");
        paths.sort();
        paths.dedup();
        let seps = [":", ": ", "=", " "];
        let pick = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| {
                d.subsec_nanos() as usize ^ std::process::id() as usize
            });
        ZPages {
            component: component.to_owned(),
            flags,
            started,
            binary_version: binary_version.to_owned(),
            compiler: compiler.to_owned(),
            paths,
            separator: seps[pick % seps.len()],
        }
    }

    fn object(&self, kind: &str, version: &str, format: Format, doc: Doc) -> Response {
        let mut body = String::new();
        match format {
            Format::Json => doc.json(0, &mut body),
            Format::Yaml => doc.yaml(0, &mut body),
        }
        Response::text(200, body, media_type(kind, version, format))
    }

    fn header(&self, kind: &str, version: &str) -> Vec<(&'static str, Doc)> {
        vec![
            ("kind", Doc::Str(kind.to_owned())),
            ("apiVersion", Doc::Str(format!("{GROUP}/{version}"))),
            (
                "metadata",
                Doc::map(vec![("name", Doc::Str(self.component.clone()))]),
            ),
        ]
    }

    /// `/flagz` for a request with this `Accept` header.
    pub fn flagz(&self, accept: Option<&str>) -> Response {
        match negotiate(accept, "Flagz") {
            Some(Wanted::Text) => {
                let mut out = format!("\n{} flagz\n{WARNING}\n", self.component);
                for (name, value) in &self.flags {
                    let _ = writeln!(out, "{name}{}{value}", self.separator);
                }
                Response::text(200, out, PLAIN)
            }
            Some(Wanted::Object(version, format)) => {
                let mut doc = self.header("Flagz", version);
                doc.push((
                    "flags",
                    Doc::Map(
                        self.flags
                            .iter()
                            .map(|(k, v)| (k.clone(), Doc::Str(v.clone())))
                            .collect(),
                    ),
                ));
                self.object("Flagz", version, format, Doc::map(doc))
            }
            None => not_acceptable(accept),
        }
    }

    /// `/statusz` at `now` for a request with this `Accept` header.
    pub fn statusz(&self, accept: Option<&str>, now: SystemTime) -> Response {
        let up = now
            .duration_since(self.started)
            .unwrap_or_default()
            .as_secs();
        match negotiate(accept, "Statusz") {
            Some(Wanted::Text) => {
                let d = self.separator;
                let mut out = format!("\n{} statusz\n{WARNING}\n\n", self.component);
                let _ = writeln!(out, "Started{d} {}", unix_date(self.started));
                let _ = writeln!(
                    out,
                    "Up{d} {} hr {:02} min {:02} sec",
                    up / 3600,
                    up / 60 % 60,
                    up % 60
                );
                let _ = writeln!(out, "Go version{d} {}", self.compiler);
                let _ = writeln!(out, "Binary version{d} {}", self.binary_version);
                let _ = writeln!(out, "Emulation version{d} {EMULATION_VERSION}");
                if !self.paths.is_empty() {
                    let _ = writeln!(out, "Paths{d} {}", self.paths.join(" "));
                }
                Response::text(200, out, PLAIN)
            }
            Some(Wanted::Object(version, format)) => {
                let started = rfc3339_nano(
                    SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_secs(
                            self.started
                                .duration_since(SystemTime::UNIX_EPOCH)
                                .unwrap_or_default()
                                .as_secs(),
                        ),
                );
                let mut doc = self.header("Statusz", version);
                doc.extend([
                    ("startTime", Doc::Str(started)),
                    ("uptimeSeconds", Doc::Num(up)),
                    ("goVersion", Doc::Str(self.compiler.clone())),
                    ("binaryVersion", Doc::Str(self.binary_version.clone())),
                    ("emulationVersion", Doc::Str(EMULATION_VERSION.to_owned())),
                    ("paths", Doc::List(self.paths.clone())),
                ]);
                self.object("Statusz", version, format, Doc::map(doc))
            }
            None => not_acceptable(accept),
        }
    }
}

/// 406, with kube-proxy's `Status`: YAML if the request's first media
/// range is YAML, else JSON.
fn not_acceptable(accept: Option<&str>) -> Response {
    let yaml = accept
        .and_then(|a| a.split(',').next())
        .and_then(|r| r.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/yaml"));
    if yaml {
        Response::text(406, NOT_ACCEPTABLE_YAML.into(), "application/yaml")
    } else {
        Response::json(406, NOT_ACCEPTABLE_JSON.into())
    }
}

/// What the `Accept` header asks for: the first acceptable range in the
/// order of preference (`q`, then as written). None at all is text.
fn negotiate(accept: Option<&str>, kind: &str) -> Option<Wanted> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Some(Wanted::Text);
    };
    let mut ranges: Vec<(f32, usize, &str)> = accept
        .split(',')
        .enumerate()
        .map(|(i, r)| {
            let q = r
                .split(';')
                .skip(1)
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (q, i, r.trim())
        })
        .filter(|(q, _, _)| *q > 0.0)
        .collect();
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranges.into_iter().find_map(|(_, _, r)| wanted(r, kind))
}

fn wanted(range: &str, kind: &str) -> Option<Wanted> {
    let mut parts = range.split(';').map(str::trim);
    let media = parts.next()?.to_ascii_lowercase();
    let params: BTreeMap<String, String> = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_owned(),
            )
        })
        .filter(|(k, _)| k != "q")
        .collect();
    let format = match media.as_str() {
        "text/plain" | "text/*" | "*/*" => {
            let plain = params.is_empty()
                || (params.len() == 1
                    && params
                        .get("charset")
                        .is_some_and(|c| c.eq_ignore_ascii_case("utf-8")));
            return plain.then_some(Wanted::Text);
        }
        "application/json" => Format::Json,
        "application/yaml" => Format::Yaml,
        _ => return None,
    };
    let g = params.get("g").map(String::as_str);
    let as_ = params.get("as").map(String::as_str);
    let v = params.get("v").map(String::as_str)?;
    let version = VERSIONS.into_iter().find(|known| *known == v)?;
    (g == Some(GROUP) && as_ == Some(kind)).then_some(Wanted::Object(version, format))
}

/// Go's `time.UnixDate` in UTC: `Wed Oct 16 21:03:43 UTC 2024`.
fn unix_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let u = Utc::of(t);
    let days = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 86_400;
    format!(
        "{} {} {:>2} {:02}:{:02}:{:02} UTC {}",
        DAYS[(days % 7) as usize],
        MONTHS[(u.month.clamp(1, 12) - 1) as usize],
        u.day,
        u.hour,
        u.minute,
        u.second,
        u.year
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pages() -> ZPages {
        let flags = [
            ("bind-address", "0.0.0.0"),
            ("proxy-mode", "nftables"),
            ("nodeport-addresses", "[primary]"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        ZPages::new(
            "kube-proxy",
            flags,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_729_112_623),
            "verdict 0.1.0",
            "rustc 1.95.0",
            vec![
                "/metrics".into(),
                "/healthz".into(),
                "/flagz".into(),
                "/statusz".into(),
            ],
        )
    }

    #[test]
    fn text_is_served_by_default_with_the_warning_and_every_flag() {
        let p = pages();
        for accept in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain; charset=utf-8"),
        ] {
            let r = p.flagz(accept);
            assert_eq!((r.code, r.content_type), (200, PLAIN), "{accept:?}");
            let body = r.text_body();
            assert!(body.starts_with("\nkube-proxy flagz\nWarning: This endpoint is not meant to be machine parseable"), "{body}");
            let sep = p.separator;
            assert!(
                body.contains(&format!("\nbind-address{sep}0.0.0.0\n")),
                "{body}"
            );
            let lines: Vec<&str> = body.lines().skip(3).collect();
            assert_eq!(lines.len(), 3, "sorted, one per flag: {lines:?}");
            assert!(lines[0].starts_with("bind-address"));
        }
        let now = p.started + Duration::from_secs(3725);
        let body = p.statusz(None, now).text_body();
        let sep = p.separator;
        assert!(body.starts_with("\nkube-proxy statusz\nWarning:"), "{body}");
        assert!(
            body.contains(&format!("Started{sep} Wed Oct 16 21:03:43 UTC 2024\n")),
            "{body}"
        );
        assert!(
            body.contains(&format!("Up{sep} 1 hr 02 min 05 sec\n")),
            "{body}"
        );
        assert!(
            body.contains(&format!("Go version{sep} rustc 1.95.0\n")),
            "{body}"
        );
        assert!(
            body.contains(&format!("Emulation version{sep} 1.36\n")),
            "{body}"
        );
        // Not itself, as kube-proxy's.
        assert!(
            body.contains(&format!("Paths{sep} /flagz /healthz /metrics\n")),
            "{body}"
        );
    }

    #[test]
    fn the_versioned_objects_are_served_to_who_asks_for_them() {
        let p = pages();
        let r = p.statusz(
            Some("application/json;v=v1beta1;g=config.k8s.io;as=Statusz"),
            p.started + Duration::from_secs(856),
        );
        assert_eq!(
            (r.code, r.content_type),
            (200, "application/json;g=config.k8s.io;v=v1beta1;as=Statusz")
        );
        // As kube-proxy 1.36 writes it (indented, its fields in order).
        assert_eq!(
            r.text_body(),
            "{\n  \"kind\": \"Statusz\",\n  \"apiVersion\": \"config.k8s.io/v1beta1\",\n  \"metadata\": {\n    \"name\": \"kube-proxy\"\n  },\n  \"startTime\": \"2024-10-16T21:03:43Z\",\n  \"uptimeSeconds\": 856,\n  \"goVersion\": \"rustc 1.95.0\",\n  \"binaryVersion\": \"verdict 0.1.0\",\n  \"emulationVersion\": \"1.36\",\n  \"paths\": [\n    \"/flagz\",\n    \"/healthz\",\n    \"/metrics\"\n  ]\n}"
        );
        let r = p.statusz(
            Some("application/yaml;as=Statusz;v=v1alpha1;g=config.k8s.io"),
            p.started + Duration::from_secs(856),
        );
        assert_eq!(
            r.content_type,
            "application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz"
        );
        assert_eq!(
            r.text_body(),
            "apiVersion: config.k8s.io/v1alpha1\nbinaryVersion: verdict 0.1.0\nemulationVersion: \"1.36\"\ngoVersion: rustc 1.95.0\nkind: Statusz\nmetadata:\n  name: kube-proxy\npaths:\n- /flagz\n- /healthz\n- /metrics\nstartTime: \"2024-10-16T21:03:43Z\"\nuptimeSeconds: 856\n"
        );
        let r = p.flagz(Some("application/json;v=v1alpha1;g=config.k8s.io;as=Flagz"));
        assert_eq!(
            r.text_body(),
            "{\n  \"kind\": \"Flagz\",\n  \"apiVersion\": \"config.k8s.io/v1alpha1\",\n  \"metadata\": {\n    \"name\": \"kube-proxy\"\n  },\n  \"flags\": {\n    \"bind-address\": \"0.0.0.0\",\n    \"nodeport-addresses\": \"[primary]\",\n    \"proxy-mode\": \"nftables\"\n  }\n}"
        );
        // A list: the object first, text as the fallback.
        let r = p.flagz(Some(
            "application/json;v=v1beta1;g=config.k8s.io;as=Flagz,text/plain;q=0.5",
        ));
        assert_eq!(
            r.content_type,
            "application/json;g=config.k8s.io;v=v1beta1;as=Flagz"
        );
        let r = p.flagz(Some(
            "application/json;v=v9;g=config.k8s.io;as=Flagz, text/plain;q=0.5",
        ));
        assert_eq!(r.content_type, PLAIN, "an unknown version falls back");
    }

    #[test]
    fn yaml_scalars_are_quoted_where_they_would_read_as_something_else() {
        for (s, want) in [
            ("1.36", "\"1.36\""),
            ("2024-10-16T21:03:43Z", "\"2024-10-16T21:03:43Z\""),
            ("true", "\"true\""),
            ("", "\"\""),
            ("1.36.2-ocpfork", "1.36.2-ocpfork"),
            ("/configz", "/configz"),
            ("0.0.0.0:10256", "0.0.0.0:10256"),
            ("[primary]", "\"[primary]\""),
            ("a: b", "\"a: b\""),
        ] {
            assert_eq!(yaml_scalar(s), want, "{s}");
        }
    }

    #[test]
    fn anything_else_is_not_acceptable_with_kube_proxys_status() {
        let p = pages();
        for accept in [
            "application/json",
            "application/json;v=v1beta1;g=config.k8s.io;as=Statusz",
            "application/json;v=v1;g=config.k8s.io;as=Flagz",
            "text/html",
            "text/plain; charset=latin1",
        ] {
            let r = p.flagz(Some(accept));
            assert_eq!(
                (r.code, r.content_type),
                (406, "application/json"),
                "{accept}"
            );
            assert!(
                r.text_body().contains("\"reason\": \"NotAcceptable\""),
                "{accept}"
            );
        }
        let r = p.flagz(Some("application/yaml"));
        assert_eq!((r.code, r.content_type), (406, "application/yaml"));
        assert!(r.text_body().starts_with("apiVersion: v1\ncode: 406\n"));
        assert_eq!(
            p.statusz(
                Some("application/json;v=v1beta1;g=config.k8s.io;as=Flagz"),
                SystemTime::now()
            )
            .code,
            406
        );
    }
}
