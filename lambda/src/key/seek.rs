//! Finding one JSON-pointer field in raw event bytes without building the document: a
//! `serde_json` deserializer walks the event, descends only along the pointer and skips
//! everything else with [`IgnoredAny`] (which allocates nothing for skipped strings, numbers,
//! objects or arrays). Memory is bounded by the pointer's depth and the found value, not by
//! the event: a 6 MB event needs no 6 MB tree (a `serde_json::Value` takes many times the
//! event's size). The whole event is still checked to be JSON.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a JSON pointer points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Found {
    /// Nothing (or `null`).
    Missing,
    /// A string.
    Str(String),
    /// A number or boolean, as `serde_json` prints it.
    Scalar(String),
    /// An object or array.
    Composite,
}

/// The reference tokens of a JSON pointer (`/a/b~1c` → `a`, `b/c`), as RFC 6901 decodes them.
pub(super) fn tokens(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// Finds `tokens` in `event`. Errors are `serde_json`'s (the event is not JSON).
pub(super) fn find(event: &[u8], tokens: &[String]) -> Result<Found, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(event);
    let found = Seek(tokens).deserialize(&mut de)?;
    de.end()?;
    Ok(found)
}

/// An array index as `serde_json::Value::pointer` accepts it: digits, no sign, no leading zero.
fn index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// Descends along the remaining tokens.
struct Seek<'a>(&'a [String]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        match self.0.split_first() {
            None => d.deserialize_any(Leaf),
            Some((head, rest)) => d.deserialize_any(Step { head, rest }),
        }
    }
}

/// One step down: into the member or element named by `head`.
struct Step<'a> {
    head: &'a str,
    rest: &'a [String],
}

/// A scalar where the pointer wanted to go deeper: nothing there.
macro_rules! missing {
    ($($name:ident: $t:ty),*) => {$(
        fn $name<E: serde::de::Error>(self, _: $t) -> Result<Found, E> {
            Ok(Found::Missing)
        }
    )*};
}

impl<'de> Visitor<'de> for Step<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    missing!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: serde::de::Error>(self) -> Result<Found, E> {
        Ok(Found::Missing)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let mut found = Found::Missing;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            // A repeated member: the last one wins, as in `serde_json::Value`.
            if key == self.head {
                found = map.next_value_seed(Seek(self.rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let wanted = index(self.head);
        let mut found = Found::Missing;
        let mut i = 0usize;
        loop {
            if Some(i) == wanted {
                match seq.next_element_seed(Seek(self.rest))? {
                    Some(f) => found = f,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }
}

/// The value the pointer names.
struct Leaf;

impl<'de> Visitor<'de> for Leaf {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Found, E> {
        Ok(Found::Scalar(v.to_string()))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Found, E> {
        Ok(Found::Scalar(v.to_string()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Found, E> {
        Ok(Found::Scalar(v.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Found, E> {
        // Printed exactly as `serde_json::Value` prints the same number.
        Ok(
            serde_json::Number::from_f64(v)
                .map_or(Found::Missing, |n| Found::Scalar(n.to_string())),
        )
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Found, E> {
        Ok(Found::Str(v.to_owned()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Found, E> {
        Ok(Found::Missing)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Found::Composite)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::Composite)
    }
}
