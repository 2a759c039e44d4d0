//! Guarantee 6 and the lost signal: release is safe; a row removed behind the holder's back is
//! reported.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::{LostReason, ReleaseOutcome};
use flightlock_testkit::{Fault, Rule};

use crate::common::*;

#[tokio::test]
async fn a_row_deleted_behind_the_holders_back_fires_lost_within_a_heartbeat() {
    bounded(async move {
        let env = Env::new("lost").await;
        let g = env.locker().await.acquire("k", &fast()).await.unwrap();
        // Uncontended, the holder sits in the counter's seat: its entry is the counter item.
        let entry = env.queue("k").await;
        assert!(entry[0].seat, "{entry:?}");
        let sk = "counter".to_owned();
        env.client
            .delete_item()
            .table_name(&env.table)
            .key("pk", AttributeValue::S("k".into()))
            .key("sk", AttributeValue::S(sk))
            .send()
            .await
            .unwrap();
        let interval = fast().heartbeat.unwrap();
        let reason = tokio::time::timeout(interval * 2 + Duration::from_millis(500), g.lost())
            .await
            .expect("lost signal did not fire within a heartbeat interval");
        assert_eq!(reason, LostReason::RowGone);
        assert!(g.is_lost());
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Lost);
    })
    .await;
}

#[tokio::test]
async fn a_late_heartbeat_never_brings_a_released_row_back() {
    bounded(async move {
        let env = Env::new("late").await;
        let (locker, proxy) = env.proxied_locker().await;
        let g = locker.acquire("k", &fast()).await.unwrap();
        // Heartbeats reach DynamoDB 800 ms after they are sent.
        proxy.add_rule(Rule::new(Fault::DelayRequest(Duration::from_millis(800))).on("UpdateItem"));
        // Release while a heartbeat is in flight.
        tokio::time::sleep(fast().heartbeat.unwrap() + Duration::from_millis(100)).await;
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(
            proxy.count("UpdateItem") >= 1,
            "no heartbeat was in flight: {:?}",
            proxy.counts()
        );
        // Neither a row nor the counter's seat (the holder's entry here) came back.
        let entries = env
            .items("k")
            .await
            .into_iter()
            .filter(|i| i["sk"].as_s().unwrap().starts_with("q#") || i.contains_key("owner"))
            .count();
        assert_eq!(entries, 0, "a late heartbeat recreated the holder's entry");
    })
    .await;
}

#[tokio::test]
async fn unreachable_dynamodb_fires_lost_before_the_lease_ends() {
    bounded(async move {
        let env = Env::new("unreach").await;
        let (locker, proxy) = env.proxied_locker().await;
        let g = locker.acquire("k", &fast()).await.unwrap();
        proxy.add_rule(Rule::new(Fault::ServerError));
        let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .unwrap();
        assert_eq!(reason, LostReason::LeaseExpired);
        proxy.clear_rules();
        // The row may still be ours; release reports the loss either way.
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Lost);
    })
    .await;
}
