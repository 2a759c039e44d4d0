//! The standard mode, SnapStart, tenant isolation and refused registrations on the platform
//! double (tests/testkit/src/platform): the real extension binary, a bash + curl runtime started
//! through the layer's wrapper, DynamoDB Local.

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
    // Restored from a snapshot, the function has no AWS_SESSION_TOKEN: the lock API's secret is
    // AWS_CONTAINER_AUTHORIZATION_TOKEN, which its handler sends (the clients do).
    let lock = |token: Option<&str>| {
        let mut req = http::Request::post(format!(
            "http://127.0.0.1:{port}/flightlock/v1/invocations/{id}/acquire"
        ));
        if let Some(t) = token {
            req = req.header("x-flightlock-token", t);
        }
        req.body(Full::new(bytes::Bytes::from_static(
            br#"{"key":"rec","waitMs":0}"#,
        )))
        .unwrap()
    };
    let container_token = sandbox::credentials(&platform)
        .into_iter()
        .find(|(k, _)| *k == "AWS_CONTAINER_AUTHORIZATION_TOKEN")
        .map(|(_, v)| v)
        .expect("SnapStart gives the container token");
    assert!(
        !sandbox::credentials(&platform)
            .iter()
            .any(|(k, _)| *k == "AWS_SESSION_TOKEN"),
        "a restored function has no session token"
    );
    assert_eq!(client.request(lock(None)).await.unwrap().status(), 401);
    let resp = client.request(lock(Some(&container_token))).await.unwrap();
    assert_eq!(resp.status(), 200, "{}", ext.log());
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

/// The double itself refuses what Managed Instances refuses (the extension's tests above rely
/// on it): INVOKE registration, the Logs API, other telemetry schemas, more invocations in
/// flight than `AWS_LAMBDA_MAX_CONCURRENCY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managed_instances_double_refuses_what_the_platform_refuses() {
    let platform =
        Platform::start(Options::new(Mode::ManagedInstances { max_concurrency: 2 })).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let base = format!("http://{}", platform.addr());
    let call = |method: &str, path: &str, headers: &[(&str, &str)], body: &str| {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(bytes::Bytes::from(body.to_owned())))
            .unwrap();
        let client = client.clone();
        async move {
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let id = resp
                .headers()
                .get("lambda-extension-identifier")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status, id, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let register = "/2020-01-01/extension/register";
    let named = [("Lambda-Extension-Name", "probe")];
    let (status, _, body) = call(
        "POST",
        register,
        &named,
        r#"{"events":["INVOKE","SHUTDOWN"]}"#,
    )
    .await;
    assert_eq!(status, 403);
    assert!(body.contains("Extension.InvalidEventType"), "{body}");
    let (status, id, _) = call("POST", register, &named, r#"{"events":["SHUTDOWN"]}"#).await;
    assert_eq!(status, 200);
    let id = id.unwrap();
    let ext = [("Lambda-Extension-Identifier", id.as_str())];
    let (status, _, body) = call("PUT", "/2020-08-15/logs", &ext, "{}").await;
    assert!(
        status == 202 && body.contains("Logs.NotSupported"),
        "{status} {body}"
    );
    let old_schema = r#"{"schemaVersion":"2022-07-01","types":["platform"],"destination":{"protocol":"HTTP","URI":"http://127.0.0.1:1/"}}"#;
    let (status, _, _) = call("PUT", "/2022-07-01/telemetry", &ext, old_schema).await;
    assert_eq!(status, 400);
    // Three invocations, at most two in flight: the third /next waits for an answer.
    let ids: Vec<String> = (0..3).map(|i| platform.invoke(json!({"i": i}))).collect();
    let next = "/2018-06-01/runtime/invocation/next";
    let polls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(call("GET", next, &[], "")))
        .collect();
    assert!(
        platform
            .wait_runtimes_waiting(1, Duration::from_secs(5))
            .await
    );
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while polls.iter().filter(|p| p.is_finished()).count() < 2 {
        assert!(
            tokio::time::Instant::now() < until,
            "two events were not handed out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(polls.iter().filter(|p| p.is_finished()).count(), 2);
    assert_eq!(platform.max_in_flight(), 2);
    let path = format!("/2018-06-01/runtime/invocation/{}/response", ids[0]);
    assert_eq!(call("POST", &path, &[], "{}").await.0, 202);
    // Answered twice: refused.
    assert_eq!(call("POST", &path, &[], "{}").await.0, 400);
    for p in polls {
        let (status, _, _) = tokio::time::timeout(Duration::from_secs(5), p)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, 200);
    }
    assert!(!platform.is_frozen());
}
