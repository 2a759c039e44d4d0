//! Lambda Managed Instances on the platform double (tests/testkit/src/platform): the real extension
//! binary, DynamoDB Local, and a scripted runtime (this test) with several `GET next` in flight.
//! The double refuses what Managed Instances refuses (INVOKE registration, the Logs API, other
//! telemetry schemas) and sends no INVOKE events. Runtime *processes* (wrapped bash + curl
//! runtimes, crash release, unenforced detection) are in `managed_instances_processes.rs`.

use std::time::Duration;

use flightlock_e2e::platform::{Mode, Options, Outcome, Platform};
use flightlock_e2e::sandbox::{self, queue};
use flightlock_e2e::table;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>;

fn managed_instances() -> Options {
    Options::new(Mode::ManagedInstances { max_concurrency: 4 })
}

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
async fn init_registers_for_shutdown_only_and_subscribes_to_telemetry() {
    let (endpoint, table) = table("e2e_mi_init").await;
    let platform = Platform::start(managed_instances()).await;
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &[], None).await;
    assert!(
        ext.wait_log("subscribed to the Telemetry API", Duration::from_secs(10))
            .await,
        "init did not complete.\nrefusals: {:?}\ninit errors: {:?}\nlog:\n{}",
        platform.refusals(),
        platform.init_errors(),
        ext.log()
    );
    let registrations = platform.registrations();
    assert_eq!(registrations.len(), 1, "{registrations:?}");
    assert_eq!(registrations[0].1, ["SHUTDOWN"]);
    assert!(platform.refusals().is_empty(), "{:?}", platform.refusals());
    assert!(
        platform.init_errors().is_empty(),
        "{:?}",
        platform.init_errors()
    );
    assert_eq!(platform.telemetry_subscribers().len(), 1);
    platform.shutdown("spindown");
    let status = ext
        .exit(Duration::from_secs(10))
        .await
        .expect("exits after SHUTDOWN");
    assert!(status.success(), "{status}\n{}", ext.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_invocations_in_flight_are_gated_independently() {
    let (endpoint, table) = table("e2e_mi").await;
    let platform = Platform::start(managed_instances()).await;
    let extra = [
        ("FLIGHTLOCK_KEY", "job-{/k}"),
        ("FLIGHTLOCK_WAIT", "0"),
        ("AWS_LAMBDA_LOG_FORMAT", "JSON"),
    ];
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    let port = ext.proxy_port;

    // Three invocations at once: two for key job-a, one for job-b.
    let r1 = platform.invoke(json!({"k": "a"}));
    let r2 = platform.invoke(json!({"k": "b"}));
    let r3 = platform.invoke(json!({"k": "a"}));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut polls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(next(client.clone(), port)))
        .collect();

    // The second job-a invocation is skipped upstream by the proxy...
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let (skipped, holder, skip) = loop {
        assert!(
            tokio::time::Instant::now() < until,
            "no job-a invocation was skipped"
        );
        let now = Duration::ZERO;
        if let Some(Outcome::Response(b)) = platform.outcome(&r1, now).await {
            break (&r1, &r3, b);
        }
        if let Some(Outcome::Response(b)) = platform.outcome(&r3, now).await {
            break (&r3, &r1, b);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let body: serde_json::Value = serde_json::from_slice(&skip).unwrap();
    assert_eq!(body["flightlock"]["skipped"], true, "{skipped}: {body}");
    assert_eq!(body["flightlock"]["key"], "job-a");
    assert_eq!(
        body["flightlock"]["heldBy"]["requestId"],
        holder.as_str(),
        "{body}"
    );

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
    let mut expected = vec![holder.as_str(), r2.as_str()];
    expected.sort();
    assert_eq!(ids, expected);
    // Concurrent invocations, within AWS_LAMBDA_MAX_CONCURRENCY (the skipped one counts while
    // the proxy decides).
    assert!((2..=4).contains(&platform.max_in_flight()));
    // The third poll is the runtime waiting for a next event: the proxy keeps it pending.
    assert_eq!(polls.len(), 1);
    assert!(!polls[0].is_finished());

    // Both answer; each lock is released after its own response went upstream.
    for (id, _) in &delivered {
        let req = http::Request::post(format!(
            "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/response"
        ))
        .body(Full::new(bytes::Bytes::from(format!(
            "{{\"done\":\"{id}\"}}"
        ))))
        .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 202);
        let got = platform.outcome(id, Duration::from_secs(5)).await;
        assert_eq!(
            got,
            Some(Outcome::Response(format!("{{\"done\":\"{id}\"}}").into()))
        );
    }
    for key in ["job-a", "job-b"] {
        assert_eq!(queue(&endpoint, &table, key).await, 0, "{key} still held");
    }

    platform.shutdown("spindown");
    let status = ext
        .exit(Duration::from_secs(5))
        .await
        .expect("exits after SHUTDOWN");
    assert!(status.success(), "{status}");
    polls[0].abort();

    // Logs are JSON (AWS_LAMBDA_LOG_FORMAT=JSON), one span per invocation with its fields.
    let log = ext.log();
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
    let platform = Platform::start(managed_instances()).await;
    let (hop_port, carried) = forwarder(platform.addr()).await;
    let hop = format!("127.0.0.1:{hop_port}");
    let ext = sandbox::extension(
        &platform,
        &endpoint,
        &table,
        &[("FLIGHTLOCK_UPSTREAM", hop.as_str())],
        None,
    )
    .await;
    let id = platform.invoke(json!({}));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (got, _) = tokio::time::timeout(
        Duration::from_secs(10),
        next(client.clone(), ext.proxy_port),
    )
    .await
    .unwrap();
    assert_eq!(got, id);
    let req = http::Request::post(format!(
        "http://127.0.0.1:{}/2018-06-01/runtime/invocation/{id}/response",
        ext.proxy_port
    ))
    .body(Full::new(bytes::Bytes::from_static(b"{\"chained\":true}")))
    .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 202);
    assert_eq!(
        platform.outcome(&id, Duration::from_secs(5)).await,
        Some(Outcome::Response("{\"chained\":true}".into()))
    );
    // The runtime traffic went through the other proxy (the Extensions API calls did not).
    assert!(carried.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_invocations_in_flight_releases_them_at_once() {
    let (endpoint, table) = table("e2e_mi_shutdown").await;
    let platform = Platform::start(managed_instances()).await;
    let extra = [("FLIGHTLOCK_KEY", "job-{/k}"), ("FLIGHTLOCK_WAIT", "0")];
    let mut ext = sandbox::extension(&platform, &endpoint, &table, &extra, None).await;
    // Two invocations in flight (60 s deadlines), handed to the runtime and never answered.
    let ids = [
        platform.invoke(json!({"k": "a"})),
        platform.invoke(json!({"k": "b"})),
    ];
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..2 {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            next(client.clone(), ext.proxy_port),
        )
        .await
        .expect("an event is handed over");
        assert!(ids.contains(&got.0), "{got:?}");
    }
    for key in ["job-a", "job-b"] {
        assert_eq!(queue(&endpoint, &table, key).await, 1, "{key}");
    }
    // SHUTDOWN does not wait for the unfinished invocations: both locks are released and the
    // extension exits, long before any deadline.
    platform.shutdown("spindown");
    let status = ext
        .exit(Duration::from_secs(10))
        .await
        .expect("SHUTDOWN was not handled while invocations were in flight");
    assert!(status.success(), "{status}");
    for key in ["job-a", "job-b"] {
        assert_eq!(
            queue(&endpoint, &table, key).await,
            0,
            "{key} still held after SHUTDOWN"
        );
    }
}
