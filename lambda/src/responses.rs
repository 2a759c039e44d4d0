//! What an invocation is answered with when the gate does not run it: the `errorType`s of
//! flightlock's invocation errors, the Runtime API's error body, the skip body, and the
//! redaction that keeps AWS ids out of them. Pure.

use flightlock::error::HeldBy;

/// `errorType` of the invocation error posted when the key is busy and `FLIGHTLOCK_ON_BUSY=error`.
pub const BUSY_ERROR_TYPE: &str = "FlightlockBusy";
/// `errorType` when the key template cannot be rendered from the event.
pub const KEY_ERROR_TYPE: &str = "FlightlockKeyError";
/// `errorType` when the invocation's tick cannot be found (`FLIGHTLOCK_TICK`: a template that
/// does not match the event, a scheduled event whose `time` is not a timestamp) or cannot be
/// checked (`FLIGHTLOCK_STALE_AFTER` with a tick id, which has no age).
pub const TICK_ERROR_TYPE: &str = "FlightlockTickError";
/// `errorType` when the lock could not be taken for another reason (DynamoDB unreachable, ...).
pub const LOCK_ERROR_TYPE: &str = "FlightlockLockError";
/// `errorType` when the key runs a newer flightlock protocol than this layer speaks (see
/// [`flightlock::PROTOCOL`]): the invocation fails whatever `FLIGHTLOCK_ON_BUSY` says, so Lambda's
/// retries apply once every participant is upgraded. Never a skip.
pub const PROTOCOL_ERROR_TYPE: &str = "FlightlockProtocolTooNew";
/// `errorType` when the key allows a different number of holders at a time than this layer's
/// `FLIGHTLOCK_PERMITS` ([`flightlock::Error::PermitsMismatch`]): the invocation fails whatever
/// `FLIGHTLOCK_ON_BUSY` says, so Lambda's retries apply once the function (or the key) is
/// reconfigured. Never a skip.
pub const PERMITS_ERROR_TYPE: &str = "FlightlockPermitsMismatch";
/// `errorType` when the extension could not read an event from the Runtime API: the invocation
/// is failed rather than handed to the runtime unlocked or incomplete.
pub const EVENT_ERROR_TYPE: &str = "FlightlockEventError";
/// `errorType` when the invocation's client context cannot be read with certainty
/// ([`crate::client_context::Unreadable`]): the invocation fails before the lock is
/// taken, whatever `FLIGHTLOCK_ON_BUSY` says, so no entry a caller forged can reach the handler.
pub const CONTEXT_ERROR_TYPE: &str = "FlightlockClientContextInvalid";

/// Replaces ARNs (`arn:...`) and 12-digit AWS account ids in `message` with `<arn>` and
/// `<account-id>`, for error bodies returned to callers: AWS error messages (access denied, ...)
/// name roles and resources, which belong in the function's logs, not in a caller's hands. Pure.
pub fn redact_aws_ids(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    let mut prev: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let boundary = !prev.is_some_and(|p| p.is_ascii_alphanumeric());
        if boundary && rest.starts_with("arn:") {
            let end = rest
                .find(|c: char| {
                    c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ',' | ')' | ']' | '}' | '>')
                })
                .unwrap_or(rest.len());
            out.push_str("<arn>");
            prev = Some('>');
            rest = &rest[end..];
            continue;
        }
        if c.is_ascii_digit() && boundary {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if end == 12 {
                out.push_str("<account-id>");
            } else {
                out.push_str(&rest[..end]);
            }
            prev = Some('0');
            rest = &rest[end..];
            continue;
        }
        out.push(c);
        prev = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Why an invocation was answered with a success body without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The key stayed held for the whole wait (`FLIGHTLOCK_ON_BUSY=skip`).
    Busy,
    /// The invocation's tick already ran successfully (a duplicate delivery or a retry).
    Duplicate,
    /// The invocation's tick is older than `FLIGHTLOCK_STALE_AFTER`.
    Stale,
    /// A newer tick replaced this waiting invocation (`FLIGHTLOCK_COALESCE=on`).
    Superseded,
}

