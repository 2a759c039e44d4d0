//! The actors of a schedule: the contenders (each a real [`Locker`] on a clock of its own, which
//! may crash, restart, cancel, or jump its clock), the real sweeper, TTL, and an operator who
//! makes mistakes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::availability;
use super::monitor::{check_coalesced, check_nothing_live_below, note_hold, wait_bound, Ctx};
use super::net::{Endpoint, SimClock};
use super::scenario::{ms, KeyPlan, WorkerPlan, EPOCH_MS};
use crate::options::Wait;
use crate::schema::{self, Snapshot};
use crate::{Error, Locker, ReleaseOutcome, Tick};

/// A participant: runs its cycles; after a crash, half the time a new process takes over the
/// remaining cycles a little later (a restarted container, the next Lambda sandbox), with
/// nothing remembered.
pub(super) async fn worker(ctx: Ctx, plan: WorkerPlan, key: KeyPlan, origin: Instant) {
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x5eed);
    let mut first = 0;
    for incarnation in 0u64.. {
        let mut this = plan.clone();
        this.seed = plan.seed.wrapping_add(incarnation);
        if incarnation > 0 {
            this.who = format!("{}r{incarnation}", plan.who);
        }
        match process(&ctx, &this, &key, origin, first).await {
            None => break,
            Some(crashed_at) => {
                if !rng.random_bool(0.5) {
                    return;
                }
                first = crashed_at + 1;
                let pause = ms(&mut rng, 0, 2 * crate::clock::millis(key.opts.lease) as u64);
                tokio::time::sleep(pause).await;
                ctx.note(format!(
                    "{} restarts as {}r{}",
                    plan.who,
                    plan.who,
                    incarnation + 1
                ));
            }
        }
    }
    ctx.with(|m| m.finished.insert(plan.who.clone()));
}

