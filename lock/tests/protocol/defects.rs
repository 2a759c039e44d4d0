//! One test per fault-path defect that the protocol once had (issue 7), each against DynamoDB
//! Local through the fault proxy where the fault is on the wire. Each failed before its fix.
//! The schedules a proxy cannot make (a heartbeat landing after a newer one with the answer lost,
//! operator changes in the middle of an enqueue, TTL at any moment) are explored by the
//! simulation (`lock/src/sim`), which also shows each of these fixes undone being caught.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::{ClockSkew, Error, LockGuard, LockOptions, Locker, Wait};
use flightlock_testkit::{Fault, Rule};
use tokio::time::Instant;

use crate::common::*;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

async fn delete_counter(env: &Env, key: &str) {
    env.client
        .delete_item()
        .table_name(&env.table)
        .key("pk", s(key))
        .key("sk", s("counter"))
        .send()
        .await
        .unwrap();
}

async fn set_counter(env: &Env, key: &str, last: u64) {
    env.client
        .put_item()
        .table_name(&env.table)
        .item("pk", s(key))
        .item("sk", s("counter"))
        .item("last", AttributeValue::N(last.to_string()))
        .send()
        .await
        .unwrap();
}

fn sk(item: &HashMap<String, AttributeValue>) -> &str {
    item.get("sk")
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str)
}

/// The item of key `k` holding `owner`'s queue entry: its row `q#<ticket>`, or the counter when
/// the entry is the counter's seat.
async fn entry_item(env: &Env, owner: &str) -> HashMap<String, AttributeValue> {
    let items = env.items("k").await;
    items
        .iter()
        .find(|i| {
            i.get("owner")
                .and_then(|v| v.as_s().ok())
                .map(String::as_str)
                == Some(owner)
        })
        .cloned()
        .unwrap_or_else(|| panic!("no entry of {owner} in {items:?}"))
}

/// `locker` acquires `k` while `first` holds it, so it queues a row `q#<ticket>` with the
/// enqueue transaction (an uncontended acquisition takes the counter's seat instead); `first` is
/// released once the row is in, and the returned guard holds the key through its row.
async fn acquire_behind(
    env: &Env,
    first: LockGuard,
    locker: Locker,
    opts: LockOptions,
) -> LockGuard {
    assert_eq!(
        sk(&entry_item(env, first.owner()).await),
        "counter",
        "the first holder is not seated"
    );
    let waiter = tokio::spawn(async move { locker.acquire("k", &opts).await });
    until_queue_len(env, "k", 2).await;
    first.release().await.unwrap();
    let g = env
        .within(
            "k",
            Duration::from_secs(10),
            "the waiter behind a release",
            waiter,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        sk(&entry_item(env, g.owner()).await),
        format!("q#{:020}", g.token())
    );
    g
}

fn short_wait() -> LockOptions {
    LockOptions {
        wait: Wait::For(Duration::from_millis(700)),
        ..fast()
    }
}

/// Defect 1: an operator deletes the counter while the key is held. A new contender used to read
/// no counter (`last = 0`), take ticket 1, see no row below it and be granted beside the holder.
/// The holder holds through a queue row (it waited behind another holder): deleting the counter
/// while the *seat* holds the key deletes the holder's entry itself, an operator mistake like
/// deleting a live row, which no protocol survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_counter_never_grants_past_the_holder() {
    bounded(async move {
        let env = Env::new("ctrdel").await;
        let first = env.locker().await.acquire("k", &fast()).await.unwrap();
        let a = acquire_behind(&env, first, env.locker().await, fast()).await;
        // Some history, so the holder's ticket is above 1: a contender that started again from
        // `last = 0` would take a ticket below the holder's row and see nothing ahead of it.
        assert!(a.token() > 1, "token {}", a.token());
        delete_counter(&env, "k").await;
        let b = env.locker().await;
        let err = b.acquire("k", &short_wait()).await.unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(!a.is_lost());
        let held = a.token();
        a.release().await.unwrap();
        let g = b.acquire("k", &short_wait()).await.unwrap();
        assert!(g.token() > held, "token {} after {held}", g.token());
        g.release().await.unwrap();
    })
    .await;
}

