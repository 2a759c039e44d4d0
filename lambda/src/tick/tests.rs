//! Finding the tick in real event shapes: EventBridge scheduled events (the repository's
//! `events/scheduled.json`), EventBridge Scheduler input built from its context attributes,
//! other events, and every way a tick can be wrong.

use super::{TickError, TickSource};
use flightlock::Tick;

/// The repository's sample scheduled event (an EventBridge rule's `Scheduled Event`).
const SCHEDULED: &str = include_str!("../../../events/scheduled.json");
/// The repository's sample keyed event: an EventBridge event that is not a scheduled one.
const KEYED: &str = include_str!("../../../events/keyed.json");
/// The repository's sample EventBridge Scheduler input, as the guide's Scheduler recipe writes it
/// (`{"tick":"<aws.scheduler.scheduled-time>","execution":"<aws.scheduler.execution-id>"}`)
/// once Scheduler has filled in the context attributes.
const SCHEDULER: &str = include_str!("../../../events/scheduler.json");

/// 2026-11-21T12:00:00Z, the `time` of `events/scheduled.json`, in epoch ms.
const SCHEDULED_AT: i64 = 1_795_262_400_000;

fn source(s: &str) -> TickSource {
    TickSource::parse(s).unwrap()
}

fn tick(s: &TickSource, event: &str) -> Result<Option<Tick>, TickError> {
    s.tick(event.as_bytes(), None)
}

#[test]
fn auto_takes_the_time_of_an_eventbridge_scheduled_event() {
    let auto = source("auto");
    assert_eq!(auto, TickSource::Auto);
    assert_eq!(tick(&auto, SCHEDULED), Ok(Some(Tick::At(SCHEDULED_AT))));
    // A duplicate delivery (same id, same time) and a retry carry the same tick; another
    // rule's event for the same minute too: the tick is the schedule's instant.
    let other_id = SCHEDULED.replace("53dc4d37", "00000000");
    assert_eq!(tick(&auto, &other_id), Ok(Some(Tick::At(SCHEDULED_AT))));
    // The fields in any order, compact, with other members of any type around them.
    let compact = r#"{"detail":{"time":"not this one"},"time":"2026-11-21T12:01:00Z",
        "resources":[{"a":[1,2,{"b":null}]}],"source":"aws.events","n":1.5,
        "detail-type":"Scheduled Event","ok":true,"none":null}"#;
    assert_eq!(
        tick(&auto, compact),
        Ok(Some(Tick::At(SCHEDULED_AT + 60_000)))
    );
}

#[test]
fn auto_gives_no_tick_for_any_other_event() {
    let auto = source("auto");
    for event in [
        KEYED,
        // Scheduler input: the user's own JSON, no source (the recipe sets FLIGHTLOCK_TICK).
        SCHEDULER,
        // Almost a scheduled event: another source, another detail-type, not strings.
        r#"{"source":"aws.events","detail-type":"Object Created","time":"2026-11-21T12:00:00Z"}"#,
        r#"{"source":"com.example","detail-type":"Scheduled Event","time":"2026-11-21T12:00:00Z"}"#,
        r#"{"source":["aws.events"],"detail-type":"Scheduled Event","time":"2026-11-21T12:00:00Z"}"#,
        r#"{"detail":{"source":"aws.events","detail-type":"Scheduled Event","time":"x"}}"#,
        // An array of the right strings is not an event with those fields.
        r#"["aws.events","Scheduled Event","2026-11-21T12:00:00Z"]"#,
        r#""aws.events""#,
        "42",
        "null",
        "",
        "not json at all",
        // Broken JSON after the fields: not an event, no tick (the key decides what it says).
        r#"{"source":"aws.events","detail-type":"Scheduled Event","time":"2026-11-21T12:00:00Z""#,
    ] {
        assert_eq!(tick(&auto, event), Ok(None), "{event}");
    }
}

