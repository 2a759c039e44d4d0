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
//!
//! **Layout.** [`Proxy`] and all of its methods are here: serving and forwarding, `GET next`
//! (fetch and gate), admitting an event (the decision, its answer upstream, the wait and hold
//! spans) and releasing it. Its sub-modules each own a concern and its state, reached through
//! their own methods: `fetches` (the fetch tasks of `GET next`, and what a disconnected
//! runtime left) and `context` (the caller's client context read, and the handler's written).
//! Which runtime process gets each event is [`crate::processes`]'s, and the crash watch of an
//! invocation [`Slot::watch`].

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flightlock::Locker;
use flightlock_lambda::client_context::LockContext;
use flightlock_lambda::config::Config;
use flightlock_lambda::gate::{Gate, Held, Outcome, Run};
use flightlock_lambda::responses::{error_body, CONTEXT_ERROR_TYPE, EVENT_ERROR_TYPE};
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
use tokio::sync::Semaphore;
use tracing::{field, Instrument};

use crate::body::{boxed, full, BodyEnd, BoxError, NotifyOnEnd, ProxyBody};
use crate::invocations::{Invocations, Slot, WatchEnd, MAX_INVOCATION};
use crate::lock_api::Caller;
use crate::mode::Mode;
use crate::otel::spans::{self, HoldEnd, WaitEnd};
use crate::otel::xray::TraceParent;
use crate::otel::{HoldTrace, Traces};
use crate::runtime_api::{
    error_path, response_path, route, usable_request_id, Route, DEADLINE_HEADER, ERROR_TYPE_HEADER,
    REQUEST_ID_HEADER, TENANT_HEADER, TRACE_ID_HEADER,
};
use flightlock_lambda::metrics::{Metric, Metrics};

mod context;
mod fetches;

