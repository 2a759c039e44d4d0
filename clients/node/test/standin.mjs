// A stand-in of the extension's lock API on 127.0.0.1, for the client's unit tests. It refuses
// what extension/src/lock_api.rs refuses, in the same order, with the same statuses and words:
// the routes (route()), the token (authorize()), the invocation in flight (in_flight()), the body
// (read_body(): 4096 bytes; parse_acquire()/parse_release(): unknown fields, key 1..=1024 bytes,
// waitMs <= 15 min, permits 1..=100), and the invocation's locks (lambda/src/records.rs: not
// reentrant, at most 100, busy with holders, notHeld). Locks are in memory (one table of keys);
// what DynamoDB decides is tested elsewhere against DynamoDB Local. It stands for a standard
// environment with FLIGHTLOCK_GATE=off, so the gate's own key (heldByGate) and another runtime
// process's invocation on Managed Instances (notYourInvocation) never arise. Paths outside
// /flightlock/v1/ answer as a Runtime API without the proxy would: a 404 that is not JSON.
import { createServer } from "node:http";

const PREFIX = "/flightlock/v1/";
const MAX_BODY = 4096;
const MAX_WAIT_MS = 15 * 60 * 1000;
const MAX_HELD = 100;
const MAX_PERMITS = 100;

export class StandIn {
  // `sessionToken`: what callers must send (undefined: the extension has none, every call 503).
  constructor(sessionToken) {
    this.sessionToken = sessionToken;
    this.inFlight = new Map(); // request id -> Set of keys it holds or is acquiring
    this.holders = new Map(); // key -> { requestId, ticket }
    this.tickets = new Map(); // key -> last ticket
    this.calls = [];
    this.server = createServer((req, res) => this.serve(req, res));
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.runtimeApi = `127.0.0.1:${this.server.address().port}`;
    return this;
  }

  async stop() {
    this.server.closeAllConnections?.();
    await new Promise((resolve) => this.server.close(resolve));
  }

  /** An invocation starts: its locks may be taken. */
  begin(requestId) {
    this.inFlight.set(requestId, new Set());
  }

  /** An invocation ends: what it still holds is released. */
  end(requestId) {
    for (const key of this.inFlight.get(requestId) ?? []) this.holders.delete(key);
    this.inFlight.delete(requestId);
  }

