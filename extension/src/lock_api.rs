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
//! every call: X-Flightlock-Token: $AWS_SESSION_TOKEN (SnapStart: $AWS_CONTAINER_AUTHORIZATION_TOKEN)
//! ```
//!
//! **Who may call.** Every call carries [`TOKEN_HEADER`] with the function's
//! `AWS_SESSION_TOKEN`, which only processes of the execution environment have (AWS's
//! Parameters and Secrets extension asks the same of its callers): a server-side request
//! forgery in the handler, which makes it fetch a URL but sets no header of the attacker's
//! choosing, cannot take or free a lock. Functions restored from a SnapStart snapshot have no
//! session token; Lambda gives them `AWS_CONTAINER_AUTHORIZATION_TOKEN` (the container
//! credentials' token, as private to the environment), and that is the secret there.
//!
//! Every call names an invocation in flight in this environment, by the request id the runtime
//! handed the handler: a call for one that has ended, or that this environment never ran, is
//! refused. A request id names an invocation, not a delivery: a retried one is a new delivery
//! with a set of its own ([`crate::invocations`]). Several invocations in flight at once
//! (Lambda Managed Instances) each have their own set, and there a call is also bound to the
//! process that runs the invocation ([`Caller`]): a runtime process that runs one invocation at
//! a time (Python, Java, .NET) can take or free only its own invocation's locks, whatever
//! request id it names. A runtime that runs several invocations in one process (Node.js) cannot
//! be told apart that way; there the request id is the only name, so it is never disclosed: a
//! busy answer says who holds a key (function, host, ticket), never which invocation.
//!
//! A key the invocation's own gate holds (`FLIGHTLOCK_KEY`) is refused at once (`heldByGate`):
//! acquiring it would wait for itself until the deadline.
//!
//! **Every lock ends with its invocation.** The locks are an invocation's
//! [`flightlock_lambda::records::Records`] (the same mechanism as the in-process layer's): when
//! the invocation ends (its response or error has gone upstream, its runtime's processes are all
//! gone, or the environment shuts down), the proxy closes them, releasing whatever is still held
//! before the runtime hears back from its response; an acquisition still under way then releases
//! what it gets at once. Each lease is capped at the invocation's deadline plus
//! [`flightlock_lambda::config::LEASE_CAP_GRACE`], and each acquisition is decided within the
//! deadline, as the gate's.
//!
//! This module is the HTTP face of it: routes, the token check, the bodies and what each
//! [`RecordError`] answers.

use std::sync::Arc;
use std::time::Duration;

use flightlock::Wait;
use flightlock_lambda::records::{RecordError, Records};
use flightlock_lambda::responses::redact_aws_ids;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::body::{full, ProxyBody};
use crate::config::{CONTAINER_TOKEN, SESSION_TOKEN};
use crate::invocations::{Invocations, Slot};
use crate::processes::runtime::Proc;

/// Every path of the API starts with this.
pub const PATH_PREFIX: &str = "/flightlock/v1/";
/// The header every call carries, with the function's `AWS_SESSION_TOKEN`.
pub const TOKEN_HEADER: &str = "x-flightlock-token";
pub use flightlock_lambda::records::MAX_HELD;
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

impl Call {
    /// The request id the call names.
    pub fn request_id(&self) -> &str {
        match self {
            Call::Acquire(id) | Call::Release(id) | Call::List(id) => id,
        }
    }
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
                "the lock API is off: neither {SESSION_TOKEN} nor {CONTAINER_TOKEN} is set in the \
                 extension's environment (Lambda sets one of them; set {SESSION_TOKEN} when \
                 emulating Lambda locally)"
            ),
        ));
    };
    let Some(sent) = sent else {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "send the header {TOKEN_HEADER} with the value of {SESSION_TOKEN} (under \
                 SnapStart, {CONTAINER_TOKEN})"
            ),
        ));
    };
    let (a, b) = (expected.as_bytes(), sent.as_bytes());
    let differ = a.len() != b.len() || a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0;
    if differ {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{TOKEN_HEADER} is not this environment's {SESSION_TOKEN} (under SnapStart, \
                 {CONTAINER_TOKEN})"
            ),
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

/// Who makes a call, as far as the platform lets the extension know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// One invocation in flight at a time (the standard mode): the request id and the token
    /// are the whole check.
    Unbound,
    /// Lambda Managed Instances: the runtime process on the other end of the call's connection
    /// (`None`: not found). A call for an invocation whose runtime process is known is answered
    /// only if it comes from that process or a process it started.
    Process(Option<Proc>),
}

