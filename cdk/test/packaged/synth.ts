// The npm package as a user gets it: scripts/check-cdk --pack installs the tarball jsii-pacmak
// built into a fresh project under target/, copies this program's compiled form beside it and
// runs it there, so `flightlock-cdk` below is the installed tarball, not cdk/src. It synthesizes
// one stack and checks what the construct promises: the lock table's schema, the function's
// layer, wrapper and variables, and the lock user's actions on the table. test/packaged/synth.py
// builds the same stack through the Python wheel and checks the same things; both write the
// template (argv[3]) so that scripts/check-cdk can compare them.
//
// Usage: node synth.js <expected version> <template out>

import { strict as assert } from 'node:assert';
import * as fs from 'node:fs';

import { App, Duration, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Flightlock, FlightlockLayer, OnBusy } from 'flightlock-cdk';

const [version, out] = process.argv.slice(2);
if (version === undefined || out === undefined) throw new Error('usage: node synth.js <expected version> <template out>');

assert.equal(FlightlockLayer.VERSION, version, 'the package\'s VERSION is the release it was built for');

// Analytics off: its metadata names the language, and the two templates are compared.
const app = new App({ analyticsReporting: false });
const stack = new Stack(app, 'Packaged', { env: { account: '111111111111', region: 'eu-west-1' } });
const job = new lambda.Function(stack, 'Job', {
  runtime: lambda.Runtime.PYTHON_3_12,
  architecture: lambda.Architecture.ARM_64,
  handler: 'index.handler',
  code: lambda.Code.fromInline('def handler(event, context):\n    return {}\n'),
});
const locks = new Flightlock(stack, 'Flightlock', { createTable: true });
locks.attach(job, { key: 'nightly', wait: Duration.seconds(30), onBusy: OnBusy.ERROR });

// The construct's own refusals run in the package too.
const other = new lambda.Function(stack, 'Other', {
  runtime: lambda.Runtime.PYTHON_3_12,
  handler: 'index.handler',
  code: lambda.Code.fromInline('def handler(event, context):\n    return {}\n'),
});
assert.throws(() => locks.attach(other, { settings: { FLIGHTLOCK_NOPE: '1' } }), /FLIGHTLOCK_NOPE, which the extension does not read/);

const template = Template.fromStack(stack).toJSON();
fs.writeFileSync(out, JSON.stringify(template, null, 1) + '\n');
const resources = Object.entries(template.Resources as Record<string, { Type: string; Properties: any }>);
const ofType = (type: string) => resources.filter(([, r]) => r.Type === type);

// The table, as template.yaml declares it.
const tables = ofType('AWS::DynamoDB::Table');
assert.equal(tables.length, 1, 'one lock table');
const [tableId, table] = tables[0];
assert.deepEqual(table.Properties.KeySchema, [
  { AttributeName: 'pk', KeyType: 'HASH' },
  { AttributeName: 'sk', KeyType: 'RANGE' },
]);
assert.deepEqual(table.Properties.TimeToLiveSpecification, { AttributeName: 'expiresAt', Enabled: true });
assert.equal(table.Properties.BillingMode, 'PAY_PER_REQUEST');
assert.equal(table.Properties.DeletionProtectionEnabled, true);

// The function: the arm64 layer of this release from SSM, the wrapper, the table, the options.
const jobs = ofType('AWS::Lambda::Function').filter(([id]) => id.startsWith('Job'));
assert.equal(jobs.length, 1, 'the attached function');
const fn = jobs[0][1].Properties;
assert.equal(fn.Layers.length, 1);
const parameter = template.Parameters[fn.Layers[0].Ref];
assert.equal(parameter.Type, 'AWS::SSM::Parameter::Value<String>');
assert.equal(parameter.Default, `/flightlock/layer/arm64/${version}`);
assert.deepEqual(fn.Environment.Variables, {
  AWS_LAMBDA_EXEC_WRAPPER: '/opt/flightlock-wrapper',
  FLIGHTLOCK_TABLE: { Ref: tableId },
  FLIGHTLOCK_KEY: 'nightly',
  FLIGHTLOCK_WAIT: '30s',
  FLIGHTLOCK_ON_BUSY: 'error',
});

// The lock user's actions on that table, on the function's role.
const role = fn.Role['Fn::GetAtt'][0];
const statements = ofType('AWS::IAM::Policy')
  .filter(([, p]) => p.Properties.Roles.some((r: { Ref?: string }) => r.Ref === role))
  .flatMap(([, p]) => p.Properties.PolicyDocument.Statement);
assert.deepEqual(
  statements.filter((s) => JSON.stringify(s.Action).includes('dynamodb:')),
  [
    {
      Effect: 'Allow',
      Action: ['dynamodb:Query', 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:DeleteItem', 'dynamodb:DescribeTable', 'dynamodb:DescribeTimeToLive'],
      Resource: { 'Fn::GetAtt': [tableId, 'Arn'] },
    },
  ],
);
console.log(`the npm package flightlock-cdk ${version}: its stack holds the table, the layer wiring and the lock user's policy`);
