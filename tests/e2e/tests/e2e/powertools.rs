//! Powertools for AWS Lambda with flightlock's Python client from the layer (issue 44): three
//! environments under the Runtime Interface Emulator run `tests/e2e/runtimes/powertools_handler.py`
//! (awslambdaric; the SQS recipe's `docs/src/recipes/sqs/sqs_fifo_powertools.py`: Powertools'
//! `SqsFifoPartialProcessor` with `flightlock.powertools.locked`), and
//! `tests/e2e/runtimes/kinesis_powertools_handler.py` (its Kinesis consumer,
//! `docs/src/recipes/sqs/kinesis_powertools.py`: `BatchProcessor` for Kinesis Data Streams),
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

/// The partition keys of each shard's records, in sequence order: three shards (of streams
/// whose records share keys, say orders and payments keyed by order id) over four keys.
const SHARDS: [&[u8]; 3] = [
    &[0, 1, 0, 2, 3, 1, 0, 2],
    &[0, 2, 1, 1, 3, 0, 2, 3],
    &[1, 0, 3, 0, 2, 3, 1, 0],
];
const KINESIS_BATCH: usize = 4;

/// A Kinesis consumer: nothing gated, a lock per partition key, `wait_ms` for a busy one.
fn kinesis_consumer(wait_ms: u64) -> Spec {
    Spec::layered("stream", Runtime::PythonKinesisPowertools)
        .with("FLIGHTLOCK_GATE", "off")
        .with("E2E_WAIT_MS", &wait_ms.to_string())
}

fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                ABC[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// Shard `shard`'s sequence number of its record `seq` (Kinesis' are decimal strings).
fn sequence_number(shard: usize, seq: usize) -> String {
    format!("4959{shard:02}{seq:050}")
}

/// Record `seq` of shard `shard`, as Lambda's poller hands over a Kinesis record.
fn kinesis_record(shard: usize, seq: usize) -> Value {
    // The first of each shard works longest, so the other shards' batches find its key busy.
    let data = json!({"shard": shard, "seq": seq, "sleepMs": if seq == 0 { 150 } else { 30 }});
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": format!("k{}", SHARDS[shard][seq]),
            "sequenceNumber": sequence_number(shard, seq),
            "data": base64(data.to_string().as_bytes()),
            "approximateArrivalTimestamp": 1764230400.0,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("shardId-{shard:012}:{}", sequence_number(shard, seq)),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/stream",
        "awsRegion": "us-east-1",
        "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/s{shard}"),
    })
}

