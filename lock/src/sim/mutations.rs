//! The mutation suite: every guarantee and every availability check must catch a deliberately
//! broken protocol within a bounded number of schedules, by the check meant to see it. A mutation
//! that survives fails its test. The defects sit where a real change could break: the heartbeat's
//! schedule, the wait deadline, the skip decision, the clock-free observer, the lost-signal path,
//! the waiters' pace, the abandonment of a cancelled enqueue, the sweeper's grace (see
//! [`super::mutant`]), and the model's conditions (see [`super::model::Mutation`]). The DynamoDB
//! shell's own conditions (`storage/dynamo.rs`) are caught by the differential test
//! (`differential.rs`), since the simulation runs the model's.

use super::model::Mutation;
use super::scenario::Knobs;
use super::tests::caught_by;
use crate::mutant::Mutant;

fn mutant(m: Mutant) -> Knobs {
    Knobs {
        mutant: Some(m),
        ..Knobs::default()
    }
}

#[test]
fn a_heartbeat_sent_every_lease_is_a_spurious_loss() {
    caught_by(
        "heartbeat every lease",
        mutant(Mutant::HeartbeatEveryLease),
        200,
        &["spurious loss"],
    );
}

#[test]
fn a_wait_that_overshoots_its_deadline_is_caught() {
    caught_by(
        "wait overshoots its deadline",
        mutant(Mutant::WaitOvershoots),
        1000,
        &["tight wait"],
    );
}

#[test]
fn a_skip_that_trusts_every_row_misses_the_takeover() {
    caught_by(
        "wait = 0 trusts dead rows",
        mutant(Mutant::SkipTrustsEveryRow),
        1000,
        &["takeover"],
    );
}

#[test]
fn a_clock_free_skip_busy_at_first_sight_misses_the_takeover() {
    let knobs = Knobs {
        mutant: Some(Mutant::BusyAtFirstSight),
        all_clock_free: true,
        ..Knobs::default()
    };
    caught_by("clock-free busy at first sight", knobs, 1000, &["takeover"]);
}

#[test]
fn a_missing_row_retried_until_the_lease_is_a_late_loss_notice() {
    caught_by(
        "gone retried until the lease",
        mutant(Mutant::GoneRetriedUntilLease),
        1000,
        &["late loss notice"],
    );
}

#[test]
fn waiters_that_look_rarely_break_progress() {
    caught_by("lazy looks", mutant(Mutant::LazyLooks), 1000, &["progress"]);
}

#[test]
fn a_dead_row_passed_over_many_leases_late_breaks_progress() {
    let knobs = Knobs {
        mutation: Some(Mutation::SlowTakeover),
        ..Knobs::default()
    };
    caught_by(
        "dead rows passed over thirty leases late",
        knobs,
        1000,
        &["progress"],
    );
}

#[test]
fn passing_waiters_ahead_breaks_fifo() {
    caught_by(
        "waiters ahead ignored",
        mutant(Mutant::WaitersAheadIgnored),
        300,
        &["FIFO", "mutual exclusion"],
    );
}

#[test]
fn a_cancelled_enqueue_that_forgets_its_rows_breaks_self_cleaning() {
    caught_by(
        "abandoned rows left",
        mutant(Mutant::AbandonLeavesRows),
        1000,
        &["self-cleaning"],
    );
}

#[test]
fn a_heartbeat_that_recreates_a_released_row_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::HeartbeatUpsert),
        ..Knobs::default()
    };
    caught_by("heartbeat upserts", knobs, 1000, &[]);
}

#[test]
fn a_sweeper_without_its_grace_removes_live_rows() {
    caught_by(
        "sweeper without its grace",
        mutant(Mutant::SweepWithoutGrace),
        2000,
        &["early removal"],
    );
}

#[test]
fn a_waiter_that_ignores_the_watermark_runs_a_done_tick_again() {
    caught_by(
        "waiter ignores the watermark",
        mutant(Mutant::WaiterIgnoresWatermark),
        1000,
        &["once per tick"],
    );
}

#[test]
fn a_release_that_marks_a_failed_run_is_caught() {
    caught_by(
        "release marks even on failure",
        mutant(Mutant::ReleaseAlwaysMarks),
        300,
        &["once per tick"],
    );
}

#[test]
fn a_seat_take_that_ignores_the_watermark_runs_a_done_tick_again() {
    let knobs = Knobs {
        mutation: Some(Mutation::EnqueueIgnoresWatermark),
        ..Knobs::default()
    };
    caught_by(
        "enqueue ignores the watermark",
        knobs,
        1000,
        &["once per tick"],
    );
}

