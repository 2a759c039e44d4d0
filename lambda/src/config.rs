//! The `FLIGHTLOCK_*` configuration shared by the Lambda extension and the in-process tower layer.
//!
//! Pure: [`Config::from_map`] takes the environment as a map (the binary collects
//! `std::env::vars()` once at the top; tests pass a literal map), so nothing here reads the
//! process environment. Every invalid value is a [`ConfigError`] that names the variable and the
//! accepted forms; an unknown `FLIGHTLOCK_*` name is an error too, so a typo never falls back to
//! a default silently.
//!
//! The variables ([`KNOWN`]), what each means, its accepted forms and its default are
//! documented once, in the guide's configuration reference
//! (`docs/src/reference/configuration.md`); `tests/template` checks that table against
//! [`KNOWN`] and the accepted words ([`Wait::FOREVER_WORDS`], [`ClockSkew::UNBOUNDED_WORDS`]).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::key::KeyTemplate;
use super::tick::{TickSource, TICK_FORMS};
use flightlock::options::{parse_duration, ClockSkew, LockOptions, Wait};
use flightlock::options::{parse_permits, parse_stale_after, PERMITS_FORMS, STALE_AFTER_FORMS};
use flightlock::schema::HolderInfo;

/// Prefix of every flightlock variable.
pub const PREFIX: &str = "FLIGHTLOCK_";
/// Lock table name (required).
pub const TABLE: &str = "FLIGHTLOCK_TABLE";
/// Lock key or key template.
pub const KEY: &str = "FLIGHTLOCK_KEY";
/// How long to wait for the key.
pub const WAIT: &str = "FLIGHTLOCK_WAIT";
/// What to do when the key stays held: `skip` or `error`.
pub const ON_BUSY: &str = "FLIGHTLOCK_ON_BUSY";
/// Lease length.
pub const LEASE: &str = "FLIGHTLOCK_LEASE";
/// Heartbeat interval.
pub const HEARTBEAT: &str = "FLIGHTLOCK_HEARTBEAT";
/// Clock-skew allowance.
pub const CLOCK_SKEW: &str = "FLIGHTLOCK_CLOCK_SKEW";
/// Time kept free before the invocation deadline.
pub const DEADLINE_MARGIN: &str = "FLIGHTLOCK_DEADLINE_MARGIN";
/// Proxy listener port (the extension's: parsed by `flightlock_extension::config`).
pub const PROXY_PORT: &str = "FLIGHTLOCK_PROXY_PORT";
/// Runtime API the proxy forwards to (the extension's: parsed by `flightlock_extension::config`).
pub const UPSTREAM: &str = "FLIGHTLOCK_UPSTREAM";
/// Log level.
pub const LOG_LEVEL: &str = "FLIGHTLOCK_LOG_LEVEL";
/// Metrics on or off.
pub const METRICS: &str = "FLIGHTLOCK_METRICS";
/// The extension's init check of `AWS_LAMBDA_EXEC_WRAPPER`, on or off (parsed by
/// `flightlock_extension::config`).
pub const WRAPPER_CHECK: &str = "FLIGHTLOCK_WRAPPER_CHECK";
/// Where an invocation's tick comes from: `auto`, `off` or a template.
pub const TICK: &str = "FLIGHTLOCK_TICK";
/// Drop an ordered tick older than this: a duration or `off`.
pub const STALE_AFTER: &str = "FLIGHTLOCK_STALE_AFTER";
/// Coalesce overruns (at most one later run waits, the newest), on or off.
pub const COALESCE: &str = "FLIGHTLOCK_COALESCE";
/// How many invocations may hold the key at a time (a FIFO counting semaphore): 1 to 100.
pub const PERMITS: &str = "FLIGHTLOCK_PERMITS";
/// Whether each invocation runs under its key (`on`), or none does and the handler locks what it
/// needs itself ([`crate::records`]: the extension's lock API, the in-process layer's
/// `records()`).
pub const GATE: &str = "FLIGHTLOCK_GATE";

/// Every `FLIGHTLOCK_*` variable of the Lambda integration: what [`Config::from_map`] accepts.
/// It parses all but [`PROXY_PORT`], [`UPSTREAM`] and [`WRAPPER_CHECK`], which only the extension
/// reads (and parses); the in-process layer accepts and ignores them.
pub const KNOWN: &[&str] = &[
    TABLE,
    KEY,
    WAIT,
    ON_BUSY,
    LEASE,
    HEARTBEAT,
    CLOCK_SKEW,
    DEADLINE_MARGIN,
    PROXY_PORT,
    UPSTREAM,
    LOG_LEVEL,
    METRICS,
    WRAPPER_CHECK,
    TICK,
    STALE_AFTER,
    COALESCE,
    PERMITS,
    GATE,
];

