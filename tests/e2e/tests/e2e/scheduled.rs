//! End-to-end: scheduled jobs, once per tick (issue 17). EventBridge scheduled events delivered
//! to environments of one function through the layer (extension + wrapper, Python under
//! `awslambdaric`), on DynamoDB Local, with the guide's scheduled-job recipe
//! (`docs/src/recipes/scheduled.md`): the function name as the key, `FLIGHTLOCK_WAIT=0`, `skip`,
//! and `FLIGHTLOCK_TICK` left at its default `auto` (the tick is the event's `time`); the last test takes the EventBridge Scheduler recipe
//! (`FLIGHTLOCK_TICK={/tick}`) and an id tick instead. Runs are counted from what the handler itself records (the
//! record file), never from the extension's answers. No assertion depends on timing: a run that
//! must still be going is held by a file the test writes when it is done with it
//! (`holdFile`), and a waiter is known to wait when the table shows its row.

mod support;

use std::sync::Arc;
use std::time::Duration;

use flightlock::{Locker, QueueEntry};
use flightlock_e2e::{assert_no_overlap, record_file, runs, start_all, Env, Runtime, Spec};
use flightlock_testkit::fresh_table;
use serde_json::{json, Value};

use support::{
    assert_skipped, assert_skipped_tick, minute, ran, scheduled, setup, teardown, wait_queue,
    wait_runs, FUNCTION,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_after_the_run_finished_is_answered_duplicate_and_never_runs() {
    let (_fresh, record, envs) = setup("tick_dup", 2, &[]).await;
    let tick = scheduled(1, &minute(-5), json!({}));

    let first = envs[0].invoke(tick.clone()).await.json();
    assert_eq!(first["ok"], true, "{first}\n{}", envs[0].log());
    // The same delivery again, 2 s later as in the issue, to the other environment, then once
    // more to the one that ran it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for env in [&envs[1], &envs[0]] {
        let again = env.invoke(tick.clone()).await.json();
        assert_skipped(&again, "duplicate", &tick, env);
    }
    assert_eq!(ran(&record), vec![1], "{:#?}", runs(&record));
    assert!(
        envs[1]
            .wait_log("\"Duplicates\"", Duration::from_secs(5))
            .await,
        "no Duplicates metric:\n{}",
        envs[1].log()
    );

    // The next tick is a tick of its own: it runs.
    let next = envs[1].invoke(scheduled(2, &minute(-4), json!({}))).await;
    assert_eq!(next.json()["ok"], true, "{}", envs[1].log());
    assert_eq!(ran(&record), vec![1, 2]);
    teardown(envs, &record, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_while_the_run_goes_on_is_busy_and_after_it_a_duplicate() {
    let (_fresh, record, envs) = setup("tick_busy", 2, &[]).await;
    let hold = record_file("tick_busy_hold");
    let tick = scheduled(1, &minute(-5), json!({"holdFile": hold}));

    let (first, dup) = tokio::join!(envs[0].invoke(tick.clone()), async {
        wait_runs(&record, 1).await;
        // While the first delivery runs: the recipe's policy (wait 0, skip) answers busy,
        // naming the run that holds the key.
        let busy = envs[1].invoke(tick.clone()).await.json();
        std::fs::write(&hold, b"").unwrap();
        busy
    });
    assert_skipped(&dup, "busy", &tick, &envs[1]);
    let holder = &runs(&record)[0].request_id;
    assert_eq!(dup["flightlock"]["heldBy"]["requestId"], *holder, "{dup}");
    assert_eq!(first.json()["ok"], true, "{}", envs[0].log());

    // After it succeeded, the same delivery is a duplicate.
    let after = envs[1].invoke(tick.clone()).await.json();
    assert_skipped(&after, "duplicate", &tick, &envs[1]);
    assert_eq!(ran(&record), vec![1], "{:#?}", runs(&record));
    teardown(envs, &record, &[&hold]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_that_waited_for_the_run_is_answered_duplicate_when_it_succeeds() {
    // With a wait instead of the recipe's 0: the duplicate queues behind the run, and learns
    // at its grant that the tick is done.
    let (fresh, record, envs) = setup("tick_waited", 2, &[("FLIGHTLOCK_WAIT", "25s")]).await;
    let locker = Locker::new(fresh.client.clone(), &fresh.table);
    let hold = record_file("tick_waited_hold");
    let tick = scheduled(1, &minute(-5), json!({"holdFile": hold}));

    let (first, dup) = tokio::join!(envs[0].invoke(tick.clone()), async {
        wait_runs(&record, 1).await;
        let (dup, ()) = tokio::join!(envs[1].invoke(tick.clone()), async {
            wait_queue(&locker, "the duplicate did not queue", |q| q.len() == 2).await;
            std::fs::write(&hold, b"").unwrap();
        });
        dup.json()
    });
    assert_eq!(first.json()["ok"], true, "{}", envs[0].log());
    assert_skipped(&dup, "duplicate", &tick, &envs[1]);
    assert_eq!(ran(&record), vec![1], "{:#?}", runs(&record));
    // The duplicate took its row away: nothing is left queued on the key.
    wait_queue(
        &locker,
        "the duplicate's row was not removed",
        <[QueueEntry]>::is_empty,
    )
    .await;
    teardown(envs, &record, &[&hold]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_crashed_run_does_not_mark_its_tick_so_the_retry_runs() {
    let (fresh, record, envs) = setup("tick_retry", 2, &[]).await;
    let locker = Locker::new(fresh.client.clone(), &fresh.table);
    let marker = record_file("tick_retry_error");
    let tick = scheduled(
        1,
        &minute(-5),
        json!({"firstMode": "error", "firstMarker": marker}),
    );

    // The first delivery fails (an invocation error: Lambda and EventBridge retry it) ...
    let failed = envs[0].invoke(tick.clone()).await.json();
    assert_eq!(failed["errorType"], "RuntimeError", "{failed}");
    // ... so the retry, the very same event, runs; after its success, a duplicate does not.
    let retry = envs[1].invoke(tick.clone()).await.json();
    assert_eq!(retry["ok"], true, "{retry}\n{}", envs[1].log());
    let dup = envs[0].invoke(tick.clone()).await.json();
    assert_skipped(&dup, "duplicate", &tick, &envs[0]);
    assert_eq!(ran(&record), vec![1, 1], "{:#?}", runs(&record));

    // The same with a crash (the runtime process exits in the middle of the run).
    let crash_marker = record_file("tick_retry_crash");
    let tick = scheduled(
        2,
        &minute(-4),
        json!({"firstMode": "crash", "firstMarker": crash_marker}),
    );
    let crashed = envs[0].invoke(tick.clone()).await;
    assert!(
        String::from_utf8_lossy(&crashed.body).contains("Runtime.ExitError"),
        "{:?}",
        crashed.body
    );
    // The extension releases the crashed run's lock (it sees the runtime exit, or SHUTDOWN);
    // the retry comes once the key is free, as with wait 0 it would otherwise be answered busy.
    wait_queue(
        &locker,
        "the crashed run's lock was not released",
        <[QueueEntry]>::is_empty,
    )
    .await;
    let retry = envs[1].invoke(tick.clone()).await.json();
    assert_eq!(retry["ok"], true, "{retry}\n{}", envs[1].log());
    let dup = envs[1].invoke(tick.clone()).await.json();
    assert_skipped(&dup, "duplicate", &tick, &envs[1]);
    assert_eq!(ran(&record), vec![1, 1, 2, 2], "{:#?}", runs(&record));
    teardown(envs, &record, &[&marker, &crash_marker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_run_does_not_mark_its_tick_so_the_retry_runs() {
    let fresh = fresh_table("e2e_tick_timeout").await;
    let record = record_file("tick_timeout");
    let recipe = Spec::layered(FUNCTION, Runtime::Python).with("FLIGHTLOCK_WAIT", "0");
    // The first environment's function times out after 6 s; its first delivery sleeps past it.
    let short = Spec {
        timeout_secs: 6,
        ..recipe.clone()
    };
    let envs = start_all(
        "timeout",
        &[short, recipe],
        &fresh.endpoint,
        &fresh.table,
        &record,
    )
    .await;
    let locker = Locker::new(fresh.client.clone(), &fresh.table);
    let marker = record_file("tick_timeout_first");
    let tick = scheduled(
        1,
        &minute(-5),
        json!({"firstMode": "timeout", "firstMarker": marker}),
    );

    let timed_out = envs[0].invoke(tick.clone()).await;
    assert!(
        String::from_utf8_lossy(&timed_out.body).contains("timed out"),
        "{:?}",
        timed_out.body
    );
    // Lambda resets the sandbox; the extension releases the lock without marking the tick.
    wait_queue(
        &locker,
        "the timed-out run's lock was not released",
        <[QueueEntry]>::is_empty,
    )
    .await;
    let retry = envs[1].invoke(tick.clone()).await.json();
    assert_eq!(retry["ok"], true, "{retry}\n{}", envs[1].log());
    let dup = envs[0].invoke(tick.clone()).await.json();
    assert_skipped(&dup, "duplicate", &tick, &envs[0]);
    // Two starts of tick 1: the one that timed out (it never ended) and the retry.
    assert_eq!(ran(&record), vec![1, 1], "{:#?}", runs(&record));
    teardown(envs, &record, &[&marker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_tick_is_dropped_without_touching_the_table() {
    let (fresh, record, envs) = setup("tick_stale", 2, &[("FLIGHTLOCK_STALE_AFTER", "10m")]).await;

    // A delivery of a tick two hours old (after hours of retries): dropped, the handler does
    // not run, and nothing was written for it.
    let stale = scheduled(1, &minute(-120), json!({}));
    let old = envs[0].invoke(stale.clone()).await.json();
    assert_skipped(&old, "stale", &stale, &envs[0]);
    assert!(runs(&record).is_empty(), "{:#?}", runs(&record));
    let items = fresh
        .client
        .scan()
        .table_name(&fresh.table)
        .send()
        .await
        .unwrap();
    assert_eq!(items.count(), 0, "a stale tick wrote: {:?}", items.items());
    assert!(
        envs[0]
            .wait_log("\"StaleTicks\"", Duration::from_secs(5))
            .await,
        "no StaleTicks metric:\n{}",
        envs[0].log()
    );

    // A tick within the bound runs.
    let fresh_tick = envs[1]
        .invoke(scheduled(2, &minute(-1), json!({})))
        .await
        .json();
    assert_eq!(fresh_tick["ok"], true, "{fresh_tick}\n{}", envs[1].log());
    assert_eq!(ran(&record), vec![2]);
    teardown(envs, &record, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overrun_then_three_ticks_under_coalesce_runs_once_more_for_the_newest() {
    let (fresh, record, envs) = setup(
        "tick_coalesce",
        4,
        &[("FLIGHTLOCK_WAIT", "25s"), ("FLIGHTLOCK_COALESCE", "on")],
    )
    .await;
    let locker = Locker::new(fresh.client.clone(), &fresh.table);
    let hold = record_file("tick_coalesce_hold");
    let overrun = scheduled(0, &minute(-5), json!({"holdFile": hold}));
    let ticks: Vec<Value> = (1..=3)
        .map(|seq| scheduled(seq, &minute(seq - 5), json!({})))
        .collect();
    let envs: Vec<Arc<Env>> = envs.into_iter().map(Arc::new).collect();
    let invoke = |i: usize, event: &Value| {
        let (env, event) = (envs[i].clone(), event.clone());
        tokio::spawn(async move { env.invoke(event).await.json() })
    };

    // Tick 0 overruns: it runs until the test lets it end. Ticks 1, 2, 3 arrive meanwhile, in
    // order, each once the one before waits: each newer one replaces the waiting one.
    let first = invoke(0, &overrun);
    wait_runs(&record, 1).await;
    let t1 = invoke(1, &ticks[0]);
    wait_queue(&locker, "tick 1 did not queue", |q| q.len() == 2).await;
    let t2 = invoke(2, &ticks[1]);
    let r1 = t1.await.unwrap();
    assert_skipped(&r1, "superseded", &ticks[0], &envs[1]);
    let t3 = invoke(3, &ticks[2]);
    let r2 = t2.await.unwrap();
    assert_skipped(&r2, "superseded", &ticks[1], &envs[2]);
    // A late retry of tick 1 while tick 3 waits: answered superseded at once.
    let late = envs[1].invoke(ticks[0].clone()).await.json();
    assert_skipped(&late, "superseded", &ticks[0], &envs[1]);

    std::fs::write(&hold, b"").unwrap();
    let r0 = first.await.unwrap();
    assert_eq!(r0["ok"], true, "{r0}\n{}", envs[0].log());
    let r3 = t3.await.unwrap();
    assert_eq!(r3["ok"], true, "{r3}\n{}", envs[3].log());
    // Exactly one more run after the overrun, for the newest tick, and never two at once.
    assert_eq!(ran(&record), vec![0, 3], "{:#?}", runs(&record));
    assert_no_overlap(&runs(&record));
    for env in [&envs[1], &envs[2]] {
        assert!(
            env.wait_log("\"Superseded\"", Duration::from_secs(5)).await,
            "no Superseded metric:\n{}",
            env.log()
        );
    }
    wait_queue(
        &locker,
        "rows were left on the key",
        <[QueueEntry]>::is_empty,
    )
    .await;
    let envs = envs
        .into_iter()
        .map(|e| Arc::try_unwrap(e).unwrap_or_else(|_| panic!("an invocation is still going")))
        .collect();
    teardown(envs, &record, &[&hold]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_layer_runs_a_tick_once_and_a_failed_run_is_retried() {
    // The Rust job with the in-process tower layer instead of the extension: the same recipe,
    // the same answers. The demo Rust handler fails on `"mode": "error"`; the tick is the
    // event's `time` alone, so the retry below is a delivery of the same tick.
    let fresh = fresh_table("e2e_tick_inproc").await;
    let record = record_file("tick_inproc");
    let spec = Spec {
        extension: false,
        wrapper: false,
        ..Spec::layered(FUNCTION, Runtime::RustInProcess).with("FLIGHTLOCK_WAIT", "0")
    };
    let envs = start_all(
        "inproc",
        &[spec.clone(), spec],
        &fresh.endpoint,
        &fresh.table,
        &record,
    )
    .await;
    let time = minute(-5);

    let failed = envs[0]
        .invoke(scheduled(1, &time, json!({"mode": "error"})))
        .await
        .json();
    assert!(
        !failed["errorType"].is_null(),
        "{failed}\n{}",
        envs[0].log()
    );
    let tick = scheduled(1, &time, json!({}));
    let retry = envs[1].invoke(tick.clone()).await.json();
    assert_eq!(retry["ok"], true, "{retry}\n{}", envs[1].log());
    for env in [&envs[0], &envs[1]] {
        let dup = env.invoke(tick.clone()).await.json();
        assert_skipped(&dup, "duplicate", &tick, env);
    }
    assert_eq!(ran(&record), vec![1, 1], "{:#?}", runs(&record));
    teardown(envs, &record, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_recipe_runs_a_scheduled_time_once_and_id_ticks_too() {
    // EventBridge Scheduler: the input carries the context attributes, `FLIGHTLOCK_TICK={/tick}`
    // points at the scheduled time. A retry is modelled with another execution id and attempt
    // number: the tick is the scheduled time alone.
    let (_fresh, record, envs) =
        setup("tick_scheduler", 2, &[("FLIGHTLOCK_TICK", "{/tick}")]).await;
    let time = minute(-5);
    let input = |seq: i64, execution: &str, attempt: i64| json!({"tick": time, "execution": execution, "attempt": attempt, "seq": seq});
    let first = envs[0].invoke(input(1, "d32c5kddcf5bb8c3", 1)).await.json();
    assert_eq!(first["ok"], true, "{first}\n{}", envs[0].log());
    let again = envs[1].invoke(input(1, "a81f0c7e2b9d4e65", 2)).await.json();
    assert_skipped_tick(&again, "duplicate", &time, &envs[1]);
    assert_eq!(ran(&record), vec![1], "{:#?}", runs(&record));
    teardown(envs, &record, &[]).await;

    // A tick that is not a time is an id (a batch id): once per id as well.
    let (_fresh, record, envs) = setup(
        "tick_id",
        2,
        &[("FLIGHTLOCK_TICK", "batch-{/detail/batchId}")],
    )
    .await;
    let batch = |id: &str, seq: i64| json!({"detail": {"batchId": id}, "seq": seq});
    let first = envs[0].invoke(batch("7f3a", 1)).await.json();
    assert_eq!(first["ok"], true, "{first}\n{}", envs[0].log());
    let again = envs[1].invoke(batch("7f3a", 1)).await.json();
    assert_skipped_tick(&again, "duplicate", "batch-7f3a", &envs[1]);
    let other = envs[1].invoke(batch("7f3b", 2)).await.json();
    assert_eq!(other["ok"], true, "{other}\n{}", envs[1].log());
    // A field the event lacks: a typed error, and the handler does not run.
    let missing = envs[0].invoke(json!({"seq": 3})).await.json();
    assert_eq!(missing["errorType"], "FlightlockTickError", "{missing}");
    assert_eq!(ran(&record), vec![1, 2], "{:#?}", runs(&record));
    teardown(envs, &record, &[]).await;
}
