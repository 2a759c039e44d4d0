//! SnapStart: a restore passing through the proxy renews what the snapshot froze. Before the
//! snapshot the extension has already talked to DynamoDB (the table check at init, and here one
//! lock cycle), so its client holds pooled connections. In a restored environment those sockets
//! belong to the snapshot's environment: here a TCP relay in front of DynamoDB Local plays that
//! by swallowing, from the restore on, everything sent on a connection opened before it. After
//! the runtime's `restore/next` has come back through the proxy, the first invocation must be
//! gated over new connections only (nothing sent on an old one), and its row must carry a new
//! host id. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightlock::{ClockSkew, LockOptions, Locker};
use flightlock_testkit::platform::{Mode, Options, Outcome, Platform};
use support::{get, LIMIT, NEXT, RESTORE_NEXT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP relay to DynamoDB Local. Connections opened before [`Relay::restore`] are dead after
/// it: what their client sends is counted and dropped, and nothing comes back.
struct Relay {
    endpoint: String,
    restored: Arc<AtomicBool>,
    /// Connections accepted before / after the restore.
    before: Arc<AtomicU64>,
    after: Arc<AtomicU64>,
    /// Bytes sent on pre-restore connections after the restore.
    sent_to_dead: Arc<AtomicU64>,
}

impl Relay {
    async fn start(upstream: &str) -> Relay {
        let target = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let relay = Relay {
            endpoint,
            restored: Arc::default(),
            before: Arc::default(),
            after: Arc::default(),
            sent_to_dead: Arc::default(),
        };
        let (restored, before, after, dead) = (
            relay.restored.clone(),
            relay.before.clone(),
            relay.after.clone(),
            relay.sent_to_dead.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let old = !restored.load(Ordering::SeqCst);
                if old { &before } else { &after }.fetch_add(1, Ordering::SeqCst);
                let server = TcpStream::connect(&target).await.unwrap();
                let (restored, dead) = (restored.clone(), dead.clone());
                tokio::spawn(pipe(client, server, old, restored, dead));
            }
        });
        relay
    }

    fn restore(&self) {
        self.restored.store(true, Ordering::SeqCst);
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    old: bool,
    restored: Arc<AtomicBool>,
    dead: Arc<AtomicU64>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let gone = restored.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if old && gone.load(Ordering::SeqCst) {
                continue;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if old && restored.load(Ordering::SeqCst) {
            // A socket of the snapshot's environment: the bytes go nowhere.
            dead.fetch_add(n as u64, Ordering::SeqCst);
            continue;
        }
        if sw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    down.abort();
}

#[tokio::test]
async fn a_restore_through_the_proxy_renews_connections_and_host_id() {
    let endpoint = flightlock_testkit::require_endpoint();
    let (table, direct) = support::table("snapstart").await;
    let relay = Relay::start(&endpoint).await;
    let client = flightlock_testkit::client(&relay.endpoint).await;
    let platform = Platform::start(Options::new(Mode::SnapStart)).await;
    let vars = [("FLIGHTLOCK_KEY", "snap")];
    let (port, proxy) =
        support::start_proxy(&platform, &table, client, &vars, "before-snapshot").await;

    // Init: the extension's client talks to DynamoDB before the snapshot.
    let guard = proxy
        .locker()
        .acquire("init", &LockOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(relay.before.load(Ordering::SeqCst) >= 1);

    // The runtime, init done, waits in restore/next; the snapshot is restored.
    let restoring = tokio::spawn(async move { get(port, RESTORE_NEXT).await });
    relay.restore();
    platform.restore();
    let restored = tokio::time::timeout(Duration::from_secs(30), restoring)
        .await
        .unwrap()
        .unwrap();
    assert!(restored.status.is_success(), "{restored:?}");

    // The first invocation after the restore is gated, over new connections only.
    let r1 = platform.invoke(serde_json::json!({}));
    let got = get(port, NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&r1));
    assert_eq!(
        relay.sent_to_dead.load(Ordering::SeqCst),
        0,
        "a request went out on a connection pooled before the snapshot"
    );
    assert!(relay.after.load(Ordering::SeqCst) >= 1);
    let holder = Locker::new(direct, &table)
        .holders("snap", ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap()
        .into_iter()
        .next()
        .expect("the first invocation holds the key");
    assert_eq!(holder.info.request_id.as_ref(), Some(&r1));
    let host = holder.info.host.unwrap_or_default();
    assert!(
        !host.is_empty() && host != "before-snapshot",
        "the host id was not renewed: {host:?}"
    );
    assert!(support::respond(port, &r1, "{}").await.is_success());
    assert_eq!(
        platform.outcome(&r1, LIMIT).await,
        Some(Outcome::Response("{}".into()))
    );
}

#[tokio::test]
async fn restore_next_on_a_standard_init_is_passed_through_unchanged() {
    let (table, client) = support::table("snapstd").await;
    let platform = support::standard().await;
    let (port, _) =
        support::start_proxy(&platform, &table, client, &[("FLIGHTLOCK_KEY", "std")], "h").await;
    let got = get(port, RESTORE_NEXT).await;
    assert_eq!(got.status, http::StatusCode::NOT_FOUND);
    // The platform's own refusal, passed through.
    let refused = platform.refusals();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].path, RESTORE_NEXT);
}
