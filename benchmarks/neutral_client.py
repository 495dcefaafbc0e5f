"""A neutral client (issue 12, item 6): NVIDIA's ``aiperf`` replays a Mooncake-format trace on its fixed
schedule through vLLM alone (two simulated backends behind ``vllm-router``, round robin) and through the
gateway (defaults, with ``cap_at_max_tokens`` off: aiperf sends ``max_completion_tokens`` = the trace's
output length, which would otherwise hand the gateway the answer), beside ``sagegate replay`` on the same
requests against the same two set-ups. Every run gets fresh backends (no prefix cache carries over).

The slice is the trace's first ``--limit`` requests, its timestamps stretched by ``1/--rate-scale``
(engine time); ``sagegate replay`` gets that slice with ``--time-scale T`` and aiperf the same slice with
its timestamps divided by T, so both send in wall time what the engines (running T× faster) see in engine
time. The load is quoted as utilisation of vLLM alone's capacity on this mix (``harness.simtwin``).

    .venv/bin/python -m benchmarks neutral_client --peers /tmp/peers [--limit 400] [--rate-scale 0.8]
        [--time-scale 1.5] [--out /tmp/neutral] [--runs aiperf:router,aiperf:gateway,replay:router,replay:gateway]

``--peers`` is a folder laid out by ``../shared/peers/install.sh`` with ``venv_aiperf``,
``venv_vllm_router`` and the offline tokenizers built (its README.md). Latencies are engine seconds
(wall × T); the clients' own send lag (aiperf's schedule lag, replay's send lateness) shows how
far a busy machine held them back. Raw outputs (aiperf artefacts, replay records, backend counters) stay under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.live_fronts import BLOCK, aiperf_profile, fronted, warm, write_jsonl
from sagegate.harness.live import backend_counters

REPO = Path(__file__).resolve().parents[1]

TRACE = Path("/work/shared/data/mooncake/synthetic_trace.jsonl")
RUNS = "aiperf:router,aiperf:gateway,replay:router,replay:gateway"


# --- the slice --------------------------------------------------------------------------------------
def read_slice(trace: Path, limit: int, rate_scale: float) -> list[dict[str, Any]]:
    """The first ``limit`` rows, timestamps (ms) divided by ``rate_scale`` and rebased to 0."""
    rows: list[dict[str, Any]] = []
    with trace.open() as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) >= limit:
                break
    t0 = rows[0]["timestamp"]
    return [{**r, "timestamp": (r["timestamp"] - t0) / rate_scale} for r in rows]


def fix_hash_ids(rows: list[dict[str, Any]]) -> int:
    """aiperf materialises each hash id once: only a request's last block may be partial, and then its id
    must be used by that request alone. Give every partial last block shared with another request a fresh
    id (in place, so both clients see the same prefix structure); returns how many were changed."""
    uses = Counter(h for r in rows for h in set(r.get("hash_ids") or ()))
    fresh = max(uses, default=-1) + 1
    changed = 0
    for r in rows:
        ids = r.get("hash_ids") or []
        if ids and r["input_length"] - BLOCK * (len(ids) - 1) < BLOCK and uses[ids[-1]] > 1:
            r["hash_ids"] = [*ids[:-1], fresh]
            fresh += 1
            changed += 1
    return changed


def load_figures(engine_slice: Path, model: str, gpu: str) -> dict[str, float]:
    """vLLM alone's capacity on this mix (engine model of the simulated backends) and the utilisation."""
    from sagegate.harness.simtwin import capacity, utilisation
    from sagegate.loadgen.schedule import prepare_workload

    work = prepare_workload(engine_slice, prompts="none").requests
    cap = capacity(work, model=model, gpu=gpu)
    span = work[-1].arrival_s - work[0].arrival_s
    return {
        "requests": len(work),
        "span_s": span,
        "offered_req_s": len(work) / span,
        "capacity_req_s": cap["req_s"],
        "utilisation": utilisation(work, cap),
        "mean_prompt": sum(r.prompt_tokens for r in work) / len(work),
        "mean_output": sum(r.output_tokens for r in work) / len(work),
    }


