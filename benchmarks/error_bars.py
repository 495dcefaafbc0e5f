"""Issue 15, part 3: every simulated headline with its error bar.

The engine model is calibrated to within ~±10% of real vLLM (docs/fidelity.md); near the knee a 15%
capacity error is a large latency error. So the key simulated results are re-run with every step's
GPU time × 0.85, × 1.0 and × 1.15 (``StepTerms.step_time_scale``) and reported as a range:

* **the value twin** (``python -m benchmarks bench_value --sim-only``, ``harness/simtwin.py``): gateway
  ``sagesched`` against vLLM alone on two simulated Qwen3-32B/H100 backends, Azure conversation
  arrivals with ShareGPT pairs, at light and high load;
* **the policy-experiment headline** (``benchmarks/policy_experiments.py``): ``sagesched`` (noisy
  oracle, 20% error) at the engine and at the gateway against vLLM alone, every workload and set-up.

Two views per scale. *Capacity-anchored*: capacity is re-measured at that scale and the load set as
that scale's utilisation, so "high = 1.7× capacity" means the same thing at every scale. *Fixed
rate*: the arrival rate of scale 1.0 replayed on the scaled engine, what a miscalibrated model does
to a user who sets a rate (a ×1.15 model sees ~1.15× the utilisation).

    .venv/bin/python -m benchmarks error_bars [--out docs/experiments/error_bars.md] [--quick]

Figures are ratios sagesched / vLLM alone from runs of one scale (below 1: sagesched is better).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.core.summary import summarize
from sagegate.loadgen.records import scale_rate

SCALES = (0.85, 1.0, 1.15)
CAPACITY = "capacity-anchored"
FIXED = "fixed-rate"
METRICS = ("ttlt_mean_s", "ttlt_p99_s", "throughput_tok_s")


@dataclass(frozen=True)
class Row:
    """One comparison: sagesched against vLLM alone at one step-time scale."""

    study: str  # "value twin" or "policy experiments"
    case: str  # the load (and workload / set-up / level)
    view: str
    scale: float
    utilisation: float
    capacity_req_s: float
    mean_ratio: float
    p99_ratio: float
    throughput_ratio: float


def _ratios(sage: dict[str, float], alone: dict[str, float]) -> tuple[float, float, float]:
    def r(k: str) -> float:
        a, b = sage.get(k, math.nan), alone.get(k, math.nan)
        return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan

    return r("ttlt_mean_s"), r("ttlt_p99_s"), r("throughput_tok_s")


# --- the value twin ---------------------------------------------------------------------------------
def value_rows(args: argparse.Namespace) -> list[Row]:
    from sagegate.harness.live import azure_workload
    from sagegate.harness.simtwin import capacity, offered_rate, scale_for, simulate_run

    def build(x: float) -> list[TraceRequest]:
        return list(azure_workload(args.minutes, x, args.seed, quiet=True).requests)

    mix = azure_workload(max(args.minutes, 2.0), 4.0, args.seed, quiet=True).requests
    kw = {"model": args.model, "gpu": args.gpu}

    def compare(work: Sequence[TraceRequest], s: float) -> tuple[float, float, float]:
        runs = [
            summarize(
                simulate_run(
                    work,
                    pol,
                    predictor=args.predictor,
                    seed=args.seed,
                    step_time_scale=s,
                    max_wait_s=args.max_wait_s,
                    **kw,
                ).records
            )
            for pol in ("sagesched", None)
        ]
        return _ratios(runs[0], runs[1])

    caps = {s: capacity(mix, step_time_scale=s, **kw) for s in args.scales}
    rows: list[Row] = []
    for label, target in (("light", args.light_util), ("high", args.high_util)):
        nominal: list[TraceRequest] = []
        for s in args.scales:
            trace_x, cap = scale_for(build, target, mix, step_time_scale=s, **kw)
            work = build(trace_x)
            if s == 1.0:
                nominal = work
            util = offered_rate(work) / cap["req_s"]
            rows.append(
                Row("value twin", f"{label} load", CAPACITY, s, util, cap["req_s"], *compare(work, s))
            )
            print(f"  value {label} ×{s}: utilisation {util:.2f}, {len(work)} requests", flush=True)
        for s in args.scales:
            if s == 1.0 or not nominal:
                continue
            util = offered_rate(nominal) / caps[s]["req_s"]
            rows.append(
                Row("value twin", f"{label} load", FIXED, s, util, caps[s]["req_s"], *compare(nominal, s))
            )
    return rows


# --- the policy-experiment headline -----------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    workload: str
    setup: str
    load: float
    view: str
    scale: float
    rate_scale: float  # applied to the workload's native arrivals
    policy: str
    level: str
    predictor: float | None


def _run_job(args: tuple[list[TraceRequest], Job]) -> tuple[Job, dict[str, float]]:
    from benchmarks.policy_experiments import run_one

    native, job = args
    timed = scale_rate(native, job.rate_scale)
    return job, run_one(timed, job.setup, job.policy, job.level, job.predictor, step_time_scale=job.scale)


def _cap_job(args: tuple[list[TraceRequest], str, float]) -> tuple[str, float, float]:
    from benchmarks.policy_experiments import saturated_rate

    work, setup, s = args
    return setup, s, saturated_rate(work, setup, s)


RUNS = (("fcfs", "engine", None), ("sagesched", "engine", 0.2), ("sagesched", "gateway", 0.2))


def policy_rows(args: argparse.Namespace) -> list[Row]:
    from benchmarks.policy_experiments import SETUPS, load_workloads

    workloads = load_workloads(args.requests)
    if args.quick:
        workloads = {k: v for k, v in workloads.items() if k in ("azure-code", "azure-conv")}
    cap: dict[tuple[str, str, float], float] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        keys = list(itertools.product(workloads, SETUPS, args.scales))
        for (w, _, _), (setup, s, c) in zip(
            keys, pool.map(_cap_job, [(workloads[w], st, s) for w, st, s in keys]), strict=True
        ):
            cap[(w, setup, s)] = c
        jobs: list[tuple[list[TraceRequest], Job]] = []
        for w, setup, load, s in itertools.product(workloads, SETUPS, args.loads, args.scales):
            work = workloads[w]
            rate = len(work) / max(work[-1].arrival_s, 1e-9)
            views = [(CAPACITY, load * cap[(w, setup, s)] / rate)]
            if s != 1.0:
                views.append((FIXED, load * cap[(w, setup, 1.0)] / rate))
            for (view, x), (pol, lvl, pred) in itertools.product(views, RUNS):
                jobs.append((work, Job(w, setup, load, view, s, x, pol, lvl, pred)))
        print(f"  policy experiments: {len(jobs)} runs", flush=True)
        results = dict(pool.map(_run_job, jobs, chunksize=4))
    rows: list[Row] = []
    for job, summary in results.items():
        if job.policy != "sagesched":
            continue
        alone = results[Job(job.workload, job.setup, job.load, job.view, job.scale, job.rate_scale, *RUNS[0])]
        c = cap[(job.workload, job.setup, job.scale)]
        work = workloads[job.workload]
        util = job.rate_scale * len(work) / max(work[-1].arrival_s, 1e-9) / c
        case = f"{job.workload} {job.setup}-bound load {job.load} {job.level}"
        rows.append(Row("policy experiments", case, job.view, job.scale, util, c, *_ratios(summary, alone)))
    return rows


# --- the report -------------------------------------------------------------------------------------
def _span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    good = [v for v in values if not math.isnan(v)]
    return f"{fmt(min(good))}–{fmt(max(good))}" if good else "—"


def _f3(x: float) -> str:
    return f"{x:.3f}"


def table(rows: Sequence[Row], scales: Sequence[float]) -> list[str]:
    """One line per (case, view): each scale's mean / p99 TTLT and throughput ratios, and their range."""
    out = [
        "| case | view | "
        + " | ".join(f"×{s:g}: util, mean, p99, tok/s" for s in scales)
        + " | mean range | p99 range |",
        "|---|---|" + "---|" * len(scales) + "---|---|",
    ]
    groups: dict[tuple[str, str], dict[float, Row]] = {}
    for r in rows:
        groups.setdefault((r.case, r.view), {})[r.scale] = r
    nominal_cells = {case: g[1.0] for (case, view), g in groups.items() if view == CAPACITY and 1.0 in g}
    for (case, view), by_scale in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != CAPACITY)):
        if view == FIXED and case in nominal_cells:
            by_scale = {**by_scale, 1.0: nominal_cells[case]}
        cells = []
        for s in scales:
            got = by_scale.get(s)
            cells.append(
                "—"
                if got is None
                else f"{got.utilisation:.2f}, {got.mean_ratio:.3f}, {got.p99_ratio:.3f}, {got.throughput_ratio:.3f}"
            )
        vals = list(by_scale.values())
        out.append(
            f"| {case} | {view} | "
            + " | ".join(cells)
            + f" | {_span([r.mean_ratio for r in vals], _f3)} | {_span([r.p99_ratio for r in vals], _f3)} |"
        )
    return out


