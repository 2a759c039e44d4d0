// The guide's example (docs/src/getting-started/cdk.md) is cdk/examples/, byte for byte, and the
// stack it defines synthesizes to what the page says; it imports the package by its name, as a
// user's app does.

import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import * as os from 'node:os';

import { App, Stack } from 'aws-cdk-lib';

import { JobsStack } from '../examples/lib/jobs-stack';
import { BatchStack, FromTemplateStack, OwnLayerStack, PinnedStack, ReleasedLayerStack } from '../examples/lib/variants';
import { VERSION } from '../src';
import { only, placeholderCleanupCode, read, REPO, synth } from './helpers';

const PAGE = 'docs/src/getting-started/cdk.md';
const EXAMPLES = path.join(REPO, 'cdk', 'examples');

/** The page's TypeScript blocks. */
function tsBlocks(text: string): string[] {
  return [...text.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
}

/** The lines of `text` without their indentation or blank lines. */
function trimmed(text: string): string[] {
  return text.split('\n').map((l) => l.trim()).filter((l) => l !== '');
}

test('the page\'s TypeScript is cdk/examples/: whole files, or fragments of lib/variants.ts', () => {
  const blocks = tsBlocks(read(PAGE));
  const files: string[] = [];
  const variants = trimmed(fs.readFileSync(path.join(EXAMPLES, 'lib', 'variants.ts'), 'utf8')).join('\n');
  for (const body of blocks) {
    const file = /^\/\/ (\S+\.ts)\n/.exec(body)?.[1];
    if (file) {
      files.push(file);
      assert.equal(body, fs.readFileSync(path.join(EXAMPLES, file), 'utf8'), `${PAGE}: ${file}`);
    } else {
      assert.ok(variants.includes(trimmed(body).join('\n')), `${PAGE}: a fragment not in cdk/examples/lib/variants.ts:\n${body}`);
    }
  }
  assert.deepEqual(files.sort(), ['bin/jobs.ts', 'lib/jobs-stack.ts']);
  assert.ok(blocks.length >= 5, `only ${blocks.length} TypeScript blocks`);
});

/** Runs `f` in a scratch directory holding placeholders for the release files the examples name. */
function inReleaseDir<T>(f: () => T): T {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'flightlock-cdk-example-'));
  // An empty zip (its end-of-central-directory record): synthesis only hashes and stages it.
  const emptyZip = Buffer.concat([Buffer.from('PK\x05\x06'), Buffer.alloc(18)]);
  for (const zip of ['flightlock-layer-arm64.zip', 'flightlock-cleanup-arm64.zip']) fs.writeFileSync(path.join(dir, zip), emptyZip);
  const built = path.join(dir, 'target', 'lambda', 'arm64', 'flightlock-cleanup');
  fs.mkdirSync(built, { recursive: true });
  fs.writeFileSync(path.join(built, 'bootstrap'), '#!/bin/sh\nexit 1\n', { mode: 0o755 });
  const cwd = process.cwd();
  process.chdir(dir);
  try {
    return f();
  } finally {
    process.chdir(cwd);
  }
}

test('the example app (bin/jobs.ts) constructs, with the release zip it names', () => {
  inReleaseDir(() => require('../examples/bin/jobs'));
});

test('the variants synthesize: released ARNs, a layer of your own, a pinned version under a key prefix, a batch consumer', () => {
  const app = new App();
  const stacks: [string, Stack][] = inReleaseDir(() => [
    ['example-released', new ReleasedLayerStack(app, 'Released')],
    ['example-own-layer', new OwnLayerStack(app, 'OwnLayer')],
    ['example-pinned', new PinnedStack(app, 'Pinned')],
    ['example-batch', new BatchStack(app, 'Batch')],
    ['example-from-template', new FromTemplateStack(app, 'FromTemplate')],
  ]);
  const t = Object.fromEntries(stacks.map(([name, stack]) => [name, inReleaseDir(() => synth(stack, name))]));

  const released = only(t['example-released'], 'AWS::Lambda::Function')[1].Properties;
  assert.match(JSON.stringify(released.Layers), /:123456789012:layer:flightlock-x86_64-0_1_0:1/);

  const own = t['example-own-layer'];
  const [layerId, layer] = only(own, 'AWS::Lambda::LayerVersion');
  assert.equal(layer.DeletionPolicy, 'Retain');
  const ownJob = Object.entries(own.findResources('AWS::Lambda::Function')).find(([id]) => id.startsWith('Job'))![1];
  assert.deepEqual(ownJob.Properties.Layers, [{ Ref: layerId }]);

  const pinned = t['example-pinned'];
  const consumer = only(pinned, 'AWS::Lambda::Function')[1].Properties;
  assert.equal(pinned.toJSON().Parameters[consumer.Layers[0].Ref].Default, '/flightlock/layer/arm64/0.1.0');
  assert.equal(consumer.Environment.Variables.FLIGHTLOCK_ON_BUSY, 'error');
  assert.equal(consumer.Environment.Variables.FLIGHTLOCK_WAIT, '20s');
  assert.match(JSON.stringify(pinned.toJSON()), /"dynamodb:LeadingKeys":\["orders\/\*"\]/);

  const batch = t['example-batch'];
  const batchFn = only(batch, 'AWS::Lambda::Function')[1].Properties;
  assert.deepEqual(batchFn.Environment.Variables, {
    AWS_LAMBDA_EXEC_WRAPPER: '/opt/flightlock-wrapper',
    FLIGHTLOCK_TABLE: 'my-locks',
    FLIGHTLOCK_GATE: 'off',
    FLIGHTLOCK_WAIT: '0',
  });
  assert.match(JSON.stringify(batch.toJSON()), /"dynamodb:LeadingKeys":\["orders\/\*"\]/);

  const fromTemplate = t['example-from-template'];
  const defaults = Object.values(fromTemplate.toJSON().Parameters ?? {}).map((p: any) => p.Default).sort();
  assert.deepEqual(defaults, ['/cdk-bootstrap/hnb659fds/version', '/flightlock/layer/arm64/0.1.0', '/flightlock/table/lock-user-policy', '/flightlock/table/name']);
});

test('the example stack: the function gated, the table, the cleanup function, the layer from SSM', () => {
  const stack = new JobsStack(new App(), 'Jobs', { cleanupCode: placeholderCleanupCode() });
  const t = synth(stack, 'example-jobs');
  const tableId = only(t, 'AWS::DynamoDB::Table')[0];
  const fns = t.findResources('AWS::Lambda::Function');
  const [, report] = Object.entries(fns).find(([id]) => id.startsWith('NightlyReport'))!;
  assert.deepEqual(report.Properties.Environment.Variables, {
    AWS_LAMBDA_EXEC_WRAPPER: '/opt/flightlock-wrapper',
    FLIGHTLOCK_TABLE: { Ref: tableId },
    FLIGHTLOCK_KEY: 'nightly-report',
  });
  const layerParam = t.toJSON().Parameters[report.Properties.Layers[0].Ref];
  assert.deepEqual(layerParam, { Type: 'AWS::SSM::Parameter::Value<String>', Default: `/flightlock/layer/arm64/${VERSION}` });
  assert.ok(Object.keys(fns).some((id) => id.startsWith('FlightlockCleanup')));
  assert.equal(only(t, 'AWS::Events::Rule')[1].Properties.ScheduleExpression, 'rate(15 minutes)');
  // No export: nothing another stack imports, so no update is ever blocked by one.
  assert.deepEqual(t.toJSON().Outputs ?? {}, {});
});
