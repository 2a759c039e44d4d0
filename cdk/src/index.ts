// flightlock for the AWS CDK: attach the single-flight layer to an existing `lambda.Function`, and
// deploy the lock table and the cleanup function when asked, or use what template.yaml deployed.
//
// One file with no dependency besides aws-cdk-lib and constructs, so it can be copied into a CDK
// app as it is. Its public API is jsii's subset of TypeScript (scripts/check-cdk builds it with
// jsii), so the same construct can be packaged for Python and the other jsii languages: props
// are interfaces of plain types, choices are enums, nothing public is a string-literal union,
// and what other languages need is a class member (the free functions and constants below are
// TypeScript shorthands of the `FlightlockLayer` statics, which jsii does not export). The guide: docs/src/getting-started/cdk.md. What each name below must agree with,
// and the test that checks it (cdk/test/sources.test.ts):
//   - the function variables: docs/src/reference/configuration.md, itself checked against the code;
//   - the IAM actions: docs/src/reference/iam.md, itself checked against template.yaml and the code;
//   - the layer names and SSM parameter names: release/publish.py (layer_name, ssm_name);
//   - the table: template.yaml's LockTable;
//   - the switch words: lock/src/options.rs.
//
// SPDX-License-Identifier: Apache-2.0

import { Aws, Duration, RemovalPolicy, Stack, Token } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as ssm from 'aws-cdk-lib/aws-ssm';
import { Construct } from 'constructs';

/**
 * The release this construct belongs to (cdk/package.json's version, the workspace version of
 * Cargo.toml; cdk/test checks both): the layer version `Flightlock` attaches unless told otherwise.
 */
export const VERSION = '0.1.0';

/** The exec wrapper the layer ships; `AWS_LAMBDA_EXEC_WRAPPER` names it. */
export const WRAPPER = '/opt/flightlock-wrapper';

/** The SSM prefix template.yaml writes under by default (its parameter ParameterPrefix). */
export const TEMPLATE_PARAMETER_PREFIX = '/flightlock';

/**
 * Where the layer's ARNs are published in an account: `<prefix>/<arch>/<version>` and
 * `<prefix>/<arch>/latest`, String parameters holding a layer version ARN (release/publish.py
 * writes them for released layers; a self-deployed template writes the same names).
 */
export const LAYER_PARAMETER_PREFIX = '/flightlock/layer';

/** The architectures the layer is built for, as Lambda names them. */
export const ARCHITECTURES: readonly string[] = ['x86_64', 'arm64'];

/** What a lock user (the extension, the in-process layer, `flightlock run`) does on the table. */
export const LOCK_USER_ACTIONS: readonly string[] = [
  'dynamodb:Query',
  'dynamodb:PutItem',
  'dynamodb:UpdateItem',
  'dynamodb:DeleteItem',
  // The table's description, checked at init (key schema, TTL): a wrong table is reported with
  // its fix. These requests name no key, so a key-prefix condition lets them through.
  'dynamodb:DescribeTable',
  'dynamodb:DescribeTimeToLive',
];

/** What the cleanup function does on the table. */
export const CLEANUP_ACTIONS: readonly string[] = ['dynamodb:Scan', 'dynamodb:DeleteItem', 'dynamodb:UpdateItem'];

/**
 * Every variable the extension reads. It fails init on any other `FLIGHTLOCK_*` name (a typo
 * never falls back to a default), so `attach` refuses other names at synthesis.
 */
export const FUNCTION_VARIABLES: readonly string[] = [
  'FLIGHTLOCK_TABLE',
  'FLIGHTLOCK_KEY',
  'FLIGHTLOCK_WAIT',
  'FLIGHTLOCK_ON_BUSY',
  'FLIGHTLOCK_LEASE',
  'FLIGHTLOCK_HEARTBEAT',
  'FLIGHTLOCK_CLOCK_SKEW',
  'FLIGHTLOCK_DEADLINE_MARGIN',
  'FLIGHTLOCK_PROXY_PORT',
  'FLIGHTLOCK_UPSTREAM',
  'FLIGHTLOCK_LOG_LEVEL',
  'FLIGHTLOCK_METRICS',
  'FLIGHTLOCK_WRAPPER_CHECK',
  'FLIGHTLOCK_TICK',
  'FLIGHTLOCK_STALE_AFTER',
  'FLIGHTLOCK_COALESCE',
  'FLIGHTLOCK_PERMITS',
  'FLIGHTLOCK_GATE',
];

