//! Deterministic simulation of the lock protocol.
//!
//! The real protocol code (`Locker`, the heartbeat, the guard) runs against a model of one
//! DynamoDB table ([`model`]) through a simulated network ([`net`]), on a single-threaded tokio
//! runtime with paused time. Every source of nondeterminism comes from one seed: the scenario
//! (keys, modes, leases, participants, their clocks), the network's delays and faults, the
//! participants' jitter and ids (through the [`crate::Clock`] seam), crashes, cancellations,
//! operator mistakes, the sweeper and TTL. The same seed replays the same run, event for event.
//!
//! Why not `turmoil` or `shuttle`: the protocol is already written against two seams (the storage
//! and the clock), its only shared state is the table, and tokio's paused clock on one thread
//! already orders every event deterministically. What is left — a network that delays, reorders,
//! drops and duplicates *requests to a table*, not bytes between hosts — is a page of code here,
//! and it can apply a request after the caller gave up on it, which is the case that matters.
//!
//! **What is checked** (each a violation with the seed and the trace):
//! 1. Mutual exclusion: when a participant is granted a key, no other participant still believes
//!    it holds that key (its lost signal has not fired), and a holder doing work while it
//!    believes it holds finds no other believer. Participants' wall clocks agree within the
//!    allowance in bounded mode; in clock-free mode they are hours apart, drift and jump (and in
//!    the clock-rate family their monotonic clocks run at rates up to 1/80 apart, [`rates`]).
//! 2. Fencing: tokens granted on a key strictly increase (an operator who deletes a counter while
//!    the queue is empty resets them: documented, not a violation).
//! 3. FIFO and self-cleaning safety: no queue row is removed by a waiter, the sweeper or TTL less
//!    than its lease after its last write (its owner may be alive); no grant passes over a row
//!    below it that is still live.
//! 4. Bounded waits: a `wait = 0` or `wait = d` acquisition returns within its documented bound.
//! 5. Liveness: once faults stop, every participant finishes its cycles; a few seconds after,
//!    no row of a participant that did not crash is left; after TTL and the sweeper have had
//!    their time, no row at all.
//! 6. Once per tick: no tick runs after a success of the same or a newer tick was marked (its
//!    `release_done` returned), and no tick is marked done without a success. Participants run
//!    with shared ticks (duplicates of each other's), fail some runs, and crash between a success
//!    and its mark (the documented window: the tick runs again).
//! 7. Availability ([`availability`]): no spurious loss, prompt loss notice, tight waits,
//!    takeover in every wait mode, progress under contention, each with the exact bound
//!    PROTOCOL.md states. Deliberate defects in the protocol's own code ([`crate::mutant`]) show each
//!    check failing (`mutations.rs`); the run counts every kind of answer the table gave, and
//!    how often each check applied, for the coverage table.
//! 8. No hot loop ([`pacing`]): no participant sends looks, heartbeats or retries on its key
//!    faster than its pacing allows. The coverage table also counts how often each safety guard
//!    of the acquisition fired ([`crate::mutant::fired`]).
//!
//! **Families**: the main one (`Knobs::default()`), all clock-free, the lease-edge family
//! (`Knobs::lease_edge`: a stalled participant whose own lease runs out across its requests, and
//! seat takes answered after the taker's lease), and the clock-rate family (`Knobs::clock_rates`:
//! monotonic clocks that run at rates of their own, [`rates`]).
//!
//! **Layout**: [`scenario`] is what a schedule is made of and how a seed generates it;
//! [`actors`] runs it (the contenders, the real sweeper, TTL, the operator); [`monitor`] holds
//! the checker's view and the checks at grants, at work and at the end of a run, [`watch`] the
//! checks that run on a timer, [`availability`] the availability checks; [`net`] and [`model`]
//! are the network and the table; [`rates`] the participants' monotonic rates; [`trace`] records
//! events. This file wires one run together.
//!
//! **Replaying a seed**: `FLIGHTLOCK_SIM_SEED=<seed> cargo test -p flightlock --lib
//! sim::tests::replay -- --nocapture` prints the whole trace.

