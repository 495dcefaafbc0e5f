"""The admission rule's filters: every profile runs them, first and last, whatever else it names."""

from __future__ import annotations

from sagegate.policies.admission import eligible
from sagegate.policies.placement.plugins import PlacementQuery


class Eligible:
    """Healthy, allowed (model served, circuit closed, not excluded), and its waiting list within the
    rule's bounds (``policies.admission.eligible``; with ``cached`` the backlog is the prefill the
    backend will do: a warm backend with a mostly cached waiting prompt still takes one more)."""

    def keep(self, q: PlacementQuery, i: int, cached: int | None) -> bool:
        return eligible(q.loads[i], i, q.cfg, q.prompt_tokens, q.allowed, cached)


class Admits:
    """The memory rule admits the request's charge there (``BackendLoad.admits``)."""

    def keep(self, q: PlacementQuery, i: int, cached: int | None) -> bool:
        return q.loads[i].admits(q.charge_on(i), q.cfg)
