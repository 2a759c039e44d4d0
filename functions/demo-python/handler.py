"""A small single-flight demo job for the flightlock layer, also used by the end-to-end tests.

Run it with any Python managed runtime (or awslambdaric) and the flightlock layer:
AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper, FLIGHTLOCK_TABLE=<lock table>.

The event selects a behaviour (all fields optional):
  {"sleepMs": 500}             work for 500 ms, then answer {"ok": true, ...}
  {"mode": "error"}            raise an exception (an invocation error)
  {"mode": "crash"}            exit the process in the middle of the invocation
  {"mode": "timeout"}          sleep far past any function timeout
  {"mode": "big", "size": N}   answer a string of N bytes
  {"mode": "context"}          answer the fencing token flightlock handed over and the whole
                               client context: {"ticket": "42", "requestId": ..., "clientContext": ...}
  {"holdFile": PATH}           after starting, work until PATH exists (at most 120 s): a test
                               decides when the run ends, so nothing depends on timing
  {"firstMode": M, "firstMarker": PATH}
                               the first delivery (PATH absent: it is created) behaves as
                               {"mode": M}, every later one with the same event as usual: a
                               transient failure that the retry of the same event gets past
If DEMO_RECORD_FILE is set, one JSON line per start and end of the handler is appended to it,
so a test can check that no two runs overlapped.
"""

import json
import os
import time

PATTERN = "abcdefghijklmnopqrstuvwxyz0123456789"


def _record(what, context, event):
    path = os.environ.get("DEMO_RECORD_FILE")
    if not path:
        return
    line = json.dumps(
        {
            "what": what,
            "requestId": context.aws_request_id,
            "seq": event.get("seq") if isinstance(event, dict) else None,
            "env": os.environ.get("DEMO_ENV_NAME", ""),
            "ns": time.time_ns(),
        }
    )
    # One write of a short line with O_APPEND: lines of concurrent writers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _lock_context(context):
    cc = context.client_context
    # The one line a handler needs: its fencing token, handed over by the flightlock layer.
    ticket = cc.custom.get("flightlockTicket") if cc and cc.custom else None
    client = None
    if cc and cc.client is not None:
        client = {name: getattr(cc.client, name) for name in cc.client.__slots__}
    return {
        "ticket": ticket,
        "requestId": context.aws_request_id,
        "clientContext": None
        if cc is None
        else {"custom": cc.custom, "env": cc.env, "client": client},
    }


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    _record("start", context, event)
    mode = event.get("mode", "ok")
    marker = event.get("firstMarker")
    if marker:
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            mode = event.get("firstMode", mode)
        except FileExistsError:
            pass
    hold = event.get("holdFile")
    if hold:
        until = time.monotonic() + 120
        while not os.path.exists(hold) and time.monotonic() < until:
            time.sleep(0.02)
    time.sleep(int(event.get("sleepMs", 0)) / 1000.0)
    if mode == "crash":
        os._exit(3)
    if mode == "timeout":
        time.sleep(3600)
    if mode == "error":
        _record("end", context, event)
        raise RuntimeError("demo failure requested by the event")
    if mode == "context":
        _record("end", context, event)
        return _lock_context(context)
    if mode == "big":
        size = int(event.get("size", 0))
        body = (PATTERN * (size // len(PATTERN) + 1))[:size]
        _record("end", context, event)
        return body
    _record("end", context, event)
    return {"ok": True, "requestId": context.aws_request_id, "seq": event.get("seq")}
