//! Acquisition options, and the humane duration and switch syntaxes shared by the CLI, the
//! extension and the cleanup function.

use std::time::Duration;

use crate::error::Error;
use crate::holder::HolderInfo;
use crate::protocol::MAX_PERMITS;
use crate::tick::Tick;

/// How long an acquisition may wait for the key ("record wait").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Fail at once if the key is held (the skip decision). Leaves no row behind.
    NoWait,
    /// Give up after this long; giving up removes our row.
    For(Duration),
    /// Never give up.
    Forever,
}

impl Wait {
    /// The words [`Wait::parse`] reads as [`Wait::Forever`] (the docs list every one; a test
    /// checks that they do).
    pub const FOREVER_WORDS: &'static [&'static str] = &["forever", "inf", "infinite"];

    /// Parses `0`, one of [`Wait::FOREVER_WORDS`], or a duration such as `500ms`, `10s`, `2m`.
    pub fn parse(s: &str) -> Result<Wait, String> {
        match s.trim() {
            "0" => Ok(Wait::NoWait),
            w if Self::FOREVER_WORDS.contains(&w) => Ok(Wait::Forever),
            other => match parse_duration(other) {
                Ok(d) if d.is_zero() => Ok(Wait::NoWait),
                Ok(d) => Ok(Wait::For(d)),
                Err(e) => Err(format!(
                    "{e}; or 0 (do not wait), or {} (never give up)",
                    Self::FOREVER_WORDS.join(", ")
                )),
            },
        }
    }

    /// The wait as a duration, `None` for forever.
    pub fn as_duration(self) -> Option<Duration> {
        match self {
            Wait::NoWait => Some(Duration::ZERO),
            Wait::For(d) => Some(d),
            Wait::Forever => None,
        }
    }
}

/// How far participants' wall clocks may disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSkew {
    /// Clocks agree within this allowance. A row is stale once our wall clock is past its
    /// `leaseUntilMs` plus the allowance: dead holders are detected from a single read.
    Bounded(Duration),
    /// Clock-free mode: wall clocks are not trusted at all. A row is stale only after we have
    /// seen its `rvn` unchanged for a full lease on our own monotonic clock.
    Unbounded,
}

impl ClockSkew {
    /// The words [`ClockSkew::parse`] reads as [`ClockSkew::Unbounded`]. `none` is not one of
    /// them: it could as well mean "no allowance" (zero), the opposite.
    pub const UNBOUNDED_WORDS: &'static [&'static str] = &["unbounded", "clock-free"];

    /// Parses one of [`ClockSkew::UNBOUNDED_WORDS`] or a duration.
    pub fn parse(s: &str) -> Result<ClockSkew, String> {
        match s.trim() {
            w if Self::UNBOUNDED_WORDS.contains(&w) => Ok(ClockSkew::Unbounded),
            other => parse_duration(other).map(ClockSkew::Bounded).map_err(|e| {
                format!(
                    "{e}; or {} (clock-free mode)",
                    Self::UNBOUNDED_WORDS.join(", ")
                )
            }),
        }
    }
}

