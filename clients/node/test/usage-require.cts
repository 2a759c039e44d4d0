// How a TypeScript handler uses flightlock: compiled by tsc --strict --noEmit
// (scripts/check-client-node) against the package's declarations, never run. The lines under
// each expect-error directive must stay errors: they prove the declarations are not `any`.
import { SqsFifoPartialProcessorAsync, processPartialResponse } from "@aws-lambda-powertools/batch";
import type { SQSRecord } from "aws-lambda";
import { HeldLock, LockApiError, Locks, NO_LOCK_API, Refusal, type RefusalWord } from "flightlock";
import { RecordBusyError, defaultKey, lockPerRecord } from "flightlock/powertools";

export async function perRecord(context: { awsRequestId: string }): Promise<number> {
  const locks = new Locks(context);
  const token: number | null = await locks.acquire("order-7", 0);
  if (token === null) return -1;
  await locks.release("order-7");
  // @ts-expect-error a key is a string
  await locks.acquire(7, 0);
  const held = await locks.held();
  const first: boolean = held[0].lost;
  const answer: string = await locks.withLock("order-8", async (t: number) => `token ${t}`, 200);
  {
    await using lock = await locks.lock("order-9", 0);
    if (lock !== null) {
      const l: HeldLock = lock;
      console.log(l.token + 1, first, answer);
    }
  }
  try {
    await locks.release("order-7");
  } catch (e) {
    if (e instanceof LockApiError && (e.error === Refusal.NOT_HELD || e.error === NO_LOCK_API)) return e.status;
    throw e;
  }
  const word: RefusalWord = Refusal.BUSY;
  // @ts-expect-error not a refusal word
  const notAWord: RefusalWord = "busyy";
  console.log(word, notAWord);
  return 0;
}

const processor = new SqsFifoPartialProcessorAsync();
const recordHandler = lockPerRecord(async (record: SQSRecord, token: number) => {
  const body: unknown = JSON.parse(record.body);
  return { body, token, group: defaultKey(record) };
});
// @ts-expect-error the handler's token is a number
lockPerRecord(async (_record: SQSRecord, token: string) => token);
lockPerRecord(async (record: SQSRecord) => record.messageId, { key: (record) => record.attributes.MessageGroupId ?? "none", waitMs: 0 });

export const handler = async (event: { Records: SQSRecord[] }, context: { awsRequestId: string }) =>
  processPartialResponse(event, recordHandler, processor, { context: context as never, skipGroupOnError: true });

export function busyKey(e: unknown): string | undefined {
  return e instanceof RecordBusyError ? e.key : undefined;
}