mod actors;
mod availability;
#[cfg(test)]
mod differential;
#[cfg(test)]
mod lease_edge;
pub(crate) mod model;
mod monitor;
#[cfg(test)]
mod permits;

#[cfg(test)]
mod mutations;
#[cfg(test)]
mod named;
pub(crate) mod net;
mod pacing;
mod rates;
mod scenario;
#[cfg(test)]
mod scripted;
#[cfg(test)]
mod scripted_lease;
#[cfg(test)]
mod scripted_permits;
#[cfg(test)]
mod tests;
mod trace;
#[cfg(test)]
mod upgrade;
mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::options::CLOCK_FREE_GRACE;
use model::{Outcomes, Table};
use monitor::Ctx;
use net::{Faults, Net, SimClock};
use scenario::Knobs;
use scenario::{
    ms, plan_edge, plan_faults, plan_keys, plan_scan_lag, plan_workers, EPOCH_MS, SWEEPER_SEED,
};
use trace::Trace;

/// The result of one run.
#[derive(Debug)]
pub(crate) struct Report {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    pub outcomes: Outcomes,
    /// How often each availability check applied (and other paths worth counting).
    pub checked: BTreeMap<&'static str, u64>,
    pub grants: u64,
    pub busy: u64,
    pub crashes: u64,
    pub cancels: u64,
    /// Simulated time the run covered.
    pub simulated: Duration,
}

/// The bound of a scripted schedule (a test of its own on paused time), in simulated time.
pub(crate) const SCRIPT_BOUND: Duration = Duration::from_secs(3600);

/// Runs a scripted schedule's test body for at most [`SCRIPT_BOUND`] of simulated time: a
/// locker whose wait never ends makes the test fail, not spin.
pub(crate) async fn bounded(body: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(SCRIPT_BOUND, body).await.is_err() {
        panic!("the script did not end within {SCRIPT_BOUND:?} of simulated time: a wait that never ends?");
    }
}

/// Runs one seeded schedule to the end and returns what it found.
pub(crate) fn run(seed: u64, knobs: Knobs) -> Report {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return Report {
                seed,
                violations: vec![format!("could not build the runtime: {e}")],
                trace: Vec::new(),
                outcomes: Outcomes::default(),
                checked: BTreeMap::new(),
                grants: 0,
                busy: 0,
                crashes: 0,
                cancels: 0,
                simulated: Duration::ZERO,
            }
        }
    };
    // No bound of simulated time here: a schedule covers days (TTL, clock-free grace); the
    // model's request bound (`model::REQUEST_BOUND`) ends a participant that never finishes.
    runtime.block_on(simulate(seed, knobs))
}

