//! Once per tick through the extension's proxy: what the runtime posts decides whether the
//! tick is marked done. `.../response` accepted by Lambda: marked, and a duplicate delivery of
//! the scheduled event to another environment is answered upstream with the skip body, reason
//! `duplicate`, never handed to its runtime. `.../error`, a streamed response that ends with a
//! `Lambda-Runtime-Function-Error-Type` trailer, and SHUTDOWN with the invocation unfinished:
//! not marked, so the retry runs. Two environments (proxy + platform double each) on one
//! table. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightlock_extension::proxy::Proxy;
use flightlock_testkit::platform::Platform;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use support::{get, respond, LIMIT, NEXT};
use tokio::net::TcpStream;

/// An EventBridge scheduled event (the shape of `events/scheduled.json`) for `time`.
fn scheduled(time: &str) -> serde_json::Value {
    flightlock_testkit::events::scheduled(flightlock_testkit::events::SCHEDULED_ID, time)
}

/// One execution environment: its platform double and its proxy's port.
struct Env {
    platform: Platform,
    port: u16,
    proxy: Arc<Proxy>,
}

/// Two environments of one function (default settings: `FLIGHTLOCK_TICK=auto`) on a fresh
/// table.
async fn two_environments(prefix: &str) -> (Env, Env) {
    let (table, client) = support::table(prefix).await;
    let mut envs = Vec::new();
    for host in ["env-1", "env-2"] {
        let platform = support::standard().await;
        let (port, proxy) =
            support::start_proxy(&platform, &table, client.clone(), &[], host).await;
        envs.push(Env {
            platform,
            port,
            proxy,
        });
    }
    let second = envs.pop().unwrap();
    (envs.pop().unwrap(), second)
}

/// Invokes `env` with `event` and expects its runtime to get it; returns the request id.
async fn runs(env: &Env, event: &serde_json::Value) -> String {
    let id = env.platform.invoke(event.clone());
    let got = get(env.port, NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&id), "the runtime got {id}");
    id
}

/// Invokes `env` with `event` and expects it answered upstream with the skip body while the
/// runtime keeps waiting; returns the body.
async fn answered_without_running(env: &Env, event: &serde_json::Value) -> serde_json::Value {
    let nexts = env.platform.runtime_nexts();
    let id = env.platform.invoke(event.clone());
    let port = env.port;
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    let answer = env.platform.answer(&id, LIMIT).await.expect("answered");
    assert_eq!(
        answer.path,
        format!("/2018-06-01/runtime/invocation/{id}/response")
    );
    // The proxy asks Lambda for the next event on the runtime's behalf: the runtime, still
    // waiting, never got this one.
    assert!(env.platform.wait_runtimes_waiting(1, LIMIT).await);
    assert_eq!(env.platform.runtime_nexts(), nexts + 2);
    assert!(!waiting.is_finished(), "the runtime got {id}");
    waiting.abort();
    serde_json::from_slice(&answer.body).unwrap()
}

/// The runtime posts an invocation error for `id` through the proxy.
async fn fail(port: u16, id: &str) -> http::StatusCode {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = http::Request::post(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/error"
    ))
    .header("lambda-runtime-function-error-type", "JobFailed")
    .body(Full::new(Bytes::from_static(
        br#"{"errorType":"JobFailed","errorMessage":"the job failed"}"#,
    )))
    .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .expect("the proxy answered")
        .unwrap();
    resp.status()
}

/// The runtime streams a response for `id` through the proxy: some data, then (with
/// `error_type`) the error trailers a runtime sends when the function fails midway.
async fn stream(port: u16, id: &str, error_type: Option<&str>) -> http::StatusCode {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut frames = vec![Ok::<_, Infallible>(Frame::data(Bytes::from_static(
        b"partial output",
    )))];
    if let Some(t) = error_type {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("lambda-runtime-function-error-type", t.parse().unwrap());
        trailers.insert(
            "lambda-runtime-function-error-body",
            "eyJlcnJvck1lc3NhZ2UiOiJib29tIn0=".parse().unwrap(),
        );
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let req = http::Request::post(format!("/2018-06-01/runtime/invocation/{id}/response"))
        .header("host", "127.0.0.1")
        .header("lambda-runtime-function-response-mode", "streaming")
        .header("transfer-encoding", "chunked")
        .header(
            "trailer",
            "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body",
        )
        .body(StreamBody::new(futures::stream::iter(frames)))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), sender.send_request(req))
        .await
        .expect("the proxy answered")
        .unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