/// Three environments of one Kinesis consumer (two with wait 0, one with 100 ms) read three
/// shards whose records share four partition keys. Each round every unfinished shard's next
/// batch (up to 4 records from its checkpoint) goes to an environment, all at once, a different
/// environment each round. As Lambda's poller does with `ReportBatchItemFailures`, a shard's
/// checkpoint moves to its batch's lowest failed sequence number, and the next batch starts
/// there: that record and all after it of the shard are delivered again. Every record is
/// processed exactly once, each shard's records of a key in their order, no two records of a key
/// at once, with rising fencing tokens per key; records reported failed were (some were busy)
/// and ran in a later round; every record before a batch's first failure was handled by the
/// environment that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn powertools_kinesis_consumers_lock_each_partition_key_and_retry_from_the_failed_record() {
    let (endpoint, table) = table("e2e_powertools_kinesis").await;
    let record = record_file("powertools-kinesis");
    let specs = [0, 0, 100].map(kinesis_consumer);
    let envs = start_all("ptk", &specs, &endpoint, &table, &record).await;
    for e in &envs {
        let r = e.invoke(json!({ "Records": [] })).await;
        assert_eq!(r.status, 200, "{}: {:?}\n{}", e.name, r.body, e.log());
    }

    let mut checkpoints = [0usize; 3];
    // Each failed sequence number with when its round ended (ns since the epoch).
    let mut failed_at: BTreeMap<String, u128> = BTreeMap::new();
    let (mut rounds, mut busy) = (0, 0);
    let started = Instant::now();
    while (0..3).any(|s| checkpoints[s] < SHARDS[s].len()) {
        rounds += 1;
        assert!(rounds <= 40, "checkpoints {checkpoints:?} after 40 rounds");
        let deliveries: Vec<(usize, &Env, Vec<usize>)> = (0..3)
            .filter(|s| checkpoints[*s] < SHARDS[*s].len())
            .map(|s| {
                let end = (checkpoints[s] + KINESIS_BATCH).min(SHARDS[s].len());
                (s, &envs[(s + rounds) % 3], (checkpoints[s]..end).collect())
            })
            .collect();
        let answers = futures::future::join_all(deliveries.iter().map(|(s, e, seqs)| {
            let records: Vec<Value> = seqs.iter().map(|q| kinesis_record(*s, *q)).collect();
            e.invoke(json!({ "Records": records }))
        }))
        .await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let handled = lines(&record);
        for ((s, e, seqs), r) in deliveries.iter().zip(&answers) {
            assert_eq!(r.status, 200, "{}: {:?}\n{}", e.name, r.body, e.log());
            let a = r.json();
            let failures: Vec<&str> = a["batchItemFailures"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: not a batch response: {a}\n{}", e.name, e.log()))
                .iter()
                .map(|f| f["itemIdentifier"].as_str().unwrap())
                .collect();
            let ids: Vec<String> = seqs.iter().map(|q| sequence_number(*s, *q)).collect();
            for f in &failures {
                assert!(
                    ids.iter().any(|i| i == f),
                    "{}: {f} not in the batch",
                    e.name
                );
            }
            // Lambda retries from the lowest failed sequence number.
            let first_failed = ids
                .iter()
                .position(|i| failures.contains(&i.as_str()))
                .unwrap_or(ids.len());
            for id in &ids[..first_failed] {
                assert!(
                    handled
                        .iter()
                        .any(|l| l["sequenceNumber"] == id.as_str() && l["env"] == e.name.as_str()),
                    "{} reported {id} processed without handling it: {a}\n{}",
                    e.name,
                    e.log()
                );
            }
            if first_failed < ids.len() {
                busy += 1;
                failed_at.insert(ids[first_failed].clone(), now);
            }
            checkpoints[*s] += first_failed;
        }
    }
    let took = started.elapsed();

    let all = lines(&record);
    for l in &all {
        assert_eq!(
            l["client"], "/opt/python/flightlock/__init__.py",
            "flightlock was not imported from the layer: {l}"
        );
    }
    let mut runs: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for l in &all {
        runs.entry(l["sequenceNumber"].as_str().unwrap())
            .or_default()
            .push(l);
    }
    let total: usize = SHARDS.iter().map(|s| s.len()).sum();
    let twice: Vec<&Vec<&Value>> = runs.values().filter(|r| r.len() != 1).collect();
    assert!(
        runs.len() == total && twice.is_empty(),
        "not every record processed exactly once ({} of {total} seen): {twice:#?}",
        runs.len()
    );
    for (id, at) in &failed_at {
        let start = runs[id.as_str()][0]["start"].as_u64().unwrap();
        assert!(
            u128::from(start) > *at,
            "{id} was reported failed but had run before that round ended: {:?}",
            runs[id.as_str()]
        );
    }
    for k in 0..4u8 {
        let mut of_key: Vec<&Value> = all.iter().filter(|l| l["key"] == format!("k{k}")).collect();
        of_key.sort_by_key(|l| l["start"].as_u64().unwrap());
        for pair in of_key.windows(2) {
            assert!(
                pair[0]["end"].as_u64() <= pair[1]["start"].as_u64(),
                "two records of k{k} ran at once: {} and {}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0]["token"].as_u64() < pair[1]["token"].as_u64(),
                "fencing tokens of k{k} do not rise: {} then {}",
                pair[0],
                pair[1]
            );
        }
        for s in 0..3u64 {
            let seqs: Vec<u64> = of_key
                .iter()
                .filter(|l| l["shard"] == s)
                .map(|l| l["seq"].as_u64().unwrap())
                .collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "shard {s}'s records of k{k} out of order: {seqs:?}"
            );
        }
    }
    assert!(
        busy > 0,
        "no record ever failed: nothing contended, so this proved nothing"
    );
    let mut by_env: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &all {
        *by_env.entry(l["env"].as_str().unwrap()).or_default() += 1;
    }
    eprintln!(
        "powertools kinesis: {total} records in {rounds} rounds, {busy} batches retried from a \
         failed record, {took:.1?}, processed by {by_env:?}"
    );
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}
