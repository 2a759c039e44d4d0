//! One source for every list: the template's parameters and outputs, the metric names, the CLI's
//! options, `LockOptions`' fields and the simulation's schedule counts are each written once in
//! the guide, and checked here against `template.yaml` and the code. And every snippet a user
//! would copy: YAML snippets parse, import only outputs the template exports and set only
//! variables the code reads, with values it accepts; each code example says under it whether a
//! test runs it or that it is not run here.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use flightlock_lambda::config::{self, Config};
use serde_yaml_ng::Value;

use crate::docs::{read, section, table, CLI, CONFIGURATION};
use crate::params::doc_files;
use crate::{load_template, repo_root};

fn template() -> Value {
    load_template(&repo_root().join("template.yaml")).unwrap()
}

fn keys(map: &Value) -> BTreeSet<String> {
    map.as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect()
}

fn set<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> BTreeSet<String> {
    items.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

#[test]
fn the_parameter_table_is_the_templates_with_its_defaults() {
    let t = template();
    let doc = read(CONFIGURATION);
    let table = table(&section(&doc, "## Template parameters"));
    assert_eq!(set(table.keys()), keys(&t["Parameters"]));
    for (name, row) in &table {
        let default = match &t["Parameters"][name.as_str()]["Default"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => panic!("{name}: default {other:?}"),
        };
        let cell = row[1].as_str();
        if default.is_empty() {
            assert!(
                cell.starts_with("empty"),
                "{name}: the default is empty; docs: {cell}"
            );
        } else {
            assert_eq!(cell, format!("`{default}`"), "{name}'s default");
        }
    }
}

#[test]
fn the_output_table_is_the_templates() {
    let doc = read(CONFIGURATION);
    let table = table(&section(&doc, "## Template outputs"));
    assert_eq!(set(table.keys()), keys(&template()["Outputs"]));
}

/// The metric names of the gate, as `Metric::name` spells them (`Metric::X => "X"`).
fn gate_metrics() -> BTreeSet<String> {
    let source = read("lambda/src/metrics.rs");
    let names: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Metric::"))
        .filter_map(|l| l.split_once(" => \""))
        .filter_map(|(variant, rest)| {
            let name = rest.split_once('"')?.0;
            (name == variant).then(|| name.to_owned())
        })
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    names
}

#[test]
fn the_metric_tables_are_the_codes() {
    let doc = read("docs/src/reference/metrics.md");
    let gate = table(&section(&doc, "## Metrics of a gated function"));
    let records = table(&section(&doc, "## Metrics of record locks"));
    let code = gate_metrics();
    // Each metric in one table: the record locks' are the `RecordLock*` names, the gate's the rest.
    let (record_code, gate_code): (BTreeSet<String>, BTreeSet<String>) =
        code.into_iter().partition(|m| m.starts_with("RecordLock"));
    assert_eq!(set(gate.keys()), gate_code, "the gate's table");
    assert_eq!(set(records.keys()), record_code, "the record locks' table");
    assert_eq!(record_code.len(), 4, "{record_code:?}");
    let sweep = table(&section(&doc, "## Metrics of the cleanup function"));
    let emf = flightlock_cleanup::metrics::emf("t", &flightlock::SweepSummary::default(), 0);
    let emitted: BTreeSet<String> = emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(set(sweep.keys()), emitted);
}

/// The long options declared in a CLI source file: each `#[arg(long ...)]` field, kebab-cased.
fn long_options(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut pending = false;
    let mut in_attr = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[arg(") {
            in_attr = true;
            pending = false;
        }
        if in_attr {
            // `long` as a word of the attribute (not `long_help`, not a value).
            if line
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == "long")
            {
                pending = true;
            }
            if line.ends_with(")]") {
                in_attr = false;
            }
            continue;
        }
        if pending {
            let field_line = line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if let Some((field, _)) = field_line.split_once(':') {
                if !field.starts_with("///") && !field.starts_with('#') {
                    found.insert(format!("--{}", field.trim().replace('_', "-")));
                    pending = false;
                }
            }
        }
    }
    found
}

