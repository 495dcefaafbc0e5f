"""Pickers: the choice among the backends the filters keep (``policies.placement.plugins.Picker``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sagegate.policies.placement.plugins import Candidates, Scorer
from sagegate.policies.placement.scorers.least_held import LeastHeld
from sagegate.policies.placement.scorers.prefix_hit import PrefixHit
from sagegate.policies.placement.scorers.room import Room


@dataclass(frozen=True)
class Incumbent:
    """The default: the admission rule's choice stays unless a backend holding more of the prompt
    scores strictly better.

    1. The incumbent is the backend the ``baseline`` scorer rates best (the most room), the first on
       ties, among those the filters keep for the whole prompt.
    2. Nothing cached anywhere: among backends with the incumbent's baseline score, the one the
       ``tie_break`` scorer rates best (the emptiest cache) takes it.
    3. Otherwise a backend the ``gate`` scorer rates strictly above the incumbent (more of the prompt
       cached), kept by the filters with its hit counted, replaces it when the profile's weighted
       score is strictly higher (by default ``cached − queued prefill``: it sticks to the warm
       backend while waiting there costs less than recomputing elsewhere)."""

    baseline: Scorer = field(default_factory=Room)
    tie_break: Scorer = field(default_factory=LeastHeld)
    gate: Scorer = field(default_factory=PrefixHit)

    def pick(self, c: Candidates) -> int | None:
        q = c.query
        n = len(q.loads)
        best: int | None = None
        best_base = float("-inf")
        for i in range(n):
            if c.kept(i, None):
                base = self.baseline.score(q, i)
                if base > best_base:
                    best, best_base = i, base
        if q.view is None:
            return best
        hits = q.hits
        if hits is None:
            return None if best is None else self._spread(c, best, best_base)
        best_score, floor = float("-inf"), 0.0
        if best is not None:
            best_score, floor = c.score(best), self.gate.score(q, best)
        incumbent = best
        for i in range(n):
            if i == incumbent or self.gate.score(q, i) <= floor or not c.kept(i, hits[i]):
                continue
            s = c.score(i)
            if s > best_score:
                best, best_score = i, s
        return best

    def _spread(self, c: Candidates, best: int, base: float) -> int:
        q, tie = c.query, self.tie_break
        choice = best
        for i in range(len(q.loads)):
            better = tie.score(q, i) > tie.score(q, choice)
            if better and self.baseline.score(q, i) == base and c.kept(i, None):
                choice = i
        return choice


@dataclass(frozen=True)
class MaxScore:
    """llm-d's max-score picker: each scorer's scores rescaled to [0, 1] over the backends the filters
    keep (all equal: 0), weighted and summed; the highest wins, the first on ties. Weights are then
    relative importance (``prefix_hit: 2, room: 1``), whatever each scorer's unit. The rescaling
    stretches any difference to the full range: one token more room counts as much as the whole gap
    between the emptiest and the fullest backend, so weight a scorer that splits hairs lightly."""

    def pick(self, c: Candidates) -> int | None:
        q = c.query
        hits = q.hits
        # a backend's backlog is counted in prefill it will do only where it holds part of the prompt
        kept = [
            i for i in range(len(q.loads)) if c.kept(i, hits[i] if hits is not None and hits[i] > 0 else None)
        ]
        if len(kept) <= 1:
            return kept[0] if kept else None
        total = [0.0] * len(kept)
        for weight, scores in c.columns(kept):
            lo, hi = min(scores), max(scores)
            if hi > lo:
                for k, s in enumerate(scores):
                    total[k] += weight * (s - lo) / (hi - lo)
        top = max(range(len(kept)), key=lambda k: (total[k], -k))
        return kept[top]
