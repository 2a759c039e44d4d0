// A Node.js handler for the end-to-end tests, run by the npm runtime interface client
// aws-lambda-ric (as Lambda's managed Node.js runtime runs handlers). It behaves like
// functions/demo-python/handler.py: the same event fields and the same record lines.
//   {"seq": N, "sleepMs": MS}   work for MS ms, answer {"ok":true,...}
//   {"mode": "error"}           throw (an invocation error)
//   {"mode": "crash"}           exit the process in the middle of the invocation
//   {"mode": "context"}         answer the fencing token flightlock handed over and the whole
//                               client context: {"ticket":"42","requestId":...,"clientContext":...}
import { appendFileSync } from "node:fs";

function record(what, context, event) {
  const path = process.env.DEMO_RECORD_FILE;
  if (!path) return;
  // Epoch nanoseconds as an exact integer (a double would round it).
  const ns = (BigInt(Date.now()) * 1000000n).toString();
  const seq = Number.isInteger(event?.seq) ? event.seq : null;
  const line = `{"what":${JSON.stringify(what)},"requestId":${JSON.stringify(context.awsRequestId)},"seq":${seq},"env":${JSON.stringify(process.env.DEMO_ENV_NAME ?? "")},"ns":${ns}}\n`;
  // One short append (O_APPEND): lines of concurrent writers never interleave.
  appendFileSync(path, line);
}

export const handler = async (event, context) => {
  record("start", context, event);
  await new Promise((resolve) => setTimeout(resolve, event?.sleepMs ?? 0));
  if (event?.mode === "crash") process.exit(3);
  record("end", context, event);
  if (event?.mode === "context") {
    // The one line a handler needs: its fencing token, handed over by the flightlock layer.
    const ticket = context.clientContext?.custom?.flightlockTicket ?? null;
    return { ticket, requestId: context.awsRequestId, clientContext: context.clientContext ?? null };
  }
  if (event?.mode === "error") throw new Error("demo failure requested by the event");
  return { ok: true, requestId: context.awsRequestId, seq: event?.seq ?? null };
};
