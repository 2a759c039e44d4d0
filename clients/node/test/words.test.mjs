// The refusal words are copies of the lock API's (extension/src/lock_api.rs) and of the guide's
// table (docs/src/guide/lock-api.md, "Refusals"): all three must be the same set.
// FLIGHTLOCK_REPO is the repository root (scripts/check-client-node sets it).
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { Refusal } from "flightlock";

const repo = process.env.FLIGHTLOCK_REPO;

// The words of lock_api.rs: the `error` of every refuse(StatusCode::X, "word", ...) and of every
// (StatusCode::X, "word") a RecordError maps to.
export function codeWords(source) {
  const words = new Set();
  for (const m of source.matchAll(/StatusCode::[A-Z_]+,\s*"([A-Za-z]+)"/g)) words.add(m[1]);
  return words;
}

// The `error` column of the guide's refusal table.
export function guideWords(page) {
  const section = page.split("## Refusals")[1].split("\n## ")[0];
  const words = new Set();
  for (const m of section.matchAll(/^\| \d{3} \| `([A-Za-z]+)` \|/gm)) words.add(m[1]);
  return words;
}

test("Refusal is the lock API's words and the guide's table", () => {
  assert.ok(repo, "FLIGHTLOCK_REPO is not set: run through scripts/check-client-node");
  const code = codeWords(readFileSync(join(repo, "extension/src/lock_api.rs"), "utf8"));
  const guide = guideWords(readFileSync(join(repo, "docs/src/guide/lock-api.md"), "utf8"));
  const ours = new Set(Object.values(Refusal));
  assert.ok(code.size >= 15, `only ${code.size} words found in lock_api.rs`);
  assert.deepEqual([...ours].sort(), [...code].sort(), "Refusal vs extension/src/lock_api.rs");
  assert.deepEqual([...guide].sort(), [...code].sort(), "the guide's Refusals table vs extension/src/lock_api.rs");
});

test("the readers find a word that is added or missing", () => {
  const code = codeWords('refuse(StatusCode::CONFLICT, "busy", m) (StatusCode::NOT_FOUND, "notHeld")');
  assert.deepEqual([...code].sort(), ["busy", "notHeld"]);
  const guide = guideWords("## Refusals\n\n| 409 | `busy` | x |\n| 404 | `notHeld` | y |\n\n## Clients\n| 500 | `other` | z |\n");
  assert.deepEqual([...guide].sort(), ["busy", "notHeld"]);
});
