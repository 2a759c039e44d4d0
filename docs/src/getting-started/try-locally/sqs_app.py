"""An SQS batch handler for `scripts/try-local --event events/sqs-fifo.json` (FLIGHTLOCK_GATE=off):
one lock per order through the layer's lock API, wait 0; a record whose order is busy is
reported failed, so SQS delivers it again, and so are the later records of that order in the
batch, to keep their order."""

import json
import time

from flightlock import Locks  # from the layer: /opt/python/flightlock


def handler(event, context):
    locks = Locks(context)
    failures, blocked = [], set()
    for record in event["Records"]:
        order = json.loads(record["body"])["orderId"]
        token = None if order in blocked else locks.acquire(order, 0)
        if token is None:
            blocked.add(order)
            failures.append({"itemIdentifier": record["messageId"]})
            print(f"busy {order}: {record['messageId']} goes back to the queue")
            continue
        time.sleep(0.3)  # the work, under the order's lock
        print(f"done {order}: {record['messageId']} with token {token}")
        locks.release(order)
    return {"batchItemFailures": failures}
