"""Helpers for the gateway tests: real servers on loopback ports, in threads or subprocesses.

``ServerThread`` runs any ASGI app under uvicorn in a thread (its own event loop) on a free port.
``FakeBackend`` is a scriptable vLLM-like backend for failure behaviour: it can refuse, stall, die
mid-stream or report a long waiting list, and it counts what it saw (requests, client disconnects).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sagegate.gateway.settings import GatewaySettings
from sagegate.harness.procs import free_port


class ServerThread:
    """``with ServerThread(app) as srv: srv.url``: uvicorn in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", loop="asyncio", lifespan="on",
            timeout_graceful_shutdown=2,
        )  # fmt: skip
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def settings_for(urls: list[str], **kw: Any) -> GatewaySettings:
    """Gateway settings for tests: quick probes, no heavy predictor, FCFS unless told."""
    base: dict[str, Any] = {
        "backends": urls,
        "policy": "fcfs",
        "predictor": "none",
        "admin_key": "admin-secret",
        "health": {"scrape_interval_s": 0.02, "probe_interval_s": 0.1, "probe_timeout_s": 1.0, "open_s": 0.2},
    }
    for key, value in kw.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return GatewaySettings(**base)


def admin(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/admin/queue", headers={"authorization": "Bearer admin-secret"}, timeout=5)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def idle(url: str) -> bool:
    """Nothing queued, in flight or reserved anywhere (every reservation released)."""
    snap = admin(url)
    return snap["queued"] == 0 and all(
        b["inflight"] == 0 and b["reserved_tokens"] == 0 for b in snap["backends"]
    )


def metric(url: str, prefix: str) -> float:
    """The value of the first ``/metrics`` sample starting with ``prefix`` (0 if absent)."""
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


async def until(cond: Callable[[], bool], what: str = "condition", timeout: float = 5.0) -> None:
    """:func:`wait_until` on a running event loop (the loop keeps turning while it waits)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def chat_body(
    content: str = "hello", *, stream: bool = False, max_tokens: int = 8, **extra: Any
) -> dict[str, Any]:
    return {
        "model": "fake",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": max_tokens,
        **extra,
    }


# --- a scriptable backend -------------------------------------------------------------------------
@dataclass
class FakeState:
    mode: str = "ok"
    """ok | fail500 | midstream (die after ``die_after`` tokens)"""
    tokens: int = 8
    delay_s: float = 0.0
    die_after: int = 3
    healthy: bool = True
    waiting: int = 0
    blocks: int = 4096
    block_size: int = 16
    model: str = "fake"
    list_models: bool = True
    poison: str | None = None
    """A request whose body holds this text is answered 500 (a poison input), with ``poison_type``."""
    poison_type: str = "InternalServerError"
    first_delta: dict[str, Any] = field(default_factory=dict)
    """Merged into the first streamed chunk's delta (reasoning, a tool call: what text cannot carry)."""
    requests: int = 0
    completed: int = 0
    scrapes: int = 0
    """``/metrics`` reads (a gateway's scrapes: proof that its probe loop has gone round)."""
    disconnects: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def _chunk(i: int, model: str, extra: dict[str, Any] | None = None) -> bytes:
    obj = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": f" t{i}", **(extra or {})}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class FakeBackend:
    def __init__(self, **kw: Any) -> None:
        self.state = FakeState(**kw)
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._generate, methods=["POST"]),
                Route("/v1/completions", self._generate, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/health", self._health),
                Route("/metrics", self._metrics),
            ]
        )

    async def _models(self, request: Request) -> Response:
        data = [{"id": self.state.model, "object": "model"}] if self.state.list_models else []
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.state.healthy else 503)

    async def _metrics(self, request: Request) -> Response:
        s = self.state
        s.scrapes += 1
        text = (
            f'vllm:num_requests_waiting{{model_name="{s.model}"}} {s.waiting}\n'
            f'vllm:num_requests_running{{model_name="{s.model}"}} 0\n'
            f'vllm:cache_config_info{{block_size="{s.block_size}",num_gpu_blocks="{s.blocks}"}} 1.0\n'
        )
        return Response(text, media_type="text/plain")

    async def _generate(self, request: Request) -> Response:
        s = self.state
        body = await request.json()
        s.requests += 1
        s.bodies.append(body)
        s.headers.append(dict(request.headers))
        if s.mode == "fail500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if s.poison is not None and s.poison in json.dumps(body):
            err = {"message": "the engine failed on this input", "type": s.poison_type, "code": 500}
            return JSONResponse({"error": err}, status_code=500)
        if body.get("stream"):
            return StreamingResponse(self._stream(body), media_type="text/event-stream")
        gone = asyncio.ensure_future(_wait_disconnect(request))
        work = asyncio.ensure_future(asyncio.sleep(s.delay_s * s.tokens))
        done, _ = await asyncio.wait({gone, work}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        work.cancel()
        if gone in done:
            s.disconnects += 1
            return Response(status_code=499)
        s.completed += 1
        usage = {"prompt_tokens": 3, "completion_tokens": s.tokens, "total_tokens": 3 + s.tokens}
        msg = {"role": "assistant", "content": "x" * s.tokens}
        return JSONResponse({"id": "c", "object": "chat.completion", "model": s.model,
                             "choices": [{"index": 0, "message": msg, "finish_reason": "length"}],
                             "usage": usage})  # fmt: skip

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        s = self.state
        finished = False
        try:
            for i in range(s.tokens):
                if s.mode == "midstream" and i == s.die_after:
                    raise RuntimeError("backend died mid-stream")
                if s.delay_s:
                    await asyncio.sleep(s.delay_s)
                yield _chunk(i, s.model, s.first_delta if i == 0 else None)
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                usage = {"prompt_tokens": 3, "completion_tokens": s.tokens, "total_tokens": 3 + s.tokens}
                yield b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            finished = True
            s.completed += 1
        finally:
            if not finished and s.mode != "midstream":
                s.disconnects += 1


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def sim_thread(
    name: str = "fake", time_scale: float = 50.0, api_key: str | None = None, **engine: Any
) -> ServerThread:
    """The simulated vLLM backend (``sim.server``) in a thread, serving model ``name`` (``api_key``:
    vLLM's ``--api-key``; ``engine``: ``EngineConfig`` fields)."""
    from sagegate.sim.config import EngineConfig  # (imported here, as in ``fleet``)
    from sagegate.sim.server import BackendSettings, create_app

    opts = BackendSettings(
        engine=EngineConfig(**engine), served_model_name=name, time_scale=time_scale, api_key=api_key
    )
    return ServerThread(create_app(opts))


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@contextmanager
def fleet(*states: dict[str, Any], **kw: Any) -> Iterator[tuple[list[FakeBackend], str]]:
    """Fake backends (one per ``states``) and a gateway in front of them (``kw``: gateway settings),
    every backend healthy."""
    from sagegate.gateway.app import (
        create_app,  # here: a fake backend's own process need not load the gateway
    )

    fakes = [FakeBackend(**s) for s in states]
    servers = [ServerThread(f.app).start() for f in fakes]
    try:
        with ServerThread(create_app(settings_for([s.url for s in servers], **kw))) as gw:
            wait_until(lambda: all(b["healthy"] for b in admin(gw.url)["backends"]), what="backends up")
            yield fakes, gw.url
    finally:
        for s in servers:
            s.stop()
