//! An in-memory model of one DynamoDB table, with exactly the semantics the lock relies on.
//!
//! - Items keyed by (`pk`, `sk`), a `Query` returns a partition in sort-key order, page by page
//!   (`page_size` items a page, `LastEvaluatedKey` while more remain). Queries are strongly
//!   consistent: every applied write is visible to the next one.
//! - The sweep's `Scan` is eventually consistent, as DynamoDB's is by default: a page may show
//!   each item as it was up to [`Table::scan_lag`] ago (gone since, changed since, or not yet
//!   written). Conditions are always evaluated on the item as it is.
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
//! Layout: this file holds the table's state (items, tokens, what was removed and by whom) and
//! the primitive changes to it; [`requests`] gives each request of the storage seam its
//! semantics (conditions, transactions, idempotency tokens); [`reads`] answers queries and scans.
//!
//! The model also records every removal of a queue row by a waiter, the sweeper or TTL
//! ([`Table::removals`]), for the simulation's checker: nobody may remove a row while its owner
//! may still be alive.

mod reads;
mod requests;
pub(crate) mod ticks;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use tokio::time::Instant;

use crate::error::Error;
use crate::schema::{self, COUNTER_SK, PK, SK};
use crate::storage::{EnqueueRequest, Failure, Item};

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
    /// The sweep's removal is conditioned on nothing (neither the owner, nor the version `rvn`
    /// the sweeper judged, nor the cutoff): it trusts what its eventually consistent scan showed.
    SweepUnconditional,
    /// A release frees another holder's permit: a row's release also removes the key's lowest
    /// other entry (a semaphore that counts releases instead of owners).
    ReleaseFreesOther,
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

/// A write's instant and the item it replaced (none: the write created it).
type Replaced = (Instant, Option<Item>);

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
    /// How far behind the writes a `Scan` page reads (zero: every write is visible to the next
    /// scan).
    pub scan_lag: Duration,
    /// For the `Scan`'s lag: each recently written item's earlier versions, as (the instant of a
    /// write, the item before it), oldest first, none older than `scan_lag`.
    history: BTreeMap<(String, String), Vec<Replaced>>,
    /// Keys whose partition became empty (no counter, no row): nothing remembers their tokens,
    /// which may start again from 1. Cleared by the checker.
    pub wiped: std::collections::BTreeSet<String>,
    /// Every tick marked done (key, [`ticks::label`], when): the checker looks for the success
    /// behind each.
    pub marks: Vec<(String, String, Instant)>,
    /// Every `tickNewest` written (key, tick, when): a coalescing waiter older than one written
    /// a while before its grant should have withdrawn.
    pub newest: Vec<(String, i64, Instant)>,
    /// Requests applied so far ([`REQUEST_BOUND`]).
    applied: u64,
}

/// The most requests one table answers: far past what a schedule or a script sends (a seeded
/// schedule sends thousands), so reaching it means a participant that never finishes — a wait
/// that never gives up on a clock that does not let paused time run (the model answers at once),
/// which no bound of simulated time can catch. The test then fails instead of spinning.
pub(crate) const REQUEST_BOUND: u64 = 1_000_000;

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
            marks: Vec::new(),
            newest: Vec::new(),
            scan_lag: Duration::ZERO,
            history: BTreeMap::new(),
            applied: 0,
        }
    }

    /// Counts one request; past [`REQUEST_BOUND`] the run fails.
    pub(crate) fn count_request(&mut self) {
        self.applied += 1;
        assert!(
            self.applied <= REQUEST_BOUND,
            "the table answered {REQUEST_BOUND} requests: a participant never finishes (a wait \
             that never gives up?)"
        );
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

    fn put(&mut self, item: Item, now: Instant) {
        if let Some(k) = pk_sk(&item) {
            let before = self.items.insert(k.clone(), Stored { item });
            self.remember(k, before.map(|s| s.item), now);
        }
    }

    /// Keeps the version a write at `now` replaced, for scans that lag behind it.
    fn remember(&mut self, k: (String, String), before: Option<Item>, now: Instant) {
        if self.scan_lag.is_zero() {
            return;
        }
        let versions = self.history.entry(k).or_default();
        versions.push((now, before));
        // A scan at or after `now` reads no earlier than `now - scan_lag`.
        if let Some(horizon) = now.checked_sub(self.scan_lag) {
            versions.retain(|(at, _)| *at > horizon);
        }
    }

    /// Every item as it was at `at` (no earlier than `scan_lag` ago), in key order.
    fn as_of(&self, at: Instant) -> BTreeMap<(String, String), Item> {
        let mut view: BTreeMap<(String, String), Item> = self
            .items
            .iter()
            .map(|(k, s)| (k.clone(), s.item.clone()))
            .collect();
        for (k, versions) in &self.history {
            // The first write after `at` replaced what `at` saw.
            if let Some((_, before)) = versions.iter().find(|(w, _)| *w > at) {
                match before {
                    Some(item) => view.insert(k.clone(), item.clone()),
                    None => view.remove(k),
                };
            }
        }
        view
    }

    /// Removes an item; a queue row removed less than its lease after its last write is recorded.
    fn remove(&mut self, key: &str, sk: &str, now: Instant, by: Option<Remover>) -> Option<Item> {
        let k = (key.to_owned(), sk.to_owned());
        let stored = self.items.remove(&k)?;
        self.remember(k, Some(stored.item.clone()), now);
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

    pub(super) fn set_counter(
        &mut self,
        key: &str,
        ticket: u64,
        owner: Option<&str>,
        now: Instant,
    ) {
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

    /// Empties a key's seat; a removal by a waiter or the sweeper is recorded as for a row.
    pub(super) fn vacate(&mut self, key: &str, now: Instant, by: Option<Remover>) {
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
