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
//!    allowance in bounded mode; in clock-free mode they are hours apart, drift and jump.
//! 2. Fencing: tokens granted on a key strictly increase (an operator who deletes a counter while
//!    the queue is empty resets them: documented, not a violation).
//! 3. FIFO and self-cleaning safety: no queue row is removed by a waiter, the sweeper or TTL less
//!    than its lease after its last write (its owner may be alive); no grant passes over a row
//!    below it that is still live.
//! 4. Bounded waits: a `wait = 0` or `wait = d` acquisition returns within its documented bound.
//! 5. Liveness: once faults stop, every participant finishes its cycles; a few seconds after,
//!    no row of a participant that did not crash is left; after TTL and the sweeper have had
//!    their time, no row at all.
//! 6. Availability ([`availability`]): no spurious loss, prompt loss notice, tight waits,
//!    takeover in every wait mode, progress under contention, each with the exact bound
//!    PROTOCOL.md states. Deliberate defects in the protocol's own code ([`mutant`]) show each
//!    check failing (`mutations.rs`); the run counts every kind of answer the table gave, and
//!    how often each check applied, for the coverage table.
//!
//! **Replaying a seed**: `FLIGHTLOCK_SIM_SEED=<seed> cargo test -p flightlock --lib
//! sim::tests::replay -- --nocapture` prints the whole trace.

mod availability;
#[cfg(test)]
mod differential;
pub(crate) mod model;
pub(crate) mod mutant;
#[cfg(test)]
mod mutations;
pub(crate) mod net;
#[cfg(test)]
mod scripted;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::options::{ClockSkew, LockOptions, Wait, CLOCK_FREE_GRACE};
use crate::schema::{self, QueueRow, Snapshot};
use crate::{Error, Locker, LostSignal, ReleaseOutcome};
use model::{Mutation, Outcomes, Table};
use net::{Endpoint, Faults, Net, SimClock};

/// The true wall time at the start of every run, epoch ms (2026-01-01).
const EPOCH_MS: i64 = 1_767_225_600_000;

/// Mixed into a run's seed for the sweeper's clock, so the sweeper draws nothing from the run's
/// generator (the rest of the plan does not shift when it is on).
const SWEEPER_SEED: u64 = 0x5eeb_5eeb;

/// The run's trace: one line per event, with the simulated time.
#[derive(Clone, Default)]
pub(crate) struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
    origin: Arc<Mutex<Option<Instant>>>,
}

impl Trace {
    pub(crate) fn line(&self, text: String) {
        let now = Instant::now();
        let origin = self
            .origin
            .lock()
            .map(|mut o| *o.get_or_insert(now))
            .unwrap_or(now);
        let ms = now.saturating_duration_since(origin).as_millis();
        if let Ok(mut l) = self.lines.lock() {
            l.push(format!("{ms:>9}ms {text}"));
        }
    }

