"""Requests running on the backend, negated: fewer sequences share its steps, so each decodes faster.
Not in the default profile; an example of a scorer the rule does not need (docs/placement.md)."""

from __future__ import annotations

from sagegate.policies.placement.plugins import PlacementQuery


class FewestRunning:
    def score(self, q: PlacementQuery, i: int) -> float:
        return -q.loads[i].running
