//! The storage seam: the requests the protocol makes, as values.
//!
//! The protocol (`locker.rs`, `heartbeat.rs`) never talks to DynamoDB directly. It builds a
//! [`Request`], hands it to a [`Storage`], and gets back a [`Response`] or a [`Failure`]. Two
//! implementations exist:
//!
//! - [`Dynamo`] (`dynamo.rs`): one DynamoDB API call per request (production, and every test
//!   against DynamoDB Local and moto);
//! - `sim::model` (tests only): an in-memory model of one table with the semantics the lock relies
//!   on, behind a simulated network, so a seeded scheduler can drive the *same protocol code*
//!   through schedules no real server can be pushed into. A differential test sends the same
//!   requests to both and compares the answers.
//!
//! Requests are owned values, and a storage returns a `'static` future: a request that the caller
//! stops waiting for (a timeout, a dropped acquisition) may still land later, exactly as on a
//! real network, and the simulation needs to be able to make that happen.
//!
//! [`Store`] is the protocol's handle: the storage, plus typed helpers that make one request each
//! and unpack its answer, plus the tracker of background releases.

pub(crate) mod answers;
mod dynamo;

#[cfg(test)]
pub(crate) use dynamo::scan_names;
pub(crate) use dynamo::Dynamo;
pub use dynamo::{DELETE_CONDITION, FILTER, PROJECTION};

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;

use crate::error::{BoxError, Error};
use crate::schema::{Counter, QueueRow, Snapshot, COUNTER_SK, PK, SK};

/// A DynamoDB item: attribute name to value.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// One request of the protocol. Each is one DynamoDB API call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    /// One page of a strongly consistent `Query` on `key`, continuing after `start`.
    Query {
        /// Lock key (the partition).
        key: String,
        /// `ExclusiveStartKey` of this page; `None` for the first page.
        start: Option<Item>,
        /// The whole partition in order, or only the rows at or below a ticket, nearest first.
        range: Range,
    },
    /// The atomic enqueue transaction (see [`EnqueueRequest`]).
    Enqueue(EnqueueRequest),
    /// `DeleteItem` of a row judged stale, conditioned on the `rvn` that was judged (for the
    /// seat: `UpdateItem` of the counter removing the seat's attributes, same condition).
    DeleteStale {
        /// Lock key.
        key: String,
        /// The row's ticket.
        ticket: u64,
        /// The entry is the counter's seat.
        seat: bool,
        /// The record version that was judged stale.
        rvn: String,
    },
    /// The sweep's removal of a dead entry (see [`SweepDead`]).
    SweepDead(SweepDead),
    /// One page of the sweep's eventually consistent `Scan` (see [`ScanRequest`]).
    Scan(ScanRequest),
    /// `UpdateItem` renewing our row (see [`Beat`]).
    Heartbeat(Beat),
    /// `PutItem` of a key's counter, only if it does not exist (`attribute_not_exists(pk)`).
    ///
    /// An enqueue conditioned on "there is no counter" would be unsafe: by the time it lands,
    /// others may have queued and been granted, and the counter been deleted (by hand) again, so
    /// its ticket, taken from an older read, could fall below theirs. So a missing counter is
    /// first created, at the highest ticket seen, and the queue read again.
    CreateCounter {
        /// Lock key.
        key: String,
        /// `last`: the highest ticket seen on the key.
        last: u64,
        /// `lastOwner`: our owner id.
        owner: String,
    },
    /// `DeleteItem` of our own row, conditioned on `owner` (for the seat: `UpdateItem` of the
    /// counter removing the seat's attributes, conditioned on `owner` and `ticket`).
    DeleteOwned {
        /// Lock key.
        key: String,
        /// Our ticket.
        ticket: u64,
        /// The entry is the counter's seat.
        seat: bool,
        /// Our owner id.
        owner: String,
    },
}

