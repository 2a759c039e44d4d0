//! End-to-end with a custom runtime as in the AWS tutorial: a bash `bootstrap` looping with curl
//! on the Runtime API (one short-lived curl process per request), started through
//! `/opt/flightlock-wrapper`. The curl that fetched the event exits while the handler runs: the
//! lock must stay held until the response, and be freed at once only when the runtime really
//! dies.

use std::path::Path;
use std::time::{Duration, Instant};

use flightlock_e2e::{
    fifo_round, record_file, runs, skip_rounds, start_all, stop_all, table, Env, Runtime, Spec,
};
use serde_json::json;

const EARLY_RELEASE: &str = "the runtime exited in the middle of the invocation";
const SHUTDOWN_RELEASE: &str = "released held locks at shutdown";

fn no_early_release(envs: &[Env]) {
    for e in envs {
        assert!(!e.log().contains(EARLY_RELEASE), "{}", e.log());
    }
}

/// Waits until the handler of event `seq` has started (its record line is written).
async fn started(record: &Path, seq: i64) {
    let until = Instant::now() + Duration::from_secs(30);
    while !runs(record).iter().any(|r| r.seq == Some(seq)) {
        assert!(Instant::now() < until, "event {seq} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_runtime_single_flight_skip() {
    let (endpoint, table) = table("e2e_curl_skip").await;
    let record = record_file("curl-skip");
    let specs: Vec<Spec> = (0..3)
        .map(|_| Spec::layered("curlskip", Runtime::Curl).with("FLIGHTLOCK_WAIT", "0"))
        .collect();
    let envs = start_all("curl", &specs, &endpoint, &table, &record).await;
    // A handler much longer than a runtime-exit poll (100 ms).
    skip_rounds(&envs, &record, "curlskip", 1500).await;
    no_early_release(&envs);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_runtime_fifo_with_wait() {
    let (endpoint, table) = table("e2e_curl_fifo").await;
    let record = record_file("curl-fifo");
    let specs: Vec<Spec> = (0..3)
        .map(|_| Spec::layered("curlfifo", Runtime::Curl).with("FLIGHTLOCK_WAIT", "forever"))
        .collect();
    let envs = start_all("curlf", &specs, &endpoint, &table, &record).await;
    fifo_round(&envs, &record).await;
    no_early_release(&envs);
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}

/// While environment `a` runs `event` (started), `b` (wait 0) is skipped; after `a`'s invocation
/// ends with `expect_in_a`, `b` runs.
async fn held_while_running_then_freed(
    a: &Env,
    b: &Env,
    record: &Path,
    event: serde_json::Value,
    expect_in_a: &str,
) {
    let seq = event["seq"].as_i64().unwrap();
    let run_a = a.invoke(event);
    let probe = async {
        started(record, seq).await;
        // Well past the moment the curl that fetched the event exited.
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.invoke(json!({"seq": 100 + seq})).await.json()
    };
    let (ra, rb) = futures::future::join(run_a, probe).await;
    assert_eq!(
        rb["flightlock"]["skipped"],
        true,
        "the lock was free while {}'s handler ran: {rb}\n{}",
        a.name,
        a.log()
    );
    assert!(
        String::from_utf8_lossy(&ra.body).contains(expect_in_a),
        "{:?}\n{}",
        ra.body,
        a.log()
    );
    // Freed by the runtime's exit (or SHUTDOWN after a timeout): the next invocation runs.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = b.invoke(json!({"seq": 200 + seq})).await.json();
        if r["ok"] == true {
            break;
        }
        assert!(
            Instant::now() < until,
            "the key stayed held after {} ended: {r}\n{}",
            a.name,
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_runtime_timeout_and_crash_keep_the_lock_while_running_and_free_it_after() {
    let (endpoint, table) = table("e2e_curl_fail").await;
    let record = record_file("curl-fail");
    // Lease 20 s: a lock that was not released when the runtime died would hold the key far
    // longer than the 5 s this test waits for it.
    let a = Spec {
        timeout_secs: 4,
        ..Spec::layered("curlfail", Runtime::Curl)
            .with("FLIGHTLOCK_WAIT", "0")
            .with("FLIGHTLOCK_LEASE", "20s")
    };
    let b = Spec::layered("curlfail", Runtime::Curl).with("FLIGHTLOCK_WAIT", "0");
    let envs = start_all("curlx", &[a, b], &endpoint, &table, &record).await;
    for e in &envs {
        assert_eq!(e.invoke(json!({"seq": -1})).await.json()["ok"], true);
    }
    // Timeout: the handler outlives the function timeout; Lambda kills the runtime.
    held_while_running_then_freed(
        &envs[0],
        &envs[1],
        &record,
        json!({"seq": 1, "mode": "timeout"}),
        "timed out",
    )
    .await;
    // Crash: the runtime exits mid-invocation (after working for a while). The key is freed at
    // once, without waiting for the lease: by the runtime-exit watch (its whole process tree is
    // gone) or by the SHUTDOWN the emulator sends after a crash, whichever comes first.
    let releases =
        |log: String| log.matches(EARLY_RELEASE).count() + log.matches(SHUTDOWN_RELEASE).count();
    let before = releases(envs[0].log());
    held_while_running_then_freed(
        &envs[0],
        &envs[1],
        &record,
        json!({"seq": 2, "mode": "crash", "sleepMs": 1500}),
        "Runtime.ExitError",
    )
    .await;
    assert!(releases(envs[0].log()) > before, "{}", envs[0].log());
    stop_all(envs).await;
    let _ = std::fs::remove_file(&record);
}
