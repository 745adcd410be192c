//! Logs as kube-proxy writes them: klog's text format by default
//! (`I1201 20:45:01.123456   12345 daemon.rs:123] "synced" full=true`), or
//! component-base's JSON (`--logging-format=json`), with klog's
//! verbosity: `-v=2` adds every sync's summary and every Service change,
//! `-v=4` every element change, `--vmodule=pattern=N` sets it per source
//! file, and `/debug/flags/v` changes it while running.
//!
//! verdict's `info!` is klog's V(0), `debug!` V(2) and `trace!` V(4).
//! Libraries' messages (the API client, TLS) count more: their info is
//! V(2), their debug V(6) and their trace V(8), as client-go logs its
//! requests only from V(6).

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use crate::config::{LogFormat, Logging};

/// Changes the verbosity while running (`/debug/flags/v`).
#[derive(Clone, Debug)]
pub struct Verbosity(Arc<AtomicU32>);

impl Verbosity {
    /// The current level.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    /// A handle not connected to logging.
    #[cfg(test)]
    pub fn for_tests(level: u32) -> Verbosity {
        Verbosity(Arc::new(AtomicU32::new(level)))
    }

    /// Sets the level; takes effect for the next message.
    pub fn set(&self, level: u32) {
        self.0.store(level, Ordering::Relaxed);
        tracing::callsite::rebuild_interest_cache();
    }
}

/// Sets up logging to stderr (and, with split streams, info to stdout).
/// Returns the handle that changes the verbosity.
pub fn init(config: &Logging) -> Verbosity {
    let verbosity = Verbosity(Arc::new(AtomicU32::new(config.verbosity)));
    let layer = Klog {
        json: config.format == LogFormat::Json,
        split: match config.format {
            LogFormat::Text => config.text_split_stream,
            LogFormat::Json => config.json_split_stream,
        },
        verbosity: verbosity.clone(),
        vmodule: config.vmodule.clone(),
        pid: std::process::id(),
    };
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    verbosity
}

/// klog's level of a message: 0 for errors, warnings and verdict's info,
/// 2 for debug, 4 for trace; four more for other crates. The API client's
/// own errors and warnings (kube, hyper, tower, rustls: a line per failed
/// request, with the whole error's debug dump) are at 4: verdict says
/// what failed in one line of its own, as kube-proxy's client says
/// nothing.
fn level_of(meta: &Metadata<'_>) -> u32 {
    let client = ["kube", "hyper", "tower", "rustls", "h2"]
        .iter()
        .any(|c| meta.target().starts_with(c));
    let base = match *meta.level() {
        Level::ERROR | Level::WARN if client => return 4,
        Level::ERROR | Level::WARN => return 0,
        Level::INFO => 0,
        Level::DEBUG => 2,
        Level::TRACE => 4,
    };
    if meta.target().starts_with("verdict") {
        base
    } else {
        base + 2 + u32::from(base > 0) * 2
    }
}

/// A file's name as klog's vmodule matches it: the base name without
/// its extension.
fn module_of(file: &str) -> &str {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.strip_suffix(".rs").unwrap_or(base)
}

/// Glob matching with `*` and `?`, as vmodule patterns use.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], name) || (!name.is_empty() && glob(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

struct Klog {
    json: bool,
    split: bool,
    verbosity: Verbosity,
    vmodule: Vec<(String, u32)>,
    pid: u32,
}

impl Klog {
    fn threshold(&self, meta: &Metadata<'_>) -> u32 {
        if let Some(file) = meta.file() {
            let full = file.trim_end_matches(".rs");
            let module = module_of(file);
            for (pattern, level) in &self.vmodule {
                let target = if pattern.contains('/') { full } else { module };
                if glob(pattern.as_bytes(), target.as_bytes()) {
                    return *level;
                }
            }
        }
        self.verbosity.get()
    }
}

