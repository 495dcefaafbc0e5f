"""The simulated backend (``sagegate backend``) over real loopback HTTP, started as a child process the
way a user starts it: the official openai client, /metrics, cancellation, bad requests, priority mode."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sagegate.cmd_backend import spawned_backend
from sagegate.core.tokens import count_tokens, flatten_messages
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.sim.server import PriorityPolicy

pytestmark = pytest.mark.heavy  # a sagegate backend process per fixture

SERVED = "sim-llama"
SMALL_BLOCKS = 256  # 4096 tokens of KV: long requests fill it quickly, long prompts do not fit
METRIC_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:cache_config_info",
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with spawned_backend(["--time-scale", "20", "--served-model-name", SERVED]) as url:
        yield url


@pytest.fixture(scope="module")
def small() -> Iterator[str]:
    # Real time: a 3000-token request would run ~20 s, far longer than the 5 s a cancellation may take.
    args = ["--time-scale", "1", "--num-gpu-blocks-override", str(SMALL_BLOCKS), "--max-num-seqs", "8"]
    with spawned_backend(args) as url:
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=30)


def metrics(url: str) -> dict[str, Any]:
    """Every sample of /metrics by name (histograms by their _count/_sum/_bucket names)."""
    text = httpx.get(url + "/metrics", trust_env=False).text
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            out[s.name] = s.labels if s.name == "vllm:cache_config_info" else s.value
    return out


CHAT: Any = [  # Any: the openai client wants its own TypedDicts
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name three rivers in Europe."},
    {"role": "assistant", "content": "The Danube, the Rhine and the Loire."},
    {"role": "user", "content": [{"type": "text", "text": "And in Africa?"}]},
]


# --- the official openai client --------------------------------------------------------------------


def test_openai_completion_non_streaming(client: openai.OpenAI) -> None:
    out = client.completions.create(model=SERVED, prompt=list(range(100, 137)), max_tokens=9)
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (37, 9, 46)
    assert len(out.choices[0].text.split()) == 9
    assert out.choices[0].finish_reason == "length"
    assert out.model == SERVED


def test_openai_completion_text_prompt_counts_tokens(client: openai.OpenAI) -> None:
    prompt = "The quick brown fox jumps over the lazy dog, again and again."
    out = client.completions.create(
        model=SERVED, prompt=prompt, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.prompt_tokens == count_tokens(prompt)


def test_openai_completion_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=SERVED,
        prompt=list(range(50)),
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    tokens = [c for c in chunks if c.choices]
    assert len(tokens) == 12
    assert [c.choices[0].finish_reason for c in tokens] == [None] * 11 + ["length"]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (50, 12, 62)


def test_openai_completion_streaming_without_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=SERVED, prompt=[1, 2, 3], max_tokens=5, stream=True))
    assert len(chunks) == 5
    assert all(c.usage is None for c in chunks)


def test_openai_chat_non_streaming(client: openai.OpenAI, server: str) -> None:
    out = client.chat.completions.create(model=SERVED, messages=CHAT, max_tokens=7)
    expected_prompt = httpx.post(server + "/tokenize", json={"messages": CHAT}, trust_env=False).json()[
        "count"
    ]
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (expected_prompt, 7)
    assert expected_prompt == count_tokens(flatten_messages(CHAT))
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content is not None and len(msg.content.split()) == 7


def test_openai_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=SERVED,
        messages=CHAT,
        max_completion_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 6
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == count_tokens(flatten_messages(CHAT))


def test_a_stream_asked_for_the_running_usage_carries_it_on_every_chunk(client: openai.OpenAI) -> None:
    """vLLM's ``continuous_usage_stats``: the role chunk at 0 tokens, each token chunk the count so
    far, then the final usage."""
    stream = client.chat.completions.create(
        model=SERVED,
        messages=CHAT,
        max_completion_tokens=5,
        stream=True,
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    counts = [c.usage.completion_tokens for c in stream if c.usage is not None]
    assert counts == [0, 1, 2, 3, 4, 5, 5]


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    out = client.completions.create(model=SERVED, prompt="hello")
    assert out.usage is not None and out.usage.completion_tokens == 16


def test_models_health_and_tokenize(server: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [SERVED]
    assert httpx.get(server + "/health", trust_env=False).status_code == 200
    tok = httpx.post(server + "/tokenize", json={"prompt": "hello world"}, trust_env=False).json()
    assert tok["count"] == len(tok["tokens"]) == count_tokens("hello world") == 2
    ids = httpx.post(server + "/tokenize", json={"prompt": [5, 6, 7]}, trust_env=False).json()
    assert ids["tokens"] == [5, 6, 7] and ids["count"] == 3
    assert tok["max_model_len"] == PerfModel(get_model("llama-3.1-8b"), get_gpu("h100")).num_gpu_blocks() * 16


# --- /metrics --------------------------------------------------------------------------------------


def test_metrics_names_and_cache_config(server: str) -> None:
    m = metrics(server)
    for name in METRIC_NAMES:
        assert name in m or name + "_count" in m, name
    blocks = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100")).num_gpu_blocks(16, 0.9)
    info = m["vllm:cache_config_info"]
    assert (int(info["num_gpu_blocks"]), int(info["block_size"])) == (blocks, 16)


def test_metrics_count_one_request(server: str, client: openai.OpenAI) -> None:
    before = metrics(server)
    client.completions.create(model=SERVED, prompt=list(range(1000, 1033)), max_tokens=8)
    after = metrics(server)

    def delta(name: str) -> float:
        return float(after[name]) - float(before[name])

    assert delta("vllm:prompt_tokens_total") == 33
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:request_success_total") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == 7
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    # Simulated seconds: at least the front end's 10 ms plus eight steps.
    assert delta("vllm:e2e_request_latency_seconds_sum") > 0.010
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0


def test_prefix_cache_counters_follow_the_engines_own_hits(server: str, client: openai.OpenAI) -> None:
    """vLLM's ``prefix_cache_queries``/``hits`` (tokens): a repeated prompt hits every full block but
    the one holding its last token (always computed: it yields the first output's logits)."""
    before = metrics(server)
    prompt = list(range(2000, 2000 + 16 * 10 + 5))  # 165 tokens: ten full blocks and five more
    client.completions.create(model=SERVED, prompt=prompt, max_tokens=1)
    mid = metrics(server)
    client.completions.create(model=SERVED, prompt=prompt, max_tokens=1)
    after = metrics(server)

    def delta(a: dict[str, Any], b: dict[str, Any], name: str) -> float:
        return float(b[name]) - float(a[name])

    assert delta(before, mid, "vllm:prefix_cache_queries_total") == 165
    assert delta(before, mid, "vllm:prefix_cache_hits_total") == 0  # never seen: nothing cached
    assert delta(mid, after, "vllm:prefix_cache_queries_total") == 165
    assert delta(mid, after, "vllm:prefix_cache_hits_total") == 160  # (165 - 1) // 16 blocks of 16
    other = list(range(2000, 2000 + 16 * 4)) + [7] * 40  # the first four blocks shared, then not
    client.completions.create(model=SERVED, prompt=other, max_tokens=1)
    last = metrics(server)
    assert delta(after, last, "vllm:prefix_cache_hits_total") == 64


def test_usage_reports_cached_prompt_tokens_only_when_enabled(client: openai.OpenAI) -> None:
    """vLLM's ``--enable-prompt-tokens-details``: usage says how much of the prompt its first admission
    found cached; without the flag (vLLM's default) usage has no details."""
    prompt = list(range(3000, 3000 + 16 * 6 + 3))  # six full blocks and three more
    plain = client.completions.create(model=SERVED, prompt=prompt, max_tokens=1)
    assert plain.usage is not None and plain.usage.prompt_tokens_details is None
    with spawned_backend(["--time-scale", "20", "--enable-prompt-tokens-details"]) as url:
        details = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        model = details.models.list().data[0].id
        first = details.completions.create(model=model, prompt=prompt, max_tokens=1)
        again = details.completions.create(
            model=model, prompt=prompt, max_tokens=2, stream=True, stream_options={"include_usage": True}
        )
        usage = list(again)[-1].usage
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # never seen
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 96  # every full block but the last token's


# --- cancellation ----------------------------------------------------------------------------------


def wait_idle(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(url)
        idle = m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        if (idle and m["vllm:kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_cancelled_streams_free_their_kv(small: str) -> None:
    body = {"prompt": list(range(300)), "max_tokens": 3000, "stream": True}
    with httpx.Client(base_url=small, timeout=30, trust_env=False) as http:
        streams = [http.stream("POST", "/v1/completions", json=body) for _ in range(4)]
        # Keep each line iterator alive: dropping one closes its connection (that is a cancel too).
        readers = [s.__enter__().iter_lines() for s in streams]
        for lines in readers:
            got = 0
            while got < 3:  # a few tokens each, so every request holds blocks
                if next(lines).startswith("data: {"):
                    got += 1
        busy = metrics(small)
        assert busy["vllm:num_requests_running"] == 4
        assert busy["vllm:kv_cache_usage_perc"] > 0
        for s in streams:
            s.__exit__(None, None, None)
    idle = wait_idle(small)
    assert idle["vllm:num_requests_running"] == 0
    assert idle["vllm:num_requests_waiting"] == 0
    assert idle["vllm:kv_cache_usage_perc"] == 0


def test_cancelled_non_streaming_request_frees_its_kv(small: str) -> None:
    body = {"prompt": list(range(200)), "max_tokens": 3000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(small + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.5), trust_env=False)
    idle = wait_idle(small)
    assert idle["vllm:num_requests_running"] == 0
    assert idle["vllm:kv_cache_usage_perc"] == 0


def test_openai_client_closing_a_stream_cancels(small: str) -> None:
    client = openai.OpenAI(base_url=small + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="llama-3.1-8b",
        messages=CHAT,
        max_tokens=3000,
        stream=True,
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    idle = wait_idle(small)
    assert idle["vllm:num_requests_running"] == 0 and idle["vllm:kv_cache_usage_perc"] == 0


# --- bad requests ----------------------------------------------------------------------------------

BAD_COMPLETIONS: list[tuple[str, Any]] = [
    ("invalid json", b"{not json"),
    ("not an object", [1, 2, 3]),
    ("missing prompt", {"max_tokens": 3}),
    ("prompt of the wrong type", {"prompt": {"text": "hi"}}),
    ("empty prompt", {"prompt": ""}),
    ("token id out of vocabulary", {"prompt": [1, 10_000_000]}),
    ("max_tokens zero", {"prompt": "hi", "max_tokens": 0}),
    ("max_tokens not a number", {"prompt": "hi", "max_tokens": "lots"}),
    ("stream not a bool", {"prompt": "hi", "stream": "maybe"}),
    ("unknown model", {"prompt": "hi", "model": "gpt-17"}),
    ("priority without priority scheduling", {"prompt": "hi", "priority": 3}),
    ("stream options without streaming", {"prompt": "hi", "stream_options": {"include_usage": True}}),
    ("several choices", {"prompt": "hi", "n": 2}),
    ("context too long", {"prompt": list(range(SMALL_BLOCKS * 16 - 10)), "max_tokens": 11}),
]
BAD_CHATS: list[tuple[str, Any]] = [
    ("missing messages", {"max_tokens": 3}),
    ("empty messages", {"messages": []}),
    ("message without role", {"messages": [{"content": "hi"}]}),
    ("messages not a list", {"messages": "hi"}),
    (
        "max_completion_tokens negative",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
    ),
]


def assert_openai_error(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["type"] in ("invalid_request_error", "BadRequestError")
    assert isinstance(err["message"], str) and err["message"]


def _post(url: str, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(url + path, content=content, headers=headers, trust_env=False)


@pytest.mark.parametrize(("case", "body"), BAD_COMPLETIONS, ids=[c for c, _ in BAD_COMPLETIONS])
def test_bad_completion_requests_get_400(small: str, case: str, body: Any) -> None:
    assert_openai_error(_post(small, "/v1/completions", body))


@pytest.mark.parametrize(("case", "body"), BAD_CHATS, ids=[c for c, _ in BAD_CHATS])
def test_bad_chat_requests_get_400(small: str, case: str, body: Any) -> None:
    assert_openai_error(_post(small, "/v1/chat/completions", body))


def test_context_limit_is_inclusive(small: str) -> None:
    """prompt + max_tokens equal to the pool is allowed; one more is not."""
    body = {"prompt": list(range(SMALL_BLOCKS * 16 - 10)), "max_tokens": 10}
    assert _post(small, "/v1/completions", body).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_an_input_too_long_to_tokenize_is_a_400_not_a_500(small: str, path: str) -> None:
    """A 2 MB prompt: the tokenizer refuses it, and the backend answers as vLLM does for an input past
    its context (it answered 500, which a gateway reads as the backend failing)."""
    text = "hello world " * 180_000
    body: dict[str, Any] = {"prompt": text} if path != "/v1/chat/completions" else {}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    r = _post(small, path, body)
    assert_openai_error(r)
    assert "maximum context length" in r.json()["error"]["message"]


def test_openai_client_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=SERVED, prompt="hi", max_tokens=0)


def test_unknown_fields_are_ignored(server: str) -> None:
    body = {"model": SERVED, "prompt": "hi", "max_tokens": 2, "temperature": 0.3, "frobnicate": [1]}
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


# --- tokens and the command line ------------------------------------------------------------------


def test_flatten_messages_keeps_every_turn() -> None:
    text = flatten_messages(CHAT)
    assert text.splitlines() == [
        "system: You answer briefly.",
        "user: Name three rivers in Europe.",
        "assistant: The Danube, the Rhine and the Loire.",
        "user: And in Africa?",
    ]


def test_token_count_fallback_without_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    import sagegate.core.tokens as tokens

    monkeypatch.setattr(tokens, "_encoder", lambda: None)
    assert tokens.count_tokens("abcdefghi") == 3  # one token per 4 characters, rounded up
    assert tokens.encode("abcdabcd") == tokens.encode("abcd") * 2 and len(tokens.encode("abcdefghi")) == 3


def test_cli_rejects_a_bad_setting() -> None:
    with (
        pytest.raises(RuntimeError, match="scheduling policy"),
        spawned_backend(["--scheduling-policy", "lottery"]),
    ):
        pass


# --- priority scheduling ---------------------------------------------------------------------------


def test_priority_policy_key_order() -> None:
    from sagegate.policies.base import SchedRequest

    policy = PriorityPolicy()
    a = SchedRequest(0, 1.0, 10, priority=5)
    b = SchedRequest(1, 2.0, 10, priority=-1)
    c = SchedRequest(2, 0.5, 10, priority=5)
    assert sorted([a, b, c], key=lambda r: policy.key(r, 0.0)) == [b, c, a]
    assert policy.pick_victim([a, b, c], 0.0) is a


def test_priority_mode_serves_urgent_first() -> None:
    """One sequence at a time: while a long request runs, a low- then a high-priority request queue up;
    the high-priority one (lower value, vLLM's convention) is served first."""
    args = ["--time-scale", "2", "--scheduling-policy", "priority", "--max-num-seqs", "1"]
    with spawned_backend(args) as url, httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        done: list[str] = []

        def send(name: str, priority: int, max_tokens: int) -> None:
            body = {"prompt": [1, 2, 3], "max_tokens": max_tokens, "priority": priority}
            assert http.post("/v1/completions", json=body).status_code == 200
            done.append(name)

        first = threading.Thread(target=send, args=("long", 0, 400))
        first.start()
        # Each wait has its own generous deadline and must succeed: a request sent before the long one
        # runs would race it (a fresh backend's first request is slow on a busy machine).
        deadline = time.monotonic() + 60
        while metrics(url)["vllm:num_requests_running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert metrics(url)["vllm:num_requests_running"] == 1, "the long request never started"
        low = threading.Thread(target=send, args=("low", 10, 50))  # long enough to finish well after

        low.start()
        deadline = time.monotonic() + 60
        while metrics(url)["vllm:num_requests_waiting"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert metrics(url)["vllm:num_requests_waiting"] >= 1, "the low request never queued"
        # 20 tokens, not 2: it ends well after the long one, whose thread reads a larger answer
        high = threading.Thread(target=send, args=("high", -1, 20))
        high.start()
        for t in (first, low, high):
            t.join(timeout=60)
        assert done == ["long", "high", "low"]
