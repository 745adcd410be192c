//! The API client: kube-rs, with two things client-go gives kube-proxy.
//! - **A client-side rate limit** (`clientConnection.qps`, `.burst`): a
//!   token bucket every request waits on. The further pages of one paged
//!   list do not wait: client-go's informers list from the API server's
//!   cache in one request, so kube-proxy's limit counts a list once.
//! - **Request metrics**: each request's method, status code (`<error>`
//!   without a response), host and time to the response's headers, handed
//!   to an observer (the daemon turns them into
//!   `rest_client_requests_total` and `rest_client_request_duration_seconds`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::{Layer, Service};

use crate::watch::SourceError;

/// One request, as the metrics count it.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The API server's `host:port`.
    pub host: String,
    /// The status code, or `<error>` when no response came.
    pub code: String,
    /// From sending to the response's headers.
    pub seconds: f64,
}

/// Receives every request's record.
pub type Observer = Arc<dyn Fn(&RequestRecord) + Send + Sync>;

/// How the client behaves.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Requests per second; negative for no limit (as client-go).
    pub qps: f64,
    /// How many requests may go at once before the rate applies.
    pub burst: u32,
    /// Where request records go.
    pub observer: Option<Observer>,
    /// The `User-Agent` of every request (`verdict/v0.1.0 (linux/amd64)
    /// <commit>`, as client-go's `kube-proxy/v1.36.0 (linux/amd64)
    /// kubernetes/<commit>`), so that the API server's audit log and its
    /// priority and fairness can tell verdict's requests apart.
    pub user_agent: Option<String>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .field("observer", &self.observer.is_some())
            .field("user_agent", &self.user_agent)
            .finish()
    }
}

/// A token bucket, as client-go's `flowcontrol` limiter: `burst` tokens,
/// refilled at `qps` a second; a request takes one, waiting for it if
/// there is none.
#[derive(Debug)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            qps,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token: how long to wait for it (`None`: go now).
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        if self.qps <= 0.0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now.max(self.at);
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.qps))
    }
}

/// A client for `config` with the rate limit and the metrics. Call it
/// inside the runtime that will drive it.
pub fn build(config: Config, opts: &ClientOptions) -> Result<Client, SourceError> {
    let host = config
        .cluster_url
        .authority()
        .map_or_else(|| "none".to_owned(), ToString::to_string);
    let builder =
        ClientBuilder::try_from(config).map_err(|e| SourceError::Client(e.to_string()))?;
    let user_agent = match &opts.user_agent {
        Some(ua) => Some(
            http::HeaderValue::from_str(ua)
                .map_err(|e| SourceError::Client(format!("the User-Agent {ua:?}: {e}")))?,
        ),
        None => None,
    };
    let layer = Observed {
        user_agent,
        host: host.into(),
        bucket: (opts.qps > 0.0).then(|| {
            Arc::new(Mutex::new(Bucket::new(
                opts.qps,
                opts.burst,
                Instant::now(),
            )))
        }),
        observer: opts.observer.clone(),
    };
    Ok(builder.with_layer(&layer).build())
}

#[derive(Clone)]
struct Observed {
    user_agent: Option<http::HeaderValue>,
    host: Arc<str>,
    bucket: Option<Arc<Mutex<Bucket>>>,
    observer: Option<Observer>,
}

impl<S> Layer<S> for Observed {
    type Service = ObservedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ObservedService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`build`] puts in front of kube-rs's stack.