  serve(req, res) {
    const path = req.url.split("?")[0];
    this.calls.push({ method: req.method, path });
    const answer = (status, body) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    const refuse = (status, error, message, extra = {}) => answer(status, { error, message, ...extra });
    if (!path.startsWith(PREFIX)) {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("404 page not found\n");
      return;
    }
    const parts = path.slice(PREFIX.length).split("/");
    const notFound = () => refuse(404, "notFound", `no such call: ${path}`);
    if (parts.length !== 3 || parts[0] !== "invocations" || parts[1] === "") return notFound();
    const [, rawId, op] = parts;
    const allowed = { acquire: "POST", release: "POST", locks: "GET" }[op];
    if (allowed === undefined) return notFound();
    if (req.method !== allowed) {
      return refuse(405, "methodNotAllowed", `${req.method} is not allowed here: acquire and release are POST, locks is GET`);
    }
    if (this.sessionToken === undefined) {
      return refuse(503, "unavailable", "the lock API is off: AWS_SESSION_TOKEN is not set in the extension's environment");
    }
    const sent = req.headers["x-flightlock-token"];
    if (sent === undefined) return refuse(401, "unauthorized", "send the header x-flightlock-token with the value of AWS_SESSION_TOKEN");
    if (sent !== this.sessionToken) return refuse(403, "forbidden", "x-flightlock-token is not this environment's AWS_SESSION_TOKEN");
    // The real route takes the id as it is in the path (Lambda's request ids need no escaping).
    const id = rawId;
    const mine = this.inFlight.get(id);
    if (mine === undefined) return refuse(403, "notInFlight", `invocation "${id}" is not in flight in this environment`);
    if (op === "locks") {
      const locks = [...mine].filter((k) => this.holders.get(k)?.requestId === id);
      return answer(200, {
        locks: locks.map((key) => ({ key, token: this.holders.get(key).ticket, permits: 1, lost: false })),
      });
    }
    const chunks = [];
    let size = 0;
    let tooLarge = false;
    req.on("data", (c) => {
      size += c.length;
      if (size > MAX_BODY) tooLarge = true;
      else chunks.push(c);
    });
    req.on("end", () => {
      if (tooLarge) return refuse(413, "tooLarge", `the body is over ${MAX_BODY} bytes`);
      let body;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch (e) {
        return refuse(400, "badRequest", `the body is not what this call takes (${e.message})`);
      }
      const fields = op === "acquire" ? ["key", "waitMs", "permits"] : ["key"];
      if (body === null || typeof body !== "object" || Array.isArray(body)) {
        return refuse(400, "badRequest", "the body is not what this call takes (not an object)");
      }
      const unknown = Object.keys(body).find((f) => !fields.includes(f));
      if (unknown !== undefined) return refuse(400, "badRequest", `the body is not what this call takes (unknown field \`${unknown}\`)`);
      if (typeof body.key !== "string") return refuse(400, "badRequest", "the body is not what this call takes (missing field `key`)");
      const bytes = Buffer.byteLength(body.key);
      if (bytes === 0 || bytes > 1024) return refuse(400, "badRequest", `invalid key: ${bytes} bytes (1 to 1024)`);
      const whole = (v, max) => v === undefined || v === null || (Number.isInteger(v) && v >= 0 && v <= max);
      if (op === "acquire") {
        if (!whole(body.waitMs, Number.MAX_SAFE_INTEGER) || !whole(body.permits, 2 ** 32 - 1)) {
          return refuse(400, "badRequest", "the body is not what this call takes (waitMs and permits are whole numbers)");
        }
        if (body.waitMs > MAX_WAIT_MS) return refuse(400, "badRequest", `waitMs ${body.waitMs} is longer than any invocation`);
        if (body.permits != null && (body.permits < 1 || body.permits > MAX_PERMITS)) {
          return refuse(400, "badRequest", `permits ${body.permits} is out of range (1 to ${MAX_PERMITS})`);
        }
        return this.acquire(id, mine, body.key, body.waitMs ?? 0, answer, refuse);
      }
      if (!mine.has(body.key) || this.holders.get(body.key)?.requestId !== id) {
        return refuse(404, "notHeld", `invocation ${id} does not hold ${body.key}`);
      }
      mine.delete(body.key);
      this.holders.delete(body.key);
      answer(200, { key: body.key, released: true });
    });
  }

  async acquire(id, mine, key, waitMs, answer, refuse) {
    if (mine.has(key)) return refuse(409, "alreadyHeld", `invocation ${id} holds or is acquiring ${key} already`);
    if (mine.size >= MAX_HELD) return refuse(429, "tooManyLocks", `invocation ${id} holds ${MAX_HELD} locks`);
    mine.add(key);
    const started = Date.now();
    while (this.holders.has(key) && Date.now() - started < waitMs) await new Promise((r) => setTimeout(r, 5));
    const holder = this.holders.get(key);
    if (holder !== undefined) {
      mine.delete(key);
      return refuse(409, "busy", `${key} is held`, { holders: [{ ticket: holder.ticket, function: "consumer", host: "standin:1" }] });
    }
    if (!this.inFlight.has(id)) return refuse(403, "notInFlight", `invocation "${id}" is not in flight in this environment`);
    const ticket = (this.tickets.get(key) ?? 0) + 1;
    this.tickets.set(key, ticket);
    this.holders.set(key, { requestId: id, ticket });
    answer(200, { key, token: ticket, waitedMs: Date.now() - started, permits: 1 });
  }
}
