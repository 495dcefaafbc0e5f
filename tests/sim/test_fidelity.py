"""The calibrated H100 profile against published real-vLLM points (docs/fidelity.md).

The points are per-stage means published by inference-sim/training (BLIS; Apache-2.0),
``default_args/<run>/results/stage_<n>_lifecycle_metrics.json``: vLLM 0.15.1 on H100,
``--max-num-seqs 128 --max-num-batched-tokens 2048``, inference-perf's shared-prefix workload
(100 fixed prompts, ``ignore_eos``), constant-rate open-loop arrivals. Only these few figures are
copied here; benchmarks/fidelity.py replays the whole runs.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import pytest

from sagegate.core.request import TraceRequest
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, client_view, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel


@dataclass(frozen=True)
class Published:
    run: str
    model: str
    tp: int
    kv_blocks: int
    rate: float
    prompt: int
    output: int
    e2e_mean_s: float
    ttft_median_s: float


POINTS = [
    # 20260218-150304-codellama-34b-tp2-general, stages 0 and 1
    Published("codellama-34b general", "codellama-34b", 2, 26602, 8.0, 574, 250, 3.694, 0.0453),
    Published("codellama-34b general", "codellama-34b", 2, 26602, 20.0, 574, 250, 4.252, 0.0535),
    # 20260217-202857-llama-2-70b-tp4-general, stage 1 (the default model saturated here)
    Published("llama-2-70b general", "llama-2-70b", 4, 31356, 20.0, 575, 246, 5.577, 0.0683),
    # 20260218-120914-mixtral-8x7b-v0-1-tp2-codegen, stage 0
    Published("mixtral-8x7b codegen", "mixtral-8x7b", 2, 27510, 5.0, 589, 243, 4.519, 0.0530),
]


def _simulate(p: Published, perf: PerfModel, seconds: float = 90.0) -> tuple[float, float]:
    """Mean E2E and median TTFT of ``seconds`` of Poisson arrivals; every request is one of 100
    fixed prompts, as in the published workload."""
    rng = random.Random(3)
    trace, t = [], 0.0
    while (t := t + rng.expovariate(p.rate)) < seconds:
        prompt = rng.randrange(100)
        trace.append(
            TraceRequest(t, p.prompt, p.output, rid=len(trace), hash_ids=(prompt * 2, prompt * 2 + 1))
        )
    cfg = EngineConfig(
        model=p.model,
        gpu="h100",
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        num_gpu_blocks_override=p.kv_blocks,
        tensor_parallel_size=p.tp,
    )
    res = simulate(trace, SimSetup(perf=perf, engine=cfg))
    client_view(res, perf.frontend_s)
    late = [r for r in res.records if r.arrival_s > 10.0]  # past the cold prefix cache
    e2e = statistics.fmean(r.ttlt for r in late if r.ttlt is not None)
    ttft = statistics.median(r.ttft for r in late if r.ttft is not None)
    return e2e, ttft


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.run}@{p.rate:g}")
def test_calibrated_h100_matches_published_runs(point: Published) -> None:
    perf = PerfModel(get_model(point.model), get_gpu("h100"), tp=point.tp)
    e2e, ttft = _simulate(point, perf)
    assert e2e == pytest.approx(point.e2e_mean_s, rel=0.15)  # the worst-case target
    assert ttft == pytest.approx(point.ttft_median_s, rel=0.35)
