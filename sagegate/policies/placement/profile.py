"""A placement profile: the admission rule's filters, any added ones, weighted scorers and a picker,
as one pure function of a request's charge and the backends' loads (``place``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, shared_charges
from sagegate.policies.placement.filters import Admits, Eligible
from sagegate.policies.placement.forecast import Forecast
from sagegate.policies.placement.outcome import CacheView, Placement, classify
from sagegate.policies.placement.pickers import Incumbent
from sagegate.policies.placement.plugins import Filter, Picker, PlacementQuery, Scorer
from sagegate.policies.placement.registry import FILTERS, PICKERS, SCORERS, make_plugin
from sagegate.policies.placement.scorers.prefix_hit import PrefixHit
from sagegate.policies.placement.scorers.queued_prefill import QueuedPrefill

INCUMBENT_SCORERS: dict[str, float] = {"prefix_hit": 1.0, "queued_prefill": 1.0}
"""The weights of a picker that reads scores, unless named: a backend's score is its cached prompt
tokens less the prefill queued there, both in tokens of prefill time."""


@dataclass(frozen=True)
class PlacementProfile:
    scorers: tuple[tuple[Scorer, float], ...] = ()
    picker: Picker = field(default_factory=Forecast)
    filters: tuple[Filter, ...] = ()
    """Filters added between the rule's own ``eligible`` and ``admits``."""
    _all_filters: tuple[Filter, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "_all_filters", (Eligible(), *self.filters, Admits()))

    def place(
        self,
        charge: Charge,
        loads: Sequence[BackendLoad],
        cfg: AdmissionConfig,
        prompt_tokens: int,
        allowed: Sequence[bool] | None,
        view: CacheView | None,
        request: object | None = None,
    ) -> Placement:
        """The backend for a request charged ``charge`` whose prompt is ``view.hits[i]`` tokens cached
        on backend ``i`` (``view`` None: nothing known), or ``Placement(None)`` when none admits it.
        Where a request in flight on a backend already holds its leading blocks, it is judged (and
        charged) there without them."""
        per = shared_charges(charge, loads)
        q = PlacementQuery(charge, per, loads, cfg, prompt_tokens, allowed, view, request)
        bound = _Bound(q, self._all_filters, self.scorers)
        idx = self.picker.pick(bound)
        if idx is None:
            return Placement(None)
        placed_charge = per[idx] if per is not None else None
        times = getattr(self.picker, "times", None)
        forecast = times(bound, idx) if times is not None else None
        hits = q.hits
        if hits is None:
            return Placement(idx, charge=placed_charge, forecast=forecast)
        return Placement(idx, hits[idx], classify(hits, idx), placed_charge, forecast)


class _Bound:
    """A profile's filters and scorers bound to one query (``plugins.Candidates``)."""

    __slots__ = ("_filters", "_scorers", "query")

    def __init__(
        self, query: PlacementQuery, filters: tuple[Filter, ...], scorers: tuple[tuple[Scorer, float], ...]
    ) -> None:
        self.query, self._filters, self._scorers = query, filters, scorers

    def kept(self, i: int, cached: int | None) -> bool:
        q = self.query
        return all(f.keep(q, i, cached) for f in self._filters)

    def score(self, i: int) -> float:
        q, s = self.query, 0.0
        for scorer, weight in self._scorers:
            s += weight * scorer.score(q, i)
        return s

    def columns(self, backends: Sequence[int]) -> list[tuple[float, list[float]]]:
        q = self.query
        return [(w, [scorer.score(q, i) for i in backends]) for scorer, w in self._scorers]


def build_profile(
    scorers: Mapping[str, float] | None = None, picker: str = "forecast", filters: Sequence[str] = ()
) -> PlacementProfile:
    """A profile from names (a config file's): ``scorers`` name → weight (None: the picker's own,
    :data:`INCUMBENT_SCORERS` for one that reads scores). A picker that reads none (``forecast``)
    refuses scorers rather than ignore them."""
    chosen = make_plugin("picker", picker, PICKERS, "pick")
    if not getattr(chosen, "reads_scores", True):
        if scorers:
            raise ValueError(
                f"placement picker {picker!r} reads no scorers ({', '.join(scorers)}): drop them, "
                "or name a picker that weighs them (incumbent, max_score)"
            )
        weights: Mapping[str, float] = {}
    else:
        weights = INCUMBENT_SCORERS if scorers is None else scorers
        for name, w in weights.items():
            if not math.isfinite(w):
                raise ValueError(f"placement scorer {name!r}: weight must be finite, got {w}")
        if not any(weights.values()):  # every backend would score the same: the first kept takes all
            raise ValueError("placement scorers: at least one needs a non-zero weight")
    return PlacementProfile(
        scorers=tuple((make_plugin("scorer", n, SCORERS, "score"), float(w)) for n, w in weights.items()),
        picker=chosen,
        filters=tuple(make_plugin("filter", n, FILTERS, "keep") for n in filters),
    )


DEFAULT_PROFILE = PlacementProfile()
"""The ``forecast`` picker: the backend where the request finishes soonest, counting what it costs
the requests already there (``policies.placement.forecast``)."""

INCUMBENT_PROFILE = PlacementProfile(((PrefixHit(), 1.0), (QueuedPrefill(), 1.0)), Incumbent())
"""The cache-aware score rule (the default until issue 64): the ``incumbent`` picker, ``prefix_hit``
and ``queued_prefill`` at 1."""
