"""The demo's three set-ups, each run live on two fresh simulated backends (empty KV and prefix caches,
so no set-up inherits another's warm cache):

* ``round robin``: vLLM behind a plain balancer (the replay client sends request i to backend i mod 2);
* ``cache-aware router``: vLLM behind vllm-router ``--policy cache_aware`` with its defaults, the
  vLLM project's own Rust router (installed from PyPI with the demo): what a latency-minded user runs;
* ``gateway``: sagegate with its defaults (the policy and predictor given).

Every run reads the engines' own counters before and after (preemptions, prefix-cache hits) and
samples their gauges as it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sagegate.core.record import RequestRecord
    from sagegate.core.request import TraceRequest
    from sagegate.harness.live import BackendSample

ROUND_ROBIN, ROUTER, GATEWAY = "round robin", "cache-aware router", "gateway"


@dataclass
class SetupRun:
    """One set-up's live run on one draw."""

    records: list[RequestRecord]
    counters: dict[str, float]
    """What the backends counted over the run (``harness.live.COUNTERS``' names)."""
    samples: dict[str, list[BackendSample]]
    """Per backend, its gauges and counters over time."""
    queue: list[tuple[float, float]] = field(default_factory=list)
    """The gateway's queue depth over time (the gateway only)."""
    paths: dict[str, float] = field(default_factory=dict)
    """How the gateway's predictions were made (the gateway only)."""


@dataclass(frozen=True)
class DemoSetup:
    model: str
    gpu: str
    time_scale: float
    policy: str
    predictor: str
    gateway_env: Mapping[str, str]
    progress: bool
    router_binary: str | None
    """vllm-router's executable; None: the cache-aware router is left out (said so)."""


def setup_names(setup: DemoSetup) -> list[str]:
    return [ROUND_ROBIN, *([ROUTER] if setup.router_binary else []), GATEWAY]


def run_setup(name: str, work: Sequence[TraceRequest], setup: DemoSetup, say: Any) -> SetupRun:
    """``name`` (one of :func:`setup_names`) on ``work``, on two fresh backends."""
    from sagegate.harness.live import (
        BackendSampler,
        backend_counters,
        backends,
        counter_deltas,
        replay_config,
    )
    from sagegate.loadgen.client import replay_async

    with backends(2, setup.model, setup.gpu, setup.time_scale) as urls, _front(name, urls, setup) as front:
        url, admin_key = front
        say(f"{name}: {url}" + (f" (watch it: {url}/dashboard?key={admin_key})" if admin_key else ""))
        cfg = replay_config(url, setup.time_scale, metrics=name == GATEWAY)
        cfg.progress = setup.progress
        if name == ROUND_ROBIN:
            cfg.spread = list(urls)
        before = backend_counters(urls)
        with BackendSampler(urls, setup.time_scale) as sampler:
            result = asyncio.run(replay_async(work, cfg))
        run = SetupRun(
            records=result.records,
            counters=counter_deltas(before, backend_counters(urls)),
            samples={f"backend-{i}": sampler.series[u] for i, u in enumerate(urls)},
        )
        if name == GATEWAY:
            run.queue, run.paths = list(result.queue_samples or []), predictor_paths(url)
    return run


@contextlib.contextmanager
def _front(name: str, urls: list[str], setup: DemoSetup) -> Iterator[tuple[str, str | None]]:
    """The front's URL (and the gateway's admin key, for its dashboard)."""
    from sagegate.harness.live import gateway, vllm_router

    if name == ROUND_ROBIN:
        yield urls[0], None
    elif name == ROUTER:
        assert setup.router_binary is not None
        with vllm_router(setup.router_binary, urls, "cache_aware") as url:
            yield url, None
    else:
        key = secrets.token_urlsafe(12)  # this run's admin key: the dashboard needs one
        env = {**setup.gateway_env, "SAGEGATE_ADMIN_KEY": key}
        with gateway(urls, setup.policy, setup.predictor, env=env) as url:
            yield url, key


def predictor_paths(url: str) -> dict[str, float]:
    """How the gateway's predictions were made (``semantic``, ``late`` past the embedding budget,
    ``bucket``/``global``/``cold`` priors), from its ``/metrics``."""
    import httpx

    from sagegate.loadgen.scrape import counter_by_label

    try:
        text = httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text
    except httpx.HTTPError:
        return {}
    return counter_by_label(text, "sagegate_predictor_path", "path")


def router_check() -> tuple[str | None, str]:
    """vllm-router's executable if it starts here, and what to tell the user either way."""
    import subprocess

    from sagegate.harness.live import vllm_router_binary

    binary = vllm_router_binary()
    if binary is None:
        return None, (
            "note: vllm-router is not installed (pip install vllm-router), so the cache-aware router "
            "baseline is left out; the table compares the gateway with round robin only"
        )
    try:
        subprocess.run([binary, "--help"], capture_output=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return (
            None,
            f"note: vllm-router at {binary} does not start ({exc}); the cache-aware baseline is left out",
        )
    return binary, f"cache-aware baseline: vllm-router ({binary}) --policy cache_aware, its defaults"
