//! The protocol's requests, as a snapshot that belongs to one protocol number: every kind of
//! request a fixed set of schedules sends (operation, condition, update, key condition, filter,
//! projection, the attribute names a put writes), with the placeholders resolved to attribute
//! names. A change to what the table holds or how a request is conditioned changes this set,
//! and then `flightlock::PROTOCOL` must change with it (see `CONTRIBUTING.md`): the test compares
//! against `snapshots/protocol-<PROTOCOL>.txt` and fails on any difference.
//!
//! For a new protocol number, write its snapshot once with `FLIGHTLOCK_WRITE_SNAPSHOT=1` (it
//! refuses to overwrite an existing one, and fails so the new file is reviewed and committed).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::Client;
use flightlock::schema::seed;
use flightlock::{LockOptions, Locker, SweepOptions, Sweeper, Tick, Wait, PROTOCOL};
use serde_json::Value;

use crate::common::*;

/// Records one line per request kind sent through the client it is installed on, and every
/// value sent as `:speaks` (the protocol a write is conditioned on).
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<BTreeSet<String>>>, Arc<Mutex<BTreeSet<String>>>);

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "protocol-snapshot"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let request = context.request();
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("?")
            .to_owned();
        let body: Value = match request.body().bytes() {
            Some(bytes) => serde_json::from_slice(bytes)?,
            None => Value::Null,
        };
        let lines = describe(&operation, &body);
        self.0.lock().unwrap().extend(lines);
        let mut speaks = self.1.lock().unwrap();
        for values in std::iter::once(&body["ExpressionAttributeValues"]).chain(
            body["TransactItems"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e.as_object().into_iter().flatten())
                .map(|(_, item)| &item["ExpressionAttributeValues"]),
        ) {
            if let Some(v) = values[":speaks"]["N"].as_str() {
                speaks.insert(v.to_owned());
            }
        }
        Ok(())
    }
}

