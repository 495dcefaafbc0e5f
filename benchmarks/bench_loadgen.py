"""The load generator's own ceiling on this machine: how many requests/s (and streamed chunks/s) it can
send and time without falling behind its schedule.

A near-free streaming server (benchmarks/fakeserver.py) runs in its own process; the replay client is
driven at increasing Poisson rates. A rate "keeps up" when the median send lateness stays under 5 ms,
the 99th percentile under 25 ms, and every request completes. The ceiling is the highest such rate.

    .venv/bin/python -m benchmarks bench_loadgen [--duration 5] [--tokens 32] [--interval-ms 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sagegate.core.summary import errors_by_kind
from sagegate.loadgen.client import ReplayConfig, replay
from sagegate.loadgen.schedule import prepare_workload

REPO = Path(__file__).resolve().parents[1]

P50_MS, P99_MS = 5.0, 25.0


def start_server(interval_ms: float) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "benchmarks.fakeserver", "--port", "0", "--interval-ms", str(interval_ms)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def run_rate(url: str, rate: float, duration: float, tokens: int, seed: int) -> dict[str, float]:
    n = max(10, int(rate * duration))
    work = prepare_workload(
        "synthetic",
        requests=n,
        rate=rate,
        seed=seed,
        prompts="filler",
        reader_opts={"prompt_mean": 32, "output_mean": tokens, "length_dist": "constant"},
    )
    cfg = ReplayConfig(url=url, model="fake", timeout_s=60, queue_metric=None, max_connections=4000)
    t, cpu = time.perf_counter(), time.process_time()
    res = replay(work.requests, cfg)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    errors = errors_by_kind(res.records)
    if errors:
        print(f"  errors at {rate:.0f} req/s: {errors}")
    late = np.array([1000 * (r.lateness or 0.0) for r in res.records])
    ok = sum(r.status == "ok" for r in res.records)
    chunks = sum(len(r.chunk_times) for r in res.records)
    span = max(r.finish_s or 0.0 for r in res.records) or 1e-9
    return {
        "rate": rate,
        "requests": float(n),
        "ok": float(ok),
        "late_p50_ms": float(np.percentile(late, 50)),
        "late_p99_ms": float(np.percentile(late, 99)),
        "late_max_ms": float(late.max()),
        "chunks_per_s": chunks / span,
        "wall_s": wall,
        "cpu_us_per_chunk": 1e6 * cpu / max(chunks, 1),
        "cpu_share": cpu / wall,
    }


def keeps_up(row: dict[str, float]) -> bool:
    return row["late_p50_ms"] < P50_MS and row["late_p99_ms"] < P99_MS and row["ok"] == row["requests"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per rate")
    ap.add_argument("--tokens", type=int, default=32, help="streamed chunks per request")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="server gap between chunks")
    ap.add_argument("--rates", type=str, default="25,50,100,150,200,250,300,400,600,800")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    proc, url = start_server(args.interval_ms)
    rows = []
    try:
        print(f"fake server at {url}; {args.tokens} chunks/request, {args.interval_ms} ms apart")
        print(
            f"{'rate':>6} {'reqs':>6} {'ok':>6} {'late p50':>9} {'p99':>8} {'max':>8} "
            f"{'chunks/s':>9} {'cpu/chunk':>9} {'cpu':>5} keeps up"
        )
        misses = 0
        for rate in (float(x) for x in args.rates.split(",")):
            row = run_rate(url, rate, args.duration, args.tokens, args.seed)
            rows.append(row)
            up = keeps_up(row)
            print(
                f"{row['rate']:>6.0f} {row['requests']:>6.0f} {row['ok']:>6.0f} {row['late_p50_ms']:>7.2f}ms "
                f"{row['late_p99_ms']:>6.1f}ms {row['late_max_ms']:>6.1f}ms {row['chunks_per_s']:>9,.0f} "
                f"{row['cpu_us_per_chunk']:>7.0f}µs {row['cpu_share']:>5.0%} "
                f"{'yes' if up else 'no'}",
                flush=True,
            )
            misses = 0 if up else misses + 1
            if misses >= 2:
                break
    finally:
        proc.terminate()
        proc.wait(5)
    good = [r for r in rows if keeps_up(r)]
    if good:
        best = max(good, key=lambda r: r["rate"])
        print(
            f"ceiling: {best['rate']:.0f} requests/s, {best['chunks_per_s']:,.0f} chunks/s "
            f"(median send lateness {best['late_p50_ms']:.2f} ms, p99 {best['late_p99_ms']:.1f} ms)"
        )
    else:
        print("ceiling: below the lowest rate tried")
    light = [r for r in rows if r["cpu_share"] < 0.5]
    if light:
        per_chunk = min(r["cpu_us_per_chunk"] for r in light)
        print(
            f"client CPU per streamed chunk (request costs included): {per_chunk:.0f} µs "
            f"-> at most ~{1e6 / per_chunk:,.0f} chunks/s on one free core"
        )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
