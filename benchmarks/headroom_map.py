"""The headroom map (issue 48): what each predictor, and each lever, buys where the gateway uses a prediction, against an oracle's ceiling.

    .venv/bin/python -m benchmarks headroom_map                       # everything below (~40 min here)
    .venv/bin/python -m benchmarks headroom_map --workloads chat --loads 1.2 --draws 2   # a corner

In the simulator, with the live gateway's settings (the demo's twin: two Qwen3-32B/H100 engines,
``sagesched`` at the gateway, its admission and queue limits, cache-aware placement), each draw of
each workload at each load runs once behind round robin (vLLM alone) and once per predictor and
lever through the gateway; every row of a cell sees the same draws. Nothing but the oracles reads
an output length: they are handed the answer key (``core.request.answer_key``) and nothing else is.

Workloads: ``chat``, the demo's multi-turn ShareGPT sessions on Azure 2023 arrivals (45 s windows);
``single``, single-turn ShareGPT pairs on the same arrivals (each prompt with its own reply's
length); ``shared``, generated shared-system-prompt traffic (RAG or agents: 40 system prompts of
~2,000 tokens, a ~200-token question each) whose output lengths vary by task: each system prompt
has its own typical length (log-uniform in 16-1,024 tokens), each request a lognormal draw around
it (sigma 0.5). Loads are offered requests per second over round robin's measured capacity on a
larger sample of the same mix.

Predictors: ``oracle`` (the true length), ``noisy-20`` and ``noisy-50`` (the oracle with that
relative error), ``semantic`` (the default), ``length-bucket``, ``global``, ``none``. Levers:
``base`` (the gateway as it is: the prediction orders the gateway's queue and sizes the admission
charge) and ``engine_rank`` (also carried into the engines as vLLM's ``priority``, the engines in
priority mode: ``policies.engine_priority``).

Per cell: mean, p50 and p99 TTLT and p50 TTFT ÷ round robin's (mean over draws, and their range),
goodput ÷ round robin's (TTFT ≤ 2 s, TPOT ≤ 100 ms), preemptions, and each row's mean TTLT ÷
``global``'s on the same draw (``global`` with the same lever): below 1, the row beats the one-line
histogram. ``--out`` gets ``headroom.json`` and ``headroom.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.core.request import TraceRequest, answer_key
from sagegate.core.summary import Slo, summarize

MODEL, GPU = "qwen3-32b", "h100"
MINUTES = 0.75
"""A draw's window (the demo's)."""
MAX_WAIT_S = 60.0
"""The live gateway's queue timeout (the demo's backends run at 1× real time)."""
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
PREDICTORS = ("oracle", "noisy-20", "noisy-50", "semantic", "prefix", "length-bucket", "global", "none")
LEVERS: dict[str, dict[str, Any]] = {
    "base": {},
    "engine_rank": {"engine_rank": True},
    "charge_q70": {"admission": {"quantile": 0.7}},
    "charge_q90": {"admission": {"quantile": 0.9}},
    "hold_deeper": {"admission": {"max_waiting_tokens": 2048}},
    "hold_shallower": {"admission": {"max_waiting_tokens": 32768}},
}
"""Each lever's settings over the gateway's defaults. ``charge_q*``: the admission charge from that
quantile of the prediction (default the median); ``hold_*``: the prompt tokens a backend may have
waiting before the gateway holds the next request (default 8,192): fewer holds more at the gateway,
where the prediction orders it, more lets the engines batch."""
DEFAULT_LEVERS = ("base", "engine_rank")
WORKLOADS = ("chat", "single", "shared")
LOADS = (0.8, 1.2, 1.7)
METRICS = ("ttlt_mean", "ttlt_p50", "ttlt_p99", "ttft_p50")


# --- the workloads ----------------------------------------------------------------------------------
def draw_chat(draw: int, target: float) -> tuple[list[TraceRequest], float]:
    from sagegate.harness.live import demo_draw

    work, info = demo_draw(draw, MINUTES, target, MODEL, GPU)
    return work, float(info["utilisation"])  # type: ignore[arg-type]


def draw_single(draw: int, target: float) -> tuple[list[TraceRequest], float]:
    from sagegate.harness.live import azure_workload
    from sagegate.harness.simtwin import scale_for, utilisation

    def build(scale: float) -> list[TraceRequest]:
        return azure_workload(MINUTES, scale, draw, quiet=True).requests

    mix = azure_workload(8.0, 4.0, draw + 1000, quiet=True).requests[:2000]
    scale, cap = scale_for(build, target, mix, model=MODEL, gpu=GPU)
    work = build(scale)
    return work, utilisation(work, cap)


def shared_prefix(rate: float, seed: int, requests: int) -> list[TraceRequest]:
    """Shared system prompts whose output length depends on the task (see the module docstring)."""
    from sagegate.loadgen.synthetic import shared_prefix_workload

    groups = 40
    per = max(1, -(-requests // groups))
    work = shared_prefix_workload(
        rate=rate, groups=groups, per_group=per, system_tokens=2000, question_tokens=200, seed=seed
    )[:requests]
    rng = np.random.default_rng(seed + 77)
    typical = np.exp(rng.uniform(math.log(16), math.log(1024), groups))
    return [
        replace(
            r, output_tokens=int(max(1, min(4096, round(typical[r.extra["group"]] * rng.lognormal(0, 0.5)))))
        )
        for r in work
    ]


def draw_shared(draw: int, target: float) -> tuple[list[TraceRequest], float]:
    from sagegate.harness.simtwin import capacity, utilisation

    cap = capacity(shared_prefix(50.0, draw + 1000, 2000), model=MODEL, gpu=GPU)
    rate = target * cap["req_s"]
    work = shared_prefix(rate, draw, int(rate * MINUTES * 60))
    return work, utilisation(work, cap)


DRAWS: dict[str, Callable[[int, float], tuple[list[TraceRequest], float]]] = {
    "chat": draw_chat,
    "single": draw_single,
    "shared": draw_shared,
}


# --- one cell ----------------------------------------------------------------------------------------
def predictor_for(name: str, work: Sequence[TraceRequest], draw: int) -> tuple[str, Any]:
    """The gateway's predictor name and, for the oracles, the predictor built with the answer key."""
    from sagegate.predictor.factory import make_predictor

    if name == "oracle":
        return "none", make_predictor("oracle", truth=answer_key(work))
    if name.startswith("noisy-"):
        err = int(name.split("-")[1]) / 100
        return "none", make_predictor("noisy-oracle", relative_error=err, seed=draw, truth=answer_key(work))
    return name, None


