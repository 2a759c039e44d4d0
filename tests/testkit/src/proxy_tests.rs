//! Raw-HTTP tests of [`FaultProxy`] against [`FakeUpstream`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::fake_upstream::FakeUpstream;
use crate::{Fault, FaultProxy, Rule, NO_OPERATION};

type TestClient = Client<HttpConnector, Full<Bytes>>;

struct Reply {
    status: StatusCode,
    headers: hyper::HeaderMap,
    body: Bytes,
    at: Instant,
}

fn http_client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn setup() -> (FakeUpstream, FaultProxy, TestClient) {
    let upstream = FakeUpstream::start().await;
    let proxy = FaultProxy::start(&upstream.url()).await.unwrap();
    (upstream, proxy, http_client())
}

fn dynamo_request(proxy: &FaultProxy, op: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("{}/", proxy.endpoint()))
        .header("content-type", "application/x-amz-json-1.0");
    if let Some(op) = op {
        builder = builder.header("x-amz-target", format!("DynamoDB_20120810.{op}"));
    }
    builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> Result<Reply, String> {
    let response = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let at = Instant::now();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
        at,
    })
}

async fn call(client: &TestClient, proxy: &FaultProxy, op: &str) -> Reply {
    send(client, dynamo_request(proxy, Some(op), "{}"))
        .await
        .unwrap()
}

#[tokio::test]
async fn forwards_requests_and_responses_byte_for_byte() {
    let (upstream, proxy, client) = setup().await;
    let body: Vec<u8> = br#"{"TableName":"t","Item":{"pk":{"S":"caf"#
        .iter()
        .copied()
        .chain([0xc3, 0xa9, 0xff, 0x00, b'"', b'}', b'}', b'}'])
        .collect();
    let auth = "AWS4-HMAC-SHA256 Credential=local/20240101/us-east-1/dynamodb/aws4_request, \
                SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=abc123";
    let req = Request::builder()
        .method(Method::PUT)
        .uri(format!("{}/some/path?x=1&y=%2F", proxy.endpoint()))
        .header("host", "dynamodb.us-east-1.amazonaws.com")
        .header("authorization", auth)
        .header("x-amz-date", "20240101T000000Z")
        .header("x-amz-target", "DynamoDB_20120810.PutItem")
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-multi", "one")
        .header("x-multi", "two")
        .header("x-echo", "1")
        .header("x-respond-status", "418")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let reply = send(&client, req).await.unwrap();

    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.method, Method::PUT);
    assert_eq!(got.path_and_query, "/some/path?x=1&y=%2F");
    assert_eq!(got.header("host"), Some("dynamodb.us-east-1.amazonaws.com"));
    assert_eq!(got.header("authorization"), Some(auth));
    assert_eq!(got.header("x-amz-date"), Some("20240101T000000Z"));
    assert_eq!(
        got.header("x-amz-target"),
        Some("DynamoDB_20120810.PutItem")
    );
    assert_eq!(
        got.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    let multi: Vec<_> = got.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, ["one", "two"]);
    assert_eq!(got.body.as_ref(), body.as_slice());

    // The upstream's status, headers and body come back unchanged.
    assert_eq!(reply.status, StatusCode::IM_A_TEAPOT);
    assert_eq!(reply.headers["x-upstream-seq"], "1");
    assert_eq!(reply.headers["x-amzn-requestid"], "upstream-1");
    assert_eq!(reply.headers["content-type"], "application/x-amz-json-1.0");
    assert_eq!(reply.body.as_ref(), body.as_slice());
    assert_eq!(proxy.faults_applied(), 0);
}

#[tokio::test]
async fn counts_requests_per_operation() {
    let (upstream, proxy, client) = setup().await;
    for op in ["TransactWriteItems", "GetItem", "TransactWriteItems"] {
        call(&client, &proxy, op).await;
    }
    proxy.add_rule(Rule::new(Fault::Throttle).on("TransactWriteItems"));
    let reply = call(&client, &proxy, "TransactWriteItems").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    send(&client, dynamo_request(&proxy, None, "{}"))
        .await
        .unwrap();

    let counts = proxy.counts();
    let expected: Vec<(&str, u64)> =
        vec![(NO_OPERATION, 1), ("GetItem", 1), ("TransactWriteItems", 3)];
    let actual: Vec<(&str, u64)> = counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(actual, expected);
    assert_eq!(proxy.count("TransactWriteItems"), 3);
    assert_eq!(proxy.count("Query"), 0);
    assert_eq!(proxy.total(), 5);
    assert_eq!(proxy.faults_applied(), 1);
    assert_eq!(upstream.count(), 4);

    proxy.reset_counts();
    assert!(proxy.counts().is_empty());
    assert_eq!(proxy.total(), 0);
    assert_eq!(proxy.faults_applied(), 0);
    call(&client, &proxy, "GetItem").await;
    assert_eq!(proxy.total(), 1);
}

