//! The Runtime API proxy: the runtime talks to it instead of Lambda (the wrapper script points
//! `AWS_LAMBDA_RUNTIME_API` here), and it gates every event through the lock.
//!
//! ```text
//! runtime ── GET next ──► proxy ── GET next ──► upstream (Lambda)
//!                           │ event: key from template, acquire within min(wait, deadline - margin)
//!                           ├─ acquired ─► event to the runtime, byte for byte, every header
//!                           └─ busy ─────► POST response (skip) or error (FlightlockBusy) upstream,
//!                                          then GET next again while the runtime keeps waiting
//! runtime ── POST {id}/response|error ──► proxy ──► upstream (streamed, trailers kept)
//!                           └─ after the body has gone upstream and it answered: release, done
//! anything else ─────────────────────────► passed through unchanged (streamed)
//! ```

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flightlock::config::{
    error_body, skipped_body, Config, OnBusy, BUSY_ERROR_TYPE, DEADLINE_MARGIN, KEY_ERROR_TYPE,
    LOCK_ERROR_TYPE,
};
use flightlock::{Error as LockError, HolderInfo, Locker, ReleaseOutcome};
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tracing::{field, Instrument};

use crate::body::{boxed, full, BoxError, NotifyOnEnd, ProxyBody};
use crate::invocations::{Held, Invocations, Slot};
use crate::metrics::{Metric, Metrics};
use crate::runtime_api::{
    error_path, response_path, route, Route, DEADLINE_HEADER, ERROR_TYPE_HEADER, REQUEST_ID_HEADER,
};
use crate::runtime_process::{self, Proc};

/// Connect timeout of the DynamoDB client (a regional endpoint answers in milliseconds).
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Per-attempt timeout of the DynamoDB client: a hung attempt gives way to a retry well inside
/// a decision budget (the lock library's default is 5 s, longer than a 3 s function's budget).
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Releasing never takes less than this, even at the deadline (the row lapses anyway).
const RELEASE_MIN: Duration = Duration::from_millis(500);
/// Releasing never takes longer than this after the response went upstream.
const RELEASE_MAX: Duration = Duration::from_secs(3);

/// How long the decision for an invocation may take (acquire, and the holder read of a busy
/// key), when `left` is the time until its deadline: up to half of the deadline margin before
/// the deadline, so the answer (skip body or error) still goes upstream in time. The lock's own
/// wait ends a full margin before the deadline (see [`Config::lock_options`]), so a key that
/// stays held is reported as busy, not as a timeout. With less than a margin left, half of what
/// is left. Pure.
pub fn decision_budget(left: Duration, margin: Duration) -> Duration {
    left.saturating_sub(margin / 2).max(left / 2)
}

/// How long a release may take, when `left` is the time until the deadline (`None`: unknown).
fn release_budget(left: Option<Duration>) -> Duration {
    left.unwrap_or(RELEASE_MAX).clamp(RELEASE_MIN, RELEASE_MAX)
}