#[test]
fn a_coalescing_waiter_that_never_withdraws_is_caught() {
    caught_by(
        "coalescing waiter never withdraws",
        mutant(Mutant::CoalesceNeverWithdraws),
        2000,
        &["coalesce"],
    );
}

/// The sweep's removal must stay conditioned on the entry it judged: without any condition, a
/// removal removes whatever the key holds when it lands, which may have changed since the
/// (eventually consistent) scan read it.
#[test]
fn a_sweep_removal_without_its_condition_removes_a_live_entry() {
    let knobs = Knobs {
        mutation: Some(Mutation::SweepUnconditional),
        ..Knobs::default()
    };
    caught_by(
        "sweep removal without its condition",
        knobs,
        2000,
        &["early removal"],
    );
}

/// Issues 25 and 26: the version ignored by one request. A waiter's look that does not check the
/// version (and permits) of the counter it reads, queued with 2 permits on a key lowered to 1,
/// is granted beside a holder (`upgrade.rs`).
#[test]
fn a_look_that_ignores_the_protocol_is_granted_beyond_the_keys_permits() {
    let planted = crate::mutant::plant(Some(Mutant::LookIgnoresProtocol));
    let caught = (0..200).find_map(|seed| {
        let run = super::upgrade::run(seed);
        run.violations.first().map(|v| format!("seed {seed}: {v}"))
    });
    drop(planted);
    match caught {
        Some(found) => eprintln!("LookIgnoresProtocol caught: {found}"),
        None => panic!("LookIgnoresProtocol survived 200 upgrade schedules"),
    }
}

/// Issue 36: the enqueue's read that does not compare the key's permits with ours. The writes
/// still refuse, so only a call that does not write meets it: a `wait = 0` on a key whose
/// permits are all held, answered busy (a silent skip) instead of refused (`upgrade.rs`).
#[test]
fn a_read_that_ignores_the_keys_permits_answers_busy_instead_of_refusing() {
    let planted = crate::mutant::plant(Some(Mutant::SurveyIgnoresPermits));
    let caught = (0..200).find_map(|seed| {
        let run = super::upgrade::run(seed);
        run.violations.first().map(|v| format!("seed {seed}: {v}"))
    });
    drop(planted);
    match caught {
        Some(found) => eprintln!("SurveyIgnoresPermits caught: {found}"),
        None => panic!("SurveyIgnoresPermits survived 200 upgrade schedules"),
    }
}

fn edge(m: Mutant) -> Knobs {
    Knobs {
        mutant: Some(m),
        lease_edge: true,
        ..Knobs::default()
    }
}

/// The guard in `locker/attempt.rs`: a look that comes back clear after our own lease ran out
/// must not grant. The main family reaches the window rarely (seed 7,972 of the long run);
/// the lease-edge family CI runs reaches it at schedule 9 (6 of its 300), and the scripted
/// schedule (`scripted_lease.rs`) drives it exactly.
#[test]
fn a_grant_on_a_look_that_outlasted_our_own_lease_gives_two_holders() {
    caught_by(
        "grant on a look that outlasted our own lease",
        edge(Mutant::GrantPastOwnLease),
        super::lease_edge::EDGE_SEEDS,
        &["mutual exclusion"],
    );
}

/// The guard in `locker.rs`: a tick id's check that outlasted the lease must not grant.
#[test]
fn a_grant_after_a_tick_check_that_outlasted_our_own_lease_gives_two_holders() {
    let knobs = Knobs {
        mutant: Some(Mutant::TickCheckPastOwnLease),
        all_clock_free: true,
        ..Knobs::default()
    };
    caught_by(
        "grant after a tick check that outlasted our own lease",
        knobs,
        666,
        &["mutual exclusion"],
    );
}

/// The one-line slip of issue 29: "has the wait run out" compares the call's start with the
/// deadline. The waiter looks on after its deadline (the tight wait check) without a pause (the
/// pacing check), until it is granted.
#[test]
fn a_wait_that_never_gives_up_is_caught_by_the_tight_wait() {
    caught_by(
        "wait never gives up",
        mutant(Mutant::WaitNeverGivesUp),
        1000,
        &["tight wait"],
    );
}

#[test]
fn a_wait_that_never_gives_up_is_a_hot_loop() {
    caught_by(
        "wait never gives up (pacing)",
        mutant(Mutant::WaitNeverGivesUp),
        1000,
        &["hot loop"],
    );
}

/// The pace without its floor: a waiter next in line looks again at once around its holder's
/// due time.
#[test]
fn a_pace_without_its_floor_is_a_hot_loop() {
    caught_by(
        "pace without its floor",
        mutant(Mutant::NoPollFloor),
        1000,
        &["hot loop"],
    );
}

