// cdk-nag's AwsSolutions pack on what the constructs deploy: no finding, except those the
// construct acknowledges in its own code with the reason (src/index.ts, `acknowledge`).

import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { AwsSolutionsChecks } from 'cdk-nag';

import { Flightlock, FlightlockTable } from '../src';
import { newStack, placeholderCleanupCode, pythonFunction } from './helpers';

/** Every AwsSolutions finding on `stack` not acknowledged, as "rule at path". */
function findings(stack: Stack, ignorePaths: RegExp): string[] {
  const report = new AwsSolutionsChecks().validateScope(stack);
  return report.violations.flatMap((v) =>
    v.violatingResources.filter((r) => !ignorePaths.test(r.constructPath ?? '')).map((r) => `${v.ruleName} at ${r.constructPath}`),
  );
}

// The stand-in for the user's own function (and its role) is the test's, not the construct's:
// its findings (a basic-execution managed policy, no DLQ...) are the user's to decide.
const USERS_OWN = /^Nag\/Job\/(Resource|ServiceRole\/Resource)$/;

test('cdk-nag AwsSolutions: the table, the cleanup function and its rule, an attached function', () => {
  const stack = newStack('Nag');
  const locks = new Flightlock(stack, 'Flightlock', { createTable: true, cleanup: { code: placeholderCleanupCode() } });
  locks.attach(pythonFunction(stack, 'Job', lambda.Architecture.ARM_64), { key: 'nightly' });
  assert.deepEqual(findings(stack, USERS_OWN), []);
});

test('cdk-nag AwsSolutions: what the template deployed, attached; a key prefix', () => {
  const stack = newStack('Nag');
  const locks = Flightlock.fromTemplate(stack, 'Flightlock', { keyPrefix: 'jobs/' });
  locks.attach(pythonFunction(stack, 'Job', lambda.Architecture.ARM_64), { key: 'jobs/nightly' });
  assert.deepEqual(findings(stack, USERS_OWN), []);
});

test('cdk-nag AwsSolutions: the check is not vacuous, and an acknowledgement is only where its finding is', () => {
  const stack = newStack('Nag');
  // A table made without the construct, as the construct's is with PITR off: the finding shows.
  new dynamodb.Table(stack, 'Plain', { partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING } });
  assert.deepEqual(findings(stack, USERS_OWN), ['AwsSolutions-DDB3 at Nag/Plain/Resource']);
  // PITR on: nothing to acknowledge, and nothing is.
  const withPitr = new FlightlockTable(stack, 'Pitr', { pointInTimeRecovery: true });
  assert.deepEqual(withPitr.table.node.metadata.filter((m) => m.type === 'aws:cdk:acknowledged-rules'), []);
  assert.deepEqual(findings(stack, USERS_OWN), ['AwsSolutions-DDB3 at Nag/Plain/Resource']);
});
