// Types of flightlock (index.mjs for `import`, index.cjs for `require`; index.d.cts is this file
// for `require`, kept identical by scripts/check-client-node).

/** The lock API's refusal words: the `error` of a refused call. */
export declare const Refusal: {
  readonly BAD_REQUEST: "badRequest";
  readonly UNAUTHORIZED: "unauthorized";
  readonly FORBIDDEN: "forbidden";
  readonly NOT_IN_FLIGHT: "notInFlight";
  readonly NOT_YOUR_INVOCATION: "notYourInvocation";
  readonly NOT_FOUND: "notFound";
  readonly NOT_HELD: "notHeld";
  readonly METHOD_NOT_ALLOWED: "methodNotAllowed";
  readonly BUSY: "busy";
  readonly ALREADY_HELD: "alreadyHeld";
  readonly HELD_BY_GATE: "heldByGate";
  readonly PERMITS_MISMATCH: "permitsMismatch";
  readonly PROTOCOL_TOO_NEW: "protocolTooNew";
  readonly LOST: "lost";
  readonly TOO_LARGE: "tooLarge";
  readonly TOO_MANY_LOCKS: "tooManyLocks";
  readonly LOCK_ERROR: "lockError";
  readonly UNAVAILABLE: "unavailable";
  readonly NO_DECISION: "noDecision";
};
/** One of the lock API's refusal words. */
export type RefusalWord = (typeof Refusal)[keyof typeof Refusal];

/** This client's word when nothing that speaks the lock API answered (no layer, no wrapper). */
export declare const NO_LOCK_API: "noLockApi";

/** Who holds a busy key (the `holders` of a `busy` refusal). */
export interface Holder {
  ticket?: number;
  function?: string;
  host?: string;
  [more: string]: unknown;
}

/** A refused call: `error` is the API's word (or NO_LOCK_API), the message says why. */
export declare class LockApiError extends Error {
  constructor(status: number, error: string, message: string, holders?: Holder[]);
  /** The HTTP status (0: no answer at all). */
  readonly status: number;
  readonly error: RefusalWord | typeof NO_LOCK_API | (string & {});
  /** Who held the key, for a `busy` refusal. */
  readonly holders: Holder[] | undefined;
}

/** What the handler's context must have: Lambda's `context`. */
export interface InvocationContext {
  awsRequestId: string;
}

/** Where the lock API is; by default from Lambda's environment. */
export interface LockApiOptions {
  /** host:port (default: AWS_LAMBDA_RUNTIME_API, which the wrapper points at the extension). */
  runtimeApi?: string;
  /** The X-Flightlock-Token header's value (default: AWS_SESSION_TOKEN, else AWS_CONTAINER_AUTHORIZATION_TOKEN). */
  sessionToken?: string;
}

/** A lock held by this invocation (`Locks.held()`). */
export interface HeldInfo {
  key: string;
  token: number;
  permits: number;
  lost: boolean;
}

/**
 * A lock this invocation holds; `release()` or `await using` frees it. `Symbol.asyncDispose` is
 * declared by TypeScript's `esnext.disposable` lib (5.2+) or by `@types/node` 20+.
 */
export declare class HeldLock {
  readonly key: string;
  /** The fencing token. */
  readonly token: number;
  /** Releases the key (once; later calls do nothing). */
  release(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** The lock API of one invocation. */
export declare class Locks {
  constructor(context: InvocationContext, options?: LockApiOptions);
  /** The fencing token of `key`, or null if it stayed busy for `waitMs` (default FLIGHTLOCK_WAIT). */
  acquire(key: string, waitMs?: number, permits?: number): Promise<number | null>;
  /** Releases `key` now (the invocation's end releases it anyway). */
  release(key: string): Promise<void>;
  /** What this invocation holds. */
  held(): Promise<HeldInfo[]>;
  /** The lock of `key` as a HeldLock, or null if it stayed busy. */
  lock(key: string, waitMs?: number, permits?: number): Promise<HeldLock | null>;
  /** Runs `fn(token)` under the lock of `key`, released however fn ends; busy: LockApiError `busy`. */
  withLock<T>(key: string, fn: (token: number) => T | Promise<T>, waitMs?: number, permits?: number): Promise<T>;
}
