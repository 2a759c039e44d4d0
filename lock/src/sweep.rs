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
//! - **Counters** (`sk = "counter"`) are never deleted: the server-side filter drops them, the
//!   client decodes only `q#…` rows, and every delete key is rebuilt from a decoded ticket.
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
//! `FilterExpression: begins_with(sk, :q) AND leaseUntilMs < :cutoff` and a
//! `ProjectionExpression` of the attributes the decision needs. DynamoDB bills a Scan on the
//! items it *reads*, before the filter and the projection: per page, the summed size of the
//! items read, rounded up to 4 KB, at 0.5 read units per 4 KB when eventually consistent.
//!
//! On a table with **100,000 idle keys** the reads are the 100,000 counter items (pk = the key,
//! `sk = "counter"`, `last`): about 60–100 bytes each, i.e. 6–10 MB, 6–10 Scan pages of 1 MB.
//! That is 6,000,000 / 4,096 × 0.5 ≈ **730** to 10,000,000 / 4,096 × 0.5 ≈ **1,220** read
//! request units per sweep (≈ 980 at 80 bytes), i.e. about **$0.00012** at the on-demand price of
//! $0.125 per million read units (us-east-1). Every 5 minutes (8,640 sweeps a month) that is
//! about 8.4 million read units, **≈ $1.06 per month**; hourly, ≈ $0.09 per month. Each dead row
//! deleted costs one write unit (a failed conditional delete too): $0.625 per million.
//! Measured by `examples/sweep_bench.rs` on DynamoDB Local (which reports consumed capacity like
//! DynamoDB): 110,000 items of 62 bytes on average, 7 pages, **829.5** read units per sweep.
//!
//! The alternative is a sparse GSI keyed on `leaseUntilMs` (projected only from queue rows), so
//! a sweep would `Query` just the dead rows and read almost nothing. But `leaseUntilMs` changes
//! at every heartbeat, and changing an index key attribute costs the index a delete plus a put:
//! **two extra write units per heartbeat** (plus one per enqueue and release), on the hot path of
//! every lock user, and a GSI needs a partition key that would have to be sharded to avoid a hot
//! partition. One holder heartbeating every 6.7 s (20 s lease) makes ~390,000 heartbeats a month:
//! ≈ 780,000 index writes ≈ $0.49 — so two busy keys already cost as much as scanning 100,000 idle
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::liveness::backoff;
use crate::schema::{self, n, queue_sk, s, QueueRow, PK, QUEUE_PREFIX, SK};
use crate::store::{Failure, Store};

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
const MAX_ATTEMPTS: u32 = 6;
const BACKOFF_BASE: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How many error messages the summary keeps.
const MAX_ERROR_SAMPLES: usize = 5;

/// The scan's filter: queue rows whose lease ended before the cutoff.
pub const FILTER: &str = "begins_with(#sk, :q) AND #until < :cutoff";
/// The scan's projection: exactly what [`QueueRow::from_item`] needs.
pub const PROJECTION: &str = "#pk, #sk, #ticket, #owner, #until, #leaseMs, #exp, #rvn";
/// The delete's condition: still the dead row that was read.
pub const DELETE_CONDITION: &str = "#owner = :owner AND #rvn = :rvn AND #until < :cutoff";

/// How to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOptions {
    /// Rows whose `leaseUntilMs` is more than this before the sweeper's wall clock are removed.
    /// Default [`DEFAULT_GRACE`]; see the module docs for how to choose it.
    pub grace: Duration,
    /// Conditional deletes in flight at once, across all segments. Default
    /// [`DEFAULT_CONCURRENCY`].
    pub concurrency: usize,
    /// Parallel scan segments (`TotalSegments`). Default 1.
    pub segments: u32,
    /// Items read per Scan page (`Limit`); `None`: DynamoDB's 1 MB pages. Smaller pages make the
    /// budget finer-grained at the cost of more requests.
    pub page_size: Option<u32>,
    /// Stop starting new work after this long. Default: none.
    pub budget: Option<Duration>,
    /// Judge and report, delete nothing.
    pub dry_run: bool,
    /// Continue an incomplete sweep from these points (from [`SweepSummary::resume`]); empty:
    /// scan the whole table.
    pub resume: Vec<ResumePoint>,
    /// How many dead rows the summary lists in [`SweepSummary::rows`]. Default 100.
    pub report_rows: usize,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            grace: DEFAULT_GRACE,
            concurrency: DEFAULT_CONCURRENCY,
            segments: 1,
            page_size: None,
            budget: None,
            dry_run: false,
            resume: Vec::new(),
            report_rows: 100,
        }
    }
}