/// Lambda's variable with the function name (the default key).
pub const FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// Heartbeats never extend a lease past the invocation deadline plus this grace: a sandbox that
/// is frozen or killed mid-invocation frees the key soon after its deadline.
pub const LEASE_CAP_GRACE: Duration = Duration::from_secs(2);

/// A bad configuration value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} is invalid: {problem}; accepted: {accepted}")]
pub struct ConfigError {
    /// The variable.
    pub variable: String,
    /// Its value (empty if missing).
    pub value: String,
    /// What is wrong.
    pub problem: String,
    /// The accepted forms.
    pub accepted: String,
}

/// What to do with an invocation whose key stayed held for the whole wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBusy {
    /// Answer it with a small JSON success body (`{"flightlock":{"skipped":true,...}}`).
    Skip,
    /// Answer it with an invocation error of type [`super::responses::BUSY_ERROR_TYPE`], so async
    /// retries apply.
    Error,
}

/// The typed `FLIGHTLOCK_*` configuration. See the module docs for the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `FLIGHTLOCK_TABLE`: the lock table. Required.
    pub table: String,
    /// `FLIGHTLOCK_KEY`: the key template. Default: the function name, literally.
    pub key: KeyTemplate,
    /// `FLIGHTLOCK_WAIT`. Default `0` (skip at once when held).
    pub wait: Wait,
    /// `FLIGHTLOCK_ON_BUSY`. Default skip.
    pub on_busy: OnBusy,
    /// `FLIGHTLOCK_LEASE`. Default 20 s.
    pub lease: Duration,
    /// `FLIGHTLOCK_HEARTBEAT`. Default: a third of the lease.
    pub heartbeat: Option<Duration>,
    /// `FLIGHTLOCK_CLOCK_SKEW`. Default 1 s.
    pub clock_skew: ClockSkew,
    /// `FLIGHTLOCK_DEADLINE_MARGIN`. Default 1 s.
    pub deadline_margin: Duration,
    /// `FLIGHTLOCK_LOG_LEVEL`. Default `info`.
    pub log_level: String,
    /// `FLIGHTLOCK_METRICS`. Default on.
    pub metrics: bool,
    /// `FLIGHTLOCK_TICK`: where an invocation's tick comes from. Default `auto`: an
    /// EventBridge scheduled event's `time`, no tick for any other event.
    pub tick: TickSource,
    /// `FLIGHTLOCK_STALE_AFTER`: an ordered tick older than this is dropped (skip reason
    /// `stale`) without touching the table. Default off (`None`).
    pub stale_after: Option<Duration>,
    /// `FLIGHTLOCK_COALESCE`: at most one later run waits for the key, the newest; the one it
    /// replaces is answered `superseded`. Needs `FLIGHTLOCK_WAIT` above 0. Default off.
    pub coalesce: bool,
    /// `FLIGHTLOCK_PERMITS`: how many invocations may hold the key at a time
    /// ([`LockOptions::permits`]). Default 1. More than 1 turns the default tick (`auto`) off
    /// and refuses an explicit `FLIGHTLOCK_TICK`, `FLIGHTLOCK_STALE_AFTER` or
    /// `FLIGHTLOCK_COALESCE=on` (they promise one run at a time).
    pub permits: u32,
    /// `FLIGHTLOCK_GATE`: each invocation runs under its key. Default on. Off, no invocation is
    /// gated, and the handler locks what it needs ([`crate::records`]).
    pub gate: bool,
    /// `AWS_LAMBDA_FUNCTION_NAME`, written into rows for people.
    pub function_name: Option<String>,
}

fn err(variable: &str, value: &str, problem: impl Into<String>, accepted: &str) -> ConfigError {
    ConfigError {
        variable: variable.to_owned(),
        value: value.to_owned(),
        problem: problem.into(),
        accepted: accepted.to_owned(),
    }
}

const DURATION_FORMS: &str = "a duration such as 500ms, 10s, 2m, 1m30s (a bare number is seconds)";

impl Config {
    /// Parses the configuration from an environment map.
    pub fn from_map(env: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut unknown: Vec<&String> = env
            .keys()
            .filter(|k| k.starts_with(PREFIX) && !KNOWN.contains(&k.as_str()))
            .collect();
        unknown.sort();
        if let Some(name) = unknown.first() {
            return Err(err(
                name,
                &env[*name],
                "unknown flightlock variable (a typo?)",
                &KNOWN.join(", "),
            ));
        }
        let get = |name: &str| value(env, name);
        let function_name = get(FUNCTION_NAME);

        let table = get(TABLE).ok_or_else(|| {
            err(
                TABLE,
                "",
                "missing",
                "the name of the lock table (3-255 characters of a-z A-Z 0-9 _ . -)",
            )
        })?;
        if !(3..=255).contains(&table.len())
            || !table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(err(
                TABLE,
                &table,
                "not a DynamoDB table name",
                "3-255 characters of a-z A-Z 0-9 _ . -",
            ));
        }

