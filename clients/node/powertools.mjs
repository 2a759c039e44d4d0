// flightlock/powertools: a lock per record for Powertools for AWS Lambda's batch utility
// (@aws-lambda-powertools/batch 2.x, which the function imports itself; this module imports
// nothing of it). The same API as powertools.cjs.
//
//   import { SqsFifoPartialProcessorAsync, processPartialResponse } from "@aws-lambda-powertools/batch";
//   import { lockPerRecord } from "flightlock/powertools";
//
//   const processor = new SqsFifoPartialProcessorAsync();
//   const recordHandler = lockPerRecord(async (record, token) => { ... });  // the whole record
//   export const handler = (event, context) =>
//     processPartialResponse(event, recordHandler, processor, { context, skipGroupOnError: true });
//
// Per record: the key (default: SQS attributes.MessageGroupId, Kinesis kinesis.partitionKey;
// options.key(record) otherwise) is locked before the handler runs and released after it. A
// record whose key stays busy, or whose key or lock fails, throws: Powertools reports it in
// batchItemFailures and Lambda delivers it again. Order is Powertools' own (the FIFO processor
// fails the rest of a group after a failure); records of one key in one batch also run one after
// another, in batch order, and after a failed one the later ones fail too, with any processor.

import { LockApiError, Locks, NO_LOCK_API, Refusal } from "./index.mjs";

/** A record's key stayed held by another invocation for the whole wait. */
export class RecordBusyError extends Error {
  constructor(key, holders, message) {
    super(`flightlock: key ${JSON.stringify(key)} is busy: ${message}`);
    this.name = "RecordBusyError";
    this.key = key;
    this.holders = holders;
  }
}

/** A record whose key could not be found: the message says the fix. */
export class RecordKeyError extends Error {
  constructor(message, options) {
    super(`flightlock: ${message}`, options);
    this.name = "RecordKeyError";
  }
}

/** A record not run because an earlier record of its key in this batch failed. */
export class EarlierRecordFailedError extends Error {
  constructor(key) {
    super(
      `flightlock: an earlier record of key ${JSON.stringify(key)} in this batch failed; ` +
        "this one is reported failed too, so it does not overtake it",
    );
    this.name = "EarlierRecordFailedError";
    this.key = key;
  }
}

const KEY_FIX = "pass lockPerRecord(handler, { key: (record) => ... })";

/** The default key of a record: its SQS message group id or its Kinesis partition key. */
export function defaultKey(record) {
  const id = recordId(record);
  switch (record?.eventSource) {
    case "aws:sqs": {
      const group = record.attributes?.MessageGroupId;
      if (typeof group === "string" && group !== "") return group;
      throw new RecordKeyError(
        `SQS record ${id} has no attributes.MessageGroupId (a standard queue, not FIFO): ` +
          `the key must come from the record: ${KEY_FIX}`,
      );
    }
    case "aws:kinesis":
      return record.kinesis.partitionKey;
    case "aws:dynamodb":
      throw new RecordKeyError(`DynamoDB Streams record ${id} has no default key: ${KEY_FIX}`);
    default:
      throw new RecordKeyError(`record ${id} is not from SQS or Kinesis, so it has no default key: ${KEY_FIX}`);
  }
}

function recordId(record) {
  return record?.messageId ?? record?.kinesis?.sequenceNumber ?? record?.dynamodb?.SequenceNumber ?? "(no id)";
}

function keyOf(record, key) {
  if (key === undefined) return defaultKey(record);
  let k;
  try {
    k = key(record);
  } catch (e) {
    throw new RecordKeyError(`the key function threw for record ${recordId(record)}: ${e?.message ?? e}; fix it (it gets the whole record)`, {
      cause: e,
    });
  }
  if (typeof k !== "string" || k === "") {
    throw new RecordKeyError(
      `the key function answered ${JSON.stringify(k)} for record ${recordId(record)}: a key is a non-empty string`,
    );
  }
  return k;
}

