//! The flow log (`--flow-log`): each flow as one JSON line, for a log
//! shipper, bounded twice. A file is rotated at a size (the
//! `--flow-log-max-size` cap, `--flow-log-max-backups` rotated files kept,
//! as Hubble's exporter does), so the log never holds more than
//! (backups + 1) × size. And past a rate of lines a second
//! (`--flow-log-rate`), flows are no longer written one by one: they are
//! folded into one aggregated line per client, Service, endpoint and
//! outcome (the aggregated flows' key) for each 15 s window, written when
//! the window ends; what finds no room among those is counted.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::json;
use verdict_admin::Metrics;
use verdict_admin::metrics::{FLOW_LOG_FOLDED, FLOW_LOG_LOST, FLOW_LOG_ROTATIONS};

use super::FlowRecord;
use super::aggregate::{BUCKET, Key};

/// The size at which a flow log file is rotated, unless told otherwise.
pub const DEFAULT_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// Rotated files kept, unless told otherwise.
pub const DEFAULT_MAX_BACKUPS: u32 = 5;
/// Lines a second written one flow each, unless told otherwise.
pub const DEFAULT_RATE: u32 = 200;
/// Keys folded at most in one window: past it, flows are counted as lost.
const FOLDED_KEYS: usize = 4096;

/// How the flow log is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A file is rotated before it grows past this many bytes.
    pub max_size: u64,
    /// Rotated files kept (`FILE.1` the newest); 0: the file starts over.
    pub max_backups: u32,
    /// Flows a second written on a line of their own; past it, folded.
    pub rate: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_size: DEFAULT_MAX_SIZE,
            max_backups: DEFAULT_MAX_BACKUPS,
            rate: DEFAULT_RATE,
        }
    }
}

/// Where the flow log goes (`--flow-log`).
pub enum FlowLog {
    /// Standard output (`--flow-log=-`): the reader bounds it.
    Stdout,
    /// A file, appended to, rotated at the size cap.
    File {
        /// Its path.
        path: PathBuf,
        /// The open file.
        file: std::fs::File,
        /// Its size.
        size: u64,
    },
}

impl FlowLog {
    /// `-` for standard output, else a file path (created, appended to).
    pub fn open(target: &str) -> std::io::Result<FlowLog> {
        if target == "-" {
            return Ok(FlowLog::Stdout);
        }
        let path = PathBuf::from(target);
        let file = append(&path)?;
        let size = file.metadata()?.len();
        Ok(FlowLog::File { path, file, size })
    }

    /// Writes `lines`, rotating the file first if they would take it past
    /// `limits.max_size`; says whether it rotated.
    fn write(&mut self, lines: &[u8], limits: &Limits) -> std::io::Result<bool> {
        match self {
            FlowLog::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(lines)?;
                out.flush()?;
                Ok(false)
            }
            FlowLog::File { path, file, size } => {
                let mut rotated = false;
                if *size > 0 && *size + lines.len() as u64 > limits.max_size {
                    rotate(path, limits.max_backups)?;
                    *file = append(path)?;
                    *size = 0;
                    rotated = true;
                }
                // A batch larger than the cap alone is cut at a line end.
                let mut take = lines.len();
                if take as u64 > limits.max_size {
                    let cap = usize::try_from(limits.max_size).unwrap_or(usize::MAX);
                    take = lines[..cap]
                        .iter()
                        .rposition(|b| *b == b'\n')
                        .map_or(0, |i| i + 1);
                }
                file.write_all(&lines[..take])?;
                *size += take as u64;
                Ok(rotated)
            }
        }
    }
}

fn append(path: &PathBuf) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// `FILE.N` for backup `n`.
fn backup(path: &std::path::Path, n: u32) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{n}"));
    PathBuf::from(p)
}

