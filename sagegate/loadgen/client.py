"""Open-loop replay of a workload against any OpenAI-compatible endpoint (this gateway, vLLM, a proxy).

Open loop: each request leaves at its scheduled time whether or not earlier ones have finished, so a
slow server meets the trace's load instead of slowing the client down. The only brake is the
connection limit; every send it delays is counted and reported. Times are seconds from the replay's
start in the workload's clock (``time_scale`` > 1 replays against a backend running that much faster
and records its engine seconds), with ``arrival_s`` the scheduled send time — the simulator's
convention, so live and simulated runs compare directly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sagegate.core.record import RequestRecord
from sagegate.core.request import FORCED_OUTPUT_FIELD, TraceRequest
from sagegate.loadgen.httppool import ClientPool
from sagegate.loadgen.progress import ProgressView
from sagegate.loadgen.response import fail, finish, http_failure, read_headers, read_stream, unsent
from sagegate.loadgen.scrape import GaugeSamples, poll_gauge, read_preemptions

log = logging.getLogger(__name__)

APIS = ("completions", "chat")
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class ReplayConfig:
    url: str
    """Base URL of the server (``http://host:port``, with or without ``/v1``)."""
    api: str = "completions"
    model: str | None = None
    """Model name; None asks the server's ``/v1/models`` for the first one."""
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    """``max_tokens`` for a request that carries no client cap of its own (None: send none). Never the
    request's true output length: see :func:`loadgen.records.with_client_cap`."""
    force_output: bool = True
    """Send each request's true output length in :data:`~core.request.FORCED_OUTPUT_FIELD`, which
    only a simulated backend honours (a real vLLM ignores it; its outputs are the model's own)."""
    spread: list[str] = field(default_factory=list)
    """Base URLs to send request ``i`` to in turn (``i mod n``): a plain round-robin balancer, i.e. vLLM
    alone behind a load balancer. Empty: everything goes to ``url``."""
    backend_metrics: list[str] = field(default_factory=list)
    """``/metrics`` URLs whose ``vllm:num_preemptions`` counters are read before and after the run
    (empty: the server's own ``/metrics``, which a vLLM has and a gateway does not)."""
    max_connections: int = 1000
    timeout_s: float = 600.0
    """Per request, wall seconds from send to the end of the stream."""
    time_scale: float = 1.0
    trace_headers: bool = True
    """Send the trace's tenant, priority and deadline as ``x-tenant``/``x-priority``/``x-deadline-ms``."""
    queue_metric: str | None = "sagegate_queue_depth"
    """Prometheus gauge polled from ``metrics_url`` during the run (None: no polling)."""
    metrics_url: str | None = None
    """Default: ``<url>/metrics``."""
    metrics_interval_s: float = 0.5
    predicted_header: str = "x-sagegate-predicted-tokens"
    backend_header: str = "x-sagegate-backend"
    progress: bool = False
    prime: bool = True
    """Send one unrecorded one-token request before the clock starts (cold caches, connection setup)."""
    start_delay_s: float = 0.05

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError("time_scale must be a positive number")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")

    @property
    def base_url(self) -> str:
        base = self.url.rstrip("/")
        return base[:-3] if base.endswith("/v1") else base

    @property
    def endpoint(self) -> str:
        return self.base_url + PATHS[self.api]

    def endpoints(self) -> list[str]:
        """Where requests go, in turn."""
        bases = [u.rstrip("/").removesuffix("/v1") for u in self.spread] or [self.base_url]
        return [b + PATHS[self.api] for b in bases]


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    t0: float
    """The event loop's clock (``time.monotonic``) at workload time 0."""
    wall_s: float
    model: str | None
    max_connections: int
    delayed_sends: int = 0
    """Sends the connection limit held back."""
    max_send_delay_s: float = 0.0
    queue_metric: str | None = None
    queue_samples: list[tuple[float, float]] = field(default_factory=list)
    metrics_failures: int = 0
    preemptions: float | None = None
    """The backends' preemptions during the run (their counters' difference); None: not readable."""
    forced_mismatch: int | None = None
    """Completed requests whose output differs from the forced length (None: nothing was forced).
    Zero: a simulated backend honoured the forcing; many: a real model chose its own lengths."""

    def meta(self) -> dict[str, Any]:
        """What a results file's ``.meta.json`` sidecar keeps besides the records."""
        return {
            "model": self.model,
            "wall_s": self.wall_s,
            "max_connections": self.max_connections,
            "delayed_sends": self.delayed_sends,
            "max_send_delay_s": self.max_send_delay_s,
            "queue_metric": self.queue_metric,
            "queue_samples": self.queue_samples,
            "metrics_failures": self.metrics_failures,
            "preemptions": self.preemptions,
            "forced_mismatch": self.forced_mismatch,
        }

    def outputs_note(self) -> str:
        """What the output lengths of this run are: forced (a simulated backend) or the model's own."""
        ok = sum(r.status == "ok" for r in self.records)
        if self.forced_mismatch is None:
            return "outputs: the model's own (no forced lengths sent)"
        if self.forced_mismatch == 0:
            return f"outputs: the trace's lengths, forced on the backend (all {ok} completed requests)"
        return (
            f"outputs: the model's own: {self.forced_mismatch} of {ok} completed requests differ from "
            "the trace's length (a real model ignores the forcing field)"
        )


def request_body(req: TraceRequest, cfg: ReplayConfig, model: str | None) -> bytes:
    """The JSON body: the prompt, the client's cap as ``max_tokens``, streamed with usage, and the true
    output length only in :data:`FORCED_OUTPUT_FIELD` (never in a field a scheduler reads)."""
    if req.prompt is None:
        raise ValueError(f"request {req.rid} has no prompt text: prepare the workload with prompts")
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    if cfg.api == "chat":
        history = req.extra.get("messages")  # a session's turn: its whole conversation so far
        body["messages"] = history if isinstance(history, list) else [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    cap = req.max_tokens if req.max_tokens is not None else cfg.max_tokens
    if cap is not None:
        body["max_tokens"] = cap
    if cfg.force_output:
        body[FORCED_OUTPUT_FIELD] = forced_length(req, cfg)
    body.update(stream=True, stream_options={"include_usage": True})
    body.update(cfg.extra_body)
    return json.dumps(body).encode()


def forced_length(req: TraceRequest, cfg: ReplayConfig) -> int:
    """The output a simulated backend is told to generate: the trace's, within the client's cap."""
    cap = req.max_tokens if req.max_tokens is not None else cfg.max_tokens
    return max(1, req.output_tokens if cap is None else min(req.output_tokens, cap))


def request_headers(req: TraceRequest, cfg: ReplayConfig) -> dict[str, str]:
    """Per-request headers: the body's type, and the trace's tenant, priority and relative deadline."""
    out = {"content-type": "application/json"}
    if not cfg.trace_headers:
        return out
    if req.tenant != "default":
        out["x-tenant"] = req.tenant
    if req.priority != 1:
        out["x-priority"] = str(req.priority)
    if req.deadline_s is not None:
        out["x-deadline-ms"] = str(max(1, round((req.deadline_s - req.arrival_s) / cfg.time_scale * 1000)))
    return out


async def prime(client: httpx.AsyncClient, cfg: ReplayConfig, model: str | None) -> None:
    """One small request, answered before the replay starts; its outcome does not matter."""
    warm = TraceRequest(0.0, 2, 1, prompt="warm up")
    body = json.loads(request_body(warm, cfg, model))
    body.pop("stream_options", None)
    body.update(stream=False, max_tokens=1)
    with contextlib.suppress(httpx.HTTPError):
        await client.post(cfg.endpoint, json=body, timeout=min(cfg.timeout_s, 60.0))


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str | None:
    """The first model ``/v1/models`` lists, None when the server does not say."""
    try:
        resp = await client.get(base_url + "/v1/models", timeout=10.0)
        data = resp.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


class _Replay:
    """One run: the schedule, the in-flight requests, the metrics poller and the progress view."""

    def __init__(self, requests: Sequence[TraceRequest], cfg: ReplayConfig, clients: ClientPool) -> None:
        self.requests = list(requests)
        self.cfg = cfg
        self.clients = clients
        self.chat = cfg.api == "chat"
        self.endpoints = cfg.endpoints()
        self.sem = asyncio.Semaphore(cfg.max_connections)
        self.loop = asyncio.get_running_loop()
        self.t0 = 0.0
        self.records = [unsent(r) for r in self.requests]
        self.delayed = 0
        self.max_delay = 0.0
        self.finished = self.ok = self.failed = self.tokens = 0
        self.recent_ttft: collections.deque[float] = collections.deque(maxlen=200)
        self.queue = GaugeSamples()
        """The queue-depth gauge polled during the run."""
        self.stop = asyncio.Event()

    def now(self) -> float:
        return (self.loop.time() - self.t0) * self.cfg.time_scale

    async def run(self, model: str | None) -> None:
        bodies = [request_body(r, self.cfg, model) for r in self.requests]
        headers = [request_headers(r, self.cfg) for r in self.requests]
        self.t0 = self.loop.time() + self.cfg.start_delay_s
        helpers = []
        cfg = self.cfg
        if cfg.queue_metric:
            url = cfg.metrics_url or cfg.base_url + "/metrics"
            poll = poll_gauge(
                url,
                cfg.queue_metric,
                self.queue,
                now=self.now,
                stop=self.stop,
                interval_s=cfg.metrics_interval_s,
                headers=_auth(cfg),
            )
            helpers.append(asyncio.create_task(poll))
        view = ProgressView(self) if self.cfg.progress else None
        if view is not None:
            helpers.append(asyncio.create_task(view.run(self.stop)))
        tasks: list[asyncio.Task[None]] = []
        try:
            scale = self.cfg.time_scale
            for i, req in enumerate(self.requests):
                delay = self.t0 + req.arrival_s / scale - self.loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._send(i, bodies[i], headers[i])))
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            self.stop.set()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _send(self, i: int, body: bytes, headers: dict[str, str]) -> None:
        rec = self.records[i]
        held = self.sem.locked()
        if held:
            self.delayed += 1
        async with self.sem:
            rec.sent_s = self.now()
            if held:
                self.max_delay = max(self.max_delay, rec.sent_s - rec.arrival_s)
            rec.reason = "in flight"  # the outcome below sets status and reason
            try:
                async with asyncio.timeout(self.cfg.timeout_s):
                    await self._exchange(rec, body, headers, self.endpoints[i % len(self.endpoints)])
            except TimeoutError:
                fail(rec, "timeout", f"no end of stream within {self.cfg.timeout_s}s")
            except httpx.ConnectError as exc:
                fail(rec, "connect", str(exc))
            except httpx.RemoteProtocolError as exc:
                fail(rec, "protocol", str(exc))
            except httpx.HTTPError as exc:
                fail(rec, type(exc).__name__.lower(), str(exc))
            except asyncio.CancelledError:
                fail(rec, "cancelled", "replay stopped")
                rec.status = "cancelled"
                raise
            finally:
                self._tally(rec)

    def _tally(self, rec: RequestRecord) -> None:
        """Running figures for the progress bar, so it never rescans the records."""
        self.finished += 1
        if rec.status == "ok":
            self.ok += 1
            self.tokens += rec.output_tokens
            if rec.ttft is not None:
                self.recent_ttft.append(rec.ttft)
        elif rec.status in ("error", "rejected"):
            self.failed += 1

    async def _exchange(self, rec: RequestRecord, body: bytes, headers: dict[str, str], url: str) -> None:
        pool = self.clients
        slot = pool.acquire()
        try:
            await self._stream(pool.clients[slot], rec, body, headers, url)
        finally:
            pool.release(slot)

    async def _stream(
        self, client: httpx.AsyncClient, rec: RequestRecord, body: bytes, headers: dict[str, str], url: str
    ) -> None:
        async with client.stream("POST", url, content=body, headers=headers) as resp:
            rec.first_byte_s = self.now()
            rec.http_status = resp.status_code
            read_headers(rec, resp.headers, self.cfg.predicted_header, self.cfg.backend_header)
            if resp.status_code != 200:
                http_failure(rec, resp.status_code, resp.headers, await resp.aread())
                return
            end = await read_stream(resp, rec.chunk_times, self.now, self.chat)
        finish(rec, end)


