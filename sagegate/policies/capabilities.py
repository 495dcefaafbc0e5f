"""What a policy declares it does, beyond ordering a queue: the one vocabulary drivers read.

A policy lists its capabilities in ``Policy.capabilities``; drivers (the gateway dispatcher, the
simulator's queue and engine) read that set and nothing else: they never look at which methods a
policy overrides. A capability a policy does not declare is a hook the drivers may skip, so a policy
that overrides a hook must declare its capability (``tests/policies/test_policy_capabilities.py`` checks the
registered panel). Each member's docstring states the invariant the policy promises and what the
drivers may rely on. :func:`check_declaration` checks a declaration once, when a policy class is
created and when an instance changes its own (a parameter turning a capability on or off).
"""

from __future__ import annotations

from collections.abc import Set
from enum import StrEnum

GATEWAY = "gateway"
ENGINE = "engine"


class Capability(StrEnum):
    ARRIVAL_ORDER = "arrival-order"
    """The key is arrival order exactly (``fcfs_tiebreak``), and never changes. The engine may then
    keep its running list in arrival order and take the latest arrival as the memory victim without
    asking :meth:`~policies.interfaces.EngineKnobs.pick_victim`."""

    DYNAMIC_KEY = "dynamic-key"
    """:meth:`~policies.interfaces.QueueOrder.key` of a queued request may change with the clock or
    with other requests (their arrival, dispatch or progress). The queue then re-evaluates keys before
    each pick (or keeps a lane index, with ``LANE_KEY``) instead of a heap, and a driver re-runs the
    pick when time passes. Without it a request's key is fixed from the moment it is pushed until it
    is popped."""

    LANE_KEY = "lane-key"
    """Requires ``DYNAMIC_KEY``. The key has the lane form of :class:`~policies.interfaces.LaneOrder`
    (``place`` / ``primary`` / ``flipped`` / ``after_flip`` keep the contract stated there), so the
    queue picks by lane heads (O(lanes · log n)) and still agrees with a scan of every key."""

    SCREEN = "screen"
    """Gateway level only. :meth:`~policies.interfaces.Screen.screen` may answer HOLD or REJECT (a
    REJECT names one of the class's ``reject_reasons``). Without it the gateway admits without
    calling ``screen`` and builds no :class:`~policies.base.LoadView`."""

    PREEMPT = "preempt"
    """Engine level only. A better-keyed waiting request may displace a running one that
    :meth:`~policies.interfaces.Displacement.may_preempt` allows, at most ``max_preempt_share`` of
    the batch per step. Without it the engine preempts only when memory runs out."""

    PREEMPT_PAYS = "preempt-pays"
    """Requires ``PREEMPT``. The engine displaces a running request for a waiting one only when the
    exchange's gain (:func:`policies.preemption.pair_gain_s`, from the policy's
    :meth:`~policies.interfaces.Displacement.expected_remaining`) exceeds the recompute's cost
    (:func:`policies.preemption.pays`) and picks the victim with the widest margin.
    Without it a preemption by choice is never priced."""

    REKEY_ON_PROGRESS = "rekey-on-progress"
    """Engine level only. The key of a *running* request changes as it generates, so the engine
    re-sorts the running list when the step's budget binds. Without it a running request keeps the
    rank it was admitted with."""

    DEFER_DECODE = "defer-decode"
    """Engine level only. :meth:`~policies.interfaces.EngineKnobs.defer_decode` may hold a decoding
    request out of a step. Without it every running decode is scheduled and the engine never asks."""

    PROGRESS_HOOK = "progress-hook"
    """:meth:`~policies.interfaces.PolicyHooks.on_progress` keeps state the policy reads later
    (counters, quanta, refined predictions), so drivers must report every token. Without it a driver
    may skip the call; the policy reads progress only from ``req.generated``."""

    USES_PREDICTION = "uses-prediction"
    """The policy reads ``req.prediction``: a driver must run a predictor for it (at gateway level
    every request gets one anyway). Without it the prediction is never read."""

    USES_ORACLE = "uses-oracle"
    """The policy reads ``req.true_output``, the real output length: a bound, not deployable. Without
    it that field is never read."""


ENGINE_ONLY = frozenset(
    {Capability.PREEMPT, Capability.PREEMPT_PAYS, Capability.REKEY_ON_PROGRESS, Capability.DEFER_DECODE}
)
"""Capabilities that only mean something where the engine runs the policy."""


def check_declaration(
    owner: str,
    capabilities: Set[Capability],
    levels: Set[str],
    *,
    reject_reasons: Set[str] = frozenset(),
    max_preempt_share: float = 1.0,
    engine_variant: str | None = None,
) -> None:
    """Raise ``TypeError`` when a declaration contradicts itself (``owner`` names it)."""
    problems: list[str] = []
    unknown = [c for c in capabilities if not isinstance(c, Capability)]
    if unknown:
        problems.append(f"unknown capabilities {unknown!r}")
    if Capability.LANE_KEY in capabilities and Capability.DYNAMIC_KEY not in capabilities:
        problems.append("LANE_KEY requires DYNAMIC_KEY")
    if Capability.ARRIVAL_ORDER in capabilities and Capability.DYNAMIC_KEY in capabilities:
        problems.append("ARRIVAL_ORDER excludes DYNAMIC_KEY")
    if Capability.PREEMPT_PAYS in capabilities and Capability.PREEMPT not in capabilities:
        problems.append("PREEMPT_PAYS requires PREEMPT")
    if Capability.SCREEN in capabilities and GATEWAY not in levels:
        problems.append("SCREEN needs the gateway level")
    if reject_reasons and Capability.SCREEN not in capabilities:
        problems.append("reject_reasons without SCREEN")
    engine_caps = sorted(c.name for c in capabilities & ENGINE_ONLY)
    if engine_caps and ENGINE not in levels:
        problems.append(f"{', '.join(engine_caps)} need the engine level")
    if engine_variant is not None and ENGINE not in levels:
        problems.append("an engine variant needs the engine level")
    if not 0.0 < max_preempt_share <= 1.0:
        problems.append(f"max_preempt_share must be in (0, 1], got {max_preempt_share!r}")
    elif max_preempt_share != 1.0 and Capability.PREEMPT not in capabilities:
        problems.append("max_preempt_share without PREEMPT")
    if problems:
        raise TypeError(f"{owner}: {'; '.join(problems)}")
