//! The standard mode, SnapStart, tenant isolation and refused registrations on the platform
//! double (tests/e2e/src/platform): the real extension binary, a bash + curl runtime started
//! through the layer's wrapper, DynamoDB Local.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flightlock_e2e::platform::{Mode, Options, Outcome, Platform};
use flightlock_e2e::sandbox::{self, curl_runtime, queue, released};
use flightlock_e2e::{record_file, table};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_the_sandbox_never_freezes_with_a_lock_held() {
    let (endpoint, table) = table("e2e_std_freeze").await;
    let record = record_file("std-freeze");
    let platform = Platform::start(Options::new(Mode::Standard)).await;
    let extra = [("FLIGHTLOCK_KEY", "freeze"), ("FLIGHTLOCK_WAIT", "0")];
    let ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    assert_eq!(
        platform.registrations()[0].1,
        ["INVOKE", "SHUTDOWN"],
        "standard mode registers both"
    );
    let runtime = curl_runtime(&platform, ext.proxy_port, &record, "std");
    let runtime_group = runtime.id().unwrap() as i32;
    platform.freeze_groups(&[runtime_group, ext.group()]);
    for seq in 1..=3 {
        let frozen_before = platform.freezes();
        let id = platform.invoke(json!({"seq": seq, "sleepMs": 200}));
        match platform.outcome(&id, Duration::from_secs(20)).await {
            Some(Outcome::Response(b)) => {
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                assert_eq!(v["ok"], true, "skipped or failed: {v}");
            }
            other => panic!("{other:?}\n{}", ext.log()),
        }
        // Lambda freezes once the runtime and the extension wait in /next again. While frozen
        // (nothing in the sandbox can run), no lock may be held.
        assert!(
            platform
                .wait_frozen(frozen_before + 1, Duration::from_secs(10))
                .await,
            "never frozen after invocation {seq}"
        );
        assert!(platform.is_frozen());
        assert_eq!(
            queue(&endpoint, &table, "freeze").await,
            0,
            "frozen with the lock held"
        );
    }
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_timeout_kills_the_runtime_then_shutdown_releases_the_lock() {
    let (endpoint, table) = table("e2e_std_timeout").await;
    let record = record_file("std-timeout");
    let mut options = Options::new(Mode::Standard);
    options.timeout = Duration::from_secs(4);
    let platform = Platform::start(options).await;
    let extra = [("FLIGHTLOCK_KEY", "slow"), ("FLIGHTLOCK_WAIT", "0")];
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let runtime = curl_runtime(&platform, ext.proxy_port, &record, "std");
    let runtime_group = runtime.id().unwrap() as i32;
    platform.runtime_group(runtime_group);
    platform.freeze_groups(&[runtime_group, ext.group()]);
    let id = platform.invoke(json!({"seq": 1, "mode": "timeout"}));
    // The handler runs (sleeps far past the timeout) with the lock held.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while queue(&endpoint, &table, "slow").await == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the lock was never taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        platform.outcome(&id, Duration::from_secs(10)).await,
        Some(Outcome::TimedOut)
    );
    // Runtime killed, then SHUTDOWN (timeout, 2 s): the extension releases and exits.
    let status = ext
        .exit(Duration::from_secs(10))
        .await
        .expect("exits after SHUTDOWN");
    assert!(status.success(), "{status}\n{}", ext.log());
    assert!(ext.log().contains("reason=timeout"), "{}", ext.log());
    assert_eq!(queue(&endpoint, &table, "slow").await, 0, "{}", ext.log());
    let _ = std::fs::remove_file(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_invoke_registration_is_an_init_error_naming_the_cause() {
    let (endpoint, table) = table("e2e_refused").await;
    // The platform refuses INVOKE (as Managed Instances does) but the environment does not say
    // it is Managed Instances: the extension registers INVOKE and is refused.
    let platform =
        Platform::start(Options::new(Mode::ManagedInstances { max_concurrency: 2 })).await;
    let extra = [("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")];
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let status = ext.exit(Duration::from_secs(10)).await.expect("init fails");
    assert!(!status.success());
    assert!(platform.wait_init_error(Duration::from_secs(1)).await);
    let errors = platform.init_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let body = &errors[0].2;
    for needle in [
        "refused to register flightlock for [INVOKE, SHUTDOWN]",
        "403 Extension.InvalidEventType",
        "AWS_LAMBDA_INITIALIZATION_TYPE is \\\"on-demand\\\"",
    ] {
        assert!(body.contains(needle), "{needle} not in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_instances_a_refused_registration_fails_with_the_platform_answer() {
    let (endpoint, table) = table("e2e_refused_mi").await;
    let mut options = Options::new(Mode::ManagedInstances { max_concurrency: 2 });
    options.refuse_registration = Some((
        403,
        "Extension.RegistrationClosed".into(),
        "Extension registration closed already".into(),
    ));
    let platform = Platform::start(options).await;
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &[], None).await;
    let status = ext.exit(Duration::from_secs(10)).await.expect("init fails");
    assert!(!status.success());
    let log = ext.log();
    assert!(
        log.contains(
            "refused to register flightlock for [SHUTDOWN] (403 Extension.RegistrationClosed"
        ),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapstart_restore_and_tenant_header_pass_through_the_proxy() {
    let (endpoint, table) = table("e2e_snap_tenant").await;
    let mut options = Options::new(Mode::SnapStart);
    options.tenant = Some("tenant-7".into());
    let platform = Platform::start(options).await;
    let ext = sandbox::extension(&platform, &endpoint, &table, &[], None).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let port = ext.proxy_port;
    let get = |path: &str| {
        http::Request::get(format!("http://127.0.0.1:{port}/2018-06-01/runtime/{path}"))
            .body(Full::default())
            .unwrap()
    };
    // The runtime asks for the restore; it returns only once the snapshot is restored.
    let restore = tokio::spawn(client.request(get("restore/next")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !restore.is_finished(),
        "restore/next returned before the restore"
    );
    let id = platform.invoke(json!({}));
    platform.restore();
    let resp = restore.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    // Then the first invocation, with the tenant header.
    let resp = client.request(get("invocation/next")).await.unwrap();
    assert_eq!(resp.headers()["lambda-runtime-aws-request-id"], id.as_str());
    assert_eq!(resp.headers()["lambda-runtime-aws-tenant-id"], "tenant-7");
    let req = http::Request::post(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/response"
    ))
    .body(Full::new(bytes::Bytes::from_static(b"{}")))
    .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 202);
    assert!(released(&endpoint, &table, "double", Duration::from_secs(5)).await);
    // Outside SnapStart the platform does not serve restore/next.
    let standard = Platform::start(Options::new(Mode::Standard)).await;
    let url = format!("http://{}/2018-06-01/runtime/restore/next", standard.addr());
    let req = http::Request::get(url).body(Full::default()).unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 404);
}
