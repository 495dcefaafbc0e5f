"""Where a request goes: a pipeline of small plugins, llm-d's shape (docs/placement.md).

Filters drop the backends that may not take the request (always the admission rule's own: healthy,
allowed, waiting list in bounds, memory admits it), weighted scorers grade the rest, a picker
chooses. A profile names them (``placement.profile`` in the gateway's config file).

The default profile is the cache-aware rule: without prefix hits, the healthy backend with the most
room that admits the request (``policies.admission.choose_backend``), ties in room going to the
backend that holds the least in its cache (distinct prefixes spread instead of evicting each other).
With hits, a backend holding part of the prompt saves that much prefill, and one with work queued
makes the request wait behind it; both are tokens of prefill-time, so each admitting backend is
scored ``cached - queued`` and the best score wins over the most-room choice only when it is
strictly better and the backend holds strictly more of the prompt. So a request sticks to the warm
backend while waiting there costs less than recomputing its prefix elsewhere, and breaks away when it
does not (or when the warm backend cannot admit it: the memory rule decides first, for every
candidate).

Pure and deterministic: the live gateway and the simulated one call the same profile with the same
inputs and get the same backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.placement.outcome import CacheView, Placement, PlacementKind, classify
from sagegate.policies.placement.profile import (
    DEFAULT_PROFILE,
    INCUMBENT_PROFILE,
    PlacementProfile,
    build_profile,
)

CACHE_AWARE = "cache_aware"
LEAST_LOADED = "least_loaded"
PLACEMENTS = (CACHE_AWARE, LEAST_LOADED)
"""The placement modes: weigh the predicted prefix cache, or not (the most-room rule alone)."""

__all__ = [
    "CACHE_AWARE",
    "DEFAULT_PROFILE",
    "INCUMBENT_PROFILE",
    "LEAST_LOADED",
    "PLACEMENTS",
    "CacheView",
    "Placement",
    "PlacementKind",
    "PlacementProfile",
    "build_profile",
    "choose_placement",
    "classify",
]


def choose_placement(
    charge: Charge,
    loads: Sequence[BackendLoad],
    cfg: AdmissionConfig,
    prompt_tokens: int,
    allowed: Sequence[bool] | None,
    view: CacheView | None,
) -> Placement:
    """The cache-aware score rule's placement (:data:`INCUMBENT_PROFILE`; the rule's own tests pin it)."""
    return INCUMBENT_PROFILE.place(charge, loads, cfg, prompt_tokens, allowed, view)
