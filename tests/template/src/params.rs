//! One source for what the docs promise: the template's duration parameters take every duration
//! form the README documents (and nothing the code would refuse), and every place the README lists
//! a lock user's IAM actions lists exactly what the template's `LockUserPolicy` grants.

use std::collections::BTreeSet;

use flightlock::{parse_duration, Wait};
use serde_yaml_ng::Value;

use super::*;

fn template() -> Value {
    load_template(&repo_root().join("template.yaml")).unwrap()
}

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).unwrap()
}

/// The backticked words of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The duration forms the README documents ("Durations everywhere: `500ms`, ...; a bare number
/// is seconds"), with a bare number added for the last clause.
fn documented_durations() -> Vec<String> {
    let readme = readme();
    let line = readme
        .lines()
        .find(|l| l.starts_with("Durations everywhere:"))
        .expect("the README's \"Durations everywhere:\" line");
    assert!(line.contains("a bare number is seconds"), "{line}");
    let mut forms: Vec<String> = backticked(line).iter().map(|s| (*s).to_owned()).collect();
    assert!(forms.len() >= 5, "{line}");
    forms.push("90".to_owned());
    forms
}

/// The `AllowedPattern` of a template parameter, compiled.
fn pattern(template: &Value, name: &str) -> regex_lite::Regex {
    let p = template["Parameters"][name]["AllowedPattern"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has no AllowedPattern"));
    regex_lite::Regex::new(p).unwrap()
}

/// Strings a user might type, right and wrong: whatever a pattern lets through must parse.
const CANDIDATES: &[&str] = &[
    "0", "90", "500ms", "20s", "2m", "1h", "1d", "1m30s", "1h30m15s", "0s", "forever", "inf",
    "infinite", "1.5s", "-1", "1 m", "soon", "", "30sec", "10x", "s", "ms",
];

#[test]
fn duration_parameters_take_every_documented_form_and_nothing_the_code_refuses() {
    let t = template();
    let forms = documented_durations();
    for name in ["LockLease", "SweepGrace", "LockWait"] {
        let re = pattern(&t, name);
        let default = t["Parameters"][name]["Default"].as_str().unwrap();
        assert!(re.is_match(default), "{name}'s default {default:?}");
        for form in &forms {
            assert!(re.is_match(form), "{name} refuses the documented {form:?}");
        }
        for c in CANDIDATES {
            if !re.is_match(c) {
                continue;
            }
            let parsed = if name == "LockWait" {
                Wait::parse(c).map(|_| ())
            } else {
                parse_duration(c).map(|_| ())
            };
            assert!(
                parsed.is_ok(),
                "{name} lets {c:?} through; the code refuses it"
            );
        }
    }
    let wait = pattern(&t, "LockWait");
    for word in Wait::FOREVER_WORDS.iter().chain(&["0"]) {
        assert!(wait.is_match(word), "LockWait refuses {word:?}");
    }
}

/// The actions the template's `LockUserPolicy` grants.
fn lock_user_actions() -> BTreeSet<String> {
    let t = template();
    let doc =
        &properties(&t, "LockUserPolicy", "AWS::IAM::ManagedPolicy").unwrap()["PolicyDocument"];
    let statements = doc["Statement"].as_sequence().unwrap();
    assert_eq!(statements.len(), 1);
    statements[0]["Action"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The `dynamodb:Action` names in `text` (IAM condition keys such as `dynamodb:LeadingKeys` are
/// not actions).
fn actions_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|w| w.starts_with("dynamodb:") && *w != "dynamodb:LeadingKeys")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_readme_list_of_a_lock_users_actions_is_the_templates() {
    let granted = lock_user_actions();
    let readme = readme();
    // The Deploy section's bullet on LockUserPolicy.
    let start = readme
        .find("- **`LockUserPolicy`**")
        .expect("the LockUserPolicy bullet");
    let bullet = &readme[start..];
    let bullet = &bullet[..bullet[2..].find("\n- ").map_or(bullet.len(), |i| i + 2)];
    assert_eq!(actions_in(bullet), granted, "Deploy: {bullet}");
    // The statement to write yourself, in "Attach it to an existing function".
    let start = readme
        .find("\"Action\": [")
        .expect("the Attach section's statement");
    let statement = &readme[start..start + readme[start..].find(']').unwrap()];
    assert_eq!(actions_in(statement), granted, "Attach: {statement}");
    // The CLI's table of actions per command: `run` needs what a lock user needs.
    let run_row = readme
        .lines()
        .find(|l| l.starts_with("| `run` | `dynamodb:"))
        .expect("the CLI's IAM row for run");
    assert_eq!(actions_in(run_row), granted, "CLI: {run_row}");
}

#[test]
fn actions_in_reads_actions_not_condition_keys() {
    assert_eq!(
        actions_in("(`dynamodb:Query`, \"dynamodb:PutItem\"); `dynamodb:LeadingKeys`"),
        ["dynamodb:PutItem", "dynamodb:Query"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    );
}
