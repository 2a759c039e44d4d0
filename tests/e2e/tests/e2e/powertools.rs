//! Powertools for AWS Lambda with flightlock's Python client from the layer (issue 44): three
//! environments under the Runtime Interface Emulator run `tests/e2e/runtimes/powertools_handler.py`
//! (awslambdaric; the SQS recipe's `docs/src/recipes/sqs/sqs_fifo_powertools.py`: Powertools'
//! `SqsFifoPartialProcessor` with `flightlock.powertools.locked`),
//! which imports `flightlock` from the layer's `/opt/python` (nothing copied beside it) and
//! `aws_lambda_powertools` from PyPI (`FLIGHTLOCK_POWERTOOLS_PATH`, set by
//! `scripts/client-python-tools`). Needs the usual e2e tools besides.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use flightlock_e2e::{record_file, start_all, stop_all, table, Env, Runtime, Spec};
use serde_json::{json, Value};

const GROUPS: u64 = 4;
const PER_GROUP: u64 = 6;

/// A FIFO consumer: nothing gated, a lock per record through the API.
fn consumer(skip_group: bool, state: &Path) -> Spec {
    Spec::layered("fifo", Runtime::PythonPowertools)
        .with("FLIGHTLOCK_GATE", "off")
        .with("E2E_STATE_DIR", &state.display().to_string())
        .with("E2E_SKIP_GROUP", if skip_group { "1" } else { "0" })
}

/// Message `seq` of group `g{group}`, as Lambda's poller hands over an SQS FIFO message.
fn message(group: u64, seq: u64) -> Value {
    let id = format!("g{group}-{seq}");
    json!({
        "messageId": id,
        "receiptHandle": "AQEB",
        // The first of each group works longest, so the others' batches find it busy.
        "body": json!({"seq": seq, "sleepMs": if seq == 0 { 150 } else { 20 }}).to_string(),
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "1764230400000",
            "MessageGroupId": format!("g{group}"),
            "MessageDeduplicationId": id,
            "SequenceNumber": (group * 1000 + seq).to_string(),
        },
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work.fifo",
        "awsRegion": "us-east-1",
    })
}

/// The message ids an answer reports failed: its `batchItemFailures`, or all of `batch` when
/// every record failed (Powertools then raises BatchProcessingError: the invocation fails and
/// Lambda hands the whole batch back).
fn failed(answer: &Value, batch: &[(u64, u64)]) -> Vec<String> {
    if let Some(failures) = answer["batchItemFailures"].as_array() {
        return failures
            .iter()
            .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
            .collect();
    }
    assert_eq!(
        answer["errorType"], "BatchProcessingError",
        "neither a batch response nor Powertools' all-failed error: {answer}"
    );
    batch.iter().map(|(g, s)| format!("g{g}-{s}")).collect()
}

fn lines(record: &Path) -> Vec<Value> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

async fn answer(e: &Env, batch: &[(u64, u64)]) -> Value {
    let records: Vec<Value> = batch.iter().map(|(g, s)| message(*g, *s)).collect();
    let r = e.invoke(json!({ "Records": records })).await;
    assert_eq!(r.status, 200, "{}: {:?}\n{}", e.name, r.body, e.log());
    r.json()
}

