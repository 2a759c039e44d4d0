//! Scripted schedules of issue 36 on keys of more than one permit, each driving real
//! [`Locker`]s against the model of the table, each with the defect it guards against planted to
//! show that the script reaches it.
//!
//! **A hint after a set-back** (`locker/attempt.rs`). N = 2: `b` holds ticket 2 (behind a seat
//! that has left); `p` is granted ticket 3 at once (one entry below) and releases it, keeping the
//! hint "3". An operator sets the counter back to 2 (an `UpdateItem` of `last` alone), or deletes
//! it and recreates it as `flightlock permits --set 2` does (at the highest ticket a row still
//! carries, 2). `c` reads, takes ticket 3 again and is granted beside `b`. `p`'s hint is refused
//! with the counter `c:3`: consistent, moved by an enqueue, standing at `p`'s own ticket. Taken
//! at its word ("nobody queued since my release"), it would grant `p` ticket 4 unread: `b`, `c`
//! and `p` hold a key of 2. A refused hint reads, and `p` is busy. With N = 3 and `d` granted
//! ticket 4 as well, the counter `d:4` is one ticket past `p`'s: no arithmetic on it can tell it
//! from a counter that never went back (where one entry, `d`, would have queued since), so no
//! bound is safe, and the hint reads there too.
//!
//! **A look refused for other permits removes nothing** (`locker/attempt.rs`). A waiter of 2 queued
//! behind two live holders and three rows that died; the key is switched to 3 permits. Its next
//! look reads its page (its own row and two dead ones) before the page with the counter: it must
//! read the counter before it removes the dead rows, and then be refused, removing only its own.
//!
//! **A seat's heartbeat refused for other permits is a loss at once** (`membership.rs`). A holder
//! of one permit on the seat; the key's counter is switched by hand to 2 permits. Its next
//! heartbeat is refused (`PermitsMismatch`): it loses the lock then, with that reason, not a
//! lease later as an expired lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::model::Table;
use super::scenario::EPOCH_MS;
use crate::mutant::{plant, Mutant};
use crate::options::{LockOptions, Wait};
use crate::schema::{self, seed, COUNTER_SK, SK};
use crate::storage::{Backend, Failure, Request, Response};
use crate::{Error, LockGuard, Locker, LostReason};

const KEY: &str = "k";

/// A change a script makes to the table by hand.
type ByHand = Box<dyn FnOnce(&mut Table) + Send>;

/// The model behind a lock, shared by every locker of a script; `after_enqueue` runs once, right
/// after the first row enqueue the table applies (the moment a script changes the key by hand).
#[derive(Clone)]
struct Direct {
    table: Arc<Mutex<Table>>,
    after_enqueue: Arc<Mutex<Option<ByHand>>>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Direct")
    }
}

impl Direct {
    fn new() -> Direct {
        Direct {
            table: Arc::new(Mutex::new(Table::new(Instant::now(), EPOCH_MS))),
            after_enqueue: Arc::default(),
        }
    }

    fn locker(&self) -> Locker {
        Locker::on(Arc::new(self.clone()), "scripted")
    }

    fn items(&self) -> Vec<crate::storage::Item> {
        self.table.lock().unwrap().partition(KEY)
    }

    /// The tickets of the key's queue rows (not the seat).
    fn rows(&self) -> Vec<u64> {
        let snap = schema::Snapshot::from_items(KEY, &self.items()).unwrap();
        snap.rows
            .iter()
            .filter(|r| !r.seat)
            .map(|r| r.ticket)
            .collect()
    }

    /// Changes the key's counter item by hand (an operator's `UpdateItem`).
    fn edit_counter(table: &mut Table, edit: impl FnOnce(&mut crate::storage::Item)) {
        let mut counter = table
            .partition(KEY)
            .into_iter()
            .find(|i| i.get(SK).and_then(|v| v.as_s().ok()) == Some(&COUNTER_SK.to_owned()))
            .expect("the key has a counter");
        edit(&mut counter);
        table.insert(counter, Instant::now());
    }
}

impl Backend for Direct {
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        let mut table = self.table.lock().unwrap();
        let result = table.apply(&request, Instant::now());
        if matches!(&request, Request::Enqueue(e) if !e.seat) && result.is_ok() {
            if let Some(then) = self.after_enqueue.lock().unwrap().take() {
                then(&mut table);
            }
        }
        Box::pin(async move { result })
    }
}

fn permits(n: u32, wait: Wait) -> LockOptions {
    LockOptions {
        wait,
        permits: n,
        lease: Duration::from_secs(20),
        ..LockOptions::default()
    }
}

