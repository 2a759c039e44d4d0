// flightlock: locks per record through the flightlock layer's lock API (Node.js 18+, global
// fetch, no dependencies). The same API as index.cjs, which `require("flightlock")` loads.
//
//   import { Locks } from "flightlock";
//   const locks = new Locks(context);          // the handler's context: its request id
//   const token = await locks.acquire("order-7", 0);
//   if (token === null) { ... }                // busy: another invocation holds it
//   await locks.release("order-7");
//
//   await locks.withLock("order-7", async (token) => { ... });   // released when fn returns
//   await using lock = await locks.lock("order-7", 0);           // TypeScript 5.2+ `using`
//
// Any other refusal throws LockApiError (its .error is the API's one word, its message says why).

/** The lock API's refusal words (the `error` of a refused call), and NO_LOCK_API, this client's. */
export const Refusal = Object.freeze({
  BAD_REQUEST: "badRequest",
  UNAUTHORIZED: "unauthorized",
  FORBIDDEN: "forbidden",
  NOT_IN_FLIGHT: "notInFlight",
  NOT_YOUR_INVOCATION: "notYourInvocation",
  NOT_FOUND: "notFound",
  NOT_HELD: "notHeld",
  METHOD_NOT_ALLOWED: "methodNotAllowed",
  BUSY: "busy",
  ALREADY_HELD: "alreadyHeld",
  HELD_BY_GATE: "heldByGate",
  PERMITS_MISMATCH: "permitsMismatch",
  PROTOCOL_TOO_NEW: "protocolTooNew",
  LOST: "lost",
  TOO_LARGE: "tooLarge",
  TOO_MANY_LOCKS: "tooManyLocks",
  LOCK_ERROR: "lockError",
  UNAVAILABLE: "unavailable",
  NO_DECISION: "noDecision",
});

/** Not a word of the API: nothing that speaks it answered (the layer or its wrapper is missing). */
export const NO_LOCK_API = "noLockApi";

const FIX =
  "attach the flightlock layer and set AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper " +
  "(docs: The lock API, Turning it on)";

export class LockApiError extends Error {
  constructor(status, error, message, holders) {
    super(`flightlock lock API: ${status} ${error}: ${message}`);
    this.name = "LockApiError";
    this.status = status;
    this.error = error;
    this.holders = holders;
  }
}

const asyncDispose = Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose");

/** A lock this invocation holds: its key and fencing token; `release()` or `await using` frees it. */
export class HeldLock {
  constructor(locks, key, token) {
    this.key = key;
    this.token = token;
    this.locks = locks;
    this.released = false;
  }

  async release() {
    if (this.released) return;
    this.released = true;
    await this.locks.release(this.key);
  }

  [asyncDispose]() {
    return this.release();
  }
}

export class Locks {
  // `options` overrides what Lambda's environment gives: `runtimeApi` (host:port of
  // AWS_LAMBDA_RUNTIME_API, which the wrapper points at the extension) and `sessionToken` (the
  // header's value: AWS_SESSION_TOKEN, or AWS_CONTAINER_AUTHORIZATION_TOKEN in a function
  // restored from a SnapStart snapshot, which has no session token; as the extension expects).
  constructor(context, options = {}) {
    const api = options.runtimeApi ?? process.env.AWS_LAMBDA_RUNTIME_API;
    const token =
      options.sessionToken ?? (process.env.AWS_SESSION_TOKEN || process.env.AWS_CONTAINER_AUTHORIZATION_TOKEN);
    if (!context || typeof context.awsRequestId !== "string" || context.awsRequestId === "") {
      throw new TypeError("flightlock: new Locks(context) needs the handler's context (its awsRequestId)");
    }
    if (!api) {
      throw new LockApiError(0, NO_LOCK_API, `AWS_LAMBDA_RUNTIME_API is not set: this is not a Lambda runtime; ${FIX}`);
    }
    if (!token) {
      throw new LockApiError(
        0,
        NO_LOCK_API,
        "neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN is set: the lock API " +
          "answers only callers that send one (Lambda sets it; set it when emulating Lambda locally)",
      );
    }
    const host = api.replace(/^https?:\/\//, "").replace(/\/+$/, "");
    this.base = `http://${host}/flightlock/v1/invocations/${encodeURIComponent(context.awsRequestId)}/`;
    this.token = token;
  }

  async call(call, body) {
    let response;
    try {
      response = await fetch(this.base + call, {
        method: body === undefined ? "GET" : "POST",
        headers: { "X-Flightlock-Token": this.token, "Content-Type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new LockApiError(0, NO_LOCK_API, `nothing answers at ${this.base} (${e.cause?.code ?? e.message}): ${FIX}`);
    }
    const text = await response.text();
    let answer;
    try {
      answer = JSON.parse(text);
    } catch {
      answer = undefined;
    }
    if (response.ok && answer && typeof answer === "object") return answer;
    if (answer && typeof answer.error === "string" && typeof answer.message === "string") {
      throw new LockApiError(response.status, answer.error, answer.message, answer.holders);
    }
    // Not the lock API's answer: Lambda's own Runtime API (no wrapper in front) or another server.
    const wrapper = process.env.AWS_LAMBDA_EXEC_WRAPPER;
    throw new LockApiError(
      response.status,
      NO_LOCK_API,
      `${this.base}${call} answered ${response.status} without a lock API body ` +
        `(AWS_LAMBDA_EXEC_WRAPPER is ${wrapper ? `"${wrapper}"` : "not set"}): ${FIX}`,
    );
  }

  // The lock of `key`: its fencing token, or null if it stayed busy for `waitMs`
  // (undefined: FLIGHTLOCK_WAIT). `permits`: how many may hold it at once (undefined:
  // FLIGHTLOCK_PERMITS).
  async acquire(key, waitMs, permits) {
    try {
      return (await this.call("acquire", { key, waitMs, permits })).token;
    } catch (e) {
      if (e instanceof LockApiError && e.error === Refusal.BUSY) return null;
      throw e;
    }
  }

  // Releases `key` now (the invocation's end releases it anyway).
  async release(key) {
    await this.call("release", { key });
  }

  // What this invocation holds: [{key, token, permits, lost}].
  async held() {
    return (await this.call("locks")).locks;
  }

  // The lock of `key` as a HeldLock (release() or `await using`), or null if busy.
  async lock(key, waitMs, permits) {
    const token = await this.acquire(key, waitMs, permits);
    return token === null ? null : new HeldLock(this, key, token);
  }

  // Runs `fn(token)` under the lock of `key` and releases it however fn ends; answers what fn
  // answers. Busy: throws LockApiError with error Refusal.BUSY, and fn does not run.
  async withLock(key, fn, waitMs, permits) {
    const answer = await this.call("acquire", { key, waitMs, permits });
    let value;
    try {
      value = await fn(answer.token);
    } catch (e) {
      await this.release(key).catch(() => {}); // fn's error is the one to see
      throw e;
    }
    await this.release(key);
    return value;
  }
}