/// Moves `FILE` to `FILE.1`, `FILE.1` to `FILE.2`, …, dropping the
/// oldest past `backups` (none kept: `FILE` is removed).
fn rotate(path: &std::path::Path, backups: u32) -> std::io::Result<()> {
    if backups == 0 {
        return std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(backup(path, backups));
    for n in (1..backups).rev() {
        let from = backup(path, n);
        if from.exists() {
            std::fs::rename(&from, backup(path, n + 1))?;
        }
    }
    std::fs::rename(path, backup(path, 1))
}

/// What one key folded in the current window.
struct Folded {
    /// The first flow folded, as its line would have been.
    first: FlowRecord,
    connections: u64,
    closed: u64,
    packets: u64,
    bytes: u64,
}

/// Writes the flow log within its limits.
pub struct LogWriter {
    log: FlowLog,
    limits: Limits,
    metrics: Arc<Mutex<Metrics>>,
    /// Lines not yet written (one batch of the kernel's reports).
    pending: Vec<u8>,
    /// The second the rate counts, and the lines written in it.
    second: u64,
    in_second: u32,
    /// The 15 s window flows are folded in, and what each key folded.
    window: SystemTime,
    folded: HashMap<Key, Folded>,
    /// The log could not be written: said once, not again until it works.
    failed: bool,
}

impl LogWriter {
    /// A writer to `log`, bounded by `limits`, counting in `metrics`.
    pub fn new(log: FlowLog, limits: Limits, metrics: Arc<Mutex<Metrics>>) -> LogWriter {
        {
            let mut m = metrics.lock().unwrap_or_else(|e| e.into_inner());
            m.touch(FLOW_LOG_FOLDED, &[]);
            m.touch(FLOW_LOG_ROTATIONS, &[]);
            for reason in ["budget", "write_error"] {
                m.touch(FLOW_LOG_LOST, &[reason]);
            }
        }
        LogWriter {
            log,
            limits,
            metrics,
            pending: Vec::new(),
            second: 0,
            in_second: 0,
            window: SystemTime::UNIX_EPOCH,
            folded: HashMap::new(),
            failed: false,
        }
    }

    fn count(&self, name: &str, labels: &[&str], n: u64) {
        if n > 0 {
            self.metrics
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(name, labels, n as f64);
        }
    }

    /// Whether a line may be written on its own at `now`: within the rate.
    fn within_rate(&mut self, now: SystemTime) -> bool {
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if second != self.second {
            self.second = second;
            self.in_second = 0;
        }
        if self.in_second >= self.limits.rate {
            return false;
        }
        self.in_second += 1;
        true
    }

    /// A flow recorded (`closed`: its line when it closed, with packets
    /// and bytes), seen at `now`: its line, or folded past the rate.
    pub(super) fn flow(
        &mut self,
        r: &FlowRecord,
        key: impl FnOnce() -> Key,
        closed: bool,
        now: SystemTime,
    ) {
        self.end_window(now);
        if self.within_rate(now) {
            if serde_json::to_writer(&mut self.pending, r).is_ok() {
                self.pending.push(b'\n');
            }
            return;
        }
        let key = key();
        let room = self.folded.len() < FOLDED_KEYS;
        match self.folded.get_mut(&key) {
            Some(f) => f.add(r, closed),
            None if room => {
                let mut f = Folded {
                    first: r.clone(),
                    connections: 0,
                    closed: 0,
                    packets: 0,
                    bytes: 0,
                };
                f.add(r, closed);
                self.folded.insert(key, f);
            }
            None => {
                self.count(FLOW_LOG_LOST, &["budget"], 1);
                return;
            }
        }
        self.count(FLOW_LOG_FOLDED, &[], 1);
    }

    /// Writes the aggregated lines of the window before `now`'s, if it
    /// ended.
    pub(super) fn end_window(&mut self, now: SystemTime) {
        let since = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let start = SystemTime::UNIX_EPOCH
            + std::time::Duration::from_secs(since.as_secs() / BUCKET.as_secs() * BUCKET.as_secs());
        if start == self.window {
            return;
        }
        let from = self.window;
        self.window = start;
        if self.folded.is_empty() {
            return;
        }
        let to = verdict_admin::time::rfc3339_micro(from + BUCKET);
        let from = verdict_admin::time::rfc3339_micro(from);
        for (_, f) in self.folded.drain() {
            // The flow's fields without its client's port, its number and
            // its times: the window's, and the counts.
            let r = &f.first;
            let line = json!({
                "aggregated": true,
                "from": from,
                "to": to,
                "protocol": r.protocol,
                "client": r.client.ip(),
                "client_pod": r.client_pod,
                "entry": r.entry,
                "destination": r.destination,
                "service": r.service,
                "port": r.port,
                "endpoint": r.endpoint,
                "pod": r.pod,
                "verdict": r.verdict,
                "reason": r.reason,
                "connections": f.connections,
                "closed": f.closed,
                "packets": f.packets,
                "bytes": f.bytes,
            });
            if serde_json::to_writer(&mut self.pending, &line).is_ok() {
                self.pending.push(b'\n');
            }
        }
    }

    /// Writes what is pending.
    pub(super) fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let lines = self.pending.iter().filter(|b| **b == b'\n').count() as u64;
        match self.log.write(&self.pending, &self.limits) {
            Ok(rotated) => {
                self.failed = false;
                if rotated {
                    self.count(FLOW_LOG_ROTATIONS, &[], 1);
                }
            }
            Err(e) => {
                if !self.failed {
                    tracing::warn!(error = %e, "cannot write the flow log; its lines are lost (and counted) until it can be written");
                }
                self.failed = true;
                self.count(FLOW_LOG_LOST, &["write_error"], lines);
            }
        }
        self.pending.clear();
    }
}

impl Folded {
    fn add(&mut self, r: &FlowRecord, closed: bool) {
        if closed {
            self.closed += 1;
            self.packets += r.packets.unwrap_or(0);
            self.bytes += r.bytes.unwrap_or(0);
        } else {
            self.connections += 1;
        }
    }
}
