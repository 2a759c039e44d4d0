//! Fail closed: an event from the Runtime API is either handed to the runtime with its lock held
//! or answered upstream as failed; never passed on ungated, never lost. The Runtime API is the
//! platform double, with delivery faults where Lambda's answer must break (no request id, a
//! truncated body) and the runtime hanging up while its event is fetched. Needs DynamoDB Local
//! (`scripts/dynamodb-local run --`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flightlock::{ClockSkew, Locker};
use flightlock_testkit::platform::{NextFault, Outcome, Platform};
use serde_json::json;
use support::{LIMIT, NEXT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 message (head and Content-Length body) from `s`.
async fn read_message(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    (head, body)
}

/// A proxy in front of `platform`, locking `key` in a fresh table on DynamoDB Local.
async fn proxy(platform: &Platform, key: &str) -> (u16, Locker) {
    let (table, client) = support::table("failclosed").await;
    let vars = [("FLIGHTLOCK_KEY", key)];
    let (port, _) = support::start_proxy(platform, &table, client.clone(), &vars, "test").await;
    (port, Locker::new(client, &table))
}

/// The runtime's `GET next` on a new connection.
async fn get_next(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(format!("GET {NEXT} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s
}

async fn answer_of(s: &mut TcpStream) -> (String, Vec<u8>) {
    tokio::time::timeout(Duration::from_secs(10), read_message(s))
        .await
        .expect("the proxy answered the runtime's GET next")
}

async fn holder_request_id(locker: &Locker, key: &str) -> Option<String> {
    locker
        .holder(key, ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap()
        .and_then(|h| h.info.request_id)
}

#[tokio::test]
async fn an_event_without_a_request_id_never_reaches_the_runtime() {
    let platform = support::standard().await;
    platform.invoke_with_fault(json!({"secret": "payload-42"}), NextFault::NoRequestId);
    let (port, _) = proxy(&platform, "k-noid").await;
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("payload-42"), "{got}");
    assert!(got.contains("request-id"), "{got}");
}

#[tokio::test]
async fn an_unreadable_event_is_failed_upstream_and_the_next_one_is_gated() {
    let platform = support::standard().await;
    // Promises the whole payload, sends half of it, hangs up.
    let bad =
        platform.invoke_with_fault(json!({"partial": "x".repeat(64)}), NextFault::TruncatedBody);
    let good = platform.invoke(json!({"ok": 1}));
    let (port, locker) = proxy(&platform, "k-bad").await;
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(&good), "{head}");
    assert_eq!(got, br#"{"ok":1}"#);
    match platform.outcome(&bad, LIMIT).await {
        Some(Outcome::Error(_, body)) => {
            let body = String::from_utf8_lossy(&body);
            assert!(body.contains("FlightlockEventError"), "{body}");
        }
        other => panic!("the unreadable event was not failed upstream: {other:?}"),
    }
    assert_eq!(holder_request_id(&locker, "k-bad").await, Some(good));
}

#[tokio::test]
async fn a_runtime_that_hangs_up_while_its_event_is_fetched_gets_it_locked_on_its_next_request() {
    let platform = support::standard().await;
    let (port, locker) = proxy(&platform, "k-gone").await;
    let first = get_next(port).await;
    assert!(
        platform.wait_runtimes_waiting(1, LIMIT).await,
        "the proxy did not ask Lambda for the event"
    );
    // The runtime hangs up while the proxy's fetch is in flight; then Lambda delivers.
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let id = platform.invoke(json!({"n": 1}));
    // The event is gated (locked) although nobody is waiting for it...
    let mut held = None;
    for _ in 0..500 {
        held = holder_request_id(&locker, "k-gone").await;
        if held.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held.as_ref(), Some(&id));
    // ...and the runtime's next request gets it, without a second fetch upstream.
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.contains(&id), "{head}");
    assert_eq!(got, br#"{"n":1}"#);
    assert_eq!(platform.runtime_nexts(), 1);
    // Finished as usual: the response goes upstream and the key is free again.
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        format!(
            "POST /2018-06-01/runtime/invocation/{id}/response HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (head, _) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");
    assert_eq!(
        platform.outcome(&id, LIMIT).await,
        Some(Outcome::Response("ok".into()))
    );
    assert_eq!(holder_request_id(&locker, "k-gone").await, None);
}
