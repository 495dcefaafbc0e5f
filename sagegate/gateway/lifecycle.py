"""One request's life in the gateway, as a state, and the backend reservation it holds.

The dispatcher reserves a backend's KV for a request when it dispatches it; the reservation must be
released exactly once whichever way the request leaves (done, failed, client gone, timed out, retried
on another backend). Only :class:`Lifecycle` releases it, on the one transition that leaves a state
holding it; leaving a final state is refused, and releasing twice raises :class:`LifecycleError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum

from sagegate.core.outcomes import CancelStage, Outcome
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.queue import GatewayRequest


class RequestState(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    """A backend is reserved; the try is on its way (or its answer is being read)."""
    STREAMING = "streaming"
    """The backend's first chunk came: the response is relayed to the client."""
    DONE = "done"
    REJECTED = "rejected"
    """The gateway refused it (queue full, waited too long, the policy said no, backends failed)."""
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL = frozenset({RequestState.DONE, RequestState.REJECTED, RequestState.FAILED, RequestState.CANCELLED})
RESERVED = frozenset({RequestState.DISPATCHED, RequestState.STREAMING})

ENDS_IN: dict[Outcome, RequestState] = {
    Outcome.OK: RequestState.DONE,
    Outcome.CLIENT_ERROR: RequestState.DONE,
    Outcome.TRUNCATED: RequestState.FAILED,
    Outcome.FAILED: RequestState.FAILED,
    Outcome.ERROR: RequestState.FAILED,
    Outcome.CANCELLED: RequestState.CANCELLED,
    Outcome.SLOW_CLIENT: RequestState.CANCELLED,
    Outcome.SHUTDOWN: RequestState.CANCELLED,
    Outcome.CLIENT_GONE: RequestState.CANCELLED,
}
"""The final state of a request that ended with each outcome."""


class LifecycleError(RuntimeError):
    """A transition the life of a request does not have (a bug in the gateway)."""


