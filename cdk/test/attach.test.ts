// attach(): the layer by architecture, the variables, the lock user's policy; and what it refuses.

import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { Duration } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as ecr from 'aws-cdk-lib/aws-ecr';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';

import { Flightlock, FlightlockLayer, LOCK_USER_ACTIONS, OnBusy, releasedLayerArn, VERSION, WRAPPER } from '../src';
import { newStack, only, placeholderCleanupCode, pythonFunction, synth } from './helpers';

const X86_ARN = 'arn:aws:lambda:eu-west-1:222222222222:layer:flightlock-x86_64-0_2_0:1';

/** The function's resolved properties. */
function functionProps(template: Template, fnId: string): any {
  const fns = template.findResources('AWS::Lambda::Function');
  const id = Object.keys(fns).find((k) => k.startsWith(fnId));
  if (id === undefined) throw new Error(`no function ${fnId} in ${Object.keys(fns).join(', ')}`);
  return fns[id].Properties;
}

/** The SSM parameter name behind a `{Ref: P}` of an SSM-typed template parameter. */
function ssmParameterName(template: Template, ref: unknown): string {
  const name = (ref as { Ref?: string }).Ref;
  if (name === undefined) throw new Error(`not a Ref: ${JSON.stringify(ref)}`);
  const p = template.toJSON().Parameters[name];
  assert.equal(p.Type, 'AWS::SSM::Parameter::Value<String>');
  return p.Default;
}

/** The statements of the policies attached to `fnId`'s role. */
function roleStatements(template: Template, fnId: string): any[] {
  const role = functionProps(template, fnId).Role['Fn::GetAtt'][0];
  return Object.values(template.findResources('AWS::IAM::Policy'))
    .filter((p: any) => p.Properties.Roles.some((r: any) => r.Ref === role))
    .flatMap((p: any) => p.Properties.PolicyDocument.Statement);
}

test('attach: the layer of each function architecture from SSM, the wrapper, the table, the policy', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { createTable: true });
  locks.attach(pythonFunction(stack, 'JobX86'));
  locks.attach(pythonFunction(stack, 'JobArm', lambda.Architecture.ARM_64), { key: 'nightly', wait: Duration.seconds(30) });
  const t = synth(stack, 'attach-ssm');

  const x86 = functionProps(t, 'JobX86');
  assert.equal(x86.Layers.length, 1);
  // Pinned by default: the construct's own release, never `latest` unless asked.
  assert.equal(ssmParameterName(t, x86.Layers[0]), `/flightlock/layer/x86_64/${VERSION}`);
  assert.deepEqual(x86.Environment.Variables, {
    AWS_LAMBDA_EXEC_WRAPPER: WRAPPER,
    FLIGHTLOCK_TABLE: { Ref: only(t, 'AWS::DynamoDB::Table')[0] },
  });
  const arm = functionProps(t, 'JobArm');
  assert.equal(ssmParameterName(t, arm.Layers[0]), `/flightlock/layer/arm64/${VERSION}`);
  assert.equal(arm.Environment.Variables.FLIGHTLOCK_KEY, 'nightly');
  assert.equal(arm.Environment.Variables.FLIGHTLOCK_WAIT, '30s');

  for (const fn of ['JobX86', 'JobArm']) {
    const dynamo = roleStatements(t, fn).filter((s) => JSON.stringify(s.Action).includes('dynamodb:'));
    assert.equal(dynamo.length, 1, JSON.stringify(dynamo));
    assert.deepEqual(dynamo[0].Action, [...LOCK_USER_ACTIONS]);
    assert.equal(dynamo[0].Effect, 'Allow');
    assert.deepEqual(dynamo[0].Resource, { 'Fn::GetAtt': [only(t, 'AWS::DynamoDB::Table')[0], 'Arn'] });
    assert.equal(dynamo[0].Condition, undefined);
  }
});

