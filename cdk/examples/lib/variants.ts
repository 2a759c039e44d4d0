// The other ways the guide (docs/src/getting-started/cdk.md) shows: each TypeScript fragment
// there is cut from this file, and cdk/test/example.test.ts synthesizes every stack here.
import { Duration, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';
import { Flightlock, OnBusy, releasedLayerArn } from 'flightlock-cdk';

function job(scope: Construct, architecture: lambda.Architecture): lambda.Function {
  return new lambda.Function(scope, 'Job', {
    runtime: lambda.Runtime.NODEJS_22_X,
    architecture,
    handler: 'index.handler',
    code: lambda.Code.fromInline('exports.handler = async () => ({});'),
  });
}

/** A table you already have, and the released layer by its ARN formula. */
export class ReleasedLayerStack extends Stack {
  constructor(scope: Construct, id: string) {
    super(scope, id);
    const fn = job(this, lambda.Architecture.X86_64);
    const locks = new Flightlock(this, 'Flightlock', {
      table: dynamodb.Table.fromTableName(this, 'Locks', 'my-locks'),
      layerArns: {
        x86_64: releasedLayerArn('x86_64', '0.1.0', '123456789012'), // the publisher's account
        arm64: releasedLayerArn('arm64', '0.1.0', '123456789012'),
      },
    });
    locks.attach(fn);
  }
}

/** What template.yaml deployed in the account: its table, its lock-user policy, its layer. */
export class FromTemplateStack extends Stack {
  constructor(scope: Construct, id: string) {
    super(scope, id);
    const fn = job(this, lambda.Architecture.ARM_64);
    // Reads /flightlock/table/name, /flightlock/table/lock-user-policy and
    // /flightlock/layer/arm64/0.1.0 at deploy time (the template's ParameterPrefix: /flightlock).
    const locks = Flightlock.fromTemplate(this, 'Flightlock', { layerVersion: '0.1.0' });
    locks.attach(fn, { key: 'nightly' });
  }
}

/** The layer of your own account, from the release zip; a pinned SSM version; from source. */
export class OwnLayerStack extends Stack {
  constructor(scope: Construct, id: string) {
    super(scope, id);
    const fn = job(this, lambda.Architecture.ARM_64);
    const layer = new lambda.LayerVersion(this, 'FlightlockLayer', {
      code: lambda.Code.fromAsset('flightlock-layer-arm64.zip'),
      compatibleArchitectures: [lambda.Architecture.ARM_64],
      removalPolicy: RemovalPolicy.RETAIN, // a function not yet updated keeps its version
    });
    const locks = new Flightlock(this, 'Flightlock', {
      createTable: true,
      layerArns: { arm64: layer.layerVersionArn },
      cleanup: { code: lambda.Code.fromAsset('target/lambda/arm64/flightlock-cleanup') },
    });
    locks.attach(fn);
  }
}

/** A version pinned through SSM, keys under a prefix, an SQS consumer gated as a whole (batch size 1). */
export class PinnedStack extends Stack {
  constructor(scope: Construct, id: string) {
    super(scope, id);
    const consumer = job(this, lambda.Architecture.ARM_64);
    const locks = new Flightlock(this, 'Flightlock', {
      table: dynamodb.Table.fromTableName(this, 'Locks', 'my-locks'),
      layerVersion: '0.1.0', // reads /flightlock/layer/<arch>/0.1.0
      keyPrefix: 'orders/',
    });
    locks.attach(consumer, {
      key: 'orders/import',
      wait: Duration.seconds(20), // below the queue's visibility timeout
      onBusy: OnBusy.ERROR,
      settings: { FLIGHTLOCK_LOG_LEVEL: 'debug' },
    });
  }
}

/** An SQS batch consumer: no invocation gated, a lock per record through the lock API. */
export class BatchStack extends Stack {
  constructor(scope: Construct, id: string) {
    super(scope, id);
    const consumer = job(this, lambda.Architecture.ARM_64);
    const locks = new Flightlock(this, 'Flightlock', {
      table: dynamodb.Table.fromTableName(this, 'Locks', 'my-locks'),
      keyPrefix: 'orders/', // the handler locks 'orders/<id>' per record
    });
    locks.attach(consumer, {
      gate: false,
      wait: Duration.seconds(0), // a busy record goes to batchItemFailures at once
    });
  }
}
