//! The docs checked against the code: the configuration reference's tables
//! (`docs/src/reference/configuration.md`) list exactly the variables the code reads and every
//! word it accepts, the wrapper script and the extension read `FLIGHTLOCK_PROXY_PORT` alike, and
//! every CLI exit status is in the CLI reference (`docs/src/reference/cli.md`). The sentences
//! that state a default, a field, an outcome, a figure or a file are checked in [`claims`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;

use flightlock::{ClockSkew, Wait};
use flightlock_cleanup::config as cleanup_config;
use flightlock_extension::config::{Settings, DEFAULT_PROXY_PORT};
use flightlock_lambda::config::{self, Config};

use crate::repo_root;

/// The configuration reference: the one place the variables are documented.
pub(crate) const CONFIGURATION: &str = "docs/src/reference/configuration.md";
/// The CLI reference: options and exit statuses.
pub(crate) const CLI: &str = "docs/src/reference/cli.md";

pub(crate) fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of the Markdown section that starts with `heading`, up to the next `## `. Panics if
/// there is no such heading (a check of an empty section would pass on nothing).
pub(crate) fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    assert!(
        text.lines().any(|l| l.trim() == heading),
        "no section {heading:?}"
    );
    text.lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect()
}

/// The cells of a Markdown table row, trimmed.
pub(crate) fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

/// Table rows of `lines` whose first cell is one backticked word: word → the row's cells (the
/// first included). Header rows (the line before `|---`) are not rows. The one reader of the
/// guide's tables, for every check of them.
pub(crate) fn table(lines: &[&str]) -> BTreeMap<String, Vec<String>> {
    lines
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            l.starts_with("| `")
                && !lines
                    .get(i + 1)
                    .is_some_and(|next| next.replace(' ', "").starts_with("|---"))
        })
        .map(|(_, l)| cells(l))
        .filter_map(|c| {
            let first = c.first()?.strip_prefix('`')?.strip_suffix('`')?.to_owned();
            (!first.contains('`')).then_some((first, c))
        })
        .collect()
}

/// Table rows whose first cell is a backticked `FLIGHTLOCK_*` name: name → the rest of the row,
/// its cells joined with ` | `.
fn variable_rows(lines: &[&str]) -> BTreeMap<String, String> {
    table(lines)
        .into_iter()
        .filter(|(name, _)| name.starts_with("FLIGHTLOCK_"))
        .map(|(name, cells)| (name, cells[1..].join(" | ")))
        .collect()
}

fn names(rows: &BTreeMap<String, String>) -> BTreeSet<String> {
    rows.keys().cloned().collect()
}