/// How the operator takes the counter back under `p`'s hint.
#[derive(Debug, Clone, Copy)]
enum Back {
    /// `UpdateItem` of `last` alone, to the highest ticket a row still carries.
    SetBack,
    /// Deleted, then created as `flightlock permits --set N` creates a missing counter.
    Recreate,
}

/// The hint schedule on a key of `n` permits (2 or 3). Returns `p`'s answer and every guard
/// still believing it holds the key (`p`'s included, if granted).
async fn hint_after(n: u32, back: Back) -> (Result<u64, Error>, Vec<(&'static str, LockGuard)>) {
    let table = Direct::new();
    let forever = permits(n, Wait::Forever);
    // A seat first, so that `b` holds a row (deleting a counter would delete a seat's entry).
    let seat = table.locker().acquire(KEY, &forever).await.unwrap();
    let b = table.locker().acquire(KEY, &forever).await.unwrap();
    seat.release().await.unwrap();
    let p = table.locker();
    let held = p.acquire(KEY, &forever).await.unwrap();
    let hint = held.token();
    held.release().await.unwrap();
    let highest = *table.rows().iter().max().unwrap();
    assert_eq!((b.token(), hint, highest), (2, 3, 2));
    {
        let mut t = table.table.lock().unwrap();
        match back {
            Back::SetBack => t.operator_set_counter(KEY, highest, Instant::now()),
            Back::Recreate => {
                t.operator_delete(KEY, COUNTER_SK, Instant::now());
                let create = Request::CreateCounter {
                    key: KEY.into(),
                    last: highest,
                    owner: schema::created_by("operator", n),
                    protocol: crate::protocol::Speaks::Permits(n).protocol(),
                    permits: n,
                };
                t.apply(&create, Instant::now()).unwrap();
            }
        }
    }
    let mut holders = vec![("b", b)];
    let c = table.locker().acquire(KEY, &forever).await.unwrap();
    assert_eq!(
        c.token(),
        hint,
        "the counter went back: the ticket is issued again"
    );
    holders.push(("c", c));
    if n == 3 {
        holders.push(("d", table.locker().acquire(KEY, &forever).await.unwrap()));
    }
    let answer = p.acquire(KEY, &permits(n, Wait::NoWait)).await.map(|g| {
        let token = g.token();
        holders.push(("p", g));
        token
    });
    (answer, holders)
}

#[tokio::test(start_paused = true)]
async fn a_refused_hint_reads_after_a_counter_went_back() {
    super::bounded(async move {
        for (n, back) in [(2, Back::SetBack), (2, Back::Recreate), (3, Back::SetBack)] {
            let (answer, holders) = hint_after(n, back).await;
            let names: Vec<&str> = holders.iter().map(|(w, _)| *w).collect();
            match &answer {
                Err(Error::Busy { holders: named, .. }) => {
                    let mut tickets: Vec<u64> = named.iter().map(|h| h.ticket).collect();
                    tickets.sort_unstable();
                    let expected: Vec<u64> = (2..2 + u64::from(n)).collect();
                    assert_eq!(
                        tickets, expected,
                        "N = {n}, {back:?}: busy naming the holders"
                    );
                }
                other => panic!("N = {n}, {back:?}: {other:?} beside {names:?}"),
            }
            assert_eq!(holders.len(), n as usize, "N = {n}, {back:?}: {names:?}");
        }
    })
    .await;
}

/// The schedule reaches the defect: a refused hint that takes the counter at its word is granted
/// beside N holders.
#[tokio::test(start_paused = true)]
async fn a_refused_hint_that_trusts_the_counter_gives_n_plus_one_holders() {
    super::bounded(async move {
        for back in [Back::SetBack, Back::Recreate] {
            let planted = plant(Some(Mutant::HintPastOthers));
            let (answer, holders) = hint_after(2, back).await;
            drop(planted);
            let names: Vec<&str> = holders.iter().map(|(w, _)| *w).collect();
            assert!(answer.is_ok(), "{back:?}: {answer:?}");
            assert_eq!(names, ["b", "c", "p"], "{back:?}");
            assert!(
                holders.iter().all(|(_, g)| !g.is_lost()),
                "{back:?}: three believe they hold a key of 2"
            );
        }
    })
    .await;
}

/// The look schedule: a waiter of 2 behind two live holders and three dead rows (tickets 3 to
/// 5); the key is switched to 3 permits once it has queued. Returns its answer and the rows left.
async fn look_after_a_switch() -> (Result<u64, Error>, Vec<u64>) {
    let table = Direct::new();
    // The lockers run on the system's wall clock (`Locker::on`).
    let now_ms = crate::clock::Clock::wall_ms(&crate::clock::SystemClock);
    let mut counter = seed::counter(KEY, 5);
    counter.insert(schema::LAST_OWNER.into(), schema::s("o5:5"));
    counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(2));
    counter.insert(schema::PERMITS_ATTR.into(), schema::n(2));
    let mut items = vec![counter];
    for ticket in 1..=5 {
        let until = if ticket <= 2 {
            now_ms + 3_600_000
        } else {
            now_ms - 60_000
        };
        let mut row = seed::row(KEY, ticket, &format!("o{ticket}"), "r", until);
        row.insert(schema::PROTOCOL_ATTR.into(), schema::n(2));
        items.push(row);
    }
    {
        let mut t = table.table.lock().unwrap();
        t.page_size = 3;
        for item in items {
            t.insert(item, Instant::now());
        }
    }
    *table.after_enqueue.lock().unwrap() = Some(Box::new(|t: &mut Table| {
        Direct::edit_counter(t, |c| {
            c.insert(schema::PERMITS_ATTR.into(), schema::n(3));
        });
    }));
    let opts = LockOptions {
        wait: Wait::For(Duration::from_secs(10)),
        ..permits(2, Wait::Forever)
    };
    let answer = table.locker().acquire(KEY, &opts).await.map(|g| g.token());
    assert!(
        table.after_enqueue.lock().unwrap().is_none(),
        "the waiter never queued"
    );
    (answer, table.rows())
}

