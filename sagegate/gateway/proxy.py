"""One try of a dispatched request on its backend, and the end of a request the backend answered.

A try is sent over the pooled client; it either fails before the first byte (a :class:`Failed`: nothing
has reached the client yet, so the director may retry it on another backend, invisibly), or becomes
the client's response: a whole answer (settled at once) or a stream (:class:`gateway.stream.SseResponse`,
which settles it when the backend is done). A stream's first chunk is awaited before the client's
response starts, so a backend that dies before its first token still counts as "before the first byte".

Whatever the upstream client raises (httpx's errors, and anything else from below it: a dead socket
has surfaced as an ``AttributeError`` from inside httpcore) is the backend failing; only a
cancellation is the client leaving (or the gateway shutting down, see ``Director.close_all``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.responses import Response

from sagegate.core.outcomes import Outcome
from sagegate.core.predictor import Asked
from sagegate.gateway.access_log import REQUEST_ID_HEADER, AccessLog, access_fields, upstream_id
from sagegate.gateway.backends import Backend, BackendPool
from sagegate.gateway.blame import MAX_ERROR_BYTES, Suspect, error_object
from sagegate.gateway.continuation import Transcript, pausable
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.lifecycle import Lifecycle
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.openai_schema import Route
from sagegate.gateway.predict import Recorder
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.relay_ports import Failed
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.sse import USAGE_CAP, SseScanner, plausible_usage
from sagegate.gateway.stream import SseResponse, answer_headers
from sagegate.gateway.tracing import RequestTrace
from sagegate.gateway.upstream import Upstream, close_quietly
from sagegate.policies.engine_priority import engine_priority

log = logging.getLogger("sagegate.gateway")

PATHS: dict[str, str] = {Route.CHAT: "/v1/chat/completions", Route.COMPLETIONS: "/v1/completions"}
RETRYABLE = frozenset({500, 502, 503, 504})
THROTTLED = 429
REFUSED_US = frozenset({401, 403})
"""A backend's answer to the gateway's credentials (``backends[].api_key``), not to the client's."""


