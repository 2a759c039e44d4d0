//! The answers every part of the double's HTTP side builds: JSON bodies, recorded refusals and
//! telemetry events.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioExecutor;

use super::{now_ms, Mode, Refusal, Shared};

/// A body the double sends: whole, or (a fault) one that breaks off.
pub(super) type Body = BoxBody<Bytes, std::io::Error>;
pub(super) type Resp = Response<Body>;

/// A whole body.
pub(super) fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

pub(super) fn json(status: StatusCode, body: serde_json::Value) -> Resp {
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

pub(super) fn ok() -> serde_json::Value {
    serde_json::json!({"status": "OK"})
}

/// An error answer in the documented `{"errorType", "errorMessage"}` form, recorded.
pub(super) fn refuse(
    shared: &Shared,
    path: &str,
    status: StatusCode,
    error_type: &str,
    msg: &str,
) -> Resp {
    let body = serde_json::json!({"errorType": error_type, "errorMessage": msg});
    shared.lock().refusals.push(Refusal {
        path: path.to_owned(),
        status: status.as_u16(),
        body: body.to_string(),
    });
    json(status, body)
}

pub(super) fn is_mi(shared: &Shared) -> bool {
    matches!(shared.options.mode, Mode::ManagedInstances { .. })
}

/// Sends one telemetry event to every subscriber.
pub(super) fn emit(shared: &Shared, kind: &str, record: serde_json::Value) {
    let uris = shared.lock().telemetry_uris.clone();
    let batch = serde_json::json!([{"time": now_ms().to_string(), "type": kind, "record": record}])
        .to_string();
    for uri in uris {
        let batch = batch.clone();
        tokio::spawn(async move {
            let client =
                hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
            if let Ok(req) = Request::post(uri).body(Full::new(Bytes::from(batch))) {
                let _ = client.request(req).await;
            }
        });
    }
}
