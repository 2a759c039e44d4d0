"""Fixtures for the release tests: moto's server on 127.0.0.1, fake sealed releases, and boto3
clients whose calls are recorded (and can be made to fail)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "release"))

import pack  # noqa: E402
import publish  # noqa: E402
from fakes import fake_release  # noqa: E402,F401  (the tests import it from here)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """moto's server (installed and started as scripts/dynamodb-local does), for this session."""
    env = dict(os.environ, FLIGHTLOCK_DDB_BACKEND="moto")
    cmd = subprocess.run([str(ROOT / "scripts/dynamodb-local"), "install"], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd + [str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto's server did not start on {url}; its log: {log.read_text()}")
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def aws(moto_endpoint, monkeypatch):
    """An empty moto (reset before each test) and boto3 pointed at it with dummy credentials."""
    urllib.request.urlopen(urllib.request.Request(moto_endpoint + "/moto-api/reset", method="POST"))
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_endpoint


class Recorder:
    """boto3 clients (publish.boto3_clients) whose calls are recorded as (service, region, method),
    in order; `fail_on(method, n)` makes the n-th call of `method` (1-based) raise instead."""

    def __init__(self) -> None:
        self.inner = publish.boto3_clients()
        self.calls: list[tuple[str, str, str]] = []
        self.failures: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def fail_on(self, method: str, n: int) -> None:
        self.failures[method] = n

    def __call__(self, service: str, region: str):
        client = self.inner(service, region)
        rec = self

        class Watched:
            def __getattr__(self, method):
                real = getattr(client, method)

                def call(**kw):
                    rec.counts[method] = rec.counts.get(method, 0) + 1
                    if rec.failures.get(method) == rec.counts[method]:
                        raise ConnectionError(f"injected: {method} call {rec.counts[method]} in {region} failed")
                    rec.calls.append((service, region, method))
                    return real(**kw)

                return call

        return Watched()

    def methods(self) -> list[str]:
        return [m for _, _, m in self.calls]


@pytest.fixture
def recorder(aws):
    return Recorder()
