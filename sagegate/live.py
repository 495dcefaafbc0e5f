"""The live set-up that ``sagegate demo`` and ``benchmarks/bench_value.py`` share: a slice of the Azure
conversation trace with ShareGPT prompts, simulated backends in their own processes, vLLM alone as a
plain round-robin balancer over them, and the gateway in front of them.

One place, so the demo and the benchmark measure the same thing the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.client import ReplayConfig
    from loadgen.records import TraceRequest
    from loadgen.results import RequestRecord


def azure_workload(minutes: float, rate_scale: float, seed: int) -> list[TraceRequest]:
    """The Azure conversation trace's first ``minutes`` (after compressing it ``rate_scale``×) with
    ShareGPT prompts paired by length; a synthetic workload with filler prompts when the shared data
    is absent."""
    from loadgen.data import AZURE_CONV, SHAREGPT, data_file
    from loadgen.schedule import prepare_workload

    trace, pairs = data_file(*AZURE_CONV), data_file(*SHAREGPT)
    if trace.exists() and pairs.exists():
        work = prepare_workload(
            trace, duration=minutes * 60, rate_scale=rate_scale, prompts="sharegpt", sharegpt=pairs, seed=seed
        )
    else:
        print(
            f"note: {trace} or {pairs} is absent: a synthetic workload with filler prompts", file=sys.stderr
        )
        work = prepare_workload(
            "synthetic",
            rate=5.0 * rate_scale,
            requests=int(minutes * 300 * rate_scale),
            prompts="filler",
            seed=seed,
        )
    return work.requests


def replay_config(
    url: str,
    time_scale: float,
    *,
    metrics: bool = False,
    timeout_s: float = 600.0,
    max_connections: int = 1000,
) -> ReplayConfig:
    """How the demo and the benchmark replay: open loop, engine-time clock, the gateway's queue depth
    polled when ``metrics``. ``timeout_s`` (wall, per request) and ``max_connections`` must cover an
    overloaded run's backlog, or the client itself would queue or cut requests."""
    from loadgen.client import ReplayConfig

    return ReplayConfig(
        url=url,
        time_scale=time_scale,
        queue_metric="sagegate_queue_depth" if metrics else None,
        timeout_s=timeout_s,
        max_connections=max_connections,
    )


async def round_robin(
    work: Sequence[TraceRequest],
    urls: Sequence[str],
    time_scale: float,
    *,
    timeout_s: float = 600.0,
    max_connections: int = 1000,
) -> list[RequestRecord]:
    """vLLM alone: a plain balancer sends request i to backend i mod n."""
    from loadgen.client import replay_async

    parts = [list(work[i :: len(urls)]) for i in range(len(urls))]
    results = await asyncio.gather(
        *(
            replay_async(
                p, replay_config(u, time_scale, timeout_s=timeout_s, max_connections=max_connections)
            )
            for p, u in zip(parts, urls, strict=True)
        )
    )
    return sorted((r for res in results for r in res.records), key=lambda r: r.rid)


def backend_args(model: str, gpu: str, time_scale: float) -> list[str]:
    return ["--model", model, "--gpu", gpu, "--time-scale", str(time_scale)]


@contextlib.contextmanager
def backends(n: int, model: str, gpu: str, time_scale: float) -> Iterator[list[str]]:
    """``n`` fresh ``sagegate backend`` processes (empty KV cache and prefix cache); all stopped on exit."""
    from sagegate.procs import spawned

    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(spawned("sagegate.cmd_backend", backend_args(model, gpu, time_scale)))
            for _ in range(n)
        ]
        yield urls


@contextlib.contextmanager
def gateway(
    urls: Sequence[str], policy: str, predictor: str, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``sagegate serve`` in front of ``urls`` (embedded history store, offline); ``env`` adds settings
    (``SAGEGATE_...`` variables). Stopped on exit."""
    from sagegate.procs import spawned

    args = [
        "serve",
        *(a for u in urls for a in ("--backend", u)),
        "--policy",
        policy,
        "--predictor",
        predictor,
    ]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    with spawned("sagegate.cli", args, ready_path="/ready", startup_timeout_s=120, env=full_env) as url:
        yield url
