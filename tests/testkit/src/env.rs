//! A lock table of its own for a test against the local DynamoDB ([`Env`]), and the bounded
//! waits every test uses so that it fails, naming what it awaited, instead of hanging: the
//! shared setup of the lock's protocol tests and the CLI's tests.

// Test support panics on anything unexpected, by design.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::FaultProxy;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;
use flightlock::{ClockSkew, LockGuard, LockOptions, Locker, LostReason, Wait};

/// Awaits `fut` for at most `bound`, so a test that waits for a signal (a grant, a loss, a task,
/// a process) fails instead of hanging when the signal never comes: past the bound it fails
/// naming what it awaited.
pub async fn within<T>(bound: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(bound, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: nothing within {bound:?}"),
    }
}

/// The bound of a whole test against the local DynamoDB: far past what any test takes on a
/// loaded 2-core machine (the slowest take under a minute), so reaching it means a wait that
/// never ends, not a slow run.
pub const TEST_BOUND: Duration = Duration::from_secs(300);

/// Runs a test's body for at most [`TEST_BOUND`]: every protocol test is wrapped in it, so one
/// whose waits never end (a locker that never gives up, a signal that never comes) fails
/// instead of keeping `cargo test` from returning.
pub async fn bounded(body: impl Future<Output = ()>) {
    within(TEST_BOUND, "the whole test (a wait that never ends?)", body).await
}

/// Runs `wait` (a blocking wait on the child process `pid`: its exit, its output) for at most
/// `bound`; past it, kills the process and fails naming `what`. A command that never ends (a
/// signal not passed on, a wait that never gives up) fails the test instead of hanging it.
pub async fn blocking_within<T: Send + 'static>(
    pid: u32,
    bound: Duration,
    what: &str,
    wait: impl FnOnce() -> T + Send + 'static,
) -> T {
    match tokio::time::timeout(bound, tokio::task::spawn_blocking(wait)).await {
        Ok(done) => done.unwrap(),
        Err(_) => {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("{what}: still running after {bound:?} (killed)")
        }
    }
}

/// Waits at most `bound` for `child` to exit, with its output (see [`blocking_within`]).
pub async fn child_within(child: Child, bound: Duration, what: &str) -> Output {
    let pid = child.id();
    blocking_within(pid, bound, what, move || child.wait_with_output().unwrap()).await
}

/// Runs `command` to its end within `bound`, its stdout and stderr captured (as
/// `Command::output` does), killing it past the bound (see [`blocking_within`]).
pub async fn output_within(mut command: Command, bound: Duration, what: &str) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    child_within(command.spawn().unwrap(), bound, what).await
}

/// A fresh table on the local server.
#[derive(Clone)]
pub struct Env {
    /// The local server's endpoint.
    pub endpoint: String,
    /// A client of the local server.
    pub client: Client,
    /// The table's name.
    pub table: String,
}

impl Env {
    /// A new lock table named after `name` (see [`crate::fresh_table`]).
    pub async fn new(name: &str) -> Env {
        let crate::FreshTable {
            endpoint,
            client,
            table,
        } = crate::fresh_table(name).await;
        Env {
            endpoint,
            client,
            table,
        }
    }

    /// A new table (see [`Env::new`]) and a locker on it.
    pub async fn with_locker(name: &str) -> (Env, Locker) {
        let env = Env::new(name).await;
        let locker = env.locker().await;
        (env, locker)
    }

    /// A locker with its own client (its own connection pool, like another process).
    pub async fn locker(&self) -> Locker {
        Locker::new(crate::client(&self.endpoint).await, &self.table)
    }

    /// A locker whose requests go through a fault-injecting proxy.
    pub async fn proxied_locker(&self) -> (Locker, FaultProxy) {
        let proxy = FaultProxy::start(&self.endpoint).await.unwrap();
        let client = crate::client(&proxy.endpoint()).await;
        (Locker::new(client, &self.table), proxy)
    }

    /// The key's queue as it stands, judged with a 1 s clock skew allowance.
    pub async fn queue(&self, key: &str) -> Vec<flightlock::QueueEntry> {
        self.locker()
            .await
            .queue(key, ClockSkew::Bounded(Duration::from_secs(1)))
            .await
            .unwrap()
    }

