// bin/jobs.ts
import { App } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { JobsStack } from '../lib/jobs-stack';

const app = new App();
new JobsStack(app, 'Jobs', {
  cleanupCode: lambda.Code.fromAsset('flightlock-cleanup-arm64.zip'),
});
