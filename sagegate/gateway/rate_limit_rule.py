"""The rate-limit rule, pure: a sliding minute estimated from two fixed ones, and concurrency.

Counts are kept per fixed minute (``floor(t / 60)``); the requests (or tokens) of the last 60 s are
estimated as ``previous · (1 − f) + current`` where ``f`` is how far into the current minute ``t``
is: the previous minute's count is assumed spread evenly over it (Cloudflare's estimate; within a
few percent of an exact sliding log at a fraction of its state). The Redis script
(``gateway.rate_limit_script``) applies the same rule inside Redis; a test holds the two equal.

A refusal's wait is the whole seconds until the same estimate has room, crossing into the next
minute when the current one alone is over (its count then fades as the previous one did), and the
longest over every limit the request is over: with nothing else admitted meanwhile, a retry after
it passes (a property test holds that). The estimate never rises without a new charge, so a limit
the request is within now stays met.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sagegate.gateway.settings_rate_limits import TenantLimits

WINDOW_S = 60.0
COUNTS_TTL_S = 2 * int(WINDOW_S)
"""A tenant's minute counts live this long after their last change: the previous minute's count is
read until the end of the current one, never longer."""
RETRY_MARGIN_S = 0.001
"""Added to a wait before rounding it up to whole seconds, so that a retry at exactly the advertised
second is past the instant the estimate reaches the limit (float rounding of the clock)."""
TOO_LARGE = "too_large"
"""A request whose prompt alone is over the tenant's tokens per minute: no wait ever admits it."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Over a limit: which (``requests``, ``tokens``, ``concurrent``, ``too_large``) and when to try
    again (0 for ``too_large``: never)."""

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
    """Live leases (requests admitted and not yet ended, whose holder still renews them)."""

    @property
    def into(self) -> float:
        """How far into the current minute ``t`` is, in [0, 1)."""
        return (self.t % WINDOW_S) / WINDOW_S


def estimate(counts: tuple[float, float], into: float) -> float:
    prev, curr = counts
    return prev * (1.0 - into) + curr


def wait_for(counts: tuple[float, float], into: float, room: float) -> int:
    """Whole seconds (at least 1) until the estimate is at most ``room`` (≥ 0), given it is over now."""
    prev, curr = counts
    if curr <= room:  # the previous minute fading within this one is enough (prev > 0 here)
        s = ((1.0 - (room - curr) / prev) - into) * WINDOW_S
    else:  # at the next minute this one's count becomes the previous one and fades in turn
        s = (1.0 - into) * WINDOW_S + (1.0 - room / curr) * WINDOW_S
    return max(1, math.ceil(s + RETRY_MARGIN_S))


def decide(limits: TenantLimits, w: Window, prompt_tokens: int = 0) -> Refusal | None:
    """Whether a request of ``prompt_tokens`` may start now (None: yes). Its prompt must fit what is
    left of the minute's tokens; its output is charged by the caller at admission (its cap)."""
    rpm, tpm, conc = limits.requests_per_minute, limits.tokens_per_minute, limits.concurrent
    if tpm is not None and prompt_tokens > tpm:
        return Refusal(TOO_LARGE, 0)
    into = w.into
    kind, wait = "", 0
    if rpm is not None and estimate(w.requests, into) + 1 > rpm:
        kind, wait = "requests", wait_for(w.requests, into, rpm - 1)
    if tpm is not None and estimate(w.tokens, into) + prompt_tokens > tpm:
        kind = kind or "tokens"
        wait = max(wait, wait_for(w.tokens, into, tpm - prompt_tokens))
    if kind:
        return Refusal(kind, wait)
    if conc is not None and w.concurrent + 1 > conc:
        return Refusal("concurrent", 1)
    return None