        let key_src =
            match get(KEY).or_else(|| function_name.clone()) {
                Some(k) => k,
                None => return Err(err(
                    KEY,
                    "",
                    format!("missing, and {FUNCTION_NAME} is not set either"),
                    "a key such as nightly-report, or a template such as job-{/detail/accountId}",
                )),
            };
        let key = match get(KEY) {
            Some(_) => KeyTemplate::parse(&key_src).map_err(|p| {
                err(
                    KEY,
                    &key_src,
                    p,
                    "literal text with {/json/pointer} placeholders; {{ and }} for literal braces",
                )
            })?,
            None => KeyTemplate::literal(&key_src),
        };

        let wait = match get(WAIT) {
            None => Wait::NoWait,
            Some(v) => Wait::parse(&v)
                .map_err(|p| err(WAIT, &v, p, &format!("0, forever, or {DURATION_FORMS}")))?,
        };
        let on_busy = match get(ON_BUSY).as_deref() {
            None | Some("skip") => OnBusy::Skip,
            Some("error") => OnBusy::Error,
            Some(v) => return Err(err(ON_BUSY, v, "unknown policy", "skip, error")),
        };
        let duration = |name: &str| -> Result<Option<Duration>, ConfigError> {
            get(name)
                .map(|v| parse_duration(&v).map_err(|p| err(name, &v, p, DURATION_FORMS)))
                .transpose()
        };
        let defaults = LockOptions::default();
        let lease = duration(LEASE)?.unwrap_or(defaults.lease);
        let heartbeat = duration(HEARTBEAT)?;
        let clock_skew = match get(CLOCK_SKEW) {
            None => defaults.clock_skew,
            Some(v) => ClockSkew::parse(&v).map_err(|p| {
                err(
                    CLOCK_SKEW,
                    &v,
                    p,
                    &format!("unbounded (clock-free mode) or {DURATION_FORMS}"),
                )
            })?,
        };
        let deadline_margin = duration(DEADLINE_MARGIN)?.unwrap_or(Duration::from_secs(1));
        let log_level = match get(LOG_LEVEL) {
            None => "info".to_owned(),
            Some(v) => {
                let lower = v.to_ascii_lowercase();
                if !["off", "error", "warn", "info", "debug", "trace"].contains(&lower.as_str()) {
                    return Err(err(
                        LOG_LEVEL,
                        &v,
                        "unknown level",
                        "off, error, warn, info, debug, trace",
                    ));
                }
                lower
            }
        };
        let switch = |name: &str, default: bool| -> Result<bool, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) => flightlock::options::parse_switch(&v)
                    .map_err(|_| err(name, &v, "not a switch", flightlock::options::SWITCH_FORMS)),
            }
        };
        let metrics = switch(METRICS, true)?;
        let tick = match get(TICK) {
            None => TickSource::Auto,
            Some(v) => TickSource::parse(&v).map_err(|p| err(TICK, &v, p, TICK_FORMS))?,
        };
        let stale_after = match get(STALE_AFTER) {
            None => None,
            Some(v) => {
                let d = parse_stale_after(&v)
                    .map_err(|p| err(STALE_AFTER, &v, p, STALE_AFTER_FORMS))?;
                if d.is_some() && tick == TickSource::Off {
                    return Err(err(
                        STALE_AFTER,
                        &v,
                        format!("{TICK}=off: without a tick there is nothing to be stale"),
                        &format!("off, or set {TICK} to auto or a template"),
                    ));
                }
                d
            }
        };
        let coalesce = switch(COALESCE, false)?;
        let gate = switch(GATE, true)?;
        let permits = parse_permits_variable(get(PERMITS))?;
        let tick = permits_tick(
            env,
            permits,
            tick,
            get(TICK).is_some(),
            stale_after,
            coalesce,
        )?;
        if coalesce && wait == Wait::NoWait {
            return Err(err(
                COALESCE,
                env.get(COALESCE).map_or("", |v| v.trim()),
                format!(
                    "{WAIT} is 0: with no wait nothing queues, so there is nothing to coalesce into"
                ),
                &format!("off, or on with {WAIT} set to a duration or forever"),
            ));
        }

        let config = Config {
            table,
            key,
            wait,
            on_busy,
            lease,
            heartbeat,
            clock_skew,
            deadline_margin,
            log_level,
            metrics,
            tick,
            stale_after,
            coalesce,
            permits,
            gate,
            function_name,
        };
        // Check lease / heartbeat / skew against each other now, at init, not at the first
        // invocation.
        config
            .lock_options(None, SystemTime::now(), HolderInfo::default())
            .validate()
            .map_err(|e| {
                let variable = match &e {
                    flightlock::Error::InvalidOption {
                        name: "heartbeat", ..
                    } => HEARTBEAT,
                    flightlock::Error::InvalidOption {
                        name: "clock skew", ..
                    } => CLOCK_SKEW,
                    _ => LEASE,
                };
                let value = env.get(variable).cloned().unwrap_or_default();
                err(
                    variable,
                    &value,
                    e.to_string(),
                    "a lease of at least 100ms and a heartbeat of at most half the lease",
                )
            })?;
        Ok(config)
    }

    /// Settings that are valid but risky, each as a sentence for an init-time warning.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.key.reads_event() && self.on_busy == OnBusy::Skip {
            warnings.push(format!(
                "{KEY}={} reads the event and {ON_BUSY}=skip answers a busy event as a success: \
                 for SQS, Kinesis and DynamoDB Streams triggers that deletes (or steps past) the \
                 skipped records. For event sources whose events must all be processed set \
                 {ON_BUSY}=error (see the flightlock docs for each trigger type)",
                self.key
            ));
        }
        warnings
    }

    /// The options of one acquisition for an invocation whose deadline is `deadline` (`None`: no
    /// deadline), at wall time `now`: the wait is capped at `deadline - margin` (no time left:
    /// no wait, and then no coalescing either: nothing would wait), and heartbeats never extend
    /// the lease past `deadline + LEASE_CAP_GRACE`. No tick: the gate sets the invocation's.
    pub fn lock_options(
        &self,
        deadline: Option<SystemTime>,
        now: SystemTime,
        holder: HolderInfo,
    ) -> LockOptions {
        let options = self.lock_options_waiting(self.wait, deadline, now, holder);
        LockOptions {
            coalesce: self.coalesce && options.wait != Wait::NoWait,
            ..options
        }
    }

    /// [`Config::lock_options`] with `wait` in place of `FLIGHTLOCK_WAIT` (still capped at the
    /// deadline) and never coalescing: the options of a lock the handler asks for through the
    /// extension's lock API.
    pub fn lock_options_waiting(
        &self,
        wait: Wait,
        deadline: Option<SystemTime>,
        now: SystemTime,
        holder: HolderInfo,
    ) -> LockOptions {
        let wait = match deadline {
            None => wait,
            Some(d) => {
                let left = d
                    .checked_sub(self.deadline_margin)
                    .and_then(|d| d.duration_since(now).ok())
                    .unwrap_or(Duration::ZERO);
                match wait.as_duration() {
                    _ if left.is_zero() => Wait::NoWait,
                    Some(w) if w <= left => wait,
                    _ => Wait::For(left),
                }
            }
        };
        LockOptions {
            wait,
            lease: self.lease,
            heartbeat: self.heartbeat,
            clock_skew: self.clock_skew,
            holder,
            lease_cap: deadline.map(|d| d + LEASE_CAP_GRACE),
            coalesce: false,
            permits: self.permits,
            ..LockOptions::default()
        }
    }
}

