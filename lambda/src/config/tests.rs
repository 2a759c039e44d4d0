//! The configuration's unit tests: every variable, every bad value, the deadline caps.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::{
    Config, ConfigError, OnBusy, CLOCK_SKEW, COALESCE, DEADLINE_MARGIN, FUNCTION_NAME, GATE,
    HEARTBEAT, KEY, LEASE, LEASE_CAP_GRACE, LOG_LEVEL, METRICS, ON_BUSY, PERMITS, PROXY_PORT,
    STALE_AFTER, TABLE, TICK, UPSTREAM, WAIT, WRAPPER_CHECK,
};
use crate::tick::TickSource;
use flightlock::options::{ClockSkew, Wait};
use flightlock::schema::HolderInfo;

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn base() -> Vec<(&'static str, &'static str)> {
    vec![(TABLE, "locks"), (FUNCTION_NAME, "nightly")]
}

fn with(extra: &[(&'static str, &'static str)]) -> HashMap<String, String> {
    let mut v = base();
    v.extend_from_slice(extra);
    map(&v)
}

fn bad(extra: &[(&'static str, &'static str)]) -> ConfigError {
    Config::from_map(&with(extra)).unwrap_err()
}

#[test]
fn defaults() {
    let c = Config::from_map(&with(&[])).unwrap();
    assert_eq!(c.table, "locks");
    assert_eq!(c.key.render_bytes(b"not json").unwrap(), "nightly");
    assert_eq!(c.wait, Wait::NoWait);
    assert_eq!(c.on_busy, OnBusy::Skip);
    assert_eq!(c.lease, Duration::from_secs(20));
    assert_eq!(c.heartbeat, None);
    assert_eq!(c.clock_skew, ClockSkew::Bounded(Duration::from_secs(1)));
    assert_eq!(c.log_level, "info");
    assert!(c.metrics);
    assert_eq!(c.tick, TickSource::Auto);
    assert_eq!(c.stale_after, None);
    assert!(!c.coalesce);
    assert_eq!(c.permits, 1);
    assert!(c.gate);
}

#[test]
fn every_variable_parses() {
    let c = Config::from_map(&with(&[
        (KEY, "job-{/detail/id}"),
        (WAIT, "forever"),
        (ON_BUSY, "error"),
        (LEASE, "9s"),
        (HEARTBEAT, "2s"),
        (CLOCK_SKEW, "unbounded"),
        (DEADLINE_MARGIN, "250ms"),
        (PROXY_PORT, "9100"),
        (UPSTREAM, "http://127.0.0.1:9200/"),
        (LOG_LEVEL, "DEBUG"),
        (METRICS, "off"),
        (WRAPPER_CHECK, "off"),
        (TICK, "run-{/detail/batchId}"),
        (STALE_AFTER, "10m"),
        (COALESCE, "on"),
        (GATE, "off"),
    ]))
    .unwrap();
    assert!(!c.gate);
    assert!(matches!(&c.tick, TickSource::Template(t) if t.source() == "run-{/detail/batchId}"));
    assert_eq!(c.stale_after, Some(Duration::from_secs(600)));
    assert!(c.coalesce);
    assert!(c.key.reads_event());
    assert_eq!(c.wait, Wait::Forever);
    assert_eq!(c.on_busy, OnBusy::Error);
    assert_eq!(c.lease, Duration::from_secs(9));
    assert_eq!(c.heartbeat, Some(Duration::from_secs(2)));
    assert_eq!(c.clock_skew, ClockSkew::Unbounded);
    assert_eq!(c.deadline_margin, Duration::from_millis(250));
    assert_eq!(c.log_level, "debug");
    assert!(!c.metrics);
}