impl Request {
    /// The DynamoDB operation, for errors and traces.
    #[cfg(test)]
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Request::Query { .. } => "Query",
            Request::Enqueue(r) if r.seat => "UpdateItem",
            Request::Enqueue(_) => "TransactWriteItems",
            Request::DeleteStale { seat: true, .. } | Request::DeleteOwned { seat: true, .. } => {
                "UpdateItem"
            }
            Request::SweepDead(d) if d.seat => "UpdateItem",
            Request::DeleteStale { .. } | Request::DeleteOwned { .. } | Request::SweepDead(_) => {
                "DeleteItem"
            }
            Request::Scan(_) => "Scan",
            Request::Heartbeat(_) => "UpdateItem",
            Request::CreateCounter { .. } => "PutItem",
        }
    }
}

/// What a [`Request::Query`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Range {
    /// The counter and every row, in sort-key order, in pages of up to 1 MB.
    All,
    /// Queue rows with tickets at or below `ticket`, highest first (`ScanIndexForward = false`),
    /// then the counter (it sorts below every row: `sk BETWEEN "counter" AND q#ticket`), at most
    /// `limit` items a page. A waiter's poll: its own row, then the nearest rows ahead of it, and
    /// the seat once the page reaches the bottom of the queue. One read unit whatever the
    /// queue's length; it goes further only past stale rows.
    Below {
        /// Highest ticket read (the waiter's own).
        ticket: u64,
        /// `Limit`.
        limit: u32,
    },
    /// The counter and the lowest queue row only (ascending, `Limit 2`): where the queue starts
    /// (the seat if it is taken, else the lowest row). A waiter far back reads it to learn how
    /// far back it is (its ticket minus this one) for one read unit.
    Lowest,
}

/// `TransactWriteItems` of two items: the key's counter moves from `counter` to `ticket`, and our
/// row (with that ticket) is put if no row has that ticket. Issuance and insertion are one atomic
/// step, which closes the late-enqueue race (DESIGN.md §4).
///
/// With `seat`, the same step is one `UpdateItem` of the counter: it moves from `counter` to
/// `ticket` and takes the seat (see [`crate::schema`]) with the row's attributes, only if the
/// counter is as expected *and* the seat is empty. Only an enqueuer that knows the queue is
/// empty takes it (its read or its hint shows no live row, and the counter condition proves
/// nobody queued since), so the seat holder holds the key at once.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EnqueueRequest {
    /// Lock key.
    pub key: String,
    /// The ticket we take. Above the counter *and* above every row we have seen on the key, so a
    /// counter that was deleted or lowered by hand cannot hand out a ticket that is already
    /// queued (or, worse, one below the holder's).
    pub ticket: u64,
    /// The counter as we read it (or as our hint says it is). The counter update is conditioned
    /// on exactly this: `last` *and* `lastOwner` (see [`crate::schema::LAST_OWNER`]), so a counter
    /// set back by hand does not pass for one nobody touched. There is always a counter: an
    /// enqueue never bets on its absence (see [`Request::CreateCounter`]).
    pub counter: Counter,
    /// The full queue row.
    pub row: Item,
    /// Our owner id (also inside `row`).
    pub owner: String,
    /// `ClientRequestToken`: one token, one byte-identical request (retries reuse both).
    pub token: String,
    /// Take the counter's seat instead of putting a row.
    pub seat: bool,
}

/// The sweep's conditional removal of a dead entry: `DeleteItem` of its row (for the seat:
/// `UpdateItem` of the counter removing the seat's attributes), only if it is still the entry the
/// scan read *and* still dead: same `owner`, same `rvn`, `leaseUntilMs` before the cutoff
/// ([`crate::sweep::DELETE_CONDITION`]). The answer is a [`StaleDelete`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SweepDead {
    /// Lock key.
    pub key: String,
    /// The entry's ticket.
    pub ticket: u64,
    /// The entry is the counter's seat.
    pub seat: bool,
    /// The entry's owner, as read.
    pub owner: String,
    /// The entry's record version, as read.
    pub rvn: String,
    /// The sweep's cutoff, epoch ms: the stored lease must end before it.
    pub cutoff_ms: i64,
}

