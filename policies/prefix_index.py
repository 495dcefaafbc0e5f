"""What one backend's prefix cache is predicted to hold: the content keys of the blocks sent there.

The gateway cannot see a backend's cache (unless the engine publishes its KV events), so it keeps the
keys of the prompt blocks it routed there, least recently used first, bounded by the backend's KV
capacity in blocks, as the engine's own cache is: a block is touched when a request carrying it is
sent there and again when that request leaves (the engine frees its blocks then, and they join the
tail of its eviction order). A predicted hit is then one the engine most likely still holds.

Invariants: ``len(index) <= capacity_blocks``; ``match(keys)`` counts leading keys up to the first
one not held and changes nothing (keys are chained, ``core.prefix``: a block's key names its whole
prefix, so a match is always a prefix); ``clear()`` forgets everything (a restarted or
dead backend holds nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class PrefixIndex:
    __slots__ = ("_lru", "capacity_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._lru: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, keys: Sequence[Hashable]) -> int:
        """How many of ``keys``' leading blocks are held."""
        lru = self._lru
        n = 0
        for key in keys:
            if key not in lru:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[Hashable]) -> None:
        """A request with these blocks was sent here, or left: they are the most recently used."""
        lru = self._lru
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    def resize(self, capacity_blocks: int) -> None:
        """The backend reported its capacity: evict down to it."""
        self.capacity_blocks = max(1, capacity_blocks)
        lru = self._lru
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    def clear(self) -> None:
        self._lru.clear()
