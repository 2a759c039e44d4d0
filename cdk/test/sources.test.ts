// The construct's names against their sources, so that none of them is a second copy that can
// drift: the configuration reference and the IAM page (each checked against the code and
// template.yaml by tests/template), the publisher (release/publish.py), template.yaml's table.

import { strict as assert } from 'node:assert';
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { test } from 'node:test';

import {
  ARCHITECTURES,
  CLEANUP_ACTIONS,
  CLEANUP_VARIABLES,
  FUNCTION_VARIABLES,
  LAYER_PARAMETER_PREFIX,
  layerName,
  layerParameterName,
  LOCK_USER_ACTIONS,
  SWITCH_OFF_WORDS,
  TABLE_SCHEMA,
  VERSION,
  WRAPPER,
} from '../src';
import { read, REPO, section } from './helpers';

const sorted = (xs: Iterable<string>) => [...xs].sort();

/** The backticked `FLIGHTLOCK_*` names that start the rows of a Markdown table. */
function variableRows(text: string): string[] {
  return [...text.matchAll(/^\| `(FLIGHTLOCK_[A-Z_]+)` \|/gm)].map((m) => m[1]);
}

/** The `dynamodb:Action` names in a text (condition keys such as dynamodb:LeadingKeys are not actions). */
function actionsIn(text: string): string[] {
  return [...new Set([...text.matchAll(/dynamodb:([A-Z][A-Za-z]+)/g)].map((m) => `dynamodb:${m[1]}`))].filter(
    (a) => a !== 'dynamodb:LeadingKeys',
  );
}

test('the function variables are the configuration reference\'s (which tests/template checks against the code)', () => {
  const doc = read('docs/src/reference/configuration.md');
  assert.deepEqual(sorted(FUNCTION_VARIABLES), sorted(variableRows(section(doc, '## Function variables'))));
  assert.deepEqual(sorted(CLEANUP_VARIABLES), sorted(variableRows(section(doc, '## Cleanup function variables'))));
  assert.ok(doc.includes(`\`AWS_LAMBDA_EXEC_WRAPPER=${WRAPPER}\``), 'the wrapper path of the configuration reference');
});

test('the IAM actions are the IAM page\'s (which tests/template checks against template.yaml and the code)', () => {
  const doc = read('docs/src/reference/iam.md');
  const lockUser = section(doc, '## A lock user (the layer, the in-process layer, `flightlock run`)');
  const statement = lockUser.slice(lockUser.indexOf('"Action": ['), lockUser.indexOf(']', lockUser.indexOf('"Action": [')));
  assert.deepEqual(sorted(LOCK_USER_ACTIONS), sorted(actionsIn(statement)));
  assert.deepEqual(sorted(CLEANUP_ACTIONS), sorted(actionsIn(section(doc, '## The cleanup function'))));
});

test('layer and SSM parameter names are the publisher\'s (release/publish.py)', () => {
  const versions = ['0.1.0', '1.2.3+rc.1', 'latest'];
  const script = [
    'import json, sys',
    `sys.path.insert(0, ${JSON.stringify(path.join(REPO, 'release'))})`,
    'import publish',
    `vs = ${JSON.stringify(versions)}`,
    'print(json.dumps({"prefix": publish.SSM_PREFIX, "arches": list(publish.ARCHES),',
    '  "names": {a: {v: publish.layer_name(a, v) for v in vs} for a in publish.ARCHES},',
    '  "ssm": {a: {v: publish.ssm_name(a, v) for v in vs} for a in publish.ARCHES}}))',
  ].join('\n');
  const py = JSON.parse(execFileSync('python3', ['-c', script], { encoding: 'utf8' }));
  assert.equal(LAYER_PARAMETER_PREFIX, py.prefix);
  assert.deepEqual(sorted(ARCHITECTURES), sorted(py.arches));
  for (const arch of ARCHITECTURES) {
    for (const v of versions) {
      assert.equal(layerName(arch, v), py.names[arch][v]);
      assert.equal(layerParameterName(arch, v), py.ssm[arch][v]);
    }
  }
  // `latest` is written by the publisher under the same prefix (publish.run).
  assert.ok(read('release/publish.py').includes('f"{SSM_PREFIX}/{arch}/latest"'));
});

test('the table schema is template.yaml\'s LockTable', () => {
  const template = read('template.yaml');
  const start = template.indexOf('\n  LockTable:\n');
  assert.ok(start >= 0, 'template.yaml has LockTable');
  const rest = template.slice(start + 1);
  const next = rest.slice(1).search(/\n  [A-Za-z]/);
  const block = next < 0 ? rest : rest.slice(0, next + 1);
  const expect = [
    'Type: AWS::DynamoDB::Table',
    'BillingMode: PAY_PER_REQUEST',
    `- AttributeName: ${TABLE_SCHEMA.partitionKey}\n          AttributeType: S`,
    `- AttributeName: ${TABLE_SCHEMA.sortKey}\n          AttributeType: S`,
    `- AttributeName: ${TABLE_SCHEMA.partitionKey}\n          KeyType: HASH`,
    `- AttributeName: ${TABLE_SCHEMA.sortKey}\n          KeyType: RANGE`,
    `TimeToLiveSpecification:\n        AttributeName: ${TABLE_SCHEMA.ttlAttribute}\n        Enabled: true`,
    'SSESpecification:\n        SSEEnabled: true',
  ];
  for (const e of expect) assert.ok(block.includes(e), `template.yaml's LockTable has no "${e}":\n${block}`);
});

test('the package version is the workspace\'s (Cargo.toml), the release the construct was written for', () => {
  const cargo = read('Cargo.toml');
  const workspacePackage = cargo.slice(cargo.indexOf('[workspace.package]'));
  const version = /^version = "([^"]+)"/m.exec(workspacePackage)?.[1];
  const pkg = JSON.parse(read('cdk/package.json'));
  const lock = JSON.parse(read('cdk/package-lock.json'));
  assert.equal(pkg.version, version);
  assert.equal(lock.version, version);
  assert.equal(lock.packages[''].version, version);
  assert.equal(VERSION, version, 'src/index.ts VERSION (the layer version attached by default)');
});

test('the install commands of the package README and the guide name this release', () => {
  for (const page of ['cdk/README.md', 'docs/src/getting-started/cdk.md']) {
    const text = read(page);
    const named = [...text.matchAll(/(?:npm install flightlock-cdk@|pip install flightlock-cdk==)(\S+)/g)].map((m) => m[1]);
    assert.equal(named.length, 2, `${page}: the npm and the pip install command`);
    for (const v of named) assert.equal(v, VERSION, `${page}: an install command names ${v}, the release is ${VERSION}`);
  }
});

test('the switch words read as off are the lock crate\'s (lock/src/options.rs)', () => {
  const m = /pub const SWITCH_OFF_WORDS: &\[&str\] = &\[([^\]]*)\];/.exec(read('lock/src/options.rs'));
  assert.ok(m, 'SWITCH_OFF_WORDS not found in lock/src/options.rs');
  assert.deepEqual([...m[1].matchAll(/"([^"]*)"/g)].map((w) => w[1]), [...SWITCH_OFF_WORDS]);
});