    fn take(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// What a run may vary beyond its seed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Knobs {
    /// A deliberate defect (to show the checks can fail).
    pub mutation: Option<Mutation>,
    /// Participants are told a skew allowance four times smaller than their clocks' spread.
    pub understate_skew: bool,
    /// Every key in clock-free mode.
    pub all_clock_free: bool,
    /// A deliberate defect in the protocol's own code (see [`mutant`]).
    pub mutant: Option<mutant::Mutant>,
}

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

/// One key's settings.
#[derive(Debug, Clone)]
struct KeyPlan {
    name: String,
    opts: LockOptions,
    /// Half the spread of participants' wall clocks (bounded mode), ms.
    spread_ms: i64,
}

/// One participant's plan.
#[derive(Debug, Clone)]
struct WorkerPlan {
    who: String,
    key: usize,
    cycles: u32,
    offset_ms: i64,
    drift_ppm: i64,
    seed: u64,
}

struct Holder {
    who: String,
    key: String,
    token: u64,
    owner: String,
    lost: LostSignal,
    exempt: bool,
    /// The key's heartbeat interval and lease.
    interval: Duration,
    lease: Duration,
    /// When the monitor saw the lost signal (or reported a late one).
    lost_at: Option<Instant>,
}

/// The checker's view of who holds what.
#[derive(Default)]
struct Monitor {
    holders: Vec<Holder>,
    max_token: BTreeMap<String, u64>,
    /// Keys whose counter an operator set back.
    tampered: BTreeSet<String>,
    /// Owners whose row an operator deleted: until their next heartbeat they cannot know, so
    /// exclusion is not promised for them (documented).
    deleted_by_hand: BTreeSet<String>,
    violations: Vec<String>,
    crashed: BTreeSet<String>,
    finished: BTreeSet<String>,
    /// (key, who) of participants inside an acquisition that waits forever.
    waiting: BTreeSet<(String, String)>,
    /// When an operator acted on each key.
    operator_at: BTreeMap<String, Vec<Instant>>,
    /// The last crash or cancellation of a participant on each key.
    upset_at: BTreeMap<String, Instant>,
    /// How often each availability check applied.
    checked: BTreeMap<&'static str, u64>,
    grants: u64,
    busy: u64,
    crashes: u64,
    cancels: u64,
}

impl Monitor {
    fn applied(&mut self, check: &'static str) {
        *self.checked.entry(check).or_default() += 1;
    }

    /// A participant on `key` crashed or cancelled an acquisition.
    fn upset(&mut self, key: &str) {
        self.upset_at.insert(key.to_owned(), Instant::now());
    }

    fn believers<'a>(&'a self, key: &'a str, except: &'a str) -> impl Iterator<Item = &'a Holder> {
        self.holders.iter().filter(move |h| {
            h.key == key && h.who != except && !h.exempt && h.lost.reason().is_none()
        })
    }

    fn grant(
        &mut self,
        who: &str,
        plan: &KeyPlan,
        token: u64,
        owner: &str,
        lost: LostSignal,
        wiped: bool,
    ) {
        let key = plan.name.as_str();
        self.grants += 1;
        let exempt = self.deleted_by_hand.contains(owner);
        let others: Vec<String> = self
            .believers(key, who)
            .map(|h| format!("{} (token {})", h.who, h.token))
            .collect();
        if !others.is_empty() && !exempt {
            self.violations.push(format!(
                "mutual exclusion: {who} granted {key} with token {token} while {} still \
                 believes it holds it",
                others.join(", ")
            ));
        }
        let max = self.max_token.entry(key.to_owned()).or_insert(0);
        if wiped {
            // The partition was empty at some point since the last grant: nothing remembers the
            // tokens (the counter was deleted by hand). Documented, not a violation.
            *max = 0;
        }
        if token <= *max && !self.tampered.contains(key) && !exempt {
            self.violations.push(format!(
                "fencing: {who} granted {key} with token {token}, not above {max}"
            ));
        }
        if !exempt {
            *max = (*max).max(token);
        }
        self.holders.push(Holder {
            who: who.to_owned(),
            key: key.to_owned(),
            token,
            owner: owner.to_owned(),
            lost,
            exempt,
            interval: plan.opts.heartbeat_interval(),
            lease: plan.opts.lease,
            lost_at: None,
        });
    }

    fn work(&mut self, who: &str, key: &str) {
        let believes = self
            .holders
            .iter()
            .any(|h| h.who == who && h.key == key && h.lost.reason().is_none() && !h.exempt);
        if !believes {
            return;
        }
        let others: Vec<String> = self.believers(key, who).map(|h| h.who.clone()).collect();
        if !others.is_empty() {
            self.violations.push(format!(
                "mutual exclusion: {who} works on {key} while {} also believes it holds it",
                others.join(", ")
            ));
        }
    }

    fn leave(&mut self, who: &str) {
        self.holders.retain(|h| h.who != who);
    }

    /// An operator deleted `owner`'s entry by hand.
    fn deleted_by_hand(&mut self, owner: &str) {
        for h in self.holders.iter_mut().filter(|h| h.owner == owner) {
            h.exempt = true;
        }
        self.deleted_by_hand.insert(owner.to_owned());
    }
}

