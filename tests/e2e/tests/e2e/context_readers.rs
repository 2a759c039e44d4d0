//! The merged client context as each runtime's own JSON reader sees it: generated hostile
//! contexts go through the extension's reading and merging
//! ([`flightlock_lambda::client_context`]), and every context it hands on is read back by
//!
//! - Go's `encoding/json` into the `ClientContext` shape aws-lambda-go declares
//!   (`tests/e2e/runtimes/go`, `bootstrap read`): names matched case-insensitively with Unicode
//!   folding, a repeated field merged into one map;
//! - Python's `json.loads`, as `awslambdaric` reads the header (last of two equal names kept);
//! - Node.js's `JSON.parse`, as `aws-lambda-ric` reads it (last kept);
//! - `serde_json` into `lambda_runtime::ClientContext`, as a Rust function reads it.
//!
//! No reader may find a `flightlock*` entry (by any case) in `custom` that is not ours. A control
//! first shows that the Go reader really folds `cuſtom` into `Custom` (so the property is not
//! vacuous). Needs `eval "$(scripts/go-tools)"`; Python 3 and Node.js are on the machine.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::client_context::base64;
use flightlock_lambda::client_context::{self, is_reserved, LockContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const PYTHON_READER: &str = r#"
import base64, json, sys
for line in sys.stdin:
    text = base64.b64decode(line.strip()).decode("utf-8")
    try:
        v = json.loads(text)
        custom = v.get("custom") if isinstance(v, dict) else None
        print(json.dumps({"ok": True, "custom": custom or {}}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": str(e)}))
"#;

const NODE_READER: &str = r#"
const lines = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
for (const line of lines) {
  const text = Buffer.from(line.trim(), "base64").toString("utf8");
  try {
    const v = JSON.parse(text);
    console.log(JSON.stringify({ ok: true, custom: (v && v.custom) || {} }));
  } catch (e) {
    console.log(JSON.stringify({ ok: false, error: String(e) }));
  }
}
"#;

/// Runs `program args` with one base64 context a line on stdin; one JSON answer a line.
fn read_with(program: &str, args: &[&str], texts: &[String]) -> Vec<Value> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let mut input = String::new();
    for t in texts {
        input.push_str(&base64(t.as_bytes()));
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{program} failed: {:?}", out.status);
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers.len(),
        texts.len(),
        "{program}: one answer per context"
    );
    answers
}

fn go_reader() -> String {
    std::env::var("FLIGHTLOCK_GO_RUNTIME").unwrap_or_else(|_| {
        panic!("FLIGHTLOCK_GO_RUNTIME is not set: run `eval \"$(scripts/go-tools)\"` first")
    })
}

/// `custom` as a `lambda_runtime` function reads it: `serde_json` into the type of
/// `Context::client_context` (not exported by name), as `Context` is made from the header.
fn rust_custom(text: &str) -> Result<std::collections::HashMap<String, String>, serde_json::Error> {
    let mut context = lambda_runtime::Context::default();
    context.client_context = Some(serde_json::from_str(text)?);
    Ok(context
        .client_context
        .map(|cc| cc.custom)
        .unwrap_or_default())
}

/// Every reader's answers, by reader name.
fn read_everywhere(texts: &[String]) -> Vec<(&'static str, Vec<Value>)> {
    let rust = texts
        .iter()
        .map(|t| match rust_custom(t) {
            Ok(custom) => serde_json::json!({"ok": true, "custom": custom}),
            Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
        })
        .collect();
    vec![
        (
            "go encoding/json",
            read_with(&go_reader(), &["read"], texts),
        ),
        (
            "python json.loads",
            read_with("python3", &["-c", PYTHON_READER], texts),
        ),
        (
            "node JSON.parse",
            read_with("node", &["-e", NODE_READER], texts),
        ),
        ("rust lambda_runtime", rust),
    ]
}

/// The reserved entries (any case) a reader found in `custom`.
fn reserved(answer: &Value) -> BTreeMap<String, Value> {
    answer["custom"]
        .as_object()
        .map(|c| {
            c.iter()
                .filter(|(name, _)| is_reserved(name))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_go_reader_folds_custom_and_merges_repeats() {
    // The control: raw contexts, not merged, as a forger would send them.
    let texts = [
        "{\"cu\u{17f}tom\":{\"flightlockTicket\":\"999\"}}".to_owned(),
        r#"{"custom":{"flightlockTicket":"1"},"Custom":{"flightlockPermits":"7"}}"#.to_owned(),
    ];
    let go = read_with(&go_reader(), &["read"], &texts);
    assert_eq!(go[0]["custom"]["flightlockTicket"], "999", "{go:?}");
    assert_eq!(go[1]["custom"]["flightlockTicket"], "1", "{go:?}");
    assert_eq!(go[1]["custom"]["flightlockPermits"], "7", "{go:?}");
}

/// A piece of a hostile context: names every reader treats its own way.
fn hostile(rng: &mut StdRng) -> String {
    const TOP: &[&str] = &[
        "custom",
        "custom",
        "Custom",
        "CUSTOM",
        "cu\u{17f}tom",
        "cu\\u017ftom",
        "\\u0063ustom",
        "client",
        "Client",
        "env",
        "x",
    ];
    const NAMES: &[&str] = &[
        "flightlockTicket",
        "FlightlockTicket",
        "flightlock\\u0054icket",
        "FLIGHTLOCKTICKET",
        "flightloc\u{212a}Ticket",
        "flightlockPermits",
        "flightlockTick",
        "flightlockKey",
        "a",
        "tenant",
    ];
    const VALUES: &[&str] = &["\"999999999\"", "\"1\"", "null", "7", "{}", "\"\\u0039\""];
    let pick = |rng: &mut StdRng, from: &[&'static str]| from[rng.random_range(0..from.len())];
    let members: Vec<String> = (0..rng.random_range(1..4))
        .map(|_| {
            let name = pick(rng, TOP);
            let value = if rng.random_bool(0.8) {
                let entries: Vec<String> = (0..rng.random_range(0..4))
                    .map(|_| format!("\"{}\":{}", pick(rng, NAMES), pick(rng, VALUES)))
                    .collect();
                format!("{{{}}}", entries.join(","))
            } else {
                pick(rng, VALUES).to_owned()
            };
            format!("\"{name}\":{value}")
        })
        .collect();
    format!("{{{}}}", members.join(","))
}

#[test]
fn no_reader_finds_a_forged_entry_in_what_the_extension_hands_on() {
    let ours = LockContext {
        ticket: 42,
        key: "order-7".to_owned(),
        waited_ms: 3,
        tick: Some("2026-11-28T10:00:00.000Z".to_owned()),
        permits: 2,
    };
    let ours_entries: BTreeMap<String, Value> = ours
        .entries()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), Value::String(v)))
        .collect();
    let mut rng = StdRng::seed_from_u64(42);
    let (mut merged, mut sent, mut refused) = (Vec::new(), Vec::new(), 0);
    for _ in 0..600 {
        let caller = hostile(&mut rng);
        match client_context::read(Some(caller.as_bytes())) {
            Ok(read) => {
                merged.push(read.merge(Some(&ours)).value);
                sent.push(caller);
            }
            Err(_) => refused += 1,
        }
    }
    assert!(
        merged.len() > 100 && refused > 100,
        "the generator exercises both sides: {} handed on, {refused} refused",
        merged.len()
    );
    for (reader, answers) in read_everywhere(&merged) {
        let mut read_ok = 0;
        for (i, answer) in answers.iter().enumerate() {
            if answer["ok"] != true {
                // The reader fails the invocation (Go and Rust refuse a non-string value in
                // custom): the handler runs with nothing forged.
                continue;
            }
            read_ok += 1;
            assert_eq!(
                reserved(answer),
                ours_entries,
                "{reader} read other flightlock entries than ours\ncaller: {}\nmerged: {}",
                sent[i],
                merged[i]
            );
        }
        assert!(read_ok > 50, "{reader} read only {read_ok} contexts");
    }
}
