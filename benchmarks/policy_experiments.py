"""Issue 3's experiments: every policy at both levels against vLLM alone, on real workloads.

Workloads: Azure 2023 conversation and code, Bailian ``m-small`` (ServeGen), ShareGPT pairs timed by
the Azure conversation arrivals. Set-ups: compute-bound (one H100, Llama-3.1-8B, ~450k KV tokens) and
memory-bound (one H100, Qwen3-32B, ~37k KV tokens). Loads: utilisation 0.5, 0.8, 0.95, 1.1, where
utilisation = offered request rate / the rate vLLM alone sustains on that workload (measured here by
running it saturated). Every figure is relative to vLLM alone (engine-level ``fcfs``, no gateway).

    .venv/bin/python -m benchmarks policy_experiments --out docs/experiments/policies.md [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from sagegate.core.request import TraceRequest, answer_key
from sagegate.loadgen.data import data_root
from sagegate.loadgen.records import rebase, scale_rate

DATA = data_root()
LOADS = (0.5, 0.8, 0.95, 1.1)
ERRORS = ("oracle", 0.2, 0.5, 1.0)
SETUPS = {
    "compute": ("llama-3.1-8b", "h100"),
    "memory": ("qwen3-32b", "h100"),
}
BASELINE = ("fcfs", "engine", None)


@dataclass(frozen=True)
class Cell:
    workload: str
    setup: str
    load: float
    policy: str
    level: str
    predictor: str | float | None  # "oracle", a noisy-oracle relative error, or None


def load_workloads(n: int) -> dict[str, list[TraceRequest]]:
    from sagegate.loadgen.readers import read_trace

    out: dict[str, list[TraceRequest]] = {}
    conv = read_trace(DATA / "azure2023" / "AzureLLMInferenceTrace_conv.csv")
    out["azure-conv"] = rebase(conv[2000 : 2000 + n])
    code = read_trace(DATA / "azure2023" / "AzureLLMInferenceTrace_code.csv")
    out["azure-code"] = rebase(code[2000 : 2000 + n])
    msmall = read_trace(DATA / "servegen" / "language" / "m-small", start_s=36000, duration_s=10, seed=0)
    out["bailian-m-small"] = rebase(msmall[:n])
    pairs = read_trace(
        DATA / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz",
        arrivals_from=[r.arrival_s for r in out["azure-conv"]],
        limit=n,
    )
    out["sharegpt@azure-conv"] = rebase(pairs[:n])
    return out


def _perf(setup: str, step_time_scale: float | None = None):  # type: ignore[no-untyped-def]
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    model, gpu = SETUPS[setup]
    return PerfModel(get_model(model), get_gpu(gpu), step_time_scale=step_time_scale)


def run_one(
    work: list[TraceRequest],
    setup: str,
    policy: str,
    level: str,
    predictor: str | float | None,
    seed: int = 0,
    step_time_scale: float | None = None,
) -> dict[str, float]:
    """One cell; ``step_time_scale`` (None: the profile's) is for ``benchmarks/error_bars.py``."""
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.des import SimSetup, client_view, simulate

    perf = _perf(setup, step_time_scale)
    model, gpu = SETUPS[setup]
    pred = None
    if predictor == "oracle":
        pred = make_predictor("oracle", truth=answer_key(work))
    elif predictor is not None:
        pred = make_predictor(
            "noisy-oracle", relative_error=float(predictor), seed=seed, truth=answer_key(work)
        )
    res = simulate(
        work,
        SimSetup(
            perf, EngineConfig(model=model, gpu=gpu), level=level, policy=parse_policy(policy), predictor=pred
        ),
    )
    client_view(res, perf.frontend_s)
    s = dict(res.summary)
    s["wall_s"] = res.wall_s
    return s


def saturated_rate(work: list[TraceRequest], setup: str, step_time_scale: float | None = None) -> float:
    """Requests per second vLLM alone sustains on ``work``: everything arrives in a burst."""
    burst = [replace(r, arrival_s=0.0) for r in work]
    s = run_one(burst, setup, "fcfs", "engine", None, step_time_scale=step_time_scale)
    return s["completed"] / s["makespan_s"]


def panel(quick: bool) -> list[tuple[str, str, str | float | None]]:
    """(policy, level, predictor) for every registered policy at each level it supports."""
    from sagegate.policies.capabilities import Capability
    from sagegate.policies.registry import registry

    rows: list[tuple[str, str, str | float | None]] = []
    for name, info in sorted(registry().items()):
        for level in sorted(info.cls.levels):
            if (name, level) == ("fcfs", "engine"):
                continue  # the baseline
            if Capability.USES_PREDICTION in info.cls.capabilities:
                errors: Iterable[str | float] = (0.2,) if quick else ERRORS
                rows.extend((name, level, e) for e in errors)
            elif level == "gateway":
                rows.append((name, level, 0.2))  # the admission rule's charge needs a prediction
            else:
                rows.append((name, level, None))
    if not quick:
        # SageSched without preemption inside the engine (recompute preemption is costly).
        rows.extend(("sagesched:preempt=false", "engine", e) for e in ERRORS)
    return rows


def _cell_job(args: tuple[list[TraceRequest], Cell]) -> tuple[Cell, dict[str, float]]:
    work, cell = args
    return cell, run_one(work, cell.setup, cell.policy, cell.level, cell.predictor)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="20%% error only, fewer workloads")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=Path("docs/experiments/policies.md"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    workloads = load_workloads(args.requests)
    if args.quick:
        workloads = {k: v for k, v in workloads.items() if k in ("azure-conv", "sharegpt@azure-conv")}
    jobs: list[tuple[list[TraceRequest], Cell]] = []
    native: dict[tuple[str, str, float], list[TraceRequest]] = {}
    capacity: dict[tuple[str, str], float] = {}
    for (wname, work), setup in itertools.product(workloads.items(), SETUPS):
        cap = saturated_rate(work, setup)
        capacity[(wname, setup)] = cap
        rate = len(work) / max(work[-1].arrival_s, 1e-9)
        for load in LOADS:
            timed = scale_rate(work, load * cap / rate)
            native[(wname, setup, load)] = timed
            for pol, lvl, pred in [BASELINE, *panel(args.quick)]:
                jobs.append((timed, Cell(wname, setup, load, pol, lvl, pred)))
    print(
        f"{len(jobs)} runs over {len(workloads)} workloads; capacities: "
        + ", ".join(f"{w}/{s}={c:.1f} req/s" for (w, s), c in capacity.items()),
        flush=True,
    )
    results: dict[Cell, dict[str, float]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for cell, summary in pool.map(_cell_job, jobs, chunksize=4):
            results[cell] = summary
    wall = time.perf_counter() - t0
    if args.json:
        args.json.write_text(json.dumps([{**cell.__dict__, **s} for cell, s in results.items()], default=str))
    report = render(results, capacity, wall, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out} in {wall:.0f} s")


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def render(
    results: dict[Cell, dict[str, float]],
    capacity: dict[tuple[str, str], float],
    wall: float,
    args: argparse.Namespace,
) -> str:
    lines = [
        "# Policy experiments (issue 3)",
        "",
        f"Command: `.venv/bin/python -m benchmarks policy_experiments --requests {args.requests}"
        f"{' --quick' if args.quick else ''}`; {len(results)} simulated runs, {wall:.0f} s wall on "
        f"{args.workers} worker(s).",
        "",
        "Each figure is the policy's value divided by vLLM alone's (engine-level `fcfs`, no gateway) on "
        "the same workload, set-up and load; below 1 is better for latencies, above 1 for throughput. "
        "Predictor: `oracle`, or `noisy-oracle` at the given relative error.",
        "",
        "Capacity (requests/s vLLM alone sustains, measured saturated): "
        + ", ".join(f"{w} {s}-bound {c:.2f}" for (w, s), c in capacity.items()),
        "",
    ]
    lines += headline(results)
    groups = sorted({(c.workload, c.setup, c.load) for c in results})
    for w, s, load in groups:
        base = results[Cell(w, s, load, *BASELINE)]
        lines += [
            f"## {w}, {s}-bound, utilisation {load}",
            "",
            f"vLLM alone: mean TTLT {base['ttlt_mean_s']:.3f} s, p99 TTLT {base['ttlt_p99_s']:.3f} s, "
            f"mean TTFT {base['ttft_mean_s']:.3f} s, p99 TTFT {base['ttft_p99_s']:.3f} s, "
            f"{base['throughput_tok_s']:.0f} tok/s, {base['preemptions']:.0f} preemptions",
            "",
            "| policy | level | predictor | mean TTLT | p99 TTLT | mean TTFT | p99 TTFT | throughput "
            "| preemptions |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        cells = sorted(
            (
                c
                for c in results
                if (c.workload, c.setup, c.load) == (w, s, load)
                and (c.policy, c.level, c.predictor) != BASELINE
            ),
            key=lambda c: results[c]["ttlt_mean_s"],
        )
        for c in cells:
            r = results[c]
            lines.append(
                f"| {c.policy} | {c.level} | {c.predictor if c.predictor is not None else '-'} | "
                + " | ".join(
                    f"{_ratio(r[k], base[k]):.3f}"
                    for k in ("ttlt_mean_s", "ttlt_p99_s", "ttft_mean_s", "ttft_p99_s")
                )
                + " | "
                f"{_ratio(r['throughput_tok_s'], base['throughput_tok_s']):.3f} | {r['preemptions']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def headline(results: dict[Cell, dict[str, float]]) -> list[str]:
    """The questions of issue 3, answered from the figures."""
    out = ["## Headline", ""]
    rivals = ("trail", "ssjf", "fastserve")
    groups = sorted({(c.workload, c.setup, c.load) for c in results})
    rows = [
        "| workload | set-up | load | level | sagesched | best rival | sagesched vs best rival "
        "| gap to srpt-oracle closed | worst gateway policy vs vLLM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worse = []
    for w, s, load in groups:
        base = results[Cell(w, s, load, *BASELINE)]["ttlt_mean_s"]
        for level in ("engine", "gateway"):
            sage = results.get(Cell(w, s, load, "sagesched", level, 0.2))
            srpt = results.get(Cell(w, s, load, "srpt-oracle", level, 0.2)) or results.get(
                Cell(w, s, load, "srpt-oracle", level, None)
            )
            rv = [
                (n, results[c]["ttlt_mean_s"])
                for n in rivals
                for c in [Cell(w, s, load, n, level, 0.2)]
                if c in results
            ]
            if sage is None or not rv:
                continue
            best_name, best = min(rv, key=lambda x: x[1])
            closed = math.nan
            if srpt is not None and base - srpt["ttlt_mean_s"] > 1e-9:
                closed = (base - sage["ttlt_mean_s"]) / (base - srpt["ttlt_mean_s"])
            gw = [
                (c.policy, results[c]["ttlt_mean_s"] / base)
                for c in results
                if (c.workload, c.setup, c.load, c.level) == (w, s, load, "gateway")
                and c.predictor in (0.2, None)
            ]
            worst = max(gw, key=lambda x: x[1]) if gw and level == "gateway" else None
            if worst and worst[1] > 1.0:
                worse.append(f"{w}/{s}/{load}: {worst[0]} {worst[1]:.3f}")
            rows.append(
                f"| {w} | {s} | {load} | {level} | {sage['ttlt_mean_s'] / base:.3f} | "
                f"{best_name} {best / base:.3f} | "
                f"{(sage['ttlt_mean_s'] / best - 1) * 100:+.1f}% | {closed * 100:.0f}% | "
                f"{'' if worst is None else f'{worst[0]} {worst[1]:.3f}'} |"
            )
    out += [
        "Mean TTLT relative to vLLM alone, `noisy-oracle` at 20% error. 'Gap closed' = "
        "(vLLM alone − sagesched) / (vLLM alone − srpt-oracle) at the same level.",
        "",
        *rows,
        "",
    ]
    out += [
        "Gateway-level runs worse than vLLM alone on mean TTLT (any policy, 20% error): "
        + ("; ".join(worse) if worse else "none"),
        "",
    ]
    return out


if __name__ == "__main__":
    main()