#[test]
fn every_bad_value_names_its_variable_and_the_accepted_forms() {
    let cases: &[(&str, &str, &str)] = &[
        (WAIT, "soon", "forever"),
        (ON_BUSY, "skipp", "skip, error"),
        (LEASE, "long", "500ms"),
        (LEASE, "10ms", "at least 100ms"),
        (HEARTBEAT, "15s", "half the lease"),
        (HEARTBEAT, "x", "500ms"),
        (CLOCK_SKEW, "-1", "unbounded"),
        (DEADLINE_MARGIN, "1 parsec", "500ms"),
        (LOG_LEVEL, "loud", "debug"),
        (METRICS, "maybe", "on, off"),
        (GATE, "records", "on, off"),
        (TICK, "{detail}", "auto"),
        (TICK, "every-minute", "{/detail/batchId}"),
        (TICK, "autom", "off"),
        (STALE_AFTER, "0", "above 0"),
        (STALE_AFTER, "0s", "off"),
        (STALE_AFTER, "8d", "at most 7d"),
        (STALE_AFTER, "soon", "90s"),
        (STALE_AFTER, "-5m", "90s"),
        (COALESCE, "newest", "on, off"),
        (PERMITS, "0", "1 (one at a time, the default) up to 100"),
        (PERMITS, "101", "up to 100"),
        (PERMITS, "+3", "a whole number"),
        (PERMITS, "2.5", "a whole number"),
        (PERMITS, "five", "such as 5"),
        (KEY, "job-{detail}", "{/json/pointer}"),
        (KEY, "job-{/a", "{/json/pointer}"),
        (KEY, "a}b", "}}"),
        (TABLE, "a b", "a-z"),
        ("FLIGHTLOCK_WIAT", "10s", "FLIGHTLOCK_WAIT"),
    ];
    for (var, value, accepted) in cases {
        let e = bad(&[(var, value)]);
        assert_eq!(e.variable, *var, "{var}={value}: {e}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("{var}=")), "{msg}");
        assert!(msg.contains(accepted), "{var}={value}: {msg}");
    }
}

#[test]
fn table_is_required_and_key_falls_back_to_the_function_name() {
    let e = Config::from_map(&map(&[(FUNCTION_NAME, "f")])).unwrap_err();
    assert_eq!(e.variable, TABLE);
    let e = Config::from_map(&map(&[(TABLE, "locks")])).unwrap_err();
    assert_eq!(e.variable, KEY);
    Config::from_map(&map(&[(TABLE, "locks"), (KEY, "k")])).unwrap();
    // A blank value is unset, not an error.
    let c = Config::from_map(&with(&[(WAIT, " ")])).unwrap();
    assert_eq!(c.wait, Wait::NoWait);
}

#[test]
fn the_wait_is_capped_by_the_deadline_and_the_lease_by_deadline_plus_grace() {
    let c = Config::from_map(&with(&[(WAIT, "forever")])).unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let deadline = now + Duration::from_secs(10);
    let o = c.lock_options(Some(deadline), now, HolderInfo::default());
    assert_eq!(o.wait, Wait::For(Duration::from_secs(9)));
    assert_eq!(o.lease_cap, Some(deadline + LEASE_CAP_GRACE));
    let c = Config::from_map(&with(&[(WAIT, "3s")])).unwrap();
    let o = c.lock_options(Some(deadline), now, HolderInfo::default());
    assert_eq!(o.wait, Wait::For(Duration::from_secs(3)));
    // Within the margin of the deadline: no wait at all.
    let o = c.lock_options(
        Some(now + Duration::from_millis(500)),
        now,
        HolderInfo::default(),
    );
    assert_eq!(o.wait, Wait::NoWait);
    let o = c.lock_options(None, now, HolderInfo::default());
    assert_eq!(
        (o.wait, o.lease_cap),
        (Wait::For(Duration::from_secs(3)), None)
    );
}

#[test]
fn a_key_template_with_skip_is_warned_about() {
    let c = Config::from_map(&with(&[(KEY, "job-{/detail/id}")])).unwrap();
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("FLIGHTLOCK_ON_BUSY=error") && w[0].contains("SQS"),
        "{w:?}"
    );
    let c = Config::from_map(&with(&[(KEY, "job-{/detail/id}"), (ON_BUSY, "error")])).unwrap();
    assert!(c.warnings().is_empty());
    assert!(Config::from_map(&with(&[])).unwrap().warnings().is_empty());
}

#[test]
fn the_tick_settings_parse_and_off_turns_them_off() {
    let c = Config::from_map(&with(&[(TICK, "OFF"), (STALE_AFTER, "off")])).unwrap();
    assert_eq!((c.tick, c.stale_after), (TickSource::Off, None));
    let c = Config::from_map(&with(&[(TICK, "Auto"), (STALE_AFTER, "7d")])).unwrap();
    assert_eq!(c.tick, TickSource::Auto);
    assert_eq!(c.stale_after, Some(Duration::from_secs(7 * 24 * 3600)));
    // A bare number is seconds, as everywhere.
    let c = Config::from_map(&with(&[(STALE_AFTER, "90")])).unwrap();
    assert_eq!(c.stale_after, Some(Duration::from_secs(90)));
}

