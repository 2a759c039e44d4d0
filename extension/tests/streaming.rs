//! Response streaming: a 200 MB streamed response (`Lambda-Runtime-Function-Response-Mode:
//! streaming`, chunked, the largest Lambda streams) that lasts several leases keeps its lock
//! the whole time, heartbeat included, and the lock is released once the stream has ended, not
//! while the proxy is still passing it on (the platform double reads the stream as it arrives and
//! answers after its end). A stream the runtime breaks off also releases. The body is generated
//! and counted, never buffered. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightlock::{ClockSkew, LockOptions, Locker, Wait};
use flightlock_testkit::platform::{Platform, KEEP};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use support::{get, LIMIT, NEXT};
use tokio::net::TcpStream;

/// Chunks of the stream, and their size: 100 x 2 MB = 200 MB.
const CHUNKS: u64 = 100;
const CHUNK: usize = 2_000_000;
/// The lease; the stream is paced to last about five of them.
const LEASE_MS: u64 = 1000;
const PACE: Duration = Duration::from_millis(LEASE_MS * 5 / CHUNKS);

/// Posts a streamed response for `id` through the proxy: `chunks` chunks, paced, then the end
/// (or, with `break_off`, the connection is dropped instead). Sets `sent` after the last chunk.
async fn stream(port: u16, id: String, chunks: u64, break_off: bool, sent: Arc<AtomicBool>) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let chunk = Bytes::from(vec![b'x'; CHUNK]);
    let done = sent.clone();
    let body = StreamBody::new(futures::stream::unfold(0u64, move |i| {
        let (chunk, sent) = (chunk.clone(), done.clone());
        async move {
            if i == chunks {
                sent.store(true, Ordering::SeqCst);
                if break_off {
                    // Never ends: the connection is dropped below.
                    std::future::pending::<()>().await;
                }
                return None;
            }
            tokio::time::sleep(PACE).await;
            Some((Ok::<_, Infallible>(Frame::data(chunk)), i + 1))
        }
    }));
    let req = http::Request::post(format!("/2018-06-01/runtime/invocation/{id}/response"))
        .header("host", "127.0.0.1")
        .header("lambda-runtime-function-response-mode", "streaming")
        .header("transfer-encoding", "chunked")
        .header(
            "trailer",
            "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body",
        )
        .body(body)
        .unwrap();
    let sending = tokio::spawn(async move { sender.send_request(req).await });
    if break_off {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !sent.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sending.abort();
        conn.abort();
        return;
    }
    let resp = tokio::time::timeout(Duration::from_secs(120), sending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let _ = resp.into_body().collect().await;
}

async fn setup(prefix: &str) -> (Platform, u16, Locker) {
    let (table, client) = support::table(prefix).await;
    let platform = support::standard().await;
    let vars = [
        ("FLIGHTLOCK_KEY", "stream"),
        ("FLIGHTLOCK_LEASE", "1s"),
        ("FLIGHTLOCK_HEARTBEAT", "250ms"),
        ("FLIGHTLOCK_CLOCK_SKEW", "100ms"),
    ];
    let (port, _) = support::start_proxy(&platform, &table, client.clone(), &vars, "h").await;
    (platform, port, Locker::new(client, &table))
}

/// Polls until nobody holds `stream` (bounded); true if released.
async fn released(locker: &Locker) -> bool {
    for _ in 0..200 {
        let h = locker
            .holder("stream", ClockSkew::Bounded(Duration::from_millis(100)))
            .await
            .unwrap();
        if h.is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_stream_keeps_its_lock_until_it_ends() {
    let (platform, port, locker) = setup("stream").await;
    let id = platform.invoke(serde_json::json!({}));
    assert_eq!(get(port, NEXT).await.request_id.as_ref(), Some(&id));

    let sent = Arc::new(AtomicBool::new(false));
    let streaming = tokio::spawn(stream(port, id.clone(), CHUNKS, false, sent.clone()));
    // The stream reaches Lambda while it runs.
    let first = platform.first_chunk(&id, LIMIT).await;
    assert!(first.is_some_and(|c| c.iter().all(|b| *b == b'x')));

    // Another environment tries the key, about four times a lease, while the stream runs.
    let no_wait = LockOptions {
        wait: Wait::NoWait,
        lease: Duration::from_millis(LEASE_MS),
        clock_skew: ClockSkew::Bounded(Duration::from_millis(100)),
        ..LockOptions::default()
    };
    let mut tries = 0u32;
    while !sent.load(Ordering::SeqCst) {
        match locker.acquire("stream", &no_wait).await {
            Err(e) if e.is_busy() => {}
            Err(e) => panic!("{e}"),
            Ok(g) => {
                let stolen = !sent.load(Ordering::SeqCst);
                g.release().await.unwrap();
                assert!(
                    !stolen,
                    "taken while the stream was still running, try {tries}"
                );
            }
        }
        let queue = locker
            .queue("stream", ClockSkew::Bounded(Duration::from_millis(100)))
            .await
            .unwrap();
        if !sent.load(Ordering::SeqCst) {
            let held = queue.first().expect("the streaming invocation's row");
            assert_eq!(held.holder.request_id.as_ref(), Some(&id));
            assert!(held.lease_left_ms > 0, "lease lapsed: {held:?}");
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(LEASE_MS / 4)).await;
    }
    // The stream outlived several leases (its pace sets it to about five).
    assert!(
        tries >= 8,
        "only {tries} tries: the stream was too short to test the heartbeat"
    );

    tokio::time::timeout(Duration::from_secs(120), streaming)
        .await
        .unwrap()
        .unwrap();
    let answer = platform.answer(&id, LIMIT).await.expect("the stream's end");
    assert!(answer.complete);
    assert_eq!(answer.len, CHUNKS * CHUNK as u64);
    assert_eq!(answer.body.len(), KEEP, "kept: its first bytes");
    assert!(
        released(&locker).await,
        "not released after the stream ended"
    );
}

#[tokio::test]
async fn a_stream_the_runtime_breaks_off_releases_the_lock() {
    let (platform, port, locker) = setup("streambreak").await;
    let id = platform.invoke(serde_json::json!({}));
    assert_eq!(get(port, NEXT).await.request_id.as_ref(), Some(&id));
    let sent = Arc::new(AtomicBool::new(false));
    stream(port, id.clone(), 3, true, sent).await;
    let answer = platform
        .answer(&id, LIMIT)
        .await
        .expect("the broken stream");
    assert!(
        !answer.complete,
        "the broken stream reached Lambda as complete"
    );
    assert!(
        released(&locker).await,
        "not released after the stream broke off"
    );
}
