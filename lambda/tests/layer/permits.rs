//! `FLIGHTLOCK_PERMITS`: N invocations hold a key at once, the next one is skipped (naming every
//! holder) or waits its turn, the handler learns the key's permits, and a layer configured with
//! other permits than the key's fails the invocation with `FlightlockPermitsMismatch`, never a
//! skip.

use flightlock_lambda::responses::PERMITS_ERROR_TYPE;

use super::*;

/// A second layer on `table` (a participant configured on its own), through `locker`'s client.
fn layer_on(locker: &Locker, table: &str, vars: &[(&str, &str)]) -> FlightlockLayer {
    let mut env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.insert("FLIGHTLOCK_TABLE".into(), table.to_owned());
    env.insert("AWS_LAMBDA_FUNCTION_NAME".into(), "nightly".into());
    FlightlockLayer::new(locker.clone(), Config::from_map(&env).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_permits_let_two_hold_at_once_and_skip_the_third_naming_both() {
    let (layer, locker, table) = layer("inproc_permits_skip", &[("FLIGHTLOCK_PERMITS", "2")]).await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);

    let holders: Vec<_> = ["req-1", "req-2"]
        .into_iter()
        .map(|id| {
            let service = service.clone();
            tokio::spawn(async move { call(service, id, json!({ "id": id })).await })
        })
        .collect();
    until_running(&probe, 2).await;

    let third = call(service.clone(), "req-3", json!({"id": "req-3"}))
        .await
        .unwrap();
    let Gated::Skipped(body) = third else {
        panic!("with both permits held the third must be skipped, got {third:?}");
    };
    let named: Vec<_> = body["flightlock"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["requestId"].as_str().unwrap().to_owned())
        .collect();
    let mut sorted = named.clone();
    sorted.sort();
    assert_eq!(sorted, ["req-1", "req-2"], "{body}");
    assert_eq!(
        body["flightlock"]["heldBy"], body["flightlock"]["holders"][0],
        "{body}"
    );
    // A layer of one permit on the full key (skip policy, no wait): refused, never skipped
    // (issue 36: its read alone can refuse it, for it writes nothing there).
    let one = layer_on(&locker, &table, &[]);
    let error = call(gated(&one, &probe), "req-4", json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error.error_type, PERMITS_ERROR_TYPE,
        "{}",
        error.error_message
    );

    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(2);
    for h in holders {
        assert!(matches!(h.await.unwrap(), Ok(Gated::Ran(_))));
    }
    assert_eq!(probe.most_at_once.load(Ordering::SeqCst), 2);
    assert_eq!(
        probe.calls.load(Ordering::SeqCst),
        2,
        "the skipped one never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_wait_the_third_runs_when_a_permit_frees() {
    let (layer, locker, _) = layer(
        "inproc_permits_wait",
        &[("FLIGHTLOCK_PERMITS", "2"), ("FLIGHTLOCK_WAIT", "30s")],
    )
    .await;
    let probe = Arc::new(Probe::default());
    probe.hold.store(true, Ordering::SeqCst);
    let service = gated(&layer, &probe);
    let spawn = |id: &'static str| {
        let service = service.clone();
        tokio::spawn(async move { call(service, id, json!({ "id": id })).await })
    };
    let first = [spawn("req-1"), spawn("req-2")];
    until_running(&probe, 2).await;
    let third = spawn("req-3");
    until_queued(&locker, "nightly", 3).await;
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2, "the third waits");

    // One permit frees: the waiter takes it while the other holder still runs.
    probe.release.add_permits(1);
    until_running(&probe, 2).await;
    let start = tokio::time::Instant::now();
    while probe.calls.load(Ordering::SeqCst) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the third never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    probe.hold.store(false, Ordering::SeqCst);
    probe.release.add_permits(2);
    for h in first.into_iter().chain([third]) {
        assert!(matches!(h.await.unwrap(), Ok(Gated::Ran(_))));
    }
    assert_eq!(
        probe.most_at_once.load(Ordering::SeqCst),
        2,
        "never three at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_permits_than_the_keys_fail_the_invocation_never_skip() {
    let (one, locker, table) = layer("inproc_permits_mismatch", &[]).await;
    let probe = Arc::new(Probe::default());
    // The key is created at one permit.
    let ran = call(gated(&one, &probe), "req-1", json!({})).await.unwrap();
    assert!(matches!(ran, Gated::Ran(_)), "{ran:?}");

    // Skip policy (the default) or not: a mismatch is an error, and nothing runs.
    let three = layer_on(&locker, &table, &[("FLIGHTLOCK_PERMITS", "3")]);
    let error = call(gated(&three, &probe), "req-2", json!({}))
        .await
        .unwrap_err();
    assert_eq!(error.error_type, PERMITS_ERROR_TYPE);
    let msg = &error.error_message;
    assert!(
        msg.contains("allows 1 holder(s)") && msg.contains("configured with 3"),
        "{msg}"
    );
    assert!(
        msg.contains("flightlock permits --key nightly --set N"),
        "{msg}"
    );

    // And the other way round: a key of three permits refuses a one-permit layer.
    let three_key = layer_on(
        &locker,
        &table,
        &[
            ("FLIGHTLOCK_PERMITS", "3"),
            ("FLIGHTLOCK_KEY", "partner-api"),
        ],
    );
    let ran = call(gated(&three_key, &probe), "req-3", json!({}))
        .await
        .unwrap();
    assert!(matches!(ran, Gated::Ran(_)), "{ran:?}");
    let one_key = layer_on(&locker, &table, &[("FLIGHTLOCK_KEY", "partner-api")]);
    let error = call(gated(&one_key, &probe), "req-4", json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        error.error_type, PERMITS_ERROR_TYPE,
        "{}",
        error.error_message
    );
    assert!(
        error.error_message.contains("allows 3 holder(s)"),
        "{}",
        error.error_message
    );
    assert_eq!(
        probe.calls.load(Ordering::SeqCst),
        2,
        "the refused ones never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_learns_the_keys_permits() {
    let (layer, _, _) = layer(
        "inproc_permits_lock_context",
        &[("FLIGHTLOCK_PERMITS", "4")],
    )
    .await;
    let out = match call(super::lock_context::reporting(&layer), "req-1", json!({})).await {
        Ok(Gated::Ran(v)) => v,
        other => panic!("the handler did not run: {other:?}"),
    };
    let custom = &out["clientContext"]["custom"];
    assert_eq!(custom["flightlockPermits"], "4", "{custom}");
    assert_eq!(
        custom["flightlockTicket"],
        out["ticket"].as_u64().unwrap().to_string()
    );
}
