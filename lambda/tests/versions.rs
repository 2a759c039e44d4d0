//! The protocol's version on the table (issue 25), as the Lambda gate meets it: a key whose
//! counter says a newer protocol than this build speaks fails the invocation whatever
//! `FLIGHTLOCK_ON_BUSY` says, and nothing is written to it. The same key against `run`, the
//! library, `status` and the sweeper: `lock/tests/protocol/versions.rs`. Run through
//! `scripts/dynamodb-local run -- cargo test -p flightlock-lambda --test versions`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::schema::seed;
use flightlock::PROTOCOL;
use flightlock_lambda::config::Config;
use flightlock_lambda::gate::{Gate, Outcome};
use flightlock_testkit::env::{now_ms, Env};

const NEWER: u32 = PROTOCOL + 1;

/// Writes `key` as a newer protocol would ([`seed::newer_key`], as `lock/tests/protocol/versions.rs`
/// does): a counter at protocol [`NEWER`] whose holder sits under attribute names this build does
/// not know, and a dead queue row written under [`NEWER`].
async fn put_newer_key(env: &Env, key: &str) {
    for item in seed::newer_key(key, now_ms()) {
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
        .expression_attribute_values(":pk", AttributeValue::S(key.into()))
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