/// The lines of one request: one per item of a transaction.
fn describe(operation: &str, body: &Value) -> Vec<String> {
    if operation == "TransactWriteItems" {
        return body["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|entry| entry.as_object().into_iter().flatten())
            .map(|(kind, item)| describe_one(&format!("TransactWriteItems/{kind}"), item))
            .collect();
    }
    vec![describe_one(operation, body)]
}

fn describe_one(label: &str, r: &Value) -> String {
    let names: HashMap<String, String> = r["ExpressionAttributeNames"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("?").to_owned()))
        .collect();
    let resolve = |expr: &str| -> String {
        let mut out = String::new();
        let mut chars = expr.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '#' {
                out.push(c);
                continue;
            }
            let mut token = String::from("#");
            while let Some(&d) = chars.peek() {
                if d.is_alphanumeric() || d == '_' {
                    token.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push_str(names.get(&token).map_or(token.as_str(), String::as_str));
        }
        out
    };
    let mut parts = vec![label.to_owned()];
    for field in [
        "KeyConditionExpression",
        "FilterExpression",
        "ProjectionExpression",
        "ConditionExpression",
        "UpdateExpression",
    ] {
        if let Some(expr) = r[field].as_str() {
            parts.push(format!("{field}: {}", resolve(expr)));
        }
    }
    for field in [
        "ScanIndexForward",
        "Limit",
        "ConsistentRead",
        "ReturnValuesOnConditionCheckFailure",
    ] {
        if !r[field].is_null() {
            parts.push(format!("{field}: {}", r[field]));
        }
    }
    if let Some(item) = r["Item"].as_object() {
        let written: BTreeSet<&str> = item.keys().map(String::as_str).collect();
        let written: Vec<&str> = written.into_iter().collect();
        parts.push(format!("writes: {}", written.join(", ")));
    }
    parts.join(" | ")
}

async fn recording_client(env: &Env, recorder: &Recorder) -> Client {
    let base = flightlock_testkit::client(&env.endpoint).await;
    let config = base
        .config()
        .to_builder()
        .interceptor(recorder.clone())
        .build();
    Client::from_conf(config)
}

/// Holds long enough for several heartbeats of [`fast`]'s 300 ms interval, so a waiter's row
/// is renewed before its grant and after it (`acquiredAtMs` rides on the first renewal).
const HOLD: Duration = Duration::from_millis(1_200);

/// Two lockers contend on `key` with `a_opts` and `b_opts`; both release with `done`.
async fn contend(a: &Locker, b: &Locker, key: &str, a_opts: LockOptions, b_opts: LockOptions) {
    let g = a.acquire(key, &a_opts).await.unwrap();
    let b = b.clone();
    let key2 = key.to_owned();
    let waiter = tokio::spawn(async move {
        let g = b.acquire(&key2, &b_opts).await.unwrap();
        tokio::time::sleep(HOLD).await;
        g.release_done().await.unwrap();
    });
    tokio::time::sleep(HOLD).await;
    g.release_done().await.unwrap();
    within(Duration::from_secs(10), "the waiter's turn", waiter)
        .await
        .unwrap();
}

/// The schedules whose requests make up the snapshot of protocol 1: every request kind of the
/// protocol and the sweep, each way it is sent, by participants of one permit. Returns the lines,
/// and the `:speaks` values the lockers (not the sweeper) sent.
async fn record() -> (BTreeSet<String>, BTreeSet<String>) {
    let env = Env::new("snapshot").await;
    let recorder = Recorder::default();
    let a = Locker::new(recording_client(&env, &recorder).await, &env.table);
    let b = Locker::new(recording_client(&env, &recorder).await, &env.table);
    let t1 = 1_795_514_400_000_i64;
    let tick = |t: i64| LockOptions {
        tick: Some(Tick::At(t)),
        ..fast()
    };
    // A new key (counter created, seat taken), a waiter queued behind it (the transaction),
    // heartbeats of the seat and of a row, both releases; then ordered ticks on the seat and
    // on a row (the mark), and a tick id.
    contend(&a, &b, "plain", fast(), fast()).await;
    contend(&a, &b, "ticks", tick(t1), tick(t1 + 60_000)).await;
    let by_id = LockOptions {
        tick: Some(Tick::Id("batch-1".into())),
        ..fast()
    };
    a.acquire("ids", &by_id)
        .await
        .unwrap()
        .release_done()
        .await
        .unwrap();
    // The hint: the same locker takes the key it released last without reading first.
    a.acquire("plain", &fast())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Dead entries passed over: a row and a seat.
    let dead = now_ms() - 3_600_000;
    env.put(vec![
        seed::counter("stale-row", 1),
        seed::row("stale-row", 1, "gone", "r1", dead),
        seed::seat("stale-seat", 1, "gone", "r1", dead),
    ])
    .await;
    for key in ["stale-row", "stale-seat"] {
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..fast()
        };
        a.acquire(key, &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // The sweep: a dead row and a dead seat.
    env.put(vec![
        seed::counter("swept-row", 1),
        seed::row("swept-row", 1, "gone", "r1", dead),
        seed::seat("swept-seat", 1, "gone", "r1", dead),
    ])
    .await;
    // The sweeper's `:speaks` is the highest protocol it speaks: recorded apart.
    let swept = Recorder(recorder.0.clone(), Arc::default());
    let sweeper = Sweeper::new(recording_client(&env, &swept).await, &env.table);
    let summary = sweeper.sweep(&SweepOptions::default()).await.unwrap();
    assert_eq!(summary.deleted, 2, "{summary:#?}");
    a.flush().await;
    b.flush().await;
    let lines = recorder.0.lock().unwrap().clone();
    let speaks = recorder.1.lock().unwrap().clone();
    (lines, speaks)
}

/// The schedules of protocol 2's own requests: participants of three permits on a new key (its
/// counter created with them, the seat taken, two rows granted at once, a fourth waiting and
/// granted when a permit frees, heartbeats of the seat and of rows, releases), the hint (a row
/// granted at once at the next ticket), a busy `wait = 0`, and the sweep of a dead row of a key
/// of three permits.
async fn record_permits() -> BTreeSet<String> {
    let env = Env::new("snapshot-permits").await;
    let recorder = Recorder::default();
    let three = LockOptions {
        permits: 3,
        ..fast()
    };
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(Locker::new(
            recording_client(&env, &recorder).await,
            &env.table,
        ));
    }
    let mut held = Vec::new();
    for l in &lockers[..3] {
        held.push(l.acquire("three", &three).await.unwrap());
    }
    let busy = LockOptions {
        wait: Wait::NoWait,
        ..three.clone()
    };
    let err = lockers[3].acquire("three", &busy).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waiter = {
        let (l, opts) = (lockers[3].clone(), three.clone());
        tokio::spawn(async move {
            let g = l.acquire("three", &opts).await.unwrap();
            tokio::time::sleep(HOLD).await;
            g.release().await.unwrap();
        })
    };
    tokio::time::sleep(HOLD).await;
    for g in held.drain(..) {
        g.release().await.unwrap();
    }
    within(Duration::from_secs(10), "the fourth's turn", waiter)
        .await
        .unwrap();
    // The hint: a row at the next ticket, granted at once.
    lockers[0]
        .acquire("three", &three)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A dead row of a key of three permits, swept.
    let dead = now_ms() - 3_600_000;
    let mut row = seed::row("swept-three", 2, "gone", "r1", dead);
    row.insert(
        "protocol".to_owned(),
        aws_sdk_dynamodb::types::AttributeValue::N("2".into()),
    );
    let mut counter = seed::counter("swept-three", 2);
    counter.insert(
        "protocol".to_owned(),
        aws_sdk_dynamodb::types::AttributeValue::N("2".into()),
    );
    counter.insert(
        "permits".to_owned(),
        aws_sdk_dynamodb::types::AttributeValue::N("3".into()),
    );
    env.put(vec![counter, row]).await;
    let sweeper = Sweeper::new(recording_client(&env, &recorder).await, &env.table);
    let summary = sweeper.sweep(&SweepOptions::default()).await.unwrap();
    assert_eq!(summary.deleted, 1, "{summary:#?}");
    for l in &lockers {
        l.flush().await;
    }
    let lines = recorder.0.lock().unwrap().clone();
    lines
}

/// A key of one permit is protocol 1 on the wire, byte for byte: participants of one permit send
/// exactly the requests of protocol 1's snapshot, conditioned on `:speaks = 1`, so a protocol 1
/// build beside them sees nothing it does not know (issue 26: "N = 1 is today's lock, unchanged
/// on the wire").
#[tokio::test]
async fn one_permit_sends_exactly_protocol_1s_requests() {
    bounded(async move {
        let (recorded, speaks) = record().await;
        let committed = std::fs::read_to_string(snapshot_path(1)).unwrap();
        let committed: BTreeSet<String> = committed
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        let added: Vec<_> = recorded.difference(&committed).collect();
        let gone: Vec<_> = committed.difference(&recorded).collect();
        assert!(
            added.is_empty() && gone.is_empty(),
            "one permit no longer sends protocol 1's requests:\nnew: {added:#?}\ngone: {gone:#?}"
        );
        assert_eq!(
            speaks,
            BTreeSet::from(["1".to_owned()]),
            "participants of one permit must condition their writes on protocol 1"
        );
    })
    .await;
}

fn snapshot_path(protocol: u32) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/protocol/snapshots")
        .join(format!("protocol-{protocol}.txt"))
}

