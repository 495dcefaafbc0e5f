"""The defining behaviour of each policy of the panel, one or a few tests per policy.

Keys are checked against the policies' definitions (docs/design/policies.md) evaluated independently here;
engine-level behaviour (preemption, deferral) through small simulations.
"""

from __future__ import annotations

import math
import random

import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import TraceRequest, answer_key
from sagegate.policies.base import ENGINE, GATEWAY, Capability, LoadView, SchedRequest, Verdict
from sagegate.policies.cost import cost_support, service_cost
from sagegate.policies.engine_variants import SLAI
from sagegate.policies.fairness import VTC, WFS
from sagegate.policies.gittins import boundaries_tokens, gittins_rank
from sagegate.policies.guards import AdmissionControl, KVConstrained, ScorpioGuard
from sagegate.policies.mlfq import FastServe
from sagegate.policies.prediction import SSJF, UNKNOWN_OUTPUT, LearningToRank, Trail, expected_remaining
from sagegate.policies.registry import parse_policy, registry
from sagegate.policies.sagesched import MeanCost, SageSched
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, engine_config_for, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
POINT = LengthDistribution.point


def req(
    rid: int,
    arrival: float = 0.0,
    prompt: int = 100,
    pred: LengthDistribution | float | None = None,
    *,
    true: int | None = None,
    tenant: str = "default",
    deadline: float | None = None,
    priority: int = 1,
    generated: int = 0,
) -> SchedRequest:
    if isinstance(pred, int | float):
        pred = POINT(pred)
    r = SchedRequest(
        rid,
        arrival,
        prompt,
        tenant=tenant,
        priority=priority,
        deadline_s=deadline,
        prediction=pred,
        true_output=true,
    )
    r.generated = generated
    return r


def finish(res, rid: int) -> float:
    t = res.records[rid].finish_s
    assert t is not None
    return t


def order(policy, reqs, now=0.0):
    return [r.rid for r in sorted(reqs, key=lambda r: policy.key(r, now))]


# --- every policy: total, deterministic keys; no crash without a prediction -------------------
@pytest.mark.parametrize("name", sorted(registry()))
def test_keys_are_totally_ordered_and_handle_missing_predictions(name):
    policy = parse_policy(name)
    rng = random.Random(1)
    reqs = []
    for i in range(40):
        r = req(
            i,
            arrival=rng.choice([0.0, 1.0, 2.0]),  # ties on arrival: the id must break them
            prompt=rng.randint(10, 2000),
            pred=None if i % 3 == 0 else rng.randint(5, 900),
            true=rng.randint(5, 900),
            tenant=rng.choice("ab"),
            deadline=None if i % 4 == 0 else rng.uniform(50, 80),  # slack left at now = 5
        )
        policy.on_arrival(r, 0.0)
        reqs.append(r)
    keys = [policy.key(r, 5.0) for r in reqs]
    assert len(set(keys)) == len(keys)  # no two requests tie
    assert sorted(keys) == sorted(policy.key(r, 5.0) for r in reqs)  # deterministic
    for r in reqs:
        assert policy.screen(r, 5.0, LoadView()).verdict is Verdict.ADMIT  # an idle fleet, slack left


# --- oracles --------------------------------------------------------------------------------------
def test_sjf_oracle_orders_by_true_cost_not_by_prediction():
    p = parse_policy("sjf-oracle")
    a = req(0, prompt=1000, pred=10, true=100)  # cost 100·1000 + 5000
    b = req(1, prompt=10, pred=1000, true=300)  # cost 3000 + 45000
    assert service_cost(10, 300) < service_cost(1000, 100)
    assert order(p, [a, b]) == [1, 0]


def test_srpt_oracle_picks_least_remaining_cost():
    p = parse_policy("srpt-oracle")
    rs = [
        req(0, prompt=100, true=500, generated=450),
        req(1, prompt=100, true=100),
        req(2, prompt=2000, true=60),
    ]

    def remaining(r):
        return service_cost(r.prompt_tokens, r.true_output) - service_cost(r.prompt_tokens, r.generated)

    assert order(p, rs) == [r.rid for r in sorted(rs, key=remaining)]
    assert p.pick_victim(rs, 0.0) is max(rs, key=remaining)
    assert {Capability.PREEMPT, Capability.REKEY_ON_PROGRESS, Capability.USES_ORACLE} <= p.capabilities


