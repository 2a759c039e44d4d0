//! Fail closed: an event from the Runtime API is either handed to the runtime with its lock held
//! or answered upstream as failed; never passed on ungated, never lost. The upstream here is a
//! scripted raw-TCP fake, so it can misbehave (no request id, a truncated body, an answer that
//! comes after the runtime hung up). Needs DynamoDB Local (`scripts/dynamodb-local run --`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flightlock::lambda::config::Config;
use flightlock::lambda::gate::Gate;
use flightlock::{ClockSkew, Locker};
use flightlock_extension::invocations::Invocations;
use flightlock_extension::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

const NEXT: &str = "/2018-06-01/runtime/invocation/next";

/// What the fake answers to one `GET next`.
enum Reply {
    Now(Vec<u8>),
    After(Arc<Notify>, Vec<u8>),
}

struct Fake {
    addr: String,
    nexts: Arc<AtomicUsize>,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    posts: mpsc::UnboundedReceiver<(String, String)>,
}

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

async fn fake() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let nexts = Arc::new(AtomicUsize::new(0));
    let replies: Arc<Mutex<VecDeque<Reply>>> = Arc::default();
    let (tx, posts) = mpsc::unbounded_channel();
    let (n, r) = (nexts.clone(), replies.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (n, r, tx) = (n.clone(), r.clone(), tx.clone());
            tokio::spawn(async move {
                let (head, body) = read_message(&mut s).await;
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                if path == NEXT {
                    n.fetch_add(1, Ordering::SeqCst);
                    let reply = r.lock().unwrap().pop_front();
                    let bytes = match reply {
                        Some(Reply::Now(b)) => b,
                        Some(Reply::After(go, b)) => {
                            go.notified().await;
                            b
                        }
                        // A long poll with nothing to deliver.
                        None => std::future::pending().await,
                    };
                    let _ = s.write_all(&bytes).await;
                } else {
                    tx.send((path, String::from_utf8_lossy(&body).into_owned()))
                        .unwrap();
                    let _ = s
                        .write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                        .await;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    Fake {
        addr,
        nexts,
        replies,
        posts,
    }
}

fn deadline_ms() -> u128 {
    (SystemTime::now() + Duration::from_secs(60))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A complete event answer.
fn event(id: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nLambda-Runtime-Aws-Request-Id: {id}\r\nLambda-Runtime-Deadline-Ms: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        deadline_ms(),
        body.len()
    )
    .into_bytes()
}

/// A proxy in front of `upstream`, locking `key` in a fresh table on DynamoDB Local.
async fn proxy(upstream: &str, key: &str) -> (u16, Locker) {
    let flightlock_testkit::FreshTable { client, table, .. } =
        flightlock_testkit::fresh_table("failclosed").await;
    let env = [
        ("FLIGHTLOCK_TABLE", table.as_str()),
        ("FLIGHTLOCK_KEY", key),
        ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        // No EMF lines on the test output.
        ("FLIGHTLOCK_METRICS", "off"),
        ("AWS_LAMBDA_RUNTIME_API", upstream),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = Arc::new(Config::from_map(&env).unwrap());
    let gate = Gate::new(
        config,
        Locker::new(client.clone(), &table),
        "test".to_owned(),
    );
    let proxy = Arc::new(Proxy::new(
        gate,
        Arc::new(Invocations::default()),
        upstream.to_owned(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(proxy.serve(listener));
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

async fn post_seen(fake: &mut Fake) -> (String, String) {
    tokio::time::timeout(Duration::from_secs(10), fake.posts.recv())
        .await
        .expect("the proxy posted upstream")
        .unwrap()
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
    let fake = fake().await;
    let body = r#"{"secret":"payload-42"}"#;
    fake.replies.lock().unwrap().push_back(Reply::Now(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    ));
    let (port, _) = proxy(&fake.addr, "k-noid").await;
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("payload-42"), "{got}");
    assert!(got.contains("request-id"), "{got}");
}

#[tokio::test]
async fn an_unreadable_event_is_failed_upstream_and_the_next_one_is_gated() {
    let mut fake = fake().await;
    // Promises 200 bytes, sends a few, hangs up.
    let truncated = format!(
        "HTTP/1.1 200 OK\r\nLambda-Runtime-Aws-Request-Id: r-bad\r\nLambda-Runtime-Deadline-Ms: {}\r\n\
         Content-Length: 200\r\nConnection: close\r\n\r\n{{\"partial\":",
        deadline_ms()
    );
    fake.replies
        .lock()
        .unwrap()
        .push_back(Reply::Now(truncated.into_bytes()));
    fake.replies
        .lock()
        .unwrap()
        .push_back(Reply::Now(event("r-good", r#"{"ok":1}"#)));
    let (port, locker) = proxy(&fake.addr, "k-bad").await;
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("r-good"), "{head}");
    assert_eq!(got, br#"{"ok":1}"#);
    let (path, body) = post_seen(&mut fake).await;
    assert_eq!(path, "/2018-06-01/runtime/invocation/r-bad/error");
    assert!(body.contains("FlightlockEventError"), "{body}");
    assert_eq!(
        holder_request_id(&locker, "k-bad").await.as_deref(),
        Some("r-good")
    );
}

#[tokio::test]
async fn a_runtime_that_hangs_up_while_its_event_is_fetched_gets_it_locked_on_its_next_request() {
    let mut fake = fake().await;
    let go = Arc::new(Notify::new());
    fake.replies
        .lock()
        .unwrap()
        .push_back(Reply::After(go.clone(), event("r-1", r#"{"n":1}"#)));
    let (port, locker) = proxy(&fake.addr, "k-gone").await;
    let first = get_next(port).await;
    while fake.nexts.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The runtime hangs up while the proxy's fetch is in flight; then Lambda delivers.
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    go.notify_one();
    // The event is gated (locked) although nobody is waiting for it...
    let mut held = None;
    for _ in 0..500 {
        held = holder_request_id(&locker, "k-gone").await;
        if held.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held.as_deref(), Some("r-1"));
    // ...and the runtime's next request gets it, without a second fetch upstream.
    let mut s = get_next(port).await;
    let (head, got) = answer_of(&mut s).await;
    assert!(head.contains("r-1"), "{head}");
    assert_eq!(got, br#"{"n":1}"#);
    assert_eq!(fake.nexts.load(Ordering::SeqCst), 1);
    // Finished as usual: the response goes upstream and the key is free again.
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        b"POST /2018-06-01/runtime/invocation/r-1/response HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok",
    )
    .await
    .unwrap();
    let (head, _) = answer_of(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");
    let (path, body) = post_seen(&mut fake).await;
    assert_eq!(
        (path.as_str(), body.as_str()),
        ("/2018-06-01/runtime/invocation/r-1/response", "ok")
    );
    assert_eq!(holder_request_id(&locker, "k-gone").await, None);
}
