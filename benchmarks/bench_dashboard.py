"""What the dashboard costs the gateway: its CPU with and without open pages, under load.

    .venv/bin/python -m benchmarks bench_dashboard [--rate 200] [--duration 20] [--pages 3] [--rounds 2]

One gateway process (``sagegate.cmd_serve``) in front of two simulated backends, an open-loop stream
of short chat requests at ``--rate``; rounds alternate *no page* and *``--pages`` pages* (each polling
``/admin/dashboard`` once a second, as the page does), so slow drift of a shared machine lands on
both. Printed: the gateway's CPU (share of one core) per round, the difference, and the feed's
latency as a page sees it. Figures only; nothing is asserted. Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from benchmarks.load import open_loop
from benchmarks.servers import PIDS, backend, cpu_seconds, gateway

KEY = "bench-admin"


async def _pages(
    url: str, pages: int, stop: asyncio.Event, latencies: list[float], builds: list[float]
) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=10, headers=headers) as c:

        async def page(offset: float) -> None:
            await asyncio.sleep(offset)
            while not stop.is_set():
                t0 = time.perf_counter()
                r = await c.get(url + "/admin/dashboard")
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                builds.append(float(r.json()["build_ms"]))
                await asyncio.sleep(1.0)

        await asyncio.gather(*(page(i / max(1, pages)) for i in range(pages)))


async def _round(
    url: str, rate: float, duration: float, pages: int, latencies: list[float], builds: list[float]
) -> tuple[float, float]:
    """(gateway CPU share of one core, requests/s sent) over one round."""
    pid = PIDS[url]
    stop = asyncio.Event()
    pollers = asyncio.create_task(_pages(url, pages, stop, latencies, builds)) if pages else None
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    load = await open_loop([url], rate, duration, max_tokens=16)
    cpu = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    stop.set()
    if pollers is not None:
        await pollers
    return cpu, load["rate"]


def _per_call_us(fn: object, n: int) -> float:
    import timeit

    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6  # type: ignore[arg-type]


def accounting(rate: float, pages: int) -> None:
    """The dashboard's own work, timed in this process: what it adds per request and per second."""
    from sagegate.core.distribution import LengthDistribution
    from sagegate.gateway.app import Gateway
    from sagegate.gateway.settings import GatewaySettings

    gw = Gateway(GatewaySettings(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"], admin_key=KEY))
    tel = gw.metrics.telemetry
    dist = LengthDistribution(tuple(range(10, 170, 10)), (1 / 16,) * 16)
    first = _per_call_us(lambda: tel.first_token(0.05), 20_000)
    done = _per_call_us(lambda: tel.completed(0.5, dist, 120), 20_000)
    clock = [0.0]

    def sample() -> None:
        clock[0] += 1.0
        tel.sample(clock[0], 0)

    step = _per_call_us(sample, 200)
    ticks = iter(range(10**9))
    quality = _per_call_us(lambda: tel.quality(1e3 * next(ticks)), 20)  # never the cached answer
    feed = _per_call_us(lambda: gw.feed.build(0.0), 200)
    per_s = rate * (first + done) + step + 0.5 * quality + 2 * feed
    print(f"per request: first token {first:.2f} µs, completion {done:.2f} µs")
    print(
        f"per second: timeline step {step:.1f} µs, quality {quality:.0f} µs (every 2 s), feed build {feed:.0f} µs (≤ 2 a second)"
    )
    print(f"at {rate:.0f} req/s with any number of pages: {per_s / 1e4:.3f}% of a core")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--pages", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--accounting-only", action="store_true", help="only time the dashboard's own work")
    args = ap.parse_args()
    accounting(args.rate, args.pages)
    if args.accounting_only:
        return
    with backend(50.0) as b0, backend(50.0) as b1, gateway([b0, b1], admin_key=KEY) as gw:
        asyncio.run(open_loop([gw], args.rate, 3.0, max_tokens=16))  # warm-up
        plain: list[float] = []
        viewed: list[float] = []
        latencies: list[float] = []
        builds: list[float] = []
        for _ in range(args.rounds):
            cpu, sent = asyncio.run(_round(gw, args.rate, args.duration, 0, latencies, builds))
            plain.append(cpu)
            print(f"no page:        gateway CPU {100 * cpu:5.1f}% of a core at {sent:.0f} req/s")
            cpu, sent = asyncio.run(_round(gw, args.rate, args.duration, args.pages, latencies, builds))
            viewed.append(cpu)
            print(f"{args.pages} pages open:   gateway CPU {100 * cpu:5.1f}% of a core at {sent:.0f} req/s")
        n = 500
        c0 = cpu_seconds(PIDS[gw])
        with httpx.Client(headers={"authorization": f"Bearer {KEY}"}) as c:
            for _ in range(n):
                c.get(gw + "/admin/dashboard").raise_for_status()
        per_poll = (cpu_seconds(PIDS[gw]) - c0) / n
        print(f"gateway CPU per poll (idle, {n} polls): {1e6 * per_poll:.0f} µs")
    a, b = statistics.fmean(plain), statistics.fmean(viewed)
    print(
        f"\nmean: {100 * a:.1f}% without, {100 * b:.1f}% with {args.pages} pages: "
        f"{100 * (b - a):+.2f} points of a core ({100 * (b - a) / a:+.1f}% of the gateway's CPU)"
    )
    if latencies:
        ms = sorted(1000 * x for x in latencies)
        print(
            f"feed latency as a page sees it: median {ms[len(ms) // 2]:.1f} ms, max {ms[-1]:.1f} ms, n={len(ms)}"
        )
        bs = sorted(builds)
        print(f"feed build inside the gateway: median {bs[len(bs) // 2]:.2f} ms, max {bs[-1]:.2f} ms")


if __name__ == "__main__":
    main()
