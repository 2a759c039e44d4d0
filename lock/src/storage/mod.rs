//! The storage seam: the requests the protocol makes, as values.
//!
//! The protocol (`locker.rs`, `membership.rs`) never talks to DynamoDB directly. It builds a
//! [`Request`], hands it to a [`Backend`], and gets back a [`Response`] or a [`Failure`]. Two
//! implementations exist:
//!
//! - [`Dynamo`] (`dynamo.rs`): one DynamoDB API call per request (production, and every test
//!   against DynamoDB Local and moto);
//! - `sim::model` (tests only): an in-memory model of one table with the semantics the lock relies
//!   on, behind a simulated network, so a seeded scheduler can drive the *same protocol code*
//!   through schedules no real server can be pushed into. A differential test sends the same
//!   requests to both and compares the answers.
//!
//! Requests are owned values, and a backend returns a `'static` future: a request that the caller
//! stops waiting for (a timeout, a dropped acquisition) may still land later, exactly as on a
//! real network, and the simulation needs to be able to make that happen.
//!
//! One word each: a **backend** is where requests go (the trait [`Backend`]; [`Dynamo`] is the
//! DynamoDB one), and the **store** ([`Store`]) is the protocol's handle on a backend: typed
//! helpers that make one request each and unpack its answer, plus the tracker of background
//! releases. "Storage" names only this module, the seam between them and the protocol.

pub(crate) mod answers;
mod dynamo;
mod store;

#[cfg(test)]
pub(crate) use dynamo::scan_names;
pub(crate) use dynamo::Dynamo;
pub use dynamo::{DELETE_CONDITION, FILTER, PROJECTION};
pub(crate) use store::Store;

use std::collections::HashMap;
use std::fmt;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::BoxFuture;

use crate::error::{BoxError, Error};
pub(crate) use crate::protocol::Speaks;
use crate::schema::{Counter, COUNTER_SK, PK, SK};

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
        /// The remover's version condition on a seat ([`Speaks::maintain`]).
        speaks: Speaks,
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
        /// `protocol`: the protocol the key runs from now on. This build always creates
        /// counters at [`crate::PROTOCOL`]; the differential test also creates one at a newer
        /// protocol, as a newer build would.
        protocol: u32,
        /// `permits` (written only above 1, with `protocol = 2`): the key's permits, ours.
        permits: u32,
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
        /// The seat only: also mark this ordered tick done in the same `UpdateItem`
        /// (`SET tickDone`, conditioned on the stored one not being newer; [`Owned::NotMarked`]
        /// if it is). A row's release marks the counter first ([`Request::MarkDone`]).
        done: Option<i64>,
        /// Our version condition on a seat ([`Speaks::maintain`]).
        speaks: Speaks,
    },
    /// `UpdateItem` of the key's counter marking an ordered tick done: `SET tickDone = :tick`
    /// if the counter exists and its `tickDone` is absent or not newer (the watermark never moves
    /// backwards). Sent by the release of a queue row with `release_done`, before its delete.
    MarkDone {
        /// Lock key.
        key: String,
        /// The tick, epoch ms.
        tick: i64,
    },
    /// A strongly consistent `Query` of one done tick id's record (see
    /// [`crate::schema::TICK_PREFIX`]), made once the lock is held.
    TickRecorded {
        /// Lock key.
        key: String,
        /// The tick id.
        id: String,
    },
    /// `UpdateItem` of a key's counter setting its permits (`SET protocol = 2, permits = N`, or
    /// for one permit `SET protocol = 1 REMOVE permits`), conditioned on the counter existing,
    /// on its seat being empty and on its protocol being one this build speaks (see
    /// `crate::permits`). The answer is a [`PermitsSet`].
    SetPermits {
        /// Lock key.
        key: String,
        /// The key's permits from now on.
        permits: u32,
    },
    /// `PutItem` of a done tick id's record, if it does not exist; TTL `expiresAt`.
    RecordTick {
        /// Lock key.
        key: String,
        /// The tick id.
        id: String,
        /// TTL, epoch seconds.
        expires_at: i64,
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
            Request::Heartbeat(_) | Request::MarkDone { .. } | Request::SetPermits { .. } => {
                "UpdateItem"
            }
            Request::CreateCounter { .. } | Request::RecordTick { .. } => "PutItem",
            Request::TickRecorded { .. } => "Query",
        }
    }
}

/// What a [`Request::Query`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Range {
    /// The counter and every row, in sort-key order, in pages of up to 1 MB
    /// (`sk BETWEEN "counter" AND` the highest row's: a done tick's record, which sorts after
    /// every row, is never read).
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
/// step, which closes the late-enqueue race (`lock/PROTOCOL.md`, "Safety guards and what catches each").
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
    /// Our ordered tick, epoch ms: the counter update is also conditioned on
    /// `tickDone < tick` (absent counts as below), so a done tick never enqueues.
    pub tick: Option<i64>,
    /// The `tickNewest` to set: the highest of the counter's as read and our tick. Conditioned on
    /// the stored one not being higher (it is what we read, unless our counter came from a hint).
    pub newest: Option<i64>,
    /// Our permits: the counter's condition is [`Speaks::Permits`] of them (one: protocol 1,
    /// exactly as before; more: the key's `permits` must be ours).
    pub permits: u32,
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
    /// Our version condition on a seat ([`Speaks::maintain`]).
    pub speaks: Speaks,
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
    /// Outcome of [`Request::MarkDone`]: `true` if the watermark is at our tick now, `false` if
    /// a newer tick is marked or there is no counter (nothing written).
    Marked(bool),
    /// Outcome of [`Request::TickRecorded`] (the record exists) and [`Request::RecordTick`]
    /// (`true`: we wrote it; `false`: it existed).
    Recorded(bool),
    /// Outcome of [`Request::SetPermits`].
    PermitsSet(PermitsSet),
}

/// Result of [`Request::SetPermits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitsSet {
    /// The counter carries the new permits.
    Set,
    /// There is no counter (any more): nothing was written.
    NoCounter,
    /// The counter's seat is taken by this ticket: nothing was written (changing the version
    /// under a seated holder would cost it its lock at its next heartbeat).
    SeatTaken(u64),
    /// The counter was refused for another reason that a fresh read explains (it changed since
    /// it was read): nothing was written.
    Changed,
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
    /// The seat is ours, but a release that also marks a tick found a newer tick marked: nothing
    /// was written (the watermark never moves backwards). Release without the mark.
    NotMarked,
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
pub(crate) trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Sends one request.
    fn call(&self, request: Request) -> BoxFuture<'static, Result<Response, Failure>>;

    /// Whether any request has been answered (by the table or anything at its endpoint). An
    /// in-memory backend always answers.
    fn answered(&self) -> bool {
        true
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
