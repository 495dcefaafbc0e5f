"""KV room left under the admission target (tokens): the most-room rule's measure."""

from __future__ import annotations

from sagegate.policies.placement.plugins import PlacementQuery


class Room:
    def score(self, q: PlacementQuery, i: int) -> float:
        return q.loads[i].room(q.cfg.target)
