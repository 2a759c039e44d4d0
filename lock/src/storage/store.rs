//! [`Store`]: the protocol's handle on a backend. Typed helpers that make one request each and
//! unpack its answer, plus the tracker of background releases.

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    Backend, Beat, Enqueue, EnqueueRequest, Failure, Item, Owned, PermitsSet, Range, Renewal,
    Request, Response, ScanRequest, StaleDelete, SweepDead,
};
use crate::error::Error;
use crate::protocol::Speaks;
use crate::schema::{Counter, QueueRow, Snapshot, COUNTER_SK, SK};

/// The protocol's handle on a backend: typed requests, one each, and the background releases.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    backend: Arc<dyn Backend>,
    table: Arc<str>,
    /// Background releases (of dropped guards and cancelled acquisitions), so a process can wait
    /// for them before exiting.
    background: tokio_util::task::TaskTracker,
}

/// A storage answered a request with the wrong kind of response: a bug, never a user error.
#[derive(Debug, thiserror::Error)]
#[error("storage answered {operation} with {got}")]
struct WrongResponse {
    operation: &'static str,
    got: String,
}

impl Store {
    pub(crate) fn new(backend: Arc<dyn Backend>, table: &str) -> Store {
        Store {
            backend,
            table: table.into(),
            background: tokio_util::task::TaskTracker::new(),
        }
    }

    /// The backend behind this store.
    pub(crate) fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub(crate) fn background(&self) -> &tokio_util::task::TaskTracker {
        &self.background
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// Whether the table (or anything at its endpoint) has ever answered this store.
    pub(crate) fn answered(&self) -> bool {
        self.backend.answered()
    }

    pub(super) async fn call(&self, request: Request) -> Result<Response, Failure> {
        self.backend.call(request).await
    }

    pub(super) fn wrong(operation: &'static str, got: Response) -> Failure {
        Failure::Fatal(Error::Dynamo {
            operation,
            source: Box::new(WrongResponse {
                operation,
                got: format!("{got:?}"),
            }),
        })
    }

    /// Reads a key's counter and queue: a strongly consistent `Query`, page by page (DynamoDB
    /// pages at 1 MB, i.e. thousands of waiters). Pages are separate reads, so the result is not
    /// one snapshot; the protocol does not need one (rows below a ticket can only disappear, and
    /// a row that disappears between pages was read as present, which is the cautious side).
    pub(crate) async fn read(&self, key: &str) -> Result<Snapshot, Failure> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let request = Request::Query {
                key: key.to_owned(),
                start,
                range: Range::All,
            };
            match self.call(request).await? {
                Response::Page { items: page, next } => {
                    items.extend(page);
                    match next {
                        Some(k) if !k.is_empty() => start = Some(k),
                        _ => break,
                    }
                }
                other => return Err(Self::wrong("Query", other)),
            }
        }
        Snapshot::from_items(key, &items).map_err(Failure::Fatal)
    }

    /// The key's counter, and the first entry of `key`'s queue (the seat if taken, else the
    /// lowest row), if any.
    pub(crate) async fn read_lowest(
        &self,
        key: &str,
    ) -> Result<(Option<Counter>, Option<QueueRow>), Failure> {
        let request = Request::Query {
            key: key.to_owned(),
            start: None,
            range: Range::Lowest,
        };
        match self.call(request).await? {
            Response::Page { items, .. } => {
                let mut counter = None;
                for item in &items {
                    if matches!(item.get(SK), Some(AttributeValue::S(sk)) if sk == COUNTER_SK) {
                        counter = Some(Counter::from_item(key, item).map_err(Failure::Fatal)?);
                    }
                    if let Some(entry) = QueueRow::entry(key, item).map_err(Failure::Fatal)? {
                        return Ok((counter, Some(entry)));
                    }
                }
                Ok((counter, None))
            }
            other => Err(Self::wrong("Query", other)),
        }
    }

    /// One page of the rows at or below `ticket`, nearest first, and where the next page starts.
    pub(crate) async fn read_below(
        &self,
        key: &str,
        ticket: u64,
        limit: u32,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), Failure> {
        let request = Request::Query {
            key: key.to_owned(),
            start,
            range: Range::Below { ticket, limit },
        };
        match self.call(request).await? {
            Response::Page { items, next } => Ok((items, next.filter(|k| !k.is_empty()))),
            other => Err(Self::wrong("Query", other)),
        }
    }

    pub(crate) async fn enqueue(&self, request: &EnqueueRequest) -> Result<Enqueue, Failure> {
        match self.call(Request::Enqueue(request.clone())).await? {
            Response::Enqueue(e) => Ok(e),
            other => Err(Self::wrong("TransactWriteItems", other)),
        }
    }

    pub(crate) async fn create_counter(
        &self,
        key: &str,
        last: u64,
        owner: &str,
        permits: u32,
    ) -> Result<bool, Failure> {
        // One permit: protocol 1, exactly as a protocol 1 build creates it.
        let request = Request::CreateCounter {
            key: key.to_owned(),
            last,
            owner: owner.to_owned(),
            protocol: crate::protocol::Speaks::Permits(permits).protocol(),
            permits,
        };
        match self.call(request).await? {
            Response::Created(c) => Ok(c),
            other => Err(Self::wrong("PutItem", other)),
        }
    }

    /// Sets the permits of `key`'s counter (see [`Request::SetPermits`]).
    pub(crate) async fn set_permits(&self, key: &str, permits: u32) -> Result<PermitsSet, Failure> {
        let request = Request::SetPermits {
            key: key.to_owned(),
            permits,
        };
        match self.call(request).await? {
            Response::PermitsSet(p) => Ok(p),
            other => Err(Self::wrong("UpdateItem", other)),
        }
    }

    pub(crate) async fn delete_stale(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        rvn: &str,
        speaks: Speaks,
    ) -> Result<StaleDelete, Failure> {
        let request = Request::DeleteStale {
            key: key.to_owned(),
            ticket,
            seat,
            rvn: rvn.to_owned(),
            speaks,
        };
        match self.call(request).await? {
            Response::StaleDelete(o) => Ok(o),
            other => Err(Self::wrong("DeleteItem", other)),
        }
    }

    /// One page of the sweep's `Scan`: the items, how many were read, where the next page starts.
    pub(crate) async fn scan(
        &self,
        request: ScanRequest,
    ) -> Result<(Vec<Item>, u64, Option<Item>), Failure> {
        match self.call(Request::Scan(request)).await? {
            Response::Scanned {
                items,
                scanned,
                next,
            } => Ok((items, scanned, next.filter(|k| !k.is_empty()))),
            other => Err(Self::wrong("Scan", other)),
        }
    }

    /// The sweep's conditional removal of a dead entry.
    pub(crate) async fn sweep_dead(&self, request: SweepDead) -> Result<StaleDelete, Failure> {
        match self.call(Request::SweepDead(request)).await? {
            Response::StaleDelete(o) => Ok(o),
            other => Err(Self::wrong("DeleteItem", other)),
        }
    }

    pub(crate) async fn heartbeat(&self, beat: &Beat) -> Result<Renewal, Failure> {
        match self.call(Request::Heartbeat(beat.clone())).await? {
            Response::Renewal(r) => Ok(r),
            other => Err(Self::wrong("UpdateItem", other)),
        }
    }

    /// Deletes our own entry; for the seat, with `done`, marking that ordered tick done in the
    /// same write.
    pub(crate) async fn delete_owned(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        owner: &str,
        done: Option<i64>,
        speaks: Speaks,
    ) -> Result<Owned, Failure> {
        let request = Request::DeleteOwned {
            key: key.to_owned(),
            ticket,
            seat,
            owner: owner.to_owned(),
            speaks,
            done: done.filter(|_| seat),
        };
        match self.call(request).await? {
            Response::Owned(o) => Ok(o),
            other => Err(Self::wrong("DeleteItem", other)),
        }
    }
}

