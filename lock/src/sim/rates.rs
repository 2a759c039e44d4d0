//! Monotonic clocks that run at rates of their own.
//!
//! Clock-free staleness waits a lease and 1/64 on the observer's monotonic clock because two
//! machines' monotonic clocks may run at rates that differ by up to 1/64 (PROTOCOL.md, "What
//! remains assumed"): a holder whose clock runs slow believes in its lease for longer, in true
//! time, than an observer whose clock runs fast waits. With one shared clock the margin cannot
//! matter; with [`Knobs::clock_rates`] each clock-free participant's monotonic clock runs at a
//! rate of its own ([`super::net::SimClock`]'s `rate_ppm`), so it does.
//!
//! **What a rate means.** A participant whose clock runs at rate `r` reads `origin + r·(t −
//! origin)` at true time `t`, and everything it times runs on that reading: its `now()`, every
//! pause and deadline the protocol sets (through [`crate::Clock::sleep_until`]: the heartbeat's
//! interval, the lease's end that fires the lost signal, the waiter's pace, the retry pauses, the
//! wait's deadline), and the attempt timeout of its requests (the SDK's timer, on its machine:
//! `net.rs`). What the simulation plans for it (when a cycle starts, how long it holds, when it
//! is cancelled or crashes) is the world's, in true time. Its wall clock keeps its offset, drift
//! and jumps, as before (clock-free waiters read no wall clock).
//!
//! **The bound.** The margin is enough when the rates of any two clocks differ by a factor of at
//! most `65/64`: a holder at rate `r_h` believes for `lease / r_h` of true time after its write
//! was sent, an observer at `r_o` waits `lease · 65/64 / r_o` after it first saw that write.
//! Rates drawn within `1 ± 1/160` ([`SPREAD_PPM`]) differ by at most `161/159`, inside it. The
//! model defect [`Knobs::rates_beyond_bound`] draws them within `1 ± 1/40` (up to `41/39`, about
//! 1/20 apart) and the suite must catch it: the assumption is shown to matter.
//!
//! **Who runs at which rate.** Per participant (a restarted process keeps its machine's rate),
//! drawn from a generator of its own (the rest of the plan does not move). With a stalled
//! participant (the lease-edge family's, the one whose lease runs out while others watch it), it
//! draws from the slowest quarter of the spread and everyone else from the fastest: the pairing
//! the margin is for.
//!
//! **Bounded mode.** Others judge a bounded row by its `leaseUntilMs` on their wall clocks,
//! within the allowance: in true time, never sooner than a lease after its writer's wall time
//! ([`promised`]), whatever the writer's monotonic rate. The holder counts its lease on its
//! monotonic clock, so a slow one would believe past that; it believes a 64th less
//! (`membership::believed`). The bounded clock-rate family (`lease_edge::bounded_rate_knobs`)
//! gives bounded participants rates too, and sets their wall clocks at the two edges of the
//! spread ([`edge_offsets`]): the stalled (slow) participant's behind, everyone else's ahead, so
//! the allowance is spent on the wall clocks' disagreement alone and a watcher may pass the
//! stalled row over exactly a lease after its write. The lease check (`watch.rs`) then holds
//! each holder's belief to that promise.
//!
//! **The clock-rate family** (`lease_edge::rate_knobs`: the lease-edge family, every key
//! clock-free, rates on) narrows the lease-edge stall ([`stall`]): the stalled participant's
//! renewals land until one is sent while someone is queued behind it, and are refused after;
//! it holds each grant through several leases ([`holds_long`]); the network's delays are at most
//! a few milliseconds ([`weather`]). So a watcher sees the holder's last version almost as it is
//! written, and the window the margin covers (about a hundredth of a lease) is reached.
//!
//! The table of rates is kept for the thread that runs the schedule (as [`crate::mutant`]'s
//! switch is), set by [`plan`] and dropped with the guard it returns, so the network and the
//! checks can read a participant's rate by its name.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::model::Table;
use super::net::Faults;
use super::scenario::{KeyPlan, Knobs, WorkerPlan};
use crate::schema::QueueRow;
use crate::storage::Request;

/// Rates are drawn within `1 ± SPREAD_PPM / 1e6`: 1/160.
pub(super) const SPREAD_PPM: i64 = 6_250;
/// The defect's spread: `1 ± 1/40`, rates up to 1/20 apart (beyond the 1/64 the margin covers).
pub(super) const BEYOND_PPM: i64 = 25_000;
/// How many renewals of a stalled entry land while someone is queued behind it.
const WATCHED: u32 = 2;
/// The clock-rate family's longest one-way delay.
const FAMILY_DELAY: Duration = Duration::from_millis(3);
/// Mixed into a participant's seed for its rate.
const RATE_SEED: u64 = 0x7a7e_5eed;

thread_local! {
    static RATES: RefCell<HashMap<String, i64>> = RefCell::new(HashMap::new());
    /// Participants on keys in bounded mode, while any clock runs at a rate of its own.
    static BOUNDED: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    /// The clock-rate family's stall: entries of the stalled participant that renewed once.
    static RENEWED: RefCell<Option<HashMap<String, u32>>> = const { RefCell::new(None) };
    /// The clock-rate family's stalled participant.
    static STALLED: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Who wrote each record version, while any clock runs at a rate of its own.
    static WRITERS: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
}

