"""Gateway benchmarks: overhead, capacity, dispatch cost, and admission at 2x overload.

    .venv/bin/python -m benchmarks bench_gateway overhead   [--n 300] [--predictors none,length-bucket]
    .venv/bin/python -m benchmarks bench_gateway capacity   [--duration 4] [--no-litellm]
    .venv/bin/python -m benchmarks bench_gateway compare    # overhead + capacity + one summary table
    .venv/bin/python -m benchmarks bench_gateway dispatch   [--queued 10000 --backends 64]
    .venv/bin/python -m benchmarks bench_gateway admission  [--requests 500] [--rules peak,sum]
    .venv/bin/python -m benchmarks bench_gateway all

Every server is a real process on loopback (``sagegate backend`` and ``python -m sagegate.cmd_serve``);
the client is this process. Figures are printed; nothing is asserted.

``overhead``/``capacity``/``compare`` put the same request stream (chat by default) through each proxy in
turn: sagegate with each ``--predictors`` entry, then LiteLLM's proxy (``litellm[proxy]`` in its own venv,
``.venv-litellm/``, made by ``benchmarks/litellm_env.sh``; skipped with a note when absent). Every proxy
is one process: LiteLLM runs with ``--num_workers 1``, as sagegate's gateway is one process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.load import (
    LIMIT_MS,
    backend_preemptions,
    capacity_rps,
    capacity_sweep,
    median_ms,
    open_loop,
    replay_split,
    ttft_ttlt,
    warm_embedder,
)
from benchmarks.servers import PIDS, backend, gateway, stop_server, wait_ready
from sagegate.harness.procs import free_port

REPO = Path(__file__).resolve().parents[1]

LITELLM_BIN = REPO / ".venv-litellm" / "bin" / "litellm"  # benchmarks/litellm_env.sh makes it


# --- LiteLLM's proxy (the backends and sagegate's gateway: benchmarks.servers) --------------------
@contextlib.contextmanager
def litellm_proxy(backends: Sequence[str]) -> Iterator[str]:
    """LiteLLM's proxy from ``.venv-litellm`` (``benchmarks/litellm_env.sh``), one worker process, with
    each backend an ``openai/sim`` deployment behind simple-shuffle routing; no database, no key (as
    sagegate runs here), no callbacks, the local model cost map, and only errors logged."""
    port = free_port()
    cfg = {
        "model_list": [
            {
                "model_name": "sim",
                "litellm_params": {"model": "openai/sim", "api_base": f"{b}/v1", "api_key": "none"},
            }
            for b in backends
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 0},
        "litellm_settings": {
            "telemetry": False,
            "set_verbose": False,
            "drop_params": True,
            "request_timeout": 60,
        },
        # no key, as sagegate's gateway runs here (no ``api_keys``): LiteLLM >= 1.108 refuses that unless told
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False",
               DISABLE_SCHEMA_UPDATE="True", NO_DOCS="True", PYTHONUNBUFFERED="1")  # fmt: skip
    cmd = [
        str(LITELLM_BIN),
        "--config",
        f.name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    log = tempfile.NamedTemporaryFile("w+b", suffix=".litellm.log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        try:
            wait_ready(url, "/health/readiness", proc, timeout=180)
        except RuntimeError:
            log.seek(0)
            sys.stderr.write(log.read()[-3000:].decode(errors="replace"))
            raise
        yield url
    finally:
        stop_server(proc)
        log.close()
        os.unlink(log.name)
        os.unlink(f.name)


# --- what sits in front of the backends -----------------------------------------------------------
ROUTER = "vllm-router"
"""vllm-router ``round_robin`` (its Rust binary, installed beside this Python from PyPI): the compiled
front a user could put there instead."""


def _target_names(predictors: Sequence[str], with_litellm: bool, with_router: bool = False) -> list[str]:
    return (
        [f"sagegate/{p}" for p in predictors]
        + ([ROUTER] if with_router else [])
        + (["litellm"] if with_litellm else [])
    )


@contextlib.contextmanager
def front(name: str, backends: Sequence[str], **gw_settings: Any) -> Iterator[str]:
    """One proxy process in front of ``backends``: ``sagegate/<predictor>``, ``vllm-router`` or
    ``litellm``."""
    if name == "litellm":
        with litellm_proxy(backends) as url:
            yield url
    elif name == ROUTER:
        from sagegate.harness.live import vllm_router_binary, vllm_router_process

        binary = vllm_router_binary()
        if binary is None:
            raise RuntimeError("vllm-router is not installed beside this Python")
        with vllm_router_process(binary, backends, "round_robin") as (url, proc):
            PIDS[url] = proc.pid
            yield url
    else:
        predictor = name.split("/", 1)[1]
        with gateway(backends, predictor=predictor, **gw_settings) as url:
            if predictor == "semantic":
                warm_embedder(url)
            yield url


def litellm_available(skip: bool) -> bool:
    if skip:
        print("\n(note: LiteLLM skipped by --no-litellm)")
        return False
    if not LITELLM_BIN.exists():
        print(
            f"\n(note: {LITELLM_BIN.relative_to(REPO)} is absent: LiteLLM skipped; create it with benchmarks/litellm_env.sh)"
        )
        return False
    return True


# --- figures --------------------------------------------------------------------------------------
def _pct_ms(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 and a == a and b == b else "-"


def _num(x: float, spec: str) -> str:
    """``x`` formatted, or ``-`` when it was not measured (NaN)."""
    return format(x, spec) if x == x else "-"


# --- overhead -------------------------------------------------------------------------------------
async def _overhead_pairs(direct: str, gw: str, n: int, route: str) -> tuple[list[float], list[float]]:
    """``n`` (direct, proxied) TTFT pairs, one request at a time, the order alternating within pairs."""
    d_t: list[float] = []
    g_t: list[float] = []
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(20):  # warm both paths (connections, tokenizer, caches)
            await ttft_ttlt(c, direct, 4, route)
            await ttft_ttlt(c, gw, 4, route)
        for i in range(n):
            order = (direct, gw) if i % 2 == 0 else (gw, direct)
            for url in order:
                t, _, _ = await ttft_ttlt(c, url, 4, route)
                (d_t if url == direct else g_t).append(t)
    return d_t, g_t


def bench_overhead(n: int, predictors: Sequence[str], with_litellm: bool, route: str) -> dict[str, float]:
    """Median added TTFT (ms) per proxy; each proxy runs alone, paired request by request with direct."""
    print(
        f"\n## Overhead: median TTFT through a proxy minus direct (low load, one request at a time, {route})"
    )
    print(
        f"   one simulated backend (time scale 20), {n} pairs per proxy, each proxy one process, started alone"
    )
    print(
        f"{'path':>24} {'direct ms':>10} {'proxied ms':>11} {'added ms':>9} {'added p90 ms':>13} "
        f"{'vs sagegate/none':>17}"
    )
    added_med: dict[str, float] = {}
    all_direct: list[float] = []
    rows: list[tuple[str, float, float, float, float]] = []
    with backend(20.0) as be:
        for name in _target_names(predictors, with_litellm):
            try:
                with front(name, [be], policy="sagesched") as gw:
                    d, g = asyncio.run(_overhead_pairs(be, gw, n, route))
            except RuntimeError as exc:
                print(f"{name:>24}  skipped: {exc}")
                continue
            all_direct += d
            added = [b - a for a, b in zip(d, g, strict=True)]
            added_med[name] = median_ms(g) - median_ms(d)
            rows.append((name, median_ms(d), median_ms(g), added_med[name], _pct_ms(added, 0.9)))
    if all_direct:
        print(f"{'direct':>24} {median_ms(all_direct):>10.2f} {'-':>11} {0:>9.2f} {'-':>13} {'-':>17}")
    base = added_med.get("sagegate/none", float("nan"))
    for name, dm, gm, am, p90 in rows:
        print(f"{name:>24} {dm:>10.2f} {gm:>11.2f} {am:>9.2f} {p90:>13.2f} {_ratio(am, base):>17}")
    return added_med


# --- capacity -------------------------------------------------------------------------------------


@dataclass
class Capacity:
    """One proxy's capacity figures. CPU is the proxy's own, net of its idle rate (health probes,
    metric scrapes), per request or per SSE chunk, from its busiest run of each sweep: unlike the
    latency criterion, it hardly moves with what else the machine runs."""

    req_s: float = float("nan")
    chunks_s: float = float("nan")
    cpu_us_req: float = float("nan")
    cpu_us_chunk: float = float("nan")


def bench_capacity(
    duration: float, rates: Sequence[float], chunk_rates: Sequence[float], predictors: Sequence[str],
    with_litellm: bool, route: str, refine: int, with_router: bool = False,
) -> dict[str, Capacity]:  # fmt: skip
    """Highest request rate and SSE chunk rate each proxy sustains with added median TTFT ≤ 10 ms."""
    print(
        f"\n## Capacity: open-loop Poisson load against two fast simulated backends (time scale 1000, {route})"
    )
    print(
        "   added = median TTFT through the proxy - median TTFT direct at the same offered rate (measured just"
    )
    print(f"   before); a proxy's sweep stops at the first rate where added > {LIMIT_MS:g} ms or errors > 1%")
    print("   ('over'), then bisects. CPU % = the proxy process (and any children) over the proxied run;")
    print("   us/req and us/chunk = that CPU net of the proxy's idle rate, per request and per SSE chunk")
    open_admission = {"policy": "fcfs", "admission": {"max_waiting": 1_000_000, "target": 1000.0}}
    found: dict[str, Capacity] = {}
    with backend(1000.0) as b1, backend(1000.0) as b2:
        asyncio.run(open_loop([b1, b2], 20, 1, 2, route))  # warm up the backends
        for label, max_tokens, sweep in (("requests", 2, rates), ("chunks", 64, chunk_rates)):
            print(f"\n{label} sweep (max_tokens={max_tokens})")
            print(
                f"{'proxy':>22} {'req/s':>7} {'chunks/s':>9} {'direct ms':>10} {'proxied ms':>11} {'added ms':>9} "
                f"{'CPU %':>6} {'us/req':>10} {'us/chunk':>11} {'errors':>7}"
            )
            for name in _target_names(predictors, with_litellm, with_router):
                try:
                    with front(name, [b1, b2], **open_admission) as gw:
                        asyncio.run(open_loop([gw], 20, 1, 2, route))  # warm up: tokenizers, connections
                        rate, chunks, us_req, us_chunk = capacity_sweep(
                            name, gw, [b1, b2], sweep, refine, duration, max_tokens, route
                        )
                except RuntimeError as exc:
                    print(f"{name:>22}  skipped: {exc}")
                    continue
                c = found.setdefault(name, Capacity())
                if label == "requests":
                    c.req_s, c.cpu_us_req = rate, us_req
                else:
                    c.chunks_s, c.cpu_us_chunk = chunks, us_chunk
    return found


def print_summary(added: dict[str, float], cap: dict[str, Capacity]) -> None:
    """One table: every proxy's overhead and capacity, and each one's ratio to LiteLLM's."""
    names = list(dict.fromkeys([*added, *cap]))
    if not names:
        return
    lite_added = added.get("litellm", float("nan"))
    lite = cap.get("litellm", Capacity())
    print(
        f"\n## Summary (one process per proxy; capacity = highest rate with added median TTFT <= {LIMIT_MS:g} ms;"
    )
    print(
        "   CPU = the proxy's own net CPU per request (2-token replies) and per SSE chunk (64-token replies))"
    )
    print(
        f"{'path':>22} {'added TTFT ms':>14} {'LiteLLM/this':>13} {'max req/s':>10} {'this/LiteLLM':>13} "
        f"{'max chunks/s':>13} {'this/LiteLLM':>13} {'CPU us/req':>11} {'CPU us/chunk':>13}"
    )
    for name in names:
        a = added.get(name, float("nan"))
        c = cap.get(name, Capacity())
        print(
            f"{name:>22} {_num(a, '.2f'):>14} {_ratio(lite_added, a):>13} {_num(c.req_s, '.0f'):>10} "
            f"{_ratio(c.req_s, lite.req_s):>13} {_num(c.chunks_s, '.0f'):>13} {_ratio(c.chunks_s, lite.chunks_s):>13} "
            f"{_num(c.cpu_us_req, '.0f'):>11} {_num(c.cpu_us_chunk, '.1f'):>13}"
        )


