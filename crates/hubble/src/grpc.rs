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
use tokio::sync::{broadcast, mpsc};

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
    /// The number of the newest flow stored (0: none yet).
    fn newest(&self) -> u64;
}

/// Where the server listens, and whether in TLS, for `GetNodes`; where
/// `Notify` learns the peers (`None`: it is not served); and the poller
/// of new flows its followers share, while any follows.
struct Listening {
    address: String,
    tls: bool,
    peers: Option<Arc<dyn PeerSource>>,
    poller: Poller,
}

/// New flows, read once for every follower.
type Batch = Arc<[(u64, Flow)]>;

/// The followers' poller: its channel while it runs.
type Poller = Arc<std::sync::Mutex<Option<broadcast::Sender<Batch>>>>;

/// Batches a follower may fall behind (a slow client) before it loses
/// some: 64 polls, about 13 s.
const BATCHES: usize = 64;

/// A follower's subscription to the new flows: the server's one poller,
/// started if none runs (from the newest flow stored now). It stops at
/// the first poll with no follower left.
fn follow(poller: &Poller, source: &Arc<dyn FlowSource>) -> broadcast::Receiver<Batch> {
    let mut running = poller.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(tx) = running.as_ref() {
        return tx.subscribe();
    }
    let (tx, rx) = broadcast::channel(BATCHES);
    *running = Some(tx.clone());
    tokio::spawn(poll(source.clone(), poller.clone(), tx, source.newest()));
    rx
}

/// Reads the flows stored after `last` every [`FOLLOW_EVERY`], once for
/// all followers, while any follows.
async fn poll(
    source: Arc<dyn FlowSource>,
    poller: Poller,
    tx: broadcast::Sender<Batch>,
    mut last: u64,
) {
    let stop = || *poller.lock().unwrap_or_else(|e| e.into_inner()) = None;
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        {
            // Under the lock a follower subscribes with: none can join a
            // poller that is leaving.
            let mut running = poller.lock().unwrap_or_else(|e| e.into_inner());
            if tx.receiver_count() == 0 {
                *running = None;
                return;
            }
        }
        let s = source.clone();
        let Ok(new) = tokio::task::spawn_blocking(move || s.flows_after(last)).await else {
            stop();
            return;
        };
        if let Some((seq, _)) = new.last() {
            last = *seq;
            let _ = tx.send(Batch::from(new));
        }
    }
}

/// `next`'s output, or `None` if `gone` (the client went away) comes
/// first.
async fn unless_gone<T>(
    next: impl std::future::Future<Output = T>,
    gone: impl std::future::Future<Output = ()>,
) -> Option<T> {
    let mut next = std::pin::pin!(next);
    let mut gone = std::pin::pin!(gone);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = next.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if gone.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
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
                tokio::spawn(get_flows(source, here.poller.clone(), request, tx));
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
/// follows, the new ones as they come (from the poller every follower of
/// this server shares), until the client goes away.
async fn get_flows(
    source: Arc<dyn FlowSource>,
    poller: Poller,
    request: GetFlowsRequest,
    tx: mpsc::Sender<Result<Bytes, (Code, String)>>,
) {
    let selection = Selection::of(&request);
    // Subscribed before the stored flows are read: whatever is recorded
    // after that read is in a batch to come.
    let batches = request.follow.then(|| follow(&poller, &source));
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
    let Some(mut batches) = batches else {
        return;
    };
    loop {
        let batch = match unless_gone(batches.recv(), tx.closed()).await {
            None | Some(Err(broadcast::error::RecvError::Closed)) => return,
            Some(Err(broadcast::error::RecvError::Lagged(missed))) => {
                tracing::debug!(missed, "a slow Hubble follower missed batches of flows");
                continue;
            }
            Some(Ok(b)) => b,
        };
        // The stored read may have covered a batch's first flows.
        let seen = last;
        for (seq, f) in batch.iter().filter(|(seq, _)| *seq > seen) {
            last = *seq;
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
        // The client gone, or the source's subscription ended.
        if unless_gone(peers.changed(), tx.closed())
            .await
            .is_none_or(|r| r.is_err())
        {
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
        poller: Poller::default(),
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

    /// Flows pushed by the test; every read counted.
    #[derive(Default)]
    struct Fake {
        flows: std::sync::Mutex<Vec<(u64, Flow)>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl FlowSource for Fake {
        fn flows_after(&self, after: u64) -> Vec<(u64, Flow)> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let f = self.flows.lock().unwrap();
            f.iter().filter(|(s, _)| *s > after).cloned().collect()
        }
        fn status(&self) -> ServerStatus {
            ServerStatus::default()
        }
        fn node_name(&self) -> String {
            "node-a".into()
        }
        fn newest(&self) -> u64 {
            self.flows.lock().unwrap().last().map_or(0, |(s, _)| *s)
        }
    }

    fn flow(port: u16) -> Flow {
        Flow {
            time: proto::Timestamp::default(),
            verdict: proto::Verdict::Forwarded,
            drop_reason: None,
            source_ip: "10.0.0.2".parse().unwrap(),
            destination_ip: "10.180.0.1".parse().unwrap(),
            l4: proto::L4::Tcp,
            source_port: port,
            destination_port: 80,
            source: proto::Endpoint::default(),
            destination: proto::Endpoint::default(),
            node_name: "node-a".into(),
            destination_service: None,
            summary: String::new(),
        }
    }

    #[test]
    fn followers_share_one_poller_which_stops_with_the_last() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let fake = Arc::new(Fake::default());
        fake.flows.lock().unwrap().push((1, flow(1)));
        let source: Arc<dyn FlowSource> = fake.clone();
        let poller = Poller::default();
        let follow_request = GetFlowsRequest {
            follow: true,
            number: 10,
            ..GetFlowsRequest::default()
        };
        rt.block_on(async {
            let mut rxs = Vec::new();
            for _ in 0..3 {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(get_flows(
                    source.clone(),
                    poller.clone(),
                    follow_request.clone(),
                    tx,
                ));
                rxs.push(rx);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let reads = fake.reads.load(std::sync::atomic::Ordering::SeqCst);
            for seq in 2..=4 {
                fake.flows.lock().unwrap().push((seq, flow(seq as u16)));
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            // Each has the stored flow and the three new ones, once.
            for rx in &mut rxs {
                let mut got = 0;
                while rx.try_recv().is_ok() {
                    got += 1;
                }
                assert_eq!(got, 4);
            }
            // One read a poll for all three: five polls in a second, not
            // fifteen.
            let polls = fake.reads.load(std::sync::atomic::Ordering::SeqCst) - reads;
            assert!((3..=7).contains(&polls), "{polls} reads");
            // The followers go: so does the poller, at its next poll.
            drop(rxs);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(poller.lock().unwrap().is_none(), "the poller stopped");
            // A new follower starts one anew, from the newest flow.
            let (tx, mut rx) = mpsc::channel(QUEUE);
            tokio::spawn(get_flows(
                source.clone(),
                poller.clone(),
                follow_request,
                tx,
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(poller.lock().unwrap().is_some());
            fake.flows.lock().unwrap().push((5, flow(5)));
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut got = 0;
            while rx.try_recv().is_ok() {
                got += 1;
            }
            assert_eq!(got, 5, "four stored, one new");
        });
    }

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
