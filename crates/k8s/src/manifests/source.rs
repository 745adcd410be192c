//! The manifests as the daemon's source: what each file defined is kept
//! (the keys, not the objects), so that an edit costs the parse of the
//! files that changed and nothing else, and comes out as [`Update`]s, as
//! the API source's changes do. The node compares each object with the
//! one it holds, so an unchanged object of a changed file is not a change.
//!
//! Changes are noticed through inotify, which names the files: a file is
//! parsed again once it is closed after writing, moved in, or touched,
//! never while it is half written. Without inotify, the files' sizes,
//! times and inodes are compared on every call instead.
//!
//! Each file is parsed on a thread of its own (a few at once), within the
//! [`Limits`]. A refresh waits for them [`HOLD`] at most (the first load,
//! [`FIRST_HOLD`], since its batch is taken as the whole truth), applies
//! what is done in the files' order, and leaves the rest to finish on
//! their own: their results come out of a later call, so a slow file never
//! holds back an edit of another. A file edited while it is being parsed is
//! parsed again once that parse ends; one still being parsed after
//! [`SLOW`] is named, once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::{Limits, ManifestError, Parsed, duplicate, files, is_manifest, parse};
use crate::convert::NodeInfo;
use crate::watch::{Key, Update};

/// What a refresh found.
#[derive(Debug, Default)]
pub struct Refresh {
    /// The changes, for the node to apply.
    pub updates: Vec<Update>,
    /// What was wrong in the files parsed now (the others were reported
    /// when they were parsed).
    pub errors: Vec<ManifestError>,
    /// The files parsed now.
    pub parsed: Vec<PathBuf>,
    /// Files still being parsed after [`SLOW`], each named once.
    pub slow: Vec<(PathBuf, Duration)>,
    /// How long the refresh took (reading and parsing).
    pub took: Duration,
}

/// How long a refresh waits for the files it parses.
pub const HOLD: Duration = Duration::from_secs(2);
/// How long the first load waits for every file: its batch is the whole
/// truth, and a Service of a file left out would be withdrawn until that
/// file is done.
pub const FIRST_HOLD: Duration = Duration::from_secs(60);
/// A file still being parsed after this long is named.
pub const SLOW: Duration = Duration::from_secs(10);

/// Files parsed at once, each on its thread.
fn parsing_at_once() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// A file being parsed.
struct Job {
    id: u64,
    /// The file's stamp when its parse began.
    stamp: Option<Stamp>,
    since: Instant,
    /// Edited meanwhile: parsed again once this parse ends.
    again: bool,
    /// Named as slow already.
    named: bool,
}

/// A parse that ended.
struct Done {
    file: PathBuf,
    id: u64,
    parsed: Parsed,
}

/// A file as last parsed.
struct File {
    /// Its path, shared with the owner lists.
    id: Arc<Path>,
    stamp: Option<Stamp>,
    /// The Services and EndpointSlices it defines, by [`Manifests::id`]:
    /// their names are kept once, in [`Manifests::owners`].
    services: Vec<Id>,
    slices: Vec<Id>,
    /// Its definitions of this node's Node object.
    nodes: Vec<NodeInfo>,
    cidrs: Vec<IpNet>,
}

/// What tells that a file changed (through links): its size, times and
/// inode (an atomic replacement, or a ConfigMap's link swap, changes it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    inode: (u64, u64),
}

/// Files up to this size are parsed on the source's own thread (well
/// under a millisecond), larger ones on a thread of their own, so that
/// they hold no other file's edit back.
const PARSE_HERE: u64 = 256 << 10;

fn stamp(f: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(f).ok()?;
    Some(Stamp {
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        inode: (m.dev(), m.ino()),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Service,
    Slice,
}

/// A 128-bit fingerprint of an object's kind, namespace and name.
type Id = u128;

/// The files defining one Service or EndpointSlice, in path order (the
/// first one's definition is used), and its name. There is one of these
/// per object (60,000 at 30,000 Services), so it is small: the name in one
/// allocation, the first file inline, and the others (nearly every object
/// has none) behind a pointer that is null without them.
struct Owned {
    /// `namespace/name` (neither can hold a `/`).
    name: Box<str>,
    first: Arc<Path>,
    #[allow(
        clippy::box_collection,
        reason = "8 bytes in every object's entry, where a Vec takes 24"
    )]
    rest: Option<Box<Vec<Arc<Path>>>>,
}

impl Owned {
    fn new(key: &Key, file: &Arc<Path>) -> Owned {
        Owned {
            name: format!("{}/{}", key.0, key.1).into_boxed_str(),
            first: file.clone(),
            rest: None,
        }
    }

    /// Whether it is the object named `key`.
    fn is(&self, key: &Key) -> bool {
        self.name
            .split_once('/')
            .is_some_and(|(ns, name)| ns == key.0 && name == key.1)
    }

    /// Its namespace and name.
    fn key(&self) -> Key {
        let (ns, name) = self.name.split_once('/').unwrap_or(("", &self.name));
        (ns.to_owned(), name.to_owned())
    }