impl SweepOptions {
    /// Checks ranges and that resume points agree with each other.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |name, problem: String| Err(Error::InvalidOption { name, problem });
        if self.grace < MIN_GRACE {
            return bad(
                "grace",
                format!(
                    "{:?} is too short: use at least {MIN_GRACE:?}, and at least the largest \
                     clock-skew allowance of any lock user (default 10m)",
                    self.grace
                ),
            );
        }
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return bad(
                "concurrency",
                format!("{} must be 1..={MAX_CONCURRENCY}", self.concurrency),
            );
        }
        let max_segments = MAX_CONCURRENCY as u32;
        if !(1..=max_segments).contains(&self.segments) {
            return bad(
                "segments",
                format!("{} must be 1..={max_segments}", self.segments),
            );
        }
        if self.page_size == Some(0) {
            return bad("page size", "0 must be at least 1".into());
        }
        for p in &self.resume {
            if p.total_segments != self.resume[0].total_segments || p.segment >= p.total_segments {
                return bad(
                    "resume",
                    format!(
                        "segment {} of {} does not fit the other resume points; pass the \
                         `resume` list of one summary unchanged",
                        p.segment, p.total_segments
                    ),
                );
            }
        }
        Ok(())
    }

    /// The segments to scan: the resume points, or every segment from the start.
    fn plan(&self) -> Vec<ResumePoint> {
        if !self.resume.is_empty() {
            return self.resume.clone();
        }
        (0..self.segments)
            .map(|segment| ResumePoint {
                segment,
                total_segments: self.segments,
                last_evaluated_key: None,
            })
            .collect()
    }
}

/// The primary key of an item, as a Scan's `ExclusiveStartKey` / `LastEvaluatedKey`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScanKey {
    /// Partition key (the lock key).
    pub pk: String,
    /// Sort key.
    pub sk: String,
}

impl ScanKey {
    fn from_item(item: &HashMap<String, AttributeValue>) -> Result<ScanKey, Error> {
        let get = |name: &str| match item.get(name) {
            Some(AttributeValue::S(v)) => Ok(v.clone()),
            other => Err(Error::MalformedItem {
                key: format!("{item:?}"),
                field: name.to_owned(),
                problem: format!("LastEvaluatedKey: expected a string, found {other:?}"),
            }),
        };
        Ok(ScanKey {
            pk: get(PK)?,
            sk: get(SK)?,
        })
    }

    fn to_item(&self) -> HashMap<String, AttributeValue> {
        HashMap::from([(PK.to_owned(), s(&self.pk)), (SK.to_owned(), s(&self.sk))])
    }
}

/// Where an unfinished scan segment continues.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumePoint {
    /// Segment number (0-based).
    pub segment: u32,
    /// Total number of segments of the sweep.
    pub total_segments: u32,
    /// Continue after this key; `None`: from the segment's start.
    pub last_evaluated_key: Option<ScanKey>,
}

/// What happened to one dead row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RowOutcome {
    /// Dry run: it would have been deleted.
    WouldDelete,
    /// Deleted.
    Deleted,
    /// Gone before our delete (a waiter or TTL removed it).
    AlreadyGone,
    /// Heartbeated since it was read: it survives.
    Revived,
    /// The delete failed after retries; the row is still there.
    Error,
    /// The budget ran out before the delete was tried.
    NotTried,
}

/// A dead row the sweep met.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweptRow {
    /// Lock key.
    pub key: String,
    /// Ticket.
    pub ticket: u64,
    /// Owner id of the row as read.
    pub owner: String,
    /// Lease end as read, epoch ms.
    pub lease_until_ms: i64,
    /// What happened.
    pub outcome: RowOutcome,
}

