//! The HTTP side of the platform double: Runtime API, Extensions API, Telemetry and Logs API.
//! Every answer that refuses something is recorded (see `Platform::refusals`); the runtime's
//! answers to invocations are served by `answer.rs`.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use nix::sys::signal::Signal;

use super::answer::finish;
use super::reply::{emit, full, is_mi, json, ok, refuse, Body, Resp};
use super::{now_ms, signal_groups, Inv, Mode, NextFault, Shared, State};

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |r| handle(shared.clone(), r));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Resp, hyper::Error> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if method == http::Method::POST && path.starts_with("/2018-06-01/runtime/invocation/") {
        // Read as it arrives (a streamed response can be long), not collected here.
        return Ok(finish(&shared, req).await);
    }
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let ext_id = header("lambda-extension-identifier");
    let resp = match (method.as_str(), path.as_str()) {
        ("POST", "/2020-01-01/extension/register") => {
            register(&shared, &path, header("lambda-extension-name"), &body)
        }
        ("GET", "/2020-01-01/extension/event/next") => ext_next(&shared, &path, ext_id).await,
        ("POST", "/2020-01-01/extension/init/error") => {
            let who = ext_id.unwrap_or_default();
            init_error(
                &shared,
                who,
                header("lambda-extension-function-error-type"),
                &body,
            )
        }
        ("POST", "/2020-01-01/extension/exit/error") => json(StatusCode::ACCEPTED, ok()),
        ("PUT", "/2022-07-01/telemetry") => telemetry(&shared, &path, &body),
        // The Logs API is refused on Managed Instances (AWS's emulator answers 202 with
        // `Logs.NotSupported`, `rapi/handler/runtimelogs_stub.go`).
        ("PUT", "/2020-08-15/logs") if is_mi(&shared) => json(
            StatusCode::ACCEPTED,
            serde_json::json!({"errorType": "Logs.NotSupported", "errorMessage": "Logs API is not supported"}),
        ),
        ("PUT", "/2020-08-15/logs") => json(StatusCode::OK, ok()),
        ("GET", "/2018-06-01/runtime/invocation/next") => runtime_next(&shared).await,
        ("GET", "/2018-06-01/runtime/restore/next") => restore_next(&shared, &path).await,
        ("POST", "/2018-06-01/runtime/init/error") => init_error(
            &shared,
            "runtime".into(),
            header("lambda-runtime-function-error-type"),
            &body,
        ),
        _ => refuse(
            &shared,
            &path,
            StatusCode::NOT_FOUND,
            "NotFound",
            "no such path",
        ),
    };
    Ok(resp)
}

/// `POST register` (Extensions API reference, "Register"): a name is required; events must be
/// ones the mode allows; registration closes when the first invocation starts.
fn register(shared: &Shared, path: &str, name: Option<String>, body: &[u8]) -> Resp {
    let forbidden = StatusCode::FORBIDDEN;
    if let Some((status, t, m)) = &shared.options.refuse_registration {
        let status = StatusCode::from_u16(*status).unwrap_or(forbidden);
        return refuse(shared, path, status, t, m);
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return refuse(
            shared,
            path,
            forbidden,
            "Extension.InvalidExtensionName",
            "Empty extension name",
        );
    };
    let events: Vec<String> = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => v["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        Err(e) => {
            return refuse(
                shared,
                path,
                forbidden,
                "InvalidRequestFormat",
                &e.to_string(),
            )
        }
    };
    for e in &events {
        let allowed = match shared.options.mode {
            // Managed Instances: SHUTDOWN only (`ValidateExternalAgentEvent` in the emulator).
            Mode::ManagedInstances { .. } => e == "SHUTDOWN",
            Mode::Standard | Mode::SnapStart => e == "INVOKE" || e == "SHUTDOWN",
        };
        if !allowed {
            let msg = format!("{e}: invalid event type");
            return refuse(shared, path, forbidden, "Extension.InvalidEventType", &msg);
        }
    }
    let mut s = shared.lock();
    if s.registration_closed {
        drop(s);
        return refuse(
            shared,
            path,
            forbidden,
            "Extension.RegistrationClosed",
            "Extension registration closed already",
        );
    }
    s.next_ext += 1;
    let id = format!("ext-{}-{}", s.next_ext, now_ms() % 100_000);
    s.exts.push(super::Ext {
        name,
        id: id.clone(),
        events,
        queue: Default::default(),
        waiting: false,
    });
    drop(s);
    shared.touch();
    let mut r = json(
        StatusCode::OK,
        serde_json::json!({"functionName": "double", "functionVersion": "$LATEST", "handler": "x"}),
    );
    r.headers_mut().insert(
        "lambda-extension-identifier",
        HeaderValue::from_str(&id).unwrap(),
    );
    r
}