/** Every variable the cleanup function reads (it too fails init on any other `FLIGHTLOCK_*`). */
export const CLEANUP_VARIABLES: readonly string[] = [
  'FLIGHTLOCK_TABLE',
  'FLIGHTLOCK_SWEEP_GRACE',
  'FLIGHTLOCK_SWEEP_CONCURRENCY',
  'FLIGHTLOCK_SWEEP_SEGMENTS',
  'FLIGHTLOCK_SWEEP_MARGIN',
  'FLIGHTLOCK_METRICS',
];

/** The words a switch variable (FLIGHTLOCK_GATE) reads as off, in any case (lock/src/options.rs). */
export const SWITCH_OFF_WORDS: readonly string[] = ['off', 'false', '0', 'no'];

/** The lock table's schema (docs/src/reference/configuration.md; template.yaml's LockTable). */
export const TABLE_SCHEMA = { partitionKey: 'pk', sortKey: 'sk', ttlAttribute: 'expiresAt' } as const;

/**
 * The name of a released layer: `flightlock-<arch>-<version>`, with `.` and `+` as `_` (a layer
 * name allows letters, digits, `-` and `_`), as release/publish.py names it.
 */
export function layerName(arch: string, version: string): string {
  checkArchitecture(arch);
  return `flightlock-${arch}-${version.replace(/[.+]/g, '_')}`;
}

/** The SSM parameter that holds the layer ARN of `arch` at `version` (or `latest`). */
export function layerParameterName(arch: string, version = 'latest', prefix = LAYER_PARAMETER_PREFIX): string {
  checkArchitecture(arch);
  return `${prefix}/${arch}/${version}`;
}

/**
 * The ARN of a released layer, by the formula of docs/src/reference/layers.md:
 * `arn:aws:lambda:<region>:<publisher account>:layer:flightlock-<arch>-<version>:1`. Region and
 * partition default to the deploying stack's.
 */
export function releasedLayerArn(
  arch: string,
  version: string,
  publisherAccount: string,
  region: string = Aws.REGION,
  partition: string = Aws.PARTITION,
): string {
  checkArchitecture(arch);
  if (!/^\d{12}$/.test(publisherAccount)) {
    throw new Error(`flightlock: publisher account '${publisherAccount}' is not a 12-digit account id`);
  }
  return `arn:${partition}:lambda:${region}:${publisherAccount}:layer:${layerName(arch, version)}:1`;
}

/**
 * The layer's names and ARNs as class members, for every jsii language (jsii exports no free
 * functions or constants; in TypeScript the shorthands above are the same functions).
 */
export class FlightlockLayer {
  /** The release this construct belongs to: the layer version attached by default. */
  public static readonly VERSION = VERSION;
  /** The exec wrapper the layer ships. */
  public static readonly WRAPPER = WRAPPER;
  /** Where layer ARNs are published: `<prefix>/<arch>/<version>` and `<prefix>/<arch>/latest`. */
  public static readonly PARAMETER_PREFIX = LAYER_PARAMETER_PREFIX;
  /** The architectures the layer is built for, as Lambda names them. */
  public static readonly ARCHITECTURES: string[] = [...ARCHITECTURES];

  /** The name of a released layer (`layerName`). */
  public static layerName(arch: string, version: string): string {
    return layerName(arch, version);
  }

  /** The SSM parameter that holds the layer ARN of `arch` at `version` (`layerParameterName`). */
  public static parameterName(arch: string, version?: string, prefix?: string): string {
    return layerParameterName(arch, version, prefix);
  }

  /** The ARN of a released layer (`releasedLayerArn`). */
  public static releasedArn(arch: string, version: string, publisherAccount: string, region?: string, partition?: string): string {
    return releasedLayerArn(arch, version, publisherAccount, region, partition);
  }

  private constructor() {}
}

// --- the lock table ------------------------------------------------------------------------------

export interface FlightlockTableProps {
  /** The table's name. @default generated by CloudFormation */
  readonly tableName?: string;
  /**
   * What happens to the table when it is removed from the stack or replaced: `RETAIN` keeps it and
   * turns on DynamoDB deletion protection (deleting the table resets every key's ticket counter,
   * so fencing tokens would start again from 1); `DESTROY` is for throw-away stacks.
   * @default RemovalPolicy.RETAIN
   */
  readonly removalPolicy?: RemovalPolicy;
  /**
   * Point-in-time recovery. Queue rows live seconds to minutes; turn it on to keep the ticket
   * counters restorable.
   * @default false
   */
  readonly pointInTimeRecovery?: boolean;
}

