//! Two protocol versions on one key through an upgrade (issues 25 and 26): protocol 1 (one
//! permit) and protocol 2 (a key of N permits), with lost answers, refusals, delays and crashes,
//! on simulated time.
//!
//! Every participant is a real [`Locker`] over the model ([`super::model::Table`]) behind a
//! faulty backend. The key starts at `from` permits (1: protocol 1; 2: protocol 2) and its
//! participants contend; participants configured with the other number, `to`, are deployed at
//! random times, some before the switch and some after; an operator switches the key from
//! `from` to `to` as `flightlock permits --set` does (one conditional write of the counter:
//! `protocol` and `permits` set, only while the seat is empty, retried while it is taken). Half
//! the seeds raise the key (1 → 2), half lower it (2 → 1). A participant configured with 1
//! permit writes exactly what a protocol 1 build writes (`tests/protocol/snapshot.rs` proves it),
//! so `from = 1` is an old release beside the new one.
//!
//! Checked, per seed: every grant was decided (its last request applied) while the key had the
//! participant's own permits, and with fewer than that many others believing they hold it (at
//! most N holders, N the key's number when the grant was decided); a participant whose
//! acquisition started after the switch with the old number is refused, never granted, and one
//! with the new number whose acquisition ended before it is refused too (nobody grants beyond
//! what the key allows), and neither is answered busy unless one of its requests was refused or
//! lost its answer (a `wait = 0` on a key whose permits are all held writes nothing: only its
//! read can refuse it); every acquisition answers within its wait and a loose bound; most seeds
//! switch, participants meet the switch both ways, and the new number is granted after it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::model::Table;
use super::net::SimClock;
use super::scenario::EPOCH_MS;
use crate::error::Error;
use crate::options::{LockOptions, Wait};
use crate::schema::{self, COUNTER_SK, SK};
use crate::storage::{Backend, Failure, Request, Response};
use crate::{Locker, LostSignal};

const KEY: &str = "k";
/// The participants configured with the key's first number of permits.
const OLD: usize = 5;
/// The participants configured with the number the key is switched to.
const NEW: usize = 3;
const ROUNDS: usize = 6;
const LEASE: Duration = Duration::from_secs(2);
/// A loose bound past a wait: retries of the last requests, with the faults injected here.
const SLACK: Duration = Duration::from_secs(30);

/// The run's shared state: the table, the faults' generator, what the checker knows.
struct World {
    /// The run's start: the table's and the clocks' origin.
    origin: Instant,
    table: Mutex<Table>,
    rng: Mutex<StdRng>,
    /// Faults on (lost answers, refusals, delays).
    faults: AtomicBool,
    /// The key's permits before and after the switch.
    from: u32,
    to: u32,
    /// When the key was switched.
    switched: Mutex<Option<Instant>>,
    /// When each participant's latest request was applied by the table: a grant is decided by
    /// the last request of its acquisition.
    applied: Mutex<HashMap<String, Instant>>,
    /// Who believes it holds the key (its lost signal says whether it still may).
    holders: Mutex<Vec<(String, LostSignal)>>,
    /// When each participant's latest request was refused or had its answer lost.
    faulted: Mutex<HashMap<String, Instant>>,
    violations: Mutex<Vec<String>>,
    /// Acquisitions refused because the key has other permits (or a newer protocol).
    refused: AtomicUsize,
    /// Grants to participants of the new number after the switch.
    granted_after: AtomicUsize,
    /// Print what happens (`replay_upgrade`).
    trace: bool,
}

impl World {
    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// The key's permits at `at`.
    fn permits_at(&self, at: Instant) -> u32 {
        match *self.switched.lock().unwrap() {
            Some(s) if s <= at => self.to,
            _ => self.from,
        }
    }

    /// The operator's switch, as `flightlock permits --set` writes it: if the key has a counter
    /// and its seat is empty, one write of its `protocol` and `permits`. `false`: not now.
    fn switch(&self, queued: usize) -> bool {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap();
        let rows = table
            .partition(KEY)
            .iter()
            .filter(|i| {
                i.get(SK)
                    .and_then(|v| v.as_s().ok())
                    .is_some_and(|sk| sk.starts_with(schema::QUEUE_PREFIX))
            })
            .count();
        if rows < queued {
            return false;
        }
        let Some(mut counter) = table
            .partition(KEY)
            .into_iter()
            .find(|i| matches!(i.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK))
        else {
            return false;
        };
        if counter.contains_key(schema::OWNER) {
            return false; // a holder in the seat would lose it at its next heartbeat
        }
        if self.to > 1 {
            counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(2));
            counter.insert(schema::PERMITS_ATTR.into(), schema::n(self.to));
        } else {
            counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(1));
            counter.remove(schema::PERMITS_ATTR);
        }
        table.insert(counter, now);
        drop(table);
        *self.switched.lock().unwrap() = Some(now);
        if self.trace {
            eprintln!(
                "{:?} SWITCH {} -> {}",
                now - self.origin,
                self.from,
                self.to
            );
        }
        true
    }
}

