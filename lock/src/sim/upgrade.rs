//! Two protocol versions on one key through an upgrade (issue 25): old only, mixed, switched and
//! new only (the key stays switched after the next protocol's holder leaves), with lost answers,
//! refusals, delays and crashes, on simulated time.
//!
//! Protocol 1 participants are real [`Locker`]s over the model ([`super::model::Table`]) behind a
//! faulty storage. The next protocol is a test-only one, [`NEXT`]: protocol 1's items, but the
//! seat's holder kept under other attribute names ([`RENAMED`]), so a build that ignored the
//! version would see an empty seat and be granted beside its holder. Its participant is a
//! stand-in: a real `Locker` while the key runs protocol 1 (a release that introduces the next
//! protocol still writes the old one), which, once it holds the key in the seat, switches it
//! (`protocol = NEXT` and the seat re-encoded under the new names, one write), holds it under
//! the next protocol, and releases it by the next protocol's rules.
//!
//! Checked, per seed: no protocol 1 participant is granted once the key is switched (the holder
//! of the next protocol may hold it, and nothing of protocol 1 can see it); nobody is refused
//! for the protocol before the switch; no queue row appears after the switch and the counter
//! changes only by the stand-in's writes (old participants write nothing to a switched key but
//! the removal of their own rows); every acquisition answers within its wait and a loose bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
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
use crate::storage::{Failure, Item, Request, Response, Storage};
use crate::Locker;

/// The test-only next protocol.
pub(crate) const NEXT: u32 = crate::PROTOCOL + 1;

/// How [`NEXT`] names the seat's attributes that protocol 1 names otherwise.
pub(crate) const RENAMED: [(&str, &str); 5] = [
    (schema::OWNER, "holder"),
    (schema::TICKET, "holderTicket"),
    (schema::LEASE_UNTIL_MS, "holderUntilMs"),
    (schema::LEASE_MS, "holderLeaseMs"),
    (schema::RVN, "holderRvn"),
];

const KEY: &str = "k";
/// The participants of protocol 1 (the stand-in of the next protocol is one more).
const OLD: usize = 4;
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
    /// When the key was switched to [`NEXT`].
    switched: Mutex<Option<Instant>>,
    /// The next protocol's holder holds the key.
    next_holds: AtomicBool,
    /// The counter as the stand-in last wrote it, and the queue rows at the switch.
    after_switch: Mutex<Option<(Item, Vec<String>)>>,
    violations: Mutex<Vec<String>>,
    /// Protocol 1 acquisitions refused for the protocol.
    refused: std::sync::atomic::AtomicUsize,
}

impl World {
    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    fn counter(&self) -> Option<Item> {
        self.table
            .lock()
            .unwrap()
            .partition(KEY)
            .into_iter()
            .find(|i| matches!(i.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK))
    }

    fn rows(&self) -> Vec<String> {
        self.table
            .lock()
            .unwrap()
            .partition(KEY)
            .into_iter()
            .filter_map(|i| i.get(SK).and_then(|v| v.as_s().ok()).cloned())
            .filter(|sk| sk.starts_with(schema::QUEUE_PREFIX))
            .collect()
    }

    /// The stand-in's switch: if `owner` sits in the seat, one write sets `protocol = NEXT` and
    /// moves the seat's holder to the next protocol's names, its lease `hold` from now.
    fn switch(&self, owner: &str, hold: Duration) -> bool {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap();
        let Some(mut counter) = table
            .partition(KEY)
            .into_iter()
            .find(|i| matches!(i.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK))
        else {
            return false;
        };
        if counter.get(schema::OWNER).and_then(|o| o.as_s().ok()) != Some(&owner.to_owned()) {
            return false;
        }
        for (old, new) in RENAMED {
            if let Some(v) = counter.remove(old) {
                counter.insert(new.to_owned(), v);
            }
        }
        for gone in schema::SEAT_ATTRIBUTES {
            counter.remove(gone);
        }
        let until = table.server_ms(now) + crate::clock::millis(hold);
        counter.insert("holderUntilMs".into(), schema::n(until));
        counter.insert(schema::PROTOCOL_ATTR.into(), schema::n(NEXT));
        table.insert(counter.clone(), now);
        drop(table);
        *self.switched.lock().unwrap() = Some(now);
        self.next_holds.store(true, Ordering::SeqCst);
        *self.after_switch.lock().unwrap() = Some((counter, self.rows()));
        true
    }

    /// The next protocol's release: its holder's attributes removed, the key stays switched.
    fn release_next(&self) {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap();
        if let Some(mut counter) = table
            .partition(KEY)
            .into_iter()
            .find(|i| matches!(i.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK))
        {
            for (_, new) in RENAMED {
                counter.remove(new);
            }
            table.insert(counter.clone(), now);
            drop(table);
            if let Some((c, _)) = self.after_switch.lock().unwrap().as_mut() {
                *c = counter;
            }
        }
        self.next_holds.store(false, Ordering::SeqCst);
    }
}

/// A participant's storage: the model behind delays, refusals, answers lost after the write,
/// and a crash (from then on nothing is sent or answered).
#[derive(Clone)]
struct Faulty {
    world: Arc<World>,
    dead: Arc<AtomicBool>,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

impl Storage for Faulty {
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
            tokio::time::sleep(back).await;
            if lose {
                return Err(retry("answer lost after the write"));
            }
            result
        })
    }
}