/** The lock table as template.yaml declares it: `pk`/`sk` (S), TTL on `expiresAt`, on-demand. */
export class FlightlockTable extends Construct {
  public readonly table: dynamodb.Table;

  constructor(scope: Construct, id: string, props: FlightlockTableProps = {}) {
    super(scope, id);
    const removalPolicy = props.removalPolicy ?? RemovalPolicy.RETAIN;
    if (removalPolicy !== RemovalPolicy.RETAIN && removalPolicy !== RemovalPolicy.DESTROY) {
      throw new Error(`flightlock: the lock table's removalPolicy is RETAIN or DESTROY, not ${removalPolicy}`);
    }
    const retain = removalPolicy === RemovalPolicy.RETAIN;
    this.table = new dynamodb.Table(this, 'Table', {
      tableName: props.tableName,
      partitionKey: { name: TABLE_SCHEMA.partitionKey, type: dynamodb.AttributeType.STRING },
      sortKey: { name: TABLE_SCHEMA.sortKey, type: dynamodb.AttributeType.STRING },
      timeToLiveAttribute: TABLE_SCHEMA.ttlAttribute,
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: props.pointInTimeRecovery ?? false },
      deletionProtection: retain,
      removalPolicy,
    });
    if (!(props.pointInTimeRecovery ?? false)) {
      acknowledge(
        this.table,
        'AwsSolutions-DDB3',
        'point-in-time recovery is the pointInTimeRecovery prop, off by default as in template.yaml: queue rows live seconds to minutes and a restore cannot bring a lease back; RETAIN and deletion protection (the default) keep the ticket counters',
      );
    }
  }
}

// --- the cleanup function ------------------------------------------------------------------------

export interface FlightlockCleanupOptions {
  /**
   * The cleanup function's code: a `bootstrap` for `provided.al2023` built for `architecture`.
   * From a release: `lambda.Code.fromAsset('flightlock-cleanup-arm64.zip')`; from source:
   * `cargo lambda build --release --arm64 -p flightlock-cleanup` and
   * `lambda.Code.fromAsset('target/lambda/flightlock-cleanup')` (docs/src/getting-started/cdk.md).
   */
  readonly code: lambda.Code;
  /** The architecture `code` was built for. @default lambda.Architecture.ARM_64 */
  readonly architecture?: lambda.Architecture;
  /** How often it sweeps. @default events.Schedule.rate(Duration.minutes(15)) */
  readonly schedule?: events.Schedule;
  /** Its timeout; the sweep stops starting new work `sweepMargin` before it. @default 300 s */
  readonly timeout?: Duration;
  /** @default 256 */
  readonly memorySize?: number;
  /** FLIGHTLOCK_SWEEP_GRACE, whole seconds, at least 1 s. @default the function's own (10 min) */
  readonly sweepGrace?: Duration;
  /** FLIGHTLOCK_SWEEP_CONCURRENCY, 1 to 256. @default the function's own (16) */
  readonly sweepConcurrency?: number;
  /** FLIGHTLOCK_SWEEP_SEGMENTS, 1 to 256. @default the function's own (1) */
  readonly sweepSegments?: number;
  /** FLIGHTLOCK_SWEEP_MARGIN. @default the function's own (5 s) */
  readonly sweepMargin?: Duration;
  /** FLIGHTLOCK_METRICS: the EMF line. @default the function's own (on) */
  readonly metrics?: boolean;
}

export interface FlightlockCleanupProps extends FlightlockCleanupOptions {
  /** The lock table it sweeps. */
  readonly table: dynamodb.ITable;
}

/**
 * The cleanup function (functions/cleanup) on a schedule: it removes queue rows whose lease
 * ended more than the grace ago, never counters and never live rows.
 */
export class FlightlockCleanup extends Construct {
  public readonly function: lambda.Function;
  public readonly rule: events.Rule;

