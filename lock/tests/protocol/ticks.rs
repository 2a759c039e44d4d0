//! Once per tick and coalesce (issue 17): a tick that succeeded never runs again, one that failed
//! does, and the uncontended cycle with an ordered tick costs what it costs without one.

use std::time::Duration;

use flightlock::{Error, LockOptions, ReleaseOutcome, Tick, Wait};

use crate::common::*;

const T1: i64 = 1_795_514_400_000; // 2026-11-24T10:00:00Z
const T2: i64 = T1 + 60_000;
const T3: i64 = T1 + 120_000;
const T4: i64 = T1 + 180_000;

fn at(tick: i64) -> LockOptions {
    LockOptions {
        tick: Some(Tick::At(tick)),
        ..fast()
    }
}

fn id(id: &str) -> LockOptions {
    LockOptions {
        tick: Some(Tick::Id(id.into())),
        ..fast()
    }
}

fn is_done(e: &Error) -> bool {
    matches!(e, Error::TickDone { .. })
}

/// The key holds no entry: no queue row, and no seat on the counter.
async fn nothing_held(env: &Env, key: &str) {
    assert!(
        env.queue(key).await.is_empty(),
        "{:?}",
        env.queue(key).await
    );
    for item in env.items(key).await {
        assert!(!item.contains_key("owner"), "an entry is left: {item:?}");
    }
}

#[tokio::test]
async fn a_duplicate_after_a_success_is_done_and_leaves_nothing() {
    bounded(async move {
        let env = Env::new("tickdup").await;
        let (a, b) = (env.locker().await, env.locker().await);
        let g = a.acquire("k", &at(T1)).await.unwrap();
        assert_eq!(g.release_done().await.unwrap(), ReleaseOutcome::Released);
        for locker in [&a, &b] {
            let err = locker.acquire("k", &at(T1)).await.unwrap_err();
            assert!(is_done(&err), "{err}");
            assert!(
                err.to_string().contains("2026-11-24T10:00:00.000Z"),
                "{err}"
            );
        }
        nothing_held(&env, "k").await;
        // Skipping callers (`wait = 0`) are answered the same way.
        let no_wait = LockOptions {
            wait: Wait::NoWait,
            ..at(T1)
        };
        assert!(is_done(&b.acquire("k", &no_wait).await.unwrap_err()));
        // The next tick runs.
        b.acquire("k", &at(T2))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        nothing_held(&env, "k").await;
    })
    .await;
}