/// Marks an extension (or the runtime) as waiting in `/next` while it is; dropped on return or
/// when the client goes away.
struct Waiting<'a> {
    shared: &'a Shared,
    ext: Option<String>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        match &self.ext {
            Some(id) => {
                if let Some(e) = s.exts.iter_mut().find(|e| &e.id == id) {
                    e.waiting = false;
                }
            }
            None => s.runtime_waiting = s.runtime_waiting.saturating_sub(1),
        }
        drop(s);
        self.shared.touch();
    }
}

/// Waits until `take` gives something (the state's change notifications wake it).
async fn wait_take<T>(shared: &Shared, mut take: impl FnMut(&mut State) -> Option<T>) -> T {
    loop {
        let changed = shared.changed.notified();
        if let Some(v) = take(&mut shared.lock()) {
            return v;
        }
        changed.await;
    }
}

async fn ext_next(shared: &Shared, path: &str, id: Option<String>) -> Resp {
    let Some(id) = id.filter(|id| shared.lock().exts.iter().any(|e| &e.id == id)) else {
        return refuse(
            shared,
            path,
            StatusCode::FORBIDDEN,
            "Extension.UnknownExtensionIdentifier",
            "unknown extension id",
        );
    };
    if let Some(e) = shared.lock().exts.iter_mut().find(|e| e.id == id) {
        e.waiting = true;
    }
    shared.touch();
    let _w = Waiting {
        shared,
        ext: Some(id.clone()),
    };
    let event = wait_take(shared, |s| {
        s.exts
            .iter_mut()
            .find(|e| e.id == id)
            .and_then(|e| e.queue.pop_front())
    })
    .await;
    json(StatusCode::OK, event)
}

fn init_error(shared: &Shared, who: String, error_type: Option<String>, body: &[u8]) -> Resp {
    let body = String::from_utf8_lossy(body).into_owned();
    shared.lock().init_errors.push((who, error_type, body));
    shared.touch();
    json(StatusCode::ACCEPTED, ok())
}

/// `PUT telemetry` (Telemetry API reference; the Managed Instances subscription schema).
fn telemetry(shared: &Shared, path: &str, body: &[u8]) -> Resp {
    if !shared.options.telemetry {
        // A platform without it answers as AWS's emulator stub does: 202 and an error body.
        return json(
            StatusCode::ACCEPTED,
            serde_json::json!({"errorType": "Telemetry.NotSupported", "errorMessage": "Telemetry API is not supported"}),
        );
    }
    let bad = |m: &str| refuse(shared, path, StatusCode::BAD_REQUEST, "ValidationError", m);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return bad("not JSON");
    };
    let schemas: &[&str] = if is_mi(shared) {
        &["2025-01-29"]
    } else {
        &["2022-07-01", "2022-12-13", "2025-01-29"]
    };
    if !v["schemaVersion"]
        .as_str()
        .is_some_and(|s| schemas.contains(&s))
    {
        return bad("schemaVersion not supported");
    }
    let types_ok = v["types"].as_array().is_some_and(|t| {
        !t.is_empty()
            && t.iter()
                .all(|t| matches!(t.as_str(), Some("platform" | "function" | "extension")))
    });
    if !types_ok {
        return bad("types");
    }
    let b = &v["buffering"];
    let in_range = |f: &str, lo: u64, hi: u64| {
        b[f].as_u64()
            .map_or(b[f].is_null(), |x| (lo..=hi).contains(&x))
    };
    if !(in_range("maxItems", 1000, 10000)
        && in_range("maxBytes", 262144, 1048576)
        && in_range("timeoutMs", 25, 30000))
    {
        return bad("buffering out of range");
    }
    let Some(uri) = v["destination"]["URI"]
        .as_str()
        .filter(|_| v["destination"]["protocol"] == "HTTP")
    else {
        return bad("destination");
    };
    shared.lock().telemetry_uris.push(uri.to_owned());
    json(StatusCode::OK, serde_json::json!("OK"))
}

