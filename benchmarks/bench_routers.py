"""The live side-by-side of three fronts on prefix-sharing work: aiperf (the neutral client) replays a
workload on its fixed schedule through

* ``rr``: vllm-router 0.1.17 ``--policy round_robin`` (vLLM behind a plain balancer),
* ``cache_aware``: vllm-router ``--policy cache_aware`` with its defaults (the cache-aware router a
  latency-minded user already runs),
* ``sagegate``: the gateway (``sagesched``, the semantic predictor, cache-aware placement; ``sg_default``:
  the product's default predictor, ``prefix``), with ``cap_at_max_tokens`` off and no queue timeout
  (``live_fronts.GATEWAY_ENV``: aiperf sends the true output length as ``max_completion_tokens``),

each in front of two fresh simulated backends (``sagegate backend``, Llama-3.1-8B/H100, prefix caching
on, time scale T; fresh per run, so no cache carries over).

Workloads (``bench_locality.builder`` builds both, as the simulated comparison does):

* ``shared-prefix``: llm-d's precise-prefix shape (150 groups x 5 prompts, a system prompt of 12 blocks
  = 6,144 tokens, a 1,200-token question, 1,000 tokens out), written in Mooncake format: each group's
  whole 512-token system blocks share hash ids, the rest of a prompt has ids of its own (aiperf
  synthesises one text per id, so the groups really share their prefix; only a prompt's last block is
  partial, and it is unique, as aiperf requires).
* ``shared-task``: the same prompts, output length following the task (each system prompt its own
  typical length, log-uniform 16-1,024 tokens, each request a lognormal draw around it, sigma 0.5;
  ``loadgen.synthetic.task_outputs``): what a predictor keyed on the prompt's start can learn.
* ``sessions``: multi-turn ShareGPT conversations (``--sessions`` of them, those a shipped predictor part
  learned from left out), each turn its whole history and the real reply's length, sessions arriving
  on a Poisson process, the next turn after the reply's reading time and a think time (mean
  ``--think-s``). Each turn is one Mooncake row carrying its full chat history as ``messages`` (real
  text, real assistant replies) at its own timestamp: aiperf sends it verbatim at that time
  (open-loop, as the reader's times are; a turn does not wait for the previous reply). The
  arrivals are cut at ``--horizon-s`` engine seconds: with a 10 s think time only a few thousand
  concurrent sessions load two engines, so a run replays the first minute of such a population.

Loads are utilisation of vLLM-behind-round-robin's capacity on the workload's mix
(``harness.simtwin.capacity``: the whole mix released in a one-second burst through two simulated
engines behind round robin, completions read between their 10th and 90th percentile), the offered
rate read over the first 90% of arrivals and found by bisection (``simtwin.bulk_rate``).
Latencies are engine seconds (wall x T). Throughput: output tokens a second between the 10th and the
90th percentile of completions (the loaded window) and over the makespan (the schedule's start to the
last completion). Prefix hit rate: the backends' ``vllm:prefix_cache_hits_total`` over
``queries_total``, deltas over the run (after the warm-up requests).

    .venv/bin/python -m benchmarks bench_routers --peers /tmp/peers --out /tmp/routers
        [--workloads shared-prefix,sessions] [--loads 0.5,1.0,1.3] [--fronts rr,cache_aware,sagegate]
        [--groups 150 --per-group 5] [--sessions 3000 --horizon-s 60]
        [--time-scale shared-prefix=0.5,sessions=0.1]

Under ``--out``: per workload, load and front the aiperf artefacts, ``records.jsonl`` (one line per
request of the workload: its row, what was sent, what came back, engine seconds) and ``run.json``; at
the top ``summary.json`` (every figure) and ``tables.md`` (what is printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from benchmarks.bench_locality import SHARED, builder
from benchmarks.live_fronts import (
    BLOCK,
    FRONTS,
    GATEWAYS,
    aiperf_profile,
    fronted,
    stop_on_sigterm,
    warm,
    write_jsonl,
)
from sagegate.core.request import TraceRequest
from sagegate.core.summary import loaded_throughput
from sagegate.harness.live import backend_counters
from sagegate.harness.simtwin import bulk_rate

REPO = Path(__file__).resolve().parents[1]

WORKLOADS = ("shared-prefix", "shared-task", "sessions")
DEFAULT_T = "shared-prefix=0.5,shared-task=0.5,sessions=0.1"
"""Engine seconds per wall second. One chunk a token streams through the front and aiperf, and the
gateway embeds every prompt: T keeps load 1.0 near 1,500-2,000 chunks and 3-10 requests a wall second
(round robin's capacity is ~3,100 output tok/s on shared-prefix, ~19,000 on a sessions window), which
two shared cores carry (measured: the gateway at ~25% of a core at sessions load 0.5, T = 0.1). A
smaller T also shrinks what a busy machine's delays cost in engine time."""


# --- the workloads ----------------------------------------------------------------------------------
def workload_builder(name: str, args: argparse.Namespace) -> Callable[[float], list[TraceRequest]]:
    """``build(scale)``: the workload at ``scale`` (bench_locality's builder; sessions cut at the horizon)."""
    ns = argparse.Namespace(**{**vars(args), "workload": name})
    build = builder(ns)
    if name != "sessions" or args.horizon_s <= 0:
        return build

    def cut(scale: float) -> list[TraceRequest]:
        work = build(scale)
        t0 = work[0].arrival_s
        return [r for r in work if r.arrival_s - t0 <= args.horizon_s]

    return cut


CAPACITY_MIN = 700
"""Requests the capacity is measured on at least: a smaller burst finishes nearly all at once (every
request runs from the start) and reads high."""


def workload_mix(name: str, args: argparse.Namespace) -> list[TraceRequest]:
    """The request mix a run sends, to measure capacity on (``simtwin.capacity`` releases it in one
    burst). Shared-prefix sends the same requests at every rate; a run of fewer than
    :data:`CAPACITY_MIN` requests is measured on the same shape with more groups. A sessions window does
    not hold the population's mix (its first minute has more first turns, so shorter prompts): the mix is
    the window at utilisation 1.0 of the whole population's capacity; it is nearly the same at any rate
    (which turns a window holds depends on the time since the start, not on the rate)."""
    from sagegate.harness.simtwin import capacity, scale_at

    if name in SHARED:
        groups = max(args.groups, math.ceil(CAPACITY_MIN / args.per_group))
        return builder(argparse.Namespace(**{**vars(args), "workload": name, "groups": groups}))(1.0)
    whole = builder(argparse.Namespace(**{**vars(args), "workload": name}))(1.0)
    if args.horizon_s <= 0:
        return whole
    cap = capacity(whole, model=args.model, gpu=args.gpu)
    build = workload_builder(name, args)
    mix = build(scale_at(lambda x: bulk_rate(build(x)), cap["req_s"], highest=1000.0))
    if len(mix) < CAPACITY_MIN:
        print(
            f"  WARNING: capacity measured on {len(mix)} requests (a longer --horizon-s has more)", flush=True
        )
    return mix


def mooncake_rows(work: Sequence[TraceRequest], name: str, system_tokens: int) -> list[dict[str, Any]]:
    """aiperf's Mooncake rows (timestamps in engine ms from the first arrival): shared-prefix as
    ``input_length`` + ``hash_ids`` (a group's whole system blocks shared), sessions as ``messages``."""
    t0 = work[0].arrival_s
    shared = system_tokens // BLOCK
    groups = {int(r.extra["group"]) for r in work} if name in SHARED else {0}  # type: ignore[call-overload]
    fresh = (1 + max(groups)) * shared
    rows = []
    for r in work:
        row: dict[str, Any] = {"timestamp": (r.arrival_s - t0) * 1000.0}
        if name in SHARED:
            g = int(r.extra["group"])  # type: ignore[call-overload]
            n = math.ceil(r.prompt_tokens / BLOCK)
            if n <= shared:
                raise ValueError(
                    "the question must be at least one token: only the last block may be partial"
                )
            ids = [g * shared + j for j in range(shared)] + list(range(fresh, fresh + n - shared))
            fresh += n - shared
            row |= {"input_length": r.prompt_tokens, "hash_ids": ids}
        else:
            row["messages"] = r.extra["messages"]
        row["output_length"] = r.output_tokens
        rows.append(row)
    return rows


def describe(r: TraceRequest, i: int, t0: float) -> dict[str, Any]:
    """What a record of request ``i`` is checked against."""
    keep = {k: v for k, v in r.extra.items() if k in ("group", "session", "turn")}
    return {
        "row": i,
        "arrival_s": r.arrival_s - t0,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        **keep,
    }


# --- one run ----------------------------------------------------------------------------------------
def read_records(art: Path, work: Sequence[dict[str, Any]], T: float) -> list[dict[str, Any]]:
    """aiperf's per-request records joined to the workload's rows (its ``session_num`` is the row: one
    conversation a Mooncake row, in file order), engine seconds; a row with no record is ``lost``."""
    by_row: dict[int, dict[str, Any]] = {}
    lines = (art / "profile_export.jsonl").read_text().splitlines()
    for line in (json.loads(x) for x in lines if x.strip()):
        md, m = line.get("metadata", {}), line.get("metrics", {})
        if md.get("benchmark_phase", "profiling") != "profiling":
            continue

        def val(key: str, m: dict[str, Any] = m) -> float | None:
            v = m.get(key, {}).get("value")
            return None if v is None else float(v)

        err = line.get("error")
        out = val("usage_completion_tokens")
        by_row[int(md["session_num"])] = {
            "start_ns": md.get("request_start_ns"),
            "end_ns": md.get("request_end_ns"),
            "error": None if not err else (err.get("message") or err.get("type") or str(err))[:300],
            "cancelled": bool(md.get("was_cancelled")),
            "ttft_s": None if val("time_to_first_token") is None else val("time_to_first_token") / 1000.0 * T,  # type: ignore[operator]
            "ttlt_s": None if val("request_latency") is None else val("request_latency") / 1000.0 * T,  # type: ignore[operator]
            "sent_output_tokens": out if out is not None else val("output_token_count"),
            "sent_prompt_tokens": val("usage_prompt_tokens"),
        }
    # the schedule's zero: where the least-late request would have left on time (wall ns)
    zero = min(
        (
            rec["start_ns"] - w["arrival_s"] / T * 1e9
            for w in work
            if (rec := by_row.get(w["row"])) and rec["start_ns"]
        ),
        default=0.0,
    )
    records = []
    for w in work:
        rec = by_row.get(w["row"])
        if rec is None:
            records.append({**w, "status": "lost"})
            continue
        ok = rec["error"] is None and not rec["cancelled"] and rec["ttlt_s"] is not None
        short = ok and (rec["sent_output_tokens"] or 0) < w["output_tokens"]
        start, end = rec.pop("start_ns"), rec.pop("end_ns")
        records.append(
            {
                **w,
                **rec,
                "status": "error" if not ok else ("short" if short else "ok"),
                "start_s": None if start is None else (start - zero) / 1e9 * T,
                "finish_s": None if end is None else (end - zero) / 1e9 * T,
                "send_lag_s": None if start is None else (start - zero) / 1e9 * T - w["arrival_s"],
            }
        )
    return records


def pct(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def figures(records: Sequence[dict[str, Any]], deltas: Sequence[dict[str, float]]) -> dict[str, float]:
    """One front's figures over a run (engine seconds)."""
    import numpy as np

    ok = [r for r in records if r["status"] == "ok"]
    fig: dict[str, float] = {
        "requests": len(records),
        "completed": len(ok),
        "errors": sum(r["status"] == "error" for r in records),
        "short": sum(r["status"] == "short" for r in records),
        "lost": sum(r["status"] == "lost" for r in records),
    }
    for key in ("ttft", "ttlt"):
        vals = [r[f"{key}_s"] for r in ok]
        fig[f"{key}_mean_s"] = float(np.mean(vals)) if vals else float("nan")
        for q in (50, 90, 99):
            fig[f"{key}_p{q}_s"] = pct(vals, q)
    done = [
        SimpleNamespace(status="ok", finish_s=r["finish_s"], output_tokens=r["sent_output_tokens"])
        for r in ok
    ]
    fig["loaded_tok_s"] = loaded_throughput(done)
    span = max((r["finish_s"] for r in ok), default=float("nan"))
    fig["makespan_s"] = span
    fig["makespan_tok_s"] = sum(r["sent_output_tokens"] for r in ok) / span if ok else float("nan")
    queries = sum(d["prefix_queries"] for d in deltas)
    fig["prefix_hit_rate"] = sum(d["prefix_hits"] for d in deltas) / queries if queries else float("nan")
    fig["preemptions"] = sum(d["preemptions"] for d in deltas)
    prompts = [d["prompt_tokens"] for d in deltas]
    fig["backend_prompt_share_max"] = max(prompts) / sum(prompts) if sum(prompts) else float("nan")
    lags = [r["send_lag_s"] for r in records if r.get("send_lag_s") is not None]
    fig["send_lag_p50_s"], fig["send_lag_p99_s"] = pct(lags, 50), pct(lags, 99)
    # the join's check: the prompt the backend counted against the row's (a wrong join shows here)
    sent = [(r["sent_prompt_tokens"], r["prompt_tokens"]) for r in ok if r.get("sent_prompt_tokens")]
    fig["prompt_mismatch"] = sum(abs(a - b) > 0.05 * b + 16 for a, b in sent)
    return fig


def run_front(
    front: str, cell: Path, trace: Path, work: Sequence[dict[str, Any]], args: argparse.Namespace, T: float
) -> dict[str, Any]:
    out = cell / front
    out.mkdir(parents=True, exist_ok=True)
    load_before, t_start = os.getloadavg(), time.monotonic()
    with fronted(front, args.peers, out, model=args.model, gpu=args.gpu, time_scale=T) as (url, bes):
        warm(url, bes)
        before = backend_counters(bes)
        rc, art = aiperf_profile(
            args.peers, url, trace, out, model=args.model, tokenizer=args.aiperf_tokenizer
        )
        after = backend_counters(bes)
        own = ""
        if front in GATEWAYS:  # the gateway's own account (placements, holds, late predictions)
            own = httpx.get(url + "/metrics", timeout=10).text
            (out / "gateway_metrics.txt").write_text(own)
    deltas = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    records = read_records(art, work, T)
    with (out / "records.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps({"front": front, **r}) + "\n")
    fig = figures(records, deltas)
    for what in ("ttft", "ttlt"):  # the placement's forecast against the outcome, as the gateway judged it
        fig[f"forecast_error_{what}"] = gauge(own, f'sagegate_forecast_median_error{{what="{what}"}}')
    agg = json.loads((art / "profile_export_aiperf.json").read_text())
    fig["aiperf_lag_p99_s"] = float(agg.get("replay_sched_lag_p99", {}).get("avg", float("nan"))) / 1000.0 * T
    fig["aiperf_rc"] = rc
    run = {
        "front": front,
        "figures": fig,
        "backends_delta": deltas,
        "wall_s": time.monotonic() - t_start,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    (out / "run.json").write_text(json.dumps(run, indent=1))
    short = {
        k: round(fig[k], 3)
        for k in ("completed", "errors", "lost", "ttft_mean_s", "ttlt_mean_s", "prefix_hit_rate")
    }
    print(f"  {front}: {json.dumps(short)}, wall {run['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return run


def gauge(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels) in a Prometheus text page; NaN if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


# --- the table --------------------------------------------------------------------------------------
ROWS = (
    ("requests", "requests", "{:.0f}", False),
    ("completed", "completed", "{:.0f}", False),
    ("errors", "errors / short / lost", None, False),
    ("ttft_mean_s", "TTFT mean (s)", "{:.2f}", True),
    ("ttft_p50_s", "TTFT p50", "{:.2f}", True),
    ("ttft_p90_s", "TTFT p90", "{:.2f}", True),
    ("ttft_p99_s", "TTFT p99", "{:.2f}", True),
    ("ttlt_mean_s", "TTLT mean (s)", "{:.2f}", True),
    ("ttlt_p50_s", "TTLT p50", "{:.2f}", True),
    ("ttlt_p90_s", "TTLT p90", "{:.2f}", True),
    ("ttlt_p99_s", "TTLT p99", "{:.2f}", True),
    ("loaded_tok_s", "output tok/s, loaded window", "{:.0f}", True),
    ("makespan_tok_s", "output tok/s, makespan", "{:.0f}", True),
    ("prefix_hit_rate", "prefix hit rate (backends)", "{:.3f}", True),
    ("preemptions", "preemptions (backends)", "{:.0f}", False),
    ("backend_prompt_share_max", "busier backend's share of prompt tokens", "{:.2f}", False),
    ("send_lag_p99_s", "aiperf send lag p99 (s)", "{:.2f}", False),
    ("forecast_error_ttft", "gateway's forecast, median error: TTFT", "{:.2f}", False),
    ("forecast_error_ttlt", "gateway's forecast, median error: TTLT", "{:.2f}", False),
)
RATIOS = (("cache_aware", "rr"),)
"""Ratios beside every gateway front's own ÷ ``cache_aware`` and ÷ ``rr`` (those that ran)."""


def table(runs: dict[str, dict[str, Any]]) -> str:
    fronts = [f for f in FRONTS if f in runs]
    pairs = [(g, base) for base in ("cache_aware", "rr") for g in fronts if g in GATEWAYS] + list(RATIOS)
    ratios = [(a, b) for a, b in pairs if a in runs and b in runs]
    heads = fronts + [f"{a} ÷ {b}" for a, b in ratios]
    lines = ["| metric (engine time) | " + " | ".join(heads) + " |", "|---" + "|---:" * len(heads) + "|"]
    for key, label, fmt, ratio in ROWS:
        figs = {f: runs[f]["figures"] for f in fronts}
        if fmt is None:
            cells = [f"{x['errors']:.0f} / {x['short']:.0f} / {x['lost']:.0f}" for x in figs.values()]
        else:
            cells = [fmt.format(x.get(key, float("nan"))) for x in figs.values()]
        for a, b in ratios:
            num, den = figs[a].get(key, float("nan")), figs[b].get(key, float("nan"))
            cells.append(f"{num / den:.2f}" if ratio and den and not math.isnan(den) else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    loads = [f"{runs[f]['loadavg_before'][0]:.1f}→{runs[f]['loadavg_after'][0]:.1f}" for f in fronts]
    lines.append("| load average (1 min), before→after | " + " | ".join(loads) + " |" + " |" * len(ratios))
    return "\n".join(lines)


def prepare_cell(
    name: str, load: float, build: Callable[[float], list[TraceRequest]], cap_req_s: float, T: float,
    args: argparse.Namespace,
) -> tuple[Path, Path, list[dict[str, Any]], dict[str, Any], list[TraceRequest]]:  # fmt: skip
    """The workload at ``load`` x round robin's capacity: its cell folder, its aiperf trace (wall ms),
    its rows, what it is, and its requests."""
    from sagegate.harness.simtwin import capacity, scale_at

    scale = scale_at(lambda x: bulk_rate(build(x)), load * cap_req_s, highest=1000.0)
    reqs = build(scale)
    t0 = reqs[0].arrival_s
    work = [describe(r, i, t0) for i, r in enumerate(reqs)]
    cell = args.out / name / f"load{load:g}"
    cell.mkdir(parents=True, exist_ok=True)
    trace = write_jsonl(mooncake_rows(reqs, name, args.system_tokens), cell / "trace_aiperf.jsonl", T)
    (cell / "workload.jsonl").write_text("".join(json.dumps(w) + "\n" for w in work))
    own = capacity(reqs, model=args.model, gpu=args.gpu)["req_s"] if len(reqs) >= CAPACITY_MIN else math.nan
    util, span = bulk_rate(reqs) / cap_req_s, reqs[-1].arrival_s - t0
    info: dict[str, Any] = {
        "target": load, "utilisation": util, "utilisation_own_mix": bulk_rate(reqs) / own,
        "requests": len(reqs), "span_s": span, "scale": scale,
        "mean_prompt": sum(r.prompt_tokens for r in reqs) / len(reqs),
        "mean_output": sum(r.output_tokens for r in reqs) / len(reqs),
        "output_tokens": sum(r.output_tokens for r in reqs),
    }  # fmt: skip
    info["line"] = (
        f"{name}, utilisation {util:.2f} (target {load:g}; {info['utilisation_own_mix']:.2f} of the capacity "
        f"on this cell's own mix): {len(reqs)} requests over {span:.0f} engine s (~{span / T / 60:.1f} min "
        f"wall of arrivals), mean prompt {info['mean_prompt']:.0f}, output {info['mean_output']:.0f}"
    )
    print("\n" + info["line"], flush=True)
    if abs(util / load - 1) > 0.05:
        print(f"  WARNING: the workload reaches utilisation {util:.2f}, not {load:g}", flush=True)
    return cell, trace, work, info, reqs


SIMULATED = {"rr": (None, None), "sg_placement": ("fcfs", "cache_aware"), "sagegate": ("sagesched", None)}
"""The set-ups the simulator runs beside the live cell: (gateway policy, placement), None = default."""


def simulated(reqs: Sequence[TraceRequest], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The cell in the simulator with the live fronts' settings (semantic predictor, no queue timeout)."""
    from sagegate.core.summary import summarize
    from sagegate.harness.simtwin import simulate_run

    out = {}
    for front, (policy, placement) in SIMULATED.items():
        res = simulate_run(reqs, policy, model=args.model, gpu=args.gpu, predictor="semantic",
                           seed=args.seed, placement=placement, max_wait_s=1e9)  # fmt: skip
        s = summarize(res.records)
        keys = ("ttft_mean_s", "ttft_p90_s", "ttlt_mean_s", "ttlt_p99_s", "loaded_tok_s", "prefix_hit_rate")
        out[front] = {k: round(float(s.get(k, 0.0)), 4) for k in keys} | {"preemptions": s["preemptions"]}
    return out


def parse_time_scales(spec: str) -> dict[str, float]:
    if "=" not in spec:
        return dict.fromkeys(WORKLOADS, float(spec))
    out = dict(kv.split("=", 1) for kv in spec.split(","))
    return {k: float(v) for k, v in out.items()}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=Path, required=True, help="Folder laid out by shared/peers/install.sh.")
    p.add_argument("--out", type=Path, default=Path("/tmp/routers"))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--loads", default="0.5,1.0,1.3", help="Utilisations of round robin's capacity.")
    p.add_argument("--fronts", default=",".join(FRONTS), help=f"Of {', '.join(FRONTS)}.")
    p.add_argument("--time-scale", default=DEFAULT_T, help="T (one for all) or WORKLOAD=T pairs.")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--groups", type=int, default=150)
    p.add_argument("--per-group", type=int, default=5)
    p.add_argument("--system-tokens", type=int, default=12 * BLOCK, help="Whole 512-token blocks are shared.")
    p.add_argument("--question-tokens", type=int, default=1200)
    p.add_argument("--output-tokens", type=int, default=1000)
    p.add_argument("--sessions", type=int, default=3000, help="Conversations in the population.")
    p.add_argument("--think-s", type=float, default=10.0)
    p.add_argument(
        "--horizon-s", type=float, default=60.0, help="Sessions: arrivals within this many engine s (0: all)."
    )
    p.add_argument("--data", default=os.environ.get("SAGEGATE_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument(
        "--aiperf-tokenizer",
        default="local/cl100k",
        help="aiperf's tokenizer (the peers' fake HF cache): cl100k, the backends' own count, so a hash "
        "block is 512 of their tokens; builtin is o200k.",
    )
    p.add_argument("--plan", action="store_true", help="Build and write the cells' traces, run nothing live.")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="Also run each cell through the simulator (round robin, placement alone, the gateway's "
        "defaults) and print live ÷ simulated beside it: the twin's check on the very requests.",
    )
    args = p.parse_args(argv)
    stop_on_sigterm()
    args.peers, args.out = args.peers.resolve(), args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    scales = parse_time_scales(args.time_scale)
    fronts = [f for f in args.fronts.split(",") if f]
    if bad := [f for f in fronts if f not in FRONTS] + [
        w for w in args.workloads.split(",") if w not in WORKLOADS
    ]:
        p.error(f"unknown front or workload: {bad}")
    if args.system_tokens % BLOCK:
        print(
            f"note: only the system prompt's whole blocks ({args.system_tokens // BLOCK * BLOCK} tokens) are shared live",
            file=sys.stderr,
        )

    from sagegate.harness.simtwin import capacity

    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "workloads": {}}
    md: list[str] = []
    for name in args.workloads.split(","):
        T = scales[name]
        build = workload_builder(name, args)
        mix = workload_mix(name, args)
        cap = capacity(mix, model=args.model, gpu=args.gpu)
        head = (f"{name}: round robin's capacity {cap['req_s']:.2f} req/s ({cap['tok_s']:.0f} output tok/s) on two "
                f"{args.model}/{args.gpu} (simtwin.capacity on {len(mix)} requests of its mix); T = {T:g}")  # fmt: skip
        print(head, flush=True)
        md += [f"## {head}", ""]
        cells: dict[str, Any] = {}
        summary["workloads"][name] = {"capacity": cap, "time_scale": T, "head": head, "cells": cells}
        for load in (float(x) for x in args.loads.split(",")):
            cell, trace, work, info, reqs = prepare_cell(name, load, build, cap["req_s"], T, args)
            md += [info["line"], ""]
            sim = simulated(reqs, args) if args.simulate else {}
            if sim:
                print("  simulated: " + json.dumps(sim), flush=True)
                md += ["simulated: " + json.dumps(sim), ""]
            if args.plan:
                cells[f"{load:g}"] = {"load": info, "simulated": sim}
                continue
            runs = {f: run_front(f, cell, trace, work, args, T) for f in fronts}
            tab = table(runs)
            print(tab, flush=True)
            md += [tab, ""]
            cells[f"{load:g}"] = {"load": info, "runs": runs, "simulated": sim}
            (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
            (args.out / "tables.md").write_text("\n".join(md) + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "tables.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
