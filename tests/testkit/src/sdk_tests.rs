//! How `aws-sdk-dynamodb` reacts to the proxy's faults: against the fake
//! upstream (always), and against DynamoDB Local when
//! `AWS_ENDPOINT_URL_DYNAMODB` is set.

use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::RequestId;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use crate::fake_upstream::FakeUpstream;
use crate::{client, client_with, Fault, FaultProxy, Rule};

async fn setup() -> (FakeUpstream, FaultProxy) {
    let upstream = FakeUpstream::start().await;
    let proxy = FaultProxy::start(&upstream.url()).await.unwrap();
    (upstream, proxy)
}

fn transact_put() -> TransactWriteItem {
    let put = Put::builder()
        .table_name("locks")
        .item("pk", AttributeValue::S("lock#1".into()))
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

#[tokio::test]
async fn sdk_retries_throttle_and_server_error() {
    let (upstream, proxy) = setup().await;
    let client = client(&proxy.endpoint()).await;
    proxy.add_rule(Rule::new(Fault::Throttle).on("ListTables").times(1));
    proxy.add_rule(Rule::new(Fault::ServerError).on("ListTables").times(1));
    client.list_tables().send().await.unwrap();
    assert_eq!(proxy.count("ListTables"), 3);
    assert_eq!(proxy.faults_applied(), 2);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn sdk_surfaces_throttle_without_retries() {
    let (_upstream, proxy) = setup().await;
    let client = client_with(&proxy.endpoint(), |b| {
        b.retry_config(RetryConfig::standard().with_max_attempts(1))
    })
    .await;
    let get = || {
        client
            .get_item()
            .table_name("locks")
            .key("pk", AttributeValue::S("lock#1".into()))
            .send()
    };
    proxy.add_rule(Rule::new(Fault::Throttle).times(1));
    let err = get().await.unwrap_err();
    let service = err.as_service_error().expect("a modeled service error");
    assert!(
        service.is_provisioned_throughput_exceeded_exception(),
        "{service:?}"
    );
    assert!(service.meta().message().is_some_and(|m| !m.is_empty()));
    assert!(service.meta().extra("aws_request_id").is_some() || service.request_id().is_some());
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 400);
    proxy.add_rule(Rule::new(Fault::ServerError).times(1));
    let err = get().await.unwrap_err();
    let service = err.as_service_error().expect("a modeled service error");
    assert!(service.is_internal_server_error(), "{service:?}");
    assert_eq!(proxy.faults_applied(), 2);
}

/// The SDK treats a dropped connection as a transient error and retries
/// *every* operation, including TransactWriteItems. The retry carries the same
/// auto-generated ClientRequestToken, so real DynamoDB deduplicates it.
#[tokio::test]
async fn sdk_retries_transact_write_items_after_dropped_response() {
    let (upstream, proxy) = setup().await;
    let client = client(&proxy.endpoint()).await;
    proxy.add_rule(
        Rule::new(Fault::DropResponse)
            .on("TransactWriteItems")
            .times(1),
    );
    client
        .transact_write_items()
        .transact_items(transact_put())
        .send()
        .await
        .unwrap();
    assert_eq!(proxy.count("TransactWriteItems"), 2);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "the write reached upstream twice");
    let token = |i: usize| -> serde_json::Value {
        let body: serde_json::Value = serde_json::from_slice(&seen[i].body).unwrap();
        body["ClientRequestToken"].clone()
    };
    assert!(token(0).is_string(), "SDK fills in an idempotency token");
    assert_eq!(token(0), token(1), "same token on the retry");
}

/// Same for a plain PutItem (no idempotency token): it is written twice.
#[tokio::test]
async fn sdk_retries_put_item_after_dropped_response_and_duplicate_arrives() {
    let (upstream, proxy) = setup().await;
    let client = client(&proxy.endpoint()).await;
    proxy.add_rule(Rule::new(Fault::DropResponse).on("PutItem").times(1));
    client
        .put_item()
        .table_name("locks")
        .item("pk", AttributeValue::S("lock#1".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(upstream.count(), 2);
    assert_eq!(upstream.seen()[0].body, upstream.seen()[1].body);
}

#[tokio::test]
async fn dropped_response_without_retries_is_a_transient_dispatch_failure() {
    let (upstream, proxy) = setup().await;
    let client = client_with(&proxy.endpoint(), |b| {
        b.retry_config(RetryConfig::standard().with_max_attempts(1))
    })
    .await;
    proxy.add_rule(Rule::new(Fault::DropResponse).times(1));
    let err = client
        .transact_write_items()
        .transact_items(transact_put())
        .send()
        .await
        .unwrap_err();
    match &err {
        // hyper reports IncompleteMessage; the SDK's connector maps that to
        // ConnectorError::other(.., TransientError), not to an I/O error.
        SdkError::DispatchFailure(failure) => {
            // (ErrorKind is not re-exported by aws-sdk-dynamodb.)
            let kind = format!("{:?}", failure.as_other());
            assert_eq!(kind, "Some(TransientError)", "{failure:?}");
            assert!(!failure.is_io() && !failure.is_timeout());
        }
        other => panic!("expected a dispatch failure, got {other:?}"),
    }
    assert_eq!(upstream.count(), 1);
}

/// A response held past the attempt timeout makes the SDK retry, although the
/// first attempt's write already happened upstream.
#[tokio::test]
async fn delayed_response_past_attempt_timeout_is_retried() {
    let (upstream, proxy) = setup().await;
    let client = client_with(&proxy.endpoint(), |b| {
        b.timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_millis(200))
                .build(),
        )
    })
    .await;
    proxy.add_rule(Rule::new(Fault::DelayResponse(Duration::from_millis(600))).times(1));
    client
        .transact_write_items()
        .transact_items(transact_put())
        .send()
        .await
        .unwrap();
    assert_eq!(upstream.count(), 2);
    assert_eq!(proxy.count("TransactWriteItems"), 2);
}
