//! Shared by the extension's tests: the proxy (one execution environment's extension, in this
//! process) in front of the Lambda platform double (`flightlock_testkit::platform`, which keeps
//! to AWS's documented Runtime API rules), and the runtime's calls through the proxy.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flightlock::Locker;
use flightlock_extension::invocations::Invocations;
use flightlock_extension::proxy::{Limits, Proxy};
use flightlock_lambda::config::Config;
use flightlock_lambda::gate::Gate;
use flightlock_testkit::platform::{Mode, Options, Platform};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::net::TcpListener;

pub const NEXT: &str = "/2018-06-01/runtime/invocation/next";
pub const RESTORE_NEXT: &str = "/2018-06-01/runtime/restore/next";

/// The session token the proxies of these tests accept on the lock API (Lambda's
/// `AWS_SESSION_TOKEN`).
pub const SESSION_TOKEN: &str = "test-session-token";

/// How long a test waits for something the double should see.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A platform double of one standard (on-demand) execution environment.
pub async fn standard() -> Platform {
    Platform::start(Options::new(Mode::Standard)).await
}

/// A platform double of one environment of tenant `tenant` (tenant isolation mode).
pub async fn of_tenant(tenant: &str) -> Platform {
    let mut options = Options::new(Mode::Standard);
    options.tenant = Some(tenant.to_owned());
    Platform::start(options).await
}

/// A fresh lock table on DynamoDB Local; returns its name and a client for it.
pub async fn table(prefix: &str) -> (String, aws_sdk_dynamodb::Client) {
    let fresh = flightlock_testkit::fresh_table(prefix).await;
    (fresh.table, fresh.client)
}

/// Starts a proxy (one execution environment's extension) in front of `platform`, configured
/// from `vars` (plus the table, the function name and the Runtime API), locking in `table`
/// through `client`. Returns its port and the proxy.
pub async fn start_proxy(
    platform: &Platform,
    table: &str,
    client: aws_sdk_dynamodb::Client,
    vars: &[(&str, &str)],
    host: &str,
) -> (u16, Arc<Proxy>) {
    start_proxy_with(platform, table, client, vars, host, Limits::default()).await
}

/// [`start_proxy`] with `limits`.
pub async fn start_proxy_with(
    platform: &Platform,
    table: &str,
    client: aws_sdk_dynamodb::Client,
    vars: &[(&str, &str)],
    host: &str,
    limits: Limits,
) -> (u16, Arc<Proxy>) {
    start_proxy_full(platform, table, client, vars, host, limits, None).await
}

/// [`start_proxy_with`], exporting spans through `traces` if given.
pub async fn start_proxy_full(
    platform: &Platform,
    table: &str,
    client: aws_sdk_dynamodb::Client,
    vars: &[(&str, &str)],
    host: &str,
    limits: Limits,
    traces: Option<Arc<flightlock_extension::otel::Traces>>,
) -> (u16, Arc<Proxy>) {
    let upstream = platform.addr().to_string();
    let mut env: std::collections::HashMap<String, String> = [
        ("FLIGHTLOCK_TABLE", table),
        ("AWS_LAMBDA_FUNCTION_NAME", "f"),
        // No EMF lines on the test output.
        ("FLIGHTLOCK_METRICS", "off"),
        ("AWS_LAMBDA_RUNTIME_API", upstream.as_str()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in vars {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let config = Arc::new(Config::from_map(&env).unwrap());
    let settings = flightlock_extension::config::Settings::from_map(&env).unwrap();
    let gate = Gate::new(
        config.clone(),
        Locker::new(client, &config.table),
        host.to_owned(),
    );
    let mut proxy = Proxy::new(gate, Arc::new(Invocations::default()), upstream)
        .with_limits(limits)
        .with_api_token(settings.api_token);
    if let Some(t) = traces {
        proxy = proxy.with_traces(t);
    }
    let proxy = Arc::new(proxy);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(proxy.clone().serve(listener));
    (port, proxy)
}

/// What the runtime got from `GET next` through the proxy.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub request_id: Option<String>,
    pub tenant: Option<String>,
    pub body: Bytes,
}

/// The runtime's `GET path` through the proxy on `port` (a new connection), bounded.
pub async fn get(port: u16, path: &str) -> Got {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let uri: http::Uri = format!("http://127.0.0.1:{port}{path}").parse().unwrap();
    let resp = tokio::time::timeout(LIMIT, client.get(uri))
        .await
        .expect("the proxy answered")
        .unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, request_id, tenant) = (
        resp.status(),
        header("lambda-runtime-aws-request-id"),
        header("lambda-runtime-aws-tenant-id"),
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        request_id,
        tenant,
        body,
    }
}

/// The runtime posts a (small) response for `id` through the proxy; returns the status.
pub async fn respond(port: u16, id: &str, body: &str) -> StatusCode {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = Request::post(format!(
        "http://127.0.0.1:{port}/2018-06-01/runtime/invocation/{id}/response"
    ))
    .body(Full::new(Bytes::from(body.to_owned())))
    .unwrap();
    let resp = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("the proxy answered")
        .unwrap();
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

/// A call of the lock API on `port` for invocation `id` (`op`: acquire, release, locks), with
/// the session token `token` if given; returns the status and the JSON body.
pub async fn lock_api(
    port: u16,
    token: Option<&str>,
    id: &str,
    op: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let uri = format!("http://127.0.0.1:{port}/flightlock/v1/invocations/{id}/{op}");
    let mut req = match &body {
        Some(_) => Request::post(uri),
        None => Request::get(uri),
    };
    if let Some(t) = token {
        req = req.header("x-flightlock-token", t);
    }
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let resp = tokio::time::timeout(LIMIT, client.request(req.body(Full::new(body)).unwrap()))
        .await
        .expect("the proxy answered")
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}
