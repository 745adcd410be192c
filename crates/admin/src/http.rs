//! The admin HTTP server: hyper's HTTP/1.1, on a small tokio runtime of
//! its own, for probes, scrapers, the debug endpoints, the introspection
//! API and the service health-check node ports. Built so that no client
//! can starve another:
//! - a request's headers must arrive within [`HEADER_TIMEOUT`] and its
//!   body within [`BODY_TIMEOUT`], or the connection is closed: a client
//!   that sends a byte every few seconds holds a connection for seconds,
//!   not forever;
//! - at most [`MAX_CONNECTIONS`] connections per server are open; one more
//!   is closed at once rather than queued;
//! - the *fast* routes (health) are answered on the runtime's own threads
//!   as soon as their request is read, and must not block; every other
//!   route runs on a pool of blocking threads, [`MAX_SLOW_IN_FLIGHT`] at
//!   once per server, so a 30,000-Service scrape or a trace that reads the
//!   kernel never holds a probe back.
//!
//! Every method reaches the handler, as with Go's handlers; a HEAD answer
//! has no body.
//!
//! A [`Stream`](crate::Stream)ed answer is written on its blocking thread as the client
//! takes it, [`CHUNK`] bytes at a time and at most [`CHUNKS_AHEAD`] chunks
//! ahead of the client, and sent chunked: a scrape of 270,000 series never
//! holds its 35 MB of text. A client that takes nothing for
//! [`STREAM_STALL`] is cut off, so it holds its slow-route turn for that
//! long at most.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use nix::unistd::{Pid, gettid};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::health::Response;

/// Open connections per server at most.
pub const MAX_CONNECTIONS: usize = 4096;
/// The `Server` header of every answer: how `verdict cleanup` tells
/// verdict's health server from kube-proxy's, whose `/healthz` JSON is
/// the same (kube-proxy's sends no `Server` header).
pub const SERVER: &str = concat!("verdict/v", env!("CARGO_PKG_VERSION"));

/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests of the slow routes answered at once per server; more wait.
pub const MAX_SLOW_IN_FLIGHT: usize = 16;
/// How long a request of a slow route waits for its turn before it is
/// answered 503.
pub const SLOW_QUEUE_WAIT: Duration = Duration::from_secs(30);
/// The largest request body read (`PUT /debug/flags/v` sends a number).
const MAX_BODY: usize = 64 * 1024;
/// The size of the chunks a [`Stream`](crate::Stream)ed answer is sent in.
pub const CHUNK: usize = 64 * 1024;
/// How many chunks of a [`Stream`](crate::Stream)ed answer are written ahead of the
/// client at most.
pub const CHUNKS_AHEAD: usize = 4;
/// How long a [`Stream`](crate::Stream)ed answer waits for the client to take a chunk
/// before the connection is cut.
pub const STREAM_STALL: Duration = Duration::from_secs(30);
/// Worker threads of the runtime every server shares: they only read
/// requests, answer the fast routes and write answers.
const WORKERS: usize = 2;

/// A request, as the handler sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, `PUT`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query, without `?` (empty if none).
    pub query: String,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// Who sent it (`None`: a request made in-process).
    pub peer: Option<SocketAddr>,
}

impl Request {
    /// A GET of `target` (`/path?query`), for tests and callers.
    pub fn get(target: &str) -> Request {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Request {
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            ..Request::default()
        }
    }

    /// A header's value (`name` lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a query parameter, percent-decoded (`+` is a space);
    /// the first if repeated.
    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query.split('&').find_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k) == key).then(|| percent_decode(v))
        })
    }

    /// Every query parameter, percent-decoded, in the order given.
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        self.query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect()
    }

    /// Whether the query has this key (`?verbose`, `?verbose=1`).
    pub fn has_query(&self, key: &str) -> bool {
        self.query
            .split('&')
            .any(|p| p.split('=').next() == Some(key))
    }
}

/// Answers a request; `None` is 404.
pub type Handler = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// What one server answers: the fast routes first, then the slow ones.
#[derive(Clone, Default)]
pub struct Routes {
    fast: Option<Handler>,
    slow: Option<Handler>,
}

impl Routes {
    /// Routes answered on the server's own threads as soon as the request
    /// is read. The handler must not block: health, taken from state a
    /// lock guards for a moment at most.
    pub fn fast(handler: Handler) -> Routes {
        Routes {
            fast: Some(handler),
            slow: None,
        }
    }

