//! The proxy forwards a runtime's streamed response to the Runtime API chunk by chunk, trailers
//! included, and passes other paths (`/runtime/init/error`) through unchanged; a stalled request
//! head is cut off and connections beyond the cap wait. The Runtime API is the platform double.
//! Only the streamed response belongs to a gated invocation (DynamoDB Local); the others take no
//! lock, so their proxy's DynamoDB endpoint is never contacted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use flightlock_extension::proxy::Limits;
use flightlock_testkit::platform::{Outcome, Platform};
use support::{get, LIMIT, NEXT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A proxy in front of `platform` for requests that take no lock.
async fn ungated_proxy(platform: &Platform, limits: Limits) -> u16 {
    // Never contacted: these requests take no lock.
    let client = flightlock_testkit::client("http://127.0.0.1:1").await;
    let (port, _) = support::start_proxy_with(platform, "locks", client, &[], "test", limits).await;
    port
}

async fn read_status(stream: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn a_streamed_response_goes_upstream_with_its_trailers() {
    let platform = support::standard().await;
    let (table, client) = support::table("passthrough").await;
    let vars = [("FLIGHTLOCK_KEY", "stream")];
    let (port, _) = support::start_proxy(&platform, &table, client, &vars, "h").await;
    let id = platform.invoke(serde_json::json!({}));
    assert_eq!(get(port, NEXT).await.request_id.as_ref(), Some(&id));
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        format!(
            "POST /2018-06-01/runtime/invocation/{id}/response HTTP/1.1\r\n\
             Host: 127.0.0.1\r\n\
             Lambda-Runtime-Function-Response-Mode: streaming\r\n\
             Transfer-Encoding: chunked\r\n\
             Trailer: Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body\r\n\r\n\
             5\r\nhello\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // The first chunk reaches Lambda while the runtime is still writing: streamed, not
    // buffered.
    assert_eq!(
        platform.first_chunk(&id, LIMIT).await,
        Some(Bytes::from_static(b"hello")),
        "the first chunk did not stream through"
    );
    s.write_all(
        b"6\r\n world\r\n0\r\n\
          Lambda-Runtime-Function-Error-Type: Runtime.StreamError\r\n\
          Lambda-Runtime-Function-Error-Body: YnJva2Vu\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(read_status(&mut s).await, "HTTP/1.1 202 Accepted");
    let got = platform.answer(&id, LIMIT).await.expect("the answer");
    assert_eq!(
        got.path,
        format!("/2018-06-01/runtime/invocation/{id}/response")
    );
    assert!(got.complete);
    assert_eq!(got.body, Bytes::from_static(b"hello world"));
    assert_eq!(
        got.headers["lambda-runtime-function-response-mode"],
        "streaming"
    );
    let trailers = got.trailers.expect("trailers were dropped");
    assert_eq!(
        trailers["lambda-runtime-function-error-type"],
        "Runtime.StreamError"
    );
    assert_eq!(trailers["lambda-runtime-function-error-body"], "YnJva2Vu");
    assert_eq!(
        platform.outcome(&id, LIMIT).await,
        Some(Outcome::Response(Bytes::from_static(b"hello world")))
    );
}

#[tokio::test]
async fn init_errors_pass_through_unchanged() {
    let platform = support::standard().await;
    let port = ungated_proxy(&platform, Limits::default()).await;
    let body = br#"{"errorMessage":"boom","errorType":"Init.Failed"}"#;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        format!(
            "POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: x\r\n\
             Lambda-Runtime-Function-Error-Type: Init.Failed\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(body).await.unwrap();
    assert_eq!(read_status(&mut s).await, "HTTP/1.1 202 Accepted");
    assert_eq!(
        platform.init_errors(),
        [(
            "runtime".to_owned(),
            Some("Init.Failed".to_owned()),
            String::from_utf8_lossy(body).into_owned()
        )]
    );
}

const INIT_ERROR: &[u8] =
    b"POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let platform = support::standard().await;
    let limits = Limits {
        header_read_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let port = ungated_proxy(&platform, limits).await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /2018-06-01/runtime/invocation/next HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the proxy closed the stalled connection")
        .unwrap_or(0);
    // Closed (EOF), possibly after a 408; never the forwarded request's answer.
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(
        platform.runtime_nexts(),
        0,
        "the stalled request went upstream"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let platform = support::standard().await;
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let port = ungated_proxy(&platform, limits).await;
    // The one slot: a connection that has sent nothing yet.
    let first = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // Give the proxy a moment to take it into the slot before the second one comes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    second.write_all(INIT_ERROR).await.unwrap();
    let mut buf = [0u8; 256];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf))
            .await
            .is_err(),
        "served beyond the cap"
    );
    assert!(
        platform.init_errors().is_empty(),
        "forwarded beyond the cap"
    );
    // The slot frees up: the waiting connection is served.
    drop(first);
    assert_eq!(read_status(&mut second).await, "HTTP/1.1 202 Accepted");
    assert_eq!(platform.init_errors().len(), 1);
}
