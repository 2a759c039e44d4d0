//! The two spans of a gated invocation, as the SDK's [`SpanData`]: `flightlock.wait` (the lock
//! decision: from the event's arrival at the gate to its answer) and `flightlock.hold` (from
//! the lock taken to its release). Both are children of the invocation's span in its own trace
//! ([`super::xray`]). Pure but for the random span ids.

use std::borrow::Cow;
use std::time::SystemTime;

use flightlock::Tick;
use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};
use sha2::{Digest, Sha256};

use super::xray::TraceParent;

/// Name of the span of the lock decision.
pub const WAIT_SPAN: &str = "flightlock.wait";
/// Name of the span of the hold.
pub const HOLD_SPAN: &str = "flightlock.hold";

/// Attribute: the first 16 hex digits of the SHA-256 of the lock key (never the key itself:
/// it may carry tenant or account ids).
pub const KEY_HASH: &str = "flightlock.key_hash";
/// Attribute: the fencing token.
pub const TICKET: &str = "flightlock.ticket";
/// Attribute: how the wait or the hold ended (see [`WaitEnd`], [`HoldEnd`]).
pub const OUTCOME: &str = "flightlock.outcome";
/// Attribute: why a skipped invocation did not run (`busy`, `stale`, `superseded`).
pub const SKIP_REASON: &str = "flightlock.skip_reason";
/// Attribute: the `errorType` a failed decision answered with (`FlightlockBusy`, ...).
pub const ERROR_TYPE: &str = "flightlock.error_type";
/// Attribute: the invocation's tick (RFC 3339 UTC for a time, else the id).
pub const TICK: &str = "flightlock.tick";

/// The SHA-256 of `key`, its first 8 bytes in hex: what the spans carry instead of the key.
pub fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the two spans of one invocation share.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The invocation's trace (sampled).
    pub parent: TraceParent,
    /// The request id (`faas.invocation_id`).
    pub request_id: String,
    /// [`key_hash`] of the key, when the key could be rendered.
    pub key_hash: Option<String>,
    /// The tick, if the invocation has one. A time is a scheduled tick: `faas.trigger` =
    /// `timer` and `faas.time` = the tick.
    pub tick: Option<Tick>,
}

/// How the lock decision ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEnd {
    /// The lock was taken (`acquired`): the handler runs.
    Acquired {
        /// The fencing token.
        ticket: u64,
    },
    /// Answered with the skip body without running: `duplicate` for a tick that already ran,
    /// else `skipped` with the reason (`busy`, `stale`, `superseded`).
    Skipped {
        /// The skip body's `reason`.
        reason: String,
    },
    /// Answered with an error (`failed`), of this `errorType`.
    Failed {
        /// The `errorType`.
        error_type: String,
    },
}

/// How the hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// `ran`: the handler answered successfully.
    Ran,
    /// `failed`: the handler failed, crashed or timed out, or its answer did not reach Lambda.
    Failed,
    /// `lost`: the lock was lost while the handler ran (another invocation may have held the
    /// key meanwhile).
    Lost,
    /// `shutdown`: the environment shut down with the invocation unfinished.
    Shutdown,
}

impl HoldEnd {
    /// The `flightlock.outcome` value.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldEnd::Ran => "ran",
            HoldEnd::Failed => "failed",
            HoldEnd::Lost => "lost",
            HoldEnd::Shutdown => "shutdown",
        }
    }
}

/// The span of the lock decision, `start` to `end`.
pub fn wait_span(
    inv: &Invocation,
    scope: &InstrumentationScope,
    start: SystemTime,
    end: SystemTime,
    outcome: &WaitEnd,
) -> SpanData {
    let mut attributes = common(inv);
    let status = match outcome {
        WaitEnd::Acquired { ticket } => {
            attributes.push(KeyValue::new(OUTCOME, "acquired"));
            attributes.push(KeyValue::new(TICKET, *ticket as i64));
            Status::Unset
        }
        WaitEnd::Skipped { reason } if reason == "duplicate" => {
            attributes.push(KeyValue::new(OUTCOME, "duplicate"));
            Status::Unset
        }
        WaitEnd::Skipped { reason } => {
            attributes.push(KeyValue::new(OUTCOME, "skipped"));
            attributes.push(KeyValue::new(SKIP_REASON, reason.clone()));
            Status::Unset
        }
        WaitEnd::Failed { error_type } => {
            attributes.push(KeyValue::new(OUTCOME, "failed"));
            attributes.push(KeyValue::new(ERROR_TYPE, error_type.clone()));
            Status::error(error_type.clone())
        }
    };
    span(inv, scope, WAIT_SPAN, start, end, attributes, status)
}