/// Everything a participant task needs.
#[derive(Clone)]
struct Ctx {
    net: Arc<Net>,
    monitor: Arc<Mutex<Monitor>>,
    faults_on: Arc<AtomicBool>,
    attempt_timeout: Duration,
}

impl Ctx {
    fn note(&self, text: String) {
        self.net.trace.line(text);
    }

    fn with<R>(&self, f: impl FnOnce(&mut Monitor) -> R) -> Option<R> {
        self.monitor.lock().ok().map(|mut m| f(&mut m))
    }

    /// How long before `at` a record version was first sent.
    fn age(&self, rvn: &str, at: Instant) -> Option<Duration> {
        let sent = self.net.sent.lock().ok()?.get(rvn).copied()?;
        Some(at.saturating_duration_since(sent))
    }

    /// Whether the key's partition was empty at some point since the last look.
    fn wiped(&self, key: &str) -> bool {
        self.net.table.lock().is_ok_and(|mut t| t.wiped.remove(key))
    }

    fn violation(&self, text: String) {
        self.note(format!("VIOLATION {text}"));
        self.with(|m| m.violations.push(text));
    }
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

fn plan_keys(rng: &mut StdRng, knobs: &Knobs) -> Vec<KeyPlan> {
    let n = if rng.random_bool(0.6) { 1 } else { 2 };
    (0..n)
        .map(|i| {
            let lease = ms(rng, 600, 3000);
            let heartbeat = lease / rng.random_range(2..=4);
            let poll = ms(rng, 10, 80);
            let max_poll = poll * rng.random_range(2..=10);
            let allowance = ms(rng, 50, 500);
            let clock_free = knobs.all_clock_free || rng.random_bool(0.3);
            let spread_ms = crate::clock::millis(allowance) / 2;
            let told = if knobs.understate_skew {
                allowance / 4
            } else {
                allowance
            };
            let opts = LockOptions {
                wait: Wait::Forever,
                lease,
                heartbeat: Some(heartbeat),
                poll,
                max_poll,
                clock_skew: if clock_free {
                    ClockSkew::Unbounded
                } else {
                    ClockSkew::Bounded(told)
                },
                ttl_grace: allowance + ms(rng, 0, 5000),
                ..LockOptions::default()
            };
            KeyPlan {
                name: format!("k{i}"),
                opts,
                spread_ms,
            }
        })
        .collect()
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
    runtime.block_on(simulate(seed, knobs))
}

async fn simulate(seed: u64, knobs: Knobs) -> Report {
    let _planted = mutant::plant(knobs.mutant);
    let origin = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let keys = plan_keys(&mut rng, &knobs);
    let min_lease = keys.iter().map(|k| k.opts.lease).min().unwrap_or_default();
    let attempt_timeout = min_lease / 4;
    let mut table = Table::new(origin, EPOCH_MS);
    table.page_size = rng.random_range(1..=4);
    table.mutation = knobs.mutation;
    let trace = Trace::default();
    let fault_phase = ms(&mut rng, 5_000, 30_000);
    // Two kinds of weather: a network with occasional faults, and a storm in which holders
    // barely keep their leases (the schedules where late heartbeats and stale judgements meet).
    let storm = rng.random_bool(0.4);
    let heavy = if storm { 3.5 } else { 1.0 };
    let faults = Faults {
        refuse: rng.random_range(0.0..0.10) * heavy,
        lose_answer: rng.random_range(0.0..0.10) * heavy,
        duplicate: rng.random_range(0.0..0.05) * heavy,
        conflict: rng.random_range(0.0..0.10),
        slow: rng.random_range(0.0..0.05) * heavy,
        delay: ms(&mut rng, 1, 30),
    };
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
        round_trip: faults.delay.max(Faults::CALM.delay) * 2 + Duration::from_millis(1),
    });
    let ctx = Ctx {
        net: net.clone(),
        monitor: Arc::default(),
        faults_on: Arc::new(AtomicBool::new(true)),
        attempt_timeout,
    };
    ctx.note(format!(
        "seed {seed}: keys {:?}, faults {faults:?} for {fault_phase:?}, pages of {}",
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
        net.table.lock().map(|t| t.page_size).unwrap_or(0)
    ));

    let workers: Vec<WorkerPlan> = (0..rng.random_range(2..=6))
        .map(|i| {
            let key = rng.random_range(0..keys.len());
            let (offset_ms, drift_ppm) = if keys[key].opts.clock_free() {
                (
                    rng.random_range(-12 * 3_600_000..=12 * 3_600_000),
                    rng.random_range(-200..=200),
                )
            } else {
                let s = keys[key].spread_ms;
                (rng.random_range(-s..=s), 0)
            };
            WorkerPlan {
                who: format!("p{i}"),
                key,
                cycles: rng.random_range(1..=4),
                offset_ms,
                drift_ppm,
                seed: rng.random(),
            }
        })
        .collect();
    for w in &workers {
        ctx.note(format!(
            "{} on {} for {} cycles, clock {:+}ms drift {}ppm",
            w.who, keys[w.key].name, w.cycles, w.offset_ms, w.drift_ppm
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
        tokio::spawn(sweeper(
            ctx.clone(),
            period,
            grace,
            clock,
            background.clone(),
        ));
    }
    tokio::spawn(ttl(ctx.clone(), background.clone()));
    tokio::spawn(lease_watch(ctx.clone(), background.clone()));
    if rng.random_bool(0.5) {
        let names: Vec<String> = keys.iter().map(|k| k.name.clone()).collect();
        tokio::spawn(operator(
            ctx.clone(),
            names,
            fault_phase,
            rng.random(),
            background.clone(),
        ));
    }

    let mut tasks = Vec::new();
    for w in workers.clone() {
        let key = keys[w.key].clone();
        tasks.push(tokio::spawn(worker(ctx.clone(), w, key, origin)));
    }

    // Faults stop after the fault phase; then every participant must finish.
    tokio::time::sleep(fault_phase).await;
    ctx.faults_on.store(false, Ordering::SeqCst);
    if let Ok(mut f) = net.faults.lock() {
        *f = Faults::CALM;
    }
    ctx.note("faults stop".into());
    tokio::spawn(stuck_watch(ctx.clone(), keys.clone(), background.clone()));
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
    let crashed = ctx.with(|m| m.crashed.clone()).unwrap_or_default();
    for (key, row) in rows(&net) {
        let who = row.holder.host.clone().unwrap_or_default();
        if !crashed.contains(&who) {
            ctx.violation(format!(
                "self-cleaning: row {key} t{} of {who}, which did not crash, is left after it \
                 finished",
                row.ticket
            ));
        }
    }

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
    sweep_once(&ctx, Duration::from_secs(60), clock).await;
    for (key, row) in rows(&net) {
        ctx.violation(format!(
            "self-cleaning: row {key} t{} of {:?} outlived TTL",
            row.ticket, row.holder.host
        ));
    }

    let (outcomes, removals) = net
        .table
        .lock()
        .map(|t| (t.outcomes.clone(), t.removals.clone()))
        .unwrap_or_default();
    for r in removals {
        let Some(age) = ctx.age(&r.rvn, r.at) else {
            continue;
        };
        if age < r.lease {
            ctx.violation(format!(
                "early removal: {} t{} removed by {:?} {age:?} after its version was sent \
                 (lease {:?}): its owner may still believe in it",
                r.key, r.ticket, r.by, r.lease
            ));
        }
    }
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

/// Every queue row in the table, decoded.
fn rows(net: &Net) -> Vec<(String, QueueRow)> {
    let Ok(table) = net.table.lock() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for key in table.keys() {
        let items = table.partition(&key);
        for item in &items {
            if let Ok(row) = QueueRow::from_item(&key, item) {
                out.push((key.clone(), row));
            }
        }
    }
    out
}

/// How an acquisition with `wait` may take at most: the wait, the floor of the retry budget for
/// transient failures, a clock-free watch of the row ahead, and removing our row on the way out.
fn wait_bound(wait: Wait, opts: &LockOptions, attempt_timeout: Duration) -> Option<Duration> {
    let wait = wait.as_duration()?;
    Some(
        wait + Duration::from_secs(5)
            + attempt_timeout * 4
            + opts.lease * 2
            + opts.max_poll * 2
            + Duration::from_secs(6),
    )
}

/// A participant: runs its cycles; after a crash, half the time a new process takes over the
/// remaining cycles a little later (a restarted container, the next Lambda sandbox), with
/// nothing remembered.
async fn worker(ctx: Ctx, plan: WorkerPlan, key: KeyPlan, origin: Instant) {
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
    let clock = Arc::new(SimClock::new(
        EPOCH_MS,
        origin,
        plan.offset_ms,
        plan.drift_ppm,
        rng.random(),
    ));
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
        let faults_at_start = ctx.faults_on.load(Ordering::SeqCst);
        let started = Instant::now();
        ctx.note(format!(
            "{who} cycle {cycle}: acquire {} wait {:?}",
            key.name, opts.wait
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
                if let Some(bound) = wait_bound(opts.wait, &opts, ctx.attempt_timeout) {
                    if elapsed > bound {
                        ctx.violation(format!(
                            "bounded wait: {who} waited {elapsed:?} with wait {:?} (bound {bound:?})",
                            opts.wait
                        ));
                    }
                }
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
        let by_hand = ctx
            .with(|m| m.deleted_by_hand.contains(guard.owner()))
            .unwrap_or(false);
        if !by_hand {
            check_nothing_live_below(ctx, &who, &key.name, token);
        }
        let mut steps = rng.random_range(0..=6);
        // A quarter of the holds outlast several leases (up to five more): a healthy holder
        // must keep its lock through them.
        if holds.random_bool(0.25) {
            steps += holds.random_range(10..=25);
        }
        let held_from = Instant::now();
        for _ in 0..steps {
            tokio::time::sleep(lease / 5).await;
            ctx.with(|m| m.work(&who, &key.name));
        }
        match rng.random_range(0..10) {
            0 => {
                dead.store(true, Ordering::SeqCst);
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
                let outcome = guard.release().await;
                ctx.note(format!("{who} released token {token}: {outcome:?}"));
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

/// Counts a hold that outlasted three leases with its lock (the no-spurious-loss check needs
/// them: a defect that loses healthy locks after a lease shows only there).
fn note_hold(ctx: &Ctx, who: &str, guard: &crate::LockGuard, from: Instant, lease: Duration) {
    let long = Instant::now().saturating_duration_since(from) >= lease * 3;
    if long && guard.lost_reason().is_none() && !ctx.net.faulted(who, from, Instant::now()) {
        ctx.with(|m| m.applied("hold kept over 3+ leases, fault-free"));
    }
}

/// FIFO: at a grant, no row below ours may still be live (its version sent less than its lease
/// ago).
fn check_nothing_live_below(ctx: &Ctx, who: &str, key: &str, token: u64) {
    let now = Instant::now();
    let Ok(table) = ctx.net.table.lock() else {
        return;
    };
    let Ok(snap) = Snapshot::from_items(key, &table.partition(key)) else {
        return;
    };
    drop(table);
    for row in snap.rows.iter().filter(|r| r.ticket < token) {
        if let Some(age) = ctx.age(&row.rvn, now) {
            let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
            if age < lease {
                ctx.violation(format!(
                    "FIFO: {who} granted {key} token {token} past row t{} sent {age:?} ago \
                     (lease {lease:?})",
                    row.ticket
                ));
            }
        }
    }
}

async fn sweeper(
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
async fn sweep_once(ctx: &Ctx, grace: Duration, clock: Arc<SimClock>) {
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

/// Guarantee 4 and progress once faults stop: a key where someone waits forever and nobody
/// live holds it must be granted within [`availability::gap_bound`] of the gap's start (or of
/// the key's last crash or cancellation): every dead entry is stale by then and two looks have
/// passed it over. A queue that only the sweeper or TTL could free breaks it, and so does a
/// waiter that looks too rarely.
async fn stuck_watch(ctx: Ctx, keys: Vec<KeyPlan>, stop: tokio_util::sync::CancellationToken) {
    let mut since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let now = Instant::now();
        for key in &keys {
            let (waiting, held, upset) = ctx
                .with(|m| {
                    (
                        m.waiting.iter().any(|(k, _)| *k == key.name),
                        // Anyone who believes it holds, exempt from the exclusion checks or
                        // not: an owner whose earlier entry an operator deleted may hold a
                        // later one of its own by right.
                        m.holders
                            .iter()
                            .any(|h| h.key == key.name && h.lost.reason().is_none()),
                        m.upset_at.get(&key.name).copied(),
                    )
                })
                .unwrap_or((false, true, None));
            if !waiting || held {
                if since.remove(&key.name).is_some() {
                    ctx.with(|m| m.applied("progress (handoff gap)"));
                }
                continue;
            }
            let start = *since.entry(key.name.clone()).or_insert(now);
            // A crash or a cancellation during the gap leaves a dead entry of its own: the gap
            // counts from the last one.
            let start = upset.map_or(start, |u| u.max(start));
            let bound = availability::gap_bound(key, ctx.attempt_timeout);
            if now - start > bound {
                ctx.violation(format!(
                    "progress: {} has a forever waiter and no live holder for {:?} after faults \
                     stopped (bound {bound:?})",
                    key.name,
                    now - start
                ));
                since.insert(key.name.clone(), now);
            }
        }
    }
}

/// Every 20 ms: the version of each holder's row in the table must promise at least the lease
/// its holder believes in (its version was sent no earlier than one lease before the holder's
/// deadline). A lease rolled back by a late write breaks this at once, whether or not a waiter
/// happens to exploit it. The availability checks of holders run at the same pace.
async fn lease_watch(ctx: Ctx, stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        availability::check_holders(&ctx);
        let holders: Vec<(String, String, u64, Instant)> = ctx
            .with(|m| {
                m.holders
                    .iter()
                    .filter(|h| !h.exempt)
                    .filter_map(|h| {
                        Some((h.who.clone(), h.key.clone(), h.token, h.lost.valid_until()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (who, key, token, until) in holders {
            let row = ctx.net.table.lock().ok().and_then(|t| {
                t.partition(&key)
                    .iter()
                    .filter_map(|i| QueueRow::from_item(&key, i).ok())
                    .find(|r| r.ticket == token)
            });
            let Some(row) = row else { continue };
            let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
            let sent = ctx
                .net
                .sent
                .lock()
                .ok()
                .and_then(|s| s.get(&row.rvn).copied());
            if let Some(sent) = sent {
                if sent + lease < until {
                    ctx.violation(format!(
                        "lease: {who} believes in {key} t{token} until {:?} from now, but the \
                         stored version promises only {:?}",
                        until.saturating_duration_since(Instant::now()),
                        (sent + lease).saturating_duration_since(Instant::now())
                    ));
                    return;
                }
            }
        }
    }
}

async fn ttl(ctx: Ctx, stop: tokio_util::sync::CancellationToken) {
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

/// Operator mistakes during the fault phase: a counter deleted or lowered, a row deleted.
async fn operator(
    ctx: Ctx,
    keys: Vec<String>,
    phase: Duration,
    seed: u64,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + phase;
    loop {
        let pause = ms(&mut rng, 200, 4_000);
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if Instant::now() >= end {
            return;
        }
        let key = &keys[rng.random_range(0..keys.len())];
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
        match rng.random_range(0..3) {
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
