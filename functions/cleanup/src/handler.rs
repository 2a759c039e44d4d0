//! One invocation: derive the time budget from the invocation deadline, apply the event's
//! overrides, sweep, log the summary.

use std::time::{Duration, SystemTime};

use flightlock::sweep::{SweepOptions, Sweeper};
use flightlock::SweepSummary;
use serde_json::Value;

use crate::config::Config;
use crate::event::{EventError, Overrides};

/// Why an invocation failed (the sweep's own per-row errors are in the summary instead).
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The event carried an invalid override.
    #[error(transparent)]
    Event(#[from] EventError),
    /// Something the operator must fix: missing table, access denied, invalid options.
    #[error(transparent)]
    Sweep(#[from] flightlock::Error),
}

/// The sweep's time budget: the time left until `deadline` minus `margin`, so the function can
/// still report and return before Lambda stops it. With less than two margins left, half of
/// what is left.
pub fn budget(deadline: SystemTime, now: SystemTime, margin: Duration) -> Duration {
    let left = deadline.duration_since(now).unwrap_or(Duration::ZERO);
    if left > margin * 2 {
        left - margin
    } else {
        left / 2
    }
}

/// Runs one sweep for an event, within `budget`.
pub async fn invoke(
    sweeper: &Sweeper,
    config: &Config,
    event: &Value,
    budget: Duration,
) -> Result<SweepSummary, InvokeError> {
    let overrides = Overrides::from_event(event)?;
    let opts = SweepOptions {
        grace: overrides.grace.unwrap_or(config.grace),
        concurrency: config.concurrency,
        segments: config.segments,
        budget: Some(budget),
        dry_run: overrides.dry_run.unwrap_or(false),
        resume: overrides.resume,
        ..SweepOptions::default()
    };
    tracing::info!(
        table = %config.table,
        grace_ms = opts.grace.as_millis() as u64,
        budget_ms = budget.as_millis() as u64,
        dry_run = opts.dry_run,
        resuming = !opts.resume.is_empty(),
        "sweep starting"
    );
    let summary = sweeper.sweep(&opts).await?;
    tracing::info!(
        table = %config.table,
        examined = summary.items_examined,
        queue_rows = summary.queue_rows_examined,
        dead = summary.dead,
        deleted = summary.deleted,
        still_live = summary.still_live,
        revived = summary.revived,
        already_gone = summary.already_gone,
        errors = summary.errors,
        pages = summary.pages,
        duration_ms = summary.duration_ms,
        complete = summary.complete,
        dry_run = summary.dry_run,
        "sweep finished"
    );
    if !summary.complete {
        tracing::warn!(
            resume = %serde_json::to_string(&summary.resume).unwrap_or_default(),
            "sweep stopped by its time budget; the next run starts over (or pass `resume`)"
        );
    }
    for e in &summary.error_samples {
        tracing::warn!(error = %e, "sweep error");
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_keeps_the_margin_back() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let m = Duration::from_secs(5);
        assert_eq!(
            budget(now + Duration::from_secs(60), now, m),
            Duration::from_secs(55)
        );
        assert_eq!(
            budget(now + Duration::from_secs(8), now, m),
            Duration::from_secs(4)
        );
        assert_eq!(budget(now - Duration::from_secs(1), now, m), Duration::ZERO);
    }
}
