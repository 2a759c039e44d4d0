//! The handler's view of its lock: the ticket, key, wait and tick merged into the event's
//! `Lambda-Runtime-Client-Context` header before the runtime gets it (the merge itself, and
//! what it keeps of the caller's context, is [`flightlock_lambda::client_context`]).

use flightlock_lambda::client_context::{merge, Handover, Merged, CLIENT_CONTEXT_HEADER};
use http::{HeaderMap, HeaderValue};

/// Puts `handover` into the client context header of an event's `headers`. Whatever is left
/// out (no room within the Invoke API's limit, a caller context that is not a JSON object) is
/// logged as a warning on the current span; the event is handed over either way.
pub(super) fn hand_over(headers: &mut HeaderMap, handover: &Handover) {
    let caller = headers
        .get(CLIENT_CONTEXT_HEADER)
        .map(HeaderValue::as_bytes);
    match merge(caller, handover) {
        Merged::Header {
            value,
            omitted,
            removed,
        } => {
            if removed > 0 {
                tracing::warn!(
                    removed,
                    "the caller's client context had `custom` entries named flightlock*; \
                     they were removed (those names are flightlock's)"
                );
            }
            if !omitted.is_empty() {
                tracing::warn!(
                    omitted = ?omitted,
                    "the caller's client context leaves too little room within the Invoke \
                     API's 3583-byte limit: these entries are not in the handler's client context"
                );
            }
            match HeaderValue::from_bytes(value.as_bytes()) {
                Ok(v) => {
                    headers.insert(CLIENT_CONTEXT_HEADER, v);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "the merged client context is not a valid header value; the caller's is \
                     passed on unchanged and the handler gets no flightlock entries"
                ),
            }
        }
        Merged::Unchanged(why) => tracing::warn!(
            reason = %why,
            "the handler gets no flightlock entries in its client context; the caller's is \
             passed on unchanged"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> Handover {
        Handover {
            ticket: 7,
            key: "k".to_owned(),
            waited_ms: 0,
            tick: None,
            permits: 1,
        }
    }

    #[test]
    fn the_header_is_added_or_replaced_and_other_headers_stay() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Lambda-Runtime-Aws-Request-Id",
            HeaderValue::from_static("r1"),
        );
        hand_over(&mut headers, &ours());
        let v: serde_json::Value =
            serde_json::from_slice(headers[CLIENT_CONTEXT_HEADER].as_bytes()).unwrap();
        assert_eq!(v["custom"]["flightlockTicket"], "7");
        assert_eq!(headers["Lambda-Runtime-Aws-Request-Id"], "r1");

        headers.insert(
            CLIENT_CONTEXT_HEADER,
            HeaderValue::from_static(r#"{"env":{"a":"b"}}"#),
        );
        hand_over(&mut headers, &ours());
        assert_eq!(headers.get_all(CLIENT_CONTEXT_HEADER).iter().count(), 1);
        let v: serde_json::Value =
            serde_json::from_slice(headers[CLIENT_CONTEXT_HEADER].as_bytes()).unwrap();
        assert_eq!(v["env"]["a"], "b");
        assert_eq!(v["custom"]["flightlockKey"], "k");
    }

    #[test]
    fn a_caller_context_that_is_not_json_is_passed_on_as_it_came() {
        let mut headers = HeaderMap::new();
        headers.insert(CLIENT_CONTEXT_HEADER, HeaderValue::from_static("not json"));
        hand_over(&mut headers, &ours());
        assert_eq!(headers[CLIENT_CONTEXT_HEADER], "not json");
    }
}
