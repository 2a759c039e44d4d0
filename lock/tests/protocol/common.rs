use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;
use flightlock::{ClockSkew, LockOptions, Locker, Wait};
use flightlock_testkit::FaultProxy;

/// A fresh table on the local server.
pub struct Env {
    pub endpoint: String,
    pub client: Client,
    pub table: String,
}

impl Env {
    pub async fn new(name: &str) -> Env {
        let flightlock_testkit::FreshTable {
            endpoint,
            client,
            table,
        } = flightlock_testkit::fresh_table(name).await;
        Env {
            endpoint,
            client,
            table,
        }
    }

    /// A locker with its own client (its own connection pool, like another process).
    pub async fn locker(&self) -> Locker {
        Locker::new(
            flightlock_testkit::client(&self.endpoint).await,
            &self.table,
        )
    }

    /// A locker whose requests go through a fault-injecting proxy.
    pub async fn proxied_locker(&self) -> (Locker, FaultProxy) {
        let proxy = FaultProxy::start(&self.endpoint).await.unwrap();
        let client = flightlock_testkit::client(&proxy.endpoint()).await;
        (Locker::new(client, &self.table), proxy)
    }

    pub async fn queue(&self, key: &str) -> Vec<flightlock::QueueEntry> {
        self.locker()
            .await
            .queue(key, ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap()
    }

    /// Every item of the key's partition (counter and rows).
    pub async fn items(&self, key: &str) -> Vec<HashMap<String, AttributeValue>> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(key.into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        out.items.unwrap_or_default()
    }

    /// Writes `items` straight into the table (unconditional puts), in order.
    pub async fn put(&self, items: Vec<HashMap<String, AttributeValue>>) {
        for item in items {
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
    }
}

/// This machine's wall clock, epoch milliseconds.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// Short timings so tests finish quickly.
pub fn fast() -> LockOptions {
    LockOptions {
        wait: Wait::Forever,
        lease: Duration::from_millis(1500),
        heartbeat: Some(Duration::from_millis(300)),
        poll: Duration::from_millis(20),
        max_poll: Duration::from_millis(200),
        clock_skew: ClockSkew::Bounded(Duration::from_millis(300)),
        ..LockOptions::default()
    }
}

/// Detects overlapping critical sections and records the order of entries.
#[derive(Clone, Default)]
pub struct Probe {
    inside: Arc<AtomicUsize>,
    pub max_inside: Arc<AtomicUsize>,
    pub entries: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Probe {
    pub fn enter(&self, who: &str, token: u64) {
        let n = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(n, Ordering::SeqCst);
        self.entries.lock().unwrap().push((who.to_owned(), token));
    }
    pub fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
    pub fn overlapped(&self) -> bool {
        self.max_inside.load(Ordering::SeqCst) > 1
    }
    pub fn order(&self) -> Vec<String> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .map(|(w, _)| w.clone())
            .collect()
    }
    pub fn tokens(&self) -> Vec<u64> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| *t)
            .collect()
    }
}

/// Waits until the key's queue has `n` rows.
pub async fn until_queue_len(env: &Env, key: &str, n: usize) {
    for _ in 0..500 {
        if env.queue(key).await.len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "queue of {key} never reached {n} rows: {:?}",
        env.queue(key).await
    );
}

pub fn assert_strictly_increasing(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not increasing: {tokens:?}"
    );
}

/// A table that is not a flightlock table: one string hash key `id`.
pub async fn create_table_keyed_by_id(client: &Client, name: &str) {
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}
