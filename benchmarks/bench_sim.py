"""Simulator speed, in simulated requests per wall-clock second (issue 2's benchmark).

(a) the full Azure 2023 conversation hour on one H100 Llama-3.1-8B engine, at the trace's rate and at
``--rate-scale 4``; (b) 200-request windows near saturation (rate scale 3.5), median over windows,
best of ``--repeat`` runs each, the engine with its decode cohort (``sim.decode_cohort``) and without
it run alternately on each window (paired: this machine's speed drifts by up to 2× between runs).
``--no-lazy`` runs (a) without the cohort; ``--windows-only`` skips (a).

    .venv/bin/python -m benchmarks bench_sim [--repeat 3] [--policy fcfs] [--level engine] [--no-lazy]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sagegate.core.request import answer_key
from sagegate.loadgen.readers import read_trace
from sagegate.loadgen.records import rebase, scale_rate
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, simulate
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

CONV = Path(__file__).resolve().parents[1].parent / "shared/data/azure2023/AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--level", default="engine")
    ap.add_argument("--no-lazy", action="store_true", help="(a) visits every decoding request every step")
    ap.add_argument("--windows-only", action="store_true")
    args = ap.parse_args()
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor

    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    t0 = time.perf_counter()
    trace = read_trace(CONV)
    print(f"read {len(trace)} requests in {time.perf_counter() - t0:.3f} s")

    def setup(lazy: bool = not args.no_lazy) -> SimSetup:
        pred = make_predictor("noisy-oracle", relative_error=0.2, seed=0, truth=answer_key(trace))
        return SimSetup(
            perf,
            EngineConfig(),
            level=args.level,
            policy=parse_policy(args.policy),
            predictor=pred,
            lazy_decode=lazy,
        )

    for scale in () if args.windows_only else (1.0, 4.0):
        work = scale_rate(trace, scale)
        rates = []
        for _ in range(args.repeat):
            res = simulate(work, setup())
            rates.append(len(work) / res.wall_s)
        print(
            f"(a) azure conv hour, rate scale {scale}: {statistics.median(rates):,.0f} req/s "
            f"(wall {len(work) / statistics.median(rates):.2f} s, preemptions {res.summary['preemptions']:.0f})"
        )
    rates: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    step = len(trace) // args.windows
    for w in range(args.windows):
        window = scale_rate(rebase(trace[w * step : w * step + 200]), 3.5)
        best = dict.fromkeys(rates, 0.0)
        for _ in range(args.repeat):
            for lazy in rates:
                best[lazy] = max(best[lazy], 200 / simulate(window, setup(lazy)).wall_s)
        for lazy in rates:
            rates[lazy].append(best[lazy])
        ratios.append(best[True] / best[False])
    for lazy, label in ((True, "decode cohort"), (False, "every request visited")):
        print(
            f"(b) 200-request windows near saturation (x3.5), {args.policy}@{args.level}, {label}: "
            f"median {statistics.median(rates[lazy]):,.0f} req/s, min {min(rates[lazy]):,.0f}"
        )
    print(
        f"(b) paired ratio, median over windows {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
