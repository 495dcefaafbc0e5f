"""The discrete-event simulator: queueing sanity, determinism, Little's law, the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import data_path

from sagegate.core.request import TraceRequest
from sagegate.loadgen.synthetic import synthetic_workload
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, client_view, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))


def test_low_load_ttft_is_front_end_plus_prefill():
    work = [TraceRequest(10.0 * i, 1000, 50, rid=i) for i in range(20)]
    res = simulate(work, SimSetup(PERF))
    client_view(res, PERF.frontend_s)
    expected = PERF.frontend_s + PERF.step_time([(1000, 0)], 0, 0)
    for r in res.records:
        assert r.ttft == pytest.approx(expected, rel=0.02)
    # A lone request decodes at the one-sequence decode step time.
    assert res.summary["tpot_mean_s"] == pytest.approx(PERF.decode_step_time(1, 1050), rel=0.05)


def test_throughput_rises_with_load_and_saturates():
    throughputs = []
    for rate in (1, 4, 16, 64, 256):
        work = synthetic_workload(1500, rate=rate, prompt_mean=400, output_mean=200, seed=1)
        throughputs.append(simulate(work, SimSetup(PERF)).summary["throughput_tok_s"])
    for lo, hi in itertools.pairwise(throughputs):
        assert hi >= lo * 0.97
    assert throughputs[-1] > 5 * throughputs[0]
    assert throughputs[-1] == pytest.approx(throughputs[-2], rel=0.15)  # saturated


def test_littles_law_on_a_long_run():
    work = synthetic_workload(6000, rate=12, prompt_mean=500, output_mean=250, seed=2)
    res = simulate(work, SimSetup(PERF))
    span = max(r.finish_s for r in res.records) - work[0].arrival_s
    lam = len(work) / span
    w = float(np.mean([r.ttlt for r in res.records]))
    assert res.mean_in_system == pytest.approx(lam * w, rel=0.05)


def test_runs_are_deterministic_and_time_never_runs_backwards():
    work = synthetic_workload(800, rate=30, seed=5)
    setup = dict(engine=EngineConfig(num_gpu_blocks_override=2000), engines=2)
    a = simulate(work, SimSetup(PERF, **setup))
    b = simulate(work, SimSetup(PERF, **setup))
    assert [(r.first_token_s, r.finish_s, r.backend) for r in a.records] == [
        (r.first_token_s, r.finish_s, r.backend) for r in b.records
    ]
    assert a.summary["preemptions"] > 0
    for r in a.records:
        assert r.arrival_s <= r.dispatch_s <= r.first_token_s <= r.finish_s
    assert {r.rid for r in a.records} == {t.rid for t in work}  # nothing lost or duplicated


def test_context_longer_than_the_pool_is_rejected_not_hung():
    work = [TraceRequest(0.0, 5000, 100, rid=0), TraceRequest(0.1, 100, 10, rid=1)]
    res = simulate(work, SimSetup(PERF, EngineConfig(num_gpu_blocks_override=100)))
    assert res.records[0].status == "rejected" and res.records[0].reason == "context_too_long"
    assert res.records[1].status == "ok"


def test_mooncake_prefix_sharing_hits_the_cache():
    path = data_path("mooncake", "synthetic_trace.jsonl")
    from sagegate.loadgen.readers import read_trace

    work = read_trace(path, limit=300)
    res = simulate(work, SimSetup(PERF))
    assert sum(r.cached_tokens for r in res.records) > 0
    off = simulate(work, SimSetup(PERF, EngineConfig(enable_prefix_caching=False)))
    assert sum(r.cached_tokens for r in off.records) == 0
    assert res.summary["ttft_mean_s"] < off.summary["ttft_mean_s"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sagegate.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.heavy
def test_cli_simulate_json_has_the_documented_keys():
    out = _cli("simulate", "--trace", "synthetic", "--requests", "300", "--rate", "20", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    for key in (
        "requests",
        "completed",
        "ttft_mean_s",
        "ttft_p99_s",
        "tpot_mean_s",
        "ttlt_mean_s",
        "ttlt_p50_s",
        "ttlt_p99_s",
        "throughput_tok_s",
        "preemptions",
        "wall_s",
    ):
        assert key in summary
    assert summary["requests"] == summary["completed"] == 300


@pytest.mark.heavy
def test_cli_rate_scale_makes_arrivals_denser(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"arrival_s": i * 0.5, "prompt_tokens": 800, "output_tokens": 300}) for i in range(400)
        )
    )
    slow = json.loads(_cli("simulate", "--trace", str(trace), "--json").stdout)
    fast = json.loads(_cli("simulate", "--trace", str(trace), "--json", "--rate-scale", "8").stdout)
    assert fast["makespan_s"] < slow["makespan_s"] / 3
    assert fast["ttlt_mean_s"] > slow["ttlt_mean_s"]


@pytest.mark.heavy
def test_cli_malformed_trace_names_file_and_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}) + "\n{not json\n")
    out = _cli("simulate", "--trace", str(trace), "--json")
    assert out.returncode == 2
    assert "bad.jsonl" in out.stderr and "line 2" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.heavy
def test_cli_unknown_policy_lists_valid_ones():
    out = _cli("simulate", "--policy", "nope", "--json")
    assert out.returncode == 2
    assert "fcfs" in out.stderr


@pytest.mark.heavy
def test_cli_admission_rule_is_chosen_and_checked():
    base = ("simulate", "--level", "gateway", "--policy", "sagesched", "--num-gpu-blocks-override", "600")
    base += ("--requests", "300", "--rate", "20", "--json")
    peak = json.loads(_cli(*base).stdout)
    summed = json.loads(_cli(*base, "--admission-rule", "sum").stdout)
    assert peak["completed"] == summed["completed"] == 300
    assert peak["preemptions"] < summed["preemptions"]  # the projected peak leaves room to grow
    out = _cli(*base, "--admission-rule", "bogus")
    assert out.returncode == 2 and "sum, peak" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.heavy
def test_cli_placement_scorers_are_chosen_and_checked():
    """``--scorer`` and ``--picker`` reach the simulated gateway's placement; a bad one is refused."""
    base = ("simulate", "--level", "gateway", "--engines", "2", "--requests", "200", "--rate", "30", "--json")
    rule = json.loads(_cli(*base).stdout)
    mine = json.loads(_cli(*base, "--picker", "max_score", "--scorer", "fewest_running=1").stdout)
    assert rule["completed"] == mine["completed"] == 200
    assert mine["ttlt_mean_s"] != rule["ttlt_mean_s"]  # another profile, other places
    for picker, bad, says in (
        ("incumbent", "prefix_hit:2", "expected name=weight"),
        ("incumbent", "prefix_hits=2", "unknown placement scorer"),
        ("forecast", "prefix_hit=2", "reads no scorers"),  # the default picker weighs none
    ):
        out = _cli(*base, "--picker", picker, "--scorer", bad)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_the_simulated_gateway_applies_the_live_queue_limits():
    """The live gateway's bounds, modelled: a request queued past ``max_wait_s`` is rejected with
    ``queue_timeout``, arrivals beyond ``max_requests`` with ``queue_full_requests``; nothing is lost."""
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.des import QueueLimits

    work = [TraceRequest(0.001 * i, 2000, 400, rid=i) for i in range(300)]  # a burst far beyond capacity
    engine = EngineConfig(num_gpu_blocks_override=800)

    def run(limits):
        setup = SimSetup(
            PERF,
            engine,
            level="gateway",
            policy=parse_policy("fcfs"),
            predictor=make_predictor("global"),
            queue_limits=limits,
        )
        return simulate(work, setup).records

    unbounded = run(None)
    assert all(r.status == "ok" for r in unbounded)
    timed = run(QueueLimits(max_wait_s=5.0))
    reasons = {r.reason for r in timed if r.status == "rejected"}
    assert reasons == {"queue_timeout"}
    for r in timed:
        if r.status == "ok":
            assert r.queue_s is not None and r.queue_s <= 5.0 + 1e-9
    late = [r.rid for r in timed if r.status == "rejected"]
    assert late and min(late) > 0 and all(unbounded[i].queue_s > 5.0 for i in late)
    full = run(QueueLimits(max_requests=50, max_wait_s=1e9))
    assert {r.reason for r in full if r.status == "rejected"} == {"queue_full_requests"}
    assert sum(r.status == "ok" for r in full) + sum(r.status == "rejected" for r in full) == len(work)


def test_a_route_places_each_request_at_engine_level_from_what_its_client_sent():
    """``SimSetup.route`` sees the trace request (its prompt) and the engines, and its answer is where
    the request runs; without one, requests alternate (round robin)."""
    work = [
        TraceRequest(0.1 * i, 500, 20, rid=i, prompt=("even " if i % 4 < 2 else "odd ") * 100)
        for i in range(16)
    ]
    seen: list[tuple[int, int]] = []

    def route(req: TraceRequest, engines) -> int:
        seen.append((req.rid, len(engines)))
        return 0 if (req.prompt or "").startswith("even") else 1

    res = simulate(work, SimSetup(PERF, engines=2, route=route))
    assert seen == [(i, 2) for i in range(16)]  # once per request, on arrival, in order
    assert [r.backend for r in res.records] == ["engine-0" if i % 4 < 2 else "engine-1" for i in range(16)]
    plain = simulate(work, SimSetup(PERF, engines=2))
    assert [r.backend for r in plain.records] == [f"engine-{i % 2}" for i in range(16)]


def test_a_route_is_refused_at_gateway_level():
    with pytest.raises(ValueError, match="engine level"):
        SimSetup(PERF, level="gateway", route=lambda req, engines: 0)
