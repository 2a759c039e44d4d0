// A batch consumer for the end-to-end tests (tests/e2e/tests/e2e/records.rs), run by the npm
// aws-lambda-ric: the SQS recipe's handler (docs/src/recipes/sqs/sqs_batch.mjs, copied beside
// this file) with the package flightlock from the layer (/opt/nodejs/node_modules, through
// NODE_PATH), and a process() that records each record's interval. The same event fields as
// records_handler.py.
import { appendFileSync, existsSync } from "node:fs";
import { LockApiError, Locks } from "flightlock";
import { handleBatch } from "./sqs_batch.mjs";

// Epoch nanoseconds, below the millisecond, as an exact integer string.
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)).toString();

function write(fields, ns) {
  const path = process.env.DEMO_RECORD_FILE;
  if (!path) return;
  const line = { ...fields, env: process.env.DEMO_ENV_NAME ?? "", pid: process.pid };
  // Timestamps as JSON integers (a double would round them).
  const json = JSON.stringify(line).slice(0, -1) + Object.entries(ns).map(([k, v]) => `,"${k}":${v}`).join("") + "}";
  // One short append (O_APPEND): lines of concurrent writers never interleave.
  appendFileSync(path, json + "\n");
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export const handler = async (event, context) => {
  if (event.keep) {
    const locks = new Locks(context);
    const tokens = {};
    for (const key of event.keep) tokens[key] = await locks.acquire(key, 0);
    return { requestId: context.awsRequestId, tokens };
  }
  if (event.actAs) {
    try {
      await new Locks({ awsRequestId: event.actAs }).acquire(event.key, 0);
      return { refused: false };
    } catch (e) {
      if (!(e instanceof LockApiError)) throw e;
      return { refused: true, status: e.status, error: e.error, message: e.message };
    }
  }
  const processRecord = async (body, token) => {
    const start = nowNs();
    const seen = { requestId: context.awsRequestId, entity: body.entity, seq: body.seq, token };
    write({ what: "start", ...seen }, { ns: start });
    if (body.crash) {
      write({ what: "crashing", ...seen }, { ns: nowNs() });
      process.kill(process.pid, "SIGKILL");
    }
    const until = Date.now() + 30000;
    while (body.holdFile && !existsSync(body.holdFile) && Date.now() < until) await sleep(20);
    await sleep(body.sleepMs ?? 50);
    write({ what: "record", ...seen }, { start, end: nowNs() });
  };
  return handleBatch(event, context, processRecord, event.waitMs ?? 0);
};