/// One process of a participant, from cycle `first`. `Some(cycle)`: it crashed in that cycle.
async fn process(
    ctx: &Ctx,
    plan: &WorkerPlan,
    key: &KeyPlan,
    origin: Instant,
    first: u32,
) -> Option<u32> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let clock = Arc::new(
        SimClock::new(
            EPOCH_MS,
            origin,
            plan.offset_ms,
            plan.drift_ppm,
            rng.random(),
        )
        .with_rate(super::rates::ppm(&plan.who)),
    );
    let dead = Arc::new(AtomicBool::new(false));
    let endpoint = Endpoint {
        net: ctx.net.clone(),
        who: plan.who.as_str().into(),
        dead: dead.clone(),
    };
    let locker = Locker::on(Arc::new(endpoint), "sim").with_clock(clock.clone());
    let who = plan.who.clone();
    let lease = key.opts.lease;
    // Hold lengths beyond the first draw come from a generator of their own, so the schedules
    // of the main generator (and the named ones) keep their shape.
    let mut holds = StdRng::seed_from_u64(plan.seed ^ 0x401d);
    // Ticks come from a generator of their own too: a few shared ticks, so participants
    // deliver duplicates of each other's.
    let mut ticks = StdRng::seed_from_u64(plan.seed ^ 0x71c4);
    for cycle in first..plan.cycles {
        tokio::time::sleep(ms(&mut rng, 0, crate::clock::millis(lease) as u64)).await;
        if key.opts.clock_free() && rng.random_bool(0.2) {
            let jump = rng.random_range(-3_600_000..=3_600_000);
            clock.jump(jump);
            ctx.note(format!("{who} wall clock jumps {jump:+}ms"));
        }
        let mut opts = key.opts.clone();
        opts.holder.host = Some(who.clone());
        opts.wait = match rng.random_range(0..10) {
            0..=2 => Wait::NoWait,
            3..=5 => Wait::For(ms(&mut rng, 1, 3 * crate::clock::millis(lease) as u64)),
            _ => Wait::Forever,
        };
        opts.tick = pick_tick(&mut ticks);
        opts.coalesce = opts.wait != Wait::NoWait && ticks.random_bool(0.4);
        if opts.permits > 1 {
            // Once per tick and coalescing are one-at-a-time promises (drawn all the same, so
            // the tick generator stays in step).
            opts.tick = None;
            opts.coalesce = false;
        }
        let tick = opts.tick.clone();
        let faults_at_start = ctx.faults_on.load(Ordering::SeqCst);
        let started = Instant::now();
        ctx.note(format!(
            "{who} cycle {cycle}: acquire {} wait {:?} tick {:?}",
            key.name, opts.wait, opts.tick
        ));
        let fate = rng.random_range(0..100);
        let acquired = if fate < 8 {
            // Cancelled from outside (a timeout, a signal): the future is dropped.
            let after = ms(&mut rng, 0, crate::clock::millis(lease) as u64);
            match tokio::time::timeout(after, locker.acquire(&key.name, &opts)).await {
                Ok(r) => r,
                Err(_) => {
                    ctx.note(format!("{who} cancels its acquisition after {after:?}"));
                    ctx.with(|m| {
                        m.cancels += 1;
                        m.upset(&key.name);
                    });
                    continue;
                }
            }
        } else if fate < 12 {
            // Crashes in the middle of acquiring.
            let after = ms(&mut rng, 0, crate::clock::millis(lease) as u64);
            if let Ok(r) = tokio::time::timeout(after, locker.acquire(&key.name, &opts)).await {
                if let Ok(g) = &r {
                    let wiped = ctx.wiped(&key.name);
                    ctx.with(|m| {
                        m.grant(&who, key, g.token(), g.owner(), g.lost_signal(), wiped);
                    });
                }
                std::mem::forget(r);
            }
            dead.store(true, Ordering::SeqCst);
            ctx.note(format!("{who} crashes while acquiring"));
            ctx.with(|m| {
                m.upset(&key.name);
                m.leave(&who);
                m.crashed.insert(who.clone());
                m.crashes += 1;
            });
            return Some(cycle);
        } else {
            let forever = opts.wait == Wait::Forever;
            if forever {
                ctx.with(|m| m.waiting.insert((key.name.clone(), who.clone())));
            }
            let r = locker.acquire(&key.name, &opts).await;
            if forever {
                ctx.with(|m| m.waiting.remove(&(key.name.clone(), who.clone())));
            }
            r
        };
        let elapsed = Instant::now().saturating_duration_since(started);
        let call = availability::Call {
            who: &who,
            key,
            wait: opts.wait,
            started,
            granted: acquired.is_ok(),
        };
        if matches!(acquired, Ok(_) | Err(Error::Busy { .. })) {
            availability::check_call(ctx, &call);
        }
        let guard = match acquired {
            Ok(g) => g,
            Err(Error::Busy { .. }) => {
                ctx.note(format!("{who} busy after {elapsed:?}"));
                ctx.with(|m| m.busy += 1);
                if let Some(bound) = wait_bound(opts.wait, &opts, ctx.attempt_timeout)
                    .map(|b| super::rates::true_duration(&who, b))
                {
                    if elapsed > bound {
                        ctx.violation(format!(
                            "bounded wait: {who} waited {elapsed:?} with wait {:?} (bound {bound:?})",
                            opts.wait
                        ));
                    }
                }
                continue;
            }
            Err(e @ (Error::TickDone { .. } | Error::Superseded { .. })) => {
                ctx.note(format!("{who} answered after {elapsed:?}: {e}"));
                ctx.with(|m| m.applied("tick done or superseded, not run"));
                continue;
            }
            Err(e @ Error::PermitsMismatch { .. })
                if ctx
                    .with(|m| m.tampered.contains(&key.name))
                    .unwrap_or(false) =>
            {
                // An operator recreated the key's counter by hand (a set-back of `last` on a
                // deleted counter creates a bare one): it forgot the key's permits, and the
                // participants fail closed until it is set again (documented).
                ctx.note(format!("{who} refused after {elapsed:?}: {e}"));
                ctx.with(|m| m.applied("permits forgotten by hand: fail closed"));
                continue;
            }
            Err(e) => {
                ctx.note(format!("{who} error after {elapsed:?}: {e}"));
                if !faults_at_start {
                    ctx.violation(format!("{who}: error with a healthy network: {e}"));
                }
                continue;
            }
        };
        let token = guard.token();
        ctx.note(format!(
            "{who} GRANTED {} token {token} after {elapsed:?}",
            key.name
        ));
        let wiped = ctx.wiped(&key.name);
        ctx.with(|m| m.grant(&who, key, token, guard.owner(), guard.lost_signal(), wiped));
        if let Some(t) = &tick {
            ctx.with(|m| m.run_tick(&who, &key.name, t));
        }
        if let (Some(Tick::At(t)), true) = (&tick, opts.coalesce) {
            check_coalesced(ctx, &who, key, *t);
        }
        let by_hand = ctx
            .with(|m| m.deleted_by_hand.contains(guard.owner()))
            .unwrap_or(false);
        if !by_hand {
            check_nothing_live_below(ctx, &who, &key.name, token, key.opts.permits);
        }
        let mut steps = rng.random_range(0..=6);
        // A quarter of the holds outlast several leases (up to five more): a healthy holder
        // must keep its lock through them.
        if holds.random_bool(0.25) || super::rates::holds_long(&who) {
            steps += holds.random_range(10..=25);
        }
        let held_from = Instant::now();
        for _ in 0..steps {
            tokio::time::sleep(lease / 5).await;
            ctx.with(|m| m.work(&who, &key.name, key.opts.permits));
        }
        // Whether the run succeeded (a tick is marked only then), decided by the tick generator.
        let succeeded = ticks.random_bool(0.7);
        match rng.random_range(0..10) {
            0 => {
                dead.store(true, Ordering::SeqCst);
                if let (Some(t), true) = (&tick, succeeded) {
                    // The crash window: the run succeeded, its mark never sent.
                    ctx.with(|m| m.succeeded(&key.name, t));
                    ctx.note(format!("{who} succeeded, then crashes before marking"));
                }
                ctx.note(format!("{who} crashes holding {} token {token}", key.name));
                ctx.with(|m| {
                    m.upset(&key.name);
                    m.leave(&who);
                    m.crashed.insert(who.clone());
                    m.crashes += 1;
                });
                std::mem::forget(guard);
                return Some(cycle);
            }
            1 => {
                note_hold(ctx, &who, &guard, held_from, lease);
                ctx.with(|m| m.leave(&who));
                ctx.note(format!("{who} drops its guard"));
                drop(guard);
            }
            _ => {
                note_hold(ctx, &who, &guard, held_from, lease);
                ctx.with(|m| m.leave(&who));
                let outcome = match (&tick, succeeded) {
                    (Some(t), true) => {
                        ctx.with(|m| m.succeeded(&key.name, t));
                        let outcome = guard.release_done().await;
                        if let Ok(ReleaseOutcome::Released) = outcome {
                            ctx.with(|m| m.marked(&key.name, t));
                        }
                        outcome
                    }
                    _ => guard.release().await,
                };
                ctx.note(format!(
                    "{who} released token {token}{}: {outcome:?}",
                    if tick.is_some() && succeeded {
                        " marking its tick"
                    } else {
                        ""
                    }
                ));
                if let (Ok(ReleaseOutcome::Lost), false) =
                    (&outcome, ctx.faults_on.load(Ordering::SeqCst))
                {
                    ctx.note(format!("{who} note: released a lock it had lost"));
                }
            }
        }
    }
    locker.flush().await;
    None
}

