"""Gateway replicas in front of one fleet at 2x overload: one gateway, N with their own ledgers, N
sharing the admission ledger in Redis (``ledger.enabled``, its default ``order: threshold``).

Two small-KV simulated backends (``sagegate backend``, fresh for every setup), the same requests in
every setup, split round robin over the replicas, each setup's replicas sharing a prediction history
of their own that starts empty (``redis_url``; ``--local-history``: each replica learns alone, as
before the baselines shared theirs); preemptions from the backends' ``/metrics``,
throughput and latency from the client. Ratios are against the one gateway of the same run.

    python -m benchmarks bench_replicas [--requests 240] [--replicas 2] [--blocks 1024] [--time-scale 4]
        [--order-none] [--policy fcfs] [--repeats 1] [--sync-interval 0.05] [--skip-own]
        [--predictor global] [--max-waiting-tokens N] [--local-history] [--one-ledger] [--burner 0.25]
        [--publish-s 0.002] [--send-first 0.1] [--dump DIR]

``--repeats K`` runs every setup K times, interleaved (setup order rotates), and ends with the median
of each setup's ratios: one gateway alone ranges widely across runs on these requests.

``tok/s*`` is the output-token rate while requests still arrive (``loaded_tok_s``): req/s over a
finite replay is requests over the makespan, and the makespan ends with the drain of the last long
answers (backends nearly idle), so the two can disagree. ``inv.`` counts pairs served out of arrival
order, per request (``out_of_order``: a later arrival's first token more than 1 s before an earlier
one's). Each row also gives the backends' mean KV usage and running batch over the replay (both
backends sampled every 100 ms wall: whether a setup kept the engines as full as another), and the
CPU seconds the setup's processes used during the replay (the gateways, the two backends, Redis and
this client) against its wall time: on a 2-core machine, whether the rig itself is short of CPU;
with a shared ledger, also the replicas' wait from a dispatch decision to Redis's answer
(``sagegate_ledger_commit_wait_seconds``: what each of their dispatches waits and one gateway's does not).

``--burner F`` adds a control: one gateway with a process beside it that keeps F of a core busy
during the replay (busy for F of every 10 ms), the CPU that N replicas add over one gateway. It
says whether taking that much CPU from the rig alone moves one gateway's figures.

``--send-first F`` adds the shared ledger with ``ledger.send_first_share`` F (a dispatch within its
budget goes at once and is checked after); its row also gives how many dispatches went first and how
many calls found a backend over the limit (``sagegate_ledger_sent_first``, ``sagegate_ledger_over``).

``--dump DIR`` writes every setup run's client records (arrival, first token, chunk times, status)
to ``DIR/run{k}-{setup}.jsonl``, for reading where two setups part (e.g. cumulative tokens over time).

Starts its own ``redis-server`` (none needs to be running). Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from benchmarks.load import backend_preemptions, capacity_rps, replay_split
from benchmarks.servers import PIDS, backend, cpu_seconds, gateway
from sagegate.harness.live import BackendSampler
from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary


def workload(n: int, rate: float, blocks: int) -> list[Any]:
    """bench_gateway's admission workload: distinct prompts, a client's cap as max_tokens."""
    from sagegate.core.request import DEFAULT_CLIENT_MAX_TOKENS
    from sagegate.loadgen.prompts import filler_text
    from sagegate.loadgen.records import with_client_cap
    from sagegate.loadgen.synthetic import synthetic_workload

    fits = blocks * 16 // 2
    reqs = synthetic_workload(n, rate=rate, prompt_mean=1024, output_mean=512, sigma=1.0, seed=3)
    kept = [
        replace(r, prompt=filler_text(r.prompt_tokens, seed=r.rid))
        for r in reqs
        if r.prompt_tokens + r.output_tokens < fits
    ]
    return with_client_cap(kept, DEFAULT_CLIENT_MAX_TOKENS)


LOCAL = "_local_history"
"""A setup flag (not a gateway setting): each replica's predictor learns from its own completions."""
BURNER = "_burner"
"""A setup flag (not a gateway setting): the share of a core a busy process takes beside the rig."""
BURN = (
    "import sys, time\n"
    "busy = float(sys.argv[1]) * 0.01\n"
    "while True:\n"
    "    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < busy: pass\n"
    "    time.sleep(0.01 - busy)\n"
)


