//! The key's counter item as read ([`Counter`]), and the attributes and items of once per tick
//! (see [`crate::tick`]): the watermark and `tickNewest` on the counter, and the record of a done
//! tick id.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    get_num, get_u64, last_owner, n, s, EXPIRES_AT, LAST, LAST_OWNER, PERMITS_ATTR, PK, SK,
};
use crate::error::Error;

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
        let protocol = crate::protocol::of(item);
        let permits = if protocol >= 2 {
            match get_num::<u32>(key, item, PERMITS_ATTR)? {
                Some(p) if (2..=crate::protocol::MAX_PERMITS).contains(&p) => p,
                other => {
                    return Err(super::malformed(
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
            .is_some_and(|o| o.starts_with(super::CREATED_PREFIX))
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
