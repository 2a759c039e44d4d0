//! [`FaultProxy`]: a fault-injecting, request-counting HTTP/1.1 reverse proxy
//! for DynamoDB.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::responses;
use crate::rule::{Fault, Rule, RuleSet};

/// Key under which [`FaultProxy::counts`] records requests that carry no
/// `X-Amz-Target` header.
pub const NO_OPERATION: &str = "(none)";

type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// A reverse proxy on `127.0.0.1` in front of a DynamoDB endpoint that counts
/// requests per operation and injects [`Fault`]s chosen by [`Rule`]s.
///
/// Requests are forwarded unchanged (method, path and query, every header
/// including `Host` and the SigV4 `Authorization`, and the body), so a client
/// that signed its requests for the proxy's endpoint is accepted upstream.
/// Responses are returned with their status, headers and body. Request and
/// response bodies are buffered in full, which is fine for DynamoDB's small
/// JSON messages.
///
/// Dropping the proxy stops the server task and closes every client
/// connection.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use flightlock_testkit::{Fault, FaultProxy, Rule};
/// let proxy = FaultProxy::start("http://127.0.0.1:8000").await?;
/// proxy.add_rule(Rule::new(Fault::DropResponse).on("TransactWriteItems").times(1));
/// let client = flightlock_testkit::client(&proxy.endpoint()).await;
/// // ... use `client`, then inspect proxy.counts() and proxy.faults_applied()
/// # drop(client);
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream_base)
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every
        // connection task (and any request it is holding or forwarding).
        self.task.abort();
    }
}

#[derive(Default)]
struct Counts {
    per_operation: BTreeMap<String, u64>,
    total: u64,
}

struct Shared {
    client: UpstreamClient,
    /// `scheme://authority[/prefix]` without a trailing slash.
    upstream_base: String,
    rules: Mutex<RuleSet>,
    counts: Mutex<Counts>,
    faults: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FaultProxy {
    /// Starts a proxy on an ephemeral port of `127.0.0.1` forwarding to
    /// `upstream`, an `http://host:port` URL such as `http://127.0.0.1:8000`
    /// (an optional path is prepended to every request path).
    ///
    /// Fails if `upstream` is not an `http` URL with a host, or if the
    /// listening socket cannot be bound. Must be called within a Tokio
    /// runtime.
    pub async fn start(upstream: &str) -> io::Result<FaultProxy> {
        let upstream_base = parse_upstream(upstream)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;

        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);

        let shared = Arc::new(Shared {
            client,
            upstream_base,
            rules: Mutex::new(RuleSet::default()),
            counts: Mutex::new(Counts::default()),
            faults: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(FaultProxy { addr, shared, task })
    }

    /// The proxy's endpoint URL, `http://127.0.0.1:PORT`, to configure as the
    /// DynamoDB client's endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends a rule; rules are tried in insertion order.
    pub fn add_rule(&self, rule: Rule) {
        lock(&self.shared.rules).push(rule);
    }

    /// Removes every rule; subsequent requests pass through untouched.
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Requests received per DynamoDB operation (the part of the
    /// `X-Amz-Target` header after the last `.`, e.g. `"TransactWriteItems"`;
    /// requests without that header are counted under [`NO_OPERATION`]).
    /// Includes requests answered by a rule, and counts a
    /// [`Fault::Duplicate`] request once.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.counts).per_operation.clone()
    }

    /// Requests received for one operation (0 if none).
    pub fn count(&self, operation: &str) -> u64 {
        lock(&self.shared.counts)
            .per_operation
            .get(operation)
            .copied()
            .unwrap_or(0)
    }

    /// Total requests received, all operations together.
    pub fn total(&self) -> u64 {
        lock(&self.shared.counts).total
    }

    /// Resets [`counts`](Self::counts), [`total`](Self::total) and
    /// [`faults_applied`](Self::faults_applied) to zero. Rules keep their
    /// progress.
    pub fn reset_counts(&self) {
        let mut counts = lock(&self.shared.counts);
        *counts = Counts::default();
        self.shared.faults.store(0, Ordering::SeqCst);
    }

    /// How many times a rule fired (a fault was applied to a request).
    pub fn faults_applied(&self) -> u64 {
        self.shared.faults.load(Ordering::SeqCst)
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn parse_upstream(upstream: &str) -> io::Result<String> {
    let uri: Uri = upstream
        .parse()
        .map_err(|e| invalid(format!("invalid upstream URL {upstream:?}: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(invalid(format!(
            "upstream URL {upstream:?} must use the http scheme"
        )));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| invalid(format!("upstream URL {upstream:?} has no host")))?;
    let prefix = uri.path().trim_end_matches('/');
    Ok(format!("http://{authority}{prefix}"))
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((stream, _)) => {
                connections.spawn(serve_connection(stream, Arc::clone(&shared)));
            }
            Err(e) => {
                // E.g. too many open files: back off instead of spinning.
                tracing::warn!(error = %e, "fault proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    // Best effort: latency matters to benchmarks, correctness does not depend on it.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(Arc::clone(&shared), req));
    let result = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "fault proxy: connection ended with error");
    }
}

fn operation(headers: &HeaderMap) -> Option<String> {
    let target = headers.get("x-amz-target")?.to_str().ok()?;
    Some(target.rsplit('.').next().unwrap_or(target).to_owned())
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| io::Error::other(format!("reading request body: {e}")))?
        .to_bytes();
    let op = operation(&parts.headers);
    {
        let mut counts = lock(&shared.counts);
        counts.total += 1;
        let key = op.as_deref().unwrap_or(NO_OPERATION);
        *counts.per_operation.entry(key.to_owned()).or_insert(0) += 1;
    }
    let fault = lock(&shared.rules).select(op.as_deref(), &body);
    let Some(fault) = fault else {
        return Ok(forward(&shared, &parts, &body).await);
    };
    shared.faults.fetch_add(1, Ordering::SeqCst);
    tracing::debug!(
        operation = op.as_deref(),
        ?fault,
        "fault proxy: injecting fault"
    );
    match fault {
        Fault::DelayRequest(delay) => {
            // The delayed request travels on its own: if the client gives up on it (an attempt
            // timeout), it still arrives, as on a real network — the late heartbeat, the
            // enqueue still in flight.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let late = shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(forward(&late, &parts, &body).await);
            });
            Ok(rx
                .await
                .unwrap_or_else(|_| responses::bad_gateway("delayed request lost")))
        }
        Fault::DelayResponse(delay) => {
            let response = forward(&shared, &parts, &body).await;
            tokio::time::sleep(delay).await;
            Ok(response)
        }
        Fault::DropResponse => {
            let _ = forward(&shared, &parts, &body).await;
            // A service error makes hyper close the connection without
            // writing any response.
            Err(io::Error::other("fault injected: dropping the response"))
        }
        Fault::Duplicate => {
            let first = forward(&shared, &parts, &body).await;
            let _second = forward(&shared, &parts, &body).await;
            Ok(first)
        }
        Fault::Throttle => Ok(responses::throttle()),
        Fault::ServerError => Ok(responses::server_error()),
    }
}

