//! Errors a user must act on: they name the problem and the fix.

use std::time::Duration;

use flightlock::{table, Error, LockOptions, Locker, Wait};

use crate::common::*;

#[tokio::test]
async fn a_missing_table_says_how_to_create_it() {
    bounded(async move {
        let endpoint = flightlock_testkit::require_endpoint();
        let client = flightlock_testkit::client(&endpoint).await;
        let locker = Locker::new(client, "no-such-table-flightlock");
        let err = locker.acquire("k", &fast()).await.unwrap_err();
        assert!(matches!(err, Error::TableNotFound { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("flightlock create-table --table no-such-table-flightlock"),
            "{err}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_table_with_the_wrong_keys_is_refused() {
    bounded(async move {
        let endpoint = flightlock_testkit::require_endpoint();
        let client = flightlock_testkit::client(&endpoint).await;
        let name = flightlock_testkit::unique_table("wrongkeys");
        create_table_keyed_by(&client, &name, "id").await;
        let err = table::create_table(&client, &name).await.unwrap_err();
        assert!(matches!(err, Error::WrongKeySchema { .. }), "{err}");
        assert!(err.to_string().contains("`id` (S, HASH)"), "{err}");
    })
    .await;
}

#[tokio::test]
async fn create_table_is_idempotent_and_verify_checks_ttl() {
    bounded(async move {
        let env = Env::new("ttl").await;
        assert_eq!(
            table::create_table(&env.client, &env.table).await.unwrap(),
            table::Created::Existing {
                ttl_turned_on: false
            }
        );
        table::verify_table(&env.client, &env.table).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn bad_keys_are_rejected_not_truncated() {
    bounded(async move {
        let env = Env::new("badkey").await;
        let locker = env.locker().await;
        assert!(matches!(
            locker.acquire("", &fast()).await,
            Err(Error::InvalidKey { .. })
        ));
        let long = "x".repeat(1025);
        let err = locker.acquire(&long, &fast()).await.unwrap_err();
        assert!(err.to_string().contains("1025 bytes"), "{err}");
        // The longest valid key works.
        let g = locker.acquire(&"x".repeat(1024), &fast()).await.unwrap();
        g.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_millisecond_ttl_in_a_row_is_reported_by_name() {
    bounded(async move {
        let env = Env::new("msttl").await;
        // The holder sits in the counter's seat (no TTL there); a waiter's row behind it carries
        // a TTL written in milliseconds by some other client.
        let g = env.locker().await.acquire("k", &fast()).await.unwrap();
        let row = flightlock::schema::NewRow {
            protocol: 1,
            key: "k",
            ticket: g.token() + 1,
            owner: "someone-else",
            lease_until_ms: 1_700_000_000_000,
            lease_ms: 1500,
            expires_at: 1_700_000_000_000,
            clock_free: false,
            rvn: "r1",
            now_ms: 1_700_000_000_000,
            granted: false,
            holder: &flightlock::schema::HolderInfo::default(),
        };
        env.client
            .put_item()
            .table_name(&env.table)
            .set_item(Some(row.to_item()))
            .send()
            .await
            .unwrap();
        let err = env
            .locker()
            .await
            .queue("k", flightlock::ClockSkew::Unbounded)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("expiresAt") && err.to_string().contains("milliseconds"),
            "{err}"
        );
        drop(g);
    })
    .await;
}

/// A Lambda user whose table has the wrong keys gets the CLI's actionable error (from the table
/// check behind [`flightlock::Locker::explain`]), not a bare `ValidationException`.
#[tokio::test]
async fn a_wrong_table_is_explained_on_first_use() {
    bounded(async move {
        let endpoint = flightlock_testkit::require_endpoint();
        let client = flightlock_testkit::client(&endpoint).await;
        let name = flightlock_testkit::unique_table("wrongfirst");
        create_table_keyed_by(&client, &name, "id").await;
        let locker = flightlock::Locker::new(client, &name);
        let err = locker
            .acquire("k", &flightlock::LockOptions::default())
            .await
            .unwrap_err();
        let better = locker.explain(&err).await;
        let better = better.unwrap_or_else(|| panic!("no explanation for {err}"));
        assert!(matches!(better, Error::WrongKeySchema { .. }), "{better}");
        assert!(matches!(
            locker.check_table().await,
            Err(Error::WrongKeySchema { .. })
        ));
    })
    .await;
}

/// The extension and the in-process layer acquire through [`Locker`]: a refused connection ends
/// a wait of forever at once, as it ends `flightlock run`'s (`cli/tests/cli/failfast.rs`).
#[tokio::test]
async fn the_library_ends_a_forever_wait_on_a_refusing_endpoint() {
    bounded(async move {
        // A local port that refuses connections (bound, then closed).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refusing = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let client = flightlock_testkit::client(&refusing).await;
        let locker = Locker::new(client, "any");
        let opts = LockOptions {
            wait: Wait::Forever,
            ..LockOptions::default()
        };
        let err = tokio::time::timeout(Duration::from_secs(120), locker.acquire("job", &opts))
            .await
            .expect("still waiting: a refused connection was retried")
            .unwrap_err();
        assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    })
    .await;
}
