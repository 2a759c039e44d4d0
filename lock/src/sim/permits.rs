//! The permits family (issue 26): keys of 1 to 4 permits (`Knobs::permits`,
//! `scenario::plan_permits`), everything else as in the main family, but its operator: beside
//! setting counters back and deleting them, it recreates them as `flightlock permits --set` does
//! (`actors::operator`), so tickets are issued twice. The checks hold it to "at most N": no more
//! than N participants ever believe they hold a key (at every grant and every step of a hold),
//! FIFO across permits (a grant with N live rows below it is a violation), progress (a key with
//! a forever waiter and fewer than N live holders is granted within the handoff bound), and every
//! availability check of the main family. Five defects must each fail it: an off-by-one that lets
//! N + 1 hold, a grant that overtakes a waiter ahead (only holders counted), a seat that is not
//! counted, a release that frees another holder's permit, and a refused hint that counts tickets
//! instead of reading (issue 36).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant as StdInstant;

use super::model::Mutation;
use super::run;
use super::scenario::Knobs;
use super::tests::{caught_by, env_u64, explain_as, Coverage, SEEDS};
use crate::mutant::Mutant;

/// Permits schedules CI runs, for every `SEEDS` of the main family.
pub(super) const PERMITS_SEEDS: u64 = 400;

/// The checks the permits family must apply, or it no longer tests more than one permit.
const CHECKS: &[&str] = &[
    "at most N holders (N > 1)",
    "FIFO across permits (N > 1)",
    "progress (handoff gap)",
    "tight wait",
    "takeover (busy behind entries)",
    crate::mutant::GUARD_HINT_READS,
];

fn permits() -> Knobs {
    Knobs {
        permits: true,
        ..Knobs::default()
    }
}

#[test]
fn permits_schedules_hold_every_guarantee() {
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    let count = env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS) * PERMITS_SEEDS / SEEDS;
    let started = StdInstant::now();
    let mut coverage = Coverage::default();
    let mut failures = Vec::new();
    let (mut grants, mut busy) = (0, 0);
    for seed in first..first + count {
        let r = run(seed, permits());
        coverage.add(&r);
        grants += r.grants;
        busy += r.busy;
        if !r.violations.is_empty() {
            failures.push(explain_as(
                &r,
                "FLIGHTLOCK_SIM_PERMITS_SEED",
                "replay_permits",
            ));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let (table, missing) = coverage.table(&[], CHECKS);
    eprintln!(
        "permits simulation: {count} schedules (seeds {first}..{}) in {:.1} s; {grants} grants, \
         {busy} busy\n{table}",
        first + count,
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    if count >= PERMITS_SEEDS {
        assert!(
            missing.is_empty(),
            "checks never applied in {count} permits schedules: {missing:?}"
        );
    }
}

/// `FLIGHTLOCK_SIM_PERMITS_SEED=<n>`: runs that permits-family seed and prints its whole trace.
#[test]
fn replay_permits() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_PERMITS_SEED") else {
        return;
    };
    let seed: u64 = seed
        .parse()
        .expect("FLIGHTLOCK_SIM_PERMITS_SEED is a number");
    let r = run(seed, permits());
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}

/// A defect on keys of 2 to 4 permits only: each is shown to break "at most N" where N is more
/// than one (with one permit most of them are the lock's own defects).
fn many() -> Knobs {
    Knobs {
        many_permits: true,
        ..permits()
    }
}

fn mutant(m: Mutant) -> Knobs {
    Knobs {
        mutant: Some(m),
        ..many()
    }
}

#[test]
fn an_off_by_one_that_lets_n_plus_one_hold_is_caught() {
    caught_by(
        "permits off by one",
        mutant(Mutant::PermitsOffByOne),
        PERMITS_SEEDS,
        &["mutual exclusion", "FIFO"],
    );
}

#[test]
fn a_grant_that_ignores_an_earlier_waiter_is_caught() {
    caught_by(
        "only holders counted against the permits",
        mutant(Mutant::PermitsCountOnlyHolders),
        PERMITS_SEEDS,
        &["FIFO", "mutual exclusion"],
    );
}

#[test]
fn a_seat_not_counted_against_the_permits_is_caught() {
    caught_by(
        "seat not counted",
        mutant(Mutant::SeatNotCounted),
        PERMITS_SEEDS,
        &["mutual exclusion", "FIFO"],
    );
}

#[test]
fn a_release_that_frees_another_holders_permit_is_caught() {
    caught_by(
        "release frees another holder's permit",
        Knobs {
            mutation: Some(Mutation::ReleaseFreesOther),
            ..many()
        },
        PERMITS_SEEDS,
        &["mutual exclusion", "loss", "FIFO"],
    );
}

/// Issue 36: a refused hint that takes the counter at face value instead of reading (the fast
/// path of before, where it granted whatever was below the released entry). Only a counter set
/// back or recreated by hand (the operator of this family) can make it grant; the scripted
/// schedule (`scripted_permits.rs`) drives it exactly.
#[test]
fn a_refused_hint_that_trusts_the_counter_is_caught_after_a_set_back() {
    caught_by(
        "refused hint granted on the counter's word",
        mutant(Mutant::HintPastOthers),
        PERMITS_SEEDS,
        &["mutual exclusion", "FIFO"],
    );
}
