"""The gateway learns from a real (simulated) engine's KV gauge how much of a prompt costs KV: with
prefix caching, requests that share their prompt hold one copy of it, so the share falls well below
1; requests with distinct prompts each hold their own, so it stays at 1."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.sim.config import EngineConfig
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from tests.gateway_support import ServerThread, admin, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and a simulated backend on loopback

N = 6
WORDS = 1200  # prompt tokens each: N of them running is well over the sample minimum (capacity / 8)


def _stream(url: str, content: str, stop: threading.Event) -> None:
    body = {"model": "sim", "messages": [{"role": "user", "content": content}], "max_tokens": 2000}
    body["stream"] = True
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return  # closing the stream cancels the request
    except httpx.HTTPError:
        pass


def _share_while_running(prompts: list[str]) -> dict[str, Any]:
    """Run ``prompts`` at once until the gateway has sampled the engine's gauge a few times."""
    engine = EngineConfig(num_gpu_blocks_override=1024)
    backend = backend_app(BackendSettings(engine=engine, served_model_name="sim", time_scale=1.0))
    with (
        ServerThread(backend) as be,
        ServerThread(create_app(settings_for([be.url], admission={"prompt_share": True}))) as gw,
    ):
        stop = threading.Event()
        threads = [threading.Thread(target=_stream, args=(gw.url, p, stop), daemon=True) for p in prompts]
        for t in threads:
            t.start()
        try:
            wait_until(
                lambda: admin(gw.url)["backends"][0]["prompt_share_samples"] >= 5,
                timeout=20,
                what="five samples of the prompt share",
            )
            return admin(gw.url)
        finally:
            stop.set()
            for t in threads:
                t.join(10)


def test_shared_prompts_cost_a_fraction_of_their_tokens() -> None:
    state = _share_while_running(["hello " * WORDS] * N)
    # One copy of the prompt for N requests: about 1/N of their tokens, plus their private tails.
    assert state["backends"][0]["prompt_share"] < 0.5
    assert state["prompt_share"] == state["backends"][0]["prompt_share"]


def test_distinct_prompts_cost_all_their_tokens() -> None:
    state = _share_while_running([f"{i} " + "hello " * WORDS for i in range(N)])
    assert state["backends"][0]["prompt_share"] > 0.9
