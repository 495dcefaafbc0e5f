"""Simulator speed, in simulated requests per wall-clock second (issue 2's benchmark).

(a) the full Azure 2023 conversation hour on one H100 Llama-3.1-8B engine, at the trace's rate and at
``--rate-scale 4``; (b) 200-request windows near saturation (rate scale 3.5), median over windows. ``--no-lazy`` turns
the engine's decode cohort off (``sim.decode_cohort``; the results are the same, the speed is not).

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
    ap.add_argument(
        "--no-lazy", action="store_true", help="visit every decoding request at every step (the A/B)"
    )
    args = ap.parse_args()
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor

    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    t0 = time.perf_counter()
    trace = read_trace(CONV)
    print(f"read {len(trace)} requests in {time.perf_counter() - t0:.3f} s")

    def setup() -> SimSetup:
        pred = make_predictor("noisy-oracle", relative_error=0.2, seed=0, truth=answer_key(trace))
        return SimSetup(
            perf,
            EngineConfig(),
            level=args.level,
            policy=parse_policy(args.policy),
            predictor=pred,
            lazy_decode=not args.no_lazy,
        )

    for scale in (1.0, 4.0):
        work = scale_rate(trace, scale)
        rates = []
        for _ in range(args.repeat):
            res = simulate(work, setup())
            rates.append(len(work) / res.wall_s)
        print(
            f"(a) azure conv hour, rate scale {scale}: {statistics.median(rates):,.0f} req/s "
            f"(wall {len(work) / statistics.median(rates):.2f} s, preemptions {res.summary['preemptions']:.0f})"
        )
    rates = []
    step = len(trace) // args.windows
    for w in range(args.windows):
        window = scale_rate(rebase(trace[w * step : w * step + 200]), 3.5)
        best = 0.0
        for _ in range(args.repeat):
            res = simulate(window, setup())
            best = max(best, 200 / res.wall_s)
        rates.append(best)
    print(
        f"(b) 200-request windows near saturation (x3.5), {args.policy}@{args.level}: median "
        f"{statistics.median(rates):,.0f} req/s, min {min(rates):,.0f}"
    )


if __name__ == "__main__":
    main()
