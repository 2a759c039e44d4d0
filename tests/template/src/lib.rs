//! Checks of `template.yaml` and of the docs against the code, plus the AWS linters.
//!
//! - the lock table's key schema and TTL attribute are the ones `flightlock::schema` uses;
//! - the lock table is retained on stack deletion unless the `TableDeletionPolicy` parameter says
//!   otherwise;
//! - each function's IAM actions (inline, or through a managed policy of the template) are
//!   exactly the DynamoDB operations its code calls (found by reading the Rust sources:
//!   `.query()`, `.scan()`, `.delete_item()`, ... and, for `TransactWriteItems`, the contained
//!   `Update`/`Put`/`Delete`/`ConditionCheck` actions, which is how IAM authorises a
//!   transaction), on the table only;
//! - every alarm watches a metric the code emits;
//! - the dashboard reads only metrics the code emits, with the dimensions they are emitted with
//!   ([`dashboard`]);
//! - every `FLIGHTLOCK_*` variable the template sets is one the code reads;
//! - layers and functions carry the build metadata `sam build` needs, and their code exists;
//! - `scripts/check-template` (cfn-lint, `sam validate --lint`, `sam validate`) passes.
//!
//! The helpers are plain functions over the parsed YAML and source text, so the checks
//! themselves are unit-tested on small inputs too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Parses a template. CloudFormation short forms (`!Ref X`) become tagged values.
pub fn load_template(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A resource's `Properties`, checking its `Type`.
pub fn properties<'a>(template: &'a Value, name: &str, kind: &str) -> Result<&'a Value, String> {
    let resource = &template["Resources"][name];
    match resource["Type"].as_str() {
        Some(t) if t == kind => Ok(&resource["Properties"]),
        other => Err(format!(
            "resource {name}: expected Type {kind}, found {other:?}"
        )),
    }
}