def figures(records: Sequence[Any]) -> dict[str, float]:
    s = summarize(records, SLO)
    return {
        "ttlt_mean": s["ttlt_mean_s"],
        "ttlt_p50": s["ttlt_p50_s"],
        "ttlt_p99": s["ttlt_p99_s"],
        "ttft_p50": s["ttft_p50_s"],
        "goodput": s.get("goodput_req_s", 0.0),
        "preemptions": s["preemptions"],
        "completed": s["completed"],
    }


def run_cell(
    workload: str, load: float, draws: int, predictors: Sequence[str], levers: Sequence[str]
) -> dict[str, Any]:
    from sagegate.harness.simtwin import simulate_run

    cell: dict[str, Any] = {"workload": workload, "load": load, "draws": [], "rows": {}}
    for draw in range(draws):
        t0 = time.time()
        work, util = DRAWS[workload](draw, load)
        rr = figures(simulate_run(work, None, model=MODEL, gpu=GPU).records)
        cell["draws"].append({"draw": draw, "requests": len(work), "utilisation": util, "rr": rr})
        for pred in predictors:
            name, override = predictor_for(pred, work, draw)
            for lever in levers:
                res = simulate_run(
                    work,
                    "sagesched",
                    model=MODEL,
                    gpu=GPU,
                    predictor=name,
                    seed=draw,
                    max_wait_s=MAX_WAIT_S,
                    predictor_override=override,
                    **LEVERS[lever],
                )
                cell["rows"].setdefault(f"{pred}|{lever}", []).append(figures(res.records))
        print(
            f"  {workload} {load:g}x draw {draw}: {len(work)} requests at {util:.2f}x ({time.time() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return cell


# --- the table ---------------------------------------------------------------------------------------
def _ratio(rows: list[dict[str, float]], base: list[dict[str, float]], key: str) -> list[float]:
    return [r[key] / b[key] if b[key] else math.nan for r, b in zip(rows, base, strict=True)]


def _cell_text(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ({min(values):.2f}–{max(values):.2f})"


def render(cell: dict[str, Any]) -> list[str]:
    rr = [d["rr"] for d in cell["draws"]]
    utils = [d["utilisation"] for d in cell["draws"]]
    lines = [
        f"### {cell['workload']} at {cell['load']:g}× ({len(rr)} draws, offered {np.mean(utils):.2f}× "
        f"capacity; round robin's mean TTLT {np.mean([r['ttlt_mean'] for r in rr]):.1f} s)",
        "",
        "| predictor | lever | TTLT mean ÷ rr | p50 ÷ rr | p99 ÷ rr | TTFT p50 ÷ rr | goodput ÷ rr | preemptions "
        "| mean TTLT ÷ global | ÷ base |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, rows in cell["rows"].items():
        pred, lever = key.split("|")
        ref = cell["rows"].get(f"global|{lever}")
        vs_global = _cell_text(_ratio(rows, ref, "ttlt_mean")) if ref else "–"
        own = cell["rows"].get(f"{pred}|base")
        vs_base = _cell_text(_ratio(rows, own, "ttlt_mean")) if own and lever != "base" else "–"
        lines.append(
            f"| {pred} | {lever} | "
            + " | ".join(_cell_text(_ratio(rows, rr, k)) for k in METRICS)
            + f" | {_cell_text(_ratio(rows, rr, 'goodput'))} | {np.mean([r['preemptions'] for r in rows]):.0f} "
            f"| {vs_global} | {vs_base} |"
        )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--loads", default=",".join(f"{x:g}" for x in LOADS))
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--predictors", default=",".join(PREDICTORS))
    ap.add_argument("--levers", default=",".join(DEFAULT_LEVERS), help=f"of {', '.join(LEVERS)}")
    ap.add_argument("--out", default="out/headroom")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = []
    for workload in a.workloads.split(","):
        for load in (float(x) for x in a.loads.split(",")):
            cells.append(run_cell(workload, load, a.draws, a.predictors.split(","), a.levers.split(",")))
            (out / "headroom.json").write_text(json.dumps(cells, indent=1))
    text = [line for cell in cells for line in render(cell)]
    (out / "headroom.md").write_text("\n".join(text))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
