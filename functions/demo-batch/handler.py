"""The demo's batch consumer (scripts/demo, the batch part): an SQS FIFO consumer on Powertools
for AWS Lambda, with a flightlock lock per message group. `flightlock` comes from the layer
(/opt/python/flightlock); aws_lambda_powertools is the function's own dependency, installed
beside this file as for Lambda. Run with FLIGHTLOCK_GATE=off: the locks are per record.

Each record body is {"seq": N}, N counting the messages of its group from 0. Under the group's
lock the record handler reads the group's progress (LAMBDA_TASK_ROOT/progress/<group>: the last
seq done): the next seq is worked on; a seq already done is a redelivery, with nothing to do;
any later one is not its turn yet and fails, to come back. A busy group fails too (LockBusy):
Powertools reports it in batchItemFailures, and with skip_group_on_error the rest of that group
in the batch fails with it, so a group's messages never overtake each other. One JSON line per
message done (or not its turn) goes to LAMBDA_TASK_ROOT/timeline.jsonl.
"""

import json
import os
import time

from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from flightlock.powertools import locked

processor = SqsFifoPartialProcessor(skip_group_on_error=True)
ROOT = os.environ["LAMBDA_TASK_ROOT"]
WORK_SECONDS = 0.15


@locked  # the lock key: the record's MessageGroupId
def record_handler(record, token):
    group = record.attributes.message_group_id
    seq = json.loads(record.body)["seq"]
    progress = os.path.join(ROOT, "progress", group)
    last = int(open(progress).read()) if os.path.exists(progress) else -1
    if seq <= last:
        return  # delivered again after it was done: nothing to do
    seen = {"messageId": record.message_id, "group": group, "seq": seq, "token": token}
    if seq != last + 1:
        _timeline({"what": "early", **seen})
        raise RuntimeError(f"{group}: message {seq} is not its turn ({last + 1} is)")
    start = time.time()
    time.sleep(WORK_SECONDS)  # the work, under the group's lock
    with open(progress, "w") as f:
        f.write(str(seq))
    _timeline({"what": "done", **seen, "start": start, "end": time.time()})


def _timeline(line):
    # One short O_APPEND write: lines of concurrent environments never interleave.
    fd = os.open(os.path.join(ROOT, "timeline.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def handler(event, context):
    return process_partial_response(event, record_handler, processor, context)
