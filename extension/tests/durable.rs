//! Durable functions: one execution is many invocations (checkpoint and replay). Each
//! invocation's event is the durable envelope, not the user's event: `DurableExecutionArn`,
//! `CheckpointToken` and `InitialExecutionState.Operations`, whose first operation (type
//! `EXECUTION`) carries the user's input as a JSON *string* in `ExecutionDetails.InputPayload`
//! (AWS Lambda API reference, `Operation` / `ExecutionDetails`; the durable execution SDKs'
//! `DurableExecutionInput`). The recommended setup (the guide's `docs/src/recipes/durable.md`):
//! `FLIGHTLOCK_KEY=durable-{/DurableExecutionArn}`, a wait longer than zero and
//! `FLIGHTLOCK_ON_BUSY=error`. Here a replay that arrives while the previous invocation of its
//! execution still holds the key waits and then runs (never answered as "busy": a skip body is no
//! durable output), while another execution runs beside it. Needs DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flightlock::{ClockSkew, EntryState, Locker};
use flightlock_lambda::key::KeyTemplate;
use support::{get, respond, LIMIT, NEXT};

// Illustrative execution ARNs: flightlock treats the value as an opaque string.
const ARN_A: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:orders:1/durable-execution/order-42/3f1c";
const ARN_B: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:orders:1/durable-execution/order-43/9a7e";

/// The envelope of one invocation of execution `arn`: `steps` steps already checkpointed.
fn envelope(arn: &str, token: &str, steps: usize) -> serde_json::Value {
    let mut ops = vec![serde_json::json!({
        "Id": "exec",
        "Type": "EXECUTION",
        "Status": "STARTED",
        "StartTimestamp": 1_764_000_000,
        "ExecutionDetails": { "InputPayload": "{\"detail\":{\"accountId\":\"42\"}}" },
    })];
    for i in 0..steps {
        ops.push(serde_json::json!({
            "Id": format!("step-{i}"),
            "Type": "STEP",
            "Status": "SUCCEEDED",
            "StartTimestamp": 1_764_000_001,
            "StepDetails": { "Attempt": 1, "Result": "\"ok\"" },
        }));
    }
    serde_json::json!({
        "DurableExecutionArn": arn,
        "CheckpointToken": token,
        "InitialExecutionState": { "Operations": ops },
    })
}

fn key(arn: &str) -> String {
    format!("durable-{arn}")
}

#[test]
fn the_users_fields_are_not_in_a_durable_event() {
    // The user's input is a string inside the envelope: a pointer to its fields finds nothing,
    // so such a template fails every durable invocation (FlightlockKeyError), never runs it
    // unlocked. The execution ARN is at the top.
    let event = envelope(ARN_A, "t1", 0).to_string();
    let user_field = KeyTemplate::parse("job-{/detail/accountId}").unwrap();
    assert!(user_field.render_bytes(event.as_bytes()).is_err());
    let per_execution = KeyTemplate::parse("durable-{/DurableExecutionArn}").unwrap();
    assert_eq!(
        per_execution.render_bytes(event.as_bytes()).unwrap(),
        key(ARN_A)
    );
}

#[tokio::test]
async fn a_replay_waits_for_its_executions_previous_invocation_and_other_executions_run() {
    let (table, client) = support::table("durable").await;
    let locker = Locker::new(client.clone(), &table);
    let vars = [
        ("FLIGHTLOCK_KEY", "durable-{/DurableExecutionArn}"),
        ("FLIGHTLOCK_WAIT", "60s"),
        ("FLIGHTLOCK_ON_BUSY", "error"),
    ];
    let mut envs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..3 {
        let platform = support::standard().await;
        let (port, _) = support::start_proxy(&platform, &table, client.clone(), &vars, "h").await;
        envs.push(platform);
        ports.push(port);
    }

    // Invocation 1 of execution A runs its first step.
    let a1 = envelope(ARN_A, "t1", 0);
    let a1_id = envs[0].invoke(a1.clone());
    let got = get(ports[0], NEXT).await;
    assert_eq!(got.request_id.as_ref(), Some(&a1_id));
    assert_eq!(
        got.body,
        a1.to_string().as_bytes(),
        "the envelope reaches the runtime byte for byte"
    );

    // Its replay is invoked in another environment before invocation 1's release has landed.
    let a2_id = envs[1].invoke(envelope(ARN_A, "t2", 1));
    let port = ports[1];
    let replay = tokio::spawn(async move { get(port, NEXT).await });
    let skew = ClockSkew::Bounded(Duration::from_secs(1));
    let mut queued = false;
    for _ in 0..200 {
        let q = locker.queue(&key(ARN_A), skew).await.unwrap();
        if q.len() == 2 {
            assert_eq!(q[0].holder.request_id.as_ref(), Some(&a1_id));
            assert_eq!(q[0].state, EntryState::Holding);
            assert_eq!(q[1].holder.request_id.as_ref(), Some(&a2_id));
            assert_eq!(q[1].state, EntryState::Waiting);
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(queued, "the replay did not queue behind invocation 1");

    // Execution B is not held up by A.
    let b1_id = envs[2].invoke(envelope(ARN_B, "u1", 0));
    assert_eq!(get(ports[2], NEXT).await.request_id, Some(b1_id));

    // Invocation 1 suspends (a wait); its replay then runs, not answered as busy.
    assert!(respond(ports[0], &a1_id, r#"{"Status":"PENDING"}"#)
        .await
        .is_success());
    let answer = envs[0].answer(&a1_id, LIMIT).await.expect("a-1 answered");
    assert_eq!(answer.text(), r#"{"Status":"PENDING"}"#);
    let got = tokio::time::timeout(LIMIT, replay).await.unwrap().unwrap();
    assert_eq!(got.request_id.as_ref(), Some(&a2_id));
    assert!(respond(
        ports[1],
        &a2_id,
        r#"{"Status":"SUCCEEDED","Result":"\"done\""}"#
    )
    .await
    .is_success());
    let answer = envs[1].answer(&a2_id, LIMIT).await.expect("a-2 answered");
    assert_eq!(
        answer.path,
        format!("/2018-06-01/runtime/invocation/{a2_id}/response")
    );
    assert!(answer.text().contains("SUCCEEDED"), "{}", answer.text());
}
