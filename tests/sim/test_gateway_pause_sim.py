"""Gateway pause/resume in the simulator (issue 17 part 3): KV and charges across pause and resume,
folding stays exact, and pausing off (or unable to pay) changes nothing."""

from __future__ import annotations

import pydantic
import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import TraceRequest, answer_key
from sagegate.gateway.settings import GatewaySettings
from sagegate.policies.admission import AdmissionConfig, Rule
from sagegate.policies.pause import PauseConfig
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import QueueLimits, SimResult, SimSetup, Simulation, simulate
from sagegate.sim.engine import EngineRequest
from sagegate.sim.engine_request import RUNNING
from sagegate.sim.gateway_level import SimGateway
from tests.sim.test_fold_exact import PERF, assert_same, workload

EAGER = PauseConfig(enabled=True, max_pauses=2, hysteresis=0.0, prefill_tokens_per_step=1e6)
"""Pauses whenever the rank says so (a resume costs next to nothing): as many pauses as possible."""


def setup_for(work: list[TraceRequest], pause: PauseConfig, *, policy: str = "sagesched", engines: int = 2,
              rule: Rule = "peak", fold: bool = True, blocks: int = 600) -> SimSetup:  # fmt: skip
    pred = make_predictor("noisy-oracle", relative_error=0.5, seed=2, truth=answer_key(work))
    return SimSetup(
        PERF,
        EngineConfig(num_gpu_blocks_override=blocks),
        engines=engines,
        level="gateway",
        policy=parse_policy(policy),
        predictor=pred,
        admission=AdmissionConfig(rule=rule),
        fold_decode=fold,
        pause=pause,
    )


def test_kv_and_charges_stay_consistent_across_pause_and_resume() -> None:
    work = workload(150, seed=7)
    sim = Simulation(work, setup_for(work, EAGER))
    gw = sim.gw
    assert gw is not None
    known_at_pause: list[int] = []
    pause, step_end = gw.pause, sim._step_end

    def pausing(req, now):  # type: ignore[no-untyped-def]
        known = req.known_tokens
        ok = pause(req, now)
        if ok:
            known_at_pause.append(known)
            assert req not in gw.flights and req.table.nblocks == 0 and req.num_computed == 0
            assert all(req not in e.running and req not in e.waiting for e in sim.engines)
        return ok

    def checked(idx: int) -> None:
        step_end(idx)
        for i, (eng, load) in enumerate(zip(sim.engines, gw.loads, strict=True)):
            eng.check_invariants()
            mine = [f.charge for f in gw.flights.values() if f.backend == i]
            assert load.charged_tokens == pytest.approx(sum(c.value for c in mine), abs=1e-6)
            assert sorted(map(id, load.holdings)) == sorted(map(id, mine))
            for r in eng.running:  # every request an engine runs is the gateway's, charged there
                assert gw.flights[r].backend == i
        for r in gw.queue.ordered(sim.now):  # a queued continuation holds nothing anywhere
            assert r.table.nblocks == 0 and r not in gw.flights

    gw.pause = pausing  # type: ignore[method-assign]
    sim._step_end = checked  # type: ignore[method-assign]
    res = sim.run()
    assert res.gateway_pauses == len(known_at_pause) > 5
    assert all(r.status == "ok" for r in res.records)
    assert [r.output_tokens for r in res.records] == [
        t.output_tokens for t in sorted(work, key=lambda t: t.rid)
    ]
    assert all(load.charged_tokens == 0.0 and not len(load.holdings) for load in gw.loads)
    assert 0 < res.resumed_tokens < sum(known_at_pause)  # the prefix cache kept some of what they computed
    assert not gw.flights and not any(e.running for e in sim.engines)


def test_a_request_is_paused_at_most_max_pauses_times() -> None:
    work = workload(150, seed=7)
    seen: dict[int, int] = {}
    sim = Simulation(work, setup_for(work, EAGER))
    gw = sim.gw
    assert gw is not None
    pause = gw.pause

    def counting(req, now):  # type: ignore[no-untyped-def]
        ok = pause(req, now)
        if ok:
            seen[req.rid] = seen.get(req.rid, 0) + 1
        return ok

    gw.pause = counting  # type: ignore[method-assign]
    sim.run()
    assert seen and max(seen.values()) <= EAGER.max_pauses
    assert sum(seen.values()) == gw.dispatch_loop.pauses


