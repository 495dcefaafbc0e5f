"""The in-process history store: the default when no Redis URL is configured.

It keeps the live window of records so that a predictor rebuilt in the same process (a reload, a
second predictor over the same store) starts warm. There is no other replica to hear from, so it never
delivers anything. ``retain=False`` keeps nothing (the predictor's index is then the only copy, which
halves memory for a single replica that never restarts).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from sagegate.predictor.history import Completion, Deliver, StoreStats, WindowBounds, wall_clock


class MemoryStore:
    def __init__(
        self,
        bounds: WindowBounds | None = None,
        retain: bool = True,
        clock: Callable[[], float] = wall_clock,
    ) -> None:
        self.clock = clock
        self.bounds = bounds or WindowBounds()
        self.retain = retain
        self._records: dict[str, deque[Completion]] = {}
        self._lock = threading.Lock()
        self._stats = StoreStats()

    def start(self, deliver: Deliver) -> list[Completion]:
        with self._lock:
            self._expire(self.clock())
            out = [r for q in self._records.values() for r in q]
        out.sort(key=lambda r: r.ts)
        return out

    def append(self, record: Completion) -> None:
        self._stats.appended += 1
        if not self.retain:
            return
        with self._lock:
            q = self._records.setdefault(record.model, deque())
            q.append(record)
            while len(q) > self.bounds.max_entries:
                q.popleft()
        self._stats.written += 1

    def _expire(self, now: float) -> None:
        horizon = self.bounds.horizon(now)
        for q in self._records.values():
            while q and q[0].ts < horizon:
                q.popleft()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._records.values())

    def close(self) -> None:
        pass

    def stats(self) -> StoreStats:
        return self._stats
