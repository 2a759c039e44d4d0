//! The lock table's schema: attribute names, sort keys, and item encoding.
//!
//! One table, keys `pk` (S) and `sk` (S), TTL on `expiresAt`. Per lock key there is one
//! **counter** item (`sk = "counter"`, attribute `last`: the last ticket issued, never expired)
//! and one **queue row** per waiter or holder (`sk = "q#" + ticket` zero-padded to 20 digits, so
//! rows sort by ticket). A single strongly consistent `Query` on `pk` therefore returns the
//! counter first (`"counter" < "q#…"`) followed by the queue in ticket order: one request is
//! enough to know both the next ticket and who is ahead.
//!
//! **The seat.** A key's counter item may also carry one queue entry: the holder of a key that
//! was taken while its queue was empty. Taking the seat is one conditional `UpdateItem` of the
//! counter (`last` moves to the seat's ticket, and the entry's attributes are set beside it), and
//! releasing it is one more (`REMOVE` of those attributes): two single-item writes per
//! uncontended cycle, the cost of a plain conditional-put lock, instead of a two-item transaction
//! and a delete. The seat uses the queue row's attribute names (`owner`, `ticket`,
//! `leaseUntilMs`, `leaseMs`, `rvn`, …), except `expiresAt`: TTL must never delete a counter. To
//! everyone reading the queue the seat is simply its lowest entry ([`QueueRow::seat`]): the
//! counter sorts before every row, its ticket is below every row queued behind it, and it is
//! judged, heartbeated and passed over like any row.
//!
//! Also here: the counter as read ([`Counter`]) and the items of once per tick (the watermark and
//! `tickNewest` on the counter, the record of a done tick id: see [`crate::tick`]).
//!
//! Everything here is pure: no I/O, unit-tested without a server.

use std::collections::HashMap;

pub use crate::holder::HolderInfo;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::Error;

#[cfg(any(test, feature = "test-util"))]
pub mod seed;

/// Partition key attribute: the lock key.
pub const PK: &str = "pk";
/// Sort key attribute: [`COUNTER_SK`] or a queue row's `q#<ticket>`.
pub const SK: &str = "sk";
/// Sort key of the per-key ticket counter.
pub const COUNTER_SK: &str = "counter";
/// Prefix of queue-row sort keys.
pub const QUEUE_PREFIX: &str = "q#";
/// Counter attribute: the last ticket issued (N).
pub const LAST: &str = "last";
/// Counter attribute: `<owner>:<ticket>` of the enqueue (or creation) that last moved the counter
/// (S). Every enqueue is conditioned on `last` *and* this, so a counter set back by hand cannot
/// pass for one nobody touched; and a counter whose `last` differs from the ticket in here was
/// changed by hand, so its `last` is not trusted without a full read.
pub const LAST_OWNER: &str = "lastOwner";

// The protocol's own attributes are defined with the protocol (see [`crate::protocol`]).
pub use crate::protocol::{PERMITS_ATTR, PROTOCOL_ATTR};

/// How the `lastOwner` of a counter created for a key of more than one permit starts: an owner
/// id that is no acquisition's, so a participant's hint never mistakes a recreated counter (whose
/// `last` may be below tickets already queued) for one an enqueue moved (see
/// `Counter::created`). A key of one permit keeps protocol 1's creation, a bare fresh id.
pub const CREATED_PREFIX: &str = "created-";

/// The owner part of the `lastOwner` a counter is created with: `id`, marked as a creation for a
/// key of more than one permit.
pub fn created_by(id: &str, permits: u32) -> String {
    if permits > 1 {
        format!("{CREATED_PREFIX}{id}")
    } else {
        id.to_owned()
    }
}

