//! The protocol's version on the table, from the CLI: a key whose counter says a newer protocol
//! than this build speaks is refused by `run` with its own exit status (76) and one line naming
//! both versions and the upgrade guide, nothing is written to it, and `status` reports the
//! protocol (the library: `lock/tests/protocol/versions.rs`).

use std::process::Output;
use std::time::Duration;

use flightlock::schema::seed;
use flightlock::PROTOCOL;

use crate::common::*;

const NEWER: u32 = PROTOCOL + 1;

async fn output(c: std::process::Command) -> Output {
    output_within(c, Duration::from_secs(60), "a flightlock command").await
}

#[tokio::test]
async fn run_refuses_a_key_on_a_newer_protocol_with_its_own_exit_status() {
    let env = Env::new("protorun").await;
    env.put(seed::newer_key("job", now_ms())).await;
    let before = env.items_by_sk("job").await;
    let marker = std::env::temp_dir().join(format!("flightlock-protorun-{}", env.table));
    for wait in ["0", "3s"] {
        let mut c = cli(&env);
        c.args(["run", "--key", "job", "--wait", wait, "--", "touch"])
            .arg(&marker);
        let out = output(c).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(76), "wait {wait}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        for said in [
            format!("protocol {NEWER}"),
            format!("protocol {PROTOCOL}"),
            "upgrades.md".to_owned(),
        ] {
            assert!(stderr.contains(&said), "{said:?} not in {stderr}");
        }
        assert!(!marker.exists(), "the command ran on a key it cannot read");
    }
    assert_eq!(env.items_by_sk("job").await, before, "run wrote to the key");
}

#[tokio::test]
async fn status_reports_the_protocol() {
    let env = Env::new("protostatus").await;
    let locker = env.locker().await;
    locker
        .acquire("old", &fast())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    env.put(seed::newer_key("new", now_ms())).await;
    let mut c = cli(&env);
    c.args(["status", "--key", "old", "--json"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // A key of one permit runs protocol 1 (issue 26), whatever this build speaks.
    assert_eq!(json["protocol"], 1);
    assert_eq!(json["speaks"], PROTOCOL);

    let mut c = cli(&env);
    c.args(["status", "--key", "new", "--json"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(76));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["protocol"], NEWER);
    assert_eq!(json["queue"], serde_json::Value::Null);
}

/// A counter set back below a queued row (a table restore, an old counter item put back by
/// hand) is reported by `status` with the command that raises it; `--json` says `counterBehind`.
#[tokio::test]
async fn status_reports_a_counter_set_back_below_its_queue() {
    let env = Env::new("protobehind").await;
    env.put(vec![
        seed::counter("job", 1),
        seed::row("job", 3, "holder-3", "r3", now_ms() + 600_000),
    ])
    .await;
    let mut c = cli(&env);
    c.args(["status", "--key", "job"]);
    let out = output(c).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("WARNING") && stderr.contains("update-item") && stderr.contains("\"3\""),
        "{stderr}"
    );
    let mut c = cli(&env);
    c.args(["status", "--key", "job", "--json"]);
    let out = output(c).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["counterBehind"], 3, "{json}");
}

/// A `protocol` that is no version (written by hand) is malformed on every read, naming the
/// attribute and the value: not "a newer protocol, upgrade" (issue 42).
#[tokio::test]
async fn a_protocol_that_is_no_version_is_named_as_malformed() {
    let env = Env::new("protomalformed").await;
    for (key, value) in [("neg", "-1"), ("half", "0.5")] {
        let mut counter = seed::counter(key, 4);
        counter.insert(
            "protocol".into(),
            aws_sdk_dynamodb::types::AttributeValue::N(value.into()),
        );
        env.put(vec![counter]).await;
        let err = env.locker().await.acquire(key, &fast()).await.unwrap_err();
        assert!(
            matches!(&err, flightlock::Error::MalformedItem { field, .. } if field == "protocol"),
            "{err}"
        );
        assert!(err.to_string().contains(value), "{err}");
        let mut c = cli(&env);
        c.args(["status", "--key", key]);
        let out = output(c).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        assert!(
            stderr.contains("protocol") && stderr.contains(value) && !stderr.contains("Upgrade"),
            "{stderr}"
        );
    }
}