pub struct ObservedService<S> {
    inner: S,
    layer: Observed,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<Body>> for ObservedService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        if let Some(ua) = &self.layer.user_agent {
            req.headers_mut()
                .insert(http::header::USER_AGENT, ua.clone());
        }
        let method = req.method().to_string();
        let next_page = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p.starts_with("continue=")));
        let wait = match &self.layer.bucket {
            Some(b) if !next_page => b.lock().ok().and_then(|mut b| b.take(Instant::now())),
            _ => None,
        };
        // Futures start when first polled: the request goes out after the wait.
        let response = self.inner.call(req);
        let host = self.layer.host.clone();
        let observer = self.layer.observer.clone();
        Box::pin(async move {
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            let start = Instant::now();
            let result = response.await;
            if let Some(observe) = observer {
                observe(&RequestRecord {
                    method,
                    host: host.to_string(),
                    code: match &result {
                        Ok(r) => r.status().as_u16().to_string(),
                        Err(_) => "<error>".to_owned(),
                    },
                    seconds: start.elapsed().as_secs_f64(),
                });
            }
            result
        })
    }
}

/// A small runtime of its own and a client for `src` on it (the client
/// spawns its connection tasks on the runtime it is built in), for a
/// thread that talks to the API server apart from the watches.
pub fn on_own_runtime(
    src: &crate::watch::ApiSource,
) -> Result<(tokio::runtime::Runtime, kube::Client), crate::watch::SourceError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::watch::SourceError::Client(e.to_string()))?;
    let config = rt.block_on(crate::watch::client_config(src))?;
    let client = {
        let _guard = rt.enter();
        build(config, &src.client)?
    };
    Ok((rt, client))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API server that answers every request at once.
    struct Answer;

    impl Service<Request<Body>> for Answer {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<()>, std::convert::Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            std::future::ready(Ok(Response::new(())))
        }
    }

    #[test]
    fn requests_wait_for_the_bucket_and_are_recorded() {
        let records = Arc::new(Mutex::new(Vec::new()));
        let seen = records.clone();
        let layer = Observed {
            user_agent: None,
            host: "10.0.0.1:6443".into(),
            bucket: Some(Arc::new(Mutex::new(Bucket::new(10.0, 2, Instant::now())))),
            observer: Some(Arc::new(move |r: &RequestRecord| {
                seen.lock().unwrap().push(r.clone())
            })),
        };
        let mut svc = layer.layer(Answer);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let request = |uri: &str| Request::get(uri).body(Body::from(Vec::new())).unwrap();
        let t = Instant::now();
        rt.block_on(async {
            for _ in 0..2 {
                svc.call(request("/api/v1/services")).await.unwrap();
            }
        });
        assert!(
            t.elapsed() < Duration::from_millis(50),
            "the burst goes at once"
        );
        rt.block_on(async {
            svc.call(request("/api/v1/services?limit=500"))
                .await
                .unwrap();
        });
        assert!(
            t.elapsed() >= Duration::from_millis(90),
            "then 10 a second: {:?}",
            t.elapsed()
        );
        // The next page of a list does not wait.
        let t = Instant::now();
        rt.block_on(async {
            for _ in 0..5 {
                svc.call(request("/api/v1/services?limit=500&continue=abc"))
                    .await
                    .unwrap();
            }
        });
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        let records = records.lock().unwrap();
        assert_eq!(records.len(), 8);
        assert_eq!(
            (
                records[0].method.as_str(),
                records[0].code.as_str(),
                records[0].host.as_str()
            ),
            ("GET", "200", "10.0.0.1:6443")
        );
    }

    #[test]
    fn the_bucket_lets_a_burst_through_then_paces() {
        let t0 = Instant::now();
        let mut b = Bucket::new(5.0, 10, t0);
        for _ in 0..10 {
            assert_eq!(b.take(t0), None);
        }
        let wait = b.take(t0).unwrap();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-9, "{wait:?}");
        let wait = b.take(t0).unwrap();
        assert!((wait.as_secs_f64() - 0.4).abs() < 1e-9, "{wait:?}");
        // After two seconds, ten more tokens (minus the two owed).
        let later = t0 + Duration::from_secs(2);
        for _ in 0..8 {
            assert_eq!(b.take(later), None);
        }
        assert!(b.take(later).is_some());
        let mut free = Bucket::new(-1.0, 0, t0);
        assert!((0..1000).all(|_| free.take(t0).is_none()));
    }
}
