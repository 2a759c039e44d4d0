//! Proxy + SDK against a real DynamoDB Local: the one `AWS_ENDPOINT_URL_DYNAMODB` names, or
//! one this test binary starts ([`crate::require_endpoint`]).

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use crate::{client, require_endpoint, unique_table, Fault, FaultProxy, Rule};

/// Against a real DynamoDB Local: a throttled ListTables is retried by the SDK
/// and succeeds.
#[tokio::test]
async fn dynamodb_local_list_tables_retried_after_throttle() {
    let endpoint = require_endpoint();
    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    proxy.add_rule(Rule::new(Fault::Throttle).on("ListTables").times(1));
    let client = client(&proxy.endpoint()).await;
    client.list_tables().send().await.unwrap();
    assert_eq!(proxy.count("ListTables"), 2);
    assert_eq!(proxy.faults_applied(), 1);
}

/// What happens when a conditional TransactWriteItems is applied but its
/// response is lost: the SDK retries with the same ClientRequestToken. Real
/// DynamoDB and DynamoDB Local treat that as idempotent and answer success;
/// moto (`FLIGHTLOCK_DDB_BACKEND=moto`) does not and cancels the transaction
/// with ConditionalCheckFailed.
#[tokio::test]
async fn dynamodb_local_transact_write_retried_after_dropped_response() {
    let endpoint = require_endpoint();
    let direct = client(&endpoint).await;
    let table = unique_table("testkit");
    crate::env::create_table_keyed_by(&direct, &table, "pk").await;

    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    let via_proxy = client(&proxy.endpoint()).await;
    proxy.add_rule(
        Rule::new(Fault::DropResponse)
            .on("TransactWriteItems")
            .times(1),
    );
    let put = Put::builder()
        .table_name(&table)
        .item("pk", AttributeValue::S("lock#1".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap();
    let result = via_proxy
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().put(put).build())
        .send()
        .await;
    println!("TransactWriteItems after a dropped response: {result:?}");
    assert_eq!(proxy.count("TransactWriteItems"), 2, "the SDK retried");
    let item = direct
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S("lock#1".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(item.item.is_some(), "the first attempt's write is there");
    direct
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    if std::env::var("FLIGHTLOCK_DDB_BACKEND").as_deref() == Ok("moto") {
        // moto ignores ClientRequestToken: the retry fails its own condition.
        let err = result.unwrap_err();
        let service = err.as_service_error().unwrap();
        assert!(service.is_transaction_canceled_exception(), "{service:?}");
    } else {
        // DynamoDB Local, like DynamoDB, recognises the retry as idempotent.
        result.unwrap();
    }
}
