"""Per-record locks through the flightlock layer's lock API: Python standard library only.

    from flightlock_locks import Locks
    locks = Locks(context)                    # the handler's context: its request id
    token = locks.acquire("order-7", wait_ms=0)
    if token is None: ...                     # busy: another invocation holds it
    locks.release("order-7")

Any other refusal raises LockApiError (its .error is the API's one word, its message says why).
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

# No proxy, whatever HTTP_PROXY says: the API is on this machine, and the token stays here.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LockApiError(Exception):
    """A call the lock API refused: .status (HTTP), .error (one word), the message."""

    def __init__(self, status, error, message):
        super().__init__(f"flightlock lock API: {status} {error}: {message}")
        self.status = status
        self.error = error


class Locks:
    """The locks of one invocation (the one whose context is given)."""

    def __init__(self, context):
        request_id = urllib.parse.quote(context.aws_request_id, safe="")
        self._base = (
            f"http://{os.environ['AWS_LAMBDA_RUNTIME_API']}"
            f"/flightlock/v1/invocations/{request_id}/"
        )
        self._token = os.environ.get("AWS_SESSION_TOKEN", "")

    def _call(self, call, body=None):
        request = urllib.request.Request(
            self._base + call,
            data=None if body is None else json.dumps(body).encode(),
            method="GET" if body is None else "POST",
            headers={"X-Flightlock-Token": self._token, "Content-Type": "application/json"},
        )
        try:
            with _OPENER.open(request) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            try:
                answer = json.load(e)
            except ValueError:
                answer = {}
            raise LockApiError(
                e.code, answer.get("error", "http"), answer.get("message", e.reason)
            ) from None

    def acquire(self, key, wait_ms=None):
        """The lock of `key`: its fencing token, or None if it stayed busy for `wait_ms`
        (None: FLIGHTLOCK_WAIT)."""
        body = {"key": key}
        if wait_ms is not None:
            body["waitMs"] = wait_ms
        try:
            return self._call("acquire", body)["token"]
        except LockApiError as e:
            if e.error == "busy":
                return None
            raise

    def release(self, key):
        """Releases `key` now (the invocation's end releases it anyway)."""
        self._call("release", {"key": key})

    def held(self):
        """What this invocation holds: [{"key", "token", "permits", "lost"}]."""
        return self._call("locks")["locks"]
