"""The relay of a backend's SSE stream to the client, chunk by chunk, settling the request the moment
the backend is done (whatever the client's pace), with bounded memory for a client that falls behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from sagegate.core.outcomes import CancelStage, Outcome, Reason
from sagegate.core.predictor import Asked
from sagegate.gateway import errors
from sagegate.gateway.access_log import REQUEST_ID_HEADER as CLIENT_ID_HEADER
from sagegate.gateway.backends import Backend
from sagegate.gateway.client_guard import CLIENT_ABORT
from sagegate.gateway.continuation import Transcript, assemble
from sagegate.gateway.disconnect import DisconnectGuard
from sagegate.gateway.lifecycle import Lifecycle
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.relay_ports import RelayHost
from sagegate.gateway.resume import Resumer
from sagegate.gateway.sse import EventTooLarge, SseScanner
from sagegate.gateway.upstream import close_quietly

log = logging.getLogger("sagegate.gateway")

BACKEND_HEADER = "x-sagegate-backend"
REQUEST_ID_HEADER = "x-sagegate-request-id"
"""The gateway's id of the request (what ``POST /admin/requests/{id}/pause`` takes)."""
PREDICTED_HEADER = "x-sagegate-predicted-tokens"
PREDICTION_PATH_HEADER = "x-sagegate-prediction-path"
"""How the prediction in ``PREDICTED_HEADER`` was made when the answer began: the predictor's path
(``late``: it was the prior, the predictor's own answer still to come)."""
PREFIX_HIT_HEADER = "x-sagegate-prefix-hit"
"""The prompt tokens predicted cached on the backend the request went to (cache-aware placement)."""
SHUTDOWN_MESSAGE = "the gateway is shutting down"
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


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
        proxy: RelayHost,
        lc: Lifecycle,
        backend: Backend,
        asked: Asked,
        upstream: httpx.Response,
        chunks: AsyncIterator[bytes],
        first: bytes,
        scanner: SseScanner,
        transcript: Transcript | None = None,
    ) -> None:
        self.proxy = proxy
        self.lc = lc
        self.req = lc.req
        self.backend = backend
        self.asked = asked
        self.upstream = upstream
        self.chunks = chunks
        self.first = first
        self.scanner = scanner
        self.status_code = 200
        self.background = None
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.buffered = 0
        """Bytes in :attr:`outbox` (the client's backlog)."""
        self.max_buffered = proxy.settings.limits.max_relay_buffer_bytes
        self.reader: asyncio.Task[None] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.aborted: str | None = None
        self.dropped = False
        """The client fell more than :attr:`max_buffered` behind: its stream is being cut."""
        self.stopping = False
        """The relay is ending (the client left, or the stream ended): no pause may start now."""
        self.transcript = transcript
        """What the client has been sent (when the request may be paused, ``gateway.resume``)."""
        self.resumer = Resumer(self, transcript) if transcript is not None else None
        self.blame_backend = True
        """A failure is the backend's (False: a resume that found no backend)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.proxy
        self.task = asyncio.current_task()
        proxy.streams.add(self)
        try:
            async with DisconnectGuard(receive) as guard:
                headers = SSE_HEADERS + [
                    (k.encode(), v.encode()) for k, v in answer_headers(self.req, self.backend).items()
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                # The first chunk goes out from here, before the reader task exists: two fewer
                # loop iterations between the backend's first byte and the client's.
                try:
                    first = self.scanner.feed(self.first)
                except EventTooLarge as exc:
                    self.end(b"", Outcome.FAILED, str(exc))
                    first = b""
                first = self._relay(first)
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                self._start()
                outbox = self.outbox
                while (data := await outbox.get()) is not None:
                    self.buffered -= len(data)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                guard.done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if self.dropped:
                proxy.metrics.cancellations.labels(CancelStage.SLOW_CLIENT).inc()
            elif guard.disconnected:
                proxy.metrics.cancellations.labels(CancelStage.STREAMING).inc()
        except asyncio.CancelledError:
            if not self.dropped or self.task is None:
                raise
            self.task.uncancel()  # cut by the relay bound: end without completing the response
            proxy.metrics.cancellations.labels(CancelStage.SLOW_CLIENT).inc()
        finally:
            await self._stop_reader()
            self._settle(Outcome.CANCELLED)

    def _start(self) -> None:
        """Hand the stream to the reader task (and make it pausable)."""
        if self.proxy.closing and self.aborted is None:
            self.abort(SHUTDOWN_MESSAGE)
        if not self.lc.final:
            self.reader = asyncio.get_running_loop().create_task(self.read())
            if self.resumer is not None:
                self.resumer.register()

    def _relay(self, data: bytes) -> bytes:
        """Events on their way to the client: counted, and (a resumed try's) rewritten."""
        if data:
            self.proxy.dispatcher.progress(self.req, self.req.resumed_from + self.scanner.events)
            if self.transcript is not None:
                data = self.transcript.relay(data)
        return data

    async def collect(self) -> Response:
        """For a client that did not ask for a stream (the gateway streams it to be able to pause it):
        read it whole, then answer with one body assembled from it."""
        self.task = asyncio.current_task()
        self.proxy.streams.add(self)
        parts: list[bytes] = []
        try:
            try:
                first = self._relay(self.scanner.feed(self.first))
            except EventTooLarge as exc:
                self.end(b"", Outcome.FAILED, str(exc))
                first = b""
            parts.append(first)
            self._start()
            outbox = self.outbox
            while (data := await outbox.get()) is not None:
                self.buffered -= len(data)
                parts.append(data)
        finally:
            await self._stop_reader()
            self._settle(Outcome.CANCELLED)
        status, body = assemble(self.req.route, b"".join(parts))
        return JSONResponse(body, status_code=status, headers=answer_headers(self.req, self.backend))

    async def _stop_reader(self) -> None:
        """Stop the reader. No pause may start from here on: the reader's cancellation yields
        (closing its upstream), and a pause in that gap would queue a continuation that nobody reads
        and that the settle after this withdraws."""
        self.proxy.streams.discard(self)
        self.stopping = True
        if self.resumer is not None:
            self.resumer.unregister()
        reader = self.reader
        if reader is None:
            await close_quietly(self.upstream)  # the reader never took the stream over
        elif not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def read(self, first: bytes = b"") -> None:
        scanner = self.scanner
        outcome, why = Outcome.CANCELLED, ""
        broke = False
        """The backend broke the stream (not a bad event): it may go on elsewhere."""
        try:
            if first:
                self._put(scanner.feed(first))
            async for chunk in self.chunks:
                self._put(scanner.feed(chunk))
            self._put(scanner.flush())
            outcome = Outcome.OK if scanner.done else Outcome.TRUNCATED
            broke = not scanner.done
        except EventTooLarge as exc:
            outcome, why = Outcome.FAILED, str(exc)
            log.warning("backend %s: %s", self.backend.name, why)
        except _ClientTooSlow:
            outcome = Outcome.SLOW_CLIENT
        except Exception as exc:  # whatever the upstream client raises: the backend failed
            outcome, broke = Outcome.FAILED, True
            log.warning("backend %s failed mid-stream: %s", self.backend.name, type(exc).__name__)
        finally:
            await close_quietly(self.upstream)
        if outcome is Outcome.SLOW_CLIENT:
            self._drop_client()
        elif broke and self.resumer is not None and self.resumer.recoverable():
            await self.resumer.recover()
        else:
            kept = self.resumer.transcript.uncarried if broke and self.resumer is not None else None
            if kept is not None:
                why = f"the backend failed mid-stream; a response with {kept} cannot be resumed elsewhere"
            self.end(b"", outcome, why)

    def switch(self, b: Backend, upstream: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
        """A resumed try on ``b`` has answered: relay from it now, counted by a fresh scanner."""
        self.backend, self.upstream, self.chunks = b, upstream, chunks
        self.scanner = self.proxy.scanner(self.req)

    def end(self, data: bytes, outcome: Outcome, why: str = "", event: bytes | None = None) -> None:
        """Queue the stream's end (with an SSE error event, ``event`` or one made of ``why``, unless
        it ended well), then settle."""
        if event is not None:
            data += event
        elif outcome is not Outcome.OK:
            msg = why or (
                "the backend failed mid-stream" if outcome is Outcome.FAILED else "the backend ended early"
            )
            data += (
                errors.sse_error_event(msg, Reason.DRAINING, "service_unavailable")
                if outcome is Outcome.SHUTDOWN
                else errors.sse_error_event(msg)
            )
        if data:
            self.outbox.put_nowait(data)
        self.outbox.put_nowait(None)
        self._settle(outcome)

    def _put(self, data: bytes) -> None:
        data = self._relay(data)
        if data:
            self.outbox.put_nowait(data)
            self.buffered += len(data)
            if self.buffered > self.max_buffered:
                raise _ClientTooSlow

    def _drop_client(self) -> None:
        """The client is too far behind: settle (the upstream is already closed) and cut its stream."""
        self.dropped = True
        log.warning(
            "request %s: the client fell %d bytes behind; its stream is cut", self.req.rid, self.buffered
        )
        self._settle(Outcome.SLOW_CLIENT)
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
        if self.lc.final or self.aborted is not None:
            return
        self.aborted = message
        reader = self.reader
        if reader is not None and not reader.done():
            reader.cancel()  # closes the upstream request
        self.end(b"", Outcome.SHUTDOWN, message)

    def _settle(self, outcome: Outcome) -> None:
        """Once per request (the reader, the relay and a drain may each end it): the backend's
        verdict, then release and record."""
        if self.resumer is not None:
            self.resumer.unregister()
        if self.lc.final:
            return
        proxy, scanner, b = self.proxy, self.scanner, self.backend
        if outcome is Outcome.FAILED and self.blame_backend:
            proxy.pool.request_failed(b, hard=False)
        elif outcome is Outcome.OK:
            proxy.pool.request_succeeded(b)
        before = self.req.resumed_from
        usage = scanner.usage
        total = before + usage if isinstance(usage, int) and not isinstance(usage, bool) else None
        output = proxy.plausible(self.req, b, total) if outcome is Outcome.OK else None
        proxy.settle(self.lc, self.asked, outcome, before + scanner.events if output is None else output)


class _ClientTooSlow(Exception):
    """Raised in the reader when the client's backlog passes the relay bound."""


def answer_headers(req: GatewayRequest, b: Backend) -> dict[str, str]:
    """Response headers telling the client where its request went and what was predicted."""
    out = {BACKEND_HEADER: b.name, REQUEST_ID_HEADER: str(req.rid), CLIENT_ID_HEADER: req.request_id}
    if req.prediction is not None:
        out[PREDICTED_HEADER] = str(round(req.prediction.mean))
        out[PREDICTION_PATH_HEADER] = req.prediction_path
    if req.prefix_hits is not None:
        out[PREFIX_HIT_HEADER] = str(req.predicted_cached)
    return out
