// Per-record locks through the flightlock layer's lock API: Node.js 18+ (global fetch), no
// package.
//
//   import { Locks } from "./flightlock_locks.mjs";
//   const locks = new Locks(context);          // the handler's context: its request id
//   const token = await locks.acquire("order-7", 0);
//   if (token === null) { ... }                // busy: another invocation holds it
//   await locks.release("order-7");
//
// Any other refusal throws LockApiError (its .error is the API's one word, its message says why).

export class LockApiError extends Error {
  constructor(status, error, message) {
    super(`flightlock lock API: ${status} ${error}: ${message}`);
    this.name = "LockApiError";
    this.status = status;
    this.error = error;
  }
}

export class Locks {
  constructor(context) {
    const id = encodeURIComponent(context.awsRequestId);
    this.base = `http://${process.env.AWS_LAMBDA_RUNTIME_API}/flightlock/v1/invocations/${id}/`;
    this.token = process.env.AWS_SESSION_TOKEN ?? "";
  }

  async call(call, body) {
    const response = await fetch(this.base + call, {
      method: body === undefined ? "GET" : "POST",
      headers: { "X-Flightlock-Token": this.token, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      throw new LockApiError(response.status, answer.error ?? "http", answer.message ?? response.statusText);
    }
    return answer;
  }

  // The lock of `key`: its fencing token, or null if it stayed busy for `waitMs`
  // (undefined: FLIGHTLOCK_WAIT).
  async acquire(key, waitMs) {
    try {
      return (await this.call("acquire", { key, waitMs })).token;
    } catch (e) {
      if (e instanceof LockApiError && e.error === "busy") return null;
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
}
