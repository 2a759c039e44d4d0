// Shared by the tests: stacks, functions, the cleanup code's placeholder asset, and the
// synthesized templates that scripts/check-cdk hands to cfn-lint.

import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { App, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as lambda from 'aws-cdk-lib/aws-lambda';

/**
 * The repository's root: this file runs from cdk/build/test/, or from a copy of cdk/ elsewhere
 * that scripts/check-cdk points here with FLIGHTLOCK_REPO (the synth against the peer floor).
 */
export const REPO = process.env.FLIGHTLOCK_REPO ?? path.resolve(__dirname, '..', '..', '..');

/** Where the synthesized templates go for cfn-lint (scripts/check-cdk). */
export const TEMPLATES_OUT = process.env.FLIGHTLOCK_CDK_TEMPLATES ?? path.join(REPO, 'cdk', 'test-out', 'templates');

export function read(relative: string): string {
  return fs.readFileSync(path.join(REPO, relative), 'utf8');
}

export function newStack(name = 'Test'): Stack {
  return new Stack(new App(), name, { env: { account: '111111111111', region: 'eu-west-1' } });
}

/** A Python function, as a user's stack has it: the code is an inline handler. */
export function pythonFunction(stack: Stack, id: string, architecture = lambda.Architecture.X86_64): lambda.Function {
  return new lambda.Function(stack, id, {
    runtime: lambda.Runtime.PYTHON_3_12,
    handler: 'index.handler',
    code: lambda.Code.fromInline('def handler(event, context):\n    return {}\n'),
    architecture,
  });
}

/**
 * The cleanup function's code for synthesis: a directory with a `bootstrap` that only says what
 * it is. The real one is the Rust binary (`cargo lambda build -p flightlock-cleanup`, or the
 * release's flightlock-cleanup-<arch>.zip); synthesis only hashes and stages the asset.
 */
export function placeholderCleanupCode(): lambda.Code {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'flightlock-cleanup-asset-'));
  fs.writeFileSync(
    path.join(dir, 'bootstrap'),
    '#!/bin/sh\necho "placeholder asset of cdk/test: build flightlock-cleanup for a deploy" >&2\nexit 1\n',
    { mode: 0o755 },
  );
  return lambda.Code.fromAsset(dir);
}

/** The stack's template, also written to TEMPLATES_OUT/<name>.json for cfn-lint. */
export function synth(stack: Stack, name: string): Template {
  const template = Template.fromStack(stack);
  fs.mkdirSync(TEMPLATES_OUT, { recursive: true });
  fs.writeFileSync(path.join(TEMPLATES_OUT, `${name}.json`), JSON.stringify(template.toJSON(), null, 1));
  return template;
}

/** The one resource of `type` in `template`: [logical id, resource]. */
export function only(template: Template, type: string): [string, any] {
  const found = Object.entries(template.findResources(type));
  if (found.length !== 1) throw new Error(`expected one ${type}, found ${found.length}`);
  return found[0];
}

/** The Markdown section under `heading`, up to the next `## ` heading. */
export function section(text: string, heading: string): string {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trim() === heading);
  if (start < 0) throw new Error(`no section ${heading}`);
  const rest = lines.slice(start + 1);
  const end = rest.findIndex((l) => l.startsWith('## '));
  return (end < 0 ? rest : rest.slice(0, end)).join('\n');
}
