//! `FLIGHTLOCK_PERMITS`: how many invocations may hold the key at a time, and what it rules out.
//!
//! More than one permit cannot be combined with a tick or coalescing: once per tick and
//! coalescing promise one run at a time. The default tick (`FLIGHTLOCK_TICK` unset, `auto`) is
//! turned off, so a user who only sets `FLIGHTLOCK_PERMITS` gets N at a time for every event,
//! scheduled or not; an explicit `FLIGHTLOCK_TICK` (other than `off`), `FLIGHTLOCK_STALE_AFTER`
//! or `FLIGHTLOCK_COALESCE=on` is refused with a [`ConfigError`] naming both variables.

use std::collections::HashMap;
use std::time::Duration;

use super::{err, ConfigError, COALESCE, PERMITS, STALE_AFTER, TICK};
use crate::tick::TickSource;
use flightlock::options::{parse_permits, PERMITS_FORMS};

/// `FLIGHTLOCK_PERMITS` (trimmed, `None` when unset or empty): [`parse_permits`], default 1.
pub(super) fn parse(value: Option<String>) -> Result<u32, ConfigError> {
    let Some(v) = value else {
        return Ok(1);
    };
    parse_permits(&v).map_err(|problem| err(PERMITS, &v, problem, PERMITS_FORMS))
}

/// The tick source to use with `permits`: unchanged with one permit; with more, `off` (the
/// default `auto` turned off), or a [`ConfigError`] if the user explicitly asked for a tick
/// (`tick_set`), stale ticks to be dropped, or coalescing.
pub(super) fn tick(
    env: &HashMap<String, String>,
    permits: u32,
    tick: TickSource,
    tick_set: bool,
    stale_after: Option<Duration>,
    coalesce: bool,
) -> Result<TickSource, ConfigError> {
    if permits <= 1 {
        return Ok(tick);
    }
    let refuse = |name: &str, what: &str| {
        err(
            name,
            env.get(name).map_or("", |v| v.trim()),
            format!(
                "{PERMITS}={permits}: {what} promises one run at a time, which more than one \
                 permit does not keep"
            ),
            &format!("leave {name} unset (or off), or set {PERMITS}=1"),
        )
    };
    if tick_set && tick != TickSource::Off {
        return Err(refuse(TICK, "a tick (once per tick)"));
    }
    if stale_after.is_some() {
        return Err(refuse(STALE_AFTER, "dropping stale ticks"));
    }
    if coalesce {
        return Err(refuse(COALESCE, "coalescing"));
    }
    Ok(TickSource::Off)
}