  constructor(scope: Construct, id: string, props: FlightlockCleanupProps) {
    super(scope, id);
    const environment: Record<string, string> = { FLIGHTLOCK_TABLE: props.table.tableName };
    if (props.sweepGrace !== undefined) {
      const ms = props.sweepGrace.toMilliseconds();
      if (ms < 1000 || ms % 1000 !== 0) throw new Error(`flightlock: sweepGrace is whole seconds, at least 1, not ${props.sweepGrace}`);
      environment.FLIGHTLOCK_SWEEP_GRACE = `${ms / 1000}s`;
    }
    if (props.sweepConcurrency !== undefined) {
      environment.FLIGHTLOCK_SWEEP_CONCURRENCY = String(wholeNumber('sweepConcurrency', props.sweepConcurrency, 1, 256));
    }
    if (props.sweepSegments !== undefined) {
      environment.FLIGHTLOCK_SWEEP_SEGMENTS = String(wholeNumber('sweepSegments', props.sweepSegments, 1, 256));
    }
    if (props.sweepMargin !== undefined) environment.FLIGHTLOCK_SWEEP_MARGIN = duration(props.sweepMargin);
    if (props.metrics !== undefined) environment.FLIGHTLOCK_METRICS = props.metrics ? 'on' : 'off';

    this.function = new lambda.Function(this, 'Function', {
      description: 'flightlock cleanup, sweeps dead lock rows (never counters, never live rows)',
      code: props.code,
      handler: 'bootstrap',
      runtime: lambda.Runtime.PROVIDED_AL2023,
      architecture: props.architecture ?? lambda.Architecture.ARM_64,
      timeout: props.timeout ?? Duration.seconds(300),
      memorySize: props.memorySize ?? 256,
      loggingFormat: lambda.LoggingFormat.JSON,
      environment,
    });
    acknowledge(
      this.function.role!,
      'AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]',
      'AWSLambdaBasicExecutionRole grants only the function\'s own CloudWatch Logs writes (CreateLogGroup, CreateLogStream, PutLogEvents), as SAM gives the template\'s cleanup function',
    );
    // A Scan names no partition key, so no key-prefix condition can narrow it.
    this.function.addToRolePolicy(
      new iam.PolicyStatement({
        sid: 'SweepLockTable',
        actions: [...CLEANUP_ACTIONS],
        resources: [props.table.tableArn],
      }),
    );
    this.rule = new events.Rule(this, 'Schedule', {
      description: 'flightlock sweep of dead lock rows',
      schedule: props.schedule ?? events.Schedule.rate(Duration.minutes(15)),
      targets: [new targets.LambdaFunction(this.function)],
    });
  }
}

// --- attaching the layer -------------------------------------------------------------------------

export interface FlightlockProps {
  /**
   * An existing lock table (`dynamodb.Table.fromTableName(this, 'Locks', 'my-locks')`), with the
   * schema of `TABLE_SCHEMA`. Give this, `createTable` or `templateParameterPrefix`.
   */
  readonly table?: dynamodb.ITable;
  /** Deploy a lock table (`true`, or its properties). Give this, `table` or `templateParameterPrefix`. */
  readonly createTable?: boolean | FlightlockTableProps;
  /**
   * Use what template.yaml deployed with this `ParameterPrefix` (its default is
   * `TEMPLATE_PARAMETER_PREFIX`, '/flightlock'), read at deploy time from its SSM parameters: the
   * table `<prefix>/table/name`, the lock-user managed policy `<prefix>/table/lock-user-policy`
   * (attached to each function's role instead of a policy of this construct's own, so the
   * template's `LockKeyPrefix` applies), and the layer `<prefix>/layer/<arch>/<layerVersion>`.
   * `Flightlock.fromTemplate` is the shorthand. Give this, `table` or `createTable`.
   */
  readonly templateParameterPrefix?: string;
  /** Deploy the cleanup function on the table, with this code and these settings. */
  readonly cleanup?: FlightlockCleanupOptions;
  /**
   * The layer's ARNs, by architecture (`x86_64`, `arm64`): a released layer
   * (`releasedLayerArn`) or a layer of your own. Without them, each ARN is read at deploy time
   * from the SSM parameter `<layerParameterPrefix>/<arch>/<layerVersion>` in the function's
   * account and region.
   */
  readonly layerArns?: { [architecture: string]: string };
  /**
   * Which SSM parameter to read: a version (`0.2.0`), whose parameter never changes once
   * written, or `latest`, which follows every deploy of the layer (and which CloudFormation may
   * not notice as changed on an otherwise unchanged stack).
   * @default VERSION, this construct's own release
   */
  readonly layerVersion?: string;
  /** @default LAYER_PARAMETER_PREFIX ('/flightlock/layer'), or `<templateParameterPrefix>/layer` */
  readonly layerParameterPrefix?: string;
  /**
   * Only keys starting with this prefix are allowed (an IAM condition on `dynamodb:LeadingKeys`);
   * every attached function must then set `key` under it. No `*`, `?` or braces.
   * @default any key
   */
  readonly keyPrefix?: string;
}

/** What an attached function does when the key is held past its wait (FLIGHTLOCK_ON_BUSY). */
export enum OnBusy {
  /** Answer the invocation with a small success body saying it was skipped. */
  SKIP = 'skip',
  /** Answer with an invocation error, so Lambda's retries (or a DLQ) apply. */
  ERROR = 'error',
}

