"""The clairvoyant bounds: shortest true cost first, and shortest true remaining cost first.

They read ``req.true_output`` (the real output length), which no deployable policy may see; they
exist to bound what prediction can buy. Cost is SageSched's ``C(O) = I·O + O²/2`` (docs/design/policies.md).
Without a true length (a live gateway has none) they fall back to the predicted mean, so they
never crash, but then they are no longer bounds.
"""

from __future__ import annotations

from typing import Any

from sagegate.policies.base import ENGINE, GATEWAY, Capability, Policy, SchedRequest, fcfs_tiebreak
from sagegate.policies.cost import service_cost
from sagegate.policies.prediction import predicted_output
from sagegate.policies.registry import register


def true_output(req: SchedRequest) -> float:
    """The real output length (the predicted mean when the driver does not know it)."""
    return float(req.true_output) if req.true_output is not None else predicted_output(req)


@register("sjf-oracle")
class SJFOracle(Policy):
    """Shortest true cost first, ``C(I, O_true)``, non-preemptive: a bound, not deployable.

    See docs/design/policies.md."""

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset({Capability.USES_ORACLE})

    def __init__(self) -> None:
        pass

    def key(self, req: SchedRequest, now: float) -> Any:
        return (service_cost(req.prompt_tokens, true_output(req)), *fcfs_tiebreak(req))


@register("srpt-oracle")
class SRPTOracle(Policy):
    """Shortest true remaining cost first, preemptive at engine level: a bound (docs/design/policies.md).

    The key is ``C(O_true) − C(generated)``; not deployable.

    At gateway level queued requests have generated nothing, so it orders like ``sjf-oracle``.
    The key is two multiplications, so re-sorting the running batch every step stays cheap.
    """

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset({Capability.USES_ORACLE, Capability.PREEMPT, Capability.REKEY_ON_PROGRESS})

    def __init__(self) -> None:
        pass

    def remaining_cost(self, req: SchedRequest) -> float:
        total = service_cost(req.prompt_tokens, true_output(req))
        return max(0.0, total - service_cost(req.prompt_tokens, req.generated))

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self.remaining_cost(req), *fcfs_tiebreak(req))
