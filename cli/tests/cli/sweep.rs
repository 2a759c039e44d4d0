//! `flightlock sweep` from the command line: a dry run prints the summary as JSON and removes
//! nothing; a bad grace is refused naming it (the sweeper itself: `lock/tests/sweep.rs`).

use std::process::{Command, Output};
use std::time::Duration;

use flightlock::schema::seed;

use crate::common::*;

async fn output(c: Command) -> Output {
    output_within(c, Duration::from_secs(60), "flightlock sweep").await
}

#[tokio::test]
async fn dry_run_prints_the_summary_as_json() {
    let env = Env::new("sweep_cli").await;
    let t = now_ms();
    for (key, until) in [("dead", t - 3_600_000), ("live", t + 60_000)] {
        env.put(vec![
            seed::row(key, 3, "o", "rvn-1", until),
            seed::counter(key, 3),
        ])
        .await;
    }
    let mut c = cli(&env);
    c.args(["sweep", "--dry-run", "--json", "--grace", "15m"]);
    let out = output(c).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["dryRun"], true);
    assert_eq!(json["dead"], 1);
    assert_eq!(json["deleted"], 0);
    assert_eq!(json["complete"], true);
    assert_eq!(json["graceMs"], 900_000);
    assert_eq!(json["rows"][0]["key"], "dead");
    assert_eq!(json["rows"][0]["outcome"], "wouldDelete");
    for key in ["dead", "live"] {
        assert_eq!(
            env.items(key).await.len(),
            2,
            "{key}: a dry run removes nothing"
        );
    }

    // A bad grace is refused with a message naming it.
    let mut c = cli(&env);
    c.args(["sweep", "--grace", "soon"]);
    let out = output(c).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("soon"));
}