    /// The files after the first.
    fn rest(&self) -> &[Arc<Path>] {
        self.rest.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Adds `file`; returns its place.
    fn insert(&mut self, file: &Arc<Path>) -> usize {
        match file.cmp(&self.first) {
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Less => {
                let was = std::mem::replace(&mut self.first, file.clone());
                self.rest.get_or_insert_default().insert(0, was);
                0
            }
            std::cmp::Ordering::Greater => match self.rest().binary_search(file) {
                Ok(i) => i + 1,
                Err(i) => {
                    self.rest.get_or_insert_default().insert(i, file.clone());
                    i + 1
                }
            },
        }
    }

    /// Takes `file` out.
    fn remove(&mut self, file: &Arc<Path>) -> Removed {
        let removed = if self.first == *file {
            let Some(rest) = self.rest.as_mut().filter(|r| !r.is_empty()) else {
                return Removed::Last;
            };
            self.first = rest.remove(0);
            Removed::First
        } else {
            match (self.rest().binary_search(file), self.rest.as_mut()) {
                (Ok(i), Some(rest)) => {
                    rest.remove(i);
                    Removed::Other
                }
                _ => return Removed::Absent,
            }
        };
        if self.rest.as_ref().is_some_and(|r| r.is_empty()) {
            self.rest = None;
        }
        removed
    }
}

/// What taking a file out of an object's [`Owned`] did.
enum Removed {
    /// The file did not define it.
    Absent,
    /// It was the only file: the caller removes the entry.
    Last,
    /// It was the first: the next one's definition is used now.
    First,
    /// It was a repeat.
    Other,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::Slice => "EndpointSlice",
        }
    }
}

/// The manifests under one path, kept per file.
pub struct Manifests {
    path: PathBuf,
    node_name: String,
    /// By path, which is the files' order.
    files: BTreeMap<PathBuf, File>,
    /// For each Service and EndpointSlice, the files defining it, in name
    /// order: the first one's definition is used.
    /// A B-tree rebuilt in one piece after a load that at least doubles
    /// it (`verdict_model::compact`): 3.9 MiB at 30,000 Services, where a
    /// hash table of the same entries took 8.5 MiB (twice as many slots
    /// as entries, and each rounded to 64 bytes).
    owners: BTreeMap<Id, Owned>,
    /// The keys of [`Manifests::id`] (SipHash with keys of this process's
    /// own: no name can be crafted to collide with another).
    prints: [RandomState; 2],
    /// What was last said about this node's Node object.
    node: Option<NodeInfo>,
    /// What was last said about the ServiceCIDRs.
    cidrs: Vec<IpNet>,
    loaded: bool,
    watch: Option<Watch>,
    /// Why the path could not be listed, as last said.
    path_error: Option<String>,
    limits: Limits,
    /// The files being parsed, and those waiting for their turn.
    parsing: HashMap<PathBuf, Job>,
    queue: BTreeSet<PathBuf>,
    next_job: u64,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
    hold: Duration,
    first_hold: Duration,
    slow: Duration,
}

impl Manifests {
    /// The manifests under `path` (a file or a directory), for the node
    /// `node_name`. Nothing is read until [`Manifests::changes`].
    pub fn new(path: &Path, node_name: &str) -> Manifests {
        let (done_tx, done_rx) = channel();
        Manifests {
            path: path.to_path_buf(),
            node_name: node_name.to_owned(),
            files: BTreeMap::new(),
            owners: BTreeMap::new(),
            prints: [RandomState::new(), RandomState::new()],
            node: None,
            cidrs: Vec::new(),
            loaded: false,
            watch: None,
            path_error: None,
            limits: Limits::DEFAULT,
            parsing: HashMap::new(),
            queue: BTreeSet::new(),
            next_job: 0,
            done_tx,
            done_rx,
            hold: HOLD,
            first_hold: FIRST_HOLD,
            slow: SLOW,
        }
    }

    /// Whether inotify tells this source about edits (else it compares the
    /// files' stamps on every call).
    pub fn watched(&self) -> bool {
        self.watch.is_some()
    }

    /// Waits up to `wait` for edits and returns what they changed: the
    /// first call loads everything at once. `None`: nothing was edited.
    pub fn changes(&mut self, wait: Duration) -> Option<Refresh> {
        if self.watch.is_none() {
            self.watch = Watch::new(&self.path);
        }
        if !self.loaded {
            self.loaded = true;
            let started = Instant::now();
            let mut out = self.refresh_inner(None, self.first_hold);
            out.took = started.elapsed();
            return Some(out);
        }
        match &mut self.watch {
            Some(w) => match w.wait(wait) {
                Seen::Nothing => self.finished_since(),
                Seen::Files(names) => Some(self.refresh(Some(&names))),
                Seen::Anything => Some(self.refresh(None)),
                Seen::Lost => {
                    // The directory went away or was replaced: watch it
                    // again, and compare everything.
                    self.watch = Watch::new(&self.path);
                    Some(self.refresh(None))
                }
            },
            None => {
                std::thread::sleep(wait);
                let r = self.refresh(None);
                (!r.parsed.is_empty() || !r.updates.is_empty() || !r.errors.is_empty()).then_some(r)
            }
        }
    }

