"""Issue 17: gateway pause/resume live, beside its simulated twin, where the simulator pauses most.

The memory-bound Azure conversation set-up of ``benchmarks/gateway_pause.py`` (Qwen3-32B on H100,
~37k KV tokens an engine; the trace's requests 2000.. with filler prompts of their lengths), here on
two simulated backends, at a utilisation of vLLM alone's measured capacity. Four runs on fresh
backends: vLLM alone (round robin), gateway ``sagesched``, the same with ``pause.enabled`` (the
default rule), and with the resume left unpriced (``hysteresis 0``, ``prefill_tokens_per_step 1e6``:
pause whenever the rank and the exchange gain say so). The gateway's predictor is ``length-bucket``
learning online (a live gateway has no oracle); the true length travels only in the field the
simulated backend honours. Each run is also simulated with the same settings. Ratios to vLLM alone.

    .venv/bin/python -m benchmarks gateway_pause_live [--requests 400] [--utilisation 1.1] [--time-scale 1]
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks import bench_value as bv
from benchmarks.engine_preemption import load_workload
from benchmarks.gateway_pause import UNPRICED
from sagegate.core.summary import summarize
from sagegate.loadgen.prompts import attach_prompts
from sagegate.loadgen.records import scale_rate

RUNS: tuple[tuple[str, bv.Setup, dict[str, float]], ...] = (
    ("vLLM alone", bv.ALONE_SETUP, {}),
    ("gateway sagesched", bv.Setup("gateway sagesched", "sagesched"), {}),
    ("… + pause", bv.Setup("gateway sagesched+pause", "sagesched", True), {}),
    ("… + pause, unpriced", bv.Setup("gateway sagesched+pause", "sagesched", True), UNPRICED),
)
METRICS = ("ttlt_mean_s", "ttlt_p99_s", "ttft_mean_s", "throughput_tok_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--utilisation", type=float, default=1.1)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sagegate.harness.simtwin import capacity, offered_rate, simulate_run

    model, gpu = "qwen3-32b", "h100"
    base = attach_prompts(load_workload("azure-conv", args.requests), "filler", seed=args.seed)
    cap = capacity(base, model=model, gpu=gpu)["req_s"]
    work = scale_rate(base, args.utilisation * cap / offered_rate(base))
    print(
        f"{len(work)} requests, {offered_rate(work):.2f} req/s offered against vLLM alone's {cap:.2f} "
        f"(utilisation {offered_rate(work) / cap:.2f}), two simulated {model}/{gpu} backends",
        flush=True,
    )
    ns = argparse.Namespace(
        model=model,
        gpu=gpu,
        time_scale=args.time_scale,
        predictor="length-bucket",
        seed=args.seed,
        pause_hysteresis=None,
        pause_prefill_tokens_per_step=None,
    )
    rows: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    for label, setup, opts in RUNS:
        sim = simulate_run(
            work,
            setup.policy,
            model=model,
            gpu=gpu,
            predictor="length-bucket",
            seed=args.seed,
            pause=setup.pause,
            pause_options=opts,
        )
        ns.pause_hysteresis = opts.get("hysteresis")
        ns.pause_prefill_tokens_per_step = opts.get("prefill_tokens_per_step")
        run = bv.run_live(work, setup, ns)
        live = summarize(run["records"])
        rows[label] = {
            **{f"live {m}": float(live[m]) for m in METRICS},
            **{f"sim {m}": float(sim.summary[m]) for m in METRICS},
            "live completed": float(live["completed"]),
            "live errors": float(live["errors"]),
            "live pauses": float(run["pauses"] or 0.0),
            "sim pauses": float(sim.gateway_pauses),
            "live preemptions": float(run["counters"]["preemptions"] or 0.0),
        }
        print(f"  {label}: {rows[label]}", flush=True)
    alone = rows["vLLM alone"]
    print(
        f"\n{len(work)} requests at utilisation {args.utilisation:g}; {time.perf_counter() - t0:.0f} s wall"
    )
    print(
        "| run | "
        + " | ".join(f"{m} live / sim" for m in METRICS)
        + " | pauses live / sim | completed, errors |"
    )
    print("|---|" + "---|" * (len(METRICS) + 2))
    for label, r in rows.items():
        cells = [
            f"{r[f'live {m}'] / alone[f'live {m}']:.3f} / {r[f'sim {m}'] / alone[f'sim {m}']:.3f}"
            for m in METRICS
        ]
        print(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {r['live pauses']:.0f} / {r['sim pauses']:.0f} | {r['live completed']:.0f}, {r['live errors']:.0f} |"
        )


if __name__ == "__main__":
    main()
