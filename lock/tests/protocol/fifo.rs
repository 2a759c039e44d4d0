//! Guarantee 2: FIFO grants, and no barging by a holder that asks again.

use std::time::Duration;

use flightlock::{LockOptions, Wait};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grants_follow_enqueue_order() {
    bounded(async move {
        let env = Env::new("fifo").await;
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        let probe = Probe::default();
        let mut tasks = Vec::new();
        for i in 0..6 {
            let locker = env.locker().await;
            let probe = probe.clone();
            tasks.push(tokio::spawn(async move {
                let g = locker.acquire("k", &fast()).await.unwrap();
                probe.enter(&format!("w{i}"), g.token());
                tokio::time::sleep(Duration::from_millis(10)).await;
                probe.leave();
                g.release().await.unwrap();
            }));
            // Enqueue strictly one after another.
            until_queue_len(&env, "k", i + 2).await;
        }
        holder.release().await.unwrap();
        env.join_within("k", Duration::from_secs(30), "six waiters in turn", tasks)
            .await;
        assert_eq!(probe.order(), ["w0", "w1", "w2", "w3", "w4", "w5"]);
        assert_strictly_increasing(&probe.tokens());
        assert!(!probe.overlapped());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_that_asks_again_queues_at_the_back() {
    bounded(async move {
        let env = Env::new("barge").await;
        // The same locker is reused: it keeps a hint from its release, the fast path that must not
        // let it jump the queue.
        let x = env.locker().await;
        let first = x.acquire("k", &fast()).await.unwrap();
        let probe = Probe::default();
        let mut tasks = Vec::new();
        for i in 0..2 {
            let locker = env.locker().await;
            let probe = probe.clone();
            tasks.push(tokio::spawn(async move {
                let g = locker.acquire("k", &fast()).await.unwrap();
                probe.enter(&format!("w{i}"), g.token());
                probe.leave();
                g.release().await.unwrap();
            }));
            until_queue_len(&env, "k", i + 2).await;
        }
        first.release().await.unwrap();
        let again = env
            .within(
                "k",
                Duration::from_secs(10),
                "x's turn",
                x.acquire("k", &fast()),
            )
            .await
            .unwrap();
        probe.enter("x", again.token());
        probe.leave();
        again.release().await.unwrap();
        env.join_within("k", Duration::from_secs(10), "the two waiters", tasks)
            .await;
        assert_eq!(probe.order(), ["w0", "w1", "x"]);
    })
    .await;
}

#[tokio::test]
async fn uncontended_cycles_reuse_the_hint_and_tokens_keep_rising() {
    bounded(async move {
        let env = Env::new("hint").await;
        let (locker, proxy) = env.proxied_locker().await;
        // No heartbeat falls inside these short holds: every UpdateItem counted is a seat write.
        let opts = LockOptions {
            lease: Duration::from_secs(60),
            heartbeat: Some(Duration::from_secs(20)),
            ..fast()
        };
        let mut tokens = Vec::new();
        for _ in 0..5 {
            let g = locker.acquire("k", &opts).await.unwrap();
            tokens.push(g.token());
            g.release().await.unwrap();
        }
        assert_eq!(tokens, [1, 2, 3, 4, 5]);
        // First use of the key: Query, PutItem (the counter), Query, then the seat taken and
        // vacated (two UpdateItems of the counter); later cycles skip the reads: two single-item
        // writes a cycle, no transaction and no row.
        assert_eq!(proxy.count("Query"), 2, "{:?}", proxy.counts());
        assert_eq!(proxy.count("PutItem"), 1, "{:?}", proxy.counts());
        assert_eq!(proxy.count("UpdateItem"), 10, "{:?}", proxy.counts());
        assert_eq!(proxy.count("TransactWriteItems"), 0, "{:?}", proxy.counts());
        assert_eq!(proxy.count("DeleteItem"), 0, "{:?}", proxy.counts());
        // A hint gone stale (someone else used the key) costs a read, never a wrong grant.
        let other = env.locker().await;
        other
            .acquire("k", &fast())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let g = locker.acquire("k", &fast()).await.unwrap();
        assert_eq!(g.token(), 7);
        g.release().await.unwrap();
    })
    .await;
}

/// Waiters of one process behind one another look only when woken (a release, a dropped guard,
/// a waiter ahead giving up), with `max_poll` as a backstop. Here the backstop is an hour: a
/// lost wake-up would stall the test until its 60 s limit, not slow it down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_process_hands_over_by_waking_alone() {
    bounded(async move {
        let env = Env::new("local").await;
        // The holder is another process: its release wakes nobody here.
        let holder = env.locker().await.acquire("k", &steady()).await.unwrap();
        let shared = env.locker().await;
        let opts = LockOptions {
            max_poll: Duration::from_secs(3600),
            ..fast()
        };
        let probe = Probe::default();
        let mut tasks = Vec::new();
        for i in 0..4 {
            let locker = shared.clone();
            let probe = probe.clone();
            // w0 gives up while the key is still held: w1, asleep behind it, must be woken to look
            // past it; w2 drops its guard instead of releasing it: w3 must be woken all the same.
            let opts = if i == 0 {
                LockOptions {
                    wait: Wait::For(Duration::from_millis(1000)),
                    ..opts.clone()
                }
            } else {
                opts.clone()
            };
            tasks.push(tokio::spawn(async move {
                match locker.acquire("k", &opts).await {
                    Ok(g) => {
                        probe.enter(&format!("w{i}"), g.token());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        probe.leave();
                        if i == 2 {
                            drop(g);
                        } else {
                            g.release().await.unwrap();
                        }
                    }
                    Err(e) => assert!(i == 0 && e.is_busy(), "w{i}: {e}"),
                }
            }));
            until_queue_len(&env, "k", i + 2).await;
        }
        // Past the give-up of w0: its row is gone (the holder and w1–w3 are left).
        until_queue_len(&env, "k", 4).await;
        holder.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(60), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("a waiter of this process was never woken");
        assert_eq!(probe.order(), ["w1", "w2", "w3"]);
        assert!(!probe.overlapped());
    })
    .await;
}