class Lifecycle:
    """A request from its arrival to its end; ``lifecycles`` (the director's) holds it while it lives."""

    __slots__ = ("dispatcher", "future", "lifecycles", "on_end", "releases", "req", "reserved", "state")

    def __init__(self, req: GatewayRequest, dispatcher: Dispatcher, lifecycles: dict[int, Lifecycle]) -> None:
        self.req = req
        self.dispatcher = dispatcher
        self.lifecycles = lifecycles
        self.state = RequestState.RECEIVED
        self.future: asyncio.Future[int] | None = None
        self.reserved: int | None = None
        """The backend (index) this request holds a reservation on."""
        self.releases = 0
        """Reservations released so far (one per dispatch: a retry is a second dispatch)."""
        self.on_end: Callable[[], None] | None = None
        """Called once when the request ends, however it ends (its rate-limit permit given back)."""
        lifecycles[id(self)] = self

    @property
    def final(self) -> bool:
        return self.state in FINAL

    # --- the queue ----------------------------------------------------------------------------
    def enqueue(self) -> None:
        """Into the dispatcher's queue (raises ``QueueFull``: then it is :attr:`~RequestState.REJECTED`)."""
        self._expect(RequestState.RECEIVED)
        try:
            self.future = self.dispatcher.submit(self.req)
        except Exception:
            self._end(RequestState.REJECTED)
            raise
        self.state = RequestState.QUEUED

    def dispatched(self) -> int:
        """The dispatcher chose a backend (the future resolved): the reservation is this request's."""
        self._expect(RequestState.QUEUED)
        assert self.future is not None
        idx = self.future.result()
        self.reserved = idx
        self.state = RequestState.DISPATCHED
        return idx

    def withdraw(self) -> None:
        """Out of the queue without a backend: it waited too long."""
        self._expect(RequestState.QUEUED)
        self._end(RequestState.REJECTED)

    def retry(self) -> None:
        """The try failed before a byte reached the client: give its backend back and queue again."""
        self._expect(RequestState.DISPATCHED)
        self._release(final=False)
        self.future = self.dispatcher.requeue(self.req)
        self.state = RequestState.QUEUED

    def pause(self, generated: int) -> None:
        """Paused (``gateway.resume``) after ``generated`` tokens: give its backend back and queue it
        again as a continuation, for any backend (what it failed on before no longer counts)."""
        self._expect(RequestState.STREAMING)
        self._release(final=False)
        req = self.req
        req.generated = req.resumed_from = generated
        req.pauses += 1
        req.attempt = 0
        req.excluded.clear()
        req.t_enqueue = self.dispatcher.clock()
        self.future = self.dispatcher.requeue(req)
        self.state = RequestState.QUEUED

    # --- a try on the backend -----------------------------------------------------------------
    def answered(self) -> None:
        """The backend's first byte: the request no longer waits in the backend's queue."""
        self._expect(RequestState.DISPATCHED)
        self.dispatcher.stop_waiting(self.req)

    def attempt_failed(self) -> None:
        """The try failed before its first byte: it no longer waits in the backend's queue either."""
        self._expect(RequestState.DISPATCHED)
        self.dispatcher.stop_waiting(self.req)

    def streaming(self) -> None:
        """The backend's stream began with a token chunk: it accepted the try and computed the prompt."""
        self._expect(RequestState.DISPATCHED)
        self.dispatcher.computed(self.req)
        self.state = RequestState.STREAMING

    def computed(self) -> None:
        """A whole answer came (a ``200``): the backend computed the prompt."""
        self._expect(RequestState.DISPATCHED)
        self.dispatcher.computed(self.req)

    # --- the end --------------------------------------------------------------------------------
    def finish(self, outcome: Outcome) -> None:
        """The request ended with ``outcome``: its reservation (if it holds one) is released now."""
        self._end(ENDS_IN[outcome])

    def reject(self) -> None:
        """The gateway answers it itself: refused from the queue, or every try failed."""
        self._end(RequestState.REJECTED)

    def fail(self) -> None:
        """The gateway broke while serving it (a bug): release and end."""
        self._end(RequestState.FAILED)

    def cancel(self) -> CancelStage | None:
        """The client went away (or the gateway is closing): end it wherever it is. Returns the stage
        to count it under: ``queued`` if it was taken out of the queue, ``upstream`` if it held a
        backend, None if it had neither (refused already, or dispatched while its handler slept)."""
        if self.final:
            return None
        stage: CancelStage | None = None
        if self.state is RequestState.QUEUED and self.future is not None and not self.future.done():
            stage = CancelStage.QUEUED
        elif self.state in RESERVED:
            stage = CancelStage.UPSTREAM
        self._end(RequestState.CANCELLED)
        return stage

    def _end(self, state: RequestState) -> None:
        if self.final:
            raise LifecycleError(f"request {self.req.rid} ended twice ({self.state}, then {state})")
        if self.state is RequestState.QUEUED:
            self._leave_queue()
        if self.reserved is not None:
            self._release(final=True)
        self.state = state
        self.lifecycles.pop(id(self), None)
        if self.on_end is not None:
            self.on_end()

    def _leave_queue(self) -> None:
        """Out of the dispatcher's queue; a dispatch already on its way to the handler (the future
        resolved, the handler not yet awake) is this request's reservation, released with it."""
        fut = self.future
        if fut is None or not fut.done():
            self.dispatcher.withdraw(self.req)
        elif fut.exception() is None:
            self.reserved = fut.result()

    def _release(self, *, final: bool) -> None:
        if self.reserved is None:
            raise LifecycleError(f"request {self.req.rid}: no reservation to release")
        self.reserved = None
        self.releases += 1
        self.dispatcher.release(self.req, final=final)

    def _expect(self, state: RequestState) -> None:
        if self.state is not state:
            raise LifecycleError(f"request {self.req.rid} is {self.state}, not {state}")
