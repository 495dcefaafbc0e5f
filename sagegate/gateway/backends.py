"""The backend pool: what the gateway knows of each engine, kept fresh by one probe task per backend.

Each backend has a :class:`BackendLoad` (the admission rule's view: capacity, charge, waiting, health)
that the dispatcher reads and charges. A probe task reads the backend's ``/metrics`` every
``scrape_interval_s`` (waiting requests, KV capacity and usage) and its ``/health`` every
``probe_interval_s``; a :class:`CircuitBreaker` takes the backend out of rotation after repeated
failures and puts it back on the first successful probe once it has been open long enough. A probe
that times out while the backend is answering real requests is no verdict (a busy gateway loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

import httpx

from sagegate.gateway.metrics import RateLimitedLog
from sagegate.gateway.redact import redact_url
from sagegate.gateway.scrape import EngineMetrics, SpeedFromScrapes, parse_metrics, restarted
from sagegate.gateway.settings import BackendSettings, GatewaySettings, HealthSettings
from sagegate.gateway.upstream import Upstream
from sagegate.policies.admission import BackendLoad
from sagegate.policies.engine_speed import EngineSpeed, SpeedFit
from sagegate.policies.prefix_index import PrefixIndex
from sagegate.policies.prompt_share import PromptShare

if TYPE_CHECKING:
    from sagegate.gateway.kv_events import KVEventFollower

log = logging.getLogger("sagegate.gateway")

Clock = Callable[[], float]


class CircuitBreaker:
    """Closed → open after ``threshold`` consecutive failures (or one hard failure, e.g. connection
    refused); open for at least ``open_s`` from that opening; then the next success closes it.

    Failures while open do not move the window: a backend that was down for a minute is back in
    rotation on its first successful probe, not ``open_s`` after its last failed one (under load,
    probes failing while it restarted kept a breaker open for 17.5 s)."""

    __slots__ = ("clock", "failures", "open_s", "opened_at", "threshold")

    def __init__(self, threshold: int, open_s: float, clock: Clock = time.monotonic) -> None:
        self.threshold = threshold
        self.open_s = open_s
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def failure(self, hard: bool = False) -> bool:
        """Record a failure; returns True if this one opened the circuit."""
        self.failures += 1
        if self.opened_at is None and (hard or self.failures >= self.threshold):
            self.opened_at = self.clock()
            return True
        return False

    def success(self) -> bool:
        """Record a success; returns True if this one closed the circuit."""
        if self.opened_at is None:
            self.failures = 0
            return False
        if self.clock() - self.opened_at >= self.open_s:
            self.opened_at = None
            self.failures = 0
            return True
        return False


class Backend:
    """One engine: its address, its admission view and what the probes last saw."""

    def __init__(
        self, cfg: BackendSettings, default_capacity: int, health: HealthSettings, clock: Clock
    ) -> None:
        self.url = cfg.url
        """Where requests go, credentials included (never shown: :attr:`shown_url`)."""
        self.shown_url = redact_url(cfg.url)
        """The URL as routes, logs, labels and other replicas see it (``gateway.redact``)."""
        self.name = cfg.name or self.shown_url
        self.configured_capacity = cfg.capacity_tokens
        self.breaker = CircuitBreaker(health.failure_threshold, health.open_s, clock)
        self.load = BackendLoad(cfg.capacity_tokens or default_capacity, healthy=False)
        self.probe_ok = False
        self.metrics: EngineMetrics | None = None
        self.models: list[dict[str, Any]] = []
        self.inflight = 0
        self.dispatched = 0
        self.failures = 0
        self.answered_at: float | None = None
        self.kv_usage: float | None = None
        """The engine's own KV gauge at the last scrape (a fraction of its capacity; None: not reported)."""
        """When a real request last got an answer here (first byte or end): a probe that times out
        meanwhile says more about the gateway's busy loop than about the backend."""
        # The backend's waiting list, estimated (see :meth:`scraped`): our requests that have not
        # produced a byte, in dispatch order (rid -> prompt tokens); of those, the ones sent since the
        # last scrape began (counted as waiting until their first byte or ``pending_s``); and the ones
        # the last scrape's count is attributed to.
        self.unstarted: dict[Any, int] = {}
        self.pending: dict[Any, int] = {}
        self.in_scrape: dict[Any, int] = {}
        """Pending ones sent before the scrape under way began: still counted until it answers."""
        self.attributed: dict[Any, int] = {}
        self._snapshot: list[Any] = []
        self.scraped_waiting = 0
        self.scraped_tokens = 0
        self.others_running = 0
        """Running requests the last scrape counted beyond ours (other clients', other replicas')."""
        self.pending_tokens = 0
        self.mean_prompt = 512.0
        """Running mean of the prompts sent here: the guess for waiting requests that are not ours."""
        # What our in-flight requests hold by our count (prompt and generated tokens), now and when
        # the last scrape began; against the engine's KV gauge it gives the prompt share.
        self.held_prompt = 0
        self.held_generated = 0
        self._held_at_scrape = (0, 0)
        self.prompt_share = PromptShare()
        self.prefix_block_tokens = 16
        """Tokens per block of :attr:`prefix` (``gateway.locality`` sets its own)."""
        self.prefix = PrefixIndex(self.load.capacity_tokens // self.prefix_block_tokens)
        """The prompt blocks predicted cached here (``gateway.locality``), bounded by the capacity."""
        self.kv: KVEventFollower | None = None
        """Its KV-cache events, when it publishes them (``gateway.kv_events``: the exact index)."""
        self.speed = SpeedFromScrapes(SpeedFit(EngineSpeed()))
        """Its speed, learned from its counters between scrapes (``forecast`` placement may read it)."""
        self._clock = clock

    @property
    def healthy(self) -> bool:
        return self.load.healthy

    def update_health(self) -> bool:
        """Recompute ``load.healthy``; returns whether it changed. A backend that goes down is
        predicted to come back with an empty cache."""
        healthy = self.probe_ok and not self.breaker.is_open
        changed = healthy != self.load.healthy
        self.load.healthy = healthy
        if changed and not healthy:
            self.forget_cache()
        return changed

    def forget_cache(self) -> None:
        """It went down or restarted: predict its cache empty (both indexes)."""
        self.prefix.clear()
        if self.kv is not None:
            self.kv.lost()

    def serves(self, model: str) -> bool:
        return not self.models or any(m.get("id") == model for m in self.models)

    # --- the local estimate of the backend's waiting list ----------------------------------
    def sent(self, rid: Any, prompt_tokens: int) -> None:
        """A request went out: it waits there until it produces a byte (or ``expire``)."""
        self.inflight += 1
        self.dispatched += 1
        self.held_prompt += prompt_tokens
        self.unstarted[rid] = prompt_tokens
        self.pending[rid] = prompt_tokens
        self.pending_tokens += prompt_tokens
        self.mean_prompt += 0.05 * (prompt_tokens - self.mean_prompt)
        self._refresh()

    def expire(self, rid: Any) -> None:
        """``pending_s`` passed: assume the engine scheduled it (the next scrape says otherwise)."""
        tokens = self.pending.pop(rid, None)
        if tokens is not None:
            self.pending_tokens -= tokens
        in_scrape = self.in_scrape.pop(rid, None) is not None
        if tokens is not None or in_scrape:
            self._refresh()

    def started(self, rid: Any) -> None:
        """It produced its first byte, or ended: it waits no more (idempotent)."""
        if self.unstarted.pop(rid, None) is None:
            return
        self.expire(rid)
        tokens = self.attributed.pop(rid, None)
        if tokens is not None:
            self.scraped_waiting = max(0, self.scraped_waiting - 1)
            self.scraped_tokens -= tokens
        self._refresh()

    def progressed(self, new_tokens: int) -> None:
        """One of ours generated ``new_tokens`` more."""
        self.held_generated += new_tokens

    def left(self, rid: Any, prompt_tokens: int, generated: int) -> None:
        """One of ours left (done, failed or cancelled) after generating ``generated`` tokens."""
        self.started(rid)
        self.inflight -= 1
        self.held_prompt -= prompt_tokens
        self.held_generated -= generated
        self._refresh()

    def scrape_begins(self) -> None:
        """From now on the scrape accounts for what was sent so far."""
        self._snapshot = list(self.unstarted)
        self._held_at_scrape = (self.held_prompt, self.held_generated)
        # Until the answer comes they still count (a slow scrape must not open a gap in the estimate).
        self.in_scrape.update(self.pending)
        self.pending.clear()
        self.pending_tokens = 0

    def scraped(self, m: EngineMetrics) -> None:
        """The engine reports ``m.waiting`` requests waiting. An engine starts requests in arrival
        order, so ours among them are the most recently sent of those still without a byte; any
        beyond ours (other clients') count as the running mean prompt sent here."""
        if restarted(self.metrics, m):
            self.forget_cache()
            self.speed.restarted()
        if self.speed.scraped(self._clock(), m):
            self.load.speed = self.speed.fit.speed
        self.metrics = m
        self.in_scrape.clear()
        still = [rid for rid in self._snapshot if rid in self.unstarted]
        ours = still[max(0, len(still) - m.waiting) :] if m.waiting else []
        self.attributed = {rid: self.unstarted[rid] for rid in ours}
        tokens = sum(self.attributed.values())
        if m.waiting > len(ours):
            tokens += round(self.mean_prompt * (m.waiting - len(ours)))
        self.scraped_waiting = m.waiting
        self.scraped_tokens = tokens
        self.others_running = max(0, m.running - self.own_running)
        if m.prefix_queries:
            self.load.prefix_hit_ratio = (m.prefix_hits or 0.0) / m.prefix_queries
        self.kv_usage = m.kv_usage
        capacity = self.configured_capacity or m.capacity_tokens
        if capacity:
            self.load.capacity_tokens = capacity
            self.prefix.resize(capacity // self.prefix_block_tokens)
            if self.kv is not None:
                self.kv.resize(capacity)
        if self.kv is not None:
            self.kv.engine_block_size(m.block_size)
        if m.kv_usage is not None and m.capacity_tokens:
            # Ours that the engine runs: those in flight when the scrape began, less those it waits on.
            prompt, generated = self._held_at_scrape
            running_prompt = prompt - sum(self.attributed.values())
            kv_tokens = m.kv_usage * m.capacity_tokens
            self.prompt_share.observe(kv_tokens, generated, running_prompt, m.capacity_tokens)
        self._refresh()

    @property
    def own_running(self) -> int:
        """Ours that have produced a byte and not ended: running there now, by our own count."""
        return self.inflight - len(self.unstarted)

    def _refresh(self) -> None:
        self.load.running = self.own_running + self.others_running
        self.load.waiting = self.scraped_waiting + len(self.pending) + len(self.in_scrape)
        self.load.waiting_tokens = (
            max(0, self.scraped_tokens) + self.pending_tokens + sum(self.in_scrape.values())
        )


class BackendPool:
    """All backends, their probe tasks and the shared upstream client."""

    def __init__(
        self,
        settings: GatewaySettings,
        client: Upstream,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.settings = settings
        self.health = settings.health
        self.client = client
        self.on_change = on_change
        self.clock = clock
        self._refused = RateLimitedLog(
            log,
            "%d probe(s) refused the gateway's credentials: backend %s was started with --api-key; "
            "set its api_key (backends[].api_key, or upstream.api_key for all). Unhealthy until then.",
            level=logging.ERROR,
        )
        self.backends = [
            Backend(b, settings.default_capacity_tokens, settings.health, clock) for b in settings.backends
        ]
        self.loads = [b.load for b in self.backends]
        self.prompt_share = 1.0
        """The share of a prompt's tokens a request is charged (see ``policies.prompt_share``): the
        healthy backends' estimates, weighted by capacity."""
        self.measure_share = settings.admission.prompt_share
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        return len(self.backends)

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.backends)

    def can_serve(self, model: str, excluding: Container[int] = ()) -> bool:
        """Whether a healthy backend serving ``model``, other than those indexed in ``excluding``, could
        take a request now (a retry, or the resume of a broken stream, has somewhere to go)."""
        return any(b.healthy and i not in excluding and b.serves(model) for i, b in enumerate(self.backends))

    def models(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for b in self.backends:
            for m in b.models:
                seen.setdefault(str(m.get("id")), m)
        return list(seen.values())

    async def start(self) -> None:
        """One probe round (so the gateway starts knowing who is up), then the probe tasks."""
        await asyncio.gather(*(self._probe_round(b, health=True) for b in self.backends))
        self._tasks = [asyncio.create_task(self._run(b), name=f"probe-{b.name}") for b in self.backends]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def update_share(self) -> None:
        """Recompute :attr:`prompt_share` from the backends' latest estimates."""
        if not self.measure_share:
            return
        num = den = 0.0
        for b in self.backends:
            if b.healthy:
                num += b.prompt_share.value * b.load.capacity_tokens
                den += b.load.capacity_tokens
        self.prompt_share = num / den if den > 0 else 1.0

    # --- outcomes of real requests ------------------------------------------------------------
    def request_failed(self, b: Backend, hard: bool) -> None:
        b.failures += 1
        if b.breaker.failure(hard):
            log.warning("backend %s: circuit opened after %d failures", b.name, b.breaker.failures)
        if b.update_health():
            self.on_change()

    def request_succeeded(self, b: Backend) -> None:
        b.answered_at = self.clock()
        if b.breaker.failures or b.breaker.is_open:
            b.breaker.success()
            if b.update_health():
                self.on_change()

    # --- probing ------------------------------------------------------------------------------
    async def _run(self, b: Backend) -> None:
        h = self.health
        next_probe = self.clock() + h.probe_interval_s
        while True:
            await asyncio.sleep(h.scrape_interval_s)
            now = self.clock()
            probe = now >= next_probe or not b.healthy
            if probe:
                next_probe = now + h.probe_interval_s
            try:
                await self._probe_round(b, health=probe)
            except Exception:  # a probe must never kill its task
                log.exception("backend %s: probe failed unexpectedly", b.name)

    async def _probe_round(self, b: Backend, health: bool) -> None:
        ok = True
        if health:
            answer = await self._get_ok(b, "/health")
            if answer is None and self._answering(b):
                answer = b.probe_ok  # a timeout alone, while real requests get answers: no verdict
            ok = bool(answer)
            if ok and not b.models:  # what it serves, and whether it takes the gateway's credentials
                ok = await self._fetch_models(b)
            b.probe_ok = ok
            if ok:
                if b.breaker.is_open:
                    b.breaker.success()
            else:
                b.breaker.failure()
        if ok:
            b.scrape_begins()
            text = await self._get_text(b, "/metrics")
            if text is not None:
                b.scraped(parse_metrics(text))
        changed = b.update_health()
        self.update_share()
        if b.healthy and (changed or not b.models):
            await self._fetch_models(b)
        if changed:
            log.info("backend %s is now %s", b.name, "healthy" if b.healthy else "unhealthy")
        self.on_change()

    def _answering(self, b: Backend) -> bool:
        """Whether ``b`` answered a real request within the last probe timeout and interval."""
        h = self.health
        at = b.answered_at
        return at is not None and self.clock() - at <= h.probe_timeout_s + h.probe_interval_s

    async def _get_ok(self, b: Backend, path: str) -> bool | None:
        """200 or not; None if the probe timed out (which may be the gateway's loop, not ``b``)."""
        try:
            r = await self.client.get(b.url + path, timeout=self.health.probe_timeout_s)
            return r.status_code == 200
        except httpx.TimeoutException:
            return None
        except Exception:  # httpx's errors, and whatever a broken socket raises from below it
            return False

    async def _get_text(self, b: Backend, path: str) -> str | None:
        try:
            r = await self.client.get(b.url + path, timeout=self.health.probe_timeout_s)
        except Exception:
            return None
        return r.text if r.status_code == 200 else None

    async def _fetch_models(self, b: Backend) -> bool:
        """Read what ``b`` serves; False if it refuses the gateway's credentials (401 or 403: a
        backend started with ``--api-key`` and no ``api_key`` set for it here), which no request
        it is sent could pass: it is not healthy then."""
        try:
            r = await self.client.get(b.url + "/v1/models", timeout=self.health.probe_timeout_s)
            if r.status_code in (401, 403):
                self._refused.note(f"{b.name} (HTTP {r.status_code})")
                return False
            data = r.json().get("data") if r.status_code == 200 else None
        except Exception:  # unreachable, or not JSON, or not a mapping
            return True
        if isinstance(data, list):
            b.models = [m for m in data if isinstance(m, dict) and "id" in m]
        return True