def summary_lines(rows: Sequence[Row]) -> list[str]:
    """The headline sentences with their ranges (what RESULTS.md quotes)."""
    out = []
    for label in ("light load", "high load"):
        sel = [r for r in rows if r.study == "value twin" and r.case == label]
        nominal = [r for r in sel if r.scale == 1.0]
        if not nominal:
            continue
        n = nominal[0]
        cap = [r for r in sel if r.view == CAPACITY]
        fix = [r for r in sel if r.view == FIXED] + [n]
        out.append(
            f"- Value twin, {label} (utilisation {n.utilisation:.2f} of vLLM alone's capacity): gateway "
            f"sagesched / vLLM alone mean TTLT **{n.mean_ratio:.3f}** (step time ±15%, capacity-anchored: "
            f"{_span([r.mean_ratio for r in cap], _f3)}; fixed rate: {_span([r.mean_ratio for r in fix], _f3)} "
            f"at utilisation {_span([r.utilisation for r in fix], lambda x: f'{x:.2f}')}), p99 TTLT "
            f"**{n.p99_ratio:.3f}** ({_span([r.p99_ratio for r in cap], _f3)}; fixed rate "
            f"{_span([r.p99_ratio for r in fix], _f3)}), throughput {n.throughput_ratio:.3f} "
            f"({_span([r.throughput_ratio for r in cap + fix], _f3)})."
        )
    for level in ("engine", "gateway"):
        sel = [r for r in rows if r.study == "policy experiments" and r.case.endswith(level)]
        if not sel:
            continue
        shift = {
            view: max(
                (
                    abs(r.mean_ratio - n.mean_ratio)
                    for r in sel
                    if r.view == view
                    for n in sel
                    if n.scale == 1.0 and n.case == r.case and not math.isnan(r.mean_ratio - n.mean_ratio)
                ),
                default=math.nan,
            )
            for view in (CAPACITY, FIXED)
        }
        nominal = [r for r in sel if r.scale == 1.0]
        wins = {v: sum(r.mean_ratio < 0.99 for r in sel if r.view == v) for v in (CAPACITY, FIXED)}
        tot = {v: sum(1 for r in sel if r.view == v) for v in (CAPACITY, FIXED)}
        out.append(
            f"- Policy experiments, sagesched at the {level} (20% error): mean TTLT / vLLM alone "
            f"{_span([r.mean_ratio for r in nominal], _f3)} over {len(nominal)} cells at ×1.0; the largest "
            f"move of one cell's ratio under ±15% step time is {shift[CAPACITY]:.3f} capacity-anchored and "
            f"{shift[FIXED]:.3f} at a fixed rate; better than vLLM alone (< 0.99) in "
            f"{wins[CAPACITY]}/{tot[CAPACITY]} capacity-anchored and {wins[FIXED]}/{tot[FIXED]} fixed-rate runs."
        )
    return out


