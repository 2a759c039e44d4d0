//! The CloudWatch Embedded Metric Format line of one sweep: namespace `flightlock`, dimension
//! `Table`, metrics `SweepExamined`, `SweepDeleted`, `SweepStillLive`, `SweepErrors` (and
//! `SweepRevived`, `SweepIncomplete`). Printed on stdout, where Lambda's log agent picks it up.

use flightlock::SweepSummary;
use serde_json::{json, Value};

/// Metric namespace.
pub const NAMESPACE: &str = "flightlock";

/// The EMF document for a sweep of `table` finished at `timestamp_ms` (epoch ms).
pub fn emf(table: &str, summary: &SweepSummary, timestamp_ms: i64) -> Value {
    let metrics = [
        ("SweepExamined", summary.items_examined),
        ("SweepDeleted", summary.deleted),
        ("SweepStillLive", summary.still_live),
        ("SweepErrors", summary.errors),
        ("SweepRevived", summary.revived),
        ("SweepIncomplete", u64::from(!summary.complete)),
    ];
    let mut doc = json!({
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["Table"]],
                "Metrics": metrics
                    .iter()
                    .map(|(name, _)| json!({"Name": name, "Unit": "Count"}))
                    .collect::<Vec<_>>(),
            }],
        },
        "Table": table,
        "DryRun": summary.dry_run,
    });
    for (name, value) in metrics {
        doc[name] = json!(value);
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emf_names_each_metric_and_carries_its_value() {
        let summary = SweepSummary {
            items_examined: 100,
            deleted: 3,
            still_live: 2,
            errors: 1,
            complete: true,
            ..SweepSummary::default()
        };
        let doc = emf("locks", &summary, 1_700_000_000_000);
        let def = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(def["Namespace"], "flightlock");
        assert_eq!(def["Dimensions"][0][0], "Table");
        assert_eq!(doc["Table"], "locks");
        assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_000_i64);
        let names: Vec<&str> = def["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap())
            .collect();
        for name in [
            "SweepExamined",
            "SweepDeleted",
            "SweepStillLive",
            "SweepErrors",
        ] {
            assert!(names.contains(&name), "{name}");
            assert!(doc[name].is_u64(), "{name} has no value");
        }
        assert_eq!(doc["SweepExamined"], 100);
        assert_eq!(doc["SweepDeleted"], 3);
        assert_eq!(doc["SweepIncomplete"], 0);
    }
}
