"""Client connections through a real ``sagegate serve`` process (issue 35): the keep-alive outlives
common client pools, every connection closed or lost with a request on it is counted, and the head
and body limits hold however the bytes arrive."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator

import pytest

from tests.fault_support import gateway_process, raw_socket, read_until_closed, stop_and_log
from tests.gateway_support import FakeBackend, ServerThread, chat_body, metric, wait_until

pytestmark = pytest.mark.heavy  # a sagegate serve process


@pytest.fixture(scope="module")
def defaults() -> Iterator[str]:
    """A gateway process with the default keep-alive and an 8 KiB head limit."""
    fake = FakeBackend(tokens=3)
    env = {"LIMITS__MAX_HEADER_BYTES": "8192"}
    with ServerThread(fake.app) as be, gateway_process([be.url], **env) as (proc, url):
        yield url
        log = stop_and_log(proc)
    assert "ERROR" not in log and "Traceback" not in log, log[-2000:]


@pytest.fixture(scope="module")
def short_keep_alive() -> Iterator[str]:
    """A gateway process whose idle connections close after 0.3 s, before a slow streaming backend."""
    fake = FakeBackend(tokens=200, delay_s=0.02)
    env = {"LIMITS__KEEP_ALIVE_S": "0.3"}
    with ServerThread(fake.app) as be, gateway_process([be.url], **env) as (proc, url):
        yield url
        stop_and_log(proc)


def read_response(s: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a ``content-length`` (the connection stays open)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length"))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


GET_HEALTH = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"


def test_an_idle_connection_is_kept_past_common_pool_timeouts(
    defaults: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn's own 5 s closed a pooled connection just as clients idling ~5 s reused it. Rather than
    idle past 5 s: the keep-alive ``serve`` hands uvicorn by default (read where it does, the server
    not run) outlives common pools' idle times (httpx 5 s, aiohttp 15 s); a live process closes an idle
    connection at its setting (``test_idle_and_lost_connections_are_counted``); and reuses one."""
    import uvicorn

    from sagegate.cmd_serve import run
    from sagegate.gateway.settings import GatewaySettings

    served: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(self.config))
    httpx_level = logging.getLogger("httpx").level
    try:
        run(GatewaySettings(backends=["http://127.0.0.1:9"]))
    finally:
        logging.getLogger("httpx").setLevel(httpx_level)  # (serve quiets it)
    (config,) = served
    assert config.timeout_keep_alive == GatewaySettings().limits.keep_alive_s > 15  # aiohttp: 15 s
    s = raw_socket(defaults)
    for _ in range(2):
        s.sendall(GET_HEALTH)
        assert read_response(s).startswith(b"HTTP/1.1 200")  # the same connection, still open
    s.close()


def test_a_head_over_the_limit_is_refused_even_in_one_read(defaults: str) -> None:
    s = raw_socket(defaults)
    s.sendall(GET_HEALTH.replace(b"\r\n\r\n", b"\r\nx-filler: " + b"a" * 9000 + b"\r\n\r\n"))
    got = read_until_closed(s)
    assert got.startswith(b"HTTP/1.1 431")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_header_too_large"
    assert metric(defaults, 'sagegate_client_connections_closed_total{why="head_too_large"}') >= 1
    # a head just within the limit, in one read, with a body after it in the same read, is served
    s = raw_socket(defaults)
    body = json.dumps(chat_body()).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    head += b"content-length: %d\r\nx-filler: %s\r\n\r\n" % (len(body), b"a" * 7000)
    s.sendall(head + body)
    assert read_response(s).startswith(b"HTTP/1.1 200")
    s.close()


def test_expect_100_continue_over_the_body_limit_gets_413_before_any_continue(defaults: str) -> None:
    s = raw_socket(defaults)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"expect: 100-continue\r\ncontent-length: 5000000\r\n\r\n"
    )
    got = read_until_closed(s)  # the client sent no body: the answer comes, and the connection closes
    assert got.startswith(b"HTTP/1.1 413"), got[:80]
    assert b"100 Continue" not in got


def test_idle_and_lost_connections_are_counted(short_keep_alive: str) -> None:
    url = short_keep_alive
    s = raw_socket(url)
    s.sendall(GET_HEALTH)
    assert read_response(s).startswith(b"HTTP/1.1 200")
    assert read_until_closed(s) == b""  # closed by the gateway after 0.3 s idle
    wait_until(lambda: metric(url, 'sagegate_client_connections_closed_total{why="idle"}') >= 1)
    # a client that goes away mid-stream: its connection is lost with a request on it
    s = raw_socket(url)
    body = json.dumps(chat_body(stream=True, max_tokens=200)).encode()
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    with contextlib.suppress(OSError):
        s.close()
    wait_until(lambda: metric(url, 'sagegate_client_connections_closed_total{why="lost_mid_request"}') == 1)