// A sync processor (BatchProcessorSync, SqsFifoPartialProcessor) would take the promise this
// handler answers as the record's result and report the record processed before it ran. The
// processor calls the handler as its method, so `this` tells.
function isSyncProcessor(processor) {
  for (let p = processor; p; p = Object.getPrototypeOf(p)) {
    const name = p.constructor?.name;
    if (name === "BatchProcessorSync" || name === "SqsFifoPartialProcessor") return true;
  }
  return false;
}

// Per invocation (Powertools passes the same context object with every record of a batch).
const batches = new WeakMap();

// Powertools keeps a failed record's error to itself (a batch that failed whole shows only
// "All records failed processing"), so the errors that need a fix are logged here: a missing
// lock API once per batch, a record without a key and any other refusal once per record. A busy
// key and the user's own errors are not: they are what batchItemFailures report.
function report(batch, e) {
  if (e instanceof RecordBusyError || e instanceof EarlierRecordFailedError) return;
  if (e instanceof LockApiError && e.error === NO_LOCK_API) {
    if (batch.noLockApiLogged) return;
    batch.noLockApiLogged = true;
  } else if (!(e instanceof LockApiError || e instanceof RecordKeyError)) {
    return;
  }
  console.error(e.message);
}

/**
 * Wraps `handler(record, token, context)` into a Powertools record handler that holds the lock
 * of the record's key while it runs. `options`: `key(record)` (the default: defaultKey),
 * `waitMs` and `permits` (undefined: FLIGHTLOCK_WAIT, FLIGHTLOCK_PERMITS), `lockApi` (Locks'
 * options, for tests).
 */
export function lockPerRecord(handler, options = {}) {
  if (typeof handler !== "function") throw new TypeError("flightlock: lockPerRecord(handler) needs a function");
  async function run(record, context) {
    if (typeof context?.awsRequestId !== "string") {
      const e = new Error(
        "flightlock: the record handler got no Lambda context: pass it to Powertools, " +
          "processPartialResponse(event, recordHandler, processor, { context })",
      );
      console.error(e.message);
      throw e;
    }
    let batch = batches.get(context);
    if (batch === undefined) {
      batch = { locks: undefined, broken: undefined, tails: new Map(), failed: new Set() };
      try {
        batch.locks = new Locks(context, options.lockApi);
      } catch (e) {
        batch.broken = e; // no lock API in this environment: every record fails with it
      }
      batches.set(context, batch);
    }
    if (batch.broken !== undefined) {
      report(batch, batch.broken);
      throw batch.broken;
    }
    let key;
    try {
      key = keyOf(record, options.key);
    } catch (e) {
      report(batch, e);
      throw e;
    }
    const before = batch.tails.get(key);
    let done;
    const mine = new Promise((resolve) => (done = resolve));
    batch.tails.set(key, mine);
    try {
      await before;
      if (batch.failed.has(key)) throw new EarlierRecordFailedError(key);
      let token;
      try {
        token = (await batch.locks.call("acquire", { key, waitMs: options.waitMs, permits: options.permits })).token;
      } catch (e) {
        if (e instanceof LockApiError && e.error === Refusal.BUSY) throw new RecordBusyError(key, e.holders, e.message);
        throw e;
      }
      let value;
      try {
        value = await handler(record, token, context);
      } catch (e) {
        await batch.locks.release(key).catch(() => {}); // the handler's error is the one to see
        throw e;
      }
      await batch.locks.release(key); // a lost lock throws: the work was not protected
      return value;
    } catch (e) {
      batch.failed.add(key);
      report(batch, e);
      throw e;
    } finally {
      done();
      if (batch.tails.get(key) === mine) batch.tails.delete(key);
    }
  }
  return function flightlockRecordHandler(record, context) {
    if (isSyncProcessor(this)) {
      throw new Error(
        "flightlock: lockPerRecord's handler is async (it calls the lock API): use BatchProcessor or " +
          "SqsFifoPartialProcessorAsync with processPartialResponse, not a sync processor",
      );
    }
    return run(record, context);
  };
}
