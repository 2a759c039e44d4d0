//! Helpers shared by the end-to-end tests: record files, starting and invoking several
//! environments, and the skip and FIFO scenarios every runtime goes through.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::{assert_no_overlap, runs, Env, Spec};

/// A fresh record file path for a test (the demo handlers append their runs to it).
pub fn record_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "flightlock-e2e-{}-{name}-{}.jsonl",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
}

/// Starts one environment per spec, named `prefix0`, `prefix1`, ...
pub async fn start_all(
    prefix: &str,
    specs: &[Spec],
    endpoint: &str,
    table: &str,
    record: &Path,
) -> Vec<Env> {
    let mut envs = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        envs.push(Env::start(&format!("{prefix}{i}"), spec, endpoint, table, record).await);
    }
    envs
}

/// Stops every environment.
pub async fn stop_all(envs: Vec<Env>) {
    for e in envs {
        e.stop().await;
    }
}

/// Stops one environment and removes the test's record file.
pub async fn finish(env: Env, record: &Path) {
    env.stop().await;
    let _ = std::fs::remove_file(record);
}

/// Fires one invocation per environment at once; returns the responses in env order.
pub async fn invoke_all(
    envs: &[Env],
    event: impl Fn(usize) -> serde_json::Value,
) -> Vec<serde_json::Value> {
    let calls = envs.iter().enumerate().map(|(i, e)| {
        let ev = event(i);
        async move {
            let r = e.invoke(ev).await;
            assert_eq!(r.status, 200, "{}: {:?}", e.name, r.body);
            r.json()
        }
    });
    futures::future::join_all(calls).await
}

/// Checks a single-flight round with wait = 0: one ran, the others were skipped with the
/// documented body naming the holder, and no two handler runs overlapped.
pub fn check_skip_round(responses: &[serde_json::Value], record: &Path, key: &str) {
    let ran: Vec<_> = responses.iter().filter(|r| r["ok"] == true).collect();
    let skipped: Vec<_> = responses
        .iter()
        .filter(|r| r["flightlock"]["skipped"] == true)
        .collect();
    assert_eq!(ran.len() + skipped.len(), responses.len(), "{responses:#?}");
    assert!(!ran.is_empty() && !skipped.is_empty(), "{responses:#?}");
    let ran_ids: Vec<&str> = ran
        .iter()
        .map(|r| r["requestId"].as_str().unwrap())
        .collect();
    for s in &skipped {
        assert_eq!(s["flightlock"]["key"], key);
        let holder = s["flightlock"]["heldBy"]["requestId"].as_str().unwrap();
        assert!(
            ran_ids.contains(&holder),
            "skipped body names {holder}, ran: {ran_ids:?}"
        );
        assert!(s["flightlock"]["heldBy"]["ticket"].as_u64().unwrap() >= 1);
    }
    let runs = runs(record);
    assert_eq!(runs.len(), ran.len(), "{runs:#?}");
    assert_no_overlap(&runs);
}

/// Two rounds (cold: init happens at the first invoke; then warm) of one invocation per
/// environment at once with wait = 0, each handler running `sleep_ms`: each round is checked by
/// [`check_skip_round`].
pub async fn skip_rounds(envs: &[Env], record: &Path, key: &str, sleep_ms: u64) {
    for _round in 0..2 {
        let _ = std::fs::remove_file(record);
        let responses = invoke_all(envs, |i| json!({"seq": i, "sleepMs": sleep_ms})).await;
        check_skip_round(&responses, record, key);
    }
}

/// FIFO with waiting: every environment is warmed first (init), so arrival order is the order
/// of invocation; then environment `i` is invoked `400 ms · i` after the first, each handler
/// running 1 s. Every invocation must succeed, the handler runs must not overlap, and they
/// must run in arrival order.
pub async fn fifo_round(envs: &[Env], record: &Path) {
    for e in envs {
        let r = e.invoke(json!({"seq": -1})).await;
        assert_eq!(r.json()["ok"], true, "{}", e.log());
    }
    let _ = std::fs::remove_file(record);
    let calls = envs.iter().enumerate().map(|(i, e)| async move {
        tokio::time::sleep(Duration::from_millis(400 * i as u64)).await;
        e.invoke(json!({"seq": i, "sleepMs": 1000})).await.json()
    });
    for (i, r) in futures::future::join_all(calls).await.iter().enumerate() {
        assert_eq!(r["ok"], true, "{i}: {r}");
    }
    let runs = runs(record);
    assert_eq!(runs.len(), envs.len(), "{runs:#?}");
    assert_no_overlap(&runs);
    let order: Vec<i64> = runs.iter().map(|r| r.seq.unwrap()).collect();
    let arrival: Vec<i64> = (0..envs.len() as i64).collect();
    assert_eq!(order, arrival, "granted out of arrival order: {runs:#?}");
}
