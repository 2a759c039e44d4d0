//! Once per tick through the in-process layer, against DynamoDB Local: a run that succeeded
//! marks its tick and a duplicate is answered with reason `duplicate`; a failed run marks
//! nothing, so the retry runs; a duplicate while the first runs is busy, then a duplicate; tick
//! ids; stale ticks dropped without a request; coalesced overruns; every bad tick a
//! `FlightlockTickError` with nothing run.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flightlock::tick::format_ms;
use flightlock::Locker;
use flightlock_lambda::config::Config;
use flightlock_lambda::responses::TICK_ERROR_TYPE;
use flightlock_lambda::{FlightlockLayer, Gated};
use flightlock_testkit::events;
use serde_json::{json, Value};

use crate::{call, gated, layer, until_queued, until_running, Probe};

/// An EventBridge scheduled event for the instant `time` (RFC 3339), as a rule delivers it
/// (`events/scheduled.json`'s shape); `fail` makes the test handler fail.
fn scheduled(time: &str, fail: bool) -> Value {
    let mut event = events::scheduled(events::SCHEDULED_ID, time);
    event["fail"] = json!(fail);
    event
}

/// The skip body's `reason`, or a panic naming what came instead.
fn skipped(answer: &Gated<Value>) -> &str {
    match answer {
        Gated::Skipped(body) => body["flightlock"]["reason"].as_str().unwrap(),
        ran => panic!("expected a skip, the handler ran: {ran:?}"),
    }
}

