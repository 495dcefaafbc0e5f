"""What the live peer benchmarks share (``neutral_client.py``, ``bench_routers.py``): fresh simulated
backends behind a front (vllm-router with a policy, or the gateway), warming them, reading their
counters, and running aiperf against the front offline.

``peers`` is a folder laid out by ``../shared/peers/install.sh`` with ``venv_aiperf``,
``venv_vllm_router`` and the offline tokenizers built (its README.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

BLOCK = 512  # Mooncake (and aiperf's mooncake_trace loader): tokens per hash id
GATEWAY_ENV = {"SAGEGATE_CAP_AT_MAX_TOKENS": "false", "SAGEGATE_QUEUE__MAX_WAIT_S": "86400"}
"""No cap at the client's max_tokens (aiperf's is the true length) and no queue timeout (vLLM alone has
none), so every set-up serves the same requests."""
FRONTS = {
    "rr": "vllm-router --policy round_robin",
    "cache_aware": "vllm-router --policy cache_aware (its defaults)",
    "sagegate": "sagegate serve with the semantic predictor (cap_at_max_tokens off, no queue timeout)",
    "sg_default": "sagegate serve with its defaults (the prefix predictor; cap off, no queue timeout)",
    "sg_placement": "sagegate with fcfs: cache-aware placement alone (the A/B)",
    "sg_rank": "sagegate with placement least_loaded: the rank alone, blind to the cache (the A/B)",
    "sg_blind": "sagegate with sagesched:shared_prefix=false: placement, and a rank blind to the cache",
    "sg_waits": "sagegate with dispatch_first off: every request waits for its prediction (the A/B)",
    "sg_sticky": "sg_incumbent with placement's prefix_hit weighed 2 (a cached token worth two queued)",
    "sg_precise": "sg_default following the backends' KV-cache events (--kv-events-config): precise hits",
    "sg_open": "sg_default with admission's bounds lifted (peak target 100, no waiting bound): the A/B",
    "sg_spread": "sg_default whose new prefixes go to the emptiest cache (benchmarks.pickers): the A/B",
    "sg_stick": "sg_open, incumbent, scoring the cached prefix alone: a warm backend is never left",
    "sg_incumbent": "sg_default with the cache-aware score rule (picker incumbent), the default until issue 64",
    "sg_forecast_learned": "sg_default reading each backend's learned speed, not the assumed (the A/B)",
}
"""The fronts a run can put before the backends, by the name the scripts take."""
OPEN_ENV = {
    "SAGEGATE_ADMISSION__PEAK_TARGET": "100",
    "SAGEGATE_ADMISSION__MAX_WAITING_TOKENS": "100000000",
    "SAGEGATE_ADMISSION__MAX_WAITING": "100000",
}
"""Admission's bounds lifted: every request goes at once, as through a router."""
INCUMBENT = {"SAGEGATE_PLACEMENT__PROFILE__PICKER": "incumbent"}
"""The cache-aware score rule (``prefix_hit`` and ``queued_prefill`` at 1), the default until issue 64."""
GATEWAYS = {
    "sagegate": ("sagesched", "semantic", {}),
    "sg_default": ("sagesched", "prefix", {}),
    "sg_placement": ("fcfs", "semantic", {}),
    "sg_rank": ("sagesched", "semantic", {"SAGEGATE_PLACEMENT__MODE": "least_loaded"}),
    "sg_blind": ("sagesched:shared_prefix=false", "semantic", {}),
    "sg_waits": ("sagesched", "semantic", {"SAGEGATE_DISPATCH_FIRST": "false"}),
    "sg_sticky": (
        "sagesched",
        "prefix",
        {**INCUMBENT, "SAGEGATE_PLACEMENT__PROFILE__SCORERS": '{"prefix_hit": 2, "queued_prefill": 1}'},
    ),
    "sg_precise": ("sagesched", "prefix", {"SAGEGATE_PLACEMENT__KV_EVENTS__TOKENIZER": "local"}),
    "sg_open": ("sagesched", "prefix", OPEN_ENV),
    "sg_stick": (
        "sagesched",
        "prefix",
        {**OPEN_ENV, **INCUMBENT, "SAGEGATE_PLACEMENT__PROFILE__SCORERS": '{"prefix_hit": 1}'},
    ),
    "sg_spread": (
        "sagesched",
        "prefix",
        {"SAGEGATE_PLACEMENT__PROFILE__PICKER": "benchmarks.pickers:SpreadByCache"},
    ),
    "sg_incumbent": ("sagesched", "prefix", INCUMBENT),
    "sg_forecast_learned": (
        "sagesched",
        "prefix",
        {"SAGEGATE_PLACEMENT__PROFILE__PICKER": "benchmarks.pickers:ForecastLearnedSpeed"},
    ),
}
"""The gateway fronts: (policy, predictor, settings beside ``GATEWAY_ENV``). ``sg_default`` is the
product as shipped; the A/Bs beside it change one thing of it, and those beside ``sagegate`` keep the
semantic predictor the earlier live figures ran."""
PUBLISHING = frozenset({"sg_precise"})
"""Fronts whose backends publish their KV-cache events, and which follow them."""


