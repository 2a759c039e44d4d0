//! The lock most DynamoDB lock clients implement, measured beside flightlock in the same run.

use crate::common::opts;

/// The lock most DynamoDB lock clients implement: a conditional `PutItem` that succeeds when
/// the item is absent or its lease has ended, retried every poll; release deletes it
/// conditionally. No queue (barging), no fencing, a dead holder costs its whole lease.
pub struct PlainLock {
    pub client: aws_sdk_dynamodb::Client,
    pub table: String,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl PlainLock {
    async fn try_acquire(&self, key: &str, owner: &str) -> bool {
        use aws_sdk_dynamodb::types::AttributeValue as V;
        let now = now_ms();
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", V::S(key.into()))
            .item("sk", V::S("plain".into()))
            .item("owner", V::S(owner.into()))
            .item("leaseUntilMs", V::N((now + 3000).to_string()))
            .condition_expression("attribute_not_exists(pk) OR leaseUntilMs < :now")
            .expression_attribute_values(":now", V::N(now.to_string()))
            .send()
            .await
            .is_ok()
    }

    pub async fn acquire(&self, key: &str, owner: &str) {
        while !self.try_acquire(key, owner).await {
            tokio::time::sleep(opts().poll).await;
        }
    }

    pub async fn release(&self, key: &str, owner: &str) {
        use aws_sdk_dynamodb::types::AttributeValue as V;
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", V::S(key.into()))
            .key("sk", V::S("plain".into()))
            .condition_expression("#o = :o")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_values(":o", V::S(owner.into()))
            .send()
            .await
            .unwrap();
    }
}
