"""Prompt tokens queued on the backend that its cache will not serve, negated: prefill the request
would wait behind there (``BackendLoad.queued_prefill``, discounted by the backend's hit ratio)."""

from __future__ import annotations

from sagegate.policies.placement.plugins import PlacementQuery


class QueuedPrefill:
    def score(self, q: PlacementQuery, i: int) -> float:
        return -q.loads[i].queued_prefill
