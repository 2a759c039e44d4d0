//! # flightlock-cleanup
//!
//! The sweeper as a scheduled Lambda function. Each invocation runs one
//! [`flightlock::sweep`] over the lock table: queue rows whose lease ended more than a grace
//! period ago are removed with conditional deletes; counters and live rows are never touched.
//! The function returns the [`SweepSummary`](flightlock::SweepSummary) as its response, logs
//! it, and prints one CloudWatch Embedded Metric Format line.
//!
//! ## Layout
//!
//! | module | what |
//! |---|---|
//! | [`config`] | `FLIGHTLOCK_*` environment variables, parsed from an injected map (pure) |
//! | [`event`] | per-invocation overrides in the event: `dryRun`, `grace`, `resume` (pure) |
//! | [`metrics`] | the EMF line (pure) |
//! | [`handler`] | one invocation: budget from the deadline, sweep, report |
//!
//! ## Quick start
//!
//! ```text
//! FLIGHTLOCK_TABLE=flightlock cargo lambda watch -p flightlock-cleanup
//! cargo lambda invoke flightlock-cleanup --data-file events/cleanup-dry-run.json
//! ```
//!
//! See `functions/cleanup/README.md` for the variables, costs and deployment.

pub mod config;
pub mod event;
pub mod handler;
pub mod metrics;

pub use config::{Config, ConfigError};
pub use event::{EventError, Overrides};
pub use handler::{budget, invoke, InvokeError};
