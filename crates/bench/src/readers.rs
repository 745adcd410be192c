//! The daemon's readers under load: HTTP probes of the admin ports,
//! taken every 50 ms from inside the daemon's network namespace while it
//! syncs (`verdict-bench daemon --readers`), and slow clients that hold
//! connections to both admin ports while `/livez` is probed and the whole
//! `/metrics` is scraped (`verdict-bench daemon --slow-clients`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one probe may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// One probe: when it was sent, how long the whole answer took, and its
/// status (`None`: no answer).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub at: Instant,
    pub took: Duration,
    pub code: Option<u16>,
}

/// One GET of `path` on `addr`, read to its end; the status and the bytes
/// of the body.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, usize), String> {
    let (code, _, body) = fetch(addr, path, timeout)?;
    Ok((code, body.len()))
}

/// One GET of `path` on `addr`, read to its end: the status, the head and
/// the body.
fn fetch(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String, Vec<u8>), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header")?;
    let head = String::from_utf8_lossy(&out[..head_end]).into_owned();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    Ok((code, head, out.split_off(head_end + 4)))
}

/// Moves this thread into the network namespace `name`.
fn enter(name: &str) -> Result<(), String> {
    crate::enter_netns(name)
}

/// Probes, each target on a thread of its own every `every`, until
/// finished.
pub struct Prober {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Sample>>>,
}

impl Prober {
    /// Starts probing `targets` (address, path) from inside `ns`.
    pub fn start(ns: &str, targets: &[(SocketAddr, &str)], every: Duration) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = targets
            .iter()
            .map(|(addr, path)| {
                let (addr, path, ns) = (*addr, path.to_string(), ns.to_owned());
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    if enter(&ns).is_err() {
                        return out;
                    }
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        let code = get(addr, &path, PROBE_TIMEOUT).ok().map(|(c, _)| c);
                        out.push(Sample {
                            at,
                            took: at.elapsed(),
                            code,
                        });
                        next += every;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                    out
                })
            })
            .collect();
        Prober { stop, threads }
    }

    /// Stops and returns every target's samples, in the order given.
    pub fn finish(self) -> Vec<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap_or_default())
            .collect()
    }
}

/// What the probes of one target saw within a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub probes: usize,
    /// Answered with any status.
    pub answered: usize,
    /// Answered 2xx.
    pub ok: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The samples sent within `[from, to]`.
pub fn summarize(samples: &[Sample], from: Instant, to: Instant) -> Summary {
    let within: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= from && s.at <= to)
        .collect();
    let ms: Vec<f64> = within
        .iter()
        .map(|s| {
            // An unanswered probe counts as the whole timeout.
            let t = if s.code.is_some() {
                s.took
            } else {
                PROBE_TIMEOUT.max(s.took)
            };
            t.as_secs_f64() * 1e3
        })
        .collect();
    Summary {
        probes: within.len(),
        answered: within.iter().filter(|s| s.code.is_some()).count(),
        ok: within
            .iter()
            .filter(|s| s.code.is_some_and(|c| (200..300).contains(&c)))
            .count(),
        p50_ms: crate::pct(&mut ms.clone(), 0.50),
        p99_ms: crate::pct(&mut ms.clone(), 0.99),
        max_ms: crate::peak(&ms),
    }
}

/// The first sample answered, if any: when the servers were up.
pub fn first_answer(samples: &[Sample]) -> Option<Instant> {
    samples.iter().find(|s| s.code.is_some()).map(|s| s.at)
}

