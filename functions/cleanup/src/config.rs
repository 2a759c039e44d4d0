//! Configuration: `FLIGHTLOCK_*` environment variables, parsed from an injected map so tests
//! never touch the process environment. Invalid values are errors that name the variable and
//! the accepted forms; there is no silent fallback to a default. An unknown `FLIGHTLOCK_*` name
//! is an error too (a typo such as `FLIGHTLOCK_SWEEP_GRAEC` would otherwise leave the default in
//! force), as in the extension.
//!
//! The variables ([`KNOWN`]) are documented once, in the table of this crate's README;
//! `tests/template` checks that table against [`KNOWN`].

use std::collections::HashMap;
use std::time::Duration;

use flightlock::sweep::{
    SweepOptions, DEFAULT_CONCURRENCY, DEFAULT_GRACE, MAX_CONCURRENCY, MIN_GRACE,
};

/// Lock table name (required).
pub const TABLE: &str = "FLIGHTLOCK_TABLE";
/// Grace after a lease end before a row is swept.
pub const SWEEP_GRACE: &str = "FLIGHTLOCK_SWEEP_GRACE";
/// Conditional deletes in flight.
pub const SWEEP_CONCURRENCY: &str = "FLIGHTLOCK_SWEEP_CONCURRENCY";
/// Parallel scan segments.
pub const SWEEP_SEGMENTS: &str = "FLIGHTLOCK_SWEEP_SEGMENTS";
/// Time kept back before the invocation deadline.
pub const SWEEP_MARGIN: &str = "FLIGHTLOCK_SWEEP_MARGIN";
/// Metrics on or off.
pub const METRICS: &str = "FLIGHTLOCK_METRICS";

/// Every variable [`Config::from_map`] reads.
pub const KNOWN: &[&str] = &[
    TABLE,
    SWEEP_GRACE,
    SWEEP_CONCURRENCY,
    SWEEP_SEGMENTS,
    SWEEP_MARGIN,
    METRICS,
];

/// What [`ConfigError::variable`] says for a `FLIGHTLOCK_*` name that is not in [`KNOWN`] (the
/// name itself is the error's value).
pub const UNKNOWN: &str = "FLIGHTLOCK_*";

/// Default [`Config::margin`].
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(5);

/// A variable that is missing or does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {problem}")]
pub struct ConfigError {
    /// The variable's name.
    pub variable: &'static str,
    /// Its value (empty when missing).
    pub value: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

/// The function's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Lock table name.
    pub table: String,
    /// Sweep grace. Default 10 minutes.
    pub grace: Duration,
    /// Conditional deletes in flight. Default 16.
    pub concurrency: usize,
    /// Parallel scan segments. Default 1.
    pub segments: u32,
    /// Time kept back before the invocation deadline. Default 5 s.
    pub margin: Duration,
    /// Print the EMF line. Default on.
    pub metrics: bool,
}

