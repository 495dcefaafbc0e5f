"""Per-tenant rate limits (``rate_limits``): requests and tokens per minute, requests at once.

A request is checked once, after its prompt is counted and before it is queued
(:meth:`RateLimiter.admit`); over a limit it is refused with ``429`` (``rate_limit_exceeded``) and a
``Retry-After``. Admitted, it holds a :class:`Permit` until it ends (its ``Lifecycle``'s end, however
that comes), which gives its concurrency back and counts its output tokens. With a ``redis_url`` the
counts live in Redis (``gateway.rate_limit_script``: atomic, so N replicas hold one limit between
them, not N); Redis unreachable, each replica counts alone (:class:`LocalCounts`) until it answers
again. The limits, and the key → tenant map, can live in a file re-read when it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from sagegate.gateway import errors
from sagegate.gateway.rate_limit_rule import WINDOW_S, Refusal, Window, decide
from sagegate.gateway.rate_limit_script import ACQUIRE_LUA, RELEASE_LUA, RENEW_LUA
from sagegate.gateway.settings_rate_limits import LimitsFile, RateLimitSettings, TenantLimits

log = logging.getLogger("sagegate.gateway")


@dataclass
class _Tenant:
    minutes: dict[int, list[float]] = field(default_factory=dict)
    """minute → [requests, tokens]"""
    running: int = 0


class LocalCounts:
    """The rule over this replica's own counts (no Redis, or Redis unreachable)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def acquire(self, tenant: str, limits: TenantLimits, prompt_tokens: int) -> Refusal | None:
        now = self.clock()
        t = self._tenants.setdefault(tenant, _Tenant())
        minute = math.floor(now / WINDOW_S)
        prev, curr = t.minutes.get(minute - 1, [0.0, 0.0]), t.minutes.get(minute, [0.0, 0.0])
        w = Window(now, (prev[0], curr[0]), (prev[1], curr[1]), t.running)
        refused = decide(limits, w)
        if refused is None:
            counts = t.minutes.setdefault(minute, [0.0, 0.0])
            counts[0] += 1
            counts[1] += prompt_tokens
            t.running += 1
            for old in [m for m in t.minutes if m < minute - 1]:
                del t.minutes[old]
        return refused

    def release(self, tenant: str, output_tokens: int, done: bool = True) -> None:
        """``output_tokens`` more generated; ``done``: the request ended (its place given back)."""
        t = self._tenants.get(tenant)
        if t is None:
            return
        if done:
            t.running = max(0, t.running - 1)
        if output_tokens > 0:
            t.minutes.setdefault(math.floor(self.clock() / WINDOW_S), [0.0, 0.0])[1] += output_tokens


class RedisCounts:
    """The rule in Redis over every replica's counts; :class:`LocalCounts` while Redis fails."""

    def __init__(self, url: str, settings: RateLimitSettings, local: LocalCounts) -> None:
        import redis.asyncio as aioredis

        self.settings = settings
        self.local = local
        self.replica = uuid.uuid4().hex[:12]
        self._redis = aioredis.Redis.from_url(url, socket_timeout=settings.timeout_s)
        self._acquire = self._redis.register_script(ACQUIRE_LUA)
        self._release = self._redis.register_script(RELEASE_LUA)
        self._renew = self._redis.register_script(RENEW_LUA)
        self.failures = 0

    def _keys(self, tenant: str) -> list[str]:
        p = self.settings.redis_prefix
        return [f"{p}:{{{tenant}}}:counts", f"{p}:{{{tenant}}}:live"]

    async def acquire(
        self, tenant: str, limits: TenantLimits, prompt_tokens: int, now: float | None = None
    ) -> tuple[Refusal | None, bool]:
        """(The refusal or None, whether Redis decided)."""
        args: list[Any] = [self.replica, "" if now is None else repr(now), self.settings.lease_s]
        args += [limits.requests_per_minute or 0, limits.tokens_per_minute or 0, limits.concurrent or 0]
        args.append(prompt_tokens)
        try:
            got = await asyncio.wait_for(
                self._acquire(keys=self._keys(tenant), args=args), self.settings.timeout_s
            )
        except Exception as exc:  # Redis down or slow: this replica counts alone
            self._failed(exc)
            return self.local.acquire(tenant, limits, prompt_tokens), False
        if int(got[0]) == 1:
            return None, True
        kind = got[1].decode() if isinstance(got[1], bytes) else str(got[1])
        return Refusal(kind, int(got[2])), True

    async def release(
        self, tenant: str, output_tokens: int, now: float | None = None, done: bool = True
    ) -> None:
        args: list[Any] = [
            self.replica,
            "" if now is None else repr(now),
            self.settings.lease_s,
            output_tokens,
            "1" if done else "0",
        ]
        try:
            await asyncio.wait_for(self._release(keys=self._keys(tenant), args=args), self.settings.timeout_s)
        except Exception as exc:
            self._failed(exc)

    async def renew(self, tenants: set[str]) -> None:
        """Keep this replica's lease (its requests in flight count) while it holds any."""
        for tenant in tenants:
            args: list[Any] = [self.replica, "", self.settings.lease_s]
            try:
                await asyncio.wait_for(
                    self._renew(keys=self._keys(tenant), args=args), self.settings.timeout_s
                )
            except Exception as exc:
                self._failed(exc)
                return

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 1000 == 0:
            log.warning(
                "rate limits: Redis failed (%s); this replica counts alone meanwhile", type(exc).__name__
            )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._redis.aclose()


