//! A scripted schedule: a waiter whose own lease runs out while its last look is in flight must
//! not be granted on that look (the guard in `locker/attempt.rs`), or two participants hold the key.
//!
//! The script (a backend over the model that answers a few requests its own way), lease 1 s,
//! allowance 100 ms, everyone's wall clock the same:
//! 1. `h` takes the seat (ticket 1); `x` queues behind it (ticket 2), then `p` (ticket 3).
//! 2. Every heartbeat of `x` is refused: its lease runs out a lease after its enqueue was sent.
//! 3. The first look of `x` sent less than 300 ms before that moment is armed: `h`'s seat is
//!    released just before it is read, so it finds the way clear; its answer is held back until
//!    `p` is granted.
//! 4. `p` sees `x`'s row unchanged past its lease and the allowance, removes it, and is granted.
//! 5. `x`'s answer comes back: clear. By then its own lease has run out and `p` holds the key:
//!    `x` must leave and queue again, not take the key beside `p`.
//!
//! Its sibling, the enqueue that outlasts its lease (the guard in `locker.rs`):
//! 1. `x` finds the key free and takes the seat; the write lands at once, its answer is held
//!    back until `p` is granted.
//! 2. `p` queues behind the seat, sees it unchanged past its lease and the allowance (`x` has no
//!    heartbeat yet: its write is not confirmed), vacates it, and is granted.
//! 3. `x`'s answer comes back: `Done`, the seat is ours, the queue was clear. Its lease ran out
//!    meanwhile: `x` must leave and queue again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::model::Table;
use super::net::{describe, SimClock};
use super::scenario::EPOCH_MS;
use crate::mutant::{plant, Mutant};
use crate::options::{ClockSkew, LockOptions, Wait};
use crate::storage::{Backend, Failure, Range, Request, Response};
use crate::Locker;

const LEASE: Duration = Duration::from_secs(1);
/// How long before `x`'s lease ends its look is armed (more than its longest pause).
const ARM: Duration = Duration::from_millis(300);

/// Which guard the script puts to the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The last look outlasts the lease (`locker/attempt.rs`).
    Look,
    /// The seat's enqueue outlasts the lease (`locker.rs`).
    Enqueue,
}

#[derive(Debug)]
struct Script {
    mode: Mode,
    table: Mutex<Table>,
    /// `h`'s seat: (ticket, owner).
    seat: Mutex<Option<(u64, String)>>,
    /// When `x` sent its enqueue (its lease counts from then).
    x_sent: Mutex<Option<Instant>>,
    armed: Mutex<bool>,
    p_granted: watch::Sender<bool>,
    answers: Mutex<Vec<String>>,
}

impl Script {
    fn note(&self, who: &str, request: &Request, what: &str) {
        let what: String = what.chars().take(120).collect();
        self.answers
            .lock()
            .unwrap()
            .push(format!("{who} {} -> {what}", describe(request)));
    }

    fn apply(&self, who: &str, request: &Request) -> Result<Response, Failure> {
        let result = self.table.lock().unwrap().apply(request, Instant::now());
        self.note(who, request, &format!("{result:?}"));
        result
    }

    fn answer(
        self: &Arc<Self>,
        who: &'static str,
        request: Request,
    ) -> BoxFuture<'static, Result<Response, Failure>> {
        let now = Instant::now();
        if who == "x" {
            match &request {
                Request::Heartbeat(_) => {
                    self.note(who, &request, "refused");
                    return Box::pin(async {
                        Err(Failure::Retry {
                            throttled: true,
                            operation: "UpdateItem",
                            source: "script: x's heartbeats are refused".into(),
                        })
                    });
                }
                Request::Enqueue(_) => {
                    let first = self.x_sent.lock().unwrap().is_none();
                    self.x_sent.lock().unwrap().get_or_insert(now);
                    if first && self.mode == Mode::Enqueue {
                        let result = self.apply(who, &request);
                        return self.held(result, "x's seat answered");
                    }
                }
                Request::Query {
                    start: None,
                    range: Range::Below { .. },
                    ..
                } => {
                    let due = self.x_sent.lock().unwrap().map(|s| s + LEASE - ARM);
                    let mut armed = self.armed.lock().unwrap();
                    if self.mode == Mode::Look && !*armed && due.is_some_and(|d| now >= d) {
                        *armed = true;
                        drop(armed);
                        // `h` releases its seat just before the look is read.
                        let (ticket, owner) = self.seat.lock().unwrap().clone().unwrap();
                        let release = Request::DeleteOwned {
                            key: "k".into(),
                            ticket,
                            seat: true,
                            owner,
                            done: None,
                            speaks: crate::protocol::Speaks::Permits(1),
                        };
                        self.apply("h", &release).unwrap();
                        let result = self.apply(who, &request);
                        return self.held(result, "x's armed look answered");
                    }
                }
                _ => {}
            }
        }
        let result = self.apply(who, &request);
        Box::pin(async move { result })
    }
}

