//! The lock API: the handler locks what it needs (one lock per record of a batch, say) through
//! the extension, and every lock it took is released when its invocation ends.
//!
//! Served by the proxy's listener, beside the Runtime API it proxies, so a handler finds it at
//! `http://$AWS_LAMBDA_RUNTIME_API/flightlock/v1/...` (the wrapper points that variable here).
//!
//! ```text
//! POST /flightlock/v1/invocations/{requestId}/acquire  {"key":"order-7","waitMs":0}
//!      200 {"key","token","waitedMs","permits"} | 409 busy {"holders":[...]} | 4xx/5xx {"error","message"}
//! POST /flightlock/v1/invocations/{requestId}/release  {"key":"order-7"}
//!      200 {"key","released":true} | 404 notHeld | 409 lost
//! GET  /flightlock/v1/invocations/{requestId}/locks
//!      200 {"locks":[{"key","token","permits","lost"}]}
//! every call: X-Flightlock-Token: $AWS_SESSION_TOKEN
//! ```
//!
//! **Who may call.** Every call carries [`TOKEN_HEADER`] with the function's
//! `AWS_SESSION_TOKEN`, which only processes of the execution environment have (AWS's
//! Parameters and Secrets extension asks the same of its callers): a server-side request
//! forgery in the handler, which makes it fetch a URL but sets no header of the attacker's
//! choosing, cannot take or free a lock. Every call names an invocation in flight in this
//! environment, by the request id the runtime handed the handler: a call for one that has
//! ended, or that this environment never ran, is refused. Several invocations in flight at once
//! (Lambda Managed Instances) each have their own set.
//!
//! **Every lock ends with its invocation.** When the invocation ends (its response or error has
//! gone upstream, its runtime's processes are all gone, or the environment shuts down), the
//! set is closed and whatever is still held is released before the runtime hears back from its
//! response; an acquisition still under way when the set closes releases what it gets at once.
//! Each lock's lease is capped at the invocation's deadline plus
//! [`flightlock_lambda::config::LEASE_CAP_GRACE`], so even a frozen or killed environment frees
//! it soon after. Each acquisition is decided within the invocation's deadline, as the gate's
//! (see [`flightlock_lambda::gate::decision_budget`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use flightlock::options::Wait;
use flightlock::{Error, LockGuard, ReleaseOutcome};
use flightlock_lambda::body::redact_aws_ids;
use flightlock_lambda::gate::{decision_budget, release_budget};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::body::{full, ProxyBody};
use crate::config::SESSION_TOKEN;
use crate::invocations::Slot;
use crate::proxy::Proxy;

/// Every path of the API starts with this.
pub const PATH_PREFIX: &str = "/flightlock/v1/";
/// The header every call carries, with the function's `AWS_SESSION_TOKEN`.
pub const TOKEN_HEADER: &str = "x-flightlock-token";
/// Locks one invocation may hold (or be acquiring) at once. A batch of 10 SQS records needs
/// 10; a handler that locks each record of a larger batch one after another needs one.
pub const MAX_HELD: usize = 100;
/// The largest request body read, in bytes (a key is at most 1024 bytes).
pub const MAX_BODY: usize = 4096;
/// The longest `waitMs` accepted: Lambda's longest invocation (15 minutes). Any wait is cut at
/// the invocation's deadline minus `FLIGHTLOCK_DEADLINE_MARGIN` anyway.
pub const MAX_WAIT_MS: u64 = 15 * 60 * 1000;

/// One call of the API, with the request id it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `POST .../invocations/{id}/acquire`.
    Acquire(String),
    /// `POST .../invocations/{id}/release`.
    Release(String),
    /// `GET .../invocations/{id}/locks`.
    List(String),
}

/// A refused call: its status, a one-word reason (the body's `error`) and a one-line message.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// The body's `error`: one word a client can branch on.
    pub error: &'static str,
    /// The body's `message`: what happened and what to do.
    pub message: String,
    /// More members of the body (`holders` of a busy key).
    pub extra: Option<(&'static str, Value)>,
}