/// Defect 1, the other way: the counter set back below the queue. A ticket that collides with a
/// queued row used to spin on a retryable error for the whole wait; now the contender reads again
/// and takes a ticket above every row. The holder holds through a queue row (it waited behind
/// another holder): setting the counter back by hand with a `PutItem` would otherwise overwrite
/// the seat, and there would be no row above the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_counter_takes_a_ticket_above_the_queue() {
    bounded(async move {
        let env = Env::new("ctrlow").await;
        let locker = env.locker().await;
        for _ in 0..3 {
            locker
                .acquire("k", &fast())
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        let first = env.locker().await.acquire("k", &fast()).await.unwrap();
        let holder = acquire_behind(&env, first, env.locker().await, fast()).await;
        let held = holder.token();
        set_counter(&env, "k", held - 1).await;
        let b = env.locker().await;
        let started = Instant::now();
        let err = b.acquire("k", &short_wait()).await.unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(!holder.is_lost());
        holder.release().await.unwrap();
        let g = b.acquire("k", &short_wait()).await.unwrap();
        assert!(g.token() > held, "token {} after {held}", g.token());
        g.release().await.unwrap();
    })
    .await;
}

/// Defect 3: an enqueue whose answers are lost three times (every SDK attempt) is retried by the
/// lock itself. It used to rebuild the row (new `rvn`, new lease) under the same
/// `ClientRequestToken`: DynamoDB refuses that with `IdempotentParameterMismatch`. One token, one
/// byte-identical request: the retry is answered from the first commit. The key is held, so the
/// acquisition queues a row with the transaction (an uncontended one takes the counter's seat,
/// with no transaction and no token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_enqueue_resends_the_same_request() {
    bounded(async move {
        let env = Env::new("sametoken").await;
        let first = env.locker().await.acquire("k", &fast()).await.unwrap();
        let ahead = first.token();
        let (a, proxy) = env.proxied_locker().await;
        proxy.add_rule(
            Rule::new(Fault::DropResponse)
                .on("TransactWriteItems")
                .times(3),
        );
        let g = acquire_behind(&env, first, a.clone(), fast()).await;
        assert_eq!(proxy.faults_applied(), 3);
        assert!(proxy.count("TransactWriteItems") >= 4);
        // The first commit's ticket: a retry that wrote again (or removed its own earlier row and
        // queued anew) would hold a later one.
        assert_eq!(g.token(), ahead + 1);
        let q = env.queue("k").await;
        assert_eq!(q.len(), 1, "{q:?}");
        assert_eq!(q[0].owner, g.owner());
        g.release().await.unwrap();
    })
    .await;
}

/// Defect 4: a heartbeat delayed past its attempt timeout lands after newer ones. It used to
/// write its older `leaseUntilMs` back over the newer lease; now its condition fails. The stored
/// lease must never go down while the holder holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_heartbeat_never_rolls_the_lease_back() {
    bounded(async move {
        let env = Env::new("hbroll").await;
        let proxy = flightlock_testkit::FaultProxy::start(&env.endpoint)
            .await
            .unwrap();
        let client = flightlock_testkit::client_with(&proxy.endpoint(), |b| {
            b.timeout_config(
                aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_millis(250))
                    .build(),
            )
        })
        .await;
        let a = flightlock::Locker::new(client, &env.table);
        // Uncontended, the holder is in the counter's seat: its heartbeats are `UpdateItem`s of the
        // counter. The rule is added once the seat is taken (taking it is an `UpdateItem` too), so
        // the first heartbeat and its two SDK retries arrive 1.2 s late, after newer heartbeats.
        let g = a.acquire("k", &fast()).await.unwrap();
        proxy.add_rule(
            Rule::new(Fault::DelayRequest(Duration::from_millis(1200)))
                .on("UpdateItem")
                .times(3),
        );
        let mut last = 0;
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let entry = entry_item(&env, g.owner()).await;
            assert_eq!(sk(&entry), "counter", "{entry:?}");
            let lease: i64 = entry["leaseUntilMs"].as_n().unwrap().parse().unwrap();
            assert!(lease >= last, "lease rolled back from {last} to {lease}");
            last = lease;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            proxy.faults_applied(),
            3,
            "the delayed heartbeats never ran"
        );
        assert!(!g.is_lost(), "the holder lost its lock");
        g.release().await.unwrap();
    })
    .await;
}

