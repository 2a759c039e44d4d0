//! What a schedule is made of — the keys and their options, the participants and their clocks,
//! the network's weather — and how one seed generates it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::Mutation;
use super::net::Faults;
use crate::mutant;
use crate::options::{ClockSkew, LockOptions, Wait};

/// The true wall time at the start of every run, epoch ms (2026-01-01).
pub(super) const EPOCH_MS: i64 = 1_767_225_600_000;

/// Mixed into a run's seed for the sweeper's clock, so the sweeper draws nothing from the run's
/// generator (the rest of the plan does not shift when it is on).
pub(super) const SWEEPER_SEED: u64 = 0x5eeb_5eeb;

/// Mixed into a run's seed for how far the sweep's `Scan` lags behind the writes (as
/// [`SWEEPER_SEED`], so the rest of the plan does not shift).
const SCAN_LAG_SEED: u64 = 0x5ca1_1a65;

/// How far behind the writes the sweep's eventually consistent `Scan` reads in this run: up to
/// a second.
pub(super) fn plan_scan_lag(seed: u64) -> Duration {
    ms(&mut StdRng::seed_from_u64(seed ^ SCAN_LAG_SEED), 0, 1_000)
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
    /// Every key in bounded mode (the bounded clock-rate family).
    pub all_bounded: bool,
    /// A deliberate defect in the protocol's own code (see [`mutant`]).
    pub mutant: Option<mutant::Mutant>,
    /// The lease-edge family: one key, small allowances and polls, and during the fault phase
    /// one stalled participant whose heartbeats are refused and whose answers come late (half
    /// the time not at all), so its own lease runs out across its requests: its last look, its
    /// enqueue, its tick id's check (see [`plan_edge`]). A share of everyone's seat takes are
    /// answered after the taker's lease (`net.rs`, `SLOW_SEAT`).
    pub lease_edge: bool,
    /// The permits family: each key draws its permits, 1 to 4 (from a generator of its own, so
    /// the rest of the plan is the main family's), and the checks hold it to "at most N".
    pub permits: bool,
    /// With `permits`: every key has 2 to 4 (the mutation tests of the permits family, so each
    /// defect is shown on a key of more than one permit).
    pub many_permits: bool,
    /// Each participant's monotonic clock runs at a rate of its own, within the 1/64 the
    /// protocol assumes, and bounded participants' wall clocks sit at the edges of their spread
    /// (see [`super::rates`]).
    pub clock_rates: bool,
    /// A model defect: monotonic clocks' rates differ by more than the 1/64 the protocol assumes
    /// (up to about 1/20, [`super::rates::BEYOND_PPM`]); the suite must catch it.
    pub rates_beyond_bound: bool,
}

/// Mixed into a run's seed for the keys' permits (the permits family).
const PERMITS_SEED: u64 = 0x9e2b_17a5;

/// The permits family: each key's permits, 1 to 4 (twice as often above 1), drawn from a
/// generator of its own.
pub(super) fn plan_permits(seed: u64, keys: &mut [KeyPlan], many: bool) {
    let mut rng = StdRng::seed_from_u64(seed ^ PERMITS_SEED);
    for key in keys {
        key.opts.permits = [1, 2, 2, 3, 3, 4][rng.random_range(0..6)];
        if many {
            key.opts.permits = key.opts.permits.max(2);
        }
    }
}

/// One key's settings.
#[derive(Debug, Clone)]
pub(super) struct KeyPlan {
    pub(super) name: String,
    pub(super) opts: LockOptions,
    /// Half the spread of participants' wall clocks (bounded mode), ms.
    pub(super) spread_ms: i64,
}

/// One participant's plan.
#[derive(Debug, Clone)]
pub(super) struct WorkerPlan {
    pub(super) who: String,
    pub(super) key: usize,
    pub(super) cycles: u32,
    pub(super) offset_ms: i64,
    pub(super) drift_ppm: i64,
    pub(super) seed: u64,
}

pub(super) fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

pub(super) fn plan_keys(rng: &mut StdRng, knobs: &Knobs) -> Vec<KeyPlan> {
    let n = if rng.random_bool(0.6) || knobs.lease_edge {
        1
    } else {
        2
    };
    (0..n)
        .map(|i| {
            let mut lease = ms(rng, 600, 3000);
            let mut heartbeat = lease / rng.random_range(2..=4);
            let mut poll = ms(rng, 10, 80);
            let mut max_poll = poll * rng.random_range(2..=10);
            let mut allowance = ms(rng, 50, 500);
            if knobs.lease_edge {
                // Drawn after the rest, so the other families' plans do not move.
                lease = ms(rng, 1200, 3000);
                heartbeat = lease / 3;
                poll = ms(rng, 5, 20);
                max_poll = poll * rng.random_range(2..=4);
                allowance = ms(rng, 20, 100);
            }
            // Drawn in every family (but all clock-free), so `all_bounded` moves nothing else.
            let clock_free = knobs.all_clock_free || (rng.random_bool(0.3) && !knobs.all_bounded);
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

/// The network's weather during the fault phase: a network with occasional faults, or a storm
/// in which holders barely keep their leases (the schedules where late heartbeats and stale
/// judgements meet).
pub(super) fn plan_faults(rng: &mut StdRng) -> Faults {
    let storm = rng.random_bool(0.4);
    let heavy = if storm { 3.5 } else { 1.0 };
    Faults {
        refuse: rng.random_range(0.0..0.10) * heavy,
        lose_answer: rng.random_range(0.0..0.10) * heavy,
        duplicate: rng.random_range(0.0..0.05) * heavy,
        conflict: rng.random_range(0.0..0.10),
        slow: rng.random_range(0.0..0.05) * heavy,
        delay: ms(rng, 1, 30),
    }
}

/// The participants: each on one key, with its cycles, its clock and a seed of its own.
pub(super) fn plan_workers(rng: &mut StdRng, keys: &[KeyPlan], knobs: &Knobs) -> Vec<WorkerPlan> {
    // The lease-edge family wants someone behind the stalled participant to pass it over.
    let least = if knobs.lease_edge { 3 } else { 2 };
    (0..rng.random_range(least..=6))
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
        .collect()
}

/// The lease-edge family's stalled participant (one of `workers`): during the fault phase its
/// heartbeats are refused, and every other request of it is applied at once but answered
/// between one and two attempt timeouts later, half the time not at all (a
/// connection congested one way). Its lease runs out a lease after its last confirmed write,
/// whatever it is doing: looking, enqueueing, checking its tick id. Others meanwhile judge its
/// entry dead and pass it over, so a request of it that comes back after that must not grant.
pub(super) fn plan_edge(rng: &mut StdRng, workers: &[WorkerPlan]) -> Option<String> {
    let i = rng.random_range(0..workers.len().max(1));
    workers.get(i).map(|w| w.who.clone())
}