    /// Routes answered on the blocking pool.
    pub fn slow(handler: Handler) -> Routes {
        Routes {
            fast: None,
            slow: Some(handler),
        }
    }

    /// These routes, and `handler` for what the fast ones do not answer.
    pub fn then_slow(mut self, handler: Handler) -> Routes {
        self.slow = Some(handler);
        self
    }
}

/// The thread ids of the runtime's threads (workers and the blocking
/// pool), as they start and stop.
static THREADS: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

fn threads_registry() -> std::sync::MutexGuard<'static, Vec<Pid>> {
    THREADS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Calls `f` with the thread ids of every thread the admin servers run on
/// (none before the first server starts). No thread of the list ends
/// while `f` runs: a thread leaves the list before it ends, and waits for
/// `f` to do so.
pub fn with_threads<T>(f: impl FnOnce(&[Pid]) -> T) -> T {
    f(&threads_registry())
}

/// The runtime every admin server runs on, started on first use.
fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .thread_name("admin-http")
                .on_thread_start(|| threads_registry().push(gettid()))
                .on_thread_stop(|| {
                    let me = gettid();
                    threads_registry().retain(|t| *t != me);
                })
                .enable_io()
                .enable_time()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| std::io::Error::other(format!("the admin server's runtime: {e}")))
}

/// One server's routes and limits.
struct Server {
    routes: Routes,
    connections: Arc<Semaphore>,
    slow: Arc<Semaphore>,
}

/// Binds `addr` and serves `routes` in the background. Returns the bound
/// address (useful with port 0).
pub fn serve(addr: SocketAddr, routes: Routes) -> std::io::Result<SocketAddr> {
    let (bound, _task) = start(addr, routes)?;
    Ok(bound)
}

/// Stops its server when dropped: the port is closed at once; requests
/// being answered finish.
#[derive(Debug)]
pub struct Stopper(tokio::task::AbortHandle);

impl Drop for Stopper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Binds `addr` and serves `routes` until the returned [`Stopper`] is
/// dropped.
pub fn serve_until_dropped(
    addr: SocketAddr,
    routes: Routes,
) -> std::io::Result<(SocketAddr, Stopper)> {
    let (bound, task) = start(addr, routes)?;
    Ok((bound, Stopper(task)))
}

fn start(
    addr: SocketAddr,
    routes: Routes,
) -> std::io::Result<(SocketAddr, tokio::task::AbortHandle)> {
    let rt = runtime()?;
    let listener = std::net::TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let server = Arc::new(Server {
        routes,
        connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        slow: Arc::new(Semaphore::new(MAX_SLOW_IN_FLIGHT)),
    });
    let task = rt.spawn(accept(listener, server));
    Ok((bound, task.abort_handle()))
}

/// Accepts connections for as long as the task lives.
async fn accept(listener: tokio::net::TcpListener, server: Arc<Server>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: try again shortly rather
                // than spin.
                tracing::debug!(error = %e, "http accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Over the cap, the connection is closed at once: queued, it
        // would hold a file descriptor and delay whoever comes next.
        let Ok(permit) = server.connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(server.clone(), req, peer));
            // Headers go out in Go's canonical case, as kube-proxy writes
            // them (`X-Load-Balancing-Endpoint-Weight`).
            let conn = http1::Builder::new()
                .title_case_headers(true)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "http connection");
            }
            drop(permit);
        });
    }
}

/// The request as the handler sees it; `Err` is the answer to give
/// instead (a body too slow or too large).
async fn read(req: hyper::Request<Incoming>, peer: SocketAddr) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes().to_vec(),
            Ok(Err(_)) => {
                return Err(Response::text(
                    413,
                    "request body too large or broken\n".into(),
                    "text/plain; charset=utf-8",
                ));
            }
            Err(_) => {
                return Err(Response::text(
                    408,
                    "request body too slow\n".into(),
                    "text/plain; charset=utf-8",
                ));
            }
        };
    Ok(Request {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        headers,
        body,
        peer: Some(peer),
    })
}

/// An answer's body: whole, or streamed from its writer.
type AnswerBody = Either<Full<Bytes>, Streamed>;

