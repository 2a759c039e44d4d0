//! The proxy forwards a runtime's streamed response upstream chunk by chunk, trailers included,
//! and passes other paths (`/runtime/init/error`) through unchanged; a stalled request head is
//! cut off and connections beyond the cap wait. No DynamoDB needed: these requests belong to no
//! gated invocation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightlock::lambda::config::Config;
use flightlock::lambda::gate::Gate;
use flightlock_extension::invocations::Invocations;
use flightlock_extension::proxy::{Limits, Proxy};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Debug)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
    body: Bytes,
    trailers: Option<http::HeaderMap>,
}

#[derive(Debug)]
enum Event {
    FirstChunk(Bytes),
    Done(Box<Seen>),
}

async fn done(rx: &mut mpsc::UnboundedReceiver<Event>) -> Seen {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(Event::Done(s))) => return *s,
            Ok(Some(Event::FirstChunk(_))) => continue,
            other => panic!("upstream saw no request: {other:?}"),
        }
    }
}

async fn upstream() -> (String, mpsc::UnboundedReceiver<Event>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, mut body) = req.into_parts();
                        let (mut data, mut trailers) = (Vec::new(), None);
                        while let Some(frame) = body.frame().await {
                            let frame = frame?;
                            if let Some(d) = frame.data_ref() {
                                if data.is_empty() {
                                    tx.send(Event::FirstChunk(d.clone())).unwrap();
                                }
                                data.extend_from_slice(d);
                            } else if let Ok(t) = frame.into_trailers() {
                                trailers = Some(t);
                            }
                        }
                        tx.send(Event::Done(Box::new(Seen {
                            path: parts.uri.path().to_owned(),
                            headers: parts.headers,
                            body: Bytes::from(data),
                            trailers,
                        })))
                        .unwrap();
                        let mut r = http::Response::new(Full::new(Bytes::from_static(b"{}")));
                        *r.status_mut() = http::StatusCode::ACCEPTED;
                        Ok::<_, hyper::Error>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, rx)
}

async fn proxy(upstream: &str) -> u16 {
    proxy_with(upstream, Limits::default()).await
}

async fn proxy_with(upstream: &str, limits: Limits) -> u16 {
    let env = [
        ("FLIGHTLOCK_TABLE", "locks"),
        ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        // No EMF lines on the test output.
        ("FLIGHTLOCK_METRICS", "off"),
        ("AWS_LAMBDA_RUNTIME_API", upstream),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = Arc::new(Config::from_map(&env).unwrap());
    // Never contacted: these requests take no lock.
    let locker = flightlock::Locker::new(
        flightlock_testkit::client("http://127.0.0.1:1").await,
        "locks",
    );
    let proxy = Arc::new(
        Proxy::new(
            Gate::new(config, locker, "test".to_owned()),
            Arc::new(Invocations::default()),
            upstream.to_owned(),
        )
        .with_limits(limits),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(proxy.serve(listener));
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
    let (up, mut seen) = upstream().await;
    let port = proxy(&up).await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        b"POST /2018-06-01/runtime/invocation/req-1/response HTTP/1.1\r\n\
          Host: 127.0.0.1\r\n\
          Lambda-Runtime-Function-Response-Mode: streaming\r\n\
          Transfer-Encoding: chunked\r\n\
          Trailer: Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body\r\n\r\n\
          5\r\nhello\r\n",
    )
    .await
    .unwrap();
    // The first chunk reaches upstream while the runtime is still writing: streamed, not
    // buffered.
    match tokio::time::timeout(Duration::from_secs(5), seen.recv()).await {
        Ok(Some(Event::FirstChunk(c))) => assert_eq!(c, Bytes::from_static(b"hello")),
        other => panic!("the first chunk did not stream through: {other:?}"),
    }
    s.write_all(
        b"6\r\n world\r\n0\r\n\
          Lambda-Runtime-Function-Error-Type: Runtime.StreamError\r\n\
          Lambda-Runtime-Function-Error-Body: YnJva2Vu\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(read_status(&mut s).await, "HTTP/1.1 202 Accepted");
    let got = done(&mut seen).await;
    assert_eq!(got.path, "/2018-06-01/runtime/invocation/req-1/response");
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
}

#[tokio::test]
async fn init_errors_pass_through_unchanged() {
    let (up, mut seen) = upstream().await;
    let port = proxy(&up).await;
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
    let got = done(&mut seen).await;
    assert_eq!(got.path, "/2018-06-01/runtime/init/error");
    assert_eq!(got.body, Bytes::from_static(body));
    assert_eq!(
        got.headers["lambda-runtime-function-error-type"],
        "Init.Failed"
    );
}

const INIT_ERROR: &[u8] =
    b"POST /2018-06-01/runtime/init/error HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let (up, _seen) = upstream().await;
    let port = proxy_with(
        &up,
        Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
    )
    .await;
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
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let (up, mut seen) = upstream().await;
    let port = proxy_with(
        &up,
        Limits {
            max_connections: 1,
            ..Limits::default()
        },
    )
    .await;
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
    assert!(seen.try_recv().is_err(), "forwarded beyond the cap");
    // The slot frees up: the waiting connection is served.
    drop(first);
    assert_eq!(read_status(&mut second).await, "HTTP/1.1 202 Accepted");
    assert_eq!(done(&mut seen).await.path, "/2018-06-01/runtime/init/error");
}