/// The `--options` written in `text`.
fn options_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.len() > 2 && w.starts_with("--") && !w.starts_with("---"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_cli_synopsis_and_option_table_list_every_option_of_the_code() {
    let dir = "cli/src";
    let mut code = BTreeSet::new();
    for file in ["main.rs", "run.rs", "status.rs", "sweep.rs", "permits.rs"] {
        code.extend(long_options(&read(&format!("{dir}/{file}"))));
    }
    assert!(
        code.contains("--log-level") && code.contains("--page-size"),
        "{code:?}"
    );
    let doc = read(CLI);
    let synopsis = doc
        .split("```text\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the synopsis block");
    assert_eq!(options_in(synopsis), code, "the synopsis");
    let table = table(&doc.lines().collect::<Vec<_>>());
    let table: BTreeSet<String> = table
        .keys()
        .filter(|k| k.starts_with("--"))
        .cloned()
        .collect();
    assert_eq!(table, code, "the option table");
    // Each command's own options are on its line of the synopsis.
    for (file, command) in [
        ("run.rs", "run"),
        ("status.rs", "status"),
        ("sweep.rs", "sweep"),
        ("permits.rs", "permits"),
    ] {
        let own = long_options(&read(&format!("{dir}/{file}")));
        let start = synopsis
            .find(&format!("flightlock {command} "))
            .unwrap_or_else(|| panic!("no synopsis of {command}"));
        let end = synopsis[start + 11..]
            .find("flightlock ")
            .map_or(synopsis.len(), |i| start + 11 + i);
        let lines = options_in(&synopsis[start..end]);
        for o in own {
            assert!(
                lines.contains(&o),
                "{o} is not in the synopsis of {command}"
            );
        }
    }
}

#[test]
fn long_options_reads_fields_of_long_arguments_only() {
    let source = "#[arg(long)]\n    pub(crate) key: String,\n    /// doc\n    #[arg(\n        long,\n        env = \"X\"\n    )]\n    log_level: String,\n    #[arg(last = true)]\n    command: Vec<String>,\n";
    assert_eq!(long_options(source), set(["--key", "--log-level"]));
}

#[test]
fn the_library_option_table_is_lock_options_fields() {
    let source = read("lock/src/options.rs");
    let body = source
        .split("pub struct LockOptions {")
        .nth(1)
        .and_then(|s| s.split("\n}").next())
        .expect("struct LockOptions");
    let fields: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(
        fields.contains("wait") && fields.contains("coalesce"),
        "{fields:?}"
    );
    let doc = read("docs/src/reference/library.md");
    let table = table(&section(&doc, "## Options"));
    assert_eq!(set(table.keys()), fields);
}

/// `2000` → `2,000`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn the_simulations_schedule_counts_are_the_tests() {
    let source = read("lock/src/sim/tests.rs");
    let seeds: u64 = source
        .lines()
        .find_map(|l| {
            let l = l.strip_prefix("pub(super) ").unwrap_or(l);
            l.strip_prefix("const SEEDS: u64 = ")
        })
        .and_then(|v| v.trim_end_matches(';').replace('_', "").parse().ok())
        .expect("const SEEDS in lock/src/sim/tests.rs");
    assert!(
        source.contains("env_u64(\"FLIGHTLOCK_SIM_SEEDS\", SEEDS) / 3"),
        "the clock-free run is no longer a third of SEEDS: update this test and the docs"
    );
    let doc = read("docs/src/internals/proofs.md");
    let claim = format!(
        "explores {} schedules, plus {} with every participant clock-free",
        thousands(seeds),
        thousands(seeds / 3)
    );
    assert!(
        doc.replace('\n', " ").contains(&claim),
        "proofs.md should say: {claim}"
    );
    assert_eq!(thousands(2000), "2,000");
    assert_eq!(thousands(666), "666");
}

