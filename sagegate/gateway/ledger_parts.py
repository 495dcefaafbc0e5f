"""The words of the shared admission ledger (``gateway.ledger``): what a replica publishes as its
queue head, the mode it is in, another replica's charge as read, and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sagegate.policies.admission import Charge


@dataclass(frozen=True, slots=True)
class QueueHead:
    """This replica's queue head as it publishes it (``order: threshold``)."""

    key: Any
    charge: Charge
    prompt_tokens: int


class LedgerMode(StrEnum):
    SHARED = "shared"
    """Redis answers: decisions weigh every replica's charges."""
    LOCAL = "local"
    """Redis is unreachable: this replica admits into ``local_share`` of each backend alone."""


class RemoteCharge(Charge):
    """Another replica's charge as last read from Redis: what it holds and has left, fixed until the
    next read (it is never progressed; the next read replaces it)."""

    __slots__ = ()

    def __init__(self, held: int, remaining: int) -> None:  # nothing to predict: no Charge.__init__
        self.held = held
        self.remaining = remaining
        self.blocks = None
        self.started = True
        self.value = float(held + remaining)


@dataclass(slots=True)
class LedgerStats:
    """Counters for ``/admin/ledger`` and the benchmark."""

    calls: int = 0
    commits: int = 0
    denied: int = 0
    failures: int = 0
    rejoins: int = 0
    last_call_s: float = 0.0
    batch_max: int = 0
    sent_first: int = 0
    """Dispatches sent before Redis saw their charge (``send_first_share``)."""
    over: int = 0
    """Calls that found a backend, where this replica had sent first, over the rule's limit."""
    remote_tokens: list[float] = field(default_factory=list)
