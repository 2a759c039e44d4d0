//! Guarantee 3: bounded waits, leaving no row behind.

use std::time::{Duration, Instant};

use flightlock::{Error, LockOptions, Wait};

use crate::common::*;

#[tokio::test]
async fn wait_zero_on_a_held_key_fails_in_at_most_two_requests_and_leaves_nothing() {
    bounded(async move {
        let env = Env::new("wait0").await;
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        let (locker, proxy) = env.proxied_locker().await;
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..fast()
        };
        let err = locker.acquire("k", &opts).await.unwrap_err();
        let Error::Busy { holders, .. } = &err else {
            panic!("expected busy with a holder, got {err}")
        };
        let [h] = holders.as_slice() else {
            panic!("expected exactly one holder, got {err}")
        };
        assert_eq!(h.ticket, holder.token());
        assert!(
            err.to_string().contains(&holder.owner().to_string()),
            "{err}"
        );
        assert!(proxy.total() <= 2, "skip took {:?}", proxy.counts());
        assert_eq!(env.queue("k").await.len(), 1, "the skipper left a row");

        // With a stale hint (we used the key before others did), still at most 2.
        holder.release().await.unwrap();
        locker
            .acquire("k", &fast())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let other = env.locker().await;
        other
            .acquire("k", &fast())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let holder = other.acquire("k", &fast()).await.unwrap();
        proxy.reset_counts();
        assert!(locker.acquire("k", &opts).await.unwrap_err().is_busy());
        assert!(
            proxy.total() <= 2,
            "skip with a stale hint took {:?}",
            proxy.counts()
        );
        assert_eq!(env.queue("k").await.len(), 1);
        holder.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn wait_zero_on_a_free_key_acquires() {
    bounded(async move {
        let env = Env::new("wait0free").await;
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..fast()
        };
        let g = env.locker().await.acquire("k", &opts).await.unwrap();
        assert_eq!(g.token(), 1);
        g.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_bounded_wait_gives_up_after_about_its_duration_and_removes_its_row() {
    bounded(async move {
        let env = Env::new("waitd").await;
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        let opts = LockOptions {
            wait: Wait::For(Duration::from_millis(700)),
            ..fast()
        };
        let started = Instant::now();
        let err = env.locker().await.acquire("k", &opts).await.unwrap_err();
        let waited = started.elapsed();
        assert!(err.is_busy(), "{err}");
        assert!(
            waited >= Duration::from_millis(700),
            "gave up early: {waited:?}"
        );
        assert!(
            waited < Duration::from_secs(10),
            "gave up far too late: {waited:?}"
        );
        let q = env.queue("k").await;
        assert_eq!(q.len(), 1, "the waiter left its row: {q:?}");
        assert_eq!(q[0].ticket, holder.token());
        holder.release().await.unwrap();
        // The waiter's abandoned ticket does not disturb the next acquisition.
        let g = env.locker().await.acquire("k", &fast()).await.unwrap();
        assert_eq!(g.token(), 3);
        g.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_acquire_leaves_the_queue() {
    bounded(async move {
        let env = Env::new("cancel").await;
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        let locker = env.locker().await;
        let attempt =
            tokio::time::timeout(Duration::from_millis(400), locker.acquire("k", &fast())).await;
        assert!(attempt.is_err(), "should still be waiting");
        locker.flush().await;
        assert_eq!(env.queue("k").await.len(), 1);
        holder.release().await.unwrap();
    })
    .await;
}
