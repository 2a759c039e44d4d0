//! An in-memory model of one DynamoDB table, with exactly the semantics the lock relies on.
//!
//! - Items keyed by (`pk`, `sk`), a `Query` returns a partition in sort-key order, page by page
//!   (`page_size` items a page, `LastEvaluatedKey` while more remain). Reads are strongly
//!   consistent: every applied write is visible to the next read.
//! - Each request's condition is evaluated and its writes applied at one instant (the server's),
//!   `TransactWriteItems` all-or-nothing, with one cancellation reason per item and the item
//!   returned for failed conditions (`ReturnValuesOnConditionCheckFailure = ALL_OLD`).
//! - `ClientRequestToken`: a transaction that succeeded is remembered for 10 minutes; the same
//!   token with the same request succeeds again without writing, with a different request it is
//!   `IdempotentParameterMismatchException`.
//! - TTL: an item whose `expiresAt` (epoch seconds) is before the server's time *may* be deleted,
//!   at any later moment ([`Table::reap`]); until then reads still return it.
//!
//! The cancellation reasons are interpreted by the same function as DynamoDB's
//! ([`crate::storage::answers::enqueue_outcome`]), so the model and the real shell can only differ in what
//! the server does, which is what the differential test compares.
//!
//! The model also records every removal of a queue row by a waiter, the sweeper or TTL
//! ([`Table::removals`]), for the simulation's checker: nobody may remove a row while its owner
//! may still be alive.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use tokio::time::Instant;

use crate::error::Error;
use crate::schema::{self, Snapshot, COUNTER_SK, PK, SK};
use crate::storage::answers::{
    enqueue_outcome, renewal_refused, row_judged, seat_judged, seat_refused, seat_release_refused,
};
use crate::storage::{
    EnqueueRequest, Failure, Item, Owned, Renewal, Request, Response, ScanRequest, StaleDelete,
};

/// How long DynamoDB remembers a `ClientRequestToken`.
pub(crate) const TOKEN_WINDOW: Duration = Duration::from_secs(600);

/// Deliberate defects, to show that the simulation catches a broken protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// A two-write enqueue: take a ticket from the counter, then put the row in a second
    /// write (applied later, by the network model). Opens the late-enqueue race.
    TwoWriteEnqueue,
    /// Stale rows are deleted without the `rvn` condition: a heartbeat that lands between the
    /// judgement and the delete no longer saves the row.
    UnconditionalStaleDelete,
    /// Heartbeats are conditioned on `owner` only: a delayed older heartbeat rolls a
    /// newer lease back.
    HeartbeatRollback,
    /// Heartbeats upsert: a heartbeat that finds no entry writes one (its condition accepts a
    /// missing owner), so a late heartbeat brings a released row back.
    HeartbeatUpsert,
    /// A waiter's looks show every row's lease thirty leases longer than stored: waiters pass
    /// a dead row over that much later (a dead holder costing many leases). Only a waiter that
    /// waits forever is slowed; the check that sees it is the takeover bound.
    SlowTakeover,
    /// The seat is taken whenever it is empty, without the counter condition: an enqueuer that
    /// read an empty queue takes it even after others queued (and were granted) since.
    SeatWithoutCounter,
    /// The enqueue's tick condition is dropped: a done tick takes the seat or queues again.
    EnqueueIgnoresWatermark,
    /// A release that marks a tick moves the watermark backwards too.
    MarkBackwards,
}

/// Who removed a queue row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remover {
    /// A waiter passing a stale row over.
    Waiter,
    /// The sweeper.
    Sweeper,
    /// DynamoDB's TTL.
    Ttl,
}

/// A queue row removed by a waiter, the sweeper or TTL. The checker compares the moment with
/// when the removed version (`rvn`) was sent: before one lease has passed since, its owner may
/// still be alive and believe in it.
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    pub key: String,
    pub ticket: u64,
    pub rvn: String,
    pub by: Remover,
    pub at: Instant,
    /// Its lease.
    pub lease: Duration,
}

/// Counts of protocol outcomes, to show which paths a run went through.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outcomes {
    pub stale_deleted: u64,
    pub stale_gone: u64,
    pub stale_revived: u64,
    pub heartbeat_superseded: u64,
    pub ticket_taken: u64,
    pub token_replays: u64,
    pub ttl_deleted: u64,
    pub swept: u64,
    /// Every kind of answer the table gave (see `net::kind`), counted.
    pub kinds: BTreeMap<String, u64>,
}