/// A participant's backend: the model behind delays, refusals, answers lost after the write,
/// and a crash (from then on nothing is sent or answered).
#[derive(Clone)]
struct Faulty {
    world: Arc<World>,
    dead: Arc<AtomicBool>,
    name: String,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

impl Backend for Faulty {
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>> {
        let this = self.clone();
        Box::pin(async move {
            if this.dead.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            let faults = this.world.faults.load(Ordering::SeqCst);
            let (go, back, refuse, lose) = {
                let mut rng = this.world.rng.lock().unwrap();
                let mut delay = || {
                    if faults && rng.random_bool(0.02) {
                        Duration::from_millis(rng.random_range(500..3_000))
                    } else {
                        Duration::from_millis(rng.random_range(1..15))
                    }
                };
                let (go, back) = (delay(), delay());
                (
                    go,
                    back,
                    faults && rng.random_bool(0.04),
                    faults && rng.random_bool(0.04),
                )
            };
            let retry = |what: &str| Failure::Retry {
                throttled: false,
                operation: request.operation(),
                source: what.to_owned().into(),
            };
            tokio::time::sleep(go).await;
            if refuse || lose {
                this.world
                    .faulted
                    .lock()
                    .unwrap()
                    .insert(this.name.clone(), Instant::now());
            }
            if refuse {
                return Err(retry("refused"));
            }
            if this.dead.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            let result = this
                .world
                .table
                .lock()
                .unwrap()
                .apply(&request, Instant::now());
            // A grant is decided by a read (the look that found a permit free) or an enqueue
            // (granted at once); heartbeats and releases run beside it and decide nothing.
            if matches!(request, Request::Query { .. } | Request::Enqueue(_)) {
                this.world
                    .applied
                    .lock()
                    .unwrap()
                    .insert(this.name.clone(), Instant::now());
            }
            tokio::time::sleep(back).await;
            if lose {
                return Err(retry("answer lost after the write"));
            }
            result
        })
    }
}

fn locker(world: &Arc<World>, name: &str, seed: u64, dead: &Arc<AtomicBool>) -> Locker {
    let backend = Faulty {
        world: world.clone(),
        dead: dead.clone(),
        name: name.to_owned(),
    };
    let clock = SimClock::new(EPOCH_MS, world.origin, 0, 0, seed);
    Locker::on(Arc::new(backend), "upgrade").with_clock(Arc::new(clock))
}

fn options(rng: &mut StdRng, permits: u32) -> LockOptions {
    let wait = match rng.random_range(0..3) {
        0 => Wait::NoWait,
        _ => Wait::For(Duration::from_millis(rng.random_range(500..8_000))),
    };
    LockOptions {
        wait,
        lease: LEASE,
        heartbeat: Some(LEASE / 4),
        poll: Duration::from_millis(50),
        max_poll: Duration::from_millis(400),
        clock_skew: crate::ClockSkew::Bounded(Duration::from_millis(200)),
        permits,
        ..LockOptions::default()
    }
}

/// One participant configured with `permits`, deployed after `delay`: rounds of acquire, hold,
/// release; sometimes it crashes.
async fn participant(world: Arc<World>, name: String, seed: u64, permits: u32, delay: Duration) {
    let mut rng = StdRng::seed_from_u64(seed);
    tokio::time::sleep(delay).await;
    let dead = Arc::new(AtomicBool::new(false));
    let locker = locker(&world, &name, seed, &dead);
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1_500))).await;
        let opts = options(&mut rng, permits);
        let started = Instant::now();
        let result = locker.acquire(KEY, &opts).await;
        let took = started.elapsed();
        let bound = opts.wait.as_duration().unwrap_or(Duration::ZERO) + SLACK;
        if took > bound {
            world.violation(format!(
                "{name}: answered after {took:?}, past its bound {bound:?}"
            ));
        }
        let switched = *world.switched.lock().unwrap();
        match result {
            Ok(guard) => {
                let decided = world
                    .applied
                    .lock()
                    .unwrap()
                    .get(&name)
                    .copied()
                    .unwrap_or(started);
                let key_permits = world.permits_at(decided);
                let others = {
                    let mut holders = world.holders.lock().unwrap();
                    holders.retain(|(_, lost)| lost.reason().is_none());
                    let others = holders.len();
                    holders.push((name.clone(), guard.lost_signal()));
                    others
                };
                if key_permits != permits {
                    world.violation(format!(
                        "{name} ({permits} permit(s)): granted ticket {} on a decision made while \
                         the key had {key_permits}",
                        guard.token()
                    ));
                }
                // Others may have been granted since the decision, under the number the key has
                // now (a raise lets them count this entry as one of theirs): the bound is the
                // higher of the two.
                let bound = key_permits.max(world.permits_at(Instant::now()));
                if others >= bound as usize {
                    world.violation(format!(
                        "{name}: granted ticket {} while {others} other(s) believe they hold a \
                         key of {bound} permit(s)",
                        guard.token()
                    ));
                }
                if switched.is_some_and(|s| s <= started) && permits == world.from {
                    world.violation(format!(
                        "{name}: granted with the old number of permits in an acquisition \
                         started after the switch"
                    ));
                }
                if switched.is_some() && permits == world.to {
                    world.granted_after.fetch_add(1, Ordering::SeqCst);
                }
                if world.trace {
                    eprintln!("{:?} {name} granted t{} decided {:?} switched {switched:?} others {others} key {key_permits} wait {:?} took {took:?}", Instant::now() - world.origin, guard.token(), decided - world.origin, opts.wait);
                }

                if rng.random_bool(0.1) {
                    if world.trace {
                        eprintln!(
                            "{:?} {name} crashes holding t{}",
                            Instant::now() - world.origin,
                            guard.token()
                        );
                    }
                    dead.store(true, Ordering::SeqCst); // crashed while holding
                    std::mem::forget(guard);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..1_500))).await;
                world
                    .holders
                    .lock()
                    .unwrap()
                    .retain(|(who, _)| *who != name);
                let t = guard.token();
                let r = guard.release().await;
                if world.trace {
                    eprintln!(
                        "{:?} {name} released t{t}: {r:?}",
                        Instant::now() - world.origin
                    );
                }
            }
            Err(e @ (Error::PermitsMismatch { .. } | Error::ProtocolTooNew { .. })) => {
                if world.trace {
                    eprintln!(
                        "{:?} {name} refused after {took:?} wait {:?}: {e}",
                        Instant::now() - world.origin,
                        opts.wait
                    );
                }
                world.refused.fetch_add(1, Ordering::SeqCst);
                if switched.is_none() && permits == world.from {
                    world.violation(format!(
                        "{name}: refused for the key's permits before any switch"
                    ));
                }
            }
            Err(Error::Busy { .. })
                if ((switched.is_some_and(|s| s <= started) && permits == world.from)
                    || (switched.is_none() && permits == world.to))
                    && world
                        .faulted
                        .lock()
                        .unwrap()
                        .get(&name)
                        .is_none_or(|&at| at < started) =>
            {
                // The key had other permits than ours for the whole call, and the call met no
                // refusal or lost answer (a wait can run out on those before the key answers):
                // every way of meeting the key (its read, its write, a look) must refuse, never
                // answer busy (a skip).
                world.violation(format!(
                    "{name} ({permits} permit(s)): answered busy after {took:?} (wait {:?}) on a \
                     key of {} permit(s) for the whole call",
                    opts.wait,
                    world.permits_at(started)
                ));
            }
            Err(_) => {} // busy, or the faults outlasted the budget
        }
    }
}