/// The fenced code blocks of a Markdown text: (language, body, the line after the fence).
pub(crate) fn code_blocks(text: &str) -> Vec<(String, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if let Some(lang) = line.strip_prefix("```") {
            let indent = lines[i].len() - line.len();
            let mut body = String::new();
            let mut j = i + 1;
            while j < lines.len() && !lines[j].trim_start().starts_with("```") {
                body.push_str(lines[j].get(indent..).unwrap_or(lines[j].trim_start()));
                body.push('\n');
                j += 1;
            }
            blocks.push((lang.trim().to_owned(), body, j + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    blocks
}

/// The lines of the crate's doctest in `lock/src/lib.rs` that a reader sees (without `# `).
fn crate_doctest() -> String {
    let lib = read("lock/src/lib.rs");
    let body = lib
        .split("//! ```no_run\n")
        .nth(1)
        .and_then(|s| s.split("//! ```\n").next())
        .expect("the doctest in lock/src/lib.rs");
    let mut code = String::new();
    for line in body.lines() {
        let line = line
            .strip_prefix("//! ")
            .unwrap_or(line.trim_start_matches("//!"));
        if line != "#" && !line.starts_with("# ") {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

#[test]
fn the_rust_quick_starts_are_the_crates_doctest() {
    let doctest = crate_doctest();
    assert!(doctest.contains("locker.acquire("), "{doctest}");
    for path in ["lock/README.md", "docs/src/reference/library.md"] {
        let text = read(path);
        let rust: Vec<String> = code_blocks(&text)
            .into_iter()
            .filter(|(lang, _, _)| lang == "rust")
            .map(|(_, body, _)| body)
            .collect();
        assert_eq!(rust.len(), 1, "{path}: one Rust block");
        assert_eq!(
            rust[0], doctest,
            "{path}'s quick start is not lock/src/lib.rs's doctest"
        );
    }
}

/// Languages of snippets a user would copy and run; JSON and text blocks show answers.
const SNIPPET_LANGUAGES: &[&str] = &["sh", "yaml", "js", "python", "rust", "dockerfile"];

/// The note under a snippet: the first non-empty line after it, an italic paragraph.
fn note_after(text: &str, line: usize) -> Option<&str> {
    text.lines()
        .skip(line)
        .map(str::trim)
        .find(|l| !l.is_empty())
}

fn shown(file: &Path) -> String {
    file.strip_prefix(repo_root())
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn every_snippet_says_whether_it_is_run() {
    let mut problems = Vec::new();
    let mut snippets = 0;
    for file in doc_files() {
        // The crate's and the function folders' READMEs point into the guide; the guide and
        // the top README carry the snippets.
        let name = shown(&file);
        if !(name.starts_with("docs/src") || name == "README.md") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (lang, _, after) in code_blocks(&text) {
            if !SNIPPET_LANGUAGES.contains(&lang.as_str()) {
                continue;
            }
            snippets += 1;
            let note = note_after(&text, after).unwrap_or_default();
            if note.starts_with("```") {
                continue; // blocks in a row share the note under the last one
            }
            let says = note.starts_with('*')
                && ["run", "Run", "Checked", "Compiled"]
                    .iter()
                    .any(|w| note.contains(w));
            if !says {
                problems.push(format!("{name}:{after}: a {lang} snippet without a note under it saying whether it is run (got {note:?})"));
            }
        }
    }
    assert!(snippets > 20, "only {snippets} snippets found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A snippet that attaches the layer pins it to a release: `{{resolve:ssm:/flightlock/layer/<arch>/latest}}`
/// moves at every deploy of the flightlock stack (and CloudFormation does not promise to notice
/// that it moved), so the pages show `<arch>/<version>`, or `latest:N` (SSM's own history). A
/// lookup of `latest` outside a dynamic reference (`aws ssm get-parameter`) is not an attachment.
#[test]
fn attach_snippets_pin_the_layer_to_a_release() {
    let unpinned = "/layer/x86_64/latest}}";
    let unpinned_arm = "/layer/arm64/latest}}";
    let mut problems = Vec::new();
    let mut pinned = 0;
    for file in doc_files() {
        let name = shown(&file);
        let text = std::fs::read_to_string(&file).unwrap();
        for (_, body, after) in code_blocks(&text) {
            for line in body
                .lines()
                .filter(|l| l.contains("{{resolve:ssm:") && l.contains("/layer/"))
            {
                if line.contains(unpinned) || line.contains(unpinned_arm) {
                    problems.push(format!(
                        "{name}: the block ending at line {after} attaches `latest`: {}",
                        line.trim()
                    ));
                } else {
                    pinned += 1;
                }
            }
        }
    }
    assert!(pinned >= 3, "only {pinned} pinned attachments found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every `!ImportValue X` in a YAML value, and every `Variables` mapping.
fn walk<'a>(v: &'a Value, imports: &mut Vec<String>, variables: &mut Vec<&'a Value>) {
    match v {
        Value::Tagged(t) => {
            if t.tag == "ImportValue" {
                if let Some(s) = t.value.as_str() {
                    imports.push(s.to_owned());
                }
            }
            walk(&t.value, imports, variables);
        }
        Value::Mapping(m) => {
            for (k, child) in m {
                if k.as_str() == Some("Variables") {
                    variables.push(child);
                }
                walk(child, imports, variables);
            }
        }
        Value::Sequence(s) => s.iter().for_each(|c| walk(c, imports, variables)),
        _ => {}
    }
}

#[test]
fn the_attach_snippets_use_the_templates_outputs() {
    let outputs = keys(&template()["Outputs"]);
    let mut yaml_snippets = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (lang, body, after) in code_blocks(&text) {
            if lang != "yaml" {
                continue;
            }
            yaml_snippets += 1;
            let at = format!("{}:{after}", shown(&file));
            let doc: Value =
                serde_yaml_ng::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}\n{body}"));
            let (mut imports, mut variables) = (Vec::new(), Vec::new());
            walk(&doc, &mut imports, &mut variables);
            for import in imports {
                let output = import
                    .strip_prefix("flightlock-")
                    .unwrap_or_else(|| panic!("{at}: import {import} is not of stack flightlock"));
                assert!(outputs.contains(output), "{at}: no output {output}");
            }
            for vars in variables {
                // Lambda sets the function name: the default key.
                let mut env = HashMap::from([(config::FUNCTION_NAME.to_owned(), "job".to_owned())]);
                for (k, v) in vars.as_mapping().unwrap() {
                    let name = k.as_str().unwrap();
                    let value = match v {
                        // An SSM parameter the stack writes: the table's name.
                        Value::String(s) if s.starts_with("{{resolve:ssm:") => "locks".to_owned(),
                        Value::String(s) => s.clone(),
                        Value::Tagged(_) => "locks".to_owned(), // an import: the table's name
                        other => panic!("{at}: {name}: {other:?}"),
                    };
                    if name == "AWS_LAMBDA_EXEC_WRAPPER" {
                        assert_eq!(value, "/opt/flightlock-wrapper", "{at}");
                    } else if name.starts_with("FLIGHTLOCK_") {
                        env.insert(name.to_owned(), value);
                    }
                }
                assert!(env.contains_key(config::TABLE), "{at}: no FLIGHTLOCK_TABLE");
                if let Err(e) = Config::from_map(&env) {
                    panic!("{at}: the code refuses these variables: {e}");
                }
            }
        }
    }
    assert!(
        yaml_snippets >= 4,
        "only {yaml_snippets} YAML snippets found"
    );
}

/// The `AWS::CloudWatch::Alarm` resources of the template.
fn template_alarms() -> BTreeSet<String> {
    template()["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some("AWS::CloudWatch::Alarm"))
        .map(|(name, _)| name.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_alarm_table_is_the_templates() {
    let doc = read("docs/src/operations/alarms.md");
    let documented = set(table(&doc.lines().collect::<Vec<_>>()).keys());
    let alarms = template_alarms();
    assert!(alarms.contains("RecordLockLostAlarm"), "{alarms:?}");
    assert_eq!(documented, alarms);
}

#[test]
fn the_dashboard_page_names_every_metric_the_dashboard_reads() {
    let t = template();
    let body =
        crate::dashboard::dashboard_body(&t["Resources"]["FlightlockDashboard"]["Properties"])
            .unwrap();
    let widgets: BTreeSet<String> = crate::dashboard::dashboard_metrics(&body)
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    // Every metric the code emits: the lock's and the sweeper's.
    let mut metrics = gate_metrics();
    let emf = flightlock_cleanup::metrics::emf("t", &flightlock::SweepSummary::default(), 0);
    metrics.extend(
        emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap().to_owned()),
    );
    // The metric column of the widget table: every backticked metric name in it.
    let doc = read("docs/src/operations/dashboard.md");
    let named: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| widget"))
        .filter_map(|l| l.split('|').nth(2))
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|w| metrics.contains(w))
        .collect();
    assert!(widgets.contains("RecordLockBusy"), "{widgets:?}");
    assert_eq!(
        named, widgets,
        "the metrics the dashboard page names, and the ones its widgets read"
    );
}
