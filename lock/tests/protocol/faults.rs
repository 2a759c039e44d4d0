//! Faults injected where they happen, by a proxy in front of DynamoDB: delayed requests and
//! responses (the late-enqueue race), dropped responses of committed writes (ambiguous writes),
//! duplicates, throttling and 5xx.
//!
//! An enqueue is one of two writes: an uncontended acquisition takes the counter's seat (one
//! conditional `UpdateItem` of the counter), a waiter puts its row with the enqueue transaction
//! (`TransactWriteItems`). Each fault is tried on both: on the seat with the key free, and on the
//! transaction with another locker holding the key first.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::schema::{COUNTER_SK, LAST, OWNER, QUEUE_PREFIX, SK, TICKET};
use flightlock::{Error, LockGuard, LockOptions, Locker, ReleaseOutcome, Wait};
use flightlock_testkit::{Fault, FaultProxy, Rule};

use crate::common::*;

type Item = HashMap<String, AttributeValue>;

// Bodies of the counter's `UpdateItem`s, told apart by their expressions (a rule on one of them
// that stops matching never fires, and the `faults_applied` assertions fail).
/// Taking the seat: the only write conditioned on an empty seat.
const SEAT_TAKE: &str = "attribute_not_exists(#a";
/// A heartbeat, of the seat or of a row.
const HEARTBEAT: &str = "#until <= :until";
/// Vacating the seat (our release).
const VACATE: &str = "REMOVE ";

/// The guard holds the key from the counter's seat.
const SEAT: bool = true;
/// The guard holds the key from a queue row.
const ROW: bool = false;

/// A rule on the seat's take.
fn on_seat_take(fault: Fault) -> Rule {
    Rule::new(fault).on("UpdateItem").body_contains(SEAT_TAKE)
}

/// A rule on the enqueue transaction (a waiter's enqueue).
fn on_transaction(fault: Fault) -> Rule {
    Rule::new(fault).on("TransactWriteItems")
}

fn queue_rows(items: &[Item]) -> usize {
    items
        .iter()
        .filter(|i| i[SK].as_s().unwrap().starts_with(QUEUE_PREFIX))
        .count()
}

fn counter_item(items: &[Item]) -> &Item {
    items
        .iter()
        .find(|i| i[SK].as_s().unwrap() == COUNTER_SK)
        .expect("the key has no counter")
}

/// The counter's `last`.
fn counter(items: &[Item]) -> String {
    counter_item(items)[LAST].as_n().unwrap().clone()
}

/// The seat's (owner, ticket), or `None` if it is empty.
fn seat(items: &[Item]) -> Option<(String, String)> {
    let c = counter_item(items);
    c.get(OWNER)
        .map(|o| (o.as_s().unwrap().clone(), c[TICKET].as_n().unwrap().clone()))
}

/// Asserts that `g` holds the key from the counter's seat with ticket 1, that the counter moved
/// once and that no queue row was written.
async fn assert_seated_once(env: &Env, g: &LockGuard) {
    let items = env.items("k").await;
    assert_eq!(
        queue_rows(&items),
        0,
        "an uncontended acquisition wrote a row"
    );
    assert_eq!(counter(&items), "1", "the seat was taken with two tickets");
    assert_eq!(
        seat(&items),
        Some((g.owner().to_owned(), "1".to_owned())),
        "the seat is not ours"
    );
    assert_eq!(g.token(), 1);
}

/// Asserts that the key is free again: seat empty, no rows, the counter where it was.
async fn assert_free(env: &Env, last: &str) {
    let items = env.items("k").await;
    assert_eq!(seat(&items), None, "the seat was not vacated");
    assert_eq!(queue_rows(&items), 0);
    assert_eq!(counter(&items), last);
}

/// Another locker (not proxied) takes the key first: it holds the seat, ticket 1.
async fn holder(env: &Env) -> LockGuard {
    let g = env.locker().await.acquire("k", &steady()).await.unwrap();
    assert_eq!(g.token(), 1);
    g
}

/// `locker` acquires the key behind `holder` (so it enqueues with the transaction), and gets it
/// once the holder has released.
async fn acquire_behind(env: &Env, holder: LockGuard, locker: &Locker) -> LockGuard {
    let waiter = locker.clone();
    let task = tokio::spawn(async move { waiter.acquire("k", &steady()).await.unwrap() });
    until_queue_len(env, "k", 2).await;
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    env.within(
        "k",
        Duration::from_secs(10),
        "the waiter behind a release",
        task,
    )
    .await
    .unwrap()
}