/// A cycle's tick: none (two cycles in five), one of four shared ordered ticks, or one of two
/// shared ids.
fn pick_tick(rng: &mut StdRng) -> Option<Tick> {
    match rng.random_range(0..10) {
        0..=3 => None,
        4..=8 => Some(Tick::At(EPOCH_MS + 60_000 * rng.random_range(1..=4))),
        _ => Some(Tick::Id(format!("batch-{}", rng.random_range(1..=2)))),
    }
}

pub(super) async fn sweeper(
    ctx: Ctx,
    period: Duration,
    grace: Duration,
    clock: Arc<SimClock>,
    stop: tokio_util::sync::CancellationToken,
) {
    let offset_ms = clock.offset_ms.lock().map_or(0, |o| *o);
    ctx.note(format!(
        "sweeper every {period:?}, grace {grace:?}, clock {offset_ms:+}ms"
    ));
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        sweep_once(&ctx, grace, clock.clone()).await;
    }
}

/// One sweep by the real [`Sweeper`](crate::sweep::Sweeper), through the simulated network: a
/// scan, then the conditional removal of every dead entry (rows and seats) it found.
pub(super) async fn sweep_once(ctx: &Ctx, grace: Duration, clock: Arc<SimClock>) {
    let endpoint = Endpoint {
        net: ctx.net.clone(),
        who: "sweeper".into(),
        dead: Arc::new(AtomicBool::new(false)),
    };
    let sweeper = crate::sweep::Sweeper::on(Arc::new(endpoint), "sim").with_clock(clock);
    let opts = crate::sweep::SweepOptions {
        grace,
        ..crate::sweep::SweepOptions::default()
    };
    match sweeper.sweep(&opts).await {
        Ok(summary) => ctx.note(format!(
            "sweeper: {} dead, {} deleted, {} revived, {} gone, {} errors",
            summary.dead, summary.deleted, summary.revived, summary.already_gone, summary.errors
        )),
        Err(e) => ctx.violation(format!("sweeper failed: {e}")),
    }
}

pub(super) async fn ttl(ctx: Ctx, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let net = ctx.net.clone();
        let mut table = match net.table.lock() {
            Ok(t) => t,
            Err(_) => return,
        };
        table.reap(Instant::now(), 0.3, &mut || net.roll());
    }
}

