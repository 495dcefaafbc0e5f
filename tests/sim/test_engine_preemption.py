"""Preemption that pays (issue 17 part 1): the engine prices a preemption by choice, the policy
values it, resumed requests are held until their next rank boundary, and folding stays exact."""

from __future__ import annotations

import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.policies.preemption import PreemptionCost, pair_gain_s, pays
from sagegate.policies.registry import parse_policy
from sagegate.policies.sagesched import SageSched
from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import PREEMPTED, RUNNING, EngineRequest
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.sim.preemption import decode_step_s, recompute_cost

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def req(rid: int, prompt: int, out: int, predicted: float, arrival: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, arrival, prompt, out, prediction=LengthDistribution.point(predicted))


def run_until(eng: Engine, now: float, done: object) -> float:
    while not done():
        step = eng.schedule(now)
        now += step.duration
        eng.complete(step, now)
    return now


def one_slot(
    policy: SageSched, victim: EngineRequest, generate: int = 20, caching: bool = True
) -> tuple[Engine, float]:
    """An engine of one sequence slot running ``victim`` until it generated ``generate`` tokens."""
    cfg = EngineConfig(max_num_seqs=1, enable_prefix_caching=caching)
    eng = Engine(PERF, cfg, policy, fold_decode=False)
    eng.add(victim, 0.0)
    return eng, run_until(eng, 0.0, lambda: victim.generated >= generate)


def test_pair_gain_is_the_exchange_bounded_by_the_next_departure() -> None:
    assert pair_gain_s(500, 100, float("inf"), 0.01) == pytest.approx(4.0)
    assert pair_gain_s(500, 100, 50, 0.01) == 0.0  # room frees before either matters
    assert pair_gain_s(500, 100, 300, 0.01) == pytest.approx(2.0)
    assert pair_gain_s(100, 500, float("inf"), 0.01) == 0.0
    cost = PreemptionCost(known_tokens=1000, cached_tokens=600, recompute_s=0.5, delayed=4)
    assert cost.recompute_tokens == 400 and cost.delay_s == 2.0
    assert pays(2.1, cost) and not pays(2.0, cost)


def test_a_victim_whose_recompute_exceeds_the_gain_keeps_running() -> None:
    # A long prompt expected to finish soon, nothing cached: recomputing it costs more than the
    # waiting one gains.
    victim = req(0, 30_000, 400, predicted=60)
    eng, now = one_slot(SageSched(), victim, caching=False)
    short = req(1, 100, 10, predicted=5, arrival=now)
    eng.add(short, now)
    cost = recompute_cost(eng, victim, eng.pool.blocks_for(short.known_tokens))
    gain = pair_gain_s(
        eng.policy.expected_remaining(victim),
        eng.policy.expected_remaining(short),
        float("inf"),
        decode_step_s(eng),
    )
    assert 0 < gain < cost.delay_s
    eng.schedule(now)
    assert victim.state is RUNNING and eng.num_preemptions == 0
    # The same pair with the rule off: the rank alone displaces it.
    victim2 = req(0, 30_000, 400, predicted=60)
    eng2, now2 = one_slot(SageSched(preempt_pays=False), victim2, caching=False)
    eng2.add(req(1, 100, 10, predicted=5, arrival=now2), now2)
    eng2.schedule(now2)
    assert victim2.state is PREEMPTED and eng2.num_preemptions == 1


def test_a_victim_whose_gain_exceeds_the_recompute_is_preempted_and_its_recompute_counted() -> None:
    victim = req(0, 200, 3000, predicted=3000)  # short prompt, long expected remainder
    eng, now = one_slot(SageSched(), victim)
    short = req(1, 100, 10, predicted=5, arrival=now)
    eng.add(short, now)
    eng.schedule(now)
    assert victim.state is PREEMPTED and eng.num_preemptions == 1
    known = victim.known_tokens
    run_until(eng, now, lambda: victim.state is RUNNING)
    # Its full blocks were still cached: only the partial last block is computed again.
    assert 0 < eng.recomputed_tokens < eng.pool.block_size + 1
    bs = eng.pool.block_size
    assert eng.recomputed_tokens == known - (known - 1) // bs * bs
    # as vLLM reports them: the request's cached tokens and the exported prefix counters are its first
    # admission's (nothing was cached then); the re-admission's lookup is not a hit
    assert victim.cached_tokens == 0 and eng.prefix_hits_tokens == 0
    assert eng.prefix_queries_tokens == victim.prompt_tokens + short.prompt_tokens