/// One page of the sweep's `Scan`: eventually consistent, filtered to queue rows and taken seats
/// whose lease ended before `cutoff_ms` ([`crate::sweep::FILTER`]), projected to what
/// [`crate::schema::QueueRow::from_item`] needs ([`crate::sweep::PROJECTION`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScanRequest {
    /// This segment (0 when the scan is not split).
    pub segment: u32,
    /// Number of segments (1: not split).
    pub total_segments: u32,
    /// `ExclusiveStartKey`; `None` for the first page.
    pub start: Option<Item>,
    /// `Limit`: items read (before the filter) per page; `None`: up to 1 MB.
    pub limit: Option<u32>,
    /// Rows whose lease ended before this, epoch ms, are returned.
    pub cutoff_ms: i64,
}

/// One heartbeat: `UpdateItem` of our row, conditioned on `owner` *and* on the stored lease not
/// being later than the one we write (`leaseUntilMs <= :until`). The owner condition keeps a late
/// heartbeat from bringing back a row that was deleted; the lease condition keeps a delayed older
/// heartbeat from rolling a newer lease back. A retried heartbeat that already landed writes the
/// same values again and still passes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Beat {
    /// Lock key.
    pub key: String,
    /// Our ticket.
    pub ticket: u64,
    /// Our entry is the counter's seat (no `expiresAt` is written there).
    pub seat: bool,
    /// Our owner id.
    pub owner: String,
    /// New lease end, epoch ms; never lower than the last one we wrote.
    pub lease_until_ms: i64,
    /// New TTL, epoch seconds.
    pub expires_at: i64,
    /// New record version.
    pub rvn: String,
    /// Set `acquiredAtMs` if it is not set yet (the row has just been granted).
    pub acquired_at_ms: Option<i64>,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Response {
    /// A page of a `Query`: its items, and where the next page starts (`None`: last page).
    Page {
        /// Items of this page, in sort-key order.
        items: Vec<Item>,
        /// `LastEvaluatedKey`.
        next: Option<Item>,
    },
    /// A page of a `Scan`: the items that passed the filter, how many were read, and where the
    /// next page starts (`None`: last page).
    Scanned {
        /// Items of this page that passed the filter.
        items: Vec<Item>,
        /// `ScannedCount`: items read, before the filter.
        scanned: u64,
        /// `LastEvaluatedKey`.
        next: Option<Item>,
    },
    /// Outcome of [`Request::Enqueue`].
    Enqueue(Enqueue),
    /// Outcome of [`Request::DeleteStale`] and [`Request::SweepDead`].
    StaleDelete(StaleDelete),
    /// Outcome of [`Request::Heartbeat`].
    Renewal(Renewal),
    /// Outcome of [`Request::DeleteOwned`].
    Owned(Owned),
    /// Outcome of [`Request::CreateCounter`]: `true` if we created it, `false` if one existed.
    Created(bool),
}

/// Result of the atomic enqueue transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Enqueue {
    /// The counter moved and our row was put, atomically.
    Done,
    /// The counter was not as expected; this is what it holds (`None`: it is gone).
    /// Nothing was written.
    CounterAt(Option<Counter>),
    /// Our row with this ticket already exists: an earlier, ambiguous attempt of this very
    /// request committed (the stored version is the one we sent).
    AlreadyOurs,
    /// An entry of ours with this ticket exists, written by an *earlier, different* request of
    /// this acquisition (another version and lease) that landed late. Nothing was written; we
    /// cannot know what that entry's lease promises, so it is removed and the queue read again.
    OursOlder,
    /// The counter was as expected but a row that is not ours has our ticket: the counter was
    /// lowered or deleted by hand. Nothing was written; read the queue and take a higher ticket.
    TicketTaken,
    /// Another transaction on the same items was in flight; try again after a backoff.
    Conflict,
}

/// Result of a conditional delete of a stale row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaleDelete {
    /// We deleted it.
    Deleted,
    /// It was already gone.
    Gone,
    /// Its `rvn` changed: its owner is alive after all.
    Revived,
}

/// Result of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The row was ours and now carries the new lease and `rvn`.
    Renewed,
    /// The row is ours but already carries a later lease: this heartbeat is older than one that
    /// landed. Nothing was written (the lease is not extended by this request).
    Superseded,
    /// The row is gone or belongs to someone else: the lock is lost.
    Gone,
}

/// Result of a conditional write on our own row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owned {
    /// The row was ours and the write happened.
    Yes,
    /// The row is gone or belongs to someone else: the lock is lost.
    No,
}

