use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn ours() -> LockContext {
    LockContext {
        ticket: 42,
        key: "nightly-report".to_owned(),
        waited_ms: 17,
        tick: Some("2026-11-24T10:00:00.000Z".to_owned()),
        permits: 1,
    }
}

fn read_one(caller: &[u8]) -> Result<CallerContext, Unreadable> {
    read(Some(caller))
}

/// Reads `caller` as one header and merges `ours` into it.
fn merge(caller: Option<&[u8]>, ours: &LockContext) -> Result<Merged, Unreadable> {
    Ok(read(caller)?.merge(Some(ours)))
}

fn header(m: Result<Merged, Unreadable>) -> (Value, String, Vec<&'static str>, usize) {
    let m = m.unwrap_or_else(|why| panic!("refused: {why}"));
    (
        serde_json::from_str(&m.value).expect("merged context is JSON"),
        m.value,
        m.omitted,
        m.removed,
    )
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
    let h = LockContext {
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
    let h = LockContext {
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
    // Names this invocation does not write itself (no tick, one permit) are removed too: a
    // forged one must not pass for ours. And escapes spell the same names.
    let h = LockContext {
        tick: None,
        ..ours()
    };
    let caller =
        br#"{"custom":{"flightlockTick":"t","flightlockPermits":"1","\u0066lightlock\u0054icket":"9"}}"#;
    let (v, _, _, removed) = header(merge(Some(caller), &h));
    assert_eq!(removed, 3);
    assert_eq!(
        v["custom"],
        json!({"flightlockTicket": "42", "flightlockWaitedMs": "17", "flightlockKey": "nightly-report"})
    );
}

#[test]
fn a_context_that_cannot_be_read_with_certainty_is_refused() {
    let deep = |n: usize| format!(r#"{{"x":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
    for bad in [
        &b"not json"[..],
        b"[1,2]",
        b"\"s\"",
        b"{\"a\":",
        b"{} {}",
        b"\xff\xfe",
        b"{\"custom\":{\"a\":\"\xff\"}}",
        // Lone surrogates: JSON.parse and json.loads read them, serde_json does not.
        br#"{"custom":{"\udc00":"","flightlockTicket":"999999999"}}"#,
        br#"{"\ud800":1,"custom":{"flightlockTicket":"9"}}"#,
        // Deeper than serde_json's 128 levels, which JSON.parse reads.
        deep(200).as_bytes(),
        // A number beyond f64 (JSON.parse reads Infinity), in any value.
        br#"{"env":{"n":1e999},"custom":{"flightlockTicket":"9"}}"#,
        // Comments and trailing commas some parsers take.
        br#"{"custom":{"flightlockTicket":"9"},}"#,
        b"{/*c*/\"custom\":{}}",
    ] {
        assert!(
            matches!(read_one(bad), Err(Unreadable::NotAnObject(_))),
            "{}: {:?}",
            String::from_utf8_lossy(bad),
            read_one(bad)
        );
    }
    assert!(read_one(deep(100).as_bytes()).is_ok());
    assert_eq!(
        read_one(br#"{"custom":"text"}"#),
        Err(Unreadable::CustomNotAnObject)
    );
    assert_eq!(
        read_one(br#"{"custom":[{"flightlockTicket":"9"}]}"#),
        Err(Unreadable::CustomNotAnObject)
    );
    let (v, ..) = header(merge(Some(br#"{"custom":null,"env":{}}"#), &ours()));
    assert_eq!(v["custom"][TICKET], "42");
    assert_eq!(v["env"], json!({}));
    // Two headers, one of them empty: still two.
    assert_eq!(
        read([&b""[..], &br#"{"custom":{"flightlockTicket":"9"}}"#[..]]),
        Err(Unreadable::Repeated)
    );
    let why = read_one(b"nope").unwrap_err().to_string();
    assert!(
        why.starts_with("the client context is not one JSON object"),
        "{why}"
    );
}

#[test]
fn a_name_given_twice_is_refused_whichever_parser_keeps_which() {
    for (bad, name) in [
        // A first-wins parser would read the forged custom, a last-wins one the other.
        (
            &br#"{"custom":{"flightlockTicket":"9"},"custom":{"a":"b"}}"#[..],
            "custom",
        ),
        (br#"{"custom":{"a":"1","a":"2"}}"#, "a"),
        (
            br#"{"custom":{"flightlockTicket":"9","flightlock\u0054icket":"8"}}"#,
            "flightlockTicket",
        ),
        (br#"{"\u0063ustom":{},"custom":{}}"#, "custom"),
    ] {
        assert_eq!(
            read_one(bad),
            Err(Unreadable::DuplicateName(name.to_owned())),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let why = Unreadable::DuplicateName("a\"b".to_owned()).to_string();
    assert!(why.contains(r#""a\"b" twice"#), "{why}");
    // Twice inside a value of the caller's: not ours to judge, handed on as it came.
    let (_, text, ..) = header(merge(Some(br#"{"env":{"a":1,"a":2}}"#), &ours()));
    assert!(text.contains(r#"{"a":1,"a":2}"#), "{text}");
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
fn a_context_at_or_over_the_limit_gets_nothing_but_loses_forged_entries() {
    let caller = caller_of_len(MAX_JSON, "");
    let (v, text, omitted, removed) = header(merge(Some(caller.as_bytes()), &ours()));
    assert_eq!(text, caller, "written anew, the same text");
    assert_eq!((omitted.len(), removed), (4, 0));
    assert!(v["custom"].get(TICKET).is_none(), "{v}");
    for len in [MAX_JSON, MAX_JSON + 1, MAX_JSON + 2000] {
        for forged in [
            r#""flightlockTicket":"9","#,
            r#""flightlockTick":"t","flightlockKey":"k","#,
        ] {
            let caller = caller_of_len(len, forged);
            let (v, text, _, removed) = header(merge(Some(caller.as_bytes()), &ours()));
            assert!(removed >= 1, "{len} {forged}");
            let ours: HashMap<_, _> = ours().entries().into_iter().collect();
            for (name, value) in reserved_entries(&text) {
                assert_eq!(
                    ours.get(name.as_str()),
                    Some(&value),
                    "a forged entry survived at {len} bytes: {v}"
                );
            }
            assert!(v["custom"]["pad"].as_str().is_some_and(|p| !p.is_empty()));
        }
    }
}

#[test]
fn the_limit_is_the_invoke_apis_in_base64() {
    let b64 = |n: usize| n.div_ceil(3) * 4;
    assert!(b64(MAX_JSON) <= INVOKE_CLIENT_CONTEXT_MAX);
    assert!(b64(MAX_JSON + 1) > INVOKE_CLIENT_CONTEXT_MAX);
}

#[test]
fn the_header_is_ascii_whatever_the_key() {
    let h = LockContext {
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
    // Names this invocation does not write are removed, not left for the handler to misread.
    let h = LockContext {
        tick: None,
        ..ours()
    };
    let mut custom = HashMap::from([
        (TICK.to_owned(), "forged".to_owned()),
        (PERMITS.to_owned(), "1".to_owned()),
        ("flightlockAnything".to_owned(), "x".to_owned()),
    ]);
    h.apply(&mut custom);
    assert!(
        custom
            .keys()
            .all(|k| h.entries().iter().any(|(n, _)| n == k)),
        "{custom:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The property: whatever bytes a caller sends, no `custom` entry named flightlock* that the
// handler could read is anything but ours. The merged text is read back by a lenient parser of
// the test's own (it takes lone surrogates and keeps every member of a name given twice, as
// JSON.parse, json.loads and first-wins parsers variously do), so the check does not lean on
// serde_json, the parser `read` uses.

/// A JSON value as a lenient parser reads it: every member kept, in order.
#[derive(Debug)]
enum Lenient {
    Object(Vec<(String, Lenient)>),
    /// Its items are parsed (to find where it ends) and not kept: no reserved entry is in one.
    Array,
    String(String),
    Other,
}

struct LenientParser<'a> {
    s: &'a [u8],
    at: usize,
}

impl LenientParser<'_> {
    fn parse(text: &str) -> Option<Lenient> {
        let mut p = LenientParser {
            s: text.as_bytes(),
            at: 0,
        };
        let v = p.value()?;
        p.ws();
        (p.at == p.s.len()).then_some(v)
    }
    fn ws(&mut self) {
        while self.s.get(self.at).is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }
    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.at) == Some(&b)).then(|| self.at += 1)
    }
    fn value(&mut self) -> Option<Lenient> {
        self.ws();
        match *self.s.get(self.at)? {
            b'{' => {
                self.at += 1;
                let mut members = Vec::new();
                if self.eat(b'}').is_some() {
                    return Some(Lenient::Object(members));
                }
                loop {
                    self.ws();
                    let name = self.string()?;
                    self.eat(b':')?;
                    members.push((name, self.value()?));
                    if self.eat(b',').is_none() {
                        self.eat(b'}')?;
                        return Some(Lenient::Object(members));
                    }
                }
            }
            b'[' => {
                self.at += 1;
                if self.eat(b']').is_some() {
                    return Some(Lenient::Array);
                }
                loop {
                    self.value()?;
                    if self.eat(b',').is_none() {
                        self.eat(b']')?;
                        return Some(Lenient::Array);
                    }
                }
            }
            b'"' => self.string().map(Lenient::String),
            _ => {
                let start = self.at;
                while self
                    .s
                    .get(self.at)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b))
                {
                    self.at += 1;
                }
                (self.at > start).then_some(Lenient::Other)
            }
        }
    }
    /// A string, lone surrogates read as U+FFFD.
    fn string(&mut self) -> Option<String> {
        (self.s.get(self.at) == Some(&b'"')).then_some(())?;
        self.at += 1;
        let mut units: Vec<u16> = Vec::new();
        let mut raw: Vec<u8> = Vec::new();
        let flush = |raw: &mut Vec<u8>, units: &mut Vec<u16>| {
            units.extend(String::from_utf8_lossy(raw).encode_utf16());
            raw.clear();
        };
        loop {
            match *self.s.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    flush(&mut raw, &mut units);
                    return Some(String::from_utf16_lossy(&units));
                }
                b'\\' => {
                    flush(&mut raw, &mut units);
                    let e = *self.s.get(self.at + 1)?;
                    self.at += 2;
                    let unit = match e {
                        b'u' => {
                            let hex =
                                std::str::from_utf8(self.s.get(self.at..self.at + 4)?).ok()?;
                            self.at += 4;
                            u16::from_str_radix(hex, 16).ok()?
                        }
                        b'n' => 10,
                        b't' => 9,
                        b'r' => 13,
                        b'b' => 8,
                        b'f' => 12,
                        other => u16::from(other),
                    };
                    units.push(unit);
                }
                b => {
                    raw.push(b);
                    self.at += 1;
                }
            }
        }
    }
}

/// Every value any parser could read for `custom`'s reserved names in `text`.
fn reserved_entries(text: &str) -> Vec<(String, String)> {
    let Some(Lenient::Object(top)) = LenientParser::parse(text) else {
        panic!("the merged context is not a JSON object to a lenient parser: {text}");
    };
    let mut found = Vec::new();
    for (name, value) in &top {
        // Go's encoding/json fills `ClientContext.Custom` from every member whose name folds to
        // it, merging them; read them all, as it does.
        if reads_as(name, "custom") {
            let Lenient::Object(custom) = value else {
                panic!("custom is not an object: {text}")
            };
            for (entry, value) in custom {
                if entry.starts_with(PREFIX) || is_reserved(entry) {
                    let value = match value {
                        Lenient::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    found.push((entry.clone(), value));
                }
            }
        }
    }
    found
}

/// A random piece of a hostile client context.
fn hostile(rng: &mut StdRng, depth: u32) -> String {
    const NAMES: &[&str] = &[
        "flightlockTicket",
        "flightlock\\u0054icket",
        "\\u0066lightlockTicket",
        "flightlockTick",
        "flightlockPermits",
        "flightlockKey",
        "flightlockX",
        "custom",
        "\\u0063ustom",
        "Custom",
        "CUSTOM",
        "cu\u{17f}tom",
        "cu\\u017ftom",
        "\\u0043ustom",
        "FlightlockTicket",
        "client",
        "env",
        "a",
        "\\udc00",
        "\\ud800",
        "na\u{ef}ve",
        "",
    ];
    const SCALARS: &[&str] = &[
        "\"999999999\"",
        "\"1\"",
        "1e999",
        "-0",
        "12345678901234567890123",
        "null",
        "true",
        "\"\\udc00\"",
        "\"\u{fc}\"",
        "\"\"",
    ];
    let ws = |rng: &mut StdRng| if rng.random_bool(0.2) { " \n" } else { "" };
    match rng.random_range(0..10) {
        0..=4 if depth < 4 => {
            let n = rng.random_range(0..5);
            let members: Vec<String> = (0..n)
                .map(|_| {
                    let name = NAMES[rng.random_range(0..NAMES.len())];
                    let value = hostile(rng, depth + 1);
                    format!("{}\"{name}\"{}:{}", ws(rng), ws(rng), value)
                })
                .collect();
            format!("{{{}}}", members.join(","))
        }
        5 if depth < 4 => {
            let n = rng.random_range(0..3);
            let items: Vec<String> = (0..n).map(|_| hostile(rng, depth + 1)).collect();
            format!("[{}]", items.join(","))
        }
        6 if rng.random_bool(0.1) => format!("{}1{}", "[".repeat(150), "]".repeat(150)),
        _ => SCALARS[rng.random_range(0..SCALARS.len())].to_owned(),
    }
}

#[test]
fn no_forged_entry_survives_whatever_the_bytes() {
    let h = LockContext {
        tick: None,
        ..ours()
    };
    let ours_now: HashMap<&str, String> = h.entries().into_iter().collect();
    let mut rng = StdRng::seed_from_u64(36);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..4000 {
        // An object with a `custom` full of candidates, or anything at all.
        let mut text = if rng.random_bool(0.7) {
            format!(
                "{{\"custom\":{},\"client\":{}}}",
                hostile(&mut rng, 1),
                hostile(&mut rng, 2)
            )
        } else {
            hostile(&mut rng, 0)
        };
        if rng.random_bool(0.1) && !text.is_empty() {
            let at = rng.random_range(0..text.len());
            if text.is_char_boundary(at) {
                text.insert(at, ['"', '\\', '}', '\u{0}'][rng.random_range(0..4)]);
            }
        }
        let mut bytes = text.into_bytes();
        if rng.random_bool(0.05) {
            let at = rng.random_range(0..=bytes.len());
            bytes.insert(at, 0xff);
        }
        match merge(Some(&bytes), &h) {
            Err(_) => refused += 1,
            Ok(m) => {
                accepted += 1;
                serde_json::from_str::<Value>(&m.value).unwrap_or_else(|e| {
                    panic!("case {case}: strict JSON expected ({e}): {}", m.value)
                });
                for (name, value) in reserved_entries(&m.value) {
                    assert_eq!(
                        ours_now.get(name.as_str()),
                        Some(&value),
                        "case {case}: {name}={value} reached the handler from {}\nmerged: {}",
                        String::from_utf8_lossy(&bytes),
                        m.value
                    );
                }
            }
        }
    }
    // The generator exercises both sides.
    assert!(
        accepted > 500 && refused > 500,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn without_a_lock_context_the_callers_reserved_entries_still_go() {
    // FLIGHTLOCK_GATE=off: nothing of ours is added, and nothing forged is handed on.
    let caller = br#"{"custom":{"flightlockTicket":"999","a":"b"},"env":{"x":"y"}}"#;
    let merged = read(Some(&caller[..])).unwrap().merge(None);
    let v: Value = serde_json::from_str(&merged.value).unwrap();
    assert_eq!(v["custom"], serde_json::json!({"a": "b"}), "{v}");
    assert_eq!(v["env"]["x"], "y");
    assert_eq!(merged.removed, 1);
}

#[test]
fn a_name_a_case_insensitive_reader_takes_for_custom_is_refused() {
    // Each was seen to reach an aws-lambda-go handler's ClientContext.Custom (issue 42).
    for caller in [
        r#"{"Custom":{"flightlockTicket":"999999999"}}"#,
        r#"{"CUSTOM":{"a":"b"}}"#,
        "{\"cu\u{17f}tom\":{\"flightlockTicket\":\"999999999\"}}",
        r#"{"cu\u017ftom":{"flightlockTicket":"999999999"}}"#,
        r#"{"custom":{"a":"b"},"Custom":{"flightlockPermits":"7","flightlockTick":"x"}}"#,
        r#"{"custom":{},"cu\u017Ftom":null}"#,
    ] {
        match read_one(caller.as_bytes()) {
            Err(Unreadable::LookalikeName(name)) => {
                assert_ne!(name, "custom");
                assert!(reads_as(&name, "custom"), "{name}");
            }
            other => panic!("{caller}: expected a refusal, got {other:?}"),
        }
    }
    // The padded form: a `Custom` that fills the Invoke API's limit, leaving no room for ours.
    let padded = format!(
        r#"{{"Custom":{{"flightlockTicket":"999999999","pad":"{}"}}}}"#,
        "x".repeat(MAX_JSON)
    );
    assert!(matches!(
        read_one(padded.as_bytes()),
        Err(Unreadable::LookalikeName(_))
    ));
    // Names that only look alike to a person are the caller's own.
    for caller in [
        r#"{"customs":{}}"#,
        r#"{"cust0m":{}}"#,
        r#"{"client":{"custom":"x"}}"#,
    ] {
        assert!(read_one(caller.as_bytes()).is_ok(), "{caller}");
    }
}

#[test]
fn reads_as_covers_every_folding_the_readers_apply() {
    for (name, ascii) in [
        ("custom", "custom"),
        ("CuStOm", "custom"),
        ("cu\u{17f}tom", "custom"), // ſ: Go's simple folding, .NET and Java upper case
        ("\u{212a}ey", "key"),      // Kelvin sign: Go's simple folding, lower case
        ("cl\u{131}ent", "client"), // dotless ı: .NET's ToUpperInvariant
        ("FLIGHTLOCK", "flightlock"),
    ] {
        assert!(reads_as(name, ascii), "{name} / {ascii}");
    }
    for (name, ascii) in [
        ("custo", "custom"),
        ("customs", "custom"),
        ("cu\u{17f}\u{17f}om", "custom"),
        ("c\u{fc}stom", "custom"),
        ("cl\u{130}ent", "client"), // İ lower-cases to two characters
    ] {
        assert!(!reads_as(name, ascii), "{name} / {ascii}");
    }
    assert!(is_reserved("FlightLockTicket"));
    assert!(is_reserved("flightlock"));
    assert!(!is_reserved("flight"));
    assert!(is_reserved("flightloc\u{212a}")); // the Kelvin sign folds to k
}

#[test]
fn reserved_look_alikes_inside_custom_are_removed() {
    let caller = br#"{"custom":{"FlightlockTicket":"9","FLIGHTLOCKKEY":"k","a":"b"}}"#;
    let merged = read(Some(&caller[..])).unwrap().merge(None);
    let v: Value = serde_json::from_str(&merged.value).unwrap();
    assert_eq!(v["custom"], json!({"a": "b"}), "{v}");
    assert_eq!(merged.removed, 2);
}