#[test]
fn a_scheduled_event_without_a_usable_time_fails() {
    let auto = source("auto");
    let bad = SCHEDULED.replace("2026-11-21T12:00:00Z", "yesterday noon");
    let e = tick(&auto, &bad).unwrap_err();
    assert_eq!(
        e,
        TickError::NotATime {
            time: Some("yesterday noon".into())
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("RFC 3339") && msg.contains("FLIGHTLOCK_TICK"),
        "{msg}"
    );
    // Missing, null, or not a string.
    for time in ["", r#","time":null"#, r#","time":1795262400"#] {
        let event = format!(r#"{{"source":"aws.events","detail-type":"Scheduled Event"{time}}}"#);
        assert_eq!(
            tick(&auto, &event),
            Err(TickError::NotATime { time: None }),
            "{event}"
        );
    }
    // A date alone is not an instant.
    let day = SCHEDULED.replace("2026-11-21T12:00:00Z", "2026-11-21");
    assert!(matches!(tick(&auto, &day), Err(TickError::NotATime { .. })));
}

#[test]
fn off_never_reads_the_event() {
    let off = source("OFF");
    assert_eq!(off, TickSource::Off);
    assert!(!off.reads_event());
    assert_eq!(tick(&off, SCHEDULED), Ok(None));
    assert_eq!(tick(&off, "not json"), Ok(None));
}

#[test]
fn templates_render_times_as_ordered_ticks_and_anything_else_as_ids() {
    // EventBridge Scheduler: the recipe puts its context attributes into the input.
    let at = source("{/tick}");
    assert!(at.reads_event());
    assert_eq!(tick(&at, SCHEDULER), Ok(Some(Tick::At(SCHEDULED_AT))));
    let id = source("{/execution}");
    assert_eq!(
        tick(&id, SCHEDULER),
        Ok(Some(Tick::Id(
            "c9a4fb0f-4a3e-4cfe-8c0c-a5c5d0b4a2a7".into()
        )))
    );
    let scheduler = r#"{"detail":{"batchId":"b-17","n":42}}"#;
    assert_eq!(
        tick(&source("batch-{/detail/batchId}"), scheduler),
        Ok(Some(Tick::Id("batch-b-17".into())))
    );
    assert_eq!(
        tick(&source("{/detail/n}"), scheduler),
        Ok(Some(Tick::Id("42".into())))
    );
    // A template may read a scheduled event's time itself: the same tick as auto.
    assert_eq!(
        tick(&source("{/time}"), SCHEDULED),
        Ok(Some(Tick::At(SCHEDULED_AT)))
    );
    // The tenant id can be part of an id.
    let t = source("{tenant}-{/detail/batchId}");
    assert_eq!(
        t.tick(scheduler.as_bytes(), Some("blue")),
        Ok(Some(Tick::Id("blue-b-17".into())))
    );
}

#[test]
fn a_template_that_does_not_match_the_event_fails_naming_the_field() {
    let t = source("{/detail/batchId}");
    let e = tick(&t, KEYED).unwrap_err();
    assert_eq!(
        e,
        TickError::NoMatch {
            template: "{/detail/batchId}".into(),
            problem: "the event field /detail/batchId is missing or null".into(),
        }
    );
    assert!(e.to_string().contains("tick template"), "{e}");
    assert!(matches!(
        tick(&t, r#"{"detail":{"batchId":null}}"#),
        Err(TickError::NoMatch { .. })
    ));
    let e = tick(&t, r#"{"detail":{"batchId":{"a":1}}}"#).unwrap_err();
    assert!(e.to_string().contains("object or array"), "{e}");
    let e = tick(&t, "<xml/>").unwrap_err();
    assert!(e.to_string().contains("not JSON"), "{e}");
    let e = source("{tenant}").tick(b"{}", None).unwrap_err();
    assert!(e.to_string().contains("tenant"), "{e}");
    // Empty or too long for a tick id.
    assert!(matches!(
        tick(&t, r#"{"detail":{"batchId":""}}"#),
        Err(TickError::Invalid { .. })
    ));
    let long = format!(r#"{{"detail":{{"batchId":"{}"}}}}"#, "x".repeat(600));
    let e = tick(&t, &long).unwrap_err();
    assert!(
        matches!(&e, TickError::Invalid { problem, .. } if problem.contains("600 bytes")),
        "{e}"
    );
}

#[test]
fn bad_sources_are_refused_with_the_problem() {
    for (value, problem) in [
        ("{detail}", "JSON"),
        ("{/a", "unclosed"),
        ("every-minute", "must read the event"),
        ("autom", "must read the event"),
        ("", "empty"),
    ] {
        let e = TickSource::parse(value).unwrap_err();
        assert!(e.contains(problem), "{value}: {e}");
    }
}
