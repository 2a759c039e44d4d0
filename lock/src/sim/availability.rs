//! The availability checks: the lock must not only be safe but also keep, answer, pass over and
//! hand on as PROTOCOL.md promises. Each check applies to the spans the simulation can vouch for
//! (no fault on the participant's own requests, no operator on the key), and counts how often it
//! applied, so a check that never applies shows up in the coverage table instead of passing
//! silently.
//!
//! - **No spurious loss**: a holder loses its lock only if one of its requests met a fault in the
//!   lease before the loss, or an operator removed its entry.
//! - **Tight waits**: a fault-free `wait = d` call answers (granted or busy) within `d` plus one
//!   round trip for the request in flight then and for each it sends after (a look's pages, our
//!   row's removal); a bounded `wait = 0` within the round trips of its one decision (the read's
//!   pages, stale deletes, one write); a clock-free `wait = 0` the same after `2·lease +
//!   max_poll + 1.1·poll` (its watch of a row it does not know). A round trip of a request that
//!   meets no fault is at most an attempt timeout `A`; in the simulation, twice the one-way delay.
//! - **Takeover in every wait mode**: a fault-free call whose key only dead entries block is
//!   granted, not told busy, once they are stale (see [`ready`]).
//! - **Prompt loss notice**: a holder whose entry is removed, by anyone, learns it within one
//!   heartbeat interval and one attempt timeout when its requests meet no fault.
//! - **Progress under contention** ([`gap_bound`]): after faults stop, a key with a forever
//!   waiter is never without a holder for longer than a dead entry's staleness plus two looks,
//!   counted from the last crash or cancellation on the key.
//!
//! A participant's clock may run at a rate of its own (`rates.rs`): every bound made of what it
//! times itself (its wait, its watch of a row, its lease, its heartbeat interval, its pace) is
//! that many units of its own clock, in true time; the progress bound, of the slowest clock's.

use std::time::Duration;

use tokio::time::Instant;

use super::monitor::Ctx;
use super::rates;
use super::scenario::KeyPlan;
use crate::options::{ClockSkew, Wait};

/// Slack for the monitor's own sampling (it looks every 20 ms).
const TICK: Duration = Duration::from_millis(25);

/// A finished acquisition call.
pub(super) struct Call<'a> {
    pub who: &'a str,
    pub key: &'a KeyPlan,
    pub wait: Wait,
    pub started: Instant,
    pub granted: bool,
}

fn allowance(key: &KeyPlan) -> Duration {
    match key.opts.clock_skew {
        ClockSkew::Bounded(d) => d,
        ClockSkew::Unbounded => Duration::ZERO,
    }
}

/// The staleness margin of clock-free mode: a lease and 1/64 on the observer's clock.
fn watched(lease: Duration) -> Duration {
    lease + lease / 64
}

/// When a call with `wait` stops waiting, after its start: `d`; `0` for a bounded `wait = 0`;
/// for a clock-free `wait = 0`, the end of its watch of a row it does not know
/// (`2·lease + max_poll`, and the poll that may straddle it). From then on it only finishes the
/// requests of its decision (a read's pages, stale deletes, one write, our row's removal).
pub(super) fn deadline(key: &KeyPlan, wait: Wait) -> Option<Duration> {
    let opts = &key.opts;
    match wait {
        Wait::Forever => None,
        Wait::NoWait if opts.clock_free() => {
            Some(opts.lease * 2 + opts.max_poll + opts.poll.mul_f64(1.1))
        }
        Wait::NoWait => Some(Duration::ZERO),
        Wait::For(d) => Some(d),
    }
}

/// When every entry of `key` last written at `last` (landed) is stale to `who`, whose call
/// started at `started`: bounded mode, a lease and twice the allowance after the write (the
/// writer's and the reader's wall clocks differ by up to the allowance); clock-free, a watched
/// lease (of its own clock) after the caller can first have seen it.
pub(super) fn ready(key: &KeyPlan, who: &str, last: Instant, started: Instant) -> Instant {
    let lease = key.opts.lease;
    if key.opts.clock_free() {
        last.max(started) + rates::true_duration(who, watched(lease))
    } else {
        last + lease + allowance(key) * 2
    }
}

