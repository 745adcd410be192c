//! A small HTTP/1.1 server: one thread accepts, each request is answered
//! and the connection closed. Enough for probes and scrapers; nothing here
//! blocks the sync loop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
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
                if let Err(e) = answer(stream, &handler) {
                    tracing::debug!(error = %e, "http request");
                }
            }
        })?;
    Ok(bound)
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

fn answer(mut s: TcpStream, handler: &Handler) -> std::io::Result<()> {
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
    let (code, body, content_type) = match method {
        "GET" | "HEAD" => match handler(path) {
            Some(r) => (r.code, r.body, r.content_type),
            None => (404, "404 page not found\n".to_owned(), plain),
        },
        _ => (405, String::new(), plain),
    };
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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
}