/// Defect 5: in clock-free mode, `wait = 0` used to meet every row for the first time and call it
/// live, so a crashed holder made every skip-mode call skip until TTL. Now a row is watched until
/// it changes (busy) or stays unchanged for its lease (passed over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_free_skip_passes_a_dead_holder_over() {
    bounded(async move {
        let env = Env::new("cfskip").await;
        let clock_free = LockOptions {
            clock_skew: ClockSkew::Unbounded,
            ttl_grace: Duration::from_secs(3600),
            ..fast()
        };
        let (dead, proxy) = env.proxied_locker().await;
        let g = dead.acquire("k", &clock_free).await.unwrap();
        proxy.add_rule(Rule::new(Fault::ServerError)); // the holder is cut off: it never beats again
        let skip = LockOptions {
            wait: Wait::NoWait,
            ..clock_free.clone()
        };
        let b = env.locker().await;
        let started = Instant::now();
        let taken = b.acquire("k", &skip).await.unwrap();
        let took = started.elapsed();
        assert!(took >= fast().lease, "passed over after only {took:?}");
        assert!(g.is_lost(), "the cut-off holder still believes it holds");
        // A live holder, on the other hand, is reported busy (once it is seen to change).
        let c = env.locker().await;
        let started = Instant::now();
        let err = c.acquire("k", &skip).await.unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(started.elapsed() < fast().lease, "{:?}", started.elapsed());
        taken.release().await.unwrap();
        drop(g);
        proxy.clear_rules();
        dead.flush().await;
    })
    .await;
}

/// Defect 6: an acquisition dropped while its enqueue transaction is in flight (a timeout, a
/// signal) used to leave a row behind that nobody heartbeats: every later caller waited a lease.
/// First behind a holder (the enqueue transaction, a queue row), then on a free key (the
/// counter's seat, an `UpdateItem`): neither leaves an entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_enqueue_leaves_no_row() {
    bounded(async move {
        let env = Env::new("cancelenq").await;
        let skip = LockOptions {
            wait: Wait::NoWait,
            ..fast()
        };
        let (a, proxy) = env.proxied_locker().await;
        // Queued behind a holder: the row is written, its answer is late, the caller gives up.
        let holder = env.locker().await.acquire("k", &fast()).await.unwrap();
        proxy.add_rule(
            Rule::new(Fault::DelayResponse(Duration::from_millis(800)))
                .on("TransactWriteItems")
                .times(1),
        );
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), a.acquire("k", &fast())).await;
        assert!(cancelled.is_err(), "the acquisition was not cancelled");
        assert_eq!(
            proxy.faults_applied(),
            1,
            "no enqueue transaction was in flight"
        );
        a.flush().await;
        let q = env.queue("k").await;
        assert_eq!(q.len(), 1, "left behind: {q:?}");
        assert_eq!(q[0].owner, holder.owner(), "{q:?}");
        // And the key is free as soon as the holder releases: one that does not wait gets it (a
        // row left behind would stay live for a lease and make it busy).
        holder.release().await.unwrap();
        let g = env.locker().await.acquire("k", &skip).await.unwrap();
        g.release().await.unwrap();

        // On a free key: the seat is taken, its answer is late, the caller gives up.
        proxy.clear_rules();
        proxy.add_rule(
            Rule::new(Fault::DelayResponse(Duration::from_millis(800)))
                .on("UpdateItem")
                .times(1),
        );
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), a.acquire("k", &fast())).await;
        assert!(cancelled.is_err(), "the acquisition was not cancelled");
        assert_eq!(proxy.faults_applied(), 2, "no seat update was in flight");
        a.flush().await;
        let q = env.queue("k").await;
        assert!(q.is_empty(), "left behind: {q:?}");
        let counter = env
            .items("k")
            .await
            .into_iter()
            .find(|i| sk(i) == "counter")
            .unwrap();
        assert!(
            !counter.contains_key("owner"),
            "the seat is still taken: {counter:?}"
        );
        let g = env.locker().await.acquire("k", &skip).await.unwrap();
        g.release().await.unwrap();
    })
    .await;
}