test('attach: a pinned layer version reads that version\'s parameter; a prefix of your own', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', {
    table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks'),
    layerVersion: '0.2.0',
    layerParameterPrefix: '/platform/flightlock/layer',
  });
  locks.attach(pythonFunction(stack, 'Job', lambda.Architecture.ARM_64));
  const t = synth(stack, 'attach-pinned');
  const fn = functionProps(t, 'Job');
  assert.equal(ssmParameterName(t, fn.Layers[0]), '/platform/flightlock/layer/arm64/0.2.0');
  assert.equal(fn.Environment.Variables.FLIGHTLOCK_TABLE, 'my-locks');
  assert.deepEqual(t.findResources('AWS::DynamoDB::Table'), {});
  const [statement] = roleStatements(t, 'Job').filter((s) => JSON.stringify(s.Action).includes('dynamodb:'));
  assert.deepEqual(statement.Resource, {
    'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':dynamodb:eu-west-1:111111111111:table/my-locks']],
  });
});

test('attach: given layer ARNs, by architecture; the formula of a released layer', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', {
    table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks'),
    layerArns: { x86_64: X86_ARN, arm64: releasedLayerArn('arm64', '0.2.0', '222222222222') },
  });
  locks.attach(pythonFunction(stack, 'JobX86'));
  locks.attach(pythonFunction(stack, 'JobArm', lambda.Architecture.ARM_64));
  const t = synth(stack, 'attach-arns');
  assert.deepEqual(functionProps(t, 'JobX86').Layers, [X86_ARN]);
  assert.deepEqual(functionProps(t, 'JobArm').Layers, [
    {
      'Fn::Join': [
        '',
        ['arn:', { Ref: 'AWS::Partition' }, ':lambda:', { Ref: 'AWS::Region' }, ':222222222222:layer:flightlock-arm64-0_2_0:1'],
      ],
    },
  ]);
  assert.equal(t.toJSON().Parameters?.['SsmParameterValueflightlocklayerx8664latest'], undefined);
  const ssmTyped = Object.values(t.toJSON().Parameters ?? {}).filter((p: any) => p.Default?.startsWith?.('/flightlock'));
  assert.deepEqual(ssmTyped, []);
});

test('attach: a layer ARN of the other architecture, a malformed one, or a missing one is refused', () => {
  const stack = newStack();
  const table = dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks');
  assert.throws(() => new Flightlock(stack, 'A', { table, layerArns: { arm64: X86_ARN } }), /names the x86_64 layer/);
  assert.throws(() => new Flightlock(stack, 'B', { table, layerArns: { x86_64: 'flightlock-x86_64' } }), /not a layer version ARN/);
  assert.throws(
    () => new Flightlock(stack, 'C', { table, layerArns: { x86_64: X86_ARN }, layerVersion: '0.2.0' }),
    /layerVersion selects an SSM parameter/,
  );
  const locks = new Flightlock(stack, 'D', { table, layerArns: { x86_64: X86_ARN } });
  assert.throws(() => locks.attach(pythonFunction(stack, 'Arm', lambda.Architecture.ARM_64)), /no layer ARN for arm64/);
  assert.throws(() => new Flightlock(stack, 'E', { table, layerArns: { amd64: X86_ARN } as any }), /layerArns has 'amd64'/);
  assert.throws(() => releasedLayerArn('arm64', '0.2.0', '2222'), /12-digit/);
});

test('attach: settings by name, typed options rendered as the variables read them', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks') });
  locks.attach(pythonFunction(stack, 'Consumer'), {
    key: 'account-{/detail/accountId}',
    waitForever: true,
    onBusy: OnBusy.ERROR,
    lease: Duration.millis(1500),
    permits: 4,
    settings: { FLIGHTLOCK_TICK: 'off', FLIGHTLOCK_LOG_LEVEL: 'debug' },
  });
  locks.attach(pythonFunction(stack, 'Scheduled'), { wait: Duration.seconds(0), lease: Duration.minutes(2) });
  const t = synth(stack, 'attach-settings');
  assert.deepEqual(functionProps(t, 'Consumer').Environment.Variables, {
    AWS_LAMBDA_EXEC_WRAPPER: WRAPPER,
    FLIGHTLOCK_TABLE: 'my-locks',
    FLIGHTLOCK_KEY: 'account-{/detail/accountId}',
    FLIGHTLOCK_WAIT: 'forever',
    FLIGHTLOCK_ON_BUSY: 'error',
    FLIGHTLOCK_LEASE: '1500ms',
    FLIGHTLOCK_PERMITS: '4',
    FLIGHTLOCK_TICK: 'off',
    FLIGHTLOCK_LOG_LEVEL: 'debug',
  });
  const scheduled = functionProps(t, 'Scheduled').Environment.Variables;
  assert.equal(scheduled.FLIGHTLOCK_WAIT, '0');
  assert.equal(scheduled.FLIGHTLOCK_LEASE, '120s');
});

