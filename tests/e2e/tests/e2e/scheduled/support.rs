//! What the scheduled-job tests share: the events, the skip-body assertions, waiting on the
//! record file and on the table, and starting environments with the recipe's settings.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use flightlock::{ClockSkew, Locker, QueueEntry};
use flightlock_e2e::{record_file, runs, start_all, stop_all, Env, Runtime, Spec};
use flightlock_testkit::{fresh_table, FreshTable};
use serde_json::{json, Value};

/// The function (and so the lock key: the recipe sets no `FLIGHTLOCK_KEY`).
pub(super) const FUNCTION: &str = "nightly";

/// The minute `offset` minutes from now, as an EventBridge `time` (`2026-11-24T10:00:00Z`).
pub(super) fn minute(offset: i64) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let at = (now / 60 + offset) * 60;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(at as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// An EventBridge scheduled event as a rule delivers it; every delivery of one tick (duplicates,
/// retries) carries the same `id` and `time`. `seq` and the fields of `control` are for the
/// demo handler (what to record, how to behave); the layer reads only `source`, `detail-type`
/// and `time`.
pub(super) fn scheduled(seq: i64, time: &str, control: Value) -> Value {
    let mut event = flightlock_testkit::events::scheduled(
        &format!("7bf73129-1428-4cd3-a780-95db273d{seq:04}"),
        time,
    );
    event["seq"] = json!(seq);
    if let (Some(e), Some(c)) = (event.as_object_mut(), control.as_object()) {
        e.extend(c.clone());
    }
    event
}

/// Panics unless `r` is the documented skip body with this `reason`, naming the tick of
/// `event` (its `time`).
pub(super) fn assert_skipped(r: &Value, reason: &str, event: &Value, env: &Env) {
    assert_skipped_tick(r, reason, event["time"].as_str().unwrap_or_default(), env);
}

/// Panics unless `r` is the documented skip body with this `reason`, naming `tick` (a time is
/// compared as an instant: the body writes it in RFC 3339 UTC).
pub(super) fn assert_skipped_tick(r: &Value, reason: &str, tick: &str, env: &Env) {
    let f = &r["flightlock"];
    assert_eq!(f["skipped"], true, "not skipped: {r}\n{}", env.log());
    assert_eq!(f["reason"], reason, "{r}\n{}", env.log());
    assert_eq!(f["key"], FUNCTION, "{r}");
    let named = f["tick"].as_str().unwrap_or_default();
    let same = match (
        humantime::parse_rfc3339(named),
        humantime::parse_rfc3339(tick),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => !named.is_empty() && named == tick,
    };
    assert!(
        same,
        "the skip body names tick {named:?}, expected {tick:?}: {r}"
    );
}

/// Waits until the handler has recorded `n` starts (the runs are in the record file).
pub(super) async fn wait_runs(record: &Path, n: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    while runs(record).len() < n {
        assert!(
            Instant::now() < until,
            "the handler did not start {n} runs within 60 s: {:#?}",
            runs(record)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the key's queue, as the table has it, satisfies `ok`; returns it.
pub(super) async fn wait_queue(
    locker: &Locker,
    what: &str,
    ok: impl Fn(&[QueueEntry]) -> bool,
) -> Vec<QueueEntry> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let q = locker
            .queue(FUNCTION, ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap();
        if ok(&q) {
            return q;
        }
        assert!(Instant::now() < until, "{what} within 60 s; queue: {q:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh table, a record file, and `n` environments of the function with the recipe's
/// settings plus `extra`.
pub(super) async fn setup(
    name: &str,
    n: usize,
    extra: &[(&str, &str)],
) -> (FreshTable, PathBuf, Vec<Env>) {
    let fresh = fresh_table(&format!("e2e_{name}")).await;
    let record = record_file(name);
    let mut spec = Spec::layered(FUNCTION, Runtime::Python).with("FLIGHTLOCK_WAIT", "0");
    for (k, v) in extra {
        spec = spec.with(k, v);
    }
    let specs = vec![spec; n];
    let envs = start_all(name, &specs, &fresh.endpoint, &fresh.table, &record).await;
    (fresh, record, envs)
}

/// The seqs of the recorded runs, in start order.
pub(super) fn ran(record: &Path) -> Vec<i64> {
    runs(record).iter().map(|r| r.seq.unwrap()).collect()
}

pub(super) async fn teardown(envs: Vec<Env>, record: &Path, files: &[&Path]) {
    stop_all(envs).await;
    for f in files.iter().copied().chain([record]) {
        let _ = std::fs::remove_file(f);
    }
}
