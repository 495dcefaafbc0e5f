"""The dispatcher: best-ranked request first, to the backend the admission rule picks.

The pass itself — peek the head, charge it, choose a backend, let the policy screen it, dispatch, refuse
or stop — is ``policies.dispatch_loop.DispatchLoop``, the code the simulator's gateway level runs too, so
the simulator's results describe this code. What is the gateway's own is its driver
(:class:`_GatewayDriver`): the charge counts the share of a prompt that the engines' KV gauges say
prompts really cost (``policies.prompt_share``; 1 until measured, so where nothing is shared it is the
simulator's charge), a retried request avoids the backends it failed on, and a decision resolves the
waiting handler's future. It runs on the event loop, woken (coalesced, once per loop iteration) by
whatever can make room: an arrival, a first byte, a completion, a scrape, a backend coming back or going
down (when none is healthy, the queue is answered at once). Each decision is O(log n) in the queue
(heap) plus O(backends).

With a shared ledger (``gateway.ledger``, several replicas in front of one fleet) a dispatch is
tentative until Redis confirms the charge: the request leaves the queue and its charge weighs on the
local view at once, but it goes to its backend only on Redis's yes; on a no it goes back into the
queue (as a retry does). The pass itself never waits on Redis. With ``ledger.send_first_share`` a
dispatch within this replica's send-first budget goes at once and its charge is checked after
(``SharedLedger.send_first``).

Pausing (``policies.pause``, off by default: the ``pause`` setting) lets the pass pause a running
request whose rank fell behind a head that fits nowhere; the pass decides, :meth:`Dispatcher.pause`
acts (cancel upstream, release the charge, queue the continuation). With ``ledger.order: threshold`` a
head ranked worse than another replica's published head is held while dispatching it would leave that
head no room (``policies.rank_threshold``; this replica's own head is published with every sync).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.ledger import QueueHead, SharedLedger
from sagegate.gateway.locality import Locality
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.queue import BoundedQueue, DispatchRefused, GatewayRequest, QueueFull
from sagegate.policies.admission import AdmissionConfig, Charge, resident_prefix
from sagegate.policies.base import Capability, Policy
from sagegate.policies.dispatch_loop import Decision, DispatchLoop
from sagegate.policies.pause import PauseConfig
from sagegate.policies.placement import DEFAULT_PROFILE, CacheView, PlacementProfile
from sagegate.policies.prompt_share import charged_prompt
from sagegate.policies.rank_threshold import threshold_mask
from sagegate.policies.resident import PromptBlocks


class PauseVerdict(StrEnum):
    PAUSED = "paused"
    DISABLED = "disabled"
    """``pause.enabled`` is off."""
    UNKNOWN = "unknown"
    """No request of that id is being streamed (never was, finished, or not dispatched yet)."""
    NOT_PAUSABLE = "not_pausable"
    """Paused already, finishing, or cannot be continued (``n`` > 1, …)."""
    LIMIT = "limit"
    """It has been paused ``pause.max_pauses`` times."""


class Pausable(Protocol):
    """A running request the gateway can pause (``gateway.resume.Resumer``): ``request`` is what the
    policy reads (its backend, ``generated``, prediction, pauses so far)."""

    @property
    def request(self) -> GatewayRequest: ...

    def pause(self) -> PauseVerdict: ...


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
        ledger: SharedLedger | None = None,
        pause: PauseConfig | None = None,
        locality: Locality | None = None,
        placement: PlacementProfile = DEFAULT_PROFILE,
    ) -> None:
        self.policy = policy
        self.locality = locality
        """Where prompts are predicted cached (None: placement by room alone)."""
        self.ledger = ledger
        """The admission ledger shared with other replicas (None: this replica owns every backend)."""
        self._committing: dict[int, GatewayRequest] = {}
        """Requests whose dispatch waits for the shared ledger's answer (by ``id``)."""
        self.pool = pool
        self.cfg = admission
        self.queue = queue
        self.metrics = metrics
        self.clock = clock
        self.capacity_requests = capacity_requests * max(1, len(pool))
        self.pending_s = pending_s
        self._scheduled = False
        self.flying: dict[int, GatewayRequest] = {}
        """Requests sent to a backend and not yet released, in dispatch order (by ``id``)."""
        self.dispatch_loop = DispatchLoop(
            policy,
            admission,
            queue,
            _GatewayDriver(self),
            capacity_requests=self.capacity_requests,
            pause=pause,
            placement=placement,
        )
        """The admission rule's dispatch pass (``policies.dispatch_loop``, the simulator's own)."""
        self.pause_enabled = False
        """``pause.enabled``: operators may pause, and the pass may pause by rank."""
        self.pause_bands = False
        """``pause.bands``: the pass may pause a lower priority band for a higher one."""
        self.pausable: dict[str, Pausable] = {}
        """Requests being streamed from a backend, by ``str(rid)``: what :meth:`pause` can pause."""
        self.last_stop: Decision[GatewayRequest] | None = None
        """Why the last pass stopped with requests still queued (the dashboard says why the head waits)."""
        self.held_for_others = 0
        """Head decisions held for a better-ranked head on another replica (``ledger.order: threshold``)."""
        if ledger is not None:
            ledger.head_of = self.queue_head
            ledger.pending_of = self.pending_on
            ledger.on_over = self._over

    def _over(self, url: str) -> None:
        """The shared ledger found a backend, where this replica sent first, over the limit."""
        if self.metrics is not None:
            name = next((b.name for b in self.pool.backends if b.shown_url == url), url)
            self.metrics.ledger_over.labels(name).inc()

    # --- entry points -------------------------------------------------------------------------
    def submit(self, req: GatewayRequest) -> asyncio.Future[int]:
        """Queue ``req`` (raises :class:`QueueFull`); the future resolves to a backend index."""
        reason = self.queue.full_reason(req)
        if reason is not None:
            raise QueueFull(reason)
        now = self.clock()
        req.future = asyncio.get_running_loop().create_future()
        req.shared_tokens = resident_prefix(self._charge(req), self.pool.loads)
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

    def repredict(self, req: GatewayRequest, prediction: LengthDistribution) -> bool:
        """A prediction that missed its budget came while ``req`` still waits: rank and charge it by
        that (out of the queue and back in; its arrival and time queued kept). False if it no longer
        waits, or the policy reads no prediction."""
        if Capability.USES_PREDICTION not in self.policy.capabilities or not self.queue.remove(req):
            return False
        now = self.clock()
        req.prediction, req.prediction_path = prediction, f"{req.prediction_path}+reranked"
        req.charge = None  # charged again from the new prediction
        self._charge(req)
        self.policy.on_repredict(req, now)
        self.queue.push(req, now)
        self.kick()
        return True

    def rebase(self, req: GatewayRequest, prediction: LengthDistribution) -> bool:
        """A late prediction came after ``req`` was sent (``dispatch_first``): charge it by that where
        it runs. False if it no longer runs, or the policy reads no prediction."""
        idx, charge = req.backend, req.charge
        if Capability.USES_PREDICTION not in self.policy.capabilities or idx is None or charge is None:
            return False
        req.prediction, req.prediction_path = prediction, f"{req.prediction_path}+rebased"
        moved = self.pool.backends[idx].load.repredict(charge, prediction)
        if moved and self.ledger is not None:
            self.ledger.changed(charge, idx)
        if moved < 0:
            self.kick()  # room freed: the head may fit now
        return True

    def idle(self) -> bool:
        """Nothing waits (queued, or for the shared ledger's answer): no one to be ordered against."""
        return not len(self.queue) and not self._committing

    def withdraw(self, req: GatewayRequest) -> bool:
        """Take a still-queued request out (client gone, waited too long). Returns if it was queued."""
        if not self.queue.remove(req) and self._committing.pop(id(req), None) is None:
            return False  # (a dispatch awaiting the ledger is abandoned: its answer releases it)
        self.policy.on_finish(req, self.clock())
        return True

    # --- pause (``gateway.resume``) ------------------------------------------------------------
    def pause(self, rid: object) -> bool:
        """Pause the running, streamed request ``rid``: its upstream stream is cancelled (the backend
        frees its KV), its charge released, and it waits in this queue as a continuation of what it
        has sent, to resume on any backend. False if it is not running, not pausable (not streamed
        yet, finishing, at ``pause.max_pauses``) or pausing is off."""
        return self.try_pause(rid) is PauseVerdict.PAUSED

    def can_pause(self, req: GatewayRequest) -> bool:
        """Whether ``req`` is being streamed by a resumer that could pause it now (``pause.enabled``
        or ``pause.bands``)."""
        return (self.pause_enabled or self.pause_bands) and str(req.rid) in self.pausable

    def try_pause(self, rid: object) -> PauseVerdict:
        """:meth:`pause` (an operator's, ``pause.enabled``), saying why not."""
        if not self.pause_enabled:
            return PauseVerdict.DISABLED
        return self.pause_now(rid)

    def pause_now(self, rid: object) -> PauseVerdict:
        """Pause ``rid`` if its resumer can (the dispatch pass's own decision)."""
        target = self.pausable.get(str(rid))
        if target is None:
            return PauseVerdict.UNKNOWN
        return target.pause()

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
        if self.ledger is not None:
            self.ledger.prepare()
        result = self.dispatch_loop.run(self.clock())
        self.last_stop = result.stop
        return result.dispatched

    def pending_on(self, backend: int) -> tuple[int, int]:
        """Requests sent to ``backend`` since its last scrape began, and their prompt tokens: what the
        shared ledger publishes for the other replicas' backlog estimates."""
        b = self.pool.backends[backend]
        return len(b.pending), b.pending_tokens

    def queue_head(self) -> QueueHead | None:
        """The best-ranked queued request, as the shared ledger publishes it."""
        req = self.queue.peek(self.clock())
        if req is None:
            return None
        return QueueHead(req.key_cache, self._charge(req), req.prompt_tokens)

    @property
    def decisions(self) -> int:
        """Head decisions taken so far."""
        return self.dispatch_loop.decisions

    def _charge(self, req: GatewayRequest) -> Charge:
        """``req``'s charge at the pool's current prompt share (rebuilt only when that moved)."""
        keyed = self.locality is not None and bool(req.prefix_keys)
        # keyed: a prefix in flight is charged once, block by block (the measured share would count
        # the same sharing again)
        prompt = req.prompt_tokens if keyed else charged_prompt(req.prompt_tokens, self.pool.prompt_share)
        charge = req.charge
        if charge is None or req.charged_prompt != prompt:
            blocks = PromptBlocks(req.prefix_keys, req.block_tokens) if keyed else None
            charge = req.charge = Charge(prompt, req.prediction, self.cfg, blocks)
            req.charged_prompt = prompt
            if req.generated:  # a continuation: it holds prompt + generated, conditioned on having gone on
                charge.update(req.generated)
        return charge

    # --- life of a dispatched request ---------------------------------------------------------
    def stop_waiting(self, req: GatewayRequest) -> None:
        """The request no longer waits in its backend's queue: the backend answered, or the try failed."""
        if req.backend is not None:
            self.pool.backends[req.backend].started(req.rid)
            self.kick()

    def computed(self, req: GatewayRequest) -> None:
        """The backend accepted the try and computed its prompt (a first token, or a whole answer):
        only now does its prompt count as cached there (``Locality.computed``)."""
        if req.backend is not None and self.locality is not None:
            self.locality.computed(req, req.backend)

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
        if b.load.progress(req.charge, generated) > 0 and self.ledger is not None:
            self.ledger.changed(req.charge, req.backend)
        self.policy.on_progress(req, new, self.clock())

    def release(self, req: GatewayRequest, *, final: bool = True) -> None:
        """The request left its backend (done, failed or cancelled): free its charge at once.

        ``final=False`` for a retry: the policy keeps tracking it.
        """
        idx = req.backend
        if idx is None:
            return
        self.flying.pop(id(req), None)
        b = self.pool.backends[idx]
        b.left(req.rid, req.upstream_prompt, req.generated - req.resumed_from)
        if self.locality is not None:
            self.locality.left(req, idx)
        if req.charge is not None:
            b.load.release(req.charge)
            if self.ledger is not None:
                self.ledger.released(req.charge, idx)
        req.backend = None
        if final:
            self.policy.on_finish(req, self.clock())
        self.kick()