def test_cached_prefix_lowers_the_cost() -> None:
    costs = {}
    for caching in (True, False):
        victim = req(0, 4000, 400, predicted=400)
        eng = Engine(
            PERF, EngineConfig(max_num_seqs=1, enable_prefix_caching=caching), SageSched(), fold_decode=False
        )
        eng.add(victim, 0.0)
        run_until(eng, 0.0, lambda v=victim: v.generated >= 20)
        costs[caching] = recompute_cost(eng, victim, need_blocks=1)
        if caching:  # a newcomer that evicts part of the victim's tail raises it again
            evicting = recompute_cost(eng, victim, need_blocks=eng.pool.free_blocks + 100)
    with_cache, without = costs[True], costs[False]
    assert without.cached_tokens == 0 and without.recompute_tokens == victim.known_tokens
    assert with_cache.cached_tokens >= 4000 and with_cache.recompute_s < without.recompute_s / 10
    assert with_cache.recompute_tokens < evicting.recompute_tokens < without.recompute_tokens


def test_a_resumed_request_is_held_until_its_next_bucket_boundary() -> None:
    policy = SageSched(buckets=16)
    r = req(0, 100, 500, predicted=300)
    policy.on_arrival(r, 0.0)
    policy.on_dispatch(r, 0.0)
    r.generated = 20
    assert policy.may_preempt(r, 1.0)  # never preempted: no hold
    policy.on_preempt(r, 1.0)
    policy.on_dispatch(r, 2.0)  # resumed at 20 tokens: held until the boundary after 20 (32)
    until = policy.tracker(r).table.next_boundary(20)
    assert until is not None and until > 20
    r.generated = until - 1
    assert not policy.may_preempt(r, 3.0)
    r.generated = until
    assert policy.may_preempt(r, 4.0)
    policy.on_finish(r, 5.0)
    off = SageSched(preempt_pays=False)
    off.on_preempt(r, 1.0)
    off.on_dispatch(r, 2.0)
    r.generated = 21
    assert off.may_preempt(r, 3.0)


def test_held_victim_is_not_displaced_in_the_engine() -> None:
    victim = req(0, 200, 3000, predicted=3000)
    eng, now = one_slot(SageSched(), victim)
    eng.add(req(1, 100, 1, predicted=1, arrival=now), now)
    now = run_until(eng, now, lambda: victim.state is RUNNING and victim.preemptions == 1)
    eng.add(req(2, 100, 1, predicted=1, arrival=now), now)
    eng.schedule(now)  # resumed and not past its next boundary: it keeps its slot
    assert victim.state is RUNNING and victim.preemptions == 1


def test_declaration() -> None:
    from sagegate.policies.capabilities import Capability

    assert Capability.PREEMPT_PAYS in parse_policy("sagesched").capabilities
    assert Capability.PREEMPT_PAYS not in parse_policy("sagesched:preempt_pays=false").capabilities
    assert Capability.PREEMPT_PAYS not in parse_policy("sagesched:preempt=false").capabilities
    for name in ("trail", "fastserve", "ssjf", "srpt-oracle"):
        assert Capability.PREEMPT_PAYS not in parse_policy(name).capabilities


@pytest.mark.parametrize("policy", ["sagesched", "gittins-length"])
def test_fold_stays_exact_with_priced_preemption(policy: str) -> None:
    """The tests/sim/test_fold_exact.py run, with the cost rule on: folded equals unfolded."""
    from sagegate.core.request import answer_key
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.des import SimSetup, simulate
    from tests.sim.test_fold_exact import workload

    work = workload()

    def run(fold: bool):  # type: ignore[no-untyped-def]
        pred = make_predictor("noisy-oracle", relative_error=0.5, seed=2, truth=answer_key(work))
        cfg = EngineConfig(num_gpu_blocks_override=600)
        return simulate(
            work, SimSetup(PERF, cfg, policy=parse_policy(policy), predictor=pred, fold_decode=fold)
        )

    folded, plain = run(True), run(False)
    assert sum(plain.engine_preemptions) > 0
    assert folded.engine_preemptions == plain.engine_preemptions
    assert folded.engine_recomputed_tokens == plain.engine_recomputed_tokens
    for a, b in zip(folded.records, plain.records, strict=True):
        assert (a.status, a.output_tokens, a.preemptions, a.cached_tokens) == (
            b.status,
            b.output_tokens,
            b.preemptions,
            b.cached_tokens,
        )
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