@contextlib.contextmanager
def burner(share: float) -> Iterator[int | None]:
    """A process busy for ``share`` of every 10 ms while the block runs (its pid; None: no burner)."""
    if share <= 0:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", BURN, str(share)])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def replicas(urls: list[str], n: int, settings: dict[str, Any], history: str) -> Iterator[list[str]]:
    """``n`` gateways sharing the prediction history under ``history`` (with ``LOCAL``: one each)."""
    local = settings.get(LOCAL, False)
    settings = {k: v for k, v in settings.items() if k not in (LOCAL, BURNER)}
    with contextlib.ExitStack() as stack:
        fronts = []
        for i in range(n):
            none = settings.get("predictor") == "none"
            options = {} if none else {"redis_prefix": f"{history}:{i}" if local else history}
            fronts.append(stack.enter_context(gateway(urls, **settings, predictor_options=options)))
        yield fronts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--blocks", type=int, default=1024, help="KV blocks (of 16) per backend")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument(
        "--order-none", action="store_true", help="also the shared ledger with ledger.order: none"
    )
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--predictor", default="global")
    ap.add_argument(
        "--max-waiting-tokens", type=int, default=None, help="admission.max_waiting_tokens (default its own)"
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--sync-interval", type=float, default=None, help="ledger.sync_interval_s (default its own)"
    )
    ap.add_argument(
        "--publish-s",
        type=float,
        default=None,
        help="also the shared ledger with this ledger.publish_s (how soon releases and growth go out)",
    )
    ap.add_argument(
        "--send-first",
        type=float,
        nargs="*",
        default=[],
        help="also the shared ledger with each of these ledger.send_first_share values",
    )
    ap.add_argument("--skip-own", action="store_true", help="leave out the replicas with their own ledgers")
    ap.add_argument(
        "--one-ledger",
        action="store_true",
        help="also one gateway with the shared ledger on (its cost with no other replica)",
    )
    ap.add_argument(
        "--local-history",
        action="store_true",
        help="also the shared ledger with each replica's predictor learning alone (its own completions)",
    )
    ap.add_argument(
        "--burner",
        type=float,
        default=0.0,
        help="also one gateway beside a process busy for this share of a core (a control for the rig)",
    )
    ap.add_argument("--dump", default=None, help="write each setup run's client records under this folder")
    args = ap.parse_args()
    if not 0 <= args.burner < 1:  # the burner sleeps for 1 - F of every 10 ms
        ap.error(f"--burner must be in [0, 1), got {args.burner:g}")
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server found")
    redis = RedisServer(binary, free_port())
    redis.start()
    engine = {"num_gpu_blocks_override": args.blocks}
    cap = capacity_rps(engine, 2, workload(args.requests, 1.0, args.blocks))
    rate = args.overload * cap
    work = workload(args.requests, rate, args.blocks)
    flags = ["--num-gpu-blocks-override", str(args.blocks)]
    base = {
        "policy": args.policy,
        "predictor": args.predictor,
        "admission": {"pending_s": 0.03 / args.time_scale}
        | ({} if args.max_waiting_tokens is None else {"max_waiting_tokens": args.max_waiting_tokens}),
        "redis_url": redis.url,
    }
    n = args.replicas
    led: dict[str, Any] = {} if args.sync_interval is None else {"sync_interval_s": args.sync_interval}
    setups: list[tuple[str, int, dict[str, Any]]] = [("1 gateway", 1, base)]
    if not args.skip_own:
        setups.append((f"{n} replicas, own ledgers", n, base))
    if args.order_none:
        setups.append((f"{n} replicas, ledger, order none", n, {**base, "ledger": {**led, "order": "none"}}))
    if args.one_ledger:
        setups.append(("1 gateway, shared ledger", 1, {**base, "ledger": led}))
    if args.local_history:
        setups.append((f"{n} replicas, ledger, own history", n, {**base, "ledger": led, LOCAL: True}))
    if args.publish_s is not None:
        setups.append(
            (
                f"{n} replicas, publish {1000 * args.publish_s:g} ms",
                n,
                {**base, "ledger": {**led, "publish_s": args.publish_s}},
            )
        )
    for share in args.send_first:
        setups.append(
            (f"{n} replicas, send first {share:g}", n, {**base, "ledger": {**led, "send_first_share": share}})
        )
    if args.burner > 0:
        setups.append((f"1 gateway, +{args.burner:g} core busy", 1, {**base, BURNER: args.burner}))
    setups.append((f"{n} replicas, shared ledger", n, {**base, "ledger": led}))
    print(
        f"## {len(work)} requests at {rate:.2f} req/s ({args.overload:g}x the saturated {cap:.2f}, engine time)"
    )
    print(f"   two simulated backends, {args.blocks} KV blocks of 16 each, time scale {args.time_scale:g}")
    print(
        f"{'setup':>32} {'preemptions':>12} {'req/s':>7} {'mean TTLT':>10} {'p99 TTLT':>9} {'errors':>7}"
        f" {'KV':>6} {'running':>7} {'tok/s*':>7} {'inv.':>6}   CPU s during the replay: gateways / backends / redis / client, of wall s"
    )
    runs: list[dict[str, tuple[float, float, float]]] = []
    try:
        for rep in range(args.repeats):
            k = rep % len(setups)
            order = setups[k:] + setups[:k]  # rotate, so no setup always runs first
            if args.repeats > 1:
                print(f"-- run {rep + 1} of {args.repeats}")
            row: dict[str, tuple[float, float, float]] = {}
            for label, count, settings in order:
                dump = (
                    None
                    if args.dump is None
                    else os.path.join(args.dump, f"run{rep + 1}-{slug(label)}.jsonl")
                )
                row[label] = run_setup(label, count, settings, work, flags, args.time_scale, redis, dump)
            runs.append(row)
    finally:
        redis.kill()
    report(runs, [label for label, _, _ in setups])