/// Now, as an RFC 3339 time (so a stale bound does not apply by accident).
fn now_rfc3339(minus: Duration) -> String {
    let ms = (SystemTime::now() - minus)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format_ms(i64::try_from(ms).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_success_marks_the_tick_and_a_duplicate_is_answered_as_such() {
    // The default FLIGHTLOCK_TICK (auto) and the guide's scheduled-job settings.
    let (layer, locker, _) = layer("tick_dup", &[]).await;
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);
    let event = scheduled("2026-11-24T10:00:00Z", false);

    let first = call(service.clone(), "req-1", event.clone()).await.unwrap();
    assert!(matches!(first, Gated::Ran(_)), "{first:?}");
    // The same event again (EventBridge's duplicate, Lambda's async retry): not run.
    let again = call(service.clone(), "req-2", event.clone()).await.unwrap();
    assert_eq!(skipped(&again), "duplicate");
    let Gated::Skipped(body) = &again else {
        unreachable!()
    };
    assert_eq!(body["flightlock"]["tick"], "2026-11-24T10:00:00.000Z");
    assert_eq!(body["flightlock"]["key"], "nightly");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
    // The duplicate left nothing behind, and the next tick runs.
    assert!(locker
        .queue(
            "nightly",
            flightlock::ClockSkew::Bounded(Duration::from_secs(1))
        )
        .await
        .unwrap()
        .is_empty());
    let next = call(
        service.clone(),
        "req-3",
        scheduled("2026-11-24T10:05:00Z", false),
    )
    .await
    .unwrap();
    assert!(matches!(next, Gated::Ran(_)), "{next:?}");
    // An older tick after a newer success: done too (a schedule never runs backwards).
    let older = call(
        service.clone(),
        "req-4",
        scheduled("2026-11-24T09:55:00Z", false),
    )
    .await
    .unwrap();
    assert_eq!(skipped(&older), "duplicate");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2);
    // Events that are not scheduled events have no tick: they run every time.
    for n in 0..2 {
        let plain = call(service.clone(), &format!("p-{n}"), json!({"n": n}))
            .await
            .unwrap();
        assert!(matches!(plain, Gated::Ran(_)), "{plain:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_run_does_not_mark_the_tick_so_the_retry_runs() {
    let (layer, _, _) = layer("tick_fail", &[]).await;
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);
    let time = "2026-11-24T11:00:00Z";

    let failed = call(service.clone(), "req-1", scheduled(time, true))
        .await
        .unwrap_err();
    assert_eq!(failed.error_type, "JobFailed");
    // The retry (same tick) runs, and succeeds this time; then the tick is done.
    let retry = call(service.clone(), "req-2", scheduled(time, false))
        .await
        .unwrap();
    assert!(matches!(retry, Gated::Ran(_)), "{retry:?}");
    let third = call(service.clone(), "req-3", scheduled(time, false))
        .await
        .unwrap();
    assert_eq!(skipped(&third), "duplicate");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_while_the_first_runs_is_busy_then_a_duplicate() {
    let (layer, _, _) = layer("tick_busy", &[]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);
    let event = scheduled("2026-11-24T12:00:00Z", false);

    let first = tokio::spawn({
        let (service, event) = (service.clone(), event.clone());
        async move { call(service, "req-1", event).await }
    });
    until_running(&probe, 1).await;
    let during = call(service.clone(), "req-2", event.clone()).await.unwrap();
    assert_eq!(skipped(&during), "busy");
    let Gated::Skipped(body) = &during else {
        unreachable!()
    };
    assert_eq!(body["flightlock"]["heldBy"]["requestId"], "req-1");
    assert_eq!(body["flightlock"]["tick"], "2026-11-24T12:00:00.000Z");

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(1);
    assert!(matches!(first.await.unwrap(), Ok(Gated::Ran(_))));
    let after = call(service.clone(), "req-3", event).await.unwrap();
    assert_eq!(skipped(&after), "duplicate");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tick_ids_from_a_template_run_once_each() {
    let (layer, _, _) = layer("tick_ids", &[("FLIGHTLOCK_TICK", "{/detail/batchId}")]).await;
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);
    let batch = |id: &str, fail: bool| json!({"detail": {"batchId": id}, "fail": fail});

    let failed = call(service.clone(), "r-0", batch("b-1", true)).await;
    assert_eq!(failed.unwrap_err().error_type, "JobFailed");
    for (request, id) in [("r-1", "b-1"), ("r-2", "b-2")] {
        let ran = call(service.clone(), request, batch(id, false))
            .await
            .unwrap();
        assert!(matches!(ran, Gated::Ran(_)), "{id}: {ran:?}");
    }
    for (request, id) in [("r-3", "b-1"), ("r-4", "b-2")] {
        let again = call(service.clone(), request, batch(id, false))
            .await
            .unwrap();
        assert_eq!(skipped(&again), "duplicate", "{id}");
        let Gated::Skipped(body) = &again else {
            unreachable!()
        };
        assert_eq!(body["flightlock"]["tick"], id);
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 3);
    // An event without the field: nothing runs.
    let missing = call(service.clone(), "r-5", json!({"detail": {}}))
        .await
        .unwrap_err();
    assert_eq!(missing.error_type, TICK_ERROR_TYPE);
    assert!(
        missing.error_message.contains("FLIGHTLOCK_TICK")
            && missing.error_message.contains("/detail/batchId"),
        "{}",
        missing.error_message
    );
    assert_eq!(probe.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_tick_is_dropped_without_a_request() {
    let (layer, _, table) = layer("tick_stale", &[("FLIGHTLOCK_STALE_AFTER", "10m")]).await;
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);

    let late = call(
        service.clone(),
        "req-1",
        scheduled(&now_rfc3339(Duration::from_secs(3600)), false),
    )
    .await
    .unwrap();
    assert_eq!(skipped(&late), "stale");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
    // Nothing was written: the key's partition is still empty (no counter, no row).
    let endpoint = flightlock_testkit::require_endpoint();
    let client = flightlock_testkit::client(&endpoint).await;
    let items = client
        .query()
        .table_name(&table)
        .key_condition_expression("pk = :k")
        .expression_attribute_values(
            ":k",
            aws_sdk_dynamodb::types::AttributeValue::S("nightly".into()),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert_eq!(items.count(), 0, "{:?}", items.items());
    // A tick within the bound runs.
    let fresh = call(
        service.clone(),
        "req-2",
        scheduled(&now_rfc3339(Duration::from_secs(60)), false),
    )
    .await
    .unwrap();
    assert!(matches!(fresh, Gated::Ran(_)), "{fresh:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_and_bad_ticks_are_answered_without_any_request() {
    // A DynamoDB that refuses every connection: any request would fail the invocation with
    // FlightlockLockError, so these answers prove that none was made.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = flightlock_testkit::client(&format!("http://127.0.0.1:{port}")).await;
    let env = HashMap::from([
        ("FLIGHTLOCK_TABLE".to_owned(), "locks".to_owned()),
        ("AWS_LAMBDA_FUNCTION_NAME".to_owned(), "nightly".to_owned()),
        ("FLIGHTLOCK_STALE_AFTER".to_owned(), "5m".to_owned()),
        ("FLIGHTLOCK_METRICS".to_owned(), "off".to_owned()),
    ]);
    let config = Config::from_map(&env).unwrap();
    let layer = FlightlockLayer::new(Locker::new(client, "locks"), config);
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);
    let stale = call(
        service.clone(),
        "r-1",
        scheduled(&now_rfc3339(Duration::from_secs(600)), false),
    )
    .await
    .unwrap();
    assert_eq!(skipped(&stale), "stale");
    let bad = call(service.clone(), "r-2", scheduled("noon", false))
        .await
        .unwrap_err();
    assert_eq!(bad.error_type, TICK_ERROR_TYPE);
    // A fresh tick does make requests, and this DynamoDB refuses them.
    let fresh = call(
        service.clone(),
        "r-3",
        scheduled(&now_rfc3339(Duration::ZERO), false),
    )
    .await
    .unwrap_err();
    assert_eq!(
        fresh.error_type,
        flightlock_lambda::responses::LOCK_ERROR_TYPE
    );
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_ticks_fail_the_invocation_and_nothing_runs() {
    let (templated, _, _) = layer(
        "tick_bad",
        &[
            ("FLIGHTLOCK_TICK", "{/tick}"),
            ("FLIGHTLOCK_STALE_AFTER", "1h"),
        ],
    )
    .await;
    let probe = Arc::new(Probe::default());
    let service = gated(&templated, &probe);
    // An id has no age: the stale bound cannot be checked.
    let id = call(service.clone(), "r-1", json!({"tick": "batch-7"}))
        .await
        .unwrap_err();
    assert_eq!(id.error_type, TICK_ERROR_TYPE);
    assert!(
        id.error_message.contains("FLIGHTLOCK_STALE_AFTER"),
        "{}",
        id.error_message
    );
    // No such field.
    let missing = call(
        service.clone(),
        "r-2",
        json!({"time": "2026-11-24T10:00:00Z"}),
    )
    .await
    .unwrap_err();
    assert_eq!(missing.error_type, TICK_ERROR_TYPE);

    // auto: a scheduled event whose time is not a timestamp.
    let (auto, _, _) = layer("tick_badtime", &[]).await;
    let service = gated(&auto, &probe);
    let e = call(service.clone(), "r-3", scheduled("at noon", false))
        .await
        .unwrap_err();
    assert_eq!(e.error_type, TICK_ERROR_TYPE);
    assert!(e.error_message.contains("RFC 3339"), "{}", e.error_message);
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_overrun_then_three_ticks_under_coalesce_runs_once_more_for_the_newest() {
    let (layer, locker, _) = layer(
        "tick_coalesce",
        &[("FLIGHTLOCK_WAIT", "60s"), ("FLIGHTLOCK_COALESCE", "on")],
    )
    .await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    // The 10:00 run overruns.
    let first = tokio::spawn({
        let service = service.clone();
        async move { call(service, "t-0", scheduled("2026-11-24T10:00:00Z", false)).await }
    });
    until_running(&probe, 1).await;
    // Three more ticks arrive while it runs: each newer one replaces the one waiting.
    let tick = |n: usize| {
        let service = service.clone();
        let event = scheduled(&format!("2026-11-24T10:0{n}:00Z"), false);
        tokio::spawn(async move { call(service, &format!("t-{n}"), event).await })
    };
    let mut waiting = tick(1);
    // The holder plus this waiter.
    until_queued(&locker, "nightly", 2).await;
    for n in 2..=3 {
        let newer = tick(n);
        let answer = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("a superseded waiter is answered while the holder still runs")
            .unwrap()
            .unwrap();
        assert_eq!(skipped(&answer), "superseded", "tick {}", n - 1);
        waiting = newer;
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(1);
    assert!(matches!(first.await.unwrap(), Ok(Gated::Ran(_))));
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(
        answer,
        Gated::Ran(json!({"done": scheduled("2026-11-24T10:03:00Z", false)}))
    );
    assert_eq!(
        probe.calls.load(Ordering::SeqCst),
        2,
        "exactly one more run, for the newest tick"
    );
}