/// Bounded staleness without the skew allowance: a row is removed while its owner, whose clock
/// is behind, still believes in it.
#[test]
fn staleness_without_the_allowance_is_an_early_removal() {
    caught_by(
        "stale without the allowance",
        mutant(Mutant::StaleWithoutAllowance),
        1000,
        &["early removal", "mutual exclusion"],
    );
}

/// A renewal's lease counted from its answer: the holder believes in more than the stored lease
/// promises.
#[test]
fn a_lease_counted_from_the_answer_is_caught() {
    caught_by(
        "lease counted from the answer",
        mutant(Mutant::LeaseFromAnswer),
        300,
        &["lease"],
    );
}

/// The guard in `locker.rs`: an enqueue (a seat taken) whose answer came back after our own
/// lease ran out must not grant. The lease-edge family answers a third of its seat takes after
/// the taker's lease and reaches it at schedule 0 (30 of its 300); the scripted schedule
/// (`scripted_lease.rs`) drives it exactly.
#[test]
fn a_seat_taken_past_our_own_lease_gives_two_holders() {
    caught_by(
        "seat granted past our own lease",
        edge(Mutant::EnqueuePastOwnLease),
        super::lease_edge::EDGE_SEEDS,
        &["mutual exclusion"],
    );
}

/// The enqueue's conflict backoff with its budget comparison inverted: a forever wait is told
/// busy at its first transaction conflict (the pacing and tight-wait checks cannot see it: the
/// call met a fault).
#[test]
fn a_conflict_that_gives_up_tells_a_forever_wait_busy() {
    caught_by(
        "conflict gives up",
        mutant(Mutant::ConflictGivesUp),
        1000,
        &["forever wait"],
    );
}

/// Clock-free staleness without its 1/64 margin: in the clock-rate family (`sim::rates`), a
/// watcher whose clock runs fast passes over the row of a holder whose clock runs slow while
/// that holder still believes in its lease. With one shared clock nothing could see it.
#[test]
fn staleness_without_the_margin_is_caught_when_clocks_run_at_different_rates() {
    let knobs = Knobs {
        mutant: Some(Mutant::StaleWithoutMargin),
        ..super::lease_edge::rate_knobs()
    };
    caught_by(
        "stale without the margin",
        knobs,
        super::lease_edge::RATE_MUTATION_SEEDS,
        &["mutual exclusion", "early removal"],
    );
}

/// The assumption the margin rests on, broken: monotonic clocks whose rates differ by more than
/// 1/64 (up to about 1/20) give two holders with the protocol intact, as wall clocks that agree
/// less than the allowance does (`trusting_clocks_more_than_they_agree_is_caught`).
#[test]
fn clocks_that_run_at_rates_further_apart_than_the_margin_are_caught() {
    let knobs = Knobs {
        rates_beyond_bound: true,
        ..super::lease_edge::rate_knobs()
    };
    caught_by(
        "monotonic rates beyond 1/64",
        knobs,
        super::lease_edge::RATE_MUTATION_SEEDS,
        &["mutual exclusion", "early removal"],
    );
}

/// Bounded mode without the 64th a holder believes less (`membership::believed`): a holder whose
/// monotonic clock runs slow (within 1/64) believes past the `leaseUntilMs` it wrote, while a
/// watcher whose wall clock is ahead by the allowance may pass its row over a lease after the
/// write. One shared monotonic clock could not show it; the bounded clock-rate family does.
#[test]
fn a_bounded_belief_without_its_margin_is_caught_when_clocks_run_slow() {
    let knobs = Knobs {
        mutant: Some(Mutant::BelievedWithoutMargin),
        ..super::lease_edge::bounded_rate_knobs()
    };
    caught_by(
        "bounded belief without the margin",
        knobs,
        super::lease_edge::BOUNDED_RATE_SEEDS,
        &["lease", "mutual exclusion", "early removal"],
    );
}

/// The assumption the 64th rests on, broken: bounded holders whose monotonic clocks run slower
/// than 1/64 (up to 1/40) believe past their lease with the protocol intact.
#[test]
fn bounded_clocks_slower_than_the_margin_are_caught() {
    let knobs = Knobs {
        rates_beyond_bound: true,
        ..super::lease_edge::bounded_rate_knobs()
    };
    caught_by(
        "bounded monotonic rates beyond 1/64",
        knobs,
        super::lease_edge::BOUNDED_RATE_SEEDS,
        &["lease", "mutual exclusion", "early removal"],
    );
}
