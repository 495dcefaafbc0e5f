"""One dispatch pass of the admission rule, the same code for the live gateway and the simulated one.

A pass takes the queue's best-ranked request, charges it, picks the backend that admits it
(the placement profile's plugins, ``policies.placement``: by default the admission rule's choice, moved
to where its prefix is cached when that pays), lets the policy screen it, and then dispatches it and goes
on, refuses it and goes on, or stops (the head waits: the policy holds it or no backend has room).
Written once so that what the simulator measures is what the gateway runs. What the two drivers do
differently lies outside the rule and is theirs, behind :class:`AdmissionDriver`: where a charge comes
from (the gateway counts the measured prompt share), which backends a request may use (the gateway
masks failed backends and other models), and what a dispatch or a refusal means to the caller (an
HTTP future, an engine's waiting list, a record).

Each decision is O(log n) in a static queue (heap), plus O(backends).

With pausing on (``policies.pause.PauseConfig``, off by default) a head that fits nowhere may make
its room by pausing a worse-ranked running request (:func:`policies.pause.choose_pause`): the loop
records a PAUSE decision, tells the policy (``on_preempt``), and the driver frees the victim's KV and
charge and queues it again as a continuation; then the pass goes on.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, usage_after
from sagegate.policies.base import ADMIT, Capability, LoadView, SchedRequest, Verdict
from sagegate.policies.interfaces import GatewayPolicy
from sagegate.policies.pause import PauseConfig, choose_pause
from sagegate.policies.placement import DEFAULT_PROFILE, CacheView, Placement, PlacementProfile

R = TypeVar("R", bound=SchedRequest)

NO_HEALTHY_BACKEND = "no_healthy_backend"
"""Why every queued request is refused when nothing can serve (``DecisionKind.NO_HEALTHY_BACKEND``)."""
REJECTED_BY_POLICY = "rejected_by_policy"
"""The reason of a policy's REJECT that gave none."""


class DispatchQueue(Protocol[R]):
    """What the loop reads of the gateway's queue.

    Invariants the loop relies on:

    * ``len(queue)`` is the number of queued requests.
    * ``peek(now)`` is the request the policy ranks first at ``now`` (None exactly when the queue is
      empty) and leaves it queued: a head that waits is peeked again on the next pass.
    * ``remove(req)`` takes ``req`` out (the loop only removes the head it peeked, so this is the
      queue's pop without a second ranking) and returns whether it was queued.
    * ``ordered(now)`` is every queued request, best first (read only when nothing can serve).
    * ``place_again(req, now)`` ranks a queued ``req`` afresh (a no-op if it is not queued): the
      policy heard of its pause after the driver queued it again.
    """

    def __len__(self) -> int: ...

    def peek(self, now: float) -> R | None: ...

    def remove(self, req: R) -> bool: ...

    def ordered(self, now: float) -> Sequence[R]: ...

    def place_again(self, req: R, now: float) -> None: ...


class AdmissionDriver(Protocol[R]):
    """What the loop needs from its driver: the backends' admission ledgers and four hooks.

    Invariants the loop relies on:

    * ``loads[i]`` is backend ``i``'s ledger, read during the pass: ``healthy``, ``waiting`` and
      ``waiting_tokens`` are current; ``charged_tokens`` and ``holdings`` are the charges of the
      requests dispatched there and not yet gone (the loop adds each dispatched charge; the driver
      feeds progress and releases the charge when the request leaves).
    * ``charge(req)`` is the request's charge, the same object while nothing it depends on moved (a
      held head asked again on every pass costs nothing; ``Holdings.fits`` remembers it).
    * ``allowed(req)`` masks the backends ``req`` may not use (None: all may serve it).
    * ``cached(req)`` is how many of ``req``'s prompt tokens each backend is predicted to hold in its
      prefix cache, and how much each holds in all (None: not known, or cache-aware placement off):
      ``policies.placement`` weighs it.
    * ``dispatched(req, backend, charge, now)`` hands the request to ``backend``; on return
      ``loads[backend].waiting`` counts it and ``waiting_tokens`` its prompt (it waits there until it
      starts), so the next head of the same pass sees it.
    * ``refused(req, reason)`` tells the caller ``req`` will never be dispatched; the loop has already
      taken it out of the queue and told the policy (``on_finish``).
    """

    @property
    def loads(self) -> Sequence[BackendLoad]: ...

    def charge(self, req: R) -> Charge: ...

    def allowed(self, req: R) -> Sequence[bool] | None: ...

    def cached(self, req: R) -> CacheView | None: ...

    def dispatched(self, req: R, backend: int, charge: Charge, now: float) -> None: ...

    def refused(self, req: R, reason: str) -> None: ...

    def running(self, backend: int) -> Sequence[tuple[R, Charge]]:
        """The requests that have started on ``backend`` (produced a byte), in dispatch order, with
        their charges (read only with pausing on)."""
        ...

    def pause(self, req: R, now: float) -> bool:
        """Pause running ``req``: cancel it on its backend (its KV freed at once), release its
        charge, and queue it again as a continuation (``generated`` kept; its charge is rebuilt at
        that progress). False if it could not be paused (it is left as it was)."""
        ...


