"""The load a gateway benchmark offers: one streamed request timed to its first chunk and its end,
open-loop Poisson arrivals, the capacity sweep, warming the embedder, and a replay split over backends
with the simulator's saturated throughput beside it."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from benchmarks.servers import PIDS, tree_cpu_seconds
from sagegate.loadgen.sse import EventSplitter

PROMPT = "The quick brown fox jumps over the lazy dog. " * 6  # ~60 tokens
_sent = itertools.count()


def request_body(route: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The same request for every path: a chat turn (default) or a completion of ``PROMPT``, numbered,
    so no two texts repeat (the semantic predictor answers an exact repeat without an embedding)."""
    text = f"{PROMPT}(request {next(_sent)})"
    if route == "chat":
        msgs = [{"role": "user", "content": text}]
        return "/v1/chat/completions", {
            "model": "sim",
            "messages": msgs,
            "max_tokens": max_tokens,
            "stream": True,
        }
    return "/v1/completions", {"model": "sim", "prompt": text, "max_tokens": max_tokens, "stream": True}


async def ttft_ttlt(
    client: httpx.AsyncClient, url: str, max_tokens: int, route: str = "chat"
) -> tuple[float, float, int]:
    """Seconds to the first body chunk and to the end, and the number of SSE data events."""
    path, body = request_body(route, max_tokens)
    t0 = time.perf_counter()
    first = None
    events = 0
    splitter = EventSplitter()
    async with client.stream("POST", url + path, json=body) as r:
        r.raise_for_status()
        async for chunk in r.aiter_raw():
            if first is None:
                first = time.perf_counter() - t0
            events += len(splitter.feed(chunk))
    assert first is not None
    return first, time.perf_counter() - t0, events


def median_ms(xs: Sequence[float]) -> float:
    return statistics.median(xs) * 1000


async def open_loop(
    urls: Sequence[str], rate: float, duration: float, max_tokens: int, route: str = "chat"
) -> dict[str, float]:
    rng = random.Random(1)
    results: list[tuple[float, float, int]] = []
    errors = 0
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    async with httpx.AsyncClient(timeout=30, limits=limits) as c:

        async def one(url: str) -> None:
            nonlocal errors
            try:
                results.append(await ttft_ttlt(c, url, max_tokens, route))
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
        "ttft_ms": median_ms(ttfts),
        "ttlt_ms": median_ms([r[1] for r in results] or [float("nan")]),
        "chunks": float(sum(r[2] for r in results)),
        "chunks_s": sum(r[2] for r in results) / wall,
        "errors": float(errors),
    }


LIMIT_MS = 10.0  # the capacity criterion: added median TTFT at most this


def idle_cpu_rate(pid: int, seconds: float = 2.0) -> float:
    """CPU seconds per second the proxy spends with no client traffic."""
    c0, t0 = tree_cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return (tree_cpu_seconds(pid) - c0) / (time.perf_counter() - t0)


