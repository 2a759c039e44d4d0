//! The simulation's tests: many seeds against every guarantee, determinism, and proof that the
//! checks fail on a deliberately broken protocol.
//!
//! `FLIGHTLOCK_SIM_SEEDS` sets how many schedules the main test explores (default 2,000, and a
//! third as many all clock-free: well under a minute) and `FLIGHTLOCK_SIM_FIRST_SEED` where they
//! start (default 0, so CI is reproducible). `scripts/sim [SEEDS [FIRST]]` is the long run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant as StdInstant};

use super::model::{Mutation, Table};
use super::scenario::Knobs;
use super::{run, Report};
use crate::storage::{Enqueue, EnqueueRequest, Request, Response};

/// Schedules the main test explores by default (and a third as many all clock-free). The test
/// build is optimised (`[profile.test.package.flightlock]`), which pays for twice the 1,000 the
/// debug build could afford, and the rarer answers need them.
pub(super) const SEEDS: u64 = 2000;

pub(super) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(super) fn explain(r: &Report) -> String {
    explain_as(r, "FLIGHTLOCK_SIM_SEED", "replay")
}

/// As [`explain`], with the replay command of another family of schedules.
pub(super) fn explain_as(r: &Report, var: &str, test: &str) -> String {
    let tail: Vec<&String> = r.trace.iter().rev().take(80).collect();
    let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
    format!(
        "seed {} broke {} guarantee(s):\n  {}\nlast trace lines:\n{}\nreplay: \
         {var}={} cargo test -p flightlock --lib sim::tests::{test} -- --nocapture",
        r.seed,
        r.violations.len(),
        r.violations.join("\n  "),
        tail.join("\n"),
        r.seed
    )
}

/// Every kind of answer the protocol distinguishes, which the CI seeds must reach (a kind at zero
/// fails the run: the path behind it went untested).
const KINDS: &[&str] = &[
    "Enqueue Done",
    "Enqueue CounterAt",
    "Enqueue OursOlder",
    "Enqueue Conflict",
    "TakeSeat Done",
    "TakeSeat CounterAt",
    "TakeSeat AlreadyOurs",
    "TakeSeat OursOlder",
    "TakeSeat Conflict",
    "Heartbeat Renewed",
    "Heartbeat Superseded",
    "Heartbeat Gone",
    "seat Heartbeat Renewed",
    "seat Heartbeat Superseded",
    "seat Heartbeat Gone",
    "DeleteStale Deleted",
    "DeleteStale Gone",
    "DeleteStale Revived",
    "seat DeleteStale Deleted",
    "seat DeleteStale Gone",
    "DeleteOwned Yes",
    "DeleteOwned No",
    "seat DeleteOwned Yes",
    "seat DeleteOwned No",
    "CreateCounter true",
    "CreateCounter false",
    "Query page",
];

/// Kinds the CI seeds need not reach, and why; the differential test meets each against
/// DynamoDB Local (`differential.rs`), and the long run (`scripts/sim`) shows the rare ones.
const KINDS_ELSEWHERE: &[(&str, &str)] = &[
    (
        "Enqueue AlreadyOurs",
        "never in a simulated run: a retry resends its request under the same token, answered \
         Done for DynamoDB's 10 minutes",
    ),
    (
        "Enqueue TicketTaken",
        "rare (1 in 20,000 schedules): the counter set back by hand to what an enqueuer read, \
         below a queued row",
    ),
    (
        "seat DeleteStale Revived",
        "rare (47 in 20,000 schedules): a seat's late heartbeat landing within a stale delete's \
         flight (named schedule 2123 keeps a row's Revived)",
    ),
];

/// The availability checks (and the paths they need) that must apply in the CI seeds.
const CHECKS: &[&str] = &[
    "tight wait",
    "takeover (busy behind entries)",
    "loss judged",
    "loss notice (entry removed under a holder)",
    "progress (handoff gap)",
    "hold kept over 3+ leases, fault-free",
    "tight wait: no look after the last",
    super::pacing::LOOKS,
    super::pacing::BEATS,
    super::pacing::RETRIES,
    "forever wait never busy",
];

