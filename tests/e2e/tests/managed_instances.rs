//! Several invocations in flight in one environment (Lambda Managed Instances): the real
//! extension binary against a scripted fake Lambda API (RIE runs one invocation at a time) and
//! DynamoDB Local. The test plays a runtime with three concurrent `GET next` calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flightlock_e2e::fake_lambda::FakeLambda;
use flightlock_e2e::{free_port, table, workspace_bin};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>;

async fn next(client: HttpClient, port: u16) -> (String, serde_json::Value) {
    let req = http::Request::get(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/next"
    ))
    .body(Full::default())
    .unwrap();
    let resp = client.request(req).await.unwrap();
    let id = resp.headers()["lambda-runtime-aws-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (id, serde_json::from_slice(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_invocations_in_flight_are_gated_independently() {
    let (endpoint, table) = table("e2e_mi").await;
    let fake = FakeLambda::start().await;
    let proxy_port = free_port();
    let log_path =
        std::env::temp_dir().join(format!("flightlock-e2e-mi-{}.log", std::process::id()));
    let mut ext = tokio::process::Command::new(workspace_bin("flightlock-extension"))
        .env_clear()
        // With a scheme, as some emulators pass it (RIE, in the other tests, passes none).
        .env("AWS_LAMBDA_RUNTIME_API", format!("http://{}", fake.addr))
        .env("AWS_LAMBDA_FUNCTION_NAME", "fake")
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", &table)
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .env("FLIGHTLOCK_KEY", "job-{/k}")
        .env("FLIGHTLOCK_WAIT", "0")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Three invocations at once: two for key job-a, one for job-b.
    fake.invoke("r1", json!({"k": "a"})).await;
    fake.invoke("r2", json!({"k": "b"})).await;
    fake.invoke("r3", json!({"k": "a"})).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut polls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(next(client.clone(), proxy_port)))
        .collect();

    // The second job-a invocation is skipped upstream by the proxy...
    let mut skipped = None;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while skipped.is_none() && tokio::time::Instant::now() < until {
        skipped = fake.received().await.into_iter().find_map(|r| {
            ["r1", "r3"]
                .into_iter()
                .find(|id| r.path == format!("/2018-06-01/runtime/invocation/{id}/response"))
                .map(|id| (id, r))
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (skipped_id, skip) = skipped.expect("one job-a invocation must be skipped");
    let body: serde_json::Value = serde_json::from_slice(&skip.body).unwrap();
    assert_eq!(body["flightlock"]["skipped"], true, "{body}");
    assert_eq!(body["flightlock"]["key"], "job-a");
    let holder = if skipped_id == "r1" { "r3" } else { "r1" };
    assert_eq!(body["flightlock"]["heldBy"]["requestId"], holder, "{body}");

    // ...while the other job-a and the job-b invocation are both handed to the runtime, at the
    // same time (neither has answered yet).
    let mut delivered = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while delivered.len() < 2 {
        assert!(tokio::time::Instant::now() < until, "events not delivered");
        let mut rest = Vec::new();
        for p in polls.drain(..) {
            if p.is_finished() {
                delivered.push(p.await.unwrap());
            } else {
                rest.push(p);
            }
        }
        polls = rest;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ids: Vec<&str> = delivered.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort();
    let mut expected = vec![holder, "r2"];
    expected.sort();
    assert_eq!(ids, expected);
    // The third poll is the runtime waiting for a next event: the proxy keeps it pending.
    assert_eq!(polls.len(), 1);
    assert!(!polls[0].is_finished());

    // Both answer; each lock is released after its own response went upstream.
    for (id, _) in &delivered {
        let req = http::Request::post(format!(
            "http://127.0.0.1:{proxy_port}/2018-06-01/runtime/invocation/{id}/response"
        ))
        .body(Full::new(bytes::Bytes::from(format!(
            "{{\"done\":\"{id}\"}}"
        ))))
        .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 202);
        let got = fake
            .wait_for(
                &format!("/2018-06-01/runtime/invocation/{id}/response"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(got.body, format!("{{\"done\":\"{id}\"}}"));
    }
    let locker = flightlock::Locker::new(flightlock_testkit::client(&endpoint).await, &table);
    for key in ["job-a", "job-b"] {
        let q = locker
            .queue(key, flightlock::ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap();
        assert!(q.is_empty(), "{key} still held: {q:?}");
    }

    // SHUTDOWN: the extension exits.
    fake.extension_event(json!({
        "eventType": "SHUTDOWN", "shutdownReason": "spindown",
        "deadlineMs": (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 2000) as u64
    }))
    .await;
    let status = tokio::time::timeout(Duration::from_secs(5), ext.wait())
        .await
        .expect("the extension did not exit after SHUTDOWN")
        .unwrap();
    assert!(status.success(), "{status}");
    polls[0].abort();

    // Logs are JSON (AWS_LAMBDA_LOG_FORMAT=JSON), one span per invocation with its fields.
    let log = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    let acquired: Vec<serde_json::Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
        })
        .filter(|v| v["fields"]["message"] == "lock acquired")
        .collect();
    assert_eq!(acquired.len(), 2, "{log}");
    for v in acquired {
        let span = &v["span"];
        assert_eq!(span["name"], "invocation", "{v}");
        assert!(
            span["request_id"].is_string() && span["key"].is_string(),
            "{v}"
        );
        assert!(span["ticket"].is_u64() && span["waited_ms"].is_u64(), "{v}");
    }
}

/// A TCP forwarder standing in for another Runtime API proxy; counts the connections it carried.
async fn forwarder(
    to: std::net::SocketAddr,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (port, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_with_another_proxy_through_flightlock_upstream() {
    let (endpoint, table) = table("e2e_chain").await;
    let fake = FakeLambda::start().await;
    let (hop_port, carried) = forwarder(fake.addr).await;
    let proxy_port = free_port();
    let mut ext = tokio::process::Command::new(workspace_bin("flightlock-extension"))
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", fake.addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "chained")
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", &table)
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .env("FLIGHTLOCK_UPSTREAM", format!("127.0.0.1:{hop_port}"))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fake.invoke("c1", json!({})).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (id, _) = tokio::time::timeout(Duration::from_secs(10), next(client.clone(), proxy_port))
        .await
        .unwrap();
    assert_eq!(id, "c1");
    let req = http::Request::post(format!(
        "http://127.0.0.1:{proxy_port}/2018-06-01/runtime/invocation/c1/response"
    ))
    .body(Full::new(bytes::Bytes::from_static(b"{\"chained\":true}")))
    .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 202);
    let got = fake
        .wait_for(
            "/2018-06-01/runtime/invocation/c1/response",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(got.body, "{\"chained\":true}");
    // The runtime traffic went through the other proxy (the Extensions API calls did not).
    assert!(carried.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    let _ = ext.start_kill();
    let _ = ext.wait().await;
}

/// Starts the real extension against `fake`, gating `job-{/k}` with wait 0; returns once its
/// proxy listens.
async fn spawn_extension(
    fake: &FakeLambda,
    endpoint: &str,
    table: &str,
    proxy_port: u16,
) -> tokio::process::Child {
    let ext = tokio::process::Command::new(workspace_bin("flightlock-extension"))
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", fake.addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "fake")
        .env("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLIGHTLOCK_TABLE", table)
        .env("FLIGHTLOCK_PROXY_PORT", proxy_port.to_string())
        .env("FLIGHTLOCK_KEY", "job-{/k}")
        .env("FLIGHTLOCK_WAIT", "0")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ext
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_invocations_in_flight_is_handled_at_once() {
    let (endpoint, table) = table("e2e_mi_shutdown").await;
    let fake = FakeLambda::start().await;
    let proxy_port = free_port();
    let mut ext = spawn_extension(&fake, &endpoint, &table, proxy_port).await;
    // Two invocations in flight (60 s deadlines), handed to the runtime and never answered.
    fake.invoke("s1", json!({"k": "a"})).await;
    fake.invoke("s2", json!({"k": "b"})).await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..2 {
        let got = tokio::time::timeout(Duration::from_secs(10), next(client.clone(), proxy_port))
            .await
            .expect("an event is handed over");
        assert!(["s1", "s2"].contains(&got.0.as_str()), "{got:?}");
    }
    let locker = flightlock::Locker::new(flightlock_testkit::client(&endpoint).await, &table);
    let skew = flightlock::ClockSkew::Bounded(Duration::from_secs(1));
    for key in ["job-a", "job-b"] {
        assert_eq!(locker.queue(key, skew).await.unwrap().len(), 1, "{key}");
    }
    // A later invocation's INVOKE and the SHUTDOWN do not queue behind the unfinished ones:
    // both locks are released and the extension exits, long before any deadline.
    fake.invoke("s3", json!({"k": "c"})).await;
    fake.extension_event(json!({
        "eventType": "SHUTDOWN", "shutdownReason": "spindown",
        "deadlineMs": (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 2000) as u64
    }))
    .await;
    let status = tokio::time::timeout(Duration::from_secs(10), ext.wait())
        .await
        .expect("SHUTDOWN was not handled while invocations were in flight")
        .unwrap();
    assert!(status.success(), "{status}");
    for key in ["job-a", "job-b"] {
        let q = locker.queue(key, skew).await.unwrap();
        assert!(q.is_empty(), "{key} still held after SHUTDOWN: {q:?}");
    }
}
