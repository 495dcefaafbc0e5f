"""The gateway's order carried into the engine: vLLM's ``--scheduling-policy priority``.

vLLM started with ``--scheduling-policy priority`` orders its waiting queue by the request's integer
``priority`` (lower first, then arrival) and, when its KV cache runs out, preempts the running request
with the largest ``(priority, arrival)``. With ``upstream.rank_priority`` the gateway sends each
request's rank as that integer (:func:`engine_priority`): the client's class first (a higher
``x-priority`` first), then the policy's rank at dispatch
(:meth:`policies.interfaces.QueueOrder.engine_rank`), bucketed on a log scale
(:data:`STEPS_PER_DOUBLING` buckets a doubling). So inside the engine too, work predicted cheap waits
less and work predicted expensive is the one preempted (it recomputes when it resumes). vLLM cannot
change a request's priority once sent: the engine keeps its rank at dispatch.

Invariants: :func:`engine_priority` never decreases as the rank grows (for one class) and a higher
class always comes first whatever the ranks; a policy without a rank sends its class alone.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from sagegate.policies.base import ENGINE, Policy, SchedRequest, fcfs_tiebreak

STEPS_PER_DOUBLING = 4
"""Rank buckets per doubling of the rank: ranks within ~19% of each other share a bucket (arrival
order breaks the tie), so a prediction's noise does not reorder near-equal requests."""
CLASS_SPAN = 1 << 16
"""Buckets one class spans: a class is ahead of the next whatever the ranks (the buckets of ranks up to
2^(CLASS_SPAN / STEPS_PER_DOUBLING) fit)."""


def rank_bucket(rank: float | None) -> int:
    """``rank`` (lower first; None: no rank) as a bucket in ``[0, CLASS_SPAN)``."""
    if rank is None or not rank > 1.0:  # (also NaN)
        return 0
    if math.isinf(rank):
        return CLASS_SPAN - 1
    return min(CLASS_SPAN - 1, int(math.log2(rank) * STEPS_PER_DOUBLING))


def engine_priority(rank: float | None, client_priority: int = 0) -> int:
    """vLLM's ``priority`` (lower first) for a request of class ``client_priority`` (higher first, as
    ``x-priority``) whose policy rank is ``rank``."""
    return -client_priority * CLASS_SPAN + rank_bucket(rank)


class PriorityPolicy(Policy):
    """vLLM's ``--scheduling-policy priority`` inside an engine: lower ``priority`` first, then earlier
    arrival; the preemption victim is the largest such key."""

    name: ClassVar[str] = "priority"
    levels: ClassVar[frozenset[str]] = frozenset({ENGINE})

    def key(self, req: SchedRequest, now: float) -> Any:
        own = req.priority if req.engine_priority is None else req.engine_priority
        return (own, *fcfs_tiebreak(req))
