"""Tune the gateway's admission rule in the simulator: gateway `fcfs` against vLLM alone.

For each workload, set-up and load, every (quantile, target, max_waiting) is run behind the gateway
and compared with vLLM alone (engine-level `fcfs`): mean TTLT ratio, throughput ratio, preemptions.

    .venv/bin/python benchmarks/tune_admission.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policy_experiments as pe

from loadgen.records import scale_rate
from policies.admission import AdmissionConfig
from policies.registry import parse_policy
from predictor.baselines import make_predictor
from sim.config import EngineConfig
from sim.des import SimSetup, simulate

GRID = [
    (0.5, 1.5, 1, 10**9),
    (0.5, 1.5, 256, 2048),
    (0.5, 1.2, 256, 2048),
    (0.5, 2.0, 256, 2048),
    (0.5, 1.5, 256, 4096),
]
DEFAULT = (0.5, 1.5, 256, 2048)


def main() -> None:
    workloads = pe.load_workloads(1000)
    print(
        "| workload | set-up | load | vLLM alone preemptions | best (q, target, max_waiting, max_waiting_tokens):"
        " TTLT ratio, tput ratio, preemptions | one waiting request at most | default " + str(DEFAULT) + " |"
    )
    print("|---|---|---|---|---|---|---|")
    for wname in workloads:
        work = workloads[wname]
        for setup in pe.SETUPS:
            perf = pe._perf(setup)
            model, gpu = pe.SETUPS[setup]
            cfg = EngineConfig(model=model, gpu=gpu)
            cap = pe.saturated_rate(work, setup)
            rate = len(work) / work[-1].arrival_s
            for load in (0.5, 0.8, 0.95, 1.1):
                timed = scale_rate(work, load * cap / rate)
                base = simulate(timed, SimSetup(perf, cfg)).summary
                rows = {}
                for q, t, mw, mwt in GRID:
                    s = simulate(
                        timed,
                        SimSetup(
                            perf,
                            cfg,
                            level="gateway",
                            policy=parse_policy("fcfs"),
                            predictor=make_predictor("noisy-oracle", relative_error=0.2),
                            admission=AdmissionConfig(
                                quantile=q, target=t, max_waiting=mw, max_waiting_tokens=mwt
                            ),
                        ),
                    ).summary
                    rows[(q, t, mw, mwt)] = (
                        s["ttlt_mean_s"] / base["ttlt_mean_s"],
                        s["throughput_tok_s"] / base["throughput_tok_s"],
                        s["preemptions"],
                    )
                best = min(rows, key=lambda k: rows[k][0])
                d, one, b = rows[DEFAULT], rows[GRID[0]], rows[best]
                print(
                    f"| {wname} | {setup} | {load} | {base['preemptions']:.0f} | {best}: {b[0]:.3f}, {b[1]:.3f}, "
                    f"{b[2]:.0f} | {one[0]:.3f}, {one[1]:.3f}, {one[2]:.0f} | {d[0]:.3f}, {d[1]:.3f}, {d[2]:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
