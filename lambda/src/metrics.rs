//! CloudWatch Embedded Metric Format: one JSON line per value on stdout, which CloudWatch Logs
//! turns into metrics in namespace [`NAMESPACE`] without an API call. Used by the gate (both
//! adapters), the extension, and the record locks a handler takes (`records`, through the
//! extension's lock API or the in-process layer's `records()`), whose metrics are named
//! `RecordLock*` so that they never add up with the gate's.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Metric namespace.
pub const NAMESPACE: &str = "flightlock";

/// The metrics flightlock emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// An invocation got the lock (Count).
    Acquired,
    /// An invocation was answered without running: key busy, policy `skip` (Count).
    Skipped,
    /// An invocation was answered with `FlightlockBusy`: key busy, policy `error` (Count).
    BusyErrors,
    /// How long an acquisition waited (Milliseconds), acquired or not.
    WaitTime,
    /// A held lock was lost while the handler ran (Count).
    LockLost,
    /// Heartbeats that failed and were retried (Count).
    HeartbeatErrors,
    /// Releases that failed (Count); the row then goes stale after one lease.
    ReleaseErrors,
    /// INVOKE events for requests that never went through the proxy: the wrapper is not
    /// configured and the lock is NOT enforced (Count; extension only).
    UnenforcedInvocations,
    /// The key template could not be rendered from the event (Count).
    KeyErrors,
    /// The lock could not be taken for another reason, e.g. DynamoDB unreachable (Count).
    LockErrors,
    /// An invocation was answered without running: its tick already ran successfully
    /// (Count; skip reason `duplicate`).
    Duplicates,
    /// An invocation was answered without running: its tick is older than
    /// `FLIGHTLOCK_STALE_AFTER` (Count; skip reason `stale`).
    StaleTicks,
    /// A waiting invocation was answered without running: a newer tick replaced it
    /// (`FLIGHTLOCK_COALESCE`; Count; skip reason `superseded`).
    Superseded,
    /// The invocation's tick could not be found or checked (Count; `FlightlockTickError`).
    TickErrors,
    /// A run succeeded but its tick could not be marked done: a retry of it will run again
    /// (Count).
    TickMarkErrors,
    /// An event from the Runtime API could not be gated (no usable request id, unreadable
    /// body) and was failed, never passed on ungated (Count; extension only).
    EventErrors,
    /// A handler took a record lock (lock API or `records()`; Count).
    RecordLockAcquired,
    /// A record lock's key stayed held for the whole wait: the handler was answered busy
    /// (Count).
    RecordLockBusy,
    /// A record lock was found lost when it was given back (its lease ran out or another holder
    /// took over): the work done under it was not protected (Count).
    RecordLockLost,
    /// A record lock could not be taken or given back for another reason: DynamoDB refused or
    /// did not answer before the invocation's deadline, the key allows another number of
    /// holders, or it runs a newer protocol (Count).
    RecordLockErrors,
}

impl Metric {
    /// The metric name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Acquired => "Acquired",
            Metric::Skipped => "Skipped",
            Metric::BusyErrors => "BusyErrors",
            Metric::WaitTime => "WaitTime",
            Metric::LockLost => "LockLost",
            Metric::HeartbeatErrors => "HeartbeatErrors",
            Metric::ReleaseErrors => "ReleaseErrors",
            Metric::UnenforcedInvocations => "UnenforcedInvocations",
            Metric::KeyErrors => "KeyErrors",
            Metric::LockErrors => "LockErrors",
            Metric::EventErrors => "EventErrors",
            Metric::Duplicates => "Duplicates",
            Metric::StaleTicks => "StaleTicks",
            Metric::Superseded => "Superseded",
            Metric::TickErrors => "TickErrors",
            Metric::TickMarkErrors => "TickMarkErrors",
            Metric::RecordLockAcquired => "RecordLockAcquired",
            Metric::RecordLockBusy => "RecordLockBusy",
            Metric::RecordLockLost => "RecordLockLost",
            Metric::RecordLockErrors => "RecordLockErrors",
        }
    }

    /// The CloudWatch unit.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::WaitTime => "Milliseconds",
            _ => "Count",
        }
    }
}

