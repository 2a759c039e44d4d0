//! `FLIGHTLOCK_PERMITS` through the extension's proxy: with 2 permits two execution environments
//! run the key's invocations side by side and a third is skipped naming both holders; an
//! environment configured with another number than the key's fails its invocation upstream with
//! `FlightlockPermitsMismatch`, never a skip, and its runtime never gets the event. Needs
//! DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use flightlock_testkit::platform::Outcome;
use serde_json::json;
use support::{get, respond, LIMIT, NEXT};

#[tokio::test]
async fn two_permits_run_two_environments_at_once_and_skip_a_third() {
    let (table, client) = support::table("ext_permits").await;
    let vars = [
        ("FLIGHTLOCK_KEY", "job"),
        ("FLIGHTLOCK_WAIT", "0"),
        ("FLIGHTLOCK_PERMITS", "2"),
    ];
    let envs = [
        support::standard().await,
        support::standard().await,
        support::standard().await,
    ];
    let mut ports = Vec::new();
    for (i, platform) in envs.iter().enumerate() {
        let host = format!("h{i}");
        let (port, _) = support::start_proxy(platform, &table, client.clone(), &vars, &host).await;
        ports.push(port);
    }

    // Two environments run at once: both get their events.
    let a = envs[0].invoke(json!({}));
    assert_eq!(get(ports[0], NEXT).await.request_id.as_ref(), Some(&a));
    let b = envs[1].invoke(json!({}));
    assert_eq!(get(ports[1], NEXT).await.request_id.as_ref(), Some(&b));

    // A third while both run: skipped upstream, naming both holders.
    let c = envs[2].invoke(json!({}));
    let port = ports[2];
    let waiting = tokio::spawn(async move { get(port, NEXT).await });
    let skipped = envs[2].answer(&c, LIMIT).await.expect("c answered");
    assert!(
        skipped.path.ends_with(&format!("{c}/response")),
        "{}",
        skipped.path
    );
    let body: serde_json::Value = serde_json::from_slice(&skipped.body).unwrap();
    assert_eq!(body["flightlock"]["reason"], "busy", "{body}");
    let mut named: Vec<String> = body["flightlock"]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["requestId"].as_str().unwrap().to_owned())
        .collect();
    named.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(named, both, "{body}");

    // One ends: the third environment's next invocation runs beside the other holder.
    assert!(respond(ports[0], &a, "{}").await.is_success());
    assert_eq!(
        envs[0].outcome(&a, LIMIT).await,
        Some(Outcome::Response("{}".into()))
    );
    let d = envs[2].invoke(json!({}));
    let got = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap();
    assert_eq!(got.request_id.as_ref(), Some(&d));
    for (port, id) in [(ports[1], &b), (ports[2], &d)] {
        assert!(respond(port, id, "{}").await.is_success());
    }
}

#[tokio::test]
async fn other_permits_than_the_keys_fail_upstream_never_skip() {
    let (table, client) = support::table("ext_permits_mismatch").await;
    let two = support::standard().await;
    let one = support::standard().await;
    let (port_two, _) = support::start_proxy(
        &two,
        &table,
        client.clone(),
        &[("FLIGHTLOCK_KEY", "job"), ("FLIGHTLOCK_PERMITS", "2")],
        "h2",
    )
    .await;
    // The key is first used with 2 permits.
    let a = two.invoke(json!({}));
    assert_eq!(get(port_two, NEXT).await.request_id.as_ref(), Some(&a));
    assert!(respond(port_two, &a, "{}").await.is_success());

    // An environment left at one permit (skip policy, the default): failed, not skipped.
    let (port_one, _) =
        support::start_proxy(&one, &table, client, &[("FLIGHTLOCK_KEY", "job")], "h1").await;
    let b = one.invoke(json!({}));
    let runtime = tokio::spawn(async move { get(port_one, NEXT).await });
    match one.outcome(&b, LIMIT).await {
        Some(Outcome::Error(error_type, body)) => {
            let body = String::from_utf8_lossy(&body);
            assert!(body.contains("FlightlockPermitsMismatch"), "{body}");
            assert!(
                body.contains("allows 2") && body.contains("configured with 1"),
                "{body}"
            );
            if let Some(t) = error_type {
                assert_eq!(t, "FlightlockPermitsMismatch");
            }
        }
        other => panic!("the mismatch was not failed upstream: {other:?}"),
    }
    assert!(
        !runtime.is_finished(),
        "the runtime never got the refused event"
    );
    runtime.abort();
}