/// Defect 7: a malformed row makes the key unusable; the error must say which row and how to
/// remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_row_is_named_with_the_way_out() {
    bounded(async move {
        let env = Env::new("malformed").await;
        env.client
            .put_item()
            .table_name(&env.table)
            .item("pk", s("k"))
            .item("sk", s("q#00000000000000000003"))
            .item("ticket", AttributeValue::N("3".into()))
            .item("owner", s("o"))
            .item("leaseUntilMs", s("soon"))
            .item("leaseMs", AttributeValue::N("1000".into()))
            .item("expiresAt", AttributeValue::N("4000000000".into()))
            .item("rvn", s("r"))
            .send()
            .await
            .unwrap();
        let err = env
            .locker()
            .await
            .acquire("k", &short_wait())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("q#00000000000000000003"), "{err}");
        assert!(err.contains("leaseUntilMs"), "{err}");
        assert!(err.contains("delete-item"), "{err}");
        // `flightlock status` shows the same: `cli/tests/cli/run.rs`.
    })
    .await;
}

/// Defect 2: clock-free mode was not clock-free for a *holder*: `expiresAt` and the sweeper's
/// cutoff come from the writer's wall clock, so a holder whose clock ran behind by more than the
/// sweeper's grace (10 min) or the TTL grace had its live row deleted, and a clock-free waiter was
/// then granted beside it. Clock-free rows now carry `clockFree` and get 24 h of grace. Both
/// kinds of entry are checked: the counter's seat (an uncontended holder: no `expiresAt` at all)
/// and a queue row (a holder that waited first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_free_holder_two_hours_behind_keeps_its_row() {
    bounded(async move {
        let env = Env::new("cfbehind").await;
        let clock_free = LockOptions {
            clock_skew: ClockSkew::Unbounded,
            ..fast()
        };
        let behind = || async {
            env.locker()
                .await
                .with_clock(std::sync::Arc::new(flightlock::SkewedClock {
                    offset_ms: -2 * 3_600_000,
                }))
        };
        let sweep = || async {
            flightlock::Sweeper::new(env.client.clone(), &env.table)
                .sweep(&flightlock::SweepOptions::default())
                .await
                .unwrap()
        };

        // In the seat. TTL: the counter carries no `expiresAt`, so TTL never removes the entry.
        let seated = behind().await.acquire("k", &clock_free).await.unwrap();
        let entry = entry_item(&env, seated.owner()).await;
        assert_eq!(sk(&entry), "counter", "{entry:?}");
        assert!(!entry.contains_key("expiresAt"), "{entry:?}");
        // The sweeper with its default 10-minute grace leaves the seat alone.
        let summary = sweep().await;
        assert_eq!(summary.deleted, 0, "{summary:?}");
        assert_eq!(summary.still_live, 1, "{summary:?}");
        assert_eq!(
            entry_item(&env, seated.owner()).await["owner"],
            entry["owner"]
        );

        // In a queue row (granted after waiting behind the seat).
        let holder = acquire_behind(&env, seated, behind().await, clock_free.clone()).await;
        // TTL: DynamoDB compares expiresAt with the true time; it must be far enough ahead.
        let row = entry_item(&env, holder.owner()).await;
        let expires: i64 = row["expiresAt"].as_n().unwrap().parse().unwrap();
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            expires > now_s + 20 * 3600,
            "expiresAt only {} s ahead",
            expires - now_s
        );
        // The sweeper with its default 10-minute grace leaves the row alone.
        let summary = sweep().await;
        assert_eq!(summary.deleted, 0, "{summary:?}");
        assert_eq!(summary.still_live, 1, "{summary:?}");
        // And a clock-free waiter is not granted while the holder lives.
        let waiter = env.locker().await;
        let err = waiter
            .acquire(
                "k",
                &LockOptions {
                    wait: Wait::For(fast().lease * 2),
                    ..clock_free.clone()
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(!holder.is_lost());
        holder.release().await.unwrap();
    })
    .await;
}
