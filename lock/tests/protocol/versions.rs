//! The protocol's version on the table (issue 25): a key whose counter says a newer protocol than
//! this build speaks is refused by `run`, the library and `status`, left alone by the sweeper, and
//! nothing at all is written to it (the Lambda gate: `lambda/tests/versions.rs`).
//!
//! The newer key is written the way a protocol 2 that keeps its holder under other attribute
//! names would write it: a build blind to the version would see an empty seat and take the key
//! beside that holder.

use std::collections::{BTreeMap, HashMap};
use std::process::Output;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use flightlock::schema::seed;
use flightlock::{Error, LockOptions, SweepOptions, Sweeper, Wait, PROTOCOL};

use crate::cli::cli;
use crate::common::*;

const NEWER: u32 = PROTOCOL + 1;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Writes `key` as a newer protocol would: a counter at protocol [`NEWER`] whose holder sits
/// under attribute names this build does not know (its `owner` attribute is absent, so a
/// version-blind build sees an empty seat), and a dead queue row written under [`NEWER`] (which
/// a version-blind sweeper would remove).
async fn put_newer_key(env: &Env, key: &str) {
    let live_until = now_ms() + 600_000;
    let counter = HashMap::from([
        ("pk".to_owned(), s(key)),
        ("sk".to_owned(), s("counter")),
        ("last".to_owned(), n(7)),
        ("lastOwner".to_owned(), s("v2-holder:7")),
        ("protocol".to_owned(), n(NEWER)),
        ("holderOwner".to_owned(), s("v2-holder")),
        ("holderTicket".to_owned(), n(7)),
        ("holderLeaseUntilMs".to_owned(), n(live_until)),
    ]);
    let mut dead_row = seed::row(key, 6, "v2-gone", "r6", now_ms() - 3_600_000);
    dead_row.insert("protocol".to_owned(), n(NEWER));
    env.put(vec![counter, dead_row]).await;
}

/// The key's items, comparable: attribute name to value, by sort key.
async fn items(env: &Env, key: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    env.items(key)
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

fn is_too_new(e: &Error) -> bool {
    matches!(e, Error::ProtocolTooNew { table, speaks, .. } if *table == NEWER && *speaks == PROTOCOL)
}

async fn output(c: std::process::Command) -> Output {
    output_within(c, Duration::from_secs(60), "a flightlock command").await
}

#[tokio::test]
async fn run_refuses_a_key_on_a_newer_protocol_with_its_own_exit_status() {
    let env = Env::new("protorun").await;
    put_newer_key(&env, "job").await;
    let before = items(&env, "job").await;
    let marker = std::env::temp_dir().join(format!("flightlock-protorun-{}", env.table));
    for wait in ["0", "3s"] {
        let mut c = cli(&env);
        c.args(["run", "--key", "job", "--wait", wait, "--", "touch"])
            .arg(&marker);
        let out = output(c).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(76), "wait {wait}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        for said in [
            format!("protocol {NEWER}"),
            format!("protocol {PROTOCOL}"),
            "upgrades.md".to_owned(),
        ] {
            assert!(stderr.contains(&said), "{said:?} not in {stderr}");
        }
        assert!(!marker.exists(), "the command ran on a key it cannot read");
    }
    assert_eq!(items(&env, "job").await, before, "run wrote to the key");
}

#[tokio::test]
async fn status_reports_the_protocol() {
    let env = Env::new("protostatus").await;
    let locker = env.locker().await;
    locker
        .acquire("old", &fast())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    put_newer_key(&env, "new").await;
    let mut c = cli(&env);
    c.args(["status", "--key", "old", "--json"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // A key of one permit runs protocol 1 (issue 26), whatever this build speaks.
    assert_eq!(json["protocol"], 1);
    assert_eq!(json["speaks"], PROTOCOL);

    let mut c = cli(&env);
    c.args(["status", "--key", "new", "--json"]);
    let out = output(c).await;
    assert_eq!(out.status.code(), Some(76));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["protocol"], NEWER);
    assert_eq!(json["queue"], serde_json::Value::Null);
}

#[tokio::test]
async fn the_library_is_refused_in_every_wait_mode_and_writes_nothing() {
    let env = Env::new("protolib").await;
    put_newer_key(&env, "k").await;
    let before = items(&env, "k").await;
    let locker = env.locker().await;
    for wait in [Wait::NoWait, Wait::For(Duration::from_secs(3))] {
        let opts = LockOptions { wait, ..fast() };
        let err = locker.acquire("k", &opts).await.unwrap_err();
        assert!(is_too_new(&err), "{err}");
    }
    assert_eq!(
        items(&env, "k").await,
        before,
        "the library wrote to the key"
    );
}

/// A locker that released the key itself takes the seat again without reading (its hint): the
/// seat's write alone must refuse a key switched since.
#[tokio::test]
async fn a_hint_is_refused_by_the_seats_own_condition() {
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
    let before = items(&env, "k").await;
    let err = locker.acquire("k", &fast()).await.unwrap_err();
    assert!(is_too_new(&err), "{err}");
    assert_eq!(items(&env, "k").await, before, "the hint wrote to the key");
}

/// A holder and a waiter of this build on a key that is switched under them: the waiter fails
/// closed at its next look (removing only its own row), the holder's next heartbeat of the seat
/// is refused and it learns it lost the key.
#[tokio::test]
async fn a_switch_under_a_holder_and_a_waiter_fails_both_closed() {
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
    let left = items(&env, "k").await;
    assert_eq!(left.keys().collect::<Vec<_>>(), ["counter"], "{left:#?}");
}

#[tokio::test]
async fn the_sweeper_leaves_a_key_on_a_newer_protocol_alone_and_reports_it() {
    let env = Env::new("protosweep").await;
    put_newer_key(&env, "new").await;
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
    let before = items(&env, "new").await;
    let sweeper = Sweeper::new(flightlock_testkit::client(&env.endpoint).await, &env.table);
    let summary = sweeper.sweep(&SweepOptions::default()).await.unwrap();
    assert_eq!(summary.deleted, 1, "{summary:#?}");
    assert_eq!(summary.newer_protocol, 2, "{summary:#?}");
    assert_eq!(summary.newer_protocol_keys, ["new"], "{summary:#?}");
    assert_eq!(summary.errors, 0, "{summary:#?}");
    assert_eq!(
        items(&env, "new").await,
        before,
        "the sweeper wrote to the key"
    );
    assert_eq!(
        items(&env, "old").await.len(),
        1,
        "the old key's dead row stays"
    );
}

/// A row written under a newer protocol (every row does from protocol 2 on) is not judged by
/// this build, even on a counter it can read: a stale-looking row of a newer protocol may be
/// alive by that protocol's rules.
#[tokio::test]
async fn a_row_of_a_newer_protocol_is_not_judged() {
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
    let before = items(&env, "k").await;
    let opts = LockOptions {
        wait: Wait::NoWait,
        ..fast()
    };
    let err = env.locker().await.acquire("k", &opts).await.unwrap_err();
    assert!(is_too_new(&err), "{err}");
    assert_eq!(
        items(&env, "k").await,
        before,
        "the stale-looking row was touched"
    );
}
