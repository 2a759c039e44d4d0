//! Guarantee 1: mutual exclusion under many contenders doing a non-atomic read-modify-write.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twelve_contenders_never_overlap_and_lose_no_update() {
    bounded(async move {
        let env = Env::new("excl").await;
        let probe = Probe::default();
        const CONTENDERS: usize = 12;
        const ROUNDS: usize = 4;
        let mut tasks = Vec::new();
        for c in 0..CONTENDERS {
            let locker = env.locker().await;
            let client = env.client.clone();
            let table = env.table.clone();
            let probe = probe.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locker.acquire("shared", &fast()).await.unwrap();
                    probe.enter(&format!("c{c}"), guard.token());
                    // Read-modify-write with a pause in between: any overlap loses an update.
                    let item = client
                        .get_item()
                        .table_name(&table)
                        .key("pk", AttributeValue::S("data".into()))
                        .key("sk", AttributeValue::S("value".into()))
                        .consistent_read(true)
                        .send()
                        .await
                        .unwrap();
                    let v: u64 = item
                        .item()
                        .and_then(|i| i.get("v"))
                        .and_then(|v| v.as_n().ok())
                        .map(|n| n.parse().unwrap())
                        .unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    client
                        .put_item()
                        .table_name(&table)
                        .item("pk", AttributeValue::S("data".into()))
                        .item("sk", AttributeValue::S("value".into()))
                        .item("v", AttributeValue::N((v + 1).to_string()))
                        .send()
                        .await
                        .unwrap();
                    probe.leave();
                    assert_eq!(
                        guard.release().await.unwrap(),
                        flightlock::ReleaseOutcome::Released
                    );
                }
            }));
        }
        env.join_within(
            "shared",
            Duration::from_secs(120),
            "twelve contenders",
            tasks,
        )
        .await;
        assert!(!probe.overlapped(), "two holders at once");
        assert_strictly_increasing(&probe.tokens());
        let item = env
            .client
            .get_item()
            .table_name(&env.table)
            .key("pk", AttributeValue::S("data".into()))
            .key("sk", AttributeValue::S("value".into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        let v = item.item().unwrap()["v"].as_n().unwrap().to_string();
        assert_eq!(v, (CONTENDERS * ROUNDS).to_string(), "lost updates");
        assert!(env.queue("shared").await.is_empty(), "rows left behind");
    })
    .await;
}

#[tokio::test]
async fn keys_are_independent() {
    bounded(async move {
        let env = Env::new("indep").await;
        let locker = env.locker().await;
        let a = locker.acquire("a", &fast()).await.unwrap();
        let opts = flightlock::LockOptions {
            wait: flightlock::Wait::NoWait,
            ..fast()
        };
        let b = locker.acquire("b", &opts).await.unwrap();
        assert_eq!((a.token(), b.token()), (1, 1));
        a.release().await.unwrap();
        b.release().await.unwrap();
    })
    .await;
}