/// A (through the proxy, with `fault` on its first enqueue) and B race for the key. `contended`:
/// H holds the key first and releases it while A's enqueue is still late, so A's enqueue is the
/// transaction; otherwise the key is free and A's enqueue takes the seat.
///
/// The race is ordered by what the table and the proxy show, not by sleeps (a starved CI machine
/// once took longer than a 150 ms head start to get A's request to the proxy): B starts once A's
/// request has met the fault, and for a late *response* once A's write is in the table; H leaves
/// once B is queued.
async fn race_with_fault(name: &str, fault: Fault, contended: bool) -> Probe {
    let env = Env::new(name).await;
    let probe = Probe::default();
    let late_response = matches!(fault, Fault::DelayResponse(_));
    let (a, proxy) = env.proxied_locker().await;
    let h = if contended {
        let g = holder(&env).await;
        probe.enter("h", g.token());
        let ph = probe.clone();
        let env_h = env.clone();
        // H, A's row if its write is in, B.
        let queued = if late_response { 3 } else { 2 };
        Some(tokio::spawn(async move {
            until_queue_len(&env_h, "k", queued).await;
            ph.leave();
            g.release().await.unwrap();
        }))
    } else {
        None
    };
    let rule = if contended {
        on_transaction(fault)
    } else {
        on_seat_take(fault)
    };
    proxy.add_rule(rule.times(1));
    let pa = probe.clone();
    let ta = tokio::spawn(async move {
        let g = a.acquire("k", &fast()).await.unwrap();
        pa.enter("a", g.token());
        tokio::time::sleep(Duration::from_millis(200)).await;
        pa.leave();
        g.release().await.unwrap();
    });
    until_fault_applied(&proxy).await;
    if late_response {
        // A's write is in: H (if any) and A.
        until_queue_len(&env, "k", if contended { 2 } else { 1 }).await;
    }
    let b = env.locker().await;
    let g = env
        .within(
            "k",
            Duration::from_secs(10),
            "b's grant",
            b.acquire("k", &fast()),
        )
        .await
        .unwrap();
    probe.enter("b", g.token());
    tokio::time::sleep(Duration::from_millis(200)).await;
    probe.leave();
    g.release().await.unwrap();
    let tasks = std::iter::once(ta).chain(h).collect();
    env.join_within("k", Duration::from_secs(10), "a's and h's holds", tasks)
        .await;
    assert_eq!(proxy.faults_applied(), 1, "{:?}", proxy.counts());
    assert!(env.queue("k").await.is_empty());
    probe
}