#[tokio::test]
async fn skip_and_times() {
    let (upstream, proxy, client) = setup().await;
    proxy.add_rule(
        Rule::new(Fault::ServerError)
            .on("PutItem")
            .body_contains("lock#1")
            .skip(1)
            .times(2),
    );
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let req = dynamo_request(&proxy, Some("PutItem"), r#"{"pk":"lock#1"}"#);
        statuses.push(send(&client, req).await.unwrap().status.as_u16());
        // Neither another operation nor another body matches the rule.
        assert_eq!(
            call(&client, &proxy, "GetItem").await.status,
            StatusCode::OK
        );
        let other = dynamo_request(&proxy, Some("PutItem"), r#"{"pk":"lock#2"}"#);
        assert_eq!(send(&client, other).await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(statuses, [200, 500, 500, 200, 200]);
    assert_eq!(proxy.faults_applied(), 2);
    assert_eq!(upstream.count(), 13);

    proxy.add_rule(Rule::new(Fault::Throttle));
    assert_eq!(call(&client, &proxy, "GetItem").await.status.as_u16(), 400);
    proxy.clear_rules();
    assert_eq!(call(&client, &proxy, "GetItem").await.status.as_u16(), 200);
}

#[tokio::test]
async fn delay_response_writes_before_answering() {
    let (upstream, proxy, client) = setup().await;
    let delay = Duration::from_millis(400);
    proxy.add_rule(Rule::new(Fault::DelayResponse(delay)).times(1));
    let req = dynamo_request(&proxy, Some("PutItem"), "{}");
    let start = Instant::now();
    let pending = tokio::spawn({
        let client = client.clone();
        async move { send(&client, req).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(upstream.count(), 1, "forwarded before the delay");
    assert!(!pending.is_finished(), "answer held back");
    let reply = pending.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.at.duration_since(upstream.seen()[0].at) >= delay);
    assert!(reply.at.duration_since(start) >= delay);
    assert_eq!(proxy.faults_applied(), 1);
    // times(1): the next one is immediate.
    let start = Instant::now();
    call(&client, &proxy, "PutItem").await;
    assert!(start.elapsed() < delay);
}

#[tokio::test]
async fn delay_request_holds_before_forwarding() {
    let (upstream, proxy, client) = setup().await;
    let delay = Duration::from_millis(400);
    proxy.add_rule(Rule::new(Fault::DelayRequest(delay)).on("PutItem"));
    let req = dynamo_request(&proxy, Some("PutItem"), "{}");
    let start = Instant::now();
    let pending = tokio::spawn({
        let client = client.clone();
        async move { send(&client, req).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(upstream.count(), 0, "not forwarded yet");
    let reply = pending.await.unwrap().unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(upstream.seen()[0].at.duration_since(start) >= delay);
}

#[tokio::test]
async fn drop_response_forwards_then_closes_the_connection() {
    let (upstream, proxy, client) = setup().await;
    proxy.add_rule(
        Rule::new(Fault::DropResponse)
            .on("TransactWriteItems")
            .times(1),
    );
    let err = send(
        &client,
        dynamo_request(&proxy, Some("TransactWriteItems"), "{}"),
    )
    .await
    .err()
    .expect("client must see an error");
    assert!(err.contains("IncompleteMessage"), "{err}");
    assert_eq!(upstream.count(), 1, "the write happened upstream");
    assert_eq!(proxy.faults_applied(), 1);
    // The next request goes through on a new connection.
    assert_eq!(
        call(&client, &proxy, "TransactWriteItems").await.status,
        StatusCode::OK
    );
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn duplicate_forwards_twice_and_returns_the_first_answer() {
    let (upstream, proxy, client) = setup().await;
    proxy.add_rule(Rule::new(Fault::Duplicate).times(1));
    let req = dynamo_request(&proxy, Some("UpdateItem"), r#"{"k":1}"#);
    let reply = send(&client, req).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["x-upstream-seq"], "1");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, seen[1].body);
    assert_eq!(seen[0].headers, seen[1].headers);
    assert!(seen[1].at >= seen[0].at);
    assert_eq!(proxy.count("UpdateItem"), 1, "counted as received");
}

#[tokio::test]
async fn throttle_and_server_error_look_like_dynamodb() {
    let (upstream, proxy, client) = setup().await;
    proxy.add_rule(Rule::new(Fault::Throttle).on("PutItem"));
    proxy.add_rule(Rule::new(Fault::ServerError).on("GetItem"));
    for (op, status, error_type) in [
        (
            "PutItem",
            400,
            "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        ),
        (
            "GetItem",
            500,
            "com.amazonaws.dynamodb.v20120810#InternalServerError",
        ),
    ] {
        let reply = call(&client, &proxy, op).await;
        assert_eq!(reply.status.as_u16(), status);
        assert_eq!(reply.headers["content-type"], "application/x-amz-json-1.0");
        assert_eq!(reply.headers["x-amzn-requestid"].len(), 52);
        let json: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object.len(), 2, "{json}");
        assert_eq!(object["__type"], error_type);
        assert!(!object["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(upstream.count(), 0);
    assert_eq!(proxy.faults_applied(), 2);
}

#[tokio::test]
async fn unreachable_upstream_is_a_bad_gateway() {
    // Bind and drop to get a port nobody listens on.
    let port = {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = FaultProxy::start(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let reply = call(&http_client(), &proxy, "GetItem").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(proxy.total(), 1);
}

#[tokio::test]
async fn start_rejects_bad_upstreams() {
    for bad in ["https://127.0.0.1:8000", "127.0.0.1:8000", "http://", ""] {
        let err = FaultProxy::start(bad).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
    }
}

#[tokio::test]
async fn dropping_the_proxy_stops_it() {
    let (_upstream, proxy, client) = setup().await;
    call(&client, &proxy, "GetItem").await;
    let addr = proxy.local_addr();
    assert!(proxy.endpoint().starts_with("http://127.0.0.1:"));
    drop(proxy);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "proxy still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
