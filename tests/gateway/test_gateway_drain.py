"""SIGTERM: the gateway (``python -m sagegate.cmd_serve``, a real process) stops accepting connections
and lets the in-flight stream finish before it exits; a drain timeout bounds how long that may take."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from contextlib import AbstractContextManager

import httpx
import pytest

from tests.fault_support import gateway_process
from tests.gateway_support import FakeBackend, ServerThread, chat_body, wait_until

pytestmark = pytest.mark.heavy  # a sagegate serve process

CLEAN_EXIT = (0, -signal.SIGTERM)
"""uvicorn re-raises the signal after its graceful shutdown, so a drained process dies of SIGTERM."""


def serve_process(
    backend: str, drain_s: float, log_level: str = "warning"
) -> AbstractContextManager[tuple[subprocess.Popen[bytes], str]]:
    """``sagegate serve`` as a real process in front of ``backend``, with ``drain_s`` to drain."""
    return gateway_process([backend], DRAIN_TIMEOUT_S=str(drain_s), LOG_LEVEL=log_level)


def _stream(url: str, out: list[str]) -> None:
    try:
        with (
            httpx.Client(timeout=20) as c,
            c.stream("POST", url + "/v1/chat/completions", json=chat_body(stream=True, max_tokens=30)) as r,
        ):
            out.extend(line for line in r.iter_lines() if line)
    except httpx.HTTPError as exc:
        out.append(f"error: {exc!r}")


def test_sigterm_drains_in_flight_stream_and_refuses_new_connections() -> None:
    fake = FakeBackend(tokens=30, delay_s=0.05)
    with ServerThread(fake.app) as backend, serve_process(backend.url, drain_s=20) as (proc, url):
        lines: list[str] = []
        t = threading.Thread(target=_stream, args=(url, lines))
        t.start()
        wait_until(lambda: fake.state.requests == 1, what="stream started")
        wait_until(lambda: len(lines) >= 2, what="tokens reach the client")  # mid-stream (30 in 1.5 s)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: not _accepts(url), timeout=5, what="listening socket closed")
        t.join(20)
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert sum(1 for line in lines if '"content"' in line) == 30
        assert proc.wait(15) in CLEAN_EXIT
        assert fake.state.completed == 1


def test_drain_timeout_bounds_shutdown() -> None:
    fake = FakeBackend(tokens=1000, delay_s=0.05)  # a 50-second stream
    with ServerThread(fake.app) as backend, serve_process(backend.url, drain_s=0.5) as (proc, url):
        lines: list[str] = []
        t = threading.Thread(target=_stream, args=(url, lines))
        t.start()
        wait_until(lambda: fake.state.requests == 1, what="stream started")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) in CLEAN_EXIT
        assert time.monotonic() - t0 < 10
        t.join(20)
        assert "data: [DONE]" not in lines
        wait_until(lambda: fake.state.disconnects == 1, what="upstream cancelled by the shutdown")


def _accepts(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
        return True
    except httpx.ConnectError:
        return False
    except httpx.HTTPError:
        return True


def test_info_log_has_no_line_per_upstream_request() -> None:
    """httpx logs every request at INFO; the gateway's own INFO log must not carry them (an upstream
    call per request, a /metrics scrape ten times a second per backend)."""
    fake = FakeBackend(tokens=3, delay_s=0.0)
    with (
        ServerThread(fake.app) as backend,
        serve_process(backend.url, drain_s=1, log_level="info") as (proc, url),
    ):
        for _ in range(3):
            r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=3), timeout=10)
            assert r.status_code == 200
        scrapes = fake.state.scrapes
        wait_until(lambda: fake.state.scrapes >= scrapes + 3, what="a few scrapes")
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    assert "is now healthy" in err  # INFO lines are written
    assert "HTTP Request" not in err, err[-500:]