/// Sums of a family of runs: answers by kind, checks applied, paths taken.
#[derive(Default)]
pub(super) struct Coverage {
    pub outcomes: super::model::Outcomes,
    pub checked: std::collections::BTreeMap<&'static str, u64>,
}

impl Coverage {
    pub(super) fn add(&mut self, r: &Report) {
        self.outcomes.add(&r.outcomes);
        for (k, n) in &r.checked {
            *self.checked.entry(k).or_default() += n;
        }
    }

    /// The table CI prints, and the kinds that were never reached.
    pub(super) fn table(&self, kinds: &[&str], checks: &[&str]) -> (String, Vec<String>) {
        let o = &self.outcomes;
        let mut rows: Vec<(String, u64)> = kinds
            .iter()
            .map(|k| ((*k).to_owned(), o.kinds.get(*k).copied().unwrap_or(0)))
            .collect();
        rows.push(("token replay".into(), o.token_replays));
        rows.push(("TTL delete".into(), o.ttl_deleted));
        rows.push(("sweeper delete".into(), o.swept));
        rows.extend(checks.iter().map(|c| {
            (
                format!("check: {c}"),
                self.checked.get(c).copied().unwrap_or(0),
            )
        }));
        let missing = rows
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(k, _)| k.clone())
            .collect();
        for (k, _) in KINDS_ELSEWHERE {
            let n = o.kinds.get(*k).copied().unwrap_or(0);
            rows.push((format!("{k} [not required]"), n));
        }
        // Kinds met that the list does not name (a new outcome wants a row of its own).
        for (k, n) in &o.kinds {
            let elsewhere = KINDS_ELSEWHERE.iter().any(|(e, _)| e == k);
            if !kinds.contains(&k.as_str()) && !elsewhere {
                rows.push((format!("(unlisted) {k}"), *n));
            }
        }
        for (k, n) in &self.checked {
            if !checks.contains(k) {
                rows.push((format!("(path) {k}"), *n));
            }
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut lines: Vec<String> = rows
            .iter()
            .map(|(k, n)| format!("  {k:<width$}  {n:>8}"))
            .collect();
        lines.extend(
            KINDS_ELSEWHERE
                .iter()
                .map(|(k, why)| format!("  [not required] {k}: {why}")),
        );
        (lines.join("\n"), missing)
    }
}

#[test]
fn seeded_schedules_hold_every_guarantee() {
    let count = env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS);
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    let started = StdInstant::now();
    let mut coverage = Coverage::default();
    let (mut grants, mut busy, mut crashes, mut cancels) = (0, 0, 0, 0);
    let mut simulated = Duration::ZERO;
    let mut failures = Vec::new();
    for seed in first..first + count {
        let r = run(seed, Knobs::default());
        grants += r.grants;
        busy += r.busy;
        crashes += r.crashes;
        cancels += r.cancels;
        simulated += r.simulated;
        coverage.add(&r);
        if !r.violations.is_empty() {
            failures.push(explain(&r));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let (table, missing) = coverage.table(KINDS, CHECKS);
    eprintln!(
        "simulation: {count} schedules (seeds {first}..{}) in {secs:.1} s = {:.1} schedules/s; \
         {:.1} h simulated; {grants} grants, {busy} busy, {crashes} crashes, {cancels} \
         cancellations\ncoverage (answers by kind, checks applied):\n{table}",
        first + count,
        count as f64 / secs,
        simulated.as_secs_f64() / 3600.0
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The schedules must reach the paths that matter, or the run proves little.
    assert!(grants > count, "too few grants: {grants}");
    assert!(busy > 0 && crashes > 0 && cancels > 0);
    if count >= SEEDS {
        assert!(
            missing.is_empty(),
            "never reached in {count} schedules: {missing:?} (the generator must reach every \
             kind, or the path behind it is untested)"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 17, 101] {
        let a = run(seed, Knobs::default());
        let b = run(seed, Knobs::default());
        assert!(a.trace.len() > 20, "{} lines", a.trace.len());
        assert_eq!(a.trace, b.trace, "seed {seed} did not replay");
    }
}

/// Runs seeds until one breaks a guarantee whose violation starts with one of `by`; the number
/// of schedules it took.
fn first_failure(knobs: Knobs, limit: u64, by: &[&str]) -> Option<(u64, Report)> {
    (0..limit).find_map(|seed| {
        let r = run(seed, knobs);
        let hit = r
            .violations
            .iter()
            .any(|v| by.is_empty() || by.iter().any(|b| v.starts_with(b)));
        hit.then_some((seed + 1, r))
    })
}

fn caught(name: &str, knobs: Knobs, limit: u64) {
    caught_by(name, knobs, limit, &[]);
}

/// A mutation must be caught within `limit` schedules, by a check named in `by` (any check if
/// empty): the suite fails if it survives.
pub(super) fn caught_by(name: &str, knobs: Knobs, limit: u64, by: &[&str]) {
    let started = StdInstant::now();
    let found = first_failure(knobs, limit, by);
    let Some((tries, report)) = found else {
        panic!(
            "{name}: survived {limit} schedules (no violation of {by:?}): the simulation cannot \
             see this defect"
        );
    };
    let first = report
        .violations
        .iter()
        .find(|v| by.is_empty() || by.iter().any(|b| v.starts_with(b)))
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "mutation {name}: caught by seed {} after {tries} schedule(s) in {:.1} s: {first}",
        report.seed,
        started.elapsed().as_secs_f64(),
    );
}

#[test]
fn the_old_two_write_enqueue_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::TwoWriteEnqueue),
        ..Knobs::default()
    };
    caught("two-write enqueue", knobs, 300);
}

