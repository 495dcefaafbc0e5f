"""The index behind :class:`~policies.queue.PolicyQueue` for dynamic policies that declare lanes.

A ``LANE_KEY`` policy (contract: :class:`policies.interfaces.LaneOrder`) puts each queued request in a lane
at a static rank; its key is ``(*primary(lane, rank, now), arrival, id)``, and the primary never
decreases along the ranks of a lane, whatever the clock or the policy's counters say. So the best
request of a lane is the first rank's earliest request, unless the next ranks' primaries tie with it
(floating-point rounding can make distinct ranks tie, e.g. ``lax = ls − now``), in which case the
earliest of all the tied ranks. The pick is the least key over the lanes' best, so it is the scan's
pick, in O(lanes · log n) instead of O(n), and reads no request's key. Requests whose position flips
(a clock or a round count passing a threshold) wait in one heap ordered by ``flip`` and move lanes as
it passes.

Removal is lazy, as in the static heap: an entry is live while its request is placed with its token.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from sagegate.policies.base import LanePosition, SchedRequest, fcfs_tiebreak
from sagegate.policies.interfaces import LaneOrder

R = TypeVar("R", bound=SchedRequest)
_TIEBREAK = 2  # every key ends with ``fcfs_tiebreak(req)``: (arrival, id)


class _Bucket(Generic[R]):
    """The requests of one rank of one lane, first come first served."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[float, Any, int, R]] = []  # (arrival, id tiebreak, token, request)
        self.live = 0


class _Lane(Generic[R]):
    __slots__ = ("buckets", "ranks")

    def __init__(self) -> None:
        self.buckets: dict[Any, _Bucket[R]] = {}
        self.ranks: list[Any] = []  # heap of ranks; may hold ranks whose bucket is gone (skipped)


class LaneIndex(Generic[R]):
    """Queued requests by lane and rank; :meth:`best` is the request with the least ``policy.key``."""

    def __init__(self, policy: LaneOrder) -> None:
        self.policy = policy
        self._lanes: dict[Hashable, _Lane[R]] = {}
        self._where: dict[int, tuple[Hashable, Any, int]] = {}  # id(req) -> (lane, rank, token)
        self._flips: list[tuple[float, int, LanePosition, R]] = []  # (flip, token, position, request)
        self._tokens = itertools.count()
        self._now = float("-inf")

    def add(self, req: R, now: float) -> None:
        if id(req) in self._where:
            self.discard(req)
        p = self.policy.place(req, now)
        token = self._insert(req, p)
        if p.flip is not None:
            heapq.heappush(self._flips, (p.flip, token, p, req))

    def discard(self, req: R) -> None:
        where = self._where.pop(id(req), None)
        if where is None:
            return
        lane_id, rank, _ = where
        lane = self._lanes[lane_id]
        bucket = lane.buckets[rank]
        bucket.live -= 1
        if bucket.live == 0:
            del lane.buckets[rank]
            if not lane.buckets:
                del self._lanes[lane_id]

    def rebuild(self, reqs: Iterable[R], now: float) -> None:
        """Place every request afresh (the clock went back: flips may have to be undone)."""
        self._lanes.clear()
        self._where.clear()
        self._flips = []
        for req in reqs:
            self.add(req, now)

    def best(self, now: float, members: Iterable[R]) -> tuple[Any, R] | None:
        """``(key, request)`` with the least key at ``now``; None when empty."""
        if now < self._now:
            self.rebuild(members, now)
        self._now = now
        self._apply_flips(now)
        best: tuple[Any, R] | None = None
        for lane_id, lane in self._lanes.items():
            cand = self._lane_best(lane_id, lane, now)
            if best is None or cand[0] < best[0]:
                best = cand
        return best

    # --- internals ----------------------------------------------------------------------------
    def _insert(self, req: R, p: LanePosition) -> int:
        token = next(self._tokens)
        lane = self._lanes.get(p.lane)
        if lane is None:
            lane = self._lanes[p.lane] = _Lane()
        bucket = lane.buckets.get(p.rank)
        if bucket is None:
            bucket = lane.buckets[p.rank] = _Bucket()
            heapq.heappush(lane.ranks, p.rank)
        heapq.heappush(bucket.heap, (*fcfs_tiebreak(req), token, req))
        bucket.live += 1
        self._where[id(req)] = (p.lane, p.rank, token)
        return token

    def _live(self, req: R, token: int) -> bool:
        where = self._where.get(id(req))
        return where is not None and where[2] == token

    def _apply_flips(self, now: float) -> None:
        flips, policy = self._flips, self.policy
        while flips:
            flip, token, placed, req = flips[0]
            if self._live(req, token):
                if not policy.flipped(flip, now):
                    return
                self.discard(req)
                self._insert(req, policy.after_flip(placed))
            heapq.heappop(flips)

    def _head(self, bucket: _Bucket[R]) -> tuple[float, Any, int, R]:
        heap = bucket.heap
        while not self._live(heap[0][3], heap[0][2]):
            heapq.heappop(heap)
        return heap[0]

    def _lane_best(self, lane_id: Hashable, lane: _Lane[R], now: float) -> tuple[Any, R]:
        """Least key in a non-empty lane: walk the rank heap from its root while primaries tie."""
        ranks, buckets = lane.ranks, lane.buckets
        while ranks[0] not in buckets:
            heapq.heappop(ranks)
        if len(ranks) > 2 * len(buckets) + 16:  # too many ranks whose bucket is gone
            lane.ranks = ranks = list(buckets)
            heapq.heapify(ranks)
        primary = self.policy.primary(lane_id, ranks[0], now)
        best = self._head(buckets[ranks[0]])
        stack = [1, 2]
        while stack:
            i = stack.pop()
            if i >= len(ranks) or self.policy.primary(lane_id, ranks[i], now) != primary:
                continue  # greater, and so is everything below it
            bucket = buckets.get(ranks[i])
            if bucket is not None:
                best = min(best, self._head(bucket))
            stack += (2 * i + 1, 2 * i + 2)
        arrival, tiebreak, _, req = best
        return (*primary, arrival, tiebreak), req