/// The result of a sweep. Serialized in camelCase; the Lambda function returns it as is.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepSummary {
    /// Items DynamoDB read (`ScannedCount`, before the filter): what the sweep is billed for.
    pub items_examined: u64,
    /// Items that passed the server-side filter and reached the sweeper.
    pub items_returned: u64,
    /// Queue rows decoded and judged on the client.
    pub queue_rows_examined: u64,
    /// Returned items that were not queue rows (counters, foreign items) and were left alone.
    /// The filter drops counters on the server, so this stays 0 unless the filter is bypassed;
    /// `items_examined - items_returned` counts what the server dropped.
    pub counters_skipped: u64,
    /// Rows judged dead (in a dry run: would have been deleted).
    pub dead: u64,
    /// Rows deleted.
    pub deleted: u64,
    /// Rows that passed the filter but the client judged live (its clock moved, or the server
    /// filter was wrong). Never deleted.
    pub still_live: u64,
    /// Dead rows already gone when we tried (removed by a waiter or TTL meanwhile).
    pub already_gone: u64,
    /// Dead rows that were heartbeated between our read and our delete: they survive.
    pub revived: u64,
    /// Rows or pages that failed after retries (the rows stay; a later sweep retries them).
    pub errors: u64,
    /// A few error messages, for the logs.
    pub error_samples: Vec<String>,
    /// Scan pages read.
    pub pages: u64,
    /// Wall-clock duration of the sweep, ms.
    pub duration_ms: u64,
    /// Whether every segment was scanned to its end and every dead row was tried.
    pub complete: bool,
    /// Where to continue when not complete (one point per unfinished segment).
    pub resume: Vec<ResumePoint>,
    /// Dry run: nothing was deleted.
    pub dry_run: bool,
    /// The grace used, ms.
    pub grace_ms: u64,
    /// The first dead rows met (at most [`SweepOptions::report_rows`]).
    pub rows: Vec<SweptRow>,
}

impl SweepSummary {
    fn merge(&mut self, other: SweepSummary, report_rows: usize) {
        self.items_examined += other.items_examined;
        self.items_returned += other.items_returned;
        self.queue_rows_examined += other.queue_rows_examined;
        self.counters_skipped += other.counters_skipped;
        self.dead += other.dead;
        self.deleted += other.deleted;
        self.still_live += other.still_live;
        self.already_gone += other.already_gone;
        self.revived += other.revived;
        self.errors += other.errors;
        self.pages += other.pages;
        for e in other.error_samples {
            if self.error_samples.len() < MAX_ERROR_SAMPLES {
                self.error_samples.push(e);
            }
        }
        let room = report_rows.saturating_sub(self.rows.len());
        self.rows.extend(other.rows.into_iter().take(room));
        self.resume.extend(other.resume);
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.error_samples.len() < MAX_ERROR_SAMPLES {
            self.error_samples.push(message);
        }
    }

    fn record(&mut self, row: &QueueRow, key: &str, outcome: RowOutcome, report_rows: usize) {
        match outcome {
            RowOutcome::WouldDelete | RowOutcome::NotTried | RowOutcome::Error => {}
            RowOutcome::Deleted => self.deleted += 1,
            RowOutcome::AlreadyGone => self.already_gone += 1,
            RowOutcome::Revived => self.revived += 1,
        }
        if self.rows.len() < report_rows {
            self.rows.push(SweptRow {
                key: key.to_owned(),
                ticket: row.ticket,
                owner: row.owner.clone(),
                lease_until_ms: row.lease_until_ms,
                outcome,
            });
        }
    }
}

/// The cutoff for a sweep at wall time `now_ms`: rows whose lease ended before it are dead.
pub fn cutoff_ms(now_ms: i64, grace: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX))
}