/// The `lastOwner` value of a counter moved to `ticket` by `owner`.
pub fn last_owner(owner: &str, ticket: u64) -> String {
    format!("{owner}:{ticket}")
}
/// Queue row: unique id of one acquisition (S). Conditions on ownership use it.
pub const OWNER: &str = "owner";
/// Queue row: the ticket (N), also the fencing token.
pub const TICKET: &str = "ticket";
/// Queue row: end of the lease, epoch milliseconds by the writer's clock (N).
pub const LEASE_UNTIL_MS: &str = "leaseUntilMs";
/// Queue row: lease length in milliseconds (N). Waiters in clock-free mode need the holder's
/// lease, not their own, to decide that a row has gone quiet for a full lease.
pub const LEASE_MS: &str = "leaseMs";
/// Queue row: TTL attribute, epoch **seconds** (N), `leaseUntil + grace`.
pub const EXPIRES_AT: &str = "expiresAt";
/// Queue row: record version number (S), changed by every heartbeat.
pub const RVN: &str = "rvn";
/// Queue row: present (`true`) when the row was written in clock-free mode; the sweeper then
/// gives it [`crate::options::CLOCK_FREE_GRACE`] instead of its own grace, because its lease end
/// comes from a wall clock that may be far off.
pub const CLOCK_FREE: &str = "clockFree";
/// Queue row (for people): function name of the holder.
pub const FUNCTION: &str = "function";
/// Queue row (for people): request id of the invocation holding or waiting.
pub const REQUEST_ID: &str = "requestId";
/// Queue row (for people): host name and process id.
pub const HOST: &str = "host";
/// Queue row (for people): when the row was enqueued, epoch ms.
pub const ENQUEUED_AT_MS: &str = "enqueuedAtMs";
/// Queue row (for people): when the lock was granted, epoch ms (absent while waiting).
pub const ACQUIRED_AT_MS: &str = "acquiredAtMs";

/// The attributes of a queue entry that the counter's seat carries (every row attribute but the
/// keys and `expiresAt`). Vacating the seat removes exactly these.
pub const SEAT_ATTRIBUTES: [&str; 11] = [
    OWNER,
    TICKET,
    LEASE_UNTIL_MS,
    LEASE_MS,
    RVN,
    CLOCK_FREE,
    ENQUEUED_AT_MS,
    ACQUIRED_AT_MS,
    FUNCTION,
    REQUEST_ID,
    HOST,
];

/// The expression placeholder of a seat attribute (`#a0`, `#a1`, …, in [`SEAT_ATTRIBUTES`]
/// order). Requests that vacate the seat name every attribute by these, conditions included, so
/// no attribute has two placeholders.
pub fn seat_placeholder(attribute: &str) -> String {
    let i = SEAT_ATTRIBUTES
        .iter()
        .position(|a| *a == attribute)
        .unwrap_or(SEAT_ATTRIBUTES.len());
    format!("#a{i}")
}

/// The placeholders of every seat attribute, and the `REMOVE` expression that empties the seat.
pub fn seat_placeholders() -> (HashMap<String, String>, String) {
    let names: HashMap<String, String> = SEAT_ATTRIBUTES
        .iter()
        .map(|a| (seat_placeholder(a), (*a).to_owned()))
        .collect();
    let remove: Vec<String> = SEAT_ATTRIBUTES
        .iter()
        .map(|a| seat_placeholder(a))
        .collect();
    (names, format!("REMOVE {}", remove.join(", ")))
}

/// The seat's attributes of a new row item: every attribute but `pk`, `sk` and `expiresAt`.
pub fn seat_attributes(row: &HashMap<String, AttributeValue>) -> Vec<(&str, &AttributeValue)> {
    let mut attrs: Vec<(&str, &AttributeValue)> = row
        .iter()
        .filter(|(name, _)| SEAT_ATTRIBUTES.contains(&name.as_str()))
        .map(|(name, value)| (name.as_str(), value))
        .collect();
    attrs.sort_by_key(|(name, _)| *name);
    attrs
}

/// Longest lock key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

