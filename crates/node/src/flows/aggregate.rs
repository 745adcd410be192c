//! Flows over time, aggregated: beside the ring of recent flows, every flow
//! recorded is counted in a bucket of [`BUCKET`] (15 s), under a key
//! without the client's port (client address, Service, port, destination,
//! endpoint, verdict, reason). A flood of one client with a new source
//! port per packet is one entry a bucket, with its count, where the ring
//! would hold one flow per packet.
//!
//! Buckets are kept for [`KEPT`] (an hour), within a budget of entries
//! (memory): a bucket holds at most an eighth of it, so that a burst of
//! many clients in one bucket does not push the rest of the hour out; past
//! the budget, the oldest buckets go first. What finds no room is counted,
//! never silently lost.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use verdict_model::{Name, NamespacedName};

use super::{EntryKind, Flow, FlowFilter, FlowVerdict, protocol_name};

/// How long one bucket spans.
pub const BUCKET: Duration = Duration::from_secs(15);
/// How long buckets are kept.
pub const KEPT: Duration = Duration::from_secs(3600);
/// Entries (one key in one bucket) kept at most, unless told otherwise
/// (their memory at this many is in docs/flows.md).
pub const DEFAULT_ENTRIES: usize = 32_768;
/// The share of the budget one bucket may hold.
const BUCKET_SHARE: usize = 8;

/// What a flow is aggregated under: the flow without its client's port,
/// its times and its counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    proto: u8,
    client: IpAddr,
    client_pod: Option<NamespacedName>,
    entry: Option<EntryKind>,
    destination: SocketAddr,
    service: Option<NamespacedName>,
    port: Option<Name>,
    endpoint: Option<SocketAddr>,
    pod: Option<Name>,
    verdict: FlowVerdict,
    reason: Option<&'static str>,
}

impl Key {
    /// The key of `f`.
    pub(super) fn of(f: &Flow) -> Key {
        Key {
            proto: f.proto,
            client: f.client.ip(),
            client_pod: f.client_pod.clone(),
            entry: f.entry,
            destination: f.destination,
            service: f.service.clone(),
            port: f.port.clone(),
            endpoint: f.endpoint,
            pod: f.pod.clone(),
            verdict: f.verdict,
            reason: f.reason,
        }
    }

    fn admitted_by(&self, filter: &FlowFilter) -> bool {
        let service = self.service.as_ref();
        filter.verdict.is_none_or(|v| self.verdict == v)
            && filter.service.as_ref().is_none_or(|s| service == Some(s))
            && filter
                .namespace
                .as_ref()
                .is_none_or(|ns| service.is_some_and(|s| s.namespace.as_str() == ns.as_str()))
            && filter.ip.is_none_or(|ip| {
                self.client == ip
                    || self.destination.ip() == ip
                    || self.endpoint.is_some_and(|e| e.ip() == ip)
            })
    }
}

/// What one key counted in one bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    connections: u64,
    packets: u64,
    bytes: u64,
}

#[derive(Debug)]
struct Bucket {
    /// When it begins (a multiple of [`BUCKET`] since the epoch).
    start: SystemTime,
    entries: HashMap<Key, Counts>,
}

/// The buckets of the last hour.
#[derive(Debug)]
pub(super) struct Aggregates {
    buckets: VecDeque<Bucket>,
    /// Entries in all buckets.
    held: usize,
    /// Entries kept at most.
    budget: usize,
    /// Flows (or their counts) that found no room, since start.
    not_recorded: u64,
    /// Buckets dropped before their hour was up, to make room.
    dropped_early: u64,
}