/// Time until `deadline`, zero if past.
fn until(deadline: SystemTime) -> Duration {
    deadline
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

/// The proxy's state, shared by all connections.
#[derive(Debug)]
pub struct Proxy {
    config: Arc<Config>,
    locker: Locker,
    invocations: Arc<Invocations>,
    metrics: Metrics,
    client: Client<HttpConnector, ProxyBody>,
    upstream: String,
    host: String,
    /// Where `/proc` is (a seam for tests).
    proc_root: PathBuf,
    /// The runtime process last found (see [`runtime_process`]).
    runtime: std::sync::Mutex<Option<Proc>>,
    /// Set once "the runtime is not known" has been logged.
    runtime_unknown_logged: AtomicBool,
}

impl Proxy {
    /// A proxy forwarding to `upstream` (`host:port`).
    pub fn new(
        config: Arc<Config>,
        locker: Locker,
        invocations: Arc<Invocations>,
        metrics: Metrics,
        upstream: String,
        host: String,
    ) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // Header names keep their case both ways (hyper records it in the message extensions),
        // so the runtime sees Lambda's headers exactly as Lambda wrote them.
        let client = Client::builder(TokioExecutor::new())
            .http1_preserve_header_case(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Proxy {
            config,
            locker,
            invocations,
            metrics,
            client,
            upstream,
            host,
            proc_root: PathBuf::from("/proc"),
            runtime: std::sync::Mutex::new(None),
            runtime_unknown_logged: AtomicBool::new(false),
        }
    }

    /// The runtime process (the one the wrapper exec'd, pointed at this proxy's port), if it
    /// can be known; see [`runtime_process`].
    async fn runtime_process(&self) -> Option<Proc> {
        let cached = *self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let root = self.proc_root.clone();
        let api = format!("127.0.0.1:{}", self.config.proxy_port);
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

    /// The locker.
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where `/proc` is.
    pub fn proc_root(&self) -> &std::path::Path {
        &self.proc_root
    }

    /// Serves connections from `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, _) = match listener.accept().await {
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
            tokio::spawn(async move {
                let service = service_fn(move |req| proxy.clone().handle(req));
                if let Err(e) = http1::Builder::new()
                    .preserve_header_case(true)
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
    ) -> Result<Response<ProxyBody>, Infallible> {
        let response = match route(req.method(), req.uri().path()) {
            Route::Next => self.next(req).await,
            Route::Response(id) | Route::Error(id) => self.finish(req, &id).await,
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

    /// `GET next`: fetch events upstream until one acquires its lock (or is not ours to gate).
    async fn next(&self, req: Request<Incoming>) -> Result<Response<ProxyBody>, BoxError> {
        let (mut parts, _) = req.into_parts();
        // The runtime's request body (a GET has none) is not forwarded: drop its framing so
        // upstream does not wait for bytes that never come.
        parts.headers.remove(http::header::CONTENT_LENGTH);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
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
            let request_id = resp
                .headers()
                .get(REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let (Some(id), true) = (request_id, resp.status().is_success()) else {
                // Not an event (an error from upstream): the runtime deals with it.
                return Ok(resp);
            };
            let (rparts, body) = resp.into_parts();
            let event = body.collect().await?.to_bytes();
            let slot = self.invocations.slot(&id);
            slot.mark_seen();
            let deadline = rparts
                .headers
                .get(DEADLINE_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
            let span = tracing::info_span!(
                "invocation",
                request_id = %id,
                key = field::Empty,
                ticket = field::Empty,
                waited_ms = field::Empty
            );
            slot.set_span(span.clone());
            if self
                .gate(&id, &slot, deadline, &event)
                .instrument(span)
                .await
            {
                // Note which runtime receives the event, to notice if it dies mid-invocation.
                slot.set_runtime(self.runtime_process().await);
                return Ok(Response::from_parts(rparts, full(event)));
            }
        }
    }

    /// Takes the lock for one event. True: the runtime gets the event. False: the invocation
    /// was answered here (skipped or failed) and is done.
    async fn gate(
        &self,
        id: &str,
        slot: &Arc<Slot>,
        deadline: Option<SystemTime>,
        event: &[u8],
    ) -> bool {
        let span = tracing::Span::current();
        let key = match self.config.key.render_bytes(event) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "cannot derive the lock key; failing the invocation");
                self.metrics.count(Metric::KeyErrors);
                self.answer(
                    id,
                    Some(KEY_ERROR_TYPE),
                    &error_body(KEY_ERROR_TYPE, &e.to_string()),
                )
                .await;
                slot.mark_done();
                return false;
            }
        };
        span.record("key", key.as_str());
        let holder = HolderInfo {
            function: self.config.function_name.clone(),
            request_id: Some(id.to_owned()),
            host: Some(self.host.clone()),
        };
        let opts = self
            .config
            .lock_options(deadline, SystemTime::now(), holder);
        let started = Instant::now();
        // Every decision before the deadline: whatever DynamoDB does (blackholed, refusing,
        // slow), the acquisition ends within the budget. Dropping an acquisition in flight is
        // safe: the lock library removes whatever row it may have written.
        let budget = deadline.map(|d| decision_budget(until(d), self.config.deadline_margin));
        let acquire = self.locker.acquire(&key, &opts);
        let result = match budget {
            None => Ok(acquire.await),
            Some(b) => tokio::time::timeout(b, acquire).await.map_err(|_| b),
        };
        let waited_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.record("waited_ms", waited_ms as u64);
        self.metrics.put(Metric::WaitTime, waited_ms);
        let result = match result {
            Ok(r) => r,
            Err(budget) => {
                let message = format!(
                    "no lock decision within {budget:.1?}: DynamoDB did not answer before the \
                     invocation deadline minus half of {DEADLINE_MARGIN} ({:.1?})",
                    self.config.deadline_margin
                );
                tracing::error!(%message, "could not take the lock in time; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                self.answer(
                    id,
                    Some(LOCK_ERROR_TYPE),
                    &error_body(LOCK_ERROR_TYPE, &message),
                )
                .await;
                slot.mark_done();
                return false;
            }
        };
        match result {
            Ok(guard) => {
                span.record("ticket", guard.token());
                tracing::info!("lock acquired");
                self.metrics.count(Metric::Acquired);
                let mut lost = guard.lost_signal();
                let metrics = self.metrics.clone();
                let watcher = tokio::spawn(
                    async move {
                        let reason = lost.wait().await;
                        tracing::error!(%reason, "lock lost while the handler runs: another invocation may now hold the key");
                        metrics.count(Metric::LockLost);
                    }
                    .instrument(span.clone()),
                );
                slot.hold(Held {
                    guard,
                    watcher,
                    deadline,
                });
                true
            }
            Err(e @ LockError::Busy { .. }) => {
                let held_by = match &e {
                    LockError::Busy {
                        holder: Some(h), ..
                    } => Some((**h).clone()),
                    // Lost the race to enqueue: one more read names the holder for the body,
                    // if the budget allows.
                    _ => {
                        let left =
                            budget.map_or(RELEASE_MAX, |b| b.saturating_sub(started.elapsed()));
                        match tokio::time::timeout(left, self.locker.holder(&key, opts.clock_skew))
                            .await
                        {
                            Ok(Ok(h)) => h,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "could not read the holder");
                                None
                            }
                            Err(_) => None,
                        }
                    }
                };
                let held_by = held_by.as_ref();
                match self.config.on_busy {
                    OnBusy::Skip => {
                        tracing::info!(reason = %e, "key busy: invocation skipped");
                        self.metrics.count(Metric::Skipped);
                        self.answer(id, None, &skipped_body(&key, held_by)).await;
                    }
                    OnBusy::Error => {
                        tracing::info!(reason = %e, "key busy: invocation failed with {BUSY_ERROR_TYPE}");
                        self.metrics.count(Metric::BusyErrors);
                        self.answer(
                            id,
                            Some(BUSY_ERROR_TYPE),
                            &error_body(BUSY_ERROR_TYPE, &e.to_string()),
                        )
                        .await;
                    }
                }
                slot.mark_done();
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "could not take the lock; failing the invocation");
                self.metrics.count(Metric::LockErrors);
                self.answer(
                    id,
                    Some(LOCK_ERROR_TYPE),
                    &error_body(LOCK_ERROR_TYPE, &e.to_string()),
                )
                .await;
                slot.mark_done();
                false
            }
        }
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

    /// `POST {id}/response` or `{id}/error`: forward (streamed), then release and mark done.
    async fn finish(
        &self,
        req: Request<Incoming>,
        id: &str,
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
            let _ = ended.await;
            if let Some(slot) = &slot {
                self.release(slot).await;
                slot.mark_done();
            }
            result
        }
        .instrument(span)
        .await
    }

    /// Releases the lock held by `slot`, if any.
    pub async fn release(&self, slot: &Slot) {
        if let Some(held) = slot.take_held() {
            self.release_held(held).await;
        }
    }

    async fn release_held(&self, held: Held) {
        let Held {
            guard,
            watcher,
            deadline,
        } = held;
        watcher.abort();
        let failures = guard.heartbeat_failures();
        if failures > 0 {
            self.metrics.put(Metric::HeartbeatErrors, failures as f64);
        }
        // Bounded like the acquisition: an unreachable DynamoDB must not hold the invocation
        // open past its deadline. An unfinished release leaves the row to lapse (its lease is
        // capped at the deadline + grace).
        let budget = release_budget(deadline.map(until));
        match tokio::time::timeout(budget, guard.release()).await {
            Ok(Ok(ReleaseOutcome::Released)) => tracing::info!("lock released"),
            Ok(Ok(ReleaseOutcome::Lost)) => {
                tracing::warn!("the lock had already been lost when the invocation ended")
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "release failed; the row goes stale after one lease");
                self.metrics.count(Metric::ReleaseErrors);
            }
            Err(_) => {
                tracing::error!(
                    budget_ms = budget.as_millis() as u64,
                    "release did not finish in time; the row goes stale after its (capped) lease"
                );
                self.metrics.count(Metric::ReleaseErrors);
            }
        }
    }

    /// Releases every held lock, within `budget` (shutdown).
    pub async fn release_all(&self, budget: Duration) {
        let held = self.invocations.take_all_held();
        let n = held.len();
        let releases = futures::future::join_all(held.into_iter().map(|h| self.release_held(h)));
        let all = async {
            releases.await;
            self.locker.flush().await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_end_before_the_deadline() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A 3 s function with the default 1 s margin: 2.5 s, leaving 0.5 s to answer.
        assert_eq!(decision_budget(s(3), s(1)), ms(2500));
        // The lock's own wait (deadline - margin) ends before the budget: busy stays busy.
        assert!(decision_budget(s(900), s(1)) > s(899));
        // Less than a margin left: half of it, never zero while time is left.
        assert_eq!(decision_budget(ms(600), s(1)), ms(300));
        assert_eq!(decision_budget(ms(0), s(1)), ms(0));
        for left in [ms(1), ms(700), s(2), s(60)] {
            assert!(decision_budget(left, s(1)) < left);
        }
    }

    #[test]
    fn releases_are_bounded() {
        assert_eq!(release_budget(None), RELEASE_MAX);
        assert_eq!(release_budget(Some(Duration::ZERO)), RELEASE_MIN);
        assert_eq!(
            release_budget(Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(release_budget(Some(Duration::from_secs(600))), RELEASE_MAX);
    }
}
