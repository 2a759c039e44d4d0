"""The client (flightlock.Locks) against the stand-in lock API."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
from conftest import Context
from standin import StandIn

import flightlock
from flightlock import LockApiError, LockApiUnavailable, LockBusy, Locks

Api = tuple[StandIn, dict[str, str]]


def test_installed_from_the_wheel_not_the_source_tree() -> None:
    # scripts/check-client-python runs these tests against the built wheel in a fresh venv.
    where = Path(flightlock.__file__).resolve()
    assert "site-packages" in where.parts, where


def test_acquire_release_and_held(api: Api, context: Context) -> None:
    state, environ = api
    locks = Locks(context, environ=environ)
    first = locks.acquire("order-7", wait_ms=0)
    assert first == 1
    assert locks.held() == [{"key": "order-7", "token": 1, "permits": 1, "lost": False}]
    locks.release("order-7")
    assert locks.held() == []
    assert locks.acquire("order-7") == 2  # fencing tokens rise
    assert state.held_by("order-7") == ["req-1"]


def test_busy_answers_none_and_acquire_or_raise_names_the_holders(api: Api, context: Context) -> None:
    state, environ = api
    state.start("req-2")
    Locks(Context("req-2"), environ=environ).acquire("order-7", 0)
    locks = Locks(context, environ=environ)
    assert locks.acquire("order-7", wait_ms=0) is None
    with pytest.raises(LockBusy) as busy:
        locks.acquire_or_raise("order-7", 0)
    assert busy.value.error == flightlock.BUSY and busy.value.status == 409
    assert busy.value.key == "order-7"
    assert [h["ticket"] for h in busy.value.holders] == [1]


def test_a_wait_ends_when_the_holder_releases(api: Api, context: Context) -> None:
    state, environ = api
    state.start("req-2")
    other = Locks(Context("req-2"), environ=environ)
    other.acquire("k", 0)
    threading.Timer(0.1, other.release, ["k"]).start()
    assert Locks(context, environ=environ).acquire("k", wait_ms=5000) == 2


def test_lock_releases_on_exit_and_on_error(api: Api, context: Context) -> None:
    state, environ = api
    locks = Locks(context, environ=environ)
    with locks.lock("a", wait_ms=0) as token:
        assert token == 1 and state.held_by("a") == ["req-1"]
    assert state.held_by("a") == []
    with pytest.raises(ZeroDivisionError), locks.lock("a") as token:
        assert state.held_by("a") == ["req-1"]
        _ = 1 / 0
    assert state.held_by("a") == []


def test_lock_raises_busy_before_the_block(api: Api, context: Context) -> None:
    state, environ = api
    state.start("req-2")
    Locks(Context("req-2"), environ=environ).acquire("a", 0)
    ran = False
    with pytest.raises(LockBusy), Locks(context, environ=environ).lock("a", 0):
        ran = True
    assert not ran
    assert state.held_by("a") == ["req-2"]


def test_a_lost_lock_fails_the_block_that_ran_under_it(api: Api, context: Context) -> None:
    state, environ = api
    locks = Locks(context, environ=environ)
    with pytest.raises(LockApiError) as lost, locks.lock("a"):
        state.lose("a")
    assert lost.value.error == flightlock.LOST and lost.value.status == 409


def test_refusals_carry_the_apis_word_and_message(api: Api, context: Context) -> None:
    state, environ = api
    locks = Locks(context, environ=environ)
    with pytest.raises(LockApiError) as e:
        locks.release("never")
    assert (e.value.status, e.value.error) == (404, flightlock.NOT_HELD)
    assert "does not hold never" in str(e.value)
    locks.acquire("a")
    with pytest.raises(LockApiError) as e:
        locks.acquire("a")
    assert e.value.error == flightlock.ALREADY_HELD
    with pytest.raises(LockApiError) as e:
        locks.acquire("")
    assert (e.value.status, e.value.error) == (400, flightlock.BAD_REQUEST)
    with pytest.raises(LockApiError) as e:
        locks.acquire("b", wait_ms=15 * 60 * 1000 + 1)
    assert e.value.error == flightlock.BAD_REQUEST
    with pytest.raises(LockApiError) as e:
        locks.acquire("x" * 5000)  # a key over 1024 bytes in a body over 4096
    assert (e.value.status, e.value.error) == (413, flightlock.TOO_LARGE)
    state.end("req-1")
    with pytest.raises(LockApiError) as e:
        locks.acquire("b")
    assert (e.value.status, e.value.error) == (403, flightlock.NOT_IN_FLIGHT)


def test_the_session_token_is_sent_and_checked(api: Api, context: Context) -> None:
    state, environ = api
    with pytest.raises(LockApiError) as e:
        Locks(context, environ={**environ, "AWS_SESSION_TOKEN": "another"}).acquire("a")
    assert (e.value.status, e.value.error) == (403, flightlock.FORBIDDEN)
    state.session_token = None
    with pytest.raises(LockApiUnavailable) as off:
        Locks(context, environ=environ).acquire("a")
    assert (off.value.status, off.value.error) == (503, flightlock.UNAVAILABLE)


@pytest.mark.parametrize(
    ("drop", "fix"),
    [
        ("AWS_LAMBDA_RUNTIME_API", "attach the flightlock layer"),
        ("_FLIGHTLOCK_RUNTIME_PID", "AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper"),
        ("AWS_SESSION_TOKEN", "neither AWS_SESSION_TOKEN nor AWS_CONTAINER_AUTHORIZATION_TOKEN"),
    ],
)
def test_no_lock_api_names_the_fix(api: Api, context: Context, drop: str, fix: str) -> None:
    _, environ = api
    environ = {k: v for k, v in environ.items() if k != drop}
    with pytest.raises(LockApiUnavailable) as e:
        Locks(context, environ=environ)
    assert e.value.error == flightlock.NOT_CONFIGURED
    assert fix in str(e.value)


def test_a_runtime_api_that_is_not_the_proxy_names_the_fix(api: Api, context: Context) -> None:
    _state, environ = api
    # The proxy passes other paths on; a bare Runtime API answers the lock API's paths without
    # a lock API body. The stand-in's non-API answer plays it, reached through a base path that
    # is not the API's.
    locks = Locks(context, environ=environ)
    locks._base = locks._base.replace("/flightlock/v1/", "/2018-06-01/runtime/")
    with pytest.raises(LockApiUnavailable) as e:
        locks.acquire("a")
    assert "AWS_LAMBDA_EXEC_WRAPPER=/opt/flightlock-wrapper" in str(e.value)


def test_nothing_listening_names_the_fix(context: Context) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    environ = {
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{port}",
        "_FLIGHTLOCK_RUNTIME_PID": "1",
        "AWS_SESSION_TOKEN": "t",
    }
    with pytest.raises(LockApiUnavailable) as e:
        Locks(context, environ=environ).acquire("a")
    assert "is the flightlock layer attached" in str(e.value)


def test_proxy_settings_are_ignored(api: Api, context: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    _, environ = api
    # urllib reads these when it builds an opener; the client's opener has no proxy at all.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    assert Locks(context, environ=environ).acquire("a") == 1


def test_the_refusal_words_are_the_extensions() -> None:
    # Every word lock_api.rs answers, and no other: the constants copy its list.
    source = Path(os.environ["FLIGHTLOCK_LOCK_API_RS"]).read_text()
    words = set(re.findall(r'StatusCode::[A-Z_]+,\s*"([a-zA-Z]+)"', source))
    assert len(words) > 10, words
    assert words == set(flightlock.REFUSALS)
    assert flightlock.NOT_CONFIGURED not in words


def test_the_wrapper_marks_the_runtime_it_starts() -> None:
    # The client knows the runtime talks to the proxy by the variable the wrapper exports.
    wrapper = Path(os.environ["FLIGHTLOCK_LAYER_WRAPPER"]).read_text()
    assert re.search(rf"^export .*\b{flightlock.WRAPPED}\b", wrapper, re.MULTILINE), wrapper


def test_under_snapstart_the_container_token_is_sent(api: Api, context: Context) -> None:
    state, environ = api
    state.session_token = "container-token"  # the extension's secret under SnapStart
    environ = {k: v for k, v in environ.items() if k != "AWS_SESSION_TOKEN"}
    environ["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "container-token"
    assert Locks(context, environ=environ).acquire("a") == 1
