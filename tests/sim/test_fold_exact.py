"""Folded decode steps are exact for every kind of engine policy, prefix caching on.

Folding runs of decode steps into one event is what makes the study affordable; it must change
nothing but speed. Preemptive policies whose keys move with progress (SageSched, FastServe, TRAIL)
and decode-deferring SLAI fold only while nothing waits; these runs have both phases (a small KV pool
and bursts keep requests waiting and preempted part of the time), shared prompt prefixes, and two
engines.
"""

from __future__ import annotations

import numpy as np
import pytest

from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.admission import AdmissionConfig, Rule
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimResult, SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def workload(n: int = 80, seed: int = 5) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.08, n) * rng.choice([0.05, 1.0, 3.0], n))  # bursts and lulls
    out = []
    for i in range(n):
        p = int(rng.integers(30, 1500))
        family = int(rng.integers(0, 3))
        hash_ids = (family, *(1000 + 10 * i + j for j in range(p // 512)))  # a shared first block
        out.append(
            TraceRequest(
                float(t[i]),
                p,
                int(rng.integers(1, 600)),
                rid=i,
                hash_ids=hash_ids,
                deadline_s=float(t[i]) + 10.0,
            )
        )
    return out


@pytest.mark.parametrize(
    ("policy", "level", "engines", "rule"),
    [
        ("sagesched", "engine", 1, "peak"),
        ("fastserve", "engine", 1, "peak"),
        ("trail", "engine", 2, "peak"),
        ("slai", "engine", 1, "peak"),
        ("srpt-oracle", "engine", 1, "peak"),
        ("sagesched", "gateway", 1, "peak"),
        ("fcfs", "gateway", 2, "peak"),
        ("sagesched", "gateway", 1, "sum"),
    ],
)
def test_fold_changes_nothing_but_speed(policy: str, level: str, engines: int, rule: Rule) -> None:
    work = workload()
    cfg = EngineConfig(num_gpu_blocks_override=600)

    def run(fold: bool):  # type: ignore[no-untyped-def]
        pred = make_predictor("noisy-oracle", relative_error=0.5, seed=2, truth=answer_key(work))
        setup = SimSetup(
            PERF,
            cfg,
            engines=engines,
            level=level,
            policy=parse_policy(policy),
            predictor=pred,
            admission=AdmissionConfig(rule=rule),
            fold_decode=fold,
        )
        return simulate(work, setup)

    folded, plain = run(True), run(False)
    assert_same(folded, plain)


def assert_same(folded: SimResult, plain: SimResult) -> None:
    """The same per-request results (times within 1e-9)."""
    assert sum(folded.engine_preemptions) == sum(plain.engine_preemptions)
    for a, b in zip(folded.records, plain.records, strict=True):
        assert (a.status, a.output_tokens, a.preemptions, a.cached_tokens, a.backend) == (
            b.status,
            b.output_tokens,
            b.preemptions,
            b.cached_tokens,
            b.backend,
        )
        for x, y in (
            (a.first_token_s, b.first_token_s),
            (a.finish_s, b.finish_s),
            (a.dispatch_s, b.dispatch_s),
        ):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-9)