@pytest.mark.parametrize(("engines", "rule"), [(1, "peak"), (2, "peak"), (2, "sum")])
def test_fold_changes_nothing_with_pausing(engines: int, rule: Rule) -> None:
    work = workload()
    folded = simulate(work, setup_for(work, EAGER, engines=engines, rule=rule, fold=True))
    plain = simulate(work, setup_for(work, EAGER, engines=engines, rule=rule, fold=False))
    assert folded.gateway_pauses == plain.gateway_pauses > 0
    assert folded.resumed_tokens == plain.resumed_tokens
    assert_same(folded, plain)


def _same_run(a: SimResult, b: SimResult) -> None:
    assert a.gateway_pauses == b.gateway_pauses == 0
    assert_same(a, b)
    assert a.summary == b.summary


@pytest.mark.parametrize(
    ("policy", "pause"),
    [
        ("sagesched", PauseConfig(enabled=True, max_pauses=0)),  # never allowed
        ("fcfs", EAGER),  # a policy that does not price displacements never pauses
        ("sagesched", PauseConfig(enabled=False, hysteresis=0.0, prefill_tokens_per_step=1e6)),  # off
    ],
)
def test_pausing_that_cannot_happen_changes_nothing(policy: str, pause: PauseConfig) -> None:
    work = workload(seed=11)
    off = simulate(work, setup_for(work, PauseConfig(), policy=policy, rule="sum"))
    other = simulate(work, setup_for(work, pause, policy=policy, rule="sum"))
    _same_run(off, other)


def test_pause_setting_is_off_by_default_and_checked() -> None:
    s = GatewaySettings.model_validate({"backends": ["http://b0"]})
    assert s.pause.config() == PauseConfig() and not PauseConfig().enabled
    on = GatewaySettings.model_validate(
        {"backends": ["http://b0"], "pause": {"enabled": True, "max_pauses": 2}}
    )
    assert on.pause.config() == PauseConfig(enabled=True, max_pauses=2)
    mechanism_only = GatewaySettings.model_validate(
        {"backends": ["http://b0"], "pause": {"enabled": True, "by_policy": False}}
    )
    assert mechanism_only.pause.enabled and not mechanism_only.pause.config().enabled
    for bad in ({"max_pauses": -1}, {"max_pauses": 17}, {"hysteresis": -0.5}, {"prefill_tokens_per_step": 0}):
        with pytest.raises(pydantic.ValidationError):
            GatewaySettings.model_validate({"backends": ["http://b0"], "pause": bad})
    with pytest.raises(ValueError, match="max_pauses"):
        PauseConfig(max_pauses=-1)


def test_a_paused_request_is_never_timed_out_in_the_queue() -> None:
    """Its arrival's timeout entry is still pending when it waits again: it must not fire."""
    sent: list[int] = []
    refused: dict[int, str] = {}
    engines = [StandIn()]
    gw = SimGateway(
        parse_policy("sagesched"),
        AdmissionConfig(),
        [300],
        capacity_requests=4,
        limits=QueueLimits(max_wait_s=1.0),
        send=lambda req, idx: sent.append(req.rid),
        refuse=lambda req, reason: refused.__setitem__(req.rid, reason),
        pause=PauseConfig(enabled=True, hysteresis=0.0),
        evict=lambda req: True,
    )
    long = EngineRequest(0, 0.0, 200, 300)  # no prediction: charged 200 + 256, alone on the backend
    gw.enqueue(long, 0.0)
    gw.dispatch(0.0, engines)
    long.state, long.t_first_token, long.generated = RUNNING, 0.1, 40
    gw.progressed([long])
    short = EngineRequest(1, 0.2, 200, 5, prediction=LengthDistribution.point(5))
    gw.enqueue(short, 0.2)
    gw.dispatch(0.2, engines)  # the short one fits nowhere: the long one is paused for it
    assert sent == [0, 1] and long.pauses == 1 and long not in gw.flights
    gw.dispatch(5.0, engines)  # past the long one's timeout; still no room for it
    assert refused == {} and gw.queue.remove(long)


class StandIn:
    num_waiting = 0
    waiting_tokens = 0
    num_running = 0
    prefix_hit_ratio = 0.0
