//! Lambda Managed Instances with real runtime processes on the platform double: several bash +
//! curl runtimes (tests/e2e/runtimes/curl_bootstrap.sh), each started through the layer's
//! wrapper, all on the same proxy port, calling `/next` concurrently; the real extension binary;
//! DynamoDB Local. There are no INVOKE events: crash release and unenforced detection come from
//! what the proxy sees and from the Telemetry API.

use std::time::Duration;

use flightlock_e2e::platform::{Mode, Options, Outcome, Platform};
use flightlock_e2e::sandbox::{self, curl_runtime, python_runtime, queue, released};
use flightlock_e2e::{record_file, repo_root, runs, table};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

const EARLY_RELEASE: &str = "the runtime exited in the middle of the invocation";

fn managed_instances() -> Options {
    Options::new(Mode::ManagedInstances { max_concurrency: 4 })
}

fn response(o: Option<Outcome>) -> serde_json::Value {
    match o {
        Some(Outcome::Response(b)) => serde_json::from_slice(&b).unwrap(),
        other => panic!("expected a response, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_processes_exclude_the_same_key_and_run_other_keys_in_parallel() {
    let (endpoint, table) = table("e2e_mi_procs").await;
    let record = record_file("mi-procs");
    let platform = Platform::start(managed_instances()).await;
    let extra = [
        ("FLIGHTLOCK_KEY", "job-{/k}"),
        ("FLIGHTLOCK_WAIT", "forever"),
    ];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let _a = curl_runtime(&platform, ext.proxy_port, &record, "proc-a");
    let _b = curl_runtime(&platform, ext.proxy_port, &record, "proc-b");
    assert!(
        platform
            .wait_runtimes_waiting(2, Duration::from_secs(10))
            .await
    );
    // job-a, job-b, job-a: the first two start together on the two processes; the second
    // job-a waits for the first.
    let ids = [
        platform.invoke(json!({"k": "a", "seq": 1, "sleepMs": 800})),
        platform.invoke(json!({"k": "b", "seq": 2, "sleepMs": 800})),
        platform.invoke(json!({"k": "a", "seq": 3, "sleepMs": 800})),
    ];
    for id in &ids {
        let body = response(platform.outcome(id, Duration::from_secs(30)).await);
        assert_eq!(body["ok"], true, "{id}: {body}");
    }
    let all = runs(&record);
    let _ = std::fs::remove_file(&record);
    assert_eq!(all.len(), 3, "{all:?}");
    let run = |seq| all.iter().find(|r| r.seq == Some(seq)).unwrap().clone();
    let (a1, b, a3) = (run(1), run(2), run(3));
    let overlap = |x: &flightlock_e2e::Run, y: &flightlock_e2e::Run| {
        x.start < y.end.unwrap() && y.start < x.end.unwrap()
    };
    assert!(!overlap(&a1, &a3), "same key ran at once: {a1:?} {a3:?}");
    assert!(
        overlap(&a1, &b),
        "other keys did not run side by side: {a1:?} {b:?}"
    );
    // Two runtime processes served them.
    assert!(all.iter().any(|r| r.env == "proc-a") && all.iter().any(|r| r.env == "proc-b"));
    for key in ["job-a", "job-b"] {
        assert!(
            released(&endpoint, &table, key, Duration::from_secs(5)).await,
            "{key}"
        );
    }
    assert!(!ext.log().contains(EARLY_RELEASE), "{}", ext.log());
}

/// Managed Instances with keys `job-{/k}`, wait 0 and a lease far longer than a test (only the
/// crash watch can free a key this soon: the heartbeat would keep it until the 60 s deadline),
/// and two bash + curl runtime processes waiting for events. `name` names its table and record.
async fn crash_watched(
    name: &str,
) -> (
    String,
    String,
    std::path::PathBuf,
    Platform,
    sandbox::Extension,
    [tokio::process::Child; 2],
) {
    let (endpoint, table) = table(&format!("e2e_mi_{name}")).await;
    let record = record_file(&format!("mi-{name}"));
    let platform = Platform::start(managed_instances()).await;
    let extra = [
        ("FLIGHTLOCK_KEY", "job-{/k}"),
        ("FLIGHTLOCK_WAIT", "0"),
        ("FLIGHTLOCK_LEASE", "60s"),
    ];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let runtimes = [
        curl_runtime(&platform, ext.proxy_port, &record, "proc-a"),
        curl_runtime(&platform, ext.proxy_port, &record, "proc-b"),
    ];
    assert!(
        platform
            .wait_runtimes_waiting(2, Duration::from_secs(10))
            .await
    );
    (endpoint, table, record, platform, ext, runtimes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_process_that_dies_mid_invocation_releases_its_lock_at_once() {
    let (endpoint, table, record, platform, ext, _runtimes) = crash_watched("crash").await;
    platform.invoke(json!({"k": "a", "seq": 1, "sleepMs": 300, "mode": "crash"}));
    assert!(
        ext.wait_log(EARLY_RELEASE, Duration::from_secs(15)).await,
        "the crashed process's lock was not released early:\n{}",
        ext.log()
    );
    assert_eq!(queue(&endpoint, &table, "job-a").await, 0);
    // The surviving process runs the key at once (wait 0: a held key would be skipped).
    let id = platform.invoke(json!({"k": "a", "seq": 2}));
    let body = response(platform.outcome(&id, Duration::from_secs(15)).await);
    assert_eq!(body["ok"], true, "{body}");
    let _ = std::fs::remove_file(&record);
}

/// Lambda retries an asynchronous invocation with the same request id. The retry is a delivery
/// of its own: when its runtime process dies mid-way, its lock is released at once, as a first
/// delivery's is (before, the retry found the first delivery's finished slot, so no crash watch
/// ran and the key stayed held and heartbeated until the deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_id_gets_a_crash_watch_of_its_own() {
    let (endpoint, table, record, platform, ext, _runtimes) = crash_watched("retry").await;
    let id = platform.invoke(json!({"k": "a", "seq": 1}));
    let body = response(platform.outcome(&id, Duration::from_secs(15)).await);
    assert_eq!(body["ok"], true, "{body}");
    assert!(released(&endpoint, &table, "job-a", Duration::from_secs(5)).await);
    // The retry, same request id; its runtime process crashes mid-invocation.
    platform.redeliver(
        &id,
        json!({"k": "a", "seq": 2, "sleepMs": 300, "mode": "crash"}),
    );
    assert!(
        ext.wait_log(EARLY_RELEASE, Duration::from_secs(15)).await,
        "the retried delivery's lock was not released when its runtime died:\n{}",
        ext.log()
    );
    assert!(
        released(&endpoint, &table, "job-a", Duration::from_secs(5)).await,
        "{}",
        ext.log()
    );
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_that_bypasses_the_proxy_is_reported_from_telemetry() {
    let (endpoint, table) = table("e2e_mi_unenforced").await;
    let platform = Platform::start(managed_instances()).await;
    let ext = sandbox::extension(&platform, &endpoint, &table, &[], None).await;
    assert!(
        ext.wait_log("subscribed to the Telemetry API", Duration::from_secs(10))
            .await
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let get = |port: u16| {
        http::Request::get(format!(
            "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/next"
        ))
        .body(Full::default())
        .unwrap()
    };
    // Through the proxy: enforced, not reported.
    let through = platform.invoke(json!({"via": "proxy"}));
    let resp = client.request(get(ext.proxy_port)).await.unwrap();
    assert_eq!(
        resp.headers()["lambda-runtime-aws-request-id"],
        through.as_str()
    );
    // A runtime process that talks to the platform directly (not started through the wrapper).
    let bypass = platform.invoke(json!({"via": "direct"}));
    let resp = client.request(get(platform.addr().port())).await.unwrap();
    assert_eq!(
        resp.headers()["lambda-runtime-aws-request-id"],
        bypass.as_str()
    );
    let _ = resp.into_body().collect().await;
    assert!(
        ext.wait_log(&format!("request_id={bypass}"), Duration::from_secs(10))
            .await,
        "{}",
        ext.log()
    );
    let log = ext.log();
    let line = log.lines().find(|l| l.contains(&bypass)).unwrap();
    assert!(line.contains("UNENFORCED"), "{line}");
    assert!(log.contains("UnenforcedInvocations"), "no metric:\n{log}");
    // Past the grace, the one that went through the proxy is still not reported.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = ext.log();
    assert!(
        !log.lines()
            .any(|l| l.contains("UNENFORCED") && l.contains(&through)),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_telemetry_api_the_limitation_is_logged_and_locks_still_hold() {
    let (endpoint, table) = table("e2e_mi_notelemetry").await;
    let mut options = managed_instances();
    options.telemetry = false;
    let platform = Platform::start(options).await;
    let extra = [("FLIGHTLOCK_KEY", "fixed")];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    assert!(
        ext.wait_log("CANNOT be detected here", Duration::from_secs(10))
            .await,
        "{}",
        ext.log()
    );
    assert!(
        ext.log().contains("Telemetry.NotSupported"),
        "{}",
        ext.log()
    );
    assert!(platform.init_errors().is_empty());
    // Init went on; an invocation fetched through the proxy is still gated.
    let id = platform.invoke(json!({}));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let port = ext.proxy_port;
    let req = http::Request::get(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/next"
    ))
    .body(Full::default())
    .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.headers()["lambda-runtime-aws-request-id"], id.as_str());
    assert_eq!(queue(&endpoint, &table, "fixed").await, 1);
    let req = http::Request::post(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/response"
    ))
    .body(Full::new(bytes::Bytes::from_static(b"{}")))
    .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 202);
    assert_eq!(queue(&endpoint, &table, "fixed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_process_that_exits_during_init_leaves_the_others_gated() {
    let (endpoint, table) = table("e2e_mi_initexit").await;
    let record = record_file("mi-initexit");
    let platform = Platform::start(managed_instances()).await;
    let extra = [
        ("FLIGHTLOCK_KEY", "job-{/k}"),
        ("FLIGHTLOCK_WAIT", "forever"),
    ];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    // One process dies before its first `/next`, as a runtime failing its init would.
    let status =
        tokio::process::Command::new(repo_root().join("extension/layer/flightlock-wrapper"))
            .args(["sh", "-c", "exit 3"])
            .env("FLIGHTLOCK_PROXY_PORT", ext.proxy_port.to_string())
            .status()
            .await
            .unwrap();
    assert_eq!(status.code(), Some(3));
    let _b = curl_runtime(&platform, ext.proxy_port, &record, "proc-b");
    let ids = [
        platform.invoke(json!({"k": "a", "seq": 1, "sleepMs": 300})),
        platform.invoke(json!({"k": "a", "seq": 2, "sleepMs": 300})),
    ];
    for id in &ids {
        let body = response(platform.outcome(id, Duration::from_secs(30)).await);
        assert_eq!(body["ok"], true, "{body}");
    }
    let all = runs(&record);
    let _ = std::fs::remove_file(&record);
    assert_eq!(all.len(), 2);
    flightlock_e2e::assert_no_overlap(&all);
    assert!(released(&endpoint, &table, "job-a", Duration::from_secs(5)).await);
    assert!(!ext.log().contains(EARLY_RELEASE), "{}", ext.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awslambdaric_processes_keep_their_connection_and_a_crash_releases_at_once() {
    let (endpoint, table) = table("e2e_mi_python").await;
    let record = record_file("mi-python");
    let platform = Platform::start(managed_instances()).await;
    let extra = [
        ("FLIGHTLOCK_KEY", "job-{/k}"),
        ("FLIGHTLOCK_WAIT", "0"),
        ("FLIGHTLOCK_LEASE", "60s"),
        ("FLIGHTLOCK_LOG_LEVEL", "debug"),
    ];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let _a = python_runtime(&platform, ext.proxy_port, &record, "py-a");
    let _b = python_runtime(&platform, ext.proxy_port, &record, "py-b");
    assert!(
        platform
            .wait_runtimes_waiting(2, Duration::from_secs(20))
            .await
    );
    // A few plain runs first: the runtime of each keep-alive connection is traced once.
    for seq in 1..=3 {
        let id = platform.invoke(json!({"k": "a", "seq": seq, "sleepMs": 100}));
        let body = response(platform.outcome(&id, Duration::from_secs(15)).await);
        assert!(body.get("flightlock").is_none(), "skipped: {body}");
        // The release follows the response the platform already has.
        assert!(released(&endpoint, &table, "job-a", Duration::from_secs(5)).await);
    }
    assert!(!ext.log().contains(EARLY_RELEASE), "{}", ext.log());
    // Three events over at most two keep-alive connections: at least one was a known connection.
    let log = ext.log();
    let traced: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("runtime process of the connection"))
        .collect();
    assert!(traced.iter().all(|l| l.contains("runtime_pid=")), "{log}");
    assert!(traced.iter().any(|l| l.contains("cached=true")), "{log}");
    platform.invoke(json!({"k": "a", "seq": 4, "sleepMs": 300, "mode": "crash"}));
    assert!(
        ext.wait_log(EARLY_RELEASE, Duration::from_secs(15)).await,
        "the crashed process's lock was not released early:\n{}",
        ext.log()
    );
    assert!(released(&endpoint, &table, "job-a", Duration::from_secs(5)).await);
    let id = platform.invoke(json!({"k": "a", "seq": 5}));
    let body = response(platform.outcome(&id, Duration::from_secs(15)).await);
    assert!(body.get("flightlock").is_none(), "skipped: {body}");
    let _ = std::fs::remove_file(&record);
}