async fn answer(
    server: Arc<Server>,
    req: hyper::Request<Incoming>,
    peer: SocketAddr,
) -> Result<hyper::Response<AnswerBody>, Infallible> {
    let request = match read(req, peer).await {
        Ok(r) => r,
        Err(r) => return Ok(to_hyper(r, None)),
    };
    if let Some(fast) = &server.routes.fast
        && let Some(r) = fast(&request)
    {
        return Ok(to_hyper(r, None));
    }
    let Some(slow) = server.routes.slow.clone() else {
        return Ok(to_hyper(not_found(), None));
    };
    let permit =
        match tokio::time::timeout(SLOW_QUEUE_WAIT, server.slow.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            _ => {
                return Ok(to_hyper(
                    Response::text(
                        503,
                        "too many requests in flight; try again\n".into(),
                        "text/plain; charset=utf-8",
                    ),
                    None,
                ));
            }
        };
    // The head comes back as soon as the handler returns; a streamed body
    // is then written on the same thread, which keeps the turn until the
    // client has it all (or is cut off).
    let (head, answered) = oneshot::channel();
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut r = slow(&request).unwrap_or_else(not_found);
        let Some(stream) = r.stream.take() else {
            let _ = head.send((r, None));
            return;
        };
        let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
        if head.send((r, Some(rx))).is_err() {
            return;
        }
        let mut out = ChunkWriter::new(tx, rt);
        if let Err(e) = stream.write(&mut out).and_then(|()| out.finish()) {
            tracing::debug!(path = %request.path, error = %e, "a streamed answer was cut off");
        }
    });
    Ok(match answered.await {
        Ok((r, rx)) => to_hyper(r, rx),
        Err(_) => to_hyper(
            Response::text(
                500,
                "the handler failed\n".into(),
                "text/plain; charset=utf-8",
            ),
            None,
        ),
    })
}

/// One piece of a streamed body, or its end.
enum Chunk {
    Data(Bytes),
    End,
}

