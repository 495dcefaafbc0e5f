"""Issue 17 part 1: engine-level preemption that pays, against the published baselines.

Engine level (no gateway), noisy-oracle predictions at 20% error, two workloads:

* ``mooncake``: the Mooncake synthetic trace (long prompts, shared prefixes), two H100 engines
  serving Llama-3.1-8B;
* ``azure-conv``: the Azure 2023 conversation trace in the memory-bound set-up (one H100 serving
  Qwen3-32B, ~37k KV tokens), requests 2000.. as in ``benchmarks/policy_experiments.py``.

Loads: utilisation 0.5 / 0.9 / 1.1 of vLLM alone's capacity as ``harness.simtwin.capacity``
measures it (saturated, 10th–90th percentile of completions). Policies: ``fcfs`` (vLLM alone),
``trail``, ``ssjf``, ``fastserve``, ``sagesched:preempt_pays=false`` (before: preempt whenever the
rank says so) and ``sagesched`` (after: only when the gain exceeds the recompute cost). Every figure
is printed as a ratio to ``fcfs`` on the same workload and load.

    .venv/bin/python -m benchmarks engine_preemption [--requests 800] [--workers 2] [--md out.md]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from sagegate.core.request import TraceRequest, answer_key
from sagegate.loadgen.data import data_root
from sagegate.loadgen.records import rebase, scale_rate

LOADS = (0.5, 0.9, 1.1)
BEFORE = "sagesched:preempt_pays=false"
POLICIES = ("fcfs", "trail", "ssjf", "fastserve", BEFORE, "sagesched")
RIVALS = ("trail", "ssjf", "fastserve")
ERROR = 0.2


@dataclass(frozen=True)
class Setup:
    model: str
    gpu: str
    engines: int


SETUPS = {
    "mooncake": Setup("llama-3.1-8b", "h100", 2),
    "azure-conv": Setup("qwen3-32b", "h100", 1),
}
SETUPS_BY_NAME = {**SETUPS, "sharegpt": Setup("llama-3.1-8b", "h100", 1)}
"""Every workload ``load_workload`` knows, with the engines it runs on (``sharegpt``: the pause study's)."""


def load_workload(name: str, n: int) -> list[TraceRequest]:
    """``mooncake`` (the synthetic trace's first ``n``), ``azure-conv`` (the conversation trace's
    requests 2000.., as ``policy_experiments.py``) or ``sharegpt`` (ShareGPT pairs on those arrivals)."""
    from sagegate.loadgen.readers import read_trace

    data = data_root()
    if name == "mooncake":
        return rebase(read_trace(data / "mooncake" / "synthetic_trace.jsonl")[:n])
    conv = rebase(read_trace(data / "azure2023" / "AzureLLMInferenceTrace_conv.csv")[2000 : 2000 + n])
    if name == "azure-conv":
        return conv
    pairs = read_trace(
        data / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz",
        arrivals_from=[r.arrival_s for r in conv],
        limit=n,
    )
    return rebase(pairs[:n])


def run_one(
    work: list[TraceRequest], setup: Setup, policy: str, step_time_scale: float | None = None
) -> dict[str, float]:
    from sagegate.harness.simtwin import perf_and_engine
    from sagegate.policies.capabilities import Capability
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.des import SimSetup, client_view, simulate

    perf, engine = perf_and_engine(setup.model, setup.gpu, step_time_scale)
    pol = parse_policy(policy)
    pred = None
    if Capability.USES_PREDICTION in pol.capabilities:
        pred = make_predictor("noisy-oracle", relative_error=ERROR, seed=0, truth=answer_key(work))
    res = simulate(
        work, SimSetup(perf, engine, engines=setup.engines, level="engine", policy=pol, predictor=pred)
    )
    client_view(res, perf.frontend_s)
    s = dict(res.summary)
    s["preemptions"] = float(sum(res.engine_preemptions))
    s["recomputed_tokens"] = float(sum(getattr(res, "engine_recomputed_tokens", [0])))
    return s


Job = tuple[str, float, str, list[TraceRequest], float | None]


def _job(args: Job) -> tuple[tuple[str, float, str], dict[str, float]]:
    wname, load, policy, work, scale = args
    return (wname, load, policy), run_one(work, SETUPS[wname], policy, scale)


def at_loads(
    names: Sequence[str], n: int, loads: Sequence[float], step_time_scale: float | None = None
) -> tuple[list[tuple[str, float, list[TraceRequest]]], dict[str, float]]:
    """Each workload of ``names`` (``n`` requests) compressed to each of ``loads`` × vLLM alone's
    measured capacity on it (``harness.simtwin.capacity``, on the engine ``step_time_scale``
    stretches), and those capacities (req/s)."""
    from sagegate.harness.simtwin import capacity

    out: list[tuple[str, float, list[TraceRequest]]] = []
    caps: dict[str, float] = {}
    for wname in names:
        setup = SETUPS_BY_NAME[wname]
        work = load_workload(wname, n)
        caps[wname] = capacity(
            work, model=setup.model, gpu=setup.gpu, engines=setup.engines, step_time_scale=step_time_scale
        )["req_s"]
        rate = len(work) / max(work[-1].arrival_s - work[0].arrival_s, 1e-9)
        out += [(wname, load, scale_rate(work, load * caps[wname] / rate)) for load in loads]
    return out, caps


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def render(results: dict[tuple[str, float, str], dict[str, float]], caps: dict[str, float], cmd: str) -> str:
    lines = [
        f"Command: `{cmd}`",
        "",
        "Engine level, noisy-oracle at 20% error; ratios to `fcfs` (vLLM alone) on the same workload and "
        "load (mean TTLT, p99 TTLT, throughput); preemptions and recomputed tokens are counts. Capacity "
        "(vLLM alone, req/s): " + ", ".join(f"{w} {c:.3f}" for w, c in caps.items()),
        "",
    ]
    for wname in SETUPS:
        lines += [
            f"### {wname}",
            "",
            "| load | policy | mean TTLT | p99 TTLT | throughput | preemptions | recomputed tokens |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for load in LOADS:
            base = results[(wname, load, "fcfs")]
            for pol in POLICIES:
                r = results[(wname, load, pol)]
                name = (
                    "sagesched (before)"
                    if pol == BEFORE
                    else ("**sagesched (after)**" if pol == "sagesched" else pol)
                )
                lines.append(
                    f"| {load} | {name} | {ratio(r['ttlt_mean_s'], base['ttlt_mean_s']):.3f} | "
                    f"{ratio(r['ttlt_p99_s'], base['ttlt_p99_s']):.3f} | "
                    f"{ratio(r['throughput_tok_s'], base['throughput_tok_s']):.3f} | "
                    f"{r['preemptions']:.0f} | {r['recomputed_tokens']:.0f} |"
                )
        lines.append("")
    lines += [
        "### Targets (mean TTLT)",
        "",
        "| workload | load | sagesched / fcfs (≤ 0.75 at 0.9, ≤ 1.02 everywhere) | best rival / fcfs "
        "| sagesched / best rival (≤ 0.9) | before / fcfs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for wname in SETUPS:
        for load in LOADS:
            base = results[(wname, load, "fcfs")]["ttlt_mean_s"]
            sage = results[(wname, load, "sagesched")]["ttlt_mean_s"]
            before = results[(wname, load, BEFORE)]["ttlt_mean_s"]
            rival, best = min(
                ((p, results[(wname, load, p)]["ttlt_mean_s"]) for p in RIVALS), key=lambda x: x[1]
            )
            lines.append(
                f"| {wname} | {load} | {sage / base:.3f} | {rival} {best / base:.3f} | "
                f"{sage / best:.3f} | {before / base:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--md", default=None, help="also write the tables to this file")
    ap.add_argument(
        "--step-time-scale",
        type=float,
        default=None,
        help="stretch every engine step (the ±15%% error bars: 0.85, 1.15); loads stay utilisations of "
        "the scaled engine's own capacity",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    loaded, caps = at_loads(list(SETUPS), args.requests, LOADS, args.step_time_scale)
    jobs: list[Job] = [
        (wname, load, pol, timed, args.step_time_scale) for wname, load, timed in loaded for pol in POLICIES
    ]
    results: dict[tuple[str, float, str], dict[str, float]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for key, summary in pool.map(_job, jobs):
            results[key] = summary
            print(
                f"  {key}: mean TTLT {summary['ttlt_mean_s']:.2f} s, {summary['preemptions']:.0f} preemptions",
                flush=True,
            )
    cmd = f".venv/bin/python -m benchmarks engine_preemption --requests {args.requests}"
    if args.step_time_scale is not None:
        cmd += f" --step-time-scale {args.step_time_scale:g}"
    text = render(results, caps, cmd)
    print(text)
    print(f"{len(jobs)} runs in {time.perf_counter() - t0:.0f} s wall")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
