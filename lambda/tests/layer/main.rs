//! The in-process layer (`flightlock_lambda::FlightlockLayer`, feature `layer`) driven directly as a tower
//! service against DynamoDB Local: both busy policies, per-key templates, events without the
//! key's field, a failing handler, and queued invocations running in arrival order. The e2e
//! suite runs the same layer inside the Lambda emulator for the skip policy only; these tests
//! cover the rest without an emulator. Once per tick: [`ticks`].

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flightlock::{ClockSkew, Locker};
use flightlock_lambda::config::Config;
use flightlock_lambda::responses::{BUSY_ERROR_TYPE, KEY_ERROR_TYPE};
use flightlock_lambda::{FlightlockLayer, Gated};
use lambda_runtime::tower::{ServiceBuilder, ServiceExt};
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

mod lock_context;
mod permits;
mod records;
mod ticks;

/// What the handler saw: how many ran, how many ran at once, and the order of the events.
struct Probe {
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    calls: AtomicUsize,
    order: Mutex<Vec<Value>>,
    /// While `hold` is set, each handler waits for one permit before it returns.
    release: Semaphore,
    hold: AtomicBool,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            running: AtomicUsize::new(0),
            most_at_once: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            order: Mutex::new(Vec::new()),
            release: Semaphore::new(0),
            hold: AtomicBool::new(false),
        }
    }
}

/// A fresh table and a layer configured by `vars` (plus the table).
async fn layer(name: &str, vars: &[(&str, &str)]) -> (FlightlockLayer, Locker, String) {
    let flightlock_testkit::FreshTable {
        endpoint, table, ..
    } = flightlock_testkit::fresh_table(name).await;
    let mut env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.insert("FLIGHTLOCK_TABLE".into(), table.clone());
    env.insert("AWS_LAMBDA_FUNCTION_NAME".into(), "nightly".into());
    let config = Config::from_map(&env).unwrap();
    let locker = Locker::new(flightlock_testkit::client(&endpoint).await, &table);
    let layer = FlightlockLayer::new(locker.clone(), config);
    (layer, locker, table)
}

type Handler =
    lambda_runtime::tower::util::BoxCloneService<LambdaEvent<Value>, Gated<Value>, Diagnostic>;

/// The layer around a handler that records into `probe`, holds while `probe.hold` is set, and
/// fails for events with `"fail": true`.
fn gated(layer: &FlightlockLayer, probe: &Arc<Probe>) -> Handler {
    let probe = probe.clone();
    let handler = lambda_runtime::service_fn(move |event: LambdaEvent<Value>| {
        let probe = probe.clone();
        async move {
            let now = probe.running.fetch_add(1, Ordering::SeqCst) + 1;
            probe.most_at_once.fetch_max(now, Ordering::SeqCst);
            probe.calls.fetch_add(1, Ordering::SeqCst);
            probe.order.lock().unwrap().push(event.payload.clone());
            if probe.hold.load(Ordering::SeqCst) {
                probe.release.acquire().await.unwrap().forget();
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            probe.running.fetch_sub(1, Ordering::SeqCst);
            if event.payload["fail"] == true {
                return Err(Diagnostic {
                    error_type: "JobFailed".into(),
                    error_message: "the job failed".into(),
                });
            }
            Ok::<Value, Diagnostic>(json!({ "done": event.payload }))
        }
    });
    lambda_runtime::tower::util::BoxCloneService::new(
        ServiceBuilder::new().layer(layer.clone()).service(handler),
    )
}

fn event(request_id: &str, payload: Value) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = request_id.to_owned();
    let deadline = SystemTime::now() + Duration::from_secs(60);
    context.deadline = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    LambdaEvent::new(payload, context)
}

async fn call(
    service: Handler,
    request_id: &str,
    payload: Value,
) -> Result<Gated<Value>, Diagnostic> {
    service.oneshot(event(request_id, payload)).await
}