const HEADER: &str = "# The requests of flightlock protocol";

#[tokio::test]
async fn the_protocols_requests_match_the_snapshot_of_its_number() {
    bounded(async move {
        let (mut recorded, _) = record().await;
        recorded.extend(record_permits().await);
        let text: String = std::iter::once(format!(
            "{HEADER} {PROTOCOL} (lock/tests/protocol/snapshot.rs; see CONTRIBUTING.md)"
        ))
        .chain(recorded.iter().cloned())
        .map(|l| l + "\n")
        .collect();
        let path = snapshot_path(PROTOCOL);
        if std::env::var_os("FLIGHTLOCK_WRITE_SNAPSHOT").is_some() {
            assert!(
            !path.exists(),
            "{} exists: a protocol's snapshot is never rewritten. A change to the requests is a \
             protocol change: raise flightlock::PROTOCOL first (CONTRIBUTING.md)",
            path.display()
        );
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
            panic!(
                "wrote {}: review it, commit it, and run again without FLIGHTLOCK_WRITE_SNAPSHOT",
                path.display()
            );
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!(
            "no snapshot for protocol {PROTOCOL} ({}): write it with FLIGHTLOCK_WRITE_SNAPSHOT=1",
            path.display()
        )
        });
        let committed_lines: BTreeSet<String> = committed
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        assert!(
            committed.starts_with(&format!("{HEADER} {PROTOCOL} ")),
            "{} does not belong to protocol {PROTOCOL}",
            path.display()
        );
        let added: Vec<_> = recorded.difference(&committed_lines).collect();
        let gone: Vec<_> = committed_lines.difference(&recorded).collect();
        assert!(
        added.is_empty() && gone.is_empty(),
        "the protocol's requests changed but flightlock::PROTOCOL is still {PROTOCOL}. A change \
         to the table's attributes or to a request's condition is a protocol change: raise \
         PROTOCOL and follow CONTRIBUTING.md.\nsent now, not in the snapshot:\n{}\nin the \
         snapshot, not sent now:\n{}",
        added
            .iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
        gone.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    })
    .await;
}