STREAM_CHARGE_TOKENS = 64
"""A stream's output is counted against its tenant's tokens per minute each time this many more
tokens have been relayed (and the rest when it ends): a long answer counts as it streams, not all at
its end, at one Redis call per this many tokens."""


class Permit:
    """An admitted request's hold on its tenant's counts: output counted as it streams
    (:meth:`streamed`), given back once (:meth:`end`)."""

    __slots__ = ("_charged", "_done", "limiter", "shared", "tenant")

    def __init__(self, limiter: RateLimiter, tenant: str, shared: bool) -> None:
        self.limiter = limiter
        self.tenant = tenant
        self.shared = shared
        self._done = False
        self._charged = 0

    def streamed(self, generated: int) -> None:
        """``generated`` output tokens relayed so far."""
        if self._done or generated - self._charged < STREAM_CHARGE_TOKENS:
            return
        more, self._charged = generated - self._charged, generated
        self.limiter.counted(self, more, done=False)

    def end(self, output_tokens: int | None) -> None:
        if self._done:
            return
        self._done = True
        self.limiter.counted(self, max(0, (output_tokens or 0) - self._charged), done=True)


class RateLimiter:
    """The gateway's rate limits: :meth:`admit` before a request is queued."""

    def __init__(
        self, settings: RateLimitSettings, api_keys: dict[str, str], redis_url: str | None = None
    ) -> None:
        self.settings = settings
        self.api_keys = dict(api_keys)
        """Key → tenant in force (the file's, once read)."""
        self._base = (settings.default, settings.tenants, dict(api_keys))
        self.default, self.tenants = settings.default, dict(settings.tenants)
        self.local = LocalCounts()
        self.redis = RedisCounts(redis_url, settings, self.local) if redis_url else None
        self._file_state: tuple[int, ...] | None = None
        self._checked = -math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._holding: dict[str, int] = {}
        self.reload()

    # --- the limits in force ------------------------------------------------------------------
    def reload(self, force: bool = False) -> bool:
        """Re-read ``rate_limits.file`` if it changed (at most every ``reload_s``); True if it did. A
        file that cannot be read or parsed keeps the limits in force (and says why in the log)."""
        path = self.settings.file
        now = time.monotonic()
        if path is None or (not force and now - self._checked < self.settings.reload_s):
            return False
        self._checked = now
        try:
            st = os.stat(path)
            state: tuple[int, ...] = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            state = ()
        if state == self._file_state:
            return False
        self._file_state = state  # a bad file is reported once, not at every check
        try:
            with open(path, encoding="utf-8") as fh:
                parsed = LimitsFile.model_validate(yaml.safe_load(fh) or {})
        except Exception as exc:
            log.error("rate_limits.file %s: %s; the limits in force stay", path, exc)
            return False
        default, tenants, keys = self._base
        self.default = parsed.default or default
        self.tenants = dict(parsed.tenants if parsed.tenants is not None else tenants)
        self.api_keys = dict(parsed.api_keys if parsed.api_keys is not None else keys)
        log.info("rate limits read from %s: %d tenants, %d keys", path, len(self.tenants), len(self.api_keys))
        return True

    def limits_of(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.default)

    def tenant_label(self, tenant: str) -> str:
        """``tenant`` if the configuration names it (a key's tenant, or one with limits), else
        ``other``: a client-chosen ``x-tenant`` cannot grow a metric's label set."""
        if tenant == "default" or tenant in self.tenants or tenant in self.api_keys.values():
            return tenant
        return "other"

    # --- a request ---------------------------------------------------------------------------
    async def admit(self, tenant: str, prompt_tokens: int) -> Permit | None:
        """A permit (None when the tenant has no limits), or ``429`` over a limit."""
        limits = self.limits_of(tenant)
        if not limits.limited:
            return None
        if self.redis is not None:
            refused, shared = await self.redis.acquire(tenant, limits, prompt_tokens)
        else:
            refused, shared = self.local.acquire(tenant, limits, prompt_tokens), False
        if refused is not None:
            wait = refused.retry_after_s
            raise errors.limit_exceeded(
                f"tenant {tenant!r} is over its {_NAMES[refused.kind]}; retry after {wait} s", wait
            )
        self._holding[tenant] = self._holding.get(tenant, 0) + 1
        if shared and self.redis is not None and (self._renewer is None or self._renewer.done()):
            self._renewer = asyncio.get_running_loop().create_task(self._renew_while_holding())
        return Permit(self, tenant, shared)

    def counted(self, permit: Permit, output_tokens: int, done: bool) -> None:
        """``output_tokens`` more of ``permit``'s output; ``done``: its request ended."""
        tenant = permit.tenant
        if done:
            left = self._holding.get(tenant, 1) - 1
            if left > 0:
                self._holding[tenant] = left
            else:
                self._holding.pop(tenant, None)
        if permit.shared and self.redis is not None:
            self._spawn(self.redis.release(tenant, output_tokens, done=done))
        else:
            self.local.release(tenant, output_tokens, done)

    async def _renew_while_holding(self) -> None:
        assert self.redis is not None
        while self._holding:
            await asyncio.sleep(self.settings.lease_s / 3)
            await self.redis.renew(set(self._holding))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        for task in list(self._tasks):
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), 1.0)
        if self.redis is not None:
            await self.redis.close()


_NAMES = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrent": "concurrent requests",
}
