"""Prompt blocks held once for all the requests in flight on one backend (prefix sharing in the charge).

An engine with prefix caching lets a request take the cached blocks of a prompt that starts like its
own, and while both run they hold those blocks once. So a request whose leading blocks another
request in flight on the same backend has already computed (it has started: its prefill is done) is
charged without them (``Charge.sharing``). Blocks of a request still waiting or in prefill are not
shared yet: an engine that admits two requests missing one prefix together computes it twice.

A block starts out charged to the request that brought it (its *owner*). Once another request shares
it, it is charged to the backend instead (*pinned*): it stays as long as any of its users runs, so the
admission rule's projection (``Holdings``) must not free it when its first user finishes. A request
that computed its own copy of a block another holds (both missed it together) pays for its copy.
Every resident block is so charged once per copy, whatever the order in which its users finish.

Invariants: a key is in ``refs`` exactly while some charge entered with it has not left, its count
being how many (``computed``: how many of those have started); a key is owned or pinned, never both;
``pinned_tokens`` is the sum of the pinned blocks' tokens; an empty ``refs`` means nothing pinned.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A request's prompt as whole cacheable blocks."""

    keys: Sequence[Hashable]
    """Chained content keys of its whole blocks (``core.prefix``: equal keys, equal prefixes)."""
    tokens: float
    """Prompt tokens per block."""
    shared: int = 0
    """Leading blocks another request in flight on its backend already holds: not charged to it."""


class Holder(Protocol):
    """A charge that can give up blocks it owns (``policies.admission.Charge``)."""

    def drop(self, tokens: float) -> float:
        """Stop charging ``tokens`` of its prompt (they are the backend's now); returns how much its
        charge fell."""
        ...


class ResidentBlocks:
    """The blocks the charged requests of one backend hold (see the module docstring)."""

    __slots__ = ("_computed", "_owner", "_pinned", "_refs", "pinned_tokens")

    def __init__(self) -> None:
        self._refs: dict[Hashable, int] = {}
        self._computed: dict[Hashable, int] = {}
        self._owner: dict[Hashable, Holder] = {}
        self._pinned: dict[Hashable, float] = {}
        self.pinned_tokens = 0.0
        """Tokens of the blocks charged to the backend rather than to one request."""

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

    def enter(self, holder: Holder, blocks: PromptBlocks) -> float | None:
        """``holder`` (holding ``blocks``, charged for all but the first ``blocks.shared``) was charged
        here. Returns how the backend's charge moves (pinned blocks in, their owners' charges out),
        or None when no other charge moved."""
        refs, owner, pinned = self._refs, self._owner, self._pinned
        moved: float | None = None
        for j, key in enumerate(blocks.keys):
            refs[key] = refs.get(key, 0) + 1
            if j < blocks.shared:
                if key not in pinned:
                    first = owner.pop(key, None)
                    moved = (moved or 0.0) + blocks.tokens
                    if first is not None:
                        moved -= first.drop(blocks.tokens)
                    pinned[key] = blocks.tokens
                    self.pinned_tokens += blocks.tokens
            elif key not in owner and key not in pinned:
                owner[key] = holder
            # else: it computes its own copy of a block another holds (both computed it together)
        return moved

    def started(self, blocks: PromptBlocks) -> None:
        """That request started (its prefill is done): others can share its blocks now."""
        done = self._computed
        for key in blocks.keys:
            done[key] = done.get(key, 0) + 1

    def leave(self, holder: Holder, blocks: PromptBlocks, started: bool) -> float:
        """``holder`` left (``started``: after :meth:`started`); returns how the pinned tokens moved
        (the backend's charge moves with them: a pinned block goes with its last user)."""
        refs, owner, pinned = self._refs, self._owner, self._pinned
        if started:
            done = self._computed
            for key in blocks.keys:
                count = done[key] - 1
                if count:
                    done[key] = count
                else:
                    del done[key]
        moved = 0.0
        for key in blocks.keys:
            if owner.get(key) is holder:
                del owner[key]  # nobody shared it (else it would be pinned): it goes with its owner
            count = refs[key] - 1
            if count:
                refs[key] = count
                continue
            del refs[key]
            gone = pinned.pop(key, None)
            if gone is not None:
                moved -= gone
        self.pinned_tokens += moved
        if not refs:
            self.pinned_tokens = 0.0  # no float drift once nothing is held
        return moved
