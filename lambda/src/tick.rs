//! The tick of an invocation (`FLIGHTLOCK_TICK`): which scheduled run an event is, so a run that
//! succeeded is never run again for a duplicate or a retry of the same event (see
//! [`flightlock::tick`] for what the lock does with it). Pure: found in the raw event bytes by a
//! streaming walk, like the key ([`super::key`]).
//!
//! - `auto` (the default): an EventBridge scheduled event (`source` = `aws.events` and
//!   `detail-type` = `Scheduled Event`) → its `time`, which must be RFC 3339 (else
//!   [`TickError::NotATime`]: nothing runs); any other event → no tick, so per-entity keys and
//!   plain events behave as without ticks. Why the default: the scheduled-job recipe (one key,
//!   an EventBridge rule) becomes once-per-tick with no setting; EventBridge's duplicates and
//!   retries and Lambda's async retries carry the same `time`, and a time is ordered, so it
//!   costs no request (a watermark on the key's counter item).
//! - `off`: no tick, ever.
//! - a template in the key-template syntax (`{/detail/batchId}`, `run-{/tick}`): rendered from
//!   the event; a value that parses as RFC 3339 is an ordered tick ([`Tick::At`]), anything
//!   else an id ([`Tick::Id`]). A template that does not match the event is a [`TickError`]:
//!   nothing runs.
//!
//! `FLIGHTLOCK_STALE_AFTER` ([`flightlock::options::parse_stale_after`], [`flightlock::tick::age`])
//! drops an ordered tick older than a bound; the gate decides it before touching the table.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::key::{KeyError, KeyTemplate};
use flightlock::Tick;

/// `source` of an EventBridge scheduled event.
pub const SCHEDULED_SOURCE: &str = "aws.events";
/// `detail-type` of an EventBridge scheduled event.
pub const SCHEDULED_DETAIL_TYPE: &str = "Scheduled Event";

/// The forms `FLIGHTLOCK_TICK` accepts.
pub const TICK_FORMS: &str = "auto (an EventBridge scheduled event's time, else no tick), off, \
                              or a template that reads the event such as {/detail/batchId} or \
                              run-{/tick} ({{ and }} for literal braces)";

/// Where an invocation's tick comes from (`FLIGHTLOCK_TICK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickSource {
    /// An EventBridge scheduled event's `time`; no tick for any other event.
    Auto,
    /// No tick.
    Off,
    /// Rendered from the event: RFC 3339 → ordered, anything else → an id.
    Template(KeyTemplate),
}

/// Why an invocation's tick could not be found: the invocation fails (`FlightlockTickError`),
/// nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TickError {
    /// An EventBridge scheduled event whose `time` is missing or not RFC 3339.
    #[error(
        "the event is an EventBridge scheduled event but its time {time:?} is not an RFC 3339 \
         timestamp (such as 2026-11-24T10:00:00Z), so it cannot be the tick; set \
         FLIGHTLOCK_TICK to a template or to off"
    )]
    NotATime {
        /// The `time` field as found (`None`: missing, null or not a string).
        time: Option<String>,
    },
    /// The tick template does not match the event.
    #[error("the tick template {template:?} does not match the event: {problem}")]
    NoMatch {
        /// The template.
        template: String,
        /// What is wrong: the field missing, not a scalar, the event not JSON.
        problem: String,
    },
    /// The rendered tick is an id that is empty or too long.
    #[error("the tick template {template:?} rendered an invalid tick: {problem}")]
    Invalid {
        /// The template.
        template: String,
        /// What is wrong.
        problem: String,
    },
}

impl TickSource {
    /// Parses `FLIGHTLOCK_TICK`: `auto`, `off` (any case), or a template. A template must read
    /// the event or the tenant: a fixed tick would make every invocation after the first
    /// success a duplicate. The error is the problem; the caller names the variable.
    pub fn parse(value: &str) -> Result<TickSource, String> {
        let v = value.trim();
        if v.eq_ignore_ascii_case("auto") {
            return Ok(TickSource::Auto);
        }
        if v.eq_ignore_ascii_case("off") {
            return Ok(TickSource::Off);
        }
        let template = KeyTemplate::parse(v)?;
        if !template.reads_event() && !template.reads_tenant() {
            return Err(
                "a tick template must read the event (a {/json/pointer} placeholder): a fixed \
                 tick would answer every invocation after the first success as a duplicate"
                    .into(),
            );
        }
        Ok(TickSource::Template(template))
    }

