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
    changed: bool,
}

/// Sightings not refreshed for this long are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// At most this many rows are remembered; past it the least recently seen are forgotten.
const MAX_SIGHTINGS: usize = 10_000;

impl Observer {
    /// Judges one row. `wall_ms` is our wall clock, `now` our monotonic clock.
    pub fn judge(
        &mut self,
        row: &QueueRow,
        wall_ms: i64,
        now: Instant,
        skew: ClockSkew,
    ) -> Verdict {
        let sighting = self
            .seen
            .entry(row.owner.clone())
            .or_insert_with(|| Sighting {
                rvn: row.rvn.clone(),
                since: now,
                last: now,
                changed: false,
            });
        if sighting.rvn != row.rvn {
            sighting.rvn.clone_from(&row.rvn);
            sighting.since = now;
            sighting.changed = true;
        }
        sighting.last = now;
        let first_seen = sighting.since;
        match skew {
            ClockSkew::Bounded(allowance) => {
                let allowance_ms = i64::try_from(allowance.as_millis()).unwrap_or(i64::MAX);
                if wall_ms > row.lease_until_ms.saturating_add(allowance_ms) {
                    Verdict::Stale
                } else {
                    Verdict::Live
                }
            }
            ClockSkew::Unbounded => {
                let lease = Duration::from_millis(u64::try_from(row.lease_ms).unwrap_or(0));
                // A 1/64 margin covers monotonic clocks that run at slightly different rates.
                if now.duration_since(first_seen) >= lease + lease / 64 {
                    Verdict::Stale
                } else {
                    Verdict::Live
                }
            }
        }
    }