/// The client-side decision: a row is dead when its lease ended before the cutoff
/// (`leaseUntilMs + grace < now`). The same comparison as the scan filter and the delete
/// condition, made again on the decoded row so a wrong or ignored filter cannot delete a live
/// row.
pub fn is_dead(row: &QueueRow, cutoff_ms: i64) -> bool {
    row.lease_until_ms < cutoff_ms
}

/// Scans the lock table and removes dead queue rows. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sweeper {
    store: Store,
    clock: Arc<dyn Clock>,
}

/// One decoded candidate of a page.
struct Candidate {
    key: String,
    row: QueueRow,
}

impl Sweeper {
    /// A sweeper for `table`, using the system clock.
    pub fn new(client: Client, table: impl AsRef<str>) -> Sweeper {
        Sweeper {
            store: Store::new(client, table.as_ref()),
            clock: Arc::new(SystemClock),
        }
    }

    /// Uses another clock (tests inject a skewed one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Sweeper {
        self.clock = clock;
        self
    }

    /// Runs one sweep. Errors on single rows or pages are counted in the summary; only what a
    /// user must fix (missing table, access denied, invalid options) is an `Err`.
    pub async fn sweep(&self, opts: &SweepOptions) -> Result<SweepSummary, Error> {
        opts.validate()?;
        let started = self.clock.now();
        let deadline = opts.budget.map(|b| started + b);
        let permits = Arc::new(Semaphore::new(opts.concurrency));
        let segments = opts.plan().into_iter().map(|point| {
            let permits = Arc::clone(&permits);
            async move { self.segment(opts, point, deadline, &permits).await }
        });
        let results = futures::future::join_all(segments).await;
        let mut summary = SweepSummary {
            dry_run: opts.dry_run,
            grace_ms: u64::try_from(opts.grace.as_millis()).unwrap_or(u64::MAX),
            ..SweepSummary::default()
        };
        for result in results {
            summary.merge(result?, opts.report_rows);
        }
        summary.resume.sort_by_key(|p| p.segment);
        summary.complete = summary.resume.is_empty();
        summary.duration_ms =
            u64::try_from(self.clock.now().duration_since(started).as_millis()).unwrap_or(0);
        tracing::info!(
            table = self.store.table(),
            examined = summary.items_examined,
            dead = summary.dead,
            deleted = summary.deleted,
            revived = summary.revived,
            errors = summary.errors,
            complete = summary.complete,
            duration_ms = summary.duration_ms,
            "sweep finished"
        );
        Ok(summary)
    }

    fn out_of_time(&self, deadline: Option<Instant>) -> bool {
        deadline.is_some_and(|d| self.clock.now() >= d)
    }

    /// Scans one segment page by page, deleting each page's dead rows before reading the next.
    async fn segment(
        &self,
        opts: &SweepOptions,
        point: ResumePoint,
        deadline: Option<Instant>,
        permits: &Semaphore,
    ) -> Result<SweepSummary, Error> {
        let mut tally = SweepSummary::default();
        let mut start = point.last_evaluated_key.clone();
        loop {
            let unfinished = ResumePoint {
                last_evaluated_key: start.clone(),
                ..point.clone()
            };
            if self.out_of_time(deadline) {
                tally.resume.push(unfinished);
                return Ok(tally);
            }
            let cutoff = cutoff_ms(self.clock.wall_ms(), opts.grace);
            let page = match self
                .scan_page(opts, &point, start.as_ref(), cutoff, deadline)
                .await
            {
                Ok(page) => page,
                Err(Failure::Fatal(e)) => return Err(e),
                Err(retry) => {
                    tally.error(retry.into_error().to_string());
                    tally.resume.push(unfinished);
                    return Ok(tally);
                }
            };
            tally.pages += 1;
            tally.items_examined += page.scanned;
            tally.items_returned += page.items.len() as u64;
            let mut candidates = Vec::new();
            for item in &page.items {
                if let Some(c) = self.judge(item, cutoff, &mut tally) {
                    candidates.push(c);
                }
            }
            tally.dead += candidates.len() as u64;
            let tried = self
                .delete_all(opts, candidates, cutoff, deadline, permits, &mut tally)
                .await?;
            if !tried {
                tally.resume.push(unfinished);
                return Ok(tally);
            }
            match page.last_key {
                Some(k) => start = Some(k),
                None => return Ok(tally),
            }
        }
    }

    /// Decodes and judges one returned item; `Some` if it is a dead queue row.
    fn judge(
        &self,
        item: &HashMap<String, AttributeValue>,
        cutoff: i64,
        tally: &mut SweepSummary,
    ) -> Option<Candidate> {
        let key = match item.get(PK) {
            Some(AttributeValue::S(k)) => k.clone(),
            _ => {
                tally.counters_skipped += 1;
                return None;
            }
        };
        let is_queue_row =
            matches!(item.get(SK), Some(AttributeValue::S(sk)) if sk.starts_with(QUEUE_PREFIX));
        if !is_queue_row {
            tally.counters_skipped += 1;
            return None;
        }
        tally.queue_rows_examined += 1;
        let row = match QueueRow::from_item(&key, item) {
            Ok(row) => row,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "sweep: leaving a malformed queue row alone");
                tally.error(e.to_string());
                return None;
            }
        };
        if !is_dead(&row, cutoff) {
            tally.still_live += 1;
            return None;
        }
        Some(Candidate { key, row })
    }

    /// Deletes (or, in a dry run, reports) a page's dead rows with bounded concurrency. Returns
    /// false if the budget ran out before every row was tried.
    async fn delete_all(
        &self,
        opts: &SweepOptions,
        candidates: Vec<Candidate>,
        cutoff: i64,
        deadline: Option<Instant>,
        permits: &Semaphore,
        tally: &mut SweepSummary,
    ) -> Result<bool, Error> {
        if opts.dry_run {
            for c in &candidates {
                tally.record(&c.row, &c.key, RowOutcome::WouldDelete, opts.report_rows);
            }
            return Ok(true);
        }
        let mut outcomes = futures::stream::iter(candidates)
            .map(|c| async move {
                let outcome = match permits.acquire().await {
                    Ok(_permit) if !self.out_of_time(deadline) => {
                        self.delete_dead(&c, cutoff, deadline).await
                    }
                    _ => Ok(RowOutcome::NotTried),
                };
                (c, outcome)
            })
            .buffer_unordered(opts.concurrency);
        let mut all_tried = true;
        let mut fatal = None;
        while let Some((c, outcome)) = outcomes.next().await {
            let outcome = match outcome {
                Ok(o) => o,
                Err(Failure::Fatal(e)) => {
                    fatal.get_or_insert(e);
                    RowOutcome::Error
                }
                Err(retry) => {
                    tally.error(format!(
                        "deleting {} ticket {}: {}",
                        c.key,
                        c.row.ticket,
                        retry.into_error()
                    ));
                    RowOutcome::Error
                }
            };
            all_tried &= outcome != RowOutcome::NotTried;
            tally.record(&c.row, &c.key, outcome, opts.report_rows);
        }
        match fatal {
            Some(e) => Err(e),
            None => Ok(all_tried),
        }
    }

    /// Sleeps before retry `attempt`; false if that would pass the deadline or the attempts
    /// are used up.
    async fn pause(&self, attempt: u32, deadline: Option<Instant>) -> bool {
        if attempt >= MAX_ATTEMPTS {
            return false;
        }
        let wait = backoff(attempt, BACKOFF_BASE, BACKOFF_MAX, rand::random::<f64>());
        if deadline.is_some_and(|d| self.clock.now() + wait >= d) {
            return false;
        }
        tokio::time::sleep(wait).await;
        true
    }

    async fn scan_page(
        &self,
        opts: &SweepOptions,
        point: &ResumePoint,
        start: Option<&ScanKey>,
        cutoff: i64,
        deadline: Option<Instant>,
    ) -> Result<Page, Failure> {
        let mut attempt = 0;
        loop {
            let mut req = self
                .store
                .client()
                .scan()
                .table_name(self.store.table())
                .filter_expression(FILTER)
                .projection_expression(PROJECTION)
                .set_expression_attribute_names(Some(scan_names()))
                .expression_attribute_values(":q", s(QUEUE_PREFIX))
                .expression_attribute_values(":cutoff", n(cutoff))
                .consistent_read(false)
                .set_exclusive_start_key(start.map(ScanKey::to_item))
                .set_limit(opts.page_size.map(|l| i32::try_from(l).unwrap_or(i32::MAX)));
            if point.total_segments > 1 {
                req = req
                    .segment(i32::try_from(point.segment).unwrap_or(0))
                    .total_segments(i32::try_from(point.total_segments).unwrap_or(1));
            }
            let failure = match req.send().await {
                Ok(out) => {
                    let last_key = match out.last_evaluated_key {
                        Some(k) if !k.is_empty() => {
                            Some(ScanKey::from_item(&k).map_err(Failure::Fatal)?)
                        }
                        _ => None,
                    };
                    return Ok(Page {
                        scanned: u64::try_from(out.scanned_count).unwrap_or(0),
                        items: out.items.unwrap_or_default(),
                        last_key,
                    });
                }
                Err(e) => self.store.classify("Scan", e),
            };
            if matches!(failure, Failure::Fatal(_)) || !self.pause(attempt, deadline).await {
                return Err(failure);
            }
            tracing::debug!(attempt, "sweep: retrying Scan");
            attempt += 1;
        }
    }

    /// Deletes one dead row, only if it is still the row we read.
    async fn delete_dead(
        &self,
        c: &Candidate,
        cutoff: i64,
        deadline: Option<Instant>,
    ) -> Result<RowOutcome, Failure> {
        let mut attempt = 0;
        loop {
            let result = self
                .store
                .client()
                .delete_item()
                .table_name(self.store.table())
                .key(PK, s(&c.key))
                .key(SK, s(&queue_sk(c.row.ticket)))
                .condition_expression(DELETE_CONDITION)
                .expression_attribute_names("#owner", schema::OWNER)
                .expression_attribute_names("#rvn", schema::RVN)
                .expression_attribute_names("#until", schema::LEASE_UNTIL_MS)
                .expression_attribute_values(":owner", s(&c.row.owner))
                .expression_attribute_values(":rvn", s(&c.row.rvn))
                .expression_attribute_values(":cutoff", n(cutoff))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let failure = match result {
                Ok(_) => return Ok(RowOutcome::Deleted),
                Err(e) => match e.as_service_error() {
                    Some(DeleteItemError::ConditionalCheckFailedException(f)) => {
                        return Ok(match f.item() {
                            // Still there but no longer the row we read: heartbeated.
                            Some(_) => RowOutcome::Revived,
                            // Absent. (A retried delete whose first attempt succeeded but whose
                            // response was lost also lands here: gone either way.)
                            None => RowOutcome::AlreadyGone,
                        });
                    }
                    _ => self.store.classify("DeleteItem", e),
                },
            };
            if matches!(failure, Failure::Fatal(_)) || !self.pause(attempt, deadline).await {
                return Err(failure);
            }
            tracing::debug!(key = %c.key, ticket = c.row.ticket, attempt, "sweep: retrying DeleteItem");
            attempt += 1;
        }
    }
}

