//! The Node.js package `flightlock` on Powertools for AWS Lambda, end to end: the SQS recipe's
//! FIFO consumer (`docs/src/recipes/sqs/sqs_fifo_powertools.mjs`: `SqsFifoPartialProcessorAsync`
//! with `skipGroupOnError`, `lockPerRecord` from `flightlock/powertools`) under the Runtime
//! Interface Emulator with the npm `aws-lambda-ric`, behind the real extension, against DynamoDB
//! Local. `flightlock` is imported from the layer's `/opt/nodejs/node_modules` through `NODE_PATH`
//! (laid out from `clients/node`'s package.json `files`; nothing of it beside the handler), and
//! `@aws-lambda-powertools/batch` 2.x from npm is the function's own `node_modules`.
//! Needs `eval "$(scripts/node-tools)"` besides the usual e2e tools.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use flightlock_e2e::{record_file, start_all, stop_all, table, Env, Runtime, Spec};
use serde_json::{json, Value};

/// Groups (message group ids, hence lock keys) shared by both queues.
const GROUPS: u64 = 6;
/// At most this many groups in one batch (SQS FIFO returns a group's messages together).
const GROUPS_PER_BATCH: usize = 3;

/// A message of a simulated FIFO queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Message {
    queue: char,
    seq: u64,
}

impl Message {
    fn group(&self) -> String {
        format!("g{}", self.seq % GROUPS)
    }
    fn id(&self) -> String {
        format!("{}-{}", self.queue, self.seq)
    }
}

