//! The lock API end to end (issue 34): batch consumers with `FLIGHTLOCK_GATE=off` under the
//! Runtime Interface Emulator, with the real runtime clients `awslambdaric` and `aws-lambda-ric`.
//! The handlers (`tests/e2e/runtimes/records_handler.{py,mjs}`) are the SQS recipe's
//! (`docs/src/recipes/sqs/sqs_batch.{py,mjs}`, copied into each environment's task directory)
//! with the packages `flightlock` (`clients/python`, `clients/node`), which the guide includes,
//! imported from the layer's `/opt` as the harness lays it out. Each record processed is one line
//! of the record file: its interval, entity, fencing token and pid.
//! Needs `eval "$(scripts/node-tools)"` besides the usual e2e tools.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use flightlock_e2e::platform::{Mode, Options, Outcome, Platform};
use flightlock_e2e::sandbox::{self, records_runtime, released, SESSION_TOKEN};
use flightlock_e2e::{record_file, start_all, stop_all, table, Runtime, Spec};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

/// A batch consumer: nothing gated, records locked through the API.
fn consumer(function: &str, runtime: Runtime) -> Spec {
    Spec::layered(function, runtime).with("FLIGHTLOCK_GATE", "off")
}

/// An SQS event (as Lambda's poller hands it over) of messages `msg-{seq}` with these bodies.
fn sqs_event(bodies: &[Value]) -> Value {
    let records: Vec<Value> = bodies
        .iter()
        .map(|body| {
            json!({
                "messageId": format!("msg-{}", body["seq"]),
                "receiptHandle": "AQEB",
                "body": body.to_string(),
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1764230400000"},
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:work",
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({ "Records": records })
}

/// The `seq` of every message a batch response reports failed.
fn failed(answer: &Value) -> Vec<u64> {
    answer["batchItemFailures"]
        .as_array()
        .unwrap_or_else(|| panic!("no batchItemFailures: {answer}"))
        .iter()
        .map(|f| {
            f["itemIdentifier"]
                .as_str()
                .and_then(|id| id.strip_prefix("msg-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("not one of ours: {f}"))
        })
        .collect()
}

/// The record file's lines with `what`.
fn lines(record: &Path, what: &str) -> Vec<Value> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["what"] == what)
        .collect()
}

/// Waits until the record file has a line with `what` (at most `limit`).
async fn line(record: &Path, what: &str, limit: Duration) -> Value {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = lines(record, what).pop() {
            return v;
        }
        assert!(Instant::now() < end, "no {what:?} line within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One call of the lock API on `port`, as a handler would make it (or should not): status and
/// JSON body.
async fn api(
    port: u16,
    token: Option<&str>,
    id: &str,
    call: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder()
        .method(if body.is_some() { "POST" } else { "GET" })
        .uri(format!(
            "http://127.0.0.1:{port}/flightlock/v1/invocations/{id}/{call}"
        ));
    if let Some(token) = token {
        req = req.header("X-Flightlock-Token", token);
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("the lock API answers within 10 s")
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Three environments (Python, Node.js, Python) consume a queue of 30 messages over 3 entities
/// as SQS would hand it to them: batches of 10, all three at once; each handler locks each
/// record's entity with wait 0 and reports the busy ones in `batchItemFailures`, which go back
/// to the queue and come again in later batches, until none is left. Records of one entity never
/// ran at once (their intervals, recorded by the handlers, do not overlap, and their fencing
/// tokens rise in that order), and every record was processed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_three_entities_lock_each_record_and_redeliver_the_busy_ones() {
    let (endpoint, table) = table("e2e_records").await;
    let record = record_file("records");
    let specs = [
        Runtime::PythonRecords,
        Runtime::NodeRecords,
        Runtime::PythonRecords,
    ]
    .map(|r| consumer("records", r));
    let envs = start_all("rec", &specs, &endpoint, &table, &record).await;
    // Init first (an empty batch), so the batches below start together.
    for e in &envs {
        let r = e.invoke(sqs_event(&[])).await.json();
        assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", e.log());
    }

    // Every batch of 10 has the same entities in the same order (e0 e1 e2 e0 ...), and the first
    // record works 200 ms: the three batches of a round contend for the same keys.
    let entity = |seq: u64| format!("e{}", (seq % 10) % 3);
    let body = |seq: u64| {
        let sleep = if seq.is_multiple_of(10) { 200 } else { 30 };
        json!({"entity": entity(seq), "seq": seq, "sleepMs": sleep})
    };
    let mut queue: VecDeque<u64> = (0..30).collect();
    let (mut rounds, mut busy) = (0, 0);
    let started = Instant::now();
    while !queue.is_empty() {
        rounds += 1;
        assert!(rounds <= 25, "still {queue:?} after 25 rounds");
        let batches: Vec<Vec<u64>> = envs
            .iter()
            .map(|_| (0..10).map_while(|_| queue.pop_front()).collect())
            .collect();
        let calls = envs
            .iter()
            .zip(&batches)
            .filter(|(_, batch)| !batch.is_empty())
            .map(|(e, batch)| async move {
                let event = sqs_event(&batch.iter().map(|s| body(*s)).collect::<Vec<_>>());
                let r = e.invoke(event).await;
                assert_eq!(r.status, 200, "{}: {:?}\n{}", e.name, r.body, e.log());
                (batch, r.json())
            });
        for (batch, answer) in futures::future::join_all(calls).await {
            for seq in failed(&answer) {
                assert!(batch.contains(&seq), "{seq} was not in {batch:?}: {answer}");
                busy += 1;
                queue.push_back(seq);
            }
        }
    }
    let took = started.elapsed();

    let done = lines(&record, "record");
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for d in &done {
        *count.entry(d["seq"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(
        count.keys().copied().collect::<Vec<_>>(),
        (0..30).collect::<Vec<_>>(),
        "not every record was processed: {done:#?}"
    );
    assert!(
        count.values().all(|n| *n == 1),
        "a record was processed twice (reported failed after it was done?): {count:?}"
    );
    assert!(
        busy > 0,
        "no record was ever busy: the batches did not contend, so this proved nothing"
    );
    for e in 0..3 {
        let mut runs: Vec<&Value> = done
            .iter()
            .filter(|d| d["entity"] == format!("e{e}"))
            .collect();
        runs.sort_by_key(|d| d["start"].as_u64().unwrap());
        for pair in runs.windows(2) {
            assert!(
                pair[0]["end"].as_u64() <= pair[1]["start"].as_u64(),
                "two records of e{e} ran at once: {} and {}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0]["token"].as_u64() < pair[1]["token"].as_u64(),
                "fencing tokens of e{e} do not rise in the order the records ran: {} then {}",
                pair[0],
                pair[1]
            );
        }
    }
    let mut by_env: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &done {
        *by_env.entry(d["env"].as_str().unwrap()).or_default() += 1;
    }
    // The extensions counted the record locks (EMF lines on stdout, in each environment's log):
    // one RecordLockAcquired per record processed, and a RecordLockBusy for the busy answers
    // (a record after a busy one of its entity is failed without asking).
    let emitted = |metric: &str| -> usize {
        envs.iter()
            .map(|e| e.log().matches(&format!("\"{metric}\":1.0")).count())
            .sum()
    };
    assert_eq!(
        emitted("RecordLockAcquired"),
        30,
        "one RecordLockAcquired per record processed"
    );
    let busy_lines = emitted("RecordLockBusy");
    assert!(
        (1..=busy).contains(&busy_lines),
        "{busy_lines} RecordLockBusy lines for {busy} busy records"
    );
    eprintln!(
        "records: 30 records in {rounds} rounds, {busy} busy and redelivered ({busy_lines} busy \
         answers counted), {took:.1?}, processed by {by_env:?}"
    );
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

/// A handler that takes locks and never releases them: the extension releases them when its
/// invocation ends, so the next invocation, in another environment, takes them with wait 0.
/// Both ways, Python then Node.js and Node.js then Python.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_never_released_by_the_handler_are_freed_when_its_invocation_ends() {
    let (endpoint, table) = table("e2e_records_keep").await;
    let record = record_file("records-keep");
    let specs = [Runtime::PythonRecords, Runtime::NodeRecords].map(|r| consumer("keep", r));
    let envs = start_all("keep", &specs, &endpoint, &table, &record).await;
    for (keeper, taker, keys) in [
        (&envs[0], &envs[1], ["k1", "k2", "k3"]),
        (&envs[1], &envs[0], ["k4", "k5", "k6"]),
    ] {
        let kept = keeper.invoke(json!({ "keep": keys })).await.json();
        for k in keys {
            assert!(
                kept["tokens"][k].as_u64().is_some(),
                "{} did not take {k}: {kept}\n{}",
                keeper.name,
                keeper.log()
            );
        }
        // The release follows the response upstream (the caller may hear first): bounded, far
        // below the lease (20 s), which is all that would free them otherwise.
        for k in keys {
            assert!(
                released(&endpoint, &table, k, Duration::from_secs(5)).await,
                "{k} still held 5 s after its invocation ended\n{}",
                keeper.log()
            );
        }
        assert!(
            keeper.log().contains("released its record locks"),
            "{}",
            keeper.log()
        );
        let bodies: Vec<Value> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| json!({"entity": k, "seq": i}))
            .collect();
        let r = taker.invoke(sqs_event(&bodies)).await.json();
        assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", taker.log());
        for d in lines(&record, "record")
            .iter()
            .filter(|d| d["env"] == taker.name.as_str())
        {
            let k = d["entity"].as_str().unwrap();
            if let Some(before) = kept["tokens"][k].as_u64() {
                assert!(d["token"].as_u64().unwrap() > before, "{d} after {kept}");
            }
        }
    }
    assert_eq!(lines(&record, "record").len(), 6);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

/// A runtime process killed in the middle of a record (the handler sends itself SIGKILL while it
/// holds the record's lock) frees the lock at once: the extension sees the runtime's process
/// tree gone (or the emulator's SHUTDOWN that follows), long before the lease (60 s) would. The
/// other environment then takes it with wait 0. Python's runtime dies first, then Node.js's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_killed_mid_record_frees_its_locks_at_once() {
    let (endpoint, table) = table("e2e_records_crash").await;
    let record = record_file("records-crash");
    let specs = [Runtime::PythonRecords, Runtime::NodeRecords].map(|r| Spec {
        timeout_secs: 60,
        ..consumer("crash", r).with("FLIGHTLOCK_LEASE", "60s")
    });
    let envs = start_all("crash", &specs, &endpoint, &table, &record).await;
    for e in &envs {
        let r = e.invoke(sqs_event(&[])).await.json();
        assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", e.log());
    }
    for (victim, next, key) in [(&envs[0], &envs[1], "c1"), (&envs[1], &envs[0], "c2")] {
        let _ = std::fs::remove_file(&record);
        let batch = sqs_event(&[
            json!({"entity": "c0", "seq": 0}),
            json!({"entity": key, "seq": 1, "crash": true}),
        ]);
        let watch = async {
            let crashing = line(&record, "crashing", Duration::from_secs(30)).await;
            let seen = Instant::now();
            let freed = released(&endpoint, &table, key, Duration::from_secs(10)).await;
            (crashing, freed, seen.elapsed())
        };
        let (r, (crashing, freed, after)) = tokio::join!(victim.invoke(batch), watch);
        assert!(
            String::from_utf8_lossy(&r.body).contains("Runtime.ExitError"),
            "{}: {:?}\n{}",
            victim.name,
            r.body,
            victim.log()
        );
        assert_eq!(crashing["entity"], key);
        // Generous for a noisy 2-core machine; the lease alone would take 60 s.
        assert!(
            freed && after < Duration::from_secs(5),
            "{key} not freed within 5 s of the crash (freed: {freed}, {after:?})\n{}",
            victim.log()
        );
        let log = victim.log();
        let by: Vec<&str> = [
            "the runtime exited in the middle",
            "released held locks at shutdown",
            "released its record locks",
        ]
        .into_iter()
        .filter(|m| log.contains(m))
        .collect();
        assert!(!by.is_empty(), "{log}");
        eprintln!(
            "{}: {key} freed {after:?} after the crash was seen; logged: {by:?}",
            victim.name
        );
        let r = next
            .invoke(sqs_event(&[json!({"entity": key, "seq": 2})]))
            .await
            .json();
        assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", next.log());
    }
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

/// A handler's answer to `{"actAs": id}`: the client raised `notInFlight` with its message.
fn assert_refused_in_handler(r: &Value) {
    assert_eq!(r["refused"], true, "{r}");
    assert_eq!(
        (&r["status"], &r["error"]),
        (&json!(403), &json!("notInFlight")),
        "{r}"
    );
    assert!(
        r["message"].as_str().unwrap().contains("is not in flight"),
        "{r}"
    );
}

/// What the lock API refuses: a call without the header (401), with another token (403), for an
/// invocation this environment is not running (403 `notInFlight`, also through the guide's
/// clients, which raise it with the message), and after the invocation ended (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_token_for_another_invocation_or_after_the_end_are_refused() {
    let (endpoint, table) = table("e2e_records_refused").await;
    let record = record_file("records-refused");
    let specs = [Runtime::PythonRecords, Runtime::NodeRecords].map(|r| consumer("refused", r));
    let envs = start_all("refused", &specs, &endpoint, &table, &record).await;
    let (py, node) = (&envs[0], &envs[1]);
    for e in &envs {
        let r = e.invoke(sqs_event(&[])).await.json();
        assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", e.log());
    }
    let hold = record_file("records-refused-hold");
    let batch =
        sqs_event(&[json!({"entity": "r1", "seq": 0, "holdFile": hold.display().to_string()})]);
    let checks = async {
        // The Python invocation is in flight, holding r1.
        let start = line(&record, "start", Duration::from_secs(30)).await;
        let id = start["requestId"].as_str().unwrap().to_owned();
        let r2 = Some(json!({"key": "r2", "waitMs": 0}));
        let (status, body) = api(py.proxy_port, None, &id, "acquire", r2.clone()).await;
        assert_eq!(
            (status, &body["error"]),
            (401, &json!("unauthorized")),
            "{body}"
        );
        let (status, body) = api(
            py.proxy_port,
            Some("not-the-token"),
            &id,
            "acquire",
            r2.clone(),
        )
        .await;
        assert_eq!(
            (status, &body["error"]),
            (403, &json!("forbidden")),
            "{body}"
        );
        let (status, body) =
            api(py.proxy_port, Some(&node.session_token), &id, "locks", None).await;
        assert_eq!(
            (status, &body["error"]),
            (403, &json!("forbidden")),
            "another environment's token: {body}"
        );
        // Another environment's proxy does not run this invocation.
        let (status, body) = api(
            node.proxy_port,
            Some(&node.session_token),
            &id,
            "acquire",
            r2.clone(),
        )
        .await;
        assert_eq!(
            (status, &body["error"]),
            (403, &json!("notInFlight")),
            "{body}"
        );
        // The guide's client, in a Node.js handler acting for the Python invocation: a clear
        // error with the API's message.
        let r = node.invoke(json!({"actAs": id, "key": "r3"})).await.json();
        assert_refused_in_handler(&r);
        // With the token, for itself, it sees what it holds.
        let (status, body) = api(py.proxy_port, Some(&py.session_token), &id, "locks", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["locks"][0]["key"], "r1", "{body}");
        std::fs::write(&hold, "").unwrap();
        id
    };
    let (r, id) = tokio::join!(py.invoke(batch), checks);
    assert_eq!(failed(&r.json()), Vec::<u64>::new(), "{}", py.log());
    // The invocation ended: its id is refused, token or not.
    for call in ["acquire", "release"] {
        let (status, body) = api(
            py.proxy_port,
            Some(&py.session_token),
            &id,
            call,
            Some(json!({"key": "r1"})),
        )
        .await;
        assert_eq!(
            (status, &body["error"]),
            (403, &json!("notInFlight")),
            "{call}: {body}"
        );
    }
    let (status, body) = api(py.proxy_port, Some(&py.session_token), &id, "locks", None).await;
    assert_eq!(
        (status, &body["error"]),
        (403, &json!("notInFlight")),
        "{body}"
    );
    // The guide's Python client, in the next invocation, acting for the one that ended.
    let r = py.invoke(json!({"actAs": id, "key": "r3"})).await.json();
    assert_refused_in_handler(&r);
    assert_eq!(lines(&record, "record").len(), 1);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
    let _ = std::fs::remove_file(&hold);
}

/// Lambda Managed Instances on the platform double: two invocations in flight at once in one
/// environment (two `awslambdaric` processes behind one extension), each holding a record of its
/// own. No other process can act for either (the lock API binds a call to the invocation's
/// runtime process), the second finds the first one's entity busy and reports it, and each set
/// is released with its own invocation. Then a process killed mid-record frees
/// its lock at once, with no SHUTDOWN to help (the crash watch), and the other takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_instances_keep_a_set_of_locks_per_invocation_in_flight() {
    let (endpoint, table) = table("e2e_records_mi").await;
    let record = record_file("records-mi");
    let platform =
        Platform::start(Options::new(Mode::ManagedInstances { max_concurrency: 4 })).await;
    let extra = [("FLIGHTLOCK_GATE", "off"), ("FLIGHTLOCK_LEASE", "60s")];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let dir = record.with_extension("task");
    let _a = records_runtime(&platform, ext.proxy_port, &record, "mi-a", &dir);
    let _b = records_runtime(&platform, ext.proxy_port, &record, "mi-b", &dir);
    assert!(
        platform
            .wait_runtimes_waiting(2, Duration::from_secs(20))
            .await,
        "{}",
        ext.log()
    );
    let (hold1, hold2) = (dir.join("hold1"), dir.join("hold2"));
    let hold = |p: &Path| p.display().to_string();
    let first = platform.invoke(sqs_event(&[
        json!({"entity": "m1", "seq": 1, "holdFile": hold(&hold1)}),
    ]));
    let started = line(&record, "start", Duration::from_secs(20)).await;
    assert_eq!(started["requestId"], first.as_str(), "{started}");
    let second = platform.invoke(sqs_event(&[
        json!({"entity": "m1", "seq": 2}),
        json!({"entity": "m2", "seq": 3, "holdFile": hold(&hold2)}),
    ]));
    let end = Instant::now() + Duration::from_secs(20);
    while !lines(&record, "start").iter().any(|l| l["entity"] == "m2") {
        assert!(Instant::now() < end, "m2 never started\n{}", ext.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both in flight at once, each holding its own record. Their locks are theirs alone: this
    // test's process runs neither invocation, so a call naming either's request id is refused
    // (bound to the runtime process that runs the invocation), with the right token and id —
    // the case of one invocation releasing and retaking another's key.
    for id in [&first, &second] {
        for (call, body) in [
            ("locks", None),
            ("release", Some(json!({"key": "m1"}))),
            ("acquire", Some(json!({"key": "m1", "waitMs": 0}))),
        ] {
            let (status, answer) = api(ext.proxy_port, Some(SESSION_TOKEN), id, call, body).await;
            assert_eq!(
                (status, answer["error"].as_str()),
                (403, Some("notYourInvocation")),
                "{call} for {id}: {answer}"
            );
        }
    }
    for key in ["m1", "m2"] {
        assert_eq!(sandbox::queue(&endpoint, &table, key).await, 1, "{key}");
    }
    std::fs::write(&hold2, "").unwrap();
    let answer = |o: Option<Outcome>| match o {
        Some(Outcome::Response(b)) => serde_json::from_slice::<Value>(&b).unwrap(),
        other => panic!("expected a response, got {other:?}"),
    };
    let r2 = answer(platform.outcome(&second, Duration::from_secs(20)).await);
    assert_eq!(failed(&r2), [2], "m1 was busy for the second: {r2}");
    // The first still holds m1 after the second ended.
    assert_eq!(sandbox::queue(&endpoint, &table, "m1").await, 1);
    std::fs::write(&hold1, "").unwrap();
    let r1 = answer(platform.outcome(&first, Duration::from_secs(20)).await);
    assert_eq!(failed(&r1), Vec::<u64>::new(), "{r1}");
    for key in ["m1", "m2"] {
        assert!(
            released(&endpoint, &table, key, Duration::from_secs(5)).await,
            "{key}"
        );
    }
    let done = lines(&record, "record");
    let (m1, m2) = (
        done.iter().find(|d| d["entity"] == "m1").unwrap(),
        done.iter().find(|d| d["entity"] == "m2").unwrap(),
    );
    assert!(
        m1["start"].as_u64() < m2["end"].as_u64() && m2["start"].as_u64() < m1["end"].as_u64(),
        "the two records did not run side by side: {m1} {m2}"
    );
    assert_ne!(m1["pid"], m2["pid"], "two runtime processes served them");

    // A runtime process killed mid-record: on Managed Instances nothing resets the environment
    // (no SHUTDOWN), so only the crash watch frees the lock this soon (lease 60 s); the other
    // process then takes it with wait 0.
    let crashed = platform.invoke(sqs_event(&[
        json!({"entity": "m3", "seq": 4, "crash": true}),
    ]));
    let crashing = line(&record, "crashing", Duration::from_secs(20)).await;
    assert_eq!(crashing["requestId"], crashed.as_str(), "{crashing}");
    let seen = Instant::now();
    assert!(
        released(&endpoint, &table, "m3", Duration::from_secs(5)).await,
        "m3 still held 5 s after its runtime process died\n{}",
        ext.log()
    );
    eprintln!(
        "managed instances: m3 freed {:?} after the crash was seen",
        seen.elapsed()
    );
    assert!(
        ext.log()
            .contains("the runtime exited in the middle of the invocation"),
        "{}",
        ext.log()
    );
    let next = platform.invoke(sqs_event(&[json!({"entity": "m3", "seq": 5})]));
    let r = answer(platform.outcome(&next, Duration::from_secs(20)).await);
    assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", ext.log());
    let _ = std::fs::remove_file(&record);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The guide's shell client (`flightlock_locks.sh`) in a bash + curl custom runtime: busy while
/// a Python invocation holds the key, locked with a higher token once it has ended, and a
/// refused call (an empty key) told apart from busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_client_finds_a_key_busy_then_takes_it_and_tells_refusals_apart() {
    let (endpoint, table) = table("e2e_records_sh").await;
    let record = record_file("records-sh");
    // The shell's environment has an http_proxy that nothing answers: its client never sends the
    // token (or anything) through a proxy (`curl --noproxy '*'`).
    let specs = [
        consumer("shell", Runtime::PythonRecords),
        consumer("shell", Runtime::CurlRecords)
            .with("RECORDS_HANDLER_HTTP_PROXY", "http://127.0.0.1:9"),
    ];
    let envs = start_all("shell", &specs, &endpoint, &table, &record).await;
    let (py, sh) = (&envs[0], &envs[1]);
    let r = py.invoke(sqs_event(&[])).await.json();
    assert_eq!(failed(&r), Vec::<u64>::new(), "{r}\n{}", py.log());
    let hold = record_file("records-sh-hold");
    let batch =
        sqs_event(&[json!({"entity": "s1", "seq": 0, "holdFile": hold.display().to_string()})]);
    let busy = async {
        let started = line(&record, "start", Duration::from_secs(30)).await;
        let r = sh.invoke(json!({"key": "s1", "seq": 1})).await.json();
        std::fs::write(&hold, "").unwrap();
        (started, r)
    };
    let (held, (started, r)) = tokio::join!(py.invoke(batch), busy);
    assert_eq!(failed(&held.json()), Vec::<u64>::new(), "{}", py.log());
    assert_eq!(
        r,
        json!({"locked": false, "status": 1}),
        "busy\n{}",
        sh.log()
    );
    assert!(released(&endpoint, &table, "s1", Duration::from_secs(5)).await);
    let r = sh
        .invoke(json!({"key": "s1", "seq": 2, "sleepMs": 50}))
        .await
        .json();
    assert_eq!(r["locked"], true, "{r}\n{}", sh.log());
    assert!(
        r["token"].as_u64() > started["token"].as_u64(),
        "{r} after {started}"
    );
    let r = sh.invoke(json!({"key": "", "seq": 3})).await.json();
    assert_eq!(
        r,
        json!({"locked": false, "status": 2}),
        "refused\n{}",
        sh.log()
    );
    assert!(
        sh.log().contains("badRequest"),
        "the refusal's reason is logged\n{}",
        sh.log()
    );
    let done = lines(&record, "record");
    assert_eq!(done.len(), 2, "{done:#?}");
    assert!(
        done.iter().any(|d| d["env"] == "shell1" && d["seq"] == 2),
        "{done:#?}"
    );
    assert!(released(&endpoint, &table, "s1", Duration::from_secs(5)).await);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
    let _ = std::fs::remove_file(&hold);
}
