"""The official ``openai`` client through the gateway to two simulated vLLM backends, over loopback."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import openai
import pytest

from sagegate.gateway.app import create_app
from sagegate.sim.config import EngineConfig
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from tests.gateway_support import ServerThread, admin, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and simulated backends on loopback


def sim_backend(name: str = "sim", **engine: object) -> ServerThread:
    cfg = EngineConfig(**engine)  # type: ignore[arg-type]
    return ServerThread(backend_app(BackendSettings(engine=cfg, served_model_name=name, time_scale=50.0)))


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, list[str]]]:
    with sim_backend() as b1, sim_backend() as b2:
        settings = settings_for([b1.url, b2.url], policy="sagesched", predictor="global")
        with ServerThread(create_app(settings)) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            yield gw.url, [b1.url, b2.url]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat_non_streaming(stack: tuple[str, list[str]]) -> None:
    url, _ = stack
    out = client(url).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "Say something."}], max_tokens=12
    )
    assert out.choices[0].message.content
    assert out.usage is not None and out.usage.completion_tokens == 12


def test_chat_streaming_with_usage(stack: tuple[str, list[str]]) -> None:
    url, _ = stack
    chunks = list(
        client(url).chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": "Stream please."}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 10


def test_streaming_without_usage_hides_the_usage_chunk(stack: tuple[str, list[str]]) -> None:
    """The gateway asks the backend for usage to learn true lengths, but a client that did not ask
    must not see it."""
    url, _ = stack
    chunks = list(
        client(url).chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}], max_tokens=5, stream=True
        )
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_completions_both_ways(stack: tuple[str, list[str]]) -> None:
    url, _ = stack
    c = client(url)
    out = c.completions.create(model="sim", prompt="Once upon a time", max_tokens=7)
    assert out.usage is not None and out.usage.completion_tokens == 7
    streamed = list(c.completions.create(model="sim", prompt="Once upon a time", max_tokens=6, stream=True))
    assert sum(1 for s in streamed if s.choices and s.choices[0].text) == 6


def test_a_body_priority_is_the_gateways_band_not_the_backends(stack: tuple[str, list[str]]) -> None:
    """The simulated backend, like vLLM, refuses a nonzero ``priority`` when not in priority mode:
    the gateway takes it as the request's band and does not forward it (no ``forward_priority``)."""
    url, _ = stack
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "priority": 5},
        timeout=10,
    )
    assert r.status_code == 200, r.text


def test_concurrent_requests_use_both_backends(stack: tuple[str, list[str]]) -> None:
    url, _ = stack
    c = client(url)

    def one(i: int) -> int:
        out = c.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=20
        )
        assert out.usage is not None
        return out.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(16))) == [20] * 16
    metrics = httpx.get(url + "/metrics").text
    admitted = [line for line in metrics.splitlines() if line.startswith("sagegate_admissions_total")]
    assert len(admitted) == 2, admitted
    snap = admin(url)
    assert all(b["inflight"] == 0 and b["reserved_tokens"] == 0 for b in snap["backends"])


def test_models_health_ready_metrics(stack: tuple[str, list[str]]) -> None:
    url, _ = stack
    models = httpx.get(url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["sim"]
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/ready").json() == {"status": "ready"}
    text = httpx.get(url + "/metrics").text
    for name in (
        "sagegate_queue_depth",
        "sagegate_queue_wait_seconds_bucket",
        "sagegate_backend_inflight",
        "sagegate_backend_reserved_kv_tokens",
        "sagegate_predictor_path_total",
        "sagegate_actual_output_tokens_bucket",
        "sagegate_output_actual_over_predicted_bucket",
    ):
        assert name in text, name
