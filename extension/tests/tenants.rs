//! Tenant isolation (`TenantIsolationMode=PER_TENANT`): with `FLIGHTLOCK_KEY=job-{tenant}`, the
//! proxy keys each invocation by the `Lambda-Runtime-Aws-Tenant-Id` header of its event. Lambda
//! gives every tenant its own execution environments, so here each environment is its own proxy
//! and platform double, all on one lock table: two tenants run side by side, a second
//! invocation of a tenant already running is skipped, and an event without a tenant id (a
//! function not in tenant isolation mode) is failed with `FlightlockKeyError`, never run
//! unlocked. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flightlock::{ClockSkew, Locker};
use flightlock_testkit::platform::Outcome;
use serde_json::json;
use support::{get, respond, LIMIT, NEXT};

async fn holder(locker: &Locker, key: &str) -> Option<String> {
    locker
        .holder(key, ClockSkew::Bounded(Duration::from_secs(1)))
        .await
        .unwrap()
        .and_then(|h| h.info.request_id)
}

#[tokio::test]
async fn tenants_run_side_by_side_and_one_tenant_runs_once_at_a_time() {
    let (table, client) = support::table("tenants").await;
    let locker = Locker::new(client.clone(), &table);
    let vars = [("FLIGHTLOCK_KEY", "job-{tenant}"), ("FLIGHTLOCK_WAIT", "0")];
    // Three environments: two of tenant blue, one of tenant green.
    let blue1 = support::of_tenant("blue").await;
    let blue2 = support::of_tenant("blue").await;
    let green = support::of_tenant("green").await;
    let mut ports = Vec::new();
    for platform in [&blue1, &blue2, &green] {
        let (port, _) = support::start_proxy(platform, &table, client.clone(), &vars, "t").await;
        ports.push(port);
    }

    let b1 = blue1.invoke(json!({}));
    let got = get(ports[0], NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&b1));
    // The runtime sees the tenant header too (its context's tenant id).
    assert_eq!(got.tenant.as_deref(), Some("blue"));
    assert_eq!(holder(&locker, "job-blue").await, Some(b1.clone()));

    // Same tenant, another environment, while b-1 runs: skipped, answered upstream.
    let b2 = blue2.invoke(json!({}));
    let port = ports[1];
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    let skipped = blue2.answer(&b2, LIMIT).await.expect("b-2 answered");
    assert_eq!(
        skipped.path,
        format!("/2018-06-01/runtime/invocation/{b2}/response")
    );
    let body: serde_json::Value = serde_json::from_slice(&skipped.body).unwrap();
    assert_eq!(body["flightlock"]["skipped"], true, "{body}");
    assert_eq!(body["flightlock"]["key"], "job-blue", "{body}");

    // Another tenant at the same time: runs.
    let g1 = green.invoke(json!({}));
    let got = get(ports[2], NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&g1));
    assert_eq!(holder(&locker, "job-green").await, Some(g1));
    assert_eq!(holder(&locker, "job-blue").await, Some(b1.clone()));

    // b-1 ends; blue's next invocation runs.
    assert!(respond(ports[0], &b1, "{}").await.is_success());
    assert_eq!(
        blue1.outcome(&b1, LIMIT).await,
        Some(Outcome::Response("{}".into()))
    );
    assert_eq!(holder(&locker, "job-blue").await, None);
    let b3 = blue2.invoke(json!({}));
    let got = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap();
    assert_eq!(got.request_id.as_ref(), Some(&b3));
    assert_eq!(holder(&locker, "job-blue").await, Some(b3));
}

#[tokio::test]
async fn an_event_without_a_tenant_id_is_failed_never_run_unlocked() {
    let (table, client) = support::table("notenant").await;
    let platform = support::standard().await;
    let vars = [("FLIGHTLOCK_KEY", "job-{tenant}")];
    let (port, _) = support::start_proxy(&platform, &table, client, &vars, "t").await;
    let n1 = platform.invoke(json!({"secret": "payload"}));
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    let failed = platform.answer(&n1, LIMIT).await.expect("n-1 answered");
    assert_eq!(
        failed.path,
        format!("/2018-06-01/runtime/invocation/{n1}/error")
    );
    assert_eq!(
        failed.headers["lambda-runtime-function-error-type"],
        "FlightlockKeyError"
    );
    assert!(
        failed.text().contains("TenantIsolationMode"),
        "{}",
        failed.text()
    );
    // The proxy asks Lambda for the next event on the runtime's behalf: the runtime, still
    // waiting, never got n-1.
    assert!(platform.wait_runtimes_waiting(1, LIMIT).await);
    assert_eq!(platform.runtime_nexts(), 2);
    assert!(!waiting.is_finished(), "the runtime got the failed event");
    waiting.abort();
}
