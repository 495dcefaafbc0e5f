"""Gateway benchmarks: overhead, capacity, dispatch cost, and admission at 2x overload.

    .venv/bin/python benchmarks/bench_gateway.py overhead   [--n 300]
    .venv/bin/python benchmarks/bench_gateway.py capacity   [--duration 4]
    .venv/bin/python benchmarks/bench_gateway.py dispatch   [--queued 10000 --backends 64]
    .venv/bin/python benchmarks/bench_gateway.py admission  [--requests 600]
    .venv/bin/python benchmarks/bench_gateway.py all

Every server is a real process on loopback (``sagegate backend`` and ``python -m sagegate.cmd_serve``);
the client is this process. Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6  # ~60 tokens


# --- processes ------------------------------------------------------------------------------------
PIDS: dict[str, int] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url}{path} not ready")


@contextlib.contextmanager
def backend(time_scale: float, *extra: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sagegate.cli", "backend", "--port", str(port), "--served-model-name", "sim"]
    cmd += ["--time-scale", str(time_scale), *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, "/health", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def gateway(backends: Sequence[str], **settings: Any) -> Iterator[str]:
    port = free_port()
    cfg = {
        "backends": list(backends),
        "port": port,
        "log_level": "warning",
        "policy": "fcfs",
        "predictor": "none",
    }
    cfg.update(settings)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        _wait(url, "/ready", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        os.unlink(f.name)


# --- one streamed request -------------------------------------------------------------------------
async def ttft_ttlt(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, float, int]:
    """Seconds to the first body chunk and to the end, and the number of SSE data events."""
    body = {"model": "sim", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    first = None
    events = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in r.aiter_raw():
            if first is None:
                first = time.perf_counter() - t0
            events += chunk.count(b"data:")
    assert first is not None
    return first, time.perf_counter() - t0, events


def _median_ms(xs: Sequence[float]) -> float:
    return statistics.median(xs) * 1000


def _pct_ms(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


# --- overhead -------------------------------------------------------------------------------------
async def _overhead_pairs(direct: str, gw: str, n: int) -> tuple[list[float], list[float]]:
    d_t: list[float] = []
    g_t: list[float] = []
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(20):  # warm both paths (connections, tokenizer, caches)
            await ttft_ttlt(c, direct, 4)
            await ttft_ttlt(c, gw, 4)
        for i in range(n):
            order = (direct, gw) if i % 2 == 0 else (gw, direct)
            for url in order:
                t, _, _ = await ttft_ttlt(c, url, 4)
                (d_t if url == direct else g_t).append(t)
    return d_t, g_t


def bench_overhead(n: int) -> None:
    print("\n## Overhead: median TTFT through the gateway minus direct (low load, one request at a time)")
    print(f"{'predictor':>14} {'direct ms':>10} {'gateway ms':>11} {'added ms':>9} {'added p90 ms':>13}")
    with backend(20.0) as be:
        for predictor in ("none", "global", "length-bucket", "semantic"):
            try:
                with gateway([be], predictor=predictor, policy="sagesched") as gw:
                    d, g = asyncio.run(_overhead_pairs(be, gw, n))
            except RuntimeError as exc:
                print(f"{predictor:>14}  skipped: {exc}")
                continue
            added = [b - a for a, b in zip(d, g, strict=True)]
            print(
                f"{predictor:>14} {_median_ms(d):>10.2f} {_median_ms(g):>11.2f} "
                f"{_median_ms(g) - _median_ms(d):>9.2f} "
                f"{_pct_ms(added, 0.9):>13.2f}"
            )


# --- capacity -------------------------------------------------------------------------------------
async def _open_loop(urls: Sequence[str], rate: float, duration: float, max_tokens: int) -> dict[str, float]:
    rng = random.Random(1)
    results: list[tuple[float, float, int]] = []
    errors = 0
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    async with httpx.AsyncClient(timeout=30, limits=limits) as c:

        async def one(url: str) -> None:
            nonlocal errors
            try:
                results.append(await ttft_ttlt(c, url, max_tokens))
            except (httpx.HTTPError, AssertionError):
                errors += 1

        tasks = []
        t0 = time.perf_counter()
        t = 0.0
        i = 0
        while t < duration:
            t += rng.expovariate(rate)
            delay = t0 + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(urls[i % len(urls)])))
            i += 1
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results] or [float("nan")]
    return {
        "sent": float(i),
        "rate": i / duration,
        "ttft_ms": _median_ms(ttfts),
        "ttlt_ms": _median_ms([r[1] for r in results] or [float("nan")]),
        "chunks_s": sum(r[2] for r in results) / wall,
        "errors": float(errors),
    }


def bench_capacity(duration: float, rates: Sequence[float], chunk_rates: Sequence[float]) -> None:
    print("\n## Capacity: open-loop Poisson load against two fast simulated backends (time scale 1000)")
    print("   added = median TTFT through the gateway - median TTFT direct at the same offered rate")
    open_admission = {"admission": {"max_waiting": 1_000_000, "target": 1000.0}}
    with backend(1000.0) as b1, backend(1000.0) as b2, gateway([b1, b2], **open_admission) as gw:
        asyncio.run(_open_loop([b1, b2], 20, 1, 2))  # warm up: tokenizers, connections
        asyncio.run(_open_loop([gw], 20, 1, 2))
        for label, max_tokens, sweep in (("requests", 2, rates), ("chunks", 64, chunk_rates)):
            print(f"\n{label} sweep (max_tokens={max_tokens})")
            print(
                f"{'req/s':>7} {'chunks/s':>9} {'direct ms':>10} {'gateway ms':>11} {'added ms':>9} "
                f"{'gw CPU %':>9} {'CPU us/req':>11} {'errors':>7}"
            )
            for rate in sweep:
                d = asyncio.run(_open_loop([b1, b2], rate, duration, max_tokens))
                cpu0, t0 = cpu_seconds(PIDS[gw]), time.perf_counter()
                g = asyncio.run(_open_loop([gw], rate, duration, max_tokens))
                cpu, wall = cpu_seconds(PIDS[gw]) - cpu0, time.perf_counter() - t0
                added = g["ttft_ms"] - d["ttft_ms"]
                print(
                    f"{g['rate']:>7.0f} {g['chunks_s']:>9.0f} {d['ttft_ms']:>10.2f} {g['ttft_ms']:>11.2f} "
                    f"{added:>9.2f} {100 * cpu / wall:>9.1f} {1e6 * cpu / g['sent']:>11.0f} "
                    f"{g['errors'] + d['errors']:>7.0f}"
                )
                if added > 10 or g["errors"] > 0.01 * g["sent"]:
                    break


# --- dispatch cost --------------------------------------------------------------------------------
def bench_dispatch(queued: int, n_backends: int, policy_name: str, cycles: int) -> None:
    from gateway.backends import BackendPool
    from gateway.dispatcher import Dispatcher
    from gateway.queue import BoundedQueue, GatewayRequest
    from gateway.settings import GatewaySettings
    from policies.admission import AdmissionConfig
    from policies.registry import parse_policy
    from predictor.distribution import LengthDistribution

    rng = random.Random(0)
    dists = [
        LengthDistribution.from_samples([rng.lognormvariate(5, 1) for _ in range(200)], max_points=32)
        for _ in range(64)
    ]

    async def run() -> tuple[list[float], list[float], int]:
        s = GatewaySettings.model_validate({"backends": [f"http://b{i}" for i in range(n_backends)]})
        pool = BackendPool(s, httpx.AsyncClient())
        cfg = AdmissionConfig()
        for b in pool.backends:
            b.load.capacity_tokens = 500_000
            b.load.healthy = True
        policy = parse_policy(policy_name)
        d = Dispatcher(policy, pool, cfg, BoundedQueue(policy, 10**9, 10**12), clock=time.perf_counter)
        rid = 0

        def make() -> GatewayRequest:
            nonlocal rid
            rid += 1
            return GatewayRequest(
                rid, time.perf_counter(), rng.randint(16, 4096), body={}, route="chat", model="sim", prompt="",
                prediction=rng.choice(dists),
            )  # fmt: skip

        for b in pool.backends:  # every backend full: the head is held
            b.load.charged_tokens = cfg.target * b.load.capacity_tokens
        for _ in range(queued):
            d.submit(make())
        d.dispatch()
        push_t, decide_t = [], []
        sent = 0
        for _ in range(cycles):
            b = pool.backends[rng.randrange(n_backends)]
            b.load.charged_tokens -= 5_000  # a request finished there: room for about one more
            b.load.waiting = 0
            t0 = time.perf_counter()
            sent += d.dispatch()
            t1 = time.perf_counter()
            d.submit(make())
            t2 = time.perf_counter()
            decide_t.append(t1 - t0)
            push_t.append(t2 - t1)
            d._scheduled = True  # the loop never runs here: keep kick() from queueing callbacks
        return push_t, decide_t, sent

    push_t, decide_t, sent = asyncio.run(run())
    print(
        f"{policy_name:>14} {queued:>7} {n_backends:>4} {statistics.median(decide_t) * 1e6:>12.1f} "
        f"{_pct_ms(decide_t, 0.99) * 1000:>11.1f} {statistics.median(push_t) * 1e6:>11.1f} {sent / cycles:>10.2f}"
    )


def bench_dispatch_all(queued: int, n_backends: int, cycles: int) -> None:
    print(f"\n## Dispatch cost: {queued} queued, {n_backends} backends (microseconds)")
    print("   pass = one dispatch call: dispatch the head, then find the next head held (two decisions);")
    print("   enqueue = an arrival, including its rank (Gittins table for sagesched) and KV charge")
    print(
        f"{'policy':>14} {'queued':>7} {'bk':>4} {'pass med us':>12} {'pass p99 us':>11} {'enqueue us':>11} "
        f"{'sent/pass':>10}"
    )
    from policies.registry import registry

    reg = registry()
    for name in ("sagesched", "fcfs", "edf", "kv-constrained"):
        dynamic = reg[name].cls.dynamic  # keys move with time: the queue rescans (O(n)) every decision
        bench_dispatch(queued, n_backends, name, min(cycles, 30) if dynamic else cycles)


# --- admission at 2x overload ---------------------------------------------------------------------
def _capacity_rps(engine: dict[str, Any], engines: int, requests: list[Any]) -> float:
    """Saturated throughput (req/s) of ``engines`` vLLM-like engines, from the simulator: the same
    requests arriving far faster than they can be served."""
    from sim.config import EngineConfig
    from sim.des import SimSetup, simulate
    from sim.hardware import get_gpu, get_model
    from sim.perf import PerfModel

    cfg = EngineConfig(**engine)
    perf = PerfModel(get_model(cfg.model), get_gpu(cfg.gpu))
    fast = [replace(r, arrival_s=r.rid * 0.001) for r in requests]
    return float(simulate(fast, SimSetup(perf=perf, engine=cfg, engines=engines)).summary["throughput_req_s"])


def _preemptions(urls: Sequence[str]) -> int:
    from gateway.scrape import parse_metrics

    return sum(parse_metrics(httpx.get(u + "/metrics").text).preemptions for u in urls)


async def _replay_split(requests: list[Any], urls: Sequence[str], time_scale: float) -> list[Any]:
    from loadgen.client import ReplayConfig, replay_async

    parts = [requests[i :: len(urls)] for i in range(len(urls))]
    cfgs = [
        ReplayConfig(url=u, time_scale=time_scale, model="sim", queue_metric=None, prime=False) for u in urls
    ]
    results = await asyncio.gather(*(replay_async(p, c) for p, c in zip(parts, cfgs, strict=True)))
    return [rec for res in results for rec in res.records]


def bench_admission(n: int, overload: float, time_scale: float, blocks: int) -> None:
    from loadgen.results import summarize
    from loadgen.synthetic import synthetic_workload

    engine = {"num_gpu_blocks_override": blocks}
    fits = blocks * 16 // 2

    def workload(rate: float) -> list[Any]:
        reqs = synthetic_workload(n, rate=rate, prompt_mean=1024, output_mean=512, sigma=1.0, seed=3)
        return [r for r in reqs if r.prompt_tokens + r.output_tokens < fits]

    cap = _capacity_rps(engine, 2, workload(1.0))
    rate = overload * cap
    work = [replace(r, prompt=" ".join(["hello"] * max(1, r.prompt_tokens - 1))) for r in workload(rate)]
    flags = ["--num-gpu-blocks-override", str(blocks)]
    print(f"\n## Admission at {overload:g}x overload: {len(work)} requests at {rate:.2f} req/s (engine time)")
    print(f"   two simulated H100 backends, {blocks} KV blocks of 16 each, time scale {time_scale:g}; ")
    print(f"   saturated capacity (simulator, vLLM alone): {cap:.2f} req/s; times below are engine seconds")
    print(
        f"{'setup':>26} {'preemptions':>12} {'req/s':>7} {'tok/s':>8} {'mean TTFT':>10} {'mean TTLT':>10} "
        f"{'p99 TTLT':>9} {'errors':>7}"
    )
    setups: list[tuple[str, dict[str, Any] | None]] = [
        ("vLLM alone (round robin)", None),
        ("gateway fcfs + admission", {"policy": "fcfs", "predictor": "global"}),
        ("gateway sagesched", {"policy": "sagesched", "predictor": "global"}),
    ]
    pending = {"admission": {"pending_s": 0.03 / time_scale}}  # about one engine step, in wall time
    for label, gw_settings in setups:
        with backend(time_scale, *flags) as b1, backend(time_scale, *flags) as b2:
            if gw_settings is None:
                records = asyncio.run(_replay_split(work, [b1, b2], time_scale))
            else:
                with gateway([b1, b2], **gw_settings, **pending) as gw:
                    records = asyncio.run(_replay_split(work, [gw], time_scale))
            pre = _preemptions([b1, b2])
        s = summarize(records)
        print(
            f"{label:>26} {pre:>12} {s['throughput_req_s']:>7.2f} {s['throughput_tok_s']:>8.0f} "
            f"{s['ttft_mean_s']:>10.2f} {s['ttlt_mean_s']:>10.2f} "
            f"{s['ttlt_p99_s']:>9.2f} {s['errors'] + s['rejected']:>7.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["overhead", "capacity", "dispatch", "admission", "all"])
    ap.add_argument("--n", type=int, default=300, help="overhead: request pairs")
    ap.add_argument("--duration", type=float, default=4.0, help="capacity: seconds per rate")
    ap.add_argument("--rates", default="25,50,100,150,200,300,400,600")
    ap.add_argument("--chunk-rates", default="10,20,40,60,80,120,160")
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--backends", type=int, default=64)
    ap.add_argument("--cycles", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=500, help="admission: requests")
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=4.0, help="admission: backends' time scale")
    ap.add_argument("--blocks", type=int, default=1024, help="admission: KV blocks per backend")
    args = ap.parse_args()
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    if args.what in ("dispatch", "all"):
        bench_dispatch_all(args.queued, args.backends, args.cycles)
    if args.what in ("overhead", "all"):
        bench_overhead(args.n)
    if args.what in ("capacity", "all"):
        bench_capacity(args.duration, floats(args.rates), floats(args.chunk_rates))
    if args.what in ("admission", "all"):
        bench_admission(args.requests, args.overload, args.time_scale, args.blocks)
    print(json.dumps({"python": sys.version.split()[0], "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
