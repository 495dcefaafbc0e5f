"""Fit the H100 profile's step-time terms on the training runs (benchmarks/fidelity.py ``HELD_OUT`` excluded).

A coordinate search in log space over the free terms of ``sim.hardware.StepTerms`` and the compute
efficiency, minimising the squared log errors of each training stage's mean E2E and ITL and (at a
quarter weight) TTFT. Runs that overloaded vLLM (client timeouts, or a mean E2E many times the light
load) are left out: their latency measures the client's timeout and queue, not the engine.

    .venv/bin/python -m benchmarks fidelity_fit [--window 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from benchmarks.fidelity import HELD_OUT, OVERLOAD_FAILURES, compare, simulate_run
from benchmarks.fidelity_data import DEFAULT_SOURCE, Run, load_runs
from sagegate.sim.hardware import DEFAULT_TERMS, GPUSpec, get_gpu, get_model
from sagegate.sim.perf import PerfModel

FREE = (
    "eta_c",
    "eta_m",
    "eta_kv",
    "t_fix",
    "t_seq",
    "t_allreduce",
    "overlap_p",
    "frontend_s",
    "frontend_multiproc_s",
)
BOUNDS = {
    "eta_c": (0.3, 0.72),
    "eta_m": (0.5, 0.82),
    "eta_kv": (0.3, 0.95),
    "overlap_p": (2.0, 8.0),
    "frontend_s": (0.005, 0.06),
    "frontend_multiproc_s": (0.0, 0.06),
}
CAP = 0.7  # a stage's log error counts at most this much (a saturated stage would swamp the rest)


def gpu_with(params: dict[str, float]) -> GPUSpec:
    """The H100 profile with ``params`` (``eta_c`` and any ``StepTerms`` field) replaced."""
    base = get_gpu("h100")
    terms = dataclasses.replace(
        base.terms or DEFAULT_TERMS, **{k: v for k, v in params.items() if k != "eta_c"}
    )
    return dataclasses.replace(base, eta_c=params["eta_c"], terms=terms)


def loss(runs: list[Run], params: dict[str, float], window_s: float | None) -> float:
    gpu = gpu_with(params)
    total = 0.0
    for run in runs:
        sim = simulate_run(run, PerfModel(get_model(run.model), gpu, tp=run.tp), window_s=window_s)
        for real, s in compare(run, sim):
            total += min(CAP, abs(math.log(s.e2e_mean / real.e2e_mean))) ** 2
            total += min(CAP, abs(math.log(s.itl_mean / real.itl_mean))) ** 2
            total += 0.25 * min(CAP, abs(math.log(s.ttft_mean / real.ttft_mean))) ** 2
    return total


def training_runs(runs: list[Run]) -> list[Run]:
    return [
        r
        for r in runs
        if not any(h in r.name for h in HELD_OUT)
        and r.failure_rate <= OVERLOAD_FAILURES
        and "reasoning" not in r.name
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--window", type=float, default=150.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--free", default=",".join(FREE), help="terms to fit (the others stay at the profile's)")
    args = ap.parse_args()
    runs = training_runs(load_runs(args.data))
    print("training runs:", ", ".join(r.name[16:] for r in runs))
    base = get_gpu("h100")
    terms = base.terms or DEFAULT_TERMS
    params = {"eta_c": base.eta_c or 0.61, **{k: getattr(terms, k) for k in FREE if k != "eta_c"}}
    best = loss(runs, params, args.window)
    print(f"start {best:.4f} {params}")
    step = 0.4
    for rnd in range(args.rounds):
        for key in args.free.split(","):
            for factor in (1 + step, 1 / (1 + step)):
                trial = dict(params)
                trial[key] *= factor
                lo, hi = BOUNDS.get(key, (0.0, math.inf))
                if not lo <= trial[key] <= hi:
                    continue
                value = loss(runs, trial, args.window)
                if value < best:
                    best, params = value, trial
                    print(f"round {rnd} {key}={trial[key]:.4g} loss {best:.4f}", flush=True)
                    break
        step /= 2
    print("fitted:", {k: round(v, 7) for k, v in params.items()}, f"loss {best:.4f}")


if __name__ == "__main__":
    main()
