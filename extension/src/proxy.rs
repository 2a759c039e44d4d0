//! The Runtime API proxy: the runtime talks to it instead of Lambda (the wrapper script points
//! `AWS_LAMBDA_RUNTIME_API` here), and it gates every event through the lock.
//!
//! ```text
//! runtime ── GET next ──► proxy ── GET next ──► upstream (Lambda)
//!                           │ event: key from template, acquire within min(wait, deadline - margin)
//!                           ├─ acquired ─► event to the runtime, byte for byte, every header
//!                           │              (the client context gains the ticket: `context`)
//!                           └─ busy ─────► POST response (skip) or error (FlightlockBusy) upstream,
//!                                          then GET next again while the runtime keeps waiting
//! runtime ── POST {id}/response|error ──► proxy ──► upstream (streamed, trailers kept)
//!                           └─ after the body has gone upstream and it answered: release, done
//! runtime ── GET restore/next ──► proxy ──► upstream (SnapStart: answered after a restore)
//!                           └─ answered: renew the DynamoDB client and host id, then pass it on
//! anything else ─────────────────────────► passed through unchanged (streamed)
//! ```
//!
//! **SnapStart.** A runtime with SnapStart (Java, Python, .NET) asks `restore/next` once init is
//! done; Lambda snapshots the environment while that request waits and answers it in each
//! environment restored from the snapshot. Everything made before it is shared by every restored
//! copy, so the proxy swaps in a renewed gate ([`Gate::renewed`]) before the runtime hears of the
//! restore: a new DynamoDB client (the pooled connections belong to the snapshot's environment)
//! and a new host id. Owner ids, record versions and jitter need nothing: they are drawn from
//! the OS at each use (see `flightlock::clock`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flightlock::Locker;
use flightlock_lambda::body::{error_body, CONTEXT_ERROR_TYPE, EVENT_ERROR_TYPE};
use flightlock_lambda::config::Config;
use flightlock_lambda::gate::{Gate, Run};
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tracing::{field, Instrument};

use crate::body::{boxed, full, BodyEnd, BoxError, NotifyOnEnd, ProxyBody};
use crate::invocations::{Invocations, Slot};
use crate::metrics::{Metric, Metrics};
use crate::mode::Mode;
use crate::otel::Traces;
use crate::runtime_api::{
    error_path, response_path, route, Route, DEADLINE_HEADER, ERROR_TYPE_HEADER, REQUEST_ID_HEADER,
    TENANT_HEADER, TRACE_ID_HEADER,
};
use crate::runtime_process::{self, Proc};

mod admit;
mod context;
mod handover;
mod next;

pub use flightlock_lambda::gate::{decision_budget, SDK_ATTEMPT_TIMEOUT, SDK_CONNECT_TIMEOUT};
use handover::Conn;
pub use next::usable_request_id;
use next::Fetched;

/// Limits on what runtime connections can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more wait in the listen backlog. Default 256 (a Managed
    /// Instances environment runs many invocations at once, each on its own connection).
    pub max_connections: usize,
    /// A connection that has not sent a complete request head this long after it connected
    /// (or after its previous request) is closed. Default 60 s. An idle keep-alive connection
    /// is closed too; runtime clients open a new one.
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(60),
        }
    }
}

