//! `flightlock_lambda::records()`: a Rust handler behind the in-process layer locks records of
//! its own, finds another invocation's busy, and every lock it took is released when it
//! returns, whether it released them or not, with the gate on or off (`FLIGHTLOCK_GATE`).

use super::*;
use flightlock::Wait;
use flightlock_lambda::records::RecordError;

/// A handler that locks each key of the event's `"keys"` (wait 0, one permit: the gate runs two
/// invocations at once) and reports what it got:
/// the token, or `"busy"` naming the holder's request id. It releases none unless
/// `"release": true`; with `"hold": true` it waits for a permit of `probe.release` first.
fn locking(layer: &FlightlockLayer, probe: &Arc<Probe>) -> Handler {
    let probe = probe.clone();
    let handler = lambda_runtime::service_fn(move |event: LambdaEvent<Value>| {
        let probe = probe.clone();
        async move {
            let records = flightlock_lambda::records().expect("behind the layer");
            let mut got = serde_json::Map::new();
            for key in event.payload["keys"].as_array().unwrap() {
                let key = key.as_str().unwrap();
                let answer = match records.acquire(key, Some(Wait::NoWait), Some(1)).await {
                    Ok(lock) => json!(lock.token),
                    Err(RecordError::Busy { holders, .. }) => {
                        json!({ "busy": holders[0].info.request_id })
                    }
                    Err(e) => json!({ "error": e.to_string() }),
                };
                got.insert(key.to_owned(), answer);
            }
            probe.calls.fetch_add(1, Ordering::SeqCst);
            if event.payload["hold"] == true {
                probe.release.acquire().await.unwrap().forget();
            }
            if event.payload["release"] == true {
                for key in got.keys() {
                    records.release(key).await.unwrap();
                }
            }
            Ok::<Value, Diagnostic>(Value::Object(got))
        }
    });
    lambda_runtime::tower::util::BoxCloneService::new(
        ServiceBuilder::new().layer(layer.clone()).service(handler),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_are_held_while_the_handler_runs_and_released_when_it_returns() {
    for gate in ["on", "off"] {
        let (layer, _, _) = layer(
            &format!("inproc_records_gate_{gate}"),
            &[("FLIGHTLOCK_GATE", gate), ("FLIGHTLOCK_PERMITS", "2")],
        )
        .await;
        let probe = Arc::new(Probe::default());
        let service = locking(&layer, &probe);
        let bounded = |service: Handler, id: &'static str, payload: Value| async move {
            match tokio::time::timeout(Duration::from_secs(30), call(service, id, payload)).await {
                Ok(Ok(Gated::Ran(v))) => v,
                other => panic!("gate {gate}: {id} did not run in 30 s: {other:?}"),
            }
        };
        let first = tokio::spawn(bounded(
            service.clone(),
            "req-1",
            json!({"keys": ["order-1", "order-2"], "hold": true}),
        ));
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while probe.calls.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert!(
            waited.await.is_ok(),
            "gate {gate}: the first handler never ran"
        );
        // While the first handler holds its records, the second finds them busy, naming it.
        let second = bounded(
            service.clone(),
            "req-2",
            json!({"keys": ["order-1", "order-3"]}),
        )
        .await;
        assert_eq!(
            second["order-1"],
            json!({"busy": "req-1"}),
            "gate {gate}: {second}"
        );
        assert!(second["order-3"].is_u64(), "gate {gate}: {second}");
        probe.release.add_permits(1);
        let first = first.await.unwrap();
        let token = first["order-1"].as_u64().expect("a token");
        // Neither released anything: the layer did when each returned.
        let third = bounded(
            service,
            "req-3",
            json!({"keys": ["order-1", "order-2", "order-3"], "release": true}),
        )
        .await;
        for key in ["order-1", "order-2", "order-3"] {
            assert!(
                third[key].is_u64(),
                "gate {gate}: {key} free again: {third}"
            );
        }
        assert!(
            third["order-1"].as_u64().unwrap() > token,
            "fencing: {third}"
        );
    }
}

#[tokio::test]
async fn outside_a_handler_behind_the_layer_there_are_no_records() {
    assert!(flightlock_lambda::records().is_none());
}

/// The metrics of record locks, as a handler's calls emit them against DynamoDB Local: one
/// invocation takes a key (`RecordLockAcquired`), another finds it busy (`RecordLockBusy`), and
/// the release that follows counts nothing.
#[tokio::test]
async fn record_locks_emit_acquired_and_busy() {
    use flightlock_lambda::metrics::Metrics;
    use flightlock_lambda::records::Records;

    let (_, locker, table) = layer("inproc_records_metrics", &[]).await;
    let env: HashMap<String, String> = [
        ("FLIGHTLOCK_TABLE", table.as_str()),
        ("AWS_LAMBDA_FUNCTION_NAME", "nightly"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = Arc::new(Config::from_map(&env).unwrap());
    let deadline = Some(SystemTime::now() + Duration::from_secs(60));
    let invocation = |id: &str, metrics: Metrics| {
        let holder = flightlock::HolderInfo {
            request_id: Some(id.to_owned()),
            ..flightlock::HolderInfo::default()
        };
        Records::new(locker.clone(), config.clone(), holder, deadline).with_metrics(metrics)
    };
    let (first_metrics, first_lines) = Metrics::captured("nightly");
    let (second_metrics, second_lines) = Metrics::captured("nightly");
    let first = invocation("req-1", first_metrics);
    let second = invocation("req-2", second_metrics);
    first
        .acquire("order-9", Some(Wait::NoWait), None)
        .await
        .unwrap();
    let busy = second.acquire("order-9", Some(Wait::NoWait), None).await;
    assert!(matches!(busy, Err(RecordError::Busy { .. })), "{busy:?}");
    first.release("order-9").await.unwrap();
    let names = |lines: &Mutex<Vec<String>>| -> Vec<String> {
        lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["FunctionName"], "nightly", "{v}");
                v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(names(&first_lines), ["RecordLockAcquired"]);
    assert_eq!(names(&second_lines), ["RecordLockBusy"]);
    assert_eq!(second.close().await, 0);
}