/// An SQS FIFO event, as Lambda's poller hands it over.
fn fifo_event(batch: &[Message]) -> Value {
    let records: Vec<Value> = batch
        .iter()
        .map(|m| {
            json!({
                "messageId": m.id(),
                "receiptHandle": "AQEB",
                "body": json!({"queue": m.queue.to_string(), "seq": m.seq, "sleepMs": 30}).to_string(),
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1764230400000",
                    "MessageGroupId": m.group(),
                    "MessageDeduplicationId": m.id(),
                    "SequenceNumber": format!("{:020}", m.seq),
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:us-east-1:123456789012:queue-{}.fifo", m.queue),
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({ "Records": records })
}

/// One batch for a consumer of a FIFO queue, as SQS FIFO hands them out: the earliest pending
/// messages, none of a group another batch of the same queue has in flight, at most
/// [`GROUPS_PER_BATCH`] groups and 10 messages; a group's messages in order.
fn take_batch(pending: &[Message], in_flight: &mut BTreeSet<String>) -> Vec<Message> {
    let mut mine: BTreeSet<String> = BTreeSet::new();
    let mut batch = Vec::new();
    for m in pending {
        if batch.len() == 10 {
            break;
        }
        let g = m.group();
        if mine.contains(&g) || (!in_flight.contains(&g) && mine.len() < GROUPS_PER_BATCH) {
            mine.insert(g.clone());
            in_flight.insert(g);
            batch.push(*m);
        }
    }
    batch
}

fn record_lines(record: &Path) -> Vec<Value> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["what"] == "record")
        .collect()
}

/// Two FIFO queues whose messages share six groups (another queue working on the same
/// entities, the exclusion a FIFO queue alone cannot give), consumed by three environments: two
/// on queue A, one on queue B, each batch handed out as SQS FIFO would. Each record's group is
/// locked with wait 0, so a group in flight on the other queue is busy: the record and the rest
/// of its group in the batch are reported failed and delivered again later, in order. Records of
/// one group never ran at once, each queue's records of a group ran in queue order across
/// redeliveries, every record ran exactly once, and some were busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powertools_fifo_consumers_from_the_layer_keep_groups_apart_and_in_order() {
    let (endpoint, table) = table("e2e_node_powertools").await;
    let record = record_file("node-powertools");
    let specs: Vec<Spec> = (0..3)
        .map(|_| Spec::layered("ptfifo", Runtime::NodePowertools).with("FLIGHTLOCK_GATE", "off"))
        .collect();
    let envs = start_all("ptn", &specs, &endpoint, &table, &record).await;
    // Init first, and where `flightlock/powertools` came from: the layer, through NODE_PATH.
    for e in &envs {
        let r = e.invoke(json!({"where": true})).await.json();
        assert_eq!(
            r["flightlock"],
            "file:///opt/nodejs/node_modules/flightlock/powertools.mjs",
            "{r}\n{}",
            e.log()
        );
    }
    let queues: [(char, Vec<&Env>); 2] = [('A', vec![&envs[0], &envs[1]]), ('B', vec![&envs[2]])];
    let mut pending: BTreeMap<char, Vec<Message>> = queues
        .iter()
        .map(|(q, _)| (*q, (0..24).map(|seq| Message { queue: *q, seq }).collect()))
        .collect();

    let (mut rounds, mut busy) = (0, 0);
    let started = Instant::now();
    while pending.values().any(|p| !p.is_empty()) {
        rounds += 1;
        assert!(rounds <= 30, "still pending after 30 rounds: {pending:?}");
        let mut calls = Vec::new();
        for (q, consumers) in &queues {
            let mut in_flight = BTreeSet::new();
            for e in consumers {
                let batch = take_batch(&pending[q], &mut in_flight);
                if !batch.is_empty() {
                    calls.push((*e, batch));
                }
            }
        }
        let answers = futures::future::join_all(calls.iter().map(|(e, batch)| async move {
            let r = e.invoke(fifo_event(batch)).await;
            assert_eq!(r.status, 200, "{}: {:?}\n{}", e.name, r.body, e.log());
            r.json()
        }))
        .await;
        for ((e, batch), answer) in calls.iter().zip(answers) {
            // Every record failed (all busy): Powertools throws FullBatchFailureError, the
            // invocation fails and Lambda hands the whole batch back.
            let failures: BTreeSet<String> = match answer["batchItemFailures"].as_array() {
                Some(failures) => failures
                    .iter()
                    .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
                    .collect(),
                None => {
                    assert_eq!(
                        answer["errorType"],
                        "FullBatchFailureError",
                        "{}: neither batchItemFailures nor Powertools' all-failed error: \
                         {answer}\n{}",
                        e.name,
                        e.log()
                    );
                    batch.iter().map(|m| m.id()).collect()
                }
            };
            // Powertools' FIFO rule: after a failed record of a group, the rest of it fails too.
            let mut failed_groups = BTreeSet::new();
            for m in batch {
                if failures.contains(&m.id()) {
                    failed_groups.insert(m.group());
                    busy += 1;
                } else {
                    assert!(
                        !failed_groups.contains(&m.group()),
                        "{} ran after an earlier record of {} failed: {answer}",
                        m.id(),
                        m.group()
                    );
                    pending.get_mut(&m.queue).unwrap().retain(|p| p != m);
                }
            }
        }
    }
    let took = started.elapsed();

    let done = record_lines(&record);
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for d in &done {
        *count
            .entry(d["messageId"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(count.len(), 48, "not every record ran: {count:?}");
    assert!(
        count.values().all(|n| *n == 1),
        "a record ran twice: {count:?}"
    );
    assert!(
        busy > 0,
        "no record was ever busy: the queues did not contend, so this proved nothing"
    );
    for g in 0..GROUPS {
        let group = format!("g{g}");
        let mut runs: Vec<&Value> = done
            .iter()
            .filter(|d| d["group"] == group.as_str())
            .collect();
        runs.sort_by_key(|d| d["start"].as_u64().unwrap());
        for pair in runs.windows(2) {
            assert!(
                pair[0]["end"].as_u64() <= pair[1]["start"].as_u64(),
                "two records of {group} ran at once: {} and {}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0]["token"].as_u64() < pair[1]["token"].as_u64(),
                "fencing tokens of {group} do not rise in the order the records ran: {} then {}",
                pair[0],
                pair[1]
            );
        }
        for q in ["A", "B"] {
            let seqs: Vec<u64> = runs
                .iter()
                .filter(|d| d["queue"] == q)
                .map(|d| d["seq"].as_u64().unwrap())
                .collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "queue {q}'s records of {group} ran out of order: {seqs:?}"
            );
        }
    }
    eprintln!(
        "node_powertools: 48 records of 2 FIFO queues in {rounds} rounds, {busy} failed \
         (busy or after a busy one) and redelivered, {took:.1?}"
    );
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

/// The layer attached, `AWS_LAMBDA_EXEC_WRAPPER` not set and the extension's own check of it
/// turned off (`FLIGHTLOCK_WRAPPER_CHECK=off`, as for a chained wrapper that should run
/// flightlock's and does not): the runtime talks to Lambda's own Runtime API, which serves no
/// lock API. No record runs and none is reported processed: the invocation fails (Powertools'
/// whole-batch failure, so Lambda delivers the batch again), and the function's log says what to
/// set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wrapper_no_record_runs_and_the_log_names_the_fix() {
    let (endpoint, table) = table("e2e_node_powertools_nowrap").await;
    let record = record_file("node-powertools-nowrap");
    let spec = Spec {
        wrapper: false,
        ..Spec::layered("ptnowrap", Runtime::NodePowertools)
            .with("FLIGHTLOCK_GATE", "off")
            .with("FLIGHTLOCK_WRAPPER_CHECK", "off")
    };
    let envs = start_all("ptnw", &[spec], &endpoint, &table, &record).await;
    let e = &envs[0];
    let batch: Vec<Message> = (0..4).map(|seq| Message { queue: 'A', seq }).collect();
    let r = e.invoke(fifo_event(&batch)).await.json();
    assert_eq!(r["errorType"], "FullBatchFailureError", "{r}\n{}", e.log());
    assert!(
        record_lines(&record).is_empty(),
        "a record ran without its lock"
    );
    let log = e.log();
    let fix = "AWS_LAMBDA_EXEC_WRAPPER is not set): attach the flightlock layer and set \
               AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper";
    assert!(log.contains(fix), "the fix is not in the log:\n{log}");
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}
