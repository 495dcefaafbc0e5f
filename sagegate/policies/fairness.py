"""Fair-share orderings at the gateway: VTC (per-tenant virtual token counters) and LSSP's WFS.

Both keep per-tenant counters fed by the life-cycle hooks, so both declare ``DYNAMIC_KEY``: a request's key
depends on what other tenants have been served. Both declare lanes (one per tenant): the counters move
a tenant's requests together, so the queue only compares the tenants' best requests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import Any, cast

from sagegate.policies.base import GATEWAY, Capability, LanePosition, Policy, SchedRequest, fcfs_tiebreak
from sagegate.policies.deadline import priority_weight
from sagegate.policies.params import NonNegative, checked
from sagegate.policies.prediction import predicted_output
from sagegate.policies.registry import register

_QUEUED, _IN_FLIGHT, _DONE = 0, 1, 2


class TenantCounters:
    """Virtual token counters, one per tenant (VTC, Sheng et al., OSDI'24), for any policy to order by.

    A tenant's counter grows by ``input_weight`` per prompt token when one of its requests is first
    dispatched (a request sent again — refused by the shared ledger, retried after a failed backend,
    resumed after a pause — is not charged its prompt twice) and by ``output_weight`` per output token
    as they stream. A tenant that *returns* (it had nothing queued or in flight) is lifted to the least
    counter among the tenants that are active, so idle time is not banked as credit; with no active
    tenant its counter is kept. Requests are told apart by ``rid`` (unique among those alive).
    """

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counters: dict[str, float] = defaultdict(float)
        self.active: dict[str, int] = defaultdict(int)  # queued + in flight, per tenant
        self._alive: dict[Hashable, str] = {}  # rid → its tenant, from arrival to finish
        self._charged: set[Hashable] = set()  # rids whose prompt has been counted

    def __getitem__(self, tenant: str) -> float:
        return self.counters[tenant]

    def arrived(self, req: SchedRequest) -> None:
        t = req.tenant
        if req.rid in self._alive:
            return  # a paused request queued again: still active
        if self.active[t] == 0:
            others = [self.counters[u] for u, n in self.active.items() if n > 0 and u != t]
            if others:
                self.counters[t] = max(self.counters[t], min(others))
        self.active[t] += 1
        self._alive[req.rid] = t

    def dispatched(self, req: SchedRequest) -> None:
        if req.rid not in self._charged:
            self._charged.add(req.rid)
            self.counters[req.tenant] += self.input_weight * req.prompt_tokens

    def progressed(self, req: SchedRequest, new_tokens: int) -> None:
        self.counters[req.tenant] += self.output_weight * new_tokens

    def finished(self, req: SchedRequest) -> None:
        t = self._alive.pop(req.rid, None)
        self._charged.discard(req.rid)
        if t is not None:
            self.active[t] -= 1


@register("vtc")
class VTC(Policy):
    """Virtual token counter per tenant: serve the least-served tenant (Sheng et al., OSDI'24, VTC).

    First come first served within a tenant. A tenant's counter grows by ``input_weight`` (1) per
    prompt token when one of its requests is dispatched and by ``output_weight`` (2) per output token
    as they stream. A tenant that *returns* (it had nothing queued or in flight) is lifted to the
    least counter among the tenants that are active (something queued or in flight), so idle time is
    not banked as credit; with no active tenant its counter is kept.
    """

    levels = frozenset({GATEWAY})
    capabilities = frozenset({Capability.DYNAMIC_KEY, Capability.LANE_KEY, Capability.PROGRESS_HOOK})

    @checked
    def __init__(self, input_weight: NonNegative = 1.0, output_weight: NonNegative = 2.0) -> None:
        self.tenants = TenantCounters(input_weight, output_weight)

    def counter(self, tenant: str) -> float:
        return self.tenants[tenant]

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self.tenants[req.tenant], *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        return LanePosition(req.tenant, 0)  # one counter per tenant, then first come first served

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        return (self.tenants[cast(str, lane)],)

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self.tenants.arrived(req)

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        self.tenants.dispatched(req)

    def on_progress(self, req: SchedRequest, new_tokens: int, now: float) -> None:
        self.tenants.progressed(req, new_tokens)

    def on_finish(self, req: SchedRequest, now: float) -> None:
        self.tenants.finished(req)


@register("wfs")
class WFS(Policy):
    """Weighted fair share over classes: (demand/(served+1)) · priority / estimated steps (LSSP panel).

    The highest score is served first.

    Our reading of LSSP's terms: a *class* is a tenant; ``demand`` the requests of that class now
    queued; ``served`` the requests of that class dispatched so far; ``priority`` the request's
    (higher is more important); ``estimated steps`` its predicted output tokens (LSSP's simulator
    emits one token per step, prefill free). So a backlogged, under-served class goes first, and
    within a class short, important requests.
    """

    levels = frozenset({GATEWAY})
    capabilities = frozenset({Capability.DYNAMIC_KEY, Capability.LANE_KEY, Capability.USES_PREDICTION})

    def __init__(self) -> None:
        self.queued: dict[str, int] = defaultdict(int)
        self.served: dict[str, int] = defaultdict(int)

    def weight(self, req: SchedRequest) -> float:
        """The request's own factor, priority / estimated steps (fixed while it is queued)."""
        return priority_weight(req) / max(1.0, predicted_output(req))

    def score(self, req: SchedRequest) -> float:
        # class factor × own factor, in that association: for a fixed class factor (≥ 0) the score
        # then never decreases with the weight, rounding included, which the lane index relies on.
        c = req.tenant
        return (self.queued[c] / (self.served[c] + 1)) * self.weight(req)

    def key(self, req: SchedRequest, now: float) -> Any:
        return (-self.score(req), *fcfs_tiebreak(req))

    def place(self, req: SchedRequest, now: float) -> LanePosition:
        return LanePosition(req.tenant, -self.weight(req))

    def primary(self, lane: Hashable, rank: Any, now: float) -> tuple[Any, ...]:
        c = cast(str, lane)
        return (-((self.queued[c] / (self.served[c] + 1)) * -rank),)

    def on_arrival(self, req: SchedRequest, now: float) -> None:
        self.queued[req.tenant] += 1
        req.pstate = _QUEUED

    def on_dispatch(self, req: SchedRequest, now: float) -> None:
        if req.pstate == _QUEUED:
            self.queued[req.tenant] -= 1
            self.served[req.tenant] += 1
        req.pstate = _IN_FLIGHT

    def on_finish(self, req: SchedRequest, now: float) -> None:
        if req.pstate == _QUEUED:  # rejected or cancelled while queued
            self.queued[req.tenant] -= 1
        req.pstate = _DONE
