"""The forwarder: from a queued request to the client's response, releasing the reservation on every
path out (done, failed, client gone) the moment it happens.

A request waits for the dispatcher, is sent over the pooled client, and is retried on another backend
if its backend fails before sending a byte of body (nothing has reached the client yet, so a retry is
invisible). A stream's first chunk is awaited before the client's response starts, so a backend that
dies before its first token still counts as "before the first byte". After that, chunks are forwarded
as they arrive; a failure mid-stream ends the stream with an SSE error event.

Whatever the upstream client raises (httpx's errors, and anything else from below it: a dead socket
has surfaced as an ``AttributeError`` from inside httpcore) is the backend failing; only a
cancellation is the client leaving (or the gateway shutting down, see :meth:`Forwarder.close_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.backends import Backend, BackendPool
from gateway.client_guard import CLIENT_ABORT
from gateway.dispatcher import Dispatcher
from gateway.metrics import GatewayMetrics
from gateway.predict import PredictInput, Recorder
from gateway.queue import Dispatched, GatewayRequest
from gateway.settings import GatewaySettings
from gateway.sse import USAGE_CAP, EventTooLarge, SseScanner, plausible_usage
from gateway.upstream import Upstream

log = logging.getLogger("sagegate.gateway")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
BACKEND_HEADER = "x-sagegate-backend"
PREDICTED_HEADER = "x-sagegate-predicted-tokens"
RETRYABLE = frozenset({500, 502, 503, 504})
THROTTLED = 429
SHUTDOWN_MESSAGE = "the gateway is shutting down"
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


@dataclass(slots=True)
class Failed:
    """Why one try failed before the first byte; ``retry_after`` is set when the backend said 429."""

    why: str
    throttled: bool = False
    retry_after: str | None = None


class Forwarder:
    def __init__(
        self,
        settings: GatewaySettings,
        dispatcher: Dispatcher,
        pool: BackendPool,
        client: Upstream,
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
        self.closing = False
        """Set by :meth:`close_all`: the gateway is ending what is still running."""
        self.waiting: set[asyncio.Task[Any]] = set()
        """Handlers inside :meth:`run` (queued, or waiting for a first byte or a whole answer)."""
        self.streams: set[SseResponse] = set()

    # --- the attempt loop ---------------------------------------------------------------------
    async def run(self, req: GatewayRequest, inp: PredictInput) -> Response:
        """Queue ``req`` and answer it. Raises :class:`GatewayError` for the gateway's own refusals."""
        retry = self.settings.queue.retry_after_s
        if self.closing:
            raise errors.unavailable("draining", SHUTDOWN_MESSAGE, retry_after=1)
        if not self.pool.any_healthy():
            self.metrics.rejected("no_healthy_backend")
            raise errors.unavailable("no_healthy_backend", "no backend is healthy", retry)
        try:
            fut = self.dispatcher.submit(req)
        except Exception as exc:  # QueueFull
            reason = getattr(exc, "reason", "queue_full")
            self.metrics.rejected(reason)
            raise errors.busy(reason, "the gateway's queue is full", retry) from exc
        task = asyncio.current_task()
        if task is not None:
            self.waiting.add(task)
        try:
            return await self._attempts(req, inp, fut)
        except asyncio.CancelledError:
            if req.backend is not None:
                self.dispatcher.release(req)
                if not self.closing:
                    self.metrics.cancellations.labels("upstream").inc()
            if self.closing and task is not None and task.cancelling():
                task.uncancel()  # cancelled by close_all, not by the client
                self.metrics.rejected("draining")
                raise errors.unavailable("draining", SHUTDOWN_MESSAGE, retry_after=1) from None
            raise
        except errors.GatewayError:
            raise
        except Exception:  # the gateway's own bug: still settle and count the request
            log.exception("request %s failed inside the gateway", req.rid)
            self.dispatcher.release(req)
            self.metrics.requests.labels(req.route, "error").inc()
            raise
        finally:
            if task is not None:
                self.waiting.discard(task)

    async def _attempts(self, req: GatewayRequest, inp: PredictInput, fut: asyncio.Future[int]) -> Response:
        throttled: Failed | None = None
        while True:
            idx = await self._wait(req, fut)
            backend = self.pool.backends[idx]
            outcome = await self._attempt(req, backend, inp)
            if not isinstance(outcome, Failed):
                return outcome
            if outcome.throttled:
                throttled = outcome
            req.attempt += 1
            req.excluded.add(idx)
            if req.attempt >= self.max_attempts or not self._others_healthy(req):
                self.dispatcher.release(req)
                if throttled is not None:
                    self.metrics.rejected("upstream_rate_limited")
                    raise errors.rate_limited(
                        f"the backend is over its rate limit ({throttled.why})", throttled.retry_after
                    )
                self.metrics.rejected("upstream_failed")
                raise errors.upstream_failed(f"backends failed: {outcome.why}")
            self.metrics.retries.labels(backend.name).inc()
            self.dispatcher.release(req, final=False)
            fut = self.dispatcher.requeue(req)

    def _others_healthy(self, req: GatewayRequest) -> bool:
        """Whether a backend ``req`` has not tried yet could take it now."""
        return any(
            b.healthy and i not in req.excluded and b.serves(req.model)
            for i, b in enumerate(self.pool.backends)
        )

    async def _wait(self, req: GatewayRequest, fut: asyncio.Future[int]) -> int:
        """The backend the dispatcher chose; withdraws the request if the wait ends otherwise."""
        limit = self.settings.queue.max_wait_s - (self.dispatcher.clock() - req.t_enqueue)
        try:
            if not fut.done():
                await asyncio.wait((fut,), timeout=max(0.0, limit))
        except BaseException:  # the client went away while queued (or the gateway is closing)
            if not fut.done():
                self.dispatcher.withdraw(req)
                if not self.closing:
                    self.metrics.cancellations.labels("queued").inc()
            elif fut.exception() is None:
                self.dispatcher.release(req)
            raise
        retry = self.settings.queue.retry_after_s
        if not fut.done():
            self.dispatcher.withdraw(req)
            if self.pool.any_healthy():
                self.metrics.rejected("queue_timeout")
                raise errors.busy("queue_timeout", "backends are busy; the request waited too long", retry)
            self.metrics.rejected("no_healthy_backend")
            raise errors.unavailable("no_healthy_backend", "no backend is healthy", retry)
        exc = fut.exception()
        if isinstance(exc, Dispatched):
            self.metrics.rejected(exc.reason)
            if exc.reason == "no_healthy_backend":
                raise errors.unavailable(exc.reason, "no backend is healthy", retry)
            raise errors.busy(exc.reason, f"the scheduling policy refused the request: {exc.reason}", 1)
        return fut.result()

    async def _attempt(self, req: GatewayRequest, b: Backend, inp: PredictInput) -> Response | Failed:
        """One try on backend ``b``: a response for the client, or why it failed before the first byte."""
        resp: httpx.Response | None = None
        handed_over = False
        try:
            try:
                resp = await self.client.send(self._build(req, b), stream=True)
            except Exception as exc:
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=isinstance(exc, httpx.ConnectError))
                return self._failed(b, "", exc)
            if resp.status_code == THROTTLED:  # the backend is busy, not broken: no breaker
                self.dispatcher.first_byte(req)
                retry = resp.headers.get("retry-after") or str(self.settings.queue.retry_after_s)
                return Failed(f"{b.name}: HTTP 429", True, retry)
            if resp.status_code in RETRYABLE:
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=False)
                return Failed(f"{b.name}: HTTP {resp.status_code}")
            if resp.status_code != 200 or not req.stream:
                return await self._whole(req, b, resp, inp)
            scanner = SseScanner(not req.want_usage, self.settings.upstream.max_sse_event_bytes)
            chunks = resp.aiter_raw()
            try:
                first = await anext(chunks)
            except Exception as exc:  # StopAsyncIteration included
                self.dispatcher.first_byte(req)
                self.pool.request_failed(b, hard=False)
                return self._failed(b, "stream ended before its first chunk", exc)
            self._first_byte(req, b)
            handed_over = True
            return SseResponse(self, req, b, inp, resp, chunks, first, scanner)
        finally:
            if not handed_over and resp is not None:
                await close_quietly(resp)

    @staticmethod
    def _failed(b: Backend, what: str, exc: Exception) -> Failed:
        name = type(exc).__name__
        if not isinstance(exc, httpx.HTTPError | StopAsyncIteration):
            log.warning("backend %s: unexpected %s from the upstream client: %s", b.name, name, exc)
        return Failed(f"{b.name}: {what} ({name})" if what else f"{b.name}: {name}")

    async def _whole(
        self, req: GatewayRequest, b: Backend, resp: httpx.Response, inp: PredictInput
    ) -> Response | Failed:
        """A non-streaming answer (or the backend's own client error), read whole then forwarded."""
        try:
            body = await resp.aread()
        except Exception as exc:
            self.dispatcher.first_byte(req)
            self.pool.request_failed(b, hard=False)
            return self._failed(b, "body failed", exc)
        self._first_byte(req, b)
        status = resp.status_code
        output = None
        if status == 200:
            output = self.plausible(req, b, _completion_tokens(body))
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

    def _first_byte(self, req: GatewayRequest, b: Backend) -> None:
        self.dispatcher.first_byte(req)
        now = self.dispatcher.clock()
        b.answered_at = now
        self.metrics.first_token(now - req.arrival_s)

    # --- the end of a dispatched request -------------------------------------------------------
    def plausible(self, req: GatewayRequest, b: Backend, usage: object) -> int | None:
        """The backend's ``completion_tokens`` if it can be true (a non-negative int within the
        request's ``max_tokens``), else None (and a warning): a backend's usage is not trusted."""
        if usage is None:
            return None
        body = req.body
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or USAGE_CAP
        value = plausible_usage(usage, cap)
        if value is None:
            log.warning("backend %s reported implausible usage %r (cap %d); not recorded", b.name, usage, cap)
        return value

    def finish(self, req: GatewayRequest, inp: PredictInput, outcome: str, output: int | None) -> None:
        """Release the reservation; on success, teach the predictor the true length."""
        self.dispatcher.release(req)
        self.metrics.requests.labels(req.route, outcome).inc()
        if outcome == "ok" and output is not None:
            self.metrics.outcome(req.prediction, output, self.dispatcher.clock() - req.arrival_s)
            self.recorder.record(inp, output)

    def close_all(self, message: str = SHUTDOWN_MESSAGE) -> None:
        """End everything still running (the drain deadline): streams with an SSE error event, the
        rest with a 503, every reservation released. New requests get 503 from now on."""
        self.closing = True
        streams, waiting = list(self.streams), list(self.waiting)
        for stream in streams:
            stream.abort(message)
        for task in waiting:
            task.cancel()
        if streams or waiting:
            log.warning("drain deadline: ended %d streams and %d requests", len(streams), len(waiting))


