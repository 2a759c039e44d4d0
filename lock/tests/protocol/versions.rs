//! The protocol's version on the table (issue 25): a key whose counter says a newer protocol than
//! this build speaks is refused by the library, left alone by the sweeper, and nothing at all is
//! written to it (`run` and `status`: `cli/tests/cli/versions.rs`; the Lambda gate:
//! `lambda/tests/versions.rs`).
//!
//! The newer key is written the way a protocol 2 that keeps its holder under other attribute
//! names would write it: a build blind to the version would see an empty seat and take the key
//! beside that holder.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::schema::seed;
use flightlock::{Error, LockOptions, SweepOptions, Sweeper, Wait, PROTOCOL};

use crate::common::*;

const NEWER: u32 = PROTOCOL + 1;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn is_too_new(e: &Error) -> bool {
    matches!(e, Error::ProtocolTooNew { table, speaks, .. } if *table == NEWER && *speaks == PROTOCOL)
}

#[tokio::test]
async fn the_library_is_refused_in_every_wait_mode_and_writes_nothing() {
    bounded(async move {
        let env = Env::new("protolib").await;
        env.put(seed::newer_key("k", now_ms())).await;
        let before = env.items_by_sk("k").await;
        let locker = env.locker().await;
        for wait in [Wait::NoWait, Wait::For(Duration::from_secs(3))] {
            let opts = LockOptions { wait, ..fast() };
            let err = locker.acquire("k", &opts).await.unwrap_err();
            assert!(is_too_new(&err), "{err}");
        }
        assert_eq!(
            env.items_by_sk("k").await,
            before,
            "the library wrote to the key"
        );
    })
    .await;
}

/// A locker that released the key itself takes the seat again without reading (its hint): the
/// seat's write alone must refuse a key switched since.
#[tokio::test]
async fn a_hint_is_refused_by_the_seats_own_condition() {
    bounded(async move {
        let env = Env::new("protohint").await;
        let locker = env.locker().await;
        let g = locker.acquire("k", &fast()).await.unwrap();
        g.release().await.unwrap();
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", s("k"))
            .key("sk", s("counter"))
            .update_expression("SET #p = :p")
            .expression_attribute_names("#p", "protocol")
            .expression_attribute_values(":p", n(NEWER))
            .send()
            .await
            .unwrap();
        let before = env.items_by_sk("k").await;
        let err = locker.acquire("k", &fast()).await.unwrap_err();
        assert!(is_too_new(&err), "{err}");
        assert_eq!(
            env.items_by_sk("k").await,
            before,
            "the hint wrote to the key"
        );
    })
    .await;
}

/// A holder and a waiter of this build on a key that is switched under them: the waiter fails
/// closed at its next look (removing only its own row), the holder's next heartbeat of the seat
/// is refused and it learns it lost the key.
#[tokio::test]
async fn a_switch_under_a_holder_and_a_waiter_fails_both_closed() {
    bounded(async move {
        let env = Env::new("protoswitch").await;
        let (a, b) = (env.locker().await, env.locker().await);
        let held = a.acquire("k", &fast()).await.unwrap();
        let waiting = tokio::spawn(async move {
            let opts = LockOptions {
                wait: Wait::For(Duration::from_secs(20)),
                ..fast()
            };
            b.acquire("k", &opts).await.map(|g| g.token())
        });
        until_queue_len(&env, "k", 2).await;
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", s("k"))
            .key("sk", s("counter"))
            .update_expression("SET #p = :p")
            .expression_attribute_names("#p", "protocol")
            .expression_attribute_values(":p", n(NEWER))
            .send()
            .await
            .unwrap();
        // Its next look (within a poll) refuses it; its wait (20 s) is only the backstop.
        let err = env
            .within(
                "k",
                Duration::from_secs(10),
                "the waiter's refusal",
                waiting,
            )
            .await
            .unwrap()
            .unwrap_err();
        assert!(is_too_new(&err), "{err}");
        // The holder's next heartbeat (every 300 ms) is refused: lost well within its lease (1.5 s).
        // A seat heartbeat that ignored the version would never be refused: fail, do not wait.
        let reason = env.lost_within(&held, Duration::from_secs(5)).await;
        assert_eq!(reason, flightlock::LostReason::ProtocolTooNew);
        // Only the holder's seat is left (this build cannot release it: it is passed over by the
        // newer protocol's participants once its lease ends); the waiter removed its own row.
        let left = env.items_by_sk("k").await;
        assert_eq!(left.keys().collect::<Vec<_>>(), ["counter"], "{left:#?}");
    })
    .await;
}

#[tokio::test]
async fn the_sweeper_leaves_a_key_on_a_newer_protocol_alone_and_reports_it() {
    bounded(async move {
        let env = Env::new("protosweep").await;
        env.put(seed::newer_key("new", now_ms())).await;
        // The newer key's seat is dead too: nothing of it may be removed.
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", s("new"))
            .key("sk", s("counter"))
            .update_expression("SET #o = :o, #t = :t, #u = :u, #l = :l, #r = :r")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_names("#t", "ticket")
            .expression_attribute_names("#u", "leaseUntilMs")
            .expression_attribute_names("#l", "leaseMs")
            .expression_attribute_names("#r", "rvn")
            .expression_attribute_values(":o", s("v2-seat"))
            .expression_attribute_values(":t", n(7))
            .expression_attribute_values(":u", n(now_ms() - 3_600_000))
            .expression_attribute_values(":l", n(20_000))
            .expression_attribute_values(":r", s("r7"))
            .send()
            .await
            .unwrap();
        // A key of this protocol with a dead row: the sweep still does its work there.
        let dead = now_ms() - 3_600_000;
        for item in [
            seed::counter("old", 3),
            seed::row("old", 3, "gone", "r3", dead),
        ] {
            env.client
                .put_item()
                .table_name(&env.table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
        let before = env.items_by_sk("new").await;
        let sweeper = Sweeper::new(flightlock_testkit::client(&env.endpoint).await, &env.table);
        let summary = sweeper.sweep(&SweepOptions::default()).await.unwrap();
        assert_eq!(summary.deleted, 1, "{summary:#?}");
        assert_eq!(summary.newer_protocol, 2, "{summary:#?}");
        assert_eq!(summary.newer_protocol_keys, ["new"], "{summary:#?}");
        assert_eq!(summary.errors, 0, "{summary:#?}");
        assert_eq!(
            env.items_by_sk("new").await,
            before,
            "the sweeper wrote to the key"
        );
        assert_eq!(
            env.items_by_sk("old").await.len(),
            1,
            "the old key's dead row stays"
        );
    })
    .await;
}

/// A row written under a newer protocol (every row does from protocol 2 on) is not judged by
/// this build, even on a counter it can read: a stale-looking row of a newer protocol may be
/// alive by that protocol's rules.
#[tokio::test]
async fn a_row_of_a_newer_protocol_is_not_judged() {
    bounded(async move {
        let env = Env::new("protorow").await;
        let mut row = seed::row("k", 4, "v2-waiter", "r4", now_ms() - 3_600_000);
        row.insert("protocol".to_owned(), n(NEWER));
        for item in [seed::counter("k", 4), row] {
            env.client
                .put_item()
                .table_name(&env.table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
        let before = env.items_by_sk("k").await;
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..fast()
        };
        let err = env.locker().await.acquire("k", &opts).await.unwrap_err();
        assert!(is_too_new(&err), "{err}");
        assert_eq!(
            env.items_by_sk("k").await,
            before,
            "the stale-looking row was touched"
        );
    })
    .await;
}