class Proxy:
    """Sends tries upstream and settles what the backend answered; holds the streams being relayed."""

    def __init__(
        self,
        settings: GatewaySettings,
        dispatcher: Dispatcher,
        pool: BackendPool,
        client: Upstream,
        metrics: GatewayMetrics,
        recorder: Recorder,
        tenant_label: Callable[[str], str],
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
        self.access = AccessLog(settings.access_log)
        self.tenant_label = tenant_label
        """A tenant's label on per-tenant metrics (the rate limiter's: a bounded set)."""
        self.closing = False
        """Set by ``Director.close_all``: the gateway is ending what is still running."""
        self.streams: set[SseResponse] = set()

    async def attempt(self, lc: Lifecycle, b: Backend, asked: Asked) -> Response | Failed:
        """One try on backend ``b``: a response for the client, or why it failed before the first byte."""
        req = lc.req
        upstream_stream = self.streams_upstream(req)
        resp = await self.send(lc, b, upstream_stream)
        if isinstance(resp, Failed):
            return resp
        handed_over = False
        try:
            if resp.status_code != 200 or not upstream_stream:
                return await self._whole(lc, b, resp, asked)
            first = await self.first_chunk(lc, b, resp)
            if isinstance(first, Failed):
                return first
            chunks, data = first
            scanner = self.scanner(req)
            transcript = Transcript(req.route, req.body) if self.transcribes(req) else None
            self.answered(lc, b)
            lc.streaming()
            handed_over = True
            sse = SseResponse(self, lc, b, asked, resp, chunks, data, scanner, transcript)
            return sse if req.stream else await sse.collect()
        finally:
            if not handed_over:
                await close_quietly(resp)

    def scanner(self, req: GatewayRequest) -> SseScanner:
        """A scanner for ``req``'s upstream stream: the usage the gateway asked for is kept only for a
        client that asked for it too (or one whose whole answer is assembled from the stream), and
        the running usage on every chunk (:meth:`counts_running`) only for one that asked for that."""
        strip_running = self.counts_running(req) and not _asked_running(req.body)
        return SseScanner(
            req.stream and not req.want_usage, self.settings.upstream.max_sse_event_bytes, strip_running
        )

    def counts_running(self, req: GatewayRequest) -> bool:
        """Whether ``req``'s stream is asked for the backend's running token count on every chunk
        (``continuous_usage_stats``): an answer that may be continued elsewhere must know how many
        tokens its text so far took, which is more than the chunks relayed when the engine holds a
        token back until its text is whole."""
        return self.settings.upstream.running_usage and self.transcribes(req)

    def pause_on(self, req: GatewayRequest) -> bool:
        """Whether ``req`` may be paused (``pause.enabled``, and it can be continued from its text)."""
        return self.settings.pause.enabled and pausable(req.route, req.body)

    def transcribes(self, req: GatewayRequest) -> bool:
        """Whether ``req``'s answer is kept as a transcript it can be continued from: it may be paused,
        or it is streamed and a broken stream is resumed (``pause.resume_broken``)."""
        pause = self.settings.pause
        wanted = pause.enabled or (pause.resume_broken and req.stream)
        return wanted and pausable(req.route, req.body)

    def streams_upstream(self, req: GatewayRequest) -> bool:
        """A streamed client, or one the gateway may pause (its answer is assembled from a stream)."""
        return req.stream or self.pause_on(req)

    async def send(self, lc: Lifecycle, b: Backend, stream: bool) -> httpx.Response | Failed:
        """Send ``lc``'s request to ``b``: the open response, or why it failed before the first byte
        (unreachable, throttled, a server error)."""
        req = lc.req
        sent_at = self.dispatcher.clock()
        try:
            resp = await self.client.send(self._build(req, b, stream), stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never the request's fault
            lc.attempt_failed()
            self.pool.request_failed(b, hard=isinstance(exc, httpx.ConnectError))
            return self._failed(b, "", exc, None)
        except Exception as exc:
            lc.attempt_failed()
            return self._failed(b, "", exc, sent_at)
        if resp.status_code == THROTTLED:  # the backend is busy, not broken: no breaker
            await close_quietly(resp)
            lc.attempt_failed()
            retry = resp.headers.get("retry-after") or str(self.settings.queue.retry_after_s)
            return Failed(f"{b.name}: HTTP 429", True, retry)
        if resp.status_code in REFUSED_US:  # the gateway's key for it is wrong: never the request's fault
            await close_quietly(resp)
            lc.attempt_failed()
            self.pool.request_failed(b, hard=True)
            return Failed(f"{b.name}: HTTP {resp.status_code} (it refused the gateway's credentials)")
        if resp.status_code in RETRYABLE:
            error = error_object(await _head_of_body(resp))
            lc.attempt_failed()
            why = f"{b.name}: HTTP {resp.status_code}"
            if error is not None and error.get("message"):
                why += f" ({str(error['message'])[:200]})"
            return Failed(why, suspect=Suspect(b.name, why, sent_at, error))
        return resp

    async def first_chunk(
        self, lc: Lifecycle, b: Backend, resp: httpx.Response
    ) -> tuple[AsyncIterator[bytes], bytes] | Failed:
        """The stream's chunks and its first one, or why it ended before it."""
        chunks = resp.aiter_raw()
        try:
            first = await anext(chunks)
        except Exception as exc:  # StopAsyncIteration included
            lc.attempt_failed()
            return self._failed(b, "stream ended before its first chunk", exc, self.dispatcher.clock())
        return chunks, first

    @staticmethod
    def _failed(b: Backend, what: str, exc: Exception, suspect_since: float | None) -> Failed:
        """The try failed with ``exc``; with ``suspect_since`` the request may be the cause, and the
        verdict waits for its next try (was the backend answering others after ``suspect_since``?)."""
        name = type(exc).__name__
        if not isinstance(exc, httpx.HTTPError | StopAsyncIteration):
            log.warning("backend %s: unexpected %s from the upstream client: %s", b.name, name, exc)
        why = f"{b.name}: {what} ({name})" if what else f"{b.name}: {name}"
        if suspect_since is None:
            return Failed(why)
        return Failed(why, suspect=Suspect(b.name, why, suspect_since))

    async def _whole(
        self, lc: Lifecycle, b: Backend, resp: httpx.Response, asked: Asked
    ) -> Response | Failed:
        """A non-streaming answer (or the backend's own client error), read whole then forwarded."""
        try:
            body = await resp.aread()
        except Exception as exc:
            lc.attempt_failed()
            return self._failed(b, "body failed", exc, self.dispatcher.clock())
        self.answered(lc, b)
        status = resp.status_code
        output = None
        if status == 200:
            lc.computed()
            output = self.plausible(lc.req, b, _completion_tokens(body))
            self.pool.request_succeeded(b)
        self.settle(lc, asked, Outcome.OK if status == 200 else Outcome.CLIENT_ERROR, output, status)
        headers = {
            "content-type": resp.headers.get("content-type", "application/json"),
            **answer_headers(lc.req, b),
        }
        return Response(body, status_code=status, headers=headers)

    def _build(self, req: GatewayRequest, b: Backend, stream: bool) -> httpx.Request:
        """The upstream request: the client's body as sent, plus what the gateway adds to it (a
        non-streaming request the gateway may pause goes upstream as a stream with usage)."""
        body = req.body
        up = self.settings.upstream
        if stream and not req.stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        elif req.stream and up.force_usage and not req.want_usage:
            body = _with_stream_options(body, include_usage=True)
        if stream and self.counts_running(req):
            body = _with_stream_options(body, include_usage=True, continuous_usage_stats=True)
        if up.rank_priority:
            rank = self.dispatcher.policy.engine_rank(req)
            body = {**body, "priority": engine_priority(rank, req.priority)}  # the band first
        elif up.forward_priority:
            body = {**body, "priority": -req.priority}
        elif "priority" in body:  # the gateway's band alone: a backend not in priority mode refuses it
            body = {k: v for k, v in body.items() if k != "priority"}
        tries = req.attempt + req.pauses
        headers = {"content-type": "application/json", REQUEST_ID_HEADER: upstream_id(req.request_id, tries)}
        if req.trace is not None:
            headers.update(req.trace.upstream(b.name, tries))
        return self.client.build_request(
            "POST",
            b.url + PATHS[req.route],
            content=json.dumps(body, separators=(",", ":")).encode(),
            headers=headers,
            timeout=self.timeout,
        )

    def ended(self, trace: RequestTrace | None, fields: dict[str, Any]) -> None:
        """A request ended: its access-log line, and its trace closed with the same figures."""
        self.access.write(fields)
        if trace is not None:
            trace.end(fields)

    def answered(self, lc: Lifecycle, b: Backend, *, first_token: bool = True) -> None:
        """The backend's first byte: time to first token (not for a resumed try), and the backend is
        alive."""
        lc.answered()
        now = self.dispatcher.clock()
        b.answered_at = now
        if first_token:
            lc.req.t_first = now
            if lc.req.trace is not None:
                lc.req.trace.phase("stream")
            self.metrics.first_token(now - lc.req.arrival_s)

    # --- the end of a request the backend answered -----------------------------------------------
    def plausible(self, req: GatewayRequest, b: Backend, usage: object) -> int | None:
        """The backend's ``completion_tokens`` if it can be true (a non-negative int within the
        request's ``max_tokens``), else None (and a warning): a backend's usage is not trusted."""
        if usage is None:
            return None
        cap = req.max_tokens or USAGE_CAP
        value = plausible_usage(usage, cap)
        if value is None:
            log.warning("backend %s reported implausible usage %r (cap %d); not recorded", b.name, usage, cap)
        return value

    def settle(
        self, lc: Lifecycle, asked: Asked, outcome: Outcome, output: int | None, status: int = 200
    ) -> None:
        """End the request (its reservation released) and write its access-log line; on success,
        teach the predictor the true length. ``status``: what the client was answered."""
        req = lc.req
        b = self.pool.backends[req.backend].name if req.backend is not None else None
        req.output_tokens = output
        lc.finish(outcome)
        now = self.dispatcher.clock()
        self.metrics.requests.labels(req.route, outcome).inc()
        fields = access_fields(req, status, outcome, now, b, output)
        if outcome is Outcome.OK and b is not None:
            fields.update(self.judge_forecast(req, b, now))
        self.ended(req.trace, fields)
        label = self.tenant_label(req.tenant)
        self.metrics.tenant_tokens.labels(label, "prompt").inc(req.prompt_tokens)
        if output:
            self.metrics.tenant_tokens.labels(label, "output").inc(output)
        if outcome is Outcome.OK and output is not None:
            ttft = None if req.t_first is None else req.t_first - req.arrival_s
            self.metrics.outcome(req.prediction, output, now - req.arrival_s, ttft)
            self.recorder.record(asked, output)

    def judge_forecast(self, req: GatewayRequest, backend: str, now: float) -> dict[str, float | None]:
        """A completed request's forecast beside its outcome (its access-log fields, from its arrival
        as its other times are): only a request that ran in one piece from one send (no pause, no
        resume) is judged, since only its forecast described what happened."""
        forecast, sent = req.forecast, req.t_dispatch
        if forecast is None or sent is None or req.pauses or req.resumed_from:
            return {}
        first = None if req.t_first is None or req.t_first < sent else req.t_first - sent
        judged = self.metrics.forecast(backend, forecast, first, now - sent)
        queued = sent - req.arrival_s
        return {
            "forecast_ttft_s": None if judged.ttft_s is None else queued + judged.ttft_s,
            "forecast_ttlt_s": None if judged.ttlt_s is None else queued + judged.ttlt_s,
        }


async def _head_of_body(resp: httpx.Response) -> bytes:
    """Up to ``MAX_ERROR_BYTES`` of an error answer's body, decoded (then the response is closed)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.aiter_bytes():
            parts.append(chunk)
            size += len(chunk)
            if size >= MAX_ERROR_BYTES:
                break
    except Exception:  # a body that breaks off says no more about why
        pass
    finally:
        await close_quietly(resp)
    return b"".join(parts)


def _with_stream_options(body: dict[str, Any], **options: bool) -> dict[str, Any]:
    """``body`` with ``options`` set in its ``stream_options`` (the client's others kept)."""
    opts = body.get("stream_options")
    return {**body, "stream_options": {**(opts if isinstance(opts, dict) else {}), **options}}


def _asked_running(body: dict[str, Any]) -> bool:
    """The client itself asked for the running usage on every chunk."""
    opts = body.get("stream_options")
    return (
        isinstance(opts, dict)
        and opts.get("continuous_usage_stats") is True
        and opts.get("include_usage") is True
    )


def _completion_tokens(body: bytes) -> object:
    """``usage.completion_tokens`` of a whole answer, as sent (checked by ``Proxy.plausible``)."""
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage.get("completion_tokens") if isinstance(usage, dict) else None