#[tokio::test]
async fn a_response_marks_the_tick_and_a_duplicate_elsewhere_is_not_run() {
    let (one, two) = two_environments("xtick_dup").await;
    let event = scheduled("2026-11-24T10:00:00Z");
    let a1 = runs(&one, &event).await;
    assert!(respond(one.port, &a1, r#"{"ok":true}"#).await.is_success());
    let answer = one.platform.answer(&a1, LIMIT).await.expect("a-1 answered");
    assert_eq!(answer.text(), r#"{"ok":true}"#);
    // EventBridge delivers the same event again, to another environment.
    let body = answered_without_running(&two, &event).await;
    assert_eq!(body["flightlock"]["skipped"], true, "{body}");
    assert_eq!(body["flightlock"]["reason"], "duplicate", "{body}");
    assert_eq!(
        body["flightlock"]["tick"], "2026-11-24T10:00:00.000Z",
        "{body}"
    );
    // The next tick runs there.
    runs(&two, &scheduled("2026-11-24T10:01:00Z")).await;
}

#[tokio::test]
async fn an_error_does_not_mark_the_tick_so_the_retry_runs() {
    let (one, two) = two_environments("xtick_err").await;
    let event = scheduled("2026-11-24T11:00:00Z");
    let a1 = runs(&one, &event).await;
    assert!(fail(one.port, &a1).await.is_success());
    let answer = one.platform.answer(&a1, LIMIT).await.expect("a-1 failed");
    assert!(
        answer.path.ends_with(&format!("{a1}/error")),
        "{}",
        answer.path
    );
    // Lambda's retry, in the other environment: runs, and this time succeeds.
    let a2 = runs(&two, &event).await;
    assert!(respond(two.port, &a2, "{}").await.is_success());
    let answer = two.platform.answer(&a2, LIMIT).await.expect("a-2 answered");
    assert!(
        answer.path.ends_with(&format!("{a2}/response")),
        "{}",
        answer.path
    );
    let body = answered_without_running(&two, &event).await;
    assert_eq!(body["flightlock"]["reason"], "duplicate", "{body}");
}

#[tokio::test]
async fn a_stream_with_an_error_trailer_does_not_mark_the_tick_and_a_clean_one_does() {
    let (one, two) = two_environments("xtick_stream").await;
    let event = scheduled("2026-11-24T12:00:00Z");
    let a1 = runs(&one, &event).await;
    assert!(stream(one.port, &a1, Some("Runtime.StreamError"))
        .await
        .is_success());
    let answer = one.platform.answer(&a1, LIMIT).await.expect("a-1 streamed");
    let trailers = answer.trailers.expect("the error trailers reached Lambda");
    assert_eq!(
        trailers["lambda-runtime-function-error-type"],
        "Runtime.StreamError"
    );
    // The lock is released once the stream ended; the retry runs.
    let a2 = runs(&two, &event).await;
    assert!(stream(two.port, &a2, None).await.is_success());
    let answer = two.platform.answer(&a2, LIMIT).await.expect("a-2 streamed");
    assert!(answer.path.ends_with(&format!("{a2}/response")) && answer.complete);
    let body = answered_without_running(&two, &event).await;
    assert_eq!(body["flightlock"]["reason"], "duplicate", "{body}");
}

#[tokio::test]
async fn a_shutdown_mid_invocation_does_not_mark_the_tick() {
    let (one, two) = two_environments("xtick_crash").await;
    let event = scheduled("2026-11-24T13:00:00Z");
    let a1 = runs(&one, &event).await;
    // The environment goes away (timeout, crash) before the runtime answered: SHUTDOWN
    // releases what it holds, as a failed run (what the extension's lifecycle does on
    // SHUTDOWN; the proxy here is not a registered extension).
    one.proxy.release_all(Duration::from_secs(2)).await;
    assert!(
        one.platform.answer(&a1, Duration::ZERO).await.is_none(),
        "a-1 was answered"
    );
    runs(&two, &event).await;
}
