//! Sentences of the docs that state a default, a field, an outcome, a figure or a file, checked
//! against where that comes from:
//!
//! - the defaults of the configuration reference's variable tables: setting a variable to its
//!   documented default changes nothing the code parses (`Config`, `Settings`, the cleanup
//!   function's `Config`), the library's option defaults are `LockOptions::default()`, and the
//!   CLI reference's defaults are the `default_value` and `env` of each option's `#[arg]`;
//! - the error types of the responses reference are the `*_ERROR_TYPE` constants of
//!   `lambda/src/responses.rs`, and its skip reasons are `SkipReason`'s words;
//! - every complete skip body the docs show has exactly the fields `skipped_body` writes, and
//!   the cleanup page's sweep summary those of `SweepSummary`, with every `RowOutcome` listed;
//! - the metric reference says which adapter emits each metric, as the code does;
//! - the client-context entries of "In the handler" are the constants of
//!   `lambda/src/client_context.rs`;
//! - the library reference lists every `flightlock::Error` variant;
//! - every repository path and test name written in backticks exists, and every message a
//!   troubleshooting item quotes is in the code;
//! - every table of measured figures names the command that produced it, and figures written
//!   in prose (the protocol, key and permit limits, grace periods, the proxy's limits) are the
//!   constants they come from.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::SystemTime;

use flightlock::{parse_duration, ClockSkew, HeldBy, HolderInfo, LockOptions, Wait};
use flightlock_cleanup::config as cleanup_config;
use flightlock_extension::config::Settings;
use flightlock_lambda::config::{self, Config};
use flightlock_lambda::responses::{skipped_body, SkipReason};
use serde_json::Value;

use super::{read, section, table, CONFIGURATION};
use crate::params::doc_files;
use crate::repo_root;

