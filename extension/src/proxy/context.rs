//! The handler's view of its lock: the ticket, key, wait and tick merged into the event's
//! `Lambda-Runtime-Client-Context` header before the runtime gets it (reading the caller's
//! context, and what is kept of it, is [`flightlock_lambda::client_context`]).

use flightlock_lambda::client_context::{
    read, CallerContext, LockContext, Unreadable, CLIENT_CONTEXT_HEADER,
};
use http::{HeaderMap, HeaderValue};

/// Reads the caller's client context from an event's `headers`, before the lock is taken: an
/// [`Unreadable`] one fails the invocation (the caller's entries could not be removed with
/// certainty).
pub(super) fn caller(headers: &HeaderMap) -> Result<CallerContext, Unreadable> {
    read(
        headers
            .get_all(CLIENT_CONTEXT_HEADER)
            .iter()
            .map(HeaderValue::as_bytes),
    )
}

/// Replaces the client context header of an event's `headers` with `caller`'s context and
/// `lock_context`'s entries (none when the invocation is not gated: the caller's are removed all
/// the same). Whatever is left out (no room within the Invoke API's limit) or removed
/// (a caller's `flightlock*` entries) is logged as a warning on the current span.
pub(super) fn write(
    headers: &mut HeaderMap,
    caller: &CallerContext,
    lock_context: Option<&LockContext>,
) {
    let merged = caller.merge(lock_context);
    if merged.removed > 0 {
        tracing::warn!(
            removed = merged.removed,
            "the caller's client context had `custom` entries named flightlock*; \
             they were removed (those names are flightlock's)"
        );
    }
    if !merged.omitted.is_empty() {
        tracing::warn!(
            omitted = ?merged.omitted,
            "the caller's client context leaves too little room within the Invoke \
             API's 3583-byte limit: these entries are not in the handler's client context"
        );
    }
    match HeaderValue::from_bytes(merged.value.as_bytes()) {
        Ok(v) => {
            headers.insert(CLIENT_CONTEXT_HEADER, v);
        }
        // Unreachable for text `merge` writes (names ASCII-escaped, the caller's values were a
        // header's bytes), but never hand on the caller's header: send none.
        Err(e) => {
            tracing::error!(
                error = %e,
                "the merged client context is not a valid header value; the handler gets no \
                 client context"
            );
            headers.remove(CLIENT_CONTEXT_HEADER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours() -> LockContext {
        LockContext {
            ticket: 7,
            key: "k".to_owned(),
            waited_ms: 0,
            tick: None,
            permits: 1,
        }
    }

    fn written(headers: &mut HeaderMap) -> Result<serde_json::Value, Unreadable> {
        let caller = caller(headers)?;
        write(headers, &caller, Some(&ours()));
        assert_eq!(headers.get_all(CLIENT_CONTEXT_HEADER).iter().count(), 1);
        Ok(serde_json::from_slice(headers[CLIENT_CONTEXT_HEADER].as_bytes()).unwrap())
    }

    #[test]
    fn the_header_is_added_or_replaced_and_other_headers_stay() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Lambda-Runtime-Aws-Request-Id",
            HeaderValue::from_static("r1"),
        );
        let v = written(&mut headers).unwrap();
        assert_eq!(v["custom"]["flightlockTicket"], "7");
        assert_eq!(headers["Lambda-Runtime-Aws-Request-Id"], "r1");

        headers.insert(
            CLIENT_CONTEXT_HEADER,
            HeaderValue::from_static(r#"{"env":{"a":"b"},"custom":{"flightlockTick":"t"}}"#),
        );
        let v = written(&mut headers).unwrap();
        assert_eq!(v["env"]["a"], "b");
        assert_eq!(v["custom"]["flightlockKey"], "k");
        assert!(v["custom"].get("flightlockTick").is_none(), "{v}");
    }

    #[test]
    fn a_context_that_cannot_be_read_with_certainty_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(CLIENT_CONTEXT_HEADER, HeaderValue::from_static("not json"));
        assert!(matches!(
            written(&mut headers),
            Err(Unreadable::NotAnObject(_))
        ));
        // Two headers: which one a runtime client reads is not ours to guess.
        let mut headers = HeaderMap::new();
        headers.append(CLIENT_CONTEXT_HEADER, HeaderValue::from_static("{}"));
        headers.append(
            CLIENT_CONTEXT_HEADER,
            HeaderValue::from_static(r#"{"custom":{"flightlockTicket":"9"}}"#),
        );
        assert_eq!(written(&mut headers), Err(Unreadable::Repeated));
    }
}
