//! No hot loop: a waiter and a holder send requests on their key no faster than their pacing
//! allows (PROTOCOL.md, "Pacing"), counted by the DynamoDB proxy while a holder holds.

use std::time::Duration;

use flightlock::{Error, LockOptions, Wait};

use crate::common::*;

/// The shortest pause between two looks (`liveness::MIN_POLL`), less its jitter.
const FLOOR: Duration = Duration::from_micros(4_500);

/// How long the holder holds in these tests.
const HOLD: Duration = Duration::from_secs(2);

/// The looks the pace allows a waiter next in line over `held`, with poll `poll` (PROTOCOL.md,
/// "Pacing"): the pauses shrink towards the holder's due time by a quarter at a time (less
/// jitter: at least `1 - 0.9/4` of the distance each look, down to the floor), grow past it by
/// a quarter of the time past due (at least `1 + 0.9/4` each), and are never longer than
/// `poll` nor shorter than the floor; at `poll` they come at least `0.9 · poll` apart. A few
/// more for the first looks and the last.
fn looks_allowed(held: Duration, poll: Duration) -> u64 {
    let span = (poll.as_secs_f64() / FLOOR.as_secs_f64()).max(1.0);
    let towards = span.ln() / (1.0f64 / (1.0 - 0.9 / 4.0)).ln();
    let past = span.ln() / (1.0f64 + 0.9 / 4.0).ln();
    let steady = held.as_secs_f64() / (0.9 * poll.as_secs_f64());
    (towards + past + steady).ceil() as u64 + 4
}

fn opts(wait: Wait) -> LockOptions {
    LockOptions {
        wait,
        poll: Duration::from_millis(100),
        max_poll: Duration::from_millis(200),
        ..fast()
    }
}

/// A forever waiter next in line looks about as often as its pace allows while the holder holds
/// two seconds, and the holder heartbeats once per interval.
#[tokio::test]
async fn a_waiter_and_a_holder_keep_their_pace() {
    bounded(async move {
        let env = Env::new("pacing").await;
        let (holding, holder_proxy) = env.proxied_locker().await;
        let holder = holding.acquire("k", &opts(Wait::Forever)).await.unwrap();
        let (waiting, proxy) = env.proxied_locker().await;
        let waiter = tokio::spawn(async move {
            let g = waiting.acquire("k", &opts(Wait::Forever)).await;
            (g, waiting)
        });
        until_queue_len(&env, "k", 2).await;
        proxy.reset_counts();
        holder_proxy.reset_counts();
        tokio::time::sleep(HOLD).await;
        let looks = proxy.count("Query");
        let others = proxy.total() - looks;
        let beats = holder_proxy.count("UpdateItem");
        holder.release().await.unwrap();
        let (granted, _waiting) = env
            .within("k", Duration::from_secs(10), "the waiter's turn", waiter)
            .await
            .unwrap();
        granted.unwrap().release().await.unwrap();

        let allowed = looks_allowed(HOLD, opts(Wait::Forever).poll);
        let interval = fast().heartbeat.unwrap();
        let beats_allowed = (HOLD.as_millis() / interval.as_millis()) as u64 + 1;
        eprintln!(
        "pacing: the waiter looked {looks} times in {HOLD:?} (its pace allows {allowed}), sent \
         {others} other requests; the holder sent {beats} heartbeats (allowed {beats_allowed})"
    );
        assert!(
            looks <= allowed,
            "hot loop: the waiter looked {looks} times while the holder held {HOLD:?}; its pace \
         allows {allowed} ({:?})",
            proxy.counts()
        );
        // The waiter's own heartbeats (one per interval) are its only other requests.
        assert!(
            others <= beats_allowed,
            "the waiter sent {others} requests besides its looks: {:?}",
            proxy.counts()
        );
        assert!(
            beats <= beats_allowed,
            "the holder heartbeat {beats} times in {HOLD:?}, interval {interval:?}: {:?}",
            holder_proxy.counts()
        );
    })
    .await;
}

/// A `wait = 500 ms` waiter behind a two-second hold gives up at its deadline: it looks as its
/// pace allows until then, at most once more, and removes its row. A wait that never gives up
/// looks on after its deadline, without a pause (its pause is cut at the deadline), until the
/// holder leaves.
#[tokio::test]
async fn a_waiter_past_its_deadline_stops_looking() {
    bounded(async move {
        let env = Env::new("pacingd").await;
        let holder = env
            .locker()
            .await
            .acquire("k", &opts(Wait::Forever))
            .await
            .unwrap();
        let (waiting, proxy) = env.proxied_locker().await;
        let wait = Duration::from_millis(500);
        let release = tokio::spawn(async move {
            tokio::time::sleep(HOLD).await;
            holder.release().await.unwrap();
        });
        let outcome = waiting.acquire("k", &opts(Wait::For(wait))).await;
        release.await.unwrap();
        let counts = proxy.counts();
        let queries = proxy.count("Query");
        match outcome {
            Err(Error::Busy { .. }) => {}
            Ok(g) => {
                g.release().await.unwrap();
                panic!("a wait of {wait:?} outlasted a hold of {HOLD:?}: granted ({counts:?})");
            }
            Err(e) => panic!("{e}"),
        }
        // The enqueue's read, the looks of the wait, one look at the deadline.
        let allowed = 1 + looks_allowed(wait, opts(Wait::Forever).poll) + 1;
        eprintln!("pacing: a {wait:?} wait made {queries} reads (allowed {allowed}): {counts:?}");
        assert!(
        queries <= allowed,
        "hot loop: a {wait:?} wait made {queries} reads; its pace allows {allowed} ({counts:?})"
    );
        // Its row's removal: one DeleteItem.
        assert_eq!(
            proxy.count("DeleteItem"),
            1,
            "the waiter did not leave once: {counts:?}"
        );
    })
    .await;
}