/// Writes a streamed body into the channel the connection reads, in
/// chunks of [`CHUNK`] bytes.
struct ChunkWriter {
    tx: mpsc::Sender<Chunk>,
    rt: tokio::runtime::Handle,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn new(tx: mpsc::Sender<Chunk>, rt: tokio::runtime::Handle) -> ChunkWriter {
        ChunkWriter {
            tx,
            rt,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    /// Waits (on this blocking thread) until the client has room for one
    /// more chunk.
    fn send(&self, chunk: Chunk) -> io::Result<()> {
        self.rt
            .block_on(self.tx.send_timeout(chunk, STREAM_STALL))
            .map_err(|e| match e {
                mpsc::error::SendTimeoutError::Timeout(_) => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took nothing for {STREAM_STALL:?}"),
                ),
                mpsc::error::SendTimeoutError::Closed(_) => {
                    io::Error::new(io::ErrorKind::BrokenPipe, "the client is gone")
                }
            })
    }

    fn send_buffered(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.send(Chunk::Data(Bytes::from(full)))
    }

    /// Sends what is buffered and the end of the body.
    fn finish(&mut self) -> io::Result<()> {
        self.send_buffered()?;
        self.send(Chunk::End)
    }
}

impl io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.send_buffered()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The writer stopped before the end of the body: the connection is cut,
/// so that the client does not take a part for the whole.
#[derive(Debug, thiserror::Error)]
#[error("the answer was cut off before its end")]
pub struct CutOff;

/// A streamed body, as the connection reads it.
pub struct Streamed {
    rx: mpsc::Receiver<Chunk>,
    ended: bool,
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = CutOff;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, CutOff>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Chunk::Data(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Chunk::End)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(Some(Err(CutOff)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

fn not_found() -> Response {
    Response::text(
        404,
        "404 page not found\n".into(),
        "text/plain; charset=utf-8",
    )
}

fn to_hyper(
    mut r: Response,
    streamed: Option<mpsc::Receiver<Chunk>>,
) -> hyper::Response<AnswerBody> {
    let body = match streamed {
        Some(rx) => Either::Right(Streamed { rx, ended: false }),
        // A stream not written on the blocking pool (a fast route's) is
        // written here, whole.
        None if r.stream.is_some() => Either::Left(Full::new(Bytes::from(r.bytes().into_owned()))),
        None => Either::Left(Full::new(Bytes::from(std::mem::take(&mut r.body)))),
    };
    let mut out = hyper::Response::new(body);
    *out.status_mut() =
        hyper::StatusCode::from_u16(r.code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = out.headers_mut();
    let mut put = |k: &str, v: &str| {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(v),
        ) {
            h.insert(k, v);
        }
    };
    put("content-type", r.content_type);
    put("x-content-type-options", "nosniff");
    put("server", SERVER);
    for (k, v) in &r.headers {
        put(k, v);
    }
    out
}

/// `%XX` escapes and `+` decoded; malformed escapes are kept as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {

    #[test]
    fn query_parameters_are_percent_decoded() {
        let r = Request::get("/api/v1/services?q=kube%2Dsystem%2Fdns&limit=5&x=a+b&bad=%zz&end=%4");
        assert_eq!(r.query_param("q").as_deref(), Some("kube-system/dns"));
        assert_eq!(r.query_param("limit").as_deref(), Some("5"));
        assert_eq!(r.query_param("x").as_deref(), Some("a b"));
        assert_eq!(r.query_param("bad").as_deref(), Some("%zz"));
        assert_eq!(r.query_param("end").as_deref(), Some("%4"));
        assert_eq!(r.query_param("missing"), None);
        let pairs = r.query_pairs();
        assert_eq!(pairs[0], ("q".into(), "kube-system/dns".into()));
        assert_eq!(pairs[2], ("x".into(), "a b".into()));
        assert_eq!(pairs.len(), 5);
        assert!(Request::get("/api/v1").query_pairs().is_empty());
    }

    use super::*;
    use crate::Stream;

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn answers_paths_and_closes() {
        let handler: Handler = Arc::new(|r: &Request| {
            (r.path == "/healthz").then(|| Response::json(503, "{\"healthy\":false}".into()))
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::slow(handler)).unwrap();
        let r = get(addr, "/healthz?verbose");
        assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
        assert!(r.contains("Content-Type: application/json\r\n"), "{r}");
        assert!(r.contains("X-Content-Type-Options: nosniff\r\n"), "{r}");
        assert!(r.contains(&format!("Server: {SERVER}\r\n")), "{r}");
        assert!(r.ends_with("\r\n\r\n{\"healthy\":false}"), "{r}");
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn the_handler_sees_who_sent_the_request() {
        let handler: Handler = Arc::new(|req: &Request| {
            let peer = req.peer.map(|p| p.ip().to_string()).unwrap_or_default();
            Some(Response::text(200, peer, "text/plain"))
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::slow(handler)).unwrap();
        assert!(get(addr, "/").ends_with("\r\n\r\n127.0.0.1"));
        assert_eq!(Request::get("/x").peer, None, "made in-process");
    }

    #[test]
    fn a_dropped_stopper_closes_the_port() {
        let handler: Handler = Arc::new(|req: &Request| {
            let mut r = Response::json(
                200,
                format!("{{\"body\":{:?}}}", String::from_utf8_lossy(&req.body)),
            );
            r.headers.push(("X-Test", "1".into()));
            Some(r)
        });
        let (addr, stopper) =
            serve_until_dropped("127.0.0.1:0".parse().unwrap(), Routes::fast(handler)).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /any HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n42"
        )
        .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("\r\nX-Test: 1\r\n"), "{r}");
        assert!(
            r.ends_with("{\"body\":\"42\"}"),
            "the body reaches the handler: {r}"
        );
        drop(stopper);
        std::thread::sleep(Duration::from_millis(300));
        assert!(TcpStream::connect(addr).is_err(), "still listening");
    }

    /// A client that sends one byte of its request now and then.
    fn trickle(addr: SocketAddr) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"G").unwrap();
        s
    }

    #[test]
    fn slow_clients_and_a_slow_route_do_not_hold_a_fast_route_back() {
        let fast: Handler = Arc::new(|r: &Request| {
            (r.path == "/livez").then(|| Response::text(200, "ok".into(), "text/plain"))
        });
        let slow: Handler = Arc::new(|r: &Request| {
            (r.path == "/metrics").then(|| {
                std::thread::sleep(Duration::from_secs(2));
                Response::text(200, "big".into(), "text/plain")
            })
        });
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Routes::fast(fast).then_slow(slow),
        )
        .unwrap();
        // More trickling clients than the old server had threads, and more
        // slow requests than the slow pool takes at once.
        let idle: Vec<TcpStream> = (0..200).map(|_| trickle(addr)).collect();
        let scrapes: Vec<_> = (0..MAX_SLOW_IN_FLIGHT + 4)
            .map(|_| std::thread::spawn(move || get(addr, "/metrics")))
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let t = Instant::now();
            let r = get(addr, "/livez");
            worst = worst.max(t.elapsed());
            assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
            assert!(r.ends_with("ok"), "{r}");
        }
        assert!(worst < Duration::from_millis(500), "{worst:?}");
        for s in scrapes {
            assert!(s.join().unwrap().ends_with("big"));
        }
        drop(idle);
    }

