//! The gRPC server: HTTP/2 through hyper, a message per length-prefixed
//! frame, the status in the trailers. It serves Hubble's
//! `observer.Observer` (`GetFlows`, `ServerStatus`) and the gRPC health
//! service, which `hubble status` asks first, and `peer.Peer/Notify`,
//! which Hubble Relay follows; any other method is `UNIMPLEMENTED`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Request, Response};
use tokio::sync::mpsc;

use crate::peer::{self, PeerSource};
use crate::proto::{self, Flow, GetFlowsRequest, ServerStatus};
use crate::select::Selection;

/// What the server answers from: the node's flows.
pub trait FlowSource: Send + Sync + 'static {
    /// The flows stored after number `after`, oldest first, each with its
    /// number. Asking counts as a reader's ask for flows.
    fn flows_after(&self, after: u64) -> Vec<(u64, Flow)>;
    /// What `ServerStatus` says.
    fn status(&self) -> ServerStatus;
    /// The node's name, for `GetNodes`.
    fn node_name(&self) -> String;
}

/// Where the server listens, and whether in TLS, for `GetNodes`; and
/// where `Notify` learns the peers (`None`: it is not served).
struct Listening {
    address: String,
    tls: bool,
    peers: Option<Arc<dyn PeerSource>>,
}

/// How often a follower looks for new flows.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// Messages queued for a slow client before the follower waits for it.
const QUEUE: usize = 256;
/// The largest request accepted (Hubble's requests are small).
const MAX_REQUEST: usize = 1 << 20;

/// gRPC status codes used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Code {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    Unimplemented = 12,
    Internal = 13,
}

/// A response body: messages as they come, then the status trailers.
struct Stream {
    rx: mpsc::Receiver<Result<Bytes, (Code, String)>>,
    done: bool,
}

impl Body for Stream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(message))) => Poll::Ready(Some(Ok(Frame::data(message)))),
            Poll::Ready(Some(Err((code, why)))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(status(code, &why)))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(status(Code::Ok, "")))))
            }
        }
    }
}

/// The trailers of a status.
fn status(code: Code, why: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if !why.is_empty() {
        // grpc-message is percent-encoded; an ASCII message needs only
        // its `%` and control characters escaped.
        let escaped: String = why
            .chars()
            .map(|c| match c {
                ' '..='~' if c != '%' => c.to_string(),
                c => {
                    let mut b = [0u8; 4];
                    c.encode_utf8(&mut b)
                        .bytes()
                        .map(|x| format!("%{x:02X}"))
                        .collect()
                }
            })
            .collect();
        if let Ok(v) = HeaderValue::from_str(&escaped) {
            h.insert("grpc-message", v);
        }
    }
    h
}

/// A message in its frame: not compressed, its length, itself.
fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

/// The message of a request body (one frame), or why not.
fn unframe(body: &[u8]) -> Result<&[u8], String> {
    match body {
        [] => Ok(&[]),
        [0, a, b, c, d, rest @ ..] => {
            let n = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
            rest.get(..n)
                .ok_or_else(|| "the request message is cut short".to_owned())
        }
        [1, ..] => Err("compressed requests are not supported".to_owned()),
        _ => Err("the request is not a gRPC message".to_owned()),
    }
}

/// Answers one request.
async fn answer(
    source: Arc<dyn FlowSource>,
    here: Arc<Listening>,
    req: Request<Incoming>,
) -> Result<Response<Stream>, Infallible> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let path = req.uri().path().to_owned();
    let body = match read_body(req.into_body()).await {
        Ok(b) => b,
        Err(why) => {
            let _ = tx.send(Err((Code::InvalidArgument, why))).await;
            return Ok(respond(rx));
        }
    };
    match path.as_str() {
        "/grpc.health.v1.Health/Check" => {
            let answer = match proto::health_service(&body) {
                Ok(s) if s.is_empty() || s == "hubble.server.Observer" => {
                    Ok(frame(&proto::health_serving()))
                }
                Ok(s) => Err((Code::NotFound, format!("unknown service {s}"))),
                Err(e) => Err((Code::InvalidArgument, e.to_string())),
            };
            let _ = tx.send(answer).await;
        }
        "/observer.Observer/ServerStatus" => {
            let _ = tx.send(Ok(frame(&source.status().encode()))).await;
        }
        "/observer.Observer/GetNodes" => {
            let nodes = proto::nodes_response(
                &source.node_name(),
                &here.address,
                here.tls,
                &source.status(),
            );
            let _ = tx.send(Ok(frame(&nodes))).await;
        }
        "/observer.Observer/GetNamespaces" => {
            let s = source.clone();
            let answer = match tokio::task::spawn_blocking(move || s.flows_after(0)).await {
                Ok(flows) => Ok(frame(&namespaces(&flows))),
                Err(e) => Err((Code::Internal, e.to_string())),
            };
            let _ = tx.send(answer).await;
        }
        "/peer.Peer/Notify" => match &here.peers {
            Some(peers) => {
                tokio::spawn(notify(peers.subscribe(), tx));
            }
            None => {
                let _ = tx
                    .send(Err((
                        Code::Unimplemented,
                        "verdict knows no peers without an API server".to_owned(),
                    )))
                    .await;
            }
        },
        "/observer.Observer/GetFlows" => match GetFlowsRequest::decode(&body) {
            Ok(request) => {
                tokio::spawn(get_flows(source, request, tx));
            }
            Err(e) => {
                let _ = tx.send(Err((Code::InvalidArgument, e.to_string()))).await;
            }
        },
        other => {
            let _ = tx
                .send(Err((
                    Code::Unimplemented,
                    format!("{other} is not served by verdict"),
                )))
                .await;
        }
    }
    Ok(respond(rx))
}

