"""What placement decides for one request, and what it is told of the backends' prefix caches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sagegate.policies.admission import Charge


class PlacementKind(StrEnum):
    """How a placement relates to the predicted cache (``sagegate_placements_total{kind}``)."""

    NO_HIT = "no_hit"
    """No backend holds any of the prompt: the most-room rule."""
    STICKY = "sticky"
    """Sent where the most of its prompt is cached."""
    BROKE_AWAY = "broke_away"
    """Some backend holds more of it, but waiting there (or its memory) costs more."""


@dataclass(frozen=True, slots=True)
class Forecasted:
    """When a placed request's first and last tokens are forecast to come, in seconds after it is
    sent, on an engine of the picker's assumed speed (``placement.forecast``): the gateway reports
    them beside what happened (``gateway.forecast_report``)."""

    ttft_s: float
    ttlt_s: float


@dataclass(frozen=True, slots=True)
class CacheView:
    """What a driver predicts of the backends' prefix caches for one request."""

    hits: Sequence[int]
    """Its prompt tokens predicted cached on each backend."""
    held: Sequence[int]
    """Tokens each backend is predicted to hold cached in all (for any request)."""


@dataclass(frozen=True, slots=True)
class Placement:
    backend: int | None
    """None: no backend admits it now."""
    cached_tokens: int = 0
    """Its prompt tokens predicted cached on ``backend``."""
    kind: PlacementKind = PlacementKind.NO_HIT
    charge: Charge | None = None
    """What it is charged on ``backend``, where that is less than its whole charge (a request in
    flight there already holds its leading blocks); None: the whole charge."""
    forecast: Forecasted | None = None
    """Its first and last token there, as a picker that forecasts them expects (None: it does not)."""


def classify(cached: Sequence[int] | None, backend: int) -> PlacementKind:
    """What sending a request with per-backend ``cached`` tokens to ``backend`` is."""
    best = max(cached, default=0) if cached else 0
    if cached is None or best <= 0:
        return PlacementKind.NO_HIT
    return PlacementKind.STICKY if cached[backend] >= best else PlacementKind.BROKE_AWAY
