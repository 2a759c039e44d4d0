"""The SQS recipe's FIFO consumer on Powertools for AWS Lambda
(docs/src/recipes/sqs/sqs_fifo_powertools.py, copied beside this file) for the end-to-end tests
(tests/e2e/tests/e2e/powertools.rs), run by awslambdaric: `flightlock` comes from the layer's
/opt/python, aws_lambda_powertools from the function's own dependencies (PYTHONPATH); nothing of
flightlock's is copied beside this file.

Each record body is {"seq": N, "sleepMs": M}, N counting the messages of its MessageGroupId from
0. Under the group's lock, the record handler reads the group's progress (E2E_STATE_DIR/<group>:
the last seq done): a seq already done is a redelivery of a done message (fine, nothing to do);
the next seq is worked on and recorded; any other seq would mean the group's order broke, which
is recorded and fails the record. E2E_SKIP_GROUP=1 makes the processor skip_group_on_error.
One JSON line per record handled goes to DEMO_RECORD_FILE.
"""

import json
import os
import time

import flightlock
from sqs_fifo_powertools import consumer


def _write(line):
    line |= {"env": os.environ.get("DEMO_ENV_NAME", ""), "client": flightlock.__file__}
    # One write of a short line with O_APPEND: lines of concurrent writers never interleave.
    fd = os.open(os.environ["DEMO_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def work(record, token):
    group = record.attributes.message_group_id
    body = json.loads(record.body)
    seq = body["seq"]
    state = os.path.join(os.environ["E2E_STATE_DIR"], group)
    last = int(open(state).read()) if os.path.exists(state) else -1
    seen = {"messageId": record.message_id, "group": group, "seq": seq, "token": token}
    if seq <= last:
        _write({"what": "redelivered", **seen})
        return
    if seq != last + 1:
        _write({"what": "outOfOrder", "last": last, **seen})
        raise RuntimeError(f"{group}: seq {seq} after {last}")
    start = time.time_ns()
    time.sleep(body.get("sleepMs", 20) / 1000)
    with open(state + ".tmp", "w") as f:
        f.write(str(seq))
    os.replace(state + ".tmp", state)
    _write({"what": "record", "start": start, "end": time.time_ns(), **seen})


_consume = consumer(work, skip_group_on_error=os.environ.get("E2E_SKIP_GROUP") == "1")


def handler(event, context):
    if not event.get("Records"):
        # The tests' warm-up (Lambda never sends an empty batch; Powertools refuses one).
        return {"batchItemFailures": []}
    return _consume(event, context)
