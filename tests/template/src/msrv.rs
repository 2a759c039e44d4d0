//! The Rust minimum is true: the workspace's `rust-version` is no lower than the `rust-version`
//! of any package in `Cargo.lock` (as `cargo metadata` reports them), and every doc that states
//! the minimum ("Rust ≥ X") says the workspace's number.

use crate::params::doc_files;
use crate::repo_root;

/// A Rust version as numbers (`1.94.1` → `[1, 94, 1]`; a missing patch is 0, as Cargo reads it).
fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("{text:?} is not a version"))
        })
        .collect();
    parts.resize(3, 0);
    parts
}

/// The workspace's `rust-version` (`[workspace.package]` in the root `Cargo.toml`).
fn workspace_minimum() -> String {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a rust-version in the workspace's Cargo.toml")
        .to_owned()
}

/// The packages of `metadata` (the JSON of `cargo metadata --format-version 1`) whose
/// `rust_version` is higher than `minimum`, as `name version (rust_version)`.
fn above(metadata: &serde_json::Value, minimum: &str) -> Vec<String> {
    let min = version(minimum);
    metadata["packages"]
        .as_array()
        .expect("cargo metadata's packages")
        .iter()
        .filter_map(|p| {
            let rv = p["rust_version"].as_str()?;
            (version(rv) > min).then(|| format!("{} {} ({rv})", p["name"], p["version"]))
        })
        .collect()
}

#[test]
fn version_reads_two_and_three_parts() {
    assert_eq!(version("1.85"), [1, 85, 0]);
    assert!(version("1.94.1") > version("1.94"));
    assert!(version("1.100") > version("1.94.1"));
}

#[test]
fn above_names_only_packages_over_the_minimum() {
    let metadata: serde_json::Value = serde_json::json!({"packages": [
        {"name": "a", "version": "1.0.0", "rust_version": "1.94.1"},
        {"name": "b", "version": "2.0.0", "rust_version": "1.70"},
        {"name": "c", "version": "3.0.0", "rust_version": null},
    ]});
    assert_eq!(above(&metadata, "1.85"), ["\"a\" \"1.0.0\" (1.94.1)"]);
    assert!(above(&metadata, "1.94.1").is_empty());
}

#[test]
fn the_workspace_minimum_is_no_lower_than_any_locked_package() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(repo_root())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let minimum = workspace_minimum();
    let packages = metadata["packages"].as_array().unwrap();
    assert!(packages.len() > 50, "only {} packages", packages.len());
    // The workspace's own crates inherit it.
    for p in packages.iter().filter(|p| p["source"].is_null()) {
        assert_eq!(
            p["rust_version"].as_str(),
            Some(minimum.as_str()),
            "{}",
            p["name"]
        );
    }
    let higher = above(&metadata, &minimum);
    assert!(
        higher.is_empty(),
        "the workspace says rust-version = \"{minimum}\", but these locked packages need more: {}",
        higher.join(", ")
    );
}

#[test]
fn every_doc_states_the_workspace_minimum() {
    let minimum = workspace_minimum();
    let mut stated = 0;
    let mut wrong = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // "Rust ≥ X", "Rust (stable, ≥ X)": a ≥ within a few words after "Rust".
            for (at, _) in line.match_indices("Rust") {
                let Some((gap, rest)) = line[at..].split_once('≥') else {
                    continue;
                };
                if gap.len() > "Rust (stable, ".len() {
                    continue;
                }
                let number: String = rest
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                let number = number.trim_end_matches('.');
                stated += 1;
                if number != minimum {
                    wrong.push(format!("{}:{}: {number}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(stated >= 3, "only {stated} statements of the Rust minimum");
    assert!(
        wrong.is_empty(),
        "the workspace's minimum is {minimum}; these docs say otherwise:\n{}",
        wrong.join("\n")
    );
}
