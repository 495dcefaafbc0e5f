"""Issue 18: aggregate requests/s at <= 10 ms added TTFT with 1, 2 and 4 gateway processes
(``sagegate serve --workers N``, one port, the shared admission ledger in Redis).

bench_gateway.py's capacity sweep (open-loop Poisson, two fast simulated backends at time scale
1000, ``max_tokens`` 2, chat; the added median TTFT through the gateway against the backends
directly at the same rate, measured just before) run against each setup in turn, in one run:

* 1 process, no ledger (today's single gateway), the baseline of the ratios;
* 1 process with the shared ledger (what the ledger costs one process);
* ``--workers`` 2 and 4 with the shared ledger.

The per-decision cost of the ledger (one commit's round trip, batched commits, a sync) is
``benchmarks/bench_ledger.py``'s. The client is this one Python process: on a small machine it
can become the ceiling (the direct TTFT it measures rises too); see docs/journal/BENCHMARKS.md, *The
load generator's own ceiling*. CPU % is the supervisor and its workers together.

    python -m benchmarks bench_workers [--workers 1 2 4] [--duration 4] [--rates 50,100,...] [--refine 2]

Starts its own ``redis-server``. Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.load import capacity_sweep, open_loop
from benchmarks.servers import PIDS, backend, stop_server, wait_ready
from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary

REPO = Path(__file__).resolve().parents[1]
OPEN_ADMISSION = {"max_waiting": 1_000_000, "target": 1000.0}
ADMIN_KEY = uuid.uuid4().hex


def _replicas_seen(url: str, want: int, timeout: float = 60) -> int:
    """Distinct ledger replicas answering on the port (the kernel spreads connections over them)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        # a fresh connection each time: possibly another worker
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError), httpx.Client(timeout=2) as c:
            r = c.get(url + "/admin/ledger", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            seen.add(r.json()["replica"])
        time.sleep(0.05)
    return len(seen)


@contextlib.contextmanager
def served(backends: Sequence[str], workers: int, redis_url: str | None) -> Iterator[str]:
    """``sagegate serve --workers N`` on a free port (the shared ledger when ``redis_url``)."""
    port = free_port()
    cfg: dict[str, Any] = {
        "backends": list(backends),
        "port": port,
        "log_level": "warning",
        "policy": "fcfs",
        "predictor": "none",
        "admission": OPEN_ADMISSION,
        "admin_key": ADMIN_KEY,
    }
    if redis_url is not None:
        cfg["redis_url"] = redis_url
        cfg["ledger"] = {"enabled": True, "prefix": f"bench:{uuid.uuid4().hex[:6]}"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name, "--workers", str(workers)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        wait_ready(url, "/ready", proc)
        if redis_url is not None and (n := _replicas_seen(url, workers)) < workers:
            raise RuntimeError(f"only {n} of {workers} workers answered")
        yield url
    finally:
        stop_server(proc)
        os.unlink(f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per rate")
    ap.add_argument("--rates", default="25,50,100,150,200,300,400,600,800")
    ap.add_argument("--refine", type=int, default=2, help="bisection steps after the grid")
    args = ap.parse_args()
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found")
    rates = [float(r) for r in args.rates.split(",")]
    redis = RedisServer(binary, free_port())
    redis.start()
    setups: list[tuple[str, int, str | None]] = [("1 process, no ledger", 1, None)]
    setups += [(f"{n} process{'es' if n > 1 else ''}, ledger", n, redis.url) for n in args.workers]
    print(
        f"{'setup':>22} {'req/s':>7} {'chunks/s':>9} {'direct ms':>10} {'proxied ms':>11} {'added ms':>9} ",
        end="",
    )
    print(f"{'CPU %':>6} {'us/req':>10} {'us/chunk':>11} {'errors':>7}")
    found: list[tuple[str, float, float]] = []
    try:
        with backend(1000.0) as b1, backend(1000.0) as b2:
            asyncio.run(open_loop([b1, b2], 20, 1, 2))  # warm up the backends
            for label, workers, url in setups:
                try:
                    with served([b1, b2], workers, url) as gw:
                        asyncio.run(open_loop([gw], 20, 1, 2))  # warm up: connections to every worker
                        rate, _, us_req, _ = capacity_sweep(
                            label, gw, [b1, b2], rates, args.refine, args.duration, 2, "chat"
                        )
                except RuntimeError as exc:
                    print(f"{label:>22}  skipped: {exc}")
                    continue
                found.append((label, rate, us_req))
    finally:
        redis.kill()
    if not found:
        return
    base = found[0][1]
    print(
        "\nrequests/s at <= 10 ms added median TTFT (one run), ratio against one process without the ledger:"
    )
    for label, rate, us_req in found:
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{label:>22}: {rate:>6.0f} req/s  {ratio:>6}  ({us_req:.0f} us CPU per request)")


if __name__ == "__main__":
    main()
