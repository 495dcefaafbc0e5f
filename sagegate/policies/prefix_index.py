"""What one backend's prefix cache is predicted to hold: the content keys of the blocks sent there.

The gateway cannot see a backend's cache (unless the engine publishes its KV events), so it keeps the
keys of the prompt blocks it routed there, least recently used first, bounded by the backend's KV
capacity in blocks, as the engine's own cache is: a block is touched when a request carrying it is
computed there and again when that request leaves (the engine frees its blocks then, and they join the
tail of its eviction order). A predicted hit is then one the engine most likely still holds.

A block the engine may still refuse is *claimed* (:meth:`claim`) at dispatch: it counts as held for
matching (a burst sharing a new prefix goes where the first of it went), but joins the LRU only once
a request carrying it is computed (:meth:`settle` then :meth:`touch`); a request refused or failed
before its first token gives its claim back and leaves nothing behind.

Invariants: ``len(index) <= capacity_blocks`` (claims aside: at most the blocks in flight);
``match(keys)`` counts leading keys held or claimed, up to the first that is neither, and changes
nothing (keys are chained, ``core.prefix``: a block's key names its whole
prefix, so a match is always a prefix); ``clear()`` forgets everything (a restarted or
dead backend holds nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from sagegate.core.prefix import held_prefix


class PrefixIndex:
    __slots__ = ("_claims", "_lru", "capacity_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._lru: OrderedDict[Hashable, None] = OrderedDict()
        self._claims: dict[Hashable, int] = {}
        """Blocks not held but sent in a request not yet computed → how many such requests."""

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, keys: Sequence[Hashable]) -> int:
        """How many of ``keys``' leading blocks are held."""
        lru, claims = self._lru, self._claims
        n = 0
        for key in keys:
            if key not in lru and key not in claims:
                break
            n += 1
        return n

    def claim(self, keys: Sequence[Hashable]) -> tuple[Hashable, ...]:
        """A request with these blocks was sent here: those not held are claimed until it is computed
        or gives up. Returns the claim, for :meth:`settle`."""
        lru, claims = self._lru, self._claims
        claimed = tuple(k for k in keys if k not in lru)
        for key in claimed:
            claims[key] = claims.get(key, 0) + 1
        return claimed

    def settle(self, claimed: Sequence[Hashable]) -> None:
        """Give a claim back: the request was computed (then :meth:`touch` its blocks), or not."""
        claims = self._claims
        for key in claimed:
            n = claims.get(key, 0) - 1
            if n > 0:
                claims[key] = n
            else:
                claims.pop(key, None)

    def touch(self, keys: Sequence[Hashable]) -> None:
        """A request with these blocks was computed here, or left: they are the most recently used,
        its first block most of all. The engine frees a request's blocks in reverse (vLLM), so that
        its cache gives up a prompt's tail before its prefix, and a prefix partly evicted still
        matches; keys touched in order would lose the first block first, and with it the whole
        match, while the engine still holds all but the tail."""
        lru = self._lru
        for key in reversed(keys):
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
        """The backend holds nothing (claims stay: their requests settle them)."""
        self._lru.clear()


class InFlight:
    """The prompt blocks of the requests a backend is running or about to run (sent, not yet left).

    A backend's KV-cache events report a block once its prefill has computed it, so an index built
    from them alone is blind to a prefill in progress: a burst sharing a new prefix would be spread
    over the fleet, each backend computing it again. These blocks are held there meanwhile (a running
    request's blocks are never evicted) or about to be, whatever the events say yet.

    Invariants: ``match(keys)`` counts ``keys``' leading blocks carried by some request added and not
    removed, and changes nothing; ``remove`` of a request never added (or removed already) does
    nothing, so every way a request leaves may call it.
    """

    __slots__ = ("_count", "_keys")

    def __init__(self) -> None:
        self._count: dict[Hashable, int] = {}
        self._keys: dict[Hashable, Sequence[Hashable]] = {}

    def __len__(self) -> int:
        """Requests in flight."""
        return len(self._keys)

    def add(self, rid: Hashable, keys: Sequence[Hashable]) -> None:
        self.remove(rid)
        self._keys[rid] = keys
        count = self._count
        for key in keys:
            count[key] = count.get(key, 0) + 1

    def remove(self, rid: Hashable) -> None:
        keys = self._keys.pop(rid, None)
        if keys is None:
            return
        count = self._count
        for key in keys:
            n = count[key] - 1
            if n:
                count[key] = n
            else:
                del count[key]

    def match(self, keys: Sequence[Hashable]) -> int:
        """How many of ``keys``' leading blocks some request in flight carries."""
        return held_prefix(keys, self._count)