/// In clock-free mode, rows are left to TTL and the sweeper only this long after their lease end
/// by their writer's clock. A clock-free holder whose wall clock runs behind the true time by more
/// than this could have its live row removed by TTL or the sweeper; up to this, nothing depends
/// on its clock. (Dead rows ahead of a waiter are passed over after one lease regardless: this
/// grace only keeps the last rows of an idle key a little longer.)
pub const CLOCK_FREE_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Options of one acquisition. Start from [`LockOptions::default`] and change what you need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    /// How long to wait for the key. Default: forever.
    pub wait: Wait,
    /// Lease length: how long the row stays live without a heartbeat. Default 20 s.
    pub lease: Duration,
    /// Heartbeat interval. Default: a third of the lease. Must be at most half the lease.
    pub heartbeat: Option<Duration>,
    /// The longest pause between two looks of the waiter next in line, and the first guess at
    /// how long a place in the queue takes before the process has seen one go by. Default
    /// 100 ms. Waiters look by their place and the key's pace (`liveness::Pace`):
    /// further back less often, up to `max_poll`; all with ±10 % jitter.
    pub poll: Duration,
    /// Longest poll interval. Default 2 s.
    pub max_poll: Duration,
    /// Clock-skew allowance. Default 1 s.
    pub clock_skew: ClockSkew,
    /// Added to the lease end to form the TTL (`expiresAt`), so TTL and the sweeper only remove
    /// rows every participant already treats as dead. Default 1 h.
    pub ttl_grace: Duration,
    /// Details written into the row for people reading the queue.
    pub holder: HolderInfo,
    /// Hard end: heartbeats never extend the lease past this wall-clock time. In Lambda it is
    /// the invocation deadline plus a grace, so a sandbox that is frozen or killed mid-invocation
    /// frees the key soon after its deadline. Reaching it fires the lost signal. Default: none.
    pub lease_cap: Option<std::time::SystemTime>,
    /// Once per tick: the identity of the scheduled run this acquisition is for. An acquisition
    /// for a tick already done (see [`crate::tick`]) is answered [`Error::TickDone`], without the
    /// lock and without anything left in the table; [`crate::LockGuard::release_done`] marks it
    /// done. Default: none (every acquisition runs).
    pub tick: Option<Tick>,
    /// How long the record of a done [`Tick::Id`] is kept (TTL) before a late duplicate of it
    /// would run again. Default 30 h: EventBridge retries for up to 24 h, Lambda's asynchronous
    /// queue for up to 6 h. Ordered ticks ([`Tick::At`]) need no record.
    pub tick_keep: Duration,
    /// Coalesce overruns: at most one later run waits, the newest. A waiter that sees a newer
    /// tick (or, without a tick, a later ticket) queued behind it withdraws and answers
    /// [`Error::Superseded`]; an acquisition whose read shows a newer tick already queued answers
    /// it at once. Needs a wait (not [`Wait::NoWait`]). Default: off (every waiter waits its turn).
    pub coalesce: bool,
    /// At most this many holders of the key at a time: a FIFO counting semaphore. Waiters are
    /// granted in ticket order as permits free up; each holder has its own lease, heartbeat,
    /// loss notice and release. Default 1: a lock, exactly as before (protocol 1 on the table).
    /// A key has one number of permits, kept on its counter by the first participant that
    /// creates it: a participant configured with another gets [`Error::PermitsMismatch`]. Up to
    /// [`MAX_PERMITS`]; more than 1 needs no `tick` and no `coalesce` (once per tick is a
    /// one-at-a-time promise).
    pub permits: u32,
}

/// The forms a number of permits accepts ([`parse_permits`]).
pub const PERMITS_FORMS: &str =
    "a whole number from 1 (one at a time, the default) up to 100, such as 5";

/// Parses a number of permits as people write it (`FLIGHTLOCK_PERMITS` in Lambda, the CLI's
/// `--permits` and `permits --set`): 1 up to [`MAX_PERMITS`], digits only (no sign, no fraction,
/// no exponent). The error is the problem; the caller names the variable or the option.
pub fn parse_permits(s: &str) -> Result<u32, &'static str> {
    match s.parse::<u32>() {
        Ok(p) if (1..=MAX_PERMITS).contains(&p) && s.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        Ok(_) => Err("out of range"),
        Err(_) => Err("not a whole number"),
    }
}

/// The default [`LockOptions::tick_keep`]: 30 h.
pub const DEFAULT_TICK_KEEP: Duration = Duration::from_secs(30 * 3600);
/// The longest [`LockOptions::tick_keep`]: a year.
pub const MAX_TICK_KEEP: Duration = Duration::from_secs(366 * 24 * 3600);

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            wait: Wait::Forever,
            lease: Duration::from_secs(20),
            heartbeat: None,
            poll: Duration::from_millis(100),
            max_poll: Duration::from_secs(2),
            clock_skew: ClockSkew::Bounded(Duration::from_secs(1)),
            ttl_grace: Duration::from_secs(3600),
            holder: HolderInfo::default(),
            lease_cap: None,
            tick: None,
            tick_keep: DEFAULT_TICK_KEEP,
            coalesce: false,
            permits: 1,
        }
    }
}

