"""Pause and transparent resume of a streamed request: the mechanism.

:meth:`Resumer.pause` takes a running request off its backend: the reader of its upstream stream is
cancelled (the connection closes, the backend frees its KV), its reservation is released (by its
:class:`~gateway.lifecycle.Lifecycle`, once) and it goes back into the dispatcher's queue as a
continuation (``gateway.continuation``), charged for its prompt plus what it generated and for the
rest its prediction expects given that it has gone on. The client's stream stays open and silent
meanwhile. Dispatched again (any backend), the continuation's stream is relayed rewritten as the rest
of the first: one id, no repeated or missing token, one usage.

A paused request is never lost: if it waits past ``queue.max_wait_s`` again, or no backend is
healthy, or every try of the resume fails, the stream ends with an OpenAI-style SSE error event;
a client that leaves withdraws it from the queue; a drain ends it like any stream
(``Director.close_all``). Which request to pause, and when, is the policy's business
(``Dispatcher.pause``); this module only makes a pause safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx

from sagegate.core.outcomes import Outcome
from sagegate.gateway import errors
from sagegate.gateway.backends import Backend
from sagegate.gateway.continuation import Transcript
from sagegate.gateway.dispatcher import PauseVerdict
from sagegate.gateway.lifecycle import RequestState
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.relay_ports import Failed, Relay
from sagegate.gateway.tokens import backend_ids, count_prompt
from sagegate.gateway.tries import Ending, Tries, TriesEnded
from sagegate.gateway.upstream import close_quietly

Opened = tuple[Backend, httpx.Response, AsyncIterator[bytes], bytes]
"""A resumed try that has answered: its backend, response, chunks and first chunk."""

log = logging.getLogger("sagegate.gateway")


class Resumer:
    """The pause and resume of one relayed stream (``gateway.stream.SseResponse``, seen through
    ``gateway.relay_ports.Relay``)."""

    __slots__ = ("key", "pausing", "sse", "transcript")

    def __init__(self, sse: Relay, transcript: Transcript) -> None:
        self.sse = sse
        self.transcript = transcript
        self.pausing = False
        """Between a pause and the resumed try's first chunk."""
        self.key = str(sse.req.rid)

    @property
    def request(self) -> GatewayRequest:
        return self.sse.req

    def register(self) -> None:
        """Offer it to pausing (only where pausing is on: a resumer may exist to recover a broken stream)."""
        dispatcher = self.sse.proxy.dispatcher
        if dispatcher.pause_enabled or dispatcher.pause_bands:
            dispatcher.pausable[self.key] = self

    def unregister(self) -> None:
        pausable = self.sse.proxy.dispatcher.pausable
        if pausable.get(self.key) is self:
            del pausable[self.key]

    def pause(self) -> PauseVerdict:
        """Pause now, if the request is still being generated; the resume runs as the stream's reader."""
        sse = self.sse
        reader = sse.reader
        if (
            self.pausing
            or sse.stopping
            or sse.lc.state is not RequestState.STREAMING
            or reader is None
            or reader.done()
            or sse.aborted is not None
            or sse.scanner.done
            or self.transcript.finished
            or not self.transcript.carried()
        ):
            return PauseVerdict.NOT_PAUSABLE
        if sse.req.pauses >= sse.proxy.settings.pause.max_pauses:
            return PauseVerdict.LIMIT
        self.pausing = True
        self.unregister()
        reader.cancel()  # closes the upstream request: the backend frees the request's KV
        self._requeue(None, "paused")  # now: the caller's dispatch pass sees the room it freed
        sse.reader = asyncio.get_running_loop().create_task(self._resume(reader))
        return PauseVerdict.PAUSED

    def recoverable(self) -> bool:
        """Whether a stream its backend broke mid-way can go on elsewhere (as a pause would): another
        healthy backend serves its model (else the client hears of the failure now, not at the queue's
        timeout)."""
        sse = self.sse
        req = sse.req
        return (
            not self.pausing
            and sse.lc.state is RequestState.STREAMING
            and sse.aborted is None
            and not sse.proxy.closing
            and not self.transcript.finished
            and self.transcript.carried()
            and req.pauses < sse.proxy.settings.pause.max_pauses
            and sse.proxy.pool.can_serve(req.model, () if req.backend is None else (req.backend,))
        )

    async def recover(self) -> None:
        """The backend broke the stream mid-way (died, cut the connection): continue it on another
        backend, the client seeing nothing but a longer gap. Runs in the stream's reader task."""
        sse = self.sse
        self.pausing = True
        self.unregister()
        failed = sse.req.backend
        sse.proxy.pool.request_failed(sse.backend, hard=False)
        self._requeue(failed, "recovered")
        await self._continue()

    async def _resume(self, old: asyncio.Task[None]) -> None:
        await asyncio.wait((old,))  # its upstream response is closed when it ends (our own cancel raises)
        await self._continue()

    def _requeue(self, exclude: int | None, event: str) -> None:
        """Release its reservation and queue it again as the continuation of what the client has
        (``exclude``: a backend not to go back to). The reader must be stopped (or be the caller):
        nothing more of the old try reaches the client."""
        sse = self.sse
        lc, req, t = sse.lc, sse.req, self.transcript
        t.read()  # what the client has been sent (an unfinished event is dropped: it comes again)
        if sse.scanner.running is not None:
            t.counted(sse.scanner.running)
        req.body = t.continuation()
        lc.pause(t.tokens)
        if exclude is not None:
            req.excluded.add(exclude)  # before the dispatch pass, which runs at the next iteration
        sse.proxy.metrics.pauses.labels(event).inc()

    async def _continue(self) -> None:
        """Wait for the continuation's dispatch, then relay on from the resumed try's first chunk."""
        sse, t = self.sse, self.transcript
        metrics = sse.proxy.metrics
        opened = await self._reopen()
        if isinstance(opened, bytes):
            metrics.pauses.labels("failed").inc()
            sse.blame_backend = False
            sse.end(b"", Outcome.FAILED, event=opened)
            return
        b, resp, chunks, first = opened
        sse.switch(b, resp, chunks)
        prompt = await self._client_prompt_tokens(b)
        t.resumed(self._prompt_offset() if prompt is None else 0, prompt)  # the fallback only if needed
        self.pausing = False
        self.register()
        metrics.pauses.labels("resumed").inc()
        await sse.read(first)

    async def _client_prompt_tokens(self, b: Backend) -> int | None:
        """The client's prompt in tokens as backend ``b`` counts it (its ``/tokenize``: the same
        model's tokenizer and chat template as the first try's), for the usage the client sees; None
        if it cannot tell (the gateway's own count of the difference is used then)."""
        proxy, t = self.sse.proxy, self.transcript
        timeout = proxy.settings.placement.kv_events.tokenize_timeout_s
        ids = await backend_ids(proxy.client, b.url, t.body, t.chat, timeout)
        return None if ids is None else max(1, len(ids))

    def _prompt_offset(self) -> int:
        """Tokens the continuation's prompt holds beyond the client's (counted as the gateway counts the
        client's), taken off the backend's ``prompt_tokens`` in the usage the client sees."""
        req = self.sse.req
        body = req.body
        prompt = body.get("messages") if "messages" in body else body.get("prompt")
        try:
            return max(0, count_prompt(prompt, self.sse.proxy.settings.tokenizer) - req.prompt_tokens)
        except (TypeError, ValueError, AttributeError, IndexError, KeyError):
            return self.transcript.tokens

    async def _reopen(self) -> Opened | bytes:
        """Wait for the continuation's dispatch and open its stream, trying another backend on a
        failure before its first chunk (the gateway's one retry loop, ``gateway.tries``, without
        blame: the client has part of an answer already). Returns ``(backend, response, chunks, first
        chunk)``, or the SSE error event that ends the client's stream."""
        proxy = self.sse.proxy
        tries = Tries(self.sse.lc, proxy.pool, proxy.metrics, proxy.settings)
        try:
            return await tries.run(self._open)
        except TriesEnded as ended:
            return self._refusal(ended)

    async def _open(self, b: Backend) -> Opened | Failed:
        """One try of the continuation on ``b``: its stream once its first chunk came, or why not."""
        proxy, lc, req = self.sse.proxy, self.sse.lc, self.sse.req
        resp = await proxy.send(lc, b, True)
        if not isinstance(resp, httpx.Response):
            return resp
        if resp.status_code != 200:
            try:
                body = await resp.aread()
            finally:
                await close_quietly(resp)
            lc.attempt_failed()
            why = f"{b.name}: HTTP {resp.status_code} {body[:200]!r}"
            log.warning("request %s: the resume was refused: %s", req.rid, why)
            return Failed(why)
        try:
            first = await proxy.first_chunk(lc, b, resp)
        except BaseException:  # cancelled: the client left, or the gateway is closing
            await close_quietly(resp)
            raise
        if isinstance(first, Failed):
            await close_quietly(resp)
            return first
        proxy.answered(lc, b, first_token=False)
        lc.streaming()
        return b, resp, first[0], first[1]

    def _refusal(self, ended: TriesEnded) -> bytes:
        """The SSE error event that ends the client's stream when the resume cannot go on."""
        metrics = self.sse.proxy.metrics
        match ended.ending:
            case Ending.QUEUE_TIMEOUT | Ending.NO_HEALTHY_BACKEND:
                metrics.rejected(ended.reason)
                if ended.ending is Ending.QUEUE_TIMEOUT:
                    why, kind = "backends are busy", "rate_limit_exceeded"
                else:
                    why, kind = "no backend is healthy", "service_unavailable"
                return errors.sse_error_event(
                    f"{why}; the paused request waited too long to resume", ended.reason, kind
                )
            case Ending.REFUSED:
                metrics.rejected(ended.reason)
                return errors.sse_error_event(
                    f"the paused request cannot resume: {ended.reason}", ended.reason
                )
        return errors.sse_error_event(f"the paused request could not resume: {ended.why}")