/// `!GetAtt X.Arn` (short or long form) → `X`.
pub fn get_att_arn(v: &Value) -> Option<String> {
    match v {
        Value::Tagged(t) if t.tag == "GetAtt" => {
            t.value.as_str()?.strip_suffix(".Arn").map(str::to_owned)
        }
        Value::Mapping(m) => {
            let parts = m.get("Fn::GetAtt")?.as_sequence()?;
            match (parts.first()?.as_str(), parts.get(1)?.as_str()) {
                (Some(res), Some("Arn")) => Some(res.to_owned()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `!Ref X` (short or long form) → `X`.
pub fn ref_name(v: &Value) -> Option<&str> {
    match v {
        Value::Tagged(t) if t.tag == "Ref" => t.value.as_str(),
        Value::Mapping(m) => m.get("Ref")?.as_str(),
        _ => None,
    }
}

/// The policy documents a function's `Policies` list names: inline documents as they are, and
/// `!Ref X` of an `AWS::IAM::ManagedPolicy` in `template` as that policy's document.
pub fn policy_documents<'a>(
    template: &'a Value,
    function: &'a Value,
) -> Result<Vec<&'a Value>, String> {
    let policies = function["Policies"]
        .as_sequence()
        .ok_or("the function has no Policies list")?;
    let mut docs = Vec::new();
    for policy in policies {
        match ref_name(policy) {
            Some(name) => {
                let managed = properties(template, name, "AWS::IAM::ManagedPolicy")?;
                docs.push(&managed["PolicyDocument"]);
            }
            None => docs.push(policy),
        }
    }
    Ok(docs)
}

/// The DynamoDB actions a function's policies allow (see [`policy_documents`]); errors if any
/// statement is not an `Allow` of named actions on exactly `table`'s ARN.
pub fn granted_actions(
    template: &Value,
    function: &Value,
    table: &str,
) -> Result<BTreeSet<String>, String> {
    let mut actions = BTreeSet::new();
    for policy in policy_documents(template, function)? {
        let statements = policy["Statement"]
            .as_sequence()
            .ok_or("only policy documents with a Statement list are allowed")?;
        for st in statements {
            if st["Effect"].as_str() != Some("Allow") {
                return Err(format!("statement {st:?} is not an Allow"));
            }
            let resources: Vec<&Value> = match &st["Resource"] {
                Value::Sequence(s) => s.iter().collect(),
                one => vec![one],
            };
            for r in resources {
                if get_att_arn(r).as_deref() != Some(table) {
                    return Err(format!("resource {r:?} is not the lock table's ARN"));
                }
            }
            let list: Vec<&Value> = match &st["Action"] {
                Value::Sequence(s) => s.iter().collect(),
                one => vec![one],
            };
            for a in list {
                let a = a.as_str().ok_or(format!("action {a:?} is not a string"))?;
                if a.contains('*') {
                    return Err(format!("wildcard action {a}"));
                }
                actions.insert(a.to_owned());
            }
        }
    }
    Ok(actions)
}

/// SDK calls and the IAM actions they need.
const CALLS: &[(&str, &str)] = &[
    (".query()", "dynamodb:Query"),
    (".scan()", "dynamodb:Scan"),
    (".get_item()", "dynamodb:GetItem"),
    (".put_item()", "dynamodb:PutItem"),
    (".update_item()", "dynamodb:UpdateItem"),
    (".delete_item()", "dynamodb:DeleteItem"),
    (".batch_get_item()", "dynamodb:BatchGetItem"),
    (".batch_write_item()", "dynamodb:BatchWriteItem"),
    (".describe_table()", "dynamodb:DescribeTable"),
    (".describe_time_to_live()", "dynamodb:DescribeTimeToLive"),
    (".create_table()", "dynamodb:CreateTable"),
    (".update_time_to_live()", "dynamodb:UpdateTimeToLive"),
];

/// Actions contained in a transaction, each authorised as its own IAM action.
const TRANSACT_PARTS: &[(&str, &str)] = &[
    ("Update::builder", "dynamodb:UpdateItem"),
    ("Put::builder", "dynamodb:PutItem"),
    ("Delete::builder", "dynamodb:DeleteItem"),
    ("ConditionCheck::builder", "dynamodb:ConditionCheckItem"),
    ("Get::builder", "dynamodb:GetItem"),
];

/// Helpers of `flightlock::table` a lock user may call, and the actions they need.
const TABLE_HELPERS: &[(&str, &[&str])] = &[
    (
        "verify_table(",
        &["dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive"],
    ),
    (
        "create_table(",
        &[
            "dynamodb:CreateTable",
            "dynamodb:DescribeTable",
            "dynamodb:DescribeTimeToLive",
            "dynamodb:UpdateTimeToLive",
        ],
    ),
];

/// The IAM actions that Rust source text calls for (comment lines ignored).
pub fn required_actions(source: &str) -> Result<BTreeSet<String>, String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut actions = BTreeSet::new();
    for (call, action) in CALLS {
        if code.contains(call) {
            actions.insert((*action).to_owned());
        }
    }
    if code.contains(".transact_write_items()") || code.contains(".transact_get_items()") {
        let parts: Vec<_> = TRANSACT_PARTS
            .iter()
            .filter(|(builder, _)| code.contains(builder))
            .collect();
        if parts.is_empty() {
            return Err("a transaction whose contained actions cannot be told".into());
        }
        actions.extend(parts.iter().map(|(_, a)| (*a).to_owned()));
    }
    for (helper, needs) in TABLE_HELPERS {
        if code.contains(&format!("table::{helper}")) {
            actions.extend(needs.iter().map(|a| (*a).to_owned()));
        }
    }
    Ok(actions)
}

/// Every `.rs` file under `dir` (none if it does not exist), skipping `skip` paths.
pub fn rust_files(dir: &Path, skip: &[&Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if skip.iter().any(|s| path == *s) {
            continue;
        }
        if path.is_dir() {
            out.extend(rust_files(&path, skip));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The union of [`required_actions`] over files.
pub fn required_by_files(files: &[PathBuf]) -> Result<BTreeSet<String>, String> {
    let mut all = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        all.extend(required_actions(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    Ok(all)
}

/// The `FLIGHTLOCK_*` variables a function's template sets.
pub fn flightlock_variables(function: &Value) -> BTreeSet<String> {
    function["Environment"]["Variables"]
        .as_mapping()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str())
                .filter(|k| k.starts_with("FLIGHTLOCK_"))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The metric an `AWS::CloudWatch::Alarm`'s properties watch: `MetricName`, or the one
/// metric of a Metrics Insights `SELECT FUNC(Metric) FROM SCHEMA(namespace, ...)` expression.
/// Returns `(namespace, metric)`.
pub fn alarm_metric(alarm: &Value) -> Result<(String, String), String> {
    if let (Some(ns), Some(name)) = (alarm["Namespace"].as_str(), alarm["MetricName"].as_str()) {
        return Ok((ns.to_owned(), name.to_owned()));
    }
    let queries = alarm["Metrics"]
        .as_sequence()
        .ok_or("the alarm has neither MetricName nor Metrics")?;
    let [query] = queries.as_slice() else {
        return Err("an alarm on more than one metric query".into());
    };
    let expr = query["Expression"]
        .as_str()
        .ok_or("the metric query has no Expression")?;
    let metric = expr
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(m, _)| m.trim())
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric()))
        .ok_or(format!("no metric in {expr:?}"))?;
    let namespace = expr
        .split_once("SCHEMA(")
        .and_then(|(_, rest)| rest.split_once(','))
        .map(|(ns, _)| ns.trim().trim_matches('"'))
        .ok_or(format!("no SCHEMA(namespace, ...) in {expr:?}"))?;
    Ok((namespace.to_owned(), metric.to_owned()))
}

pub mod dashboard;
#[cfg(test)]
mod deploy;
#[cfg(test)]
mod docs;
#[cfg(test)]
mod links;
#[cfg(test)]
mod lists;
#[cfg(test)]
mod msrv;
#[cfg(test)]
mod params;
#[cfg(test)]
mod tests;
