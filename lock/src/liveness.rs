//! Deciding whether a queue row is still alive, and how often to look again. Pure logic.
//!
//! A row is **stale** (its owner is presumed dead) when:
//!
//! - [`ClockSkew::Bounded`]: our wall clock is past the row's `leaseUntilMs` by more than the
//!   allowance. The row's owner stops trusting its lease at `sent + lease` on its monotonic clock,
//!   where `sent` is taken just before the write that set `leaseUntilMs = wall(sent) + lease`; so
//!   as long as the two wall clocks agree within the allowance, the owner has given up before we
//!   call it stale.
//! - [`ClockSkew::Unbounded`] (clock-free): we have seen the same `rvn` for the row's whole
//!   lease (`leaseMs`, the *owner's* lease, not ours) on our own monotonic clock. The write that
//!   produced that `rvn` was sent before we first saw it, so the owner's deadline passed first.
//!
//! A stale row is never simply ignored: the caller deletes it conditionally on the `rvn` it saw,
//! and only a successful delete (or finding it already gone) lets anyone pass it. A heartbeat
//! that lands first changes the `rvn` and the delete fails: the row is live again.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::options::ClockSkew;
use crate::schema::QueueRow;

/// Whether a row's owner is presumed alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Alive (or not yet known to be dead).
    Live,
    /// Dead: may be removed conditionally on its `rvn`.
    Stale,
}

/// The clock rule of staleness ([`ClockSkew::Bounded`]): our wall clock `wall_ms` is past the
/// lease end by more than the allowance. The protocol's judgement ([`Observer::judge_read`]) and
/// the status view (`status.rs`) both ask it.
pub(crate) fn past_lease(lease_until_ms: i64, wall_ms: i64, allowance_ms: i64) -> bool {
    wall_ms > lease_until_ms.saturating_add(allowance_ms)
}

/// Remembers when each row's current `rvn` was first seen (needed for clock-free mode), and
/// whether the row has been seen to change at all (proof that its owner is alive).
///
/// A [`crate::Locker`] keeps one for its whole life, not one per acquisition: a process that
/// asks again later (a warm Lambda sandbox, a long-running service) remembers what it saw, so in
/// clock-free mode a dead row it met before is passed over without watching it for another lease.
#[derive(Debug, Default)]
pub struct Observer {
    seen: HashMap<String, Sighting>,
}

#[derive(Debug)]
struct Sighting {
    rvn: String,
    since: Instant,
    last: Instant,
    /// When the latest read that showed this `rvn` was first sent: the server read it after.
    last_read: Instant,
    /// Until when the owner is known to have been alive less than a lease before: a change of
    /// `rvn` proves a write after the previous version was last seen, so the owner lived then.
    alive_until: Option<Instant>,
}

/// Sightings not refreshed for this long are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// At most this many rows are remembered; past it the least recently seen are forgotten.
const MAX_SIGHTINGS: usize = 10_000;

impl Observer {
    /// Judges one row. `wall_ms` is our wall clock, `now` our monotonic clock.
    #[cfg(test)]
    pub fn judge(
        &mut self,
        row: &QueueRow,
        wall_ms: i64,
        now: Instant,
        skew: ClockSkew,
    ) -> Verdict {
        self.judge_read(row, wall_ms, now, now, skew)
    }

    /// [`Observer::judge`] of a row from a read first sent at `asked` (before any retry): the
    /// server read it at some moment between then and `now`. Staleness counts from `now` (the
    /// later bound: never too early); a change of `rvn` proves its owner alive only after the
    /// earlier read was *sent* (a slow answer may carry a version long replaced).
    pub fn judge_read(
        &mut self,
        row: &QueueRow,
        wall_ms: i64,
        asked: Instant,
        now: Instant,
        skew: ClockSkew,
    ) -> Verdict {
        let asked = asked.min(now);
        let sighting = self
            .seen
            .entry(row.owner.clone())
            .or_insert_with(|| Sighting {
                rvn: row.rvn.clone(),
                since: now,
                last: now,
                last_read: asked,
                alive_until: None,
            });
        if sighting.rvn != row.rvn {
            // The new version was written after the old one was last seen: its owner lived
            // then, not necessarily now. A change first seen long after (a sighting from an
            // earlier call) proves nothing about the present.
            let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
            sighting.alive_until = Some(sighting.last_read + lease);
            sighting.rvn.clone_from(&row.rvn);
            sighting.since = now;
        }
        sighting.last = now;
        sighting.last_read = asked;
        let first_seen = sighting.since;
        match skew {
            ClockSkew::Bounded(allowance) => {
                let allowance_ms = i64::try_from(allowance.as_millis()).unwrap_or(i64::MAX);
                #[cfg(test)]
                let allowance_ms =
                    if crate::mutant::on(crate::mutant::Mutant::StaleWithoutAllowance) {
                        0
                    } else {
                        allowance_ms
                    };
                if past_lease(row.lease_until_ms, wall_ms, allowance_ms) {
                    Verdict::Stale
                } else {
                    Verdict::Live
                }
            }
            ClockSkew::Unbounded => {
                let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
                // A 1/64 margin covers monotonic clocks that run at slightly different rates.
                #[allow(unused_mut)]
                let mut margin = lease / 64;
                #[cfg(test)]
                if crate::mutant::on(crate::mutant::Mutant::StaleWithoutMargin) {
                    margin = Duration::ZERO;
                }
                let watched = now.duration_since(first_seen);
                #[cfg(test)]
                if watched >= lease && watched < lease + margin {
                    crate::mutant::fired(crate::mutant::GUARD_MARGIN);
                }
                if watched >= lease + margin {
                    Verdict::Stale
                } else {
                    Verdict::Live
                }
            }
        }
    }

