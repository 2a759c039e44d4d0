//! Once per tick: the identity of one scheduled run ([`Tick`]).
//!
//! A run that *succeeded* marks its tick done ([`crate::LockGuard::release_done`]); a later
//! acquisition for the same tick is answered [`crate::Error::TickDone`] without the lock being
//! held and without anything left in the table. A run that failed releases with
//! [`crate::LockGuard::release`], which marks nothing, so retries run it again.
//!
//! **Ordered ticks** ([`Tick::At`], an instant) cost nothing on the uncontended path: the key's
//! counter item carries `tickDone` (the newest tick that succeeded, a watermark that only moves
//! forward). The seat take and the enqueue are conditioned on `tickDone < tick`, the acquisition's
//! read sees it, a waiter's granting look reads it in the same page, and the seat's release sets
//! it in the same `UpdateItem` (a queue row's release marks the counter first, then deletes the
//! row: one more request on the contended path). A tick at or below the watermark is done: an
//! older tick after a newer success is answered as done too (a schedule never runs backwards).
//!
//! **Unordered ticks** ([`Tick::Id`], a batch id, an execution id) cost one more read and one more
//! write per run: a small record per id in the key's partition (`sk = "tick#" + id`, sorting
//! after every queue row, so no queue read ever reaches one), expiring by TTL after
//! [`crate::LockOptions::tick_keep`]. It is looked up (strongly consistent) only once the lock is
//! held — the holder excludes every other run of the key, so the check is race-free — and written
//! by `release_done` before the release.
//!
//! **The crash window.** A run that succeeded but whose process dies before `release_done`'s
//! write lands is not marked: a retry runs it again. The window is one release write's round
//! trip, and it errs on running twice, never on skipping a tick.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The identity of one scheduled run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tick {
    /// An instant, epoch milliseconds (an EventBridge `time`, a Scheduler scheduled-time, the
    /// CLI's `--once 2026-11-24T10:00Z`). Ordered: a watermark on the key's counter item, free.
    At(i64),
    /// An identity without order (a batch id, a Scheduler execution id): a small record per id,
    /// expiring by TTL after [`crate::LockOptions::tick_keep`].
    Id(String),
}

/// Longest [`Tick::Id`], in bytes: the record's sort key (`tick#` + id) stays far below
/// DynamoDB's 1024-byte limit for a sort key.
pub const MAX_ID_BYTES: usize = 512;

impl Tick {
    /// RFC 3339 (`2026-11-24T10:00:00Z`; seconds, fractions and the zone optional, UTC when no
    /// zone is given; `t` or a space for `T`) → [`Tick::At`]; anything else → [`Tick::Id`].
    pub fn parse(s: &str) -> Tick {
        match parse_rfc3339_ms(s.trim()) {
            Some(ms) => Tick::At(ms),
            None => Tick::Id(s.to_owned()),
        }
    }

    /// The ordered tick's instant, epoch ms.
    pub fn at(&self) -> Option<i64> {
        match self {
            Tick::At(ms) => Some(*ms),
            Tick::Id(_) => None,
        }
    }

    /// Checks the tick: an id is 1..=[`MAX_ID_BYTES`] bytes.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Tick::At(_) => Ok(()),
            Tick::Id(id) if id.is_empty() => Err("the tick id is empty".into()),
            Tick::Id(id) if id.len() > MAX_ID_BYTES => Err(format!(
                "the tick id is {} bytes long; at most {MAX_ID_BYTES} bytes are allowed",
                id.len()
            )),
            Tick::Id(_) => Ok(()),
        }
    }
}

impl fmt::Display for Tick {
    /// An ordered tick as RFC 3339 UTC with milliseconds; an id as itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tick::At(ms) => f.write_str(&format_ms(*ms)),
            Tick::Id(id) => f.write_str(id),
        }
    }
}

