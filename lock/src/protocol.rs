//! The protocol's version on the table: which protocol a key runs, and the check every
//! participant makes before it trusts what it reads or writes.
//!
//! A key's counter item carries `protocol` (N, [`PROTOCOL_ATTR`]); an absent
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

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::Error;

/// A DynamoDB item, as the requests and answers carry it.
type Item = HashMap<String, AttributeValue>;

/// The highest protocol version this build speaks. An absent `protocol` attribute on a key's
/// counter means 1. Changing what the table holds or how a request is conditioned changes this
/// number (see `CONTRIBUTING.md` and `lock/tests/protocol/snapshot.rs`).
///
/// - **1**: one holder at a time. The counter carries no `protocol` (or `1`) and no `permits`.
/// - **2**: N holders at a time ([`crate::LockOptions::permits`] above 1): the counter carries
///   `protocol = 2` and `permits = N`, and rows carry `protocol = 2`. A key with one permit stays
///   on protocol 1, byte for byte, so a participant configured with one permit writes exactly
///   what a protocol 1 build writes (its writes are conditioned on `:speaks = 1`).
pub const PROTOCOL: u32 = 2;

/// Counter attribute: the protocol version the key runs (N; absent means 1). Written at the
/// counter's creation; every write that touches the counter is conditioned on it not being newer
/// than the writer speaks, and every read of the counter checks it.
pub const PROTOCOL_ATTR: &str = "protocol";
/// Counter attribute (protocol 2): how many holders the key allows at a time (N, at least 2; a
/// key of protocol 1 carries none and allows one). Written at the counter's creation or by
/// `flightlock permits`; every write of a participant configured with more than one permit is
/// conditioned on it.
pub const PERMITS_ATTR: &str = "permits";
/// The most permits a key may have ([`crate::LockOptions::permits`]).
pub const MAX_PERMITS: u32 = 100;

/// The condition every write that touches the counter carries: the key runs a protocol this
/// build speaks. `#proto` names [`PROTOCOL_ATTR`], `:speaks` is [`PROTOCOL`].
pub const CONDITION: &str = "(attribute_not_exists(#proto) OR #proto <= :speaks)";

/// The condition of a participant configured with more than one permit: the key runs protocol 2
/// *and* has exactly our permits. A key of one permit (protocol 1), of other permits, or of a
/// newer protocol refuses the write; the refusal's `ALL_OLD` counter says which.
pub const PERMITS_CONDITION: &str = "(#proto = :speaks AND #permits = :permits)";

/// The placeholder of [`PERMITS_ATTR`] in [`PERMITS_CONDITION`].
pub(crate) const PERMITS_NAME: &str = "#permits";
/// The placeholder of our permits in [`PERMITS_CONDITION`].
pub(crate) const PERMITS_VALUE: &str = ":permits";

/// Who writes or reads a key, as far as its version goes: what its writes are conditioned on,
/// and what its reads accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// A participant configured with this many permits. One: protocol 1, exactly as a protocol 1
    /// build (the key must carry no `permits`). More: protocol 2, and the key's `permits` must be
    /// ours. Anything else is [`Error::PermitsMismatch`] (or [`Error::ProtocolTooNew`]).
    Permits(u32),
    /// The sweeper and status: any protocol this build speaks, any permits (a dead entry is dead
    /// whatever the key's permits).
    Any,
}

impl Speaks {
    /// What a participant with `permits` conditions its writes on when it maintains an entry it
    /// already has (the seat's heartbeat, release, a stale seat's removal): with one permit,
    /// protocol 1 exactly; with more, any protocol this build speaks (the key's permits decide
    /// grants, not the upkeep of an entry already granted or queued).
    pub(crate) fn maintain(permits: u32) -> Speaks {
        if permits > 1 {
            Speaks::Any
        } else {
            Speaks::Permits(1)
        }
    }

    /// The protocol this speaker's writes are conditioned on (`:speaks`).
    pub(crate) fn protocol(self) -> u32 {
        match self {
            Speaks::Permits(1) => 1,
            Speaks::Permits(_) | Speaks::Any => PROTOCOL,
        }
    }

