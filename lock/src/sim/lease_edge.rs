//! The lease-edge family's test: a stalled participant's own lease runs out across its requests
//! (`Knobs::lease_edge`, `scenario::plan_edge`), so the guards that keep such an entry from being
//! granted decide, and a defect in one of them breaks mutual exclusion within CI's schedules.
//! Beside it, the clock-rate families (`sim::rates`): the same stall with monotonic clocks at
//! rates of their own, clock-free (where the 1/64 margin of clock-free staleness decides) and
//! bounded (where the 64th a holder believes less decides, its wall clock behind its watchers'
//! by the whole allowance).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant as StdInstant;

use super::run;
use super::scenario::Knobs;
use super::tests::{env_u64, explain_as, Coverage, SEEDS};

/// Lease-edge schedules CI runs (`Knobs::lease_edge`), for every `SEEDS` of the main family.
pub(super) const EDGE_SEEDS: u64 = 300;

/// The safety guards the lease-edge family must see fire (each decided something in some
/// schedule), or the schedules no longer reach the window they guard.
const GUARDS: &[&str] = &[crate::mutant::GUARD_LOOK, crate::mutant::GUARD_ENQUEUE];

/// The lease-edge family: a stalled participant's own lease runs out across its requests (see
/// `scenario::plan_edge`). Every guarantee holds, and the guards that keep an entry whose lease
/// ran out from being granted fire.
#[test]
fn lease_edge_schedules_hold_every_guarantee() {
    let knobs = Knobs {
        lease_edge: true,
        ..Knobs::default()
    };
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    let count = env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS) * EDGE_SEEDS / SEEDS;
    let started = StdInstant::now();
    let mut coverage = Coverage::default();
    let mut failures = Vec::new();
    for seed in first..first + count {
        let r = run(seed, knobs);
        coverage.add(&r);
        if !r.violations.is_empty() {
            failures.push(explain_as(
                &r,
                "FLIGHTLOCK_SIM_EDGE_SEED",
                "replay_lease_edge",
            ));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let (table, _) = coverage.table(&[], GUARDS);
    eprintln!(
        "lease-edge simulation: {count} schedules (seeds {first}..{}) in {:.1} s\n{table}",
        first + count,
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    if count >= EDGE_SEEDS {
        let silent: Vec<&&str> = GUARDS
            .iter()
            .filter(|g| coverage.checked.get(**g).copied().unwrap_or(0) == 0)
            .collect();
        assert!(
            silent.is_empty(),
            "guards that never fired in {count} lease-edge schedules: {silent:?} (the family \
             no longer reaches the window they guard)"
        );
    }
}

/// Clock-rate schedules CI runs (`Knobs::clock_rates`), for every `SEEDS` of the main family.
pub(super) const RATE_SEEDS: u64 = 150;

/// How many clock-rate schedules a mutation may survive (each test stops at its first catch).
pub(super) const RATE_MUTATION_SEEDS: u64 = 300;

/// The clock-rate family: the lease-edge family, every key clock-free, each participant's
/// monotonic clock at a rate of its own within the 1/64 the protocol assumes (see
/// `sim::rates`): the stalled participant's slow, everyone else's fast, its renewals refused
/// once one landed while others watched it. Every guarantee holds, and the margin of clock-free
/// staleness decides (a row a lease old on the watcher's clock, not yet a lease and 1/64).
pub(super) fn rate_knobs() -> Knobs {
    Knobs {
        lease_edge: true,
        all_clock_free: true,
        clock_rates: true,
        ..Knobs::default()
    }
}

#[test]
fn clock_rate_schedules_hold_every_guarantee() {
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    let count = env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS) * RATE_SEEDS / SEEDS;
    let started = StdInstant::now();
    let mut coverage = Coverage::default();
    let mut failures = Vec::new();
    for seed in first..first + count {
        let r = run(seed, rate_knobs());
        coverage.add(&r);
        if !r.violations.is_empty() {
            failures.push(explain_as(
                &r,
                "FLIGHTLOCK_SIM_RATE_SEED",
                "replay_clock_rates",
            ));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let (table, _) = coverage.table(&[], &[crate::mutant::GUARD_MARGIN]);
    eprintln!(
        "clock-rate simulation: {count} schedules (seeds {first}..{}) in {:.1} s\n{table}",
        first + count,
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let margin = coverage
        .checked
        .get(crate::mutant::GUARD_MARGIN)
        .copied()
        .unwrap_or(0);
    assert!(
        count < RATE_SEEDS || margin > 0,
        "the margin of clock-free staleness never decided in {count} clock-rate schedules (the \
         family no longer reaches the window it covers)"
    );
}

/// Bounded clock-rate schedules CI runs (`bounded_rate_knobs`), for every `SEEDS` of the main
/// family. Few: the margin decides at every renewal of a slow clock (145 times in these 20),
/// and a defect in it is caught at the first (`mutations.rs`).
pub(super) const BOUNDED_RATE_SEEDS: u64 = 20;

/// The bounded clock-rate family: the clock-rate family with every key in bounded mode, each
/// participant's monotonic clock at a rate of its own within 1/64 (the stalled participant's
/// slow), and wall clocks at the edges of the allowance (the stalled participant's behind its
/// watchers' by all of it: `rates::edge_offsets`). Every guarantee holds, and the 64th a bounded
/// holder believes less (`membership::believed`) keeps each slow clock's belief inside the lease
/// its version promises.
pub(super) fn bounded_rate_knobs() -> Knobs {
    Knobs {
        all_bounded: true,
        all_clock_free: false,
        ..rate_knobs()
    }
}

#[test]
fn bounded_clock_rate_schedules_hold_every_guarantee() {
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    let count = env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS) * BOUNDED_RATE_SEEDS / SEEDS;
    let started = StdInstant::now();
    let mut coverage = Coverage::default();
    let mut failures = Vec::new();
    for seed in first..first + count {
        let r = run(seed, bounded_rate_knobs());
        coverage.add(&r);
        if !r.violations.is_empty() {
            failures.push(explain_as(
                &r,
                "FLIGHTLOCK_SIM_BOUNDED_RATE_SEED",
                "replay_bounded_clock_rates",
            ));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let (table, _) = coverage.table(&[], &[crate::mutant::GUARD_BELIEVED]);
    eprintln!(
        "bounded clock-rate simulation: {count} schedules (seeds {first}..{}) in {:.1} s\n{table}",
        first + count,
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let margin = coverage
        .checked
        .get(crate::mutant::GUARD_BELIEVED)
        .copied()
        .unwrap_or(0);
    assert!(
        count < BOUNDED_RATE_SEEDS || margin > 0,
        "no bounded holder with a slow clock was checked in {count} bounded clock-rate schedules \
         (the family no longer reaches the window the 64th covers)"
    );
}
