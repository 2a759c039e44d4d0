//! The handler's fencing token, through the invocation's client context, with the real runtime
//! clients: `awslambdaric` (Python) and `aws-lambda-ric` (Node.js) parse the
//! `Lambda-Runtime-Client-Context` header the proxy merged, and the handler
//! (`{"mode": "context"}` in `functions/demo-python/handler.py` and
//! `tests/e2e/runtimes/node_handler.mjs`; `lambda_runtime` in `functions/demo-rust`, behind the
//! extension and behind the in-process layer) answers what it read. RIE passes a caller's client
//! context through (its invoke endpoint takes `X-Amz-Client-Context` in base64, as the Invoke
//! API's `ClientContext`, and hands the decoded JSON to the runtime), so the caller's side is
//! checked on RIE too. Needs `eval "$(scripts/node-tools)"` for the Node.js runtime and
//! `eval "$(scripts/go-tools)"` for the Go one (`tests/e2e/runtimes/go`, Go's own `encoding/json`
//! decoding into the shape aws-lambda-go declares, started through the wrapper).

use flightlock_e2e::{finish, record_file, table, Env, Runtime, Spec};
use serde_json::{json, Value};

/// The `ticket` of the "lock acquired" line of invocation `request_id`: the extension's JSON
/// line, or the text line of the in-process layer (`invocation{request_id=.. ticket=..}`).
fn logged_ticket(log: &str, request_id: &str) -> Option<u64> {
    let json = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| {
            v["fields"]["message"] == "lock acquired" && v["span"]["request_id"] == request_id
        })
        .and_then(|v| v["span"]["ticket"].as_u64());
    json.or_else(|| {
        let line = log.lines().find(|l| {
            l.contains("lock acquired") && l.contains(&format!("request_id={request_id} "))
        })?;
        let digits: String = line
            .split_once(" ticket=")?
            .1
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

fn ticket_of(answer: &Value) -> u64 {
    answer["ticket"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the handler read no ticket: {answer}"))
}

async fn handler_reads_its_ticket(runtime: Runtime, name: &str) {
    let (endpoint, table) = table(&format!("e2e_cc_{name}")).await;
    let record = record_file(&format!("cc-{name}"));
    let layered = Spec::layered(name, runtime.clone()).with("AWS_LAMBDA_LOG_FORMAT", "JSON");
    // The in-process layer needs no extension (both would take the same key).
    let spec = match runtime {
        Runtime::RustInProcess => Spec {
            extension: false,
            wrapper: false,
            ..layered
        },
        _ => layered,
    };
    let env = Env::start(name, &spec, &endpoint, &table, &record).await;

    let first = env.invoke(json!({"mode": "context"})).await.json();
    let t1 = ticket_of(&first);
    let custom = &first["clientContext"]["custom"];
    assert_eq!(custom["flightlockKey"], name, "{first}");
    assert!(
        custom["flightlockWaitedMs"]
            .as_str()
            .is_some_and(|w| w.parse::<u64>().is_ok()),
        "{first}"
    );
    let id = first["requestId"].as_str().expect("request id");
    assert_eq!(
        logged_ticket(&env.log(), id),
        Some(t1),
        "the handler's token is the ticket in the extension's log line\n{}",
        env.log()
    );

    assert!(custom.get("flightlockTick").is_none(), "no tick: {first}");

    // The next one, a scheduled tick (the default FLIGHTLOCK_TICK reads its `time`).
    let mut tick = flightlock_testkit::events::scheduled(
        flightlock_testkit::events::SCHEDULED_ID,
        "2026-11-25T10:00:00Z",
    );
    tick["mode"] = json!("context");
    let second = env.invoke(tick).await.json();
    assert!(ticket_of(&second) > t1, "{first} then {second}");
    assert_eq!(
        second["clientContext"]["custom"]["flightlockTick"], "2026-11-25T10:00:00.000Z",
        "{second}"
    );
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_handler_reads_its_ticket_and_the_next_a_higher_one() {
    handler_reads_its_ticket(Runtime::Python, "ccpy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_handler_reads_its_ticket_and_the_next_a_higher_one() {
    handler_reads_its_ticket(Runtime::Node, "ccnode").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_handler_behind_the_extension_reads_its_ticket() {
    handler_reads_its_ticket(Runtime::Rust, "ccrust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_handler_behind_the_in_process_layer_reads_its_ticket() {
    handler_reads_its_ticket(Runtime::RustInProcess, "ccrustinproc").await;
}

/// Standard base64 with padding (what the SDKs send as the Invoke API's `ClientContext`; the
/// readers' line format in `context_readers.rs`).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn callers_context_survives(runtime: Runtime, name: &str) {
    let (endpoint, table) = table(&format!("e2e_cc_{name}")).await;
    let record = record_file(&format!("cc-{name}"));
    // aws-lambda-go's ClientApplication has no app_version_name: Go's reader drops it.
    let go = matches!(runtime, Runtime::Go);
    let spec = Spec::layered(name, runtime);
    let env = Env::start(name, &spec, &endpoint, &table, &record).await;
    let client = json!({
        "installation_id": "inst-1",
        "app_title": "App",
        "app_version_name": "1.0",
        "app_version_code": "7",
        "app_package_name": "com.example.app",
    });
    let caller = json!({
        "client": client,
        "custom": {"tenant": "acme", "flightlockTicket": "99999999"},
        "env": {"locale": "en_GB", "platform": "test"},
    });
    let header = base64(caller.to_string().as_bytes());
    let answer = env
        .invoke_with(
            json!({"mode": "context"}).to_string(),
            &[("X-Amz-Client-Context", header.as_str())],
        )
        .await
        .json();
    let cc = &answer["clientContext"];
    assert_eq!(cc["custom"]["tenant"], "acme", "{answer}");
    assert_eq!(cc["env"], caller["env"], "{answer}");
    let mut expected_client = client.clone();
    if go {
        expected_client
            .as_object_mut()
            .expect("an object")
            .remove("app_version_name");
    }
    assert_eq!(cc["client"], expected_client, "{answer}");
    let ticket = ticket_of(&answer);
    assert_ne!(
        ticket, 99_999_999,
        "a caller's forged token must not reach the handler"
    );
    assert!(
        env.log().contains("they were removed"),
        "the removal is logged\n{}",
        env.log()
    );
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_callers_client_context_survives_beside_ours() {
    callers_context_survives(Runtime::Python, "ccpycaller").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_callers_client_context_survives_beside_ours() {
    callers_context_survives(Runtime::Node, "ccnodecaller").await;
}

#[test]
fn base64_matches_the_rfc_4648_vectors() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
}

/// A caller's client context the extension cannot read with certainty fails the invocation with
/// `FlightlockClientContextInvalid` before the lock is taken, and the handler never runs: above
/// all the issue's case, a lone surrogate that `aws-lambda-ric` and `awslambdaric` read and
/// `serde_json` does not, beside a forged `flightlockTicket`. A context written twice over the
/// same name, or nested deeper than `serde_json` reads, likewise. The next, ordinary invocation
/// runs with its own ticket.
async fn unreadable_contexts_never_reach_the_handler(runtime: Runtime, name: &str) {
    let (endpoint, table) = table(&format!("e2e_cc_{name}")).await;
    let record = record_file(&format!("cc-{name}"));
    let spec = Spec::layered(name, runtime);
    let env = Env::start(name, &spec, &endpoint, &table, &record).await;
    let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    let hostile = [
        r#"{"custom":{"\udc00":"","flightlockTicket":"999999999"}}"#.to_owned(),
        r#"{"custom":{"flightlockTicket":"999999999"},"custom":{"a":"b"}}"#.to_owned(),
        r#"{"custom":{"a":"b"},"custom":{"flightlockTicket":"999999999"}}"#.to_owned(),
        format!(r#"{{"custom":{{"flightlockTicket":"999999999"}},"env":{deep}}}"#),
        // Names Go's encoding/json (aws-lambda-go) folds into ClientContext.Custom, merging them.
        "{\"cu\u{17f}tom\":{\"flightlockTicket\":\"999999999\"}}".to_owned(),
        r#"{"cu\u017ftom":{"flightlockTicket":"999999999"}}"#.to_owned(),
        r#"{"custom":{"a":"b"},"Custom":{"flightlockTicket":"999999999","flightlockPermits":"9"}}"#
            .to_owned(),
        format!(
            r#"{{"Custom":{{"flightlockTicket":"999999999","pad":"{}"}}}}"#,
            "x".repeat(2600)
        ),
    ];
    for caller in &hostile {
        let r = env
            .invoke_with(
                json!({"mode": "context"}).to_string(),
                &[("X-Amz-Client-Context", base64(caller.as_bytes()).as_str())],
            )
            .await;
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert!(
            !body.contains("999999999"),
            "a forged token reached the handler: {body}\n{}",
            env.log()
        );
        assert_eq!(
            r.json()["errorType"],
            "FlightlockClientContextInvalid",
            "{caller}: {body}\n{}",
            env.log()
        );
    }
    let answer = env.invoke(json!({"mode": "context"})).await.json();
    assert!(ticket_of(&answer) > 0, "{answer}");
    finish(env, &record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_unreadable_client_contexts_never_reach_the_handler() {
    unreadable_contexts_never_reach_the_handler(Runtime::Node, "ccnodehostile").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_unreadable_client_contexts_never_reach_the_handler() {
    unreadable_contexts_never_reach_the_handler(Runtime::Python, "ccpyhostile").await;
}

// Go: an OS-only runtime started through the wrapper, its context read by Go's encoding/json.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_handler_reads_its_ticket_and_the_next_a_higher_one() {
    handler_reads_its_ticket(Runtime::Go, "ccgo").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_callers_client_context_survives_beside_ours() {
    callers_context_survives(Runtime::Go, "ccgocaller").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_unreadable_and_look_alike_client_contexts_never_reach_the_handler() {
    unreadable_contexts_never_reach_the_handler(Runtime::Go, "ccgohostile").await;
}