/// One EMF line (without the newline) for `metric` = `value` at `timestamp_ms`, dimension
/// `FunctionName`. Pure.
pub fn emf_line(function: &str, metric: Metric, value: f64, timestamp_ms: u128) -> String {
    let mut doc = serde_json::json!({
        "_aws": {
            "Timestamp": timestamp_ms as u64,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["FunctionName"]],
                "Metrics": [{ "Name": metric.name(), "Unit": metric.unit() }],
            }],
        },
        "FunctionName": function,
    });
    doc[metric.name()] = serde_json::json!(value);
    doc.to_string()
}

/// Prints EMF lines to stdout when enabled (Lambda ships stdout to CloudWatch Logs, which turns
/// them into metrics without any API call).
#[derive(Debug, Clone)]
pub struct Metrics {
    enabled: bool,
    function: String,
    /// Where the lines go: stdout, or kept in memory ([`Metrics::captured`]).
    kept: Option<Arc<Mutex<Vec<String>>>>,
}

impl Metrics {
    /// Metrics for `function`; `enabled = false` prints nothing.
    pub fn new(enabled: bool, function: impl Into<String>) -> Metrics {
        Metrics {
            enabled,
            function: function.into(),
            kept: None,
        }
    }

    /// Metrics for `function` whose lines are kept in the returned list instead of printed:
    /// what a test reads to see what the code emitted.
    pub fn captured(function: impl Into<String>) -> (Metrics, Arc<Mutex<Vec<String>>>) {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics {
            enabled: true,
            function: function.into(),
            kept: Some(kept.clone()),
        };
        (metrics, kept)
    }

    /// Emits one value.
    pub fn put(&self, metric: Metric, value: f64) {
        if !self.enabled {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let line = emf_line(&self.function, metric, value, now);
        if let Some(kept) = &self.kept {
            kept.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            return;
        }
        // One write per line, so concurrent invocations never interleave inside a line.
        let mut out = std::io::stdout().lock();
        if let Err(e) = out
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| out.flush())
        {
            tracing::warn!(error = %e, metric = metric.name(), "could not write a metric line");
        }
    }

    /// Emits a count of one.
    pub fn count(&self, metric: Metric) {
        self.put(metric, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_valid_emf() {
        let line = emf_line("f", Metric::WaitTime, 12.5, 1_700_000_000_000);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["_aws"]["CloudWatchMetrics"][0]["Namespace"], "flightlock");
        assert_eq!(
            v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"],
            "WaitTime"
        );
        assert_eq!(
            v["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"],
            "Milliseconds"
        );
        assert_eq!(v["_aws"]["Timestamp"], 1_700_000_000_000u64);
        assert_eq!(v["FunctionName"], "f");
        assert_eq!(v["WaitTime"], 12.5);
        assert!(!line.contains('\n'));
    }

    #[test]
    fn record_lock_metrics_are_counts_under_their_own_names() {
        for (metric, name) in [
            (Metric::RecordLockAcquired, "RecordLockAcquired"),
            (Metric::RecordLockBusy, "RecordLockBusy"),
            (Metric::RecordLockLost, "RecordLockLost"),
            (Metric::RecordLockErrors, "RecordLockErrors"),
        ] {
            let v: serde_json::Value =
                serde_json::from_str(&emf_line("f", metric, 1.0, 0)).unwrap();
            let def = &v["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(def["Metrics"][0]["Name"], name);
            assert_eq!(def["Metrics"][0]["Unit"], "Count");
            assert_eq!(def["Dimensions"], serde_json::json!([["FunctionName"]]));
            assert_eq!(v[name], 1.0);
        }
    }

    #[test]
    fn captured_metrics_keep_the_lines_they_would_print() {
        let (metrics, kept) = Metrics::captured("f");
        metrics.count(Metric::RecordLockBusy);
        let kept = kept.lock().unwrap();
        assert_eq!(kept.len(), 1);
        let v: serde_json::Value = serde_json::from_str(&kept[0]).unwrap();
        assert_eq!(v["RecordLockBusy"], 1.0);
        assert_eq!(v["FunctionName"], "f");
    }
}
