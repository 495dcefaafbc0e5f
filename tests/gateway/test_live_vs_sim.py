"""Live versus simulated: one 300-request workload through the gateway and two simulated backends,
and through ``sagegate simulate`` at gateway level, agree on median TTLT within 15%."""

from __future__ import annotations

import os
import statistics

import pytest

from sagegate.gateway.settings import PlacementSettings
from sagegate.harness.procs import spawned
from sagegate.loadgen.client import ReplayConfig, replay
from sagegate.loadgen.schedule import prepare_workload
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, client_view, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

pytestmark = pytest.mark.heavy  # gateway and backend processes

TIME_SCALE = 4.0
MODEL, GPU = "qwen3-32b", "h100"


@pytest.mark.slow
def test_live_and_simulated_median_ttlt_agree():
    work = prepare_workload(
        "synthetic",
        rate=3.0,
        requests=300,
        prompts="filler",
        seed=3,
        reader_opts={"prompt_mean": 400, "output_mean": 120},
    ).requests
    perf = PerfModel(get_model(MODEL), get_gpu(GPU))
    sim = simulate(
        work,
        SimSetup(
            perf,
            EngineConfig(model=MODEL, gpu=GPU),
            engines=2,
            level="gateway",
            policy=parse_policy("fcfs"),
            predictor=make_predictor("length-bucket"),
            placement=PlacementSettings().mode,  # the live gateway's
        ),
    )
    client_view(sim, perf.frontend_s)
    args = ["--model", MODEL, "--gpu", GPU, "--time-scale", str(TIME_SCALE)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with spawned("sagegate.cmd_backend", args) as b1, spawned("sagegate.cmd_backend", args) as b2:
        gw_args = [
            "serve",
            "--backend",
            b1,
            "--backend",
            b2,
            "--policy",
            "fcfs",
            "--predictor",
            "length-bucket",
        ]
        with spawned("sagegate.cli", gw_args, ready_path="/ready", startup_timeout_s=60, env=env) as gw:
            live = replay(work, ReplayConfig(url=gw, time_scale=TIME_SCALE, queue_metric=None))
    live_ttlt = [r.ttlt for r in live.records if r.status == "ok" and r.ttlt is not None]
    sim_ttlt = [r.ttlt for r in sim.records if r.ttlt is not None]
    assert len(live_ttlt) == len(work), "every request completes live"
    live_med, sim_med = statistics.median(live_ttlt), statistics.median(sim_ttlt)
    print(f"median TTLT: live {live_med:.3f} s, simulated {sim_med:.3f} s, ratio {live_med / sim_med:.3f}")
    assert live_med == pytest.approx(sim_med, rel=0.15)