#[tokio::test]
async fn a_failed_run_is_not_marked_and_runs_again() {
    bounded(async move {
        let env = Env::new("tickfail").await;
        let locker = env.locker().await;
        let g = locker.acquire("k", &at(T1)).await.unwrap();
        g.release().await.unwrap(); // the run failed
        let g = locker.acquire("k", &at(T1)).await.unwrap(); // the retry runs
        g.release_done().await.unwrap();
        assert!(is_done(&locker.acquire("k", &at(T1)).await.unwrap_err()));
        // A dropped guard (a crash) marks nothing either.
        drop(locker.acquire("k", &at(T2)).await.unwrap());
        locker.flush().await;
        locker
            .acquire("k", &at(T2))
            .await
            .unwrap()
            .release_done()
            .await
            .unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_duplicate_waiting_while_the_first_runs_is_done_after_it() {
    bounded(async move {
        let env = Env::new("tickwait").await;
        let first = env.locker().await.acquire("k", &at(T1)).await.unwrap();
        // A duplicate that skips is busy while the first runs (nothing is done yet).
        let skip = LockOptions {
            wait: Wait::NoWait,
            ..at(T1)
        };
        assert!(env
            .locker()
            .await
            .acquire("k", &skip)
            .await
            .unwrap_err()
            .is_busy());
        let dup = env.locker().await;
        let waiter =
            tokio::spawn(async move { dup.acquire("k", &at(T1)).await.map(|g| g.token()) });
        until_queue_len(&env, "k", 2).await;
        first.release_done().await.unwrap();
        let err = env
            .within(
                "k",
                Duration::from_secs(10),
                "the duplicate's answer",
                waiter,
            )
            .await
            .unwrap()
            .unwrap_err();
        assert!(is_done(&err), "{err}");
        nothing_held(&env, "k").await;
    })
    .await;
}

#[tokio::test]
async fn a_queue_row_marks_its_tick_too() {
    bounded(async move {
        let env = Env::new("tickrow").await;
        let first = env.locker().await.acquire("k", &at(T1)).await.unwrap();
        let second = env.locker().await;
        let run = tokio::spawn(async move {
            let g = second.acquire("k", &at(T2)).await.unwrap();
            g.release_done().await.unwrap()
        });
        until_queue_len(&env, "k", 2).await;
        first.release().await.unwrap(); // T1 failed
        let released = env
            .within("k", Duration::from_secs(10), "T2's run", run)
            .await
            .unwrap();
        assert_eq!(released, ReleaseOutcome::Released); // T2 held a row, succeeded
        let locker = env.locker().await;
        assert!(is_done(&locker.acquire("k", &at(T2)).await.unwrap_err()));
        // T1 is below the watermark now: a schedule never runs backwards.
        assert!(is_done(&locker.acquire("k", &at(T1)).await.unwrap_err()));
        nothing_held(&env, "k").await;
    })
    .await;
}

#[tokio::test]
async fn an_older_tick_after_a_newer_success_is_done() {
    bounded(async move {
        let env = Env::new("tickold").await;
        let locker = env.locker().await;
        locker
            .acquire("k", &at(T2))
            .await
            .unwrap()
            .release_done()
            .await
            .unwrap();
        let err = locker.acquire("k", &at(T1)).await.unwrap_err();
        let Error::TickDone { done, .. } = &err else {
            panic!("expected done, got {err}")
        };
        assert_eq!(done, "2026-11-24T10:01:00.000Z");
        // From another process (no hint: its read answers), and after a newer tick, the same.
        let other = env.locker().await;
        assert!(is_done(&other.acquire("k", &at(T1)).await.unwrap_err()));
        other
            .acquire("k", &at(T3))
            .await
            .unwrap()
            .release_done()
            .await
            .unwrap();
        assert!(is_done(&locker.acquire("k", &at(T2)).await.unwrap_err()));
        other
            .acquire("k", &at(T4))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        nothing_held(&env, "k").await;
    })
    .await;
}

/// Requests per uncontended cycle (acquire + release), warm (the hint from the last release),
/// without a tick, with an ordered tick, and with a tick id.
#[tokio::test]
async fn an_ordered_tick_costs_no_request_on_the_uncontended_path() {
    bounded(async move {
        let env = Env::new("tickcost").await;
        let (locker, proxy) = env.proxied_locker().await;
        let long = |o: LockOptions| LockOptions {
            lease: Duration::from_secs(60),
            heartbeat: Some(Duration::from_secs(20)),
            ..o
        };
        // Warm up: the counter exists and the locker holds a hint.
        locker
            .acquire("k", &long(fast()))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let mut per_cycle = Vec::new();
        for (label, opts) in [
            ("no tick", long(fast())),
            ("ordered tick", long(at(T1))),
            ("next ordered tick", long(at(T2))),
            ("tick id", long(id("batch-1"))),
        ] {
            proxy.reset_counts();
            let g = locker.acquire("k", &opts).await.unwrap();
            g.release_done().await.unwrap();
            eprintln!(
                "requests per uncontended cycle, {label}: {} {:?}",
                proxy.total(),
                proxy.counts()
            );
            per_cycle.push(proxy.total());
        }
        assert_eq!(per_cycle[..3], [2, 2, 2], "{per_cycle:?}");
        // A tick id: one more read (after the grant) and one more write (the record).
        assert_eq!(per_cycle[3], 4, "{per_cycle:?}");
        // A duplicate ordered tick is answered by the seat take's refusal: one request.
        proxy.reset_counts();
        assert!(is_done(
            &locker.acquire("k", &long(at(T2))).await.unwrap_err()
        ));
        eprintln!(
            "requests for a duplicate (warm): {} {:?}",
            proxy.total(),
            proxy.counts()
        );
        assert!(proxy.total() <= 2, "{:?}", proxy.counts());
    })
    .await;
}

#[tokio::test]
async fn tick_ids_run_once_and_their_records_stay_out_of_the_queue() {
    bounded(async move {
        let env = Env::new("tickid").await;
        let (a, b) = (env.locker().await, env.locker().await);
        a.acquire("k", &id("batch-7"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap(); // failed
        a.acquire("k", &id("batch-7"))
            .await
            .unwrap()
            .release_done()
            .await
            .unwrap();
        let err = b.acquire("k", &id("batch-7")).await.unwrap_err();
        assert!(is_done(&err), "{err}");
        b.acquire("k", &id("batch-8"))
            .await
            .unwrap()
            .release_done()
            .await
            .unwrap();
        nothing_held(&env, "k").await;
        // The records are items of the partition, with a TTL, outside the queue's reads.
        let records: Vec<_> = env
            .items("k")
            .await
            .into_iter()
            .filter(|i| i["sk"].as_s().is_ok_and(|s| s.starts_with("tick#")))
            .collect();
        assert_eq!(records.len(), 2, "{records:?}");
        for r in &records {
            let ttl: i64 = r["expiresAt"].as_n().unwrap().parse().unwrap();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            assert!((ttl - now - 30 * 3600).abs() < 120, "ttl {ttl} now {now}");
        }
        // A waiter behind a holder reads the queue, never the records; and the sweeper leaves them.
        let summary = flightlock::Sweeper::new(env.client.clone(), &env.table)
            .sweep(&flightlock::SweepOptions::default())
            .await
            .unwrap();
        assert_eq!(summary.deleted, 0, "{summary:?}");
        assert_eq!(env.items("k").await.len(), 3); // the counter and two records
    })
    .await;
}

fn coalescing(tick: Option<i64>) -> LockOptions {
    LockOptions {
        tick: tick.map(Tick::At),
        coalesce: true,
        ..fast()
    }
}

/// An overrun: T1 still runs while T2, T3 and T4 arrive. Each newer tick replaces the waiting
/// one, which is answered `Superseded`; exactly one more run follows, for T4.
#[tokio::test]
async fn an_overrun_then_three_ticks_runs_once_more_for_the_newest() {
    bounded(async move {
        let env = Env::new("coalesce").await;
        let first = env
            .locker()
            .await
            .acquire("k", &coalescing(Some(T1)))
            .await
            .unwrap();
        let probe = Probe::default();
        let mut waiting: Option<tokio::task::JoinHandle<Result<(), Error>>> = None;
        let mut superseded = 0;
        for (i, tick) in [T2, T3, T4].into_iter().enumerate() {
            let locker = env.locker().await;
            let probe = probe.clone();
            let next = tokio::spawn(async move {
                let g = locker.acquire("k", &coalescing(Some(tick))).await?;
                probe.enter(&format!("T{}", i + 2), g.token());
                probe.leave();
                g.release_done().await.map(|_| ())
            });
            if let Some(older) = waiting.take() {
                // The older waiter sees the newer tick behind it and withdraws.
                let e = env
                    .within(
                        "k",
                        Duration::from_secs(10),
                        "the older waiter's withdrawal",
                        older,
                    )
                    .await
                    .unwrap()
                    .unwrap_err();
                assert!(matches!(e, Error::Superseded { .. }), "{e}");
                superseded += 1;
            }
            // The holder and one waiter: never more.
            until_queue_len(&env, "k", 2).await;
            waiting = Some(next);
        }
        assert_eq!(superseded, 2);
        first.release_done().await.unwrap();
        let last = waiting.unwrap();
        env.within("k", Duration::from_secs(10), "T4's run", last)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(probe.order(), ["T4"]);
        nothing_held(&env, "k").await;
        // A late T3 or T4 is done (T4 succeeded: the watermark covers both).
        let late = env.locker().await;
        for tick in [T3, T4] {
            let e = late
                .acquire("k", &coalescing(Some(tick)))
                .await
                .unwrap_err();
            assert!(matches!(e, Error::TickDone { .. }), "{e}");
        }
    })
    .await;
}

/// Coalescing without ticks: the later arrival replaces the earlier waiter.
#[tokio::test]
async fn coalescing_without_ticks_keeps_the_latest_arrival() {
    bounded(async move {
        let env = Env::new("coalesce0").await;
        let first = env
            .locker()
            .await
            .acquire("k", &coalescing(None))
            .await
            .unwrap();
        let early = env.locker().await;
        let early = tokio::spawn(async move { early.acquire("k", &coalescing(None)).await });
        until_queue_len(&env, "k", 2).await;
        let late = env.locker().await;
        let late = tokio::spawn(async move { late.acquire("k", &coalescing(None)).await });
        let e = env
            .within(
                "k",
                Duration::from_secs(10),
                "the early arrival's withdrawal",
                early,
            )
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, Error::Superseded { .. }), "{e}");
        assert_eq!(env.queue("k").await.len(), 2);
        first.release().await.unwrap();
        let g = env
            .within(
                "k",
                Duration::from_secs(10),
                "the late arrival's turn",
                late,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.token(), 3);
        g.release().await.unwrap();
        nothing_held(&env, "k").await;
    })
    .await;
}

/// A coalescing waiter behind a queue row (not the seat) reads the counter too.
#[tokio::test]
async fn a_coalescing_waiter_behind_a_queue_row_sees_a_newer_tick() {
    bounded(async move {
        let env = Env::new("coalescerow").await;
        let seat = env.locker().await.acquire("k", &fast()).await.unwrap();
        // A plain waiter, who will hold a row once the seat is released.
        let plain = env.locker().await;
        let plain = tokio::spawn(async move { plain.acquire("k", &fast()).await.unwrap() });
        until_queue_len(&env, "k", 2).await;
        seat.release().await.unwrap();
        let row_holder = env
            .within(
                "k",
                Duration::from_secs(10),
                "the plain waiter's turn",
                plain,
            )
            .await
            .unwrap();
        let older = env.locker().await;
        let older = tokio::spawn(async move { older.acquire("k", &coalescing(Some(T1))).await });
        until_queue_len(&env, "k", 2).await;
        let newer = env.locker().await;
        let newer = tokio::spawn(async move { newer.acquire("k", &coalescing(Some(T2))).await });
        let e = env
            .within(
                "k",
                Duration::from_secs(10),
                "the older waiter's withdrawal",
                older,
            )
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, Error::Superseded { .. }), "{e}");
        row_holder.release().await.unwrap();
        let newer = env
            .within(
                "k",
                Duration::from_secs(10),
                "the newer waiter's turn",
                newer,
            )
            .await
            .unwrap()
            .unwrap();
        newer.release_done().await.unwrap();
        nothing_held(&env, "k").await;
    })
    .await;
}

#[tokio::test]
async fn coalesce_needs_a_wait() {
    bounded(async move {
        let env = Env::new("coalescewait").await;
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..coalescing(Some(T1))
        };
        let e = env.locker().await.acquire("k", &opts).await.unwrap_err();
        assert!(e.to_string().contains("coalesc"), "{e}");
    })
    .await;
}
