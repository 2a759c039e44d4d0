//! N at a time (issue 26) against a real local DynamoDB: at most N hold a key of N permits, a
//! free permit goes to the earliest waiter (FIFO across permits), busy names every holder, a key
//! has one number of permits (anyone configured with another is refused and writes nothing), a
//! dead holder's permit passes on, and the uncontended cycle still costs two requests.

use std::time::Duration;

use flightlock::{Error, LockOptions, Wait};

use crate::common::*;

fn permits(n: u32) -> LockOptions {
    LockOptions {
        permits: n,
        ..fast()
    }
}

#[tokio::test]
async fn three_permits_let_three_hold_and_the_fourth_waits_for_a_free_one() {
    bounded(async move {
        let env = Env::new("permits3").await;
        let probe = Probe::default();
        let mut lockers = Vec::new();
        for _ in 0..4 {
            lockers.push(env.locker().await);
        }
        let mut guards = Vec::new();
        for (i, l) in lockers[..3].iter().enumerate() {
            let g = l.acquire("k", &permits(3)).await.unwrap();
            probe.enter(&format!("h{i}"), g.token());
            guards.push(g);
        }
        assert_eq!(
            probe.max_inside.load(std::sync::atomic::Ordering::SeqCst),
            3
        );
        // The fourth: busy, naming the three holders in ticket order.
        let short = LockOptions {
            wait: Wait::For(Duration::from_millis(300)),
            ..permits(3)
        };
        let err = lockers[3].acquire("k", &short).await.unwrap_err();
        let Error::Busy {
            holders,
            permits: 3,
            ..
        } = &err
        else {
            panic!("expected busy with three permits, got {err}")
        };
        let tickets: Vec<u64> = holders.iter().map(|h| h.ticket).collect();
        let held: Vec<u64> = guards.iter().map(|g| g.token()).collect();
        assert_eq!(tickets, held, "{err}");
        for g in &guards {
            assert!(err.to_string().contains(&g.owner().to_string()), "{err}");
        }
        // A forever waiter is granted once one of the three releases, not before.
        let waiter = {
            let l = lockers[3].clone();
            tokio::spawn(async move { l.acquire("k", &permits(3)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished(), "granted a fourth permit");
        let released = guards.remove(1);
        let freed = released.token();
        released.release().await.unwrap();
        let fourth = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the free permit is passed on")
            .unwrap();
        assert!(fourth.token() > freed);
        let q = env.queue("k").await;
        let holding = q
            .iter()
            .filter(|e| e.state == flightlock::EntryState::Holding)
            .count();
        assert_eq!(holding, 3, "{q:#?}");
        fourth.release().await.unwrap();
        for g in guards {
            g.release().await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn a_free_permit_goes_to_the_earliest_waiter() {
    bounded(async move {
        let env = Env::new("permitsfifo").await;
        let a = env.locker().await.acquire("k", &permits(2)).await.unwrap();
        let b = env.locker().await.acquire("k", &permits(2)).await.unwrap();
        let probe = Probe::default();
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (l, probe) = (env.locker().await, probe.clone());
            waiters.push(tokio::spawn(async move {
                let g = l.acquire("k", &permits(2)).await.unwrap();
                probe.enter(&format!("w{i}"), g.token());
                tokio::time::sleep(Duration::from_millis(400)).await;
                probe.leave();
                g.release().await.unwrap();
            }));
            // Queued one after the other: tickets in this order (a, b, then the waiters so far).
            until_queue_len(&env, "k", 3 + i).await;
        }
        a.release().await.unwrap();
        // w0 is in before the second permit frees up, so w1 cannot enter first.
        until_entered(&probe, 1).await;
        b.release().await.unwrap();
        env.join_within(
            "k",
            Duration::from_secs(15),
            "three waiters in turn",
            waiters,
        )
        .await;
        assert_eq!(probe.order(), ["w0", "w1", "w2"]);
        let tokens = probe.tokens();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert!(probe.max_inside.load(std::sync::atomic::Ordering::SeqCst) <= 2);
    })
    .await;
}

#[tokio::test]
async fn a_key_has_one_number_of_permits_and_others_are_refused_writing_nothing() {
    bounded(async move {
        let env = Env::new("permitsagree").await;
        let g = env.locker().await.acquire("k3", &permits(3)).await.unwrap();
        g.release().await.unwrap();
        let before = env.items("k3").await;
        for (n, wait) in [
            (1, Wait::NoWait),
            (2, Wait::Forever),
            (4, Wait::For(Duration::from_secs(1))),
        ] {
            let opts = LockOptions { wait, ..permits(n) };
            let err = env.locker().await.acquire("k3", &opts).await.unwrap_err();
            match &err {
                Error::PermitsMismatch {
                    table: 3,
                    configured,
                    ..
                } if *configured == n => {}
                other => panic!("expected a mismatch of 3 and {n}, got {other}"),
            }
            let text = err.to_string();
            assert!(text.contains("allows 3") && text.contains(&format!("configured with {n}")));
            assert!(text.contains("flightlock permits"), "{text}");
        }
        assert_eq!(env.items("k3").await, before, "a refused participant wrote");
        // The other way round: a key of one permit refuses a participant of three.
        let one = env.locker().await.acquire("k1", &fast()).await.unwrap();
        let err = env
            .locker()
            .await
            .acquire("k1", &permits(3))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::PermitsMismatch {
                    table: 1,
                    configured: 3,
                    ..
                }
            ),
            "{err}"
        );
        one.release().await.unwrap();
        // The hint of a locker of three never writes on a key of one.
        let l = env.locker().await;
        l.acquire("k1", &fast())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let err = l.acquire("k1", &permits(3)).await.unwrap_err();
        assert!(err.is_permits_mismatch(), "{err}");
    })
    .await;
}

#[tokio::test]
async fn a_dead_holders_permit_passes_on() {
    bounded(async move {
        use aws_sdk_dynamodb::types::AttributeValue;
        let env = Env::new("permitsdead").await;
        let alive = env.locker().await.acquire("k", &permits(2)).await.unwrap();
        // A second holder died long ago: its row (protocol 2) is still there, and the counter was
        // last moved by its enqueue.
        let dead_ticket = alive.token() + 1;
        let mut row =
            flightlock::schema::seed::row("k", dead_ticket, "gone", "r1", now_ms() - 60_000);
        row.insert("protocol".into(), AttributeValue::N("2".into()));
        env.put(vec![row]).await;
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", AttributeValue::S("k".into()))
            .key("sk", AttributeValue::S("counter".into()))
            .update_expression("SET #last = :t, #by = :by")
            .expression_attribute_names("#last", "last")
            .expression_attribute_names("#by", "lastOwner")
            .expression_attribute_values(":t", AttributeValue::N(dead_ticket.to_string()))
            .expression_attribute_values(":by", AttributeValue::S(format!("gone:{dead_ticket}")))
            .send()
            .await
            .unwrap();
        // Both permits look taken, but one holder is dead: a `wait = 0` is granted at once, and the
        // dead row is gone.
        let opts = LockOptions {
            wait: Wait::NoWait,
            ..permits(2)
        };
        let g = env.locker().await.acquire("k", &opts).await.unwrap();
        assert!(g.token() > dead_ticket);
        let q = env.queue("k").await;
        assert!(q.iter().all(|e| e.ticket != dead_ticket), "{q:#?}");
        g.release().await.unwrap();
        alive.release().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn an_uncontended_cycle_costs_two_requests_with_three_permits() {
    bounded(async move {
        let env = Env::new("permitscost").await;
        let (locker, proxy) = env.proxied_locker().await;
        let opts = LockOptions {
            lease: Duration::from_secs(60),
            heartbeat: Some(Duration::from_secs(20)),
            ..permits(3)
        };
        // Another holder keeps a permit the whole time: fewer than three hold, nobody waits.
        let other = env.locker().await.acquire("k", &opts).await.unwrap();
        locker
            .acquire("k", &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let mut counts = Vec::new();
        for _ in 0..3 {
            proxy.reset_counts();
            locker
                .acquire("k", &opts)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            eprintln!(
                "requests per uncontended cycle, three permits, one other holder: {} {:?}",
                proxy.total(),
                proxy.counts()
            );
            counts.push(proxy.total());
        }
        assert_eq!(counts, [2, 2, 2]);
        other.release().await.unwrap();
    })
    .await;
}

/// Issue 36: a participant of another number meets a key whose permits are all held. A
/// `wait = 0` writes nothing there (it would be busy), so only its read can refuse it: it must
/// be refused (`PermitsMismatch`: exit 78, the Lambda error type), never answered busy, which
/// would turn a misconfiguration into a silent skip. Bounded and clock-free alike.
#[tokio::test]
async fn a_full_key_refuses_another_number_even_with_wait_zero() {
    bounded(async move {
    let env = Env::new("permitsfull").await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(env.locker().await.acquire("k", &permits(3)).await.unwrap());
    }
    // What a write would change (the holders' heartbeats change their leases meanwhile).
    let entries = || async {
        env.items("k")
            .await
            .iter()
            .map(|i| {
                let text = |name: &str| i.get(name).map(|v| format!("{v:?}"));
                (text("sk"), text("owner"), text("last"), text("lastOwner"))
            })
            .collect::<Vec<_>>()
    };
    let before = entries().await;
    for (n, clock_skew) in [
        (1, fast().clock_skew),
        (2, fast().clock_skew),
        (1, flightlock::ClockSkew::Unbounded),
        (2, flightlock::ClockSkew::Unbounded),
    ] {
        let opts = LockOptions {
            wait: Wait::NoWait,
            clock_skew,
            ..permits(n)
        };
        let err = env
            .within(
                "k",
                Duration::from_secs(10),
                "a wait = 0 of another number",
                env.locker().await.acquire("k", &opts),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::PermitsMismatch { table: 3, configured, .. } if configured == n),
            "{n} permit(s), {clock_skew:?}: {err}"
        );
    }
    assert_eq!(entries().await, before, "a refused participant wrote");
    for g in held {
        g.release().await.unwrap();
    }
    })
    .await;
}

/// Issue 36: "refused before it judges, removes or writes". A waiter of two permits queued
/// behind two live holders and eight rows that die while it waits; the key is raised to three
/// meanwhile. Its look reads its own row and seven dead ones (a page) before the page that
/// holds the counter: it reads the counter first, is refused, and removes nothing but its own
/// row (removing first, it would remove seven rows before the next page refused it).
#[tokio::test]
async fn a_look_refused_for_other_permits_removes_nothing_first() {
    bounded(async move {
        use aws_sdk_dynamodb::types::AttributeValue;
        let env = Env::new("permitslook").await;
        let live = now_ms() + 600_000;
        let dying = now_ms() + 1_500;
        let mut items = vec![flightlock::schema::seed::counter("k", 10)];
        items[0].insert("lastOwner".into(), AttributeValue::S("o10:10".into()));
        items[0].insert("protocol".into(), AttributeValue::N("2".into()));
        items[0].insert("permits".into(), AttributeValue::N("2".into()));
        for ticket in 1..=10 {
            let until = if ticket <= 2 { live } else { dying };
            let mut row =
                flightlock::schema::seed::row("k", ticket, &format!("o{ticket}"), "r", until);
            row.insert("protocol".into(), AttributeValue::N("2".into()));
            items.push(row);
        }
        env.put(items).await;
        let opts = LockOptions {
            wait: Wait::For(Duration::from_secs(8)),
            ..permits(2)
        };
        let locker = env.locker().await;
        let waiter =
            tokio::spawn(async move { locker.acquire("k", &opts).await.map(|g| g.token()) });
        until_queue_len(&env, "k", 11).await;
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", AttributeValue::S("k".into()))
            .key("sk", AttributeValue::S("counter".into()))
            .update_expression("SET #p = :p")
            .expression_attribute_names("#p", "permits")
            .expression_attribute_values(":p", AttributeValue::N("3".into()))
            .send()
            .await
            .unwrap();
        let answer = env
            .within("k", Duration::from_secs(15), "the waiter's answer", waiter)
            .await
            .unwrap();
        let rows: Vec<String> = env
            .items("k")
            .await
            .iter()
            .filter_map(|i| i["sk"].as_s().ok().cloned())
            .filter(|sk| sk.starts_with("q#"))
            .collect();
        assert!(
            matches!(
                answer,
                Err(Error::PermitsMismatch {
                    table: 3,
                    configured: 2,
                    ..
                })
            ),
            "{answer:?}; rows left: {rows:?}"
        );
        assert_eq!(rows.len(), 10, "removed before it was refused: {rows:?}");
    })
    .await;
}

/// Issue 36: a holder of one permit on the seat, its key switched by hand to two permits (the
/// seat was taken, so `flightlock permits --set` would have waited). Its next heartbeat is
/// refused (`PermitsMismatch`): it loses the lock then, with that reason, not a lease later as
/// an expired lease.
#[tokio::test]
async fn a_seat_switched_to_other_permits_is_lost_at_once_with_its_reason() {
    bounded(async move {
        use aws_sdk_dynamodb::types::AttributeValue;
        let env = Env::new("permitsseat").await;
        let opts = LockOptions {
            lease: Duration::from_secs(20),
            heartbeat: Some(Duration::from_millis(300)),
            ..fast()
        };
        let held = env.locker().await.acquire("k", &opts).await.unwrap();
        env.client
            .update_item()
            .table_name(&env.table)
            .key("pk", AttributeValue::S("k".into()))
            .key("sk", AttributeValue::S("counter".into()))
            .update_expression("SET #proto = :two, #p = :two")
            .expression_attribute_names("#proto", "protocol")
            .expression_attribute_names("#p", "permits")
            .expression_attribute_values(":two", AttributeValue::N("2".into()))
            .send()
            .await
            .unwrap();
        let switched = std::time::Instant::now();
        // The next heartbeat, well within the lease (20 s): an expired lease would come after it.
        let reason = env.lost_within(&held, Duration::from_secs(5)).await;
        assert_eq!(
            reason,
            flightlock::LostReason::PermitsMismatch,
            "after {:?}",
            switched.elapsed()
        );
        assert!(reason.to_string().contains("permits"), "{reason}");
    })
    .await;
}
