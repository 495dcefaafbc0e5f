"""The small interfaces a policy is used through, each with the invariants its caller relies on.

A consumer is typed against the narrowest one it calls:

* :class:`QueueOrder`: *who goes first*; :class:`~policies.queue.PolicyQueue` (the live gateway's
  queue, the simulated gateway's and each simulated engine's waiting list) and ``sim.step_timing``.
* :class:`LaneOrder`: the same order kept as lanes (``LANE_KEY``); :class:`~policies.lanes.LaneIndex`.
* :class:`Screen`: *may this request go now* (gateway level); the dispatch loop.
* :class:`Displacement`: *may a running request give way, and what has it left*; the gateway's pause
  (``policies.pause``) and the engine's preemption by choice (``sim.preemption``).
* :class:`EngineKnobs`: what only an engine asks (memory victims, deferred decodes, the engine's
  variant); the engine model (``sim.engine``, ``sim.des``).
* :class:`PolicyHooks`: a request's life told to the policy, so it can keep counters; every driver.

:class:`GatewayPolicy` and :class:`EnginePolicy` combine what the dispatch loop and the engine model
call. :class:`~policies.base.Policy` implements all of them with first-come-first-served defaults,
each group's defaults in one class of ``policies.base``; a policy need not subclass it. What is
optional is declared in ``capabilities`` (:mod:`policies.capabilities`): a driver calls an optional
method only when its capability says so, never by looking at which methods a class overrides.
Every method is pure: ``now`` comes from the caller.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

from sagegate.policies.base import LanePosition, LoadView, SchedRequest, Screening
from sagegate.policies.capabilities import Capability


@runtime_checkable
class QueueOrder(Protocol):
    """Who goes first: the order a :class:`~policies.queue.PolicyQueue` keeps.

    Invariants:

    * ``key(req, now)`` is the sort key, lower served first, totally ordered among one policy's keys.
      The panel ends every key with :func:`~policies.base.fcfs_tiebreak` (arrival, then id), so no
      two requests tie and the order is deterministic.
    * ``capabilities`` says how the key may move: without ``DYNAMIC_KEY`` a request's key is fixed
      from its push to its pop (the queue keeps a heap); with ``ARRIVAL_ORDER`` it is
      ``fcfs_tiebreak(req)`` exactly; with ``LANE_KEY`` the policy is also a :class:`LaneOrder`.
    * ``engine_rank(req)`` is a scalar form of the request's place in this order (lower first), for an
      engine's own priority scheduler (``policies.engine_priority``); None: the order has none to give.
    * ``name`` names the policy in messages and listings.
    """

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    def key(self, req: SchedRequest, now: float) -> Any: ...

    def engine_rank(self, req: SchedRequest) -> float | None: ...


@runtime_checkable
class LaneOrder(QueueOrder, Protocol):
    """A ``LANE_KEY`` order: each queued request sits in a lane at a static rank
    (:class:`~policies.base.LanePosition`), so :class:`~policies.lanes.LaneIndex` picks by lane heads
    (O(lanes · log n)) and still agrees with a scan of every key.

    ``place(req, now)`` is the lane and rank of ``req`` as it enters a queue; ``primary(lane, rank,
    now)`` the key, less its first-come-first-served tail, of a request at that position;
    ``flipped(flip, now)`` whether a request whose position carries ``flip`` has moved on at ``now``;
    ``after_flip(placed)`` where a request placed at ``placed`` goes when it flips. The contract:

    1. ``key(req, now) == (*self.primary(lane, rank, now), *fcfs_tiebreak(req))``, and within a
       lane the primary part never decreases as the rank grows;
    2. ``req`` is in ``p = place(req, now)`` until ``flipped(p.flip, now)``, then in
       ``after_flip(p)`` for good; ``flipped`` holds for every smaller ``flip`` when it holds for
       one, and keeps holding as the clock and the policy's state move on (if the clock goes
       back, the queue places every request afresh);
    3. what ``place`` reads of ``req`` does not change while it is queued (``on_arrival`` and
       ``on_preempt`` run before the push, or the queue places it again after them: a gateway
       pause queues the continuation first).
    """

    def place(self, req: SchedRequest, now: float) -> LanePosition: ...

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]: ...

    def flipped(self, flip: float, now: float) -> bool: ...

    def after_flip(self, placed: LanePosition) -> LanePosition: ...


@runtime_checkable
class Screen(Protocol):
    """Gateway level: may the queue's head be dispatched now.

    Asked only of a policy that declares ``SCREEN`` (any other admits everything, and no
    :class:`~policies.base.LoadView` is built). ``screen(req, now, load)`` answers ADMIT, HOLD (not
    now: the head stays queued and the pass stops) or REJECT (never: the driver answers the client);
    a REJECT names one of ``reject_reasons``. It may keep state of its own: a held head is asked again
    on every pass.
    """

    @property
    def reject_reasons(self) -> frozenset[str]: ...

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening: ...


@runtime_checkable
class Displacement(QueueOrder, Protocol):
    """Which running request may give way to a better-keyed waiting one, and at what price: the
    engine's preemption by choice (``PREEMPT``, ``sim.preemption``) and the gateway's pause
    (``policies.pause``). A victim always ranks strictly behind the request it makes room for, by
    ``key``.

    * ``may_preempt(victim, now)``, ``PREEMPT`` policies: may ``victim`` be displaced now (e.g. not
      before its next rank boundary).
    * ``expected_remaining(req)``, ``PREEMPT_PAYS`` policies: the output tokens ``req`` is expected
      still to generate, as the policy believes; the displacement is priced from it
      (:func:`policies.preemption.pair_gain_s`). Other policies need not answer.
    """

    def may_preempt(self, victim: SchedRequest, now: float) -> bool: ...

    def expected_remaining(self, req: SchedRequest) -> float: ...


@runtime_checkable
class EngineKnobs(Displacement, Protocol):
    """What only an engine asks of its policy (the engine model, ``sim.engine`` and ``sim.des``).

    * ``pick_victim(running, now)``: which running request gives way when memory runs out (vLLM: the
      largest key); None only when ``running`` is empty. An ``ARRIVAL_ORDER`` policy is not asked:
      the engine takes the latest arrival.
    * ``defer_decode(req, now)``, ``DEFER_DECODE`` policies: skip ``req``'s decode token this step.
    * ``max_preempt_share``, ``PREEMPT`` policies: at most this share of the running batch (in (0, 1])
      is preempted by choice in one step.
    * ``engine_variant`` / ``engine_chunk_size``: run the engine as this variant (``v1``, ``v0``,
      ``sarathi``) with that per-step token budget, when set (the engine-variant policies).
    """

    @property
    def max_preempt_share(self) -> float: ...

    @property
    def engine_variant(self) -> str | None: ...

    @property
    def engine_chunk_size(self) -> int | None: ...

    def pick_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest | None: ...

    def defer_decode(self, req: SchedRequest, now: float) -> bool: ...


@runtime_checkable
class PolicyHooks(Protocol):
    """A request's life, told to the policy so it can keep counters (VTC, FastServe).

    * ``on_arrival``: it entered this policy's queue (gateway queue or engine waiting list).
    * ``on_dispatch``: it left the queue, dispatched to a backend (gateway) or scheduled into the batch
      (engine).
    * ``on_progress``: it generated ``new_tokens`` more tokens (``req.generated`` already counts them).
      Drivers may skip this unless the policy declares ``PROGRESS_HOOK``.
    * ``on_preempt``: it was preempted (engine level) or paused (gateway level) and goes back to
      waiting.
    * ``on_finish``: it completed, failed, was cancelled or refused; forget it.
    * ``on_repredict``: gateway level, ``USES_PREDICTION`` only. While ``req`` waited out of the
      queue, its ``prediction`` was replaced (a prediction that missed its budget arrived late): drop
      what was derived from the old one. The queue places it again right after; what the policy keeps
      that does not depend on the prediction (arrival, time entered, counters) must stay as it was.
    """

    def on_arrival(self, req: SchedRequest, now: float) -> None: ...

    def on_dispatch(self, req: SchedRequest, now: float) -> None: ...

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None: ...

    def on_preempt(self, req: SchedRequest, now: float) -> None: ...

    def on_finish(self, req: SchedRequest, now: float) -> None: ...

    def on_repredict(self, req: SchedRequest, now: float) -> None: ...


@runtime_checkable
class GatewayPolicy(Screen, Displacement, PolicyHooks, Protocol):
    """What the dispatch loop (``policies.dispatch_loop``) calls: the order, the screen, the pause's
    pricing and the hooks."""


@runtime_checkable
class EnginePolicy(EngineKnobs, PolicyHooks, Protocol):
    """What the engine model (``sim.engine``) calls: the order, the engine's knobs and the hooks."""
