"""Per-decision cost of the shared admission ledger (``gateway.ledger``) against a local Redis.

What a dispatch costs once replicas share the ledger, beside the local decision itself:

* ``sequential``: one commit at a time (an idle gateway): the round trip a dispatch waits for, µs.
* ``burst``: ``--burst`` commits queued at once (a loaded gateway): the worker batches them into a
  few script calls; wall µs per commit, the gateway process's CPU µs per commit (what the event loop
  pays: encoding, the client, the answer), and the largest batch.
* ``sync``: one sync round (publish own charges, renew the lease, read the others') with
  ``--charges`` charges per backend on each of two replicas, ms.
* ``view``: the local decision's cost with the others' charges folded into the view, µs per
  ``choose_backend`` against the same without them.

    python -m benchmarks bench_ledger [--charges 200] [--burst 256] [--rounds 5]

Starts its own ``redis-server`` on a free port (none needs to be running).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from sagegate.gateway.ledger import SharedLedger
from sagegate.gateway.settings import LedgerSettings
from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge, choose_backend

CFG = AdmissionConfig(unknown_output=256)
BACKENDS = ["http://gpu-1:8000", "http://gpu-2:8000"]
CAPACITY = 10_000_000
"""Room for everything: the benchmark measures the cost of a yes (a no costs one more read)."""


def ledger(url: str, prefix: str) -> SharedLedger:
    settings = LedgerSettings(enabled=True, prefix=prefix, lease_s=10.0, sync_interval_s=0.05)
    return SharedLedger(settings, url, [BackendLoad(CAPACITY) for _ in BACKENDS], BACKENDS, CFG)


async def commit(led: SharedLedger, backend: int, release: bool = False) -> bool:
    """One dispatch as the gateway makes it; ``release``: and its end right after (a steady state)."""
    charge = Charge(300, None, CFG)
    led.loads[backend].charge(charge)
    fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    led.commit(backend, charge, fut.set_result)
    ok = await fut
    if release:
        led.loads[backend].release(charge)
        led.released(charge, backend)
    return ok


async def fill(led: SharedLedger, per_backend: int) -> None:
    await asyncio.gather(*(commit(led, b) for b in range(len(BACKENDS)) for _ in range(per_backend)))


async def measure(url: str, charges: int, burst: int) -> dict[str, float]:
    prefix = f"bench-ledger:{uuid.uuid4().hex[:8]}"
    a, b = ledger(url, prefix), ledger(url, prefix)
    await a.start()
    await b.start()
    try:
        await fill(b, charges)  # the other replica's load: every check reads it
        await fill(a, charges)
        out: dict[str, float] = {}
        n = 200
        t0 = time.perf_counter()
        for i in range(n):
            await commit(a, i % 2, release=True)
        out["sequential_us"] = 1e6 * (time.perf_counter() - t0) / n
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(commit(a, i % 2, release=True) for i in range(burst)))
        out["burst_wall_us"] = 1e6 * (time.perf_counter() - t0) / burst
        out["burst_cpu_us"] = 1e6 * (time.process_time() - c0) / burst
        out["batch_max"] = a.stats.batch_max
        syncs, cpu = [], []
        for _ in range(20):
            a._next_sync = 0.0
            t0, c0 = time.perf_counter(), time.process_time()
            await a._round()
            syncs.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out["sync_ms"] = 1000 * statistics.median(syncs)
        out["sync_cpu_ms"] = 1000 * statistics.median(cpu)
        out["own_charges"] = sum(len(own) for own in a._own)
        out["remote_charges"] = sum(len(r) for r in a._remote)
        out["view_us"], out["no_view_us"] = view_cost(a)
        out["threshold_us"] = threshold_cost(a)
        return out
    finally:
        await a.stop()
        await b.stop()


def view_cost(led: SharedLedger, n: int = 2000) -> tuple[float, float]:
    """µs per ``choose_backend`` on the merged view, and on this replica's own charges alone (with
    a capacity that makes the peak rule compute, and a change between decisions as a dispatch makes)."""
    cfg = AdmissionConfig(unknown_output=256, peak_target=0.5)
    own = [BackendLoad(load.capacity_tokens) for load in led.loads]
    for backend, charges in enumerate(led._own):
        for charge in charges:
            own[backend].charge(charge)
    out = []
    for loads in (led.loads, own):
        for load in loads:
            load.capacity_tokens = int(load.charged_tokens * 1.2)
        probe = Charge(300, None, cfg)
        t0 = time.perf_counter()
        for _ in range(n):
            for load in loads:
                load.holdings.changed()
            choose_backend(probe, loads, cfg)
        out.append(1e6 * (time.perf_counter() - t0) / n)
    return out[0], out[1]


def threshold_cost(led: SharedLedger, n: int = 2000) -> float:
    """µs per ``ledger.order: threshold`` hold check on the merged view, worst case: a better foreign
    head that fits on one backend only (one hypothetical charge there, a projected peak rebuilt)."""
    from sagegate.policies.rank_threshold import ForeignHead, threshold_mask

    cfg = AdmissionConfig(unknown_output=256)
    loads = led.loads
    for load in loads:
        load.capacity_tokens = int(load.charged_tokens + 700)
    loads[-1].capacity_tokens = int(loads[-1].charged_tokens + 100)  # the head fits on backend 0 alone
    head = ForeignHead((0.0,), Charge(300, None, cfg), 300)
    mine = Charge(100, None, cfg)
    t0 = time.perf_counter()
    for _ in range(n):
        threshold_mask((1.0,), mine, 100, loads, cfg, [head])
    return 1e6 * (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--charges", type=int, default=128, help="in-flight charges per backend per replica")
    ap.add_argument("--burst", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found")
    server = RedisServer(binary, free_port())
    server.start()
    try:
        runs = [asyncio.run(measure(server.url, args.charges, args.burst)) for _ in range(args.rounds)]
    finally:
        server.kill()
    print(f"shared ledger, 2 replicas x 2 backends x {args.charges} charges each, burst {args.burst}:")
    for key in runs[0]:
        vals = [r[key] for r in runs]
        print(
            f"  {key:15s} median {statistics.median(vals):10.1f}   (min {min(vals):.1f}, max {max(vals):.1f})"
        )


if __name__ == "__main__":
    main()
