//! The lock API through the extension's proxy, on DynamoDB Local, in front of the Lambda
//! platform double: a handler locks records of its own, another environment finds them busy,
//! and whatever an invocation still holds is released when it ends (its response, SHUTDOWN, an
//! acquisition that comes through after the end). Calls without the session token, for another
//! invocation or after the end are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use http::StatusCode;
use serde_json::json;
use support::{get, lock_api, respond, LIMIT, NEXT, SESSION_TOKEN};

const TOKEN: Option<&str> = Some(SESSION_TOKEN);
/// Batch consumers: no invocation gated, records locked through the API.
const RECORDS_ONLY: &[(&str, &str)] = &[("FLIGHTLOCK_GATE", "off")];

fn key(k: &str) -> Option<serde_json::Value> {
    Some(json!({ "key": k }))
}

#[tokio::test]
async fn records_are_held_per_invocation_and_released_when_it_ends() {
    let (table, client) = support::table("ext_api_records").await;
    let (one, two) = (support::standard().await, support::standard().await);
    let (p1, _) = support::start_proxy(&one, &table, client.clone(), RECORDS_ONLY, "h1").await;
    let (p2, _) = support::start_proxy(&two, &table, client, RECORDS_ONLY, "h2").await;

    // Not gated: the handler gets its event at once, with no lock of the gate.
    let a = one.invoke(json!({"Records": []}));
    let got = get(p1, NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&a));

    let (status, first) = lock_api(p1, TOKEN, &a, "acquire", key("order-1")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["key"], "order-1");
    assert_eq!(first["permits"], 1);
    let token = first["token"].as_u64().expect("a token");
    let (status, other) = lock_api(p1, TOKEN, &a, "acquire", key("order-2")).await;
    assert_eq!(status, StatusCode::OK, "{other}");
    // Not reentrant: the same key twice in one invocation is refused, not waited for.
    let (status, again) = lock_api(p1, TOKEN, &a, "acquire", key("order-1")).await;
    assert_eq!(
        (status, again["error"].as_str()),
        (StatusCode::CONFLICT, Some("alreadyHeld"))
    );
    let (status, list) = lock_api(p1, TOKEN, &a, "locks", None).await;
    assert_eq!(status, StatusCode::OK);
    let keys: Vec<&str> = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["order-1", "order-2"], "{list}");
    assert_eq!(list["locks"][0]["token"], token);
    assert_eq!(list["locks"][0]["lost"], false);

    // Another environment's invocation finds order-1 busy, naming the holder.
    let b = two.invoke(json!({}));
    assert_eq!(get(p2, NEXT).await.request_id.as_ref(), Some(&b));
    let (status, busy) = lock_api(
        p2,
        TOKEN,
        &b,
        "acquire",
        Some(json!({"key": "order-1", "waitMs": 0})),
    )
    .await;
    assert_eq!(
        (status, busy["error"].as_str()),
        (StatusCode::CONFLICT, Some("busy")),
        "{busy}"
    );
    assert_eq!(busy["holders"][0]["ticket"], token, "{busy}");
    assert!(busy["holders"][0]["host"].is_string(), "{busy}");
    // Never the holder's request id (on Managed Instances its name to the lock API), nor its
    // owner id.
    let text = busy.to_string();
    assert!(
        !text.contains(a.as_str()) && busy["holders"][0].get("owner").is_none(),
        "{busy}"
    );
    // It cannot act for the other environment's invocation.
    let (status, refused) = lock_api(p2, TOKEN, &a, "release", key("order-1")).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("notInFlight"))
    );

    // A release frees one; releasing it again says it is not held.
    let (status, released) = lock_api(p1, TOKEN, &a, "release", key("order-2")).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["released"], true);
    let (status, again) = lock_api(p1, TOKEN, &a, "release", key("order-2")).await;
    assert_eq!(
        (status, again["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("notHeld"))
    );

    // The invocation ends still holding order-1: it is released before the runtime hears back.
    assert!(respond(p1, &a, "{}").await.is_success());
    let (status, late) = lock_api(p1, TOKEN, &a, "acquire", key("order-3")).await;
    assert_eq!(
        (status, late["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("notInFlight"))
    );
    let (status, taken) = lock_api(
        p2,
        TOKEN,
        &b,
        "acquire",
        Some(json!({"key": "order-1", "waitMs": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{taken}");
    assert!(
        taken["token"].as_u64().unwrap() > token,
        "fencing: {taken} after {token}"
    );
    assert!(respond(p2, &b, "{}").await.is_success());
}

#[tokio::test]
async fn calls_without_the_session_token_or_for_no_invocation_here_are_refused() {
    let (table, client) = support::table("ext_api_refused").await;
    let env = support::standard().await;
    let (port, _) = support::start_proxy(&env, &table, client.clone(), RECORDS_ONLY, "h").await;
    let a = env.invoke(json!({}));
    assert_eq!(get(port, NEXT).await.request_id.as_ref(), Some(&a));

    let (status, r) = lock_api(port, None, &a, "acquire", key("k")).await;
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    let (status, r) = lock_api(port, Some("guess"), &a, "acquire", key("k")).await;
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let (status, r) = lock_api(port, TOKEN, "not-an-invocation", "acquire", key("k")).await;
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("notInFlight"))
    );
    // Bad input: a clear answer, nothing taken.
    for (body, word) in [
        (json!({"key": "k", "wait": 1}), "unknown field `wait`"),
        (json!({"key": "k".repeat(1025)}), "at most 1024 bytes"),
        (json!({"key": "k", "permits": 0}), "1 to 100"),
    ] {
        let (status, r) = lock_api(port, TOKEN, &a, "acquire", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{r}");
        assert!(r["message"].as_str().unwrap().contains(word), "{r}");
    }
    // Oversized: refused before it is parsed.
    let big = json!({"key": "k", "pad": "x".repeat(5000)});
    let (status, r) = lock_api(port, TOKEN, &a, "acquire", Some(big)).await;
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("tooLarge")),
        "{r}"
    );
    let (_, list) = lock_api(port, TOKEN, &a, "locks", None).await;
    assert_eq!(list["locks"], json!([]));
    // A key configured with other permits than its first holders': refused, never busy.
    let (status, r) = lock_api(
        port,
        TOKEN,
        &a,
        "acquire",
        Some(json!({"key": "p", "permits": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let b_env = support::standard().await;
    let (p2, _) = support::start_proxy(&b_env, &table, client.clone(), RECORDS_ONLY, "h2").await;
    let b = b_env.invoke(json!({}));
    assert_eq!(get(p2, NEXT).await.request_id.as_ref(), Some(&b));
    let (status, r) = lock_api(
        p2,
        TOKEN,
        &b,
        "acquire",
        Some(json!({"key": "p", "waitMs": 0})),
    )
    .await;
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::CONFLICT, Some("permitsMismatch")),
        "{r}"
    );
    assert!(respond(port, &a, "{}").await.is_success());
    assert!(respond(p2, &b, "{}").await.is_success());

    // An extension without a session token (a blank one counts as unset) serves nothing.
    let bare = support::standard().await;
    let vars = [("FLIGHTLOCK_GATE", "off"), ("AWS_SESSION_TOKEN", "")];
    let (p3, _) = support::start_proxy(&bare, &table, client, &vars, "h3").await;
    let c = bare.invoke(json!({}));
    assert_eq!(get(p3, NEXT).await.request_id.as_ref(), Some(&c));
    for token in [TOKEN, Some("")] {
        let (status, r) = lock_api(p3, token, &c, "acquire", key("k")).await;
        assert_eq!(
            (status, r["error"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
            "{r}"
        );
    }
    assert!(respond(p3, &c, "{}").await.is_success());
}

#[tokio::test]
async fn an_acquisition_that_comes_through_after_its_invocation_ended_is_released_at_once() {
    let (table, client) = support::table("ext_api_late").await;
    let (one, two) = (support::standard().await, support::standard().await);
    let (p1, _) = support::start_proxy(&one, &table, client.clone(), RECORDS_ONLY, "h1").await;
    let (p2, _) = support::start_proxy(&two, &table, client, RECORDS_ONLY, "h2").await;
    let a = one.invoke(json!({}));
    assert_eq!(get(p1, NEXT).await.request_id.as_ref(), Some(&a));
    let (status, _) = lock_api(p1, TOKEN, &a, "acquire", key("x")).await;
    assert_eq!(status, StatusCode::OK);

    // b waits for x, and its invocation ends while it waits.
    let b = two.invoke(json!({}));
    assert_eq!(get(p2, NEXT).await.request_id.as_ref(), Some(&b));
    let b2 = b.clone();
    let waiting = tokio::spawn(async move {
        lock_api(
            p2,
            TOKEN,
            &b2,
            "acquire",
            Some(json!({"key": "x", "waitMs": 20000})),
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(respond(p2, &b, "{}").await.is_success());
    // a lets go: b's acquisition is granted after its invocation ended, and gives it back.
    let (status, _) = lock_api(p1, TOKEN, &a, "release", key("x")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, r) = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap();
    assert_eq!(
        (status, r["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("notInFlight")),
        "{r}"
    );
    let (status, r) = lock_api(
        p1,
        TOKEN,
        &a,
        "acquire",
        Some(json!({"key": "x", "waitMs": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "x is free again: {r}");
    assert!(respond(p1, &a, "{}").await.is_success());
}

#[tokio::test]
async fn shutdown_releases_what_unfinished_invocations_hold() {
    let (table, client) = support::table("ext_api_shutdown").await;
    let (one, two) = (support::standard().await, support::standard().await);
    let (p1, proxy) = support::start_proxy(&one, &table, client.clone(), RECORDS_ONLY, "h1").await;
    let (p2, _) = support::start_proxy(&two, &table, client, RECORDS_ONLY, "h2").await;
    let a = one.invoke(json!({}));
    assert_eq!(get(p1, NEXT).await.request_id.as_ref(), Some(&a));
    for k in ["s1", "s2", "s3"] {
        assert_eq!(
            lock_api(p1, TOKEN, &a, "acquire", key(k)).await.0,
            StatusCode::OK
        );
    }
    proxy.release_all(std::time::Duration::from_secs(5)).await;
    let b = two.invoke(json!({}));
    assert_eq!(get(p2, NEXT).await.request_id.as_ref(), Some(&b));
    for k in ["s1", "s2", "s3"] {
        let (status, r) = lock_api(
            p2,
            TOKEN,
            &b,
            "acquire",
            Some(json!({"key": k, "waitMs": 0})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{k} free after shutdown: {r}");
    }
    assert!(respond(p2, &b, "{}").await.is_success());
}

#[tokio::test]
async fn with_the_gate_on_the_handler_holds_its_records_beside_the_invocations_key() {
    let (table, client) = support::table("ext_api_gated").await;
    let (one, two) = (support::standard().await, support::standard().await);
    let gated = [("FLIGHTLOCK_KEY", "job"), ("FLIGHTLOCK_WAIT", "0")];
    let (p1, _) = support::start_proxy(&one, &table, client.clone(), &gated, "h1").await;
    let (p2, _) = support::start_proxy(&two, &table, client, RECORDS_ONLY, "h2").await;
    let a = one.invoke(json!({}));
    assert_eq!(get(p1, NEXT).await.request_id.as_ref(), Some(&a));
    assert_eq!(
        lock_api(p1, TOKEN, &a, "acquire", key("rec")).await.0,
        StatusCode::OK
    );
    // The gate's own key: refused at once (it used to wait for itself until the deadline, then
    // answer busy or noDecision).
    let (status, own) = lock_api(
        p1,
        TOKEN,
        &a,
        "acquire",
        Some(json!({"key": "job", "waitMs": 60_000})),
    )
    .await;
    assert_eq!(
        (status, own["error"].as_str()),
        (StatusCode::CONFLICT, Some("heldByGate")),
        "{own}"
    );
    // Both the gate's key and the record are held while a runs.
    let b = two.invoke(json!({}));
    assert_eq!(get(p2, NEXT).await.request_id.as_ref(), Some(&b));
    for k in ["job", "rec"] {
        let (status, r) = lock_api(
            p2,
            TOKEN,
            &b,
            "acquire",
            Some(json!({"key": k, "waitMs": 0})),
        )
        .await;
        assert_eq!(
            (status, r["error"].as_str()),
            (StatusCode::CONFLICT, Some("busy")),
            "{k}: {r}"
        );
    }
    assert!(respond(p1, &a, "{}").await.is_success());
    for k in ["job", "rec"] {
        let (status, r) = lock_api(
            p2,
            TOKEN,
            &b,
            "acquire",
            Some(json!({"key": k, "waitMs": 0})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{k}: {r}");
    }
    assert!(respond(p2, &b, "{}").await.is_success());
    // b's response released both of its locks: a third invocation takes them at once.
    let c = one.invoke(json!({}));
    assert_eq!(get(p1, NEXT).await.request_id.as_ref(), Some(&c));
    assert_eq!(
        lock_api(p1, TOKEN, &c, "acquire", key("rec")).await.0,
        StatusCode::OK
    );
    assert!(respond(p1, &c, "{}").await.is_success());
}
