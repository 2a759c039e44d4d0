//! Clock skew. The property checked is the one that matters: a holder that stops heartbeating
//! (here: its DynamoDB becomes unreachable) learns it has lost the lock *before* a waiter whose
//! wall clock is off is granted the key.

use std::sync::Arc;
use std::time::Duration;

use flightlock::{ClockSkew, LockOptions, SkewedClock};
use flightlock_testkit::{Fault, Rule};
use tokio::time::Instant;

use crate::common::*;

/// A holds, then loses DynamoDB; B (wall clock off by `offset_ms`, mode `skew`) waits.
/// Returns (when A's lost signal fired, when B was granted).
async fn race(name: &str, offset_ms: i64, skew: ClockSkew) -> (Instant, Instant) {
    let env = Env::new(name).await;
    let (a, proxy) = env.proxied_locker().await;
    let ga = a.acquire("k", &fast()).await.unwrap();
    let b = env
        .locker()
        .await
        .with_clock(Arc::new(SkewedClock { offset_ms }));
    // Lagging clocks write expiresAt in the past unless the TTL grace covers the lag; DynamoDB
    // Local's real TTL would then delete rows mid-test.
    let opts = LockOptions {
        clock_skew: skew,
        ttl_grace: Duration::from_secs(3 * 3600),
        ..fast()
    };
    let waiter = tokio::spawn(async move {
        let g = b.acquire("k", &opts).await.unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    until_queue_len(&env, "k", 2).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.add_rule(Rule::new(Fault::ServerError)); // A can no longer reach DynamoDB
    let lost = tokio::time::timeout(Duration::from_secs(10), async {
        ga.lost().await;
        Instant::now()
    });
    let granted = within(
        Duration::from_secs(15),
        "B's takeover from A, cut off",
        waiter,
    );
    let (lost_at, granted_at) = tokio::join!(lost, granted);
    (
        lost_at.expect("A never learnt it lost the lock"),
        granted_at.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_within_the_allowance_is_safe_in_the_default_mode() {
    bounded(async move {
        for offset in [250, -250] {
            let (lost_at, granted_at) = race(
                "skewin",
                offset,
                ClockSkew::Bounded(Duration::from_millis(300)),
            )
            .await;
            assert!(
                lost_at <= granted_at,
                "offset {offset} ms: B was granted {:?} before A knew it lost",
                lost_at - granted_at
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_free_mode_is_safe_with_any_skew() {
    bounded(async move {
        for offset in [3_600_000, -3_600_000] {
            let (lost_at, granted_at) = race("skewfree", offset, ClockSkew::Unbounded).await;
            assert!(
                lost_at <= granted_at,
                "offset {offset} ms: B was granted {:?} before A knew it lost",
                lost_at - granted_at
            );
        }
    })
    .await;
}

/// The limit, shown: beyond the allowance the default mode is *not* safe. This is the control
/// that proves the two tests above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skew_beyond_the_allowance_breaks_the_default_mode() {
    bounded(async move {
        let (lost_at, granted_at) = race(
            "skewout",
            1_500,
            ClockSkew::Bounded(Duration::from_millis(300)),
        )
        .await;
        assert!(
            granted_at < lost_at,
            "expected the skewed waiter to take over early"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_free_waiter_never_takes_over_from_a_live_holder() {
    bounded(async move {
        let env = Env::new("freelive").await;
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        let b = env.locker().await.with_clock(Arc::new(SkewedClock {
            offset_ms: 3_600_000,
        }));
        let opts = LockOptions {
            clock_skew: ClockSkew::Unbounded,
            ..fast()
        };
        let waiter = tokio::spawn(async move {
            b.acquire("k", &opts)
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        });
        tokio::time::sleep(fast().lease * 3).await;
        assert!(!waiter.is_finished(), "took over from a live holder");
        assert!(!holder.is_lost());
        holder.release().await.unwrap();
        env.within("k", Duration::from_secs(10), "the waiter's turn", waiter)
            .await
            .unwrap();
    })
    .await;
}
