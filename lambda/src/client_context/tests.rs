use super::*;
use serde_json::{json, Value};

fn ours() -> Handover {
    Handover {
        ticket: 42,
        key: "nightly-report".to_owned(),
        waited_ms: 17,
        tick: Some("2026-11-24T10:00:00.000Z".to_owned()),
        permits: 1,
    }
}

fn header(m: Merged) -> (Value, String, Vec<&'static str>, usize) {
    match m {
        Merged::Header {
            value,
            omitted,
            removed,
        } => (
            serde_json::from_str(&value).expect("merged context is JSON"),
            value,
            omitted,
            removed,
        ),
        Merged::Unchanged(why) => panic!("unchanged: {why}"),
    }
}

#[test]
fn without_a_caller_context_only_ours_is_sent() {
    let m = merge(None, &ours());
    let (v, _, omitted, removed) = header(m.clone());
    assert_eq!(
        v,
        json!({"custom": {
            "flightlockTicket": "42",
            "flightlockWaitedMs": "17",
            "flightlockTick": "2026-11-24T10:00:00.000Z",
            "flightlockKey": "nightly-report",
        }})
    );
    assert!(omitted.is_empty());
    assert_eq!(removed, 0);
    assert_eq!(
        merge(Some(b"  "), &ours()),
        m,
        "an empty header counts as none"
    );
}

#[test]
fn permits_are_handed_over_only_when_more_than_one() {
    let (v, ..) = header(merge(None, &ours()));
    assert!(v["custom"].get(PERMITS).is_none(), "{v}");
    let h = Handover {
        permits: 4,
        ..ours()
    };
    let (v, ..) = header(merge(None, &h));
    assert_eq!(v["custom"][PERMITS], "4");
    // Kept right after the ticket when room is short: it says what the ticket means.
    let names: Vec<_> = h.entries().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[..2], [TICKET, PERMITS]);
}

#[test]
fn no_tick_no_tick_entry() {
    let h = Handover {
        tick: None,
        ..ours()
    };
    let (v, ..) = header(merge(None, &h));
    assert!(v["custom"].get(TICK).is_none(), "{v}");
    assert_eq!(v["custom"][TICKET], "42");
}

#[test]
fn the_callers_context_is_kept_as_it_was_sent() {
    let caller = r#"{"client":{"installation_id":"i-1","app_title":"App"},
        "custom":{"tenant":"acme","n":12345678901234567890123, "nested":{"a":[1, 2.50]}},
        "env":{"locale":"en_GB","x":1.0e2}}"#;
    let (v, text, ..) = header(merge(Some(caller.as_bytes()), &ours()));
    // Each value of the caller's keeps its exact text (spacing, number forms).
    for raw in [
        r#"{"installation_id":"i-1","app_title":"App"}"#,
        r#"{"locale":"en_GB","x":1.0e2}"#,
        r#""acme""#,
        "12345678901234567890123",
        r#"{"a":[1, 2.50]}"#,
    ] {
        assert!(text.contains(raw), "{raw} missing from {text}");
    }
    assert_eq!(v["custom"]["tenant"], "acme");
    assert_eq!(v["custom"][TICKET], "42");
    assert_eq!(v["client"]["app_title"], "App");
}

#[test]
fn a_callers_reserved_entries_never_reach_the_handler() {
    let caller = br#"{"custom":{"flightlockTicket":"999999","flightlockOther":"x","mine":"y"}}"#;
    let (v, _, _, removed) = header(merge(Some(caller), &ours()));
    assert_eq!(removed, 2);
    assert_eq!(v["custom"][TICKET], "42");
    assert!(v["custom"].get("flightlockOther").is_none(), "{v}");
    assert_eq!(v["custom"]["mine"], "y");
}

