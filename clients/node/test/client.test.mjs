// The client (`flightlock`) against the stand-in lock API, loaded both ways a user loads it:
// `import` (index.mjs) and `require` (index.cjs). Run from a project that installed the packed
// tarball (scripts/check-client-node), so "flightlock" is what npm installed.
import { strict as assert } from "node:assert";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import * as esm from "flightlock";
import { StandIn } from "./standin.mjs";

const cjs = createRequire(import.meta.url)("flightlock");
const TOKEN = "session-token-of-the-test";

for (const [flavour, m] of [
  ["import", esm],
  ["require", cjs],
]) {
  describe(`flightlock (${flavour})`, () => {
    let api;
    let n = 0;
    const invocation = () => {
      const awsRequestId = `req-${flavour}-${++n}`;
      api.begin(awsRequestId);
      return { awsRequestId };
    };
    const locks = (context, options = {}) => new m.Locks(context, { runtimeApi: api.runtimeApi, sessionToken: TOKEN, ...options });
    before(async () => {
      api = await new StandIn(TOKEN).start();
    });
    after(() => api.stop());

    test("acquire answers rising tokens; busy is null; release frees the key", async () => {
      const a = locks(invocation());
      const b = locks(invocation());
      const t1 = await a.acquire("order-7", 0);
      assert.equal(typeof t1, "number");
      assert.equal(await b.acquire("order-7", 0), null);
      assert.deepEqual(await a.held(), [{ key: "order-7", token: t1, permits: 1, lost: false }]);
      await a.release("order-7");
      assert.deepEqual(await a.held(), []);
      const t2 = await b.acquire("order-7", 0);
      assert.ok(t2 > t1, `${t2} > ${t1}`);
    });

    test("a wait ends when the holder releases", async () => {
      const a = locks(invocation());
      const b = locks(invocation());
      await a.acquire("waited", 0);
      setTimeout(() => a.release("waited"), 50);
      assert.equal(typeof (await b.acquire("waited", 2000)), "number");
    });

    test("withLock releases when fn returns and when it throws; busy throws busy", async () => {
      const a = locks(invocation());
      const b = locks(invocation());
      assert.equal(await a.withLock("w", async (token) => `ran with ${token}`, 0), "ran with 1");
      assert.deepEqual(await a.held(), []);
      await assert.rejects(
        a.withLock("w", () => {
          throw new Error("work failed");
        }),
        /work failed/,
      );
      assert.deepEqual(await a.held(), []);
      await a.acquire("w", 0);
      let ran = false;
      await assert.rejects(
        b.withLock("w", () => (ran = true), 0),
        (e) => e instanceof m.LockApiError && e.error === m.Refusal.BUSY && e.status === 409 && e.holders.length === 1,
      );
      assert.equal(ran, false);
    });

    test("lock() answers a HeldLock that async dispose releases once", async () => {
      const a = locks(invocation());
      const held = await a.lock("d", 0);
      assert.ok(held instanceof m.HeldLock);
      assert.equal(held.key, "d");
      assert.deepEqual((await a.held()).map((h) => h.key), ["d"]);
      await held[Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")]();
      await held.release(); // a second release does not call the API again (it would be notHeld)
      assert.deepEqual(await a.held(), []);
      const b = locks(invocation());
      await b.acquire("d2", 0);
      assert.equal(await a.lock("d2", 0), null);
    });

    test("refusals carry the API's word, status and message", async () => {
      const context = invocation();
      const a = locks(context);
      await a.acquire("k", 0);
      const refused = async (promise, status, word) =>
        assert.rejects(promise, (e) => {
          assert.ok(e instanceof m.LockApiError, String(e));
          assert.equal(e.status, status, e.message);
          assert.equal(e.error, word, e.message);
          assert.match(e.message, new RegExp(`^flightlock lock API: ${status} ${word}: .+`));
          return true;
        });
      await refused(a.acquire("k", 0), 409, m.Refusal.ALREADY_HELD);
      await refused(a.release("never"), 404, m.Refusal.NOT_HELD);
      await refused(a.acquire("", 0), 400, m.Refusal.BAD_REQUEST);
      await refused(a.acquire("x".repeat(1025), 0), 400, m.Refusal.BAD_REQUEST);
      await refused(a.acquire("k2", 15 * 60 * 1000 + 1), 400, m.Refusal.BAD_REQUEST);
      await refused(a.acquire("k2", 0, 101), 400, m.Refusal.BAD_REQUEST);
      await refused(a.acquire("x".repeat(4097), 0), 413, m.Refusal.TOO_LARGE);
      await refused(locks(context, { sessionToken: "another" }).acquire("k3", 0), 403, m.Refusal.FORBIDDEN);
      await refused(locks({ awsRequestId: "never-ran" }).acquire("k3", 0), 403, m.Refusal.NOT_IN_FLIGHT);
      api.end(context.awsRequestId);
      await refused(a.held(), 403, m.Refusal.NOT_IN_FLIGHT);
      const many = invocation();
      for (let i = 0; i < 100; i++) await locks(many).acquire(`many-${flavour}-${i}`, 0);
      await refused(locks(many).acquire("one-more", 0), 429, m.Refusal.TOO_MANY_LOCKS);
    });

    test("an extension without AWS_SESSION_TOKEN answers unavailable", async () => {
      const off = await new StandIn(undefined).start();
      try {
        off.begin("r");
        await assert.rejects(
          new m.Locks({ awsRequestId: "r" }, { runtimeApi: off.runtimeApi, sessionToken: "t" }).acquire("k", 0),
          (e) => e.error === m.Refusal.UNAVAILABLE && e.status === 503,
        );
      } finally {
        await off.stop();
      }
    });

    test("no lock API: each way it is missing is NO_LOCK_API with the fix in the message", async () => {
      const fix = /AWS_LAMBDA_EXEC_WRAPPER=\/opt\/flightlock-wrapper/;
      // Lambda's own Runtime API (no wrapper in front): a 404 that is not the lock API's.
      const runtimeApi = createServer((req, res) => {
        res.writeHead(404, { "content-type": "text/plain" });
        res.end("404 page not found\n");
      });
      await new Promise((resolve) => runtimeApi.listen(0, "127.0.0.1", resolve));
      const port = runtimeApi.address().port;
      try {
        await assert.rejects(
          new m.Locks({ awsRequestId: "r" }, { runtimeApi: `127.0.0.1:${port}`, sessionToken: "t" }).acquire("k", 0),
          (e) => e instanceof m.LockApiError && e.error === m.NO_LOCK_API && e.status === 404 && fix.test(e.message),
        );
      } finally {
        await new Promise((resolve) => runtimeApi.close(resolve));
      }
      // Nothing listens (the port was just closed).
      await assert.rejects(
        new m.Locks({ awsRequestId: "r" }, { runtimeApi: `http://127.0.0.1:${port}`, sessionToken: "t" }).acquire("k", 0),
        (e) => e.error === m.NO_LOCK_API && e.status === 0 && fix.test(e.message),
      );
      // No AWS_SESSION_TOKEN in the handler's environment.
      assert.throws(
        () => new m.Locks({ awsRequestId: "r" }, { runtimeApi: api.runtimeApi, sessionToken: "" }),
        (e) => e.error === m.NO_LOCK_API && /neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN is set/.test(e.message),
      );
      assert.throws(() => new m.Locks({}, { runtimeApi: api.runtimeApi, sessionToken: "t" }), /awsRequestId/);
    });

    test("the Refusal words are frozen", () => {
      assert.ok(Object.isFrozen(m.Refusal));
      assert.equal(m.NO_LOCK_API, "noLockApi");
      assert.ok(!Object.values(m.Refusal).includes(m.NO_LOCK_API));
    });
  });
}