def _auth(cfg: ReplayConfig) -> dict[str, str]:
    return {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def replay_async(requests: Sequence[TraceRequest], cfg: ReplayConfig) -> ReplayResult:
    """Replay ``requests`` (with prompt text) at their arrival times; every request gets a record."""
    clients = ClientPool({**_auth(cfg), **cfg.headers})
    try:
        model = cfg.model or await discover_model(clients.first, cfg.base_url)
        if cfg.prime:
            await prime(clients.first, cfg, model)
        counters = cfg.backend_metrics or [cfg.base_url + "/metrics"]
        before = await read_preemptions(clients.first, counters)
        run = _Replay(requests, cfg, clients)
        start = run.loop.time()
        await run.run(model)
        wall = run.loop.time() - start
        after = await read_preemptions(clients.first, counters) if before is not None else None
    finally:
        await clients.aclose()
    if run.delayed:
        log.warning(
            "the connection limit (%d) delayed %d sends, by up to %.3fs",
            cfg.max_connections,
            run.delayed,
            run.max_delay,
        )
    return ReplayResult(
        records=run.records,
        t0=run.t0,
        wall_s=wall,
        model=model,
        max_connections=cfg.max_connections,
        delayed_sends=run.delayed,
        max_send_delay_s=run.max_delay,
        queue_metric=cfg.queue_metric,
        queue_samples=run.queue.samples,
        metrics_failures=run.queue.failures,
        preemptions=None if before is None or after is None else after - before,
        forced_mismatch=_forced_mismatch(run.requests, run.records, cfg),
    )


def _forced_mismatch(
    requests: Sequence[TraceRequest], records: Sequence[RequestRecord], cfg: ReplayConfig
) -> int | None:
    if not cfg.force_output:
        return None
    return sum(
        rec.status == "ok" and rec.output_tokens != forced_length(req, cfg)
        for req, rec in zip(requests, records, strict=True)
    )


def replay(requests: Sequence[TraceRequest], cfg: ReplayConfig) -> ReplayResult:
    """:func:`replay_async` on a fresh event loop."""
    return asyncio.run(replay_async(requests, cfg))
