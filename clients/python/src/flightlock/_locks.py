"""Per-record locks through the flightlock layer's lock API: Python standard library only.

    from flightlock import Locks
    locks = Locks(context)                    # the handler's context: its request id
    token = locks.acquire("order-7", wait_ms=0)
    if token is None: ...                     # busy: another invocation holds it
    locks.release("order-7")

    with locks.lock("order-7", wait_ms=0) as token:   # LockBusy if busy; released on exit
        ...

Any other refusal raises LockApiError (its .error is the API's one word, its message says why);
a lock API that is not there (no layer, no AWS_LAMBDA_EXEC_WRAPPER, neither AWS_SESSION_TOKEN
nor, under SnapStart, AWS_CONTAINER_AUTHORIZATION_TOKEN) raises LockApiUnavailable, whose message
names the fix.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, Protocol, TypedDict

# The refusal words: a refused call's body is {"error": <word>, "message": ...}
# (extension/src/lock_api.rs; the guide's table of refusals says when each is answered).
BAD_REQUEST: Final = "badRequest"
UNAUTHORIZED: Final = "unauthorized"
FORBIDDEN: Final = "forbidden"
NOT_IN_FLIGHT: Final = "notInFlight"
NOT_YOUR_INVOCATION: Final = "notYourInvocation"
NOT_FOUND: Final = "notFound"
NOT_HELD: Final = "notHeld"
METHOD_NOT_ALLOWED: Final = "methodNotAllowed"
BUSY: Final = "busy"
ALREADY_HELD: Final = "alreadyHeld"
HELD_BY_GATE: Final = "heldByGate"
PERMITS_MISMATCH: Final = "permitsMismatch"
PROTOCOL_TOO_NEW: Final = "protocolTooNew"
LOST: Final = "lost"
TOO_LARGE: Final = "tooLarge"
TOO_MANY_LOCKS: Final = "tooManyLocks"
LOCK_ERROR: Final = "lockError"
UNAVAILABLE: Final = "unavailable"
NO_DECISION: Final = "noDecision"
#: Every word the lock API answers.
REFUSALS: Final = frozenset(
    {
        BAD_REQUEST,
        UNAUTHORIZED,
        FORBIDDEN,
        NOT_IN_FLIGHT,
        NOT_YOUR_INVOCATION,
        NOT_FOUND,
        NOT_HELD,
        METHOD_NOT_ALLOWED,
        BUSY,
        ALREADY_HELD,
        HELD_BY_GATE,
        PERMITS_MISMATCH,
        PROTOCOL_TOO_NEW,
        LOST,
        TOO_LARGE,
        TOO_MANY_LOCKS,
        LOCK_ERROR,
        UNAVAILABLE,
        NO_DECISION,
    }
)
#: Not the API's: this client's word when there is no lock API to ask.
NOT_CONFIGURED: Final = "notConfigured"

TOKEN_HEADER: Final = "X-Flightlock-Token"
WRAPPER: Final = "/opt/flightlock-wrapper"
# Set by the wrapper for the runtime it starts (extension/layer/flightlock-wrapper): present
# only when the runtime talks to the proxy, however the wrapper was reached (directly through
# AWS_LAMBDA_EXEC_WRAPPER, or from another wrapper).
WRAPPED: Final = "_FLIGHTLOCK_RUNTIME_PID"

# No proxy, whatever HTTP_PROXY says: the API is on this machine, and the token stays here.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LockApiError(Exception):
    """A call the lock API refused: .status (HTTP), .error (one word), the message."""

    def __init__(self, status: int | None, error: str, message: str) -> None:
        super().__init__(f"flightlock lock API: {status or '-'} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


class LockBusy(LockApiError):
    """The key stayed held for the whole wait; .holders names who holds it."""

    def __init__(self, key: str, message: str, holders: list[Any]) -> None:
        super().__init__(409, BUSY, message)
        self.key = key
        self.holders = holders


class LockApiUnavailable(LockApiError):
    """There is no lock API to ask (the layer or its wrapper is not set up): the message says
    what to set."""


class HeldLock(TypedDict):
    """One lock an invocation holds."""

    key: str
    token: int
    permits: int
    lost: bool


class LambdaContext(Protocol):
    """What the client needs of the handler's context: its request id."""

    @property
    def aws_request_id(self) -> str: ...