    /// Parses the files that changed (of `only`, if given, and any file not
    /// seen before) and returns the differences, with what files parsed
    /// before finished since.
    pub fn refresh(&mut self, only: Option<&BTreeSet<PathBuf>>) -> Refresh {
        let started = Instant::now();
        let mut out = self.refresh_inner(only, self.hold);
        out.took = started.elapsed();
        out
    }

    /// What the parses still running when a refresh returned did since;
    /// `None` if nothing.
    fn finished_since(&mut self) -> Option<Refresh> {
        if self.parsing.is_empty() && self.queue.is_empty() {
            return None;
        }
        let started = Instant::now();
        let mut out = Refresh::default();
        self.settle(&mut out, Duration::ZERO, started);
        self.facts(&mut out);
        out.took = started.elapsed();
        (!out.parsed.is_empty()
            || !out.updates.is_empty()
            || !out.errors.is_empty()
            || !out.slow.is_empty())
        .then_some(out)
    }

    fn refresh_inner(&mut self, only: Option<&BTreeSet<PathBuf>>, hold: Duration) -> Refresh {
        let mut out = Refresh::default();
        let listed = match files(&self.path) {
            Ok(l) => l,
            Err(e) => {
                // What was loaded stays: a path that is briefly unreadable
                // does not withdraw every Service. It is said once, not
                // at every poll.
                let message = e.to_string();
                if self.path_error.as_ref() != Some(&message) {
                    out.errors.push(ManifestError {
                        file: self.path.clone(),
                        object: "path".into(),
                        message: message.clone(),
                    });
                    self.path_error = Some(message);
                }
                return out;
            }
        };
        self.path_error = None;
        let gone: Vec<PathBuf> = {
            let now: BTreeSet<&PathBuf> = listed.iter().collect();
            self.files
                .keys()
                .filter(|f| !now.contains(f))
                .cloned()
                .collect()
        };
        let mut todo: BTreeSet<PathBuf> = BTreeSet::new();
        for f in gone {
            // A parse of it still running is forgotten: its result is not
            // used.
            self.parsing.remove(&f);
            self.queue.remove(&f);
            self.replace(&f, None, Parsed::default(), &mut out, &mut todo);
            self.files.remove(&f);
        }
        for f in listed {
            // A file inotify names is read whatever its stamp says: two
            // writes within one tick of the file system's clock leave the
            // same times.
            let named = only.is_some_and(|o| o.contains(&f));
            let last = match self.parsing.get(&f) {
                Some(job) => Some(&job.stamp),
                None => self.files.get(&f).map(|seen| &seen.stamp),
            };
            let stale = match last {
                None => true,
                Some(st) => only.is_none() && *st != stamp(&f),
            };
            if named || stale {
                todo.insert(f);
            }
        }
        let began = Instant::now();
        self.schedule(todo);
        self.settle(&mut out, hold, began);
        self.facts(&mut out);
        out
    }

    /// Starts parsing `files` (a file being parsed is parsed again once
    /// that parse ends).
    fn schedule(&mut self, files: BTreeSet<PathBuf>) {
        for f in files {
            match self.parsing.get_mut(&f) {
                Some(job) => job.again = true,
                None => {
                    self.queue.insert(f);
                }
            }
        }
        while self.parsing.len() < parsing_at_once() {
            let Some(file) = self.queue.pop_first() else {
                break;
            };
            self.next_job += 1;
            let id = self.next_job;
            let job = Job {
                id,
                stamp: stamp(&file),
                since: Instant::now(),
                again: false,
                named: false,
            };
            // A small file (an edit, typically) is parsed here: starting
            // a thread costs more than parsing it (and on glibc's
            // allocator the thread took an ended parse worker's arena and
            // paid for merging what the node freed there: 8 ms after a
            // cold start at 30,000 Services).
            let small = job.stamp.as_ref().is_some_and(|st| st.len <= PARSE_HERE);
            let spawned = if small {
                Err(None)
            } else {
                let (tx, limits, f) = (self.done_tx.clone(), self.limits, file.clone());
                std::thread::Builder::new()
                    .name("manifest-parse".into())
                    .spawn(move || {
                        let parsed = parse::files(std::slice::from_ref(&f), limits)
                            .pop()
                            .unwrap_or_default();
                        let _ = tx.send(Done {
                            file: f,
                            id,
                            parsed,
                        });
                    })
                    .map(drop)
                    .map_err(Some)
            };
            if let Err(failed) = spawned {
                if let Some(e) = failed {
                    // No thread: parsed here, holding the others back.
                    tracing::debug!(error = %e, "cannot start a thread to parse a manifest");
                }
                let parsed = parse::files(std::slice::from_ref(&file), self.limits)
                    .pop()
                    .unwrap_or_default();
                let _ = self.done_tx.send(Done {
                    file: file.clone(),
                    id,
                    parsed,
                });
            }
            self.parsing.insert(file, job);
        }
    }