use crate::processes::{Conn, Processes};
use fetches::{Fetched, Fetches};
pub use flightlock_lambda::gate::{decision_budget, SDK_ATTEMPT_TIMEOUT, SDK_CONNECT_TIMEOUT};

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
    /// Which runtime process gets each event (see [`processes`]), and the execution mode: on
    /// Managed Instances the proxy identifies the runtime process of each connection and
    /// watches the invocations it hands over (there are no INVOKE events).
    processes: Processes,
    /// Connection limits.
    limits: Limits,
    /// Set when a runtime first asks the proxy for an event.
    runtime_connected: AtomicBool,
    /// The fetch tasks of `GET next`, and what disconnected runtimes left (see [`fetches`]).
    fetches: Arc<Fetches>,
    /// Releases in flight (a runtime that died mid-invocation is released by its watch, which
    /// may still be deleting the row when SHUTDOWN comes): shutdown waits for them.
    releasing: tokio::sync::watch::Sender<usize>,
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
            processes: Processes::new(
                PathBuf::from("/proc"),
                crate::config::DEFAULT_PROXY_PORT,
                Mode::Standard,
            ),
            limits: Limits::default(),
            runtime_connected: AtomicBool::new(false),
            fetches: Arc::new(Fetches::default()),
            releasing: tokio::sync::watch::channel(0).0,
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
        self.processes.set_port(port);
        self
    }

    /// Sets the execution mode (default: standard).
    pub fn with_mode(mut self, mode: Mode) -> Proxy {
        self.processes.set_mode(mode);
        self
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
        self.processes.proc_root()
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
            let conn = stream.local_addr().ok().map(|local| Conn::new(peer, local));
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
                Ok(call) => {
                    let caller = self.caller(conn.as_ref(), &call).await;
                    crate::lock_api::serve(self.api_token(), &self.invocations, caller, call, req)
                        .await
                }
                Err(refusal) => crate::lock_api::refused(refusal),
            });
        }
        let response = match route(req.method(), req.uri().path()) {
            Route::Next => {
                let resp = self.clone().next(req).await;
                if let (Ok(r), Some(conn), Mode::ManagedInstances) =
                    (&resp, conn, self.processes.mode())
                {
                    self.watch_on_connection(r, conn).await;
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

/// `GET next`: fetch events upstream and gate them, in a task a disconnecting runtime cannot
/// cancel halfway (fail closed; see [`fetches`]).
impl Proxy {
    /// `GET next`: fetch events upstream until one acquires its lock (or is not ours to gate).
    async fn next(self: Arc<Self>, req: Request<Incoming>) -> Fetched {
        self.runtime_connected.store(true, Ordering::Relaxed);
        let (mut parts, _) = req.into_parts();
        // The runtime's request body (a GET has none) is not forwarded: drop its framing so
        // upstream does not wait for bytes that never come.
        parts.headers.remove(http::header::CONTENT_LENGTH);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        // Fetching and gating run in their own task (see [`fetches`]).
        let this = self.clone();
        self.fetches
            .next(move || async move { this.fetch_and_gate(parts).await })
            .await
    }

    /// Fetches events upstream until one acquires its lock (or is not an event).
    async fn fetch_and_gate(
        &self,
        parts: http::request::Parts,
    ) -> Result<Response<ProxyBody>, BoxError> {
        loop {
            let resp = self
                .send(
                    Method::GET,
                    &parts.uri,
                    parts.headers.clone(),
                    parts.extensions.clone(),
                    full(Bytes::new()),
                )
                .await?;
            if !resp.status().is_success() {
                // Not an event (an error from upstream): the runtime deals with it.
                return Ok(resp);
            }
            let request_id = resp
                .headers()
                .get(REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|id| usable_request_id(id))
                .map(str::to_owned);
            let Some(id) = request_id else {
                // Fail closed: an event that can be neither gated nor answered is never passed
                // to the runtime ungated. Lambda ends it at its deadline.
                self.metrics.count(Metric::EventErrors);
                return Err(format!(
                    "upstream answered GET next with an event without a usable {REQUEST_ID_HEADER} \
                     header; it is not handed to the runtime ungated"
                )
                .into());
            };
            let (rparts, body) = resp.into_parts();
            let slot = self.invocations.delivery(&id);
            slot.mark_seen();
            let span = tracing::info_span!(
                "invocation",
                request_id = %id,
                key = field::Empty,
                tick = field::Empty,
                ticket = field::Empty,
                waited_ms = field::Empty
            );
            slot.set_span(span.clone());
            let event = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    // Fail closed: answer it upstream as failed, never hand over a partial event.
                    let message =
                        format!("flightlock could not read the event from the Runtime API: {e}");
                    async {
                        tracing::error!(error = %e, "could not read the event; failing the invocation");
                        self.metrics.count(Metric::EventErrors);
                        self.answer(&id, Some(EVENT_ERROR_TYPE), &error_body(EVENT_ERROR_TYPE, &message))
                            .await;
                    }
                    .instrument(span)
                    .await;
                    slot.mark_done();
                    continue;
                }
            };
            // Before the lock is taken: a caller's client context that cannot be read with
            // certainty fails the invocation, so no entry it forged can reach the handler.
            let caller = match context::caller(&rparts.headers) {
                Ok(caller) => caller,
                Err(why) => {
                    let message = format!(
                        "flightlock refused the invocation's client context: {why}; it cannot \
                         remove the caller's flightlock* entries from it with certainty"
                    );
                    async {
                        tracing::warn!(reason = %why, "refused the invocation's client context; failing the invocation");
                        self.answer(&id, Some(CONTEXT_ERROR_TYPE), &error_body(CONTEXT_ERROR_TYPE, &message))
                            .await;
                    }
                    .instrument(span)
                    .await;
                    slot.mark_done();
                    continue;
                }
            };
            let deadline = rparts
                .headers
                .get(DEADLINE_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
            // Tenant isolation mode: the tenant id of this invocation, for `{tenant}` keys.
            let tenant = rparts
                .headers
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // With OTLP export on: the invocation's trace, for its spans (sampled ones only).
            let trace = self.traces.as_ref().and_then(|_| {
                rparts
                    .headers
                    .get(TRACE_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(crate::otel::xray::parse)
                    .filter(|t| t.sampled)
            });
            // The gate decides (skipped or failed invocations were answered here and are done)
            // unless FLIGHTLOCK_GATE is off; either way the caller's flightlock* entries go.
            let lock_context = if self.config.gate {
                match self
                    .admit(&id, &slot, deadline, &event, tenant.as_deref(), trace)
                    .instrument(span.clone())
                    .await
                {
                    Some(lock_context) => Some(lock_context),
                    None => continue,
                }
            } else {
                None
            };
            // Note which runtime receives the event, to notice if it dies mid-invocation.
            slot.set_runtime(self.processes.runtime().await);
            // The one change to the event: the handler's client context gets its lock.
            let mut rparts = rparts;
            span.in_scope(|| context::write(&mut rparts.headers, &caller, lock_context.as_ref()));
            slot.mark_handed_over(flightlock_lambda::records::Records::new(
                self.locker(),
                self.config.clone(),
                self.holder(&id),
                deadline,
            ));
            return Ok(Response::from_parts(rparts, full(event)));
        }
    }

    /// Who makes a lock API call on `conn`: on Managed Instances, where several invocations are
    /// in flight, the runtime process on the other end (found once per connection); elsewhere
    /// one invocation runs at a time and the call is not bound to a process.
    async fn caller(&self, conn: Option<&Conn>, call: &crate::lock_api::Call) -> Caller {
        if self.processes.mode() != Mode::ManagedInstances {
            return Caller::Unbound;
        }
        let Some(conn) = conn else {
            return Caller::Process(None);
        };
        Caller::Process(self.processes.of_connection(conn, call.request_id()).await)
    }

    /// An event is about to go to the runtime process on `conn` (Managed Instances): note which
    /// process that is, and start the invocation's crash watch, bounded by its deadline.
    async fn watch_on_connection(self: &Arc<Self>, resp: &Response<ProxyBody>, conn: Conn) {
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let Some(id) = header(REQUEST_ID_HEADER).map(str::to_owned) else {
            return;
        };
        let Some(slot) = self.invocations.get(&id) else {
            return;
        };
        let deadline = header(DEADLINE_HEADER)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        let runtime = self.processes.of_connection(&conn, &id).await;
        slot.set_runtime(runtime);
        tokio::spawn(watch_invocation(self.clone(), id, slot, deadline));
    }
}

/// Admitting one event: deciding it through the shared [`Gate`], answering upstream what it
/// decided (skipped or failed), and tracing its wait and hold.
impl Proxy {
    /// Takes the lock for one event. `Some`: the runtime gets the event, and its handler this
    /// (see [`context`]). `None`: the invocation was answered here (skipped or failed)
    /// and is done. With `trace` (a sampled trace, OTLP export on), the wait's span is queued
    /// once the decision is answered, and an acquired lock's hold is traced until its release.
    async fn admit(
        &self,
        id: &str,
        slot: &Arc<Slot>,
        deadline: Option<SystemTime>,
        event: &[u8],
        tenant: Option<&str>,
        trace: Option<TraceParent>,
    ) -> Option<LockContext> {
        // Untraced, nothing more than this check.
        let started = trace.map(|parent| (parent, SystemTime::now()));
        let outcome = self
            .current_gate()
            .decide(id, deadline, event, tenant)
            .await;
        let traced = started.map(|(parent, start)| (parent, start, SystemTime::now()));
        match outcome {
            Outcome::Acquired(held) => {
                let lock_context = held.lock_context();
                if let Some(traced) = traced {
                    self.trace_acquired(slot, &held, &lock_context, id, traced);
                }
                slot.hold(held);
                Some(lock_context)
            }
            Outcome::Skipped(body) => {
                self.answer(id, None, &body).await;
                // The span is queued after the answer, before the invocation counts as done.
                if let Some((parent, start, decided)) = traced {
                    let reason = body["flightlock"]["reason"]
                        .as_str()
                        .unwrap_or("unknown")
                        .to_owned();
                    let key = body["flightlock"]["key"].as_str().map(spans::key_hash);
                    let inv = self.traced(id, parent, key, event, tenant);
                    self.trace_wait(&inv, start, decided, &WaitEnd::Skipped { reason });
                }
                slot.mark_done();
                None
            }
            Outcome::Failed {
                error_type,
                message,
            } => {
                let body = flightlock_lambda::responses::error_body(error_type, &message);
                self.answer(id, Some(error_type), &body).await;
                if let Some((parent, start, decided)) = traced {
                    let key = self
                        .config
                        .key
                        .render_invocation(event, tenant)
                        .ok()
                        .map(|k| spans::key_hash(&k));
                    let inv = self.traced(id, parent, key, event, tenant);
                    let error_type = error_type.to_owned();
                    self.trace_wait(&inv, start, decided, &WaitEnd::Failed { error_type });
                }
                slot.mark_done();
                None
            }
        }
    }

    /// What the spans of an invocation that was not run share (its tick rendered again from
    /// the event; it was only just rendered by the gate).
    fn traced(
        &self,
        id: &str,
        parent: TraceParent,
        key_hash: Option<String>,
        event: &[u8],
        tenant: Option<&str>,
    ) -> spans::Invocation {
        spans::Invocation {
            parent,
            request_id: id.to_owned(),
            key_hash,
            tick: self.config.tick.tick(event, tenant).ok().flatten(),
        }
    }

    /// Queues the span of a wait (OTLP export on).
    fn trace_wait(
        &self,
        inv: &spans::Invocation,
        start: SystemTime,
        end: SystemTime,
        how: &WaitEnd,
    ) {
        if let Some(traces) = &self.traces {
            traces.record(spans::wait_span(inv, traces.scope(), start, end, how));
        }
    }

    /// Queues the span of a wait that took the lock (`traced`: the trace, when the decision
    /// started and when it ended), and starts tracing its hold.
    fn trace_acquired(
        &self,
        slot: &Slot,
        held: &Held,
        lock_context: &LockContext,
        id: &str,
        (parent, start, decided): (TraceParent, SystemTime, SystemTime),
    ) {
        let inv = spans::Invocation {
            parent,
            request_id: id.to_owned(),
            key_hash: Some(spans::key_hash(&lock_context.key)),
            tick: held.tick().cloned(),
        };
        let ticket = lock_context.ticket;
        self.trace_wait(&inv, start, decided, &WaitEnd::Acquired { ticket });
        slot.set_hold_trace(HoldTrace {
            inv,
            ticket,
            start: decided,
        });
    }

    /// Queues the span of a hold that ended as `how` (OTLP export on).
    fn trace_hold(&self, trace: Option<HoldTrace>, how: HoldEnd) {
        if let (Some(traces), Some(t)) = (&self.traces, trace) {
            let end = SystemTime::now();
            traces.record(spans::hold_span(
                &t.inv,
                traces.scope(),
                t.ticket,
                t.start,
                end,
                how,
            ));
        }
    }
}

/// Releasing what an invocation acquired: when it is answered, when its runtime dies, at
/// shutdown.
impl Proxy {
    /// Releases the locks of `slot` after a run that ended as `run`: the gate's lock, if any (a
    /// succeeded run marks its tick done), and every lock its handler took through the lock API
    /// (the invocation ended: none outlives it).
    pub async fn release(&self, slot: &Slot, run: Run) {
        let _in_flight = Releasing::start(&self.releasing);
        let records = async {
            match slot.records() {
                Some(records) => records.close().await,
                None => 0,
            }
        };
        let gated = self.release_gated(slot, run);
        futures::future::join(records, gated).await;
    }

    /// Releases the gate's lock held by `slot`, if any.
    async fn release_gated(&self, slot: &Slot, run: Run) {
        if let Some(held) = slot.take_held() {
            let trace = slot.take_hold_trace();
            let how = match run {
                _ if trace.is_some() && held.is_lost() => HoldEnd::Lost,
                Run::Succeeded => HoldEnd::Ran,
                Run::Failed => HoldEnd::Failed,
            };
            self.current_gate().release(held, run).await;
            self.trace_hold(trace, how);
        }
    }

    /// Waits until the invocation of `slot` is finished, at most `limit` (see
    /// [`Slot::watch`]). If the runtime that got the event dies first, with every
    /// process it started, releases the lock at once (the run failed: its tick stays for the
    /// retries) and counts the invocation as finished. False: `limit` passed first.
    pub async fn watch_until_done(&self, slot: &Slot, id: &str, limit: Duration) -> bool {
        match slot.watch(self.processes.proc_root(), limit).await {
            WatchEnd::Done => true,
            WatchEnd::TimedOut => false,
            WatchEnd::RuntimeGone { pid } => {
                tracing::warn!(
                    request_id = %id,
                    runtime_pid = pid,
                    "the runtime exited in the middle of the invocation (its whole process tree \
                     is gone); releasing its lock now"
                );
                self.release(slot, Run::Failed).await;
                slot.mark_done();
                true
            }
        }
    }

    /// Releases every held lock, within `budget` (shutdown). Their runs never answered: failed,
    /// so their ticks stay for the retries. Then sends the queued spans (OTLP export on) with
    /// what is left of `budget`.
    pub async fn release_all(&self, budget: Duration) {
        let started = Instant::now();
        let held = self.invocations.take_all_held_traced();
        let n = held.len();
        let gate = self.current_gate();
        let releases = futures::future::join_all(held.into_iter().map(|(h, trace)| {
            let how = if trace.is_some() && h.is_lost() {
                HoldEnd::Lost
            } else {
                HoldEnd::Shutdown
            };
            let gate = &gate;
            async move {
                gate.release(h, Run::Failed).await;
                self.trace_hold(trace, how);
            }
        }));
        // And every lock a handler took through the lock API: its invocation never answered.
        let slots = self.invocations.all();
        let records = futures::future::join_all(slots.iter().filter_map(|s| s.records()).map(
            |records| async move {
                let n = records.close().await;
                // Acquisitions still under way release what they get; wait for them too
                // (the whole is bounded by the shutdown budget below).
                records.drain(budget).await;
                n
            },
        ));
        let all = async {
            let (_, records) = futures::future::join(releases, records).await;
            let records: usize = records.into_iter().sum();
            if records > 0 {
                tracing::info!(
                    released = records,
                    "released the lock API's locks at shutdown"
                );
            }
            // Releases already under way elsewhere (the watch of a runtime that died just
            // before SHUTDOWN) finish too: exiting now would drop their delete.
            let _ = self.releasing.subscribe().wait_for(|n| *n == 0).await;
            gate.locker().flush().await;
        };
        if tokio::time::timeout(budget, all).await.is_err() {
            tracing::error!(
                held = n,
                budget_ms = budget.as_millis() as u64,
                "shutdown budget spent before every lock was released; they lapse within a lease"
            );
            self.metrics.count(Metric::ReleaseErrors);
        } else if n > 0 {
            tracing::info!(released = n, "released held locks at shutdown");
        }
        if let Some(traces) = &self.traces {
            traces.flush(budget.saturating_sub(started.elapsed())).await;
        }
    }
}

/// The crash watch of an event the proxy has just handed to a runtime process (Managed
/// Instances): until the invocation is finished or its deadline, release its lock at once if
/// that runtime process dies. The slot is left for the forget sweep, so a late `platform.start`
/// still finds it seen.
async fn watch_invocation(
    proxy: Arc<Proxy>,
    id: String,
    slot: Arc<Slot>,
    deadline: Option<SystemTime>,
) {
    let left = deadline.map_or(MAX_INVOCATION, |d| {
        d.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    });
    if !proxy.watch_until_done(&slot, &id, left).await {
        tracing::warn!(
            request_id = %id,
            "invocation still unfinished past its deadline; its lock is released at \
             shutdown or lapses at the deadline plus grace"
        );
    }
}

/// One release in flight, counted until it ends (or its future is dropped).
struct Releasing<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> Releasing<'a> {
    fn start(count: &'a tokio::sync::watch::Sender<usize>) -> Releasing<'a> {
        count.send_modify(|n| *n += 1);
        Releasing(count)
    }
}

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
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