/// The value of `name` in `env`, trimmed; `None` when unset or blank (Lambda consoles and
/// templates often leave variables blank, which counts as unset). Every `FLIGHTLOCK_*` reader
/// (this module, the extension's settings) reads values through it.
pub fn value(env: &HashMap<String, String>, name: &str) -> Option<String> {
    env.get(name)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

// `FLIGHTLOCK_PERMITS`: how many invocations may hold the key at a time, and what it rules out.
// More than one permit cannot be combined with a tick or coalescing: once per tick and
// coalescing promise one run at a time. The default tick (`FLIGHTLOCK_TICK` unset, `auto`) is
// turned off, so a user who only sets `FLIGHTLOCK_PERMITS` gets N at a time for every event,
// scheduled or not; an explicit `FLIGHTLOCK_TICK` (other than `off`), `FLIGHTLOCK_STALE_AFTER`
// or `FLIGHTLOCK_COALESCE=on` is refused with a [`ConfigError`] naming both variables.

/// `FLIGHTLOCK_PERMITS` (trimmed, `None` when unset or empty): [`parse_permits`], default 1.
fn parse_permits_variable(value: Option<String>) -> Result<u32, ConfigError> {
    let Some(v) = value else {
        return Ok(1);
    };
    parse_permits(&v).map_err(|problem| err(PERMITS, &v, problem, PERMITS_FORMS))
}

/// The tick source to use with `permits`: unchanged with one permit; with more, `off` (the
/// default `auto` turned off), or a [`ConfigError`] if the user explicitly asked for a tick
/// (`tick_set`), stale ticks to be dropped, or coalescing.
fn permits_tick(
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

#[cfg(test)]
mod tests;
