//! The metrics a CloudWatch dashboard's body reads, found in its widgets: plain metric arrays
//! (`["namespace", "Metric", "Dim", "value", {...}]`), Metrics Insights queries
//! (`SELECT SUM(Metric) FROM SCHEMA(namespace, Dim) ...`) and `SEARCH` expressions
//! (`SEARCH('{namespace,Dim} MetricName="Metric"', 'p99', 300)`). Pure.

use serde_yaml_ng::Value;

/// One metric a dashboard reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricRef {
    /// The widget's title.
    pub widget: String,
    /// The namespace.
    pub namespace: String,
    /// The metric name.
    pub name: String,
    /// The dimension names it is read with.
    pub dimensions: Vec<String>,
}

/// The `DashboardBody` text of a template resource's properties (a plain string or `!Sub`),
/// parsed (JSON is YAML), with `${...}` substitutions left as they are.
pub fn dashboard_body(properties: &Value) -> Result<Value, String> {
    let text = match &properties["DashboardBody"] {
        Value::String(s) => s.as_str(),
        Value::Tagged(t) if t.tag == "Sub" => t
            .value
            .as_str()
            .ok_or("DashboardBody: !Sub of something other than a string")?,
        other => return Err(format!("DashboardBody is not a string: {other:?}")),
    };
    serde_yaml_ng::from_str(text).map_err(|e| format!("DashboardBody is not JSON: {e}"))
}

/// Every metric the dashboard `body` reads. Errors on an entry it cannot read (a widget type or
/// metric form this does not know), so nothing escapes the check unread.
pub fn dashboard_metrics(body: &Value) -> Result<Vec<MetricRef>, String> {
    let widgets = body["widgets"].as_sequence().ok_or("no widgets")?;
    let mut out = Vec::new();
    for w in widgets {
        let props = &w["properties"];
        let widget = props["title"].as_str().unwrap_or_default().to_owned();
        match w["type"].as_str() {
            Some("metric") => {}
            Some("text") => continue,
            other => return Err(format!("{widget}: widget type {other:?} is not checked")),
        }
        let rows = props["metrics"]
            .as_sequence()
            .ok_or(format!("{widget}: no metrics"))?;
        for row in rows {
            let row = row.as_sequence().ok_or(format!("{widget}: {row:?}"))?;
            let reference = match row.first() {
                Some(Value::Mapping(_)) => {
                    let expr = row[0]["expression"]
                        .as_str()
                        .ok_or(format!("{widget}: an entry without an expression"))?;
                    expression_metric(expr)?
                }
                Some(Value::String(_)) => array_metric(row)?,
                _ => return Err(format!("{widget}: an empty metric entry")),
            };
            out.push(MetricRef {
                widget: widget.clone(),
                ..reference
            });
        }
    }
    Ok(out)
}

/// `["namespace", "Metric", "Dim", "value", ..., {options}]`.
fn array_metric(row: &[Value]) -> Result<MetricRef, String> {
    let strings: Vec<&str> = row.iter().filter_map(Value::as_str).collect();
    if strings.contains(&".") || strings.contains(&"..") {
        return Err(format!("shorthand metric entry {row:?}: spell it out"));
    }
    let [namespace, name, dims @ ..] = strings.as_slice() else {
        return Err(format!("metric entry {row:?} has no namespace and name"));
    };
    if dims.len() % 2 != 0 {
        return Err(format!("metric entry {row:?}: a dimension without a value"));
    }
    Ok(MetricRef {
        widget: String::new(),
        namespace: (*namespace).to_owned(),
        name: (*name).to_owned(),
        dimensions: dims.chunks(2).map(|d| d[0].to_owned()).collect(),
    })
}

/// A Metrics Insights `SELECT FUNC(Metric) FROM SCHEMA(namespace, Dim, ...)` or a
/// `SEARCH('{namespace,Dim,...} MetricName="Metric"', ...)` expression.
fn expression_metric(expr: &str) -> Result<MetricRef, String> {
    let (schema, name) = if let Some(rest) = expr.strip_prefix("SEARCH('{") {
        let (schema, rest) = rest
            .split_once('}')
            .ok_or(format!("no {{schema}} in {expr:?}"))?;
        let name = rest
            .split_once("MetricName=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(n, _)| n)
            .ok_or(format!("no MetricName=\"...\" in {expr:?}"))?;
        (schema, name)
    } else if expr.starts_with("SELECT ") {
        let name = expr
            .split_once('(')
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(n, _)| n.trim())
            .ok_or(format!("no FUNC(metric) in {expr:?}"))?;
        let schema = expr
            .split_once("SCHEMA(")
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(s, _)| s)
            .ok_or(format!("no SCHEMA(...) in {expr:?}"))?;
        (schema, name)
    } else {
        return Err(format!("expression {expr:?} is neither SEARCH nor SELECT"));
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("no metric name in {expr:?}"));
    }
    let mut parts = schema.split(',').map(|p| p.trim().trim_matches('"'));
    let namespace = parts.next().unwrap_or_default().to_owned();
    Ok(MetricRef {
        widget: String::new(),
        namespace,
        name: name.to_owned(),
        dimensions: parts.map(str::to_owned).collect(),
    })
}

#[cfg(test)]
mod tests;