    /// The condition term, its names and its values, to `AND` onto a write that touches the
    /// counter (or a row of a key whose counter the sweeper checked).
    pub(crate) fn condition(
        self,
        names: &mut HashMap<String, String>,
        values: &mut Item,
    ) -> &'static str {
        names.insert(NAME.to_owned(), PROTOCOL_ATTR.to_owned());
        values.insert(
            VALUE.to_owned(),
            AttributeValue::N(self.protocol().to_string()),
        );
        match self {
            Speaks::Permits(n) if n > 1 => {
                names.insert(PERMITS_NAME.to_owned(), PERMITS_ATTR.to_owned());
                values.insert(PERMITS_VALUE.to_owned(), AttributeValue::N(n.to_string()));
                PERMITS_CONDITION
            }
            _ => CONDITION,
        }
    }

    /// Whether a write conditioned by this speaker passes on a counter item (`None`: no
    /// counter), as DynamoDB evaluates [`Speaks::condition`]. The simulation's model uses it.
    #[cfg(test)]
    pub(crate) fn passes(self, counter: Option<&Item>) -> bool {
        let proto = counter.and_then(|c| c.get(PROTOCOL_ATTR));
        let num = |v: Option<&AttributeValue>| match v {
            Some(AttributeValue::N(n)) => n.parse::<f64>().ok(),
            _ => None,
        };
        match self {
            Speaks::Permits(n) if n > 1 => {
                let permits = counter.and_then(|c| c.get(PERMITS_ATTR));
                num(proto) == Some(f64::from(PROTOCOL)) && num(permits) == Some(f64::from(n))
            }
            _ => match proto {
                None => true,
                Some(v) => num(Some(v)).is_some_and(|p| p <= f64::from(self.protocol())),
            },
        }
    }
}

/// The placeholder of [`PROTOCOL_ATTR`] in [`CONDITION`].
pub(crate) const NAME: &str = "#proto";
/// The placeholder of [`PROTOCOL`] in [`CONDITION`].
pub(crate) const VALUE: &str = ":speaks";

/// The protocol a counter item (or a row) says its key runs: its `protocol` attribute, 1 when
/// absent. Anything but a whole number from 1 is malformed (`Err` says why): the one judgement
/// of the attribute, which every read and every refused write's `ALL_OLD` item goes through
/// ([`check`]), so `-1` or `0.5` is not "a newer protocol" on one path and "protocol 1" on
/// another.
pub(crate) fn of(item: &Item) -> Result<u32, String> {
    match item.get(PROTOCOL_ATTR) {
        None => Ok(1),
        Some(AttributeValue::N(v)) => match v.parse::<u32>() {
            Ok(p) if p >= 1 => Ok(p),
            _ => Err(format!(
                "{v} is not a protocol version (a whole number from 1; absent means 1)"
            )),
        },
        Some(other) => Err(format!(
            "{other:?} is not a protocol version (a number, N, from 1; absent means 1)"
        )),
    }
}

/// Checks what the counter item `counter` (as read, or as it stood when a write was refused)
/// says of `key`'s protocol: [`Error::MalformedItem`] naming the value if it is not a protocol
/// version ([`of`]), [`Error::ProtocolTooNew`] if it is newer than [`PROTOCOL`]. No counter:
/// nothing to check.
pub(crate) fn check(key: &str, counter: Option<&Item>) -> Result<(), Error> {
    let Some(item) = counter else {
        return Ok(());
    };
    match of(item) {
        Err(problem) => Err(Error::MalformedItem {
            key: key.to_owned(),
            sk: match item.get("sk") {
                Some(AttributeValue::S(sk)) => sk.clone(),
                _ => "?".to_owned(),
            },
            field: PROTOCOL_ATTR.to_owned(),
            problem,
        }),
        Ok(table) if table > PROTOCOL => Err(Error::ProtocolTooNew {
            key: key.to_owned(),
            table,
            speaks: PROTOCOL,
        }),
        Ok(_) => Ok(()),
    }
}

/// [`Error::PermitsMismatch`] unless the key's permits (`table`, 1 on protocol 1) are ours.
pub(crate) fn agree_permits(key: &str, table: u32, configured: u32) -> Result<(), Error> {
    if table == configured {
        Ok(())
    } else {
        Err(Error::PermitsMismatch {
            key: key.to_owned(),
            table,
            configured,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::UPGRADE_GUIDE;

    fn counter(protocol: Option<AttributeValue>) -> Item {
        let mut item = HashMap::from([("last".to_owned(), AttributeValue::N("3".into()))]);
        if let Some(p) = protocol {
            item.insert(PROTOCOL_ATTR.to_owned(), p);
        }
        item
    }

    #[test]
    fn an_absent_protocol_is_one_and_speakable() {
        assert_eq!(of(&counter(None)), Ok(1));
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
    fn a_value_that_is_no_protocol_version_is_malformed_naming_it() {
        for (value, shown) in [
            (AttributeValue::N("-1".into()), "-1"),
            (AttributeValue::N("0.5".into()), "0.5"),
            (AttributeValue::N("0".into()), "0"),
            (AttributeValue::N("4294967296".into()), "4294967296"),
            (AttributeValue::S("2".into()), "S(\"2\")"),
        ] {
            match check("k", Some(&counter(Some(value)))) {
                Err(Error::MalformedItem { field, problem, .. }) => {
                    assert_eq!(field, PROTOCOL_ATTR);
                    assert!(problem.contains(shown), "{problem}");
                }
                other => panic!("{shown}: expected MalformedItem, got {other:?}"),
            }
        }
        // A whole number above what this build speaks is a newer protocol, not malformed.
        assert!(matches!(
            check("k", Some(&counter(Some(AttributeValue::N("7".into()))))),
            Err(Error::ProtocolTooNew { table: 7, .. })
        ));
    }
}
