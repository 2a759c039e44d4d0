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

/// The shortest pause between two looks of a waiter.
pub const MIN_POLL: Duration = Duration::from_millis(5);

/// How long a waiter sleeps before looking again, by its place and the key's usual hold time.
///
/// - `ahead` is how many live rows are ahead of it (1: it is next). Each look reads only the rows
///   just below its own (one read unit), so this is exact for a short queue and a lower bound for
///   a long one.
/// - `hold` is how long this process usually holds the key (`None` until it has held it once).
/// - The waiter that is next looks every `base`, or every half a usual hold if holds are shorter
///   (never faster than [`MIN_POLL`]): a short critical section is handed over in about half its
///   length, a long one costs one read per `base`.
/// - A waiter further back expects `ahead - 1` holds to pass first and looks again after half of
///   that, doubling while the queue stands still, up to `max`: the requests on a key grow with the
///   logarithm of the queue, not with its length, until `max` caps the interval.
///
/// `jitter` in `[0, 1)` spreads waiters apart by ±25 %.
pub fn poll_interval(
    ahead: usize,
    hold: Option<Duration>,
    still_polls: u32,
    base: Duration,
    max: Duration,
    jitter: f64,
) -> Duration {
    let quick = hold.map_or(base, |h| (h / 2).clamp(MIN_POLL.min(base), base));
    let nominal = if ahead <= 1 {
        quick
    } else {
        let behind = u32::try_from(ahead - 1).unwrap_or(u32::MAX);
        let expect = hold.unwrap_or(base).saturating_mul(behind) / 2;
        expect
            .max(quick)
            .saturating_mul(1 << still_polls.min(4))
            .min(max)
            .max(quick)
    };
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
    fn pacing_follows_the_place_and_the_hold_time() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let ms = Duration::from_millis;
        // Next in line: base, or half a short hold (never under MIN_POLL).
        assert_eq!(poll_interval(1, None, 9, base, max, 0.5), base);
        assert_eq!(poll_interval(1, Some(ms(20)), 0, base, max, 0.5), ms(10));
        assert_eq!(poll_interval(1, Some(ms(4)), 0, base, max, 0.5), MIN_POLL);
        assert_eq!(poll_interval(1, Some(ms(10_000)), 0, base, max, 0.5), base);
        // Further back: half the expected wait, at least the quick interval, at most max.
        assert_eq!(poll_interval(3, Some(ms(20)), 0, base, max, 0.5), ms(20));
        assert_eq!(poll_interval(5, Some(ms(400)), 0, base, max, 0.5), ms(800));
        assert_eq!(poll_interval(50, Some(ms(400)), 0, base, max, 0.5), max);
        // Unknown hold: the base per place; doubling while nothing moves.
        assert_eq!(poll_interval(3, None, 0, base, max, 0.5), base);
        assert_eq!(poll_interval(3, None, 2, base, max, 0.5), base * 4);
        assert_eq!(poll_interval(3, None, 30, base, max, 0.5), base * 16);
        // Jitter: ±25 %.
        assert_eq!(poll_interval(1, None, 0, base, max, 0.0), ms(75));
        assert_eq!(poll_interval(1, None, 0, base, max, 1.0), ms(125));
    }

    #[test]
    fn requests_on_a_key_grow_slowly_with_the_queue() {
        // Sum of look rates of n waiters with 1 s holds: about (2/hold)·ln(n) looks per second
        // until max caps the far ones; never n/base.
        let rate = |n: usize| -> f64 {
            (1..=n)
                .map(|k| {
                    1.0 / poll_interval(
                        k,
                        Some(Duration::from_secs(1)),
                        0,
                        Duration::from_millis(100),
                        Duration::from_secs(30),
                        0.5,
                    )
                    .as_secs_f64()
                })
                .sum()
        };
        assert!(rate(100) < 25.0, "{}", rate(100));
        assert!(rate(1000) < 60.0, "{}", rate(1000));
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