impl Script {
    /// An answer held back until `p` is granted (ten leases at most).
    fn held(
        self: &Arc<Self>,
        result: Result<Response, Failure>,
        what: &'static str,
    ) -> BoxFuture<'static, Result<Response, Failure>> {
        let mut granted = self.p_granted.subscribe();
        let script = self.clone();
        Box::pin(async move {
            let _ = tokio::time::timeout(LEASE * 10, granted.wait_for(|g| *g)).await;
            script.answers.lock().unwrap().push(what.into());
            result
        })
    }
}

#[derive(Debug)]
struct Named(Arc<Script>, &'static str);

impl Backend for Named {
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        self.0.answer(self.1, request)
    }
}

/// Runs the script; `Err` if `x` was granted while `p` held the key.
async fn play(mode: Mode) -> Result<String, String> {
    let origin = Instant::now();
    let (p_granted, _) = watch::channel(false);
    let script = Arc::new(Script {
        mode,
        table: Mutex::new(Table::new(origin, EPOCH_MS)),
        seat: Mutex::new(None),
        x_sent: Mutex::new(None),
        armed: Mutex::new(false),
        p_granted,
        answers: Mutex::new(Vec::new()),
    });
    let locker = |who: &'static str, seed: u64| {
        Locker::on(Arc::new(Named(script.clone(), who)), "scripted")
            .with_clock(Arc::new(SimClock::new(EPOCH_MS, origin, 0, 0, seed)))
    };
    let opts = LockOptions {
        wait: Wait::Forever,
        lease: LEASE,
        heartbeat: Some(Duration::from_millis(300)),
        poll: Duration::from_millis(20),
        max_poll: Duration::from_millis(100),
        clock_skew: ClockSkew::Bounded(Duration::from_millis(100)),
        ..LockOptions::default()
    };
    let h = match mode {
        Mode::Look => {
            let h = locker("h", 1).acquire("k", &opts).await.expect("h granted");
            *script.seat.lock().unwrap() = Some((h.token(), h.owner().to_owned()));
            Some(h)
        }
        Mode::Enqueue => None,
    };
    let x = locker("x", 2);
    let x_opts = opts.clone();
    let x_task = tokio::spawn(async move {
        let g = x.acquire("k", &x_opts).await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let p = locker("p", 3).acquire("k", &opts).await.expect("p granted");
    script.p_granted.send_replace(true);
    // `p` holds for three leases, heartbeating, then releases.
    tokio::time::sleep(LEASE * 3).await;
    let p_token = p.token();
    let p_lost = p.lost_reason();
    p.release().await.expect("p released");
    let released = Instant::now();
    let (x_guard, x_at) = x_task.await.expect("x's task");
    let x_guard = x_guard.expect("x granted in the end");
    let answers = script.answers.lock().unwrap().join("\n");
    let reached = match mode {
        Mode::Look => answers.contains("x's armed look answered"),
        Mode::Enqueue => answers.contains("x's seat answered"),
    };
    if !reached {
        return Err(format!(
            "the script no longer reaches its window:\n{answers}"
        ));
    }
    // `p` must have passed `x`'s entry over while x's request was held.
    if !answers.lines().any(|l| l.starts_with("p DeleteStale")) {
        return Err(format!("p never passed x's entry over:\n{answers}"));
    }
    if x_at < released || x_guard.token() <= p_token || p_lost.is_some() {
        return Err(format!(
            "two holders: x granted k t{} {:?} before p (t{p_token}, lost: {p_lost:?}) \
             released\n{answers}",
            x_guard.token(),
            released.saturating_duration_since(x_at)
        ));
    }
    x_guard.release().await.expect("x released");
    drop(h);
    Ok(answers)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_lease_ran_out_during_its_last_look_is_not_granted() {
    super::bounded(async move {
        if let Err(e) = play(Mode::Look).await {
            panic!("{e}");
        }
    })
    .await;
}

/// The same script without the guard: `x` is granted beside `p`.
#[tokio::test(start_paused = true)]
async fn without_the_guard_the_script_gives_two_holders() {
    super::bounded(async move {
        let _planted = plant(Some(Mutant::GrantPastOwnLease));
        match play(Mode::Look).await {
            Err(e) => {
                eprintln!("{e}");
                assert!(e.starts_with("two holders"), "{e}");
            }
            Ok(answers) => panic!("the guard's removal went unseen:\n{answers}"),
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_seat_taken_after_our_own_lease_ran_out_is_not_granted() {
    super::bounded(async move {
        if let Err(e) = play(Mode::Enqueue).await {
            panic!("{e}");
        }
    })
    .await;
}

/// The enqueue's script without its guard: `x` is granted the seat beside `p`.
#[tokio::test(start_paused = true)]
async fn without_the_enqueue_guard_the_script_gives_two_holders() {
    super::bounded(async move {
        let _planted = plant(Some(Mutant::EnqueuePastOwnLease));
        match play(Mode::Enqueue).await {
            Err(e) => {
                eprintln!("{e}");
                assert!(e.starts_with("two holders"), "{e}");
            }
            Ok(answers) => panic!("the guard's removal went unseen:\n{answers}"),
        }
    })
    .await;
}
