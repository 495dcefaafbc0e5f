"""The dispatcher: best-ranked request first, to the backend the admission rule picks.

It mirrors ``sim.des.Simulation._dispatch`` line for line — peek the head, charge it
(``policies.admission.Charge``), ask ``choose_backend``, let the policy screen it, dispatch or stop —
so the simulator's results describe this code. One input the simulator does not have yet: the charge
counts the share of a prompt that the engines' KV gauges say prompts really cost
(``policies.prompt_share``; 1 until measured, so where nothing is shared the two agree). It runs on
the event loop, woken (coalesced, once per loop iteration) by whatever can make room: an arrival, a
first byte, a completion, a scrape, a backend coming back or going down (when none is healthy, the
queue is answered at once). Each decision is O(log n) in the queue (heap) plus O(backends).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from gateway.backends import BackendPool
from gateway.metrics import GatewayMetrics
from gateway.queue import BoundedQueue, Dispatched, GatewayRequest
from policies.admission import AdmissionConfig, Charge, choose_backend, usage_after
from policies.base import ADMIT, Capability, LoadView, Policy, Verdict
from policies.prompt_share import charged_prompt


class QueueFull(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Dispatcher:
    def __init__(
        self,
        policy: Policy,
        pool: BackendPool,
        admission: AdmissionConfig,
        queue: BoundedQueue,
        metrics: GatewayMetrics | None = None,
        *,
        capacity_requests: int = 256,
        pending_s: float = 0.03,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.cfg = admission
        self.queue = queue
        self.metrics = metrics
        self.clock = clock
        self.capacity_requests = capacity_requests * max(1, len(pool))
        self.pending_s = pending_s
        self._scheduled = False
        self._screens = Capability.SCREEN in policy.capabilities
        """Only a policy that screens gets a :class:`LoadView` (building one costs O(backends))."""
        self.decisions = 0

    # --- entry points -------------------------------------------------------------------------
    def submit(self, req: GatewayRequest) -> asyncio.Future[int]:
        """Queue ``req`` (raises :class:`QueueFull`); the future resolves to a backend index."""
        reason = self.queue.full_reason(req)
        if reason is not None:
            raise QueueFull(reason)
        now = self.clock()
        req.future = asyncio.get_running_loop().create_future()
        self._charge(req)
        req.t_enqueue = now
        self.policy.on_arrival(req, now)
        self.queue.push(req, now)
        if Capability.DYNAMIC_KEY in self.policy.capabilities:
            self.kick()  # a rescan of the queue (O(n)) once per loop iteration, not per arrival
        else:
            self.dispatch()  # at once (O(log n)): an idle fleet adds no loop iteration to the first byte
        return req.future

    def requeue(self, req: GatewayRequest) -> asyncio.Future[int]:
        """Put back a request whose backend failed before answering (a retry; bounds do not apply)."""
        req.future = asyncio.get_running_loop().create_future()
        req.charge = None  # a fresh charge, as on arrival
        self._charge(req)
        self.queue.push(req, self.clock())
        self.kick()
        return req.future

    def withdraw(self, req: GatewayRequest) -> bool:
        """Take a still-queued request out (client gone, waited too long). Returns if it was queued."""
        if not self.queue.remove(req):
            return False
        self.policy.on_finish(req, self.clock())
        return True

    def kick(self) -> None:
        """Run a dispatch pass soon (once per loop iteration however many events asked)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    # --- the decision -------------------------------------------------------------------------
    def _run(self) -> None:
        self._scheduled = False
        self.dispatch()

    def dispatch(self) -> int:
        """Dispatch queued requests, best rank first, while a backend admits the head. Returns how many."""
        now, queue, cfg = self.clock(), self.queue, self.cfg
        loads = self.pool.loads
        sent = 0
        while len(queue):
            req = queue.peek(now)
            assert req is not None
            charge = self._charge(req)
            self.decisions += 1
            idx = choose_backend(charge, loads, cfg, req.prompt_tokens, self._allowed(req))
            if self._screens:
                view = LoadView(
                    kv_usage=usage_after(charge.value, idx, loads),
                    queue_len=len(queue),
                    capacity_requests=self.capacity_requests,
                )
                screening = self.policy.screen(req, now, view)
            else:
                screening = ADMIT
            if screening.verdict is Verdict.REJECT:
                self.withdraw(req)
                _resolve_error(req, screening.reason or "rejected_by_policy")
                continue
            if screening.verdict is Verdict.HOLD or idx is None:
                if idx is None and not self.pool.any_healthy():
                    self._fail_queued("no_healthy_backend")
                return sent
            queue.remove(req)
            self.policy.on_dispatch(req, now)
            b = self.pool.backends[idx]
            loads[idx].charge(charge)
            req.backend = idx
            b.sent(req.rid, req.prompt_tokens)
            req.t_dispatch = now
            asyncio.get_running_loop().call_later(self.pending_s, self._expire, req, idx, req.attempt)
            if self.metrics is not None:
                self.metrics.dispatched(b.name, now - req.t_enqueue)
            fut = req.future
            if fut is not None and not fut.done():
                fut.set_result(idx)
            sent += 1
        return sent

    def _fail_queued(self, reason: str) -> None:
        """Nothing can serve: answer every queued request now rather than at ``queue.max_wait_s``."""
        for req in self.queue.ordered(self.clock()):
            self.withdraw(req)
            _resolve_error(req, reason)

    def _charge(self, req: GatewayRequest) -> Charge:
        """``req``'s charge at the pool's current prompt share (rebuilt only when that moved)."""
        prompt = charged_prompt(req.prompt_tokens, self.pool.prompt_share)
        charge = req.charge
        if charge is None or req.charged_prompt != prompt:
            charge = req.charge = Charge(prompt, req.prediction, self.cfg)
            req.charged_prompt = prompt
        return charge

    def _allowed(self, req: GatewayRequest) -> Sequence[bool] | None:
        """Which backends ``req`` may use (None: all): those it has not failed on that serve its model."""
        backends = self.pool.backends
        if not req.excluded and all(b.serves(req.model) for b in backends):
            return None
        return [i not in req.excluded and b.serves(req.model) for i, b in enumerate(backends)]

    # --- life of a dispatched request ---------------------------------------------------------
    def stop_waiting(self, req: GatewayRequest) -> None:
        """The request no longer waits in its backend's queue: the backend answered, or the try failed."""
        if req.backend is not None:
            self.pool.backends[req.backend].started(req.rid)
            self.kick()

    def _expire(self, req: GatewayRequest, idx: int, attempt: int) -> None:
        """``pending_s`` after dispatch: count it as scheduled unless a scrape says it still waits."""
        if req.backend == idx and req.attempt == attempt:
            self.pool.backends[idx].expire(req.rid)
            self.kick()

    def progress(self, req: GatewayRequest, generated: int) -> None:
        """``generated`` tokens so far: correct the charge."""
        if req.backend is None or req.charge is None or generated <= req.generated:
            return
        new = generated - req.generated
        req.generated = generated
        b = self.pool.backends[req.backend]
        b.progressed(new)
        b.load.progress(req.charge, generated)
        self.policy.on_progress(req, new, self.clock())

    def release(self, req: GatewayRequest, *, final: bool = True) -> None:
        """The request left its backend (done, failed or cancelled): free its charge at once.

        ``final=False`` for a retry: the policy keeps tracking it.
        """
        idx = req.backend
        if idx is None:
            return
        b = self.pool.backends[idx]
        b.left(req.rid, req.prompt_tokens, req.generated)
        if req.charge is not None:
            b.load.release(req.charge)
        req.backend = None
        if final:
            self.policy.on_finish(req, self.clock())
        self.kick()


def _resolve_error(req: GatewayRequest, reason: str) -> None:
    fut = req.future
    if fut is not None and not fut.done():
        fut.set_exception(Dispatched(reason))