/// Largest `expiresAt` accepted as *seconds*: the year 5138 in seconds, but only 1973 in
/// milliseconds. A value above it was almost certainly written in milliseconds, which would keep
/// the row for tens of thousands of years.
pub const MAX_EXPIRES_AT_SECONDS: i64 = 100_000_000_000;

/// Checks a lock key: 1..=1024 bytes. Keys are validated, never truncated.
pub fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::InvalidKey {
            key: String::new(),
            problem: "the key is empty; give a non-empty string of at most 1024 bytes".into(),
        });
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidKey {
            key: format!("{}…", truncate_for_display(key, 40)),
            problem: format!(
                "the key is {} bytes long; at most {MAX_KEY_BYTES} bytes are allowed",
                key.len()
            ),
        });
    }
    Ok(())
}

fn truncate_for_display(s: &str, max_chars: usize) -> &str {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The sort key of the queue row with this ticket: `q#` and 20 zero-padded digits.
pub fn queue_sk(ticket: u64) -> String {
    format!("{QUEUE_PREFIX}{ticket:020}")
}

/// Converts epoch milliseconds to a TTL value in whole epoch seconds (rounded up, so TTL never
/// fires before the instant the caller meant).
pub fn ttl_seconds(epoch_ms: i64) -> i64 {
    epoch_ms.div_euclid(1000) + i64::from(epoch_ms.rem_euclid(1000) != 0)
}

/// One row of a key's queue, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRow {
    /// The ticket, which is also the fencing token.
    pub ticket: u64,
    /// The acquisition's unique id.
    pub owner: String,
    /// Lease end, epoch ms by the writer's clock.
    pub lease_until_ms: i64,
    /// Lease length, ms.
    pub lease_ms: i64,
    /// TTL, epoch seconds (0 for the seat, which TTL never removes).
    pub expires_at: i64,
    /// The entry is the counter's seat (see the module docs), not a row of its own.
    pub seat: bool,
    /// Record version number; changes at every heartbeat.
    pub rvn: String,
    /// Enqueue time, epoch ms (writer's clock).
    pub enqueued_at_ms: Option<i64>,
    /// Grant time, epoch ms (writer's clock), once granted.
    pub acquired_at_ms: Option<i64>,
    /// Written in clock-free mode (see [`CLOCK_FREE`]).
    pub clock_free: bool,
    /// Details for people.
    pub holder: HolderInfo,
}

/// The attributes of a new queue row, ready for a `Put`.
pub struct NewRow<'a> {
    /// Lock key.
    pub key: &'a str,
    /// Ticket to take.
    pub ticket: u64,
    /// Unique acquisition id.
    pub owner: &'a str,
    /// First lease end, epoch ms.
    pub lease_until_ms: i64,
    /// Lease length, ms.
    pub lease_ms: i64,
    /// TTL, epoch seconds (see [`crate::LockOptions::expires_at`]).
    pub expires_at: i64,
    /// Written in clock-free mode.
    pub clock_free: bool,
    /// First record version.
    pub rvn: &'a str,
    /// Enqueue time, epoch ms.
    pub now_ms: i64,
    /// Set `acquiredAtMs` too (the enqueuer already knows it is first).
    pub granted: bool,
    /// Details for people.
    pub holder: &'a HolderInfo,
    /// The protocol the row is written under: from protocol 2 on, rows carry it (see
    /// [`crate::protocol`]); a protocol 1 row carries none, as before.
    pub protocol: u32,
}

