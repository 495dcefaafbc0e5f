"""The backend pool: what the gateway knows of each engine, kept fresh by one probe task per backend.

Each backend has a :class:`BackendLoad` (the admission rule's view: capacity, charge, waiting, health)
that the dispatcher reads and charges. A probe task reads the backend's ``/metrics`` every
``scrape_interval_s`` (waiting requests, KV capacity) and its ``/health`` every ``probe_interval_s``;
a :class:`CircuitBreaker` takes the backend out of rotation after repeated failures and puts it back on
the first successful probe once it has been open long enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from gateway.scrape import EngineMetrics, parse_metrics
from gateway.settings import BackendSettings, GatewaySettings, HealthSettings
from policies.admission import BackendLoad

log = logging.getLogger("sagegate.gateway")

Clock = Callable[[], float]


class CircuitBreaker:
    """Closed → open after ``threshold`` consecutive failures (or one hard failure, e.g. connection
    refused); open for at least ``open_s``; then the next success closes it."""

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
        if self.opened_at is not None:
            self.opened_at = self.clock()
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
        self.name = cfg.name or cfg.url
        self.url = cfg.url
        self.configured_capacity = cfg.capacity_tokens
        self.breaker = CircuitBreaker(health.failure_threshold, health.open_s, clock)
        self.load = BackendLoad(cfg.capacity_tokens or default_capacity, healthy=False)
        self.probe_ok = False
        self.metrics: EngineMetrics | None = None
        self.models: list[dict[str, Any]] = []
        self.inflight = 0
        self.dispatched = 0
        self.failures = 0
        self.scraped_waiting = 0
        self.pending = 0
        """Requests sent since the last scrape was taken that have not produced a byte yet."""
        self.epoch = 0

    @property
    def healthy(self) -> bool:
        return self.load.healthy

    def update_health(self) -> bool:
        """Recompute ``load.healthy``; returns whether it changed."""
        healthy = self.probe_ok and not self.breaker.is_open
        changed = healthy != self.load.healthy
        self.load.healthy = healthy
        return changed

    def serves(self, model: str) -> bool:
        return not self.models or any(m.get("id") == model for m in self.models)

    # --- the local estimate of the backend's waiting list ----------------------------------
    def sent(self) -> int:
        """A request went out; returns the epoch it belongs to (see :meth:`started`)."""
        self.inflight += 1
        self.dispatched += 1
        self.pending += 1
        self.load.waiting = self.scraped_waiting + self.pending
        return self.epoch

    def started(self, epoch: int) -> None:
        """A request sent in ``epoch`` produced its first byte or ended: it waits no more."""
        if epoch == self.epoch and self.pending > 0:
            self.pending -= 1
            self.load.waiting = self.scraped_waiting + self.pending

    def scrape_begins(self) -> None:
        self.epoch += 1
        self.pending = 0

    def scraped(self, m: EngineMetrics) -> None:
        self.metrics = m
        self.scraped_waiting = m.waiting
        self.load.waiting = m.waiting + self.pending
        self.load.running = m.running
        capacity = self.configured_capacity or m.capacity_tokens
        if capacity:
            self.load.capacity_tokens = capacity


class BackendPool:
    """All backends, their probe tasks and the shared upstream client."""

    def __init__(
        self,
        settings: GatewaySettings,
        client: httpx.AsyncClient,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.settings = settings
        self.health = settings.health
        self.client = client
        self.on_change = on_change
        self.clock = clock
        self.backends = [
            Backend(b, settings.default_capacity_tokens, settings.health, clock) for b in settings.backends
        ]
        self.loads = [b.load for b in self.backends]
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        return len(self.backends)

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.backends)

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

    # --- outcomes of real requests ------------------------------------------------------------
    def request_failed(self, b: Backend, hard: bool) -> None:
        b.failures += 1
        if b.breaker.failure(hard):
            log.warning("backend %s: circuit opened after %d failures", b.name, b.breaker.failures)
        if b.update_health():
            self.on_change()

    def request_succeeded(self, b: Backend) -> None:
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
            ok = await self._get_ok(b, "/health")
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
        if b.healthy and (changed or not b.models):
            await self._fetch_models(b)
        if changed:
            log.info("backend %s is now %s", b.name, "healthy" if b.healthy else "unhealthy")
        self.on_change()

    async def _get_ok(self, b: Backend, path: str) -> bool:
        try:
            r = await self.client.get(b.url + path, timeout=self.health.probe_timeout_s)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _get_text(self, b: Backend, path: str) -> str | None:
        try:
            r = await self.client.get(b.url + path, timeout=self.health.probe_timeout_s)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def _fetch_models(self, b: Backend) -> None:
        try:
            r = await self.client.get(b.url + "/v1/models", timeout=self.health.probe_timeout_s)
            data = r.json().get("data") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        if isinstance(data, list):
            b.models = [m for m in data if isinstance(m, dict) and "id" in m]
