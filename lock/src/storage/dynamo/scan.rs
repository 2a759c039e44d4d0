//! The sweep's `Scan`: the one request only the sweeper makes (lock users never scan). A file of
//! its own so the template's least-privilege test can tell the cleanup function's actions from a
//! lock user's by file.

use std::collections::HashMap;

use super::Dynamo;
use crate::schema::{self, n, s, PK, SK};
use crate::storage::{Failure, Response, ScanRequest};

impl Dynamo {
    /// One page of the sweep's `Scan` (see [`ScanRequest`]).
    pub(super) async fn scan(&self, r: ScanRequest) -> Result<Response, Failure> {
        let mut req = self
            .client
            .scan()
            .table_name(&*self.table)
            .filter_expression(FILTER)
            .projection_expression(PROJECTION)
            .set_expression_attribute_names(Some(scan_names()))
            .expression_attribute_values(":q", s(schema::QUEUE_PREFIX))
            .expression_attribute_values(":counter", s(schema::COUNTER_SK))
            .expression_attribute_values(":cutoff", n(r.cutoff_ms))
            .consistent_read(false)
            .set_exclusive_start_key(r.start)
            .set_limit(r.limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)));
        if r.total_segments > 1 {
            req = req
                .segment(i32::try_from(r.segment).unwrap_or(0))
                .total_segments(i32::try_from(r.total_segments).unwrap_or(1));
        }
        match req.send().await {
            Ok(out) => Ok(Response::Scanned {
                scanned: u64::try_from(out.scanned_count).unwrap_or(0),
                items: out.items.unwrap_or_default(),
                next: out.last_evaluated_key.filter(|k| !k.is_empty()),
            }),
            Err(e) => Err(self.classify("Scan", e)),
        }
    }
}

// The sweep's expressions (re-exported by `crate::sweep`, which documents what a sweep does).

/// The scan's filter: queue rows and taken seats whose lease ended before the cutoff.
pub const FILTER: &str = "(begins_with(#sk, :q) OR #sk = :counter) AND #until < :cutoff";
/// The scan's projection: exactly what [`crate::schema::QueueRow::from_item`] needs, and the
/// protocol an entry was written under (a seat's is its counter's).
pub const PROJECTION: &str =
    "#pk, #sk, #ticket, #owner, #until, #leaseMs, #exp, #rvn, #clockFree, #proto";
/// The placeholders of [`FILTER`], [`PROJECTION`] and [`super::DELETE_CONDITION`].
pub(crate) fn scan_names() -> HashMap<String, String> {
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
        (crate::protocol::NAME, schema::PROTOCOL_ATTR),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}