/// Waits until `n` handlers are inside.
async fn until_running(probe: &Probe, n: usize) {
    let start = tokio::time::Instant::now();
    while probe.running.load(Ordering::SeqCst) < n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no handler started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the key's queue holds `n` rows.
async fn until_queued(locker: &Locker, key: &str, n: usize) {
    let start = tokio::time::Instant::now();
    loop {
        let rows = locker
            .queue(key, ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap();
        if rows.len() >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the queue never reached {n} rows"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skip_policy_answers_a_busy_key_with_the_skip_body_naming_the_holder() {
    let (layer, _, _) = layer("inproc_skip", &[("FLIGHTLOCK_ON_BUSY", "skip")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    let first = tokio::spawn({
        let service = service.clone();
        async move { call(service, "req-1", json!({"n": 1})).await }
    });
    until_running(&probe, 1).await;

    let second = call(service.clone(), "req-2", json!({"n": 2}))
        .await
        .unwrap();
    let Gated::Skipped(body) = second else {
        panic!("a busy key must be skipped, got {second:?}");
    };
    assert_eq!(body["flightlock"]["skipped"], true);
    assert_eq!(
        body["flightlock"]["key"], "nightly",
        "the default key is the function name"
    );
    assert_eq!(body["flightlock"]["heldBy"]["requestId"], "req-1");
    assert_eq!(body["flightlock"]["heldBy"]["function"], "nightly");

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(1);
    assert_eq!(
        first.await.unwrap().unwrap(),
        Gated::Ran(json!({"done": {"n": 1}}))
    );
    // Released: the next invocation runs at once.
    assert_eq!(
        call(service.clone(), "req-3", json!({"n": 3}))
            .await
            .unwrap(),
        Gated::Ran(json!({"done": {"n": 3}}))
    );
    assert_eq!(
        probe.calls.load(Ordering::SeqCst),
        2,
        "the skipped one never ran"
    );
    assert_eq!(probe.most_at_once.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn error_policy_fails_a_busy_key_with_flightlock_busy() {
    let (layer, _, _) = layer("inproc_error", &[("FLIGHTLOCK_ON_BUSY", "error")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    let first = tokio::spawn({
        let service = service.clone();
        async move { call(service, "req-1", json!({})).await }
    });
    until_running(&probe, 1).await;

    let error = call(service.clone(), "req-2", json!({})).await.unwrap_err();
    assert_eq!(error.error_type, BUSY_ERROR_TYPE);
    assert!(
        error.error_message.contains("req-1"),
        "the error names the holder: {}",
        error.error_message
    );

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(1);
    assert!(matches!(first.await.unwrap(), Ok(Gated::Ran(_))));
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_templates_let_other_keys_run_and_reject_events_without_the_field() {
    let (layer, _, _) = layer("inproc_keys", &[("FLIGHTLOCK_KEY", "acct-{/account}")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    let first = tokio::spawn({
        let service = service.clone();
        async move { call(service, "req-1", json!({"account": "a"})).await }
    });
    until_running(&probe, 1).await;
    let other = tokio::spawn({
        let service = service.clone();
        async move { call(service, "req-2", json!({"account": "b"})).await }
    });
    until_running(&probe, 2).await; // another key is not held up

    let same = call(service.clone(), "req-3", json!({"account": "a"}))
        .await
        .unwrap();
    match same {
        Gated::Skipped(body) => assert_eq!(body["flightlock"]["key"], "acct-a"),
        ran => panic!("the same key must be skipped, got {ran:?}"),
    }
    let missing = call(service.clone(), "req-4", json!({"user": "a"}))
        .await
        .unwrap_err();
    assert_eq!(missing.error_type, KEY_ERROR_TYPE);
    assert!(
        missing.error_message.contains("/account"),
        "{}",
        missing.error_message
    );

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(2);
    assert!(matches!(first.await.unwrap(), Ok(Gated::Ran(_))));
    assert!(matches!(other.await.unwrap(), Ok(Gated::Ran(_))));
    assert_eq!(
        probe.calls.load(Ordering::SeqCst),
        2,
        "only the two held keys ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_handler_passes_its_error_through_and_releases_the_key() {
    let (layer, locker, _) = layer("inproc_fail", &[]).await;
    let probe = Arc::new(Probe::default());
    let service = gated(&layer, &probe);

    let error = call(service.clone(), "req-1", json!({"fail": true}))
        .await
        .unwrap_err();
    assert_eq!(error.error_type, "JobFailed");
    assert!(
        locker
            .queue("nightly", ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap()
            .is_empty(),
        "the row is deleted when the handler fails"
    );
    assert_eq!(
        call(service.clone(), "req-2", json!({"n": 2}))
            .await
            .unwrap(),
        Gated::Ran(json!({"done": {"n": 2}})),
        "with FLIGHTLOCK_WAIT=0 the next invocation runs: nothing was left held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_invocations_run_one_at_a_time_in_arrival_order() {
    let (layer, locker, _) = layer("inproc_fifo", &[("FLIGHTLOCK_WAIT", "30s")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    let mut calls = Vec::new();
    for n in 0..5 {
        let service = service.clone();
        calls.push(tokio::spawn(async move {
            call(service, &format!("req-{n}"), json!({"n": n})).await
        }));
        // The next one arrives after this one has its ticket.
        until_queued(&locker, "nightly", n + 1).await;
    }
    // Let them through one by one; each must be the next in arrival order.
    for n in 0..5 {
        until_running(&probe, 1).await;
        assert_eq!(
            probe.order.lock().unwrap().last().unwrap(),
            &json!({"n": n})
        );
        probe.release.add_permits(1);
        // Wait for this one to leave before releasing the next.
        let start = tokio::time::Instant::now();
        while probe.running.load(Ordering::SeqCst) > 0
            && probe.calls.load(Ordering::SeqCst) == n + 1
        {
            assert!(start.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for (n, handle) in calls.into_iter().enumerate() {
        assert_eq!(
            handle.await.unwrap().unwrap(),
            Gated::Ran(json!({"done": {"n": n}}))
        );
    }
    assert_eq!(
        probe.most_at_once.load(Ordering::SeqCst),
        1,
        "never two at once"
    );
    let order: Vec<Value> = probe.order.lock().unwrap().clone();
    assert_eq!(order, (0..5).map(|n| json!({"n": n})).collect::<Vec<_>>());
}

fn tenant_event(request_id: &str, tenant: Option<&str>) -> LambdaEvent<Value> {
    let mut e = event(request_id, json!({}));
    e.context.tenant_id = tenant.map(str::to_owned);
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_keys_come_from_the_context() {
    let (layer, locker, _) = layer(
        "layertenant",
        &[("FLIGHTLOCK_KEY", "job-{tenant}"), ("FLIGHTLOCK_WAIT", "0")],
    )
    .await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);
    let blue = tokio::spawn(service.clone().oneshot(tenant_event("b-1", Some("blue"))));
    until_running(&probe, 1).await;
    let holder = locker
        .holder("job-blue", ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder.info.request_id.as_deref(), Some("b-1"));
    // The same tenant is skipped; another runs beside it.
    let again = service
        .clone()
        .oneshot(tenant_event("b-2", Some("blue")))
        .await
        .unwrap();
    assert!(matches!(again, Gated::Skipped(_)), "{again:?}");
    let green = tokio::spawn(service.clone().oneshot(tenant_event("g-1", Some("green"))));
    until_running(&probe, 2).await;
    // No tenant id: a key error, the handler never runs.
    let none = service
        .clone()
        .oneshot(tenant_event("n-1", None))
        .await
        .unwrap_err();
    assert_eq!(none.error_type, KEY_ERROR_TYPE);
    probe.release.add_permits(2);
    blue.await.unwrap().unwrap();
    green.await.unwrap().unwrap();
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_restore_the_layer_gates_with_a_new_host_id() {
    use lambda_runtime::SnapStartResource;
    let (layer, locker, _) = layer("layerrestore", &[("FLIGHTLOCK_KEY", "snap")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let host_of = |locker: Locker| async move {
        locker
            .holder("snap", ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap()
            .unwrap()
            .info
            .host
            .unwrap()
    };
    let service = gated(&layer, &probe);
    let first = tokio::spawn(service.clone().oneshot(event("r-1", json!({}))));
    until_running(&probe, 1).await;
    let before = host_of(locker.clone()).await;
    probe.release.add_permits(1);
    first.await.unwrap().unwrap();
    // The runtime's after_restore hook on a clone renews the gate of every clone.
    layer.clone().after_restore().await.unwrap();
    let second = tokio::spawn(service.oneshot(event("r-2", json!({}))));
    until_running(&probe, 1).await;
    let after = host_of(locker).await;
    probe.release.add_permits(1);
    second.await.unwrap().unwrap();
    assert_ne!(before, after, "the host id was not renewed");
}