/// One Scan page.
struct Page {
    scanned: u64,
    items: Vec<HashMap<String, AttributeValue>>,
    last_key: Option<ScanKey>,
}

fn scan_names() -> HashMap<String, String> {
    [
        ("#pk", PK),
        ("#sk", SK),
        ("#ticket", schema::TICKET),
        ("#owner", schema::OWNER),
        ("#until", schema::LEASE_UNTIL_MS),
        ("#leaseMs", schema::LEASE_MS),
        ("#exp", schema::EXPIRES_AT),
        ("#rvn", schema::RVN),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::HolderInfo;

    fn row(lease_until_ms: i64) -> QueueRow {
        QueueRow {
            ticket: 7,
            owner: "o".into(),
            lease_until_ms,
            lease_ms: 20_000,
            expires_at: 0,
            rvn: "r".into(),
            enqueued_at_ms: None,
            acquired_at_ms: None,
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

    #[test]
    fn expressions_name_every_placeholder() {
        let names = scan_names();
        for expr in [FILTER, PROJECTION, DELETE_CONDITION] {
            for word in expr.split(|c: char| !(c.is_alphanumeric() || c == '#')) {
                if word.starts_with('#') {
                    assert!(names.contains_key(word), "{word} in {expr}");
                }
            }
        }
        // The projection carries every attribute QueueRow::from_item requires.
        for attr in [
            PK,
            SK,
            schema::TICKET,
            schema::OWNER,
            schema::LEASE_UNTIL_MS,
            schema::LEASE_MS,
            schema::EXPIRES_AT,
            schema::RVN,
        ] {
            assert!(names.values().any(|v| v == attr), "{attr}");
        }
        assert!(FILTER.contains("begins_with(#sk, :q)"));
    }

    #[test]
    fn options_are_validated() {
        assert!(SweepOptions::default().validate().is_ok());
        let bad = |o: SweepOptions| o.validate().unwrap_err().to_string();
        assert!(bad(SweepOptions {
            grace: Duration::from_millis(10),
            ..Default::default()
        })
        .contains("grace"));
        assert!(bad(SweepOptions {
            concurrency: 0,
            ..Default::default()
        })
        .contains("concurrency"));
        assert!(bad(SweepOptions {
            segments: 1000,
            ..Default::default()
        })
        .contains("segments"));
        let point = |segment, total_segments| ResumePoint {
            segment,
            total_segments,
            last_evaluated_key: None,
        };
        assert!(bad(SweepOptions {
            resume: vec![point(0, 2), point(1, 3)],
            ..Default::default()
        })
        .contains("resume"));
        assert!(bad(SweepOptions {
            resume: vec![point(2, 2)],
            ..Default::default()
        })
        .contains("resume"));
    }

    #[test]
    fn plan_is_every_segment_or_the_resume_points() {
        let opts = SweepOptions {
            segments: 3,
            ..Default::default()
        };
        let plan = opts.plan();
        assert_eq!(plan.len(), 3);
        assert!(plan
            .iter()
            .all(|p| p.total_segments == 3 && p.last_evaluated_key.is_none()));
        let resume = vec![ResumePoint {
            segment: 1,
            total_segments: 3,
            last_evaluated_key: Some(ScanKey {
                pk: "k".into(),
                sk: "counter".into(),
            }),
        }];
        let opts = SweepOptions {
            resume: resume.clone(),
            ..opts
        };
        assert_eq!(opts.plan(), resume);
    }

    #[test]
    fn scan_keys_round_trip_and_reject_odd_keys() {
        let key = ScanKey {
            pk: "a".into(),
            sk: "q#1".into(),
        };
        assert_eq!(ScanKey::from_item(&key.to_item()).unwrap(), key);
        let mut item = key.to_item();
        item.insert(SK.into(), n(1));
        assert!(ScanKey::from_item(&item).is_err());
        let json = serde_json::to_value(ResumePoint {
            segment: 0,
            total_segments: 1,
            last_evaluated_key: Some(key),
        })
        .unwrap();
        assert_eq!(json["lastEvaluatedKey"]["sk"], "q#1");
        assert_eq!(json["totalSegments"], 1);
    }

    #[test]
    fn summaries_merge_and_cap_rows() {
        let mut a = SweepSummary::default();
        let r = row(0);
        a.record(&r, "k", RowOutcome::Deleted, 2);
        let mut b = SweepSummary::default();
        b.record(&r, "k", RowOutcome::Revived, 2);
        b.record(&r, "k", RowOutcome::AlreadyGone, 2);
        for i in 0..10 {
            b.error(format!("e{i}"));
        }
        a.merge(b, 2);
        assert_eq!((a.deleted, a.revived, a.already_gone), (1, 1, 1));
        assert_eq!(a.rows.len(), 2);
        assert_eq!(a.errors, 10);
        assert_eq!(a.error_samples.len(), MAX_ERROR_SAMPLES);
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["rows"][1]["outcome"], "revived");
        assert!(json.get("itemsExamined").is_some());
    }
}
