//! A small HTTP/1.1 server: one thread accepts, each request is answered
//! and the connection closed. Enough for probes and scrapers; nothing here
//! blocks the sync loop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::health::Response;

/// Answers a request path; `None` is 404.
pub type Handler = Arc<dyn Fn(&str) -> Option<Response> + Send + Sync>;

/// Binds `addr` and serves `handler` on a background thread. Returns the
/// bound address (useful with port 0).
pub fn serve(addr: SocketAddr, handler: Handler) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name(format!("http-{bound}"))
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream, &handler, false) {
                    tracing::debug!(error = %e, "http request");
                }
            }
        })?;
    Ok(bound)
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
/// dropped. With `any_method`, every method is answered like GET (as
/// kube-proxy's service health checks are).
pub fn serve_until_dropped(
    addr: SocketAddr,
    handler: Handler,
    any_method: bool,
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
                            .and_then(|()| answer(stream, &handler, any_method));
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
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Bad Request",
    }
}

fn answer(mut s: TcpStream, handler: &Handler, any_method: bool) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split('?').next().unwrap_or_default();
    let plain = "text/plain; charset=utf-8";
    let (code, body, content_type, headers) = match method {
        _ if any_method || matches!(method, "GET" | "HEAD") => match handler(path) {
            Some(r) => (r.code, r.body, r.content_type, r.headers),
            None => (404, "404 page not found\n".to_owned(), plain, Vec::new()),
        },
        _ => (405, String::new(), plain, Vec::new()),
    };
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nX-Content-Type-Options: nosniff\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        reason(code),
        body.len()
    );
    if method != "HEAD" {
        out.push_str(&body);
    }
    s.write_all(out.as_bytes())
}

#[cfg(test)]
mod tests {
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
        let handler: Handler = Arc::new(|p: &str| {
            (p == "/healthz").then(|| Response::json(503, "{\"healthy\":false}".into()))
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
        let handler: Handler = Arc::new(|_: &str| {
            let mut r = Response::json(200, "{}".into());
            r.headers.push(("X-Test", "1".into()));
            Some(r)
        });
        let (addr, stopper) =
            serve_until_dropped("127.0.0.1:0".parse().unwrap(), handler, true).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "POST /any HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("\r\nX-Test: 1\r\n"), "{r}");
        drop(stopper);
        std::thread::sleep(Duration::from_millis(300));
        assert!(TcpStream::connect(addr).is_err(), "still listening");
    }
}