impl LockOptions {
    /// The heartbeat interval in force.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat.unwrap_or(self.lease / 3)
    }

    /// The lease end for a write at wall time `wall_ms`: `wall + lease`, but never past
    /// [`LockOptions::lease_cap`].
    pub fn lease_until_ms(&self, wall_ms: i64) -> i64 {
        let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let until = wall_ms.saturating_add(lease);
        match self
            .lease_cap
            .and_then(|c| c.duration_since(std::time::UNIX_EPOCH).ok())
        {
            Some(cap) => until.min(i64::try_from(cap.as_millis()).unwrap_or(i64::MAX)),
            None => until,
        }
    }

    /// Whether waiters judge rows without wall clocks ([`ClockSkew::Unbounded`]).
    pub fn clock_free(&self) -> bool {
        self.clock_skew == ClockSkew::Unbounded
    }

    /// The TTL (`expiresAt`, epoch seconds) for a row whose lease ends at `lease_until_ms`:
    /// `lease end + ttl_grace`, and in clock-free mode at least [`CLOCK_FREE_GRACE`] (the row's
    /// lease end comes from its writer's wall clock, which clock-free mode does not trust; TTL
    /// compares it with the true time).
    pub fn expires_at(&self, lease_until_ms: i64) -> i64 {
        let grace = if self.clock_free() {
            self.ttl_grace.max(CLOCK_FREE_GRACE)
        } else {
            self.ttl_grace
        };
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        crate::schema::ttl_seconds(lease_until_ms.saturating_add(grace_ms))
    }

    /// Checks the options against each other.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |name, problem: String| Err(Error::InvalidOption { name, problem });
        if self.lease < Duration::from_millis(100) {
            return bad(
                "lease",
                format!("{:?} is too short; use at least 100ms", self.lease),
            );
        }
        let hb = self.heartbeat_interval();
        if hb.is_zero() || hb > self.lease / 2 {
            return bad(
                "heartbeat",
                format!(
                    "{hb:?} must be above zero and at most half the lease ({:?})",
                    self.lease
                ),
            );
        }
        if self.poll.is_zero() || self.max_poll < self.poll {
            return bad(
                "poll",
                format!(
                    "poll {:?} must be above zero and at most max poll {:?}",
                    self.poll, self.max_poll
                ),
            );
        }
        if let Some(tick) = &self.tick {
            if let Err(problem) = tick.validate() {
                return bad("tick", problem);
            }
        }
        if self.permits == 0 || self.permits > MAX_PERMITS {
            return bad(
                "permits",
                format!(
                    "{} is out of range; use 1 (one at a time, the default) up to {MAX_PERMITS}",
                    self.permits
                ),
            );
        }
        if self.permits > 1 && (self.tick.is_some() || self.coalesce) {
            return bad(
                "permits",
                format!(
                    "{} permits cannot be combined with a tick or coalesce: once per tick and \
                     coalescing promise one run at a time; use permits = 1 for them",
                    self.permits
                ),
            );
        }
        if self.tick_keep < Duration::from_secs(1) || self.tick_keep > MAX_TICK_KEEP {
            return bad(
                "tick keep",
                format!(
                    "{:?} is out of range; use 1s up to {:?} (default 30h)",
                    self.tick_keep, MAX_TICK_KEEP
                ),
            );
        }
        if self.coalesce && self.wait == Wait::NoWait {
            return bad(
                "coalesce",
                "coalescing needs a wait above zero: with no wait there is nothing to coalesce \
                 into"
                    .into(),
            );
        }
        if let ClockSkew::Bounded(skew) = self.clock_skew {
            if skew > self.ttl_grace {
                return bad(
                    "clock skew",
                    format!(
                        "{skew:?} exceeds the TTL grace {:?}; TTL could remove live rows",
                        self.ttl_grace
                    ),
                );
            }
        }
        Ok(())
    }
}