    /// True if finding the tick reads the event (`auto` and templates with a pointer).
    pub fn reads_event(&self) -> bool {
        match self {
            TickSource::Auto => true,
            TickSource::Off => false,
            TickSource::Template(t) => t.reads_event(),
        }
    }

    /// The tick of an invocation with raw `event` bytes and tenant id (`None`: no tick).
    pub fn tick(&self, event: &[u8], tenant: Option<&str>) -> Result<Option<Tick>, TickError> {
        match self {
            TickSource::Off => Ok(None),
            TickSource::Auto => {
                let head = Head::read(event);
                if head.source.as_deref() != Some(SCHEDULED_SOURCE)
                    || head.detail_type.as_deref() != Some(SCHEDULED_DETAIL_TYPE)
                {
                    return Ok(None);
                }
                match head.time.as_deref().map(Tick::parse) {
                    Some(tick @ Tick::At(_)) => Ok(Some(tick)),
                    _ => Err(TickError::NotATime { time: head.time }),
                }
            }
            TickSource::Template(t) => {
                let rendered = t
                    .render_invocation(event, tenant)
                    .map_err(|e| template_error(t, e))?;
                let tick = Tick::parse(&rendered);
                tick.validate().map_err(|problem| TickError::Invalid {
                    template: t.source().to_owned(),
                    problem,
                })?;
                Ok(Some(tick))
            }
        }
    }
}

impl fmt::Display for TickSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TickSource::Auto => f.write_str("auto"),
            TickSource::Off => f.write_str("off"),
            TickSource::Template(t) => f.write_str(t.source()),
        }
    }
}

/// A key-template error, told as a tick template's.
fn template_error(template: &KeyTemplate, e: KeyError) -> TickError {
    let source = template.source().to_owned();
    let problem = match e {
        KeyError::NotJson { problem, .. } => format!("the event is not JSON ({problem})"),
        KeyError::Missing { pointer, .. } => {
            format!("the event field {pointer} is missing or null")
        }
        KeyError::NotScalar { pointer, .. } => format!(
            "the event field {pointer} is an object or array; point at a string, number or \
             boolean"
        ),
        KeyError::NotJsonText {
            pointer, problem, ..
        } => format!("it reads the event field {pointer} as JSON text, but {problem}"),
        KeyError::NoTenant { .. } => {
            "it uses {tenant}, but the invocation has no tenant id".to_owned()
        }
        KeyError::InvalidKey { problem, .. } => {
            return TickError::Invalid {
                template: source,
                problem,
            }
        }
    };
    TickError::NoMatch {
        template: source,
        problem,
    }
}

/// The three top-level fields of an EventBridge event that `auto` reads, each kept only if it
/// is a string.
#[derive(Debug, Default)]
struct Head {
    source: Option<String>,
    detail_type: Option<String>,
    time: Option<String>,
}

impl Head {
    /// Reads them in one streaming pass that skips everything else (nothing of the rest of the
    /// event is kept). An event that is not a JSON object has none of them.
    fn read(event: &[u8]) -> Head {
        let mut de = serde_json::Deserializer::from_slice(event);
        match de.deserialize_any(HeadVisitor) {
            Ok(head) if de.end().is_ok() => head,
            _ => Head::default(),
        }
    }
}

/// Visitor methods for values that carry nothing `auto` reads.
macro_rules! nothing {
    ($out:ty => $value:expr; $($name:ident: $t:ty),*) => {$(
        fn $name<E: serde::de::Error>(self, _: $t) -> Result<$out, E> {
            Ok($value)
        }
    )*};
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Head;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    nothing!(Head => Head::default(); visit_bool: bool, visit_i64: i64, visit_u64: u64,
             visit_f64: f64, visit_str: &str);

    fn visit_unit<E: serde::de::Error>(self) -> Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Head, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Head::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
        let mut head = Head::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            // A repeated member: the last one wins, as in `serde_json::Value`.
            let slot = match key.as_ref() {
                "source" => &mut head.source,
                "detail-type" => &mut head.detail_type,
                "time" => &mut head.time,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value::<Text>()?.0;
        }
        Ok(head)
    }
}

/// A value kept if it is a string, skipped otherwise.
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    nothing!(Text => Text(None); visit_bool: bool, visit_i64: i64, visit_u64: u64,
             visit_f64: f64);

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text(Some(v.to_owned())))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Text, E> {
        Ok(Text(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Text(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Text(None))
    }
}

#[cfg(test)]
mod tests;
