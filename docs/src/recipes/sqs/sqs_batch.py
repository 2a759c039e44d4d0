"""An SQS batch handler with a lock per entity (FLIGHTLOCK_GATE=off, ReportBatchItemFailures)."""

import json

from flightlock import Locks  # from the layer: /opt/python/flightlock


def process(body, token):
    """Your work on one record, under its entity's lock. Pass `token` (the fencing token) to
    what you write, so a writer whose lock was lost is refused there."""


def handle_batch(event, context, process, wait_ms=0):
    locks = Locks(context)
    failures = []
    blocked = set()  # entities with a record failed in this batch: their later records wait too
    for record in event["Records"]:
        entity = None
        try:
            body = json.loads(record["body"])
            entity = body["entity"]
            token = None if entity in blocked else locks.acquire(entity, wait_ms)
            if token is not None:
                process(body, token)
                locks.release(entity)
                continue
        except Exception as e:  # an unreadable body, a failed record, a refused call
            print(f"record {record['messageId']} failed: {e!r}")
        blocked.add(entity)
        failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}


def handler(event, context):
    return handle_batch(event, context, process)
