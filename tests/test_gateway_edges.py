"""Hostile input at the gateway's edge, over real loopback HTTP and raw sockets: bodies nested past
the depth limit, ``NaN``/``Infinity``, bad query parameters, wrong methods, uploads cut short. Each
answer is OpenAI's error shape (or, for a client that left, nothing and no traceback)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.app import create_app
from gateway.jsonbody import depth
from tests.gateway_support import FakeBackend, ServerThread, settings_for, wait_until


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, FakeBackend]]:
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be, ServerThread(create_app(settings_for([be.url]))) as gw:
        yield gw.url, fake


def _openai_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


def test_depth_ignores_brackets_inside_strings() -> None:
    assert depth(b'{"a": [1, {"b": "[[[[{{"}], "c": "\\"]]"}') == 3
    assert depth(b"[" * 1000 + b"]" * 1000) == 1000
    assert depth(b'"just a string"') == 0


@pytest.mark.parametrize("levels", [65, 1000, 100_000])
def test_deeply_nested_body_is_400_not_500(stack: tuple[str, FakeBackend], levels: int) -> None:
    url, fake = stack
    before = fake.state.requests
    raw = (
        b'{"model":"fake","messages":[{"role":"user","content":"hi"}],"x":'
        + b"[" * levels
        + b"]" * levels
        + b"}"
    )
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert "nests deeper than 64" in str(err["message"])
    assert fake.state.requests == before


def test_nesting_within_the_limit_is_forwarded(stack: tuple[str, FakeBackend]) -> None:
    url, fake = stack
    raw = b'{"model":"fake","messages":[{"role":"user","content":"[[[["}],"max_tokens":3,"x":'
    raw += b"[" * 60 + b"]" * 60 + b"}"
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    forwarded = fake.state.bodies[-1]["x"]
    levels = 0
    while isinstance(forwarded, list):
        levels += 1
        forwarded = forwarded[0] if forwarded else None
    assert levels == 60


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(stack: tuple[str, FakeBackend], constant: str) -> None:
    url, fake = stack
    before = fake.state.requests
    raw = f'{{"model":"fake","messages":[{{"role":"user","content":"hi"}}],"temperature":{constant}}}'
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert constant in str(err["message"]) and err["code"] == "invalid_request"
    assert fake.state.requests == before


def test_bad_query_parameter_is_openai_shaped(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    r = httpx.get(url + "/admin/queue?limit=abc", headers={"authorization": "Bearer admin-secret"})
    err = _openai_error(r, 400)
    assert err["param"] == "limit" and "detail" not in r.json()


def test_wrong_method_is_405_with_allow(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    r = httpx.get(url + "/v1/chat/completions")
    _openai_error(r, 405)
    assert r.headers.get("allow") == "POST"


def _metric(url: str, line_start: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_aborted_uploads_are_quiet_cancellations(
    stack: tuple[str, FakeBackend], caplog: pytest.LogCaptureFixture
) -> None:
    url, fake = stack
    port = int(url.rsplit(":", 1)[1])
    before = fake.state.requests
    caplog.set_level(logging.INFO)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b'content-length: 10000\r\n\r\n{"model":"fake","messages":'
            )
            time.sleep(0.05)  # the gateway is reading the body when the client goes
    key = 'sagegate_cancellations_total{stage="upload"}'
    wait_until(lambda: _metric(url, key) >= 5, timeout=10, what="five upload cancellations")
    time.sleep(0.2)
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    assert fake.state.requests == before
    assert httpx.get(url + "/health").status_code == 200
