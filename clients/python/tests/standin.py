"""A stand-in for the extension's lock API, for the client's unit tests: an HTTP server on
127.0.0.1 that answers as extension/src/lock_api.rs does and refuses what it refuses. Each rule
names the function of lock_api.rs it follows. Locks live in memory; the DynamoDB protocol behind
them is the extension's business (its own tests and the end-to-end tests run it).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH_PREFIX = "/flightlock/v1/"  # lock_api.rs PATH_PREFIX
TOKEN_HEADER = "x-flightlock-token"  # lock_api.rs TOKEN_HEADER (HTTP headers ignore case)
MAX_BODY = 4096  # lock_api.rs MAX_BODY
MAX_WAIT_MS = 15 * 60 * 1000  # lock_api.rs MAX_WAIT_MS
MAX_HELD = 100  # flightlock_lambda::records::MAX_HELD
MAX_PERMITS = 100  # flightlock::MAX_PERMITS
MAX_KEY_BYTES = 1024  # flightlock::schema::validate_key


class Refused(Exception):
    def __init__(self, status: int, error: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.extra = status, error, message, extra


@dataclass
class Held:
    invocation: str
    token: int
    permits: int
    lost: bool = False


@dataclass
class StandIn:
    """The state behind the server: the session token (None: the extension has none), the
    invocations in flight, who holds which key, and each key's last token."""

    # What callers must send: the extension's AWS_SESSION_TOKEN, else (SnapStart)
    # AWS_CONTAINER_AUTHORIZATION_TOKEN (extension/src/config.rs api_token).
    session_token: str | None = "session-token"
    default_wait_ms: int = 0
    in_flight: set[str] = field(default_factory=set)
    holders: dict[str, list[Held]] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def start(self, request_id: str) -> None:
        with self.cond:
            self.in_flight.add(request_id)

    def end(self, request_id: str) -> None:
        """The invocation ended: its locks are released (lock_api.rs: every lock ends with its
        invocation)."""
        with self.cond:
            self.in_flight.discard(request_id)
            for key in list(self.holders):
                self.holders[key] = [h for h in self.holders[key] if h.invocation != request_id]
            self.cond.notify_all()

    def lose(self, key: str) -> None:
        """Every holder of `key` loses it (its lease ran out)."""
        with self.cond:
            for h in self.holders.get(key, []):
                h.lost = True

    def held_by(self, key: str) -> list[str]:
        with self.cond:
            return [h.invocation for h in self.holders.get(key, []) if not h.lost]

    # --- lock_api.rs route() ------------------------------------------------------------------
    def route(self, method: str, path: str) -> tuple[str, str]:
        rest = path[len(PATH_PREFIX) :]
        parts = rest.split("/")
        not_found = Refused(404, "notFound", f"no such call: {path}")
        if len(parts) != 3 or parts[0] != "invocations" or not parts[1]:
            raise not_found
        _, request_id, op = parts
        allowed = {"acquire": "POST", "release": "POST", "locks": "GET"}
        if op not in allowed:
            raise not_found
        if method != allowed[op]:
            raise Refused(405, "methodNotAllowed", f"{method} is not allowed here")
        return request_id, op

    # --- lock_api.rs authorize() --------------------------------------------------------------
    def authorize(self, sent: str | None) -> None:
        if self.session_token is None:
            raise Refused(503, "unavailable", "the lock API is off: AWS_SESSION_TOKEN is not set")
        if sent is None:
            raise Refused(401, "unauthorized", f"send the header {TOKEN_HEADER}")
        if sent != self.session_token:
            raise Refused(403, "forbidden", f"{TOKEN_HEADER} is not this environment's AWS_SESSION_TOKEN")

    def check_in_flight(self, request_id: str) -> None:
        if request_id not in self.in_flight:
            raise Refused(403, "notInFlight", f"invocation {request_id!r} is not in flight")

    # --- lock_api.rs parse_acquire() / parse_release() (serde deny_unknown_fields) ------------
    @staticmethod
    def parse(raw: bytes, fields: dict[str, type]) -> dict[str, Any]:
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise Refused(400, "badRequest", f"the body is not what this call takes ({e})") from None
        if not isinstance(body, dict) or "key" not in body:
            raise Refused(400, "badRequest", "the body is not what this call takes (missing key)")
        for name, value in body.items():
            kind = fields.get(name)
            if kind is None:
                raise Refused(400, "badRequest", f"unknown field `{name}`")
            # serde: waitMs and permits are unsigned integers (or null); key is a string.
            ok = (
                isinstance(value, str)
                if kind is str
                else (
                    value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
                )
            )
            if not ok:
                raise Refused(400, "badRequest", f"invalid type for `{name}`")
        key = body["key"]
        if not 1 <= len(key.encode()) <= MAX_KEY_BYTES:
            raise Refused(400, "badRequest", "a lock key is 1 to 1024 bytes")
        return body

    def acquire(self, request_id: str, raw: bytes) -> dict[str, Any]:
        body = self.parse(raw, {"key": str, "waitMs": int, "permits": int})
        key, wait_ms, permits = body["key"], body.get("waitMs"), body.get("permits")
        if wait_ms is not None and wait_ms > MAX_WAIT_MS:
            raise Refused(400, "badRequest", f"waitMs {wait_ms} is longer than any invocation")
        if permits is not None and not 1 <= permits <= MAX_PERMITS:
            raise Refused(400, "badRequest", f"permits {permits} is out of range (1 to 100)")
        permits = permits or 1
        wait = (self.default_wait_ms if wait_ms is None else wait_ms) / 1000
        started = time.monotonic()
        with self.cond:
            mine = [k for k, hs in self.holders.items() for h in hs if h.invocation == request_id]
            if key in mine:
                raise Refused(409, "alreadyHeld", f"invocation {request_id} holds {key} already")
            if len(mine) >= MAX_HELD:
                raise Refused(429, "tooManyLocks", "the invocation holds 100 locks")
            holders = self.holders.setdefault(key, [])
            if holders and holders[0].permits != permits:
                raise Refused(409, "permitsMismatch", f"{key} allows {holders[0].permits} holders")
            while len([h for h in holders if not h.lost]) >= permits:
                left = wait - (time.monotonic() - started)
                if left <= 0:
                    raise Refused(
                        409,
                        "busy",
                        f"{key} is held",
                        # Who holds it, never which invocation (lock_api.rs refusal()).
                        holders=[{"ticket": h.token, "function": "fn", "host": "h"} for h in holders],
                    )
                self.cond.wait(left)
                holders = self.holders.setdefault(key, [])
            self.check_in_flight(request_id)  # it may have ended while waiting
            self.holders[key] = [h for h in holders if not h.lost]
            token = self.tokens.get(key, 0) + 1
            self.tokens[key] = token
            self.holders[key].append(Held(request_id, token, permits))
        waited = int((time.monotonic() - started) * 1000)
        return {"key": key, "token": token, "waitedMs": waited, "permits": permits}

    def release(self, request_id: str, raw: bytes) -> dict[str, Any]:
        key = self.parse(raw, {"key": str})["key"]
        with self.cond:
            holders = self.holders.get(key, [])
            mine = [h for h in holders if h.invocation == request_id]
            if not mine:
                raise Refused(404, "notHeld", f"invocation {request_id} does not hold {key}")
            self.holders[key] = [h for h in holders if h.invocation != request_id]
            self.cond.notify_all()
            if mine[0].lost:
                raise Refused(409, "lost", f"{key} was lost before its release")
        return {"key": key, "released": True}

    def list(self, request_id: str) -> dict[str, Any]:
        with self.cond:
            return {
                "locks": [
                    {"key": k, "token": h.token, "permits": h.permits, "lost": h.lost}
                    for k, hs in self.holders.items()
                    for h in hs
                    if h.invocation == request_id
                ]
            }

    def answer(
        self, method: str, path: str, token: str | None, raw: bytes | None
    ) -> tuple[int, dict[str, Any]]:
        try:
            request_id, op = self.route(method, path)
            self.calls.append((op, request_id))
            self.authorize(token)
            self.check_in_flight(request_id)
            if raw is not None and len(raw) > MAX_BODY:
                raise Refused(413, "tooLarge", f"the body is over {MAX_BODY} bytes")
            if op == "acquire":
                return 200, self.acquire(request_id, raw or b"")
            if op == "release":
                return 200, self.release(request_id, raw or b"")
            return 200, self.list(request_id)
        except Refused as r:
            return r.status, {"error": r.error, "message": r.message, **r.extra}


def serve(state: StandIn) -> tuple[ThreadingHTTPServer, str]:
    """Starts a server for `state` on a free port of 127.0.0.1; returns it and its host:port."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            if not self.path.startswith(PATH_PREFIX):
                # Not the lock API: the proxy passes it on to the Runtime API (lock_api.rs route()).
                self.send_error(404, "not a lock API path")
                return
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if method == "POST" else None
            status, body = state.answer(method, self.path, self.headers.get(TOKEN_HEADER), raw)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    host, port = server.server_address[:2]
    return server, f"{host}:{port}"