class DecisionKind(enum.StrEnum):
    DISPATCH = "dispatch"
    """Sent to ``backend``; the pass goes on."""
    REJECT = "reject"
    """Refused for good (``reason``); the pass goes on."""
    HOLD = "hold"
    """The policy holds the head; the pass stops."""
    NO_ROOM = "no_room"
    """No backend admits the head's charge; the pass stops until something makes room."""
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    """The head fits nowhere and no backend is healthy: every queued request is refused now (reason
    ``no_healthy_backend``) rather than at its timeout; the pass stops with the queue empty."""
    PAUSE = "pause"
    """The head fit nowhere: running ``request`` was paused on ``backend`` to make its room (pausing
    on); it waits in the queue again, and the pass goes on."""


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    """What the loop decided for one request."""

    kind: DecisionKind
    request: R
    charge: Charge
    """The charge it was judged at (the one a dispatch adds to the backend's ledger)."""
    backend: int | None = None
    """Where it went (DISPATCH) or would go (HOLD); None when no backend admits it."""
    reason: str = ""
    """Why it was refused (REJECT, NO_HEALTHY_BACKEND) or held (HOLD: the policy's reason)."""
    placement: Placement | None = None
    """How its backend was chosen (the prefix cache's part in it)."""


@dataclass(frozen=True, slots=True)
class PassResult(Generic[R]):
    """One pass: how many requests it dispatched and the head decision that stopped it."""

    dispatched: int
    stop: Decision[R] | None
    """HOLD, NO_ROOM or NO_HEALTHY_BACKEND; None when dispatches and rejections emptied the queue."""