# --- SSJF / LTR -----------------------------------------------------------------------------------
def test_ssjf_shortest_prediction_first_until_a_request_starves():
    p = SSJF(starvation_s=10.0)
    old_long = req(0, arrival=0.0, pred=800)
    short = req(1, arrival=5.0, pred=20)
    p.on_arrival(old_long, 0.0)
    p.on_arrival(short, 5.0)
    assert order(p, [old_long, short], now=9.9) == [1, 0]
    assert order(p, [old_long, short], now=10.0) == [0, 1]
    assert Capability.DYNAMIC_KEY in p.capabilities and Capability.PREEMPT not in p.capabilities


def test_ltr_promotes_a_request_passed_over_for_n_rounds():
    p = LearningToRank(starvation_rounds=3)
    long = req(0, pred=900)
    p.on_arrival(long, 0.0)
    waiting = [long]
    for rnd in range(1, 4):  # each round a fresh short request arrives and is served first
        short = req(rnd, arrival=float(rnd), pred=10)
        p.on_arrival(short, float(rnd))
        waiting.append(short)
        first = min(waiting, key=lambda r: p.key(r, float(rnd)))
        assert first is short
        waiting.remove(first)
        p.on_dispatch(first, float(rnd))
    assert p.passed_over(long) == 3
    newcomer = req(9, arrival=4.0, pred=10)
    p.on_arrival(newcomer, 4.0)
    assert min([long, newcomer], key=lambda r: p.key(r, 4.0)) is long  # promoted past a shorter one
    assert Capability.DYNAMIC_KEY in p.capabilities and Capability.PREEMPT not in p.capabilities


# --- TRAIL ----------------------------------------------------------------------------------------
def test_trail_refines_the_remaining_length_with_generated_tokens():
    p = Trail()
    d = LengthDistribution((10, 100), (0.5, 0.5))
    r = req(0, pred=d)
    p.on_arrival(r, 0.0)
    assert p.remaining(r) == pytest.approx(55.0)
    for g in range(1, 12):
        r.generated = g
        p.on_progress(r, 1, 0.0)
        assert p.remaining(r) == pytest.approx(expected_remaining(d, g))
    assert p.remaining(r) == pytest.approx(100 - 11)  # only the long outcome is left


def test_trail_may_not_preempt_past_80_percent_of_its_prediction():
    p = Trail()
    r = req(0, pred=100)
    r.generated = 79
    assert p.may_preempt(r, 0.0)
    r.generated = 80
    assert not p.may_preempt(r, 0.0)
    # Memory victims avoid it too while a preemptible request exists.
    young = req(1, pred=50, generated=10)
    assert p.pick_victim([r, young], 0.0) is young


class _RecordingTrail(Trail):
    def __init__(self) -> None:
        super().__init__()
        self.preempted: list[tuple[int, float]] = []

    def on_preempt(self, req, now):
        self.preempted.append((req.generated, self._state(req).initial))


def test_trail_never_preempts_past_80_percent_in_the_engine():
    rng = random.Random(3)
    work = []
    t = 0.0
    for i in range(120):
        t += rng.expovariate(40.0)
        work.append(TraceRequest(t, rng.randint(20, 300), rng.choice([8, 30, 200, 400]), rid=i))
    policy = _RecordingTrail()
    # Ample KV (no memory preemption), few sequences: every preemption is TRAIL's own choice.
    cfg = EngineConfig(max_num_seqs=4, num_gpu_blocks_override=20000)
    res = simulate(
        work,
        SimSetup(
            PERF, cfg, 1, ENGINE, policy, make_predictor("noisy-oracle", seed=1, truth=answer_key(work))
        ),
    )
    assert res.summary["completed"] == len(work)
    assert policy.preempted, "the workload must make TRAIL preempt, or this test proves nothing"
    assert all(g < 0.8 * initial for g, initial in policy.preempted)


# --- FastServe ------------------------------------------------------------------------------------
def test_fastserve_skip_join_by_prefill_time():
    p = FastServe(base_quantum_ms=10, prefill_s_per_token=25e-6)
    for prompt in (1, 100, 400, 401, 1000, 5000):
        level = p.join_level(prompt)
        first_iteration = prompt * 25e-6
        assert 0.010 * 2**level >= first_iteration - 1e-12
        assert level == 0 or 0.010 * 2 ** (level - 1) < first_iteration


