"""Helpers for the fault tests: a misbehaving backend, a gateway process with its own settings, raw
sockets and an upstream transport that fails the way a dead socket has been seen to fail.

``BadBackend`` is :class:`FakeBackend` with the faults found by a hostile test: one endless SSE event,
``429`` with ``Retry-After``, negative usage, a fast flood of events, a ``/health`` that stalls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.gateway_support import REPO_ROOT, FakeBackend, _chunk, free_port, wait_until

DEAD_SOCKET = "'NoneType' object has no attribute 'getpeername'"
"""What httpcore raised from inside ``client.send`` when a backend was SIGKILLed under load."""


class BadBackend(FakeBackend):
    """``fault``: endless | throttle | bad_usage | flood (streams only; else as :class:`FakeBackend`)."""

    def __init__(
        self, fault: str = "", *, usage: int = -21_000_000, health_delay_s: float = 0.0, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.fault = fault
        self.usage = usage
        self.health_delay_s = health_delay_s
        self.sent_bytes = 0

    async def _health(self, request: Request) -> Response:
        if self.health_delay_s:
            await asyncio.sleep(self.health_delay_s)
        return await super()._health(request)

    async def _generate(self, request: Request) -> Response:
        if self.fault == "throttle":
            self.state.requests += 1
            err = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            return JSONResponse(err, status_code=429, headers={"retry-after": "7"})
        body = await request.json()
        if self.fault not in ("endless", "bad_usage", "flood") or (
            self.fault == "flood" and not body.get("stream")
        ):
            return await super()._generate(request)
        self.state.requests += 1
        if self.fault == "bad_usage" and not body.get("stream"):
            usage = {"prompt_tokens": 3, "completion_tokens": self.usage, "total_tokens": 3}
            msg = {"role": "assistant", "content": "x"}
            choice = {"index": 0, "message": msg, "finish_reason": "stop"}
            return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage})
        gen = {"endless": self._endless, "bad_usage": self._bad_usage, "flood": self._flood}[self.fault]
        return StreamingResponse(self._counted(gen()), media_type="text/event-stream")

    async def _counted(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for data in events:
                self.sent_bytes += len(data)
                yield data
            finished = True
            self.state.completed += 1
        finally:
            if not finished:
                self.state.disconnects += 1

    async def _endless(self) -> AsyncIterator[bytes]:
        yield _chunk(0, self.state.model)
        yield b'data: {"choices":[{"index":0,"delta":{"content":"'
        piece = b"x" * 65536
        while True:
            yield piece
            await asyncio.sleep(0)

    async def _bad_usage(self) -> AsyncIterator[bytes]:
        for i in range(self.state.tokens):
            yield _chunk(i, self.state.model)
        usage = {"prompt_tokens": 3, "completion_tokens": self.usage, "total_tokens": 3}
        yield b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def _flood(self) -> AsyncIterator[bytes]:
        batch = b"".join(_chunk(i, self.state.model) for i in range(200))
        for _ in range(self.state.tokens // 200):
            yield batch
            await asyncio.sleep(0)
        yield b"data: [DONE]\n\n"


class FaultyTransport(httpx.AsyncBaseTransport):
    """The real transport, but the first ``fail_sends`` POSTs raise what a dead socket raised from
    inside httpcore (an ``AttributeError``, no ``httpx.HTTPError``), and with ``break_after`` set
    every POST's body raises it after that many chunks."""

    def __init__(self, fail_sends: int = 0, break_after: int | None = None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.fail_sends = fail_sends
        self.break_after = break_after

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and self.fail_sends > 0:
            self.fail_sends -= 1
            raise AttributeError(DEAD_SOCKET)
        resp = await self.inner.handle_async_request(request)
        if request.method != "POST" or self.break_after is None:
            return resp
        assert isinstance(resp.stream, httpx.AsyncByteStream)
        stream = _Breaking(resp.stream, self.break_after)
        return httpx.Response(
            resp.status_code, headers=resp.headers, stream=stream, extensions=resp.extensions
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Breaking(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, after: int) -> None:
        self.inner = inner
        self.after = after

    async def __aiter__(self) -> AsyncIterator[bytes]:
        n = 0
        async for chunk in self.inner:
            if n == self.after:
                raise AttributeError(DEAD_SOCKET)
            n += 1
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


# --- processes -------------------------------------------------------------------------------------
BACKEND_MAIN = """
import sys, uvicorn
from tests.gateway_support import FakeBackend
uvicorn.run(FakeBackend(tokens=int(sys.argv[2]), delay_s=float(sys.argv[3])).app,
            host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@contextmanager
def backend_process(tokens: int, delay_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A :class:`FakeBackend` in a process of its own, to be SIGKILLed."""
    port = free_port()
    cmd = [sys.executable, "-c", BACKEND_MAIN, str(port), str(tokens), str(delay_s)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _answers(url + "/health") or proc.poll() is not None, timeout=30, what="backend up"
        )
        assert proc.poll() is None
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# --- a gateway process ----------------------------------------------------------------------------
@contextmanager
def gateway_process(backends: list[str], **env: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``sagegate serve`` as a real process (uvloop, httptools, the client guards), settings from
    ``SAGEGATE_*`` variables ``env`` (e.g. ``LIMITS__HEADER_TIMEOUT_S="0.5"``)."""
    port = free_port()
    extra = {f"SAGEGATE_{k}": v for k, v in env.items()}
    full = {
        **os.environ,
        "SAGEGATE_LOG_LEVEL": "warning",
        "SAGEGATE_ADMIN_KEY": "admin-secret",
        **extra,
    }
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--port", str(port), "--policy", "fcfs"]
    cmd += ["--predictor", "none"] + [a for b in backends for a in ("--backend", b)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or proc.poll() is not None, timeout=30, what="gateway process ready")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def stop_and_log(proc: subprocess.Popen[bytes]) -> str:
    """SIGTERM the gateway process, wait for it, and return what it logged."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    assert proc.stderr is not None
    return proc.stderr.read().decode()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def raw_socket(url: str, rcvbuf: int | None = None) -> socket.socket:
    """A TCP connection to ``url``'s host and port (``rcvbuf``: a small receive buffer, set before
    connecting, for a client that stops reading)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(15)
    s.connect((host, int(port)))
    return s


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (or the socket's timeout passes: then raises)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out