#[test]
fn settings_that_contradict_each_other_fail_init_naming_both() {
    // Coalescing needs a wait: the default wait is 0.
    for wait in [None, Some("0"), Some("0s")] {
        let mut extra = vec![(COALESCE, "on")];
        extra.extend(wait.map(|w| (WAIT, w)));
        let e = bad(&extra);
        assert_eq!(e.variable, COALESCE, "{e}");
        assert!(e.to_string().contains(WAIT), "{e}");
    }
    let c = Config::from_map(&with(&[(COALESCE, "yes"), (WAIT, "forever")])).unwrap();
    assert!(c.coalesce);
    // A stale bound without a tick catches nothing.
    let e = bad(&[(TICK, "off"), (STALE_AFTER, "1h")]);
    assert_eq!(e.variable, STALE_AFTER, "{e}");
    assert!(e.to_string().contains("FLIGHTLOCK_TICK=off"), "{e}");
}

#[test]
fn coalescing_is_dropped_when_the_deadline_leaves_no_wait() {
    let c = Config::from_map(&with(&[(COALESCE, "on"), (WAIT, "30s")])).unwrap();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let o = c.lock_options(
        Some(now + Duration::from_secs(10)),
        now,
        HolderInfo::default(),
    );
    assert!(o.coalesce);
    assert!(o.validate().is_ok());
    // Within the margin: no wait, so nothing to coalesce into (and the options stay valid).
    let o = c.lock_options(
        Some(now + Duration::from_millis(500)),
        now,
        HolderInfo::default(),
    );
    assert_eq!((o.wait, o.coalesce), (Wait::NoWait, false));
    assert!(o.validate().is_ok());
}

#[test]
fn permits_parse_and_reach_the_lock_options() {
    for (value, n) in [("1", 1), ("2", 2), (" 5 ", 5), ("100", 100)] {
        let c = Config::from_map(&with(&[(PERMITS, value)])).unwrap();
        assert_eq!(c.permits, n, "{value}");
        let o = c.lock_options(None, SystemTime::now(), HolderInfo::default());
        assert_eq!(o.permits, n, "{value}");
        assert!(o.validate().is_ok(), "{value}");
    }
    // Blank is unset: one permit, and the default tick stays on.
    let c = Config::from_map(&with(&[(PERMITS, "")])).unwrap();
    assert_eq!((c.permits, c.tick), (1, TickSource::Auto));
    assert!(flightlock::options::PERMITS_FORMS.contains(&flightlock::MAX_PERMITS.to_string()));
}

#[test]
fn more_than_one_permit_turns_the_default_tick_off_and_refuses_what_needs_one_run() {
    // Unset FLIGHTLOCK_TICK (auto by default) is turned off; explicit off stays off.
    for extra in [vec![], vec![(TICK, "off")], vec![(STALE_AFTER, "off")]] {
        let mut extra = extra;
        extra.push((PERMITS, "3"));
        let c = Config::from_map(&with(&extra)).unwrap();
        assert_eq!(c.tick, TickSource::Off, "{extra:?}");
    }
    // With one permit, nothing changes.
    let c = Config::from_map(&with(&[(PERMITS, "1"), (TICK, "auto")])).unwrap();
    assert_eq!(c.tick, TickSource::Auto);
    for extra in [
        [(TICK, "auto"), (WAIT, "0")],
        [(TICK, "{/detail/id}"), (WAIT, "0")],
        [(STALE_AFTER, "1h"), (WAIT, "0")],
        [(COALESCE, "on"), (WAIT, "forever")],
    ] {
        let mut extra = extra.to_vec();
        extra.push((PERMITS, "2"));
        let e = bad(&extra);
        assert_eq!(e.variable, extra[0].0, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("FLIGHTLOCK_PERMITS=2"), "{msg}");
        assert!(msg.contains("set FLIGHTLOCK_PERMITS=1"), "{msg}");
    }
}

#[test]
fn the_extensions_own_settings_are_accepted_and_left_to_it() {
    // Parsed by the extension (`flightlock_extension::config`); the in-process layer has no
    // proxy and no wrapper, so it accepts their names and leaves their values alone.
    for (var, value) in [
        (PROXY_PORT, "70000"),
        (UPSTREAM, "localhost"),
        (WRAPPER_CHECK, "x"),
    ] {
        assert!(
            Config::from_map(&with(&[(var, value)])).is_ok(),
            "{var}={value}"
        );
    }
}