def capacity_sweep(
    name: str, gw: str, direct: Sequence[str], rates: Sequence[float], refine: int, duration: float,
    max_tokens: int, route: str,
) -> tuple[float, float, float, float]:  # fmt: skip
    """Rates up the grid until the added median TTFT passes ``LIMIT_MS`` (or >1% errors), then
    ``refine`` bisection steps between the last good rate and the first bad one. Returns the highest
    good (offered req/s, delivered SSE chunks/s) and the net CPU µs per request and per chunk of the
    run that sent most."""
    best = (0.0, 0.0)
    busiest = (0.0, float("nan"), float("nan"))  # requests sent, CPU us/request, CPU us/chunk
    idle = idle_cpu_rate(PIDS[gw])

    def run(rate: float) -> bool:
        nonlocal best, busiest
        d = asyncio.run(open_loop(direct, rate, duration, max_tokens, route))
        cpu0, t0 = tree_cpu_seconds(PIDS[gw]), time.perf_counter()
        g = asyncio.run(open_loop([gw], rate, duration, max_tokens, route))
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds(PIDS[gw]) - cpu0
        net = max(0.0, cpu - idle * wall)
        us_req, us_chunk = 1e6 * net / max(1.0, g["sent"]), 1e6 * net / max(1.0, g["chunks"])
        added = g["ttft_ms"] - d["ttft_ms"]
        ok = added <= LIMIT_MS and g["errors"] <= 0.01 * g["sent"] and d["errors"] <= 0.01 * d["sent"]
        print(
            f"{name:>22} {g['rate']:>7.0f} {g['chunks_s']:>9.0f} {d['ttft_ms']:>10.2f} {g['ttft_ms']:>11.2f} "
            f"{added:>9.2f} {100 * cpu / wall:>6.1f} {us_req:>10.0f} {us_chunk:>11.0f} "
            f"{g['errors'] + d['errors']:>7.0f} {'' if ok else '  over':>6}",
            flush=True,
        )
        if ok and g["rate"] > best[0]:
            best = (g["rate"], g["chunks_s"])
        if g["sent"] > busiest[0]:
            busiest = (g["sent"], us_req, us_chunk)
        return ok

    lo, hi = 0.0, float("nan")
    for rate in rates:
        if not run(rate):
            hi = rate
            break
        lo = rate
    for _ in range(refine if hi == hi else 0):
        mid = round((lo + hi) / 2) if lo > 0 else hi / 2
        if mid in (lo, hi):
            break
        if run(mid):
            lo = mid
        else:
            hi = mid
    return best[0], best[1], busiest[1], busiest[2]


def paths_not_late(url: str) -> float:
    """Predictions the gateway made with the embedding in time (``sagegate_predictor_path`` != late)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("sagegate_predictor_path_total{") and 'path="late"' not in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def warm_embedder(url: str, timeout: float = 240) -> None:
    """The semantic gateway loads its embedding model on the first request, and answers from the
    prior ("late") until it is in: send requests one at a time until one is predicted in time."""
    path, body = request_body("chat", 2)
    deadline = time.monotonic() + timeout
    before = paths_not_late(url)
    while time.monotonic() < deadline:
        httpx.post(url + path, json=body, timeout=60).raise_for_status()
        if paths_not_late(url) > before:
            return
        time.sleep(0.2)
    print(f"(note: the semantic predictor at {url} still answered late after {timeout:g} s)", file=sys.stderr)


def capacity_rps(engine: dict[str, Any], engines: int, requests: list[Any]) -> float:
    """Saturated throughput (req/s) of ``engines`` vLLM-like engines, from the simulator: the same
    requests arriving far faster than they can be served."""
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.des import SimSetup, simulate
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    cfg = EngineConfig(**engine)
    perf = PerfModel(get_model(cfg.model), get_gpu(cfg.gpu))
    fast = [replace(r, arrival_s=r.rid * 0.001) for r in requests]
    return float(simulate(fast, SimSetup(perf=perf, engine=cfg, engines=engines)).summary["throughput_req_s"])


def backend_preemptions(urls: Sequence[str]) -> str:
    """The backends' preemptions, as the table prints them ("?" when a backend does not say)."""
    from sagegate.loadgen.scrape import scrape_preemptions

    count = scrape_preemptions([u + "/metrics" for u in urls])
    return "?" if count is None else str(int(count))


async def replay_split(requests: list[Any], urls: Sequence[str], time_scale: float) -> list[Any]:
    from sagegate.loadgen.client import ReplayConfig, replay_async

    parts = [requests[i :: len(urls)] for i in range(len(urls))]
    cfgs = [
        ReplayConfig(url=u, time_scale=time_scale, model="sim", queue_metric=None, prime=False) for u in urls
    ]
    results = await asyncio.gather(*(replay_async(p, c) for p, c in zip(parts, cfgs, strict=True)))
    return [rec for res in results for rec in res.records]
