"""The gateway's rank carried into the engine (``policies.engine_priority``): vLLM's integer priority,
its invariants, and the simulator's engines in priority mode ordering by it."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sagegate.core.request import TraceRequest
from sagegate.policies.admission import AdmissionConfig
from sagegate.policies.engine_priority import CLASS_SPAN, engine_priority, rank_bucket
from sagegate.policies.registry import parse_policy
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

ranks = st.floats(min_value=0.0, max_value=1e30, allow_nan=False)


@given(ranks, ranks, st.integers(-5, 5))
def test_a_worse_rank_never_comes_first_within_a_class(a: float, b: float, cls: int) -> None:
    lo, hi = sorted((a, b))
    assert engine_priority(lo, cls) <= engine_priority(hi, cls)


@given(ranks, ranks, st.integers(-5, 4))
def test_a_higher_class_comes_first_whatever_the_ranks(a: float, b: float, cls: int) -> None:
    assert engine_priority(a, cls + 1) < engine_priority(b, cls)


def test_buckets_are_quarter_doublings_and_odd_ranks_are_safe() -> None:
    assert rank_bucket(None) == rank_bucket(0.5) == rank_bucket(math.nan) == 0
    assert rank_bucket(1024.0) == 40 and rank_bucket(1024.0 * 2**0.25 * 1.01) == 41
    assert rank_bucket(1100.0) == rank_bucket(1024.0)  # within a bucket: arrival order decides
    assert rank_bucket(math.inf) == CLASS_SPAN - 1


def test_engines_in_priority_mode_serve_the_cheapest_predicted_first() -> None:
    """One engine running one sequence at a time, six requests at once behind a long one: with the
    rank carried in, the engine serves them shortest prompt first (the Gittins rank of the memory-time
    cost, with one prior for all); without it, first come first served."""
    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    prompts = [4000, 3000, 1500, 600, 200, 50]
    work = [TraceRequest(arrival_s=0.0, prompt_tokens=100, output_tokens=2000, rid=0)]
    work += [
        TraceRequest(arrival_s=0.01 * (i + 1), prompt_tokens=p, output_tokens=8, rid=i + 1)
        for i, p in enumerate(prompts)
    ]
    orders = {}
    for on in (False, True):
        setup = SimSetup(
            perf,
            EngineConfig(max_num_seqs=1),
            level="gateway",
            policy=parse_policy("sagesched"),
            admission=AdmissionConfig(max_waiting_tokens=10**6),  # the gateway holds nothing back
            engine_rank=on,
        )
        res = simulate(work, setup)
        done = sorted((r for r in res.records if r.rid), key=lambda r: r.finish_s or math.inf)
        orders[on] = [r.rid for r in done]
    assert orders[False] == [1, 2, 3, 4, 5, 6]
    assert orders[True] == [6, 5, 4, 3, 2, 1]
