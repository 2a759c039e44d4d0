#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use flightlock_lambda::metrics::{emf_line, Metric};
use serde_yaml_ng::Value;

use super::*;
use crate::{load_template, properties, repo_root};

/// The extension's and the in-process layer's metric names, as `Metric::name` spells them in
/// `lambda/src/metrics.rs` (`Metric::X => "Name"`): a renamed metric changes this set.
fn lambda_metrics() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo_root().join("lambda/src/metrics.rs")).unwrap();
    let body = source
        .split_once("pub fn name(self)")
        .and_then(|(_, rest)| rest.split_once("pub fn unit(self)"))
        .map(|(body, _)| body)
        .expect("Metric::name in lambda/src/metrics.rs");
    let names: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.split_once("=> \"")?.1.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(names.contains("WaitTime"), "{names:?}");
    names
}

/// JSON text as a value (JSON is YAML).
fn parse(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// The sweeper's metric names and dimensions, from the EMF document it prints.
fn sweeper_emf() -> (BTreeSet<String>, Value) {
    let emf = flightlock_cleanup::metrics::emf("t", &flightlock::SweepSummary::default(), 0);
    let emf = parse(&emf.to_string());
    let def = &emf["_aws"]["CloudWatchMetrics"][0];
    let names = def["Metrics"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap().to_owned())
        .collect();
    (names, def["Dimensions"].clone())
}

fn template_dashboard() -> (Value, Value) {
    let t = load_template(&repo_root().join("template.yaml")).unwrap();
    let props = properties(&t, "FlightlockDashboard", "AWS::CloudWatch::Dashboard")
        .unwrap()
        .clone();
    (t, props)
}

#[test]
fn the_dashboard_is_optional_and_on_by_default() {
    let (t, _) = template_dashboard();
    assert_eq!(
        t["Resources"]["FlightlockDashboard"]["Condition"].as_str(),
        Some("CreateDashboard")
    );
    assert_eq!(
        t["Parameters"]["Dashboard"]["Default"].as_str(),
        Some("true")
    );
    let cond = &t["Conditions"]["CreateDashboard"];
    // Dashboard=true, and only with the table's part (Deploy): its sweep widget reads the table.
    let Value::Tagged(and) = cond else {
        panic!("{cond:?}")
    };
    assert_eq!(and.tag, "And", "{cond:?}");
    assert!(
        matches!(&and.value[0], Value::Tagged(e) if e.tag == "Equals"
            && crate::ref_name(&e.value[0]) == Some("Dashboard")
            && e.value[1].as_str() == Some("true")),
        "{cond:?}"
    );
    assert!(
        matches!(&and.value[1], Value::Tagged(e) if e.tag == "Condition"
            && e.value.as_str() == Some("DeployTable")),
        "{cond:?}"
    );
}

#[test]
fn the_dashboard_reads_only_metrics_the_code_emits_with_their_own_dimensions() {
    // What the code emits: the lock's metrics with FunctionName only, the sweeper's with Table
    // only. No key, tenant or request id is ever a dimension.
    let line = parse(&emf_line("f", Metric::Acquired, 1.0, 0));
    assert_eq!(
        line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        parse(r#"[["FunctionName"]]"#)
    );
    let (sweeper, sweeper_dims) = sweeper_emf();
    assert_eq!(sweeper_dims, parse(r#"[["Table"]]"#));
    let lambda = lambda_metrics();

    let (_, props) = template_dashboard();
    let read = dashboard_metrics(&dashboard_body(&props).unwrap()).unwrap();
    for m in &read {
        assert_eq!(m.namespace, "flightlock", "{m:?}");
        if sweeper.contains(&m.name) {
            assert_eq!(m.dimensions, ["Table"], "{m:?}");
        } else {
            assert!(
                lambda.contains(&m.name),
                "the widget {:?} reads {}, which nothing emits",
                m.widget,
                m.name
            );
            assert_eq!(m.dimensions, ["FunctionName"], "{m:?}");
        }
    }
    // What the dashboard is for.
    let names: BTreeSet<&str> = read.iter().map(|m| m.name.as_str()).collect();
    for wanted in [
        "WaitTime",
        "Acquired",
        "Skipped",
        "Duplicates",
        "StaleTicks",
        "Superseded",
        "LockLost",
        "UnenforcedInvocations",
        "RecordLockAcquired",
        "RecordLockBusy",
        "RecordLockLost",
        "RecordLockErrors",
        "SweepDeleted",
        "SweepStillLive",
        "SweepErrors",
        "SweepIncomplete",
    ] {
        assert!(names.contains(wanted), "no widget reads {wanted}");
    }
    let Value::Tagged(sub) = &props["DashboardBody"] else {
        panic!("DashboardBody is a !Sub");
    };
    let text = sub.value.as_str().unwrap();
    for stat in ["'p50'", "'p99'"] {
        assert!(text.contains(stat), "no {stat} wait percentile");
    }
    // The sweep widget reads this stack's table, nothing else.
    assert!(text.contains("\"Table\", \"${LockTable}\""), "{text}");
}

#[test]
fn dashboard_metrics_reads_each_form_and_refuses_what_it_cannot_read() {
    let body = parse(
        r#"{"widgets": [
            {"type": "text", "properties": {"markdown": "hi"}},
            {"type": "metric", "properties": {"title": "w", "metrics": [
                ["ns", "A", "Table", "t", {"stat": "Sum"}],
                [{"expression": "SELECT SUM(B) FROM SCHEMA(ns, FunctionName) GROUP BY FunctionName"}],
                [{"expression": "SEARCH('{ns,FunctionName} MetricName=\"C\"', 'p99', 300)"}]
            ]}}
        ]}"#,
    );
    let read = dashboard_metrics(&body).unwrap();
    let simple: Vec<(&str, &str, Vec<&str>)> = read
        .iter()
        .map(|m| {
            (
                m.namespace.as_str(),
                m.name.as_str(),
                m.dimensions.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        simple,
        [
            ("ns", "A", vec!["Table"]),
            ("ns", "B", vec!["FunctionName"]),
            ("ns", "C", vec!["FunctionName"]),
        ]
    );
    for bad in [
        r#"{"widgets": [{"type": "log", "properties": {}}]}"#,
        r#"{"widgets": [{"type": "metric", "properties": {"metrics": [[".", "A"]]}}]}"#,
        r#"{"widgets": [{"type": "metric", "properties": {"metrics": [["ns", "A", "Table"]]}}]}"#,
        r#"{"widgets": [{"type": "metric", "properties": {"metrics": [[{"expression": "m1 + m2"}]]}}]}"#,
        r#"{"widgets": [{"type": "metric", "properties": {"metrics": [[{"id": "x"}]]}}]}"#,
    ] {
        assert!(dashboard_metrics(&parse(bad)).is_err(), "{bad}");
    }
}