/// One aggregated flow: a key's counts over the buckets a reader asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateRecord {
    /// The start of its first bucket with a count (RFC 3339).
    pub first_bucket: String,
    /// The end of its last bucket with a count (RFC 3339).
    pub last_bucket: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The client's address (its ports are not kept).
    pub client: IpAddr,
    /// The client's pod (`namespace/name`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_pod: Option<String>,
    /// How it entered (`None`: an address of the service CIDRs no Service has).
    pub entry: Option<EntryKind>,
    /// The address and port it was sent to.
    pub destination: SocketAddr,
    /// The Service (`namespace/name`), when one has the destination.
    pub service: Option<String>,
    /// The Service's port name, when the port is one of the Service's.
    pub port: Option<String>,
    /// The endpoint chosen.
    pub endpoint: Option<SocketAddr>,
    /// The endpoint's pod.
    pub pod: Option<String>,
    /// What became of the connections.
    pub verdict: FlowVerdict,
    /// Why they were rejected or dropped.
    pub reason: Option<String>,
    /// Connections.
    pub connections: u64,
    /// Packets both ways of those that closed (with conntrack accounting).
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// `GET /api/v1/flows?aggregated=1`: the aggregated flows a filter admits,
/// the most connections first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregatesAnswer {
    /// The flows, at most the limit.
    pub aggregates: Vec<AggregateRecord>,
    /// How many keys match in all.
    pub matched: usize,
    /// The seconds one bucket spans.
    pub bucket_seconds: u64,
    /// The seconds buckets are kept.
    pub kept_seconds: u64,
    /// The start of the oldest bucket held (RFC 3339; none: no bucket).
    pub oldest_bucket: Option<String>,
    /// Entries held now, and at most.
    pub entries: usize,
    /// See `entries`.
    pub budget: usize,
    /// Flows that found no room in the budget, since start.
    pub not_recorded: u64,
    /// Buckets dropped before their hour to make room, since start.
    pub dropped_early: u64,
    /// See [`FlowsAnswer::stream`](super::FlowsAnswer::stream).
    pub stream: String,
}

fn bucket_start(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let n = since.as_secs() / BUCKET.as_secs();
    SystemTime::UNIX_EPOCH + Duration::from_secs(n * BUCKET.as_secs())
}

impl Aggregates {
    /// Empty, keeping at most `budget` entries.
    pub fn new(budget: usize) -> Aggregates {
        Aggregates {
            buckets: VecDeque::new(),
            held: 0,
            budget,
            not_recorded: 0,
            dropped_early: 0,
        }
    }

    /// Flows that found no room, since start.
    pub fn not_recorded(&self) -> u64 {
        self.not_recorded
    }

    /// Drops the buckets older than [`KEPT`] at `now`.
    fn expire(&mut self, now: SystemTime) {
        while let Some(b) = self.buckets.front() {
            if now.duration_since(b.start).unwrap_or_default() < KEPT + BUCKET {
                break;
            }
            self.held -= b.entries.len();
            self.buckets.pop_front();
        }
    }

    /// The place of the bucket that begins at `start`, added if it is
    /// newer than all (a late report whose bucket is gone counts in the
    /// next one held).
    fn bucket(&mut self, start: SystemTime) -> usize {
        if self.buckets.back().is_none_or(|b| b.start < start) {
            self.buckets.push_back(Bucket {
                start,
                entries: HashMap::new(),
            });
            return self.buckets.len() - 1;
        }
        self.buckets
            .iter()
            .position(|b| b.start >= start)
            .unwrap_or(self.buckets.len() - 1)
    }

    /// Adds to `key` in the bucket of `at`; `false`: no room.
    fn add(
        &mut self,
        key: Key,
        at: SystemTime,
        connections: u64,
        packets: u64,
        bytes: u64,
    ) -> bool {
        self.expire(at);
        let mut i = self.bucket(bucket_start(at));
        if !self.buckets[i].entries.contains_key(&key) {
            let per_bucket = (self.budget / BUCKET_SHARE).max(1);
            if self.buckets[i].entries.len() >= per_bucket {
                self.not_recorded += 1;
                return false;
            }
            // The oldest buckets make room for a newer one's entry.
            while self.held >= self.budget && i > 0 {
                if let Some(old) = self.buckets.pop_front() {
                    self.held -= old.entries.len();
                    self.dropped_early += 1;
                }
                i -= 1;
            }
            if self.held >= self.budget {
                self.not_recorded += 1;
                return false;
            }
            self.held += 1;
        }
        let c = self.buckets[i].entries.entry(key).or_default();
        c.connections += connections;
        c.packets += packets;
        c.bytes += bytes;
        true
    }

