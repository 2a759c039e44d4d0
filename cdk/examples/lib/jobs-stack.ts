// lib/jobs-stack.ts
import { Duration, Stack, StackProps } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';
import { Flightlock } from 'flightlock-cdk';

export interface JobsStackProps extends StackProps {
  /** The cleanup function: the release's flightlock-cleanup-arm64.zip, or a build from source. */
  readonly cleanupCode: lambda.Code;
}

export class JobsStack extends Stack {
  constructor(scope: Construct, id: string, props: JobsStackProps) {
    super(scope, id, props);

    // The function you already have: a scheduled job whose runs must never overlap.
    const report = new lambda.Function(this, 'NightlyReport', {
      runtime: lambda.Runtime.PYTHON_3_12,
      architecture: lambda.Architecture.ARM_64,
      handler: 'index.handler',
      code: lambda.Code.fromInline('def handler(event, context):\n    print("report")\n'),
      timeout: Duration.minutes(5),
    });

    // A lock table and the cleanup function in this stack; the layer's ARN is read at each
    // deploy from the SSM parameter /flightlock/layer/arm64/<version> of this account and region
    // (this construct's release: VERSION).
    const locks = new Flightlock(this, 'Flightlock', {
      createTable: true,
      cleanup: { code: props.cleanupCode },
    });
    locks.attach(report, { key: 'nightly-report' });
  }
}
