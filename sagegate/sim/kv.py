"""Paged KV cache with prefix caching, as vLLM's block manager keeps it.

Blocks of ``block_size`` tokens, allocated on demand. With prefix caching, every *full* block of
shareable prompt content is registered under a content key (a chain hash of the content before it and
its own). A preempted request registers its other full blocks too, under request-private keys, so its
recomputation finds them if they survive. A freed cached block stays cached, evictable least recently
used first; a request whose prompt starts with cached blocks takes them without recomputing them.
(Simplification: a *finished* request's private blocks return as plain free blocks, evicted before any
cached block; vLLM keeps them in its LRU too, but nothing can ever hit them.)

The pool never lends more blocks than it has: ``used + free == num_blocks`` always.

Whoever wants to see the cache change (the simulated backend publishing vLLM's KV events,
``sim.kv_events``) sets :attr:`BlockPool.events`: it hears of every block newly cached, every cached
block evicted and every reset, as vLLM's block pool reports them. Unset (the default, and always in
the simulator) it costs one test per block cached or evicted and changes nothing the pool does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from sagegate.sim.prefix import BlockKeys


class CacheEvents(Protocol):
    """What the pool tells an observer of its prefix cache (vLLM's ``BlockStored``, ``BlockRemoved``,
    ``AllBlocksCleared``). Called synchronously inside the pool's own operations; must not call back."""

    def stored(self, key_of: Callable[[int], Hashable], blocks: list[int]) -> None:
        """Blocks ``blocks`` (indices into the request whose keys ``key_of`` gives, ascending) were
        cached: their content was not cached before."""

    def removed(self, key: Hashable) -> None:
        """The cached block ``key`` was evicted (its content is no longer cached)."""

    def cleared(self) -> None:
        """Every cached block was dropped (a prefix cache reset)."""