    /// Counts a new connection, seen at `at`.
    pub(super) fn connection(&mut self, f: &Flow, at: SystemTime) -> bool {
        self.add(Key::of(f), at, 1, 0, 0)
    }

    /// Counts the packets and bytes of a connection (of `key`) that
    /// closed at `at`.
    pub(super) fn closed(&mut self, key: Key, at: SystemTime, packets: u64, bytes: u64) -> bool {
        self.add(key, at, 0, packets, bytes)
    }

    /// The keys `filter` admits (its `since` chooses the buckets, its
    /// `after` is ignored), summed over the buckets, the most connections
    /// first, at most `limit`.
    pub fn query(&self, filter: &FlowFilter, limit: usize) -> AggregatesAnswer {
        let mut merged: HashMap<&Key, (Counts, SystemTime, SystemTime)> = HashMap::new();
        for b in &self.buckets {
            if filter.since.is_some_and(|s| b.start + BUCKET <= s) {
                continue;
            }
            for (k, c) in &b.entries {
                if !k.admitted_by(filter) {
                    continue;
                }
                let m = merged
                    .entry(k)
                    .or_insert((Counts::default(), b.start, b.start));
                m.0.connections += c.connections;
                m.0.packets += c.packets;
                m.0.bytes += c.bytes;
                m.1 = m.1.min(b.start);
                m.2 = m.2.max(b.start);
            }
        }
        let matched = merged.len();
        let mut rows: Vec<_> = merged.into_iter().collect();
        rows.sort_by(|a, b| {
            (b.1.0.connections, b.1.0.packets)
                .cmp(&(a.1.0.connections, a.1.0.packets))
                .then_with(|| b.1.2.cmp(&a.1.2))
        });
        rows.truncate(limit);
        let time = verdict_admin::time::rfc3339_micro;
        AggregatesAnswer {
            aggregates: rows
                .into_iter()
                .map(|(k, (c, first, last))| AggregateRecord {
                    first_bucket: time(first),
                    last_bucket: time(last + BUCKET),
                    protocol: protocol_name(k.proto),
                    client: k.client,
                    client_pod: k.client_pod.as_ref().map(ToString::to_string),
                    entry: k.entry,
                    destination: k.destination,
                    service: k.service.as_ref().map(ToString::to_string),
                    port: k.port.as_ref().map(|p| p.as_str().to_owned()),
                    endpoint: k.endpoint,
                    pod: k.pod.as_ref().map(|p| p.as_str().to_owned()),
                    verdict: k.verdict,
                    reason: k.reason.map(str::to_owned),
                    connections: c.connections,
                    packets: c.packets,
                    bytes: c.bytes,
                })
                .collect(),
            matched,
            bucket_seconds: BUCKET.as_secs(),
            kept_seconds: KEPT.as_secs(),
            oldest_bucket: self.buckets.front().map(|b| time(b.start)),
            entries: self.held,
            budget: self.budget,
            not_recorded: self.not_recorded,
            dropped_early: self.dropped_early,
            stream: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an entry costs besides its map's overhead: its key and its
    /// counts, names shared with the read model (docs/flows.md).
    #[test]
    fn an_entry_is_a_key_and_three_counts() {
        let entry = std::mem::size_of::<Key>() + std::mem::size_of::<Counts>();
        println!("an aggregated entry: {entry} bytes");
        assert!(entry <= 224, "{entry} bytes");
    }
}
