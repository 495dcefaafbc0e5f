"""Tokens the backend is predicted to hold cached for any request, negated: distinct prefixes spread
over the fleet's caches instead of evicting each other from one."""

from __future__ import annotations

from sagegate.policies.placement.plugins import PlacementQuery


class LeastHeld:
    def score(self, q: PlacementQuery, i: int) -> float:
        view = q.view
        return -view.held[i] if view is not None else 0
