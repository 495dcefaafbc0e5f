"""Pickers for live A/Bs, named ``module:Class`` in ``placement.profile.picker`` (not shipped)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sagegate.policies.placement.forecast import Forecast
from sagegate.policies.placement.pickers import Incumbent
from sagegate.policies.placement.plugins import Scorer
from sagegate.policies.placement.scorers.least_held import LeastHeld


@dataclass(frozen=True)
class SpreadByCache(Incumbent):
    """The incumbent rule with the emptiest cache as its baseline instead of the most room: a prompt
    with nothing cached goes where least is held, as vllm-router's ``cache_aware`` sends a prompt
    that matches too little to its smallest tree; one cached somewhere goes there as before."""

    baseline: Scorer = field(default_factory=LeastHeld)


@dataclass(frozen=True)
class ForecastLearnedSpeed(Forecast):
    """The ``forecast`` picker reading each backend's speed as learned from its counters
    (``policies.engine_speed``) instead of the assumed one: the A/B of the learning."""

    learned: bool = True