/// The proxy's state, shared by all connections.
#[derive(Debug)]
pub struct Proxy {
    config: Arc<Config>,
    /// The decisions (shared with the in-process layer): key, lock, skip / error, release.
    /// Replaced by a renewed one after a SnapStart restore; a decision under way keeps the gate
    /// it started with.
    gate: std::sync::RwLock<Gate>,
    /// The metrics (the gate's; kept here too so a renewed gate needs no lock to count).
    metrics: Metrics,
    invocations: Arc<Invocations>,
    client: Client<HttpConnector, ProxyBody>,
    upstream: String,
    /// The port the wrapper points the runtime at (`FLIGHTLOCK_PROXY_PORT`): how the runtime's
    /// process is told from others (its `AWS_LAMBDA_RUNTIME_API`).
    port: u16,
    /// Where `/proc` is (a seam for tests).
    proc_root: PathBuf,
    /// The runtime process last found (see [`runtime_process`]).
    runtime: std::sync::Mutex<Option<Proc>>,
    /// Set once "the runtime is not known" has been logged.
    runtime_unknown_logged: AtomicBool,
    /// Connection limits.
    limits: Limits,
    /// Set when a runtime first asks the proxy for an event.
    runtime_connected: AtomicBool,
    /// Results of fetches whose runtime disconnected, for the next `GET next` (see [`Waiting`]).
    orphans: std::sync::Mutex<VecDeque<oneshot::Receiver<Fetched>>>,
    /// Releases in flight (a runtime that died mid-invocation is released by its watch, which
    /// may still be deleting the row when SHUTDOWN comes): shutdown waits for them.
    releasing: tokio::sync::watch::Sender<usize>,
    /// The execution mode: on Managed Instances the proxy identifies the runtime process of
    /// each connection and watches the invocations it hands over (there are no INVOKE events).
    mode: Mode,
    /// The OTLP export of the wait and hold spans ([`crate::otel`]); `None` without an
    /// endpoint, and then no span is made.
    traces: Option<Arc<Traces>>,
    /// What callers of the lock API must send ([`crate::lock_api`]); `None`: it refuses all.
    api_token: Option<String>,
}

impl Proxy {
    /// A proxy forwarding to `upstream` (`host:port`), deciding invocations with `gate` (its
    /// configuration, locker and metrics are the proxy's).
    pub fn new(gate: Gate, invocations: Arc<Invocations>, upstream: String) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // Header names keep their case both ways (hyper records it in the message extensions),
        // so the runtime sees Lambda's headers exactly as Lambda wrote them.
        let client = Client::builder(TokioExecutor::new())
            .http1_preserve_header_case(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        gate.check_table_in_background();
        Proxy {
            config: gate.shared_config(),
            metrics: gate.metrics().clone(),
            gate: std::sync::RwLock::new(gate),
            invocations,
            client,
            upstream,
            port: crate::config::DEFAULT_PROXY_PORT,
            proc_root: PathBuf::from("/proc"),
            runtime: std::sync::Mutex::new(None),
            runtime_unknown_logged: AtomicBool::new(false),
            limits: Limits::default(),
            runtime_connected: AtomicBool::new(false),
            orphans: std::sync::Mutex::new(VecDeque::new()),
            releasing: tokio::sync::watch::channel(0).0,
            mode: Mode::Standard,
            traces: None,
            api_token: None,
        }
    }

    /// Serves the lock API to callers that send `token` (the function's `AWS_SESSION_TOKEN`;
    /// see [`crate::lock_api`]). Without it every call is refused.
    pub fn with_api_token(mut self, token: Option<String>) -> Proxy {
        self.api_token = token;
        self
    }

    /// What callers of the lock API must send, if it is on.
    pub fn api_token(&self) -> Option<&str> {
        self.api_token.as_deref()
    }

    /// The `FLIGHTLOCK_*` configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Who holds a lock taken for invocation `request_id`, as its row tells people.
    pub fn holder(&self, request_id: &str) -> flightlock::HolderInfo {
        self.current_gate().holder(request_id)
    }

    /// Exports the wait and hold spans of invocations in sampled traces through `traces`.
    pub fn with_traces(mut self, traces: Arc<Traces>) -> Proxy {
        self.traces = Some(traces);
        self
    }

    /// Sets the port the wrapper points the runtime at (default
    /// [`DEFAULT_PROXY_PORT`](crate::config::DEFAULT_PROXY_PORT)).
    pub fn with_port(mut self, port: u16) -> Proxy {
        self.port = port;
        self
    }

    /// Sets the execution mode (default: standard).
    pub fn with_mode(mut self, mode: Mode) -> Proxy {
        self.mode = mode;
        self
    }

