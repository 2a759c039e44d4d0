//! [`Sweeper`]: pagination, bounded concurrency and the summary. The requests themselves (the
//! Scan page and the conditional removal) go through the storage seam ([`Store::scan`],
//! [`Store::sweep_dead`]), so the simulation runs this very code against its model.

use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{
    cutoff_ms, is_dead, ResumePoint, RowOutcome, ScanKey, SweepOptions, SweepSummary, BACKOFF_BASE,
    BACKOFF_MAX, MAX_ATTEMPTS,
};
use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::retry::Policy;
use crate::schema::{self, QueueRow, COUNTER_SK, PK, QUEUE_PREFIX, SK};
use crate::storage::{Backend, Dynamo, Failure, Item, ScanRequest, StaleDelete, Store, SweepDead};

/// The sweeper's retries: on top of the SDK's own, within the sweep's budget.
const RETRY: Policy = Policy {
    base: BACKOFF_BASE,
    max: BACKOFF_MAX,
    attempts: MAX_ATTEMPTS,
};

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
        let table = table.as_ref();
        Sweeper::on(Arc::new(Dynamo::new(client, table)), table)
    }

    /// A sweeper for `table` behind any backend (the simulation passes its model's endpoint).
    pub(crate) fn on(backend: Arc<dyn Backend>, table: &str) -> Sweeper {
        Sweeper {
            store: Store::new(backend, table),
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
        if summary.newer_protocol > 0 {
            tracing::warn!(
                table = self.store.table(),
                entries = summary.newer_protocol,
                keys = ?summary.newer_protocol_keys,
                speaks = crate::PROTOCOL,
                guide = crate::error::UPGRADE_GUIDE,
                "sweep left keys on a newer protocol alone: upgrade the sweeper"
            );
        }
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
            let cutoff = cutoff_ms(self.clock.wall_ms(), grace(opts));
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
    fn judge(&self, item: &Item, cutoff: i64, tally: &mut SweepSummary) -> Option<Candidate> {
        let key = match item.get(PK).and_then(|k| k.as_s().ok()) {
            Some(k) => k.clone(),
            _ => {
                tally.counters_skipped += 1;
                return None;
            }
        };
        // A queue row, or a counter whose seat is taken (see `schema`).
        let is_queue_row = match item.get(SK).and_then(|sk| sk.as_s().ok()) {
            Some(sk) if sk.starts_with(QUEUE_PREFIX) => true,
            Some(sk) => sk == COUNTER_SK && item.contains_key(schema::OWNER),
            None => false,
        };
        if !is_queue_row {
            tally.counters_skipped += 1;
            return None;
        }
        tally.queue_rows_examined += 1;
        if crate::protocol::check(&key, Some(item)).is_err() {
            // Written under (or, for a seat, on a counter of) a newer protocol: not ours to
            // judge. Left alone and reported.
            tracing::warn!(key = %key, speaks = crate::PROTOCOL, "sweep: leaving an entry of a key on a newer protocol alone; upgrade the sweeper");
            tally.newer_protocol(&key);
            return None;
        }
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
                Err(Failure::Fatal(Error::ProtocolTooNew { .. })) => {
                    // Switched to a newer protocol since the scan read it: left alone.
                    tally.newer_protocol(&c.key);
                    RowOutcome::NewerProtocol
                }
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

    /// One Scan page, retried within the budget.
    async fn scan_page(
        &self,
        opts: &SweepOptions,
        point: &ResumePoint,
        start: Option<&ScanKey>,
        cutoff: i64,
        deadline: Option<Instant>,
    ) -> Result<Page, Failure> {
        let request = ScanRequest {
            segment: point.segment,
            total_segments: point.total_segments,
            start: start.map(ScanKey::to_item),
            limit: opts.page_size,
            cutoff_ms: cutoff,
        };
        let mut attempt = 0;
        loop {
            let failure = match self.store.scan(request.clone()).await {
                Ok((items, scanned, next)) => {
                    let last_key = match next {
                        Some(k) => Some(ScanKey::from_item(&k).map_err(Failure::Fatal)?),
                        None => None,
                    };
                    return Ok(Page {
                        scanned,
                        items,
                        last_key,
                    });
                }
                Err(f) => f,
            };
            if !RETRY.pause(&failure, attempt, deadline, &*self.clock).await {
                return Err(failure);
            }
            attempt += 1;
        }
    }

    /// Removes one dead entry (deletes its row, or vacates its seat), only if it is still the
    /// entry we read and still dead, retrying transient failures within the budget.
    async fn delete_dead(
        &self,
        c: &Candidate,
        cutoff: i64,
        deadline: Option<Instant>,
    ) -> Result<RowOutcome, Failure> {
        let request = SweepDead {
            key: c.key.clone(),
            ticket: c.row.ticket,
            seat: c.row.seat,
            owner: c.row.owner.clone(),
            rvn: c.row.rvn.clone(),
            cutoff_ms: cutoff,
        };
        let mut attempt = 0;
        loop {
            let failure = match self.store.sweep_dead(request.clone()).await {
                Ok(StaleDelete::Deleted) => return Ok(RowOutcome::Deleted),
                Ok(StaleDelete::Revived) => return Ok(RowOutcome::Revived),
                Ok(StaleDelete::Gone) => return Ok(RowOutcome::AlreadyGone),
                Err(f) => f,
            };
            if !RETRY.pause(&failure, attempt, deadline, &*self.clock).await {
                return Err(failure);
            }
            attempt += 1;
        }
    }
}

/// The sweep's grace (under the test-only mutant: none).
fn grace(opts: &SweepOptions) -> std::time::Duration {
    #[cfg(test)]
    if crate::mutant::on(crate::mutant::Mutant::SweepWithoutGrace) {
        return std::time::Duration::ZERO;
    }
    opts.grace
}

/// One Scan page.
struct Page {
    scanned: u64,
    items: Vec<Item>,
    last_key: Option<ScanKey>,
}

#[cfg(test)]
mod tests {
    use super::super::{DELETE_CONDITION, FILTER, PROJECTION};
    use crate::schema::{self, PK, SK};
    use crate::storage::scan_names;

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