# --- dispatch cost --------------------------------------------------------------------------------
def bench_dispatch(queued: int, n_backends: int, policy_name: str, cycles: int, rule: str = "peak") -> None:
    from sagegate.core.distribution import LengthDistribution
    from sagegate.gateway.backends import BackendPool
    from sagegate.gateway.dispatcher import Dispatcher
    from sagegate.gateway.queue import BoundedQueue, GatewayRequest
    from sagegate.gateway.settings import GatewaySettings
    from sagegate.policies.admission import AdmissionConfig
    from sagegate.policies.registry import parse_policy

    rng = random.Random(0)
    dists = [
        LengthDistribution.from_samples([rng.lognormvariate(5, 1) for _ in range(200)], max_points=32)
        for _ in range(64)
    ]

    async def run() -> tuple[list[float], list[float], int, float]:
        s = GatewaySettings.model_validate({"backends": [f"http://b{i}" for i in range(n_backends)]})
        pool = BackendPool(s, httpx.AsyncClient())
        cfg = AdmissionConfig(rule=rule)  # type: ignore[arg-type]
        for b in pool.backends:
            b.load.capacity_tokens = 32_768  # ~10 requests each: the in-flight a process can stream
            b.load.healthy = True
        policy = parse_policy(policy_name)
        d = Dispatcher(policy, pool, cfg, BoundedQueue(policy, 10**9, 10**12), clock=time.perf_counter)
        d.kick = lambda: None  # type: ignore[method-assign]  # the loop never runs here: one pass per cycle
        rid = 0
        running: list[list[GatewayRequest]] = [[] for _ in pool.backends]

        def make() -> GatewayRequest:
            nonlocal rid
            rid += 1
            return GatewayRequest(
                rid, time.perf_counter(), rng.randint(16, 4096), body={}, route="chat", model="sim", prompt="",
                prediction=rng.choice(dists),
            )  # fmt: skip

        def submit() -> None:
            r = make()
            d.submit(r).add_done_callback(lambda f, r=r: started.append(r) if not f.exception() else None)

        async def settle() -> None:
            """What was sent started (its first byte): it runs there and no longer counts as waiting."""
            await asyncio.sleep(0)  # the futures' callbacks
            for r in started:
                assert r.backend is not None
                pool.backends[r.backend].started(r.rid)
                running[r.backend].append(r)
            started.clear()

        started: list[GatewayRequest] = []
        for _ in range(queued):  # the fleet fills until the rule refuses the head; the rest queue
            submit()
            await settle()
        while d.dispatch():  # a policy that dispatches from the loop (kick) fills here
            await settle()
        await settle()
        push_t, decide_t = [], []
        sent = 0
        for _ in range(cycles):
            i = rng.randrange(n_backends)
            for r in running[i]:  # the backend's requests streamed a few tokens each...
                d.progress(r, r.generated + rng.randint(1, 8))
            if running[i]:  # ...and one finished: room for about one more
                d.release(running[i].pop(rng.randrange(len(running[i]))))
            t0 = time.perf_counter()
            sent += d.dispatch()
            t1 = time.perf_counter()
            submit()
            t2 = time.perf_counter()
            await settle()
            decide_t.append(t1 - t0)
            push_t.append(t2 - t1)
        inflight = sum(len(x) for x in running) / n_backends
        return push_t, decide_t, sent, inflight

    push_t, decide_t, sent, inflight = asyncio.run(run())
    print(
        f"{policy_name:>14} {rule:>5} {queued:>7} {n_backends:>4} {inflight:>9.1f} "
        f"{statistics.median(decide_t) * 1e6:>12.1f} {_pct_ms(decide_t, 0.99) * 1000:>11.1f} "
        f"{statistics.median(push_t) * 1e6:>11.1f} {sent / cycles:>10.2f}"
    )