    /// The runtime process (the one the wrapper exec'd, pointed at this proxy's port), if it
    /// can be known; see [`runtime_process`].
    async fn runtime_process(&self) -> Option<Proc> {
        if self.mode == Mode::ManagedInstances {
            // Several runtime processes: each connection's is found by `handed_over`.
            return None;
        }
        let cached = *self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let root = self.proc_root.clone();
        let api = format!("127.0.0.1:{}", self.port);
        let found = tokio::task::spawn_blocking(move || match cached {
            Some(p) if runtime_process::is_alive(&root, p) => Some(p),
            _ => runtime_process::find_runtime(&root, &api),
        })
        .await
        .ok()
        .flatten();
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = found;
        if found.is_none() && !self.runtime_unknown_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the runtime process is not known (not started through /opt/flightlock-wrapper): \
                 if it crashes mid-invocation its lock is released at SHUTDOWN or when the lease \
                 (capped at the deadline) lapses, not at once"
            );
        }
        found
    }

    /// The invocations in flight.
    pub fn invocations(&self) -> &Arc<Invocations> {
        &self.invocations
    }

    /// The gate in force (cheap to clone).
    fn current_gate(&self) -> Gate {
        self.gate.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The locker in force (a renewed one after a SnapStart restore).
    pub fn locker(&self) -> Locker {
        self.current_gate().locker().clone()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// After a SnapStart restore: swaps in a gate with a new DynamoDB client (so new
    /// connections) and a new host id (see the module docs). Invocations already holding a lock
    /// keep theirs; there are none at a restore, which comes before the first invocation.
    pub fn renew_after_restore(&self) {
        let host = flightlock_lambda::gate::host_id();
        let mut gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        *gate = gate.renewed(host.clone());
        tracing::info!(%host, "restored from a snapshot: new DynamoDB client and host id");
    }

    /// Replaces the connection limits (tests use small ones).
    pub fn with_limits(mut self, limits: Limits) -> Proxy {
        self.limits = limits;
        self
    }

    /// True once a runtime has asked the proxy for an event. A runtime started through the
    /// wrapper does so before its first invocation can begin (Lambda starts invoking only after
    /// the runtime's first `GET next`, which comes here first).
    pub fn runtime_connected(&self) -> bool {
        self.runtime_connected.load(Ordering::Relaxed)
    }

    /// Where `/proc` is.
    pub fn proc_root(&self) -> &std::path::Path {
        &self.proc_root
    }

    /// Serves connections from `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let slots = Arc::new(Semaphore::new(self.limits.max_connections));
        let mut at_cap_logged = false;
        loop {
            // At the cap, new connections wait in the listen backlog until one ends.
            if slots.available_permits() == 0 && !at_cap_logged {
                at_cap_logged = true;
                tracing::warn!(
                    max = self.limits.max_connections,
                    "proxy connection cap reached; new runtime connections wait for a free slot"
                );
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            let proxy = self.clone();
            let header_read_timeout = self.limits.header_read_timeout;
            let conn = stream.local_addr().ok().map(|local| Conn {
                peer,
                local,
                runtime: Arc::new(std::sync::OnceLock::new()),
            });
            tokio::spawn(async move {
                let _slot = slot;
                let service = service_fn(move |req| proxy.clone().handle(req, conn.clone()));
                if let Err(e) = http1::Builder::new()
                    .preserve_header_case(true)
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_read_timeout)
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "runtime connection ended with an error");
                }
            });
        }
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        conn: Option<Conn>,
    ) -> Result<Response<ProxyBody>, Infallible> {
        if let Some(call) = crate::lock_api::route(req.method(), req.uri().path()) {
            return Ok(match call {
                Ok(call) => crate::lock_api::serve(&self, call, req).await,
                Err(refusal) => crate::lock_api::refused(refusal),
            });
        }
        let response = match route(req.method(), req.uri().path()) {
            Route::Next => {
                let resp = self.clone().next(req).await;
                if let (Ok(r), Some(conn), Mode::ManagedInstances) = (&resp, conn, self.mode) {
                    self.handed_over(r, conn).await;
                }
                resp
            }
            Route::Response(id) => self.finish(req, &id, true).await,
            Route::Error(id) => self.finish(req, &id, false).await,
            Route::RestoreNext => self.restore_next(req).await,
            Route::Other => {
                let (parts, body) = req.into_parts();
                self.send(
                    parts.method,
                    &parts.uri,
                    parts.headers,
                    parts.extensions,
                    boxed(body),
                )
                .await
            }
        };
        Ok(response.unwrap_or_else(bad_gateway))
    }

    /// `GET restore/next`: forwarded; once upstream answers (in a restored environment), the
    /// gate is renewed before the runtime gets the answer, so its first invocation already
    /// uses the new client.
    async fn restore_next(&self, req: Request<Incoming>) -> Result<Response<ProxyBody>, BoxError> {
        let (parts, body) = req.into_parts();
        let resp = self
            .send(
                parts.method,
                &parts.uri,
                parts.headers,
                parts.extensions,
                boxed(body),
            )
            .await?;
        if resp.status().is_success() {
            self.renew_after_restore();
        }
        Ok(resp)
    }

    /// Sends a request upstream, streaming its body; the response streams back.
    async fn send(
        &self,
        method: Method,
        uri: &Uri,
        mut headers: http::HeaderMap,
        extensions: http::Extensions,
        body: ProxyBody,
    ) -> Result<Response<ProxyBody>, BoxError> {
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        let target: Uri = format!("http://{}{pq}", self.upstream).parse()?;
        headers.insert(HOST, HeaderValue::from_str(&self.upstream)?);
        let mut req = Request::builder().method(method).uri(target);
        if let Some(h) = req.headers_mut() {
            *h = headers;
        }
        if let Some(x) = req.extensions_mut() {
            *x = extensions;
        }
        let resp = self.client.request(req.body(body)?).await?;
        Ok(resp.map(boxed))
    }

    /// Answers invocation `id` upstream ourselves: a response, or an error of `error_type`.
    async fn answer(&self, id: &str, error_type: Option<&str>, body: &serde_json::Value) {
        let path = match error_type {
            None => response_path(id),
            Some(_) => error_path(id),
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(t) = error_type.and_then(|t| HeaderValue::from_str(t).ok()) {
            headers.insert(ERROR_TYPE_HEADER, t);
        }
        let uri = match path.parse::<Uri>() {
            Ok(u) => u,
            Err(e) => {
                tracing::error!(error = %e, "request id is not usable in a path");
                return;
            }
        };
        let body = full(body.to_string());
        match self
            .send(Method::POST, &uri, headers, http::Extensions::new(), body)
            .await
        {
            Ok(r) if r.status().is_success() => {
                // Drain so the connection can be reused.
                let _ = r.into_body().collect().await;
            }
            Ok(r) => {
                let status = r.status();
                let text = r.into_body().collect().await.map(|b| b.to_bytes());
                tracing::error!(%status, body = ?text, "upstream refused our answer to the invocation");
            }
            Err(e) => tracing::error!(error = %e, "could not answer the invocation upstream"),
        }
    }

    /// `POST {id}/response` (`response` true) or `{id}/error`: forward (streamed), then release
    /// and mark the slot done. The run succeeded (its tick is marked done) only if it is a
    /// response, its whole body went upstream without an error trailer, and upstream accepted
    /// it; anything else (an error, a streamed response that failed midway, a body cut short,
    /// an answer Lambda refused, e.g. too large) leaves the tick for the retries.
    async fn finish(
        &self,
        req: Request<Incoming>,
        id: &str,
        response: bool,
    ) -> Result<Response<ProxyBody>, BoxError> {
        let slot = self.invocations.get(id);
        let span = slot.as_ref().map_or_else(tracing::Span::none, |s| s.span());
        async move {
            let (parts, body) = req.into_parts();
            let (body, ended) = NotifyOnEnd::new(body);
            let result = self
                .send(
                    parts.method,
                    &parts.uri,
                    parts.headers,
                    parts.extensions,
                    boxed(body),
                )
                .await;
            // The upstream answer can come before the whole body went up (streaming): release
            // only once the body has ended (or failed, or was dropped).
            let end = ended.await.unwrap_or(BodyEnd::Broken);
            let accepted = matches!(&result, Ok(r) if r.status().is_success());
            let run = if response && accepted && end == BodyEnd::Complete {
                Run::Succeeded
            } else {
                Run::Failed
            };
            if let Some(slot) = &slot {
                self.release(slot, run).await;
                slot.mark_done();
            }
            result
        }
        .instrument(span)
        .await
    }
}

fn bad_gateway(e: BoxError) -> Response<ProxyBody> {
    tracing::error!(error = %e, "upstream Runtime API request failed");
    let body = serde_json::json!({
        "errorType": "FlightlockProxyError",
        "errorMessage": format!("flightlock proxy: upstream request failed: {e}"),
    });
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
