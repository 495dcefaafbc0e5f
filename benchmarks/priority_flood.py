"""Priority bands under a flood: does a low band's surge move a high band's latency?

    .venv/bin/python -m benchmarks priority_flood [--draws 3] [--high 0.4] [--flood 1.2] [--reserves 0.2] [--live]

In the simulator with the live gateway's settings (the demo's twin: two Qwen3-32B/H100 engines,
``sagesched`` at the gateway with its admission and queue limits), single-turn ShareGPT requests in
the high band (``x-priority: 2``) arrive at ``--high`` × capacity, alone and then with a flood in the
default band (priority 1) at ``--flood`` × capacity on top; every row sees the same draws. Rows: the
gateway holding bands (``sagesched``), the same with the rank carried into engines in vLLM's priority
mode (``upstream.rank_priority``: the band first, so an engine also preempts the low band for the high
one), and vLLM alone behind round robin (no bands). Printed: the high band's TTFT p50 / p90 and mean
TTLT with the flood ÷ without it (1.00: the flood is not felt), and the flood's own completed share and
mean TTLT.
``--reserves``: rows with ``admission.band_reserve`` (room only a higher band may fill) at each value,
without and with the engine rank.

``--live``: the gateway rows again, for the first draw, through the real gateway (``sagegate serve``)
before two simulated backends at GPU speed (``sagegate backend``), the loader sending ``x-priority``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.headroom_map import GPU, MAX_WAIT_S, MODEL, SLO, draw_single
from sagegate.core.request import TraceRequest
from sagegate.core.summary import summarize

ROWS: dict[str, dict[str, Any] | None] = {
    "round robin (vLLM alone)": None,
    "gateway: bands": {},
    "gateway: bands + engine rank": {"engine_rank": True},
}


def workload(draw: int, high: float, flood: float) -> tuple[list[TraceRequest], set[int]]:
    """The high band's requests (priority 2) and, if ``flood``, the default band's on top."""
    ours, _ = draw_single(draw, high)
    hi = [replace(r, rid=i, priority=2) for i, r in enumerate(ours)]
    if flood <= 0:
        return hi, {r.rid for r in hi}
    theirs, _ = draw_single(draw + 500, flood)
    lo = [replace(r, rid=len(hi) + i, priority=1) for i, r in enumerate(theirs)]
    return sorted(hi + lo, key=lambda r: r.arrival_s), {r.rid for r in hi}


def band_figures(records: list[Any], rids: set[int]) -> dict[str, float]:
    s = summarize([r for r in records if r.rid in rids], SLO)
    return {"ttft_p50": s["ttft_p50_s"], "ttft_p90": s["ttft_p90_s"], "ttlt_mean": s["ttlt_mean_s"]}


def flood_figures(records: list[Any], high: set[int]) -> tuple[float, float]:
    """The flood's completed share and its mean TTLT (s): what keeping room for the high band costs it."""
    lo = [r for r in records if r.rid not in high]
    ttlt = [r.ttlt for r in lo if r.ttlt is not None]
    return len(ttlt) / max(1, len(lo)), float(np.mean(ttlt)) if ttlt else float("nan")


def live(work: list[TraceRequest], opts: dict[str, Any]) -> list[Any]:
    """``work`` through the real gateway with ``opts``' settings before two simulated backends."""
    from benchmarks.bench_value import Setup, run_live

    env = {f"SAGEGATE_ADMISSION__{k.upper()}": str(v) for k, v in (opts.get("admission") or {}).items()}
    env["SAGEGATE_QUEUE__MAX_WAIT_S"] = str(MAX_WAIT_S)  # the simulated rows' queue bound and aging
    env["SAGEGATE_RATE_LIMITS__DEFAULT__MAX_PRIORITY"] = "2"  # the high band, open to the loader
    ns = argparse.Namespace(model=MODEL, gpu=GPU, time_scale=1.0, predictor="prefix")
    return list(run_live(work, Setup("gateway", "sagesched"), ns, env)["records"])


def run(work: list[TraceRequest], opts: dict[str, Any] | None) -> list[Any]:
    from sagegate.harness.simtwin import simulate_run

    if opts is None:
        return simulate_run(work, None, model=MODEL, gpu=GPU).records
    return simulate_run(
        work, "sagesched", model=MODEL, gpu=GPU, predictor="prefix", max_wait_s=MAX_WAIT_S, **opts
    ).records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--high", type=float, default=0.4)
    ap.add_argument("--flood", type=float, default=1.2)
    ap.add_argument("--reserves", default="", help="band_reserve values to add rows for ('' for none)")
    ap.add_argument("--live", action="store_true", help="also the gateway rows live, first draw")
    a = ap.parse_args(argv)
    rows = dict(ROWS)
    for v in filter(None, a.reserves.split(",")):
        rows[f"gateway: bands + reserve {float(v):g}"] = {"admission": {"band_reserve": float(v)}}
        rows[f"… + reserve {float(v):g} + engine rank"] = {
            "admission": {"band_reserve": float(v)},
            "engine_rank": True,
        }
    ratios: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    alone_s: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    done: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    for draw in range(a.draws):
        alone, hi = workload(draw, a.high, 0.0)
        flooded, hi_f = workload(draw, a.high, a.flood)
        assert hi == hi_f
        for name, opts in rows.items():
            base = band_figures(run(alone, opts), hi)
            alone_s[name].append(base)
            recs = run(flooded, opts)
            got = band_figures(recs, hi)
            ratios[name].append({k: got[k] / base[k] for k in got})
            done[name].append(flood_figures(recs, hi))
        print(
            f"  draw {draw}: {len(hi)} high-band requests, {len(flooded) - len(hi)} in the flood",
            file=sys.stderr,
        )
    head = f"high band at {a.high:g}x capacity, flood at {a.flood:g}x; the high band's figures with the flood ÷ without"
    table(head, ratios, alone_s, done)
    if a.live:
        alone, hi = workload(0, a.high, 0.0)
        flooded, _ = workload(0, a.high, a.flood)
        for name in list(ratios):
            opts = rows[name]
            if opts is None or opts.get("engine_rank"):
                del ratios[name]  # live: the gateway rows whose engines run as they do by default
                continue
            base = band_figures(live(alone, opts), hi)
            recs = live(flooded, opts)
            got = band_figures(recs, hi)
            ratios[name], alone_s[name] = [{k: got[k] / base[k] for k in got}], [base]
            done[name] = [flood_figures(recs, hi)]
        table(f"live, draw 0: {head}", ratios, alone_s, done)
    return 0


def table(
    head: str,
    ratios: dict[str, list[dict[str, float]]],
    alone_s: dict[str, list[dict[str, float]]],
    done: dict[str, list[tuple[float, float]]],
) -> None:
    print(head)
    print(
        "| set-up | alone: TTFT p50 / p90, mean TTLT (s) | TTFT p50 | TTFT p90 | mean TTLT | the flood: completed, mean TTLT (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rs in ratios.items():
        cells = [f"{np.mean([r[k] for r in rs]):.2f} ({min(r[k] for r in rs):.2f}–{max(r[k] for r in rs):.2f})"
                 for k in ("ttft_p50", "ttft_p90", "ttlt_mean")]  # fmt: skip
        a_ = alone_s[name]
        own = " / ".join(f"{np.mean([r[k] for r in a_]):.2f}" for k in ("ttft_p50", "ttft_p90", "ttlt_mean"))
        share, ttlt = (np.mean([d[i] for d in done[name]]) for i in (0, 1))
        print(f"| {name} | {own} | " + " | ".join(cells) + f" | {share:.2f}, {ttlt:.2f} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