def bench_dispatch_all(queued: int, n_backends: int, cycles: int) -> None:
    print(f"\n## Dispatch cost: {queued} queued, {n_backends} backends (microseconds)")
    print("   pass = one dispatch call after a backend's requests streamed and one finished: dispatch")
    print("   the head, then find the next head held (two decisions); enqueue = an arrival, including")
    print("   its rank (Gittins table for sagesched) and KV charge; in-flight = requests per backend")
    print(
        f"{'policy':>14} {'rule':>5} {'queued':>7} {'bk':>4} {'in-flight':>9} {'pass med us':>12} "
        f"{'pass p99 us':>11} {'enqueue us':>11} {'sent/pass':>10}"
    )
    for name in ("sagesched", "fcfs", "edf", "kv-constrained"):
        for rule in ("peak", "sum"):
            bench_dispatch(queued, n_backends, name, cycles, rule)


# --- admission at 2x overload ---------------------------------------------------------------------


def bench_admission(n: int, overload: float, time_scale: float, blocks: int, rules: Sequence[str]) -> None:
    from sagegate.core.request import DEFAULT_CLIENT_MAX_TOKENS
    from sagegate.core.summary import summarize
    from sagegate.loadgen.prompts import filler_text
    from sagegate.loadgen.records import with_client_cap
    from sagegate.loadgen.synthetic import synthetic_workload

    engine = {"num_gpu_blocks_override": blocks}
    fits = blocks * 16 // 2

    def workload(rate: float) -> list[Any]:
        # Distinct prompts (no shared prefix), so the engines' prefix caches hold each one in full
        # and the simulator's capacity is the live backends' capacity.
        # A client's cap as max_tokens (never the true length, which goes only to the simulated
        # backend: see core.request.FORCED_OUTPUT_FIELD).
        reqs = synthetic_workload(n, rate=rate, prompt_mean=1024, output_mean=512, sigma=1.0, seed=3)
        return with_client_cap(
            [
                replace(r, prompt=filler_text(r.prompt_tokens, seed=r.rid))
                for r in reqs
                if r.prompt_tokens + r.output_tokens < fits
            ],
            DEFAULT_CLIENT_MAX_TOKENS,
        )

    cap = capacity_rps(engine, 2, workload(1.0))
    rate = overload * cap
    work = workload(rate)
    flags = ["--num-gpu-blocks-override", str(blocks)]
    print(f"\n## Admission at {overload:g}x overload: {len(work)} requests at {rate:.2f} req/s (engine time)")
    print(f"   two simulated H100 backends, {blocks} KV blocks of 16 each, time scale {time_scale:g}; ")
    print(f"   saturated capacity (simulator, vLLM alone): {cap:.2f} req/s; times below are engine seconds")
    print(
        f"{'setup':>28} {'preemptions':>12} {'req/s':>7} {'tok/s':>8} {'mean TTFT':>10} {'mean TTLT':>10} "
        f"{'p99 TTLT':>9} {'errors':>7}"
    )
    setups: list[tuple[str, dict[str, Any] | None]] = [("vLLM alone (round robin)", None)]
    for rule in rules:
        for policy in ("fcfs", "sagesched"):
            admission = {"rule": rule, "pending_s": 0.03 / time_scale}  # pending: about one engine step
            setups.append((f"gateway {policy}, {rule} rule", {"policy": policy, "admission": admission}))
    for label, gw_settings in setups:
        with backend(time_scale, *flags) as b1, backend(time_scale, *flags) as b2:
            if gw_settings is None:
                records = asyncio.run(replay_split(work, [b1, b2], time_scale))
            else:
                with gateway([b1, b2], predictor="global", **gw_settings) as gw:
                    records = asyncio.run(replay_split(work, [gw], time_scale))
            pre = backend_preemptions([b1, b2])
        s = summarize(records)
        print(
            f"{label:>28} {pre:>12} {s['throughput_req_s']:>7.2f} {s['throughput_tok_s']:>8.0f} "
            f"{s['ttft_mean_s']:>10.2f} {s['ttlt_mean_s']:>10.2f} "
            f"{s['ttlt_p99_s']:>9.2f} {s['errors'] + s['rejected']:>7.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["overhead", "capacity", "compare", "dispatch", "admission", "all"])
    ap.add_argument("--n", type=int, default=300, help="overhead: request pairs per proxy")
    ap.add_argument("--duration", type=float, default=4.0, help="capacity: seconds per rate")
    ap.add_argument("--rates", default="10,25,50,100,150,200,300,400,600")
    ap.add_argument("--chunk-rates", default="5,10,20,40,60,80,120,160")
    ap.add_argument("--refine", type=int, default=2, help="capacity: bisection steps after the grid")
    ap.add_argument("--predictors", default="none,length-bucket,semantic", help="sagegate predictors to run")
    ap.add_argument(
        "--route", choices=["chat", "completions"], default="chat", help="overhead/capacity requests"
    )
    ap.add_argument("--no-litellm", action="store_true", help="overhead/capacity: leave LiteLLM's proxy out")
    ap.add_argument("--router", action="store_true", help="capacity: vllm-router round_robin beside them")
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--backends", type=int, default=64)
    ap.add_argument("--cycles", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=500, help="admission: requests")
    ap.add_argument("--overload", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=4.0, help="admission: backends' time scale")
    ap.add_argument("--blocks", type=int, default=1024, help="admission: KV blocks per backend")
    ap.add_argument("--rules", default="peak", help="admission: the gateway's rules to run (peak,sum)")
    args = ap.parse_args()
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    predictors = [p for p in args.predictors.split(",") if p]
    proxies = args.what in ("overhead", "capacity", "compare", "all")
    with_litellm = litellm_available(args.no_litellm) if proxies else False
    added: dict[str, float] = {}
    cap: dict[str, Capacity] = {}
    if args.what in ("dispatch", "all"):
        bench_dispatch_all(args.queued, args.backends, args.cycles)
    if args.what in ("overhead", "compare", "all"):
        added = bench_overhead(args.n, predictors, with_litellm, args.route)
    if args.what in ("capacity", "compare", "all"):
        cap = bench_capacity(
            args.duration, floats(args.rates), floats(args.chunk_rates), predictors, with_litellm, args.route,
            args.refine, args.router,
        )  # fmt: skip
    if proxies:
        print_summary(added, cap)
    if args.what in ("admission", "all"):
        bench_admission(args.requests, args.overload, args.time_scale, args.blocks, args.rules.split(","))
    print(json.dumps({"python": sys.version.split()[0], "cpus": os.cpu_count(), "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
