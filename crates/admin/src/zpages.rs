//! `/flagz` and `/statusz`, as kube-proxy 1.36 serves them on its metrics
//! address (component-base's z-pages, beta and on by default there): plain
//! text for people by default, and the versioned objects
//! (`config.k8s.io/v1alpha1` or `v1beta1`, kinds `Flagz` and `Statusz`)
//! for tools that ask for them with
//! `Accept: application/json;v=v1beta1;g=config.k8s.io;as=Statusz`. A bare
//! `application/json`, or anything else, is 406 Not Acceptable.
//!
//! The text is not meant to be parsed, and says so: as component-base
//! does, the separator between a name and its value is picked at random
//! from `:`, `: `, `=` and ` ` for each process.

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
    /// The paths the address serves, for `/statusz` (top-level only).
    pub paths: Vec<String>,
    /// The separator of the text pages, picked once.
    separator: &'static str,
}

/// How a request wants a page.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    Text,
    /// The structured object, of this version.
    Object(&'static str),
}

impl ZPages {
    /// The pages of a process started at `started`.
    pub fn new(
        component: &str,
        flags: BTreeMap<String, String>,
        started: SystemTime,
        binary_version: &str,
        mut paths: Vec<String>,
    ) -> ZPages {
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
            paths,
            separator: seps[pick % seps.len()],
        }
    }

    /// `/flagz` for a request with this `Accept` header.
    pub fn flagz(&self, accept: Option<&str>) -> Response {
        match negotiate(accept, "Flagz") {
            Some(Wanted::Text) => {
                let mut out = format!("\n{} flags\n{WARNING}\n\n", self.component);
                for (name, value) in &self.flags {
                    let _ = writeln!(out, "{name}{}{value}", self.separator);
                }
                Response::text(200, out, PLAIN)
            }
            Some(Wanted::Object(version)) => {
                let flags: Vec<String> = self
                    .flags
                    .iter()
                    .map(|(k, v)| format!("{}:{}", json(k), json(v)))
                    .collect();
                let body = format!(
                    "{{\"kind\":\"Flagz\",\"apiVersion\":\"{GROUP}/{version}\",\"metadata\":{{\"name\":{}}},\"flags\":{{{}}}}}",
                    json(&self.component),
                    flags.join(",")
                );
                Response::json(200, body)
            }
            None => not_acceptable("Flagz"),
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
                let _ = writeln!(out, "Binary version{d} {}", self.binary_version);
                if !self.paths.is_empty() {
                    let _ = writeln!(out, "Paths{d} {}", self.paths.join(" "));
                }
                Response::text(200, out, PLAIN)
            }
            Some(Wanted::Object(version)) => {
                let started = rfc3339_nano(
                    SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_secs(
                            self.started
                                .duration_since(SystemTime::UNIX_EPOCH)
                                .unwrap_or_default()
                                .as_secs(),
                        ),
                );
                let paths: Vec<String> = self.paths.iter().map(|p| json(p)).collect();
                let body = format!(
                    "{{\"kind\":\"Statusz\",\"apiVersion\":\"{GROUP}/{version}\",\"metadata\":{{\"name\":{}}},\"startTime\":\"{started}\",\"uptimeSeconds\":{up},\"binaryVersion\":{},\"paths\":[{}]}}",
                    json(&self.component),
                    json(&self.binary_version),
                    paths.join(",")
                );
                Response::json(200, body)
            }
            None => not_acceptable("Statusz"),
        }
    }
}

fn not_acceptable(kind: &str) -> Response {
    Response::text(
        406,
        format!(
            "media type not acceptable, must be: text/plain, or application/json;v=v1beta1;g={GROUP};as={kind}\n"
        ),
        PLAIN,
    )
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
    match media.as_str() {
        "text/plain" | "text/*" | "*/*" => {
            let plain = params.is_empty()
                || (params.len() == 1
                    && params
                        .get("charset")
                        .is_some_and(|c| c.eq_ignore_ascii_case("utf-8")));
            plain.then_some(Wanted::Text)
        }
        "application/json" => {
            let g = params.get("g").map(String::as_str);
            let as_ = params.get("as").map(String::as_str);
            let v = params.get("v").map(String::as_str)?;
            let version = VERSIONS.into_iter().find(|known| *known == v)?;
            (g == Some(GROUP) && as_ == Some(kind)).then_some(Wanted::Object(version))
        }
        _ => None,
    }
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
            vec!["/metrics".into(), "/healthz".into(), "/flagz".into()],
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
            assert!(body.starts_with("\nkube-proxy flags\nWarning: This endpoint is not meant to be machine parseable"), "{body}");
            let sep = p.separator;
            assert!(
                body.contains(&format!("\nbind-address{sep}0.0.0.0\n")),
                "{body}"
            );
            let lines: Vec<&str> = body.lines().skip(4).collect();
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
        assert_eq!((r.code, r.content_type), (200, "application/json"));
        assert_eq!(
            r.text_body(),
            "{\"kind\":\"Statusz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\"metadata\":{\"name\":\"kube-proxy\"},\"startTime\":\"2024-10-16T21:03:43Z\",\"uptimeSeconds\":856,\"binaryVersion\":\"verdict 0.1.0\",\"paths\":[\"/flagz\",\"/healthz\",\"/metrics\"]}"
        );
        let r = p.flagz(Some("application/json;v=v1alpha1;g=config.k8s.io;as=Flagz"));
        assert_eq!(
            r.text_body(),
            "{\"kind\":\"Flagz\",\"apiVersion\":\"config.k8s.io/v1alpha1\",\"metadata\":{\"name\":\"kube-proxy\"},\"flags\":{\"bind-address\":\"0.0.0.0\",\"nodeport-addresses\":\"[primary]\",\"proxy-mode\":\"nftables\"}}"
        );
        // A list: the object first, text as the fallback.
        let r = p.flagz(Some(
            "application/json;v=v1beta1;g=config.k8s.io;as=Flagz,text/plain;q=0.5",
        ));
        assert_eq!(r.content_type, "application/json");
        let r = p.flagz(Some(
            "application/json;v=v9;g=config.k8s.io;as=Flagz, text/plain;q=0.5",
        ));
        assert_eq!(r.content_type, PLAIN, "an unknown version falls back");
    }

    #[test]
    fn anything_else_is_not_acceptable() {
        let p = pages();
        for accept in [
            "application/json",
            "application/json;v=v1beta1;g=config.k8s.io;as=Statusz",
            "application/yaml",
            "text/html",
            "text/plain; charset=latin1",
        ] {
            assert_eq!(p.flagz(Some(accept)).code, 406, "{accept}");
        }
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
