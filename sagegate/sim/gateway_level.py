"""The simulator's gateway level: the live gateway's queue, bounds and admission ledgers, in engine time.

Requests wait in a policy-ordered queue (with the live gateway's bounds, ``QueueLimits``) and are
dispatched by ``policies.dispatch_loop.DispatchLoop`` — the live gateway's own pass — to FCFS engines.
This class is that loop's driver (``policies.dispatch_loop.AdmissionDriver``): it charges a request
its whole prompt (the simulator has no prompt-share gauge), lets every request use every engine, and
hands dispatches and refusals to the simulation through two callbacks. With pausing on
(``policies.pause``) a third, ``evict``, takes a paused request off its engine at once (its blocks
stay cached); the request then waits in this queue again as a continuation (its ``generated`` kept:
the engine resumes it by prefilling its prompt and generated tokens, less what its cache still holds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, resident_prefix
from sagegate.policies.dispatch_loop import DispatchLoop, PassResult
from sagegate.policies.interfaces import GatewayPolicy
from sagegate.policies.pause import PauseConfig
from sagegate.policies.placement import (
    CACHE_AWARE,
    DEFAULT_PROFILE,
    LEAST_LOADED,
    CacheView,
    PlacementProfile,
)
from sagegate.policies.prefix_index import PrefixIndex
from sagegate.policies.queue import PolicyQueue
from sagegate.policies.resident import PromptBlocks
from sagegate.sim.engine import EngineRequest
from sagegate.sim.engine_request import RUNNING
from sagegate.sim.prefix import BlockKeys, block_keys


@dataclass(frozen=True)
class QueueLimits:
    """The live gateway's bounds on its queue (``gateway.settings.QueueSettings``), in engine time:
    an arrival past ``max_requests`` or ``max_tokens`` queued prompt tokens is rejected
    (``queue_full_requests`` / ``queue_full_tokens``), a request still queued after ``max_wait_s`` is
    rejected (``queue_timeout``)."""

    max_requests: int = 10_000
    max_tokens: int = 50_000_000
    max_wait_s: float = 60.0


class EngineBacklog(Protocol):
    """What the gateway level reads of an engine before each pass (its true waiting list)."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def waiting_tokens(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def prefix_hit_ratio(self) -> float: ...


class Flight:
    """The gateway's view of one dispatched request: its KV charge and where it went."""

    __slots__ = ("backend", "charge", "claim")

    def __init__(self, backend: int, charge: Charge) -> None:
        self.backend = backend
        self.charge = charge
        self.claim: tuple[Hashable, ...] | None = None
        """Its prompt blocks claimed on its engine until its first token (as ``gateway.locality``)."""


Send = Callable[[EngineRequest, int], None]
"""Hand a dispatched request to engine ``idx``."""
Refuse = Callable[[EngineRequest, str], None]
"""Record a request refused for good (the policy has been told)."""
Evict = Callable[[EngineRequest], bool]
"""Take a paused request off its engine at once (False: it could not be, e.g. it has finished)."""