impl Outcomes {
    /// Counts one answer of `kind`.
    pub(crate) fn count(&mut self, kind: &str) {
        *self.kinds.entry(kind.to_owned()).or_default() += 1;
    }

    /// Adds another run's counts.
    pub(crate) fn add(&mut self, o: &Outcomes) {
        self.stale_deleted += o.stale_deleted;
        self.stale_gone += o.stale_gone;
        self.stale_revived += o.stale_revived;
        self.heartbeat_superseded += o.heartbeat_superseded;
        self.ticket_taken += o.ticket_taken;
        self.token_replays += o.token_replays;
        self.ttl_deleted += o.ttl_deleted;
        self.swept += o.swept;
        for (k, n) in &o.kinds {
            *self.kinds.entry(k.clone()).or_default() += n;
        }
    }
}

/// A queue entry (row or seat) removed from the table, by anyone: its owner must learn it.
#[derive(Debug, Clone)]
pub(crate) struct Gone {
    pub key: String,
    pub owner: String,
    pub ticket: u64,
    pub at: Instant,
}

#[derive(Debug, Clone)]
struct Stored {
    item: Item,
}

/// The table.
#[derive(Debug)]
pub(crate) struct Table {
    items: BTreeMap<(String, String), Stored>,
    tokens: HashMap<String, (EnqueueRequest, Instant)>,
    /// Items per `Query` page.
    pub page_size: usize,
    /// Server wall time at `Instant` `origin`, epoch ms.
    pub epoch_ms: i64,
    origin: Instant,
    pub mutation: Option<Mutation>,
    pub removals: Vec<Removal>,
    /// Every entry removed, by whoever removed it (its owner included).
    pub gone: Vec<Gone>,
    pub outcomes: Outcomes,
    /// Keys whose partition became empty (no counter, no row): nothing remembers their tokens,
    /// which may start again from 1. Cleared by the checker.
    pub wiped: std::collections::BTreeSet<String>,
}

fn num(item: &Item, name: &str) -> Option<i64> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => None,
    }
}

fn string<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v),
        _ => None,
    }
}

fn pk_sk(item: &Item) -> Option<(String, String)> {
    Some((string(item, PK)?.to_owned(), string(item, SK)?.to_owned()))
}

/// The sort key of a queue entry: its row's, or the counter's for the seat.
fn entry_sk(ticket: u64, seat: bool) -> String {
    if seat {
        COUNTER_SK.to_owned()
    } else {
        schema::queue_sk(ticket)
    }
}

/// The scan segment of a partition key: a stable hash of it, modulo the number of segments
/// (DynamoDB splits a parallel scan by partition).
fn segment_of(pk: &str, total: u32) -> u32 {
    if total <= 1 {
        return 0;
    }
    let hash = pk.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    u32::try_from(hash % u64::from(total)).unwrap_or(0)
}

fn conditional_failed(operation: &'static str) -> Failure {
    // Only reached for request kinds whose conditions are all mapped to outcomes; kept as an
    // error so a gap in the model shows up as a failing run, not a silent pass.
    Failure::Fatal(Error::Dynamo {
        operation,
        source: "model: unexpected condition failure".into(),
    })
}

impl Table {
    /// An empty table whose server clock reads `epoch_ms` at `origin`.
    pub(crate) fn new(origin: Instant, epoch_ms: i64) -> Table {
        Table {
            items: BTreeMap::new(),
            tokens: HashMap::new(),
            page_size: usize::MAX,
            epoch_ms,
            origin,
            mutation: None,
            removals: Vec::new(),
            gone: Vec::new(),
            outcomes: Outcomes::default(),
            wiped: std::collections::BTreeSet::new(),
        }
    }

    /// The server's wall clock (the true time), epoch ms.
    pub(crate) fn server_ms(&self, now: Instant) -> i64 {
        self.epoch_ms + crate::clock::millis(now.saturating_duration_since(self.origin))
    }

    /// Every item of a partition, in sort-key order.
    pub(crate) fn partition(&self, key: &str) -> Vec<Item> {
        self.items
            .range((key.to_owned(), String::new())..)
            .take_while(|((pk, _), _)| pk == key)
            .map(|(_, s)| s.item.clone())
            .collect()
    }