#[tokio::test(start_paused = true)]
async fn a_look_refused_for_other_permits_removes_nothing() {
    super::bounded(async move {
        let (answer, rows) = look_after_a_switch().await;
        assert!(
            matches!(
                answer,
                Err(Error::PermitsMismatch {
                    table: 3,
                    configured: 2,
                    ..
                })
            ),
            "{answer:?}"
        );
        assert_eq!(rows, [1, 2, 3, 4, 5], "removed before it was refused");
    })
    .await;
}

/// The schedule reaches the defect: a look that removes what its first page shows before it
/// reads the counter removes the dead rows (and here, stopped by the two holders on the next
/// page before the counter, is never refused: busy at its deadline).
#[tokio::test(start_paused = true)]
async fn a_look_that_removes_before_it_reads_the_counter_is_caught() {
    super::bounded(async move {
        let planted = plant(Some(Mutant::LookRemovesUnchecked));
        let (answer, rows) = look_after_a_switch().await;
        drop(planted);
        assert!(answer.is_err(), "{answer:?}");
        assert_ne!(rows, [1, 2, 3, 4, 5], "{answer:?}");
    })
    .await;
}

/// The seat schedule: a holder of one permit on the seat, its key's counter switched by hand to
/// 2 permits. Returns why it lost the lock, and after how long.
async fn seat_after_a_hand_switch() -> (LostReason, Duration) {
    let table = Direct::new();
    let opts = LockOptions {
        heartbeat: Some(Duration::from_secs(2)),
        ..permits(1, Wait::Forever)
    };
    let guard = table.locker().acquire(KEY, &opts).await.unwrap();
    {
        let mut t = table.table.lock().unwrap();
        Direct::edit_counter(&mut t, |c| {
            c.insert(schema::PROTOCOL_ATTR.into(), schema::n(2));
            c.insert(schema::PERMITS_ATTR.into(), schema::n(2));
        });
    }
    let switched = Instant::now();
    let reason = tokio::time::timeout(opts.lease * 2, guard.lost())
        .await
        .expect("the lock was never lost");
    (reason, switched.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_seat_heartbeat_refused_for_other_permits_is_a_loss_at_once() {
    super::bounded(async move {
        let (reason, after) = seat_after_a_hand_switch().await;
        assert_eq!(reason, LostReason::PermitsMismatch);
        // Its next heartbeat, one interval after the grant.
        assert!(after <= Duration::from_secs(2), "lost after {after:?}");
        assert!(reason.to_string().contains("permits"), "{reason}");
    })
    .await;
}

/// The schedule reaches the defect: a fatal answer retried until the lease is reported late, as
/// an expired lease.
#[tokio::test(start_paused = true)]
async fn a_refused_heartbeat_retried_until_the_lease_is_caught() {
    super::bounded(async move {
        let planted = plant(Some(Mutant::FatalHeartbeatRetried));
        let (reason, after) = seat_after_a_hand_switch().await;
        drop(planted);
        assert_eq!(reason, LostReason::LeaseExpired, "lost after {after:?}");
        assert!(after > Duration::from_secs(2), "lost after {after:?}");
    })
    .await;
}
