//! The protocol's version on the table: which protocol a key runs, and the check every
//! participant makes before it trusts what it reads or writes.
//!
//! A key's counter item carries `protocol` (N, [`crate::schema::PROTOCOL_ATTR`]); an absent
//! attribute means protocol 1. [`PROTOCOL`] is the highest version this build speaks, the one
//! source of that number. The check rides on requests the protocol already makes, so it costs no
//! request (2 per uncontended cycle stay 2):
//!
//! - every write that touches the counter (its creation, the enqueue's counter update, the seat's
//!   take, heartbeat, release and removal, the tick's mark) adds [`CONDITION`] to its condition,
//!   and a refusal's `ALL_OLD` counter tells "newer protocol" (`check`) from its other
//!   refusals;
//! - every read that returns the counter (the enqueue's `Query`, a waiter's look once it reaches
//!   the counter, the first-row read, status, the sweeper's read of a key before it removes
//!   anything) decodes it through [`crate::schema::Counter::from_item`], which refuses a newer
//!   protocol.
//!
//! A participant that meets a newer protocol fails closed with [`Error::ProtocolTooNew`]: it is
//! never granted, and it removes nothing but its own waiting entry (as a give-up does). Every
//! grant is decided on a read that included the counter, or by a conditional write of the
//! counter (the seat's take, the enqueue's counter update), so no grant escapes the check
//! (`lock/PROTOCOL.md`, "The protocol's version").

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::Error;
use crate::schema::PROTOCOL_ATTR;
use crate::storage::Item;

/// The highest protocol version this build speaks. An absent `protocol` attribute on a key's
/// counter means 1. Changing what the table holds or how a request is conditioned changes this
/// number (see `CONTRIBUTING.md` and `lock/tests/protocol/snapshot.rs`).
pub const PROTOCOL: u32 = 1;

/// Where a user who meets [`Error::ProtocolTooNew`] reads what to do.
pub const UPGRADE_GUIDE: &str = "docs/src/operations/upgrades.md";

/// The condition every write that touches the counter carries: the key runs a protocol this
/// build speaks. `#proto` names [`PROTOCOL_ATTR`], `:speaks` is [`PROTOCOL`].
pub const CONDITION: &str = "(attribute_not_exists(#proto) OR #proto <= :speaks)";

/// The placeholder of [`PROTOCOL_ATTR`] in [`CONDITION`].
pub(crate) const NAME: &str = "#proto";
/// The placeholder of [`PROTOCOL`] in [`CONDITION`].
pub(crate) const VALUE: &str = ":speaks";

/// The value of [`VALUE`]: the highest protocol this build speaks.
pub(crate) fn speaks_value() -> AttributeValue {
    AttributeValue::N(PROTOCOL.to_string())
}

/// The protocol a counter item says its key runs: its `protocol` attribute, 1 when absent. A
/// value that is not a whole number is read as newer than anything (fail closed).
pub(crate) fn of(item: &Item) -> u32 {
    match item.get(PROTOCOL_ATTR) {
        None => 1,
        Some(AttributeValue::N(v)) => v.parse().unwrap_or(u32::MAX),
        Some(_) => u32::MAX,
    }
}

/// [`Error::ProtocolTooNew`] if the counter item `counter` (as read, or as it stood when a write
/// was refused) says `key` runs a protocol newer than [`PROTOCOL`]. No counter: nothing to check.
pub(crate) fn check(key: &str, counter: Option<&Item>) -> Result<(), Error> {
    match counter.map(of) {
        Some(table) if table > PROTOCOL => Err(Error::ProtocolTooNew {
            key: key.to_owned(),
            table,
            speaks: PROTOCOL,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn counter(protocol: Option<AttributeValue>) -> Item {
        let mut item = HashMap::from([("last".to_owned(), AttributeValue::N("3".into()))]);
        if let Some(p) = protocol {
            item.insert(PROTOCOL_ATTR.to_owned(), p);
        }
        item
    }

    #[test]
    fn an_absent_protocol_is_one_and_speakable() {
        assert_eq!(of(&counter(None)), 1);
        assert!(check("k", Some(&counter(None))).is_ok());
        assert!(check("k", None).is_ok());
    }

    #[test]
    fn a_newer_protocol_is_refused_naming_both_versions() {
        let item = counter(Some(AttributeValue::N((PROTOCOL + 1).to_string())));
        let err = check("k", Some(&item)).err();
        match err {
            Some(Error::ProtocolTooNew { key, table, speaks }) => {
                assert_eq!((key.as_str(), table, speaks), ("k", PROTOCOL + 1, PROTOCOL));
            }
            other => panic!("expected ProtocolTooNew, got {other:?}"),
        }
        let text = check("k", Some(&item)).map_err(|e| e.to_string()).err();
        let text = text.unwrap_or_default();
        assert!(
            text.contains(&format!("protocol {}", PROTOCOL + 1)),
            "{text}"
        );
        assert!(text.contains(UPGRADE_GUIDE), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
    }

    #[test]
    fn an_unreadable_protocol_fails_closed() {
        let item = counter(Some(AttributeValue::S("2".into())));
        assert!(check("k", Some(&item)).is_err());
    }
}