/// Waits until the proxy has applied a fault (the request it holds has reached it).
async fn until_fault_applied(proxy: &FaultProxy) {
    for _ in 0..1000 {
        if proxy.faults_applied() > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no fault applied within 10 s: {:?}", proxy.counts());
}

/// How long a late request is held: long enough for B to enqueue on a starved machine, shorter
/// than the locker's 5 s attempt timeout (past it the SDK would retry, and the retry passes).
const LATE_REQUEST: Duration = Duration::from_millis(2500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_response_delayed_after_the_write() {
    bounded(async move {
        // A took the seat; its answer is late. B must queue behind A's seat, not jump ahead.
        let delay = Fault::DelayResponse(Duration::from_millis(900));
        let probe = race_with_fault("lateresp", delay, false).await;
        assert!(!probe.overlapped(), "two holders");
        assert_eq!(probe.order(), ["a", "b"]);
        assert_strictly_increasing(&probe.tokens());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_response_delayed_after_the_write_behind_a_holder() {
    bounded(async move {
        // A's row is in (behind H); its answer is late. When H leaves, B must queue behind A's row.
        let delay = Fault::DelayResponse(Duration::from_millis(900));
        let probe = race_with_fault("lateresph", delay, true).await;
        assert!(!probe.overlapped(), "two holders");
        assert_eq!(probe.order(), ["h", "a", "b"]);
        assert_strictly_increasing(&probe.tokens());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_request_delayed_before_the_write() {
    bounded(async move {
        // A's seat take arrives after B took the seat (and maybe left it): A's write must fail and A
        // must queue behind B, never take the seat with a lower ticket.
        let delay = Fault::DelayRequest(LATE_REQUEST);
        let probe = race_with_fault("latereq", delay, false).await;
        assert!(!probe.overlapped(), "two holders");
        assert_eq!(probe.order(), ["b", "a"]);
        assert_strictly_increasing(&probe.tokens());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_request_delayed_before_the_write_behind_a_holder() {
    bounded(async move {
        // A's transaction arrives after B took the next ticket: it must fail and A must queue behind
        // B, never insert a lower ticket.
        let delay = Fault::DelayRequest(LATE_REQUEST);
        let probe = race_with_fault("latereqh", delay, true).await;
        assert!(!probe.overlapped(), "two holders");
        assert_eq!(probe.order(), ["h", "b", "a"]);
        assert_strictly_increasing(&probe.tokens());
    })
    .await;
}

/// Lost answers of one enqueue: as many as the SDK makes attempts (standard retry mode, 3), so
/// the locker's own retry is exercised too, not only the SDK's.
const LOST_ANSWERS: u32 = 3;

#[tokio::test]
async fn a_seat_take_whose_response_is_lost_is_retried_idempotently() {
    bounded(async move {
        // The seat take has no ClientRequestToken: a retry's condition fails on our own seat, which
        // must be recognised as ours (same owner and rvn), not taken for a holder ahead.
        let env = Env::new("ambigseat").await;
        let (locker, proxy) = env.proxied_locker().await;
        let lost = u64::from(LOST_ANSWERS);
        proxy.add_rule(on_seat_take(Fault::DropResponse).times(LOST_ANSWERS));
        let g = locker.acquire("k", &fast()).await.unwrap();
        assert_eq!(proxy.faults_applied(), lost, "{:?}", proxy.counts());
        assert!(proxy.count("UpdateItem") > lost, "{:?}", proxy.counts());
        assert_eq!(proxy.count("TransactWriteItems"), 0, "{:?}", proxy.counts());
        assert_seated_once(&env, &g).await;
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
        assert_free(&env, "1").await;
    })
    .await;
}

#[tokio::test]
async fn an_enqueue_whose_response_is_lost_is_retried_idempotently() {
    bounded(async move {
        // Behind a holder the enqueue is the transaction: its retries (same ClientRequestToken, and
        // our row recognised as ours) must not write a second row or take a second ticket.
        let env = Env::new("ambig").await;
        let h = holder(&env).await;
        let (locker, proxy) = env.proxied_locker().await;
        let lost = u64::from(LOST_ANSWERS);
        proxy.add_rule(on_transaction(Fault::DropResponse).times(LOST_ANSWERS));
        let g = acquire_behind(&env, h, &locker).await;
        assert_eq!(proxy.faults_applied(), lost, "{:?}", proxy.counts());
        assert!(
            proxy.count("TransactWriteItems") > lost,
            "{:?}",
            proxy.counts()
        );
        let items = env.items("k").await;
        assert_eq!(queue_rows(&items), 1, "a retried enqueue wrote two rows");
        assert_eq!(counter(&items), "2", "a retried enqueue took two tickets");
        assert_eq!(seat(&items), None);
        assert_eq!(g.token(), 2);
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
        assert_free(&env, "2").await;
    })
    .await;
}

#[tokio::test]
async fn duplicated_seat_take_writes_once() {
    bounded(async move {
        let env = Env::new("dupseat").await;
        let (locker, proxy) = env.proxied_locker().await;
        proxy.add_rule(on_seat_take(Fault::Duplicate).times(1));
        let g = locker.acquire("k", &fast()).await.unwrap();
        assert_eq!(proxy.faults_applied(), 1, "{:?}", proxy.counts());
        assert_seated_once(&env, &g).await;
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
        assert_free(&env, "1").await;
    })
    .await;
}

#[tokio::test]
async fn duplicated_enqueue_writes_once() {
    bounded(async move {
        let env = Env::new("dup").await;
        let h = holder(&env).await;
        let (locker, proxy) = env.proxied_locker().await;
        proxy.add_rule(on_transaction(Fault::Duplicate).times(1));
        let g = acquire_behind(&env, h, &locker).await;
        assert_eq!(proxy.faults_applied(), 1, "{:?}", proxy.counts());
        let items = env.items("k").await;
        assert_eq!((queue_rows(&items), counter(&items)), (1, "2".to_string()));
        assert_eq!(g.token(), 2);
        g.release().await.unwrap();
    })
    .await;
}

/// The release of the seat (vacating it) or of a row (deleting it).
fn on_release(fault: Fault, seat: bool) -> Rule {
    if seat {
        Rule::new(fault).on("UpdateItem").body_contains(VACATE)
    } else {
        Rule::new(fault).on("DeleteItem")
    }
}

/// Drops the answers of three heartbeats and of the release of `g` (held through `proxy`, from
/// the seat or from a row).
async fn drop_heartbeats_and_release(g: LockGuard, seat: bool, proxy: &FaultProxy) {
    let release = on_release(Fault::DropResponse, seat);
    let heartbeats = Rule::new(Fault::DropResponse)
        .on("UpdateItem")
        .body_contains(HEARTBEAT);
    proxy.add_rule(heartbeats.times(3));
    tokio::time::sleep(fast().heartbeat.unwrap() * 5).await;
    assert_eq!(proxy.faults_applied(), 3, "{:?}", proxy.counts());
    assert!(
        !g.is_lost(),
        "an ambiguous heartbeat was taken for a lost lock"
    );
    proxy.add_rule(release.times(1));
    assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(proxy.faults_applied(), 4, "{:?}", proxy.counts());
}

#[tokio::test]
async fn lost_heartbeat_and_release_responses_are_not_losses() {
    bounded(async move {
        let env = Env::new("ambighb").await;
        let (locker, proxy) = env.proxied_locker().await;
        let g = locker.acquire("k", &fast()).await.unwrap();
        assert_seated_once(&env, &g).await;
        drop_heartbeats_and_release(g, SEAT, &proxy).await;
        assert_free(&env, "1").await;
    })
    .await;
}

#[tokio::test]
async fn lost_heartbeat_and_release_responses_of_a_row_are_not_losses() {
    bounded(async move {
        let env = Env::new("ambighbrow").await;
        let h = holder(&env).await;
        let (locker, proxy) = env.proxied_locker().await;
        let g = acquire_behind(&env, h, &locker).await;
        assert_eq!(g.token(), 2);
        assert_eq!(queue_rows(&env.items("k").await), 1);
        drop_heartbeats_and_release(g, ROW, &proxy).await;
        assert_free(&env, "2").await;
    })
    .await;
}

/// Throttles `g`'s heartbeats and fails (5xx) its release (held through `proxy`, from the seat
/// or from a row), and checks that they were retried.
async fn fail_heartbeats_and_release(g: LockGuard, seat: bool, proxy: &FaultProxy) {
    let release = on_release(Fault::ServerError, seat);
    let before = proxy.faults_applied();
    proxy.add_rule(
        Rule::new(Fault::Throttle)
            .on("UpdateItem")
            .body_contains(HEARTBEAT)
            .times(2),
    );
    proxy.add_rule(release.times(2));
    tokio::time::sleep(fast().heartbeat.unwrap() * 3).await;
    assert!(!g.is_lost());
    assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(proxy.faults_applied() - before, 4, "{:?}", proxy.counts());
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried() {
    bounded(async move {
        let env = Env::new("throttle").await;
        let (locker, proxy) = env.proxied_locker().await;
        proxy.add_rule(Rule::new(Fault::Throttle).on("Query").times(4));
        proxy.add_rule(on_seat_take(Fault::ServerError).times(4));
        let g = locker.acquire("k", &steady()).await.unwrap();
        assert_eq!(proxy.faults_applied(), 8, "{:?}", proxy.counts());
        assert_seated_once(&env, &g).await;
        fail_heartbeats_and_release(g, SEAT, &proxy).await;
        assert_free(&env, "1").await;
    })
    .await;
}

#[tokio::test]
async fn throttling_and_server_errors_of_a_waiter_are_retried() {
    bounded(async move {
        let env = Env::new("throttlew").await;
        let h = holder(&env).await;
        let (locker, proxy) = env.proxied_locker().await;
        proxy.add_rule(Rule::new(Fault::Throttle).on("Query").times(4));
        proxy.add_rule(on_transaction(Fault::ServerError).times(4));
        let g = acquire_behind(&env, h, &locker).await;
        assert_eq!(proxy.faults_applied(), 8, "{:?}", proxy.counts());
        assert_eq!(g.token(), 2);
        assert_eq!(queue_rows(&env.items("k").await), 1);
        fail_heartbeats_and_release(g, ROW, &proxy).await;
        assert_free(&env, "2").await;
    })
    .await;
}

#[tokio::test]
async fn throttling_beyond_the_budget_is_a_clear_error() {
    bounded(async move {
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
    })
    .await;
}
