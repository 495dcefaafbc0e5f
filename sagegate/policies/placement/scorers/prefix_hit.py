"""Prompt tokens predicted cached on the backend: prefill the request will not do there."""

from __future__ import annotations

from sagegate.policies.placement.plugins import PlacementQuery


class PrefixHit:
    def score(self, q: PlacementQuery, i: int) -> float:
        hits = q.hits
        return hits[i] if hits is not None else 0
