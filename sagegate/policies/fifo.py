"""Arrival-order and random policies: the default and the floor."""

from __future__ import annotations

import random as _random
from typing import Any

from sagegate.policies.base import Capability, Policy, SchedRequest, fcfs_tiebreak
from sagegate.policies.registry import register


@register("fcfs")
class FCFS(Policy):
    """First come, first served: arrival order (vLLM's default scheduling)."""

    capabilities = frozenset({Capability.ARRIVAL_ORDER})

    def __init__(self) -> None:
        pass


@register("random")
class RandomOrder(Policy):
    """Uniform random order, a floor every real policy should beat. Seeded per request id."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def key(self, req: SchedRequest, now: float) -> Any:
        if req.pstate is None:
            req.pstate = _random.Random(f"{self.seed}:{req.rid}").random()
        return (req.pstate, *fcfs_tiebreak(req))
