"""The rate-limit rule, pure: a sliding minute estimated from two fixed ones, and concurrency.

Counts are kept per fixed minute (``floor(t / 60)``); the requests (or tokens) of the last 60 s are
estimated as ``previous · (1 − f) + current`` where ``f`` is how far into the current minute ``t``
is: the previous minute's count is assumed spread evenly over it (Cloudflare's estimate; within a
few percent of an exact sliding log at a fraction of its state). The Redis script
(``gateway.rate_limit_script``) applies the same rule inside Redis; a test holds the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sagegate.gateway.settings_rate_limits import TenantLimits

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Over a limit: which (``requests``, ``tokens``, ``concurrent``) and when to try again."""

    kind: str
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Window:
    """A tenant's counts as the rule reads them, at ``t`` seconds."""

    t: float
    requests: tuple[float, float]
    """(previous minute, current minute)"""
    tokens: tuple[float, float]
    concurrent: int

    @property
    def into(self) -> float:
        """How far into the current minute ``t`` is, in [0, 1)."""
        return (self.t % WINDOW_S) / WINDOW_S


def estimate(counts: tuple[float, float], into: float) -> float:
    prev, curr = counts
    return prev * (1.0 - into) + curr


def wait_for(counts: tuple[float, float], into: float, room: float) -> int:
    """Seconds until the estimate falls to ``room`` (whole seconds, at least 1)."""
    prev, curr = counts
    if curr > room or prev <= 0:  # only the next minute can help
        return max(1, math.ceil((1.0 - into) * WINDOW_S))
    need = 1.0 - (room - curr) / prev  # the share of the minute at which prev·(1−x) + curr = room
    return max(1, math.ceil((need - into) * WINDOW_S))


def decide(limits: TenantLimits, w: Window) -> Refusal | None:
    """Whether one more request may start now (None: yes)."""
    into = w.into
    rpm, tpm, conc = limits.requests_per_minute, limits.tokens_per_minute, limits.concurrent
    if rpm is not None and estimate(w.requests, into) + 1 > rpm:
        return Refusal("requests", wait_for(w.requests, into, rpm - 1))
    if tpm is not None and estimate(w.tokens, into) >= tpm:
        return Refusal("tokens", wait_for(w.tokens, into, tpm - 1))
    if conc is not None and w.concurrent + 1 > conc:
        return Refusal("concurrent", 1)
    return None
