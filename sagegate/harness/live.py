"""The live set-ups that ``sagegate demo`` and the benchmarks share: the demo's workloads (multi-turn
ShareGPT sessions on Azure arrivals; the Azure trace with ShareGPT first-turn pairs, which
``benchmarks/bench_value.py`` replays), simulated backends in their own processes, vLLM alone as a
plain round-robin balancer over them, vllm-router, the gateway, and the backends' gauges and counters.

One place, so the demo and the benchmarks measure the same thing the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sagegate.core.request import DEFAULT_CLIENT_MAX_TOKENS, TraceRequest
from sagegate.loadgen.records import with_client_cap

if TYPE_CHECKING:
    import subprocess

    from sagegate.core.record import RequestRecord
    from sagegate.loadgen.client import ReplayConfig


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
    from sagegate.loadgen.data import AZURE_CONV, SHAREGPT, find_data
    from sagegate.loadgen.schedule import prepare_workload
    from sagegate.predictor.learned import learned_prompts

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


def sessions_workload(
    minutes: float,
    rate_scale: float,
    draw: int,
    max_tokens: int | None = DEFAULT_CLIENT_MAX_TOKENS,
) -> DemoWorkload:
    """Multi-turn ShareGPT conversations with their real text (each turn re-sends its whole history;
    the real reply's length is its output) starting on the Azure conversation trace's arrivals,
    compressed ``rate_scale``×. Draw ``draw`` takes its own part of the trace's hour and its own
    conversations (a seeded order). Turns after ``minutes`` are cut: a short window's later turns would
    trickle in for minutes. None of the conversations is one a shipped predictor part learned from."""
    import numpy as np

    azure, conversations = session_parts()
    window_s = minutes * 60.0
    first = (600.0 * draw) % max(azure[-1] - window_s * rate_scale, 1.0)
    starts = [(t - first) / rate_scale for t in azure if first <= t < first + window_s * rate_scale]
    order = np.random.default_rng(draw).permutation(len(conversations))
    turns = [
        replace(r, arrival_s=start + r.arrival_s)
        for start, i in zip(starts, order, strict=False)
        for r in conversations[int(i)]
        if start + r.arrival_s < window_s
    ]
    turns.sort(key=lambda r: r.arrival_s)
    kept = with_client_cap([replace(r, rid=i) for i, r in enumerate(turns)], max_tokens)
    what = (
        f"multi-turn ShareGPT conversations ({min(len(starts), len(conversations))} sessions over "
        f"{window_s:.0f} s; each turn its whole history, real text, the real reply's length) starting on "
        f"Azure 2023 conversation arrivals (draw {draw}; client cap max_tokens={max_tokens})"
    )
    return DemoWorkload(kept, what, real_text=True)


def demo_draw(
    draw: int, minutes: float, target: float, model: str, gpu: str
) -> tuple[list[TraceRequest], dict[str, object]]:
    """The demo's draw ``draw``: multi-turn sessions (:func:`sessions_workload`) over ``minutes`` at
    ``target`` × round robin's capacity, measured on a larger sample of the same mix; its requests
    and what a reader must know of them."""
    from dataclasses import replace

    from sagegate.harness.simtwin import capacity, offered_rate, scale_at, utilisation

    # a large sample of windows of the same length from other parts of the trace (a window's turns are
    # mostly early ones, with short histories: a longer window is another mix; and a burst of a few
    # hundred requests all fit in the engines at once, which reads capacity high)
    mix: list[TraceRequest] = []
    other = draw + 1000
    while len(mix) < 2000:
        mix += sessions_workload(minutes, 4.0, other).requests
        other += 1
    mix = [replace(r, rid=i) for i, r in enumerate(sorted(mix, key=lambda r: r.arrival_s))]
    cap = capacity(mix, model=model, gpu=gpu)
    rate_at = lambda s: offered_rate(sessions_workload(minutes, s, draw).requests)  # noqa: E731
    scale = scale_at(rate_at, target * cap["req_s"])
    work = sessions_workload(minutes, scale, draw)
    info = {
        "draw": draw,
        "description": work.description,
        "requests": len(work.requests),
        "rate_scale": scale,
        "capacity_req_s": cap["req_s"],
        "capacity_tok_s": cap["tok_s"],
        "utilisation": utilisation(work.requests, cap),
    }
    return work.requests, info


@functools.lru_cache(maxsize=1)
def session_parts() -> tuple[list[float], list[list[TraceRequest]]]:
    """The Azure trace's arrival times, and the conversations, each as its turns timed from the
    session's start (read once: the bisection on the rate asks often)."""
    from sagegate.loadgen.data import AZURE_CONV, SHAREGPT_SESSIONS, find_data
    from sagegate.loadgen.readers import read_trace
    from sagegate.predictor.learned import learned_prompts

    found_trace, found_convs = find_data(*AZURE_CONV), find_data(*SHAREGPT_SESSIONS)
    if found_trace is None or found_convs is None:
        raise FileNotFoundError(
            "the Azure trace or the ShareGPT conversations are missing: sagegate data list"
        )
    azure = [r.arrival_s for r in read_trace(found_trace.path, "azure")]
    every = read_trace(
        found_convs.path,
        "sharegpt-sessions",
        arrivals_from=[0.0] * 100_000,  # each session starts at 0: its turns' times are offsets
        exclude=learned_prompts(),
    )
    by_session: dict[object, list[TraceRequest]] = {}
    for r in sorted(every, key=lambda r: r.rid):  # the reader's order: conversation by conversation
        by_session.setdefault(r.extra.get("session"), []).append(r)
    return azure, list(by_session.values())


def data_sources() -> str:
    """Which copies of the demo's data are read (shipped, shared or fetched)."""
    from sagegate.loadgen.data import AZURE_CONV, SHAREGPT_SESSIONS, find_data

    found = [find_data(*AZURE_CONV), find_data(*SHAREGPT_SESSIONS)]
    return "; ".join(f.describe() for f in found if f is not None)


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
    from sagegate.loadgen.client import ReplayConfig

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
    from sagegate.loadgen.client import replay_async

    cfg = replay_config(urls[0], time_scale, timeout_s=timeout_s, max_connections=max_connections)
    cfg.spread, cfg.progress = list(urls), progress
    cfg.backend_metrics = [u + "/metrics" for u in urls]
    return (await replay_async(work, cfg)).records


def backend_args(model: str, gpu: str, time_scale: float) -> list[str]:
    """A harness backend: usage reports each request's cached prompt tokens (the records keep them)."""
    return ["--model", model, "--gpu", gpu, "--time-scale", str(time_scale), "--enable-prompt-tokens-details"]


@contextlib.contextmanager
def backends(n: int, model: str, gpu: str, time_scale: float) -> Iterator[list[str]]:
    """``n`` fresh ``sagegate backend`` processes (empty KV cache and prefix cache); all stopped on exit."""
    with publishing_backends(n, model, gpu, time_scale, kv_events=False) as fleet:
        yield [b["url"] for b in fleet]


@contextlib.contextmanager
def publishing_backends(
    n: int, model: str, gpu: str, time_scale: float, *, kv_events: bool = True
) -> Iterator[list[dict[str, Any]]]:
    """:func:`backends`, each publishing its KV-cache events as vLLM's ``--kv-events-config`` does
    (``kv_events``): entries of the gateway's ``backends`` setting (``url``, ``kv_events``)."""
    from sagegate.harness.procs import kv_events_flag, spawned

    with contextlib.ExitStack() as stack:
        fleet: list[dict[str, Any]] = []
        for _ in range(n):
            args = backend_args(model, gpu, time_scale)
            entry: dict[str, Any] = {}
            if kv_events:
                flag, entry["kv_events"] = kv_events_flag()
                args += flag
            fleet.append({"url": stack.enter_context(spawned("sagegate.cmd_backend", args)), **entry})
        yield fleet


@contextlib.contextmanager
def gateway(
    urls: Sequence[str], policy: str, predictor: str, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``sagegate serve`` in front of ``urls`` (embedded history store, offline); ``env`` adds settings
    (``SAGEGATE_...`` variables). Stopped on exit."""
    from sagegate.harness.procs import spawned

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


def vllm_router_binary() -> str | None:
    """vllm-router's executable (its PyPI wheel installs it beside this Python), else one on PATH."""
    import shutil

    here = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    return here if os.access(here, os.X_OK) else shutil.which("vllm-router")


def vllm_router_command(binary: str, port: int, workers: Sequence[str], policy: str) -> list[str]:
    """vllm-router on loopback ``port`` over ``workers`` with ``policy``, its defaults otherwise (its
    metrics on another free port, its log quiet)."""
    from sagegate.harness.procs import free_port

    cmd = [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    cmd += ["--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    return [*cmd, "--log-level", "warning"]


@contextlib.contextmanager
def vllm_router(binary: str, workers: Sequence[str], policy: str = "cache_aware") -> Iterator[str]:
    """vllm-router (the vLLM project's Rust router) over ``workers`` with ``policy`` and its defaults
    otherwise; stopped on exit."""
    with vllm_router_process(binary, workers, policy) as (url, _proc):
        yield url


@contextlib.contextmanager
def vllm_router_process(
    binary: str, workers: Sequence[str], policy: str = "cache_aware"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """:func:`vllm_router`, with its process (for a benchmark that reads its CPU)."""
    from sagegate.harness.procs import free_port, running

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = vllm_router_command(binary, port, workers, policy)
    with running(cmd, url, "/health", startup_timeout_s=60) as (proc, _log):
        yield url, proc


COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prefix_cache_queries": "prefix_queries",
    "vllm:prefix_cache_hits": "prefix_hits",
}
"""Backend counters a run reads before and after itself (their ``_total`` samples), by our name."""


def backend_counters(urls: Sequence[str]) -> list[dict[str, float]]:
    """Each backend's :data:`COUNTERS` now (0 for one it does not report)."""
    import httpx

    from sagegate.loadgen.scrape import counter_totals

    out = []
    for url in urls:
        found = counter_totals(
            httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text, list(COUNTERS)
        )
        out.append({ours: found[theirs] or 0.0 for theirs, ours in COUNTERS.items()})
    return out


def counter_deltas(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> dict[str, float]:
    """What every backend together counted between two :func:`backend_counters` readings."""
    return {k: sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) for k in COUNTERS.values()}


@dataclass
class BackendSample:
    t: float
    """Engine seconds since the sampler started."""
    kv: float
    running: float
    waiting: float
    prefix_hits: float = 0.0
    """Tokens the engine found in its prefix cache so far (a counter)."""
    prefix_queries: float = 0.0
    """Prompt tokens it looked up so far (a counter)."""


class BackendSampler:
    """Reads every backend's KV usage, running and waiting gauges and prefix-cache counters every
    ``interval_s`` (wall) in a thread of its own: the pictures of a run show what the engines held."""

    GAUGES = (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
    )

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

        from sagegate.loadgen.scrape import gauge_values

        t0 = time.monotonic()
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while not self._stop.is_set():
                t = (time.monotonic() - t0) * self.time_scale
                for url in self.urls:
                    try:
                        text = client.get(url + "/metrics").text
                        found = gauge_values(text, self.GAUGES)
                        values = [found[g] or 0.0 for g in self.GAUGES]
                    except (httpx.HTTPError, ValueError):
                        continue
                    self.series[url].append(BackendSample(t, *values))
                self._stop.wait(self.interval_s)