#[test]
fn a_stale_delete_without_its_rvn_condition_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::UnconditionalStaleDelete),
        ..Knobs::default()
    };
    caught("stale delete without rvn condition", knobs, 2000);
}

#[test]
fn a_heartbeat_that_can_roll_the_lease_back_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::HeartbeatRollback),
        ..Knobs::default()
    };
    caught("heartbeat without the lease condition", knobs, 600);
}

#[test]
fn a_dead_row_passed_over_many_leases_late_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::SlowTakeover),
        ..Knobs::default()
    };
    caught("dead rows passed over thirty leases late", knobs, 2000);
}

#[test]
fn a_seat_taken_without_the_counter_condition_is_caught() {
    let knobs = Knobs {
        mutation: Some(Mutation::SeatWithoutCounter),
        ..Knobs::default()
    };
    caught("seat without the counter condition", knobs, 300);
}

#[test]
fn trusting_clocks_more_than_they_agree_is_caught() {
    let knobs = Knobs {
        understate_skew: true,
        ..Knobs::default()
    };
    caught("skew allowance understated", knobs, 300);
}

#[test]
fn clock_free_schedules_hold_every_guarantee() {
    let knobs = Knobs {
        all_clock_free: true,
        ..Knobs::default()
    };
    let first = env_u64("FLIGHTLOCK_SIM_FIRST_SEED", 0);
    for seed in first..first + env_u64("FLIGHTLOCK_SIM_SEEDS", SEEDS) / 3 {
        let r = run(seed, knobs);
        assert!(
            r.violations.is_empty(),
            "{}",
            explain_as(&r, "FLIGHTLOCK_SIM_CF_SEED", "replay_clock_free")
        );
    }
}

/// `FLIGHTLOCK_SIM_SEED=<n>`: runs that seed and prints its whole trace.
#[test]
fn replay() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("FLIGHTLOCK_SIM_SEED is a number");
    let r = run(seed, Knobs::default());
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}

// ----- the model's own semantics --------------------------------------------------------------

fn enqueue(key: &str, ticket: u64, owner: &str, token: &str) -> Request {
    Request::Enqueue(EnqueueRequest {
        key: key.into(),
        ticket,
        counter: crate::schema::Counter {
            last: 0,
            owner: None,
            tick_done: None,
            tick_newest: None,
            protocol: 1,
            permits: 1,
        },
        row: row_item(key, ticket, owner),
        owner: owner.into(),
        token: token.into(),
        seat: false,
        tick: None,
        newest: None,
        permits: 1,
    })
}

