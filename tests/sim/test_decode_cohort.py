"""The decode cohort (sim/decode_cohort.py): decoding requests advanced together, unvisited, change
nothing but speed.

The engine with ``lazy_decode`` must give the same per-request results, the same counters and the
same KV pool after every step as the engine that visits every request: with preemption (a small
pool), shared prefixes, folds, aborts in the middle of a step, and the policies that may use it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.decode_cohort import DecodeCohort
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import EngineRequest
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from tests.sim.test_fold_exact import assert_same, workload

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


@pytest.mark.parametrize(("policy", "blocks"), [("fcfs", 600), ("fcfs", 250), ("ssjf", 400), ("edf", 300)])
def test_the_cohort_changes_no_result(policy: str, blocks: int) -> None:
    work = workload(120, seed=9)

    def run(lazy: bool):  # type: ignore[no-untyped-def]
        pred = make_predictor("noisy-oracle", relative_error=0.5, seed=2, truth=answer_key(work))
        setup = SimSetup(
            PERF,
            EngineConfig(num_gpu_blocks_override=blocks),
            engines=2,
            policy=parse_policy(policy),
            predictor=pred,
            lazy_decode=lazy,
        )
        return simulate(work, setup)

    lazy, plain = run(True), run(False)
    assert_same(lazy, plain)
    assert sum(plain.engine_preemptions) > 0 or blocks >= 600  # the small pools do preempt
    assert lazy.summary == plain.summary


def requests(seed: int, n: int) -> list[EngineRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        family = int(rng.integers(0, 3))
        p = int(rng.integers(20, 900))
        ids = (family, *(1000 + 10 * i + j for j in range(p // 512)))
        out.append(EngineRequest(i, 0.0, p, int(rng.integers(1, 400)), hash_ids=ids))
    return out


def test_every_step_leaves_the_same_engine_with_aborts_in_flight() -> None:
    """Two engines, one lazy, driven step by step with the same arrivals and the same aborts (some
    of them while a step runs): after each step the same outcome, counters, pool and invariants."""
    cfg = EngineConfig(num_gpu_blocks_override=120, max_num_batched_tokens=1024)
    lazy, plain = Engine(PERF, cfg, lazy_decode=True), Engine(PERF, cfg)
    assert lazy.cohort is not None and plain.cohort is None
    reqs = {False: requests(3, 90), True: requests(3, 90)}
    rng = random.Random(1)
    now, arrived, lazy_steps, aborts = 0.0, 0, 0, 0
    while arrived < 90 or lazy.has_work():
        if arrived < 90 and rng.random() < 0.6:
            for eng, lz in ((lazy, True), (plain, False)):
                eng.add(reqs[lz][arrived], now)
            arrived += 1
        if not lazy.has_work():
            now += 0.01
            continue
        horizon = now + rng.choice([0.0, 0.05, 1.0])
        steps = [eng.schedule(now, horizon) for eng in (lazy, plain)]
        assert [s.duration for s in steps] == [steps[1].duration] * 2 and steps[0].k == steps[1].k
        lazy_steps += steps[0].cohort > 0
        if rng.random() < 0.05:  # the client of a running request goes away while the step runs
            victim = rng.choice(plain.running) if plain.running else None
            if victim is not None:
                member = reqs[True][victim.rid]
                aborts += member.cohort_tick >= 0  # a cohort member, its tokens of this step pending
                assert lazy.abort(member, now) == plain.abort(victim, now)
        now += steps[1].duration
        outs = [eng.complete(s, now) for eng, s in zip((lazy, plain), steps, strict=True)]
        assert [r.rid for r in outs[0].finished] == [r.rid for r in outs[1].finished]
        assert [r.rid for r in outs[0].first] == [r.rid for r in outs[1].first]
        for eng in (lazy, plain):
            eng.check_invariants()
        assert lazy.pool.free_blocks == plain.pool.free_blocks
        assert [r.rid for r in lazy.running] == [r.rid for r in plain.running]
        for a in lazy.running:
            b = reqs[False][a.rid]
            assert (a.generated, a.num_computed, a.table.nblocks) == (
                b.generated,
                b.num_computed,
                b.table.nblocks,
            )
    for attr in ("generation_tokens_total", "prompt_tokens_total", "prefix_hits_tokens", "num_preemptions"):
        assert getattr(lazy, attr) == getattr(plain, attr), attr
    assert plain.num_preemptions > 0 and lazy_steps > 0 and aborts > 0


def test_blocks_for_counts_each_members_block_boundaries() -> None:
    bs = 16
    cohort = DecodeCohort(bs)
    rng = random.Random(4)
    members = []
    for i in range(40):
        cohort.tick = rng.randrange(0, 50)  # members join at different ticks
        r = EngineRequest(i, 0.0, rng.randrange(1, 300), 1000)
        r.generated = rng.randrange(1, 30)
        r.num_computed = r.prompt_tokens + r.generated - 1
        r.table.nblocks = -(-r.num_computed // bs)
        assert cohort.can_join(r)
        cohort.join(r)
        members.append(r)
    for steps in (1, 2, 15, 16, 17, 100):
        for r in members:
            cohort.sync(r)
        brute = sum(-(-(r.num_computed + steps) // bs) - r.table.nblocks for r in members)
        assert cohort.blocks_for(steps) == brute
        assert cohort.due() == sum(1 for r in members if r.num_computed % bs == 0)
    assert cohort.context == sum(r.num_computed for r in members)


def test_policies_that_read_running_requests_get_no_cohort() -> None:
    for name in ("sagesched", "fastserve", "slai"):  # progress hooks, re-keying, preemption, deferral
        assert Engine(PERF, policy=parse_policy(name), lazy_decode=True).cohort is None
    assert Engine(PERF, EngineConfig(variant="v0"), lazy_decode=True).cohort is None
    assert Engine(PERF, policy=parse_policy("ssjf"), lazy_decode=True).cohort is not None


def test_the_gateway_level_reads_progress_so_its_engines_keep_none() -> None:
    work: list[TraceRequest] = workload(10)
    setup = SimSetup(PERF, level="gateway", lazy_decode=True)
    from sagegate.sim.des import Simulation

    assert all(e.cohort is None for e in Simulation(work, setup).engines)
