"""A queue ordered by a policy's key: a heap when keys are static, a lane index or a scan when they move.

Used by the simulator's gateway queue, the simulator's engine waiting list and the live gateway, so
ordering is the same code everywhere. Removal is lazy (an entry is marked gone and skipped); a
request removed and pushed again (re-ranked) has only its newest heap entry live.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from sagegate.policies.base import Capability, SchedRequest
from sagegate.policies.interfaces import LaneOrder, QueueOrder
from sagegate.policies.lanes import LaneIndex

R = TypeVar("R", bound=SchedRequest)


class PolicyQueue(Generic[R]):
    """Requests in ``policy.key`` order (lower first), for any :class:`~policies.interfaces.QueueOrder`.

    Static policies: each request's key is computed once on push and kept in a heap, so ``peek`` and
    ``pop`` are O(log n). Policies that declare ``DYNAMIC_KEY`` and ``LANE_KEY``: a
    :class:`~policies.lanes.LaneIndex`, O(lanes · log n) a pick, the same pick
    as a scan. Other ``DYNAMIC_KEY`` policies, or ``scan=True``: keys are recomputed on every ``peek`` (O(n)),
    because they depend on the clock or on other requests.
    """

    def __init__(self, policy: QueueOrder, *, scan: bool = False) -> None:
        self.policy = policy
        self._dynamic = Capability.DYNAMIC_KEY in policy.capabilities
        self._heap: list[tuple[Any, int, R]] = []
        self._members: dict[int, R] = {}
        self._live: dict[int, int] = {}
        """Static policies: each member's live heap entry (its sequence number); older entries of a
        request pushed again are skipped like removed ones."""
        self._counter = itertools.count()
        self._index: LaneIndex[R] | None = (
            LaneIndex(lane_order(policy))
            if self._dynamic and Capability.LANE_KEY in policy.capabilities and not scan
            else None
        )

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __contains__(self, req: object) -> bool:
        return id(req) in self._members

    def __iter__(self) -> Iterator[R]:
        return iter(list(self._members.values()))

    def push(self, req: R, now: float) -> None:
        self._members[id(req)] = req
        if self._index is not None:
            self._index.add(req, now)
        elif not self._dynamic:
            key = self.policy.key(req, now)
            req.key_cache = key
            seq = self._live[id(req)] = next(self._counter)
            heapq.heappush(self._heap, (key, seq, req))

    def place_again(self, req: R, now: float) -> None:
        """What ``req``'s key reads changed while it was queued (a hook that ran after its push):
        rank it afresh, if it is queued."""
        if self.remove(req):
            self.push(req, now)

    def remove(self, req: R) -> bool:
        """Take ``req`` out wherever it is (cancellation). Returns whether it was queued."""
        if self._members.pop(id(req), None) is None:
            return False
        self._live.pop(id(req), None)
        if self._index is not None:
            self._index.discard(req)
        return True

    def peek(self, now: float) -> R | None:
        if not self._members:
            return None
        if self._index is not None:
            found = self._index.best(now, self._members.values())
            assert found is not None
            key, req = found
            req.key_cache = key
            return req
        if self._dynamic:
            return min(self._members.values(), key=lambda r: self._rekey(r, now))
        heap, live = self._heap, self._live
        while heap and live.get(id(heap[0][2])) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self, now: float) -> R | None:
        req = self.peek(now)
        if req is not None:
            self.remove(req)
        return req

    def ordered(self, now: float, limit: int | None = None) -> list[R]:
        """The first ``limit`` requests in order, without removing them (for the admin snapshot: a
        dynamic policy's keys are all computed once, O(n log limit))."""
        if self._dynamic:
            members, key = self._members.values(), lambda r: self._rekey(r, now)
            items = heapq.nsmallest(limit, members, key=key) if limit else sorted(members, key=key)
        else:
            live = [e for e in self._heap if self._live.get(id(e[2])) == e[1]]
            items = [e[2] for e in (heapq.nsmallest(limit, live) if limit else sorted(live))]
        return items[:limit] if limit is not None else items

    def rekey(self, now: float) -> None:
        """Recompute every key (a static policy whose state changed, e.g. a bucket boundary)."""
        if self._dynamic:
            return
        self._heap = []
        for req in self._members.values():
            key = self.policy.key(req, now)
            req.key_cache = key
            seq = self._live[id(req)] = next(self._counter)
            self._heap.append((key, seq, req))
        heapq.heapify(self._heap)

    def _rekey(self, req: R, now: float) -> Any:
        key = self.policy.key(req, now)
        req.key_cache = key
        return key


def lane_order(policy: QueueOrder) -> LaneOrder:
    """``policy``, which declares ``LANE_KEY``, as the :class:`~policies.interfaces.LaneOrder` it
    promises to be."""
    if not isinstance(policy, LaneOrder):
        raise TypeError(f"policy {policy.name!r} declares LANE_KEY without the lane methods (LaneOrder)")
    return policy
