// flightlock/powertools with the real @aws-lambda-powertools/batch 2.x from npm, against the
// stand-in lock API, loaded both ways (import and require). What Powertools reports is what
// Lambda would redeliver: every record that did not run to the end under its lock is in
// batchItemFailures, and none that is there ran.
import { strict as assert } from "node:assert";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import * as powertools from "@aws-lambda-powertools/batch";
import * as esm from "flightlock/powertools";
import { StandIn } from "./standin.mjs";

const require = createRequire(import.meta.url);
const cjs = require("flightlock/powertools");
const { BatchProcessor, BatchProcessorSync, EventType, SqsFifoPartialProcessor, SqsFifoPartialProcessorAsync } = powertools;
const { processPartialResponse, processPartialResponseSync } = powertools;
const TOKEN = "powertools-test-token";

const sqs = (id, group, body = {}) => ({
  messageId: id,
  receiptHandle: "AQEB",
  body: JSON.stringify(body),
  attributes: { ApproximateReceiveCount: "1", SentTimestamp: "1764230400000", ...(group ? { MessageGroupId: group } : {}) },
  messageAttributes: {},
  md5OfBody: "",
  eventSource: "aws:sqs",
  eventSourceARN: "arn:aws:sqs:us-east-1:123456789012:work.fifo",
  awsRegion: "us-east-1",
});
const failedIds = (response) => response.batchItemFailures.map((f) => f.itemIdentifier);