#[test]
fn a_context_that_is_not_an_object_is_left_alone() {
    for bad in [
        &b"not json"[..],
        b"[1,2]",
        b"\"s\"",
        b"{\"a\":",
        b"\xff\xfe",
    ] {
        assert_eq!(
            merge(Some(bad), &ours()),
            Merged::Unchanged(Unchanged::NotAnObject),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        merge(Some(br#"{"custom":"text"}"#), &ours()),
        Merged::Unchanged(Unchanged::CustomNotAnObject)
    );
    let (v, ..) = header(merge(Some(br#"{"custom":null,"env":{}}"#), &ours()));
    assert_eq!(v["custom"][TICKET], "42");
    assert_eq!(v["env"], json!({}));
}

/// A caller context of exactly `len` bytes of JSON.
fn caller_of_len(len: usize, extra: &str) -> String {
    let shell = format!(r#"{{"custom":{{{extra}"pad":""}}}}"#);
    let text = format!(
        r#"{{"custom":{{{extra}"pad":"{}"}}}}"#,
        "p".repeat(len - shell.len())
    );
    assert_eq!(text.len(), len);
    text
}

#[test]
fn entries_are_left_out_from_the_key_down_to_stay_within_the_limit() {
    // Room for the ticket and the wait, not for the tick and the key.
    let ticket_and_wait = r#","flightlockTicket":"42","flightlockWaitedMs":"17""#.len();
    let caller = caller_of_len(MAX_JSON - ticket_and_wait, "");
    let (v, text, omitted, _) = header(merge(Some(caller.as_bytes()), &ours()));
    assert_eq!(text.len(), MAX_JSON, "{text}");
    assert_eq!(omitted, [KEY, TICK]);
    assert_eq!(v["custom"][TICKET], "42");
    assert_eq!(v["custom"][WAITED_MS], "17");
    // One byte less room: only the ticket.
    let caller = caller_of_len(MAX_JSON - ticket_and_wait + 1, "");
    let (v, text, omitted, _) = header(merge(Some(caller.as_bytes()), &ours()));
    assert!(text.len() <= MAX_JSON);
    assert_eq!(omitted, [KEY, TICK, WAITED_MS]);
    assert_eq!(v["custom"][TICKET], "42");
}

#[test]
fn a_context_at_the_limit_gets_nothing_but_loses_forged_entries() {
    let caller = caller_of_len(MAX_JSON, "");
    assert_eq!(
        merge(Some(caller.as_bytes()), &ours()),
        Merged::Unchanged(Unchanged::NoRoom)
    );
    let caller = caller_of_len(MAX_JSON, r#""flightlockTicket":"9","#);
    let (v, text, omitted, removed) = header(merge(Some(caller.as_bytes()), &ours()));
    assert!(text.len() <= MAX_JSON);
    assert_eq!(removed, 1);
    assert_eq!(omitted.len(), 4);
    assert!(v["custom"].get(TICKET).is_none(), "{v}");
}

#[test]
fn the_limit_is_the_invoke_apis_in_base64() {
    let b64 = |n: usize| n.div_ceil(3) * 4;
    assert!(b64(MAX_JSON) <= INVOKE_CLIENT_CONTEXT_MAX);
    assert!(b64(MAX_JSON + 1) > INVOKE_CLIENT_CONTEXT_MAX);
}

#[test]
fn the_header_is_ascii_whatever_the_key() {
    let h = Handover {
        key: "tenant-é-日本-😀 \"q\" \\".to_owned(),
        ..ours()
    };
    // Names are re-escaped; the caller's values keep their bytes (Lambda sent them so).
    let caller = "{\"custom\":{\"naïve\":\"u\"}}";
    let (v, text, ..) = header(merge(Some(caller.as_bytes()), &h));
    assert!(text.bytes().all(|b| (b' '..=b'~').contains(&b)), "{text}");
    assert_eq!(v["custom"][KEY], h.key.as_str());
    assert_eq!(v["custom"]["naïve"], "u");
    let (_, text, ..) = header(merge(Some("{\"env\":\"ü\"}".as_bytes()), &h));
    assert!(text.contains("\"env\":\"ü\""), "{text}");
}

#[test]
fn apply_replaces_reserved_entries_in_a_parsed_map() {
    let mut custom = HashMap::from([
        ("flightlockTicket".to_owned(), "999".to_owned()),
        ("mine".to_owned(), "y".to_owned()),
    ]);
    ours().apply(&mut custom);
    assert_eq!(custom[TICKET], "42");
    assert_eq!(custom[KEY], "nightly-report");
    assert_eq!(custom["mine"], "y");
    assert_eq!(custom.len(), 5);
}
