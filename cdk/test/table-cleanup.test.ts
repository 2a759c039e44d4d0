// The lock table and the cleanup function, when asked for: as template.yaml declares them.

import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { Duration, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as lambda from 'aws-cdk-lib/aws-lambda';

import { CLEANUP_ACTIONS, Flightlock, FlightlockCleanup, FlightlockTable } from '../src';
import { newStack, only, placeholderCleanupCode, pythonFunction, synth } from './helpers';

test('createTable: pk/sk strings, TTL on expiresAt, on-demand, encrypted, retained with deletion protection', () => {
  const stack = newStack();
  new Flightlock(stack, 'Flightlock', { createTable: true });
  const t = synth(stack, 'table-retained');
  const [, table] = only(t, 'AWS::DynamoDB::Table');
  assert.equal(table.DeletionPolicy, 'Retain');
  assert.equal(table.UpdateReplacePolicy, 'Retain');
  assert.deepEqual(table.Properties, {
    AttributeDefinitions: [
      { AttributeName: 'pk', AttributeType: 'S' },
      { AttributeName: 'sk', AttributeType: 'S' },
    ],
    BillingMode: 'PAY_PER_REQUEST',
    DeletionProtectionEnabled: true,
    KeySchema: [
      { AttributeName: 'pk', KeyType: 'HASH' },
      { AttributeName: 'sk', KeyType: 'RANGE' },
    ],
    PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: false },
    SSESpecification: { SSEEnabled: true },
    TimeToLiveSpecification: { AttributeName: 'expiresAt', Enabled: true },
  });
});

test('createTable: DESTROY for throw-away stacks (no deletion protection), a name, point-in-time recovery', () => {
  const stack = newStack();
  new FlightlockTable(stack, 'Locks', { removalPolicy: RemovalPolicy.DESTROY, tableName: 'test-locks', pointInTimeRecovery: true });
  const t = synth(stack, 'table-destroy');
  const [, table] = only(t, 'AWS::DynamoDB::Table');
  assert.equal(table.DeletionPolicy, 'Delete');
  assert.equal(table.UpdateReplacePolicy, 'Delete');
  assert.equal(table.Properties.DeletionProtectionEnabled, false);
  assert.equal(table.Properties.TableName, 'test-locks');
  assert.deepEqual(table.Properties.PointInTimeRecoverySpecification, { PointInTimeRecoveryEnabled: true });
  assert.throws(() => new FlightlockTable(stack, 'Snap', { removalPolicy: RemovalPolicy.SNAPSHOT }), /RETAIN or DESTROY/);
});

test('cleanup: provided.al2023 bootstrap, arm64, 300 s, JSON logs, the table, a 15-minute schedule, only its three actions', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { createTable: true, cleanup: { code: placeholderCleanupCode() } });
  locks.attach(pythonFunction(stack, 'Job'));
  const t = synth(stack, 'cleanup-default');
  const tableId = only(t, 'AWS::DynamoDB::Table')[0];

  const fns = t.findResources('AWS::Lambda::Function');
  const [cleanupId, cleanup] = Object.entries(fns).find(([id]) => id.startsWith('FlightlockCleanup'))!;
  assert.equal(cleanup.Properties.Runtime, 'provided.al2023');
  assert.equal(cleanup.Properties.Handler, 'bootstrap');
  assert.deepEqual(cleanup.Properties.Architectures, ['arm64']);
  assert.equal(cleanup.Properties.Timeout, 300);
  assert.equal(cleanup.Properties.MemorySize, 256);
  assert.deepEqual(cleanup.Properties.LoggingConfig, { LogFormat: 'JSON' });
  assert.deepEqual(cleanup.Properties.Environment.Variables, { FLIGHTLOCK_TABLE: { Ref: tableId } });
  assert.equal(cleanup.Properties.Layers, undefined, 'the sweeper runs without the layer');

  const role = cleanup.Properties.Role['Fn::GetAtt'][0];
  const statements = Object.values(t.findResources('AWS::IAM::Policy'))
    .filter((p: any) => p.Properties.Roles.some((r: any) => r.Ref === role))
    .flatMap((p: any) => p.Properties.PolicyDocument.Statement);
  assert.deepEqual(statements, [
    { Sid: 'SweepLockTable', Action: [...CLEANUP_ACTIONS], Effect: 'Allow', Resource: { 'Fn::GetAtt': [tableId, 'Arn'] } },
  ]);

  const [, rule] = only(t, 'AWS::Events::Rule');
  assert.equal(rule.Properties.ScheduleExpression, 'rate(15 minutes)');
  assert.equal(rule.Properties.State, 'ENABLED');
  assert.deepEqual(rule.Properties.Targets.map((x: any) => x.Arn), [{ 'Fn::GetAtt': [cleanupId, 'Arn'] }]);
  const [, permission] = only(t, 'AWS::Lambda::Permission');
  assert.equal(permission.Properties.Principal, 'events.amazonaws.com');
  assert.equal(permission.Properties.Action, 'lambda:InvokeFunction');
});

test('cleanup: settings rendered as the sweeper reads them; on an existing table; x86_64', () => {
  const stack = newStack();
  new FlightlockCleanup(stack, 'Cleanup', {
    table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks'),
    code: placeholderCleanupCode(),
    architecture: lambda.Architecture.X86_64,
    schedule: events.Schedule.rate(Duration.minutes(5)),
    timeout: Duration.minutes(10),
    sweepGrace: Duration.hours(1),
    sweepConcurrency: 32,
    sweepSegments: 4,
    sweepMargin: Duration.millis(7500),
    metrics: false,
  });
  const t = synth(stack, 'cleanup-settings');
  const [, fn] = only(t, 'AWS::Lambda::Function');
  assert.deepEqual(fn.Properties.Architectures, ['x86_64']);
  assert.equal(fn.Properties.Timeout, 600);
  assert.deepEqual(fn.Properties.Environment.Variables, {
    FLIGHTLOCK_TABLE: 'my-locks',
    FLIGHTLOCK_SWEEP_GRACE: '3600s',
    FLIGHTLOCK_SWEEP_CONCURRENCY: '32',
    FLIGHTLOCK_SWEEP_SEGMENTS: '4',
    FLIGHTLOCK_SWEEP_MARGIN: '7500ms',
    FLIGHTLOCK_METRICS: 'off',
  });
  assert.equal(only(t, 'AWS::Events::Rule')[1].Properties.ScheduleExpression, 'rate(5 minutes)');

  const table = dynamodb.Table.fromTableName(stack, 'Locks2', 'my-locks');
  const code = placeholderCleanupCode();
  assert.throws(() => new FlightlockCleanup(stack, 'A', { table, code, sweepGrace: Duration.millis(500) }), /whole seconds, at least 1/);
  assert.throws(() => new FlightlockCleanup(stack, 'B', { table, code, sweepConcurrency: 0 }), /1 to 256/);
  assert.throws(() => new FlightlockCleanup(stack, 'C', { table, code, sweepSegments: 257 }), /1 to 256/);
});
