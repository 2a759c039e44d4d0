// An SQS batch handler with a lock per entity (FLIGHTLOCK_GATE=off, ReportBatchItemFailures).
import { Locks } from "flightlock"; // the layer carries it (/opt/nodejs/node_modules)

// Your work on one record, under its entity's lock. Pass `token` (the fencing token) to what
// you write, so a writer whose lock was lost is refused there.
export async function process(body, token) {}

export async function handleBatch(event, context, process, waitMs = 0) {
  const locks = new Locks(context);
  const failures = [];
  const blocked = new Set(); // entities with a record failed in this batch: their later records wait too
  for (const record of event.Records) {
    let entity = null;
    try {
      const body = JSON.parse(record.body);
      entity = body.entity;
      const token = blocked.has(entity) ? null : await locks.acquire(entity, waitMs);
      if (token !== null) {
        await process(body, token);
        await locks.release(entity);
        continue;
      }
    } catch (e) { // an unreadable body, a failed record, a refused call
      console.log(`record ${record.messageId} failed: ${e}`);
    }
    blocked.add(entity);
    failures.push({ itemIdentifier: record.messageId });
  }
  return { batchItemFailures: failures };
}

export const handler = (event, context) => handleBatch(event, context, process);