impl Store {
    /// Marks the ordered tick `tick` done on `key`'s counter (only forward). `true` if the
    /// watermark stands at `tick` now.
    pub(crate) async fn mark_done(&self, key: &str, tick: i64) -> Result<bool, Failure> {
        let request = Request::MarkDone {
            key: key.to_owned(),
            tick,
        };
        match self.call(request).await? {
            Response::Marked(m) => Ok(m),
            other => Err(Self::wrong("UpdateItem", other)),
        }
    }

    /// Whether the record of the done tick id `id` exists (a strongly consistent read).
    pub(crate) async fn tick_recorded(&self, key: &str, id: &str) -> Result<bool, Failure> {
        let request = Request::TickRecorded {
            key: key.to_owned(),
            id: id.to_owned(),
        };
        match self.call(request).await? {
            Response::Recorded(r) => Ok(r),
            other => Err(Self::wrong("Query", other)),
        }
    }

    /// Writes the record of the done tick id `id`, expiring at `expires_at` (epoch seconds).
    /// `true` if we wrote it, `false` if it existed.
    pub(crate) async fn record_tick(
        &self,
        key: &str,
        id: &str,
        expires_at: i64,
    ) -> Result<bool, Failure> {
        let request = Request::RecordTick {
            key: key.to_owned(),
            id: id.to_owned(),
            expires_at,
        };
        match self.call(request).await? {
            Response::Recorded(r) => Ok(r),
            other => Err(Self::wrong("PutItem", other)),
        }
    }
}