impl Config {
    /// Parses the configuration from environment-like pairs.
    pub fn from_map(env: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut unknown: Vec<&String> = env
            .keys()
            .filter(|k| {
                k.starts_with(flightlock_lambda::config::PREFIX) && !KNOWN.contains(&k.as_str())
            })
            .collect();
        unknown.sort();
        if let Some(name) = unknown.first() {
            return Err(ConfigError {
                variable: UNKNOWN,
                value: (*name).clone(),
                problem: format!(
                    "unknown variable of the cleanup function (a typo?); it reads {}",
                    KNOWN.join(", ")
                ),
            });
        }
        let get = |name: &str| env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let err = |variable, value: &str, problem: String| ConfigError {
            variable,
            value: value.to_owned(),
            problem,
        };
        let table = get(TABLE)
            .ok_or_else(|| {
                err(
                    TABLE,
                    "",
                    "is required: set it to the lock table's name (template.yaml passes the \
                     table it creates)"
                        .into(),
                )
            })?
            .to_owned();
        let duration = |name: &'static str, default: Duration, min: Duration| match get(name) {
            None => Ok(default),
            Some(v) => match flightlock::parse_duration(v) {
                Ok(d) if d >= min => Ok(d),
                Ok(d) => Err(err(name, v, format!("{d:?} is below the minimum {min:?}"))),
                Err(e) => Err(err(name, v, e)),
            },
        };
        let number = |name: &'static str, default: usize| match get(name) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_CONCURRENCY).contains(&n) => Ok(n),
                _ => Err(err(
                    name,
                    v,
                    format!("expected a whole number from 1 to {MAX_CONCURRENCY}"),
                )),
            },
        };
        let metrics = match get(METRICS) {
            None => true,
            Some(v) => flightlock::parse_switch(v).map_err(|e| err(METRICS, v, e))?,
        };
        let defaults = SweepOptions::default();
        Ok(Config {
            table,
            grace: duration(SWEEP_GRACE, DEFAULT_GRACE, MIN_GRACE)?,
            concurrency: number(SWEEP_CONCURRENCY, DEFAULT_CONCURRENCY)?,
            // At most MAX_CONCURRENCY, so it fits.
            segments: u32::try_from(number(SWEEP_SEGMENTS, defaults.segments as usize)?)
                .unwrap_or(defaults.segments),
            margin: duration(SWEEP_MARGIN, DEFAULT_MARGIN, Duration::ZERO)?,
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_need_only_the_table() {
        let c = Config::from_map(&env(&[(TABLE, "locks")])).unwrap();
        assert_eq!(
            c,
            Config {
                table: "locks".into(),
                grace: Duration::from_secs(600),
                concurrency: 16,
                segments: 1,
                margin: Duration::from_secs(5),
                metrics: true,
            }
        );
    }

    #[test]
    fn every_variable_is_read() {
        let c = Config::from_map(&env(&[
            (TABLE, "t"),
            (SWEEP_GRACE, "15m"),
            (SWEEP_CONCURRENCY, "4"),
            (SWEEP_SEGMENTS, "2"),
            (SWEEP_MARGIN, "2s"),
            (METRICS, "off"),
        ]))
        .unwrap();
        assert_eq!(c.grace, Duration::from_secs(900));
        assert_eq!((c.concurrency, c.segments), (4, 2));
        assert_eq!(c.margin, Duration::from_secs(2));
        assert!(!c.metrics);
    }

    #[test]
    fn metrics_reads_the_same_switch_words_as_the_extension() {
        let words = flightlock::options::SWITCH_ON_WORDS
            .iter()
            .map(|w| (w, true))
            .chain(
                flightlock::options::SWITCH_OFF_WORDS
                    .iter()
                    .map(|w| (w, false)),
            );
        for (word, on) in words {
            let c = Config::from_map(&env(&[(TABLE, "t"), (METRICS, &word.to_uppercase())]));
            assert_eq!(c.map(|c| c.metrics), Ok(on), "{METRICS}={word}");
        }
    }

    #[test]
    fn unknown_flightlock_variables_are_errors_other_variables_are_not() {
        let e =
            Config::from_map(&env(&[(TABLE, "t"), ("FLIGHTLOCK_SWEEP_GRAEC", "1h")])).unwrap_err();
        assert_eq!(e.variable, UNKNOWN);
        assert_eq!(e.value, "FLIGHTLOCK_SWEEP_GRAEC");
        assert!(e.to_string().contains(SWEEP_GRACE), "{e}");
        // The extension's variables are not the sweeper's.
        assert!(Config::from_map(&env(&[(TABLE, "t"), ("FLIGHTLOCK_WAIT", "0")])).is_err());
        let c = Config::from_map(&env(&[(TABLE, "t"), ("AWS_REGION", "eu-west-1")])).unwrap();
        assert_eq!(c.table, "t");
    }

    #[test]
    fn errors_name_the_variable() {
        let e = Config::from_map(&env(&[])).unwrap_err();
        assert_eq!(e.variable, TABLE);
        assert!(e.to_string().contains("FLIGHTLOCK_TABLE"));
        for (name, value) in [
            (SWEEP_GRACE, "soon"),
            (SWEEP_GRACE, "10ms"),
            (SWEEP_CONCURRENCY, "0"),
            (SWEEP_CONCURRENCY, "many"),
            (SWEEP_SEGMENTS, "100000"),
            (METRICS, "maybe"),
        ] {
            let e = Config::from_map(&env(&[(TABLE, "t"), (name, value)])).unwrap_err();
            assert_eq!(e.variable, name, "{e}");
            assert!(e.to_string().contains(name) && e.to_string().contains(value));
        }
    }
}