impl SkipReason {
    /// The `reason` field of the skip body.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Busy => "busy",
            SkipReason::Duplicate => "duplicate",
            SkipReason::Stale => "stale",
            SkipReason::Superseded => "superseded",
        }
    }
}

/// The success body answered for a skipped invocation:
/// `{"flightlock":{"skipped":true,"reason":"busy","key":"...","tick":"..." | null,"heldBy":{...} | null}}`.
/// `tick` is the invocation's tick (an ordered one as RFC 3339 UTC), `heldBy` the (first) holder
/// of a busy key when known, and `holders` every holder known (a key with more than one permit
/// has up to that many), in ticket order.
pub fn skipped_body(
    reason: SkipReason,
    key: &str,
    tick: Option<&str>,
    holders: &[HeldBy],
) -> serde_json::Value {
    serde_json::json!({
        "flightlock": {
            "skipped": true,
            "reason": reason.as_str(),
            "key": key,
            "tick": tick,
            "heldBy": holders.first(),
            "holders": holders,
        }
    })
}

/// The invocation error body (Runtime API shape: `errorMessage`, `errorType`).
pub fn error_body(error_type: &str, message: &str) -> serde_json::Value {
    serde_json::json!({ "errorMessage": message, "errorType": error_type })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_ids_are_kept_out_of_error_bodies() {
        let msg = "access denied calling dynamodb:PutItem on `locks`: User: \
                   arn:aws:sts::123456789012:assumed-role/r/f is not authorized to perform: \
                   dynamodb:PutItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/locks \
                   (account 123456789012, request 9876543210123, key job-42)";
        let r = redact_aws_ids(msg);
        assert!(!r.contains("123456789012") && !r.contains("arn:"), "{r}");
        assert!(
            r.contains("User: <arn> is not authorized")
                && r.contains("resource: <arn> (account <account-id>, request 9876543210123"),
            "{r}"
        );
        assert!(
            r.contains("dynamodb:PutItem on `locks`") && r.contains("key job-42"),
            "{r}"
        );
        // Words that merely contain "arn:" are left alone.
        assert_eq!(redact_aws_ids("yarn: ok"), "yarn: ok");
    }

    #[test]
    fn bodies_have_the_documented_shape() {
        let b = skipped_body(SkipReason::Busy, "k", None, &[]);
        assert_eq!(
            b,
            serde_json::json!({"flightlock": {
                "skipped": true, "reason": "busy", "key": "k", "tick": null, "heldBy": null,
                "holders": []
            }})
        );
        // Every holder of a key of more than one permit, in ticket order; heldBy is the first.
        let held = |ticket: u64, request: &str| HeldBy {
            ticket,
            owner: format!("o{ticket}"),
            info: flightlock::HolderInfo {
                function: Some("f".into()),
                request_id: Some(request.into()),
                host: None,
            },
        };
        let b = skipped_body(SkipReason::Busy, "k", None, &[held(3, "r3"), held(5, "r5")]);
        let f = &b["flightlock"];
        assert_eq!(f["heldBy"]["ticket"], 3);
        assert_eq!(f["holders"][0], f["heldBy"]);
        assert_eq!(f["holders"][1]["ticket"], 5);
        assert_eq!(f["holders"][1]["requestId"], "r5");
        assert_eq!(f["holders"].as_array().map(Vec::len), Some(2));
        for (reason, word) in [
            (SkipReason::Duplicate, "duplicate"),
            (SkipReason::Stale, "stale"),
            (SkipReason::Superseded, "superseded"),
        ] {
            let b = skipped_body(reason, "k", Some("2026-11-24T10:00:00.000Z"), &[]);
            assert_eq!(b["flightlock"]["reason"], word);
            assert_eq!(b["flightlock"]["tick"], "2026-11-24T10:00:00.000Z");
        }
        let e = error_body(BUSY_ERROR_TYPE, "busy");
        assert_eq!(e["errorType"], "FlightlockBusy");
    }
}
