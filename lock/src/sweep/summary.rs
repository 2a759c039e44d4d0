//! The result of a sweep. Pure.

use super::ResumePoint;
use super::MAX_ERROR_SAMPLES;
use crate::schema::QueueRow;

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
    /// Its key was switched to a newer protocol than this build speaks since the scan read it:
    /// left alone (counted in `SweepSummary::newer_protocol`).
    NewerProtocol,
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
    /// The first dead rows met (at most [`SweepOptions::report_rows`](super::SweepOptions::report_rows)).
    pub rows: Vec<SweptRow>,
    /// Entries left alone because their key runs a newer protocol than this build speaks
    /// ([`crate::PROTOCOL`]): upgrade the sweeper (see [`crate::error::UPGRADE_GUIDE`]).
    pub newer_protocol: u64,
    /// The keys of those entries (the first few).
    pub newer_protocol_keys: Vec<String>,
}

impl SweepSummary {
    pub(crate) fn merge(&mut self, other: SweepSummary, report_rows: usize) {
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
        self.newer_protocol += other.newer_protocol;
        for k in other.newer_protocol_keys {
            self.newer_protocol_key(k);
        }
        for e in other.error_samples {
            if self.error_samples.len() < MAX_ERROR_SAMPLES {
                self.error_samples.push(e);
            }
        }
        let room = report_rows.saturating_sub(self.rows.len());
        self.rows.extend(other.rows.into_iter().take(room));
        self.resume.extend(other.resume);
    }

    /// Counts an entry of a key on a newer protocol, left alone, and names its key.
    pub(crate) fn newer_protocol(&mut self, key: &str) {
        self.newer_protocol += 1;
        self.newer_protocol_key(key.to_owned());
    }

    fn newer_protocol_key(&mut self, key: String) {
        if self.newer_protocol_keys.len() < MAX_ERROR_SAMPLES
            && !self.newer_protocol_keys.contains(&key)
        {
            self.newer_protocol_keys.push(key);
        }
    }

    pub(crate) fn error(&mut self, message: String) {
        self.errors += 1;
        if self.error_samples.len() < MAX_ERROR_SAMPLES {
            self.error_samples.push(message);
        }
    }

    pub(crate) fn record(
        &mut self,
        row: &QueueRow,
        key: &str,
        outcome: RowOutcome,
        report_rows: usize,
    ) {
        match outcome {
            RowOutcome::WouldDelete
            | RowOutcome::NotTried
            | RowOutcome::Error
            | RowOutcome::NewerProtocol => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::tests::row;

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
