"""Per-tenant rate limits (``rate_limits``): requests and tokens per minute, requests at once.

A request is checked once, after its prompt is counted and before it is queued
(:meth:`RateLimiter.admit`); over a limit it is refused with ``429`` (``rate_limit_exceeded``) and a
``Retry-After``. Admitted, it is charged its prompt and its output cap, and holds a :class:`Permit`
(a lease on one of its tenant's places) until it ends (its ``Lifecycle``'s end, however that comes),
which gives the place and the unused output back. With a ``redis_url`` the counts live in Redis
(``gateway.rate_limit_script``: atomic, so N replicas hold one limit between them, not N). Nothing
there can leak: a lease not renewed lapses within ``lease_s``; a give-back Redis did not take is kept
and sent again until it does; a key not written for two minutes (a lease) expires. Redis unreachable,
each replica counts alone (:class:`LocalCounts`) until it answers again. The limits, and the key →
tenant map, can live in a file re-read when it changes (fail closed: :meth:`RateLimiter.reload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass

import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sagegate.gateway import errors
from sagegate.gateway.metrics import RateLimitedLog
from sagegate.gateway.rate_limit_counts import LocalCounts, RedisCounts
from sagegate.gateway.rate_limit_rule import TOO_LARGE, Refusal
from sagegate.gateway.settings_rate_limits import LimitsFile, RateLimitSettings, TenantLimits

log = logging.getLogger("sagegate.gateway")

RETRY_S = 1.0
"""How often a replica retries the settlements Redis did not take (and renews its leases meanwhile)."""
REDIS_LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class _Unsettled:
    """A settlement Redis did not take: retried until it does, or until its lease has lapsed there
    (``moot_at``, on the monotonic clock: nothing is left to give back), so the list stays bounded."""

    tenant: str
    slot: str
    refund: int
    minute: int
    moot_at: float


class Permit:
    """An admitted request's lease on its tenant's counts, and the output it was charged for
    (``reserved``): :meth:`end` gives the lease back and the unused output once."""

    __slots__ = ("_done", "limiter", "minute", "reserved", "shared", "slot", "tenant")

    def __init__(
        self, limiter: RateLimiter, tenant: str, slot: str, minute: int, reserved: int, shared: bool
    ) -> None:
        self.limiter = limiter
        self.tenant = tenant
        self.slot = slot
        self.minute = minute
        self.reserved = reserved
        self.shared = shared
        self._done = False

    def end(self, output_tokens: int | None) -> None:
        if self._done:
            return
        self._done = True
        self.limiter.settle(self, self.reserved - max(0, output_tokens or 0))


class LimitsFileError(ValueError):
    """``rate_limits.file`` cannot be put in force (the reason is the message)."""


class RateLimiter:
    """The gateway's rate limits: :meth:`admit` before a request is queued."""

    def __init__(
        self,
        settings: RateLimitSettings,
        api_keys: dict[str, str],
        redis_url: str | None = None,
        max_output: int = 32_768,
    ) -> None:
        self.settings = settings
        self.max_output = max_output
        """The output charged for a request that names no cap (the gateway's ``limits.max_tokens``)."""
        self.api_keys = dict(api_keys)
        """Key → tenant in force (the file's, once read)."""
        self._base = (settings.default, settings.tenants, dict(api_keys))
        self.default, self.tenants = settings.default, dict(settings.tenants)
        self.replica = uuid.uuid4().hex[:12]
        self._seq = itertools.count()
        self.local = LocalCounts()
        self.redis = RedisCounts(redis_url, settings) if redis_url else None
        self.redis_errors = 0
        """Redis calls that failed or timed out (``sagegate_limits_redis_errors_total``)."""
        self._redis_log = RateLimitedLog(
            log,
            "rate limits: %d Redis call(s) failed (%s); this replica counts alone and settles what it "
            "could not give back once Redis answers",
            every_s=REDIS_LOG_EVERY_S,
        )
        self.unsettled: list[_Unsettled] = []
        """Leases and refunds Redis did not take, oldest first."""
        self._held: dict[str, Permit] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._file_state: tuple[int, ...] | None = None
        """The file as last read (applied or refused); None before the first read."""
        self._seen: tuple[int, ...] | None = None
        """The file as last looked at (a change is applied once it is seen twice)."""
        self._checked = -math.inf
        self._wake = asyncio.Event()
        self.reload()
        if not self.api_keys:
            log.warning("no api_keys: the gateway is open (any client may call, as any tenant it names)")

    # --- the limits in force ------------------------------------------------------------------
    def reload(self, force: bool = False) -> bool:
        """Re-read ``rate_limits.file`` if it changed (at most every ``reload_s``); True if the limits
        in force changed. Fails closed: a file that is gone, empty, unparsable, invalid or that would
        remove every key without saying ``open: true`` keeps the limits in force (logged once per
        change of the file); a change is applied once the file has stayed as it is for one check
        (a file being written is not read half-way). At start-up such a file is an error."""
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
        first = self._file_state is None
        if state == self._file_state:
            return False
        if not first and state != self._seen:  # changed since the last look: let the writer finish
            self._seen = state
            return False
        self._file_state = self._seen = state  # a bad file is reported once, not at every check
        try:
            default, tenants, keys = self._read(path)
        except LimitsFileError as exc:
            if first:
                raise
            log.error("%s; the limits and keys in force stay", exc)
            return False
        self.default, self.tenants, self.api_keys = default, tenants, keys
        log.info("rate limits read from %s: %d tenants, %d keys", path, len(tenants), len(keys))
        return True

    def _read(self, path: str) -> tuple[TenantLimits, dict[str, TenantLimits], dict[str, str]]:
        """The limits and keys ``path`` puts in force, or :class:`LimitsFileError` saying why not."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise LimitsFileError(f"rate_limits.file {path} cannot be read ({exc.strerror})") from None
        if not text.strip():
            raise LimitsFileError(f"rate_limits.file {path} is empty")
        try:
            raw = yaml.safe_load(text)
            if not isinstance(raw, dict):
                raise ValueError("not a mapping of api_keys, default, tenants")
            parsed = LimitsFile.model_validate(raw)
        except Exception as exc:
            raise LimitsFileError(f"rate_limits.file {path}: {exc}") from None
        default, tenants, base_keys = self._base
        keys = dict(parsed.api_keys if parsed.api_keys is not None else base_keys)
        if not keys and (self.api_keys or base_keys) and not parsed.open:
            raise LimitsFileError(
                f"rate_limits.file {path} would remove every API key; write open: true to mean it"
            )
        tenants = dict(parsed.tenants if parsed.tenants is not None else tenants)
        return parsed.default or default, tenants, keys

    def limits_of(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.default)

    def band_ceiling(self, tenant: str) -> int:
        """The highest priority band ``tenant`` may claim: its own ``max_priority`` when keys name
        tenants, else ``default``'s (without keys a tenant is only the client's claim)."""
        return (self.limits_of(tenant) if self.api_keys else self.default).max_priority

    def tenant_label(self, tenant: str) -> str:
        """``tenant`` if the configuration names it (a key's tenant, or one with limits), else
        ``other``: a client-chosen ``x-tenant`` cannot grow a metric's label set."""
        if tenant == "default" or tenant in self.tenants or tenant in self.api_keys.values():
            return tenant
        return "other"

    # --- a request ---------------------------------------------------------------------------
    async def admit(self, tenant: str, prompt_tokens: int, max_output: int | None = None) -> Permit | None:
        """A permit (None when the tenant has no limits), or ``429`` over a limit. The request is
        charged its prompt and its output cap (``max_output``, else the gateway's) now; the unused
        part comes back when it ends."""
        limits = self.limits_of(tenant)
        if not limits.limited:
            return None
        reserved = max_output if max_output is not None else self.max_output
        charge = prompt_tokens + reserved
        slot = f"{self.replica}:{next(self._seq)}"
        shared = False
        if self.redis is not None:
            try:
                refused, minute = await self.redis.acquire(tenant, limits, prompt_tokens, charge, slot)
                shared = True
            except Exception as exc:  # Redis down or slow: this replica counts alone
                self._failed(exc)
                # the call may still run once Redis answers: its lease is given back then
                self.unsettled.append(_Unsettled(tenant, slot, 0, -1, self._moot_at()))
                self._keep_going()
        if not shared:
            refused, minute = self.local.acquire(
                tenant, limits, prompt_tokens, charge, slot, self.settings.lease_s
            )
        if refused is not None:
            raise _refusal(tenant, refused, prompt_tokens, limits)
        permit = Permit(self, tenant, slot, minute, reserved, shared)
        self._held[slot] = permit
        self._keep_going()
        return permit

    def settle(self, permit: Permit, refund: int) -> None:
        """``permit``'s request ended: its lease back, and ``refund`` tokens of its charge."""
        self._held.pop(permit.slot, None)
        if permit.shared and self.redis is not None:
            self.unsettled.append(
                _Unsettled(permit.tenant, permit.slot, refund, permit.minute, self._moot_at())
            )
            self._keep_going(now=True)
        else:
            self.local.settle(permit.tenant, permit.slot, refund, permit.minute)

    # --- leases kept, settlements retried --------------------------------------------------------
    def _moot_at(self) -> float:
        return time.monotonic() + self.settings.lease_s

    def _keep_going(self, now: bool = False) -> None:
        """Make sure the keeper runs (``now``: it has a settlement to send at once)."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())
        elif now:
            self._wake.set()

    async def _keep(self) -> None:
        """While this replica holds leases or owes settlements: send the settlements (oldest first,
        until one fails), and renew the leases every third of ``lease_s``."""
        renew_every = self.settings.lease_s / 3
        next_renewal = time.monotonic() + renew_every
        retry_at = -math.inf
        while self._held or self.unsettled:
            if self.unsettled and time.monotonic() >= retry_at and not await self._settle_owed():
                retry_at = time.monotonic() + RETRY_S  # the rest wait, however many more come
            if time.monotonic() >= next_renewal:
                await self._renew()
                next_renewal = time.monotonic() + renew_every
            if not self._held and not self.unsettled:
                return
            wait = max(0.0, next_renewal - time.monotonic())
            if self.unsettled:
                wait = min(wait, RETRY_S)
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _settle_owed(self) -> bool:
        """Send what is owed, oldest first; False at the first failure (the rest wait)."""
        assert self.redis is not None
        now = time.monotonic()
        self.unsettled = [u for u in self.unsettled if u.moot_at > now]
        while self.unsettled:
            u = self.unsettled[0]
            try:
                await self.redis.settle(u.tenant, u.slot, u.refund, u.minute)
            except Exception as exc:
                self._failed(exc)
                return False
            self.unsettled.pop(0)
        return True

    async def _renew(self) -> None:
        by_tenant: dict[tuple[str, bool], list[str]] = {}
        for slot, p in self._held.items():
            by_tenant.setdefault((p.tenant, p.shared), []).append(slot)
        for (tenant, shared), slots in by_tenant.items():
            if not shared or self.redis is None:
                self.local.renew(tenant, slots, self.settings.lease_s)
                continue
            try:
                await self.redis.renew(tenant, slots)
            except Exception as exc:
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.redis_errors += 1
        self._redis_log.note(type(exc).__name__)

    def collect(self) -> list[Metric]:
        """The limiter's own metrics, read at scrape time (``GatewayMetrics.attach_state``)."""
        errors_ = CounterMetricFamily(
            "sagegate_limits_redis_errors", "Rate limits: Redis calls that failed or timed out."
        )
        errors_.add_metric([], self.redis_errors)
        owed = GaugeMetricFamily(
            "sagegate_limits_unsettled", "Rate limits: leases and refunds Redis has not taken yet."
        )
        owed.add_metric([], len(self.unsettled))
        return [errors_, owed]

    async def close(self) -> None:
        """Settle what can be settled within a second, then stop."""
        if self._keeper is not None and not self._keeper.done():
            self._held.clear()  # the process is ending: its leases lapse by themselves
            self._wake.set()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._keeper), 1.0)
            self._keeper.cancel()
        if self.redis is not None:
            await self.redis.close()


def _refusal(tenant: str, refused: Refusal, prompt_tokens: int, limits: TenantLimits) -> errors.GatewayError:
    if refused.kind == TOO_LARGE:
        return errors.limit_exceeded(
            f"request too large for tenant {tenant!r}: its prompt of {prompt_tokens} tokens is over the "
            f"tenant's {limits.tokens_per_minute} tokens per minute",
            None,
        )
    wait = refused.retry_after_s
    return errors.limit_exceeded(
        f"tenant {tenant!r} is over its {_NAMES[refused.kind]}; retry after {wait} s", wait
    )


_NAMES = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrent": "concurrent requests",
}