fn row_item(key: &str, ticket: u64, owner: &str) -> crate::storage::Item {
    crate::schema::NewRow {
        key,
        ticket,
        owner,
        lease_until_ms: 10_000,
        lease_ms: 1_000,
        expires_at: 20,
        clock_free: false,
        rvn: "r",
        now_ms: 0,
        granted: false,
        holder: &crate::schema::HolderInfo::default(),
        protocol: 1,
    }
    .to_item()
}

#[tokio::test(start_paused = true)]
async fn model_tokens_replay_and_refuse_changed_requests() {
    let now = tokio::time::Instant::now();
    let mut t = Table::new(now, 0);
    t.operator_set_counter("k", 0, now);
    let first = enqueue("k", 1, "a", "tok");
    assert_eq!(
        t.apply(&first, now).unwrap(),
        Response::Enqueue(Enqueue::Done)
    );
    // Same token, same request: success again, nothing written twice.
    assert_eq!(
        t.apply(&first, now).unwrap(),
        Response::Enqueue(Enqueue::Done)
    );
    // Same token, another request: the mismatch error.
    let changed = enqueue("k", 1, "a2", "tok");
    let err = t.apply(&changed, now).unwrap_err().describe();
    assert!(err.contains("IdempotentParameterMismatch"), "{err}");
    // After the window the token is forgotten: the request is evaluated again.
    let later = now + super::model::TOKEN_WINDOW + Duration::from_secs(1);
    assert_eq!(
        t.apply(&first, later).unwrap(),
        Response::Enqueue(Enqueue::AlreadyOurs)
    );
}

#[tokio::test(start_paused = true)]
async fn model_pages_a_partition_in_order() {
    let now = tokio::time::Instant::now();
    let mut t = Table::new(now, 0);
    t.page_size = 2;
    for i in 1..=5 {
        t.insert(row_item("k", i, "o"), now);
    }
    t.insert(row_item("other", 1, "o"), now);
    let mut start = None;
    let mut seen = Vec::new();
    loop {
        let Response::Page { items, next } = t
            .apply(
                &Request::Query {
                    key: "k".into(),
                    start: start.clone(),
                    range: crate::storage::Range::All,
                },
                now,
            )
            .unwrap()
        else {
            panic!("not a page")
        };
        seen.extend(items.iter().map(|i| i["ticket"].as_n().unwrap().clone()));
        match next {
            Some(n) => start = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, ["1", "2", "3", "4", "5"]);
}

/// `FLIGHTLOCK_SIM_SEED=<n>` with every key clock-free.
#[test]
fn replay_clock_free() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_CF_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("FLIGHTLOCK_SIM_CF_SEED is a number");
    let r = run(
        seed,
        Knobs {
            all_clock_free: true,
            ..Knobs::default()
        },
    );
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}

/// `FLIGHTLOCK_SIM_EDGE_SEED=<n>`: a lease-edge schedule, its whole trace.
#[test]
fn replay_lease_edge() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_EDGE_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("FLIGHTLOCK_SIM_EDGE_SEED is a number");
    let r = run(
        seed,
        Knobs {
            lease_edge: true,
            ..Knobs::default()
        },
    );
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}

/// `FLIGHTLOCK_SIM_RATE_SEED=<n>`: a clock-rate schedule (`lease_edge::rate_knobs`), its whole
/// trace.
#[test]
fn replay_clock_rates() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_RATE_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("FLIGHTLOCK_SIM_RATE_SEED is a number");
    let r = run(seed, super::lease_edge::rate_knobs());
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}

/// `FLIGHTLOCK_SIM_BOUNDED_RATE_SEED=<n>`: a bounded clock-rate schedule
/// (`lease_edge::bounded_rate_knobs`), its whole trace.
#[test]
fn replay_bounded_clock_rates() {
    let Ok(seed) = std::env::var("FLIGHTLOCK_SIM_BOUNDED_RATE_SEED") else {
        return;
    };
    let seed: u64 = seed
        .parse()
        .expect("FLIGHTLOCK_SIM_BOUNDED_RATE_SEED is a number");
    let r = run(seed, super::lease_edge::bounded_rate_knobs());
    for line in &r.trace {
        println!("{line}");
    }
    println!("violations: {:#?}", r.violations);
}