def render(rows: Sequence[Row], args: argparse.Namespace, wall: float, command: str) -> str:
    value = [r for r in rows if r.study == "value twin"]
    policy = [r for r in rows if r.study == "policy experiments"]
    lines = [
        "# Error bars of the simulated headlines (issue 15, part 3)",
        "",
        f"Command: `{command}`; {wall:.0f} s wall on {args.workers} worker(s). Step time × "
        + ", ".join(f"{s:g}" for s in args.scales)
        + " (`StepTerms.step_time_scale`; the front end is not scaled). Each cell: utilisation of that "
        "scale's vLLM-alone capacity, then sagesched / vLLM alone for mean TTLT, p99 TTLT and tok/s. "
        "*Capacity-anchored*: capacity re-measured at each scale, load set as its utilisation. *Fixed "
        "rate*: scale 1.0's arrivals on the scaled engine (what a miscalibrated model does to a user); its "
        "×1 column is the capacity-anchored run.",
        "",
        "## For RESULTS.md",
        "",
        *summary_lines(rows),
        "",
        "**Reading.** A uniform step-time error with the load re-anchored to the scaled capacity only "
        "changes the unit of time, so at engine level the capacity-anchored ratios barely move (what moves "
        "them is the front end and, at the gateway, its absolute-time settings). In the value twin the "
        "request set moves too, because a different trace compression takes a different number of the "
        "trace's requests. A headline stated as a utilisation therefore survives a ±15% step-time error. "
        "The error a user meets is the fixed-rate one: the same arrival rate is a different utilisation "
        "on a mis-modelled engine, and near the knee (memory-bound, utilisation 0.8–1.1) this moves "
        "sagesched's engine-level ratio by up to the figure above.",
        "",
    ]
    if value:
        lines += [
            f"## Value twin (gateway sagesched vs vLLM alone, {args.model}/{args.gpu} × 2 backends, "
            f"{args.minutes:g} min of Azure conversation arrivals, predictor {args.predictor})",
            "",
            "Capacity (req/s, vLLM alone, per scale): "
            + ", ".join(
                f"×{r.scale:g} {r.capacity_req_s:.2f}"
                for r in value
                if r.case == "light load" and r.view == CAPACITY
            ),
            "",
            *table(value, args.scales),
            "",
        ]
    if policy:
        lines += [
            f"## Policy-experiment headline (sagesched, noisy oracle 20%, vs vLLM alone; {args.requests} "
            "requests a workload)",
            "",
            *table(policy, args.scales),
            "",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=lambda s: tuple(float(x) for x in s.split(",")), default=SCALES)
    ap.add_argument("--minutes", type=float, default=10.0, help="value twin: minutes of arrivals")
    ap.add_argument("--light-util", type=float, default=0.5)
    ap.add_argument("--high-util", type=float, default=1.7)
    ap.add_argument("--model", default="qwen3-32b", help="value twin's model")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--predictor", default="length-bucket", help="value twin's gateway predictor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-wait-s",
        type=float,
        default=None,
        help="value twin: the gateway's queue timeout in engine seconds (the demo's: 30); default none",
    )
    ap.add_argument("--requests", type=int, default=800, help="policy experiments: requests a workload")
    ap.add_argument(
        "--loads", type=lambda s: tuple(float(x) for x in s.split(",")), default=(0.5, 0.8, 0.95, 1.1)
    )
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument(
        "--quick", action="store_true", help="policy experiments on azure-code and azure-conv only"
    )
    ap.add_argument("--skip", choices=("value", "policy"), default=None, help="leave one study out")
    ap.add_argument("--out", type=Path, default=Path("docs/experiments/error_bars.md"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if 1.0 not in args.scales:
        ap.error("--scales must include 1.0 (the nominal model)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    command = " ".join(
        [".venv/bin/python", "-m", "benchmarks", "error_bars", *(sys.argv[1:] if argv is None else argv)]
    )
    t0 = time.perf_counter()
    rows: list[Row] = []
    if args.skip != "value":
        rows += value_rows(args)
    if args.skip != "policy":
        rows += policy_rows(args)
    report = render(rows, args, time.perf_counter() - t0, command)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
