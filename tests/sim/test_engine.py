"""The engine model: KV accounting, prefix caching, preemption, variants, folded decode steps."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.base import Policy, SchedRequest
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import FINISHED, EngineRequest
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.kv import BlockPool, BlockTable
from sagegate.sim.perf import PerfModel

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def drive(engine: Engine, arrivals: list[tuple[float, EngineRequest]], check: bool = True) -> float:
    """Run ``engine`` on its own clock until every request is done; check invariants every step."""
    pending = sorted(arrivals, key=lambda a: a[0])
    now = 0.0
    i = 0
    while i < len(pending) or engine.has_work():
        while i < len(pending) and pending[i][0] <= now:
            engine.add(pending[i][1], now)
            i += 1
        if not engine.has_work():
            now = pending[i][0]
            continue
        step = engine.schedule(now)
        assert step.scheduled, "an engine with work must schedule something"
        assert step.duration > 0
        now += step.duration
        engine.complete(step, now)
        if check:
            engine.check_invariants()
    return now


def mkreq(rid: int, prompt: int, out: int, **kw: object) -> EngineRequest:
    return EngineRequest(rid, 0.0, prompt, out, **kw)  # type: ignore[arg-type]


requests_strategy = st.lists(
    st.tuples(
        st.floats(0, 5, allow_nan=False),
        st.integers(1, 600),
        st.integers(1, 300),
        st.sampled_from([None, (1,), (1, 2), (3,)]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=requests_strategy,
    blocks=st.integers(60, 400),
    variant=st.sampled_from(["v1", "v0", "sarathi"]),
    caching=st.booleans(),
    seqs=st.integers(1, 16),
    budget=st.integers(64, 2048),
    full_isl=st.booleans(),
)
def test_random_workloads_conserve_blocks_and_finish_exactly(
    reqs, blocks, variant, caching, seqs, budget, full_isl
):
    cfg = EngineConfig(
        num_gpu_blocks_override=blocks,
        variant=variant,
        enable_prefix_caching=caching,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        scheduler_reserve_full_isl=full_isl,
    )
    eng = Engine(PERF, cfg)
    cap = blocks * cfg.block_size
    arrivals = []
    for i, (t, p, o, h) in enumerate(reqs):
        if p + o > cap:
            continue  # the front end rejects what can never fit
        arrivals.append((t, mkreq(i, p, o, hash_ids=h)))
    drive(eng, arrivals)
    for _, r in arrivals:
        assert r.state == FINISHED
        assert r.generated == r.output_tokens
        assert r.t_first_token is not None and r.t_finish is not None
        assert r.t_first_token <= r.t_finish
    assert eng.pool.used_blocks == 0, "every block returns when the run ends"
    assert eng.finished_total == len(arrivals)
    assert eng.num_preemptions == sum(r.preemptions for _, r in arrivals)


def test_memory_pressure_preempts_and_everyone_still_finishes():
    cfg = EngineConfig(num_gpu_blocks_override=64, max_num_seqs=32)
    eng = Engine(PERF, cfg)
    arrivals = [(0.0, mkreq(i, 200, 300)) for i in range(8)]
    drive(eng, arrivals)
    assert eng.num_preemptions > 0
    assert all(r.state == FINISHED and r.generated == 300 for _, r in arrivals)


@pytest.mark.parametrize("full_isl", [False, True])
def test_whole_prompt_admission_waits_for_room_instead_of_preempting(full_isl: bool) -> None:
    """40 blocks (640 tokens), a 512-token budget, two 400-token prompts at once. Admitting by the
    first chunk (vLLM before 0.32) starts the second beside the first, and as both grow one is
    preempted; admitting by the whole prompt (0.32's ``--scheduler-reserve-full-isl``) holds the
    second until the first has left."""
    cfg = EngineConfig(
        num_gpu_blocks_override=40, max_num_batched_tokens=512, scheduler_reserve_full_isl=full_isl
    )
    eng = Engine(PERF, cfg)
    a, b = mkreq(0, 400, 50), mkreq(1, 400, 50)
    eng.add(a, 0.0)
    eng.add(b, 0.0)
    first = eng.schedule(0.0)
    assert first.scheduled[a] == 400
    assert first.scheduled.get(b) == (None if full_isl else 112)  # the budget's rest, as a chunk
    eng.complete(first, first.duration)
    drive(eng, [])
    assert a.generated == b.generated == 50
    assert (eng.num_preemptions == 0) == full_isl
    if full_isl:
        assert b.t_first_token is not None and a.t_finish is not None and b.t_first_token > a.t_finish


def test_fcfs_victim_is_the_last_admitted():
    cfg = EngineConfig(num_gpu_blocks_override=40, max_num_seqs=8, enable_prefix_caching=False)
    eng = Engine(PERF, cfg)
    first, second = mkreq(0, 300, 400), mkreq(1, 300, 400)
    eng.add(first, 0.0)
    eng.add(second, 0.0)
    now = 0.0
    while first.preemptions == 0 and second.preemptions == 0:
        step = eng.schedule(now)
        now += step.duration
        eng.complete(step, now)
    assert second.preemptions == 1 and first.preemptions == 0


class _Priority(Policy):
    """Lower ``priority`` first, as vLLM's priority mode."""

    def key(self, req: SchedRequest, now: float):
        return (req.priority, req.arrival_s, req.rid)


def test_priority_hook_orders_waiting_and_picks_victims():
    cfg = EngineConfig(num_gpu_blocks_override=40, max_num_seqs=8, enable_prefix_caching=False)
    eng = Engine(PERF, cfg, _Priority())
    low = EngineRequest(0, 0.0, 300, 400, priority=5)
    high = EngineRequest(1, 0.0, 300, 400, priority=0)
    eng.add(low, 0.0)
    eng.add(high, 0.0)
    step = eng.schedule(0.0)
    assert next(iter(step.scheduled)) is high  # waiting queue in policy order
    now = step.duration
    eng.complete(step, now)
    while low.preemptions == 0 and high.preemptions == 0:
        step = eng.schedule(now)
        now += step.duration
        eng.complete(step, now)
    assert low.preemptions == 1 and high.preemptions == 0  # victim: the largest key


def test_prefix_cache_skips_shared_prefill():
    cfg = EngineConfig()
    eng = Engine(PERF, cfg)
    a = mkreq(0, 2048, 4, hash_ids=(7, 8, 9, 10))
    drive(eng, [(0.0, a)])
    b = mkreq(1, 2048, 4, hash_ids=(7, 8, 9, 11))
    eng.add(b, 0.0)
    step = eng.schedule(0.0)
    assert b.cached_tokens == 3 * 512  # three shared 512-token blocks hit
    assert step.scheduled[b] == 2048 - 3 * 512
    c = mkreq(2, 2048, 4, hash_ids=(1, 2, 3, 4))
    cold = Engine(PERF, cfg)
    cold.add(c, 0.0)
    assert step.duration < cold.schedule(0.0).duration / 2


def test_prefix_cache_off_never_hits():
    eng = Engine(PERF, EngineConfig(enable_prefix_caching=False))
    drive(eng, [(0.0, mkreq(0, 1024, 2, hash_ids=(1, 2)))])
    b = mkreq(1, 1024, 2, hash_ids=(1, 2))
    drive(eng, [(0.0, b)])
    assert b.cached_tokens == 0


def test_lru_evicts_oldest_cached_block_first():
    pool = BlockPool(4, block_size=16)
    for keyset in (("a",), ("b",)):
        t = BlockTable()
        assert pool.grow(t, 16)
        pool.register_full(t, 16, lambda j, k=keyset: k[0])
        pool.free(t)
    assert pool.free_blocks == 4
    t = BlockTable()
    assert pool.grow(t, 16 * 3)  # two plain blocks, then evict "a" (least recent)
    assert pool.cached_prefix(lambda j: "a", 1) == []
    assert pool.cached_prefix(lambda j: "b", 1) == ["b"]


def test_abort_frees_blocks_at_once():
    eng = Engine(PERF, EngineConfig())
    r = mkreq(0, 1000, 500)
    eng.add(r, 0.0)
    step = eng.schedule(0.0)
    eng.complete(step, step.duration)
    assert eng.pool.used_blocks > 0
    assert eng.abort(r, step.duration)
    assert eng.pool.used_blocks == 0 and not eng.has_work()
    assert not eng.abort(r, step.duration)


def test_v0_never_mixes_prefill_and_decode():
    eng = Engine(PERF, EngineConfig(variant="v0"))
    a, b = mkreq(0, 100, 50), mkreq(1, 100, 50)
    eng.add(a, 0.0)
    now = 0.0
    step = eng.schedule(now)
    now += step.duration
    eng.complete(step, now)
    eng.add(b, now)
    step = eng.schedule(now)
    assert list(step.scheduled) == [b] and step.scheduled[b] == 100  # prefill-only step


def test_sarathi_chunks_prefill_to_its_budget():
    eng = Engine(PERF, EngineConfig(variant="sarathi", chunk_size=512))
    a = mkreq(0, 2000, 5)
    eng.add(a, 0.0)
    step = eng.schedule(0.0)
    assert step.scheduled[a] == 512


def test_v1_chunks_long_prompt_over_token_budget():
    eng = Engine(PERF, EngineConfig(max_num_batched_tokens=1024))
    a = mkreq(0, 3000, 5)
    drive(eng, [(0.0, a)])
    assert a.generated == 5


@pytest.mark.parametrize("level", ["engine", "gateway"])
@pytest.mark.parametrize("blocks", [None, 300])
def test_folded_decode_steps_are_exact(level, blocks):
    """Folding k identical decode steps into one event changes nothing but speed."""
    import numpy as np

    rng = np.random.default_rng(3)
    work = [
        TraceRequest(float(t), int(p), int(o), rid=i)
        for i, (t, p, o) in enumerate(
            zip(
                np.cumsum(rng.exponential(0.05, 300)),
                rng.integers(20, 1500, 300),
                rng.integers(1, 400, 300),
                strict=False,
            )
        )
    ]
    cfg = EngineConfig(num_gpu_blocks_override=blocks)
    from sagegate.predictor.factory import make_predictor

    def run(fold: bool):
        pred = make_predictor("noisy-oracle", seed=1, truth=answer_key(work)) if level == "gateway" else None
        return simulate(work, SimSetup(PERF, cfg, level=level, predictor=pred, fold_decode=fold))

    folded, plain = run(True), run(False)
    for a, b in zip(folded.records, plain.records, strict=True):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
        assert a.preemptions == b.preemptions
    assert folded.summary["preemptions"] == plain.summary["preemptions"]


def test_engine_config_rejects_bad_values():
    with pytest.raises(ValueError, match="variant"):
        EngineConfig(variant="v9")
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        dataclasses.replace(EngineConfig(), gpu_memory_utilization=1.5)


def test_sarathi_schedules_decodes_before_prefill_chunks():
    eng = Engine(PERF, EngineConfig(variant="sarathi", chunk_size=512))
    a, b = mkreq(0, 10, 50), mkreq(1, 2000, 5)
    eng.add(a, 0.0)
    eng.add(b, 0.0)
    step = eng.schedule(0.0, 0.0)
    eng.complete(step, step.duration)
    assert a.generated == 1 and b.num_computed == 502
    eng.running.reverse()  # the prefilling request now comes first in the running list
    step = eng.schedule(step.duration, step.duration)
    assert step.scheduled[a] == 1 and step.scheduled[b] == 511