impl NewRow<'_> {
    /// Encodes the row as a DynamoDB item.
    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        let mut item = HashMap::new();
        item.insert(PK.into(), s(self.key));
        item.insert(SK.into(), s(&queue_sk(self.ticket)));
        item.insert(OWNER.into(), s(self.owner));
        item.insert(TICKET.into(), n(self.ticket));
        item.insert(LEASE_UNTIL_MS.into(), n(self.lease_until_ms));
        item.insert(LEASE_MS.into(), n(self.lease_ms));
        item.insert(EXPIRES_AT.into(), n(self.expires_at));
        if self.clock_free {
            item.insert(CLOCK_FREE.into(), AttributeValue::Bool(true));
        }
        item.insert(RVN.into(), s(self.rvn));
        if self.protocol > 1 {
            item.insert(PROTOCOL_ATTR.into(), n(self.protocol));
        }
        item.insert(ENQUEUED_AT_MS.into(), n(self.now_ms));
        if self.granted {
            item.insert(ACQUIRED_AT_MS.into(), n(self.now_ms));
        }
        let details = [
            (FUNCTION, &self.holder.function),
            (REQUEST_ID, &self.holder.request_id),
            (HOST, &self.holder.host),
        ];
        for (name, value) in details {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                item.insert(name.into(), s(v));
            }
        }
        item
    }
}

/// A string attribute value.
pub fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// A number attribute value.
pub fn n(v: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// What a key's partition holds: the counter and the queue in ticket order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The counter; `None` when there is no counter item (the key was never used, or the
    /// counter was deleted by hand).
    pub counter: Option<Counter>,
    /// Queue rows, in ticket order.
    pub rows: Vec<QueueRow>,
    /// The protocol the key runs, from its counter (1 without a counter, or without the
    /// attribute). Never newer than [`crate::PROTOCOL`]: a newer one is an error.
    pub protocol: u32,
}

impl Snapshot {
    /// Decodes the items of a `Query` on one key, in any order.
    pub fn from_items<'a>(
        key: &str,
        items: impl IntoIterator<Item = &'a HashMap<String, AttributeValue>>,
    ) -> Result<Snapshot, Error> {
        let mut snap = Snapshot {
            protocol: 1,
            ..Snapshot::default()
        };
        for item in items {
            let sk = get_s(key, item, SK)?;
            if sk == COUNTER_SK {
                let counter = Counter::from_item(key, item)?;
                snap.protocol = counter.protocol;
                snap.counter = Some(counter);
            }
            if let Some(entry) = QueueRow::entry(key, item)? {
                snap.rows.push(entry);
            }
        }
        snap.rows.sort_by_key(|r| r.ticket);
        Ok(snap)
    }
}

