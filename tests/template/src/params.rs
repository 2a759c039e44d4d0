//! One source for what the docs promise: the template's duration parameters take the duration
//! forms the configuration reference documents and nothing the code would refuse, and the IAM
//! actions of a lock user and of the cleanup function are written once, on the IAM page, as the
//! template grants them.

use std::collections::{BTreeSet, HashMap};

use flightlock_cleanup::config as cleanup_config;
use flightlock_lambda::config::{self, Config};
use serde_yaml_ng::Value;

use super::*;
use crate::docs::{read, section, CONFIGURATION};

/// The IAM page: the one place IAM actions are listed.
const IAM: &str = "docs/src/reference/iam.md";

fn template() -> Value {
    load_template(&repo_root().join("template.yaml")).unwrap()
}

/// The backticked words of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The duration forms the configuration reference documents ("Durations everywhere: `500ms`,
/// ...; a bare number is seconds"), with a bare number added for the last clause.
fn documented_durations() -> Vec<String> {
    let doc = read(CONFIGURATION);
    let line = doc
        .lines()
        .find(|l| l.starts_with("Durations everywhere:"))
        .expect("the configuration reference's \"Durations everywhere:\" line");
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

/// Strings a user might type, right and wrong: whatever a pattern lets through must be accepted
/// by the code that reads the value.
const CANDIDATES: &[&str] = &[
    "0", "90", "500ms", "50ms", "1500ms", "20s", "2m", "1h", "1d", "1m30s", "1h30m15s", "0s",
    "0m0s", "forever", "inf", "infinite", "1.5s", "-1", "1 m", "soon", "", "30sec", "10x", "s",
    "ms",
];

/// Whether the code that reads the parameter `name` accepts `value`: the extension's config for
/// the example jobs' variables, the cleanup function's for the sweep's.
fn code_accepts(name: &str, value: &str) -> bool {
    let mut env = HashMap::from([
        (config::TABLE.to_owned(), "locks".to_owned()),
        (config::FUNCTION_NAME.to_owned(), "job".to_owned()),
    ]);
    match name {
        "LockLease" => env.insert(config::LEASE.to_owned(), value.to_owned()),
        "LockWait" => env.insert(config::WAIT.to_owned(), value.to_owned()),
        "SweepGrace" => {
            env.insert(cleanup_config::SWEEP_GRACE.to_owned(), value.to_owned());
            return cleanup_config::Config::from_map(&env).is_ok();
        }
        other => panic!("no reader for {other}"),
    };
    Config::from_map(&env).is_ok()
}

#[test]
fn duration_parameters_take_documented_forms_and_nothing_the_code_refuses() {
    let t = template();
    let forms = documented_durations();
    for name in ["LockLease", "SweepGrace", "LockWait"] {
        let re = pattern(&t, name);
        let default = t["Parameters"][name]["Default"].as_str().unwrap();
        assert!(re.is_match(default), "{name}'s default {default:?}");
        assert!(code_accepts(name, default), "{name}'s default {default:?}");
        for c in CANDIDATES
            .iter()
            .copied()
            .chain(forms.iter().map(String::as_str))
        {
            if re.is_match(c) {
                assert!(
                    code_accepts(name, c),
                    "{name} lets {c:?} through; the code refuses it"
                );
            }
        }
    }
    // The wait takes every documented form (the lease and the grace, whole seconds up).
    let wait = pattern(&t, "LockWait");
    for form in forms.iter().map(String::as_str).chain(["0", "forever"]) {
        assert!(
            wait.is_match(form),
            "LockWait refuses the documented {form:?}"
        );
    }
    for word in flightlock::Wait::FOREVER_WORDS {
        assert!(wait.is_match(word), "LockWait refuses {word:?}");
    }
    for name in ["LockLease", "SweepGrace"] {
        let re = pattern(&t, name);
        for form in ["20s", "10m", "1h", "1d", "1m30s", "90"] {
            assert!(re.is_match(form), "{name} refuses {form:?}");
        }
    }
}

#[test]
fn the_permits_parameter_takes_exactly_what_the_code_accepts() {
    let t = template();
    let p = &t["Parameters"]["LockPermits"];
    let num = |field: &str| {
        p[field]
            .as_u64()
            .unwrap_or_else(|| panic!("LockPermits has no {field}"))
    };
    let (min, max, default) = (num("MinValue"), num("MaxValue"), num("Default"));
    assert_eq!((min, max), (1, u64::from(flightlock::MAX_PERMITS)));
    let accepts = |n: u64| {
        let env = HashMap::from([
            (config::TABLE.to_owned(), "locks".to_owned()),
            (config::FUNCTION_NAME.to_owned(), "job".to_owned()),
            (config::PERMITS.to_owned(), n.to_string()),
        ]);
        Config::from_map(&env).is_ok()
    };
    assert!(accepts(default) && accepts(min) && accepts(max));
    assert!(!accepts(min - 1) && !accepts(max + 1));
    // Both example jobs read it.
    let jobs = ["DemoPythonJob", "DemoRustJob"];
    for job in jobs {
        let vars = &t["Resources"][job]["Properties"]["Environment"]["Variables"];
        assert!(
            !vars[config::PERMITS].is_null(),
            "{job} does not set {}",
            config::PERMITS
        );
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
        .filter(|w| {
            w.strip_prefix("dynamodb:")
                .is_some_and(|action| action.starts_with(|c: char| c.is_ascii_uppercase()))
        })
        .filter(|w| *w != "dynamodb:LeadingKeys")
        .map(str::to_owned)
        .collect()
}

/// The actions the template grants the cleanup function.
fn cleanup_actions() -> BTreeSet<String> {
    let t = template();
    let f = properties(&t, "CleanupFunction", "AWS::Serverless::Function").unwrap();
    let docs = policy_documents(&t, f).unwrap();
    docs.iter()
        .flat_map(|d| d["Statement"].as_sequence().unwrap())
        .flat_map(|st| st["Action"].as_sequence().unwrap())
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_iam_page_lists_what_the_template_grants() {
    let doc = read(IAM);
    let lock_user = section(
        &doc,
        "## A lock user (the layer, the in-process layer, `flightlock run`)",
    )
    .join("\n");
    let start = lock_user
        .find("\"Action\": [")
        .expect("the lock user's statement");
    let statement = &lock_user[start..start + lock_user[start..].find(']').unwrap()];
    assert_eq!(actions_in(statement), lock_user_actions(), "{statement}");
    let cleanup = section(&doc, "## The cleanup function").join("\n");
    assert_eq!(actions_in(&cleanup), cleanup_actions(), "{cleanup}");
}

/// Every Markdown file of the docs: the guide and the READMEs.
pub(crate) fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files: Vec<PathBuf> = [
        "README.md",
        "extension/README.md",
        "functions/cleanup/README.md",
        "lock/README.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn iam_actions_are_written_only_on_the_iam_page() {
    let iam = repo_root().join(IAM);
    for file in doc_files() {
        if file == iam {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let found = actions_in(&text);
        assert!(
            found.is_empty(),
            "{} lists IAM actions {found:?}: link to {IAM} instead",
            file.display()
        );
    }
}

#[test]
fn actions_in_reads_actions_not_condition_keys() {
    assert_eq!(
        actions_in(
            "(`dynamodb:Query`, \"dynamodb:PutItem\"); `dynamodb:LeadingKeys`, aws_sdk_dynamodb::Client, dynamodb:…"
        ),
        ["dynamodb:PutItem", "dynamodb:Query"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    );
}