/// Checks that `caller` may act for the invocation in `slot`. Pure.
pub fn bound(caller: Caller, slot: &Slot, id: &str) -> Result<(), Refusal> {
    let Caller::Process(from) = caller else {
        return Ok(());
    };
    match slot.runtime() {
        // Not known (the runtime was not started through the wrapper, or /proc is not
        // readable): nothing to bind to; the request id is the check, as in the standard mode.
        None => Ok(()),
        Some(runs) if from == Some(runs) => Ok(()),
        Some(_) => Err(refuse(
            StatusCode::FORBIDDEN,
            "notYourInvocation",
            format!(
                "invocation {id:?} runs in another runtime process than this call comes from{}: \
                 a handler takes and frees the locks of its own invocation (the request id its \
                 context gives it), never another's",
                if from.is_none() {
                    " (the calling process is not a runtime started through /opt/flightlock-wrapper)"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// Answers one call: `token` is what callers must send (`None`: every call is refused),
/// `invocations` the invocations in flight in this environment, whose locks a call may take or
/// free, and `caller` who makes the call.
pub async fn serve(
    token: Option<&str>,
    invocations: &Invocations,
    caller: Caller,
    call: Call,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let answer = match authorize(token, req.headers().get(TOKEN_HEADER)) {
        Err(refusal) => Err(refusal),
        Ok(()) => match call {
            Call::Acquire(id) => acquire(invocations, caller, &id, req).await,
            Call::Release(id) => release(invocations, caller, &id, req).await,
            Call::List(id) => in_flight(invocations, caller, &id).map(|(_, records)| {
                let locks: Vec<Value> = records
                    .held()
                    .into_iter()
                    .map(|h| json!({ "key": h.key, "token": h.token, "permits": h.permits, "lost": h.lost }))
                    .collect();
                (StatusCode::OK, json!({ "locks": locks }))
            }),
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

/// The delivery of invocation `id` and its locks, if it is in flight here (its event was handed
/// to the runtime and it has not ended) and `caller` may act for it.
fn in_flight(
    invocations: &Invocations,
    caller: Caller,
    id: &str,
) -> Result<(Arc<Slot>, Arc<Records>), Refusal> {
    match invocations.get(id) {
        Some(slot) if !slot.is_done() => {
            let records = slot.records().ok_or_else(|| not_in_flight(id))?;
            bound(caller, &slot, id)?;
            Ok((slot, records))
        }
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

async fn acquire(
    invocations: &Invocations,
    caller: Caller,
    id: &str,
    req: Request<Incoming>,
) -> Answer {
    let (slot, records) = in_flight(invocations, caller, id)?;
    let body = parse_acquire(&read_body(req).await?)?;
    if slot.held_key().as_deref() == Some(body.key.as_str()) {
        return Err(refuse(
            StatusCode::CONFLICT,
            "heldByGate",
            format!(
                "this invocation holds {:?} already: the gate took it before the handler ran \
                 (FLIGHTLOCK_KEY); lock other keys here, or set FLIGHTLOCK_GATE=off to take \
                 every lock through this API",
                body.key
            ),
        ));
    }
    let wait = body.wait_ms.map(|ms| match ms {
        0 => Wait::NoWait,
        ms => Wait::For(Duration::from_millis(ms)),
    });
    let acquired = records
        .acquire(&body.key, wait, body.permits)
        .await
        .map_err(|e| refusal(e, id))?;
    Ok((
        StatusCode::OK,
        json!({
            "key": acquired.key,
            "token": acquired.token,
            "waitedMs": acquired.waited.as_millis() as u64,
            "permits": acquired.permits,
        }),
    ))
}

async fn release(
    invocations: &Invocations,
    caller: Caller,
    id: &str,
    req: Request<Incoming>,
) -> Answer {
    let (_, records) = in_flight(invocations, caller, id)?;
    let body = parse_release(&read_body(req).await?)?;
    records
        .release(&body.key)
        .await
        .map_err(|e| refusal(e, id))?;
    Ok((StatusCode::OK, json!({ "key": body.key, "released": true })))
}

/// What a [`RecordError`] of invocation `id` answers.
pub fn refusal(e: RecordError, id: &str) -> Refusal {
    let (status, error) = match &e {
        RecordError::Ended => return not_in_flight(id),
        RecordError::AlreadyHeld { .. } => (StatusCode::CONFLICT, "alreadyHeld"),
        RecordError::TooMany => (StatusCode::TOO_MANY_REQUESTS, "tooManyLocks"),
        RecordError::Busy {
            error,
            holders,
            cut,
            ..
        } => {
            // Who holds it, for people: never the holders' request ids or owner ids (another
            // invocation's request id is its name here; see the module docs).
            let holders: Vec<Value> = holders
                .iter()
                .map(|h| json!({"ticket": h.ticket, "function": h.info.function, "host": h.info.host}))
                .collect();
            let key = match &**error {
                flightlock::Error::Busy { key, .. } => key.as_str(),
                _ => "the key",
            };
            let message = format!("{key:?} is busy: {} holder(s) ahead{cut}", holders.len());
            return Refusal {
                extra: Some(("holders", Value::Array(holders))),
                ..refuse(StatusCode::CONFLICT, "busy", message)
            };
        }
        RecordError::NoDecision { .. } => (StatusCode::GATEWAY_TIMEOUT, "noDecision"),
        RecordError::NotHeld { .. } => (StatusCode::NOT_FOUND, "notHeld"),
        RecordError::Lost { .. } => (StatusCode::CONFLICT, "lost"),
        RecordError::Lock(lock) => match **lock {
            flightlock::Error::InvalidKey { .. } => (StatusCode::BAD_REQUEST, "badRequest"),
            flightlock::Error::PermitsMismatch { .. } => (StatusCode::CONFLICT, "permitsMismatch"),
            flightlock::Error::ProtocolTooNew { .. } => (StatusCode::CONFLICT, "protocolTooNew"),
            ref other => {
                tracing::error!(error = %other, "lock API: DynamoDB refused");
                (StatusCode::BAD_GATEWAY, "lockError")
            }
        },
    };
    // The full error is in the log; the caller gets no ARNs or account ids.
    refuse(status, error, redact_aws_ids(&e.to_string()))
}

#[cfg(test)]
mod tests;