/// Forgets this thread's rates when dropped.
pub(super) struct Planned;

impl Drop for Planned {
    fn drop(&mut self) {
        RATES.with(|r| r.borrow_mut().clear());
        BOUNDED.with(|b| b.borrow_mut().clear());
        RENEWED.with(|r| r.borrow_mut().take());
        STALLED.with(|s| s.borrow_mut().take());
        WRITERS.with(|w| w.borrow_mut().clear());
    }
}

/// Draws each participant's rate for this run (none unless `knobs.clock_rates` or
/// `knobs.rates_beyond_bound`), and keeps them until the returned guard is dropped.
pub(super) fn plan(
    knobs: &Knobs,
    keys: &[KeyPlan],
    workers: &[WorkerPlan],
    stalled: Option<&str>,
) -> Planned {
    let spread = if knobs.rates_beyond_bound {
        BEYOND_PPM
    } else if knobs.clock_rates {
        SPREAD_PPM
    } else {
        0
    };
    let rates: HashMap<String, i64> = workers
        .iter()
        .filter(|_| spread > 0)
        .map(|w| {
            let mut rng = StdRng::seed_from_u64(w.seed ^ RATE_SEED);
            let ppm = match stalled {
                Some(s) if s == w.who => rng.random_range(-spread..=-spread * 3 / 4),
                Some(_) => rng.random_range(spread * 3 / 4..=spread),
                None => rng.random_range(-spread..=spread),
            };
            (w.who.clone(), ppm)
        })
        .collect();
    let bounded: HashSet<String> = workers
        .iter()
        .filter(|w| spread > 0 && !keys[w.key].opts.clock_free())
        .map(|w| w.who.clone())
        .collect();
    RATES.with(|r| *r.borrow_mut() = rates);
    BOUNDED.with(|b| *b.borrow_mut() = bounded);
    let family = knobs.clock_rates || knobs.rates_beyond_bound;
    RENEWED.with(|r| *r.borrow_mut() = family.then(HashMap::new));
    STALLED.with(|s| *s.borrow_mut() = stalled.filter(|_| family).map(str::to_owned));
    Planned
}

/// How the stalled participant's request is treated: `(stalled, refused)`. The lease-edge
/// family's stall (`net.rs`, `scenario::plan_edge`) refuses every heartbeat and answers every
/// other request late; with rates on, the stall is narrower: the renewals of a granted entry go
/// as anyone's until one is sent while someone is queued behind it (its watchers then see a
/// version its holder wrote while they looked on); every later one is refused; other requests go
/// as anyone's. Its holder then believes in that version for a lease of its slow clock while its
/// fast watchers count theirs: the margin's window.
pub(super) fn stall(stalled: bool, request: &Request, table: &Mutex<Table>) -> (bool, bool) {
    let Request::Heartbeat(b) = request else {
        return RENEWED.with(|r| (stalled && r.borrow().is_none(), false));
    };
    let entry = format!("{}/{}/{}/{}", b.key, b.ticket, b.seat, b.owner);
    RENEWED.with(|r| match (r.borrow_mut().as_mut(), stalled) {
        (None, _) => (stalled, stalled),
        (Some(_), false) => (false, false),
        (Some(_), true) if b.acquired_at_ms.is_none() => (false, false),
        (Some(renewed), true) if renewed.get(&entry).is_some_and(|&n| n >= WATCHED) => {
            (false, true)
        }
        (Some(renewed), true) => {
            if queued_behind(table, &b.key, b.ticket) {
                *renewed.entry(entry).or_default() += 1;
            }
            (false, false)
        }
    })
}

/// Whether this run is of the clock-rate family (its stall is [`stall`]'s).
pub(super) fn family() -> bool {
    RENEWED.with(|r| r.borrow().is_some())
}

/// Whether a row with a ticket above `ticket` is queued on `key`.
fn queued_behind(table: &Mutex<Table>, key: &str, ticket: u64) -> bool {
    table.lock().is_ok_and(|t| {
        t.partition(key)
            .iter()
            .filter_map(|i| QueueRow::from_item(key, i).ok())
            .any(|r| r.ticket > ticket)
    })
}

/// The stalled participant of the clock-rate family holds each grant through several leases
/// (`actors.rs`), so its lease runs out while it holds: the window the margin covers.
pub(super) fn holds_long(who: &str) -> bool {
    STALLED.with(|s| s.borrow().as_deref() == Some(machine(who)))
}

/// The clock-rate family's network: its delays at most [`FAMILY_DELAY`], so a watcher sees a
/// new version within a few milliseconds of its write (the window is a hundredth of a lease).
pub(super) fn weather(knobs: &Knobs, faults: Faults) -> Faults {
    if knobs.clock_rates || knobs.rates_beyond_bound {
        Faults {
            delay: faults.delay.min(FAMILY_DELAY),
            ..faults
        }
    } else {
        faults
    }
}

