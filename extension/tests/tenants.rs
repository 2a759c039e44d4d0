//! Tenant isolation (`TenantIsolationMode=PER_TENANT`): with `FLIGHTLOCK_KEY=job-{tenant}`, the
//! proxy keys each invocation by the `Lambda-Runtime-Aws-Tenant-Id` header of its event. Lambda
//! gives every tenant its own execution environments, so here each environment is its own proxy
//! and scripted Runtime API, all on one lock table: two tenants run side by side, a second
//! invocation of a tenant already running is skipped, and an event without a tenant id is failed
//! with `FlightlockKeyError`, never run unlocked. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flightlock::{ClockSkew, Locker};
use support::{get, respond, Event, FakeRuntimeApi, NEXT};

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
    let mut blue1 = FakeRuntimeApi::start().await;
    let mut blue2 = FakeRuntimeApi::start().await;
    let green = FakeRuntimeApi::start().await;
    let mut ports = Vec::new();
    for api in [&blue1, &blue2, &green] {
        let config = support::config(&table, &api.addr, &vars);
        let (port, _) = support::start_proxy(config, client.clone(), &api.addr, "t").await;
        ports.push(port);
    }

    blue1.push(Event::new("b-1", "{}").tenant("blue"));
    let got = get(ports[0], NEXT).await;
    assert_eq!(got.request_id.as_deref(), Some("b-1"));
    // The runtime sees the tenant header too (its context's tenant id).
    assert_eq!(got.tenant.as_deref(), Some("blue"));
    assert_eq!(holder(&locker, "job-blue").await.as_deref(), Some("b-1"));

    // Same tenant, another environment, while b-1 runs: skipped, answered upstream.
    blue2.push(Event::new("b-2", "{}").tenant("blue"));
    let port = ports[1];
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    let skipped = blue2.answer().await;
    assert_eq!(skipped.path, "/2018-06-01/runtime/invocation/b-2/response");
    let body: serde_json::Value = serde_json::from_slice(&skipped.body).unwrap();
    assert_eq!(body["flightlock"]["skipped"], true, "{body}");
    assert_eq!(body["flightlock"]["key"], "job-blue", "{body}");

    // Another tenant at the same time: runs.
    green.push(Event::new("g-1", "{}").tenant("green"));
    let got = get(ports[2], NEXT).await;
    assert_eq!(got.request_id.as_deref(), Some("g-1"));
    assert_eq!(holder(&locker, "job-green").await.as_deref(), Some("g-1"));
    assert_eq!(holder(&locker, "job-blue").await.as_deref(), Some("b-1"));

    // b-1 ends; blue's next invocation runs.
    assert!(respond(ports[0], "b-1", "{}").await.is_success());
    assert_eq!(
        blue1.answer().await.path,
        "/2018-06-01/runtime/invocation/b-1/response"
    );
    assert_eq!(holder(&locker, "job-blue").await, None);
    blue2.push(Event::new("b-3", "{}").tenant("blue"));
    let got = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.request_id.as_deref(), Some("b-3"));
    assert_eq!(holder(&locker, "job-blue").await.as_deref(), Some("b-3"));
}

#[tokio::test]
async fn an_event_without_a_tenant_id_is_failed_never_run_unlocked() {
    let (table, client) = support::table("notenant").await;
    let mut api = FakeRuntimeApi::start().await;
    let config = support::config(&table, &api.addr, &[("FLIGHTLOCK_KEY", "job-{tenant}")]);
    let (port, _) = support::start_proxy(config, client.clone(), &api.addr, "t").await;
    api.push(Event::new("n-1", r#"{"secret":"payload"}"#));
    api.push(Event::new("n-2", "{}").tenant("blue"));
    let got = get(port, NEXT).await;
    // The runtime never got n-1; it got the next event, locked.
    assert_eq!(got.request_id.as_deref(), Some("n-2"));
    let failed = api.answer().await;
    assert_eq!(failed.path, "/2018-06-01/runtime/invocation/n-1/error");
    assert_eq!(
        failed.headers["lambda-runtime-function-error-type"],
        "FlightlockKeyError"
    );
    assert!(
        failed.text().contains("TenantIsolationMode"),
        "{}",
        failed.text()
    );
    let locker = Locker::new(client, &table);
    assert_eq!(holder(&locker, "job-blue").await.as_deref(), Some("n-2"));
}
