"""SageSched (Gan et al., arXiv 2603.07917) and its two ablations, on the Gittins core.

``sagesched`` ranks a request by the Gittins rank of its predicted *cost* distribution
(``C = I·O + O²/2``) at the cost it has attained; ``gittins-length`` does the same over the output
length alone (no memory-time cost); ``mean-cost`` orders by the expected cost, uncertainty-unaware.
All three recompute a running request's rank only at boundaries (support points and the output
buckets ``b, 2b, 4b, …``) and keep it in ``req.pstate``, so :meth:`key` is a field read.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Annotated, Any

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.base import (
    ENGINE,
    GATEWAY,
    Capability,
    LanePosition,
    Policy,
    SchedRequest,
    fcfs_tiebreak,
)
from sagegate.policies.cost import service_cost
from sagegate.policies.fairness import TenantCounters
from sagegate.policies.gittins import GittinsTable, GittinsTracker
from sagegate.policies.params import Positive, Range, checked
from sagegate.policies.prediction import expected_remaining, prior_of
from sagegate.policies.registry import register

_NEVER = 1 << 62


Buckets = Annotated[int, Range(ge=0, note="0 = support points only")]
"""The first output-token bucket boundary (then doubling); 0: the support points only."""


class _GittinsPolicy(Policy):
    """Shared body of ``sagesched`` and ``gittins-length``: a :class:`GittinsTracker` per request."""

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset(
        {
            Capability.USES_PREDICTION,
            Capability.PREEMPT,
            Capability.REKEY_ON_PROGRESS,
            Capability.PROGRESS_HOOK,
        }
    )
    length_only = False

    @checked
    def __init__(
        self,
        buckets: Buckets = 16,
        max_points: Annotated[int, Range(ge=1)] = 64,
        preempt: bool = True,
        preempt_pays: bool = True,
        shared_prefix: bool = True,
    ) -> None:
        self.bucket_base = buckets or None
        self.shared_prefix = shared_prefix
        """Price memory on the prompt tokens a request adds where it runs: less its leading tokens a
        request in flight there already holds (``SchedRequest.shared_tokens``, prefix caching keeps
        one copy), so a request whose prefix is resident is cheaper to serve now."""
        self.max_points = max_points
        self.preempt_pays = preempt and preempt_pays
        self._resumed_until: dict[Hashable, int] = {}  # rid → generated tokens it is held until
        if not preempt:
            self.declare(self.capabilities - {Capability.PREEMPT})
        elif preempt_pays:
            self.declare(self.capabilities | {Capability.PREEMPT_PAYS})

    def distribution(self, req: SchedRequest) -> LengthDistribution:
        """The prediction (the cold-start prior if none), merged onto at most ``max_points`` points."""
        dist = prior_of(req)
        if len(dist.support) > self.max_points:
            dist = LengthDistribution.from_samples(dist.support, dist.probs, max_points=self.max_points)
        return dist

    def tracker(self, req: SchedRequest) -> GittinsTracker:
        tr = req.pstate
        if tr is None:
            prompt = req.prompt_tokens - req.shared_tokens if self.shared_prefix else req.prompt_tokens
            table = GittinsTable(
                self.distribution(req), prompt, base=self.bucket_base, length_only=self.length_only
            )
            tr = req.pstate = GittinsTracker(table, req.generated)
        return tr

    def rank(self, req: SchedRequest) -> float:
        """The request's current (boundary-quantised) Gittins rank; lower is served first."""
        tr = self.tracker(req)
        tr.update(req.generated)
        return tr.rank

    def key(self, req: SchedRequest, now: float) -> Any:
        """Priority bands first (a higher ``priority`` strictly ahead), the Gittins rank inside one."""
        return (-req.priority, self.rank(req), *fcfs_tiebreak(req))

    def engine_rank(self, req: SchedRequest) -> float | None:
        return self.rank(req)

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self.tracker(req)

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        req.pstate = None  # the rank table was built from the old prediction
        self.tracker(req)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        self.tracker(req).update(req.generated)

    # --- preemption that pays (``preempt_pays``) ---------------------------------------------------
    def expected_remaining(self, req: SchedRequest) -> float:
        """Expected output tokens still to come, from the same distribution the rank reads."""
        return expected_remaining(self.distribution(req), req.generated)

    def may_preempt(self, victim: SchedRequest, now: float) -> bool:
        """Hysteresis: a request resumed after a preemption is not displaced again until it has
        generated past its next rank boundary (it re-ranks only there anyway)."""
        until = self._resumed_until.get(victim.rid) if self.preempt_pays else None
        return until is None or victim.generated >= until

    def on_preempt(self, req: SchedRequest, now: float) -> None:
        if self.preempt_pays:
            self._resumed_until[req.rid] = -1  # marked: its next dispatch is a resume

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        if self.preempt_pays and req.rid in self._resumed_until:
            nxt = self.tracker(req).table.next_boundary(req.generated)
            self._resumed_until[req.rid] = _NEVER if nxt is None else nxt

    def on_finish(self, req: SchedRequest, now: float) -> None:
        self._resumed_until.pop(req.rid, None)