    /// [`within`], failing with what the key holds then (its counter and rows).
    pub async fn within<T>(
        &self,
        key: &str,
        bound: Duration,
        what: &str,
        fut: impl Future<Output = T>,
    ) -> T {
        match tokio::time::timeout(bound, fut).await {
            Ok(v) => v,
            Err(_) => panic!(
                "{what}: nothing within {bound:?}; {key} holds {:#?}",
                self.items(key).await
            ),
        }
    }

    /// Awaits every task (each unwrapped: a task that panicked fails the test) for at most
    /// `bound` in all; past it, fails with what the key holds then.
    pub async fn join_within<T>(
        &self,
        key: &str,
        bound: Duration,
        what: &str,
        tasks: Vec<tokio::task::JoinHandle<T>>,
    ) -> Vec<T> {
        self.within(key, bound, what, async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        })
        .await
    }

    /// Waits at most `bound` for `guard`'s lost signal; past it, fails with what the guard and
    /// the key show (a heartbeat that keeps succeeding never loses the lock).
    pub async fn lost_within(&self, guard: &LockGuard, bound: Duration) -> LostReason {
        match tokio::time::timeout(bound, guard.lost()).await {
            Ok(reason) => reason,
            Err(_) => panic!(
                "{} t{} was never lost within {bound:?} (lost: {:?}, {} failed heartbeat(s)); \
                 the key holds {:#?}",
                guard.key(),
                guard.token(),
                guard.lost_reason(),
                guard.heartbeat_failures(),
                self.items(guard.key()).await
            ),
        }
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

    /// [`Env::items`], comparable: attribute name to value (debug-printed), by sort key.
    pub async fn items_by_sk(&self, key: &str) -> BTreeMap<String, BTreeMap<String, String>> {
        self.items(key)
            .await
            .into_iter()
            .map(|item| {
                let sk = item["sk"].as_s().unwrap().clone();
                let attrs = item
                    .into_iter()
                    .map(|(k, v)| (k, format!("{v:?}")))
                    .collect();
                (sk, attrs)
            })
            .collect()
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

/// [`fast`]'s pacing with a lease a starved machine cannot outrun (a 2-core CI runner with other
/// tests beside it has stalled a heartbeat past 1.2 s): for tests of exclusion and of retries,
/// where an expired lease is not what is under test.
pub fn steady() -> LockOptions {
    LockOptions {
        lease: Duration::from_secs(6),
        ..fast()
    }
}

/// No wait (busy at once when the key is full), with `permits`.
pub fn skip(permits: u32) -> LockOptions {
    LockOptions {
        wait: Wait::NoWait,
        permits,
        ..LockOptions::default()
    }
}

/// Detects overlapping critical sections and records the order of entries.
#[derive(Clone, Default)]
pub struct Probe {
    inside: Arc<AtomicUsize>,
    /// The most holders seen inside at once.
    pub max_inside: Arc<AtomicUsize>,
    /// Who entered, with their fencing token, in order.
    pub entries: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Probe {
    /// `who` enters with `token`.
    pub fn enter(&self, who: &str, token: u64) {
        let n = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(n, Ordering::SeqCst);
        self.entries.lock().unwrap().push((who.to_owned(), token));
    }
    /// One holder leaves.
    pub fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
    /// Whether two holders were ever inside at once.
    pub fn overlapped(&self) -> bool {
        self.max_inside.load(Ordering::SeqCst) > 1
    }
    /// Who entered, in order.
    pub fn order(&self) -> Vec<String> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .map(|(w, _)| w.clone())
            .collect()
    }
    /// The tokens entered with, in order.
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

/// Waits until `n` holders have entered `probe` (10 s at most).
pub async fn until_entered(probe: &Probe, n: usize) {
    for _ in 0..1000 {
        if probe.order().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} holders never entered: {:?}", probe.order());
}

/// Fails unless `tokens` strictly increase (fencing tokens of successive holders).
pub fn assert_strictly_increasing(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not increasing: {tokens:?}"
    );
}

/// A table that is not a flightlock table: one string hash key named `key` (`id`: a user's
/// table of another shape).
pub async fn create_table_keyed_by(client: &Client, name: &str, key: &str) {
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}