/// A cell that is one literal in backticks: `` `x` `` → `x`.
fn literal(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What a gated function parses from `env`: the shared configuration and the extension's own.
fn parsed(env: &HashMap<String, String>) -> Result<(Config, Settings), String> {
    let config = Config::from_map(env).map_err(|e| e.to_string())?;
    let settings = Settings::from_map(env).map_err(|e| e.to_string())?;
    Ok((config, settings))
}

/// Checks each `(variable, default cell)`: the forms a default is written in are `**required**`,
/// a literal in backticks (a value, or the name of the variable whose value is the default),
/// `the function name` and `lease / N`. Returns the problems.
fn check_defaults<T: PartialEq + std::fmt::Debug>(
    rows: &[(String, String)],
    base_env: &HashMap<String, String>,
    parse: impl Fn(&HashMap<String, String>) -> Result<T, String>,
    formula: impl Fn(&str, &T) -> Option<bool>,
) -> Vec<String> {
    let base = parse(base_env).expect("the base environment parses");
    let with = |name: &str, value: &str| {
        let mut e = base_env.clone();
        e.insert(name.to_owned(), value.to_owned());
        parse(&e)
    };
    let mut problems = Vec::new();
    for (name, cell) in rows {
        let ok = if cell == "**required**" {
            let mut e = base_env.clone();
            e.remove(name);
            parse(&e).is_err_and(|m| m.contains(name.as_str()))
        } else if cell == "the function name" {
            with(name, &base_env[config::FUNCTION_NAME]).as_ref() == Ok(&base)
        } else if let Some(ok) = formula(cell, &base) {
            ok
        } else if let Some(v) = literal(cell) {
            // `AWS_LAMBDA_RUNTIME_API`: the default is that variable's value.
            let value = base_env.get(v).map_or(v, String::as_str);
            with(name, value).as_ref() == Ok(&base)
        } else {
            problems.push(format!(
                "{name}: the default {cell:?} is in no form this check reads (`value`, \
                 **required**, the function name, lease / N)"
            ));
            continue;
        };
        if !ok {
            problems.push(format!(
                "{name}: the documented default {cell} is not what the code uses when {name} is unset"
            ));
        }
    }
    problems
}

/// `(variable, last cell)` of a section's `FLIGHTLOCK_*` rows.
fn variable_defaults(doc: &str, heading: &str) -> Vec<(String, String)> {
    table(&section(doc, heading))
        .into_iter()
        .filter(|(name, _)| name.starts_with("FLIGHTLOCK_"))
        .map(|(name, c)| (name, c.last().cloned().unwrap_or_default()))
        .collect()
}

/// `lease / N` → whether the heartbeat in force without `FLIGHTLOCK_HEARTBEAT` is the lease / N.
fn heartbeat_formula(cell: &str, base: &(Config, Settings)) -> Option<bool> {
    let n: u32 = cell.strip_prefix("lease / ")?.parse().ok()?;
    let options = base
        .0
        .lock_options(None, SystemTime::now(), HolderInfo::default());
    Some(base.0.heartbeat.is_none() && options.heartbeat_interval() == base.0.lease / n)
}

fn defaults_problems(doc: &str) -> Vec<String> {
    let function = variable_defaults(doc, "## Function variables");
    assert_eq!(function.len(), config::KNOWN.len(), "{function:?}");
    let base = env(&[
        (config::TABLE, "locks"),
        (config::FUNCTION_NAME, "nightly-report"),
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
    ]);
    let mut problems = check_defaults(&function, &base, parsed, heartbeat_formula);
    let cleanup = variable_defaults(doc, "## Cleanup function variables");
    assert_eq!(cleanup.len(), cleanup_config::KNOWN.len(), "{cleanup:?}");
    problems.extend(check_defaults(
        &cleanup,
        &env(&[(cleanup_config::TABLE, "locks")]),
        |e| cleanup_config::Config::from_map(e).map_err(|e| e.to_string()),
        |_, _| None,
    ));
    problems
}

#[test]
fn the_configuration_defaults_are_the_codes() {
    let problems = defaults_problems(&read(CONFIGURATION));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_wrong_default_is_caught() {
    let doc = read(CONFIGURATION);
    for (from, to) in [
        ("| `20s` |\n", "| `30s` |\n"),
        ("| lease / 3 |", "| lease / 2 |"),
        ("| `16` |", "| `8` |"),
        ("| `9009` |", "| `9000` |"),
        ("| `AWS_LAMBDA_RUNTIME_API` |", "| `127.0.0.1:1` |"),
    ] {
        assert!(doc.contains(from), "{from:?} is no longer in the reference");
        let broken = doc.replacen(from, to, 1);
        assert!(
            !defaults_problems(&broken).is_empty(),
            "{to:?} was not caught"
        );
    }
}

/// The library's option defaults, read as the option's type reads them.
fn option_default_matches(field: &str, cell: &str, d: &LockOptions) -> Option<bool> {
    let duration = || literal(cell).and_then(|v| parse_duration(v).ok());
    Some(match field {
        "wait" => Wait::parse(literal(cell)?).ok()? == d.wait,
        "lease" => duration()? == d.lease,
        "poll" => duration()? == d.poll,
        "max_poll" => duration()? == d.max_poll,
        "ttl_grace" => duration()? == d.ttl_grace,
        "tick_keep" => duration()? == d.tick_keep,
        "clock_skew" => ClockSkew::parse(literal(cell)?).ok()? == d.clock_skew,
        "heartbeat" => {
            let n: u32 = cell.strip_prefix("lease / ")?.parse().ok()?;
            d.heartbeat.is_none() && d.heartbeat_interval() == d.lease / n
        }
        "holder" => cell == "empty" && d.holder == HolderInfo::default(),
        "lease_cap" => cell == "none" && d.lease_cap.is_none(),
        "tick" => cell == "none" && d.tick.is_none(),
        "coalesce" => literal(cell)? == d.coalesce.to_string(),
        "permits" => literal(cell)? == d.permits.to_string(),
        _ => return None,
    })
}

fn library_option_problems(doc: &str) -> Vec<String> {
    let d = LockOptions::default();
    let mut problems = Vec::new();
    for (field, c) in table(&section(doc, "## Options")) {
        let cell = c.get(1).cloned().unwrap_or_default();
        match option_default_matches(&field, &cell, &d) {
            Some(true) => {}
            Some(false) => problems.push(format!(
                "LockOptions::{field}: the documented default {cell} is not LockOptions::default()"
            )),
            None => problems.push(format!(
                "LockOptions::{field}: no reader for its default {cell:?} (a new field? teach \
                 option_default_matches)"
            )),
        }
    }
    problems
}

#[test]
fn the_library_option_defaults_are_lock_options_default() {
    let doc = read("docs/src/reference/library.md");
    let problems = library_option_problems(&doc);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let broken = doc.replacen("| `max_poll` | `2s` |", "| `max_poll` | `5s` |", 1);
    assert_ne!(broken, doc);
    assert!(!library_option_problems(&broken).is_empty());
}

/// The values of `pub const *_ERROR_TYPE: &str = "..."` in `lambda/src/responses.rs`.
fn error_types() -> BTreeSet<String> {
    let found: BTreeSet<String> = read("lambda/src/responses.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("pub const "))
        .filter_map(|l| l.split_once("_ERROR_TYPE: &str = \""))
        .filter_map(|(_, v)| v.strip_suffix("\";"))
        .map(str::to_owned)
        .collect();
    assert!(found.len() >= 8, "{found:?}");
    found
}

fn error_type_table(doc: &str) -> BTreeSet<String> {
    table(&section(doc, "## Error types")).into_keys().collect()
}

#[test]
fn the_error_type_table_is_the_codes() {
    let doc = read("docs/src/reference/responses.md");
    assert_eq!(error_type_table(&doc), error_types());
    let broken = doc.replacen("| `FlightlockEventError` |", "| `FlightlockEventErr` |", 1);
    assert_ne!(error_type_table(&broken), error_types());
}

/// `SkipReason::X => "word"` in `lambda/src/responses.rs`.
fn skip_reasons() -> BTreeSet<String> {
    let found: BTreeSet<String> = read("lambda/src/responses.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("SkipReason::"))
        .filter_map(|l| l.split_once(" => \""))
        .filter_map(|(_, w)| w.split_once('"'))
        .map(|(w, _)| w.to_owned())
        .collect();
    assert!(found.contains("busy") && found.len() >= 4, "{found:?}");
    found
}

#[test]
fn every_skip_reason_is_in_the_skip_body_section() {
    let doc = read("docs/src/reference/responses.md");
    let text = section(&doc, "## The skip body").join("\n");
    for reason in skip_reasons() {
        assert!(
            text.contains(&format!("`{reason}`")),
            "the skip body's reason {reason} is not in responses.md"
        );
    }
}

/// The keys of a JSON object, or none.
fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every complete skip body written in `text` (examples cut short with `…` are not JSON and are
/// left out), checked against the fields `skipped_body` writes.
fn skip_body_problems(name: &str, text: &str) -> (usize, Vec<String>) {
    let holder = HeldBy {
        ticket: 41,
        owner: "o".into(),
        info: HolderInfo {
            function: Some("f".into()),
            request_id: Some("r".into()),
            host: Some("h".into()),
        },
    };
    let full = skipped_body(
        SkipReason::Busy,
        "k",
        Some("t"),
        std::slice::from_ref(&holder),
    );
    let body_keys = keys(&full["flightlock"]);
    let holder_keys = keys(&full["flightlock"]["heldBy"]);
    let mut checked = 0;
    let mut problems = Vec::new();
    for (start, _) in text.match_indices("{\"flightlock\":{\"skipped\"") {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        let Some(Ok(v)) = stream.next() else { continue };
        checked += 1;
        let body = &v["flightlock"];
        if keys(body) != body_keys {
            problems.push(format!(
                "{name}: a skip body with the fields {:?}; the code writes {body_keys:?}",
                keys(body)
            ));
        }
        let held = std::iter::once(&body["heldBy"])
            .chain(body["holders"].as_array().into_iter().flatten())
            .filter(|h| !h.is_null());
        for h in held {
            if !keys(h).is_subset(&holder_keys) {
                problems.push(format!(
                    "{name}: a holder with the fields {:?}; the code writes {holder_keys:?}",
                    keys(h)
                ));
            }
        }
    }
    (checked, problems)
}

fn shown(file: &Path) -> String {
    file.strip_prefix(repo_root())
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn every_skip_body_shown_has_the_codes_fields() {
    let mut checked = 0;
    let mut problems = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let (n, p) = skip_body_problems(&shown(&file), &text);
        checked += n;
        problems.extend(p);
    }
    assert!(checked >= 3, "only {checked} complete skip bodies found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let without_holders =
        r#"{"flightlock":{"skipped":true,"reason":"busy","key":"k","tick":null,"heldBy":null}}"#;
    assert_eq!(skip_body_problems("x", without_holders).1.len(), 1);
}

/// Where each metric is emitted: `Metric::X` outside its own definition and outside tests, in
/// the gate (`lambda/src/gate.rs`) or the record locks (`lambda/src/records.rs`), both shared
/// by the two adapters, the in-process layer (`lambda/src/layer.rs`) or the extension
/// (`extension/src`).
fn metric_sources() -> BTreeMap<String, &'static str> {
    fn code(path: &Path) -> String {
        let text = std::fs::read_to_string(path).unwrap();
        text.split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .to_owned()
    }
    let root = repo_root();
    let mut places: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    let mut scan = |text: &str, place: &'static str| {
        for (i, _) in text.match_indices("Metric::") {
            let name: String = text[i + 8..]
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            places.entry(name).or_default().insert(place);
        }
    };
    let mut gate = vec![root.join("lambda/src/gate.rs")];
    gate.extend(crate::rust_files(&root.join("lambda/src/gate"), &[]));
    gate.push(root.join("lambda/src/records.rs"));
    for f in gate {
        scan(&code(&f), "gate");
    }
    scan(&code(&root.join("lambda/src/layer.rs")), "layer");
    for f in crate::rust_files(&root.join("extension/src"), &[]) {
        if !shown(&f).contains("test") {
            scan(&code(&f), "extension");
        }
    }
    places
        .into_iter()
        .map(|(name, p)| {
            let from = if p.contains("gate") || (p.contains("layer") && p.contains("extension")) {
                "both"
            } else if p.contains("extension") {
                "extension"
            } else {
                "in-process layer"
            };
            (name, from)
        })
        .collect()
}

fn metric_source_problems(doc: &str) -> Vec<String> {
    let sources = metric_sources();
    let mut problems = Vec::new();
    let mut rows = table(&section(doc, "## Metrics of a gated function"));
    rows.extend(table(&section(doc, "## Metrics of record locks")));
    for (metric, c) in rows {
        let cell = c.get(1).map(|s| s.trim_matches('`')).unwrap_or_default();
        match sources.get(&metric) {
            Some(from) if *from == cell => {}
            Some(from) => problems.push(format!(
                "{metric}: the reference says it comes from {cell:?}; the code emits it from {from:?}"
            )),
            None => problems.push(format!("{metric}: no code emits it")),
        }
    }
    problems
}

#[test]
fn the_metric_reference_says_which_adapter_emits_each_metric() {
    let doc = read("docs/src/reference/metrics.md");
    let problems = metric_source_problems(&doc);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let broken = doc.replacen(
        "| `UnenforcedInvocations` | `extension` |",
        "| `UnenforcedInvocations` | `both` |",
        1,
    );
    assert_ne!(broken, doc);
    assert!(!metric_source_problems(&broken).is_empty());
    let broken = doc.replacen(
        "| `RecordLockBusy` | `both` |",
        "| `RecordLockBusy` | `extension` |",
        1,
    );
    assert_ne!(broken, doc);
    assert!(!metric_source_problems(&broken).is_empty());
}

/// `pub const X: &str = "flightlock…";` in `lambda/src/client_context.rs`, but the prefix itself.
fn client_context_entries() -> BTreeSet<String> {
    let found: BTreeSet<String> = read("lambda/src/client_context.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("pub const "))
        .filter_map(|l| l.split_once(": &str = \""))
        .filter_map(|(_, v)| v.strip_suffix("\";"))
        .filter(|v| v.starts_with("flightlock") && *v != "flightlock")
        .map(str::to_owned)
        .collect();
    assert!(found.contains("flightlockTicket"), "{found:?}");
    found
}

#[test]
fn the_client_context_entries_are_the_codes() {
    let doc = read("docs/src/guide/in-the-handler.md");
    let documented: BTreeSet<String> = table(&doc.lines().collect::<Vec<_>>())
        .into_keys()
        .filter(|k| {
            k.starts_with("flightlock") && k.chars().nth(10).is_some_and(|c| c.is_ascii_uppercase())
        })
        .collect();
    assert_eq!(documented, client_context_entries());
}

/// The variants of `pub enum Error` in `lock/src/error.rs`.
fn error_variants() -> BTreeSet<String> {
    let source = read("lock/src/error.rs");
    let body = source
        .split("pub enum Error {")
        .nth(1)
        .and_then(|s| s.split("\n}").next())
        .expect("enum Error");
    let found: BTreeSet<String> = body
        .lines()
        .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
        .map(str::trim)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| {
            l.chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect::<String>()
        })
        .collect();
    assert!(found.contains("Busy") && found.len() >= 10, "{found:?}");
    found
}

#[test]
fn the_library_error_table_is_the_error_enum() {
    let doc = read("docs/src/reference/library.md");
    let documented: BTreeSet<String> = table(&section(&doc, "## Errors")).into_keys().collect();
    assert_eq!(documented, error_variants());
}

/// The guide's pages and the top README: what a user reads.
fn guide_files() -> Vec<std::path::PathBuf> {
    doc_files()
        .into_iter()
        .filter(|f| {
            let n = shown(f);
            n.starts_with("docs/src") || n == "README.md"
        })
        .collect()
}

/// The backticked spans of `text`, code blocks included.
fn spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Top-level entries of the repository that are generated, not committed.
const GENERATED: &[&str] = &["target", ".tools", "dist"];

/// A span that names a repository path: it starts with a committed top-level entry and a `/`,
/// holds no placeholder, and is one word. Returns the path without a `:line` suffix.
fn repository_path(span: &str) -> Option<&str> {
    let path = span.split(':').next()?;
    let (top, _) = path.split_once('/')?;
    if span.contains(char::is_whitespace)
        || path.contains(['{', '*', '<', '…', '$'])
        || top.is_empty()
        || top == "."
        || GENERATED.contains(&top)
        || !repo_root().join(top).exists()
    {
        return None;
    }
    Some(path)
}

fn missing_paths(name: &str, text: &str) -> Vec<String> {
    spans(text)
        .into_iter()
        .filter_map(repository_path)
        // `release/layers-vX.Y.Z` is the branch the release workflow pushes, not a path.
        .filter(|p| !repo_root().join(p).exists() && !p.starts_with("release/layers-v"))
        .map(|p| format!("{name}: `{p}` does not exist"))
        .collect()
}

#[test]
fn every_repository_path_written_exists() {
    let mut problems = Vec::new();
    let mut count = 0;
    for file in guide_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        count += spans(&text).into_iter().filter_map(repository_path).count();
        problems.extend(missing_paths(&shown(&file), &text));
    }
    assert!(count > 100, "only {count} paths found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        missing_paths(
            "x",
            "see `tests/e2e/tests/e2e/extenson.rs` and `lock/src/lib.rs:12`"
        )
        .len(),
        1
    );
}

/// Every `fn name` of the repository's Rust sources.
fn function_names() -> BTreeSet<String> {
    let root = repo_root();
    let mut names = BTreeSet::new();
    for dir in ["lock", "lambda", "cli", "extension", "functions", "tests"] {
        for f in crate::rust_files(&root.join(dir), &[]) {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, _) in text.match_indices("fn ") {
                let name: String = text[i + 3..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

/// A span that names a test: snake case with at least three underscores.
fn test_name(span: &str) -> Option<&str> {
    let ok = span.starts_with(|c: char| c.is_ascii_lowercase())
        && span
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && span.matches('_').count() >= 3;
    ok.then_some(span)
}

#[test]
fn every_test_named_exists() {
    let functions = function_names();
    let mut problems = Vec::new();
    let mut count = 0;
    for file in guide_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in spans(&text).into_iter().filter_map(test_name) {
            count += 1;
            if !functions.contains(name) {
                problems.push(format!("{}: no test `{name}`", shown(&file)));
            }
        }
    }
    assert!(count >= 10, "only {count} test names found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(!functions.contains("single_flight_skip_across_python_environmentz"));
}

/// Sections of the guide that report measured figures: (page, heading or `""` for every section).
const FIGURES: &[(&str, &str)] = &[
    ("docs/src/internals/benchmarks.md", ""),
    ("docs/src/guide/n-at-a-time.md", "## Cost"),
    ("docs/src/development/releasing.md", "## Measured"),
    ("docs/src/operations/cost.md", "### What a sweep reads"),
];

/// Whether `span` is a command that can be run here: each part (`&&`, and the command after a
/// script's `--`) a script of `scripts/`, `make`, or a `cargo` command whose `--example` exists.
fn runnable(span: &str) -> bool {
    span.split("&&").all(|part| match part.split_once(" -- ") {
        Some((script, rest)) if script.trim_start().starts_with("scripts/") => {
            one_runnable(script) && one_runnable(rest)
        }
        _ => one_runnable(part),
    })
}

fn one_runnable(span: &str) -> bool {
    let words: Vec<&str> = span.split_whitespace().collect();
    let Some(first) = words.first() else {
        return false;
    };
    if first.starts_with("scripts/") {
        return repo_root().join(first).is_file();
    }
    // A binary the command before it built.
    if first.starts_with("target/") {
        return true;
    }
    if *first == "make" {
        let makefile = std::fs::read_to_string(repo_root().join("Makefile")).unwrap_or_default();
        return words[1..]
            .iter()
            .take_while(|w| !w.starts_with('#'))
            .all(|t| makefile.lines().any(|l| l.starts_with(&format!("{t}:"))));
    }
    if *first != "cargo" {
        return false;
    }
    match words.iter().position(|w| *w == "--example") {
        None => true,
        Some(i) => words.get(i + 1).is_some_and(|name| {
            ["lock", "extension", "lambda", "cli"].iter().any(|c| {
                let dir = repo_root().join(c).join("examples");
                dir.join(format!("{name}.rs")).exists() || dir.join(name).join("main.rs").exists()
            })
        }),
    }
}

/// The lines (0-based) on which a runnable command ends: a backticked span of the prose (it may
/// run over several lines) or a line of a code block.
fn command_lines(text: &str) -> BTreeSet<usize> {
    let mut lines = BTreeSet::new();
    let mut prose = String::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if fenced {
            if runnable(line.trim()) {
                lines.insert(n);
            }
        } else {
            prose.push_str(line);
        }
        prose.push('\n');
    }
    let mut offset = 0;
    for (i, piece) in prose.split('`').enumerate() {
        offset += piece.len() + 1;
        if i % 2 == 1 && runnable(&piece.replace('\n', " ")) {
            lines.insert(prose[..offset - 1].matches('\n').count());
        }
    }
    lines
}

/// Every table of figures in `text` (the sections `heading` names, or all) must follow a command
/// that produced it, after the previous table and heading, or name one in its own cells.
fn unsourced_tables(name: &str, text: &str, heading: &str) -> Vec<String> {
    let commands = command_lines(text);
    let lines: Vec<&str> = text.lines().collect();
    let mut problems = Vec::new();
    let mut in_scope = heading.is_empty();
    let mut sourced = false;
    let mut in_table = false;
    let mut fenced = false;
    for (n, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            in_scope = heading.is_empty() || line.trim() == heading;
            sourced = false;
        }
        let row = !fenced && line.starts_with('|');
        if row && !in_table && in_scope && !sourced {
            let end = n + lines[n..].iter().take_while(|l| l.starts_with('|')).count();
            if !commands.range(n..end).any(|_| true) {
                problems.push(format!(
                    "{name}:{}: a table of figures with no command before it in its section",
                    n + 1
                ));
            }
        }
        if in_table && !row {
            sourced = false; // each table names its own command
        }
        in_table = row;
        sourced |= commands.contains(&n);
    }
    problems
}

#[test]
fn every_table_of_figures_names_its_command() {
    let mut problems = Vec::new();
    for (page, heading) in FIGURES {
        let text = read(page);
        if !heading.is_empty() {
            section(&text, heading);
        }
        problems.extend(unsourced_tables(page, &text, heading));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let bench = read("docs/src/internals/benchmarks.md");
    let broken = bench.replacen("`scripts/bench`", "the benchmark", 1);
    assert!(!unsourced_tables("b", &broken, "").is_empty());
    let cost = read("docs/src/operations/cost.md");
    let heading = "### What a sweep reads";
    assert!(unsourced_tables("c", &cost, heading).is_empty());
    let broken = cost
        .replacen(
            "`scripts/dynamodb-local run -- target/release/examples/sweep_bench`",
            "a benchmark",
            1,
        )
        .replacen(
            "`cargo build --release -p flightlock --example sweep_bench`",
            "a build",
            1,
        );
    assert_eq!(unsourced_tables("c", &broken, heading).len(), 1);
    assert!(runnable(
        "make layer-x86_64 && scripts/dynamodb-local run -- cargo run -p flightlock-extension --example extension_bench"
    ));
    assert!(!runnable(
        "scripts/dynamodb-local run -- cargo run --example extension_bnch"
    ));
    assert!(!runnable("make layer-x86"));
    assert!(!runnable("scripts/benchmark"));
}

/// The sweep summary shown in the cleanup page: its fields, its row's fields and the outcome
/// words listed under it, against `SweepSummary`, `SweptRow` and `RowOutcome`.
fn sweep_summary_problems(doc: &str) -> Vec<String> {
    use flightlock::sweep::{RowOutcome, SweptRow};
    let text = section(
        doc,
        "## The summary (the function's response, and `flightlock sweep --json`)",
    )
    .join("\n");
    let block = text
        .split("```json\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the summary's JSON block");
    let shown: Value = serde_json::from_str(block).expect("the summary example is JSON");
    let row = SweptRow {
        key: "k".into(),
        ticket: 1,
        owner: "o".into(),
        lease_until_ms: 0,
        outcome: RowOutcome::Deleted,
    };
    let code = serde_json::to_value(flightlock::SweepSummary {
        rows: vec![row],
        ..Default::default()
    })
    .unwrap();
    let mut problems = Vec::new();
    if keys(&shown) != keys(&code) {
        problems.push(format!(
            "the summary shows {:?}; SweepSummary has {:?}",
            keys(&shown),
            keys(&code)
        ));
    }
    if keys(&shown["rows"][0]) != keys(&code["rows"][0]) {
        problems.push(format!(
            "a summary row shows {:?}; SweptRow has {:?}",
            keys(&shown["rows"][0]),
            keys(&code["rows"][0])
        ));
    }
    let source = read("lock/src/sweep/summary.rs");
    let body = source
        .split("pub enum RowOutcome {")
        .nth(1)
        .and_then(|s| s.split("\n}").next())
        .expect("enum RowOutcome");
    for variant in body
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
    {
        let name = variant.trim_end_matches(',');
        let mut word = name[..1].to_ascii_lowercase();
        word.push_str(&name[1..]);
        if !text.contains(&format!("`{word}`")) {
            problems.push(format!("the row outcome {word} is not listed"));
        }
    }
    problems
}

#[test]
fn the_sweep_summary_shown_is_the_codes() {
    let doc = read("docs/src/operations/cleanup.md");
    let problems = sweep_summary_problems(&doc);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let old = doc.replacen(
        ",\n  \"newerProtocol\": 0, \"newerProtocolKeys\": []",
        "",
        1,
    );
    assert_ne!(old, doc);
    assert_eq!(sweep_summary_problems(&old).len(), 1);
    let untold = doc.replacen("`notTried` (budget spent)", "budget spent", 1);
    assert_ne!(untold, doc);
    assert_eq!(sweep_summary_problems(&untold).len(), 1);
}

/// The source text of everything that prints a message a user can see: the crates' sources and
/// the wrapper, with Rust's `\`-continued string lines joined as the compiler joins them.
fn message_sources() -> String {
    let root = repo_root();
    let mut text = String::new();
    for dir in [
        "lock/src",
        "lambda/src",
        "extension/src",
        "cli/src",
        "functions/cleanup/src",
    ] {
        for f in crate::rust_files(&root.join(dir), &[]) {
            text.push_str(&std::fs::read_to_string(f).unwrap());
        }
    }
    text.push_str(&read("extension/layer/flightlock-wrapper"));
    let mut joined = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut line = line.to_owned();
        while let Some(head) = line.strip_suffix('\\') {
            let next = lines.next().unwrap_or_default().trim_start();
            line = format!("{head}{next}");
        }
        joined.push_str(&line);
        joined.push('\n');
    }
    joined
}

/// The messages a troubleshooting item leads with (`- **… \`message\` …**`), cut at `…` and at
/// placeholders (`N`, `M`: one capital letter): each piece of four characters or more must be in
/// the code (JSON fragments excepted).
fn unquoted_messages(doc: &str, code: &str) -> Vec<String> {
    let placeholder = regex_lite::Regex::new(r"\b[A-Z]\b").unwrap();
    let mut problems = Vec::new();
    for line in doc.lines() {
        let Some(lead) = line
            .strip_prefix("- **")
            .and_then(|rest| rest.split("**").next())
        else {
            continue;
        };
        for span in spans(lead) {
            let pieces = span
                .split(['…', '[', ']'])
                .flat_map(|p| placeholder.split(p).collect::<Vec<_>>())
                .map(str::trim);
            for piece in pieces {
                if piece.chars().count() >= 4 && !piece.starts_with('"') && !code.contains(piece) {
                    problems.push(format!("troubleshooting quotes {piece:?}, no code says it"));
                }
            }
        }
    }
    problems
}

#[test]
fn the_messages_troubleshooting_quotes_are_the_codes() {
    let doc = read("docs/src/troubleshooting.md");
    let code = message_sources();
    let problems = unquoted_messages(&doc, &code);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(doc.contains("`cannot reach DynamoDB`"));
    let broken = doc.replacen("`cannot reach DynamoDB`", "`cannot contact DynamoDB`", 1);
    assert_eq!(unquoted_messages(&broken, &code).len(), 1);
}

/// Figures written in prose, each with the constant it comes from: (page, the sentence's words
/// with the figure in place). A sentence reworded drops out of this list loudly; keep its figure
/// tied to the constant.
fn stated_figures() -> Vec<(&'static str, String)> {
    let secs = |d: std::time::Duration| d.as_secs();
    let limits = flightlock_extension::proxy::Limits::default();
    vec![
        (
            "docs/src/operations/upgrades.md",
            format!("(`flightlock::PROTOCOL` is {})", flightlock::PROTOCOL),
        ),
        (
            "docs/src/reference/cli.md",
            format!(
                "the lock key, 1 to {} bytes",
                flightlock::schema::MAX_KEY_BYTES
            ),
        ),
        (
            "docs/src/reference/library.md",
            format!("longer than {} bytes", flightlock::schema::MAX_KEY_BYTES),
        ),
        (
            "docs/src/reference/library.md",
            format!("`MAX_PERMITS` = `{}`", flightlock::MAX_PERMITS),
        ),
        (
            CONFIGURATION,
            format!(
                "a whole number from `1` up to `{}`",
                flightlock::MAX_PERMITS
            ),
        ),
        (
            CONFIGURATION,
            format!(
                "one small record per id, kept {} h",
                secs(flightlock::options::DEFAULT_TICK_KEEP) / 3600
            ),
        ),
        (
            "docs/src/internals/how-it-works.md",
            format!(
                "deadline + {} s, so a frozen or killed sandbox",
                secs(config::LEASE_CAP_GRACE)
            ),
        ),
        (
            "docs/src/internals/how-it-works.md",
            format!(
                "allows {} s for the proxy to see the event",
                secs(flightlock_extension::lifecycle::UNENFORCED_GRACE)
            ),
        ),
        (
            "docs/src/internals/how-it-works.md",
            format!(
                "serves at most {} runtime connections",
                limits.max_connections
            ),
        ),
        (
            "docs/src/internals/how-it-works.md",
            format!(
                "complete request head within {} s",
                secs(limits.header_read_timeout)
            ),
        ),
        (
            "docs/src/operations/cleanup.md",
            format!(
                "`rows` lists the first {} dead rows",
                flightlock::SweepOptions::default().report_rows
            ),
        ),
    ]
}

fn figure_problems(read_page: impl Fn(&str) -> String) -> Vec<String> {
    let mut problems = Vec::new();
    for (page, sentence) in stated_figures() {
        let text = read_page(page)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !text.contains(&sentence) {
            problems.push(format!("{page} should say {sentence:?} (from the code)"));
        }
    }
    problems
}

#[test]
fn figures_stated_in_prose_are_their_constants() {
    let problems = figure_problems(read);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let broken = figure_problems(|page| {
        read(page).replace("allows 2 s for the proxy", "allows 3 s for the proxy")
    });
    assert_eq!(broken.len(), 1, "{broken:?}");
}

/// The log lines the metrics reference tells a user to look for, which the code must print.
fn unlogged_lines(doc: &str, code: &str) -> Vec<String> {
    let text = section(doc, "## Logs").join("\n");
    let lines = text
        .split("The lines\nto look for:")
        .nth(1)
        .or_else(|| text.split("The lines to look for:").nth(1))
        .expect("the sentence naming the lines to look for");
    let lines = lines.split("\n\n").next().unwrap_or_default();
    let named: Vec<&str> = spans(lines)
        .into_iter()
        .filter(|s| !s.contains('_') && *s != "FLIGHTLOCK_LOG_LEVEL")
        .collect();
    assert!(named.len() >= 4, "{named:?}");
    named
        .into_iter()
        .filter(|line| !code.contains(&format!("\"{line}")))
        .map(|line| format!("the log line {line:?} is printed by no code"))
        .collect()
}

#[test]
fn the_log_lines_to_look_for_are_printed() {
    let doc = read("docs/src/reference/metrics.md");
    let code = message_sources();
    let problems = unlogged_lines(&doc, &code);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let broken = doc.replacen("`lock released`", "`lock freed`", 1);
    assert_eq!(unlogged_lines(&broken, &code).len(), 1);
}