fn locker(world: &Arc<World>, seed: u64, dead: &Arc<AtomicBool>) -> Locker {
    let storage = Faulty {
        world: world.clone(),
        dead: dead.clone(),
    };
    let clock = SimClock::new(EPOCH_MS, world.origin, 0, 0, seed);
    Locker::on(Arc::new(storage), "upgrade").with_clock(Arc::new(clock))
}

fn options(rng: &mut StdRng) -> LockOptions {
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
        ..LockOptions::default()
    }
}

/// One participant of protocol 1: rounds of acquire, hold, release; sometimes it crashes.
async fn old(world: Arc<World>, name: String, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dead = Arc::new(AtomicBool::new(false));
    let locker = locker(&world, seed, &dead);
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1_500))).await;
        let opts = options(&mut rng);
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
                if switched.is_some() {
                    world.violation(format!(
                        "{name}: granted ticket {} on a key switched to protocol {NEXT} at \
                         {switched:?} (the next protocol's holder holds: {})",
                        guard.token(),
                        world.next_holds.load(Ordering::SeqCst)
                    ));
                }
                if rng.random_bool(0.1) {
                    dead.store(true, Ordering::SeqCst); // crashed while holding
                    std::mem::forget(guard);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..1_500))).await;
                drop(guard.release().await);
            }
            Err(Error::ProtocolTooNew { .. }) => {
                world.refused.fetch_add(1, Ordering::SeqCst);
                if switched.is_none() {
                    world.violation(format!(
                        "{name}: refused for the protocol before the switch"
                    ));
                }
            }
            Err(_) => {} // busy, or the faults outlasted the budget
        }
    }
}

/// The next protocol's participant: protocol 1 (a real `Locker`) until it holds the key in the
/// seat, then the switch, a hold under the next protocol, and its release.
async fn next(world: Arc<World>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Old only, then this release is deployed.
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..6_000))).await;
    let dead = Arc::new(AtomicBool::new(false));
    let locker = locker(&world, seed, &dead);
    for _ in 0..30 {
        let opts = LockOptions {
            wait: Wait::For(Duration::from_secs(5)),
            ..options(&mut rng)
        };
        let Ok(guard) = locker.acquire(KEY, &opts).await else {
            continue;
        };
        // Mixed: it holds as protocol 1 for a while, then switches (only from the seat).
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..800))).await;
        let hold = Duration::from_millis(rng.random_range(1_000..6_000));
        let live = guard.lost_reason().is_none();
        if live && world.switch(guard.owner(), hold + LEASE) {
            // Its protocol 1 guard can no longer renew the seat (the version refuses it).
            std::mem::forget(guard);
            tokio::time::sleep(hold).await;
            world.release_next();
            return;
        }
        drop(guard.release().await);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
    }
}

/// What one seed did.
pub(crate) struct Upgraded {
    /// The violations found.
    pub violations: Vec<String>,
    /// The key was switched (a run that never switches proves little).
    pub switched: bool,
    /// Protocol 1 acquisitions refused for the protocol.
    pub refused: usize,
}

/// Runs one seed.
pub(crate) fn run(seed: u64) -> Upgraded {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let origin = Instant::now();
        let world = Arc::new(World {
            origin,
            table: Mutex::new(Table::new(origin, EPOCH_MS)),
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0xfa17)),
            faults: AtomicBool::new(true),
            switched: Mutex::new(None),
            next_holds: AtomicBool::new(false),
            after_switch: Mutex::new(None),
            violations: Mutex::new(Vec::new()),
            refused: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut tasks = Vec::new();
        for i in 0..OLD {
            let w = world.clone();
            let s = seed.wrapping_mul(31).wrapping_add(i as u64);
            tasks.push(tokio::spawn(old(w, format!("old-{i}"), s)));
        }
        tasks.push(tokio::spawn(next(world.clone(), seed.wrapping_mul(31) + 99)));
        for t in tasks {
            let _ = t.await;
        }
        // Whatever protocol 1 still had in flight lands or is dropped.
        tokio::time::sleep(Duration::from_secs(15)).await;
        if let Some((counter, rows)) = world.after_switch.lock().unwrap().clone() {
            if world.counter().as_ref() != Some(&counter) {
                world.violation(format!(
                    "the switched counter was written by protocol 1: {:?} (the stand-in left {counter:?})",
                    world.counter()
                ));
            }
            let added: Vec<String> = world
                .rows()
                .into_iter()
                .filter(|r| !rows.contains(r))
                .collect();
            if !added.is_empty() {
                world.violation(format!("rows queued after the switch: {added:?}"));
            }
        }
        let violations = world.violations.lock().unwrap().clone();
        let switched = world.switched.lock().unwrap().is_some();
        Upgraded {
            violations,
            switched,
            refused: world.refused.load(Ordering::SeqCst),
        }
    })
}

#[test]
fn an_upgrade_through_old_mixed_and_switched_keeps_protocol_1_out() {
    let seeds: u64 = std::env::var("FLIGHTLOCK_UPGRADE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let (mut switched, mut refused) = (0, 0);
    for seed in 0..seeds {
        let run = run(seed);
        assert!(
            run.violations.is_empty(),
            "seed {seed}: {:#?}",
            run.violations
        );
        switched += usize::from(run.switched);
        refused += run.refused;
    }
    eprintln!(
        "upgrade: {seeds} seeds, {switched} switched, {refused} protocol 1 acquisitions refused"
    );
    // The schedules reach what they are for: most switch, and old participants meet the switch.
    assert!(
        switched * 2 >= usize::try_from(seeds).unwrap(),
        "only {switched} of {seeds} switched"
    );
    assert!(refused > 0, "no protocol 1 acquisition met a switched key");
}