/// Operator mistakes during the fault phase: a counter deleted or lowered, a row deleted; with
/// `recreate` (the permits family), also a counter recreated as `flightlock permits --set` does.
pub(super) async fn operator(
    ctx: Ctx,
    keys: Vec<(String, u32)>,
    phase: Duration,
    seed: u64,
    recreate: bool,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + phase;
    for n in 0u64.. {
        let pause = ms(&mut rng, 200, 4_000);
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if Instant::now() >= end {
            return;
        }
        let (key, permits) = &keys[rng.random_range(0..keys.len())];
        let now = Instant::now();
        ctx.with(|m| m.operator_at.entry(key.clone()).or_default().push(now));
        let Ok(mut table) = ctx.net.table.lock() else {
            return;
        };
        let items = table.partition(key);
        let snap = Snapshot::from_items(key, &items).unwrap_or_default();
        // Deleting the counter deletes its seat's entry too: for the seat's owner that is a row
        // deleted by hand.
        let seated = snap.rows.iter().find(|r| r.seat).map(|r| r.owner.clone());
        match rng.random_range(0..if recreate { 4 } else { 3 }) {
            0 => {
                table.operator_delete(key, schema::COUNTER_SK, now);
                drop(table);
                ctx.note(format!("OPERATOR deletes the counter of {key}"));
                // Documented: a process that read "no counter" before may recreate it from its
                // old read, below tickets already used; tickets stay above every row queued,
                // not above rows already gone. Exclusion still holds; fencing is not promised.
                ctx.with(|m| {
                    m.tampered.insert(key.clone());
                    if let Some(owner) = &seated {
                        m.deleted_by_hand(owner);
                    }
                });
            }
            1 => {
                // Mostly just below the queue, where a stale ticket meets a queued row.
                let top = snap.counter.as_ref().map_or(0, |c| c.last);
                let low = snap.rows.first().map_or(0, |r| r.ticket.saturating_sub(1));
                let to = if rng.random_bool(0.7) && low <= top {
                    rng.random_range(low..=top)
                } else {
                    rng.random_range(0..=top)
                };
                table.operator_set_counter(key, to, now);
                drop(table);
                ctx.note(format!("OPERATOR sets the counter of {key} to {to}"));
                // Documented: a counter set back by hand keeps tokens above every row still
                // queued, not above the tokens of rows already gone; fencing on this key is not
                // promised from now on. (Mutual exclusion still is.)
                ctx.with(|m| m.tampered.insert(key.clone()));
            }
            3 => {
                // Deleted and recreated as `flightlock permits --set` creates a missing counter:
                // the key's permits, `last` at the highest ticket a row still carries, a
                // creation's `lastOwner`. Tickets of entries already gone are issued again.
                let highest = snap
                    .rows
                    .iter()
                    .filter(|r| !r.seat)
                    .map(|r| r.ticket)
                    .max()
                    .unwrap_or(0);
                table.operator_delete(key, schema::COUNTER_SK, now);
                let create = crate::storage::Request::CreateCounter {
                    key: key.clone(),
                    last: highest,
                    owner: schema::created_by(&format!("operator{n}"), *permits),
                    protocol: crate::protocol::Speaks::Permits(*permits).protocol(),
                    permits: *permits,
                };
                drop(table.apply(&create, now));
                drop(table);
                ctx.note(format!(
                    "OPERATOR recreates the counter of {key} at {highest} ({permits} permit(s))"
                ));
                // As a deletion: the seat's entry goes with the counter, and tokens restart
                // above the rows still queued only.
                ctx.with(|m| {
                    m.tampered.insert(key.clone());
                    if let Some(owner) = &seated {
                        m.deleted_by_hand(owner);
                    }
                });
            }
            _ => {
                if snap.rows.is_empty() {
                    continue;
                }
                let row = &snap.rows[rng.random_range(0..snap.rows.len())];
                // A seat's entry is deleted by deleting the counter that carries it.
                let sk = if row.seat {
                    schema::COUNTER_SK.to_owned()
                } else {
                    schema::queue_sk(row.ticket)
                };
                table.operator_delete(key, &sk, now);
                drop(table);
                ctx.note(format!(
                    "OPERATOR deletes {} {key} t{}",
                    if row.seat {
                        "the seated counter"
                    } else {
                        "row"
                    },
                    row.ticket
                ));
                // Its owner, holding or waiting, can only learn at its next heartbeat (a waiter
                // may be granted on a read from just before): exclusion is not promised for it.
                ctx.with(|m| {
                    m.deleted_by_hand(&row.owner);
                    if row.seat {
                        m.tampered.insert(key.clone());
                    }
                });
            }
        }
    }
}