@register("sagesched")
class SageSched(_GittinsPolicy):
    """Gittins rank over the predicted cost distribution C = I·O + O²/2 (Gan et al., arXiv 2603.07917).

    SageSched, the product's default: the rank at the attained cost, recomputed only at boundaries.
    ``buckets``: first output-token bucket boundary (then doubling; 0 = support points only);
    ``max_points``: the prediction is merged onto at most this many support points; ``preempt``:
    at engine level a better-ranked waiting request may displace a worse-ranked running one
    (SageSched ran at engine level with preemption); ``preempt_pays`` (on): only where the gain
    (:func:`policies.preemption.pair_gain_s` over :meth:`expected_remaining`) exceeds the engine's
    recompute cost, the widest margin first, and a resumed request is held until its next rank
    boundary (``preempt_pays=false``: displace whenever the rank says so, the worst first).
    At gateway level a queued request has
    generated nothing, so its key is the rank at attained cost 0. Requests are held in priority
    bands (``SchedRequest.priority``: the gateway's ``x-priority``, higher first), strictly: the
    rank orders a band, never across bands; every request in one band (the default) is SageSched.

    ``max_wait_s`` (off by default, as published): a request that arrived that long ago goes ahead of
    every one that did not, oldest first. Serving the cheapest expected work first leaves long requests
    behind for as long as cheaper ones keep arriving; this bounds their wait under sustained overload,
    at the price of some mean latency. It makes the key time-dependent (``DYNAMIC_KEY``, kept in lanes).

    ``fair_tenants`` (off by default): inside a band, the tenant with the least virtual token counter
    goes first (:class:`~policies.fairness.TenantCounters`: VTC's counters, prompt tokens at dispatch
    and output tokens twice as they stream), the Gittins rank inside a tenant; so one tenant's flood
    in a band cannot starve another tenant of that band. Aged requests still go first, oldest first.
    """

    @checked
    def __init__(
        self,
        buckets: Buckets = 16,
        max_points: Annotated[int, Range(ge=1)] = 64,
        preempt: bool = True,
        max_wait_s: Positive | None = None,
        preempt_pays: bool = True,
        shared_prefix: bool = True,
        fair_tenants: bool = False,
    ) -> None:
        super().__init__(buckets, max_points, preempt, preempt_pays, shared_prefix)
        self.max_wait_s = max_wait_s
        self.tenants = TenantCounters() if fair_tenants else None
        if max_wait_s is not None or fair_tenants:  # the key ages with the clock, or follows the counters
            self.declare(self.capabilities | {Capability.DYNAMIC_KEY, Capability.LANE_KEY})

    def key(self, req: SchedRequest, now: float) -> Any:
        if self.max_wait_s is None and self.tenants is None:
            return super().key(req, now)
        if self.max_wait_s is not None and now - req.arrival_s >= self.max_wait_s:
            return (-req.priority, 0, req.arrival_s, *fcfs_tiebreak(req))
        return (-req.priority, 1, *self._share(req.tenant), self.rank(req), *fcfs_tiebreak(req))

    def _share(self, tenant: str) -> tuple[float, ...]:
        """The tenant's counter when tenants share a band fairly (else nothing)."""
        return () if self.tenants is None else (self.tenants[tenant],)

    # lanes (with max_wait_s or fair_tenants), per priority band: ("waiting", band[, tenant]) by rank
    # until max_wait_s after arrival, then ("aged", band) by arrival
    def place(self, req: SchedRequest, now: float) -> LanePosition:
        lane = ("waiting", req.priority) if self.tenants is None else ("waiting", req.priority, req.tenant)
        return LanePosition(lane, self.rank(req), req.arrival_s)

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        kind, band, tenant = _band_lane(lane)
        if kind == "aged":
            return (-band, 0, rank)
        return (-band, 1, *self._share(tenant), rank)

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        super().on_arrival(req, now)
        if self.tenants is not None:
            self.tenants.arrived(req)

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        super().on_dispatch(req, now)
        if self.tenants is not None:
            self.tenants.dispatched(req)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        super().on_progress(req, new_tokens, now)
        if self.tenants is not None:
            self.tenants.progressed(req, new_tokens)

    def on_finish(self, req: SchedRequest, now: float) -> None:
        super().on_finish(req, now)
        if self.tenants is not None:
            self.tenants.finished(req)

    def flipped(self, flip: float, now: float) -> bool:
        return self.max_wait_s is not None and now - flip >= self.max_wait_s

    def after_flip(self, placed: LanePosition) -> LanePosition:
        _, band, _ = _band_lane(placed.lane)
        return LanePosition(("aged", band), placed.flip)  # by arrival