    /// All partition keys that hold items.
    pub(crate) fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.items.keys().map(|(pk, _)| pk.clone()).collect();
        keys.dedup();
        keys
    }

    fn get(&self, key: &str, sk: &str) -> Option<&Item> {
        self.items
            .get(&(key.to_owned(), sk.to_owned()))
            .map(|s| &s.item)
    }

    fn put(&mut self, item: Item, _now: Instant) {
        if let Some(k) = pk_sk(&item) {
            self.items.insert(k, Stored { item });
        }
    }

    /// Removes an item; a queue row removed less than its lease after its last write is recorded.
    fn remove(&mut self, key: &str, sk: &str, now: Instant, by: Option<Remover>) -> Option<Item> {
        let stored = self.items.remove(&(key.to_owned(), sk.to_owned()))?;
        self.record_gone(key, &stored.item, now);
        if self.partition(key).is_empty() {
            self.wiped.insert(key.to_owned());
        }
        if let Some(by) = by {
            self.record_removal(key, &stored.item, by, now);
        }
        Some(stored.item)
    }

    /// Records that the entry on `item` (a row, or a counter's seat), if any, is gone.
    fn record_gone(&mut self, key: &str, item: &Item, now: Instant) {
        if let (Some(owner), Some(ticket)) =
            (string(item, schema::OWNER), num(item, schema::TICKET))
        {
            self.gone.push(Gone {
                key: key.to_owned(),
                owner: owner.to_owned(),
                ticket: u64::try_from(ticket).unwrap_or(0),
                at: now,
            });
        }
    }

    /// Records the removal of a queue entry (a row, or the seat on `item`) by `by`.
    fn record_removal(&mut self, key: &str, item: &Item, by: Remover, now: Instant) {
        if let (Some(ticket), Some(lease), Some(rvn)) = (
            num(item, schema::TICKET),
            num(item, schema::LEASE_MS),
            string(item, schema::RVN),
        ) {
            self.removals.push(Removal {
                key: key.to_owned(),
                ticket: u64::try_from(ticket).unwrap_or(0),
                rvn: rvn.to_owned(),
                by,
                at: now,
                lease: Duration::from_millis(u64::try_from(lease).unwrap_or(0)),
            });
        }
    }

    /// Applies one request at server instant `now`.
    pub(crate) fn apply(&mut self, request: &Request, now: Instant) -> Result<Response, Failure> {
        match request {
            Request::Query { key, start, range } => Ok(match range {
                crate::storage::Range::All => self.query(key, start.as_ref()),
                crate::storage::Range::Below { ticket, limit } => {
                    self.as_shown(self.query_below(key, start.as_ref(), *ticket, *limit))
                }
                crate::storage::Range::Lowest => self.as_shown(self.query_lowest(key)),
            }),
            Request::Enqueue(r) => self.enqueue(r, now),
            Request::DeleteStale {
                key,
                ticket,
                seat,
                rvn,
            } => {
                let outcome = self.remove_dead(key, *ticket, *seat, rvn, None, now);
                self.count_stale(outcome);
                Ok(Response::StaleDelete(outcome))
            }
            Request::SweepDead(d) => {
                let sweep = Some((d.owner.as_str(), d.cutoff_ms));
                let outcome = self.remove_dead(&d.key, d.ticket, d.seat, &d.rvn, sweep, now);
                if outcome == StaleDelete::Deleted {
                    self.outcomes.swept += 1;
                }
                Ok(Response::StaleDelete(outcome))
            }
            Request::Scan(r) => Ok(self.scan(r)),
            Request::Heartbeat(beat) => {
                let sk = entry_sk(beat.ticket, beat.seat);
                let current = self.get(&beat.key, &sk);
                let owner_ok = current
                    .and_then(|i| string(i, schema::OWNER))
                    .is_some_and(|o| o == beat.owner);
                let lease_ok = self.mutation == Some(Mutation::HeartbeatRollback)
                    || current
                        .and_then(|i| num(i, schema::LEASE_UNTIL_MS))
                        .is_some_and(|u| u <= beat.lease_until_ms);
                let upsert = || {
                    let mut item = crate::storage::entry_key(&beat.key, beat.ticket, beat.seat);
                    item.insert(schema::OWNER.into(), AttributeValue::S(beat.owner.clone()));
                    item.insert(schema::TICKET.into(), schema::n(beat.ticket));
                    item.insert(schema::LEASE_MS.into(), schema::n(1000));
                    item
                };
                let item = match current.cloned() {
                    Some(item) => Some(item),
                    None if self.mutation == Some(Mutation::HeartbeatUpsert) && !beat.seat => {
                        Some(upsert())
                    }
                    None => None,
                };
                let upserted = current.is_none();
                let Some(mut item) = item else {
                    return Ok(Response::Renewal(Renewal::Gone));
                };
                let (owner_ok, lease_ok) = if upserted {
                    (true, true)
                } else {
                    (owner_ok, lease_ok)
                };
                if !(owner_ok && lease_ok) {
                    let r = renewal_refused(Some(&item), &beat.owner);
                    if r == Renewal::Superseded {
                        self.outcomes.heartbeat_superseded += 1;
                    }
                    return Ok(Response::Renewal(r));
                }
                let n = |v: i64| AttributeValue::N(v.to_string());
                item.insert(schema::LEASE_UNTIL_MS.into(), n(beat.lease_until_ms));
                if !beat.seat {
                    item.insert(schema::EXPIRES_AT.into(), n(beat.expires_at));
                }
                item.insert(schema::RVN.into(), AttributeValue::S(beat.rvn.clone()));
                if let Some(at) = beat.acquired_at_ms {
                    item.entry(schema::ACQUIRED_AT_MS.into()).or_insert(n(at));
                }
                self.put(item, now);
                Ok(Response::Renewal(Renewal::Renewed))
            }
            Request::CreateCounter { key, last, owner } => {
                if self.get(key, COUNTER_SK).is_some() {
                    return Ok(Response::Created(false));
                }
                let by = schema::last_owner(owner, *last);
                self.set_counter(key, *last, Some(&by), now);
                Ok(Response::Created(true))
            }
            Request::DeleteOwned {
                key,
                ticket,
                seat: true,
                owner,
                done: Some(tick),
            } => Ok(Response::Owned(
                self.release_seat_done(key, *ticket, owner, *tick, now),
            )),
            Request::MarkDone { key, tick } => {
                let exists = self
                    .get(key, COUNTER_SK)
                    .is_some_and(|c| c.contains_key(schema::LAST));
                let marked = exists && self.watermark_allows(key, *tick);
                if marked {
                    self.set_counter_attribute(key, schema::TICK_DONE, *tick, now);
                }
                Ok(Response::Marked(marked))
            }
            Request::TickRecorded { key, id } => Ok(Response::Recorded(
                self.get(key, &schema::tick_sk(id)).is_some(),
            )),
            Request::RecordTick {
                key,
                id,
                expires_at,
            } => {
                if self.get(key, &schema::tick_sk(id)).is_some() {
                    return Ok(Response::Recorded(false));
                }
                self.put(schema::tick_record(key, id, *expires_at), now);
                Ok(Response::Recorded(true))
            }
            Request::DeleteOwned {
                key,
                ticket,
                seat,
                owner,
                ..
            } => {
                let sk = entry_sk(*ticket, *seat);
                // The seat's release is conditioned on its ticket too (`storage/dynamo.rs`): the seat may
                // hold a later entry of the same owner. A row's ticket is its sort key.
                let ours = self.get(key, &sk).is_some_and(|i| {
                    string(i, schema::OWNER) == Some(owner.as_str())
                        && num(i, schema::TICKET) == i64::try_from(*ticket).ok()
                });
                if ours && *seat {
                    self.vacate(key, now, None);
                    Ok(Response::Owned(Owned::Yes))
                } else if ours {
                    self.remove(key, &sk, now, None);
                    Ok(Response::Owned(Owned::Yes))
                } else {
                    Ok(Response::Owned(Owned::No))
                }
            }
        }
    }

    /// `MARK_CONDITION` of `storage/dynamo/ticks.rs`: the watermark is absent or not newer than
    /// `tick` (under [`Mutation::MarkBackwards`], always).
    fn watermark_allows(&self, key: &str, tick: i64) -> bool {
        self.mutation == Some(Mutation::MarkBackwards)
            || self
                .get(key, COUNTER_SK)
                .and_then(|c| num(c, schema::TICK_DONE))
                .is_none_or(|d| d <= tick)
    }

    /// The seat's release that marks its tick (`storage/dynamo/ticks.rs`): ours (owner and
    /// ticket) and the watermark not newer → vacated and marked; ours under a newer watermark →
    /// [`Owned::NotMarked`], nothing written; else [`Owned::No`].
    fn release_seat_done(
        &mut self,
        key: &str,
        ticket: u64,
        owner: &str,
        tick: i64,
        now: Instant,
    ) -> Owned {
        let counter = self.get(key, COUNTER_SK).cloned();
        let ours = counter.as_ref().is_some_and(|i| {
            string(i, schema::OWNER) == Some(owner)
                && num(i, schema::TICKET) == i64::try_from(ticket).ok()
        });
        if ours && self.watermark_allows(key, tick) {
            self.vacate(key, now, None);
            self.set_counter_attribute(key, schema::TICK_DONE, tick, now);
            return Owned::Yes;
        }
        seat_release_refused(counter.as_ref(), owner, ticket)
    }

    /// A look's page as the waiter sees it: as stored, but under [`Mutation::SlowTakeover`] with
    /// every lease thirty leases longer.
    fn as_shown(&self, page: Response) -> Response {
        let (Some(Mutation::SlowTakeover), Response::Page { items, next }) = (self.mutation, &page)
        else {
            return page;
        };
        let items = items
            .iter()
            .cloned()
            .map(|mut item| {
                let until = num(&item, schema::LEASE_UNTIL_MS);
                let lease = num(&item, schema::LEASE_MS);
                if let (Some(until), Some(lease)) = (until, lease) {
                    item.insert(schema::LEASE_UNTIL_MS.into(), schema::n(until + 30 * lease));
                    item.insert(schema::LEASE_MS.into(), schema::n(31 * lease));
                }
                item
            })
            .collect();
        Response::Page {
            items,
            next: next.clone(),
        }
    }

    fn query(&self, key: &str, start: Option<&Item>) -> Response {
        let after = start.and_then(|s| string(s, SK)).map(str::to_owned);
        let mut rest = self
            .items
            .range((key.to_owned(), after.clone().unwrap_or_default())..)
            .take_while(|((pk, _), _)| pk == key)
            .filter(|((_, sk), _)| after.as_ref().is_none_or(|a| sk > a))
            .filter(|((_, sk), _)| sk.as_str() >= COUNTER_SK && *sk <= schema::queue_sk(u64::MAX))
            .map(|(_, s)| s.item.clone());
        let items: Vec<Item> = rest.by_ref().take(self.page_size).collect();
        let next = match (rest.next(), items.last()) {
            (Some(_), Some(last)) => pk_sk(last).map(|(pk, sk)| {
                HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk)),
                    (SK.to_owned(), AttributeValue::S(sk)),
                ])
            }),
            _ => None,
        };
        Response::Page { items, next }
    }

    /// Rows at or below `ticket`, highest first, then the counter, `limit` items a page.
    fn query_below(&self, key: &str, start: Option<&Item>, ticket: u64, limit: u32) -> Response {
        let hi = schema::queue_sk(ticket);
        let lo = COUNTER_SK.to_owned();
        let before = start.and_then(|s| string(s, SK)).map(str::to_owned);
        let items: Vec<Item> = self
            .items
            .range((key.to_owned(), lo)..=(key.to_owned(), hi))
            .rev()
            .filter(|((_, sk), _)| before.as_ref().is_none_or(|b| sk < b))
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, s)| s.item.clone())
            .collect();
        // Descending, DynamoDB Local names a next page when the page is full and the partition
        // holds more items below, in the key condition's range or not (the counter sorts below
        // every row, so a look that reaches it is the last page).
        let full = items.len() >= usize::try_from(limit).unwrap_or(usize::MAX);
        let more = items.last().and_then(pk_sk).is_some_and(|(_, last)| {
            self.items
                .range((key.to_owned(), String::new())..(key.to_owned(), last))
                .next()
                .is_some()
        });
        let next = match (full && more, items.last()) {
            (true, Some(last)) => pk_sk(last).map(|(pk, sk)| {
                HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk)),
                    (SK.to_owned(), AttributeValue::S(sk)),
                ])
            }),
            _ => None,
        };
        Response::Page { items, next }
    }

    /// The counter and the lowest queue row, as an ascending `Limit 2` page: a full page names
    /// its last item as where the next page would start, whatever follows (as DynamoDB Local
    /// does ascending).
    fn query_lowest(&self, key: &str) -> Response {
        let lo = COUNTER_SK.to_owned();
        let hi = schema::queue_sk(u64::MAX);
        let items: Vec<Item> = self
            .items
            .range((key.to_owned(), lo)..=(key.to_owned(), hi))
            .take(2)
            .map(|(_, s)| s.item.clone())
            .collect();
        let next = items.get(1).and_then(pk_sk).map(|(pk, sk)| {
            HashMap::from([
                (PK.to_owned(), AttributeValue::S(pk)),
                (SK.to_owned(), AttributeValue::S(sk)),
            ])
        });
        Response::Page { items, next }
    }

    /// The counter half of the enqueue transaction: its condition, and the cancellation reason.
    fn counter_check(&self, r: &EnqueueRequest) -> (bool, Option<Item>) {
        let counter = self.get(&r.key, COUNTER_SK).cloned();
        let last = counter.as_ref().and_then(|c| num(c, schema::LAST));
        let by = counter
            .as_ref()
            .and_then(|c| string(c, schema::LAST_OWNER))
            .map(str::to_owned);
        let ok = last == i64::try_from(r.counter.last).ok() && by == r.counter.owner;
        // `ENQUEUE_TICK_CONDITION` and the `tickNewest` condition of `storage/dynamo.rs`.
        let stored = |name| counter.as_ref().and_then(|c| num(c, name));
        let tick_ok = r.tick.is_none_or(|t| {
            stored(schema::TICK_DONE).is_none_or(|d| d < t)
                || self.mutation == Some(Mutation::EnqueueIgnoresWatermark)
        });
        let newest_ok = r
            .newest
            .is_none_or(|n| stored(schema::TICK_NEWEST).is_none_or(|s| s <= n));
        (ok && tick_ok && newest_ok, counter)
    }

    /// An enqueue's counter move: `last`, `lastOwner`, and `tickNewest` if it sets one.
    fn move_counter(&mut self, r: &EnqueueRequest, now: Instant) {
        let by = schema::last_owner(&r.owner, r.ticket);
        self.set_counter(&r.key, r.ticket, Some(&by), now);
        if let Some(newest) = r.newest {
            self.set_counter_attribute(&r.key, schema::TICK_NEWEST, newest, now);
        }
    }

    /// Sets one number attribute of an existing counter.
    fn set_counter_attribute(&mut self, key: &str, name: &str, value: i64, now: Instant) {
        if let Some(mut counter) = self.get(key, COUNTER_SK).cloned() {
            counter.insert(name.to_owned(), schema::n(value));
            self.put(counter, now);
        }
    }

    fn set_counter(&mut self, key: &str, ticket: u64, owner: Option<&str>, now: Instant) {
        let mut counter = self
            .get(key, COUNTER_SK)
            .cloned()
            .unwrap_or_else(|| crate::storage::counter_key(key));
        counter.insert(schema::LAST.into(), AttributeValue::N(ticket.to_string()));
        if let Some(o) = owner {
            counter.insert(schema::LAST_OWNER.into(), AttributeValue::S(o.to_owned()));
        }
        self.put(counter, now);
    }

    /// The seat's enqueue: one conditional update of the counter.
    fn take_seat(&mut self, r: &EnqueueRequest, now: Instant) -> Result<Response, Failure> {
        let (counter_ok, counter) = self.counter_check(r);
        let counter_ok = counter_ok || self.mutation == Some(Mutation::SeatWithoutCounter);
        let empty = counter
            .as_ref()
            .is_some_and(|c| !c.contains_key(schema::OWNER));
        if !(counter_ok && empty) {
            return seat_refused(r, counter.as_ref()).map(Response::Enqueue);
        }
        self.move_counter(r, now);
        let mut item = self.get(&r.key, COUNTER_SK).cloned().unwrap_or_default();
        for (name, value) in schema::seat_attributes(&r.row) {
            item.insert(name.to_owned(), value.clone());
        }
        self.put(item, now);
        Ok(Response::Enqueue(crate::storage::Enqueue::Done))
    }

    /// Empties a key's seat; a removal by a waiter or the sweeper is recorded as for a row.
    fn vacate(&mut self, key: &str, now: Instant, by: Option<Remover>) {
        let Some(mut counter) = self.get(key, COUNTER_SK).cloned() else {
            return;
        };
        if let Some(by) = by {
            self.record_removal(key, &counter, by, now);
        }
        self.record_gone(key, &counter, now);
        for name in schema::SEAT_ATTRIBUTES {
            counter.remove(name);
        }
        self.put(counter, now);
    }

    fn count_stale(&mut self, outcome: StaleDelete) {
        match outcome {
            StaleDelete::Deleted => self.outcomes.stale_deleted += 1,
            StaleDelete::Gone => self.outcomes.stale_gone += 1,
            StaleDelete::Revived => self.outcomes.stale_revived += 1,
        }
    }

    fn enqueue(&mut self, r: &EnqueueRequest, now: Instant) -> Result<Response, Failure> {
        if r.seat {
            return self.take_seat(r, now);
        }
        self.tokens
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < TOKEN_WINDOW);
        if let Some((seen, _)) = self.tokens.get(&r.token) {
            if seen == r {
                self.outcomes.token_replays += 1;
                return Ok(Response::Enqueue(crate::storage::Enqueue::Done));
            }
            return Err(Failure::Fatal(Error::Dynamo {
                operation: "TransactWriteItems",
                source: "IdempotentParameterMismatchException: the request differs from the \
                         earlier one with the same client token"
                    .into(),
            }));
        }
        let (counter_ok, counter) = self.counter_check(r);
        let sk = schema::queue_sk(r.ticket);
        let existing = self.get(&r.key, &sk).cloned();
        if counter_ok && existing.is_none() {
            self.move_counter(r, now);
            self.put(r.row.clone(), now);
            self.tokens.insert(r.token.clone(), (r.clone(), now));
            return Ok(Response::Enqueue(crate::storage::Enqueue::Done));
        }
        let reason = |ok: bool, item: Option<Item>| {
            if ok {
                ("None", None)
            } else {
                ("ConditionalCheckFailed", item)
            }
        };
        let reasons = [
            reason(counter_ok, counter),
            reason(existing.is_none(), existing),
        ];
        let borrowed: Vec<(&str, Option<&Item>)> =
            reasons.iter().map(|(c, i)| (*c, i.as_ref())).collect();
        match enqueue_outcome(r, &borrowed)? {
            Some(o) => {
                if o == crate::storage::Enqueue::TicketTaken {
                    self.outcomes.ticket_taken += 1;
                }
                Ok(Response::Enqueue(o))
            }
            None => Err(conditional_failed("TransactWriteItems")),
        }
    }

    /// First half of [`Mutation::TwoWriteEnqueue`]: only the counter update. `true` if it passed.
    pub(crate) fn take_ticket(
        &mut self,
        r: &EnqueueRequest,
        now: Instant,
    ) -> Result<Response, bool> {
        let (ok, counter) = self.counter_check(r);
        if !ok {
            let current = counter
                .as_ref()
                .and_then(|c| Snapshot::from_items(&r.key, [c]).ok())
                .and_then(|s| s.counter);
            return Ok(Response::Enqueue(crate::storage::Enqueue::CounterAt(
                current,
            )));
        }
        self.move_counter(r, now);
        Err(true)
    }

    /// Second half of [`Mutation::TwoWriteEnqueue`]: the row put, if its ticket is free.
    pub(crate) fn put_row(&mut self, r: &EnqueueRequest, now: Instant) {
        let sk = schema::queue_sk(r.ticket);
        if self.get(&r.key, &sk).is_none() {
            self.put(r.row.clone(), now);
        }
    }

    /// TTL: deletes each expired item with probability `chance` (`roll` gives numbers in
    /// `[0, 1)`). DynamoDB deletes expired items at some later time, not at once.
    pub(crate) fn reap(&mut self, now: Instant, chance: f64, roll: &mut dyn FnMut() -> f64) {
        let server_s = self.server_ms(now) / 1000;
        let expired: Vec<(String, String)> = self
            .items
            .iter()
            .filter(|(_, s)| num(&s.item, schema::EXPIRES_AT).is_some_and(|e| e < server_s))
            .map(|(k, _)| k.clone())
            .collect();
        for (pk, sk) in expired {
            if roll() < chance {
                self.remove(&pk, &sk, now, Some(Remover::Ttl));
                self.outcomes.ttl_deleted += 1;
            }
        }
    }

    /// The conditional removal of an entry judged dead, as `storage/dynamo.rs` sends it: still the
    /// version judged (`rvn`), and for the sweep (`sweep`: the owner read and the cutoff) also
    /// the same owner and a lease that ended before the cutoff (`DELETE_CONDITION` of
    /// `sweep.rs`). A refused removal is judged by the answer readers `storage/dynamo.rs` uses.
    fn remove_dead(
        &mut self,
        key: &str,
        ticket: u64,
        seat: bool,
        rvn: &str,
        sweep: Option<(&str, i64)>,
        now: Instant,
    ) -> StaleDelete {
        let sk = entry_sk(ticket, seat);
        let stored = self.get(key, &sk).cloned();
        let same_rvn = |i: &Item| string(i, schema::RVN) == Some(rvn);
        let removable = match &stored {
            None => false,
            // An empty seat: the counter alone, nothing to remove.
            Some(i) if seat && string(i, schema::RVN).is_none() => false,
            Some(i) => match sweep {
                None => same_rvn(i) || self.mutation == Some(Mutation::UnconditionalStaleDelete),
                Some((owner, cutoff)) => {
                    string(i, schema::OWNER) == Some(owner)
                        && same_rvn(i)
                        && num(i, schema::LEASE_UNTIL_MS).is_some_and(|u| u < cutoff)
                }
            },
        };
        if removable {
            let by = if sweep.is_some() {
                Remover::Sweeper
            } else {
                Remover::Waiter
            };
            if seat {
                self.vacate(key, now, Some(by));
            } else {
                self.remove(key, &sk, now, Some(by));
            }
            return StaleDelete::Deleted;
        }
        if seat {
            seat_judged(stored.as_ref(), ticket)
        } else {
            row_judged(stored.as_ref())
        }
    }

    /// One page of the sweep's `Scan` (`ScanRequest`): items in key order within the segment,
    /// `limit` read per page, the filter applied after the read (`ScannedCount` counts every
    /// item read), the projection applied to what passes. Eventual consistency is not modelled:
    /// a page reads the table as it stands, which a real scan may lag behind; the removal's
    /// condition, not the read, is what keeps a live entry safe.
    fn scan(&self, r: &ScanRequest) -> Response {
        let start = r.start.as_ref().and_then(pk_sk);
        let limit = r
            .limit
            .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX))
            .max(1);
        let names = crate::storage::scan_names();
        let mut page = self
            .items
            .iter()
            .filter(|((pk, _), _)| segment_of(pk, r.total_segments) == r.segment)
            .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s))
            .peekable();
        let (mut items, mut scanned, mut next) = (Vec::new(), 0u64, None);
        while let Some(((pk, sk), stored)) = page.next() {
            scanned += 1;
            let entry = sk.starts_with(schema::QUEUE_PREFIX) || sk == COUNTER_SK;
            let dead = num(&stored.item, schema::LEASE_UNTIL_MS).is_some_and(|u| u < r.cutoff_ms);
            if entry && dead {
                let projected: Item = stored
                    .item
                    .iter()
                    .filter(|(name, _)| names.values().any(|v| v == *name))
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect();
                items.push(projected);
            }
            if scanned as usize == limit && page.peek().is_some() {
                next = Some(HashMap::from([
                    (PK.to_owned(), AttributeValue::S(pk.clone())),
                    (SK.to_owned(), AttributeValue::S(sk.clone())),
                ]));
                break;
            }
        }
        Response::Scanned {
            items,
            scanned,
            next,
        }
    }

    /// An operator deletes an item by hand (no condition, never an early removal of ours).
    pub(crate) fn operator_delete(&mut self, key: &str, sk: &str, now: Instant) -> Option<Item> {
        self.remove(key, sk, now, None)
    }

    /// An operator sets a key's counter by hand.
    pub(crate) fn operator_set_counter(&mut self, key: &str, last: u64, now: Instant) {
        self.set_counter(key, last, None, now);
    }

    /// Applies a raw item (tests).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, item: Item, now: Instant) {
        self.put(item, now);
    }
}