/// The words [`parse_switch`] reads as on, in any case (the docs list every one; a test checks
/// that they do).
pub const SWITCH_ON_WORDS: &[&str] = &["on", "true", "1", "yes"];

/// The words [`parse_switch`] reads as off, in any case.
pub const SWITCH_OFF_WORDS: &[&str] = &["off", "false", "0", "no"];

/// The accepted forms of a switch, for error messages.
pub const SWITCH_FORMS: &str = "on, off (also true/false, 1/0, yes/no)";

/// Parses an on/off switch: one of [`SWITCH_ON_WORDS`] or [`SWITCH_OFF_WORDS`], in any case.
/// Anything else is an error rather than a default, so a typo never flips a setting.
pub fn parse_switch(s: &str) -> Result<bool, String> {
    let lower = s.trim().to_ascii_lowercase();
    if SWITCH_ON_WORDS.contains(&lower.as_str()) {
        Ok(true)
    } else if SWITCH_OFF_WORDS.contains(&lower.as_str()) {
        Ok(false)
    } else {
        Err(format!("{s:?} is not a switch; accepted: {SWITCH_FORMS}"))
    }
}

/// Parses a humane duration: `500ms`, `10s`, `2m`, `1h`, `1m30s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    const FORMS: &str = "accepted: a number with a unit (500ms, 10s, 2m, 1h, 1d), units together \
                         (1m30s), or a bare number of seconds";
    if s.is_empty() {
        return Err(format!("empty duration; {FORMS}"));
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative; {FORMS}"));
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration ({e}); {FORMS}"))
}

/// The longest stale bound ([`parse_stale_after`]; `FLIGHTLOCK_STALE_AFTER` in Lambda,
/// `flightlock run --stale-after`): every retry of a delivery ends within 30 h
/// (EventBridge 24 h, then Lambda's async queue 6 h), so a bound of more than a week catches
/// nothing and is a unit mistake (a bare number is seconds, not milliseconds).
pub const MAX_STALE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// The forms a stale bound accepts ([`parse_stale_after`]).
pub const STALE_AFTER_FORMS: &str =
    "off, or a duration above 0 and at most 7d such as 90s, 10m, 1h (a bare number is seconds)";

