"""The live set-up that ``sagegate demo`` and ``benchmarks/bench_value.py`` share: a slice of the Azure
conversation trace carrying real ShareGPT prompt-response pairs, simulated backends in their own
processes, vLLM alone as a plain round-robin balancer over them, and the gateway in front of them.

One place, so the demo and the benchmark measure the same thing the same way.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.request import DEFAULT_CLIENT_MAX_TOKENS, TraceRequest

if TYPE_CHECKING:
    from core.record import RequestRecord
    from loadgen.client import ReplayConfig


@dataclass
class DemoWorkload:
    """The requests, and what a reader of the results must know about them."""

    requests: list[TraceRequest]
    description: str
    real_text: bool
    """True: each prompt's text is a real prompt and its output the length of that prompt's real
    response, so a text-reading predictor is judged fairly; False: filler text (use a length-only
    predictor)."""


def azure_workload(
    minutes: float,
    rate_scale: float,
    seed: int,
    max_tokens: int | None = DEFAULT_CLIENT_MAX_TOKENS,
    *,
    quiet: bool = False,
) -> DemoWorkload:
    """The Azure conversation trace's first ``minutes`` of arrivals (compressed ``rate_scale``×), each
    request a real ShareGPT first-turn pair (a seeded shuffle, each pair once while they last) with
    the *response's own length* as its output, and the client cap ``max_tokens``. Without the pairs:
    the trace's lengths with filler prompts, said to be so (unless ``quiet``)."""
    from loadgen.data import AZURE_CONV, SHAREGPT, find_data
    from loadgen.schedule import prepare_workload
    from predictor.learned import learned_prompts

    found_trace, found_pairs = find_data(*AZURE_CONV), find_data(*SHAREGPT)
    if found_trace is not None and found_pairs is not None:
        trace, pairs = found_trace.path, found_pairs.path
        if not quiet:
            print(f"data: {found_trace.describe()}; {found_pairs.describe()}", file=sys.stderr)
        work = prepare_workload(
            trace,
            duration=minutes * 60,
            rate_scale=rate_scale,
            prompts="paired",
            sharegpt=pairs,
            seed=seed,
            max_tokens=max_tokens,
            exclude_prompts=learned_prompts(),  # the shipped prior and encoder tune learned from them
        )
        what = (
            f"Azure 2023 conversation arrivals ({minutes:g} min), each request a real ShareGPT prompt "
            f"with its own response's length (client cap max_tokens={max_tokens})"
        )
        return DemoWorkload(work.requests, what, real_text=True)
    if not quiet:
        print("note: the Azure trace or the ShareGPT pairs are absent: synthetic lengths, filler prompts")
    work = prepare_workload(
        "synthetic",
        rate=5.0 * rate_scale,
        requests=int(minutes * 300 * rate_scale),
        prompts="filler",
        seed=seed,
        max_tokens=max_tokens,
    )
    return DemoWorkload(work.requests, "synthetic lengths with filler text (no real prompts)", False)


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
    progress: bool = False,
) -> list[RequestRecord]:
    """vLLM alone: a plain balancer sends request i to backend i mod n (one replay, one clock)."""
    from loadgen.client import replay_async

    cfg = replay_config(urls[0], time_scale, timeout_s=timeout_s, max_connections=max_connections)
    cfg.spread, cfg.progress = list(urls), progress
    cfg.backend_metrics = [u + "/metrics" for u in urls]
    return (await replay_async(work, cfg)).records


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


@dataclass
class BackendSample:
    t: float
    """Engine seconds since the sampler started."""
    kv: float
    running: float
    waiting: float


class BackendSampler:
    """Reads every backend's KV usage, running and waiting gauges every ``interval_s`` (wall) in a
    thread of its own, so the pictures of a run show what the engines really held."""

    GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")

    def __init__(self, urls: Sequence[str], time_scale: float, interval_s: float = 0.5) -> None:
        import threading

        self.urls = list(urls)
        self.time_scale = time_scale
        self.interval_s = interval_s
        self.series: dict[str, list[BackendSample]] = {u: [] for u in self.urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backend-sampler", daemon=True)

    def __enter__(self) -> BackendSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import time

        import httpx

        from loadgen.scrape import gauge_value

        t0 = time.monotonic()
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while not self._stop.is_set():
                t = (time.monotonic() - t0) * self.time_scale
                for url in self.urls:
                    try:
                        text = client.get(url + "/metrics").text
                        kv, running, waiting = (gauge_value(text, g) or 0.0 for g in self.GAUGES)
                    except (httpx.HTTPError, ValueError):
                        continue
                    self.series[url].append(BackendSample(t, kv, running, waiting))
                self._stop.wait(self.interval_s)
