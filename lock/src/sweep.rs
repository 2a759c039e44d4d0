//! The sweeper: removes queue rows whose lease ended more than a grace period ago.
//!
//! Waiters already remove dead rows *ahead of them* (see `liveness`), and TTL removes the rest
//! eventually (typically within days, and expired rows stay visible until then). The sweeper is
//! the backstop in between: run on a schedule (the `flightlock-cleanup` Lambda function, or
//! `flightlock sweep`), it scans the table and deletes every queue row that is dead by a wide
//! margin. It never relies on TTL.
//!
//! ```no_run
//! # async fn demo(client: aws_sdk_dynamodb::Client) -> Result<(), flightlock::Error> {
//! use flightlock::sweep::{SweepOptions, Sweeper};
//! let summary = Sweeper::new(client, "flightlock").sweep(&SweepOptions::default()).await?;
//! tracing::info!(deleted = summary.deleted, complete = summary.complete, "swept");
//! # Ok(()) }
//! ```
//!
//! A row is **dead** when the sweeper's wall clock is past `leaseUntilMs + grace` ([`is_dead`]).
//! Each dead row is removed only if it is still the dead row that was read (same `owner`, same
//! `rvn`, lease still before the cutoff: the storage seam's `SweepDead` request); a dead seat is
//! vacated by the same condition and its counter stays. Counters and live rows are never
//! deleted; a sweep is idempotent, and one given a budget ([`SweepOptions::budget`]) stops
//! cleanly and says where to resume ([`ResumePoint`]).
//!
//! Why each rule holds, how to choose the grace and what a sweep costs (and why it scans rather
//! than keep an index): the guide's Cleanup and Cost pages (`docs/src/operations/cleanup.md`,
//! `docs/src/operations/cost.md`).
//!
//! ## Layout
//!
//! | file | what |
//! |---|---|
//! | `sweep.rs` | constants, expressions and the dead-row decision (pure) |
//! | `sweep/options.rs` | [`SweepOptions`], [`ResumePoint`], [`ScanKey`] (pure) |
//! | `sweep/summary.rs` | [`SweepSummary`] and per-row outcomes (pure) |
//! | `sweep/sweeper.rs` | [`Sweeper`]: the Scan and the conditional deletes (I/O) |

mod options;
mod summary;
mod sweeper;

use std::time::Duration;

use crate::schema::QueueRow;

pub use options::{ResumePoint, ScanKey, SweepOptions};
pub use summary::{RowOutcome, SweepSummary, SweptRow};
pub use sweeper::Sweeper;

/// Default grace after a lease end before the sweeper removes a row: 10 minutes.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);
/// Smallest accepted grace. It must also be at least every participant's clock-skew allowance
/// plus the sweeper's own clock error; the floor only catches obvious mistakes.
pub const MIN_GRACE: Duration = Duration::from_secs(1);
/// Default number of conditional deletes in flight.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Largest accepted concurrency (and number of scan segments).
pub const MAX_CONCURRENCY: usize = 256;
/// Attempts per request (on top of the SDK's own retries) for throttling and transient errors.
pub(crate) const MAX_ATTEMPTS: u32 = 6;
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(50);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How many error messages the summary keeps.
pub(crate) const MAX_ERROR_SAMPLES: usize = 5;

pub use crate::storage::{DELETE_CONDITION, FILTER, PROJECTION};

/// The cutoff for a sweep at wall time `now_ms`: rows whose lease ended before it are dead.
pub fn cutoff_ms(now_ms: i64, grace: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX))
}

/// The client-side decision: a row is dead when its lease ended before the cutoff
/// (`leaseUntilMs + grace < now`). The same comparison as the scan filter and the delete
/// condition, made again on the decoded row so a wrong or ignored filter cannot delete a live
/// row.
///
/// A row written in clock-free mode gets [`crate::options::CLOCK_FREE_GRACE`] more: its lease end
/// comes from a wall clock nobody vouches for.
pub fn is_dead(row: &QueueRow, cutoff_ms: i64) -> bool {
    let cutoff = if row.clock_free {
        cutoff_ms.saturating_sub(crate::clock::millis(crate::options::CLOCK_FREE_GRACE))
    } else {
        cutoff_ms
    };
    row.lease_until_ms < cutoff
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::schema::HolderInfo;

    pub(crate) fn row(lease_until_ms: i64) -> QueueRow {
        QueueRow {
            ticket: 7,
            owner: "o".into(),
            lease_until_ms,
            lease_ms: 20_000,
            expires_at: 0,
            seat: false,
            rvn: "r".into(),
            enqueued_at_ms: None,
            acquired_at_ms: None,
            clock_free: false,
            holder: HolderInfo::default(),
        }
    }

    #[test]
    fn dead_means_lease_end_plus_grace_before_now() {
        let grace = Duration::from_secs(600);
        let now = 10_000_000;
        let cutoff = cutoff_ms(now, grace);
        assert_eq!(cutoff, now - 600_000);
        assert!(is_dead(&row(now - 600_001), cutoff));
        assert!(!is_dead(&row(now - 600_000), cutoff));
        assert!(!is_dead(&row(now), cutoff));
        assert!(!is_dead(&row(now + 60_000), cutoff));
        assert_eq!(cutoff_ms(i64::MIN, grace), i64::MIN);
    }
}
