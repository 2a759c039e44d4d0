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
    let (layer, _, _) = layer("inproc_lock_context", &[]).await;
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
    let (layer, _, _) = layer("inproc_lock_context_caller", &[]).await;
    let service = reporting(&layer);
    let mut e = event("req-1", json!({}));
    e.context.client_context = serde_json::from_value(json!({
        // `lambda_runtime` wants every `client` field, and names the environment `environment`.
        "client": {"installationId": "inst-1", "appTitle": "App", "appVersionName": "1.0",
                   "appVersionCode": "1", "appPackageName": "com.example"},
        // Forged entries, among them names this invocation does not write itself (it has no
        // tick and one permit): none may reach the handler.
        "custom": {"tenant": "acme", "flightlockTicket": "99999999", "flightlockTick": "forged",
                   "flightlockPermits": "9", "flightlockOther": "x"},
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
    let reserved: Vec<&String> = after["custom"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("flightlock"))
        .collect();
    assert_eq!(
        reserved,
        ["flightlockKey", "flightlockTicket", "flightlockWaitedMs"],
        "{after}"
    );
}

/// The client context the in-process layer meets was parsed by `lambda_runtime` from the
/// Runtime API's header: whatever bytes a caller sent there, either `lambda_runtime` refuses the
/// header (the invocation fails before the layer runs) or the handler reads no reserved entry
/// but the layer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_client_contexts_parsed_by_lambda_runtime_carry_no_forged_entry() {
    use lambda_runtime::{Config, Context};
    let (layer, _, _) = layer("inproc_lock_context_hostile", &[]).await;
    let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    let forged = r#""flightlockTicket":"999999999","flightlockTick":"t""#;
    let contexts = [
        format!(r#"{{"custom":{{"\udc00":"",{forged}}}}}"#),
        format!(r#"{{"custom":{{{forged}}},"custom":{{"a":"b"}}}}"#),
        format!(r#"{{"custom":{{"a":"b"}},"custom":{{{forged}}}}}"#),
        format!(r#"{{"custom":{{{forged},"flightlockTicket":"8"}}}}"#),
        format!(r#"{{"custom":{{"\u0066lightlockTicket":"7",{forged}}}}}"#),
        format!(r#"{{"custom":{{{forged}}},"env":{deep}}}"#),
        format!(r#"{{"custom":{{{forged}}},"pad":"{}"}}"#, "p".repeat(4000)),
        format!(r#"{{"custom":{{{forged}}}}}"#),
    ];
    let config = std::sync::Arc::new(Config::default());
    let (mut parsed, mut refused, mut last) = (0, 0, 0);
    for (i, text) in contexts.iter().enumerate() {
        let mut headers = http::HeaderMap::new();
        headers.insert("lambda-runtime-aws-request-id", "r".parse().unwrap());
        headers.insert(
            "lambda-runtime-deadline-ms",
            "9999999999999".parse().unwrap(),
        );
        headers.insert("lambda-runtime-client-context", text.parse().unwrap());
        let Ok(context) = Context::new(&format!("req-h{i}"), config.clone(), &headers) else {
            refused += 1;
            continue;
        };
        parsed += 1;
        let mut e = event(&format!("req-h{i}"), json!({}));
        e.context = context;
        let out = ran(reporting(&layer).oneshot(e).await);
        let custom = out["clientContext"]["custom"].as_object().unwrap().clone();
        // Exactly the layer's entries, each with the layer's value: a forged one would show as
        // a name too many (`flightlockTick`) or a value that is not this invocation's.
        let reserved: Vec<&str> = custom
            .keys()
            .filter(|k| k.starts_with("flightlock"))
            .map(String::as_str)
            .collect();
        assert_eq!(
            reserved,
            ["flightlockKey", "flightlockTicket", "flightlockWaitedMs"],
            "from {text}"
        );
        // `ticket()` reads the context too, so the table's fresh counter is the independent
        // witness: each invocation's ticket is above the last one's and nowhere near the forgery.
        let ticket = out["ticket"].as_u64().unwrap();
        assert_eq!(
            custom["flightlockTicket"],
            ticket.to_string(),
            "from {text}"
        );
        assert!(
            ticket > last && ticket < 1_000,
            "ticket {ticket} after {last}, from {text}"
        );
        last = ticket;
        assert_eq!(custom["flightlockKey"], "nightly", "from {text}");
        let waited: u64 = custom["flightlockWaitedMs"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(waited < 60_000, "waited {waited} ms, from {text}");
    }
    // Both sides are met: lambda_runtime refuses some, parses others.
    assert!(
        parsed >= 3 && refused >= 2,
        "{parsed} parsed, {refused} refused"
    );
}