def run_setup(
    label: str,
    count: int,
    settings: dict[str, Any],
    work: list[Any],
    flags: list[str],
    time_scale: float,
    redis: RedisServer,
    dump: str | None = None,
) -> tuple[float, float, float]:
    """One setup on fresh backends: prints its row, returns (preemptions, req/s, loaded tok/s)."""
    from sagegate.core.summary import summarize

    prefix = f"bench:{uuid.uuid4().hex[:6]}"  # every setup run learns from an empty history
    if "ledger" in settings:
        settings = {**settings, "ledger": {**settings["ledger"], "enabled": True, "prefix": prefix}}
    with backend(time_scale, *flags) as b1, backend(time_scale, *flags) as b2:
        with (
            replicas([b1, b2], count, settings, f"{prefix}:history") as fronts,
            burner(settings.get(BURNER, 0.0)) as busy,
        ):
            groups = {"gateways": [PIDS[u] for u in fronts], "backends": [PIDS[b1], PIDS[b2]]}
            if redis.proc is not None:
                groups["redis"] = [redis.proc.pid]
            if busy is not None:
                groups["burner"] = [busy]
            before = {g: sum(cpu_seconds(p) for p in pids) for g, pids in groups.items()}
            me, t0 = os.times(), time.perf_counter()
            with BackendSampler([b1, b2], time_scale, interval_s=0.1) as sampler:
                records = asyncio.run(replay_split(work, fronts, time_scale))
            wall = time.perf_counter() - t0
            waits = commit_waits(fronts)
            first = sent_first(fronts)
            used = {g: sum(cpu_seconds(p) for p in pids) - before[g] for g, pids in groups.items()}
            mine = os.times()
            used["client"] = mine.user + mine.system - me.user - me.system
        pre = backend_preemptions([b1, b2])
    if dump is not None:
        write_records(dump, records)
    s = summarize(records)
    cpu = " / ".join(f"{used.get(g, float('nan')):.1f}" for g in ("gateways", "backends", "redis", "client"))
    if "burner" in used:
        cpu += f" (+ burner {used['burner']:.1f})"
    loaded = loaded_tok_s(records)
    inversions = out_of_order(records)
    samples = [x for series in sampler.series.values() for x in series]
    kv = sum(x.kv for x in samples) / max(1, len(samples))
    running = sum(x.running for x in samples) / max(1, len(samples))
    if waits is not None:
        cpu += f"; commit wait mean {waits[0]:.1f} ms, p90 <= {waits[1]:g} ms (wall, {waits[2]:.0f} answers)"
    if first[0]:
        cpu += f"; sent first {first[0]:.0f}, over {first[1]:.0f}"
    print(
        f"{label:>32} {pre:>12} {s['throughput_req_s']:>7.2f} {s['ttlt_mean_s']:>10.2f} "
        f"{s['ttlt_p99_s']:>9.2f} {s['errors'] + s['rejected']:>7.0f} {kv:>6.3f} {running:>7.1f} {loaded:>7.1f} {inversions:>6.2f}   "
        f"{cpu} of {wall:.1f}",
        flush=True,
    )
    return (float(pre) if pre != "?" else float("nan"), s["throughput_req_s"], loaded)