/** Options of `Flightlock.fromTemplate`. */
export interface FlightlockFromTemplateProps {
  /** The template's `ParameterPrefix`. @default TEMPLATE_PARAMETER_PREFIX ('/flightlock') */
  readonly parameterPrefix?: string;
  /** The layer version to attach (a deployed or published version, or `latest`). @default VERSION */
  readonly layerVersion?: string;
  /** As `FlightlockProps.keyPrefix`: checked at synthesis against each attached key. @default any key */
  readonly keyPrefix?: string;
}

export interface AttachOptions {
  /** FLIGHTLOCK_KEY: the lock key or key template. @default the function name */
  readonly key?: string;
  /** FLIGHTLOCK_WAIT: how long to wait for the key. @default 0 (skip at once) */
  readonly wait?: Duration;
  /** FLIGHTLOCK_WAIT=forever: wait as long as the invocation's deadline allows. Not with `wait`. @default false */
  readonly waitForever?: boolean;
  /** FLIGHTLOCK_ON_BUSY. @default OnBusy.SKIP */
  readonly onBusy?: OnBusy;
  /** FLIGHTLOCK_LEASE, at least 100 ms. @default 20 s */
  readonly lease?: Duration;
  /** FLIGHTLOCK_PERMITS, 1 to 100. @default 1 */
  readonly permits?: number;
  /**
   * FLIGHTLOCK_GATE. `false` for a batch consumer: no invocation is gated, and the handler locks
   * each record's key itself through the layer's lock API (docs/src/guide/lock-api.md); `key` and
   * `onBusy` are then unused, and `wait`, `permits` and `lease` are the lock API's defaults. With
   * `keyPrefix`, the handler's keys must start with the prefix (IAM denies the others).
   * @default true
   */
  readonly gate?: boolean;
  /**
   * Any other variable of docs/src/reference/configuration.md, by name
   * (`{ FLIGHTLOCK_TICK: 'off' }`). Names the extension does not read are refused.
   */
  readonly settings?: Record<string, string>;
  /**
   * Set `AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper`. `false` only when another exec wrapper
   * runs flightlock's itself (then also set `FLIGHTLOCK_WRAPPER_CHECK: 'off'` in `settings`).
   * @default true
   */
  readonly execWrapper?: boolean;
}

/**
 * flightlock for a set of functions: one lock table (given or deployed), optionally the cleanup
 * function, and `attach(fn)` for each function that must be single-flight.
 */
export class Flightlock extends Construct {
  /** The lock table. */
  public readonly table: dynamodb.ITable;
  /** The deployed table, when `createTable` was given. */
  public readonly lockTable?: FlightlockTable;
  /** The cleanup function, when `cleanup` was given. */
  public readonly cleanup?: FlightlockCleanup;
  /** The template's lock-user managed policy, when `templateParameterPrefix` was given. */
  public readonly lockUserPolicy?: iam.IManagedPolicy;

  /**
   * flightlock as template.yaml deployed it (`templateParameterPrefix`): its table, its
   * lock-user policy and its layer at a pinned version, all read from its SSM parameters.
   */
  public static fromTemplate(scope: Construct, id: string, props: FlightlockFromTemplateProps = {}): Flightlock {
    return new Flightlock(scope, id, {
      templateParameterPrefix: props.parameterPrefix ?? TEMPLATE_PARAMETER_PREFIX,
      layerVersion: props.layerVersion,
      keyPrefix: props.keyPrefix,
    });
  }

  private readonly props: FlightlockProps;
  private readonly attached = new Set<lambda.Function>();