fn refuse(status: StatusCode, error: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        error,
        message: message.into(),
        extra: None,
    }
}

/// Classifies a request of `method` to `path`: `None` if it is not for the API (the proxy
/// passes it on), else the call or why it is refused. Pure.
pub fn route(method: &Method, path: &str) -> Option<Result<Call, Refusal>> {
    let rest = path.strip_prefix(PATH_PREFIX)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let call = match parts.as_slice() {
        ["invocations", id, op] if !id.is_empty() => match (*op, method) {
            ("acquire", &Method::POST) => Call::Acquire((*id).to_owned()),
            ("release", &Method::POST) => Call::Release((*id).to_owned()),
            ("locks", &Method::GET) => Call::List((*id).to_owned()),
            ("acquire" | "release" | "locks", _) => {
                return Some(Err(refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "methodNotAllowed",
                    format!(
                        "{method} is not allowed here: acquire and release are POST, locks is GET"
                    ),
                )))
            }
            _ => return Some(Err(not_found(path))),
        },
        _ => return Some(Err(not_found(path))),
    };
    Some(Ok(call))
}

fn not_found(path: &str) -> Refusal {
    refuse(
        StatusCode::NOT_FOUND,
        "notFound",
        format!(
            "no such call: {path}; the calls are POST {PATH_PREFIX}invocations/{{requestId}}/acquire, \
             .../release and GET .../locks"
        ),
    )
}

/// Checks a call's [`TOKEN_HEADER`] against the extension's `AWS_SESSION_TOKEN` (`expected`),
/// in time independent of where they differ. Pure.
pub fn authorize(expected: Option<&str>, sent: Option<&HeaderValue>) -> Result<(), Refusal> {
    let Some(expected) = expected else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "the lock API is off: {SESSION_TOKEN} is not set in the extension's environment \
                 (Lambda always sets it; set it when emulating Lambda locally)"
            ),
        ));
    };
    let Some(sent) = sent else {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!("send the header {TOKEN_HEADER} with the value of {SESSION_TOKEN}"),
        ));
    };
    let (a, b) = (expected.as_bytes(), sent.as_bytes());
    let differ = a.len() != b.len() || a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0;
    if differ {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("{TOKEN_HEADER} is not this environment's {SESSION_TOKEN}"),
        ));
    }
    Ok(())
}

/// The body of an acquisition.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AcquireBody {
    /// The lock key.
    pub key: String,
    /// How long to wait for it, in ms; default `FLIGHTLOCK_WAIT`. Cut at the deadline.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// How many may hold it at once; default `FLIGHTLOCK_PERMITS`. Must match the key's.
    #[serde(default)]
    pub permits: Option<u32>,
}

/// The body of a release.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseBody {
    /// The lock key.
    pub key: String,
}

/// Parses and checks an acquisition's body. Pure.
pub fn parse_acquire(bytes: &[u8]) -> Result<AcquireBody, Refusal> {
    let body: AcquireBody = parse(bytes, r#"{"key":"order-7","waitMs":0}"#)?;
    check_key(&body.key)?;
    if let Some(ms) = body.wait_ms.filter(|ms| *ms > MAX_WAIT_MS) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "badRequest",
            format!("waitMs {ms} is longer than any invocation (at most {MAX_WAIT_MS})"),
        ));
    }
    if let Some(p) = body
        .permits
        .filter(|p| !(1..=flightlock::MAX_PERMITS).contains(p))
    {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "badRequest",
            format!(
                "permits {p} is out of range (1 to {})",
                flightlock::MAX_PERMITS
            ),
        ));
    }
    Ok(body)
}

/// Parses and checks a release's body. Pure.
pub fn parse_release(bytes: &[u8]) -> Result<ReleaseBody, Refusal> {
    let body: ReleaseBody = parse(bytes, r#"{"key":"order-7"}"#)?;
    check_key(&body.key)?;
    Ok(body)
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8], example: &str) -> Result<T, Refusal> {
    serde_json::from_slice(bytes).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            "badRequest",
            format!("the body is not what this call takes ({e}); for example {example}"),
        )
    })
}