# --- the clients ------------------------------------------------------------------------------------
def run_aiperf(url: str, args: argparse.Namespace, trace: Path, out: Path) -> dict[str, float]:
    """aiperf's fixed-schedule replay of ``trace`` (wall-time timestamps); its own figures, × T."""
    rc, art = aiperf_profile(args.peers, url, trace, out, model=args.model, tokenizer=args.aiperf_tokenizer)
    d = json.loads((art / "profile_export_aiperf.json").read_text())
    T = args.time_scale
    records = [json.loads(x) for x in (art / "profile_export.jsonl").read_text().splitlines() if x.strip()]

    def stat(name: str, key: str) -> float:
        return float(d.get(name, {}).get(key, float("nan")))

    fig = {
        "rc": float(rc),
        "requests": float(len(records)),
        "completed": stat("completed_request_count", "avg"),
        "errors": float(sum(1 for r in records if r.get("error"))),
        "throughput_tok_s": stat("output_token_throughput", "avg") / T,
        "send_lag_p99_s": stat("replay_sched_lag_p99", "avg") / 1000.0 * T,
    }
    for ours, theirs in (("ttft", "time_to_first_token"), ("ttlt", "request_latency")):
        for s in ("avg", "p50", "p99"):
            fig[f"{ours}_{'mean' if s == 'avg' else s}_s"] = stat(theirs, s) / 1000.0 * T
    return fig


def run_replay(
    url: str, kind: str, bes: Sequence[str], args: argparse.Namespace, trace: Path, out: Path
) -> dict[str, float]:
    """``sagegate replay`` of the engine-time ``trace`` (its ``--time-scale`` divides the times)."""
    cmd = [str(REPO / ".venv/bin/sagegate"), "replay", "--url", url, "--trace", str(trace)]
    cmd += ["--time-scale", str(args.time_scale), "--prompts", "auto", "--max-tokens", "0", "--api", "chat"]
    cmd += [a for b in bes for a in ("--backend-metrics", b + "/metrics")]
    cmd += ["--out", str(out / "records.jsonl"), "--json", "--no-progress"]
    if kind == "router":
        cmd += ["--queue-metric", ""]  # no gateway queue to poll
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out)
    (out / "replay.log").write_text(res.stderr + res.stdout)
    if not res.stdout.strip():
        raise RuntimeError(
            f"sagegate replay exited with {res.returncode} and no summary: see {out / 'replay.log'}"
        )
    s = json.loads(res.stdout.strip().splitlines()[-1])["summary"]
    fig = {k: float(s[k]) for k in s if isinstance(s[k], (int, float))}
    fig["rc"] = float(res.returncode)
    fig["replay_preemptions"] = fig.get("preemptions", float("nan"))  # replay's own reading, to check
    fig["send_lag_p99_s"] = fig.get("send_lateness_p99_s", float("nan"))
    return fig


