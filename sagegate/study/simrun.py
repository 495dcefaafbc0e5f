"""Run one window through the simulator: the one place the study builds a ``SimSetup``.

Every run is a fresh episode (new engine, new policy object, new predictor) on the reference engine
configuration: one engine, ``EngineConfig(model, gpu)`` with vLLM's defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sagegate.core.request import TraceRequest
from sagegate.loadgen.records import scale_rate

if TYPE_CHECKING:
    from sagegate.core.distribution import LengthDistribution
    from sagegate.core.predictor import LengthPredictor
    from sagegate.policies.base import Policy
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.des import SimResult
    from sagegate.sim.perf import PerfModel


@dataclass(frozen=True)
class Entry:
    """A policy at one level: one row of every ranking (``sagesched@gateway``)."""

    policy: str
    level: str

    @property
    def label(self) -> str:
        return f"{self.policy}@{self.level}"

    @staticmethod
    def parse(label: str) -> Entry:
        policy, _, level = label.rpartition("@")
        return Entry(policy, level)


@functools.lru_cache(maxsize=8)
def reference(model: str, gpu: str) -> tuple[EngineConfig, PerfModel]:
    """The reference engine's ``(EngineConfig, PerfModel)`` (cached per process)."""
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    return EngineConfig(model=model, gpu=gpu), PerfModel(get_model(model), get_gpu(gpu))


def build_policy(name: str, seed: int) -> Policy:
    """A fresh policy; a policy with a ``seed`` parameter gets the cell's seed."""
    from sagegate.policies.registry import parse_policy, registry

    info = registry()[name]
    if any(p.name == "seed" for p in info.params):
        return parse_policy(name, seed=seed)
    return parse_policy(name)


def build_predictor(
    predictor: str,
    error: float,
    seed: int,
    dists: Mapping[int, LengthDistribution] | None,
    work: Sequence[TraceRequest] = (),
) -> LengthPredictor:
    """``noisy-oracle`` at ``error`` seeded per window (handed ``work``'s answer key), or precomputed
    distributions (``semantic``)."""
    from sagegate.core.request import answer_key
    from sagegate.predictor.baselines import NoisyOraclePredictor, PrecomputedPredictor

    if predictor == "noisy-oracle":
        return NoisyOraclePredictor(error, seed, truth=answer_key(work))
    if dists is None:
        raise ValueError(f"predictor {predictor!r} needs precomputed distributions")
    return PrecomputedPredictor(dists)


def run_window(
    requests: Sequence[TraceRequest],
    factor: float,
    entry: Entry,
    *,
    model: str,
    gpu: str,
    seed: int,
    predictor: str = "noisy-oracle",
    error: float = 0.2,
    dists: Mapping[int, LengthDistribution] | None = None,
) -> SimResult:
    """Simulate ``requests`` with arrival gaps compressed by ``factor`` (slack divided by it)."""
    from sagegate.sim.des import SimSetup, simulate

    engine, perf = reference(model, gpu)
    work = scale_rate(list(requests), factor) if factor != 1.0 else list(requests)
    setup = SimSetup(
        perf,
        engine,
        engines=1,
        level=entry.level,
        policy=build_policy(entry.policy, seed),
        predictor=build_predictor(predictor, error, seed, dists, work),
    )
    return simulate(work, setup)
