"""Deadline and service-time orderings of the LSSP panel: EDF, LLF, ESTF.

Service time is estimated with the LSSP deadline rule's per-token costs (docs/design/study.md): 0.4 ms per
prompt token and 20 ms per output token. A request's *laxity* is ``deadline − now − remaining
service``; ordering by laxity at a common instant is ordering by the time-independent *latest start*
``deadline − remaining service``, which is what the static keys here use (a heap, not a rescan).
Requests without a deadline go after every request that has one, first come first served.
"""

from __future__ import annotations

import math
from typing import Any

from sagegate.policies.base import ENGINE, GATEWAY, Capability, Policy, SchedRequest, fcfs_tiebreak
from sagegate.policies.params import NonNegative, checked
from sagegate.policies.prediction import expected_remaining, predicted_output, prior_of
from sagegate.policies.registry import register

S_PER_PROMPT_TOKEN = 0.0004
S_PER_OUTPUT_TOKEN = 0.02


def remaining_service_s(
    req: SchedRequest,
    s_per_prompt_token: float = S_PER_PROMPT_TOKEN,
    s_per_output_token: float = S_PER_OUTPUT_TOKEN,
) -> float:
    """Predicted seconds of service left: the prefill until the first token, plus the predicted
    remaining output (``E[O | O > generated] − generated``) at the per-token decode cost."""
    prefill = s_per_prompt_token * req.prompt_tokens if req.generated == 0 else 0.0
    return prefill + s_per_output_token * expected_remaining(prior_of(req), req.generated)


def latest_start(
    req: SchedRequest,
    s_per_prompt_token: float = S_PER_PROMPT_TOKEN,
    s_per_output_token: float = S_PER_OUTPUT_TOKEN,
) -> float:
    """``deadline − remaining service`` (``inf`` without a deadline): laxity is this minus now."""
    if req.deadline_s is None:
        return math.inf
    return req.deadline_s - remaining_service_s(req, s_per_prompt_token, s_per_output_token)


def laxity(
    req: SchedRequest,
    now: float,
    s_per_prompt_token: float = S_PER_PROMPT_TOKEN,
    s_per_output_token: float = S_PER_OUTPUT_TOKEN,
) -> float:
    """Seconds ``req`` can still wait and meet its deadline (``inf`` without a deadline)."""
    return latest_start(req, s_per_prompt_token, s_per_output_token) - now


def priority_weight(req: SchedRequest) -> float:
    """LSSP's priority as a weight: higher is more important; non-positive priorities count as 1."""
    return float(req.priority) if req.priority > 0 else 1.0


@register("edf")
class EDF(Policy):
    """Earliest deadline first; requests without a deadline last (LSSP panel)."""

    levels = frozenset({GATEWAY, ENGINE})

    def __init__(self) -> None:
        pass

    def key(self, req: SchedRequest, now: float) -> Any:
        d = req.deadline_s
        return (d is None, d if d is not None else 0.0, *fcfs_tiebreak(req))


@register("llf")
class LLF(Policy):
    """Least laxity first: deadline − now − predicted remaining service time (LSSP panel).

    Service time: ``s_per_prompt_token`` × prompt tokens (until the first token) plus
    ``s_per_output_token`` × predicted remaining output; the defaults are the deadline rule of
    docs/design/study.md. Keyed by the latest start (``now`` cancels when comparing), so the queue
    keeps a heap.
    """

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset({Capability.USES_PREDICTION})

    @checked
    def __init__(
        self,
        s_per_prompt_token: NonNegative = S_PER_PROMPT_TOKEN,
        s_per_output_token: NonNegative = S_PER_OUTPUT_TOKEN,
    ) -> None:
        self.s_in = s_per_prompt_token
        self.s_out = s_per_output_token

    def laxity(self, req: SchedRequest, now: float) -> float:
        return laxity(req, now, self.s_in, self.s_out)

    def key(self, req: SchedRequest, now: float) -> Any:
        ls = latest_start(req, self.s_in, self.s_out)
        return (ls == math.inf, ls if ls != math.inf else 0.0, *fcfs_tiebreak(req))


@register("estf")
class ESTF(Policy):
    """Estimated service time first: ``0.5·I + 1.0·predicted O`` (LSSP panel)."""

    levels = frozenset({GATEWAY, ENGINE})
    capabilities = frozenset({Capability.USES_PREDICTION})

    @checked
    def __init__(self, prompt_weight: NonNegative = 0.5, output_weight: NonNegative = 1.0) -> None:
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight

    def estimate(self, req: SchedRequest) -> float:
        return self.prompt_weight * req.prompt_tokens + self.output_weight * predicted_output(req)

    def key(self, req: SchedRequest, now: float) -> Any:
        return (self.estimate(req), *fcfs_tiebreak(req))
