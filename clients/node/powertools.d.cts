// Types of flightlock/powertools (powertools.mjs, powertools.cjs; powertools.d.cts is this file for
// `require`, kept identical by scripts/check-client-node). No type of Powertools is needed: the
// record types are the shapes Lambda hands over, as far as the default key reads them.

import type { Holder, InvocationContext, LockApiOptions } from "./index.cjs";

/** A record's key stayed held by another invocation for the whole wait. */
export declare class RecordBusyError extends Error {
  readonly key: string;
  readonly holders: Holder[] | undefined;
}
/** A record whose key could not be found (no group id, a key function that threw). */
export declare class RecordKeyError extends Error {}
/** A record not run because an earlier record of its key in the batch failed. */
export declare class EarlierRecordFailedError extends Error {
  readonly key: string;
}

/** The default key: SQS `attributes.MessageGroupId` (FIFO), Kinesis `kinesis.partitionKey`. */
export declare function defaultKey(record: unknown): string;

export interface LockPerRecordOptions<R> {
  /** The record's lock key (default: defaultKey). */
  key?: (record: R) => string;
  /** How long to wait for a busy key, ms (default FLIGHTLOCK_WAIT). */
  waitMs?: number;
  /** How many may hold a key at once (default FLIGHTLOCK_PERMITS). */
  permits?: number;
  /** Where the lock API is (default: Lambda's environment). */
  lockApi?: LockApiOptions;
}

/** The user's work on one record: the whole record, its key's fencing token, the context. */
export type LockedRecordHandler<R, T, C extends InvocationContext = InvocationContext> = (
  record: R,
  token: number,
  context: C,
) => T | Promise<T>;

/** A record handler for Powertools' BatchProcessor / SqsFifoPartialProcessorAsync. */
export declare function lockPerRecord<R, T, C extends InvocationContext = InvocationContext>(
  handler: LockedRecordHandler<R, T, C>,
  options?: LockPerRecordOptions<R>,
): (record: R, context?: C) => Promise<T>;