/// Parses a stale bound (`FLIGHTLOCK_STALE_AFTER` in Lambda, `flightlock run --stale-after`):
/// `off` (`None`) or a duration in `(0, MAX_STALE_AFTER]`. An ordered tick older than the bound
/// is dropped without touching the table. The error is the problem; the caller names the
/// variable or the option.
pub fn parse_stale_after(value: &str) -> Result<Option<Duration>, String> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let d = parse_duration(v)?;
    if d.is_zero() {
        return Err("zero would drop every tick (write off to turn the check off)".into());
    }
    if d > MAX_STALE_AFTER {
        return Err(format!(
            "{} is longer than any retry horizon (EventBridge 24 h + Lambda async 6 h): it \
             would catch nothing",
            humantime::format_duration(d)
        ));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`PERMITS_FORMS`] is a constant string, so it writes [`MAX_PERMITS`] out: it must say
    /// the number the parser accepts, and no more.
    #[test]
    fn the_permits_forms_name_the_bound_the_parser_keeps() {
        assert!(
            PERMITS_FORMS.contains(&format!("up to {MAX_PERMITS},")),
            "{PERMITS_FORMS}"
        );
        assert_eq!(parse_permits(&MAX_PERMITS.to_string()), Ok(MAX_PERMITS));
        assert!(parse_permits(&(MAX_PERMITS + 1).to_string()).is_err());
        assert!(parse_permits("0").is_err());
    }

    #[test]
    fn switches_read_each_word_in_any_case_and_nothing_else() {
        for word in SWITCH_ON_WORDS {
            assert_eq!(parse_switch(word), Ok(true), "{word}");
            assert_eq!(parse_switch(&word.to_uppercase()), Ok(true), "{word}");
        }
        for word in SWITCH_OFF_WORDS {
            assert_eq!(parse_switch(word), Ok(false), "{word}");
            assert_eq!(
                parse_switch(&format!(" {} ", word.to_uppercase())),
                Ok(false)
            );
        }
        for bad in ["", "maybe", "enabled", "2", "o n"] {
            let e = parse_switch(bad).unwrap_err();
            assert!(e.contains(SWITCH_FORMS), "{e}");
        }
    }

    #[test]
    fn waits_parse() {
        assert_eq!(Wait::parse("0").unwrap(), Wait::NoWait);
        assert_eq!(Wait::parse("0s").unwrap(), Wait::NoWait);
        for w in Wait::FOREVER_WORDS {
            assert_eq!(Wait::parse(w).unwrap(), Wait::Forever);
        }
        assert_eq!(
            Wait::parse("1m30s").unwrap(),
            Wait::For(Duration::from_secs(90))
        );
        assert_eq!(
            Wait::parse("500ms").unwrap(),
            Wait::For(Duration::from_millis(500))
        );
        let e = Wait::parse("soon").unwrap_err();
        for form in [
            "soon",
            "500ms",
            "1m30s",
            "bare number",
            "0",
            "forever",
            "inf",
            "infinite",
        ] {
            assert!(e.contains(form), "{form}: {e}");
        }
        assert!(Wait::parse("-1").unwrap_err().contains("negative"));
    }

    #[test]
    fn skew_parses() {
        for w in ClockSkew::UNBOUNDED_WORDS {
            assert_eq!(ClockSkew::parse(w).unwrap(), ClockSkew::Unbounded);
        }
        // Ambiguous: "no allowance" or "no bound"? Rejected, not guessed.
        assert!(ClockSkew::parse("none").is_err());
        assert_eq!(
            ClockSkew::parse("250ms").unwrap(),
            ClockSkew::Bounded(Duration::from_millis(250))
        );
        let e = ClockSkew::parse("").unwrap_err();
        for form in ["500ms", "1m30s", "unbounded", "clock-free"] {
            assert!(e.contains(form), "{form}: {e}");
        }
    }

    #[test]
    fn defaults_are_valid_and_heartbeat_is_a_third() {
        let o = LockOptions::default();
        o.validate().unwrap();
        assert_eq!(o.heartbeat_interval(), o.lease / 3);
    }

    #[test]
    fn the_lease_cap_bounds_the_lease() {
        let cap = std::time::UNIX_EPOCH + Duration::from_millis(25_000);
        let o = LockOptions {
            lease_cap: Some(cap),
            ..Default::default()
        };
        assert_eq!(o.lease_until_ms(1_000), 21_000);
        assert_eq!(o.lease_until_ms(10_000), 25_000);
        assert_eq!(LockOptions::default().lease_until_ms(10_000), 30_000);
    }

    #[test]
    fn bad_combinations_name_the_option() {
        let o = LockOptions {
            heartbeat: Some(Duration::from_secs(15)),
            ..Default::default()
        };
        assert!(o.validate().unwrap_err().to_string().contains("heartbeat"));
        let o = LockOptions {
            lease: Duration::from_millis(10),
            ..Default::default()
        };
        assert!(o.validate().unwrap_err().to_string().contains("lease"));
        let o = LockOptions {
            max_poll: Duration::from_millis(1),
            ..Default::default()
        };
        assert!(o.validate().unwrap_err().to_string().contains("poll"));
    }

    #[test]
    fn stale_bounds_parse_within_range() {
        assert_eq!(parse_stale_after("off"), Ok(None));
        assert_eq!(parse_stale_after("Off"), Ok(None));
        assert_eq!(parse_stale_after("10m"), Ok(Some(Duration::from_secs(600))));
        assert_eq!(parse_stale_after("90"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_stale_after("7d"), Ok(Some(MAX_STALE_AFTER)));
        for (bad, problem) in [
            ("0", "zero"),
            ("0ms", "zero"),
            ("7d 1s", "longer than any retry horizon"),
            ("3600000", "longer than any retry horizon"),
            ("-1m", "negative"),
            ("soon", "not a duration"),
        ] {
            let e = parse_stale_after(bad).unwrap_err();
            assert!(e.contains(problem), "{bad}: {e}");
        }
    }
}