    /// Waits up to `hold` for the parses started since `began` to end, and
    /// applies those that did (and any other that has), in the files'
    /// order, and what they in turn make parse again. Names the files still
    /// being parsed after [`SLOW`].
    fn settle(&mut self, out: &mut Refresh, hold: Duration, began: Instant) {
        let deadline = Instant::now() + hold;
        // Only the parses started since `began` (by this refresh) are
        // waited for: one that was already running (a slow file) holds
        // nothing back.
        let waited = |parsing: &HashMap<PathBuf, Job>| parsing.values().any(|j| j.since >= began);
        // A file whose definitions became the first ones (the one before it
        // dropped them) is parsed again, to learn them: rare, and bounded
        // by the number of files.
        for _ in 0..=self.files.len() + 1 {
            let mut arrived: BTreeMap<PathBuf, (Option<Stamp>, Parsed)> = BTreeMap::new();
            while !self.parsing.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                let done = match self.done_rx.try_recv() {
                    Ok(d) => d,
                    Err(_) if left.is_zero() || !waited(&self.parsing) => break,
                    Err(_) => match self.done_rx.recv_timeout(left) {
                        Ok(d) => d,
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    },
                };
                let Some(job) = self.parsing.get(&done.file) else {
                    continue;
                };
                if job.id != done.id {
                    continue;
                }
                let Some(job) = self.parsing.remove(&done.file) else {
                    continue;
                };
                if job.again {
                    self.queue.insert(done.file);
                } else {
                    arrived.insert(done.file, (job.stamp, done.parsed));
                }
                self.schedule(BTreeSet::new());
            }
            if arrived.is_empty() {
                break;
            }
            let mut todo = BTreeSet::new();
            for (f, (st, parsed)) in arrived {
                self.replace(&f, st, parsed, out, &mut todo);
                out.parsed.push(f);
            }
            self.schedule(todo);
        }
        for (f, job) in &mut self.parsing {
            let took = job.since.elapsed();
            if took >= self.slow && !job.named {
                job.named = true;
                out.slow.push((f.clone(), took));
            }
        }
        out.slow.sort();
    }

    /// The node's facts, as the files now say them.
    fn facts(&mut self, out: &mut Refresh) {
        // The node's facts come first: the proxiers are reconfigured before
        // the Services arrive, not once they all have.
        let mut facts = Vec::new();
        let node = self.files.values().flat_map(|f| &f.nodes).next().cloned();
        if node != self.node {
            facts.push(Update::Node(node.clone()));
            self.node = node;
        }
        let mut cidrs: Vec<IpNet> = self.files.values().flat_map(|f| f.cidrs.clone()).collect();
        cidrs.sort();
        cidrs.dedup();
        if cidrs != self.cidrs {
            facts.push(Update::ServiceCidrs(cidrs.clone()));
            self.cidrs = cidrs;
        }
        out.updates.splice(0..0, facts);
    }

    /// Puts what `file` defines now in place of what it defined before.
    fn replace(
        &mut self,
        file: &Path,
        stamp: Option<Stamp>,
        parsed: Parsed,
        out: &mut Refresh,
        todo: &mut BTreeSet<PathBuf>,
    ) {
        let entry = self
            .files
            .entry(file.to_path_buf())
            .or_insert_with(|| File {
                id: Arc::from(file),
                stamp: None,
                services: Vec::new(),
                slices: Vec::new(),
                nodes: Vec::new(),
                cidrs: Vec::new(),
            });
        entry.stamp = stamp;
        let id = entry.id.clone();
        out.errors.extend(parsed.errors);
        entry.nodes = parsed
            .nodes
            .into_iter()
            .filter(|n| n.name == self.node_name)
            .collect();
        entry.cidrs = parsed.service_cidrs;
        let old_services = std::mem::take(&mut entry.services);
        let old_slices = std::mem::take(&mut entry.slices);
        let owned_before = self.owners.len();
        let mut services = Vec::with_capacity(parsed.services.len());
        for s in parsed.services {
            let key = (s.namespace.clone(), s.name.clone());
            let (object, used) = self.own(Kind::Service, &key, &id, out);
            if used {
                out.updates.push(Update::Service(key, Some(s)));
            }
            services.push(object);
        }
        let mut slices = Vec::with_capacity(parsed.slices.len());
        for s in parsed.slices {
            let key = (s.namespace.clone(), s.name.clone());
            let (object, used) = self.own(Kind::Slice, &key, &id, out);
            if used {
                out.updates.push(Update::Slice(key, Some(s)));
            }
            slices.push(object);
        }
        self.disown(Kind::Service, old_services, &services, &id, out, todo);
        self.disown(Kind::Slice, old_slices, &slices, &id, out, todo);
        let added = self.owners.len().saturating_sub(owned_before);
        if verdict_model::worth_compacting(added, owned_before) {
            verdict_model::compact(&mut self.owners);
        }
        if let Some(entry) = self.files.get_mut(file) {
            entry.services = services;
            entry.slices = slices;
        }
    }

    /// The fingerprint an object of `kind` named `key` is kept by.
    fn id(&self, kind: Kind, key: &Key) -> Id {
        let [a, b] = &self.prints;
        let what = (kind as u8, key);
        (u128::from(a.hash_one(what)) << 64) | u128::from(b.hash_one(what))
    }

    /// Records that `file` defines `key`. Returns the object's fingerprint,
    /// and whether its definition is the one used (the file is the first
    /// to define it).
    fn own(&mut self, kind: Kind, key: &Key, file: &Arc<Path>, out: &mut Refresh) -> (Id, bool) {
        let id = self.id(kind, key);
        let owned = match self.owners.entry(id) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Owned::new(key, file));
                return (id, true);
            }
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        };
        if !owned.is(key) {
            // Two names with one fingerprint: 2^-128 per pair, and keyed
            // by this process; said rather than mixed up.
            out.errors.push(ManifestError {
                file: file.to_path_buf(),
                object: format!("{} {}/{}", kind.name(), key.0, key.1),
                message: format!("its fingerprint is also {}'s: left out", owned.name),
            });
            return (id, false);
        }
        let at = owned.insert(file);
        match (at, owned.rest().first()) {
            (0, Some(second)) => {
                // The other definition is the repeat.
                out.errors
                    .push(duplicate(second, kind.name(), &key.0, &key.1));
                (id, true)
            }
            (0, None) => (id, true),
            _ => {
                out.errors
                    .push(duplicate(file, kind.name(), &key.0, &key.1));
                (id, false)
            }
        }
    }

    /// `file` no longer defines the keys of `old` missing from `now`: each
    /// is deleted, or taken from the next file that defines it.
    fn disown(
        &mut self,
        kind: Kind,
        old: Vec<Id>,
        now: &[Id],
        file: &Arc<Path>,
        out: &mut Refresh,
        todo: &mut BTreeSet<PathBuf>,
    ) {
        if old.is_empty() {
            return;
        }
        let now: HashSet<&Id> = now.iter().collect();
        for id in old {
            if now.contains(&id) {
                continue;
            }
            let Some(owned) = self.owners.get_mut(&id) else {
                continue;
            };
            match owned.remove(file) {
                Removed::Absent | Removed::Other => {}
                Removed::Last => {
                    if let Some(gone) = self.owners.remove(&id) {
                        out.updates.push(match kind {
                            Kind::Service => Update::Service(gone.key(), None),
                            Kind::Slice => Update::Slice(gone.key(), None),
                        });
                    }
                }
                Removed::First => {
                    todo.insert(owned.first.to_path_buf());
                }
            }
        }
    }
}

