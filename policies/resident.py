"""Prompt blocks held once for all the requests in flight on one backend (prefix sharing in the charge).

An engine with prefix caching lets a request take the cached blocks of a prompt that starts like its
own, and while both run they hold those blocks once. So a request whose leading blocks another
request in flight on the same backend has already computed (it has started: its prefill is done) is
charged without them (``Charge.sharing``). Blocks of a request still waiting or in prefill are not
shared yet: an engine that admits two requests missing one prefix together computes it twice.
The request that paid for a block may leave first while others still use it: its blocks then stay
charged to the backend (*pinned*) until their last user leaves, so every resident block is charged
exactly once, whatever the order in which its users finish.

Invariants: a key is in ``refs`` exactly while some charge entered with it has not left, its count
being how many (``computed``: how many of those have started); ``pinned`` holds only keys with a
positive count whose payers have all left; ``pinned_tokens`` is the sum of their tokens; an empty ``refs``
means nothing pinned.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A request's prompt as whole cacheable blocks."""

    keys: Sequence[Hashable]
    """Chained content keys of its whole blocks (``core.prefix``: equal keys, equal prefixes)."""
    tokens: float
    """Prompt tokens per block."""
    shared: int = 0
    """Leading blocks another request in flight on its backend already holds: not charged to it."""


class ResidentBlocks:
    """The blocks the charged requests of one backend hold (see the module docstring)."""

    __slots__ = ("_computed", "_paid", "_pinned", "_refs", "pinned_tokens")

    def __init__(self) -> None:
        self._refs: dict[Hashable, int] = {}
        self._computed: dict[Hashable, int] = {}
        self._paid: dict[Hashable, int] = {}  # how many holders were charged for the block
        self._pinned: dict[Hashable, float] = {}
        self.pinned_tokens = 0.0
        """Tokens of blocks whose payers left, still held by other requests in flight."""

    def __len__(self) -> int:
        return len(self._refs)

    def shared(self, keys: Sequence[Hashable]) -> int:
        """How many of ``keys``' leading blocks a request in flight here has computed."""
        done = self._computed
        if not done:
            return 0
        n = 0
        for key in keys:
            if key not in done:
                break
            n += 1
        return n

    def enter(self, blocks: PromptBlocks) -> float:
        """A request holding ``blocks`` was charged here (for all but the first ``blocks.shared``);
        returns how the pinned tokens moved (a pinned block it pays for is no longer pinned)."""
        refs, paid, pinned = self._refs, self._paid, self._pinned
        moved = 0.0
        for j, key in enumerate(blocks.keys):
            refs[key] = refs.get(key, 0) + 1
            if j >= blocks.shared:
                paid[key] = paid.get(key, 0) + 1
                gone = pinned.pop(key, None) if pinned else None
                if gone is not None:
                    moved -= gone
        self.pinned_tokens += moved
        return moved

    def started(self, blocks: PromptBlocks) -> None:
        """That request started (its prefill is done): others can share its blocks now."""
        done = self._computed
        for key in blocks.keys:
            done[key] = done.get(key, 0) + 1

    def leave(self, blocks: PromptBlocks, started: bool) -> float:
        """That request left (``started``: after :meth:`started`); returns how the pinned tokens moved
        (the backend's charge moves with them)."""
        refs, pinned = self._refs, self._pinned
        if started:
            done = self._computed
            for key in blocks.keys:
                count = done[key] - 1
                if count:
                    done[key] = count
                else:
                    del done[key]
        paid = self._paid
        moved = 0.0
        for j, key in enumerate(blocks.keys):
            payers = paid.get(key, 0)
            if j >= blocks.shared:
                payers -= 1
                if payers:
                    paid[key] = payers
                else:
                    paid.pop(key, None)
            count = refs[key] - 1
            if count:
                refs[key] = count
                if not payers and key not in pinned:  # its last payer left; others still hold it
                    pinned[key] = blocks.tokens
                    moved += blocks.tokens
                continue
            del refs[key]
            gone = pinned.pop(key, None)
            if gone is not None:
                moved -= gone
        self.pinned_tokens += moved
        if not refs:
            self.pinned_tokens = 0.0  # no float drift once nothing is held
        return moved
