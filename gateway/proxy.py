"""The forwarder: from a queued request to the client's response, releasing the reservation on every
path out (done, failed, client gone) the moment it happens.

A request waits for the dispatcher, is sent over the pooled client, and is retried on another backend
if its backend fails before sending a byte of body (nothing has reached the client yet, so a retry is
invisible). A stream's first chunk is awaited before the client's response starts, so a backend that
dies before its first token still counts as "before the first byte". After that, chunks are forwarded
as they arrive; a failure mid-stream ends the stream with an SSE error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.backends import Backend, BackendPool
from gateway.dispatcher import Dispatcher
from gateway.metrics import GatewayMetrics
from gateway.predict import PredictInput, Recorder
from gateway.queue import Dispatched, GatewayRequest
from gateway.settings import GatewaySettings
from gateway.sse import SseScanner

log = logging.getLogger("sagegate.gateway")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
BACKEND_HEADER = "x-sagegate-backend"
PREDICTED_HEADER = "x-sagegate-predicted-tokens"
RETRYABLE = frozenset({429, 500, 502, 503, 504})
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class DisconnectGuard:
    """Cancels the task that entered it when the client disconnects; the ``async with`` block then
    ends quietly with ``disconnected`` set. Leave ``done`` set before the last send so the server's
    own end-of-response signal is not mistaken for a disconnect."""

    __slots__ = ("disconnected", "done", "listener", "receive", "task")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.disconnected = False
        self.done = False
        self.task: asyncio.Task[Any] | None = None
        self.listener: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectGuard:
        self.task = asyncio.current_task()
        self.listener = asyncio.get_running_loop().create_task(self._listen())
        return self

    async def _listen(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                if not self.done and self.task is not None:
                    self.disconnected = True
                    self.task.cancel()
                return

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.listener is not None:
            self.listener.cancel()
        if self.disconnected and exc_type is asyncio.CancelledError and self.task is not None:
            self.task.uncancel()
            return True
        return False


class Forwarder:
    def __init__(
        self,
        settings: GatewaySettings,
        dispatcher: Dispatcher,
        pool: BackendPool,
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        recorder: Recorder,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.pool = pool
        self.client = client
        self.metrics = metrics
        self.recorder = recorder
        up = settings.upstream
        self.timeout = httpx.Timeout(
            connect=up.connect_timeout_s, read=up.read_timeout_s, write=up.read_timeout_s, pool=None
        )
        self.max_attempts = up.max_attempts

    # --- the attempt loop ---------------------------------------------------------------------
    async def run(self, req: GatewayRequest, inp: PredictInput) -> Response:
        """Queue ``req`` and answer it. Raises :class:`GatewayError` for the gateway's own refusals."""
        try:
            fut = self.dispatcher.submit(req)
        except Exception as exc:  # QueueFull
            reason = getattr(exc, "reason", "queue_full")
            self.metrics.rejected(reason)
            raise errors.busy(
                reason, "the gateway's queue is full", self.settings.queue.retry_after_s
            ) from exc
        last_error = "no backend answered"
        while True:
            idx = await self._wait(req, fut)
            backend = self.pool.backends[idx]
            try:
                outcome = await self._attempt(req, backend, inp)
            except BaseException:  # the client went away while the backend worked
                if req.backend is not None:
                    self.metrics.cancellations.labels("upstream").inc()
                    self.dispatcher.release(req)
                raise
            if not isinstance(outcome, str):
                return outcome
            last_error = outcome
            req.attempt += 1
            req.excluded.add(idx)
            if req.attempt >= self.max_attempts or len(req.excluded) >= len(self.pool):
                self.dispatcher.release(req)
                self.metrics.rejected("upstream_failed")
                raise errors.upstream_failed(f"backends failed: {last_error}")
            self.metrics.retries.labels(backend.name).inc()
            self.dispatcher.release(req, final=False)
            fut = self.dispatcher.requeue(req)

    async def _wait(self, req: GatewayRequest, fut: asyncio.Future[int]) -> int:
        """The backend the dispatcher chose; withdraws the request if the wait ends otherwise."""
        limit = self.settings.queue.max_wait_s - (self.dispatcher.clock() - req.t_enqueue)
        try:
            if not fut.done():
                await asyncio.wait((fut,), timeout=max(0.0, limit))
        except BaseException:  # the client went away while queued
            if not fut.done():
                self.dispatcher.withdraw(req)
                self.metrics.cancellations.labels("queued").inc()
            elif fut.exception() is None:
                self.dispatcher.release(req)
            raise
        if not fut.done():
            self.dispatcher.withdraw(req)
            retry = self.settings.queue.retry_after_s
            if self.pool.any_healthy():
                self.metrics.rejected("queue_timeout")
                raise errors.busy("queue_timeout", "backends are busy; the request waited too long", retry)
            self.metrics.rejected("no_healthy_backend")
            raise errors.unavailable("no_healthy_backend", "no backend is healthy", retry)
        exc = fut.exception()
        if isinstance(exc, Dispatched):
            self.metrics.rejected(exc.reason)
            raise errors.busy(exc.reason, f"the scheduling policy refused the request: {exc.reason}", 1)
        return fut.result()

    async def _attempt(self, req: GatewayRequest, b: Backend, inp: PredictInput) -> Response | str:
        """One try on backend ``b``: a response for the client, or why it failed before the first byte."""
        resp: httpx.Response | None = None
        handed_over = False
        try:
            try:
                resp = await self.client.send(self._build(req, b), stream=True)
            except httpx.HTTPError as exc:
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=isinstance(exc, httpx.ConnectError))
                return f"{b.name}: {type(exc).__name__}"
            if resp.status_code in RETRYABLE:
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=False)
                return f"{b.name}: HTTP {resp.status_code}"
            if resp.status_code != 200 or not req.stream:
                return await self._whole(req, b, resp, inp)
            scanner = SseScanner(strip_usage=not req.want_usage)
            chunks = resp.aiter_raw()
            try:
                first = await anext(chunks)
            except (httpx.HTTPError, StopAsyncIteration) as exc:
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=False)
                return f"{b.name}: stream ended before its first chunk ({type(exc).__name__})"
            self._first_byte(req)
            handed_over = True
            return SseResponse(self, req, b, inp, resp, chunks, first, scanner)
        finally:
            if not handed_over and resp is not None:
                await resp.aclose()

    async def _whole(
        self, req: GatewayRequest, b: Backend, resp: httpx.Response, inp: PredictInput
    ) -> Response | str:
        """A non-streaming answer (or the backend's own client error), read whole then forwarded."""
        try:
            body = await resp.aread()
        except httpx.HTTPError as exc:
            self.dispatcher.first_byte(req)
            self.pool.request_failed(b, hard=False)
            return f"{b.name}: body failed ({type(exc).__name__})"
        self._first_byte(req)
        status = resp.status_code
        output = None
        if status == 200:
            output = _completion_tokens(body)
            self.pool.request_succeeded(b)
        self.finish(req, inp, "ok" if status == 200 else "client_error", output)
        headers = {"content-type": resp.headers.get("content-type", "application/json"), **_info(req, b)}
        return Response(body, status_code=status, headers=headers)

    def _build(self, req: GatewayRequest, b: Backend) -> httpx.Request:
        body = req.body
        up = self.settings.upstream
        if req.stream and up.force_usage and not req.want_usage:
            opts = body.get("stream_options")
            body = {
                **body,
                "stream_options": {**(opts if isinstance(opts, dict) else {}), "include_usage": True},
            }
        if up.forward_priority:
            body = {**body, "priority": -req.priority}
        return self.client.build_request(
            "POST",
            b.url + PATHS[req.route],
            content=json.dumps(body, separators=(",", ":")).encode(),
            headers={"content-type": "application/json"},
            timeout=self.timeout,
        )

    def _first_byte(self, req: GatewayRequest) -> None:
        self.dispatcher.first_byte(req)
        self.metrics.ttft.observe(self.dispatcher.clock() - req.arrival_s)

    # --- the end of a dispatched request -------------------------------------------------------
    def finish(self, req: GatewayRequest, inp: PredictInput, outcome: str, output: int | None) -> None:
        """Release the reservation; on success, teach the predictor the true length."""
        self.dispatcher.release(req)
        self.metrics.requests.labels(req.route, outcome).inc()
        if outcome == "ok" and output is not None:
            self.metrics.outcome(req.prediction.mean if req.prediction is not None else None, output)
            self.recorder.record(inp, output)


