"""A batch consumer for the end-to-end tests (tests/e2e/tests/e2e/records.rs), run by
awslambdaric: the SQS recipe's handler (docs/src/recipes/sqs/sqs_batch.py), copied beside this
file, with the client `flightlock` from the layer's /opt/python (clients/python/src/flightlock),
and a process() that records each record's interval. Event fields besides an SQS batch:
  record body {"entity", "seq", "sleepMs"}   work sleepMs (default 50) under the entity's lock
  record body {..., "holdFile": PATH}        work until PATH exists (at most 30 s)
  record body {..., "crash": true}           kill this runtime process mid-record
  {"keep": [KEYS]}                           take KEYS (wait 0) and never release them
  {"actAs": ID, "key": K}                    acquire K for invocation ID: answer the refusal
If DEMO_RECORD_FILE is set, one JSON line per record processed (and per start) is appended.
"""

import json
import os
import signal
import time

from flightlock import LockApiError, Locks
from sqs_batch import handle_batch


def _write(line):
    path = os.environ.get("DEMO_RECORD_FILE")
    if not path:
        return
    line["env"] = os.environ.get("DEMO_ENV_NAME", "")
    line["pid"] = os.getpid()
    # One write of a short line with O_APPEND: lines of concurrent writers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


class _Other:
    def __init__(self, request_id):
        self.aws_request_id = request_id


def handler(event, context):
    if "keep" in event:
        locks = Locks(context)
        tokens = {key: locks.acquire(key, 0) for key in event["keep"]}
        return {"requestId": context.aws_request_id, "tokens": tokens}
    if "actAs" in event:
        try:
            Locks(_Other(event["actAs"])).acquire(event["key"], 0)
            return {"refused": False}
        except LockApiError as e:
            return {"refused": True, "status": e.status, "error": e.error, "message": str(e)}

    def process(body, token):
        start = time.time_ns()
        seen = {"requestId": context.aws_request_id, "entity": body["entity"], "seq": body["seq"]}
        _write({"what": "start", "token": token, "ns": start, **seen})
        if body.get("crash"):
            _write({"what": "crashing", "ns": time.time_ns(), **seen})
            os.kill(os.getpid(), signal.SIGKILL)
        hold = body.get("holdFile")
        until = time.monotonic() + 30
        while hold and not os.path.exists(hold) and time.monotonic() < until:
            time.sleep(0.02)
        time.sleep(body.get("sleepMs", 50) / 1000)
        _write({"what": "record", "token": token, "start": start, "end": time.time_ns(), **seen})

    return handle_batch(event, context, process, event.get("waitMs", 0))