  constructor(scope: Construct, id: string, props: FlightlockProps) {
    super(scope, id);
    this.props = props;
    const sources = [props.table && 'table', props.createTable && 'createTable', props.templateParameterPrefix !== undefined && 'templateParameterPrefix'].filter(Boolean);
    if (sources.length > 1) {
      throw new Error(`flightlock: give one of table (an existing lock table), createTable or templateParameterPrefix, not ${sources.join(' and ')}`);
    }
    const prefix = props.templateParameterPrefix;
    if (props.table) {
      this.table = props.table;
    } else if (props.createTable) {
      this.lockTable = new FlightlockTable(this, 'LockTable', props.createTable === true ? {} : props.createTable);
      this.table = this.lockTable.table;
    } else if (prefix !== undefined) {
      if (!/^(\/[A-Za-z0-9_.-]+)+$/.test(prefix)) {
        throw new Error(`flightlock: templateParameterPrefix '${prefix}' is not an SSM path like /flightlock (template.yaml's ParameterPrefix)`);
      }
      if (props.layerParameterPrefix !== undefined && props.layerParameterPrefix !== `${prefix}/layer`) {
        throw new Error(`flightlock: the template at ${prefix} writes its layers under ${prefix}/layer, not layerParameterPrefix ${props.layerParameterPrefix}`);
      }
      const tableName = ssm.StringParameter.valueForStringParameter(this, `${prefix}/table/name`);
      this.table = dynamodb.Table.fromTableName(this, 'Table', tableName);
      const policyArn = ssm.StringParameter.valueForStringParameter(this, `${prefix}/table/lock-user-policy`);
      this.lockUserPolicy = iam.ManagedPolicy.fromManagedPolicyArn(this, 'LockUserPolicy', policyArn);
    } else {
      throw new Error('flightlock: give table (an existing lock table), createTable: true or templateParameterPrefix');
    }
    if (props.keyPrefix !== undefined) {
      if (props.keyPrefix === '' || /[*?{}]/.test(props.keyPrefix)) {
        throw new Error(`flightlock: keyPrefix '${props.keyPrefix}' must be non-empty, without '*', '?' (IAM wildcards) or braces (key-template placeholders)`);
      }
    }
    for (const arch of Object.keys(props.layerArns ?? {})) {
      if (!(ARCHITECTURES as readonly string[]).includes(arch)) {
        throw new Error(`flightlock: layerArns has '${arch}'; the architectures are ${ARCHITECTURES.join(', ')}`);
      }
    }
    for (const arch of ARCHITECTURES) {
      const arn = props.layerArns?.[arch];
      if (arn !== undefined) checkLayerArn(arch, arn);
    }
    if (props.layerArns && props.layerVersion !== undefined) {
      throw new Error('flightlock: layerVersion selects an SSM parameter; with layerArns there is none to select');
    }
    if (props.cleanup) {
      this.cleanup = new FlightlockCleanup(this, 'Cleanup', { ...props.cleanup, table: this.table });
    }
  }

  /**
   * The layer version ARN for `arch`, as the function's stack sees it: the given ARN, or a
   * deploy-time read of the SSM parameter (a CloudFormation parameter of type
   * `AWS::SSM::Parameter::Value<String>` in that stack: resolved again at every deploy, and no
   * export between stacks that an update could be blocked by).
   */
  public layerArn(arch: string, scope: Construct = this): string {
    checkArchitecture(arch);
    const given = this.props.layerArns;
    if (given) {
      const arn = given[arch];
      if (arn === undefined) {
        throw new Error(`flightlock: no layer ARN for ${arch} in layerArns (it has ${Object.keys(given).join(', ') || 'none'}); a function runs only the layer of its own architecture`);
      }
      return arn;
    }
    const prefix =
      this.props.layerParameterPrefix ??
      (this.props.templateParameterPrefix !== undefined ? `${this.props.templateParameterPrefix}/layer` : LAYER_PARAMETER_PREFIX);
    const name = layerParameterName(arch, this.props.layerVersion ?? VERSION, prefix);
    return ssm.StringParameter.valueForStringParameter(scope, name);
  }

  /**
   * Grants exactly what a lock user needs on the table (docs/src/reference/iam.md), under the
   * key-prefix condition when `keyPrefix` is set; with `templateParameterPrefix`, by attaching
   * the template's lock-user managed policy to the grantee's role. Fails if the grantee has no
   * policy to add it to (a role imported with `mutable: false` silently takes nothing: attach
   * its policy yourself).
   */
  public grantLockUser(grantee: iam.IGrantable): iam.Grant {
    if (this.lockUserPolicy !== undefined) {
      const role = grantee.grantPrincipal;
      if (!(role instanceof iam.Role)) {
        throw new Error(`flightlock: ${grantee.grantPrincipal} is not a role of this app; attach the template's lock-user policy (${TEMPLATE_PARAMETER_PREFIX}/table/lock-user-policy) to it yourself`);
      }
      role.addManagedPolicy(this.lockUserPolicy);
      return iam.Grant.drop(grantee, 'the template\'s lock-user managed policy, attached to the role');
    }
    const grant = iam.Grant.addToPrincipal({
      grantee,
      actions: [...LOCK_USER_ACTIONS],
      resourceArns: [this.table.tableArn],
      conditions:
        this.props.keyPrefix !== undefined
          ? { 'ForAllValues:StringLike': { 'dynamodb:LeadingKeys': [`${this.props.keyPrefix}*`] } }
          : undefined,
    });
    grant.assertSuccess();
    return grant;
  }