class Locks:
    """The locks of one invocation (the one whose context is given).

    `environ` is the environment to read (default: os.environ); `timeout` bounds each call in
    seconds (default: none; the extension decides every acquisition before the deadline).
    """

    def __init__(
        self,
        context: LambdaContext,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        api = env.get("AWS_LAMBDA_RUNTIME_API")
        fix = f"attach the flightlock layer and set AWS_LAMBDA_EXEC_WRAPPER={WRAPPER} (docs: the lock API)"
        if not api:
            raise LockApiUnavailable(None, NOT_CONFIGURED, f"AWS_LAMBDA_RUNTIME_API is not set: {fix}")
        if not env.get(WRAPPED):
            raise LockApiUnavailable(
                None,
                NOT_CONFIGURED,
                f"this runtime was not started through {WRAPPER} (AWS_LAMBDA_EXEC_WRAPPER is "
                f"{env.get('AWS_LAMBDA_EXEC_WRAPPER')!r}), so it talks to Lambda, not to the "
                f"flightlock proxy: {fix}",
            )
        # The extension's secret: AWS_SESSION_TOKEN, or in a function restored from a SnapStart
        # snapshot (no session token there) the container credentials' token.
        token = env.get("AWS_SESSION_TOKEN") or env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
        if not token:
            raise LockApiUnavailable(
                None,
                NOT_CONFIGURED,
                "neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN is set, and every "
                "call must carry one (Lambda sets one; set AWS_SESSION_TOKEN when emulating Lambda "
                "locally, for the extension and the handler alike)",
            )
        if "://" not in api:
            api = "http://" + api  # Lambda hands it over as host:port
        request_id = urllib.parse.quote(context.aws_request_id, safe="")
        self._base = f"{api}/flightlock/v1/invocations/{request_id}/"
        self._token = token
        self._timeout = timeout

    def _call(self, call: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self._base + call,
            data=None if body is None else json.dumps(body).encode(),
            method="GET" if body is None else "POST",
            headers={TOKEN_HEADER: self._token, "Content-Type": "application/json"},
        )
        try:
            with _OPENER.open(request, timeout=self._timeout) as response:
                answer: dict[str, Any] = json.load(response)
                return answer
        except urllib.error.HTTPError as e:
            try:
                refused = json.load(e)
            except ValueError:
                refused = None
            if not isinstance(refused, dict) or "error" not in refused:
                raise LockApiUnavailable(
                    e.code,
                    NOT_CONFIGURED,
                    f"{self._base + call} answered {e.code} {e.reason} without a lock API body: "
                    f"AWS_LAMBDA_RUNTIME_API is not the flightlock proxy (set "
                    f"AWS_LAMBDA_EXEC_WRAPPER={WRAPPER}, and FLIGHTLOCK_GATE as the guide says)",
                ) from None
            error, message = str(refused["error"]), str(refused.get("message", e.reason))
            if error == BUSY:
                key = body.get("key", "") if body else ""
                raise LockBusy(key, message, list(refused.get("holders") or [])) from None
            if error == UNAVAILABLE:
                raise LockApiUnavailable(e.code, error, message) from None
            raise LockApiError(e.code, error, message) from None
        except urllib.error.URLError as e:
            raise LockApiUnavailable(
                None,
                NOT_CONFIGURED,
                f"no lock API at {self._base} ({e.reason}): is the flightlock layer attached "
                f"and AWS_LAMBDA_EXEC_WRAPPER={WRAPPER} set?",
            ) from None

    def acquire(self, key: str, wait_ms: int | None = None, *, permits: int | None = None) -> int | None:
        """The lock of `key`: its fencing token, or None if it stayed busy for `wait_ms`
        (None: FLIGHTLOCK_WAIT). `permits`: how many may hold it at once (None:
        FLIGHTLOCK_PERMITS)."""
        try:
            return self.acquire_or_raise(key, wait_ms, permits=permits)
        except LockBusy:
            return None

    def acquire_or_raise(self, key: str, wait_ms: int | None = None, *, permits: int | None = None) -> int:
        """As `acquire`, but a busy key raises LockBusy (with its holders)."""
        body: dict[str, Any] = {"key": key}
        if wait_ms is not None:
            body["waitMs"] = wait_ms
        if permits is not None:
            body["permits"] = permits
        token: int = self._call("acquire", body)["token"]
        return token

    def release(self, key: str) -> None:
        """Releases `key` now (the invocation's end releases it anyway). A lock lost before
        its release raises LockApiError with .error == LOST: the work under it was not protected."""
        self._call("release", {"key": key})

    def held(self) -> list[HeldLock]:
        """What this invocation holds."""
        locks: list[HeldLock] = self._call("locks")["locks"]
        return locks

    @contextmanager
    def lock(self, key: str, wait_ms: int | None = None, *, permits: int | None = None) -> Iterator[int]:
        """Holds `key` for the `with` block, giving its fencing token; releases it on the way
        out, whatever happens. A busy key raises LockBusy before the block runs."""
        token = self.acquire_or_raise(key, wait_ms, permits=permits)
        try:
            yield token
        except BaseException as failed:
            try:
                self.release(key)
            except LockApiError as e:
                # The block's own failure is the one to see; this one rides along (3.11+).
                add_note = getattr(failed, "add_note", None)
                if add_note is not None:
                    add_note(f"and its lock was not released: {e}")
            raise
        self.release(key)
