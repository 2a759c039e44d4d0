//! Options of a sweep, and where an incomplete sweep resumes. Pure.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{DEFAULT_CONCURRENCY, DEFAULT_GRACE, MAX_CONCURRENCY, MIN_GRACE};
use crate::error::Error;
use crate::schema::{s, PK, SK};

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
    /// Continue an incomplete sweep from these points (from [`SweepSummary::resume`](super::SweepSummary::resume)); empty:
    /// scan the whole table.
    pub resume: Vec<ResumePoint>,
    /// How many dead rows the summary lists in [`SweepSummary::rows`](super::SweepSummary::rows). Default 100.
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
    pub(crate) fn plan(&self) -> Vec<ResumePoint> {
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
    pub(crate) fn from_item(item: &HashMap<String, AttributeValue>) -> Result<ScanKey, Error> {
        let get = |name: &str| match item.get(name) {
            Some(AttributeValue::S(v)) => Ok(v.clone()),
            other => Err(Error::MalformedItem {
                key: format!("{item:?}"),
                sk: "?".into(),
                field: name.to_owned(),
                problem: format!("LastEvaluatedKey: expected a string, found {other:?}"),
            }),
        };
        Ok(ScanKey {
            pk: get(PK)?,
            sk: get(SK)?,
        })
    }

    pub(crate) fn to_item(&self) -> HashMap<String, AttributeValue> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::n;

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
}