class SimGateway:
    """The gateway's queue and ledgers; the simulation tells it of arrivals, progress and finishes."""

    def __init__(
        self,
        policy: GatewayPolicy,
        admission: AdmissionConfig,
        capacities: Sequence[int],
        *,
        capacity_requests: int,
        limits: QueueLimits | None,
        send: Send,
        refuse: Refuse,
        pause: PauseConfig | None = None,
        evict: Evict | None = None,
        placement: str = LEAST_LOADED,
        profile: PlacementProfile = DEFAULT_PROFILE,
        block_size: int = 16,
    ) -> None:
        self.policy = policy
        self.block_size = block_size
        self.prefixes: list[PrefixIndex] | None = None
        """Cache-aware placement (``placement="cache_aware"``): the prompt blocks predicted cached on
        each engine, as the live gateway keeps them (``gateway.locality``), here keyed by the engine's
        own block content keys."""
        if placement == CACHE_AWARE:
            self.prefixes = [PrefixIndex(c // block_size) for c in capacities]
        elif placement != LEAST_LOADED:
            raise ValueError(f"placement must be {CACHE_AWARE!r} or {LEAST_LOADED!r}, not {placement!r}")
        self.track_blocks = self.prefixes is not None
        """Charges know their prompt blocks (a prefix held in flight is charged once, and a policy
        pricing it reads ``shared_tokens``) with cache-aware placement, as the live gateway's do."""
        self.queue: PolicyQueue[EngineRequest] = PolicyQueue(policy)
        self.loads = [BackendLoad(c) for c in capacities]
        self.admission = admission
        self.limits = limits
        self.send = send
        self.refuse = refuse
        self.flights: dict[EngineRequest, Flight] = {}
        self.head_charges: dict[EngineRequest, Charge] = {}  # queued requests' charges, built once
        self.expiry: deque[tuple[float, EngineRequest]] = deque()  # (timeout, request), in arrival order
        self.queued_tokens = 0
        self.evict = evict
        self.dispatch_loop = DispatchLoop(
            policy,
            admission,
            self.queue,
            self,
            capacity_requests=capacity_requests,
            pause=pause,
            placement=profile,
        )

    # --- what the simulation tells it ---------------------------------------------------------
    def full_reason(self, req: EngineRequest) -> str | None:
        """Why the live gateway's bounded queue would refuse ``req`` (``gateway.queue.BoundedQueue``)."""
        limits = self.limits
        if limits is None:
            return None
        if len(self.queue) >= limits.max_requests:
            return "queue_full_requests"
        if self.queued_tokens + req.prompt_tokens > limits.max_tokens and len(self.queue) > 0:
            return "queue_full_tokens"
        return None

    def enqueue(self, req: EngineRequest, now: float) -> None:
        """``req`` arrived (and fits the bounds): it waits in the queue."""
        if self.track_blocks:
            req.shared_tokens = resident_prefix(self.charge(req), self.loads)
        self.policy.on_arrival(req, now)
        self.queue.push(req, now)
        if self.limits is not None:
            self.queued_tokens += req.prompt_tokens
            self.expiry.append((now + self.limits.max_wait_s, req))

    def dispatch(self, now: float, engines: Sequence[EngineBacklog]) -> PassResult[EngineRequest]:
        """Refuse the requests past their wait, read the engines' waiting lists, run a pass."""
        if self.expiry:
            self._expire(now)
        for load, eng in zip(self.loads, engines, strict=True):
            load.waiting = eng.num_waiting
            load.waiting_tokens = eng.waiting_tokens
            load.running = eng.num_running
            load.prefix_hit_ratio = eng.prefix_hit_ratio
        return self.dispatch_loop.run(now)

    def progressed(self, emitted: Sequence[EngineRequest]) -> None:
        """These dispatched requests generated tokens (``req.generated`` is their count so far)."""
        loads = self.loads
        for req in emitted:
            flight: Flight = req.user  # set at dispatch
            loads[flight.backend].progress(flight.charge, req.generated)

    def finish(self, req: EngineRequest, now: float) -> None:
        """A dispatched request finished: free its charge (its blocks join the engine's cache last)."""
        flight = self.flights.pop(req)
        self.loads[flight.backend].release(flight.charge)
        if self.prefixes is not None:
            self._computed(flight, req)
            self.prefixes[flight.backend].touch(self._content_keys(req))
        self.policy.on_finish(req, now)

    def started(self, req: EngineRequest) -> None:
        """A dispatched request's first token: its prompt is cached on its engine now."""
        flight = self.flights.get(req)
        if flight is not None and self.prefixes is not None:
            self._computed(flight, req)

    def _computed(self, flight: Flight, req: EngineRequest) -> None:
        if flight.claim is not None:
            prefix = self.prefixes[flight.backend]  # type: ignore[index]
            prefix.settle(flight.claim)
            prefix.touch(self._content_keys(req))
            flight.claim = None

    def _expire(self, now: float) -> None:
        """Reject requests queued longer than ``max_wait_s`` (at the first event after their timeout:
        nothing could have dispatched them in between)."""
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            _, req = expiry.popleft()
            if not req.pauses and self.queue.remove(req):  # a paused request is never timed out
                self._unqueue(req)
                self.policy.on_finish(req, now)
                self.refuse(req, "queue_timeout")

    def _unqueue(self, req: EngineRequest) -> None:
        self.head_charges.pop(req, None)
        if self.limits is not None:
            self.queued_tokens -= req.prompt_tokens

    # --- the dispatch loop's driver -----------------------------------------------------------
    def charge(self, req: EngineRequest) -> Charge:
        charge = self.head_charges.get(req)
        if charge is None:  # a fresh charge depends only on the request: build it once
            blocks = None
            if self.track_blocks:  # a prefix in flight on a backend is charged once
                blocks = PromptBlocks(self._content_keys(req), self.block_size)
            charge = self.head_charges[req] = Charge(
                req.prompt_tokens, req.prediction, self.admission, blocks
            )
            if req.generated:  # a paused continuation: charged at its progress
                charge.update(req.generated)
        return charge

    def allowed(self, req: EngineRequest) -> Sequence[bool] | None:
        return None

    def cached(self, req: EngineRequest) -> CacheView | None:
        """Each engine's predicted cached prompt tokens (None: placement by room alone)."""
        if self.prefixes is None:
            return None
        keys = self._content_keys(req)
        bs = self.block_size
        most = (req.prompt_tokens + req.generated - 1) // bs  # the last token is always computed
        hits = [min(most, p.match(keys)) * bs for p in self.prefixes]
        return CacheView(hits, [len(p) * bs for p in self.prefixes])

    def _content_keys(self, req: EngineRequest) -> list[Hashable]:
        """The content keys of ``req``'s shareable blocks (the engine's own, resolved once here)."""
        keys = req.keys
        if not isinstance(keys, BlockKeys):
            keys = req.keys = block_keys(req.rid, req.prompt_tokens, self.block_size, *keys)
        return keys.content

    def dispatched(self, req: EngineRequest, backend: int, charge: Charge, now: float) -> None:
        """Sent: it waits in engine ``backend`` (counted so the rest of the pass sees it; the engine's
        own count is read again before the next pass)."""
        self._unqueue(req)
        flight = self.flights[req] = req.user = Flight(backend, charge)
        if self.prefixes is not None:  # claimed until its first token (the live gateway's rule)
            flight.claim = self.prefixes[backend].claim(self._content_keys(req))
        load = self.loads[backend]
        load.waiting += 1
        load.waiting_tokens += req.prompt_tokens
        self.send(req, backend)

    def refused(self, req: EngineRequest, reason: str) -> None:
        self._unqueue(req)
        self.refuse(req, reason)

    def running(self, backend: int) -> Sequence[tuple[EngineRequest, Charge]]:
        """Running there and past its first token (the live gateway's "started": a first byte)."""
        return [
            (r, f.charge)
            for r, f in self.flights.items()
            if f.backend == backend and r.state is RUNNING and r.t_first_token is not None
        ]

    def pause(self, req: EngineRequest, now: float) -> bool:
        """Free its KV on the engine at once, release its charge, queue it again (no timeout)."""
        if self.evict is None or not self.evict(req):
            return False
        flight = self.flights.pop(req)
        load = self.loads[flight.backend]
        load.release(flight.charge)
        if req.t_first_token is not None:  # off its engine now, within this pass too: as the live
            load.running = max(0, load.running - 1)  # gateway counts its own (the forecast reads it)
        if self.prefixes is not None:
            self._computed(flight, req)
            self.prefixes[flight.backend].touch(self._content_keys(req))
        self.queue.push(req, now)
        if self.limits is not None:
            self.queued_tokens += req.prompt_tokens
        return True