for (const [flavour, m] of [
  ["import", esm],
  ["require", cjs],
]) {
  describe(`flightlock/powertools (${flavour})`, () => {
    let api;
    let n = 0;
    const invocation = () => {
      const awsRequestId = `pt-${flavour}-${++n}`;
      api.begin(awsRequestId);
      return { awsRequestId, functionName: "consumer" };
    };
    const lockApi = () => ({ runtimeApi: api.runtimeApi, sessionToken: TOKEN });
    before(async () => {
      api = await new StandIn(TOKEN).start();
    });
    after(() => api.stop());

    test("FIFO: a busy group fails with the rest of its group; other groups run with their tokens", async () => {
      const other = invocation();
      await new (require("flightlock").Locks)(other, lockApi()).acquire("g1", 0);
      const ran = [];
      const handler = m.lockPerRecord(
        async (record, token, context) => {
          assert.equal(typeof token, "number");
          assert.ok(context.awsRequestId.startsWith("pt-"));
          ran.push([record.messageId, token]);
        },
        { lockApi: lockApi(), waitMs: 0 },
      );
      const event = { Records: [sqs("m1", "g0"), sqs("m2", "g1"), sqs("m3", "g0"), sqs("m4", "g1"), sqs("m5", "g2")] };
      const context = invocation();
      const response = await processPartialResponse(event, handler, new SqsFifoPartialProcessorAsync(), {
        context,
        skipGroupOnError: true,
      });
      assert.deepEqual(failedIds(response), ["m2", "m4"]);
      assert.deepEqual(
        ran.map(([id]) => id),
        ["m1", "m3", "m5"],
      );
      assert.ok(ran[1][1] > ran[0][1], "g0's second record has a higher token");
      // Everything was released: another invocation takes each key at once.
      const next = new (require("flightlock").Locks)(invocation(), lockApi());
      for (const key of ["g0", "g2"]) assert.equal(typeof (await next.acquire(key, 0)), "number");
    });

    test("FIFO without skipGroupOnError: everything after the first failure fails (Powertools' rule)", async () => {
      const other = invocation();
      await new (require("flightlock").Locks)(other, lockApi()).acquire("h1", 0);
      const ran = [];
      const handler = m.lockPerRecord((record) => ran.push(record.messageId), { lockApi: lockApi(), waitMs: 0 });
      const event = { Records: [sqs("n1", "h0"), sqs("n2", "h1"), sqs("n3", "h2")] };
      const response = await processPartialResponse(event, handler, new SqsFifoPartialProcessorAsync(), { context: invocation() });
      assert.deepEqual(failedIds(response), ["n2", "n3"]);
      assert.deepEqual(ran, ["n1"]);
    });

    test("BatchProcessor in parallel: records of one key run one after another, in batch order", async () => {
      const running = new Set();
      const order = [];
      const handler = m.lockPerRecord(
        async (record) => {
          const key = JSON.parse(record.body).entity;
          assert.ok(!running.has(key), `two records of ${key} at once`);
          running.add(key);
          await new Promise((r) => setTimeout(r, 20));
          running.delete(key);
          order.push(record.messageId);
        },
        { key: (record) => JSON.parse(record.body).entity, lockApi: lockApi() },
      );
      const event = {
        Records: [sqs("p1", null, { entity: "e0" }), sqs("p2", null, { entity: "e1" }), sqs("p3", null, { entity: "e0" }), sqs("p4", null, { entity: "e0" })],
      };
      const response = await processPartialResponse(event, handler, new BatchProcessor(EventType.SQS), { context: invocation() });
      assert.deepEqual(failedIds(response), []);
      const e0 = order.filter((id) => id !== "p2");
      assert.deepEqual(e0, ["p1", "p3", "p4"]);
    });

    test("after a failed record, later records of its key in the batch fail without running", async () => {
      const ran = [];
      const handler = m.lockPerRecord(
        async (record) => {
          if (record.messageId === "q1") throw new Error("work failed");
          ran.push(record.messageId);
        },
        { key: (record) => JSON.parse(record.body).entity, lockApi: lockApi() },
      );
      const event = { Records: [sqs("q1", null, { entity: "f0" }), sqs("q2", null, { entity: "f1" }), sqs("q3", null, { entity: "f0" })] };
      const processor = new BatchProcessor(EventType.SQS);
      const response = await processPartialResponse(event, handler, processor, { context: invocation() });
      assert.deepEqual(failedIds(response).sort(), ["q1", "q3"]);
      assert.deepEqual(ran, ["q2"]);
      assert.ok(processor.errors.some((e) => e.name === "EarlierRecordFailedError"), String(processor.errors));
    });

    test("a key function that throws, a record without a group id: failed, with the fix named", async (t) => {
      const logged = t.mock.method(console, "error", () => {});
      const ran = [];
      const throwing = m.lockPerRecord((r) => ran.push(r.messageId), {
        key: (record) => JSON.parse(record.body).entity.id,
        lockApi: lockApi(),
      });
      const event = { Records: [sqs("r1", null, { entity: { id: "x" } }), sqs("r2", null, { noEntity: true })] };
      const processor = new BatchProcessor(EventType.SQS);
      const response = await processPartialResponse(event, throwing, processor, { context: invocation() });
      assert.deepEqual(failedIds(response), ["r2"]);
      assert.deepEqual(ran, ["r1"]);
      assert.equal(processor.errors[0].name, "RecordKeyError");
      assert.match(processor.errors[0].message, /key function threw for record r2: .*fix it/);

      const standard = m.lockPerRecord((r) => ran.push(r.messageId), { lockApi: lockApi() });
      const p2 = new BatchProcessor(EventType.SQS);
      const r2 = await processPartialResponse({ Records: [sqs("s1", "g"), sqs("s2", null)] }, standard, p2, { context: invocation() });
      assert.deepEqual(failedIds(r2), ["s2"]);
      assert.match(p2.errors[0].message, /s2 has no attributes\.MessageGroupId.*key: \(record\) =>/);
      assert.deepEqual(
        logged.mock.calls.map((c) => c.arguments[0]),
        [processor.errors[0].message, p2.errors[0].message],
        "each record without a key is logged",
      );
      assert.throws(() => m.defaultKey({ eventSource: "aws:dynamodb", dynamodb: { SequenceNumber: "7" } }), /DynamoDB Streams record 7 has no default key/);
      assert.equal(m.defaultKey({ eventSource: "aws:kinesis", kinesis: { partitionKey: "pk-1", sequenceNumber: "9" } }), "pk-1");
    });

    test("Kinesis: the partition key is the default key", async () => {
      const seen = [];
      const handler = m.lockPerRecord(async (record, token) => seen.push([record.kinesis.partitionKey, token]), { lockApi: lockApi() });
      const kinesis = (seq, pk) => ({
        eventSource: "aws:kinesis",
        eventID: `shardId-000:${seq}`,
        kinesis: { partitionKey: pk, sequenceNumber: seq, data: "e30=", kinesisSchemaVersion: "1.0", approximateArrivalTimestamp: 1 },
      });
      const response = await processPartialResponse(
        { Records: [kinesis("1", "kp-a"), kinesis("2", "kp-b")] },
        handler,
        new BatchProcessor(EventType.KinesisDataStreams),
        { context: invocation() },
      );
      assert.deepEqual(response.batchItemFailures, []);
      assert.deepEqual(seen.map(([pk]) => pk).sort(), ["kp-a", "kp-b"]);
    });

    test("no lock API: no record is reported processed, and the log names the fix once", async (t) => {
      const logged = t.mock.method(console, "error", () => {});
      for (const [lockApi, fix] of [
        [{ runtimeApi: "127.0.0.1:9", sessionToken: "t" }, /AWS_LAMBDA_EXEC_WRAPPER=\/opt\/flightlock-wrapper/],
        [{ runtimeApi: api.runtimeApi, sessionToken: "" }, /neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN/],
      ]) {
        logged.mock.resetCalls();
        const ran = [];
        const handler = m.lockPerRecord((r) => ran.push(r.messageId), { lockApi });
        const processor = new BatchProcessor(EventType.SQS);
        await assert.rejects(
          processPartialResponse({ Records: [sqs("t1", "g"), sqs("t2", "h")] }, handler, processor, { context: invocation() }),
          (e) => e.name === "FullBatchFailureError",
        );
        assert.deepEqual(ran, []);
        assert.equal(processor.errors.length, 2);
        for (const e of processor.errors) {
          assert.equal(e.error, "noLockApi");
          assert.match(e.message, fix);
        }
        assert.equal(logged.mock.callCount(), 1, "logged once per batch");
        assert.match(logged.mock.calls[0].arguments[0], fix);
      }
    });

    test("no context passed to Powertools, or a sync processor: failed, never processed", async (t) => {
      t.mock.method(console, "error", () => {});
      const ran = [];
      const handler = m.lockPerRecord((r) => ran.push(r.messageId), { lockApi: lockApi() });
      const p1 = new BatchProcessor(EventType.SQS);
      await assert.rejects(processPartialResponse({ Records: [sqs("u1", "g")] }, handler, p1), (e) => e.name === "FullBatchFailureError");
      assert.match(p1.errors[0].message, /processPartialResponse\(event, recordHandler, processor, \{ context \}\)/);
      for (const processor of [new SqsFifoPartialProcessor(), new BatchProcessorSync(EventType.SQS)]) {
        assert.throws(
          () => processPartialResponseSync({ Records: [sqs("v1", "g"), sqs("v2", "h")] }, handler, processor, { context: invocation() }),
          (e) => e.name === "FullBatchFailureError",
        );
        assert.match(processor.errors[0].message, /SqsFifoPartialProcessorAsync with processPartialResponse/);
      }
      assert.deepEqual(ran, []);
    });
  });
}
