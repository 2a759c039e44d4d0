//! The protocol's version on the table (issue 25), as the Lambda gate meets it: a key whose
//! counter says a newer protocol than this build speaks fails the invocation whatever
//! `FLIGHTLOCK_ON_BUSY` says, and nothing is written to it. The same key against `run`, the
//! library, `status` and the sweeper: `lock/tests/protocol/versions.rs`. Run through
//! `scripts/dynamodb-local run -- cargo test -p flightlock-lambda --test versions`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use flightlock::schema::seed;
use flightlock::{Locker, PROTOCOL};
use flightlock_lambda::config::Config;
use flightlock_lambda::gate::{Gate, Outcome};

const NEWER: u32 = PROTOCOL + 1;

/// A fresh table on the local server.
struct Env {
    endpoint: String,
    client: Client,
    table: String,
}

impl Env {
    async fn new(name: &str) -> Env {
        let t = flightlock_testkit::fresh_table(name).await;
        Env {
            endpoint: t.endpoint,
            client: t.client,
            table: t.table,
        }
    }

    /// A locker with its own client (its own connection pool, like another process).
    async fn locker(&self) -> Locker {
        Locker::new(
            flightlock_testkit::client(&self.endpoint).await,
            &self.table,
        )
    }
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Writes `key` as a newer protocol would (as `lock/tests/protocol/versions.rs` does): a counter
/// at protocol [`NEWER`] whose holder sits under attribute names this build does not know, and a
/// dead queue row written under [`NEWER`].
async fn put_newer_key(env: &Env, key: &str) {
    let live_until = now_ms() + 600_000;
    let counter = HashMap::from([
        ("pk".to_owned(), s(key)),
        ("sk".to_owned(), s("counter")),
        ("last".to_owned(), n(7)),
        ("lastOwner".to_owned(), s("v2-holder:7")),
        ("protocol".to_owned(), n(NEWER)),
        ("holderOwner".to_owned(), s("v2-holder")),
        ("holderTicket".to_owned(), n(7)),
        ("holderLeaseUntilMs".to_owned(), n(live_until)),
    ]);
    let mut dead_row = seed::row(key, 6, "v2-gone", "r6", now_ms() - 3_600_000);
    dead_row.insert("protocol".to_owned(), n(NEWER));
    for item in [counter, dead_row] {
        env.client
            .put_item()
            .table_name(&env.table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
}

/// The key's items, comparable: attribute name to value, by sort key.
async fn items(env: &Env, key: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let out = env
        .client
        .query()
        .table_name(&env.table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", s(key))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    out.items
        .unwrap_or_default()
        .into_iter()
        .map(|item| {
            let sk = item["sk"].as_s().unwrap().clone();
            let attrs = item
                .into_iter()
                .map(|(k, v)| (k, format!("{v:?}")))
                .collect();
            (sk, attrs)
        })
        .collect()
}

#[tokio::test]
async fn the_gate_fails_the_invocation_even_when_busy_means_skip() {
    let env = Env::new("protogate").await;
    put_newer_key(&env, "job").await;
    let before = items(&env, "job").await;
    for on_busy in ["skip", "error"] {
        let vars: HashMap<String, String> = [
            ("FLIGHTLOCK_TABLE", env.table.as_str()),
            ("FLIGHTLOCK_KEY", "job"),
            ("FLIGHTLOCK_ON_BUSY", on_busy),
            ("FLIGHTLOCK_WAIT", "2s"),
            ("FLIGHTLOCK_METRICS", "off"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let config = Config::from_map(&vars).unwrap();
        let gate = Gate::new(config.into(), env.locker().await, "host".into());
        let deadline = SystemTime::now() + Duration::from_secs(30);
        match gate.decide("req-1", Some(deadline), b"{}", None).await {
            Outcome::Failed {
                error_type,
                message,
            } => {
                assert_eq!(error_type, "FlightlockProtocolTooNew", "{message}");
                assert!(message.contains(&format!("protocol {NEWER}")), "{message}");
            }
            other => panic!("on busy {on_busy}: expected a failed invocation, got {other:?}"),
        }
    }
    assert_eq!(
        items(&env, "job").await,
        before,
        "the gate wrote to the key"
    );
}