/// Slow clients: `n` connections to each address, each sending one byte
/// of a request every `pace` and never finishing it; a connection the
/// server closes is opened again at once.
pub struct SlowClients {
    stop: Arc<AtomicBool>,
    pub open: Arc<AtomicUsize>,
    pub reopened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl SlowClients {
    /// Opens them from inside `ns` and keeps them going.
    pub fn start(ns: &str, addrs: &[SocketAddr], n: usize, pace: Duration) -> SlowClients {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let reopened = Arc::new(AtomicUsize::new(0));
        let (s, o, r, ns, addrs) = (
            stop.clone(),
            open.clone(),
            reopened.clone(),
            ns.to_owned(),
            addrs.to_vec(),
        );
        let thread = std::thread::spawn(move || {
            if enter(&ns).is_err() {
                return;
            }
            const REQUEST: &[u8] = b"GET /livez HTTP/1.1\r\nHost: slow\r\n";
            let connect = |addr: &SocketAddr| {
                let c = TcpStream::connect_timeout(addr, Duration::from_secs(2)).ok()?;
                c.set_nonblocking(true).ok()?;
                Some(c)
            };
            // (address, stream, bytes of the request sent)
            let mut conns: Vec<(SocketAddr, Option<TcpStream>, usize)> = Vec::new();
            for a in &addrs {
                for _ in 0..n {
                    conns.push((*a, connect(a), 0));
                }
            }
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let mut alive = 0;
                for (addr, conn, sent) in conns.iter_mut() {
                    let gone = match conn {
                        Some(c) => {
                            let mut buf = [0u8; 512];
                            // The server closed it (EOF), or answered.
                            let closed = matches!(c.read(&mut buf), Ok(0));
                            let byte = &REQUEST[*sent % REQUEST.len()..][..1];
                            closed || c.write(byte).is_err()
                        }
                        None => true,
                    };
                    if gone {
                        *conn = connect(addr);
                        *sent = 0;
                        r.fetch_add(1, Ordering::Relaxed);
                    } else {
                        *sent += 1;
                    }
                    if conn.is_some() {
                        alive += 1;
                    }
                }
                o.store(alive, Ordering::Relaxed);
                let left = pace.saturating_sub(started.elapsed());
                let t = Instant::now();
                while t.elapsed() < left && !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        SlowClients {
            stop,
            open,
            reopened,
            thread: Some(thread),
        }
    }
}

impl Drop for SlowClients {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Scrapes `/metrics` in a loop from inside `ns` until stopped: how many
/// scrapes, how long each took, and the bytes of the last.
pub struct Scraper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Vec<f64>, usize)>,
}

impl Scraper {
    pub fn start(ns: &str, addr: SocketAddr) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, ns) = (stop.clone(), ns.to_owned());
        let thread = std::thread::spawn(move || {
            let mut took = Vec::new();
            let mut bytes = 0;
            if enter(&ns).is_err() {
                return (took, bytes);
            }
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                if let Ok((200, n)) = get(addr, "/metrics", Duration::from_secs(60)) {
                    took.push(t.elapsed().as_secs_f64() * 1e3);
                    bytes = n;
                }
            }
            (took, bytes)
        });
        Scraper { stop, thread }
    }

    pub fn finish(self) -> (Vec<f64>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Raises this process's soft limit of open files to the hard limit: the
/// slow clients hold one descriptor each.
pub fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// The floor: a minimal HTTP server of the benchmark's own inside `ns`,
/// probed as verdict's ports are. It shares the machine, the namespace
/// and its loopback path through verdict's hooks, but none of verdict's
/// code, so a stall it sees too is the machine's (CPU time taken by the
/// kernel's commit on two cores), not the admin server's.
pub struct Floor {
    pub addr: SocketAddr,
    ns: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Floor {
    pub fn start(ns: &str) -> Result<Floor, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, inside) = (stop.clone(), ns.to_owned());
        let thread = std::thread::spawn(move || {
            let listener = enter(&inside).and_then(|()| {
                std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())
            });
            let listener = match listener.and_then(|l| {
                let a = l.local_addr().map_err(|e| e.to_string())?;
                Ok((l, a))
            }) {
                Ok((l, a)) => {
                    let _ = tx.send(Ok(a));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !s.load(Ordering::Relaxed) {
                let Ok((mut c, _)) = listener.accept() else {
                    continue;
                };
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| e.to_string())??;
        Ok(Floor {
            addr,
            ns: ns.to_owned(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes its accept from inside the namespace, where the address
        // is; a thread that cannot enter it is left to end with the
        // process.
        let addr = self.addr;
        let waker = self.ns.clone();
        let woke = std::thread::spawn(move || {
            enter(&waker).is_ok()
                && TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
        })
        .join()
        .unwrap_or(false);
        if let Some(t) = self.thread.take()
            && woke
        {
            let _ = t.join();
        }
    }
}

/// One GET of `path` on `addr` from inside `ns`: the body, which must
/// come with 200.
pub fn get_body(ns: &str, addr: SocketAddr, path: &str) -> Result<String, String> {
    let (ns, path) = (ns.to_owned(), path.to_owned());
    std::thread::spawn(move || {
        enter(&ns)?;
        let (code, head, body) = fetch(addr, &path, Duration::from_secs(60))?;
        if code != 200 {
            return Err(format!("GET {path}: {head}"));
        }
        let body = if verdict_e2e::http::is_chunked(&head) {
            verdict_e2e::http::decode_chunked(&body).map_err(|e| format!("GET {path}: {e}"))?
        } else {
            body
        };
        String::from_utf8(body).map_err(|e| format!("GET {path}: {e}"))
    })
    .join()
    .map_err(|_| "the scraping thread panicked".to_owned())?
}