/// `GET invocation/next`: the next invocation once the mode allows it (standard and SnapStart:
/// one in flight, after every extension is back in `/next`; SnapStart: only after the restore;
/// Managed Instances: up to `AWS_LAMBDA_MAX_CONCURRENCY` in flight).
async fn runtime_next(shared: &Shared) -> Resp {
    {
        let mut s = shared.lock();
        s.runtime_waiting += 1;
        s.runtime_nexts += 1;
    }
    shared.touch();
    let w = Waiting { shared, ext: None };
    let mode = shared.options.mode;
    let inv = wait_take(shared, |s| {
        let cap = match mode {
            Mode::ManagedInstances { max_concurrency } => max_concurrency,
            Mode::Standard | Mode::SnapStart => 1,
        };
        let ready = match mode {
            Mode::ManagedInstances { .. } => true,
            Mode::Standard => s.exts.iter().all(|e| e.queue.is_empty()),
            Mode::SnapStart => s.restored && s.exts.iter().all(|e| e.queue.is_empty()),
        };
        if s.shut_down || !ready || s.running.len() >= cap {
            return None;
        }
        let mut inv: Inv = s.queue.pop_front()?;
        inv.deadline_ms = now_ms() + shared.options.timeout.as_millis() as u64;
        s.running.insert(inv.id.clone(), inv.clone());
        s.dispatched += 1;
        s.max_in_flight = s.max_in_flight.max(s.running.len());
        s.registration_closed = true;
        // Thawed before anything is delivered (the whole sandbox resumes for the invoke), under
        // the same lock as the freeze, so the two signals cannot cross.
        if std::mem::take(&mut s.frozen) {
            signal_groups(&s.freeze_groups, Signal::SIGCONT);
        }
        if !matches!(mode, Mode::ManagedInstances { .. }) {
            let event = serde_json::json!({
                "eventType": "INVOKE", "deadlineMs": inv.deadline_ms, "requestId": inv.id,
                "invokedFunctionArn": "arn:aws:lambda:us-east-1:000000000000:function:double",
                "tracing": {"type": "X-Amzn-Trace-Id", "value": inv.trace.as_deref().unwrap_or("Root=1-0-0")},
            });
            for e in s
                .exts
                .iter_mut()
                .filter(|e| e.events.iter().any(|v| v == "INVOKE"))
            {
                e.queue.push_back(event.clone());
            }
        }
        Some(inv)
    })
    .await;
    drop(w);
    shared.touch();
    emit(
        shared,
        "platform.start",
        serde_json::json!({"requestId": inv.id, "version": "$LATEST"}),
    );
    let body = match inv.fault {
        Some(NextFault::TruncatedBody) => breaking_off(inv.payload.clone()),
        _ => full(inv.payload.clone()),
    };
    let mut r = Response::new(body);
    let h = r.headers_mut();
    if inv.fault != Some(NextFault::NoRequestId) {
        h.insert(
            "lambda-runtime-aws-request-id",
            HeaderValue::from_str(&inv.id).unwrap(),
        );
    }
    if inv.fault == Some(NextFault::TruncatedBody) {
        // The whole payload's length is promised; half of it comes.
        h.insert("content-length", HeaderValue::from(inv.payload.len()));
    }
    h.insert(
        "lambda-runtime-deadline-ms",
        HeaderValue::from(inv.deadline_ms),
    );
    h.insert(
        "lambda-runtime-invoked-function-arn",
        HeaderValue::from_static("arn:aws:lambda:us-east-1:000000000000:function:double"),
    );
    h.insert(
        "lambda-runtime-trace-id",
        inv.trace
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
            .unwrap_or(HeaderValue::from_static("Root=1-0-0")),
    );
    h.insert("content-type", HeaderValue::from_static("application/json"));
    if let Some(t) = &shared.options.tenant {
        h.insert(
            "lambda-runtime-aws-tenant-id",
            HeaderValue::from_str(t).unwrap(),
        );
    }
    r
}

/// The fault [`NextFault::TruncatedBody`]: the first half of `payload`, then the connection breaks.
/// The break comes after one yield, so hyper writes out the head and the half before it sees the
/// error and drops the connection.
fn breaking_off(payload: Bytes) -> Body {
    let half = payload.slice(..payload.len() / 2);
    let sent = futures::stream::iter([Ok(Frame::data(half))]);
    let broken = futures::stream::once(async {
        tokio::task::yield_now().await;
        Err(std::io::Error::other("the double breaks the event off"))
    });
    StreamBody::new(futures::StreamExt::chain(sent, broken)).boxed()
}

/// `GET restore/next`: SnapStart only; returns once the snapshot is restored.
async fn restore_next(shared: &Shared, path: &str) -> Resp {
    if shared.options.mode != Mode::SnapStart {
        return refuse(
            shared,
            path,
            StatusCode::NOT_FOUND,
            "NotFound",
            "restore/next is served to SnapStart functions only",
        );
    }
    wait_take(shared, |s| s.restored.then_some(())).await;
    json(StatusCode::OK, serde_json::json!({}))
}