/// The operator: after `delay`, switches the key (retried while its seat is taken, for up to a
/// minute, as `flightlock permits --wait` does). Half the time it waits (up to ten seconds) for
/// a moment when three rows are queued, so that waiters queued under the old number meet the new
/// one at their next look.
async fn operator(world: Arc<World>, delay: Duration, busy: bool) {
    tokio::time::sleep(delay).await;
    for attempt in 0..600 {
        let queued = if busy && attempt < 100 { 3 } else { 0 };
        if world.switch(queued) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one seed did.
pub(crate) struct Upgraded {
    /// The violations found.
    pub violations: Vec<String>,
    /// The key was switched (a run that never switches proves little).
    pub switched: bool,
    /// Acquisitions refused for the key's permits (or protocol).
    pub refused: usize,
    /// Grants to the new number after the switch.
    pub granted_after: usize,
}

/// Runs one seed.
pub(crate) fn run(seed: u64) -> Upgraded {
    run_traced(seed, false)
}

/// Runs one seed, printing every grant, release, refusal and the switch with `trace`.
fn run_traced(seed: u64, trace: bool) -> Upgraded {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let origin = Instant::now();
        let mut plan = StdRng::seed_from_u64(seed ^ 0x0b5e);
        let (from, to) = if plan.random_bool(0.5) {
            (1, 2)
        } else {
            (2, 1)
        };
        let world = Arc::new(World {
            origin,
            table: Mutex::new(Table::new(origin, EPOCH_MS)),
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0xfa17)),
            faults: AtomicBool::new(true),
            from,
            to,
            switched: Mutex::new(None),
            applied: Mutex::default(),
            holders: Mutex::default(),
            faulted: Mutex::default(),
            violations: Mutex::new(Vec::new()),
            refused: AtomicUsize::new(0),
            granted_after: AtomicUsize::new(0),
            trace,
        });
        // The key exists at `from` before anyone of the other number is deployed (else the first
        // participant of either number would create it at its own).
        let create = Request::CreateCounter {
            key: KEY.into(),
            last: 0,
            owner: "setup".into(),
            protocol: crate::protocol::Speaks::Permits(from).protocol(),
            permits: from,
        };
        drop(world.table.lock().unwrap().apply(&create, origin));
        let switch_at = Duration::from_millis(plan.random_range(2_000..8_000));
        let mut tasks = Vec::new();
        for i in 0..OLD {
            let s = seed.wrapping_mul(31).wrapping_add(i as u64);
            let w = world.clone();
            tasks.push(tokio::spawn(participant(
                w,
                format!("from{from}-{i}"),
                s,
                from,
                Duration::ZERO,
            )));
        }
        for i in 0..NEW {
            let s = seed.wrapping_mul(31).wrapping_add(50 + i as u64);
            // Deployed around the switch: some before it (refused until it), most after.
            let delay = Duration::from_millis(plan.random_range(0..12_000));
            let w = world.clone();
            tasks.push(tokio::spawn(participant(
                w,
                format!("to{to}-{i}"),
                s,
                to,
                delay,
            )));
        }
        let busy = plan.random_bool(0.5);
        tasks.push(tokio::spawn(operator(world.clone(), switch_at, busy)));
        for t in tasks {
            let _ = t.await;
        }
        // Whatever was still in flight lands or is dropped.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let violations = world.violations.lock().unwrap().clone();
        let switched = world.switched.lock().unwrap().is_some();
        Upgraded {
            violations,
            switched,
            refused: world.refused.load(Ordering::SeqCst),
            granted_after: world.granted_after.load(Ordering::SeqCst),
        }
    })
}

