// An SQS FIFO consumer on Powertools' batch utility, a lock per message group
// (FLIGHTLOCK_GATE=off, ReportBatchItemFailures). The function's handler: <this file>.handler.
// "flightlock" comes from the layer; @aws-lambda-powertools/batch from the function's package.
import { SqsFifoPartialProcessorAsync, processPartialResponse } from "@aws-lambda-powertools/batch";
import { lockPerRecord } from "flightlock/powertools";

// Your work on one record, under the lock of its message group: the whole SQS record
// (`messageId` is SQS's idempotency key, `body` the message) and the fencing token, to pass to
// what you write so a writer whose lock was lost is refused there.
export async function processRecord(record, token, context) {}

export function consumer(work) {
  const processor = new SqsFifoPartialProcessorAsync();
  const recordHandler = lockPerRecord(work); // key: record.attributes.MessageGroupId
  return (event, context) =>
    processPartialResponse(event, recordHandler, processor, { context, skipGroupOnError: true });
}

export const handler = consumer(processRecord);
