"""The tries of one request: the gateway's one retry loop, for a request's first tries and for the
resume of a paused or broken stream alike.

Each turn waits for the dispatcher's choice (within ``queue.max_wait_s`` of the request's
enqueueing), makes one try on that backend, and on a failure before the first byte puts the request
back in the queue with that backend excluded: up to ``upstream.max_attempts`` tries, or until no
other backend serves its model. How the tries end without an answer is a :class:`TriesEnded`; each
caller says it its own way (an HTTP error before the response began, an SSE error event inside a
stream that had).

A first try also weighs blame (``gateway.blame``): a failure the request may have caused waits for
the next try's verdict, and such retries are drawn from the tenant's retry budget. A resume does not:
its client already has part of an answer, so the only question left is whether another backend can
carry on.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sagegate.core.outcomes import Reason
from sagegate.gateway.backends import Backend, BackendPool
from sagegate.gateway.blame import RetryBudget, Verdicts
from sagegate.gateway.lifecycle import Lifecycle
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.queue import DispatchRefused
from sagegate.gateway.relay_ports import Failed
from sagegate.gateway.settings import GatewaySettings

T = TypeVar("T")


class Ending(enum.Enum):
    """Why a request's tries ended without an answer."""

    QUEUE_TIMEOUT = "queue_timeout"
    """It waited ``queue.max_wait_s`` in the queue; some backend is healthy."""
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    """It waited ``queue.max_wait_s`` and no backend is healthy."""
    REFUSED = "refused"
    """The dispatcher refused it (its policy, or no backend serves it): :attr:`TriesEnded.reason`."""
    OUT_OF_TRIES = "out_of_tries"
    """Every try failed: ``upstream.max_attempts`` of them, or every backend serving the model."""
    BUDGET_SPENT = "budget_spent"
    """A suspect failure, and the tenant's retry budget is spent: not tried again."""
    THE_REQUEST = "the_request"
    """It failed suspectly on two backends: the request is the cause (``gateway.blame``)."""


class TriesEnded(Exception):
    """The request's tries ended without an answer. The lifecycle is left as it was (still queued
    for a wait that ran out, dispatched for a failed try): the caller ends it."""

    def __init__(self, ending: Ending, reason: str, last: Failed | None = None) -> None:
        super().__init__(ending.value)
        self.ending = ending
        self.reason = reason
        """The reason to count it under (``core.outcomes.Reason``)."""
        self.last = last
        """The last failed try, if a try was made."""

    @property
    def why(self) -> str:
        return "" if self.last is None else self.last.why


class Tries:
    """The retry loop of one request (:meth:`run`). ``budget`` None: no blame is weighed (a resume)."""

    def __init__(
        self,
        lc: Lifecycle,
        pool: BackendPool,
        metrics: GatewayMetrics,
        settings: GatewaySettings,
        budget: RetryBudget | None = None,
    ) -> None:
        self.lc = lc
        self.pool = pool
        self.metrics = metrics
        self.clock = lc.dispatcher.clock
        self.max_wait_s = settings.queue.max_wait_s
        self.max_attempts = settings.upstream.max_attempts
        self.budget = budget
        self.verdicts = Verdicts()
        """The suspect tries so far (blame: charged once another backend serves the request)."""
        self.throttled: Failed | None = None
        """The last try a backend refused with a 429, if any."""

    async def run(self, attempt: Callable[[Backend], Awaitable[T | Failed]]) -> T:
        """Try backends as the dispatcher picks them until ``attempt`` returns something other than a
        :class:`~gateway.relay_ports.Failed`; raises :class:`TriesEnded` when the request cannot be
        tried again."""
        req = self.lc.req
        while True:
            idx = await self.dispatched()
            backend = self.pool.backends[idx]
            outcome = await attempt(backend)
            if not isinstance(outcome, Failed):
                return outcome
            if outcome.throttled:
                self.throttled = outcome
            budget = self.budget
            suspect = outcome.suspect if budget is not None else None  # a resume weighs no blame
            if suspect is not None and self.verdicts.failed(suspect):
                self._suspects("request")
                raise TriesEnded(Ending.THE_REQUEST, Reason.REQUEST_FAILED_TWICE, outcome)
            req.attempt += 1
            req.excluded.add(idx)
            if req.attempt >= self.max_attempts or not self.pool.can_serve(req.model, req.excluded):
                self._suspects("none")
                if self.throttled is not None:
                    raise TriesEnded(Ending.OUT_OF_TRIES, Reason.UPSTREAM_RATE_LIMITED, outcome)
                raise TriesEnded(Ending.OUT_OF_TRIES, Reason.UPSTREAM_FAILED, outcome)
            if suspect is not None and budget is not None and not budget.take(req.tenant):
                self._suspects("none")
                raise TriesEnded(Ending.BUDGET_SPENT, Reason.RETRY_BUDGET_SPENT, outcome)
            self.metrics.retries.labels(backend.name).inc()
            self.lc.retry()

    async def dispatched(self) -> int:
        """The backend the dispatcher chose, within ``max_wait_s`` of enqueueing."""
        lc = self.lc
        fut = lc.future
        assert fut is not None
        if not fut.done():
            limit = self.max_wait_s - (self.clock() - lc.req.t_enqueue)
            await asyncio.wait((fut,), timeout=max(0.0, limit))
        if not fut.done():
            if self.pool.any_healthy():
                raise TriesEnded(Ending.QUEUE_TIMEOUT, Reason.QUEUE_TIMEOUT)
            raise TriesEnded(Ending.NO_HEALTHY_BACKEND, Reason.NO_HEALTHY_BACKEND)
        exc = fut.exception()
        if isinstance(exc, DispatchRefused):
            raise TriesEnded(Ending.REFUSED, exc.reason)
        return lc.dispatched()

    def _suspects(self, verdict: str) -> None:
        """Count the suspect tries under the verdict they got (``request``: the request was the
        cause; ``none``: no verdict)."""
        self.metrics.suspect_failures.labels(verdict).inc(len(self.verdicts.suspects))
