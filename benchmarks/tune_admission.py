"""Tune the gateway's admission rule in the simulator: gateway `fcfs` against vLLM alone.

For each workload, set-up and load, every candidate rule is run behind the gateway and compared
with vLLM alone (engine-level `fcfs`): mean TTLT ratio, throughput ratio, preemptions.

    .venv/bin/python -m benchmarks tune_admission [--loads 0.5,0.8,0.95,1.1,2.0] [--n 1000]
"""

from __future__ import annotations

import argparse

from benchmarks import policy_experiments as pe
from sagegate.core.request import answer_key
from sagegate.harness.simtwin import perf_and_engine
from sagegate.loadgen.records import scale_rate
from sagegate.policies.admission import AdmissionConfig
from sagegate.policies.registry import parse_policy
from sagegate.predictor.factory import make_predictor
from sagegate.sim.des import SimSetup, simulate

CANDIDATES = {
    "sum 1.5": AdmissionConfig(rule="sum", quantile=0.5, target=1.5),
    "sum 1.2": AdmissionConfig(rule="sum", quantile=0.5, target=1.2),
    "peak 1.0": AdmissionConfig(rule="peak", quantile=0.5, peak_target=1.0),
    "peak 1.05": AdmissionConfig(rule="peak", quantile=0.5, peak_target=1.05),
    "peak 0.97": AdmissionConfig(rule="peak", quantile=0.5, peak_target=0.97),
    "peak 0.95": AdmissionConfig(rule="peak", quantile=0.5, peak_target=0.95),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="0.5,0.8,0.95,1.1,2.0", help="utilisations of the saturated rate")
    ap.add_argument("--n", type=int, default=1000, help="requests per workload")
    ap.add_argument("--only", default=None, help="comma-separated candidate names")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    names = args.only.split(",") if args.only else list(CANDIDATES)
    workloads = pe.load_workloads(args.n)
    print("Each cell: mean TTLT ratio / throughput ratio / preemptions, against vLLM alone.\n")
    print("| workload | set-up | load | vLLM alone preemptions | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for wname, work in workloads.items():
        for setup in pe.SETUPS:
            perf, cfg = perf_and_engine(*pe.SETUPS[setup])
            cap = pe.saturated_rate(work, setup)
            rate = len(work) / work[-1].arrival_s
            for load in loads:
                timed = scale_rate(work, load * cap / rate)
                base = simulate(timed, SimSetup(perf, cfg)).summary
                cells = []
                for name in names:
                    s = simulate(
                        timed,
                        SimSetup(
                            perf,
                            cfg,
                            level="gateway",
                            policy=parse_policy("fcfs"),
                            predictor=make_predictor(
                                "noisy-oracle", relative_error=0.2, truth=answer_key(timed)
                            ),
                            admission=CANDIDATES[name],
                        ),
                    ).summary
                    cells.append(
                        f"{s['ttlt_mean_s'] / base['ttlt_mean_s']:.3f} / "
                        f"{s['throughput_tok_s'] / base['throughput_tok_s']:.3f} / {s['preemptions']:.0f}"
                    )
                print(
                    f"| {wname} | {setup} | {load} | {base['preemptions']:.0f} | " + " | ".join(cells) + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
