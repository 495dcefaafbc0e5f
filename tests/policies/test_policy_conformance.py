"""Every registered policy, at every level it supports, on one mixed workload.

The workload has three tenants, deadlines on most requests, short chat-like and long requests, and
arrives fast enough for queues to form on two small engines (tight KV, a low sequence cap), so that
ordering, admission and preemption all matter. Each policy must finish every request or reject it
for a reason it documents, give identical records when run twice, and — for the two oracles — never
lose to ``random`` on mean end-to-end latency.
"""

from __future__ import annotations

import random
from functools import cache

import pytest

from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.base import ENGINE, GATEWAY, Policy
from sagegate.policies.registry import parse_policy, registry
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimResult, SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
ENGINE_CFG = EngineConfig(max_num_seqs=32, num_gpu_blocks_override=800)  # 12,800 KV tokens each
ENGINES = 2
SIM_REASONS = frozenset({"context_too_long"})  # rejections by the simulator itself, not a policy

# Specs beyond the defaults: a policy's reject path; a parameter that makes a policy time-dependent.
EXTRA_SPECS = [
    ("admission-control:min_laxity_s=10.0", GATEWAY),
    ("sagesched:max_wait_s=2.0", GATEWAY),
    ("sagesched:max_wait_s=2.0", ENGINE),
]


def mixed_workload(n: int = 300, rate: float = 20.0, seed: int = 7) -> list[TraceRequest]:
    """Poisson arrivals; 20% long requests (300–900 output tokens), the rest 10–120; prompts
    50–1500; three tenants of unequal volume; four in five requests carry an LSSP-rule deadline."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        long = rng.random() < 0.2
        o = rng.randint(300, 900) if long else rng.randint(10, 120)
        prompt = rng.randint(50, 1500)
        tenant = rng.choices(["a", "b", "c"], weights=[5, 3, 1])[0]
        deadline = None if rng.random() < 0.2 else t + 20 * (0.0004 * prompt + 0.02 * o)
        out.append(TraceRequest(t, prompt, o, rid=i, tenant=tenant, deadline_s=deadline))
    return out


WORKLOAD = mixed_workload()


def run(spec: str, level: str) -> tuple[Policy, SimResult]:
    policy = parse_policy(spec)
    setup = SimSetup(
        PERF,
        ENGINE_CFG,
        ENGINES,
        level,
        policy,
        make_predictor("noisy-oracle", seed=3, truth=answer_key(WORKLOAD)),
    )
    return policy, simulate(WORKLOAD, setup)


@cache
def mean_ttlt(spec: str, level: str) -> float:
    return run(spec, level)[1].summary["ttlt_mean_s"]


CASES = [(name, level) for name, info in sorted(registry().items()) for level in sorted(info.cls.levels)]


@pytest.mark.parametrize(("spec", "level"), CASES + EXTRA_SPECS)
def test_policy_completes_or_rejects_with_a_documented_reason_and_is_deterministic(spec, level):
    policy, first = run(spec, level)
    allowed = policy.reject_reasons | SIM_REASONS
    for rec in first.records:
        if rec.status == "ok":
            assert rec.finish_s is not None and rec.output_tokens > 0, rec
        else:
            assert rec.status == "rejected" and rec.reason in allowed, (rec.status, rec.reason)
    assert first.summary["completed"] > 0
    _, second = run(spec, level)
    assert second.records == first.records
    assert second.engine_preemptions == first.engine_preemptions


def test_the_workload_makes_queues_form():
    """The comparisons below mean something only if requests wait."""
    _, res = run("fcfs", GATEWAY)
    assert res.mean_queued > 2.0


def test_a_rejecting_spec_does_reject():
    """The extra spec really exercises the reject path, so its conformance case is not vacuous."""
    _, res = run(*EXTRA_SPECS[0])
    assert res.summary["rejected"] > 0


@pytest.mark.parametrize("oracle", ["sjf-oracle", "srpt-oracle"])
def test_oracles_never_lose_to_random(oracle):
    levels = registry()[oracle].cls.levels & registry()["random"].cls.levels
    assert levels
    for level in sorted(levels):
        assert mean_ttlt(oracle, level) <= mean_ttlt("random", level), level