    /// Whether this owner's row was seen to change so that its owner is known to have lived less
    /// than a lease before `now`: the change came between two sightings less than a lease apart
    /// (in the past lease). Clock-free mode needs it to say "busy" truthfully: a row seen once
    /// may be a dead one, and so may a row whose change was first seen long after the sighting
    /// before it.
    pub fn seen_alive(&self, owner: &str, now: Instant) -> bool {
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::BusyAtFirstSight) {
            return self.seen.contains_key(owner);
        }
        self.seen
            .get(owner)
            .and_then(|s| s.alive_until)
            .is_some_and(|until| now < until)
    }

    /// Forgets rows not seen for an hour, and the least recently seen beyond a bound, so memory
    /// stays bounded however many keys and rows pass by.
    pub fn forget_old(&mut self, now: Instant) {
        self.seen
            .retain(|_, s| now.saturating_duration_since(s.last) < FORGET_AFTER);
        if self.seen.len() > MAX_SIGHTINGS {
            let mut lasts: Vec<Instant> = self.seen.values().map(|s| s.last).collect();
            lasts.sort_unstable();
            let cut = lasts[lasts.len() - MAX_SIGHTINGS];
            self.seen.retain(|_, s| s.last >= cut);
        }
    }
}

/// `d` spread by ±10 % (`jitter` in `[0, 1)`), so waiters that started together drift apart.
pub fn jittered(d: Duration, jitter: f64) -> Duration {
    d.mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0))
}

/// When a waiter looks below its row next: by its place in the queue and the pace at which the
/// queue moves, so it looks about when the answer can have changed, not at a fixed rate.
///
/// - A *turn* is how long one place in the queue takes: a hold plus its handoff. It starts from
///   what this process learnt of the key before (or the poll interval), weighted as two places,
///   and is learnt from the wait itself: the places gained since its first look over the time
///   they took (each gain dated half way between the look that found it and the one before).
///   Over the whole wait, not look by look: a waiter that looks often sees one place go by
///   between two close looks, which says little about how long a place takes.
/// - A waiter `k` places back (`k >= 2`) looks again after `0.9 (k - 1)` holds: the queue
///   cannot move `k - 1` places faster, so it is never late to take its place as next in line.
///   Late would cost the whole queue (the waiter behind it would wait on a row nobody knows is
///   granted); early costs a read. The waits of a queue of `n` cost about `ln n` looks each
///   instead of one per poll.
/// - The waiter next in line (`k = 1`) reckons when the holder ahead of it was granted: between
///   the look that still saw an earlier row there and the look that saw this one (or, at first
///   sight, within a hold before now). The holder is due a hold later; the hold is this
///   process's own usual hold of the key (the same function holds it everywhere), or three
///   quarters of a turn. It looks first when the holder may be done at the earliest, then at a
///   quarter of the distance to (or past) the moment it is due, never less often than every
///   `base` nor more often than every [`MIN_POLL`]: a critical section of the usual length is
///   handed over within a few milliseconds, a long one costs a few reads, then one per `base`
///   while it runs over. It aims at the hold, not the turn: a turn includes the handoff, and a
///   waiter that came late would learn a longer turn from its own lateness and come later still.
/// - While the queue stands still the pause grows with how long it has stood (a quarter of
///   it), up to `max`, so a hold far longer than usual costs a logarithm of it, then one look
///   per `max`.
///
/// A release by this same process wakes its next waiter at once whatever the pause
/// ([`crate::memory`]); the pace matters for waiters in other processes.
#[derive(Debug, Clone)]
pub struct Pace {
    turn: Duration,
    /// What the process knew before this wait.
    prior: Duration,
    /// The first look of this wait: when, how many rows were ahead.
    start: Option<(Instant, usize)>,
    hold: Option<Duration>,
    base: Duration,
    max: Duration,
    /// The previous look: when, how many rows were ahead, the nearest live one's ticket.
    last: Option<(Instant, usize, u64)>,
    /// When the queue last moved (or the wait began).
    moved: Option<Instant>,
    /// Next in line: the holder's ticket, and the earliest and latest it can have been granted.
    holder: Option<(u64, Instant, Instant)>,
}