test('attach: names the extension does not read, and settings given twice, are refused', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks') });
  const fn = pythonFunction(stack, 'Job');
  assert.throws(() => locks.attach(fn, { settings: { FLIGHTLOCK_TIMEOUT: '5s' } }), /does not read/);
  assert.throws(() => locks.attach(fn, { settings: { FLIGHTLOCK_TABLE: 'other' } }), /set by attach/);
  assert.throws(() => locks.attach(fn, { key: 'a', settings: { FLIGHTLOCK_KEY: 'b' } }), /given twice/);
  assert.throws(() => locks.attach(fn, { permits: 0 }), /permits is a whole number from 1 to 100/);
  assert.throws(() => locks.attach(fn, { permits: 101 }), /permits/);
  assert.throws(() => locks.attach(fn, { lease: Duration.millis(50) }), /at least 100 ms/);
  assert.throws(() => locks.attach(fn, { onBusy: 'drop' as any }), /'skip' or 'error'/);
  assert.throws(() => locks.attach(fn, { key: '' }), /key is empty/);
  assert.throws(() => locks.attach(fn, { wait: Duration.seconds(1), waitForever: true }), /wait or waitForever/);
  assert.throws(() => locks.attach(fn, { gate: false, settings: { FLIGHTLOCK_GATE: 'off' } }), /given twice/);
  const typo = pythonFunction(stack, 'Typo');
  typo.addEnvironment('FLIGHTLOCK_WIAT', '10s');
  assert.throws(() => locks.attach(typo), /its environment has FLIGHTLOCK_WIAT/);
  // Nothing was added by the refused attempts: a valid attach still goes through, once.
  locks.attach(fn);
  assert.throws(() => locks.attach(fn), /already attached/);
  const other = new Flightlock(stack, 'Other', { table: dynamodb.Table.fromTableName(stack, 'Locks2', 'other') });
  assert.throws(() => other.attach(fn), /already sets FLIGHTLOCK_TABLE/);
});