/// The span of the hold of `ticket`, `start` (taken) to `end` (released).
pub fn hold_span(
    inv: &Invocation,
    scope: &InstrumentationScope,
    ticket: u64,
    start: SystemTime,
    end: SystemTime,
    outcome: HoldEnd,
) -> SpanData {
    let mut attributes = common(inv);
    attributes.push(KeyValue::new(OUTCOME, outcome.as_str()));
    attributes.push(KeyValue::new(TICKET, ticket as i64));
    let status = match outcome {
        HoldEnd::Lost => Status::error("the lock was lost while the handler ran"),
        HoldEnd::Ran | HoldEnd::Failed | HoldEnd::Shutdown => Status::Unset,
    };
    span(inv, scope, HOLD_SPAN, start, end, attributes, status)
}

fn common(inv: &Invocation) -> Vec<KeyValue> {
    let mut attributes = vec![KeyValue::new("faas.invocation_id", inv.request_id.clone())];
    if let Some(h) = &inv.key_hash {
        attributes.push(KeyValue::new(KEY_HASH, h.clone()));
    }
    if let Some(t) = &inv.tick {
        attributes.push(KeyValue::new(TICK, t.to_string()));
        if let Tick::At(_) = t {
            attributes.push(KeyValue::new("faas.trigger", "timer"));
            attributes.push(KeyValue::new("faas.time", t.to_string()));
        }
    }
    attributes
}

fn span(
    inv: &Invocation,
    scope: &InstrumentationScope,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
    status: Status,
) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            inv.parent.trace_id,
            RandomIdGenerator::default().new_span_id(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: inv.parent.parent,
        parent_span_is_remote: true,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(name),
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn inv(tick: Option<Tick>) -> Invocation {
        Invocation {
            parent: super::super::xray::parse(
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
            )
            .expect("parsed"),
            request_id: "r1".to_owned(),
            key_hash: Some(key_hash("tenant-42/job")),
            tick,
        }
    }

    fn attr(s: &SpanData, name: &str) -> Option<String> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == name)
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn the_key_hash_is_a_sha256_prefix_and_never_the_key() {
        // sha256("abc") = ba7816bf8f01cfea...
        assert_eq!(key_hash("abc"), "ba7816bf8f01cfea");
        let s = wait_span(
            &inv(None),
            &InstrumentationScope::builder("t").build(),
            SystemTime::UNIX_EPOCH,
            SystemTime::UNIX_EPOCH,
            &WaitEnd::Acquired { ticket: 3 },
        );
        assert!(s
            .attributes
            .iter()
            .all(|kv| !kv.value.to_string().contains("tenant-42")));
    }

    #[test]
    fn outcomes_and_scheduled_ticks_are_attributes() {
        let scope = InstrumentationScope::builder("t").build();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let sched = inv(Some(Tick::At(1_800_000_000_000)));
        let s = wait_span(
            &sched,
            &scope,
            t0,
            t0,
            &WaitEnd::Skipped {
                reason: "duplicate".into(),
            },
        );
        assert_eq!(attr(&s, OUTCOME).as_deref(), Some("duplicate"));
        assert_eq!(attr(&s, SKIP_REASON), None);
        assert_eq!(attr(&s, "faas.trigger").as_deref(), Some("timer"));
        assert_eq!(
            attr(&s, "faas.time").as_deref(),
            Some("2027-01-15T08:00:00.000Z")
        );
        let s = wait_span(
            &inv(Some(Tick::Id("batch-7".into()))),
            &scope,
            t0,
            t0,
            &WaitEnd::Skipped {
                reason: "busy".into(),
            },
        );
        assert_eq!(attr(&s, OUTCOME).as_deref(), Some("skipped"));
        assert_eq!(attr(&s, SKIP_REASON).as_deref(), Some("busy"));
        assert_eq!(attr(&s, "faas.trigger"), None);
        let s = hold_span(&sched, &scope, 9, t0, t0, HoldEnd::Lost);
        assert_eq!(attr(&s, OUTCOME).as_deref(), Some("lost"));
        assert_eq!(attr(&s, TICKET).as_deref(), Some("9"));
        assert!(matches!(s.status, Status::Error { .. }));
        assert_eq!(s.parent_span_id, sched.parent.parent);
        assert_eq!(s.span_context.trace_id(), sched.parent.trace_id);
    }
}