def test_fastserve_demotes_after_a_quantum_and_promotes_after_starvation():
    p = FastServe(base_quantum_ms=10, starvation_s=3.0)
    r = req(0, prompt=10)
    p.on_arrival(r, 0.0)
    assert p.level_of(r, 0.0) == 0
    p.on_dispatch(r, 0.0)
    r.generated = 1
    p.on_progress(r, 1, 0.009)
    assert p.level_of(r, 0.009) == 0  # 9 ms of its 10 ms quantum
    r.generated = 2
    p.on_progress(r, 1, 0.011)
    assert p.level_of(r, 0.011) == 1  # quantum used up: demoted
    r.generated = 3
    p.on_progress(r, 1, 0.030)
    assert p.level_of(r, 0.030) == 1  # 19 ms of its 20 ms quantum at level 1
    r.generated = 4
    p.on_progress(r, 1, 0.032)
    assert p.level_of(r, 0.032) == 2
    p.on_preempt(r, 1.0)
    fresh = req(1, arrival=1.5, prompt=10)
    p.on_arrival(fresh, 1.5)
    assert order(p, [r, fresh], now=3.9) == [1, 0]  # waited 2.9 s: still demoted
    assert p.level_of(r, 4.0) == 0  # 3 s of starvation: back to the top queue
    assert order(p, [r, fresh], now=4.0) == [0, 1]  # top queue, earlier arrival
    p.on_dispatch(r, 4.0)
    assert p.level_of(r, 10.0) == 0  # promotion sticks while it runs


def test_fastserve_preempts_a_demoted_request_for_a_new_one_at_engine_level():
    work = [
        TraceRequest(0.0, 100, 600, rid=0),
        TraceRequest(0.0, 100, 600, rid=1),
        TraceRequest(0.5, 100, 20, rid=2),
    ]
    cfg = EngineConfig(max_num_seqs=2)
    fast = simulate(work, SimSetup(PERF, cfg, 1, ENGINE, parse_policy("fastserve")))
    fcfs = simulate(work, SimSetup(PERF, cfg, 1, ENGINE, parse_policy("fcfs")))
    assert finish(fcfs, 2) > min(finish(fcfs, 0), finish(fcfs, 1))  # waits for a free slot
    assert finish(fast, 2) < min(finish(fast, 0), finish(fast, 1))  # jumps both
    assert fast.records[0].preemptions + fast.records[1].preemptions >= 1


def test_a_preemptive_policy_may_displace_the_only_running_request():
    work = [TraceRequest(0.0, 100, 600, rid=0), TraceRequest(0.5, 100, 20, rid=1)]
    res = simulate(work, SimSetup(PERF, EngineConfig(max_num_seqs=1), 1, ENGINE, parse_policy("fastserve")))
    assert finish(res, 1) < finish(res, 0)


