//! The handler behind the in-process layer learns its lock as a handler behind the extension
//! does: `flightlockTicket`, `flightlockKey`, `flightlockWaitedMs` in the client context's
//! `custom`, beside the caller's own entries.

use super::*;

/// A handler answering its ticket (read with `flightlock_lambda::ticket`) and its whole
/// client context.
pub(super) fn reporting(layer: &FlightlockLayer) -> Handler {
    let handler = lambda_runtime::service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<Value, Diagnostic>(json!({
            "ticket": flightlock_lambda::ticket(&event.context),
            "clientContext": event.context.client_context,
        }))
    });
    lambda_runtime::tower::util::BoxCloneService::new(
        ServiceBuilder::new().layer(layer.clone()).service(handler),
    )
}

fn ran(result: Result<Gated<Value>, Diagnostic>) -> Value {
    match result {
        Ok(Gated::Ran(v)) => v,
        other => panic!("the handler did not run: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_reads_its_ticket_key_and_wait_and_the_next_one_a_higher_ticket() {
    let (layer, _, _) = layer("inproc_handover", &[]).await;
    let service = reporting(&layer);
    let first = ran(call(service.clone(), "req-1", json!({})).await);
    let custom = &first["clientContext"]["custom"];
    let ticket = first["ticket"].as_u64().expect("a ticket");
    assert_eq!(custom["flightlockTicket"], ticket.to_string());
    assert_eq!(custom["flightlockKey"], "nightly");
    assert!(
        custom["flightlockWaitedMs"]
            .as_str()
            .is_some_and(|w| w.parse::<u64>().is_ok()),
        "{custom}"
    );
    assert!(custom.get("flightlockTick").is_none(), "no tick: {custom}");
    assert!(
        custom.get("flightlockPermits").is_none(),
        "one permit (the default) is not handed over: {custom}"
    );
    let second = ran(call(service, "req-2", json!({})).await);
    assert!(
        second["ticket"].as_u64().expect("a ticket") > ticket,
        "{first} then {second}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_client_context_is_kept_and_a_forged_ticket_replaced() {
    let (layer, _, _) = layer("inproc_handover_caller", &[]).await;
    let service = reporting(&layer);
    let mut e = event("req-1", json!({}));
    e.context.client_context = serde_json::from_value(json!({
        // `lambda_runtime` wants every `client` field, and names the environment `environment`.
        "client": {"installationId": "inst-1", "appTitle": "App", "appVersionName": "1.0",
                   "appVersionCode": "1", "appPackageName": "com.example"},
        "custom": {"tenant": "acme", "flightlockTicket": "99999999"},
        "environment": {"locale": "en_GB"},
    }))
    .unwrap();
    let before = serde_json::to_value(&e.context.client_context).unwrap();
    let out = ran(service.oneshot(e).await);
    let after = &out["clientContext"];
    assert_eq!(after["client"]["appTitle"], "App");
    assert_eq!(after["client"], before["client"]);
    assert_eq!(after["environment"]["locale"], "en_GB");
    assert_eq!(after["environment"], before["environment"]);
    assert_eq!(after["custom"]["tenant"], "acme");
    assert_ne!(after["custom"]["flightlockTicket"], "99999999");
    assert_eq!(
        after["custom"]["flightlockTicket"],
        out["ticket"].as_u64().unwrap().to_string()
    );
}