class BlockTable:
    """One request's blocks: ``nblocks`` in all, the first ``len(keys)`` of them registered (cached)."""

    __slots__ = ("keys", "nblocks")

    def __init__(self) -> None:
        self.nblocks = 0
        self.keys: list[Hashable | None] = []  # None: a private duplicate of a cached block


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_prefix_caching
        self._plain_free = num_blocks  # free blocks holding nothing worth keeping
        self._lru: OrderedDict[Hashable, None] = OrderedDict()  # free blocks still cached, oldest first
        self._ref: dict[Hashable, int] = {}  # cached blocks in use, by key → number of holders
        self.hits_tokens = 0
        self.queried_tokens = 0
        self.events: CacheEvents | None = None
        """An observer of the prefix cache (see the module docstring); None: nobody listens."""

    # --- accounting ---------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self._plain_free + len(self._lru)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    @property
    def cached_in_use(self) -> int:
        """Cached blocks held by at least one request (each counted once, however many share it)."""
        return len(self._ref)

    @property
    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # --- prefix cache -------------------------------------------------------------------------
    def cached_prefix(self, key_of: Callable[[int], Hashable], max_blocks: int) -> list[Hashable]:
        """Keys of the leading blocks (at most ``max_blocks``) already cached, in use or free."""
        if not self.caching:
            return []
        hits: list[Hashable] = []
        ref, lru = self._ref, self._lru
        for j in range(max_blocks):
            key = key_of(j)
            if key in ref or key in lru:
                hits.append(key)
            else:
                break
        return hits

    def prefix_hits(self, key_of: Callable[[int], Hashable], max_blocks: int) -> tuple[list[Hashable], int]:
        """:meth:`cached_prefix`, plus how many of the hits are free cached blocks (what
        :meth:`can_take` counts as revived), in one pass. With :class:`BlockKeys` (the engine's
        keys) a long run of hits scans the request's memoised key list, no call per block."""
        if not self.caching or max_blocks <= 0:
            return [], 0
        ref, lru = self._ref, self._lru
        key = key_of(0)
        if key not in ref and key not in lru:
            return [], 0  # the common case: nothing cached for this request
        if isinstance(key_of, BlockKeys):
            keys = key_of.first(max_blocks)
            if len(keys) > max_blocks:
                keys = keys[:max_blocks]
        else:
            keys = [key_of(j) for j in range(max_blocks)]
        hits: list[Hashable] = []
        revived = 0
        for key in keys:
            if key in ref:
                hits.append(key)
            elif key in lru:
                hits.append(key)
                revived += 1
            else:
                break
        return hits, revived

    def fits(self, revived: int, new_blocks: int) -> bool:
        """:meth:`can_take` with the revived count already known (from :meth:`prefix_hits`)."""
        return new_blocks <= self.free_blocks - revived

    def take_fresh(self, blocks: int) -> None:
        """Hand out ``blocks`` fresh blocks (plain free ones first, then evicting the least recently
        used cached ones): what a run of :meth:`grow` calls totalling ``blocks`` does to the pool.
        The caller checked they fit and adds them to its tables."""
        take_plain = min(blocks, self._plain_free)
        self._plain_free -= take_plain
        if blocks > take_plain:
            self._evict(blocks - take_plain)

    def _evict(self, n: int) -> None:
        """Evict the ``n`` least recently used cached free blocks."""
        lru = self._lru
        events = self.events
        if events is None:
            for _ in range(n):
                lru.popitem(last=False)
        else:
            for _ in range(n):
                events.removed(lru.popitem(last=False)[0])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's ``reset_prefix_cache``; refused (False, nothing
        changes) while any block is in use, as vLLM refuses."""
        if self.used_blocks:
            return False
        self._plain_free += len(self._lru)
        self._lru.clear()
        if self.events is not None:
            self.events.cleared()
        return True

    def can_take(self, hit_keys: Sequence[Hashable], new_blocks: int) -> bool:
        """Would taking the cached ``hit_keys`` plus ``new_blocks`` fresh blocks fit?"""
        revived = sum(1 for k in hit_keys if k in self._lru)
        return new_blocks <= self.free_blocks - revived

    def take(self, table: BlockTable, hit_keys: Sequence[Hashable]) -> None:
        """Give an empty ``table`` the cached blocks ``hit_keys`` (shared, reference-counted)."""
        assert table.nblocks == 0
        for key in hit_keys:
            if key in self._lru:
                del self._lru[key]
                self._ref[key] = 1
            else:
                self._ref[key] += 1
            table.keys.append(key)
        table.nblocks = len(hit_keys)

    # --- allocation ---------------------------------------------------------------------------
    def grow(self, table: BlockTable, tokens: int) -> bool:
        """Make ``table`` hold ``tokens`` tokens; False (and no change) if the pool is short."""
        need = -(-tokens // self.block_size) - table.nblocks
        if need <= 0:
            return True
        if need > self._plain_free + len(self._lru):
            return False
        take_plain = min(need, self._plain_free)
        self._plain_free -= take_plain
        if need > take_plain:
            self._evict(need - take_plain)  # the least recently used cached blocks
        table.nblocks += need
        return True

    def register_full(
        self, table: BlockTable, computed_tokens: int, key_of: Callable[[int], Hashable]
    ) -> None:
        """Cache every block of ``table`` that ``computed_tokens`` has filled and is not yet cached."""
        if not self.caching:
            return
        full = min(computed_tokens // self.block_size, table.nblocks)
        keys = table.keys
        ref = self._ref
        new: list[int] | None = None if self.events is None else []
        for j in range(len(keys), full):
            key = key_of(j)
            if key in ref:
                # Same content computed twice (two requests missed one prefix together): the first
                # copy stays the cached one; this block stays private and is freed plainly.
                keys.append(None)
                continue
            if key in self._lru:
                # A stale free copy of the same content: this block becomes the cached one and the
                # stale copy a plain free block.
                del self._lru[key]
                self._plain_free += 1
            elif new is not None:
                new.append(j)
            ref[key] = 1
            keys.append(key)
        if new:
            assert self.events is not None
            self.events.stored(key_of, new)

    def free(self, table: BlockTable) -> None:
        """Release every block of ``table``; cached ones stay cached, most recent last."""
        ref = self._ref
        lru = self._lru
        cached = 0
        # vLLM frees in reverse so that a request's tail is evicted before its prefix.
        for key in reversed(table.keys):
            if key is None:
                continue
            n = ref[key] - 1
            if n:
                ref[key] = n
            else:
                del ref[key]
                if key in lru:  # pragma: no cover - a key is never both in use and free
                    raise AssertionError("block cached twice")
                lru[key] = None
            cached += 1
        self._plain_free += table.nblocks - cached
        table.nblocks = 0
        table.keys = []