/// Epoch ms as RFC 3339 UTC with milliseconds (`2026-11-24T10:00:00.000Z`).
pub fn format_ms(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
    let (min, rest) = (rest / 60_000, rest % 60_000);
    let (sec, milli) = (rest / 1000, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{sec:02}.{milli:03}Z")
}

/// Parses RFC 3339 to epoch ms (see [`Tick::parse`] for what is accepted).
fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let digits = |from: usize, n: usize| -> Option<i64> {
        let part = b.get(from..from + n)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |v, d| v * 10 + i64::from(d - b'0')))
    };
    let year = digits(0, 4)?;
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return None;
    }
    let (month, day) = (digits(5, 2)?, digits(8, 2)?);
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let hour = digits(11, 2)?;
    if b.get(13) != Some(&b':') {
        return None;
    }
    let minute = digits(14, 2)?;
    let mut i = 16;
    let (mut second, mut milli) = (0, 0);
    if b.get(i) == Some(&b':') {
        second = digits(i + 1, 2)?;
        i += 3;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == start {
                return None;
            }
            // Milliseconds: the first three digits, the rest truncated.
            let frac = &s[start..i.min(start + 3)];
            milli = frac.parse::<i64>().ok()? * 10_i64.pow(3 - frac.len() as u32);
        }
    }
    let offset_min = match b.get(i) {
        None => 0,
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b.get(i + 3) == Some(&b':') => {
            let (oh, om) = (digits(i + 1, 2)?, digits(i + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let m = oh * 60 + om;
            if *sign == b'-' {
                -m
            } else {
                m
            }
        }
        _ => return None,
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month) || day < 1 || day > month_days[(month - 1) as usize] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_min * 60;
    Some(secs * 1000 + milli)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// How old the ordered tick `at_ms` (epoch ms) is at wall time `now`; zero for a tick in the
/// future (a clock ahead of this one's). Pure.
pub fn age(at_ms: i64, now: SystemTime) -> Duration {
    let now_ms = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    };
    Duration::from_millis(u64::try_from(now_ms.saturating_sub(at_ms)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_forms_parse_to_the_same_instant() {
        let t = 1_795_514_400_000; // 2026-11-24T10:00:00Z
        for s in [
            "2026-11-24T10:00:00Z",
            "2026-11-24T10:00Z",
            "2026-11-24T10:00",
            "2026-11-24 10:00:00",
            "2026-11-24t10:00:00.000z",
            "2026-11-24T12:00:00+02:00",
            "2026-11-24T09:30:00-00:30",
        ] {
            assert_eq!(Tick::parse(s), Tick::At(t), "{s}");
        }
        assert_eq!(Tick::parse("2026-11-24T10:00:00.1234Z"), Tick::At(t + 123));
        assert_eq!(Tick::parse("1970-01-01T00:00:00Z"), Tick::At(0));
        assert_eq!(Tick::parse("1969-12-31T23:59:59.999Z"), Tick::At(-1));
    }

    #[test]
    fn anything_else_is_an_id() {
        for s in [
            "batch-42",
            "2026-11-24",
            "2026-13-01T00:00Z",
            "2026-02-29T00:00Z",
            "2026-11-24T10:00:00+0200",
            "2026-11-24T10:00:00.Z",
            "2026-11-24T24:00Z",
            "",
        ] {
            assert_eq!(Tick::parse(s), Tick::Id(s.to_owned()), "{s}");
        }
        assert_eq!(
            Tick::parse("2024-02-29T00:00Z"),
            Tick::At(1_709_164_800_000)
        );
    }

    #[test]
    fn ticks_display_as_utc_and_round_trip() {
        for ms in [
            0,
            -1,
            1_795_514_400_123,
            253_402_300_799_999,
            951_782_400_000,
        ] {
            let shown = Tick::At(ms).to_string();
            assert_eq!(Tick::parse(&shown), Tick::At(ms), "{shown}");
        }
        assert_eq!(
            Tick::At(1_795_514_400_000).to_string(),
            "2026-11-24T10:00:00.000Z"
        );
        assert_eq!(Tick::Id("b-1".into()).to_string(), "b-1");
    }

    #[test]
    fn ids_are_bounded() {
        assert!(Tick::Id("x".into()).validate().is_ok());
        assert!(Tick::Id(String::new()).validate().is_err());
        let long = Tick::Id("x".repeat(MAX_ID_BYTES + 1))
            .validate()
            .unwrap_err();
        assert!(long.contains("513 bytes"), "{long}");
    }

    /// An ordered tick: 2026-11-21T12:00:00Z (epoch ms).
    const AT: i64 = 1_795_262_400_000;

    #[test]
    fn a_ticks_age_is_measured_on_the_wall_clock() {
        let now = UNIX_EPOCH + Duration::from_millis(AT as u64 + 90_000);
        assert_eq!(age(AT, now), Duration::from_secs(90));
        // A tick from the future (a clock ahead of ours) is not old.
        assert_eq!(age(AT + 200_000, now), Duration::ZERO);
        // Before 1970, both sides.
        assert_eq!(age(-1_000, UNIX_EPOCH), Duration::from_secs(1));
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(age(-10_000, before), Duration::from_secs(5));
        assert!(age(0, SystemTime::now()) > Duration::from_secs(50 * 365 * 86_400));
    }
}