impl QueueRow {
    /// The queue entry an item of a key's partition holds: a queue row, the counter's seat, or
    /// nothing (a counter with an empty seat; an item of another sort key, which is not ours: a
    /// user may share the table). An entry written under a newer protocol than this build
    /// speaks is [`Error::ProtocolTooNew`].
    pub fn entry(key: &str, item: &HashMap<String, AttributeValue>) -> Result<Option<Self>, Error> {
        let sk = get_s(key, item, SK)?;
        let ours = sk.starts_with(QUEUE_PREFIX) || (sk == COUNTER_SK && item.contains_key(OWNER));
        if ours {
            // From protocol 2 on every row carries the protocol it was written under (a seat's
            // is its counter's): one this build does not speak is not judged, fail closed.
            crate::protocol::check(key, Some(item))?;
            QueueRow::from_item(key, item).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Decodes a queue row or an occupied seat, naming the field that is wrong.
    pub fn from_item(key: &str, item: &HashMap<String, AttributeValue>) -> Result<Self, Error> {
        let sk = get_s(key, item, SK)?;
        let ticket = get_u64(key, item, TICKET)?;
        let seat = sk == COUNTER_SK;
        if !seat && sk != queue_sk(ticket) {
            return Err(malformed(
                key,
                item,
                SK,
                format!("sort key {sk:?} does not match ticket {ticket}"),
            ));
        }
        let expires_at = if seat {
            0
        } else {
            get_i64(key, item, EXPIRES_AT)?
        };
        if expires_at > MAX_EXPIRES_AT_SECONDS {
            return Err(malformed(
                key,
                item,
                EXPIRES_AT,
                format!(
                    "{expires_at} looks like milliseconds; the TTL attribute must be epoch seconds"
                ),
            ));
        }
        let opt_s = |name: &str| match item.get(name) {
            Some(AttributeValue::S(v)) => Some(v.clone()),
            _ => None,
        };
        Ok(QueueRow {
            ticket,
            owner: get_s(key, item, OWNER)?.to_owned(),
            lease_until_ms: get_i64(key, item, LEASE_UNTIL_MS)?,
            lease_ms: get_i64(key, item, LEASE_MS)?,
            expires_at,
            seat,
            rvn: get_s(key, item, RVN)?.to_owned(),
            enqueued_at_ms: opt_i64(key, item, ENQUEUED_AT_MS)?,
            acquired_at_ms: opt_i64(key, item, ACQUIRED_AT_MS)?,
            clock_free: matches!(item.get(CLOCK_FREE), Some(AttributeValue::Bool(true))),
            holder: HolderInfo {
                function: opt_s(FUNCTION),
                request_id: opt_s(REQUEST_ID),
                host: opt_s(HOST),
            },
        })
    }
}

fn malformed(
    key: &str,
    item: &HashMap<String, AttributeValue>,
    field: &str,
    problem: String,
) -> Error {
    let sk = match item.get(SK) {
        Some(AttributeValue::S(sk)) => sk.clone(),
        _ => "?".to_owned(),
    };
    Error::MalformedItem {
        key: key.to_owned(),
        sk,
        field: field.to_owned(),
        problem,
    }
}

fn get_s<'a>(
    key: &str,
    item: &'a HashMap<String, AttributeValue>,
    name: &str,
) -> Result<&'a str, Error> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        Some(other) => Err(malformed(
            key,
            item,
            name,
            format!("expected a string, found {other:?}"),
        )),
        None => Err(malformed(key, item, name, "missing".into())),
    }
}

fn get_num<T: std::str::FromStr>(
    key: &str,
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<Option<T>, Error> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().map(Some).map_err(|_| {
            malformed(
                key,
                item,
                name,
                format!("{v:?} is not a whole number in range"),
            )
        }),
        Some(other) => Err(malformed(
            key,
            item,
            name,
            format!("expected a number, found {other:?}"),
        )),
        None => Ok(None),
    }
}

fn get_u64(key: &str, item: &HashMap<String, AttributeValue>, name: &str) -> Result<u64, Error> {
    get_num(key, item, name)?.ok_or_else(|| malformed(key, item, name, "missing".into()))
}

fn get_i64(key: &str, item: &HashMap<String, AttributeValue>, name: &str) -> Result<i64, Error> {
    get_num(key, item, name)?.ok_or_else(|| malformed(key, item, name, "missing".into()))
}

fn opt_i64(
    key: &str,
    item: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<Option<i64>, Error> {
    get_num(key, item, name)
}

// --- the counter as read, and once per tick ------------------------------------------------------

/// Counter attribute: the newest ordered tick ([`crate::Tick::At`], epoch ms) whose run
/// succeeded (N). A watermark: only ever moved forward, by a release that marks its tick done.
/// Every seat take and enqueue with an ordered tick is conditioned on it being below the tick.
pub const TICK_DONE: &str = "tickDone";
/// Counter attribute: the newest ordered tick that enqueued (N), kept by every enqueue with an
/// ordered tick as the highest of the stored value and its own. Coalescing waiters older than it
/// withdraw.
pub const TICK_NEWEST: &str = "tickNewest";
/// Prefix of a done [`crate::Tick::Id`]'s record sort key. It sorts after every queue row
/// (`"tick#" > "q#…"`), so the queue's reads (bounded by `"counter"` and the highest row) never
/// read or page through records.
pub const TICK_PREFIX: &str = "tick#";

/// The sort key of the record of the done tick id `id`.
pub fn tick_sk(id: &str) -> String {
    format!("{TICK_PREFIX}{id}")
}

/// A done tick id's record: its keys and its TTL, nothing else.
pub fn tick_record(key: &str, id: &str, expires_at: i64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_owned(), s(key)),
        (SK.to_owned(), s(&tick_sk(id))),
        (EXPIRES_AT.to_owned(), n(expires_at)),
    ])
}