fn check_key(key: &str) -> Result<(), Refusal> {
    flightlock::schema::validate_key(key)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, "badRequest", e.to_string()))
}

/// The locks one invocation took through the API (kept in its [`Slot`]).
#[derive(Debug, Default)]
pub struct Records(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Set when the invocation ends: nothing more is taken.
    closed: bool,
    /// The locks held, with the permits each was taken with.
    held: BTreeMap<String, (LockGuard, u32)>,
    /// Keys being acquired now.
    pending: BTreeSet<String>,
}

impl Records {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves `key` for an acquisition: refused if the set is closed, the key is held or
    /// being acquired by this invocation (a lock is not reentrant: the second would wait for
    /// the first), or [`MAX_HELD`] are held or pending. The reservation ends when it is dropped.
    fn reserve<'a>(&'a self, id: &str, key: &str) -> Result<Reservation<'a>, Refusal> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(not_in_flight(id));
        }
        if let Some((held, _)) = inner.held.get(key) {
            return Err(refuse(
                StatusCode::CONFLICT,
                "alreadyHeld",
                format!(
                    "this invocation already holds {key:?} (token {}); a lock is not reentrant",
                    held.token()
                ),
            ));
        }
        if inner.pending.contains(key) {
            return Err(refuse(
                StatusCode::CONFLICT,
                "alreadyHeld",
                format!("this invocation is already acquiring {key:?}"),
            ));
        }
        if inner.held.len() + inner.pending.len() >= MAX_HELD {
            return Err(refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "tooManyLocks",
                format!(
                    "this invocation holds or is acquiring {MAX_HELD} locks, the most one may; \
                     release one first"
                ),
            ));
        }
        inner.pending.insert(key.to_owned());
        Ok(Reservation {
            records: self,
            key: key.to_owned(),
        })
    }

    /// Takes the lock of `key`, if this invocation holds it.
    fn take(&self, key: &str) -> Option<LockGuard> {
        self.lock().held.remove(key).map(|(guard, _)| guard)
    }

    /// What is held: key, token, permits, lost.
    fn list(&self) -> Vec<Value> {
        self.lock()
            .held
            .iter()
            .map(|(key, (g, permits))| {
                json!({ "key": key, "token": g.token(), "permits": permits, "lost": g.is_lost() })
            })
            .collect()
    }

    /// Closes the set (the invocation ended) and takes everything held.
    pub fn close(&self) -> Vec<LockGuard> {
        let mut inner = self.lock();
        inner.closed = true;
        std::mem::take(&mut inner.held)
            .into_values()
            .map(|(guard, _)| guard)
            .collect()
    }

    /// How many locks are held now.
    pub fn len(&self) -> usize {
        self.lock().held.len()
    }

    /// True if none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A key being acquired; dropping it (a caller that hung up mid-acquisition drops the whole
/// call) frees the key for another call.
#[derive(Debug)]
struct Reservation<'a> {
    records: &'a Records,
    key: String,
}

impl Reservation<'_> {
    /// Keeps `guard` (taken with `permits`) in the set, or gives it back (`Some`) if the set
    /// closed meanwhile.
    fn settle(self, guard: LockGuard, permits: u32) -> Option<LockGuard> {
        let mut inner = self.records.lock();
        if inner.closed {
            return Some(guard);
        }
        inner.held.insert(self.key.clone(), (guard, permits));
        None
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.records.lock().pending.remove(&self.key);
    }
}

fn not_in_flight(id: &str) -> Refusal {
    refuse(
        StatusCode::FORBIDDEN,
        "notInFlight",
        format!(
            "invocation {id:?} is not in flight in this environment (it ended, or it never ran \
             here): a lock is taken for the invocation that holds it"
        ),
    )
}