impl<S: Subscriber> Layer<S> for Klog {
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        use tracing::level_filters::LevelFilter;
        let v = self
            .vmodule
            .iter()
            .map(|(_, l)| *l)
            .chain([self.verbosity.get()])
            .max()
            .unwrap_or(0);
        Some(match v {
            0 | 1 => LevelFilter::INFO,
            2 | 3 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }

    fn register_callsite(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Decided once per call site; a change of verbosity rebuilds the
        // decisions (`Verbosity::set`).
        if level_of(meta) <= self.threshold(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        level_of(meta) <= self.threshold(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = if self.json {
            json_line(meta, &fields, SystemTime::now())
        } else {
            text_line(meta, &fields, SystemTime::now(), self.pid)
        };
        let error = *meta.level() <= Level::WARN;
        // One write per line, so lines from threads never interleave.
        let _ = if self.split && !error {
            std::io::stdout().lock().write_all(line.as_bytes())
        } else {
            std::io::stderr().lock().write_all(line.as_bytes())
        };
    }
}

/// A message's fields, in order.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, Rendered)>,
}

enum Rendered {
    /// Quoted in text, a JSON string.
    Text(String),
    /// As is in both formats (numbers, booleans).
    Raw(String),
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.pairs
                .push((field.name(), Rendered::Text(value.to_owned())));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.pairs.push((field.name(), Rendered::Text(text)));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pairs
            .push((field.name(), Rendered::Raw(value.to_string())));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.pairs
            .push((field.name(), Rendered::Raw(value.to_string())));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.pairs
            .push((field.name(), Rendered::Raw(value.to_string())));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let text = if value.is_finite() {
            value.to_string()
        } else {
            format!("\"{value}\"")
        };
        self.pairs.push((field.name(), Rendered::Raw(text)));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.pairs
            .push((field.name(), Rendered::Text(value.to_string())));
    }
}

/// Go's `%q` of a string, as klog quotes messages and values.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `file:line` of a message, the file as its base name.
fn caller(meta: &Metadata<'_>) -> String {
    let file = meta
        .file()
        .map_or("???", |f| f.rsplit('/').next().unwrap_or(f));
    format!("{file}:{}", meta.line().unwrap_or(0))
}

/// A value as klog's text format writes it: quoted, or a multi-line
/// string as `<` and its lines indented by a tab, then ` >`.
fn text_value(out: &mut String, key: &str, value: &Rendered) {
    match value {
        Rendered::Raw(s) => {
            let _ = write!(out, " {key}={s}");
        }
        Rendered::Text(s) if s.trim_end_matches('\n').contains('\n') => {
            let _ = write!(out, " {key}=<");
            for line in s.trim_end_matches('\n').split('\n') {
                let _ = write!(out, "\n\t{line}");
            }
            out.push_str("\n >");
        }
        Rendered::Text(s) => {
            let _ = write!(out, " {key}={}", quote(s));
        }
    }
}

/// klog's text line. An `error` field is klog's `err`, right after the
/// message.
fn text_line(meta: &Metadata<'_>, fields: &Fields, now: SystemTime, pid: u32) -> String {
    let severity = match *meta.level() {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let t = verdict_admin::time::Utc::of(now);
    let mut line = format!(
        "{severity}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}] {}",
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.nanos / 1000,
        pid % 10_000_000,
        caller(meta),
        quote(&fields.message)
    );
    let (errors, rest): (Vec<_>, Vec<_>) = fields.pairs.iter().partition(|(k, _)| *k == "error");
    for (_, value) in errors {
        text_value(&mut line, "err", value);
    }
    for (key, value) in rest {
        text_value(&mut line, key, value);
    }
    line.push('\n');
    line
}

/// component-base's JSON line: `ts` (milliseconds), `caller`, `msg`, `v`
/// (not for errors), the fields in order, and `err` last.
fn json_line(meta: &Metadata<'_>, fields: &Fields, now: SystemTime) -> String {
    let ts = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0;
    let mut pairs: Vec<(&str, serde_json::Value)> = vec![
        ("ts", serde_json::json!(ts)),
        ("caller", caller(meta).into()),
        ("msg", fields.message.as_str().into()),
    ];
    if *meta.level() != Level::ERROR {
        pairs.push(("v", level_of(meta).into()));
    }
    let mut err = None;
    for (key, value) in &fields.pairs {
        let v = match value {
            Rendered::Text(s) => serde_json::Value::from(s.as_str()),
            Rendered::Raw(s) => serde_json::from_str(s).unwrap_or_else(|_| s.as_str().into()),
        };
        if *key == "error" {
            err = Some(v);
        } else {
            pairs.push((key, v));
        }
    }
    if let Some(v) = err {
        pairs.push(("err", v));
    }
    let mut line = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        let _ = write!(line, "{}:{v}", serde_json::Value::from(*k));
    }
    line.push_str("}\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmodule_globs_match_file_names() {
        assert!(glob(b"daemon", b"daemon"));
        assert!(glob(b"dae*", b"daemon"));
        assert!(glob(b"*mon", b"daemon"));
        assert!(glob(b"d?emon", b"daemon"));
        assert!(!glob(b"proxier", b"daemon"));
        assert_eq!(module_of("crates/verdict/src/daemon.rs"), "daemon");
    }

    #[test]
    fn quoting_is_go_like() {
        assert_eq!(quote("a \"b\"\n"), "\"a \\\"b\\\"\\n\"");
    }
}