/// What the watch saw.
enum Seen {
    Nothing,
    /// These files were written, moved, touched or removed.
    Files(BTreeSet<PathBuf>),
    /// Something that does not name a manifest (a link swapped, events
    /// lost): compare every file.
    Anything,
    /// The watched directory is gone.
    Lost,
}

/// inotify on the directory that holds the manifests.
struct Watch {
    fd: Inotify,
    dir: PathBuf,
    /// With `--manifests FILE`: that file, which its directory's other
    /// files do not concern.
    file: Option<PathBuf>,
}

impl Watch {
    fn new(path: &Path) -> Option<Watch> {
        let (dir, file) = if path.is_dir() {
            (path.to_path_buf(), None)
        } else {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            (dir, Some(path.to_path_buf()))
        };
        let fd = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        // Not IN_MODIFY: a file is read once it is closed, not while it is
        // being written.
        let mask = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        match fd.add_watch(&dir, mask) {
            Ok(_) => Some(Watch { fd, dir, file }),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch the manifests; comparing them on every poll");
                None
            }
        }
    }

    fn wait(&mut self, wait: Duration) -> Seen {
        use std::os::fd::AsFd;
        let timeout = nix::poll::PollTimeout::try_from(wait).unwrap_or(nix::poll::PollTimeout::MAX);
        let mut fds = [nix::poll::PollFd::new(
            self.fd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) => return Seen::Nothing,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Seen::Nothing,
            Err(_) => return Seen::Anything,
        }
        let mut names = BTreeSet::new();
        let mut anything = false;
        loop {
            let events = match self.fd.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => return Seen::Anything,
            };
            if events.is_empty() {
                break;
            }
            for e in events {
                if e.mask.intersects(
                    AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_IGNORED,
                ) {
                    return Seen::Lost;
                }
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    anything = true;
                    continue;
                }
                match e.name {
                    Some(name) => {
                        let p = self.dir.join(&name);
                        if let Some(f) = &self.file {
                            if f.file_name() == Some(name.as_os_str()) {
                                names.insert(f.clone());
                            } else if !is_manifest(&p) {
                                anything = true;
                            }
                        } else if is_manifest(&p) {
                            names.insert(p);
                        } else {
                            // `..data` of a ConfigMap volume, or another
                            // link the manifests go through.
                            anything = true;
                        }
                    }
                    None => anything = true,
                }
            }
        }
        if anything {
            Seen::Anything
        } else if names.is_empty() {
            Seen::Nothing
        } else {
            Seen::Files(names)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("verdict-source-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn service(name: &str, ip: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: demo}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
        )
    }

    fn slice(name: &str, ip: &str) -> String {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: demo, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}], conditions: {{ready: true}}}}]\nports: [{{port: 8080}}]\n"
        )
    }

    /// Waits for the watch to report an edit.
    fn next(m: &mut Manifests) -> Refresh {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = m.changes(Duration::from_millis(100)) {
                return r;
            }
            assert!(Instant::now() < deadline, "no change seen");
        }
    }

    fn keys(r: &Refresh) -> Vec<String> {
        r.updates
            .iter()
            .map(|u| match u {
                Update::Service((ns, n), s) => format!("Service {ns}/{n} {}", s.is_some()),
                Update::Slice((ns, n), s) => format!("EndpointSlice {ns}/{n} {}", s.is_some()),
                Update::Node(n) => format!("Node {:?}", n.as_ref().map(|n| &n.name)),
                Update::ServiceCidrs(c) => format!("ServiceCIDRs {c:?}"),
                Update::Pod((ns, n), p) => format!("Pod {ns}/{n} {}", p.is_some()),
                Update::Synced => "Synced".into(),
            })
            .collect()
    }

    #[test]
    fn an_objects_files_stay_in_path_order_and_the_first_is_used() {
        let f = |p: &str| -> Arc<Path> { Arc::from(Path::new(p)) };
        let key: Key = ("ns".into(), "web".into());
        let mut o = Owned::new(&key, &f("/m/c.yaml"));
        assert!(o.is(&key) && !o.is(&("ns".into(), "we".into())));
        assert_eq!(o.key(), key);
        assert_eq!(o.insert(&f("/m/a.yaml")), 0);
        assert_eq!(o.insert(&f("/m/b.yaml")), 1);
        assert_eq!(o.insert(&f("/m/b.yaml")), 1, "once each");
        assert_eq!(o.first, f("/m/a.yaml"));
        assert_eq!(o.rest(), [f("/m/b.yaml"), f("/m/c.yaml")]);
        assert!(matches!(o.remove(&f("/m/x.yaml")), Removed::Absent));
        assert!(matches!(o.remove(&f("/m/b.yaml")), Removed::Other));
        assert!(matches!(o.remove(&f("/m/a.yaml")), Removed::First));
        assert_eq!(o.first, f("/m/c.yaml"));
        assert!(o.rest.is_none(), "no room kept for repeats");
        assert!(matches!(o.remove(&f("/m/c.yaml")), Removed::Last));
    }

    #[test]
    fn an_edit_parses_only_the_file_that_changed() {
        let d = tmpdir("edit");
        // 15,000 Services and their slices: 30,000 objects in one file.
        let mut big = String::new();
        for i in 0..15_000 {
            let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            big.push_str(&service(&format!("s{i}"), &ip));
            big.push_str(&slice(
                &format!("s{i}"),
                &format!("10.244.{}.{}", i / 250, i % 250 + 1),
            ));
        }
        std::fs::write(d.join("big.yaml"), big).unwrap();
        std::fs::write(
            d.join("small.yaml"),
            service("web", "10.97.0.1") + &slice("web", "10.245.0.1"),
        )
        .unwrap();
        let mut m = Manifests::new(&d, "node-a");
        let first = m.changes(Duration::ZERO).unwrap();
        assert!(m.watched(), "inotify works in the temporary directory");
        assert_eq!(first.parsed, [d.join("big.yaml"), d.join("small.yaml")]);
        assert_eq!(first.updates.len(), 30_002);
        assert!(first.errors.is_empty(), "{:?}", first.errors);
        assert!(
            m.changes(Duration::from_millis(50)).is_none(),
            "nothing edited"
        );

        // The endpoint moves: only small.yaml is read, and both its objects
        // come out (the node drops the one that did not change).
        std::fs::write(
            d.join("small.yaml"),
            service("web", "10.97.0.1") + &slice("web", "10.245.0.2"),
        )
        .unwrap();
        let r = next(&mut m);
        assert_eq!(r.parsed, [d.join("small.yaml")]);
        assert_eq!(
            keys(&r),
            ["Service demo/web true", "EndpointSlice demo/web-1 true"]
        );
        let Update::Slice(_, Some(s)) = &r.updates[1] else {
            panic!()
        };
        assert_eq!(s.endpoints[0].addresses, ["10.245.0.2"]);

        // Edits of the same size within one tick of the file system's
        // clock leave the same stamp; each is read all the same.
        for ip in ["10.245.0.3", "10.245.0.4", "10.245.0.5"] {
            std::fs::write(
                d.join("small.yaml"),
                service("web", "10.97.0.1") + &slice("web", ip),
            )
            .unwrap();
            let r = next(&mut m);
            let Some(Update::Slice(_, Some(s))) = r.updates.get(1) else {
                panic!("{:?}", keys(&r))
            };
            assert_eq!(s.endpoints[0].addresses, [ip]);
        }

        // The Service goes from the file: it is deleted, nothing else.
        std::fs::write(d.join("small.yaml"), slice("web", "10.245.0.5")).unwrap();
        let r = next(&mut m);
        assert_eq!(r.parsed, [d.join("small.yaml")]);
        assert_eq!(
            keys(&r),
            ["EndpointSlice demo/web-1 true", "Service demo/web false"]
        );

        // A new file is read alone; a removed one deletes what it held.
        std::fs::write(d.join("more.yml"), service("api", "10.97.0.2")).unwrap();
        let r = next(&mut m);
        assert_eq!(r.parsed, [d.join("more.yml")]);
        assert_eq!(keys(&r), ["Service demo/api true"]);
        std::fs::remove_file(d.join("small.yaml")).unwrap();
        let r = next(&mut m);
        assert!(r.parsed.is_empty(), "{:?}", r.parsed);
        assert_eq!(keys(&r), ["EndpointSlice demo/web-1 false"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_over_a_limit_is_named_and_the_others_keep_flowing() {
        let d = tmpdir("limits");
        std::fs::write(d.join("a.yaml"), service("web", "10.97.0.1")).unwrap();
        let nested = format!(
            "{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: deep, namespace: demo}}\nspec: {}{}\n",
            service("x", "10.97.0.5"),
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        std::fs::write(d.join("b.yaml"), &nested).unwrap();
        let mut m = Manifests::new(&d, "node-a");
        let started = Instant::now();
        let r = m.changes(Duration::ZERO).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(keys(&r), ["Service demo/web true"]);
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert_eq!(
            r.errors[0].to_string(),
            format!(
                "{}: file: is nested more than 100 levels deep (line 10); not read",
                d.join("b.yaml").display()
            )
        );
        // Edits of the good file flow; the bad one is not named again.
        std::fs::write(d.join("a.yaml"), service("web", "10.97.0.2")).unwrap();
        let r = next(&mut m);
        assert_eq!(keys(&r), ["Service demo/web true"]);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // Fixed, it is read: no restart.
        std::fs::write(d.join("b.yaml"), service("x", "10.97.0.5")).unwrap();
        let r = next(&mut m);
        assert_eq!(keys(&r), ["Service demo/x true"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_slow_file_does_not_hold_back_an_edit_of_another() {
        let d = tmpdir("slow");
        let big = |ip: &str| {
            let mut big = String::new();
            for i in 0..20_000 {
                big.push_str(&service(
                    &format!("s{i}"),
                    &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                ));
                big.push_str(&slice(&format!("s{i}"), ip));
            }
            big
        };
        std::fs::write(d.join("big.yaml"), big("10.244.0.1")).unwrap();
        std::fs::write(d.join("small.yaml"), service("web", "10.97.0.1")).unwrap();
        let mut m = Manifests::new(&d, "node-a");
        let first = m.changes(Duration::ZERO).unwrap();
        assert_eq!(first.updates.len(), 40_001);
        // The big file is rewritten and its parse starts; the small one is
        // edited while it runs: the small edit comes out at once, though the
        // refresh would wait 10 s for a parse of its own.
        m.hold = Duration::from_millis(50);
        m.slow = Duration::from_millis(200);
        std::fs::write(d.join("big.yaml"), big("10.244.0.2")).unwrap();
        let started = Instant::now();
        let mut big_at = None;
        let mut named_slow = false;
        let mut see = |r: &Refresh, big_at: &mut Option<Duration>| {
            named_slow |= r.slow.iter().any(|(f, _)| f == &d.join("big.yaml"));
            if r.parsed.contains(&d.join("big.yaml")) {
                assert_eq!(r.updates.len(), 40_000);
                big_at.get_or_insert(started.elapsed());
            }
        };
        if let Some(r) = m.changes(Duration::from_millis(500)) {
            see(&r, &mut big_at);
        }
        assert!(
            big_at.is_none(),
            "the big file parsed in {:?}",
            started.elapsed()
        );
        m.hold = Duration::from_secs(10);
        std::fs::write(d.join("small.yaml"), service("web", "10.97.0.2")).unwrap();
        let edited = Instant::now();
        let r = next(&mut m);
        let small_took = edited.elapsed();
        assert!(r.parsed.contains(&d.join("small.yaml")), "{:?}", r.parsed);
        assert!(keys(&r).contains(&"Service demo/web true".to_owned()));
        assert!(
            small_took < Duration::from_secs(2),
            "the small edit took {small_took:?}"
        );
        assert!(
            !r.parsed.contains(&d.join("big.yaml")),
            "the big file was done first: nothing shown"
        );
        while big_at.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the big file never came out"
            );
            if let Some(r) = m.changes(Duration::from_millis(50)) {
                see(&r, &mut big_at);
            }
        }
        assert!(
            named_slow || big_at < Some(Duration::from_millis(250)),
            "big {big_at:?}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_is_read_once_written_not_while_being_written() {
        let d = tmpdir("half");
        std::fs::write(d.join("a.yaml"), service("web", "10.97.0.1")).unwrap();
        let mut m = Manifests::new(&d, "node-a");
        m.changes(Duration::ZERO).unwrap();
        // Truncated and half written, still open: nothing is read, so the
        // Service is not withdrawn meanwhile.
        let text = service("web", "10.97.0.9");
        let (head, tail) = text.as_bytes().split_at(30);
        let mut f = std::fs::File::create(d.join("a.yaml")).unwrap();
        f.write_all(head).unwrap();
        f.flush().unwrap();
        assert!(m.changes(Duration::from_millis(300)).is_none());
        f.write_all(tail).unwrap();
        drop(f);
        let r = next(&mut m);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let [Update::Service(_, Some(s))] = r.updates.as_slice() else {
            panic!("{:?}", keys(&r))
        };
        assert_eq!(s.cluster_ips, ["10.97.0.9"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_repeat_takes_over_when_the_first_definition_goes() {
        let d = tmpdir("repeat");
        std::fs::write(d.join("a.yaml"), service("web", "10.97.0.1")).unwrap();
        std::fs::write(d.join("b.yaml"), service("web", "10.97.0.2")).unwrap();
        let mut m = Manifests::new(&d, "node-a");
        let r = m.changes(Duration::ZERO).unwrap();
        assert_eq!(keys(&r), ["Service demo/web true"]);
        assert_eq!(r.errors.len(), 1);
        assert!(
            r.errors[0]
                .to_string()
                .contains("b.yaml: Service demo/web: defined more than once"),
            "{}",
            r.errors[0]
        );

        // a.yaml stops defining it: b.yaml's definition is read and used.
        std::fs::write(d.join("a.yaml"), "").unwrap();
        let r = next(&mut m);
        assert_eq!(r.parsed, [d.join("a.yaml"), d.join("b.yaml")]);
        let [Update::Service(_, Some(s))] = r.updates.as_slice() else {
            panic!("{:?}", keys(&r))
        };
        assert_eq!(s.cluster_ips, ["10.97.0.2"]);

        // A file before b.yaml defines it again: that one is used.
        std::fs::write(d.join("0.yaml"), service("web", "10.97.0.3")).unwrap();
        let r = next(&mut m);
        let [Update::Service(_, Some(s))] = r.updates.as_slice() else {
            panic!("{:?}", keys(&r))
        };
        assert_eq!(s.cluster_ips, ["10.97.0.3"]);
        assert!(
            r.errors[0]
                .to_string()
                .contains("b.yaml: Service demo/web: defined more than once")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn this_node_and_the_service_cidrs_change_only_when_they_do() {
        let d = tmpdir("node");
        let node = |ip: &str| {
            format!(
                "---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nstatus: {{addresses: [{{type: InternalIP, address: {ip}}}]}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-b}}\n"
            )
        };
        let cidr = "---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16]}\n";
        std::fs::write(d.join("node.yaml"), node("192.168.0.10") + cidr).unwrap();
        std::fs::write(d.join("svc.yaml"), service("web", "10.96.0.1")).unwrap();
        let mut m = Manifests::new(&d, "node-a");
        let r = m.changes(Duration::ZERO).unwrap();
        assert_eq!(
            keys(&r),
            [
                "Node Some(\"node-a\")",
                "ServiceCIDRs [10.96.0.0/16]",
                "Service demo/web true"
            ]
        );
        // Another file's edit says nothing about them.
        std::fs::write(d.join("svc.yaml"), service("web", "10.96.0.2")).unwrap();
        assert_eq!(keys(&next(&mut m)), ["Service demo/web true"]);
        std::fs::write(d.join("node.yaml"), node("192.168.0.11")).unwrap();
        assert_eq!(
            keys(&next(&mut m)),
            ["Node Some(\"node-a\")", "ServiceCIDRs []"]
        );
        std::fs::remove_file(d.join("node.yaml")).unwrap();
        assert_eq!(keys(&next(&mut m)), ["Node None"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_unreadable_path_keeps_what_was_loaded() {
        let d = tmpdir("gone");
        let f = d.join("one.yaml");
        std::fs::write(&f, service("web", "10.96.0.1")).unwrap();
        // A single file, watched through its directory.
        let mut m = Manifests::new(&f, "node-a");
        assert_eq!(
            keys(&m.changes(Duration::ZERO).unwrap()),
            ["Service demo/web true"]
        );
        std::fs::write(d.join("other.yaml"), service("x", "10.96.0.9")).unwrap();
        assert!(
            m.changes(Duration::from_millis(200)).is_none(),
            "another file of the directory"
        );
        std::fs::remove_file(&f).unwrap();
        let r = next(&mut m);
        assert!(r.updates.is_empty(), "{:?}", keys(&r));
        assert!(
            r.errors[0].to_string().contains("one.yaml: path:"),
            "{}",
            r.errors[0]
        );
        // Said once, not at every look.
        assert!(m.refresh(None).errors.is_empty());
        // Back: read again (the node finds the Service unchanged).
        std::fs::write(&f, service("web", "10.96.0.1")).unwrap();
        let r = next(&mut m);
        assert_eq!(keys(&r), ["Service demo/web true"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
