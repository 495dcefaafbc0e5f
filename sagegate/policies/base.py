"""The request view a policy reads, and :class:`Policy`, the convenient base of the panel, called
unchanged by the simulator's gateway queue, the simulator's engine hook and the live gateway.

A policy sees a :class:`SchedRequest` (what it is allowed to know of a request) and answers three
questions: *who goes first* (``key``, lower first), *may this request go now* (``screen``, gateway
level) and *who gives way* (``pick_victim``, engine level). It is told of a request's life through
``on_*`` hooks so it can keep counters (VTC, FastServe). Each group of questions is a small interface
of :mod:`policies.interfaces`, where its contract is stated; here each group has its defaults
(:class:`OrderDefaults`, :class:`LaneDefaults`, :class:`ScreenDefaults`, :class:`EngineDefaults`,
:class:`HookDefaults`), and :class:`Policy` composes them and checks a declaration.
What it does beyond ordering it declares in ``Policy.capabilities`` (:mod:`policies.capabilities`);
drivers read that, never which methods a policy overrides.
Policies are pure: they take ``now`` from the caller and any randomness from a seeded generator.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.capabilities import ENGINE as ENGINE  # re-exported: the levels every policy names
from sagegate.policies.capabilities import GATEWAY as GATEWAY
from sagegate.policies.capabilities import Capability as Capability
from sagegate.policies.capabilities import check_declaration

Level = str


class SchedRequest:
    """What a policy may read of one request.

    ``true_output`` is the real output length: only the oracle policies (``USES_ORACLE``) read it.
    ``pstate`` belongs to the policy (one slot of per-request scratch), ``key_cache`` to the queue.
    Drivers subclass this with their own fields (engine progress, HTTP futures).
    """

    __slots__ = (
        "arrival_s",
        "band_ceiling",
        "deadline_s",
        "engine_priority",
        "forecast",
        "generated",
        "key_cache",
        "pauses",
        "prediction",
        "priority",
        "prompt_tokens",
        "pstate",
        "rid",
        "shared_tokens",
        "tenant",
        "true_output",
    )

    def __init__(
        self,
        rid: Any,
        arrival_s: float,
        prompt_tokens: int,
        *,
        tenant: str = "default",
        priority: int = 1,
        deadline_s: float | None = None,
        prediction: LengthDistribution | None = None,
        true_output: int | None = None,
    ) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.tenant = tenant
        self.priority = priority
        self.deadline_s = deadline_s
        self.prediction = prediction
        self.true_output = true_output
        self.generated = 0
        self.pstate: Any = None
        self.key_cache: Any = None
        self.pauses = 0
        """Times the gateway paused it (``policies.pause``); a continuation has ``pauses > 0``."""
        self.engine_priority: int | None = None
        """The ``priority`` an engine in vLLM's priority mode orders it by when the gateway sent one
        (``policies.engine_priority``); None: its ``priority``. Its band stays ``priority``."""
        self.band_ceiling: int | None = None
        """The highest band its tenant may claim (the gateway's ``max_priority``); a request of
        another tenant pauses it only from a band above that (``policies.pause``). None: any higher
        band may (the simulator's requests)."""
        self.forecast: Any = None
        """When its placement forecast its first and last token (``policies.placement.Forecasted``,
        set at dispatch; None: its picker does not forecast)."""
        self.shared_tokens = 0
        """Its leading prompt tokens a request in flight already holds where it would run (set at
        arrival by a driver whose charges know prompt blocks, ``policies.admission.resident_prefix``):
        KV it will not add there."""

    def predicted_output(self) -> float:
        """Point prediction (the distribution's mean); 1 token when there is no prediction."""
        return self.prediction.mean if self.prediction is not None else 1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rid={self.rid!r}, I={self.prompt_tokens}, gen={self.generated})"


class Verdict(enum.Enum):
    ADMIT = "admit"
    HOLD = "hold"  # not now; stays queued
    REJECT = "reject"  # never: the driver answers the client with the reason


@dataclass(frozen=True, slots=True)
class Screening:
    verdict: Verdict
    reason: str = ""


ADMIT = Screening(Verdict.ADMIT)


@dataclass(frozen=True, slots=True)
class LoadView:
    """What a gateway-level policy may know of the fleet when it screens a request.

    ``kv_usage`` is the reserved share of KV capacity (0..1) on the backend with the most room after
    this request would be charged there; ``queue_len`` the gateway's queue; ``capacity_requests`` an
    estimate of how many requests the fleet runs at once.
    """

    kv_usage: float = 0.0
    queue_len: int = 0
    capacity_requests: int = 256
    est_service_s: float = 0.0


class LanePosition(NamedTuple):
    """Where a queued ``LANE_KEY`` policy's request sits in the queue's index (contract:
    :class:`~policies.interfaces.LaneOrder`)."""

    lane: Hashable
    rank: Any
    """Order inside the lane (then first come first served); hashable and totally ordered."""
    flip: float | None = None
    """The request moves to ``policy.after_flip(position)`` once ``policy.flipped(flip, now)``;
    None: never."""


class OrderDefaults:
    """:class:`~policies.interfaces.QueueOrder` by default: first come, first served."""

    name: ClassVar[str] = "base"
    capabilities: frozenset[Capability] = frozenset()
    """Per class; an instance may narrow or widen its own with :meth:`Policy.declare`."""

    def key(self, req: SchedRequest, now: float) -> Any:
        """Sort key, lower served first. Default: arrival, then id."""
        return (req.arrival_s, _tiebreak(req.rid))

    def engine_rank(self, req: SchedRequest) -> float | None:
        """A scalar form of the request's place in this order. Default: none (None)."""
        return None


class LaneDefaults(OrderDefaults):
    """:class:`~policies.interfaces.LaneOrder`: a ``LANE_KEY`` policy overrides ``place`` and
    ``primary`` (and ``flipped`` / ``after_flip`` when a position flips); the defaults declare no
    lanes."""

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        """The lane and rank of ``req`` as it enters a queue."""
        raise NotImplementedError(f"policy {self.name!r} does not declare lanes")

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        """The key, less its first-come-first-served tail, of a request at that position."""
        raise NotImplementedError(f"policy {self.name!r} does not declare lanes")

    def flipped(self, flip: float, now: float) -> bool:
        """Has a request whose position carries ``flip`` moved on at ``now``. Default: never."""
        return False

    def after_flip(self, placed: LanePosition) -> LanePosition:
        """Where a request placed at ``placed`` goes when it flips."""
        raise NotImplementedError(f"policy {self.name!r} does not declare flips")


class ScreenDefaults:
    """:class:`~policies.interfaces.Screen` by default: admit everything (no ``SCREEN``)."""

    reject_reasons: ClassVar[frozenset[str]] = frozenset()
    """``SCREEN`` policies: every REJECT carries one of these reasons."""

    def screen(self, req: SchedRequest, now: float, load: LoadView) -> Screening:
        """May ``req`` be dispatched now? Default: always."""
        return ADMIT


class EngineDefaults(OrderDefaults):
    """:class:`~policies.interfaces.EngineKnobs` (and :class:`~policies.interfaces.Displacement`) by
    default: vLLM's, the memory victim is the largest key, nothing preempted by choice or deferred."""

    max_preempt_share: ClassVar[float] = 1.0
    """``PREEMPT`` policies: at most this share of the running batch is preempted in one step (in (0, 1])."""

    engine_variant: ClassVar[str | None] = None
    """Run the engine as this variant (``v1``, ``v0``, ``sarathi``) with ``engine_chunk_size`` as its
    per-step token budget when set (the engine-variant policies)."""
    engine_chunk_size: ClassVar[int | None] = None

    def pick_victim(self, running: Sequence[SchedRequest], now: float) -> SchedRequest | None:
        """Which running request gives way when memory runs out.

        Default (vLLM): the lowest-priority one, i.e. the largest key; for FCFS that is the latest
        arrival, the last of the running list.
        """
        if not running:
            return None
        return max(running, key=lambda r: self.key(r, now))

    def may_preempt(self, victim: SchedRequest, now: float) -> bool:
        """May ``victim`` be displaced by a better waiting one. Default: yes."""
        return True

    def expected_remaining(self, req: SchedRequest) -> float:
        """The output tokens ``req`` is expected still to generate (``PREEMPT_PAYS`` policies)."""
        raise NotImplementedError(f"policy {self.name!r} does not price preemptions")

    def defer_decode(self, req: SchedRequest, now: float) -> bool:
        """Skip ``req``'s decode token this step. Default: never."""
        return False


class HookDefaults:
    """:class:`~policies.interfaces.PolicyHooks` by default: keep nothing."""

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        """A request entered this policy's queue."""

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        """It left the queue: dispatched (gateway) or scheduled into the batch (engine)."""

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        """It generated ``new_tokens`` more tokens (only reported to ``PROGRESS_HOOK`` policies)."""

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        """It was preempted or paused and goes back to waiting."""

    def on_finish(self, req: SchedRequest, now: float) -> None:
        """It completed, failed or was cancelled; forget it."""

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        """Its prediction was replaced while it waited out of the queue (``USES_PREDICTION``)."""


class Policy(LaneDefaults, ScreenDefaults, EngineDefaults, HookDefaults):
    """The convenient base: every interface of :mod:`policies.interfaces` with its defaults (FCFS).
    Subclasses override what they change and declare it.

    Class attributes describe a policy to drivers and to ``sagegate policies``: ``levels`` where it
    may run; ``capabilities`` what it does beyond a static order (each :class:`Capability` states
    its invariant); ``reject_reasons`` the reasons a ``SCREEN`` policy may REJECT with;
    ``max_preempt_share`` and ``engine_variant`` / ``engine_chunk_size`` tune the engine. A class's
    declaration is checked when the class is created; an instance whose parameters change it calls
    :meth:`declare` from ``__init__``.
    """

    levels: ClassVar[frozenset[Level]] = frozenset({GATEWAY, ENGINE})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._check(cls.__name__, cls.capabilities)

    @classmethod
    def _check(cls, owner: str, capabilities: frozenset[Capability]) -> None:
        check_declaration(
            owner,
            capabilities,
            cls.levels,
            reject_reasons=cls.reject_reasons,
            max_preempt_share=cls.max_preempt_share,
            engine_variant=cls.engine_variant,
        )

    def declare(self, capabilities: frozenset[Capability]) -> None:
        """Replace this instance's capabilities (a parameter turned one on or off), checked as a class's."""
        self._check(f"{type(self).__name__} instance", capabilities)
        self.capabilities = capabilities


def _tiebreak(rid: Any) -> Any:
    return rid if isinstance(rid, int | float) else str(rid)


def fcfs_tiebreak(req: SchedRequest) -> tuple[float, Any]:
    """The tie-break every policy appends to its key: arrival, then id (deterministic)."""
    return (req.arrival_s, _tiebreak(req.rid))
