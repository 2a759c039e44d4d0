//! `POST /2018-06-01/runtime/invocation/{id}/response|error`: the runtime's answer to an
//! invocation, buffered or streamed.
//!
//! - Only for an invocation in flight, checked on the request head: AWS's emulator answers 400
//!   `InvalidRequestID` otherwise (`rapi/rendering/render_error.go`).
//! - The body is read to its end, then answered 202: the emulator's handler
//!   (`lambda/rapi/handler/invocationresponse.go`) passes the body on and renders `Accepted`
//!   after it. A streamed response (`Lambda-Runtime-Function-Response-Mode: streaming`, chunked,
//!   with the trailers `Lambda-Runtime-Function-Error-Type` / `-Body`; Runtime API, "Response
//!   streaming") is read as it arrives: its first chunk is visible while it runs
//!   ([`super::Platform::first_chunk`]). Lambda streams up to 200 MB, so beyond [`KEEP`] bytes a
//!   body is counted, not kept.
//! - A body that breaks off is no answer: the emulator's handler returns its error before the
//!   runtime's state changes, so the invocation stays in flight (until its deadline). The broken
//!   body is still recorded ([`Answer::complete`] false).

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::Request;

use super::reply::{emit, is_mi, json, ok, refuse, Resp};
use super::{Outcome, Shared};

/// Bytes of an answer's body kept ([`Answer::body`]); the rest is counted ([`Answer::len`]).
/// Above Lambda's 6 MB limit of a buffered response, so only a long stream is cut.
pub const KEEP: usize = 8 << 20;

const PREFIX: &str = "/2018-06-01/runtime/invocation/";

/// One answer the runtime posted for an invocation in flight, as the double read it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The path posted (`.../{id}/response` or `.../{id}/error`).
    pub path: String,
    /// The request's headers.
    pub headers: http::HeaderMap,
    /// The body's first [`KEEP`] bytes (a buffered body whole).
    pub body: Bytes,
    /// Bytes in the body.
    pub len: u64,
    /// Whether the body ended cleanly (a streamed body can break off).
    pub complete: bool,
    /// The trailers of a chunked body, if any were sent.
    pub trailers: Option<http::HeaderMap>,
}

impl Answer {
    /// The kept body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Serves one answer (see the module docs).
pub(super) async fn finish(shared: &Shared, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let rest = path.trim_start_matches(PREFIX);
    let (id, kind) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(kind, "response" | "error") {
        return refuse(
            shared,
            &path,
            StatusCode::NOT_FOUND,
            "NotFound",
            "no such path",
        );
    }
    if !shared.lock().running.contains_key(id) {
        return invalid_id(shared, &path);
    }
    let (parts, body) = req.into_parts();
    let answer = read(shared, id, &path, parts.headers, body).await;
    let outcome = match kind {
        "response" => Outcome::Response(answer.body.clone()),
        _ => Outcome::Error(
            answer
                .headers
                .get("lambda-runtime-function-error-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            answer.body.clone(),
        ),
    };
    let complete = answer.complete;
    let mut s = shared.lock();
    s.answers.insert(id.to_owned(), answer);
    if !complete {
        drop(s);
        shared.touch();
        // The runtime's connection broke: this reaches nobody.
        return json(StatusCode::BAD_REQUEST, serde_json::json!({}));
    }
    // Gone meanwhile: the deadline passed while the body was read.
    if s.running.remove(id).is_none() {
        drop(s);
        return invalid_id(shared, &path);
    }
    s.outcomes.insert(id.to_owned(), outcome);
    drop(s);
    shared.touch();
    // No `platform.runtimeDone` on Managed Instances.
    if !is_mi(shared) {
        emit(
            shared,
            "platform.runtimeDone",
            serde_json::json!({"requestId": id, "status": "success"}),
        );
    }
    json(StatusCode::ACCEPTED, ok())
}

fn invalid_id(shared: &Shared, path: &str) -> Resp {
    refuse(
        shared,
        path,
        StatusCode::BAD_REQUEST,
        "InvalidRequestID",
        "Invalid request ID",
    )
}

/// Reads the body of the answer to `id` to its end or its break, publishing its first chunk.
async fn read(
    shared: &Shared,
    id: &str,
    path: &str,
    headers: http::HeaderMap,
    mut body: Incoming,
) -> Answer {
    let (mut kept, mut len, mut trailers, mut complete) = (Vec::new(), 0u64, None, true);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            complete = false;
            break;
        };
        match frame.into_data() {
            Ok(data) => {
                if len == 0 && !data.is_empty() {
                    shared
                        .lock()
                        .first_chunks
                        .insert(id.to_owned(), data.clone());
                    shared.touch();
                }
                len += data.len() as u64;
                let take = data.len().min(KEEP - kept.len());
                kept.extend_from_slice(&data[..take]);
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    Answer {
        path: path.to_owned(),
        headers,
        body: Bytes::from(kept),
        len,
        complete,
        trailers,
    }
}
