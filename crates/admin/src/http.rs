//! A small HTTP/1.1 server: one thread accepts, each request is answered
//! on a thread of its own (up to [`MAX_IN_FLIGHT`]; beyond that on the
//! accepting thread) and the connection closed. Enough for probes,
//! scrapers, the debug endpoints and the introspection API, where a slow
//! answer (a trace reading the kernel) must not hold a probe back;
//! nothing here blocks the sync loop. Every method reaches the
//! handler, as with Go's handlers; a HEAD answer has no body.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::health::Response;

/// Requests answered at once on threads of their own.
pub const MAX_IN_FLIGHT: usize = 16;

/// The largest request body read (`PUT /debug/flags/v` sends a number).
const MAX_BODY: usize = 64 * 1024;

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

    /// Whether the query has this key (`?verbose`, `?verbose=1`).
    pub fn has_query(&self, key: &str) -> bool {
        self.query
            .split('&')
            .any(|p| p.split('=').next() == Some(key))
    }
}

/// Answers a request; `None` is 404.
pub type Handler = Arc<dyn Fn(&Request) -> Option<Response> + Send + Sync>;

/// Binds `addr` and serves `handler` on a background thread. Returns the
/// bound address (useful with port 0).
pub fn serve(addr: SocketAddr, handler: Handler) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name(format!("http-{bound}"))
        .spawn(move || {
            let in_flight = Arc::new(AtomicUsize::new(0));
            for stream in listener.incoming().flatten() {
                let busy = in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT;
                let (h, n) = (handler.clone(), in_flight.clone());
                let work = move || {
                    if let Err(e) = answer(stream, &h) {
                        tracing::debug!(error = %e, "http request");
                    }
                    n.fetch_sub(1, Ordering::AcqRel);
                };
                if busy {
                    work();
                } else if let Err(e) = std::thread::Builder::new()
                    .name(format!("http-{bound}-request"))
                    .spawn(work)
                {
                    // The closure (and the connection) is gone with the
                    // failed spawn: count it out.
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::debug!(error = %e, "http request thread");
                }
            }
        })?;
    Ok(bound)
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

/// Stops its server when dropped (within about 100 ms).
#[derive(Debug)]
pub struct Stopper(Arc<AtomicBool>);

impl Drop for Stopper {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Binds `addr` and serves `handler` until the returned [`Stopper`] is
/// dropped.
pub fn serve_until_dropped(
    addr: SocketAddr,
    handler: Handler,
) -> std::io::Result<(SocketAddr, Stopper)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::Builder::new()
        .name(format!("http-{bound}"))
        .spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let r = stream
                            .set_nonblocking(false)
                            .and_then(|()| answer(stream, &handler));
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "http request");
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })?;
    Ok((bound, Stopper(stop)))
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Bad Request",
    }
}

/// Reads one request: the head, then as much body as `Content-Length`
/// says (up to [`MAX_BODY`]).
fn read_request(s: &mut TcpStream) -> std::io::Result<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 * 1024 {
            break buf.len();
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break buf.len();
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let mut words = lines.next().unwrap_or_default().split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let target = words.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_BODY);
    let mut body = buf[head_end.min(buf.len())..].to_vec();
    while body.len() < length {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Request {
        method,
        path: path.to_owned(),
        query: query.to_owned(),
        headers,
        body,
    })
}

fn answer(mut s: TcpStream, handler: &Handler) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let req = read_request(&mut s)?;
    let r = handler(&req).unwrap_or_else(|| {
        Response::text(
            404,
            "404 page not found\n".into(),
            "text/plain; charset=utf-8",
        )
    });
    let extra: String = r
        .headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nX-Content-Type-Options: nosniff\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        r.code,
        reason(r.code),
        r.content_type,
        r.body.len()
    )
    .into_bytes();
    if req.method != "HEAD" {
        out.extend_from_slice(&r.body);
    }
    s.write_all(&out)
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
    }

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn answers_paths_and_closes() {
        let handler: Handler = Arc::new(|r: &Request| {
            (r.path == "/healthz").then(|| Response::json(503, "{\"healthy\":false}".into()))
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), handler).unwrap();
        let r = get(addr, "/healthz?verbose");
        assert!(r.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{r}");
        assert!(r.contains("Content-Type: application/json\r\n"));
        assert!(r.contains("X-Content-Type-Options: nosniff\r\n"));
        assert!(r.ends_with("\r\n\r\n{\"healthy\":false}"), "{r}");
        assert!(get(addr, "/nope").starts_with("HTTP/1.1 404"));
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
        let (addr, stopper) = serve_until_dropped("127.0.0.1:0".parse().unwrap(), handler).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /any HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n42"
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
}