/// A key's counter as read: the last ticket issued, and who issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// `last`.
    pub last: u64,
    /// `lastOwner` (absent on counters written before it existed, or set by hand).
    pub owner: Option<String>,
    /// `tickDone`: the newest ordered tick that succeeded, epoch ms.
    pub tick_done: Option<i64>,
    /// `tickNewest`: the newest ordered tick that enqueued, epoch ms.
    pub tick_newest: Option<i64>,
    /// `protocol`: the protocol the key runs (1 when absent).
    pub protocol: u32,
    /// The key's permits: `permits` on a protocol 2 counter, 1 on a protocol 1 counter.
    pub permits: u32,
}

impl Counter {
    /// A counter as the hint knows it: `last` and `lastOwner`, nothing about ticks.
    pub fn moved(owner: &str, ticket: u64) -> Counter {
        Counter {
            last: ticket,
            owner: Some(last_owner(owner, ticket)),
            tick_done: None,
            tick_newest: None,
            protocol: 1,
            permits: 1,
        }
    }

    /// Decodes a counter item, naming the field that is wrong. A counter that says its key runs
    /// a newer protocol than this build speaks is [`Error::ProtocolTooNew`]: every read of the
    /// counter goes through here, so nobody acts on a key it cannot read (see
    /// [`crate::protocol`]).
    pub fn from_item(key: &str, item: &HashMap<String, AttributeValue>) -> Result<Counter, Error> {
        crate::protocol::check(key, Some(item))?;
        let protocol =
            crate::protocol::of(item).map_err(|p| malformed(key, item, PROTOCOL_ATTR, p))?;
        let permits = if protocol >= 2 {
            match get_num::<u32>(key, item, PERMITS_ATTR)? {
                Some(p) if (2..=crate::protocol::MAX_PERMITS).contains(&p) => p,
                other => {
                    return Err(malformed(
                        key,
                        item,
                        PERMITS_ATTR,
                        format!(
                            "{other:?}: a protocol {protocol} counter carries the key's permits, \
                             2 up to {}",
                            crate::protocol::MAX_PERMITS
                        ),
                    ))
                }
            }
        } else {
            1
        };
        Ok(Counter {
            protocol,
            permits,
            last: get_u64(key, item, LAST)?,
            owner: match item.get(LAST_OWNER) {
                Some(AttributeValue::S(o)) => Some(o.clone()),
                _ => None,
            },
            tick_done: get_num(key, item, TICK_DONE)?,
            tick_newest: get_num(key, item, TICK_NEWEST)?,
        })
    }

    /// Whether the ordered tick `tick` is done by this counter's watermark (at or below it).
    pub fn done(&self, tick: i64) -> bool {
        self.tick_done.is_some_and(|d| d >= tick)
    }

    /// Whether the counter was created (by the `CreateCounter` request of a key of more
    /// than one permit, or by `flightlock permits`) and not moved by an enqueue since: its
    /// `lastOwner` names no acquisition (see [`crate::schema::created_by`]).
    pub fn created(&self) -> bool {
        self.owner
            .as_deref()
            .is_some_and(|o| o.starts_with(CREATED_PREFIX))
    }

    /// Whether `last` is the ticket recorded in `lastOwner`: the counter was last moved by an
    /// enqueue, not set by hand.
    pub fn consistent(&self) -> bool {
        self.owner
            .as_deref()
            .and_then(|o| o.rsplit_once(':'))
            .and_then(|(_, t)| t.parse::<u64>().ok())
            == Some(self.last)
    }
}

#[cfg(test)]
mod tests;