/// The shortest pause between two looks of a waiter.
pub const MIN_POLL: Duration = Duration::from_millis(5);

impl Pace {
    /// A pace for one wait. `turn`: what the process learnt of the key before (`None`: the
    /// poll interval `base`); `hold`: its usual hold of the key, if it has held it; `max`
    /// caps every pause.
    pub fn new(
        turn: Option<Duration>,
        hold: Option<Duration>,
        base: Duration,
        max: Duration,
    ) -> Pace {
        let max = max.max(MIN_POLL);
        let turn = turn.unwrap_or(base).clamp(MIN_POLL, max);
        Pace {
            turn,
            prior: turn,
            start: None,
            hold,
            base: base.clamp(MIN_POLL, max),
            max,
            last: None,
            moved: None,
            holder: None,
        }
    }

    /// The turn learnt so far (to remember for the key's next wait).
    pub fn turn(&self) -> Duration {
        self.turn
    }

    /// Records a look at `now` that found `ahead` rows ahead of ours, the nearest live one being
    /// `nearest`; returns how long to sleep before the next look. `jitter` in `[0, 1)`.
    pub fn after_look(
        &mut self,
        now: Instant,
        ahead: usize,
        nearest: u64,
        jitter: f64,
    ) -> Duration {
        let ahead = ahead.max(1);
        // The baseline: the first look, or a later one that found more ahead than it (the first
        // count was low: others were still queueing in front, or it was a lower bound).
        let (started, first_ahead) = match self.start {
            Some((at, n)) if n >= ahead => (at, n),
            _ => *self.start.insert((now, ahead)),
        };
        let moved = match self.last {
            None => true,
            Some((at, before, was)) => {
                if ahead < before && ahead < first_ahead {
                    let gained = u32::try_from(first_ahead - ahead).unwrap_or(u32::MAX);
                    let when = at + now.saturating_duration_since(at) / 2;
                    let took = when.saturating_duration_since(started);
                    self.turn = ((self.prior * 2 + took) / (gained.saturating_add(2)))
                        .clamp(MIN_POLL, self.max);
                }
                ahead < before || was != nearest
            }
        };
        if moved {
            self.moved = Some(now);
        }
        let still = now.saturating_duration_since(self.moved.unwrap_or(now));
        let hold = self.hold.unwrap_or(self.turn * 3 / 4).min(self.turn);
        let pause = if ahead == 1 {
            let (earliest, latest) = match self.holder {
                Some((ticket, earliest, latest)) if ticket == nearest => (earliest, latest),
                _ => {
                    let range = match self.last {
                        // Granted between the look that saw another row next and this one.
                        Some((before, _, was)) if was != nearest => (before, now),
                        // First sight: within a hold before now.
                        _ => (now.checked_sub(hold).unwrap_or(now), now),
                    };
                    self.holder = Some((nearest, range.0, range.1));
                    range
                }
            };
            let first = earliest + hold;
            let due = earliest + (latest - earliest) / 2 + hold;
            let pause = if first > now {
                first - now
            } else if due > now {
                (due - now) / 4
            } else {
                (now - due) / 4
            };
            pause.min(self.base)
        } else {
            // The queue cannot move k - 1 places in less than k - 1 holds.
            let places = (ahead - 1) as f64;
            hold.mul_f64(0.9 * places).max(still / 4)
        };
        self.last = Some((now, ahead, nearest));
        #[cfg(test)]
        if crate::mutant::on(crate::mutant::Mutant::NoPollFloor) {
            return jittered(pause.min(self.max), jitter);
        }
        jittered(pause.clamp(MIN_POLL, self.max), jitter)
    }
}

/// Exponential backoff with full jitter for retries after throttling, transaction conflicts
/// and transient errors: `jitter * min(max, base * 2^attempt)`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let nominal = base.saturating_mul(1 << attempt.min(16)).min(max);
    nominal.mul_f64(jitter.clamp(0.05, 1.0))
}

#[cfg(test)]
mod tests;