/// Checks a finished call: its duration, and (busy) whether dead entries alone kept it out.
pub(super) fn check_call(ctx: &Ctx, call: &Call<'_>) {
    let now = Instant::now();
    if call.wait == Wait::Forever {
        // A forever wait is granted or fails; busy only after an hour of transaction
        // conflicts (its retry budget), longer than any simulated run.
        ctx.with(|m| m.applied("forever wait never busy"));
        if !call.granted {
            ctx.violation(format!(
                "forever wait: {} told busy on {} after {:?}",
                call.who,
                call.key.name,
                now - call.started
            ));
        }
    }
    let Some(deadline) = deadline(call.key, call.wait) else {
        return;
    };
    // The caller times its wait on its own clock.
    let on_its_clock = |d: Duration| rates::true_duration(call.who, d);
    let deadline = on_its_clock(deadline);
    let name = &call.key.name;
    let operator = ctx
        .with(|m| {
            m.operator_at.get(name).is_some_and(|at| {
                at.iter()
                    .any(|&t| t + call.key.opts.lease * 3 >= call.started && t <= now)
            })
        })
        .unwrap_or(true);
    if operator || ctx.net.faulted(call.who, call.started, now) {
        return;
    }
    let elapsed = now - call.started;
    if let Wait::For(_) = call.wait {
        // After its deadline a waiter finishes the look in flight, or makes the one its pause
        // (cut at the deadline) ended with, and leaves: no second look.
        let looks = ctx.net.looks_since(call.who, call.started + deadline);
        ctx.with(|m| m.applied("tight wait: no look after the last"));
        if looks > 1 {
            ctx.violation(format!(
                "tight wait: {} looked {looks} times after its deadline (wait {:?}, {}); one \
                 look may end the wait, then it leaves",
                call.who,
                call.wait,
                if call.granted { "granted" } else { "busy" }
            ));
        }
    }
    // The request in flight at the deadline, and each one sent after it (at most one look's
    // pages and stale removals, the counter read of a coalescing waiter, our row's removal or
    // the tick id's check): one round trip each.
    let after = ctx.net.sent_since(call.who, call.started + deadline);
    let trips = u32::try_from(after + 1).unwrap_or(u32::MAX);
    let bound = deadline + ctx.net.round_trip * trips;
    ctx.with(|m| m.applied("tight wait"));
    if elapsed > bound {
        ctx.violation(format!(
            "tight wait: {} answered after {elapsed:?} with wait {:?} on a fault-free call \
             (bound {bound:?})",
            call.who, call.wait
        ));
    }
    if call.granted {
        return;
    }
    // Busy: was anyone alive on the key? The last version written by anyone but this call.
    let last = ctx.net.writes.lock().ok().and_then(|w| {
        w.iter()
            .filter(|l| l.key == *name && !(l.who == call.who && l.sent >= call.started))
            .map(|l| l.at)
            .max()
    });
    let Some(last) = last else {
        // Nothing was ever written on the key, yet it was busy.
        ctx.violation(format!(
            "takeover: {} told busy on {name} where nobody ever wrote",
            call.who
        ));
        return;
    };
    let ready = ready(call.key, call.who, last, call.started);
    let opts = &call.key.opts;
    let owed = match call.wait {
        Wait::NoWait if opts.clock_free() => {
            last + on_its_clock(watched(opts.lease)) < call.started
        }
        Wait::NoWait => ready <= call.started,
        Wait::For(d) => {
            ready + on_its_clock(opts.max_poll.mul_f64(1.1)) + ctx.attempt_timeout
                <= call.started + on_its_clock(d)
        }
        Wait::Forever => false,
    };
    ctx.with(|m| m.applied("takeover (busy behind entries)"));
    if owed {
        ctx.violation(format!(
            "takeover: {} told busy on {name} after {elapsed:?} with wait {:?}, though every \
             entry ahead was dead (last written {:?} before the call began, stale {:?} after it)",
            call.who,
            call.wait,
            call.started.saturating_duration_since(last),
            ready.saturating_duration_since(call.started)
        ));
    }
}

