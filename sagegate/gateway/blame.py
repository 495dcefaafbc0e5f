"""Whose fault a failed try is: the backend's, or the request's.

A backend that answers a request with a 5xx, or drops it before its first byte, may be broken; or
the request may be poison, an input that fails on any engine (or crashes one engine build). Counting
every such failure against the backend's circuit breaker let one tenant's bad requests open every
circuit: eight 2 MB prompts at once opened both of two, and another tenant got 503s. So such a
failure is only *suspect* until the request's next try gives a verdict:

- the same request fails on a second backend too: the request is the cause. It is not tried again
  and neither backend is charged; the client gets a 400 when a backend's error says the input was
  refused, else a 502 naming both failures.
- another backend serves it: the first one is charged, unless it answered some other request since
  this try was sent (then it fails this input, not everyone: no reason to take it out of rotation).
- no verdict (no other backend to try, or the tenant's retry budget is spent): nobody is charged.

Failures to connect are never the request's: they are charged at once, as are failed probes, and
those are what take a dead backend out of rotation. Invariant: a request is charged to at most one
backend's breaker per suspect try, and a request that failed on two backends is charged to none.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sagegate.core.outcomes import Reason
from sagegate.gateway.errors import GatewayError

MAX_ERROR_BYTES = 16 * 1024
"""How much of a backend's error body is read to learn why it failed."""

REFUSED_TYPES = frozenset({"BadRequestError", "invalid_request_error", "NotFoundError"})
"""OpenAI/vLLM error types that say the input was refused rather than the server broken."""


@dataclass(slots=True)
class Suspect:
    """One try that failed in a way the request may have caused."""

    backend: str
    why: str
    since: float
    """When the try was sent (or failed, if it failed after the backend's headers): a backend that
    answered another request after this is not failing everyone."""
    error: dict[str, object] | None = None
    """The backend's OpenAI error object, if its body carried one."""


@dataclass(slots=True)
class Verdicts:
    """A request's suspect tries until the verdict (see the module's docstring)."""

    suspects: list[Suspect] = field(default_factory=list)

    def failed(self, suspect: Suspect) -> bool:
        """Record a suspect failure; True when it is the request's second: the request is the cause."""
        self.suspects.append(suspect)
        return len(self.suspects) >= 2

    def charged_on_success(self, answered_since: Callable[[str, float], bool]) -> list[str]:
        """Another backend served the request: the suspect backends to charge, those that answered
        no other request since the failed try (``answered_since(backend, since)``)."""
        return [s.backend for s in self.suspects if not answered_since(s.backend, s.since)]

    def answer(self) -> GatewayError:
        """The client's answer when the request failed on two backends."""
        refused = next((s for s in self.suspects if refused_input(s.error)), None)
        if refused is not None:
            message = str(refused.error.get("message") if refused.error else "") or "the input was refused"
            return GatewayError(400, f"the backend refused the input: {message}", reason=Reason.INPUT_REFUSED)
        tried = "; ".join(s.why for s in self.suspects)
        return GatewayError(
            502,
            f"the request failed on {len(self.suspects)} backends and was not tried again ({tried})",
            type="upstream_error",
            reason=Reason.REQUEST_FAILED_TWICE,
        )


def error_object(body: bytes) -> dict[str, object] | None:
    """The ``error`` object of an OpenAI-style error body (or the body itself if it has the fields)."""
    try:
        parsed = json.loads(body[:MAX_ERROR_BYTES])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(parsed, dict):
        return None
    inner = parsed.get("error")
    if isinstance(inner, dict):
        return inner
    return parsed if "message" in parsed else None


def refused_input(error: dict[str, object] | None) -> bool:
    """Whether a backend's error says the input was refused (a client error under a 5xx status)."""
    if error is None:
        return False
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 500:
        return True
    return error.get("type") in REFUSED_TYPES


class RetryBudget:
    """Per-tenant token buckets for retries after suspect failures: ``rate`` retries a second, up to
    ``burst`` at once. Bounds what one tenant's failing requests cost the fleet (each retry is another
    backend's prefill); failures to connect are retried outside it. ``rate`` 0 with ``burst`` 0
    turns retries after suspect failures off."""

    MAX_TENANTS = 4096
    """Buckets kept at most; past it the full ones (tenants idle long enough) are dropped."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str) -> bool:
        """Spend one retry of ``tenant``'s; False when its bucket is empty."""
        now = self.clock()
        tokens, at = self._buckets.get(tenant, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            return False
        self._buckets[tenant] = (tokens - 1.0, now)
        if len(self._buckets) > self.MAX_TENANTS:
            self._prune(now)
        return True

    def _prune(self, now: float) -> None:
        full = math.inf if self.rate <= 0 else (self.burst / self.rate)
        self._buckets = {t: (k, at) for t, (k, at) in self._buckets.items() if now - at < full}
        if len(self._buckets) > self.MAX_TENANTS:  # that many tenants retrying at once: start afresh
            self._buckets.clear()
