"""Fixtures: a stand-in lock API (standin.py) and the environment a handler sees under the layer."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from standin import StandIn, serve


@dataclass
class Context:
    """A Lambda context as the runtime hands it to the handler: here, its request id."""

    aws_request_id: str


@pytest.fixture
def api() -> Iterator[tuple[StandIn, dict[str, str]]]:
    """The stand-in, and the environment of a function with the layer and its wrapper."""
    state = StandIn()
    server, address = serve(state)
    environ = {
        "AWS_LAMBDA_RUNTIME_API": address,
        "AWS_LAMBDA_EXEC_WRAPPER": "/opt/flightlock-wrapper",
        "_FLIGHTLOCK_RUNTIME_PID": "1",
        "AWS_SESSION_TOKEN": "session-token",
    }
    yield state, environ
    server.shutdown()
    server.server_close()


@pytest.fixture
def context(api: tuple[StandIn, dict[str, str]]) -> Context:
    """An invocation in flight."""
    state, _ = api
    state.start("req-1")
    return Context("req-1")
