"""Gateway replicas in front of one fleet at 2x overload: one gateway, N with their own ledgers, N
sharing the admission ledger in Redis (``ledger.enabled``).

Two small-KV simulated backends (``sagegate backend``, fresh for every setup), the same requests in
every setup, split round robin over the replicas; preemptions from the backends' ``/metrics``,
throughput and latency from the client. Ratios are against the one gateway of the same run.

    python benchmarks/bench_replicas.py [--requests 240] [--replicas 2] [--blocks 1024] [--time-scale 4]
        [--order-threshold] [--policy fcfs]

Starts its own ``redis-server`` (none needs to be running). Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from bench_gateway import _capacity_rps, _preemptions, _replay_split, backend, gateway

from sagegate.procs import RedisServer, free_port
from tests.redis_support import redis_server_binary


def workload(n: int, rate: float, blocks: int) -> list[Any]:
    """bench_gateway's admission workload: distinct prompts, a client's cap as max_tokens."""
    from core.request import DEFAULT_CLIENT_MAX_TOKENS
    from loadgen.prompts import filler_text
    from loadgen.records import with_client_cap
    from loadgen.synthetic import synthetic_workload

    fits = blocks * 16 // 2
    reqs = synthetic_workload(n, rate=rate, prompt_mean=1024, output_mean=512, sigma=1.0, seed=3)
    kept = [
        replace(r, prompt=filler_text(r.prompt_tokens, seed=r.rid))
        for r in reqs
        if r.prompt_tokens + r.output_tokens < fits
    ]
    return with_client_cap(kept, DEFAULT_CLIENT_MAX_TOKENS)


@contextlib.contextmanager
def replicas(urls: list[str], n: int, settings: dict[str, Any]) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(gateway(urls, **settings)) for _ in range(n)]


def main() -> None:
    from core.summary import summarize

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--blocks", type=int, default=1024, help="KV blocks (of 16) per backend")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument(
        "--order-threshold", action="store_true", help="also the shared ledger with ledger.order: threshold"
    )
    ap.add_argument("--policy", default="fcfs")
    args = ap.parse_args()
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found")
    redis = RedisServer(binary, free_port())
    redis.start()
    engine = {"num_gpu_blocks_override": args.blocks}
    cap = _capacity_rps(engine, 2, workload(args.requests, 1.0, args.blocks))
    rate = args.overload * cap
    work = workload(args.requests, rate, args.blocks)
    flags = ["--num-gpu-blocks-override", str(args.blocks)]
    base = {
        "policy": args.policy,
        "predictor": "global",
        "admission": {"pending_s": 0.03 / args.time_scale},
        "redis_url": redis.url,
    }
    n = args.replicas
    setups: list[tuple[str, int, dict[str, Any]]] = [
        ("1 gateway", 1, base),
        (f"{n} replicas, own ledgers", n, base),
        (f"{n} replicas, shared ledger", n, {**base, "ledger": {"enabled": True}}),
    ]
    if args.order_threshold:
        setups.append((f"{n} replicas, ledger, threshold", n, {**base, "ledger": {"order": "threshold"}}))
    print(
        f"## {len(work)} requests at {rate:.2f} req/s ({args.overload:g}x the saturated {cap:.2f}, engine time)"
    )
    print(f"   two simulated backends, {args.blocks} KV blocks of 16 each, time scale {args.time_scale:g}")
    print(f"{'setup':>32} {'preemptions':>12} {'req/s':>7} {'mean TTLT':>10} {'p99 TTLT':>9} {'errors':>7}")
    rows: list[tuple[str, float, float]] = []
    try:
        for label, count, settings in setups:
            if "ledger" in settings:
                settings = {
                    **settings,
                    "ledger": {
                        **settings["ledger"],
                        "enabled": True,
                        "prefix": f"bench:{uuid.uuid4().hex[:6]}",
                    },
                }
            with backend(args.time_scale, *flags) as b1, backend(args.time_scale, *flags) as b2:
                with replicas([b1, b2], count, settings) as fronts:
                    records = asyncio.run(_replay_split(work, fronts, args.time_scale))
                pre = _preemptions([b1, b2])
            s = summarize(records)
            rows.append((label, float(pre) if pre != "?" else float("nan"), s["throughput_req_s"]))
            print(
                f"{label:>32} {pre:>12} {s['throughput_req_s']:>7.2f} {s['ttlt_mean_s']:>10.2f} "
                f"{s['ttlt_p99_s']:>9.2f} {s['errors'] + s['rejected']:>7.0f}"
            )
    finally:
        redis.kill()
    _, pre1, tp1 = rows[0]
    print("\nagainst 1 gateway (same run):")
    for label, pre, tp in rows[1:]:
        ratio = f"{pre / pre1:.2f}x" if pre1 else f"{pre:.0f} vs 0"
        print(f"{label:>32}: preemptions {ratio}, throughput {tp / tp1:.3f}x")


if __name__ == "__main__":
    main()