def one_run(client: str, kind: str, args: argparse.Namespace, slices: dict[str, Path]) -> dict[str, Any]:
    out = args.out / f"{client}_{kind}"
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    front = "rr" if kind == "router" else "sagegate"
    with fronted(
        front,
        args.peers,
        out,
        model=args.model,
        gpu=args.gpu,
        time_scale=args.time_scale,
        gateway_env=args.env,
    ) as (url, bes):
        warm(url, bes)
        before = backend_counters(bes)
        if client == "aiperf":
            fig = run_aiperf(url, args, slices["wall"], out)
        else:
            fig = run_replay(url, kind, bes, args, slices["engine"], out)
        after = backend_counters(bes)
    per_backend = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    fig["preemptions"] = sum(p["preemptions"] for p in per_backend)
    run = {
        "client": client,
        "setup": kind,
        "figures": fig,
        "backends_before": before,
        "backends_after": after,
        "backends_delta": per_backend,
        "wall_s": time.monotonic() - t0,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    (out / "run.json").write_text(json.dumps(run, indent=1))
    print(f"{client} × {kind}: {json.dumps(_short(run))}", file=sys.stderr, flush=True)
    return run


def _short(run: dict[str, Any]) -> dict[str, Any]:
    f = run["figures"]
    keys = ("completed", "errors", "ttft_mean_s", "ttlt_mean_s", "throughput_tok_s", "preemptions")
    return {**{k: round(f.get(k, float("nan")), 3) for k in keys}, "wall_s": round(run["wall_s"])}


# --- the table --------------------------------------------------------------------------------------
ROWS = (
    ("requests", "requests", "{:.0f}"),
    ("completed", "completed", "{:.0f}"),
    ("errors", "errors", "{:.0f}"),
    ("ttft_mean_s", "mean TTFT (s)", "{:.2f}"),
    ("ttft_p50_s", "p50 TTFT (s)", "{:.2f}"),
    ("ttft_p99_s", "p99 TTFT (s)", "{:.2f}"),
    ("ttlt_mean_s", "mean latency (s)", "{:.2f}"),
    ("ttlt_p50_s", "p50 latency (s)", "{:.2f}"),
    ("ttlt_p99_s", "p99 latency (s)", "{:.2f}"),
    ("throughput_tok_s", "output tok/s", "{:.0f}"),
    ("preemptions", "preemptions (backends' /metrics)", "{:.0f}"),
    ("send_lag_p99_s", "client's send lag p99 (s)", "{:.2f}"),
)


def table(runs: Sequence[dict[str, Any]]) -> str:
    """One column per run, and per client the gateway ÷ router ratio."""
    cols = {(r["client"], r["setup"]): r for r in runs}
    heads = [f"{c} → {s}" for c, s in cols]
    clients = sorted({c for c, _ in cols}, key=lambda c: c != "aiperf")
    ratio_heads = [f"{c} gw÷router" for c in clients if (c, "router") in cols and (c, "gateway") in cols]
    lines = ["| metric (engine time) | " + " | ".join(heads + ratio_heads) + " |"]
    lines.append("|---" * (1 + len(heads) + len(ratio_heads)) + "|")
    for key, label, fmt in ROWS:
        cells = [fmt.format(r["figures"].get(key, float("nan"))) for r in cols.values()]
        for c in clients:
            if (c, "router") not in cols or (c, "gateway") not in cols:
                continue
            if key == "send_lag_p99_s":  # the clients' own health, not a figure to compare
                cells.append("")
            else:
                a = cols[(c, "router")]["figures"].get(key, float("nan"))
                b = cols[(c, "gateway")]["figures"].get(key, float("nan"))
                cells.append(f"{b / a:.3f}" if a else "—")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    loads = [f"{r['loadavg_before'][0]:.1f}→{r['loadavg_after'][0]:.1f}" for r in cols.values()]
    lines.append(
        "| load average (1 min, before→after) | " + " | ".join(loads) + " |" + " |" * len(ratio_heads)
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", type=Path, required=True, help="Folder laid out by shared/peers/install.sh.")
    p.add_argument("--trace", type=Path, default=TRACE, help="Mooncake-format trace.")
    p.add_argument("--limit", type=int, default=400, help="The trace's first N requests.")
    p.add_argument("--rate-scale", type=float, default=0.8, help="Compress the trace's times (<1 stretches).")
    p.add_argument("--time-scale", type=float, default=1.5, help="The backends run T× faster than real time.")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--out", type=Path, default=Path("/tmp/neutral"))
    p.add_argument("--runs", default=RUNS, help="client:setup pairs, comma-separated.")
    p.add_argument(
        "--aiperf-tokenizer",
        default="builtin",
        help="aiperf's tokenizer: builtin (o200k, ~2.5%% fewer tokens than the backends' cl100k count) "
        "or local/cl100k (the peers' fake HF cache: the backends' own count).",
    )
    p.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Extra gateway setting for a diagnostic run (repeatable), e.g. SAGEGATE_ADMISSION__MAX_WAITING_TOKENS=262144.",
    )
    args = p.parse_args(argv)
    args.env = dict(kv.split("=", 1) for kv in args.gateway_env)
    args.peers, args.out = args.peers.resolve(), args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    rows = read_slice(args.trace, args.limit, args.rate_scale)
    fixed = fix_hash_ids(rows)
    slices = {
        "engine": write_jsonl(rows, args.out / "slice_engine.jsonl"),
        "wall": write_jsonl(rows, args.out / "slice_aiperf.jsonl", args.time_scale),
    }
    load = load_figures(slices["engine"], args.model, args.gpu)
    print(
        f"slice: {load['requests']} requests of {args.trace.name} over {load['span_s']:.1f} engine s "
        f"(trace times / {args.rate_scale:g}; {fixed} partial hash blocks made unique); mean prompt "
        f"{load['mean_prompt']:.0f}, output {load['mean_output']:.0f} tokens; offered "
        f"{load['offered_req_s']:.2f} req/s against vLLM alone's {load['capacity_req_s']:.2f}: utilisation "
        f"{load['utilisation']:.2f}; T = {args.time_scale:g}",
        flush=True,
    )
    pairs = [pair.split(":", 1) for pair in args.runs.split(",") if pair]
    runs = [one_run(client, kind, args, slices) for client, kind in pairs]
    md = table(runs)
    print(md)
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "load": load,
        "hash_fixes": fixed,
        "runs": runs,
    }
    (args.out / "neutral.json").write_text(json.dumps(report, indent=1))
    (args.out / "neutral.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