  /**
   * Makes `fn` single-flight: the layer of its architecture, AWS_LAMBDA_EXEC_WRAPPER,
   * FLIGHTLOCK_TABLE and the given settings, and the lock user's permissions on the table.
   */
  public attach(fn: lambda.Function, options: AttachOptions = {}): void {
    const at = `flightlock: ${fn.node.path}`;
    if (this.attached.has(fn)) throw new Error(`${at}: already attached`);
    checkRuntime(at, fn.runtime);
    const arch = ARCHITECTURES.find((a) => a === fn.architecture.name);
    if (arch === undefined) {
      throw new Error(`${at}: architecture ${fn.architecture.name}; the layer is built for ${ARCHITECTURES.join(', ')}`);
    }

    const variables = settingsOf(at, options);
    const existing = environmentOf(fn);
    for (const name of Object.keys(existing)) {
      if (name.startsWith('FLIGHTLOCK_') && !FUNCTION_VARIABLES.includes(name)) {
        throw new Error(`${at}: its environment has ${name}, which the extension does not read (it would fail init)`);
      }
    }
    const key = variables.FLIGHTLOCK_KEY ?? existing.FLIGHTLOCK_KEY;
    // Gate off, no invocation takes FLIGHTLOCK_KEY: the handler's own keys meet the prefix in IAM.
    const gated = !SWITCH_OFF_WORDS.includes((variables.FLIGHTLOCK_GATE ?? existing.FLIGHTLOCK_GATE ?? 'on').trim().toLowerCase());
    if (this.props.keyPrefix !== undefined && gated) {
      if (key === undefined) {
        throw new Error(`${at}: keyPrefix '${this.props.keyPrefix}' allows only keys under it, and the default key (the function name) is not: set key`);
      }
      if (!Token.isUnresolved(key) && !key.startsWith(this.props.keyPrefix)) {
        throw new Error(`${at}: key '${key}' does not start with keyPrefix '${this.props.keyPrefix}': IAM would deny every request`);
      }
    }

    for (const name of ['FLIGHTLOCK_TABLE', ...Object.keys(variables)]) {
      if (name in existing) throw new Error(`${at}: already sets ${name}`);
    }
    const execWrapper = options.execWrapper ?? true;
    if (execWrapper && existing.AWS_LAMBDA_EXEC_WRAPPER !== undefined && existing.AWS_LAMBDA_EXEC_WRAPPER !== WRAPPER) {
      throw new Error(`${at}: AWS_LAMBDA_EXEC_WRAPPER is already ${existing.AWS_LAMBDA_EXEC_WRAPPER}; one wrapper runs. To chain them, let that wrapper run ${WRAPPER} and attach with execWrapper: false`);
    }

    fn.addLayers(lambda.LayerVersion.fromLayerVersionArn(fn, 'FlightlockLayer', this.layerArn(arch, fn)));
    if (execWrapper) fn.addEnvironment('AWS_LAMBDA_EXEC_WRAPPER', WRAPPER);
    fn.addEnvironment('FLIGHTLOCK_TABLE', this.table.tableName);
    for (const [name, value] of Object.entries(variables)) fn.addEnvironment(name, value);
    this.grantLockUser(fn);
    this.attached.add(fn);

    // Whatever is added later, at synthesis the wrapper must still be flightlock's: another one
    // set afterwards would run the handler without the lock (UnenforcedInvocations).
    if (execWrapper) {
      fn.node.addValidation({
        validate: () => {
          const wrapper = environmentOf(fn).AWS_LAMBDA_EXEC_WRAPPER;
          return wrapper === WRAPPER ? [] : [`${at}: AWS_LAMBDA_EXEC_WRAPPER was changed to ${wrapper} after attach; the handler would run without the lock`];
        },
      });
    }
  }
}

// --- helpers -------------------------------------------------------------------------------------

/**
 * Acknowledges a cdk-nag finding on `scope` and everything under it, with the reason: the
 * metadata that `Validations.of(scope).acknowledge` writes (cdk-nag 3 reads it), written directly
 * so that neither cdk-nag nor an aws-cdk-lib with `Validations` is needed at run time.
 */
function acknowledge(scope: Construct, rule: string, reason: string): void {
  scope.node.addMetadata('aws:cdk:acknowledged-rules', { [rule]: reason });
}

