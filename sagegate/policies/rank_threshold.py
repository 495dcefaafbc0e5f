"""The shared rank threshold between gateway replicas (``ledger.order: threshold``).

Each replica keeps its own queue; every ledger sync it publishes its queue head (rank key, charge,
prompt) and reads the others'. A replica holds back a head ranked worse than a published foreign
head when dispatching it would leave that better head no backend that admits it (capacity is
scarce); with room for both it goes. So across replicas the better-ranked request takes scarce room
first, without a round trip per decision (the heads ride the sync that already runs). Chosen in the
simulator (``sim.replicas``; docs/journal/BENCHMARKS.md, *One order across replicas*) over a global
queue in Redis. The same function is the hold in the live dispatcher and in the simulated replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, choose_backend


@dataclass(frozen=True, slots=True)
class ForeignHead:
    """Another replica's published queue head."""

    key: Any
    """Its rank key (``Policy.key``; lower goes first)."""
    charge: Charge
    prompt_tokens: int


def _below(a: Any, b: Any) -> bool:
    """``a < b``, False where the keys do not compare (another policy's keys)."""
    try:
        return bool(a < b)
    except TypeError:
        return False


def better_head(key: Any, heads: Sequence[ForeignHead]) -> ForeignHead | None:
    """The best-ranked of ``heads`` ranked better than ``key`` (None: none is)."""
    best: ForeignHead | None = None
    for h in heads:
        if _below(h.key, key) and (best is None or _below(h.key, best.key)):
            best = h
    return best


def threshold_mask(
    key: Any,
    charge: Charge,
    prompt_tokens: int,
    loads: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    heads: Sequence[ForeignHead],
    allowed: Sequence[bool] | None = None,
) -> Sequence[bool] | None:
    """``allowed`` narrowed to the backends where a request of ``key`` and ``charge`` leaves the best
    better-ranked foreign head a backend that admits it (``allowed`` itself when no head is better).
    All False: hold it.

    Admission is monotone (more load never admits more), so only one backend ever needs a
    hypothetical charge: where the head fits nowhere now, hold everywhere; where it fits on two
    backends or more, charging one leaves another. Charges ``loads`` hypothetically and restores them.
    """
    head = better_head(key, heads)
    if head is None:
        return allowed
    fits = [choose_backend(head.charge, [load], cfg, head.prompt_tokens) is not None for load in loads]
    where = [i for i, ok in enumerate(fits) if ok]
    mask = [len(where) > 1 or (len(where) == 1 and where[0] != i) for i in range(len(loads))]
    if len(where) == 1 and (allowed is None or allowed[where[0]]):
        load = loads[where[0]]  # its only room: does it survive this request there?
        load.charge(charge)
        load.waiting += 1
        load.waiting_tokens += prompt_tokens
        mask[where[0]] = choose_backend(head.charge, [load], cfg, head.prompt_tokens) is not None
        load.waiting -= 1
        load.waiting_tokens -= prompt_tokens
        load.release(charge)
    if allowed is not None:
        mask = [m and ok for m, ok in zip(mask, allowed, strict=True)]
    return mask


def wire_key(key: Any) -> Any:
    """A rank key as JSON (tuples as lists; anything but numbers and strings as its text)."""
    if isinstance(key, tuple | list):
        return [wire_key(k) for k in key]
    if isinstance(key, bool) or not isinstance(key, int | float | str):
        return str(key)
    return key


def key_from_wire(obj: Any) -> Any:
    """The inverse of :func:`wire_key` (lists as tuples, so keys compare as ``Policy.key`` does)."""
    if isinstance(obj, list):
        return tuple(key_from_wire(k) for k in obj)
    return obj
