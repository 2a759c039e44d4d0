//! `flightlock::permits` (behind `flightlock permits` and `flightlock status`) against a real
//! local DynamoDB: changing a key's permits on an idle key and back, waiting while the counter's
//! seat is taken, and a key without a counter (the CLI's `permits`, `run --permits` and `status`:
//! `cli/tests/cli/permits.rs`). Each test has its own table. Run through
//! `scripts/dynamodb-local run -- cargo test -p flightlock --test permits`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::permits::{set_permits, Change, PermitsError};
use flightlock::schema::{self, seed};
use flightlock::{ClockSkew, EntryState, Error, Locker};
use flightlock_testkit::env::{skip as opts, Env};

const POLL: Duration = Duration::from_millis(50);
const SKEW: ClockSkew = ClockSkew::Bounded(Duration::from_secs(1));

/// Sets `key`'s permits to `n`, checking what the answer names.
async fn set(locker: &Locker, key: &str, n: u32, wait: Duration) -> Result<Change, PermitsError> {
    let done = set_permits(locker, key, n, wait, POLL).await?;
    assert_eq!((done.key.as_str(), done.permits), (key, n));
    Ok(done.change)
}

/// `key`'s counter item as it stands.
async fn counter(e: &Env, key: &str) -> HashMap<String, AttributeValue> {
    e.client
        .get_item()
        .table_name(&e.table)
        .key(schema::PK, schema::s(key))
        .key(schema::SK, schema::s(schema::COUNTER_SK))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("a counter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_to_three_on_an_idle_key_then_back_to_one() {
    let (e, locker) = Env::with_locker("permits_idle").await;
    let key = "partner-api";
    // The key in use at one permit, idle now.
    locker
        .acquire(key, &opts(1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    assert_eq!(
        set(&locker, key, 3, Duration::ZERO).await.unwrap(),
        Change::Changed { from: 1 }
    );
    let c = counter(&e, key).await;
    assert_eq!(c.get(schema::PROTOCOL_ATTR), Some(&schema::n(2)));
    assert_eq!(c.get(schema::PERMITS_ATTR), Some(&schema::n(3)));
    // Idempotent: the same number again writes nothing.
    assert_eq!(
        set(&locker, key, 3, Duration::ZERO).await.unwrap(),
        Change::Unchanged
    );

    // Three participants configured with 3 hold at once; a fourth is busy, naming all three.
    let mut guards = Vec::new();
    for _ in 0..3 {
        guards.push(locker.acquire(key, &opts(3)).await.unwrap());
    }
    match locker.acquire(key, &opts(3)).await {
        Err(Error::Busy {
            holders, permits, ..
        }) => {
            assert_eq!(permits, 3);
            let mut tickets: Vec<_> = holders.iter().map(|h| h.ticket).collect();
            tickets.sort_unstable();
            let mut held: Vec<_> = guards.iter().map(|g| g.token()).collect();
            held.sort_unstable();
            assert_eq!(tickets, held);
        }
        other => panic!("a fourth must be busy, got {other:?}"),
    }
    // One configured with 1 is refused, naming both numbers, and not granted.
    match locker.acquire(key, &opts(1)).await {
        Err(Error::PermitsMismatch {
            table, configured, ..
        }) => assert_eq!((table, configured), (3, 1)),
        other => panic!("expected PermitsMismatch, got {other:?}"),
    }
    let state = locker.state(key, SKEW).await.unwrap();
    assert_eq!((state.protocol, state.permits), (2, 3));
    let holding = state
        .queue
        .iter()
        .filter(|q| q.state == EntryState::Holding)
        .count();
    assert_eq!(holding, 3, "{:?}", state.queue);
    for g in guards {
        g.release().await.unwrap();
    }

    // Back to one: protocol 1, no permits attribute, as a key that never had more.
    assert_eq!(
        set(&locker, key, 1, Duration::ZERO).await.unwrap(),
        Change::Changed { from: 3 }
    );
    let c = counter(&e, key).await;
    assert_eq!(c.get(schema::PROTOCOL_ATTR), Some(&schema::n(1)));
    assert_eq!(c.get(schema::PERMITS_ATTR), None);
    assert!(matches!(
        locker.acquire(key, &opts(3)).await,
        Err(Error::PermitsMismatch {
            table: 1,
            configured: 3,
            ..
        })
    ));
    let g = locker.acquire(key, &opts(1)).await.unwrap();
    g.release().await.unwrap();
    let state = locker.state(key, SKEW).await.unwrap();
    assert_eq!((state.protocol, state.permits), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_seat_is_waited_for_and_never_changed_under_its_holder() {
    let (e, locker) = Env::with_locker("permits_seat").await;
    let key = "nightly";
    let guard = locker.acquire(key, &opts(1)).await.unwrap();
    let state = locker.state(key, SKEW).await.unwrap();
    assert_eq!(
        state.seat,
        Some(guard.token()),
        "an uncontended grant sits on the seat"
    );

    // Refused for the whole wait, naming the seated ticket; nothing changed.
    match set(&locker, key, 2, Duration::from_millis(300)).await {
        Err(PermitsError::SeatTaken { ticket, waited, .. }) => {
            assert_eq!(ticket, guard.token());
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected SeatTaken, got {other:?}"),
    }
    assert_eq!(counter(&e, key).await.get(schema::PERMITS_ATTR), None);
    assert!(!guard.is_lost());

    // Waiting: it goes through once the holder releases.
    let waiting = tokio::spawn({
        let locker = locker.clone();
        async move { set_permits(&locker, key, 2, Duration::from_secs(20), POLL).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "it must wait for the seat");
    assert!(!guard.is_lost(), "the seated holder keeps its lock");
    guard.release().await.unwrap();
    let done = waiting.await.unwrap().unwrap();
    assert_eq!(done.change, Change::Changed { from: 1 });
    let a = locker.acquire(key, &opts(2)).await.unwrap();
    let b = locker.acquire(key, &opts(2)).await.unwrap();
    a.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_a_counter_gets_one_above_its_highest_ticket() {
    let (e, locker) = Env::with_locker("permits_no_counter").await;
    // A key never used.
    assert_eq!(
        set(&locker, "fresh", 4, Duration::ZERO).await.unwrap(),
        Change::Created { last: 0 }
    );
    let c = counter(&e, "fresh").await;
    assert_eq!(c.get(schema::PERMITS_ATTR), Some(&schema::n(4)));
    let owner = match c.get(schema::LAST_OWNER) {
        Some(AttributeValue::S(o)) => o.clone(),
        other => panic!("lastOwner: {other:?}"),
    };
    assert!(owner.ends_with(":0"), "{owner}");
    let g = locker.acquire("fresh", &opts(4)).await.unwrap();
    assert!(g.token() >= 1);
    g.release().await.unwrap();

    // A key whose counter is gone but whose queue holds a live row at ticket 7.
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 60_000;
    e.client
        .put_item()
        .table_name(&e.table)
        .set_item(Some(seed::row("orphan", 7, "o-7", "rvn-1", until)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        set(&locker, "orphan", 2, Duration::ZERO).await.unwrap(),
        Change::Created { last: 7 }
    );
    // Tickets keep rising, and the second permit is free beside the live row.
    let g = locker.acquire("orphan", &opts(2)).await.unwrap();
    assert!(g.token() > 7, "ticket {}", g.token());
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_is_refused_before_any_request() {
    let (_env, locker) = Env::with_locker("permits_range").await;
    for n in [0, flightlock::MAX_PERMITS + 1] {
        assert!(matches!(
            set(&locker, "k", n, Duration::ZERO).await,
            Err(PermitsError::OutOfRange(m)) if m == n
        ));
    }
    let state = locker.state("k", SKEW).await.unwrap();
    assert!(!state.has_counter);
}