async def close_quietly(resp: httpx.Response) -> None:
    """Close an upstream response; a broken connection may raise anything, and it is closed anyway."""
    try:
        await resp.aclose()
    except Exception as exc:
        log.debug("closing an upstream response raised %s", type(exc).__name__)


class SseResponse(Response):
    """Streams a backend's SSE to the client chunk by chunk.

    A reader task drains the backend as fast as it produces and settles the request (reservation
    released, true length recorded) the moment the backend is done, even if the client is still
    reading: the backend's KV is free then, whatever the client's pace. The response task relays what
    the reader queued, at most ``limits.max_relay_buffer_bytes`` of it: a client that falls further
    behind loses its stream (and the backend request is cancelled), so a client that stops reading
    costs bounded memory and never holds a backend. A client that leaves cancels both, and the
    upstream request with them.
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
        self.buffered = 0
        """Bytes in :attr:`outbox` (the client's backlog)."""
        self.max_buffered = fwd.settings.limits.max_relay_buffer_bytes
        self.settled = False
        self.reader: asyncio.Task[None] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.aborted: str | None = None
        self.dropped = False
        """The client fell more than :attr:`max_buffered` behind: its stream is being cut."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fwd = self.fwd
        self.task = asyncio.current_task()
        fwd.streams.add(self)
        try:
            async with DisconnectGuard(receive) as guard:
                headers = SSE_HEADERS + [
                    (k.encode(), v.encode()) for k, v in _info(self.req, self.backend).items()
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                # The first chunk goes out from here, before the reader task exists: two fewer
                # loop iterations between the backend's first byte and the client's.
                try:
                    first = self.scanner.feed(self.first)
                except EventTooLarge as exc:
                    self._end(b"", "failed", str(exc))
                    first = b""
                if first:
                    fwd.dispatcher.progress(self.req, self.scanner.events)
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                if fwd.closing and self.aborted is None:
                    self.abort(SHUTDOWN_MESSAGE)
                if not self.settled:
                    self.reader = asyncio.get_running_loop().create_task(self._read())
                outbox = self.outbox
                while (data := await outbox.get()) is not None:
                    self.buffered -= len(data)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                guard.done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if self.dropped:
                fwd.metrics.cancellations.labels("slow_client").inc()
            elif guard.disconnected:
                fwd.metrics.cancellations.labels("streaming").inc()
        except asyncio.CancelledError:
            if not self.dropped or self.task is None:
                raise
            self.task.uncancel()  # cut by the relay bound: end without completing the response
            fwd.metrics.cancellations.labels("slow_client").inc()
        finally:
            fwd.streams.discard(self)
            reader = self.reader
            if reader is None:
                await close_quietly(self.upstream)  # the reader never took the stream over
            elif not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            self._settle("cancelled")

    async def _read(self) -> None:
        scanner = self.scanner
        outcome, why = "cancelled", ""
        try:
            async for chunk in self.chunks:
                self._put(scanner.feed(chunk))
            self._put(scanner.flush())
            outcome = "ok" if scanner.done else "truncated"
        except EventTooLarge as exc:
            outcome, why = "failed", str(exc)
            log.warning("backend %s: %s", self.backend.name, why)
        except _ClientTooSlow:
            outcome = "slow_client"
        except Exception as exc:  # whatever the upstream client raises: the backend failed
            outcome = "failed"
            log.warning("backend %s failed mid-stream: %s", self.backend.name, type(exc).__name__)
        finally:
            await close_quietly(self.upstream)
        if outcome == "slow_client":
            self._drop_client()
        else:
            self._end(b"", outcome, why)

    def _end(self, data: bytes, outcome: str, why: str = "") -> None:
        """Queue the stream's end (with an SSE error event unless it ended well), then settle."""
        if outcome != "ok":
            msg = why or (
                "the backend failed mid-stream" if outcome == "failed" else "the backend ended early"
            )
            data += (
                errors.sse_error_event(msg, "draining", "service_unavailable")
                if outcome == "shutdown"
                else errors.sse_error_event(msg)
            )
        if data:
            self.outbox.put_nowait(data)
        self.outbox.put_nowait(None)
        self._settle(outcome)

    def _put(self, data: bytes) -> None:
        if data:
            self.outbox.put_nowait(data)
            self.buffered += len(data)
            self.fwd.dispatcher.progress(self.req, self.scanner.events)
            if self.buffered > self.max_buffered:
                raise _ClientTooSlow

    def _drop_client(self) -> None:
        """The client is too far behind: settle (the upstream is already closed) and cut its stream."""
        self.dropped = True
        log.warning(
            "request %s: the client fell %d bytes behind; its stream is cut", self.req.rid, self.buffered
        )
        self._settle("slow_client")
        outbox = self.outbox
        while not outbox.empty():  # the backlog goes now, not when the relay ends
            outbox.get_nowait()
        self.buffered = 0
        outbox.put_nowait(None)
        abort = CLIENT_ABORT.get()
        if abort is not None:
            abort()  # the connection goes at once, unflushed: the relay then ends as on a disconnect
        elif self.task is not None:
            self.task.cancel()  # a server without the guard: end the response unfinished

    def abort(self, message: str) -> None:
        """End the stream now with an SSE error event ``message`` (the gateway is shutting down)."""
        if self.settled or self.aborted is not None:
            return
        self.aborted = message
        reader = self.reader
        if reader is not None and not reader.done():
            reader.cancel()  # closes the upstream request
        self._end(b"", "shutdown", message)

    def _settle(self, outcome: str) -> None:
        """Once per request: the backend's verdict, then release and record."""
        if self.settled:
            return
        self.settled = True
        fwd, scanner, b = self.fwd, self.scanner, self.backend
        if outcome == "failed":
            fwd.pool.request_failed(b, hard=False)
        elif outcome == "ok":
            fwd.pool.request_succeeded(b)
        output = fwd.plausible(self.req, b, scanner.usage) if outcome == "ok" else None
        fwd.finish(self.req, self.inp, outcome, scanner.events if output is None else output)


class _ClientTooSlow(Exception):
    """Raised in the reader when the client's backlog passes the relay bound."""


def _info(req: GatewayRequest, b: Backend) -> dict[str, str]:
    """Response headers telling the client where its request went and what was predicted."""
    out = {BACKEND_HEADER: b.name}
    if req.prediction is not None:
        out[PREDICTED_HEADER] = str(round(req.prediction.mean))
    return out


def _completion_tokens(body: bytes) -> object:
    """``usage.completion_tokens`` of a whole answer, as sent (checked by ``Forwarder.plausible``)."""
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage.get("completion_tokens") if isinstance(usage, dict) else None
