"""Where a tenant's rate-limit counts live: this replica's memory (:class:`LocalCounts`, the rule's
steps in Python) or Redis (:class:`RedisCounts`, the same steps in ``gateway.rate_limit_script``). Both
keep per-minute requests and tokens and one lease per request admitted; a test holds them equal."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sagegate.gateway.rate_limit_rule import WINDOW_S, Refusal, Window, decide
from sagegate.gateway.rate_limit_script import ACQUIRE_LUA, RENEW_LUA, SETTLE_LUA
from sagegate.gateway.settings_rate_limits import RateLimitSettings, TenantLimits


@dataclass
class _Tenant:
    minutes: dict[int, list[float]] = field(default_factory=dict)
    """minute → [requests, tokens]"""
    slots: dict[str, float] = field(default_factory=dict)
    """lease → expiry"""


class LocalCounts:
    """The rule over this replica's own counts (no Redis, or Redis unreachable): the script's state
    and steps, in Python (a test holds the two equal)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def acquire(
        self,
        tenant: str,
        limits: TenantLimits,
        prompt_tokens: int,
        charge: int,
        slot: str,
        lease_s: float,
        now: float | None = None,
    ) -> tuple[Refusal | None, int]:
        """(The refusal or None, the minute ``charge`` went to)."""
        now = self.clock() if now is None else now
        t = self._tenants.setdefault(tenant, _Tenant())
        minute = math.floor(now / WINDOW_S)
        self._forget_old(t, minute)
        prev, curr = t.minutes.get(minute - 1, [0.0, 0.0]), t.minutes.get(minute, [0.0, 0.0])
        self._lapse(t, now)
        w = Window(now, (prev[0], curr[0]), (prev[1], curr[1]), len(t.slots))
        refused = decide(limits, w, prompt_tokens)
        if refused is None:
            counts = t.minutes.setdefault(minute, [0.0, 0.0])
            counts[0] += 1
            counts[1] += charge
            t.slots[slot] = now + lease_s
        return refused, minute

    def settle(self, tenant: str, slot: str, refund: int, minute: int, now: float | None = None) -> None:
        """``slot``'s lease given back and, if it still held it, ``refund`` tokens of the charge made
        in ``minute`` (a negative refund: an overrun, charged now)."""
        t = self._tenants.get(tenant)
        if t is None:
            return
        now = self.clock() if now is None else now
        self._lapse(t, now)
        if t.slots.pop(slot, None) is None:
            return
        current = math.floor(now / WINDOW_S)
        self._forget_old(t, current)
        if refund > 0 and minute >= current - 1:
            counts = t.minutes.get(minute)
            if counts is not None and counts[1] > 0:
                counts[1] -= min(refund, counts[1])
        elif refund < 0:
            t.minutes.setdefault(current, [0.0, 0.0])[1] -= refund
        if not t.slots and not t.minutes:
            del self._tenants[tenant]

    def renew(self, tenant: str, slots: list[str], lease_s: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        t = self._tenants.setdefault(tenant, _Tenant())
        self._lapse(t, now)
        for slot in slots:
            t.slots[slot] = now + lease_s

    def minutes_of(self, tenant: str) -> dict[int, list[float]]:
        """``tenant``'s counts by minute (``[requests, tokens]``), as the rule reads them."""
        t = self._tenants.get(tenant)
        return dict(t.minutes) if t is not None else {}

    @staticmethod
    def _lapse(t: _Tenant, now: float) -> None:
        """Leases not renewed in time are gone (their holder's refunds with them)."""
        for gone in [s for s, expiry in t.slots.items() if expiry <= now]:
            del t.slots[gone]

    @staticmethod
    def _forget_old(t: _Tenant, minute: int) -> None:
        for old in [m for m in t.minutes if m < minute - 1]:
            del t.minutes[old]


class RedisCounts:
    """The rule in Redis over every replica's counts (``gateway.rate_limit_script``). Each call
    raises when Redis fails or is slower than ``timeout_s``: the limiter decides what then."""

    def __init__(self, url: str, settings: RateLimitSettings) -> None:
        import redis.asyncio as aioredis

        self.settings = settings
        self._redis = aioredis.Redis.from_url(url, socket_timeout=settings.timeout_s)
        self._acquire = self._redis.register_script(ACQUIRE_LUA)
        self._settle = self._redis.register_script(SETTLE_LUA)
        self._renew = self._redis.register_script(RENEW_LUA)

    def keys(self, tenant: str) -> list[str]:
        p = self.settings.redis_prefix
        return [f"{p}:{{{tenant}}}:counts", f"{p}:{{{tenant}}}:slots"]

    def _head(self, now: float | None) -> list[Any]:
        return ["" if now is None else repr(now), self.settings.lease_s]

    async def _call(self, script: Any, tenant: str, args: list[Any]) -> Any:
        return await asyncio.wait_for(script(keys=self.keys(tenant), args=args), self.settings.timeout_s)

    async def acquire(
        self,
        tenant: str,
        limits: TenantLimits,
        prompt_tokens: int,
        charge: int,
        slot: str,
        now: float | None = None,
    ) -> tuple[Refusal | None, int]:
        args = [*self._head(now), slot, limits.requests_per_minute or 0, limits.tokens_per_minute or 0]
        args += [limits.concurrent or 0, prompt_tokens, charge]
        got = await self._call(self._acquire, tenant, args)
        if int(got[0]) == 1:
            return None, int(got[1])
        kind = got[1].decode() if isinstance(got[1], bytes) else str(got[1])
        return Refusal(kind, int(got[2])), -1

    async def settle(
        self, tenant: str, slot: str, refund: int, minute: int, now: float | None = None
    ) -> None:
        await self._call(self._settle, tenant, [*self._head(now), slot, refund, minute])

    async def renew(self, tenant: str, slots: list[str], now: float | None = None) -> None:
        await self._call(self._renew, tenant, [*self._head(now), *slots])

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._redis.aclose()
