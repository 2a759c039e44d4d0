//! [`Sweeper`]: the Scan and the conditional deletes. The thin I/O shell of the sweep.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{
    cutoff_ms, is_dead, ResumePoint, RowOutcome, ScanKey, SweepOptions, SweepSummary, BACKOFF_BASE,
    BACKOFF_MAX, DELETE_CONDITION, FILTER, MAX_ATTEMPTS, PROJECTION,
};
use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::liveness::backoff;
use crate::schema::{self, n, queue_sk, s, QueueRow, COUNTER_SK, PK, QUEUE_PREFIX, SK};
use crate::storage::Failure;
use crate::store::Dynamo;

/// Scans the lock table and removes dead queue rows. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sweeper {
    store: Dynamo,
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
            store: Dynamo::new(client, table.as_ref()),
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
        // A queue row, or a counter whose seat is taken (see `schema`).
        let is_queue_row = match item.get(SK) {
            Some(AttributeValue::S(sk)) if sk.starts_with(QUEUE_PREFIX) => true,
            Some(AttributeValue::S(sk)) => sk == COUNTER_SK && item.contains_key(schema::OWNER),
            _ => false,
        };
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
                .expression_attribute_values(":counter", s(COUNTER_SK))
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

    /// Removes one dead entry (deletes its row, or vacates its seat), only if it is still the
    /// entry we read, retrying transient failures within the budget.
    async fn delete_dead(
        &self,
        c: &Candidate,
        cutoff: i64,
        deadline: Option<Instant>,
    ) -> Result<RowOutcome, Failure> {
        let operation = if c.row.seat {
            "UpdateItem"
        } else {
            "DeleteItem"
        };
        let mut attempt = 0;
        loop {
            let attempted = if c.row.seat {
                self.vacate_dead(c, cutoff).await
            } else {
                self.delete_dead_row(c, cutoff).await
            };
            let failure = match attempted {
                Ok(outcome) => return Ok(outcome),
                Err(f) => f,
            };
            if matches!(failure, Failure::Fatal(_)) || !self.pause(attempt, deadline).await {
                return Err(failure);
            }
            tracing::debug!(key = %c.key, ticket = c.row.ticket, attempt, operation, "sweep: retrying");
            attempt += 1;
        }
    }

    /// One conditional `DeleteItem` of a dead row.
    async fn delete_dead_row(&self, c: &Candidate, cutoff: i64) -> Result<RowOutcome, Failure> {
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
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(RowOutcome::Deleted),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(f)) => Ok(match f.item() {
                    // Still there but no longer the row we read: heartbeated.
                    Some(_) => RowOutcome::Revived,
                    // Absent. (A retried delete whose first attempt succeeded but whose
                    // response was lost also lands here: gone either way.)
                    None => RowOutcome::AlreadyGone,
                }),
                _ => Err(self.store.classify("DeleteItem", e)),
            },
        }
    }

    /// One `UpdateItem` that empties a dead seat (the counter stays), only if it still holds the
    /// entry we read: [`DELETE_CONDITION`] in the placeholders the removal uses (one per
    /// attribute).
    async fn vacate_dead(&self, c: &Candidate, cutoff: i64) -> Result<RowOutcome, Failure> {
        let (names, remove) = schema::seat_placeholders();
        let condition = DELETE_CONDITION
            .replace("#owner", &schema::seat_placeholder(schema::OWNER))
            .replace("#rvn", &schema::seat_placeholder(schema::RVN))
            .replace("#until", &schema::seat_placeholder(schema::LEASE_UNTIL_MS));
        let result = self
            .store
            .client()
            .update_item()
            .table_name(self.store.table())
            .key(PK, s(&c.key))
            .key(SK, s(COUNTER_SK))
            .update_expression(remove)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .expression_attribute_values(":owner", s(&c.row.owner))
            .expression_attribute_values(":rvn", s(&c.row.rvn))
            .expression_attribute_values(":cutoff", n(cutoff))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(RowOutcome::Deleted),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(f)) => {
                    // Still our entry, heartbeated; or the seat is empty or someone else's.
                    let same_owner = f
                        .item()
                        .and_then(|i| i.get(schema::OWNER))
                        .is_some_and(|o| o.as_s().is_ok_and(|o| *o == c.row.owner));
                    Ok(if same_owner {
                        RowOutcome::Revived
                    } else {
                        RowOutcome::AlreadyGone
                    })
                }
                _ => Err(self.store.classify("UpdateItem", e)),
            },
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
        ("#clockFree", schema::CLOCK_FREE),
        ("#rvn", schema::RVN),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(FILTER.contains("begins_with(#sk, :q) OR #sk = :counter"));
    }
}
