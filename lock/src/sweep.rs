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
//! ## What is deleted
//!
//! A row is **dead** when the sweeper's wall clock is past `leaseUntilMs + grace`
//! ([`is_dead`]). Each dead row is removed with a `DeleteItem` conditioned on the row still being
//! the dead row that was read: same `owner`, same `rvn`, and `leaseUntilMs` still before the
//! cutoff. A heartbeat that lands between the read and the delete changes the `rvn` (and
//! `leaseUntilMs`), so the delete fails and the row survives ([`SweepSummary::revived`]). A row
//! already removed by a waiter or TTL is counted as [`SweepSummary::already_gone`].
//!
//! - **Counters** (`sk = "counter"`) are never deleted. A counter whose seat (see
//!   [`crate::schema`]) holds a dead entry is *vacated*: an `UpdateItem` removes the seat's
//!   attributes under the same condition as a row's delete, and the counter stays. TTL never
//!   removes a seat (a counter has no `expiresAt`), so a dead seat is left for the next
//!   acquirer or the sweeper. Every delete key is rebuilt from a decoded ticket.
//! - **Live rows** are never deleted: the filter (`leaseUntilMs < :cutoff`) is only a bandwidth
//!   saving. The decision is made again on the client from the decoded row, and a third time by
//!   the delete's condition.
//! - **Idempotent**: a second sweep finds nothing to do; deleting a gone row is a no-op outcome.
//!
//! ## Choosing the grace
//!
//! A participant treats a row as dead once its own clock is past `leaseUntilMs` plus its
//! clock-skew allowance ([`ClockSkew::Bounded`](crate::ClockSkew)). The sweeper must never be
//! earlier than that, so `grace` must be at least the largest clock-skew allowance any
//! participant uses **plus** how far the sweeper's own clock may be ahead. The default, 10
//! minutes, is far above the lock's default allowance (1 s) and cheap: a dead row that lives 10
//! minutes longer costs nothing, since waiters pass dead rows over on their own. Clock-free
//! participants (`ClockSkew::Unbounded`) do not read `leaseUntilMs`; for them the grace is how
//! long after its lease end a row's owner must have stopped heartbeating, which holds whenever
//! the writer's wall clock is not behind the sweeper's by more than the grace.
//!
//! ## What a sweep reads, and what it costs
//!
//! One `Scan` of the whole table (paginated with `ExclusiveStartKey`, optionally split into
//! parallel segments), eventually consistent, with
//! `FilterExpression: (begins_with(sk, :q) OR sk = :counter) AND leaseUntilMs < :cutoff` and a
//! `ProjectionExpression` of the attributes the decision needs. DynamoDB bills a Scan on the
//! items it *reads*, before the filter and the projection: per page, the summed size of the
//! items read, rounded up to 4 KB, at 0.5 read units per 4 KB when eventually consistent.
//!
//! On a table with **100,000 idle keys** the reads are the 100,000 counter items (pk = the key,
//! `sk = "counter"`, `last`): 62 bytes each on average, 7 Scan pages of 1 MB, **829.5** read
//! request units per sweep, measured by `examples/sweep_bench.rs` on DynamoDB Local (which
//! reports consumed capacity like DynamoDB). Each dead row deleted costs one write unit (a
//! failed conditional delete too). What that costs in money: the guide's Cost page
//! (`docs/src/operations/cost.md`), the one place for cost figures.
//!
//! The alternative is a sparse GSI keyed on `leaseUntilMs` (projected only from queue rows), so
//! a sweep would `Query` just the dead rows and read almost nothing. But `leaseUntilMs` changes
//! at every heartbeat, and changing an index key attribute costs the index a delete plus a put:
//! **two extra write units per heartbeat** (plus one per enqueue and release), on the hot path of
//! every lock user, and a GSI needs a partition key that would have to be sharded to avoid a hot
//! partition. One holder heartbeating every 6.7 s (20 s lease) makes ~390,000 heartbeats a month:
//! ≈ 780,000 index write units — so two busy keys already cost as much as scanning 100,000 idle
//! keys every 5 minutes, and the cost grows with lock traffic instead of with how often one
//! chooses to sweep. The sweep is a backstop (waiters and TTL also clean up), so its frequency
//! can be turned down freely. We chose the Scan: the hot path stays at one write per heartbeat,
//! there is no index to keep consistent, and the sweep's cost is visible and tunable.
//!
//! ## Budget and resumption
//!
//! A sweep may be given a time budget ([`SweepOptions::budget`]). When it is spent, no new page
//! is read and no new delete starts; deletes in flight finish. The summary then says
//! `complete: false` and, per unfinished segment, where to resume ([`ResumePoint`]): the start key
//! of the first page not fully handled, so nothing is skipped (re-reading a page is harmless:
//! the sweep is idempotent). Pass the points back in [`SweepOptions::resume`] to continue.

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