test('attach: keyPrefix puts the LeadingKeys condition on the policy and requires a key under it', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', {
    table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks'),
    keyPrefix: 'billing/',
  });
  assert.throws(() => locks.attach(pythonFunction(stack, 'NoKey')), /default key \(the function name\) is not/);
  assert.throws(() => locks.attach(pythonFunction(stack, 'Outside'), { key: 'reports/nightly' }), /does not start with keyPrefix/);
  locks.attach(pythonFunction(stack, 'Inside'), { key: 'billing/nightly' });
  // A key the function's environment already has counts, inside the prefix or not.
  const preset = pythonFunction(stack, 'Preset');
  preset.addEnvironment('FLIGHTLOCK_KEY', 'billing/preset');
  locks.attach(preset);
  const presetOutside = pythonFunction(stack, 'PresetOutside');
  presetOutside.addEnvironment('FLIGHTLOCK_KEY', 'reports/x');
  assert.throws(() => locks.attach(presetOutside), /does not start with keyPrefix/);
  // Gate off, no invocation takes FLIGHTLOCK_KEY: no key is required (the handler's meet IAM).
  locks.attach(pythonFunction(stack, 'Batch'), { gate: false });
  const presetOff = pythonFunction(stack, 'PresetOff');
  presetOff.addEnvironment('FLIGHTLOCK_GATE', ' OFF ');
  locks.attach(presetOff);
  assert.throws(() => locks.attach(pythonFunction(stack, 'GateOn'), { gate: true }), /default key \(the function name\) is not/);
  const t = synth(stack, 'attach-prefix');
  assert.equal(functionProps(t, 'Batch').Environment.Variables.FLIGHTLOCK_GATE, 'off');
  const [statement] = roleStatements(t, 'Inside').filter((s) => JSON.stringify(s.Action).includes('dynamodb:'));
  assert.deepEqual(statement.Condition, { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': ['billing/*'] } });
  for (const bad of ['', 'a*', 'a?', 'job-{tenant}']) {
    assert.throws(
      () => new Flightlock(stack, `Bad${bad.length}${bad.charCodeAt(1)}`, { table: dynamodb.Table.fromTableName(stack, `T${bad.length}${bad.charCodeAt(1)}`, 'x'), keyPrefix: bad }),
      /keyPrefix/,
    );
  }
});

test('attach: OS-only runtimes and container images are refused with the path that works', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks') });
  const rust = new lambda.Function(stack, 'Rust', {
    runtime: lambda.Runtime.PROVIDED_AL2023,
    handler: 'bootstrap',
    code: placeholderCleanupCode(),
  });
  assert.throws(() => locks.attach(rust), /OS-only runtime.*rust\.md/);
  const image = new lambda.DockerImageFunction(stack, 'Image', {
    code: lambda.DockerImageCode.fromEcr(ecr.Repository.fromRepositoryName(stack, 'Repo', 'jobs')),
  });
  assert.throws(() => locks.attach(image), /container image/);
});

test('attach: another exec wrapper, before or after, is refused; execWrapper: false leaves it to the chain', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks') });
  const before = pythonFunction(stack, 'Before');
  before.addEnvironment('AWS_LAMBDA_EXEC_WRAPPER', '/opt/otel-instrument');
  assert.throws(() => locks.attach(before), /already \/opt\/otel-instrument/);

  const chained = pythonFunction(stack, 'Chained');
  chained.addEnvironment('AWS_LAMBDA_EXEC_WRAPPER', '/opt/otel-instrument');
  locks.attach(chained, { execWrapper: false, settings: { FLIGHTLOCK_WRAPPER_CHECK: 'off' } });
  const t = synth(stack, 'attach-chained');
  assert.equal(functionProps(t, 'Chained').Environment.Variables.AWS_LAMBDA_EXEC_WRAPPER, '/opt/otel-instrument');
  assert.equal(functionProps(t, 'Chained').Environment.Variables.FLIGHTLOCK_WRAPPER_CHECK, 'off');

  const after = newStack('After');
  const locks2 = new Flightlock(after, 'Flightlock', { table: dynamodb.Table.fromTableName(after, 'Locks', 'my-locks') });
  const fn = pythonFunction(after, 'Job');
  locks2.attach(fn);
  fn.addEnvironment('AWS_LAMBDA_EXEC_WRAPPER', '/opt/otel-instrument');
  assert.throws(() => Template.fromStack(after), /changed to \/opt\/otel-instrument after attach/);
});

test('attach: in a stack of its own, the layer is read in the function\'s stack (no export to block an upgrade)', () => {
  const stack = newStack('Locks');
  const locks = new Flightlock(stack, 'Flightlock', { createTable: true });
  const app = stack.node.root as any;
  const jobs = new (stack.constructor as any)(app, 'Jobs', { env: { account: '111111111111', region: 'eu-west-1' } });
  locks.attach(pythonFunction(jobs, 'Job', lambda.Architecture.ARM_64));
  const t = synth(jobs, 'attach-other-stack');
  const fn = functionProps(t, 'Job');
  assert.equal(ssmParameterName(t, fn.Layers[0]), `/flightlock/layer/arm64/${VERSION}`);
  // The table's name and ARN do cross (a retained table never changes them); the layer does not.
  const outputs = Template.fromStack(stack).toJSON().Outputs ?? {};
  for (const o of Object.values(outputs) as any[]) {
    assert.ok(!JSON.stringify(o.Value).includes('SsmParameterValue'), JSON.stringify(o));
  }
});

test('grantLockUser: a role of your own gets exactly the lock user statement; a principal without a policy fails', () => {
  const stack = newStack();
  const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks') });
  const role = new iam.Role(stack, 'Worker', { assumedBy: new iam.ServicePrincipal('ecs-tasks.amazonaws.com') });
  locks.grantLockUser(role);
  synth(stack, 'grant-role').hasResourceProperties('AWS::IAM::Policy', {
    PolicyDocument: { Statement: [Match.objectLike({ Action: [...LOCK_USER_ACTIONS], Effect: 'Allow' })] },
  });
  assert.throws(() => locks.grantLockUser(new iam.AccountPrincipal('333333333333')), /could not be added/);
});

test('fromTemplate: the table, the lock-user policy and a pinned layer from the template\'s SSM parameters', () => {
  const stack = newStack();
  const locks = Flightlock.fromTemplate(stack, 'Flightlock', { parameterPrefix: '/team/flightlock' });
  locks.attach(pythonFunction(stack, 'Job', lambda.Architecture.ARM_64), { key: 'nightly' });
  const t = synth(stack, 'attach-from-template');
  const fn = functionProps(t, 'Job');
  assert.equal(ssmParameterName(t, fn.Layers[0]), `/team/flightlock/layer/arm64/${VERSION}`);
  assert.equal(ssmParameterName(t, fn.Environment.Variables.FLIGHTLOCK_TABLE), '/team/flightlock/table/name');
  // The template's managed policy on the role, and no policy of the construct's own.
  const role = Object.values(t.findResources('AWS::IAM::Role'))[0] as any;
  const managed = role.Properties.ManagedPolicyArns.filter((a: any) => 'Ref' in a);
  assert.equal(managed.length, 1);
  assert.equal(ssmParameterName(t, managed[0]), '/team/flightlock/table/lock-user-policy');
  assert.deepEqual(roleStatements(t, 'Job').filter((s) => JSON.stringify(s.Action).includes('dynamodb:')), []);
  // No resource of its own: everything is the template's.
  assert.deepEqual(Object.keys(t.findResources('AWS::DynamoDB::Table')), []);
  assert.throws(() => Flightlock.fromTemplate(stack, 'Bad', { parameterPrefix: 'flightlock' }), /not an SSM path/);
  assert.throws(
    () => new Flightlock(stack, 'Mixed', { templateParameterPrefix: '/flightlock', layerParameterPrefix: '/other/layer' }),
    /writes its layers under \/flightlock\/layer/,
  );
});

test('FlightlockLayer: the statics other jsii languages use are the TypeScript shorthands', () => {
  assert.equal(FlightlockLayer.VERSION, VERSION);
  assert.equal(FlightlockLayer.WRAPPER, WRAPPER);
  assert.equal(FlightlockLayer.layerName('arm64', '1.2.3'), 'flightlock-arm64-1_2_3');
  assert.equal(FlightlockLayer.parameterName('x86_64'), `/flightlock/layer/x86_64/latest`);
  assert.equal(FlightlockLayer.releasedArn('arm64', '0.2.0', '222222222222', 'eu-west-1', 'aws'), releasedLayerArn('arm64', '0.2.0', '222222222222', 'eu-west-1', 'aws'));
  assert.throws(() => FlightlockLayer.layerName('amd64', '1.2.3'), /architecture 'amd64'/);
});

test('Flightlock needs one table: given or created, not both, not neither', () => {
  const stack = newStack();
  const table = dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks');
  assert.throws(() => new Flightlock(stack, 'A', {}), /give table/);
  assert.throws(() => new Flightlock(stack, 'B', { table, createTable: true }), /not table and createTable/);
  assert.throws(() => new Flightlock(stack, 'C', { table, templateParameterPrefix: '/flightlock' }), /not table and templateParameterPrefix/);
});

test('attach: a function published as versions gets a new version when the pinned layer version changes', () => {
  const versionId = (layerVersion: string) => {
    const stack = newStack();
    const locks = new Flightlock(stack, 'Flightlock', { table: dynamodb.Table.fromTableName(stack, 'Locks', 'my-locks'), layerVersion });
    const fn = pythonFunction(stack, 'Job', lambda.Architecture.ARM_64);
    locks.attach(fn);
    fn.currentVersion;
    return only(Template.fromStack(stack), 'AWS::Lambda::Version')[0];
  };
  assert.equal(versionId('0.1.0'), versionId('0.1.0'));
  assert.notEqual(versionId('0.1.0'), versionId('0.2.0'));
});
