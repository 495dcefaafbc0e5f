"""A bounded mapping that forgets the entry least recently written (or read through :meth:`Lru.get`):
what the gateway's and the predictors' plain caches keep (sessions, recent prompts, prefix keys).

Caches whose eviction order carries more (eviction events, entries put back at the front) keep their
own ``OrderedDict``: ``policies.prefix_index``, ``gateway.kv_index``, ``sim.kv``,
``gateway.shared_prefixes_parts``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``maxsize`` entries; writing past it drops the least recently used one."""

    __slots__ = ("_items", "maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("an LRU cache holds at least one entry")
        self.maxsize = maxsize
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        """Keys, least recently used first."""
        return iter(self._items)

    def peek(self, key: K) -> V | None:
        """The value, leaving its place in the order as it is (None: not held)."""
        return self._items.get(key)

    def get(self, key: K) -> V | None:
        """The value, now the most recently used (None: not held)."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Hold ``value`` under ``key`` as the most recently used, dropping the least recently used
        entry when that makes one too many."""
        items = self._items
        items[key] = value
        items.move_to_end(key)
        if len(items) > self.maxsize:
            items.popitem(last=False)