def write_jsonl(rows: Sequence[dict[str, Any]], path: Path, time_div: float = 1.0) -> Path:
    """``rows`` as JSON lines, each ``timestamp`` divided by ``time_div`` (engine ms → wall ms)."""
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "timestamp": round(r["timestamp"] / time_div, 3)}) + "\n")
    return path


# --- the set-ups ------------------------------------------------------------------------------------
@contextlib.contextmanager
def router(peers: Path, workers: Sequence[str], policy: str = "round_robin") -> Iterator[str]:
    """vllm-router from the peers' venv over ``workers`` with ``policy`` and its defaults otherwise."""
    from sagegate.harness.live import vllm_router

    with vllm_router(str(peers / "venv_vllm_router/bin/vllm-router"), workers, policy) as url:
        yield url


@contextlib.contextmanager
def fronted(
    front: str,
    peers: Path,
    out: Path,
    *,
    model: str,
    gpu: str,
    time_scale: float,
    gateway_env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, list[str]]]:
    """Two fresh backends (empty KV and prefix caches) and ``front`` (a name of :data:`FRONTS`) before
    them: (front URL, backend URLs). Everything is stopped on exit."""
    from sagegate.harness.live import gateway, publishing_backends

    if front not in FRONTS:
        raise ValueError(f"unknown front {front!r}: one of {', '.join(FRONTS)}")
    with publishing_backends(2, model, gpu, time_scale, kv_events=front in PUBLISHING) as fleet:
        urls = [b["url"] for b in fleet]
        if front in GATEWAYS:
            policy, predictor, extra = GATEWAYS[front]
            env = {**GATEWAY_ENV, **extra, **(gateway_env or {})}
            if front in PUBLISHING:
                env["SAGEGATE_BACKENDS"] = json.dumps(fleet)
            with gateway([] if front in PUBLISHING else urls, policy, predictor, env=env) as url:
                yield url, urls
        else:
            policy = "round_robin" if front == "rr" else "cache_aware"
            with router(peers, urls, policy) as url:
                yield url, urls


def warm(front: str, bes: Sequence[str]) -> None:
    """A cold backend's first request costs it about 1.5 s of wall time (T× that in engine time), which
    aiperf, having no unrecorded prime request, would charge to its first requests: warm every backend
    directly, then the front twice (round robin reaches both backends)."""
    import httpx

    from sagegate.loadgen.prompts import filler_text

    for i, url in enumerate([*bes, front, front]):
        body = {
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": filler_text(2000, seed=900 + i)}],
            "max_tokens": 2,
        }
        httpx.post(url + "/v1/chat/completions", json=body, timeout=120.0, trust_env=False).raise_for_status()


# --- aiperf -----------------------------------------------------------------------------------------
def peers_env(peers: Path) -> dict[str, str]:
    """The offline settings of the peers' ``bin/env.sh``."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TIKTOKEN_CACHE_DIR": str(peers / "tiktoken_cache"),
        "HF_HOME": str(peers / "hf_home_local"),
    }


def aiperf_profile(
    peers: Path, url: str, trace: Path, out: Path, *, model: str, tokenizer: str
) -> tuple[int, Path]:
    """aiperf's fixed-schedule replay of the Mooncake-format ``trace`` (wall-time timestamps, ms) against
    ``url``, streaming chat; (its exit code, its artefact folder). Raises when it left no results."""
    art = out / "aiperf"
    cmd = [str(peers / "venv_aiperf/bin/aiperf"), "profile", "-m", model, "--url", url]
    cmd += ["--endpoint-type", "chat", "--streaming", "--tokenizer", tokenizer, "--input-file", str(trace)]
    cmd += ["--custom-dataset-type", "mooncake_trace", "--fixed-schedule", "--ui-type", "none"]
    cmd += ["--artifact-dir", str(art), "--random-seed", "1", "--no-server-metrics"]
    with (out / "aiperf.log").open("w") as log:
        # its own session: aiperf runs a tree of processes, all stopped if this run is interrupted
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=peers_env(peers), cwd=out, start_new_session=True
        )
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    if not (art / "profile_export_aiperf.json").exists():
        raise RuntimeError(f"aiperf exited with {rc} and no results: see {out / 'aiperf.log'}")
    return rc, art


def stop_on_sigterm() -> None:
    """SIGTERM ends the run as Ctrl-C does, through every ``finally`` (backends, fronts, aiperf stopped)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
