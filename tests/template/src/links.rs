//! The docs' link check: every relative link and `#anchor` in the guide (`docs/src`) and the
//! READMEs resolves — to a page, a repository file or folder, and a heading of the page it names
//! — and every page of the guide is in `docs/src/SUMMARY.md`. (`scripts/docs` builds the book
//! with `create-missing = false`, so a page SUMMARY.md names that does not exist fails there.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::params::doc_files;
use crate::repo_root;

/// `text` without fenced code blocks and inline code spans: links inside code are not links.
/// Fence lines become empty lines, so line numbers stay.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            // Drop inline code spans: every other piece between backticks.
            let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
            out.push_str(&plain);
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`, with their line numbers.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose(text).lines().enumerate() {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            // `[text](target "title")`: the title is not part of the target.
            let target = target.split_whitespace().next().unwrap_or_default();
            found.push((n + 1, target.to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// A heading's anchor as mdBook and GitHub make it: lower case, spaces to `-`, letters, digits,
/// `-` and `_` kept, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks); a repeated heading gets
/// `-1`, `-2`, ... as on GitHub and in mdBook.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// What is wrong with the link `target` in `file` (`None`: it resolves).
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
    {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let resolved: PathBuf = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().unwrap_or(Path::new(".")).join(path)
    };
    if !resolved.exists() {
        return Some(format!("{path} does not exist"));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return Some(format!("#{anchor} on {path}, which is not a Markdown page"));
    }
    let text = std::fs::read_to_string(&resolved).ok()?;
    if anchors(&text).contains(anchor) {
        None
    } else {
        Some(format!("no heading #{anchor} in {}", resolved.display()))
    }
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in link_targets(&text) {
            checked += 1;
            if let Some(problem) = broken(&file, &target) {
                let shown = file
                    .strip_prefix(&root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                problems.push(format!("{shown}:{line}: ({target}): {problem}"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the scan broken?"
    );
    assert!(problems.is_empty(), "dead links:\n{}", problems.join("\n"));
}

#[test]
fn every_page_of_the_guide_is_in_the_summary() {
    let src = repo_root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = link_targets(&summary)
        .into_iter()
        .map(|(_, t)| src.join(t))
        .collect();
    for file in doc_files() {
        if file.starts_with(&src) && file != src.join("SUMMARY.md") {
            assert!(
                listed.contains(&file),
                "{} is not in docs/src/SUMMARY.md",
                file.display()
            );
        }
    }
}

#[test]
fn links_and_anchors_are_read_as_mdbook_and_github_do() {
    let text = "# A `sam build` page\n\nSee [x](a.md#b-c) and `[not](a link)`.\n\n```md\n[no](x)\n```\n## Same\n## Same\n";
    assert_eq!(link_targets(text), vec![(3, "a.md#b-c".to_owned())]);
    let a = anchors(text);
    assert!(a.contains("a-sam-build-page"), "{a:?}");
    assert!(a.contains("same") && a.contains("same-1"), "{a:?}");
    assert_eq!(
        slug("The cleanup function's tests"),
        "the-cleanup-functions-tests"
    );
    assert_eq!(
        slug("SQS, Kinesis and DynamoDB Streams"),
        "sqs-kinesis-and-dynamodb-streams"
    );
    let here = repo_root().join("README.md");
    assert!(broken(&here, "docs/src/SUMMARY.md").is_none());
    assert!(broken(&here, "docs/src/nope.md").is_some());
    assert!(broken(&here, "#no-such-heading").is_some());
    assert!(broken(&here, "https://example.com/x").is_none());
}

/// The files a page includes (`{{#include path}}`, `{{#include path:anchor}}`), by line. mdBook
/// resolves them from the page's folder and, when one is missing, logs an error and builds the
/// page without it: the clients the guide shows (`clients/python`, `clients/node`) are included
/// from outside docs/, so a moved file would leave an empty code block.
fn include_targets(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find("{{#include ") {
            let after = &rest[start + "{{#include ".len()..];
            let Some(end) = after.find("}}") else { break };
            let target = after[..end].trim();
            let path = target.split(':').next().unwrap_or(target);
            found.push((i + 1, path.to_owned()));
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_included_file_exists() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, target) in include_targets(&text) {
            checked += 1;
            if !file.parent().unwrap().join(&target).is_file() {
                problems.push(format!(
                    "{}:{line}: {{{{#include {target}}}}}",
                    file.display()
                ));
            }
        }
    }
    assert!(
        checked >= 5,
        "only {checked} includes found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "included files that do not exist:\n{}",
        problems.join("\n")
    );
    assert_eq!(
        include_targets(
            "a\n```python\n{{#include ../../x/_locks.py}}\n{{#include y.rs:anchor}}\n```"
        ),
        vec![(3, "../../x/_locks.py".to_owned()), (4, "y.rs".to_owned())]
    );
}