class _GatewayDriver:
    """The dispatch loop's driver in the gateway (``policies.dispatch_loop.AdmissionDriver``): charges at
    the pool's prompt share, masks failed backends and other models, resolves the waiting handler's
    future."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher
        self.loads = dispatcher.pool.loads

    def charge(self, req: GatewayRequest) -> Charge:
        return self.d._charge(req)

    def allowed(self, req: GatewayRequest) -> Sequence[bool] | None:
        """Which backends ``req`` may use (None: all): those it has not failed on that serve its model,
        and (shared rank threshold) that leave a better-ranked head of another replica room."""
        d = self.d
        backends = d.pool.backends
        mask: Sequence[bool] | None = None
        if req.excluded or not all(b.serves(req.model) for b in backends):
            mask = [i not in req.excluded and b.serves(req.model) for i, b in enumerate(backends)]
        led = d.ledger
        if led is None or not led.heads:
            return mask
        held = threshold_mask(
            req.key_cache, d._charge(req), req.prompt_tokens, self.loads, d.cfg, led.heads, mask
        )
        if held is not None and not any(held):
            d.held_for_others += 1
        return held

    def cached(self, req: GatewayRequest) -> CacheView | None:
        loc = self.d.locality
        return None if loc is None else loc.cached(req)

    def dispatched(self, req: GatewayRequest, backend: int, charge: Charge, now: float) -> None:
        """Chosen: sent at once, or (shared ledger) once Redis has charged it fleet-wide."""
        d = self.d
        req.charge = charge  # what it was charged there (less a prefix in flight there holds)
        if d.ledger is None:
            self.send(req, backend, now)
            return
        if d.ledger.send_first(backend, charge):
            if d.metrics is not None:
                d.metrics.ledger_sent_first.inc()
            self.send(req, backend, now)
            return
        d._committing[id(req)] = req
        d.ledger.commit(
            backend, charge, lambda ok: self.committed(req, backend, charge, ok, now), priority=req.priority
        )

    def committed(self, req: GatewayRequest, backend: int, charge: Charge, ok: bool, decided: float) -> None:
        """The shared ledger's answer (to the decision made at ``decided``): send it; or (no room
        fleet-wide) queue it again; or, if its client left meanwhile, give the charge back."""
        d = self.d
        if d.metrics is not None:  # the round trip every dispatch of a replica waits for
            d.metrics.ledger_wait.labels("yes" if ok else "no").observe(d.clock() - decided)
        waiting = d._committing.pop(id(req), None) is not None
        if ok and waiting:
            self.send(req, backend, d.clock())
            return
        d.pool.loads[backend].release(charge)
        if ok:
            assert d.ledger is not None
            d.ledger.released(charge, backend)
        elif waiting:
            req.charge = None  # charged afresh (this one may have given blocks to the backend)
            d.queue.push(req, d.clock())
        d.kick()

    def send(self, req: GatewayRequest, backend: int, now: float) -> None:
        """Sent: the backend counts it waiting (``Backend.sent``) until its first byte or ``pending_s``."""
        d = self.d
        b = d.pool.backends[backend]
        req.backend = backend
        d.flying[id(req)] = req
        b.sent(req.rid, req.upstream_prompt)
        if d.locality is not None:
            d.locality.sent(req, backend)
        req.t_dispatch = now
        asyncio.get_running_loop().call_later(d.pending_s, d._expire, req, backend, req.attempt)
        if d.metrics is not None:
            d.metrics.dispatched(b.name, now - req.t_enqueue)
        fut = req.future
        if fut is not None and not fut.done():
            fut.set_result(backend)

    def refused(self, req: GatewayRequest, reason: str) -> None:
        _resolve_error(req, reason)

    def running(self, backend: int) -> Sequence[tuple[GatewayRequest, Charge]]:
        """What has started on ``backend`` (a first byte came) and could be paused now
        (``pause.enabled``, being streamed: ``gateway.resume``), in dispatch order."""
        d = self.d
        unstarted = d.pool.backends[backend].unstarted
        return [
            (r, r.charge)
            for r in d.flying.values()
            if r.backend == backend and r.charge is not None and r.rid not in unstarted and d.can_pause(r)
        ]

    def pause(self, req: GatewayRequest, now: float) -> bool:
        """Pause a running request (see :meth:`Dispatcher.pause`): its charge is released at once and
        it queues again as a continuation, so the pass may go on to admit the head in its room."""
        return self.d.pause_now(req.rid) is PauseVerdict.PAUSED


def _resolve_error(req: GatewayRequest, reason: str) -> None:
    fut = req.future
    if fut is not None and not fut.done():
        fut.set_exception(DispatchRefused(reason))
