//! The lease-edge family's test: a stalled participant's own lease runs out across its requests
//! (`Knobs::lease_edge`, `scenario::plan_edge`), so the guards that keep such an entry from being
//! granted decide, and a defect in one of them breaks mutual exclusion within CI's schedules.

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
