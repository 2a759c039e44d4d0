//! Every bad value on the command line: exit 2 (as the CLI reference's exit-status table says) and one
//! message that names the option and lists every accepted form. Nothing is sent to DynamoDB.

use std::process::Output;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};

use crate::common::*;

async fn output(c: std::process::Command) -> Output {
    output_within(
        c,
        std::time::Duration::from_secs(60),
        "a flightlock command",
    )
    .await
}

/// Runs `args` and asserts exit 2 and that stderr holds every one of `needles`.
async fn refused(env: &Env, args: &[&str], needles: &[&str]) {
    let mut c = cli(env);
    c.args(args);
    let out = output(c).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: {n:?} missing from: {stderr}");
    }
    assert!(
        !stderr.contains("-- -"),
        "{args:?}: clap's `-- -1` tip: {stderr}"
    );
}

/// The forms a duration takes, each named in the error.
const DURATION_FORMS: [&str; 3] = ["500ms", "1m30s", "bare number of seconds"];

#[tokio::test]
async fn a_negative_wait_is_a_bad_value_not_an_option() {
    let env = Env::new("usagewaitneg").await;
    let needles = [
        &[
            "--wait",
            "-1",
            "negative",
            "forever",
            "inf",
            "0 (do not wait)",
        ][..],
        &DURATION_FORMS,
    ]
    .concat();
    refused(
        &env,
        &["run", "--key", "k", "--wait", "-1", "--", "true"],
        &needles,
    )
    .await;
}

#[tokio::test]
async fn an_unknown_wait_lists_every_form() {
    let env = Env::new("usagewait").await;
    let needles = [
        &[
            "--wait",
            "soonish",
            "forever",
            "infinite",
            "0 (do not wait)",
        ][..],
        &DURATION_FORMS,
    ]
    .concat();
    refused(
        &env,
        &["run", "--key", "k", "--wait", "soonish", "--", "true"],
        &needles,
    )
    .await;
}

#[tokio::test]
async fn an_unknown_clock_skew_lists_every_form() {
    let env = Env::new("usageskew").await;
    let needles = [
        &["--max-clock-skew", "unbounded", "clock-free"][..],
        &DURATION_FORMS,
    ]
    .concat();
    let run = [
        "run",
        "--key",
        "k",
        "--max-clock-skew",
        "lots",
        "--",
        "true",
    ];
    refused(&env, &run, &needles).await;
    refused(
        &env,
        &["status", "--key", "k", "--max-clock-skew", "-2s"],
        &needles,
    )
    .await;
}

#[tokio::test]
async fn an_unknown_log_level_is_refused_with_the_levels() {
    let env = Env::new("usagelog").await;
    let needles = [
        "--log-level",
        "bogus",
        "off",
        "error",
        "warn",
        "info",
        "debug",
        "trace",
    ];
    refused(
        &env,
        &["status", "--key", "k", "--log-level", "bogus"],
        &needles,
    )
    .await;
    let mut c = cli(&env);
    c.env("FLIGHTLOCK_LOG_LEVEL", "loud")
        .args(["status", "--key", "k"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(2));
    // Any case, as FLIGHTLOCK_LOG_LEVEL in Lambda.
    let mut c = cli(&env);
    c.args(["status", "--key", "k", "--log-level", "DEBUG"]);
    assert!(output(c).await.status.success());
}

#[tokio::test]
async fn an_endpoint_that_is_not_a_url_is_one_line() {
    let env = Env::new("usageurl").await;
    let needles = [
        "--endpoint-url",
        "notaurl",
        "http://HOST[:PORT]",
        "https://HOST[:PORT]",
    ];
    refused(
        &env,
        &["status", "--key", "k", "--endpoint-url", "notaurl"],
        &needles,
    )
    .await;
    refused(&env, &["sweep", "--endpoint-url", "http://"], &needles[2..]).await;
}

#[tokio::test]
async fn out_of_range_lock_options_exit_2_naming_the_bound() {
    let env = Env::new("usagerange").await;
    let run = |extra: &'static [&'static str]| {
        [&["run", "--key", "k"][..], extra, &["--", "true"]].concat()
    };
    refused(
        &env,
        &run(&["--lease", "50ms"]),
        &["lease", "at least 100ms"],
    )
    .await;
    refused(
        &env,
        &run(&["--heartbeat", "15s"]),
        &["heartbeat", "at most half the lease"],
    )
    .await;
    let long_key = "k".repeat(2000);
    let mut c = cli(&env);
    c.args(["run", "--key", &long_key, "--", "true"]);
    assert_eq!(output(c).await.status.code(), Some(2));
    assert!(env.queue("k").await.is_empty());
}

#[tokio::test]
async fn sweep_counts_and_grace_are_checked() {
    let env = Env::new("usagesweep").await;
    let count = ["whole number from 1 up"];
    refused(&env, &["sweep", "--concurrency", "-1"], &count).await;
    refused(&env, &["sweep", "--segments", "0"], &count).await;
    refused(
        &env,
        &["sweep", "--concurrency", "1000"],
        &["concurrency", "1..=256"],
    )
    .await;
    let grace = [&["--grace", "-5m", "negative"][..], &DURATION_FORMS].concat();
    refused(&env, &["sweep", "--grace", "-5m"], &grace).await;
}

#[tokio::test]
async fn create_table_says_what_it_found_and_what_it_changed() {
    let env = Env::new("usagecreate").await;
    let mut c = cli(&env);
    c.arg("create-table");
    let out = output(c).await;
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing changed"),
        "{out:?}"
    );
    // A flightlock-shaped table without TTL: create-table turns TTL on and says so.
    let bare = flightlock_testkit::unique_table("usagebare");
    let attr = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .unwrap()
    };
    let key = |n: &str, k| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(k)
            .build()
            .unwrap()
    };
    env.client
        .create_table()
        .table_name(&bare)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk"))
        .attribute_definitions(attr("sk"))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .send()
        .await
        .unwrap();
    let mut c = cli(&env);
    c.env("FLIGHTLOCK_TABLE", &bare).arg("create-table");
    let out = output(c).await;
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("TTL on expiresAt was off: turned it on"),
        "{stdout}"
    );
}