/// The participant a process name belongs to (`p2r1`, p2's first restart, runs on p2's clock).
fn machine(who: &str) -> &str {
    who.split_once('r').map_or(who, |(m, _)| m)
}

/// The rate of `who`'s monotonic clock, in parts per million off the true rate (0: true).
pub(super) fn ppm(who: &str) -> i64 {
    RATES.with(|r| r.borrow().get(machine(who)).copied().unwrap_or(0))
}

/// The clock-rate family on bounded keys: each bounded participant's wall clock at an edge of
/// its key's spread (`±spread_ms`, half the allowance), the stalled participant's behind and
/// everyone else's ahead. Their wall clocks then disagree by the whole allowance, in the
/// direction where a holder that believes too long meets a watcher that judges early.
pub(super) fn edge_offsets(
    knobs: &Knobs,
    keys: &[KeyPlan],
    workers: &mut [WorkerPlan],
    stalled: Option<&str>,
) {
    if !(knobs.clock_rates || knobs.rates_beyond_bound) {
        return;
    }
    for w in workers.iter_mut() {
        let key = &keys[w.key];
        if key.opts.clock_free() {
            continue;
        }
        w.offset_ms = if stalled == Some(w.who.as_str()) {
            -key.spread_ms
        } else {
            key.spread_ms
        };
    }
}

/// Whether `who` runs on a key in bounded mode (in a run where clocks run at rates of their own).
fn bounded(who: &str) -> bool {
    BOUNDED.with(|b| b.borrow().contains(machine(who)))
}

/// How long after its send, in true time, a version `who` wrote keeps others from passing its
/// entry over, for a row of `lease`: clock-free, a lease of the watcher's clock and 1/64, which
/// is at least a lease of the writer's ([`true_duration`]); bounded, the lease itself (others
/// compare `leaseUntilMs` with wall clocks that agree with the writer's within the allowance).
pub(super) fn promised(who: &str, lease: Duration) -> Duration {
    if bounded(who) {
        lease
    } else {
        true_duration(who, lease)
    }
}

/// Notes that `who` sent the record version `rvn` (an enqueue's or a heartbeat's).
pub(super) fn wrote(rvn: &str, who: &str) {
    if ppm(who) != 0 && !bounded(who) {
        WRITERS.with(|w| w.borrow_mut().insert(rvn.to_owned(), who.to_owned()));
    }
}

/// How long, in true time, a version `rvn` keeps others from passing its entry over, for a row
/// of `lease`: [`promised`] for its writer (its writer believes no longer).
pub(super) fn writers_lease(rvn: &str, lease: Duration) -> Duration {
    match WRITERS.with(|w| w.borrow().get(rvn).cloned()) {
        Some(who) => true_duration(&who, lease),
        None => lease,
    }
}

/// How long `who`'s timer of `d` (on its own clock) lasts in true time, rounded up as its
/// timers are ([`true_nanos`]).
pub(super) fn true_duration(who: &str, d: Duration) -> Duration {
    match ppm(who) {
        0 => d,
        p => Duration::from_nanos(u64::try_from(true_nanos(d.as_nanos(), p)).unwrap_or(u64::MAX)),
    }
}

/// How long a timer of `d` lasts in true time on the slowest clock of this run (a bound that
/// holds whoever runs it).
pub(super) fn on_slowest(d: Duration) -> Duration {
    let slowest = RATES.with(|r| r.borrow().values().copied().min().unwrap_or(0));
    match slowest {
        p if p < 0 => d.mul_f64(1e6 / (1e6 + p as f64)),
        _ => d,
    }
}

/// A participant's monotonic reading at true elapsed time `elapsed` (nanoseconds since the
/// origin), rounded down.
pub(super) fn local_nanos(elapsed: u128, ppm: i64) -> u128 {
    let k = u128::try_from(1_000_000 + ppm).unwrap_or(1);
    elapsed * k / 1_000_000
}

/// The first true elapsed time (nanoseconds since the origin) at which a clock of rate `ppm`
/// reads `local` or more: [`local_nanos`]'s inverse, rounded up so a timer never fires early.
pub(super) fn true_nanos(local: u128, ppm: i64) -> u128 {
    let k = u128::try_from(1_000_000 + ppm).unwrap_or(1);
    (local * 1_000_000).div_ceil(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_fires_when_its_clock_reads_the_deadline_and_not_before() {
        for ppm in [-BEYOND_PPM, -SPREAD_PPM, -1, 1, SPREAD_PPM, BEYOND_PPM] {
            for local in [0u128, 1, 999, 1_000_000, 2_999_999_999, 86_400_000_000_000] {
                let t = true_nanos(local, ppm);
                assert!(local_nanos(t, ppm) >= local, "{ppm} {local}");
                assert!(t == 0 || local_nanos(t - 1, ppm) < local, "{ppm} {local}");
            }
        }
    }

    #[test]
    fn a_restarted_process_keeps_its_machines_rate() {
        assert_eq!(machine("p2r1"), "p2");
        assert_eq!(machine("p13"), "p13");
    }
}
