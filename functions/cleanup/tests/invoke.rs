//! The cleanup function's invocation against DynamoDB Local, driven by the sample events in
//! `events/`. Run through `scripts/dynamodb-local run -- cargo test -p flightlock-cleanup`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use flightlock::schema::{self, queue_sk, s, seed};
use flightlock::sweep::Sweeper;
use flightlock::{Clock, SystemClock};
use flightlock_cleanup::{invoke, Config, InvokeError};
use serde_json::Value;

fn event(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../events")
        .join(name);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

async fn table_with_rows(name: &str) -> (aws_sdk_dynamodb::Client, String) {
    let flightlock_testkit::FreshTable { client, table, .. } =
        flightlock_testkit::fresh_table(name).await;
    let now = SystemClock.wall_ms();
    for (key, until) in [("dead", now - 3_600_000), ("live", now + 60_000)] {
        let item = seed::row(key, 1, "o", "r", until);
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap();
    }
    (client, table)
}

async fn present(client: &aws_sdk_dynamodb::Client, table: &str, key: &str) -> bool {
    client
        .get_item()
        .table_name(table)
        .key(schema::PK, s(key))
        .key(schema::SK, s(&queue_sk(1)))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some()
}

fn config(table: &str) -> Config {
    Config::from_map(&HashMap::from([(
        flightlock_cleanup::config::TABLE.to_owned(),
        table.to_owned(),
    )]))
    .unwrap()
}

#[tokio::test]
async fn dry_run_event_reports_and_scheduled_event_sweeps() {
    let (client, table) = table_with_rows("cleanup_invoke").await;
    let sweeper = Sweeper::new(client.clone(), &table);
    let config = config(&table);
    let budget = Duration::from_secs(60);

    let dry = invoke(&sweeper, &config, &event("cleanup-dry-run.json"), budget)
        .await
        .unwrap();
    assert!(dry.dry_run);
    assert_eq!((dry.dead, dry.deleted, dry.still_live), (1, 0, 0));
    assert!(present(&client, &table, "dead").await);

    // A scheduled EventBridge event carries no overrides: a real sweep with the configured grace.
    let real = invoke(&sweeper, &config, &event("scheduled.json"), budget)
        .await
        .unwrap();
    assert!(!real.dry_run && real.complete);
    assert_eq!(real.deleted, 1);
    assert_eq!(real.grace_ms, 600_000);
    assert!(!present(&client, &table, "dead").await);
    assert!(present(&client, &table, "live").await);

    // The response is the summary, camelCase.
    let response = serde_json::to_value(&real).unwrap();
    assert_eq!(response["deleted"], 1);
    assert!(response.get("itemsExamined").is_some());

    let again = invoke(&sweeper, &config, &event("cleanup.json"), budget)
        .await
        .unwrap();
    assert_eq!((again.dead, again.deleted), (0, 0));
}

#[tokio::test]
async fn bad_overrides_and_a_missing_table_fail_the_invocation() {
    let (client, table) = table_with_rows("cleanup_bad").await;
    let sweeper = Sweeper::new(client.clone(), &table);
    let err = invoke(
        &sweeper,
        &config(&table),
        &serde_json::json!({"dryRun": "yes"}),
        Duration::from_secs(10),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, InvokeError::Event(_)), "{err}");
    assert!(err.to_string().contains("dryRun"));
    assert!(present(&client, &table, "dead").await);

    let missing = flightlock_testkit::unique_table("cleanup_missing");
    let err = invoke(
        &Sweeper::new(client, &missing),
        &config(&missing),
        &event("scheduled.json"),
        Duration::from_secs(10),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("was not found"), "{err}");
}

#[test]
fn keyed_event_renders_the_documented_key() {
    let template = flightlock_lambda::key::KeyTemplate::parse("job-{/detail/accountId}").unwrap();
    assert_eq!(
        template.render(&event("keyed.json")).unwrap(),
        "job-acct-42"
    );
    // The other samples parse as JSON objects.
    for name in ["scheduled.json", "cleanup.json", "cleanup-dry-run.json"] {
        assert!(event(name).is_object(), "{name}");
    }
}