def _band_lane(lane: Hashable) -> tuple[str, int, str]:
    """A ``sagesched`` lane: (``"waiting"`` or ``"aged"``, the priority band, the tenant or "")."""
    if not isinstance(lane, tuple) or len(lane) not in (2, 3):
        raise TypeError(f"not a sagesched lane: {lane!r}")
    return str(lane[0]), int(lane[1]), str(lane[2]) if len(lane) == 3 else ""


@register("gittins-length")
class GittinsLength(_GittinsPolicy):
    """SageSched ablation: Gittins rank over the output length alone, no memory-time cost.

    SageSched reports its cost model mattering; this measures by how much (docs/design/policies.md)."""

    length_only = True


class _MeanCostState:
    """Rank ``E[C] − C(b)`` at the last boundary ``b ≤ g``; ``next_at`` the next boundary.

    Boundaries: the buckets, and ``o_mean``, the output length at which the attained cost reaches
    ``E[C]`` (the point distribution's one support point).
    """

    __slots__ = ("mean_cost", "next_at", "o_mean", "rank")

    def __init__(self, mean_cost: float, prompt_tokens: int) -> None:
        self.mean_cost = mean_cost
        i = float(prompt_tokens)
        self.o_mean = max(1, math.ceil(-i + math.sqrt(i * i + 2.0 * mean_cost)))  # C(o_mean) ≥ E[C]
        self.rank = mean_cost
        self.next_at = 0


@register("mean-cost")
class MeanCost(Policy):
    """SageSched ablation: order by the expected cost E[I·O + O²/2], uncertainty-unaware.

    It is SageSched with the distribution collapsed to its mean cost (docs/design/policies.md): the
    Gittins rank of a point cost is the remaining cost, so a running request's key is ``E[C] − C(b)``
    at its last boundary ``b`` (the same buckets and preemption as ``sagesched``, so only uncertainty
    differs); once its attained cost reaches ``E[C]`` the key is the attained cost (the Gittins core's
    past-the-support rule).
    """

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset(
        {
            Capability.USES_PREDICTION,
            Capability.PREEMPT,
            Capability.REKEY_ON_PROGRESS,
            Capability.PROGRESS_HOOK,
        }
    )

    @checked
    def __init__(self, buckets: Buckets = 16, preempt: bool = True) -> None:
        self.bucket_base = buckets or None
        if not preempt:
            self.declare(self.capabilities - {Capability.PREEMPT})

    @staticmethod
    def expected_cost(req: SchedRequest) -> float:
        dist = prior_of(req)
        i = float(req.prompt_tokens)
        return math.fsum(p * (i * o + 0.5 * o * o) for o, p in zip(dist.support, dist.probs, strict=True))

    def _bucket_floor(self, generated: int) -> int:
        base = self.bucket_base
        if base is None or generated < base:
            return 0
        return base << ((generated // base).bit_length() - 1)

    def _bucket_after(self, generated: int) -> int:
        base = self.bucket_base
        if base is None:
            return _NEVER
        if generated < base:
            return base
        return base << (generated // base).bit_length()

    def _state(self, req: SchedRequest) -> _MeanCostState:
        st = req.pstate
        if st is None:
            st = req.pstate = _MeanCostState(self.expected_cost(req), req.prompt_tokens)
        g = req.generated
        if g >= st.next_at:
            floor = self._bucket_floor(g)
            if g >= st.o_mean:
                floor = max(floor, st.o_mean)
            attained = service_cost(req.prompt_tokens, floor)
            st.rank = st.mean_cost - attained if attained < st.mean_cost else attained
            nxt = self._bucket_after(g)
            st.next_at = min(nxt, st.o_mean) if g < st.o_mean else nxt
        return st

    def rank(self, req: SchedRequest) -> float:
        return self._state(req).rank

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self._state(req).rank, *fcfs_tiebreak(req))

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self._state(req)

    def on_repredict(self, req: SchedRequest, now: float) -> None:
        req.pstate = None  # the mean cost was the old prediction's
        self._state(req)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        self._state(req)