/// Answers one call.
pub async fn serve(proxy: &Proxy, call: Call, req: Request<Incoming>) -> Response<ProxyBody> {
    let answer = match authorize(proxy.api_token(), req.headers().get(TOKEN_HEADER)) {
        Err(refusal) => Err(refusal),
        Ok(()) => match call {
            Call::Acquire(id) => acquire(proxy, &id, req).await,
            Call::Release(id) => release(proxy, &id, req).await,
            Call::List(id) => in_flight(proxy, &id)
                .map(|slot| (StatusCode::OK, json!({ "locks": slot.records().list() }))),
        },
    };
    match answer {
        Ok((status, body)) => json_response(status, &body),
        Err(refusal) => refused(refusal),
    }
}

/// The answer to a refused call: its status, `{"error","message"}` and any more members.
pub fn refused(r: Refusal) -> Response<ProxyBody> {
    tracing::info!(status = r.status.as_u16(), error = r.error, message = %r.message, "lock API call refused");
    let mut body = json!({ "error": r.error, "message": r.message });
    if let Some((name, value)) = r.extra {
        body[name] = value;
    }
    json_response(r.status, &body)
}

fn json_response(status: StatusCode, body: &Value) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

type Answer = Result<(StatusCode, Value), Refusal>;

/// The slot of invocation `id`, if it is in flight here (its event was handed to the runtime
/// and it has not ended).
fn in_flight(proxy: &Proxy, id: &str) -> Result<std::sync::Arc<Slot>, Refusal> {
    match proxy.invocations().get(id) {
        Some(slot) if slot.handed_over() && !slot.is_done() => Ok(slot),
        _ => Err(not_in_flight(id)),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, Refusal> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "tooLarge",
            format!("the body is over {MAX_BODY} bytes"),
        )),
        Err(e) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "badRequest",
            format!("the body could not be read: {e}"),
        )),
    }
}

async fn acquire(proxy: &Proxy, id: &str, req: Request<Incoming>) -> Answer {
    let slot = in_flight(proxy, id)?;
    let body = parse_acquire(&read_body(req).await?)?;
    let records = slot.records();
    let reservation = records.reserve(id, &body.key)?;
    let config = proxy.config();
    let deadline = slot.deadline();
    let wait = match body.wait_ms {
        None => config.wait,
        Some(0) => Wait::NoWait,
        Some(ms) => Wait::For(Duration::from_millis(ms)),
    };
    let mut options =
        config.lock_options_waiting(wait, deadline, SystemTime::now(), proxy.holder(id));
    options.permits = body.permits.unwrap_or(config.permits);
    let locker = proxy.locker();
    let started = Instant::now();
    let left = deadline.map(|d| d.duration_since(SystemTime::now()).unwrap_or_default());
    let budget = left.map(|l| decision_budget(l, config.deadline_margin));
    let acquisition = locker.acquire(&body.key, &options);
    let result = match budget {
        None => Ok(acquisition.await),
        Some(b) => tokio::time::timeout(b, acquisition).await.map_err(|_| b),
    };
    let waited_ms = started.elapsed().as_millis() as u64;
    let key = body.key;
    match result {
        Err(budget) => Err(refuse(
            StatusCode::GATEWAY_TIMEOUT,
            "noDecision",
            format!(
                "no decision on {key:?} within {budget:.1?}: DynamoDB did not answer before the \
                 invocation's deadline"
            ),
        )),
        Ok(Ok(guard)) => {
            let token = guard.token();
            let permits = options.permits;
            if let Some(guard) = reservation.settle(guard, permits) {
                release_now(guard, deadline).await;
                return Err(not_in_flight(id));
            }
            tracing::info!(%key, token, waited_ms, "lock API: acquired");
            Ok((
                StatusCode::OK,
                json!({ "key": key, "token": token, "waitedMs": waited_ms, "permits": permits }),
            ))
        }
        Ok(Err(e)) => Err(acquire_refusal(e, &key, wait, &options.wait)),
    }
}