/** An architecture is a string in the public API (jsii has no string-literal types): checked here. */
function checkArchitecture(arch: string): void {
  if (!ARCHITECTURES.includes(arch)) {
    throw new Error(`flightlock: architecture '${arch}'; the layer is built for ${ARCHITECTURES.join(', ')}`);
  }
}

function checkLayerArn(arch: string, arn: string): void {
  if (Token.isUnresolved(arn)) return;
  const m = /^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:layer:([A-Za-z0-9_-]+):\d+$/.exec(arn);
  if (!m) {
    throw new Error(`flightlock: layerArns.${arch} '${arn}' is not a layer version ARN (arn:aws:lambda:<region>:<account>:layer:<name>:<version>)`);
  }
  const other = ARCHITECTURES.find((a) => a !== arch)!;
  if (m[1].includes(other)) {
    throw new Error(`flightlock: layerArns.${arch} '${arn}' names the ${other} layer; a function runs only the layer of its own architecture ("exec format error" at init)`);
  }
}

function checkRuntime(at: string, runtime: lambda.Runtime): void {
  if (runtime.name === lambda.Runtime.FROM_IMAGE.name) {
    throw new Error(`${at}: a container image function takes no layers; copy the layer into the image (docs/src/getting-started/container-image.md)`);
  }
  if (runtime.name.startsWith('provided')) {
    throw new Error(`${at}: ${runtime.name} is an OS-only runtime, which does not run AWS_LAMBDA_EXEC_WRAPPER; take the lock in process (docs/src/getting-started/rust.md)`);
  }
}

/** The FLIGHTLOCK_* variables of `options`, checked. */
function settingsOf(at: string, options: AttachOptions): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(options.settings ?? {})) {
    if (!FUNCTION_VARIABLES.includes(name)) {
      throw new Error(`${at}: settings has ${name}, which the extension does not read (it would fail init); known: ${FUNCTION_VARIABLES.join(', ')}`);
    }
    if (name === 'FLIGHTLOCK_TABLE') throw new Error(`${at}: FLIGHTLOCK_TABLE is the lock table's name; it is set by attach`);
    out[name] = value;
  }
  const typed: Record<string, string | undefined> = {
    FLIGHTLOCK_KEY: options.key,
    FLIGHTLOCK_WAIT: options.waitForever ? 'forever' : options.wait === undefined ? undefined : duration(options.wait, true),
    FLIGHTLOCK_ON_BUSY: options.onBusy,
    FLIGHTLOCK_LEASE: options.lease === undefined ? undefined : duration(options.lease),
    FLIGHTLOCK_PERMITS: options.permits === undefined ? undefined : String(wholeNumber('permits', options.permits, 1, 100)),
    FLIGHTLOCK_GATE: options.gate === undefined ? undefined : options.gate ? 'on' : 'off',
  };
  for (const [name, value] of Object.entries(typed)) {
    if (value === undefined) continue;
    if (name in out) throw new Error(`${at}: ${name} is given twice, as an option and in settings`);
    out[name] = value;
  }
  if (out.FLIGHTLOCK_KEY === '') throw new Error(`${at}: key is empty`);
  if (options.waitForever && options.wait !== undefined) throw new Error(`${at}: give wait or waitForever, not both`);
  if (options.onBusy !== undefined && options.onBusy !== OnBusy.SKIP && options.onBusy !== OnBusy.ERROR) {
    throw new Error(`${at}: onBusy is 'skip' or 'error', not '${options.onBusy}'`);
  }
  if (options.lease !== undefined && !options.lease.isUnresolved() && options.lease.toMilliseconds() < 100) {
    throw new Error(`${at}: lease is at least 100 ms`);
  }
  return out;
}

/** A duration in the variables' form: `20s`, `1500ms` (`0` for zero when `zero` is allowed). */
function duration(d: Duration, zero = false): string {
  const ms = d.toMilliseconds();
  if (ms === 0) {
    if (zero) return '0';
    throw new Error('flightlock: a zero duration is not allowed here');
  }
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

function wholeNumber(what: string, n: number, min: number, max: number): number {
  if (!Number.isInteger(n) || n < min || n > max) throw new Error(`flightlock: ${what} is a whole number from ${min} to ${max}, not ${n}`);
  return n;
}

/** The function's environment variables as they stand (values may be tokens). */
function environmentOf(fn: lambda.Function): Record<string, string> {
  const cfn = fn.node.defaultChild as lambda.CfnFunction;
  const env = Stack.of(fn).resolve(cfn.environment) as { variables?: Record<string, unknown> } | undefined;
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env?.variables ?? {})) out[k] = typeof v === 'string' ? v : JSON.stringify(v);
  return out;
}
