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
}

#[tokio::test]
async fn a_free_permit_goes_to_the_earliest_waiter() {
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
        // Queued one after the other: tickets in this order.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    a.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    b.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(probe.order(), ["w0", "w1", "w2"]);
    let tokens = probe.tokens();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(probe.max_inside.load(std::sync::atomic::Ordering::SeqCst) <= 2);
}

#[tokio::test]
async fn a_key_has_one_number_of_permits_and_others_are_refused_writing_nothing() {
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
}

#[tokio::test]
async fn a_dead_holders_permit_passes_on() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let env = Env::new("permitsdead").await;
    let alive = env.locker().await.acquire("k", &permits(2)).await.unwrap();
    // A second holder died long ago: its row (protocol 2) is still there, and the counter was
    // last moved by its enqueue.
    let dead_ticket = alive.token() + 1;
    let mut row = flightlock::schema::seed::row("k", dead_ticket, "gone", "r1", now_ms() - 60_000);
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
}

#[tokio::test]
async fn an_uncontended_cycle_costs_two_requests_with_three_permits() {
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
}