# --- SageSched and its ablations ------------------------------------------------------------------
def test_sagesched_rank_is_gittins_rank_and_changes_only_at_boundaries():
    d = LengthDistribution((20, 90, 400, 1500), (0.4, 0.3, 0.2, 0.1))
    prompt = 700
    p = SageSched(buckets=16)
    r = req(0, prompt=prompt, pred=d)
    p.on_arrival(r, 0.0)
    costs = cost_support(d, prompt)
    assert p.key(r, 0.0)[1] == pytest.approx(gittins_rank(costs, d.probs, 0.0))  # after the band
    support_points = set(d.support)

    def is_boundary(g: int) -> bool:  # a support point, or a bucket 16·2^m (docs/design/policies.md)
        return g in support_points or (g % 16 == 0 and (g // 16) & (g // 16 - 1) == 0)

    assert {g for g in range(1, 1501) if is_boundary(g)} == set(boundaries_tokens(d, 16)) - {0}
    prev = p.key(r, 0.0)[1]
    changes = []
    last_bound = 0
    for g in range(1, 2100):  # past the support too (buckets continue: 2048)
        r.generated = g
        p.on_progress(r, 1, 0.0)
        k = p.key(r, 0.0)[1]
        if is_boundary(g):
            last_bound = g
        assert k == pytest.approx(gittins_rank(costs, d.probs, service_cost(prompt, last_bound)))
        if k != prev:
            changes.append(g)
        prev = k
    assert len(changes) > 3, "the rank must move as the request ages"
    assert all(is_boundary(g) for g in changes), changes


def test_sagesched_prefers_the_cheaper_of_equal_length_predictions():
    """Same output distribution, longer prompt: more KV-memory time, so a worse rank."""
    d = LengthDistribution((50, 500), (0.5, 0.5))

    def pair():  # fresh requests per policy: ``pstate`` belongs to one policy
        return req(0, prompt=100, pred=d), req(1, prompt=4000, pred=d)

    short_prompt, long_prompt = pair()
    assert order(SageSched(), [long_prompt, short_prompt]) == [0, 1]
    g = parse_policy("gittins-length")  # the ablation cannot see the difference: arrival decides
    short_prompt, long_prompt = pair()
    assert g.key(short_prompt, 0.0)[1] == g.key(long_prompt, 0.0)[1]  # (the band, then the rank)


def test_sagesched_without_prediction_uses_the_cold_start_prior():
    p = SageSched()
    r = req(0, prompt=300, pred=None)
    assert p.key(r, 0.0)[1] == pytest.approx(service_cost(300, UNKNOWN_OUTPUT))


def test_sagesched_max_wait_puts_an_old_request_ahead_oldest_first():
    def queue():  # a long request that arrived first, then short ones
        return [req(0, 0.0, pred=2000), req(1, 5.0, pred=10), req(2, 25.0, pred=10), req(3, 10.0, pred=3000)]

    plain, aging = SageSched(), parse_policy("sagesched:max_wait_s=30")
    assert Capability.DYNAMIC_KEY not in plain.capabilities
    assert {Capability.DYNAMIC_KEY, Capability.LANE_KEY} <= aging.capabilities
    assert order(plain, queue(), now=100.0) == [1, 2, 0, 3]  # as published: the long one waits on
    assert order(aging, queue(), now=20.0) == [1, 2, 0, 3]  # nobody has waited 30 s: the same order
    assert order(aging, queue(), now=32.0) == [0, 1, 2, 3]  # request 0 has: it goes first
    assert order(aging, queue(), now=40.0) == [0, 1, 3, 2]  # 0, 1 and 3 have: by arrival; then 2 by rank
    with pytest.raises(ValueError, match="max_wait_s"):
        parse_policy("sagesched:max_wait_s=0")


@pytest.mark.parametrize(
    "spec", ["sagesched", "sagesched:max_wait_s=30", "sagesched:fair_tenants=true", "gittins-length"]
)
def test_sagesched_holds_priority_bands_strictly_and_ranks_inside_each(spec: str) -> None:
    """A higher ``priority`` goes first whatever its predicted cost; inside a band, the Gittins rank
    (and with ``max_wait_s``, aging happens within a band, never across)."""
    p = parse_policy(spec)
    reqs = [
        req(0, 0.0, pred=3000, priority=1),
        req(1, 1.0, pred=10, priority=1),
        req(2, 2.0, pred=2000, priority=2),
        req(3, 3.0, pred=20, priority=2),
        req(4, 4.0, pred=5, priority=0),
    ]
    assert order(p, reqs, now=5.0) == [3, 2, 1, 0, 4]
    if spec.endswith("max_wait_s=30"):
        assert order(p, reqs, now=40.0) == [2, 3, 0, 1, 4]  # all aged: by arrival, band by band


def test_sagesched_fair_tenants_share_a_band_by_their_counters() -> None:
    """Inside a band the tenant served least goes first, the rank inside a tenant; bands stay strict."""
    p, plain = parse_policy("sagesched:fair_tenants=true"), SageSched()
    flood = [req(i, 0.1 * i, prompt=500, pred=10, tenant="a") for i in range(4)]
    other = req(10, 0.5, prompt=500, pred=400, tenant="b")  # worse ranked than every one of a's
    urgent = req(11, 0.6, pred=900, tenant="a", priority=2)
    for r in (*flood, other, urgent):
        p.on_arrival(r, r.arrival_s)
        plain.on_arrival(r, r.arrival_s)
    assert order(plain, [*flood[1:], other]) == [1, 2, 3, 10]  # the rank alone: b waits behind a
    p.on_dispatch(flood[0], 1.0)  # a's counter: 500 prompt tokens
    assert order(p, [*flood[1:], other, urgent], now=1.0) == [11, 10, 1, 2, 3]
    p.on_dispatch(other, 1.1)
    p.on_progress(other, 100, 1.2)  # b: 500 + 2 × 100 = 700 > a's 500
    assert order(p, [*flood[1:], urgent], now=1.3) == [11, 1, 2, 3]
    p.on_finish(other, 1.4)  # b leaves; back later it is lifted to a's counter, no banked credit
    late = req(12, 2.0, pred=400, tenant="b")
    p.on_arrival(late, 2.0)
    assert p.tenants is not None and p.tenants["b"] == 700  # above a's 500: kept, not lowered
    assert order(p, [*flood[1:], late], now=2.0) == [1, 2, 3, 12]
    new = req(13, 2.1, pred=400, tenant="c")  # never served: lifted to a's 500, no banked credit
    p.on_arrival(new, 2.1)
    assert p.tenants["c"] == 500
    assert order(p, [*flood[1:], new], now=2.1) == [1, 2, 3, 13]  # a ties c, and ranks better


def test_mean_cost_orders_by_expected_cost():
    p = MeanCost()
    d1 = LengthDistribution((10, 1000), (0.9, 0.1))  # E[C] dominated by the rare long outcome
    d2 = POINT(200)
    a, b = req(0, prompt=100, pred=d1), req(1, prompt=100, pred=d2)

    def expected(d, prompt=100):
        return sum(q * service_cost(prompt, o) for o, q in zip(d.support, d.probs, strict=True))

    assert p.key(a, 0.0)[0] == pytest.approx(expected(d1))
    assert expected(d1) > expected(d2) and order(p, [a, b]) == [1, 0]
    # Gittins sees the 90% chance of a quick finish and puts the uncertain one first.
    a, b = req(0, prompt=100, pred=d1), req(1, prompt=100, pred=d2)
    assert order(SageSched(), [a, b]) == [0, 1]


def test_preemption_is_a_parameter():
    assert Capability.PREEMPT in parse_policy("sagesched").capabilities
    assert Capability.PREEMPT not in parse_policy("sagesched:preempt=false").capabilities
    assert Capability.PREEMPT not in parse_policy("mean-cost:preempt=false").capabilities


# --- deadlines ------------------------------------------------------------------------------------
def test_edf_orders_by_deadline_with_no_deadline_last():
    p = parse_policy("edf")
    rs = [
        req(0, deadline=5.0),
        req(1, deadline=None),
        req(2, arrival=1.0, deadline=2.0),
        req(3, deadline=9.0),
    ]
    assert order(p, rs) == [2, 0, 3, 1]


def test_llf_orders_by_laxity():
    p = parse_policy("llf")
    # Same deadline, more predicted work: less laxity, so first.
    big = req(0, prompt=1000, pred=400, deadline=20.0)
    small = req(1, prompt=100, pred=10, deadline=20.0)
    later = req(2, prompt=100, pred=10, deadline=30.0)
    assert p.laxity(big, 1.0) == pytest.approx(20.0 - 1.0 - (0.0004 * 1000 + 0.02 * 400))  # type: ignore[attr-defined]
    now = 3.0
    expect = sorted([big, small, later], key=lambda r: p.laxity(r, now))  # type: ignore[attr-defined]
    assert order(p, [small, later, big], now) == [r.rid for r in expect]


def test_estf_orders_by_estimated_service():
    p = parse_policy("estf")
    preds = {0: 10, 1: 400, 2: 100}
    rs = [req(0, prompt=1000, pred=10), req(1, prompt=100, pred=400), req(2, prompt=200, pred=100)]
    assert order(p, rs) == sorted(preds, key=lambda i: 0.5 * rs[i].prompt_tokens + preds[i])


# --- fairness -------------------------------------------------------------------------------------
def test_vtc_serves_the_least_counter_tenant_fifo_within_a_tenant():
    p = VTC()
    a1, a2 = req(0, arrival=0.0, prompt=500, tenant="a"), req(1, arrival=0.1, tenant="a")
    b1, b2 = req(2, arrival=0.2, tenant="b"), req(3, arrival=0.3, tenant="b")
    for r in (a1, a2, b1, b2):
        p.on_arrival(r, r.arrival_s)
    p.on_dispatch(a1, 1.0)
    assert p.counter("a") == 500  # input tokens weigh 1
    a1.generated = 10
    p.on_progress(a1, 10, 1.1)
    assert p.counter("a") == 520  # output tokens weigh 2
    assert order(p, [a2, b1, b2], now=1.2) == [2, 3, 1]  # tenant b first, FIFO inside it
    p.on_dispatch(b1, 1.3)
    p.on_dispatch(b2, 1.3)
    assert p.counter("b") == 200
    p.on_dispatch(b2, 1.35)  # sent again (refused by the shared ledger, retried): its prompt counts once
    assert p.counter("b") == 200
    assert order(p, [a2], now=1.4) == [1]


def test_vtc_lifts_a_returning_tenant_to_the_least_active_counter():
    p = VTC()
    a, b = req(0, prompt=300, tenant="a"), req(1, prompt=800, tenant="b")
    p.on_arrival(a, 0.0)
    p.on_arrival(b, 0.0)
    p.on_dispatch(a, 0.0)
    p.on_dispatch(b, 0.0)
    assert (p.counter("a"), p.counter("b")) == (300, 800)
    c = req(2, arrival=5.0, tenant="c")  # never seen: counter 0, idle
    p.on_arrival(c, 5.0)
    assert p.counter("c") == 300  # lifted to the least active counter, no banked credit
    p.on_finish(a, 6.0)  # a goes idle
    p.on_dispatch(c, 6.0)
    p.on_finish(c, 7.0)
    a2 = req(3, arrival=8.0, tenant="a")
    p.on_arrival(a2, 8.0)
    assert p.counter("a") == 800  # only b is active now
    # A tenant already above the least active counter is not lowered.
    p.on_finish(a2, 9.0)
    p.tenants.counters["a"] = 5000
    p.on_arrival(req(4, arrival=10.0, tenant="a"), 10.0)
    assert p.counter("a") == 5000


def test_wfs_score_is_the_lssp_formula():
    p = WFS()
    reqs_a = [req(i, tenant="a", pred=100) for i in range(4)]
    reqs_b = [req(10 + i, tenant="b", pred=100) for i in range(2)]
    for r in reqs_a + reqs_b:
        p.on_arrival(r, 0.0)
    p.on_dispatch(reqs_a[0], 0.0)  # a: 3 queued, 1 served; b: 2 queued, 0 served
    assert p.score(reqs_a[1]) == pytest.approx((3 / 2) * 1 / 100)
    assert p.score(reqs_b[0]) == pytest.approx((2 / 1) * 1 / 100)
    assert order(p, [reqs_a[1], reqs_b[0]]) == [10, 1]  # the under-served class first
    prio = req(20, tenant="a", pred=100, priority=4)
    p.on_arrival(prio, 0.0)
    assert order(p, [reqs_b[0], prio]) == [20, 10]  # priority weighs in


# --- guards ---------------------------------------------------------------------------------------
def test_kv_constrained_holds_above_082_unless_urgent():
    p = KVConstrained()
    busy = req(0)
    p.on_arrival(busy, 0.0)
    p.on_dispatch(busy, 0.0)  # something in flight
    relaxed = req(1, prompt=100, pred=50, deadline=100.0)
    urgent = req(2, prompt=100, pred=50, deadline=1.1)  # laxity 1.1 − 0.04 − 1.0 − now
    for r in (relaxed, urgent):
        p.on_arrival(r, 0.0)
    assert p.screen(relaxed, 0.0, LoadView(kv_usage=0.82)).verdict is Verdict.ADMIT
    assert p.screen(relaxed, 0.0, LoadView(kv_usage=0.83)).verdict is Verdict.HOLD
    assert p.laxity(urgent, 0.0) <= 0.25
    assert p.screen(urgent, 0.0, LoadView(kv_usage=0.99)).verdict is Verdict.ADMIT
    assert order(p, [relaxed, urgent]) == [2, 1]  # urgent first
    p.on_finish(busy, 1.0)  # nothing in flight: an idle fleet always takes work
    assert p.screen(relaxed, 1.0, LoadView(kv_usage=0.95)).verdict is Verdict.ADMIT


def test_kv_constrained_orders_non_urgent_by_weighted_size():
    p = KVConstrained()
    rs = [
        req(0, prompt=1000, pred=100),
        req(1, prompt=100, pred=1000),
        req(2, prompt=100, pred=1000, priority=4),
    ]
    size = {0: 1000 + 25, 1: 100 + 250, 2: (100 + 250) / 4}
    assert order(p, rs) == sorted(size, key=size.__getitem__)


def test_admission_control_drops_below_the_threshold_only_when_set():
    load = LoadView()
    late = req(0, prompt=100, pred=50, deadline=1.0)
    assert AdmissionControl().screen(late, 5.0, load).verdict is Verdict.ADMIT  # default: never drop
    p = AdmissionControl(min_laxity_s=0.0)
    s = p.screen(late, 5.0, load)
    assert s.verdict is Verdict.REJECT and s.reason in p.reject_reasons
    assert p.screen(req(1, deadline=100.0), 5.0, load).verdict is Verdict.ADMIT
    assert p.screen(req(2, deadline=None), 5.0, load).verdict is Verdict.ADMIT


def test_scorpio_guard_filters_orders_and_throttles():
    p = ScorpioGuard()
    busy = req(99)
    p.on_arrival(busy, 0.0)
    p.on_dispatch(busy, 0.0)
    hopeless = req(0, prompt=1000, pred=100, deadline=2.0)  # TTFT deadline 0, prefill 0.4 s
    s = p.screen(hopeless, 0.0, LoadView())
    assert s.verdict is Verdict.REJECT and s.reason in p.reject_reasons
    tight = req(1, prompt=100, pred=10, deadline=0.6)  # TTFT slack 0.6 − 0.2 − 0.04 = 0.36 s
    loose = req(2, prompt=100, pred=10, deadline=50.0)
    free = req(3, prompt=100, pred=10)
    assert order(p, [free, loose, tight]) == [1, 2, 3]  # most urgent first, no deadline last
    calm = LoadView(kv_usage=0.5, queue_len=10, capacity_requests=100)
    assert p.screen(loose, 0.0, calm).verdict is Verdict.ADMIT
    for pressure in (LoadView(kv_usage=0.65), LoadView(kv_usage=0.1, queue_len=301, capacity_requests=100)):
        assert p.screen(loose, 0.0, pressure).verdict is Verdict.HOLD
        assert p.screen(tight, 0.0, pressure).verdict is Verdict.ADMIT  # urgent still goes
    assert p.screen(loose, 0.0, LoadView(kv_usage=0.1, queue_len=300, capacity_requests=100)).verdict is (
        Verdict.ADMIT
    )


# --- engine variants and SLAI ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "variant", "chunk"),
    [("vllm-v0", "v0", None), ("vllm-v1", "v1", None), ("sarathi", "sarathi", 512)],
)
def test_engine_variants_are_fcfs_engines(name, variant, chunk):
    p = parse_policy(name)
    assert Capability.ARRIVAL_ORDER in p.capabilities
    assert p.engine_variant == variant and p.engine_chunk_size == chunk
    assert p.levels == {ENGINE}
    cfg = engine_config_for(EngineConfig(), p)
    assert cfg.variant == variant
    rs = [req(0, arrival=2.0), req(1, arrival=1.0), req(2, arrival=3.0)]
    assert order(p, rs) == [1, 0, 2]


def test_slai_admits_shortest_prefill_first_on_a_512_budget():
    p = parse_policy("slai")
    rs = [req(0, prompt=900), req(1, prompt=30), req(2, prompt=300, generated=100)]
    assert order(p, rs) == [1, 2, 0]
    cfg = engine_config_for(EngineConfig(), p)
    assert (cfg.variant, cfg.chunk_size) == ("sarathi", 512)
    assert Capability.DEFER_DECODE in p.capabilities and p.levels == {ENGINE}


def _decoding(p: SLAI, n: int, last_token: float) -> list[SchedRequest]:
    rs = [req(i, prompt=50) for i in range(n)]
    for r in rs:
        p.on_arrival(r, 0.0)
        p.on_dispatch(r, 0.0)
        r.generated = 1
        p.on_progress(r, 1, last_token)
    return rs


def test_slai_defers_decodes_with_slack_only():
    p = SLAI(tpot_slo_s=0.1, step_estimate_s=0.03)
    decoding = _decoding(p, 3, last_token=1.0)  # next tokens due at 1.1: last schedulable time 1.07
    assert p.last_schedulable(decoding[0]) == pytest.approx(1.07)
    # Nobody waits: nothing to gain, nothing deferred.
    assert [p.defer_decode(r, 1.01) for r in decoding] == [False, False, False]
    w1 = req(10, prompt=400)
    p.on_arrival(w1, 1.01)
    # The first decode offered in a step always runs; the others have slack and are deferred.
    assert [p.defer_decode(r, 1.02) for r in decoding] == [False, True, True]
    p.on_dispatch(w1, 1.02)  # the budget went to the prefill: admissions flow
    p.on_arrival(req(11, prompt=400), 1.03)
    assert [p.defer_decode(r, 1.05) for r in decoding] == [False, True, True]
    p.on_arrival(req(12, prompt=400), 1.06)
    # Past their last schedulable time they run whatever waits.
    assert [p.defer_decode(r, 1.08) for r in decoding] == [False, False, False]


def test_slai_stops_deferring_when_admission_is_blocked():
    p = SLAI()
    decoding = _decoding(p, 3, last_token=0.0)
    p.on_arrival(req(10, prompt=400), 0.0)
    assert [p.defer_decode(r, 0.01) for r in decoding] == [False, True, True]
    # The step at 0.01 left the waiter un-admitted (it did not fit): deferring would only slow decodes.
    assert [p.defer_decode(r, 0.02) for r in decoding] == [False, False, False]


def test_slai_lets_the_next_decode_through_when_the_first_is_preempted():
    p = SLAI()
    decoding = _decoding(p, 3, last_token=0.0)
    p.on_arrival(req(10, prompt=400), 0.0)
    assert p.defer_decode(decoding[0], 0.01) is False
    p.on_preempt(decoding[0], 0.01)  # lost its place to free memory
    assert p.defer_decode(decoding[1], 0.01) is False
    assert p.defer_decode(decoding[2], 0.01) is True


class _RecordingSLAI(SLAI):
    def __init__(self) -> None:
        super().__init__()
        self.deferred: list[tuple[float, float]] = []

    def defer_decode(self, req, now):
        out = super().defer_decode(req, now)
        if out:
            self.deferred.append((now, self.last_schedulable(req)))
        return out


def test_slai_defers_in_the_engine_only_before_the_last_schedulable_time():
    rng = random.Random(5)
    work = []
    t = 0.0
    for i in range(200):
        t += rng.expovariate(30.0)
        work.append(TraceRequest(t, rng.randint(50, 1500), rng.randint(10, 300), rid=i))
    policy = _RecordingSLAI()
    cfg = EngineConfig(max_num_seqs=32, num_gpu_blocks_override=1500)
    res = simulate(work, SimSetup(PERF, cfg, 1, ENGINE, policy))
    assert res.summary["completed"] == len(work)
    assert policy.deferred, "the load must make SLAI defer, or this test proves nothing"
    assert all(now < lst for now, lst in policy.deferred)


def test_gateway_only_policies_refuse_the_engine_level():
    for name in ("vtc", "wfs", "kv-constrained"):
        with pytest.raises(ValueError, match="gateway"):
            SimSetup(PERF, level=ENGINE, policy=parse_policy(name))
    with pytest.raises(ValueError, match="engine"):
        SimSetup(PERF, level=GATEWAY, policy=parse_policy("slai"))


def test_unknown_output_matches_the_predictors_prior():
    assert math.isclose(UNKNOWN_OUTPUT, 256.0)


def test_mean_cost_ranks_a_running_request_by_remaining_expected_cost():
    p = MeanCost(buckets=16)
    r = req(0, prompt=100, pred=POINT(200))
    mean = service_cost(100, 200)  # a point: E[C] = C(200)
    expected = {0: mean, 15: mean, 16: mean - service_cost(100, 16), 70: mean - service_cost(100, 64)}
    expected |= {199: mean - service_cost(100, 128), 200: mean, 255: mean, 256: service_cost(100, 256)}
    for g in sorted(expected):
        r.generated = g
        p.on_progress(r, 1, 0.0)
        assert p.rank(r) == pytest.approx(expected[g]), g