/// `GetNamespaces`: the namespaces of the Services and pods in the stored
/// flows, in name order.
fn namespaces(flows: &[(u64, Flow)]) -> Vec<u8> {
    let names: std::collections::BTreeSet<&str> = flows
        .iter()
        .flat_map(|(_, f)| {
            [
                f.destination_service.as_ref().map(|(ns, _)| ns.as_str()),
                Some(f.source.namespace.as_str()),
                Some(f.destination.namespace.as_str()),
            ]
        })
        .flatten()
        .filter(|ns| !ns.is_empty())
        .collect();
    proto::namespaces_response(names)
}

async fn read_body(body: Incoming) -> Result<Vec<u8>, String> {
    let limited = http_body_util::Limited::new(body, MAX_REQUEST);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| format!("reading the request: {e}"))?
        .to_bytes();
    unframe(&bytes).map(<[u8]>::to_vec)
}

fn respond(rx: mpsc::Receiver<Result<Bytes, (Code, String)>>) -> Response<Stream> {
    let mut r = Response::new(Stream { rx, done: false });
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    r.headers_mut().insert(
        "hubble-server-version",
        HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
    );
    r
}

/// `GetFlows`: the stored flows the request selects, then, when it
/// follows, the new ones as they come, until the client goes away.
async fn get_flows(
    source: Arc<dyn FlowSource>,
    request: GetFlowsRequest,
    tx: mpsc::Sender<Result<Bytes, (Code, String)>>,
) {
    let selection = Selection::of(&request);
    let stored = {
        let s = source.clone();
        match tokio::task::spawn_blocking(move || s.flows_after(0)).await {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.send(Err((Code::Internal, e.to_string()))).await;
                return;
            }
        }
    };
    let mut last = stored.last().map_or(0, |(seq, _)| *seq);
    for f in selection.stored(stored.iter().map(|(_, f)| f)) {
        if tx
            .send(Ok(frame(&proto::flows_response(f, &request.field_mask))))
            .await
            .is_err()
        {
            return;
        }
    }
    if !request.follow {
        return;
    }
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        if tx.is_closed() {
            return;
        }
        let s = source.clone();
        let Ok(new) = tokio::task::spawn_blocking(move || s.flows_after(last)).await else {
            return;
        };
        if let Some((seq, _)) = new.last() {
            last = *seq;
        }
        for (_, f) in &new {
            if selection.admits(f)
                && tx
                    .send(Ok(frame(&proto::flows_response(f, &request.field_mask))))
                    .await
                    .is_err()
            {
                return;
            }
        }
    }
}

/// `peer.Peer/Notify`: every peer known, then the changes, for as long as
/// the client stays; the subscription (and what it costs the source) ends
/// with the stream.
async fn notify(
    mut peers: tokio::sync::watch::Receiver<peer::Peers>,
    tx: mpsc::Sender<Result<Bytes, (Code, String)>>,
) {
    let mut sent = std::collections::BTreeMap::new();
    loop {
        let now = peers.borrow_and_update().clone();
        if let Some(now) = now {
            for (change, p) in peer::changes(&sent, &now) {
                if tx
                    .send(Ok(frame(&peer::notification(&p, change))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            sent = (*now).clone();
        }
        if !peer::changed_or(&mut peers, tx.closed()).await {
            return;
        }
    }
}

/// Serves `source` on `addr` (HTTP/2, in TLS with `tls`, else plaintext)
/// on a runtime of its own thread, until the process ends, with `Notify`
/// from `peers`; the address it listens on.
pub fn serve(
    addr: SocketAddr,
    source: Arc<dyn FlowSource>,
    peers: Option<Arc<dyn PeerSource>>,
    tls: Option<crate::tls::Reloading>,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("hubble")
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("hubble".into())
        .spawn(move || runtime.block_on(accept(listener, source, peers, tls)))?;
    Ok(bound)
}

async fn accept(
    listener: std::net::TcpListener,
    source: Arc<dyn FlowSource>,
    peers: Option<Arc<dyn PeerSource>>,
    tls: Option<crate::tls::Reloading>,
) {
    let here = Arc::new(Listening {
        address: listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        tls: tls.is_some(),
        peers,
    });
    let tls = tls.map(Arc::new);
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "the Hubble API cannot listen");
            return;
        }
    };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "the Hubble API could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let source = source.clone();
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.current()));
        let here = here.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| answer(source.clone(), here.clone(), req));
            let http2 =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
            let served = match acceptor {
                None => {
                    http2
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await
                }
                Some(a) => match a.accept(stream).await {
                    Ok(tls) => {
                        http2
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "a Hubble client failed the TLS handshake");
                        return;
                    }
                },
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "a Hubble client's connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_framed_and_unframed() {
        let f = frame(b"abc");
        assert_eq!(&f[..], [0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(&f).unwrap(), b"abc");
        assert_eq!(unframe(&[]).unwrap(), b"");
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
    }

    #[test]
    fn a_status_message_is_percent_encoded() {
        let h = status(Code::Unimplemented, "100% not here: é");
        assert_eq!(h["grpc-status"], "12");
        assert_eq!(h["grpc-message"], "100%25 not here: %C3%A9");
        assert!(status(Code::Ok, "").get("grpc-message").is_none());
    }
}
