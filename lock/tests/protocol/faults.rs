//! Faults injected where they happen, by a proxy in front of DynamoDB: delayed requests and
//! responses (the late-enqueue race), dropped responses of committed writes (ambiguous writes),
//! duplicates, throttling and 5xx.

use std::time::Duration;

use flightlock::{Error, LockOptions, ReleaseOutcome, Wait};
use flightlock_testkit::{Fault, Rule};

use crate::common::*;

/// A (through the proxy, with `fault` on its first enqueue) and B race for the key.
async fn race_with_fault(name: &str, fault: Fault) -> Probe {
    let env = Env::new(name).await;
    let (a, proxy) = env.proxied_locker().await;
    proxy.add_rule(Rule::new(fault).on("TransactWriteItems").times(1));
    let probe = Probe::default();
    let pa = probe.clone();
    let ta = tokio::spawn(async move {
        let g = a.acquire("k", &fast()).await.unwrap();
        pa.enter("a", g.token());
        tokio::time::sleep(Duration::from_millis(200)).await;
        pa.leave();
        g.release().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(150)).await; // A's transaction is in the proxy now
    let b = env.locker().await;
    let g = b.acquire("k", &fast()).await.unwrap();
    probe.enter("b", g.token());
    tokio::time::sleep(Duration::from_millis(200)).await;
    probe.leave();
    g.release().await.unwrap();
    ta.await.unwrap();
    assert_eq!(proxy.faults_applied(), 1);
    assert!(env.queue("k").await.is_empty());
    probe
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_response_delayed_after_the_write() {
    // A's write happened; its answer is late. B must queue behind A's row, not jump ahead.
    let probe = race_with_fault("lateresp", Fault::DelayResponse(Duration::from_millis(900))).await;
    assert!(!probe.overlapped(), "two holders");
    assert_eq!(probe.order(), ["a", "b"]);
    assert_strictly_increasing(&probe.tokens());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_request_delayed_before_the_write() {
    // A's write arrives after B took the next ticket: A's transaction must fail and A must queue
    // behind B, never insert a lower ticket.
    let probe = race_with_fault("latereq", Fault::DelayRequest(Duration::from_millis(900))).await;
    assert!(!probe.overlapped(), "two holders");
    assert_eq!(probe.order(), ["b", "a"]);
    assert_strictly_increasing(&probe.tokens());
}

fn queue_rows(
    items: &[std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>],
) -> usize {
    items
        .iter()
        .filter(|i| i["sk"].as_s().unwrap().starts_with("q#"))
        .count()
}

fn counter(
    items: &[std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>],
) -> String {
    items
        .iter()
        .find(|i| i["sk"].as_s().unwrap() == "counter")
        .unwrap()["last"]
        .as_n()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn an_enqueue_whose_response_is_lost_is_retried_idempotently() {
    let env = Env::new("ambig").await;
    let (locker, proxy) = env.proxied_locker().await;
    proxy.add_rule(
        Rule::new(Fault::DropResponse)
            .on("TransactWriteItems")
            .times(1),
    );
    let g = locker.acquire("k", &fast()).await.unwrap();
    assert_eq!(proxy.faults_applied(), 1);
    assert!(
        proxy.count("TransactWriteItems") >= 2,
        "{:?}",
        proxy.counts()
    );
    let items = env.items("k").await;
    assert_eq!(queue_rows(&items), 1, "a retried enqueue wrote two rows");
    assert_eq!(counter(&items), "1", "a retried enqueue took two tickets");
    assert_eq!(g.token(), 1);
    assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test]
async fn duplicated_enqueue_writes_once() {
    let env = Env::new("dup").await;
    let (locker, proxy) = env.proxied_locker().await;
    proxy.add_rule(Rule::new(Fault::Duplicate).on("TransactWriteItems"));
    let g = locker.acquire("k", &fast()).await.unwrap();
    let items = env.items("k").await;
    assert_eq!((queue_rows(&items), counter(&items)), (1, "1".to_string()));
    g.release().await.unwrap();
}

#[tokio::test]
async fn lost_heartbeat_and_release_responses_are_not_losses() {
    let env = Env::new("ambighb").await;
    let (locker, proxy) = env.proxied_locker().await;
    let g = locker.acquire("k", &fast()).await.unwrap();
    proxy.add_rule(Rule::new(Fault::DropResponse).on("UpdateItem").times(3));
    tokio::time::sleep(fast().heartbeat.unwrap() * 5).await;
    assert_eq!(proxy.faults_applied(), 3, "{:?}", proxy.counts());
    assert!(
        !g.is_lost(),
        "an ambiguous heartbeat was taken for a lost lock"
    );
    proxy.add_rule(Rule::new(Fault::DropResponse).on("DeleteItem").times(1));
    assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(queue_rows(&env.items("k").await), 0);
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried() {
    let env = Env::new("throttle").await;
    let (locker, proxy) = env.proxied_locker().await;
    proxy.add_rule(Rule::new(Fault::Throttle).on("Query").times(4));
    proxy.add_rule(
        Rule::new(Fault::ServerError)
            .on("TransactWriteItems")
            .times(4),
    );
    proxy.add_rule(Rule::new(Fault::Throttle).on("UpdateItem").times(2));
    proxy.add_rule(Rule::new(Fault::ServerError).on("DeleteItem").times(2));
    let g = locker.acquire("k", &fast()).await.unwrap();
    tokio::time::sleep(fast().heartbeat.unwrap() * 3).await;
    assert!(!g.is_lost());
    assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(proxy.faults_applied(), 12, "{:?}", proxy.counts());
    assert_eq!(queue_rows(&env.items("k").await), 0);
}

#[tokio::test]
async fn throttling_beyond_the_budget_is_a_clear_error() {
    let env = Env::new("throttled").await;
    let (locker, proxy) = env.proxied_locker().await;
    proxy.add_rule(Rule::new(Fault::Throttle).on("Query"));
    let opts = LockOptions {
        wait: Wait::NoWait,
        ..fast()
    };
    let err = locker.acquire("k", &opts).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Throttled {
                operation: "Query",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("throttled"), "{err}");
}