async fn simulate(seed: u64, knobs: Knobs) -> Report {
    let _planted = crate::mutant::plant(knobs.mutant);
    drop(crate::mutant::take_fired()); // an earlier run's, on this thread
    let origin = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut keys = plan_keys(&mut rng, &knobs);
    if knobs.permits {
        scenario::plan_permits(seed, &mut keys, knobs.many_permits);
    }
    let min_lease = keys.iter().map(|k| k.opts.lease).min().unwrap_or_default();
    let attempt_timeout = min_lease / 4;
    let mut table = Table::new(origin, EPOCH_MS);
    table.page_size = rng.random_range(1..=4);
    table.mutation = knobs.mutation;
    table.scan_lag = plan_scan_lag(seed);
    let trace = Trace::default();
    let fault_phase = ms(&mut rng, 5_000, 30_000);
    let faults = rates::weather(&knobs, plan_faults(&mut rng));
    let net = Arc::new(Net {
        table: Mutex::new(table),
        rng: Mutex::new(StdRng::seed_from_u64(rng.random())),
        faults: Mutex::new(faults),
        attempt_timeout,
        trace: trace.clone(),
        mutation: knobs.mutation,
        sent: Mutex::default(),
        faulted: Mutex::default(),
        writes: Mutex::default(),
        requests: Mutex::default(),
        reads: Mutex::default(),
        log: Mutex::default(),
        stalled: Mutex::default(),
        round_trip: faults.delay.max(Faults::CALM.delay) * 2 + Duration::from_millis(1),
    });
    let ctx = Ctx {
        net: net.clone(),
        monitor: Arc::default(),
        faults_on: Arc::new(AtomicBool::new(true)),
        attempt_timeout,
    };
    ctx.note(format!(
        "seed {seed}: keys {:?}, faults {faults:?} for {fault_phase:?}, pages of {}, scans {:?} \
         behind",
        keys.iter()
            .map(|k| format!(
                "{} lease {:?} hb {:?} poll {:?}..{:?} skew {:?} ttl grace {:?}",
                k.name,
                k.opts.lease,
                k.opts.heartbeat_interval(),
                k.opts.poll,
                k.opts.max_poll,
                k.opts.clock_skew,
                k.opts.ttl_grace
            ))
            .collect::<Vec<_>>(),
        net.table.lock().map(|t| t.page_size).unwrap_or(0),
        net.table.lock().map(|t| t.scan_lag).unwrap_or_default()
    ));

    let mut workers = plan_workers(&mut rng, &keys, &knobs);
    if knobs.lease_edge {
        let stalled = plan_edge(&mut rng, &workers);
        ctx.note(format!("{stalled:?} is stalled during the fault phase"));
        if let Ok(mut s) = net.stalled.lock() {
            *s = stalled;
        }
    }
    let stalled = net.stalled.lock().ok().and_then(|s| s.clone());
    rates::edge_offsets(&knobs, &keys, &mut workers, stalled.as_deref());
    let _rates = rates::plan(&knobs, &keys, &workers, stalled.as_deref());
    for w in &workers {
        ctx.note(format!(
            "{} on {} for {} cycles, clock {:+}ms drift {}ppm{}",
            w.who,
            keys[w.key].name,
            w.cycles,
            w.offset_ms,
            w.drift_ppm,
            match rates::ppm(&w.who) {
                0 => String::new(),
                p => format!(", monotonic rate {p:+}ppm"),
            }
        ));
    }

    // Background actors: the sweeper, TTL, the operator.
    let background = tokio_util::sync::CancellationToken::new();
    let sweeper_on = rng.random_bool(0.7);
    if sweeper_on {
        let period = ms(&mut rng, 500, 5_000);
        let max_allowance = keys
            .iter()
            .map(|k| Duration::from_millis(u64::try_from(k.spread_ms * 2).unwrap_or(0)))
            .max()
            .unwrap_or_default();
        // The real sweeper refuses a grace below its floor.
        let grace = (max_allowance + ms(&mut rng, 0, 3_000)).max(crate::sweep::MIN_GRACE);
        let s = keys.iter().map(|k| k.spread_ms).min().unwrap_or(0);
        let offset = rng.random_range(-s..=s);
        let clock = Arc::new(SimClock::new(
            EPOCH_MS,
            origin,
            offset,
            0,
            seed ^ SWEEPER_SEED,
        ));
        tokio::spawn(actors::sweeper(
            ctx.clone(),
            period,
            grace,
            clock,
            background.clone(),
        ));
    }
    tokio::spawn(actors::ttl(ctx.clone(), background.clone()));
    tokio::spawn(watch::lease_watch(ctx.clone(), background.clone()));
    if rng.random_bool(0.5) {
        let names: Vec<(String, u32)> = keys
            .iter()
            .map(|k| (k.name.clone(), k.opts.permits))
            .collect();
        tokio::spawn(actors::operator(
            ctx.clone(),
            names,
            fault_phase,
            rng.random(),
            knobs.permits,
            background.clone(),
        ));
    }

    let mut tasks = Vec::new();
    for w in workers.clone() {
        let key = keys[w.key].clone();
        tasks.push(tokio::spawn(actors::worker(ctx.clone(), w, key, origin)));
    }

    // Faults stop after the fault phase; then every participant must finish.
    tokio::time::sleep(fault_phase).await;
    ctx.faults_on.store(false, Ordering::SeqCst);
    if let Ok(mut f) = net.faults.lock() {
        *f = Faults::CALM;
    }
    if let Ok(mut s) = net.stalled.lock() {
        *s = None;
    }
    ctx.note("faults stop".into());
    tokio::spawn(watch::stuck_watch(
        ctx.clone(),
        keys.clone(),
        background.clone(),
    ));
    let horizon = Instant::now() + Duration::from_secs(600);
    for (w, mut task) in workers.iter().zip(tasks) {
        let left = horizon.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, &mut task).await.is_err() {
            // Stopped, so a stuck participant does not go on polling through the drain below
            // (simulated hours: a broken protocol's run took minutes of real time).
            task.abort();
            ctx.violation(format!(
                "liveness: {} did not finish its cycles within 10 minutes after faults stopped",
                w.who
            ));
        }
    }
    ctx.note("all participants done".into());

    // A few seconds later (background releases, a cancelled enqueue's second delete), only rows
    // of crashed participants may be left.
    tokio::time::sleep(Duration::from_secs(10)).await;
    monitor::check_only_crashed_left(&ctx);

    // After TTL and the sweeper have had their time, nothing is left at all.
    background.cancel();
    let clock_free = keys.iter().any(|k| k.opts.clock_free());
    let longest_grace = keys
        .iter()
        .map(|k| k.opts.ttl_grace)
        .max()
        .unwrap_or_default();
    let drain = if clock_free {
        // Clocks up to 12 h ahead, plus up to four 1 h jumps: rows may carry that much extra.
        CLOCK_FREE_GRACE + Duration::from_secs(18 * 3600)
    } else {
        longest_grace + Duration::from_secs(60)
    };
    tokio::time::sleep(drain).await;
    if let Ok(mut t) = net.table.lock() {
        t.reap(Instant::now(), 1.0, &mut || 0.0);
    }
    // TTL never removes a counter, so a dead seat is the sweeper's (or the next acquirer's):
    // one scheduled sweep, whether or not the sweeper ran during the run.
    let clock = Arc::new(SimClock::new(EPOCH_MS, origin, 0, 0, seed ^ SWEEPER_SEED));
    actors::sweep_once(&ctx, Duration::from_secs(60), clock).await;
    monitor::check_nothing_left(&ctx);

    let (outcomes, removals, marks) = net
        .table
        .lock()
        .map(|t| (t.outcomes.clone(), t.removals.clone(), t.marks.clone()))
        .unwrap_or_default();
    monitor::check_removals(&ctx, removals);
    monitor::check_marks(&ctx, marks);
    pacing::check(&ctx, &keys);
    // How often each safety guard of the protocol decided something in this run.
    let fired = crate::mutant::take_fired();
    ctx.with(|m| {
        for (guard, n) in fired {
            *m.checked.entry(guard).or_default() += n;
        }
    });
    let m = ctx.with(|m| {
        (
            std::mem::take(&mut m.violations),
            std::mem::take(&mut m.checked),
            m.grants,
            m.busy,
            m.crashes,
            m.cancels,
        )
    });
    let (violations, checked, grants, busy, crashes, cancels) = m.unwrap_or_default();
    Report {
        seed,
        violations,
        trace: trace.take(),
        outcomes,
        checked,
        grants,
        busy,
        crashes,
        cancels,
        simulated: Instant::now().saturating_duration_since(origin),
    }
}