/// Every 20 ms, for each holder: a loss must have a cause, and a removed entry must be noticed.
pub(super) fn check_holders(ctx: &Ctx) {
    let now = Instant::now();
    let Ok(table) = ctx.net.table.lock() else {
        return;
    };
    let mut found = Vec::new();
    ctx.with(|m| {
        for h in m.holders.iter_mut() {
            if h.lost_at.is_some() {
                continue;
            }
            let removed = table
                .gone
                .iter()
                .filter(|g| g.key == h.key && g.owner == h.owner && g.ticket == h.token)
                .map(|g| g.at)
                .max()
                .filter(|&at| !rewritten(ctx, &h.key, &h.owner, at));
            if h.lost.reason().is_some() {
                h.lost_at = Some(now);
                if removed.is_some() {
                    m.checked
                        .entry("loss notice (entry removed under a holder)")
                        .and_modify(|n| *n += 1)
                        .or_insert(1);
                }
                found.push((
                    h.who.clone(),
                    h.key.clone(),
                    h.token,
                    h.lease,
                    h.exempt,
                    None,
                ));
                continue;
            }
            if let Some(at) = removed {
                let bound = rates::true_duration(&h.who, h.interval + ctx.attempt_timeout) + TICK;
                if now > at + bound {
                    h.lost_at = Some(now); // reported once
                    found.push((
                        h.who.clone(),
                        h.key.clone(),
                        h.token,
                        h.lease,
                        h.exempt,
                        Some((at, bound)),
                    ));
                }
            }
        }
    });
    drop(table);
    for (who, key, token, lease, exempt, late) in found {
        match late {
            None => {
                // Lost: a fault on its requests within the lease before, or an operator.
                ctx.with(|m| m.applied("loss judged"));
                let lease = rates::true_duration(&who, lease);
                if exempt || ctx.net.faulted(&who, now - lease - TICK, now) {
                    continue;
                }
                ctx.violation(format!(
                    "spurious loss: {who} lost {key} t{token} though none of its requests met \
                     a fault in the lease before"
                ));
            }
            Some((at, bound)) => {
                if ctx.net.faulted(&who, at, now) {
                    continue;
                }
                ctx.with(|m| m.applied("loss notice late"));
                ctx.violation(format!(
                    "late loss notice: {who}'s entry {key} t{token} was removed {:?} ago and its \
                     lost signal has not fired (bound {bound:?})",
                    now - at
                ));
            }
        }
    }
}

/// Whether a write of `owner`'s entry on `key` landed after `at`: the same acquisition wrote its
/// entry again (a new seat or row, same owner and ticket) after an earlier one was removed.
fn rewritten(ctx: &Ctx, key: &str, owner: &str, at: Instant) -> bool {
    ctx.net.writes.lock().is_ok_and(|w| {
        w.iter()
            .any(|l| l.key == key && l.owner == owner && l.at > at)
    })
}

/// Progress under contention: the longest a key with a forever waiter may go without a holder
/// once faults stop, counted from the gap's start or the key's last crash or cancellation: a
/// dead entry's staleness (the lease, twice the allowance or a watched lease), its in-flight
/// writes landing (two attempt timeouts), two looks and their requests.
pub(super) fn gap_bound(key: &KeyPlan, attempt: Duration) -> Duration {
    let opts = &key.opts;
    rates::on_slowest(
        watched(opts.lease) + allowance(key) * 2 + opts.max_poll.mul_f64(2.2) + attempt * 4,
    ) + TICK * 4
}