class SseResponse(Response):
    """Streams a backend's SSE to the client chunk by chunk.

    A reader task drains the backend as fast as it produces and settles the request (reservation
    released, true length recorded) the moment the backend is done, even if the client is still
    reading: the backend's KV is free then, whatever the client's pace. The response task relays what
    the reader queued. A client that leaves cancels both, and the upstream request with them.
    """

    def __init__(
        self,
        fwd: Forwarder,
        req: GatewayRequest,
        backend: Backend,
        inp: PredictInput,
        upstream: httpx.Response,
        chunks: AsyncIterator[bytes],
        first: bytes,
        scanner: SseScanner,
    ) -> None:
        self.fwd = fwd
        self.req = req
        self.backend = backend
        self.inp = inp
        self.upstream = upstream
        self.chunks = chunks
        self.first = first
        self.scanner = scanner
        self.status_code = 200
        self.background = None
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.settled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader: asyncio.Task[None] | None = None
        try:
            async with DisconnectGuard(receive) as guard:
                headers = SSE_HEADERS + [
                    (k.encode(), v.encode()) for k, v in _info(self.req, self.backend).items()
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                # The first chunk goes out from here, before the reader task exists: two fewer
                # loop iterations between the backend's first byte and the client's.
                first = self.scanner.feed(self.first)
                if first:
                    self.fwd.dispatcher.progress(self.req, self.scanner.events)
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                reader = asyncio.get_running_loop().create_task(self._read())
                outbox = self.outbox
                while (data := await outbox.get()) is not None:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                guard.done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if guard.disconnected:
                self.fwd.metrics.cancellations.labels("streaming").inc()
        finally:
            if reader is None:
                await self.upstream.aclose()  # the reader never took the stream over
            elif not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            self._settle("cancelled")

    async def _read(self) -> None:
        scanner = self.scanner
        outcome = "cancelled"
        try:
            async for chunk in self.chunks:
                self._put(scanner.feed(chunk))
            self._put(scanner.flush())
            outcome = "ok" if scanner.done else "truncated"
        except httpx.HTTPError as exc:
            outcome = "failed"
            log.warning("backend %s failed mid-stream: %s", self.backend.name, type(exc).__name__)
        finally:
            await self.upstream.aclose()
        if outcome != "ok":
            msg = "the backend failed mid-stream" if outcome == "failed" else "the backend ended early"
            self.outbox.put_nowait(errors.sse_error_event(msg))
        self.outbox.put_nowait(None)
        self._settle(outcome)

    def _put(self, data: bytes) -> None:
        if data:
            self.outbox.put_nowait(data)
            self.fwd.dispatcher.progress(self.req, self.scanner.events)

    def _settle(self, outcome: str) -> None:
        """Once per request: the backend's verdict, then release and record."""
        if self.settled:
            return
        self.settled = True
        fwd, scanner = self.fwd, self.scanner
        if outcome == "failed":
            fwd.pool.request_failed(self.backend, hard=False)
        elif outcome == "ok":
            fwd.pool.request_succeeded(self.backend)
        output = scanner.usage if scanner.usage is not None else scanner.events
        fwd.finish(self.req, self.inp, outcome, output)


def _info(req: GatewayRequest, b: Backend) -> dict[str, str]:
    """Response headers telling the client where its request went and what was predicted."""
    out = {BACKEND_HEADER: b.name}
    if req.prediction is not None:
        out[PREDICTED_HEADER] = str(round(req.prediction.mean))
    return out


def _completion_tokens(body: bytes) -> int | None:
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None
