//! Test-only item builders (feature `test-util`): queue rows, counters and seats written straight
//! into a table, for tests and benchmarks that need a table in a given state (dead rows for a
//! sweep, idle keys, a seat). The lock itself writes its items through [`NewRow`] and its
//! requests, never through these.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{n, s, seat_attributes, ttl_seconds, NewRow, COUNTER_SK, LAST, LAST_OWNER, PK, SK};
use crate::holder::HolderInfo;

/// A written item.
pub type Item = HashMap<String, AttributeValue>;

/// A row's lease length, ms.
pub const LEASE_MS: i64 = 20_000;

/// How long after its lease a row's TTL falls: 30 days, so DynamoDB Local's TTL (which it runs)
/// never removes a row during a test.
pub const TTL_AFTER_MS: i64 = 30 * 24 * 3_600_000;

/// A granted queue row of `owner` with record version `rvn` whose [`LEASE_MS`] lease ends at
/// `lease_until_ms` (in the past: a dead row), with no holder details.
pub fn row(key: &str, ticket: u64, owner: &str, rvn: &str, lease_until_ms: i64) -> Item {
    row_of(
        key,
        ticket,
        owner,
        rvn,
        lease_until_ms,
        &HolderInfo::default(),
    )
}

/// As [`row`], with `holder`'s details.
pub fn row_of(
    key: &str,
    ticket: u64,
    owner: &str,
    rvn: &str,
    lease_until_ms: i64,
    holder: &HolderInfo,
) -> Item {
    NewRow {
        key,
        ticket,
        owner,
        lease_until_ms,
        lease_ms: LEASE_MS,
        expires_at: ttl_seconds(lease_until_ms + TTL_AFTER_MS),
        clock_free: false,
        rvn,
        now_ms: lease_until_ms - LEASE_MS,
        granted: true,
        holder,
        protocol: 1,
    }
    .to_item()
}

/// A key's counter at `last`, with an empty seat.
pub fn counter(key: &str, last: u64) -> Item {
    HashMap::from([
        (PK.to_owned(), s(key)),
        (SK.to_owned(), s(COUNTER_SK)),
        (LAST.to_owned(), n(last)),
    ])
}

/// A key's counter at `ticket` whose seat holds the entry [`row`] describes (the counter moved
/// there by `owner`).
pub fn seat(key: &str, ticket: u64, owner: &str, rvn: &str, lease_until_ms: i64) -> Item {
    let row = row(key, ticket, owner, rvn, lease_until_ms);
    let mut item = counter(key, ticket);
    item.insert(LAST_OWNER.to_owned(), s(&super::last_owner(owner, ticket)));
    for (name, value) in seat_attributes(&row) {
        item.insert(name.to_owned(), value.clone());
    }
    item
}

/// `key` as a newer protocol ([`crate::PROTOCOL`] + 1) would write it, `now_ms` being the wall
/// clock: a counter at that protocol whose holder sits under attribute names this build does not
/// know (its `owner` attribute is absent, so a version-blind build would see an empty seat and
/// take the key beside that holder), and a dead queue row written under that protocol (which a
/// version-blind sweeper would remove).
pub fn newer_key(key: &str, now_ms: i64) -> Vec<Item> {
    let newer = crate::PROTOCOL + 1;
    let counter = HashMap::from([
        (PK.to_owned(), s(key)),
        (SK.to_owned(), s(COUNTER_SK)),
        (LAST.to_owned(), n(7)),
        (LAST_OWNER.to_owned(), s("v2-holder:7")),
        (super::PROTOCOL_ATTR.to_owned(), n(newer)),
        ("holderOwner".to_owned(), s("v2-holder")),
        ("holderTicket".to_owned(), n(7)),
        ("holderLeaseUntilMs".to_owned(), n(now_ms + 600_000)),
    ]);
    let mut dead_row = row(key, 6, "v2-gone", "r6", now_ms - 3_600_000);
    dead_row.insert(super::PROTOCOL_ATTR.to_owned(), n(newer));
    vec![counter, dead_row]
}
