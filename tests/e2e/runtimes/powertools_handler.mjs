// A FIFO consumer for the end-to-end tests (tests/e2e/tests/e2e/node_powertools.rs), run by the
// npm aws-lambda-ric: the SQS recipe's Powertools consumer (docs/src/recipes/sqs/
// sqs_fifo_powertools.mjs, copied beside this file) with work that records each record's
// interval. "flightlock" is the layer's (/opt/nodejs/node_modules, through NODE_PATH), Powertools
// the function's own node_modules.
import { appendFileSync } from "node:fs";
import { consumer } from "./sqs_fifo_powertools.mjs";

const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)).toString();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function write(fields, ns) {
  const line = { ...fields, env: process.env.DEMO_ENV_NAME ?? "", pid: process.pid };
  // Timestamps as JSON integers (a double would round them); one short O_APPEND write per line.
  const json = JSON.stringify(line).slice(0, -1) + Object.entries(ns).map(([k, v]) => `,"${k}":${v}`).join("") + "}";
  appendFileSync(process.env.DEMO_RECORD_FILE, json + "\n");
}

const fifo = consumer(async (record, token, context) => {
  const body = JSON.parse(record.body);
  const start = nowNs();
  const seen = {
    requestId: context.awsRequestId,
    messageId: record.messageId,
    group: record.attributes.MessageGroupId,
    queue: body.queue,
    seq: body.seq,
    token,
  };
  await sleep(body.sleepMs ?? 30);
  write({ what: "record", ...seen }, { start, end: nowNs() });
});

export const handler = async (event, context) => {
  if (event.where) return { flightlock: import.meta.resolve("flightlock/powertools") };
  return fifo(event, context);
};