    /// The body of a chunked answer, and whether it ended properly (the
    /// zero-length chunk).
    fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        loop {
            let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
                return (out, false);
            };
            let size = std::str::from_utf8(&rest[..eol]).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            rest = &rest[eol + 2..];
            if size == 0 {
                return (out, rest == b"\r\n");
            }
            if rest.len() < size + 2 {
                out.extend_from_slice(rest);
                return (out, false);
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
    }

    fn get_bytes(addr: SocketAddr, path: &str) -> (String, Vec<u8>) {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        // A connection cut before the head was sent has none.
        let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
            return (String::new(), out);
        };
        let head = String::from_utf8_lossy(&out[..end]).into_owned();
        (head, out.split_off(end + 4))
    }

    /// `n` lines of text, numbered.
    fn lines(n: usize) -> Stream {
        Stream::new(move |out| {
            for i in 0..n {
                writeln!(out, "line {i} of the streamed answer")?;
            }
            Ok(())
        })
    }

    #[test]
    fn a_streamed_answer_arrives_whole_and_chunked() {
        let slow: Handler =
            Arc::new(|_: &Request| Some(Response::streamed(200, "text/plain", lines(100_000))));
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::slow(slow)).unwrap();
        let (head, body) = get_bytes(addr, "/");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
        assert!(!head.contains("Content-Length"), "{head}");
        let (body, ended) = dechunk(&body);
        assert!(ended, "the answer ends with the last chunk");
        let want = Response::streamed(200, "text/plain", lines(100_000))
            .bytes()
            .into_owned();
        assert!(want.len() > 10 * CHUNK, "{}", want.len());
        assert_eq!(body, want);
    }

    #[test]
    fn a_stream_that_fails_cuts_the_connection_without_its_end() {
        let slow: Handler = Arc::new(|_: &Request| {
            Some(Response::streamed(
                200,
                "text/plain",
                Stream::new(|out| {
                    out.write_all(&vec![b'x'; 3 * CHUNK])?;
                    Err(io::Error::other("the counters cannot be read"))
                }),
            ))
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::slow(slow)).unwrap();
        let (head, body) = get_bytes(addr, "/");
        // The head may have gone out before the failure, or not.
        assert!(
            head.is_empty() || head.starts_with("HTTP/1.1 200 OK"),
            "{head}"
        );
        let (body, ended) = dechunk(&body);
        assert!(!ended, "a cut answer must not look whole");
        assert!(body.len() <= 3 * CHUNK, "{}", body.len());
    }

    #[test]
    fn a_stream_is_written_only_as_fast_as_the_client_reads() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const TOTAL: usize = 200 * 1024 * 1024;
        let written = Arc::new(AtomicUsize::new(0));
        let w = written.clone();
        let slow: Handler = Arc::new(move |_: &Request| {
            let w = w.clone();
            Some(Response::streamed(
                200,
                "application/octet-stream",
                Stream::new(move |out| {
                    let piece = vec![b'y'; 16 * 1024];
                    while w.load(Ordering::SeqCst) < TOTAL {
                        out.write_all(&piece)?;
                        w.fetch_add(piece.len(), Ordering::SeqCst);
                    }
                    Ok(())
                }),
            ))
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::slow(slow)).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        // The client reads nothing for a while: the writer must stop after
        // what the channel and the sockets' buffers hold.
        std::thread::sleep(Duration::from_secs(1));
        let ahead = written.load(Ordering::SeqCst);
        assert!(
            ahead < 32 * 1024 * 1024,
            "{ahead} bytes written ahead of the client"
        );
        let mut n = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf).unwrap() {
                0 => break,
                k => n += k,
            }
        }
        assert!(n > TOTAL, "{n} bytes read, chunk sizes included");
        assert_eq!(written.load(Ordering::SeqCst), TOTAL);
    }

    #[test]
    fn a_request_whose_headers_never_finish_is_cut_off() {
        let fast: Handler =
            Arc::new(|_: &Request| Some(Response::text(200, "ok".into(), "text/plain")));
        let addr = serve("127.0.0.1:0".parse().unwrap(), Routes::fast(fast)).unwrap();
        let mut s = trickle(addr);
        s.set_read_timeout(Some(HEADER_TIMEOUT + Duration::from_secs(5)))
            .unwrap();
        let t = Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let took = t.elapsed();
        assert!(
            took >= HEADER_TIMEOUT - Duration::from_secs(1)
                && took < HEADER_TIMEOUT + Duration::from_secs(4),
            "closed after {took:?}"
        );
    }
}
