"""Where a request goes: the backend that admits it at the least cost, with its cached prefix in it.

Without prefix hits, placement is the admission rule's (``policies.admission.choose_backend``: the
healthy backend with the most room that admits the request), ties in room going to the backend that
holds the least in its cache (distinct prefixes spread instead of evicting each other). With hits,
a backend holding part of the prompt saves that much prefill, and one with work queued makes the
request wait behind it; both
are tokens of prefill-time, so each admitting backend is scored ``cached - queued`` (its predicted
cached prompt tokens less the prompt tokens waiting there that its cache will not serve, by its own
hit ratio) and the best score wins over the
most-room choice only when it is strictly better. So a request sticks to the warm backend while
waiting there costs less than recomputing its prefix elsewhere, and breaks away when it does not
(or when the warm backend cannot admit it: the memory rule decides first, for every candidate).

Pure and deterministic: the live gateway and the simulated one call it with the same inputs and get
the same backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.admission import AdmissionConfig, BackendLoad, Charge, choose_backend, eligible, shared_charges

CACHE_AWARE = "cache_aware"
LEAST_LOADED = "least_loaded"
PLACEMENTS = (CACHE_AWARE, LEAST_LOADED)
"""The placement modes: weigh the predicted prefix cache, or not (the most-room rule alone)."""


class PlacementKind(StrEnum):
    """How a placement relates to the predicted cache (``sagegate_placements_total{kind}``)."""

    NO_HIT = "no_hit"
    """No backend holds any of the prompt: the most-room rule."""
    STICKY = "sticky"
    """Sent where the most of its prompt is cached."""
    BROKE_AWAY = "broke_away"
    """Some backend holds more of it, but waiting there (or its memory) costs more."""


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


def classify(cached: Sequence[int] | None, backend: int) -> PlacementKind:
    """What sending a request with per-backend ``cached`` tokens to ``backend`` is."""
    best = max(cached, default=0) if cached else 0
    if cached is None or best <= 0:
        return PlacementKind.NO_HIT
    return PlacementKind.STICKY if cached[backend] >= best else PlacementKind.BROKE_AWAY


def choose_placement(
    charge: Charge,
    loads: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    prompt_tokens: int,
    allowed: Sequence[bool] | None,
    view: CacheView | None,
) -> Placement:
    """The backend for a request charged ``charge`` whose prompt is ``view.hits[i]`` tokens cached on
    backend ``i`` (``view`` None: nothing known), or ``Placement(None)`` when none admits it. Where a
    request in flight on a backend already holds its leading blocks, it is judged (and charged) there
    without them."""
    per = shared_charges(charge, loads)
    judged: Charge | Sequence[Charge] = charge if per is None else per
    default = choose_backend(judged, loads, cfg, prompt_tokens, allowed)
    if view is None:
        return _placed(default, per)
    cached = view.hits
    if max(cached, default=0) <= 0:
        if default is None:
            return Placement(None)
        return _placed(_least_held(default, judged, loads, cfg, prompt_tokens, allowed, view.held), per)

    best, best_score = default, -math.inf
    if default is not None:
        best_score = cached[default] - loads[default].queued_prefill
    floor = cached[default] if default is not None else 0
    for i, b in enumerate(loads):
        if i == default or cached[i] <= floor or not eligible(b, i, cfg, prompt_tokens, allowed, cached[i]):
            continue
        s = cached[i] - b.queued_prefill
        if s > best_score and b.admits(charge if per is None else per[i], cfg):
            best, best_score = i, s
    if best is None:
        return Placement(None)
    return _placed(best, per, cached[best], classify(cached, best))


def _placed(
    backend: int | None,
    per: Sequence[Charge] | None,
    cached: int = 0,
    kind: PlacementKind = PlacementKind.NO_HIT,
) -> Placement:
    charge = per[backend] if per is not None and backend is not None else None
    return Placement(backend, cached, kind, charge)


def _least_held(
    default: int,
    charge: Charge | Sequence[Charge],
    loads: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    prompt_tokens: int,
    allowed: Sequence[bool] | None,
    held: Sequence[int],
) -> int:
    """Cached nowhere: among the backends with as much room as the most-room choice (idle ones tie),
    the one holding the least, so that distinct prefixes spread over the fleet's caches instead of
    evicting each other from the first backend's."""
    room = loads[default].room(cfg.target)
    best = default
    for i, b in enumerate(loads):
        if (
            held[i] < held[best]
            and b.room(cfg.target) == room
            and eligible(b, i, cfg, prompt_tokens, allowed)
            and b.admits(charge if isinstance(charge, Charge) else charge[i], cfg)
        ):
            best = i
    return best