def commit_waits(fronts: list[str]) -> tuple[float, float, float] | None:
    """The replicas' wait from dispatch decision to Redis's answer over the replay (wall ms: mean,
    the bucket bound holding the 90th percentile, answers), from their ``/metrics``; None without a
    shared ledger."""
    import math

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    total = count = 0.0
    for url in fronts:
        text = httpx.get(url + "/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            if fam.name != "sagegate_ledger_commit_wait_seconds":
                continue
            for smp in fam.samples:
                if smp.name.endswith("_bucket"):
                    le = float(smp.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + smp.value
                elif smp.name.endswith("_sum"):
                    total += smp.value
                elif smp.name.endswith("_count"):
                    count += smp.value
    if count == 0:
        return None
    p90 = next((le for le in sorted(buckets) if buckets[le] >= 0.9 * count), math.inf)
    return 1000 * total / count, 1000 * p90, count


def sent_first(fronts: list[str]) -> tuple[float, float]:
    """The replicas' dispatches sent before Redis saw them, and the calls that found a backend over
    the limit (``send_first_share``), from their ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    first = over = 0.0
    for url in fronts:
        for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
            for smp in fam.samples:
                if smp.name == "sagegate_ledger_sent_first_total":
                    first += smp.value
                elif smp.name == "sagegate_ledger_over_total":
                    over += smp.value
    return first, over


def slug(label: str) -> str:
    """A setup's label as a file name."""
    return "-".join("".join(c if c.isalnum() else " " for c in label).split())


def write_records(path: str, records: list[Any]) -> None:
    """The client's records as JSON lines (``core.record.RequestRecord`` fields)."""
    import dataclasses
    import json

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(dataclasses.asdict(r)) + "\n")


def loaded_tok_s(records: list[Any]) -> float:
    """Output tokens per second while requests still arrive (from 10% into the arrival span to the
    last arrival), from each answer's chunk times. A finite replay's req/s is set by its makespan,
    and so by when the last long answers started; this is the rate the fleet kept while loaded."""
    arrivals = sorted(r.arrival_s for r in records)
    t0 = arrivals[0] + 0.1 * (arrivals[-1] - arrivals[0])
    t1 = arrivals[-1]
    tokens = 0.0
    for r in records:
        if r.status == "ok" and r.chunk_times:
            tokens += r.output_tokens / len(r.chunk_times) * sum(t0 <= t <= t1 for t in r.chunk_times)
    return tokens / max(t1 - t0, 1e-9)


def out_of_order(records: list[Any], margin_s: float = 1.0) -> float:
    """Pairs served out of arrival order, per request: a later arrival whose first token came more
    than ``margin_s`` (engine) before an earlier one's. Under ``fcfs`` one gateway keeps arrival
    order up to prefill times; replicas keep it only as far as their shared threshold does."""
    started = sorted((r.arrival_s, r.first_token_s) for r in records if r.first_token_s is not None)
    pairs = sum(1 for i, (_, a) in enumerate(started) for _, b in started[i + 1 :] if b < a - margin_s)
    return pairs / max(1, len(started))


def report(runs: list[dict[str, tuple[float, float, float]]], labels: list[str]) -> None:
    """Each setup against the one gateway of the same run; with several runs, the medians."""
    from statistics import median

    first = labels[0]
    print("\nagainst 1 gateway (same run):")
    for label in labels[1:]:
        pres = [(r[label][0], r[first][0]) for r in runs]
        tps = [r[label][1] / r[first][1] for r in runs]
        loaded = [r[label][2] / r[first][2] for r in runs]
        each = ", ".join(f"{p:.0f}/{p1:.0f} {t:.3f}x" for (p, p1), t in zip(pres, tps, strict=True))
        total_ratio = sum(p for p, _ in pres) / max(1.0, sum(p1 for _, p1 in pres))
        print(
            f"{label:>32}: preemptions {total_ratio:.2f}x (summed over runs), "
            f"throughput median {median(tps):.3f}x  [{each}]; tok/s under load median {median(loaded):.3f}x "
            f"[{', '.join(f'{x:.3f}' for x in loaded)}]"
        )


if __name__ == "__main__":
    main()