    /// Whether we have seen this owner's row change: its owner was alive a moment ago. Clock-free
    /// mode needs it to say "busy" truthfully: a row seen once may be a dead one.
    pub fn seen_alive(&self, owner: &str) -> bool {
        self.seen.get(owner).is_some_and(|s| s.changed)
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

/// How long a waiter sleeps before looking again.
///
/// - The waiter next in line (`live_ahead == 1`) always polls at `base`, so a release is seen
///   within one poll interval.
/// - A waiter further back polls at `base` too while the queue is moving (its place improved
///   since its last look: `still_polls == 0`), because it may be next very soon. While the queue
///   stands still it backs off, doubling per look without progress, up to a factor set by its
///   place (`2^(live_ahead-1)`) and at most `max`. A long holder with a long queue then costs
///   little, and a fast-moving queue hands off without delay.
///
/// `jitter` in `[0, 1)` spreads waiters apart by ±25 %.
pub fn poll_interval(
    live_ahead: usize,
    still_polls: u32,
    base: Duration,
    max: Duration,
    jitter: f64,
) -> Duration {
    let by_place = u32::try_from(live_ahead.saturating_sub(1)).unwrap_or(u32::MAX);
    let doublings = by_place.min(still_polls).min(8);
    let nominal = base.saturating_mul(1 << doublings).min(max);
    nominal.mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// Exponential backoff with full jitter for retries after throttling, transaction conflicts
/// and transient errors: `jitter * min(max, base * 2^attempt)`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let nominal = base.saturating_mul(1 << attempt.min(16)).min(max);
    nominal.mul_f64(jitter.clamp(0.05, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::HolderInfo;

    fn row(owner: &str, rvn: &str, lease_until_ms: i64) -> QueueRow {
        QueueRow {
            ticket: 1,
            owner: owner.into(),
            lease_until_ms,
            lease_ms: 10_000,
            expires_at: 0,
            rvn: rvn.into(),
            enqueued_at_ms: None,
            acquired_at_ms: None,
            clock_free: false,
            holder: HolderInfo::default(),
        }
    }

    const SKEW: ClockSkew = ClockSkew::Bounded(Duration::from_secs(1));

    #[test]
    fn bounded_mode_waits_for_lease_plus_allowance() {
        let mut o = Observer::default();
        let now = Instant::now();
        let r = row("a", "1", 50_000);
        assert_eq!(o.judge(&r, 50_000, now, SKEW), Verdict::Live);
        assert_eq!(o.judge(&r, 51_000, now, SKEW), Verdict::Live);
        assert_eq!(o.judge(&r, 51_001, now, SKEW), Verdict::Stale);
    }

    #[tokio::test(start_paused = true)]
    async fn clock_free_mode_needs_an_unchanged_rvn_for_a_full_lease() {
        let mut o = Observer::default();
        // Wall time says "long dead": clock-free mode must not care.
        let wall = i64::MAX / 2;
        let t0 = Instant::now();
        assert_eq!(
            o.judge(&row("a", "1", 0), wall, t0, ClockSkew::Unbounded),
            Verdict::Live
        );
        tokio::time::advance(Duration::from_millis(9_000)).await;
        assert_eq!(
            o.judge(
                &row("a", "1", 0),
                wall,
                Instant::now(),
                ClockSkew::Unbounded
            ),
            Verdict::Live
        );
        // A heartbeat changes the rvn: the clock starts again.
        assert_eq!(
            o.judge(
                &row("a", "2", 0),
                wall,
                Instant::now(),
                ClockSkew::Unbounded
            ),
            Verdict::Live
        );
        tokio::time::advance(Duration::from_millis(10_000)).await;
        assert_eq!(
            o.judge(
                &row("a", "2", 0),
                wall,
                Instant::now(),
                ClockSkew::Unbounded
            ),
            Verdict::Live
        );
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(
            o.judge(
                &row("a", "2", 0),
                wall,
                Instant::now(),
                ClockSkew::Unbounded
            ),
            Verdict::Stale
        );
    }

    #[tokio::test(start_paused = true)]
    async fn observer_forgets_rows_not_seen_for_an_hour() {
        let mut o = Observer::default();
        o.judge(&row("a", "1", 0), 0, Instant::now(), SKEW);
        tokio::time::advance(Duration::from_secs(1800)).await;
        o.judge(&row("b", "1", 0), 0, Instant::now(), SKEW);
        tokio::time::advance(Duration::from_secs(1801)).await;
        o.forget_old(Instant::now());
        assert_eq!(o.seen.len(), 1);
        assert!(o.seen.contains_key("b"));
    }

    #[test]
    fn a_changed_rvn_proves_the_owner_alive() {
        let mut o = Observer::default();
        let now = Instant::now();
        o.judge(&row("a", "1", 0), 0, now, ClockSkew::Unbounded);
        assert!(!o.seen_alive("a"));
        o.judge(&row("a", "1", 0), 0, now, ClockSkew::Unbounded);
        assert!(!o.seen_alive("a"));
        o.judge(&row("a", "2", 0), 0, now, ClockSkew::Unbounded);
        assert!(o.seen_alive("a"));
        assert!(!o.seen_alive("b"));
    }

    #[test]
    fn poll_interval_backs_off_only_while_the_queue_stands_still() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        // Next in line: always the base interval.
        assert_eq!(poll_interval(1, 0, base, max, 0.5), base);
        assert_eq!(poll_interval(1, 10, base, max, 0.5), base);
        // Further back but the queue just moved: base.
        assert_eq!(poll_interval(5, 0, base, max, 0.5), base);
        // Further back and stuck: doubles per still look, bounded by the place and by max.
        assert_eq!(poll_interval(5, 1, base, max, 0.5), base * 2);
        assert_eq!(poll_interval(5, 3, base, max, 0.5), base * 8);
        assert_eq!(poll_interval(3, 9, base, max, 0.5), base * 4);
        assert_eq!(poll_interval(50, 50, base, max, 0.5), max);
        // Jitter: ±25 %.
        assert_eq!(
            poll_interval(1, 0, base, max, 0.0),
            Duration::from_millis(75)
        );
        assert_eq!(
            poll_interval(1, 0, base, max, 1.0),
            Duration::from_millis(125)
        );
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        let b = Duration::from_millis(10);
        let m = Duration::from_secs(1);
        assert_eq!(backoff(0, b, m, 1.0), b);
        assert_eq!(backoff(3, b, m, 1.0), b * 8);
        assert_eq!(backoff(30, b, m, 1.0), m);
        assert!(backoff(3, b, m, 0.5) < b * 8);
    }
}