/// `FLIGHTLOCK_UPGRADE_SEED=<n>`: runs that upgrade seed and prints what happened.
#[test]
fn replay_upgrade() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_UPGRADE_SEED") else {
        return;
    };
    let r = run_traced(
        seed.parse().expect("FLIGHTLOCK_UPGRADE_SEED is a number"),
        true,
    );
    eprintln!("violations: {:#?}", r.violations);
}

#[test]
fn a_switch_of_permits_between_protocols_1_and_2_never_grants_beyond_the_key() {
    let seeds: u64 = std::env::var("FLIGHTLOCK_UPGRADE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let (mut switched, mut refused, mut granted_after) = (0, 0, 0);
    for seed in 0..seeds {
        let run = run(seed);
        assert!(
            run.violations.is_empty(),
            "seed {seed}: {:#?}",
            run.violations
        );
        switched += usize::from(run.switched);
        refused += run.refused;
        granted_after += run.granted_after;
    }
    eprintln!(
        "upgrade: {seeds} seeds, {switched} switched, {refused} acquisitions refused for the \
         key's permits, {granted_after} grants of the new number after the switch"
    );
    // The schedules reach what they are for: most switch, and old participants meet the switch.
    assert!(
        switched * 2 >= usize::try_from(seeds).unwrap(),
        "only {switched} of {seeds} switched"
    );
    assert!(refused > 0, "no acquisition met a key of other permits");
    assert!(
        granted_after > 0,
        "the new number was never granted after a switch"
    );
}