/// Three environments (two with `skip_group_on_error`) take FIFO-shaped batches of 10 over 4
/// message groups. Each round all three get the same head of the queue, as when a visibility
/// timeout runs out while another consumer still works on the messages: only the group locks
/// keep them apart. A message any environment reports processed leaves the queue; the others
/// (busy, or failed after a busy one of their group) are handed out again. Every message is
/// processed exactly once, each group's in order and never two at once, with rising fencing
/// tokens; no message is reported processed that was not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powertools_fifo_consumers_lock_each_group_and_keep_its_order() {
    let (endpoint, table) = table("e2e_powertools").await;
    let record = record_file("powertools");
    let state = record.with_extension("state");
    std::fs::create_dir_all(&state).unwrap();
    let specs = [false, true, true].map(|skip| consumer(skip, &state));
    let envs = start_all("pt", &specs, &endpoint, &table, &record).await;
    for e in &envs {
        let r = answer(e, &[]).await;
        assert_eq!(failed(&r, &[]), Vec::<String>::new(), "{r}\n{}", e.log());
    }

    let mut queue: Vec<(u64, u64)> = (0..PER_GROUP)
        .flat_map(|seq| (0..GROUPS).map(move |g| (g, seq)))
        .collect();
    let (mut rounds, mut busy) = (0, 0);
    let started = Instant::now();
    while !queue.is_empty() {
        rounds += 1;
        assert!(rounds <= 30, "still {queue:?} after 30 rounds");
        let batch: Vec<(u64, u64)> = queue.iter().take(10).copied().collect();
        let answers = futures::future::join_all(envs.iter().map(|e| answer(e, &batch))).await;
        let handled = lines(&record);
        for (e, a) in envs.iter().zip(&answers) {
            let failures = failed(a, &batch);
            busy += failures.len();
            for (g, s) in &batch {
                let id = format!("g{g}-{s}");
                if failures.contains(&id) {
                    continue;
                }
                // Reported processed: then this environment handled it (did it, or found it done).
                assert!(
                    handled.iter().any(|l| l["messageId"] == id.as_str()
                        && l["env"] == e.name.as_str()
                        && (l["what"] == "record" || l["what"] == "redelivered")),
                    "{} reported {id} processed without handling it: {a}\n{}",
                    e.name,
                    e.log()
                );
                queue.retain(|m| m != &(*g, *s));
            }
        }
    }
    let took = started.elapsed();

    let all = lines(&record);
    let wrong: Vec<&Value> = all.iter().filter(|l| l["what"] == "outOfOrder").collect();
    assert!(wrong.is_empty(), "a group's order broke: {wrong:#?}");
    for l in &all {
        assert_eq!(
            l["client"], "/opt/python/flightlock/__init__.py",
            "flightlock was not imported from the layer: {l}"
        );
    }
    let done: Vec<&Value> = all.iter().filter(|l| l["what"] == "record").collect();
    assert_eq!(
        done.len() as u64,
        GROUPS * PER_GROUP,
        "not every message processed exactly once: {done:#?}"
    );
    assert!(
        busy > 0,
        "no record was ever busy: nothing contended, so this proved nothing"
    );
    for g in 0..GROUPS {
        let mut runs: Vec<&&Value> = done
            .iter()
            .filter(|l| l["group"] == format!("g{g}"))
            .collect();
        runs.sort_by_key(|l| l["start"].as_u64().unwrap());
        let seqs: Vec<u64> = runs.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (0..PER_GROUP).collect::<Vec<_>>(),
            "g{g} out of order: {runs:#?}"
        );
        for pair in runs.windows(2) {
            assert!(
                pair[0]["end"].as_u64() <= pair[1]["start"].as_u64(),
                "two records of g{g} ran at once: {} and {}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0]["token"].as_u64() < pair[1]["token"].as_u64(),
                "fencing tokens of g{g} do not rise: {} then {}",
                pair[0],
                pair[1]
            );
        }
    }
    let mut by_env: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &done {
        *by_env.entry(d["env"].as_str().unwrap()).or_default() += 1;
    }
    eprintln!(
        "powertools: {} messages in {rounds} rounds, {busy} failed and handed out again, \
         {took:.1?}, processed by {by_env:?}",
        GROUPS * PER_GROUP
    );
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
    let _ = std::fs::remove_dir_all(&state);
}

/// The layer attached but the function started without `AWS_LAMBDA_EXEC_WRAPPER`, and the
/// extension's own wrapper check off (`FLIGHTLOCK_WRAPPER_CHECK=off`, as when another wrapper
/// is meant to run ours but does not): the runtime talks to Lambda, not to the proxy, so there
/// is no lock API. Nothing is processed, and the invocation's error names the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powertools_without_the_wrapper_processes_nothing_and_names_the_fix() {
    let (endpoint, table) = table("e2e_powertools_nowrap").await;
    let record = record_file("powertools-nowrap");
    let state = record.with_extension("state");
    std::fs::create_dir_all(&state).unwrap();
    let spec = Spec {
        wrapper: false,
        ..consumer(true, &state).with("FLIGHTLOCK_WRAPPER_CHECK", "off")
    };
    let envs = start_all("ptnw", &[spec], &endpoint, &table, &record).await;
    let batch = [(0, 0), (1, 0)];
    let a = answer(&envs[0], &batch).await;
    assert_eq!(failed(&a, &batch).len(), 2, "{a}");
    let text = a.to_string();
    assert!(
        text.contains("AWS_LAMBDA_EXEC_WRAPPER") && text.contains("/opt/flightlock-wrapper"),
        "the error does not name the fix: {a}"
    );
    assert!(lines(&record).is_empty(), "{:?}", lines(&record));
    stop_all(envs).await;
    let _ = std::fs::remove_dir_all(&state);
}