class DispatchLoop(Generic[R]):
    """The admission rule applied to a queue, pass after pass (see the module docstring)."""

    def __init__(
        self,
        policy: GatewayPolicy,
        admission: AdmissionConfig,
        queue: DispatchQueue[R],
        driver: AdmissionDriver[R],
        *,
        capacity_requests: int,
        pause: PauseConfig | None = None,
        placement: PlacementProfile = DEFAULT_PROFILE,
    ) -> None:
        self.policy = policy
        self.placement = placement
        """The placement plugins (``policies.placement``): where an admitted head goes."""
        self.admission = admission
        self.queue = queue
        self.driver = driver
        self.capacity_requests = capacity_requests
        """What a screening policy is told the fleet runs at once (``LoadView.capacity_requests``)."""
        self.screens = Capability.SCREEN in policy.capabilities
        """Only a policy that screens gets asked (and a :class:`LoadView`: building one costs
        O(backends)); any other admits everything."""
        by_rank = pause is not None and pause.enabled and Capability.PREEMPT_PAYS in policy.capabilities
        by_band = pause is not None and pause.bands
        self.pause = (
            replace(pause, enabled=by_rank)
            if pause is not None and (by_rank or by_band) and pause.max_pauses > 0
            else None
        )
        """Pausing on (None: off, or it can never happen: ``max_pauses`` 0, or neither pausing by rank,
        which needs a policy that prices displacements, ``PREEMPT_PAYS``, nor by priority band)."""
        self.pauses = 0
        """Requests paused so far."""
        self.decisions = 0
        """Head decisions taken so far."""
        self.log: list[Decision[R]] | None = None
        """Set it to a list to record every decision in order (tests, debugging)."""

    def decide(self, req: R, now: float) -> Decision[R]:
        """The decision for head ``req`` at ``now``; changes nothing but the counter (and whatever the
        policy's ``screen`` keeps)."""
        driver, loads = self.driver, self.driver.loads
        charge = driver.charge(req)
        self.decisions += 1
        rule = self.admission.for_band(req.priority)
        placement = self.placement.place(
            charge, loads, rule, req.prompt_tokens, driver.allowed(req), driver.cached(req), req
        )
        idx = placement.backend
        if placement.charge is not None:  # cheaper there: a request in flight holds its leading blocks
            charge = placement.charge
        if self.screens:
            view = LoadView(
                kv_usage=usage_after(charge.value, idx, loads),
                queue_len=len(self.queue),
                capacity_requests=self.capacity_requests,
            )
            screening = self.policy.screen(req, now, view)
        else:
            screening = ADMIT
        verdict = screening.verdict
        if verdict is Verdict.REJECT:
            return Decision(DecisionKind.REJECT, req, charge, reason=screening.reason or REJECTED_BY_POLICY)
        if idx is None and not any(b.healthy for b in loads):
            return Decision(DecisionKind.NO_HEALTHY_BACKEND, req, charge, reason=NO_HEALTHY_BACKEND)
        if verdict is Verdict.HOLD:
            return Decision(DecisionKind.HOLD, req, charge, idx, screening.reason, placement)
        if idx is None:
            return Decision(DecisionKind.NO_ROOM, req, charge)
        return Decision(DecisionKind.DISPATCH, req, charge, idx, placement=placement)

    def run(self, now: float) -> PassResult[R]:
        """Dispatch queued requests, best rank first, while a backend admits the head."""
        queue, driver, policy, log = self.queue, self.driver, self.policy, self.log
        sent = 0
        while len(queue):
            req = queue.peek(now)
            assert req is not None
            decision = self.decide(req, now)
            if log is not None:
                log.append(decision)
            kind = decision.kind
            if kind is DecisionKind.DISPATCH:
                idx = decision.backend
                assert idx is not None
                queue.remove(req)
                req.forecast = decision.placement.forecast if decision.placement is not None else None
                policy.on_dispatch(req, now)
                driver.loads[idx].charge(decision.charge)
                driver.dispatched(req, idx, decision.charge, now)
                sent += 1
            elif kind is DecisionKind.REJECT:
                self._refuse(req, decision.reason, now)
            elif kind is DecisionKind.NO_ROOM and self.pause is not None and self._pause_for(decision, now):
                continue
            else:
                if kind is DecisionKind.NO_HEALTHY_BACKEND:
                    for queued in queue.ordered(now):
                        self._refuse(queued, NO_HEALTHY_BACKEND, now)
                return PassResult(sent, decision)
        return PassResult(sent, None)

    def _pause_for(self, head: Decision[R], now: float) -> bool:
        """Pause the running request that pays most for ``head``'s room; whether one was paused."""
        cfg, driver = self.pause, self.driver
        assert cfg is not None
        req = head.request
        loads = driver.loads
        running = [driver.running(i) for i in range(len(loads))]
        key = self.policy.key(req, now)
        choice = choose_pause(
            self.policy,
            req,
            head.charge,
            key,
            loads,
            running,
            driver.allowed(req),
            self.admission.for_band(req.priority),
            cfg,
            now,
        )
        if choice is None:
            return False
        victim: R = choice.victim  # type: ignore[assignment]  # one of ``running``'s
        charge = next(c for r, c in running[choice.backend] if r is victim)
        if not driver.pause(victim, now):
            return False
        victim.pauses += 1
        self.pauses += 1
        self.policy.on_preempt(victim, now)
        self.queue.place_again(victim, now)  # what on_preempt changed may move its rank
        if self.log is not None:
            self.log.append(Decision(DecisionKind.PAUSE, victim, charge, choice.backend))
        return True

    def _refuse(self, req: R, reason: str, now: float) -> None:
        self.queue.remove(req)
        self.policy.on_finish(req, now)
        self.driver.refused(req, reason)