/// What a failed acquisition answers.
fn acquire_refusal(e: Error, key: &str, asked: Wait, waited: &Wait) -> Refusal {
    match e {
        Error::Busy { ref holders, .. } => {
            let cut = if asked != *waited {
                format!(
                    " (the wait was cut to {:?}: the invocation's deadline minus \
                     FLIGHTLOCK_DEADLINE_MARGIN came first)",
                    waited.as_duration().unwrap_or_default()
                )
            } else {
                String::new()
            };
            let holders = serde_json::to_value(holders).unwrap_or(Value::Null);
            Refusal {
                extra: Some(("holders", holders)),
                ..refuse(StatusCode::CONFLICT, "busy", format!("{e}{cut}"))
            }
        }
        Error::PermitsMismatch { .. } => refuse(
            StatusCode::CONFLICT,
            "permitsMismatch",
            redact_aws_ids(&e.to_string()),
        ),
        Error::ProtocolTooNew { .. } => refuse(
            StatusCode::CONFLICT,
            "protocolTooNew",
            redact_aws_ids(&e.to_string()),
        ),
        e => {
            tracing::error!(error = %e, %key, "lock API: could not take the lock");
            refuse(
                StatusCode::BAD_GATEWAY,
                "lockError",
                redact_aws_ids(&e.to_string()),
            )
        }
    }
}

async fn release(proxy: &Proxy, id: &str, req: Request<Incoming>) -> Answer {
    let slot = in_flight(proxy, id)?;
    let body = parse_release(&read_body(req).await?)?;
    let Some(guard) = slot.records().take(&body.key) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "notHeld",
            format!("this invocation does not hold {:?}", body.key),
        ));
    };
    let key = body.key;
    let token = guard.token();
    let budget = release_budget(
        slot.deadline()
            .map(|d| d.duration_since(SystemTime::now()).unwrap_or_default()),
    );
    match tokio::time::timeout(budget, guard.release()).await {
        Ok(Ok(ReleaseOutcome::Released)) => {
            tracing::info!(%key, token, "lock API: released");
            Ok((StatusCode::OK, json!({ "key": key, "released": true })))
        }
        Ok(Ok(ReleaseOutcome::Lost)) => Err(refuse(
            StatusCode::CONFLICT,
            "lost",
            format!(
                "the lock of {key:?} (token {token}) had been lost before this release (its \
                 lease ran out or another holder took over): the work done under it was not \
                 protected"
            ),
        )),
        Ok(Err(e)) => {
            tracing::error!(error = %e, %key, "lock API: release failed");
            Err(refuse(
                StatusCode::BAD_GATEWAY,
                "lockError",
                format!(
                    "{}; the row lapses within its lease",
                    redact_aws_ids(&e.to_string())
                ),
            ))
        }
        Err(_) => Err(refuse(
            StatusCode::GATEWAY_TIMEOUT,
            "noDecision",
            format!("the release of {key:?} did not finish in {budget:.1?}; the row lapses within its lease"),
        )),
    }
}

/// Releases `guard` within the release budget of an invocation whose deadline is `deadline`.
async fn release_now(guard: LockGuard, deadline: Option<SystemTime>) {
    let key = guard.key().to_owned();
    let budget =
        release_budget(deadline.map(|d| d.duration_since(SystemTime::now()).unwrap_or_default()));
    match tokio::time::timeout(budget, guard.release()).await {
        Ok(Ok(ReleaseOutcome::Released)) => {
            tracing::info!(%key, "lock API: released at the invocation's end")
        }
        Ok(Ok(ReleaseOutcome::Lost)) => {
            tracing::warn!(%key, "lock API: the lock had been lost before the invocation ended")
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, %key, "lock API: release failed; the row lapses within its lease")
        }
        Err(_) => {
            tracing::error!(%key, "lock API: release did not finish in time; the row lapses within its lease")
        }
    }
}

/// Closes the set of invocation `slot` (it ended) and releases everything it still holds,
/// concurrently, each within the release budget. Returns how many were released.
pub async fn release_all(slot: &Slot) -> usize {
    let held = slot.records().close();
    let n = held.len();
    if n > 0 {
        let deadline = slot.deadline();
        futures::future::join_all(held.into_iter().map(|g| release_now(g, deadline))).await;
        tracing::info!(
            released = n,
            "lock API: the invocation ended; released what it held"
        );
    }
    n
}

#[cfg(test)]
mod tests;