/// Sends one copy of the request upstream and buffers the response. Upstream
/// failures become a `502 Bad Gateway` (which the SDK treats as transient).
async fn forward(shared: &Shared, parts: &Parts, body: &Bytes) -> Response<Full<Bytes>> {
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let uri: Uri = match format!("{}{}", shared.upstream_base, path).parse() {
        Ok(uri) => uri,
        Err(e) => return responses::bad_gateway(&format!("cannot build upstream URI: {e}")),
    };
    let mut request = Request::new(Full::new(body.clone()));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = uri;
    *request.version_mut() = parts.version;
    // Host included: the legacy client only sets Host when it is missing.
    *request.headers_mut() = parts.headers.clone();

    let response = match shared.client.request(request).await {
        Ok(response) => response,
        Err(e) => return responses::bad_gateway(&format!("upstream request failed: {e:?}")),
    };
    let (parts, body) = response.into_parts();
    match body.collect().await {
        Ok(collected) => Response::from_parts(parts, Full::new(collected.to_bytes())),
        Err(e) => responses::bad_gateway(&format!("reading upstream response body: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn parses_upstream() {
        assert_eq!(
            parse_upstream("http://127.0.0.1:8000").unwrap(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            parse_upstream("http://localhost:8000/").unwrap(),
            "http://localhost:8000"
        );
        assert_eq!(
            parse_upstream("http://h:1/base/").unwrap(),
            "http://h:1/base"
        );
        assert!(parse_upstream("https://h:1").is_err());
        assert!(parse_upstream("127.0.0.1:8000").is_err());
        assert!(parse_upstream("not a url").is_err());
    }

    #[test]
    fn operation_from_target() {
        let mut h = HeaderMap::new();
        assert_eq!(operation(&h), None);
        h.insert(
            "X-Amz-Target",
            HeaderValue::from_static("DynamoDB_20120810.TransactWriteItems"),
        );
        assert_eq!(operation(&h).as_deref(), Some("TransactWriteItems"));
        h.insert("x-amz-target", HeaderValue::from_static("Bare"));
        assert_eq!(operation(&h).as_deref(), Some("Bare"));
    }
}
