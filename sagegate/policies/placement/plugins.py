"""The three kinds of placement plugin, llm-d's shape: filters drop backends, scorers grade the rest,
a picker chooses. A profile (``policies.placement.profile``) names one picker and weighted scorers.

Invariants every plugin keeps (the simulator and the live gateway call the same objects, and the
property tests rely on it):

- **Pure**: a plugin reads the :class:`PlacementQuery` and changes nothing (no backend's load, no
  request); the same query gets the same answer, in the gateway and in the simulator.
- **Cheap**: it runs for every backend on every head decision of the dispatch pass; O(1) a backend.
- **No veto past the rule**: filters may only remove backends. The admission rule's own filters
  (``eligible``, ``admits``) always run, so no profile sends a request where memory does not admit it.
- **Higher is better** for a scorer. Its unit is its own (the built-ins score in prompt tokens of
  prefill time, except ``room``: tokens of KV room); the ``incumbent`` picker adds them weighted as
  they are, ``max_score`` rescales each to [0, 1] over the candidates first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.placement.outcome import CacheView


@dataclass(slots=True)
class PlacementQuery:
    """Everything a plugin may read about one request's placement (read only: not frozen, since it is
    made for every head decision and a frozen dataclass is slower to make)."""

    charge: Charge
    """Its whole charge (what it costs where no request in flight shares its prompt blocks)."""
    per_backend: Sequence[Charge] | None
    """Its charge on each backend, less the leading blocks a request in flight there already holds;
    None: ``charge`` everywhere."""
    loads: Sequence[BackendLoad]
    cfg: AdmissionConfig
    """The admission rule for this request's priority band."""
    prompt_tokens: int
    allowed: Sequence[bool] | None
    """Backends it may use (model served, circuit closed, not excluded); None: all."""
    view: CacheView | None
    """Its prompt's predicted cached tokens per backend (None: placement blind to the cache)."""
    request: object | None = None
    """The request itself (the gateway's or the simulator's; read its fields with care: both have
    ``prompt_tokens``, ``priority``, ``tenant`` and ``model``)."""
    hits: Sequence[int] | None = field(init=False)
    """Predicted cached prompt tokens per backend, or None when nothing is cached anywhere (or
    nothing is known)."""

    def __post_init__(self) -> None:
        view = self.view
        self.hits = None if view is None or max(view.hits, default=0) <= 0 else view.hits

    def charge_on(self, i: int) -> Charge:
        return self.charge if self.per_backend is None else self.per_backend[i]


class Filter(Protocol):
    """Whether backend ``i`` may take the request. ``cached``: its prompt tokens predicted cached
    there when the caller weighs the cache (a warm backend's queue is counted in prefill it will do),
    None when it does not."""

    def keep(self, q: PlacementQuery, i: int, cached: int | None) -> bool: ...


class Scorer(Protocol):
    """How good backend ``i`` is for the request (higher is better), in the scorer's own unit."""

    def score(self, q: PlacementQuery, i: int) -> float: ...


class Candidates(Protocol):
    """What a picker is given: the filters and the weighted scorers, bound to one query."""

    query: PlacementQuery

    def kept(self, i: int, cached: int | None) -> bool: ...

    def score(self, i: int) -> float:
        """The weighted sum of the profile's scorers for backend ``i``."""
        ...

    def columns(self, backends: Sequence[int]) -> list[tuple[float, list[float]]]:
        """Each scorer's weight and its scores for ``backends``, in profile order."""
        ...


class Picker(Protocol):
    """The backend for the request among those the filters keep, or None (none admits it now).
    A picker that weighs no scorers says so with a class attribute ``reads_scores = False``."""

    def pick(self, c: Candidates) -> int | None: ...
