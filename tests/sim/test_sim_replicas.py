"""The simulator's N-replica gateway mode (``sim.replicas``): one replica is the ordinary gateway
level, the global queue keeps one order, per-replica queues do not, round trips delay dispatches."""

from __future__ import annotations

import pytest

from sagegate.loadgen.synthetic import synthetic_workload
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.sim.replicas import ReplicaSetup, simulate_replicas

PERF = PerfModel(get_model("qwen3-32b"), get_gpu("h100"))


def setup() -> SimSetup:
    return SimSetup(
        PERF,
        EngineConfig(model="qwen3-32b", gpu="h100"),
        engines=2,
        level="gateway",
        policy=parse_policy("sagesched"),
        predictor=make_predictor("length-bucket"),
    )


def overload() -> list:  # type: ignore[type-arg]
    return synthetic_workload(400, rate=40.0, prompt_mean=600, output_mean=300, seed=2)


def test_one_replica_without_round_trips_is_the_gateway_level():
    work = overload()
    plain = simulate(work, setup())
    one, stats = simulate_replicas(work, setup(), ReplicaSetup(replicas=1, rtt_s=0.0))
    assert [(r.dispatch_s, r.finish_s, r.preemptions) for r in one.records] == [
        (r.dispatch_s, r.finish_s, r.preemptions) for r in plain.records
    ]
    assert stats.inversions == 0 and stats.delay_s == 0.0


def test_per_replica_queues_dispatch_out_of_global_order_and_the_global_queue_does_not():
    work = overload()
    _, apart = simulate_replicas(work, setup(), ReplicaSetup(replicas=3, order="none"))
    assert apart.inversions > 0
    res, glob = simulate_replicas(work, setup(), ReplicaSetup(replicas=3, order="global"))
    assert glob.inversions == 0
    assert res.summary["completed"] == len(work)


def test_threshold_holds_heads_for_better_ranked_foreign_ones():
    work = overload()
    res, stats = simulate_replicas(work, setup(), ReplicaSetup(replicas=3, order="threshold"))
    assert stats.holds > 0
    assert res.summary["completed"] == len(work)


@pytest.mark.parametrize("order", ["none", "global"])
def test_a_dispatch_waits_its_round_trip(order: str):
    work = synthetic_workload(30, rate=0.5, prompt_mean=200, output_mean=20, seed=1)  # an idle fleet
    rtt = 0.01
    res, stats = simulate_replicas(work, setup(), ReplicaSetup(replicas=2, order=order, rtt_s=rtt))  # type: ignore[arg-type]
    waits = [r.dispatch_s - r.arrival_s for r in res.records if r.dispatch_s is not None]
    assert len(waits) == len(work)
    assert min(waits) == pytest.approx(rtt)
    assert stats.delay_s == pytest.approx(rtt * len(work))


def test_the_prompt_split_routes_by_prompt_length():
    work = overload()
    cut = sorted(r.prompt_tokens for r in work)[len(work) // 2]
    res, _ = simulate_replicas(
        work, setup(), ReplicaSetup(replicas=2, split="prompt", prompt_edges=(cut,), order="none")
    )
    assert res.summary["completed"] == len(work)
    with pytest.raises(ValueError, match="prompt_edges"):
        ReplicaSetup(replicas=3, split="prompt", prompt_edges=(cut,))
    with pytest.raises(ValueError, match="order"):
        ReplicaSetup(order="fifo")  # type: ignore[arg-type]


def test_sending_first_skips_the_round_trip_only_within_the_budget():
    """``send_first_share``: on an idle fleet every dispatch fits the budget and goes at once; under
    overload only the budget's worth per call does, the rest wait their round trip."""
    rtt = 0.01
    idle = synthetic_workload(30, rate=0.5, prompt_mean=200, output_mean=20, seed=1)
    rs = ReplicaSetup(replicas=2, order="threshold", rtt_s=rtt, send_first_share=0.2)
    res, stats = simulate_replicas(idle, setup(), rs)
    assert all(r.dispatch_s == r.arrival_s for r in res.records)
    assert stats.sent_first == len(idle) and stats.delay_s == 0.0
    work = overload()
    res, stats = simulate_replicas(work, setup(), ReplicaSetup(replicas=3, rtt_s=rtt, send_first_share=0.01))
    assert 0 < stats.sent_first < stats.dispatches and stats.delay_s > 0
    assert res.summary["completed"] == len(work)
    with pytest.raises(ValueError, match="send_first_share"):
        ReplicaSetup(send_first_share=1.0)