fn known(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn variable_rows_reads_only_variable_rows() {
    let lines = [
        "| variable | meaning | default |",
        "| `FLIGHTLOCK_A` | a | `1` |",
        "| `OTHER` | b | |",
        "text `FLIGHTLOCK_B`",
    ];
    let rows = variable_rows(&lines);
    assert_eq!(names(&rows), known(&["FLIGHTLOCK_A"]));
    assert_eq!(rows["FLIGHTLOCK_A"], "a | `1`");
}

#[test]
fn configuration_table_lists_exactly_the_variables_the_code_reads() {
    let doc = read(CONFIGURATION);
    let rows = variable_rows(&section(&doc, "## Function variables"));
    assert_eq!(names(&rows), known(config::KNOWN));
}

#[test]
fn every_accepted_word_is_documented_and_none_is_not_a_skew() {
    let doc = read(CONFIGURATION);
    let rows = variable_rows(&section(&doc, "## Function variables"));
    for word in Wait::FOREVER_WORDS {
        assert!(
            rows[config::WAIT].contains(&format!("`{word}`")),
            "FLIGHTLOCK_WAIT accepts {word}, the configuration reference does not say so"
        );
    }
    for word in ClockSkew::UNBOUNDED_WORDS {
        assert!(
            rows[config::CLOCK_SKEW].contains(&format!("`{word}`")),
            "FLIGHTLOCK_CLOCK_SKEW accepts {word}, the configuration reference does not say so"
        );
    }
    assert!(ClockSkew::parse("none").is_err());
    let switch_words = flightlock::options::SWITCH_ON_WORDS
        .iter()
        .chain(flightlock::options::SWITCH_OFF_WORDS);
    for word in switch_words {
        assert!(
            rows[config::METRICS].contains(&format!("`{word}`")),
            "{word}"
        );
        let env = HashMap::from([
            (config::TABLE.to_owned(), "locks".to_owned()),
            (config::KEY.to_owned(), "k".to_owned()),
            (config::METRICS.to_owned(), word.to_uppercase()),
        ]);
        assert!(Config::from_map(&env).is_ok(), "FLIGHTLOCK_METRICS={word}");
    }
}

#[test]
fn cleanup_docs_list_exactly_the_variables_the_cleanup_function_reads() {
    let doc = read(CONFIGURATION);
    let rows = variable_rows(&section(&doc, "## Cleanup function variables"));
    assert_eq!(names(&rows), known(cleanup_config::KNOWN));
    for word in flightlock::options::SWITCH_ON_WORDS
        .iter()
        .chain(flightlock::options::SWITCH_OFF_WORDS)
    {
        assert!(
            rows[cleanup_config::METRICS].contains(&format!("`{word}`")),
            "the cleanup function's FLIGHTLOCK_METRICS accepts {word}, the reference does not say so"
        );
    }
}

/// What the extension makes of `FLIGHTLOCK_PROXY_PORT = value`: the port, or `None` (init fails).
fn extension_port(value: &str) -> Option<u16> {
    let env = HashMap::from([
        (config::TABLE.to_owned(), "locks".to_owned()),
        (config::KEY.to_owned(), "k".to_owned()),
        (config::PROXY_PORT.to_owned(), value.to_owned()),
    ]);
    // The shared parser accepts the name; the extension's own settings read the value.
    Config::from_map(&env).ok()?;
    Settings::from_map(&env).ok().map(|s| s.proxy_port)
}

/// What the wrapper makes of it: the port it points the runtime at, or `None` (it refuses).
fn wrapper_port(value: &str) -> Option<u16> {
    let out = Command::new("sh")
        .arg(repo_root().join("extension/layer/flightlock-wrapper"))
        .args(["sh", "-c", "printf %s \"$AWS_LAMBDA_RUNTIME_API\""])
        .env(config::PROXY_PORT, value)
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let api = String::from_utf8(out.stdout).unwrap();
    Some(api.strip_prefix("127.0.0.1:").unwrap().parse().unwrap())
}

#[test]
fn the_wrapper_and_the_extension_read_the_proxy_port_alike() {
    for value in [
        "",
        " ",
        "9009",
        " 9010 ",
        "009011",
        "1",
        "65535",
        "0",
        "65536",
        "+9009",
        "-1",
        "12a",
        "9 009",
        "0x10",
        "99999999999999999999",
        "000000000000000009012",
    ] {
        assert_eq!(
            wrapper_port(value),
            extension_port(value),
            "FLIGHTLOCK_PROXY_PORT={value:?}"
        );
    }
    assert_eq!(wrapper_port(""), Some(DEFAULT_PROXY_PORT));
}

#[test]
fn every_cli_exit_status_is_documented() {
    let main = read("cli/src/main.rs");
    let statuses: Vec<(&str, &str)> = main
        .lines()
        .filter_map(|l| l.strip_prefix("pub const EXIT_"))
        .filter_map(|l| l.split_once(": u8 = "))
        .map(|(name, v)| (name, v.trim_end_matches(';')))
        .collect();
    assert!(statuses.len() >= 4, "{statuses:?}");
    let doc = read(CLI);
    let table = section(&doc, "## Exit statuses").join("\n");
    for (name, value) in statuses {
        assert!(
            table.contains(&format!("\n| {value} | ")),
            "exit status {value} (EXIT_{name}) is not in the CLI reference's table"
        );
    }
    for value in ["0", "1", "2"] {
        assert!(table.contains(&format!("\n| {value} | ")), "{value}");
    }
}

mod claims;