/// Why a request did not produce an outcome.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth retrying after a backoff: throttling, 5xx, timeouts, lost connections. A write that
    /// failed this way may or may not have happened (an *ambiguous* write).
    Retry {
        /// The service said to slow down.
        throttled: bool,
        /// Operation name, for the final error.
        operation: &'static str,
        /// The error.
        source: BoxError,
    },
    /// Retrying will not help; the user must act.
    Fatal(Error),
}

impl Failure {
    /// The error to report once the retry budget is spent.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Fatal(e) => e,
            Failure::Retry {
                throttled: true,
                operation,
                source,
            } => Error::Throttled { operation, source },
            Failure::Retry {
                operation, source, ..
            } => Error::Dynamo { operation, source },
        }
    }
}

/// Where requests go. Implementations must be cheap to call concurrently; the returned future
/// owns everything it needs (see the module docs).
pub(crate) trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Sends one request.
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>>;
}

/// The protocol's handle on a storage: typed requests, one each, and the background releases.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    storage: Arc<dyn Storage>,
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
    pub(crate) fn new(storage: Arc<dyn Storage>, table: &str) -> Store {
        Store {
            storage,
            table: table.into(),
            background: tokio_util::task::TaskTracker::new(),
        }
    }

    /// The storage behind this store.
    pub(crate) fn storage(&self) -> Arc<dyn Storage> {
        self.storage.clone()
    }

    pub(crate) fn background(&self) -> &tokio_util::task::TaskTracker {
        &self.background
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    async fn call(&self, request: Request) -> Result<Response, Failure> {
        self.storage.call(request).await
    }

    fn wrong(operation: &'static str, got: Response) -> Failure {
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

    /// The first entry of `key`'s queue (the seat if taken, else the lowest row), if any.
    pub(crate) async fn read_lowest(&self, key: &str) -> Result<Option<QueueRow>, Failure> {
        let request = Request::Query {
            key: key.to_owned(),
            start: None,
            range: Range::Lowest,
        };
        match self.call(request).await? {
            Response::Page { items, .. } => {
                for item in &items {
                    if let Some(entry) = QueueRow::entry(key, item).map_err(Failure::Fatal)? {
                        return Ok(Some(entry));
                    }
                }
                Ok(None)
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
    ) -> Result<bool, Failure> {
        let request = Request::CreateCounter {
            key: key.to_owned(),
            last,
            owner: owner.to_owned(),
        };
        match self.call(request).await? {
            Response::Created(c) => Ok(c),
            other => Err(Self::wrong("PutItem", other)),
        }
    }

    pub(crate) async fn delete_stale(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        rvn: &str,
    ) -> Result<StaleDelete, Failure> {
        let request = Request::DeleteStale {
            key: key.to_owned(),
            ticket,
            seat,
            rvn: rvn.to_owned(),
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

    pub(crate) async fn delete_owned(
        &self,
        key: &str,
        ticket: u64,
        seat: bool,
        owner: &str,
    ) -> Result<Owned, Failure> {
        let request = Request::DeleteOwned {
            key: key.to_owned(),
            ticket,
            seat,
            owner: owner.to_owned(),
        };
        match self.call(request).await? {
            Response::Owned(o) => Ok(o),
            other => Err(Self::wrong("DeleteItem", other)),
        }
    }
}

/// The primary key of a key's counter item.
pub(crate) fn counter_key(key: &str) -> Item {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(key.to_owned())),
        (SK.to_owned(), AttributeValue::S(COUNTER_SK.to_owned())),
    ])
}

/// The primary key of a queue entry: its row, or the counter for the seat.
pub(crate) fn entry_key(key: &str, ticket: u64, seat: bool) -> Item {
    if seat {
        counter_key(key)
    } else {
        row_key(key, ticket)
    }
}

/// The primary key of a queue row.
pub(crate) fn row_key(key: &str, ticket: u64) -> Item {
    HashMap::from([
        (PK.to_owned(), AttributeValue::S(key.to_owned())),
        (
            SK.to_owned(),
            AttributeValue::S(crate::schema::queue_sk(ticket)),
        ),
    ])
}
