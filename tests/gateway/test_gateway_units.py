"""The gateway's pure parts: settings sources, SSE scanning, metrics parsing, the circuit breaker,
tenants, the max_tokens cap, and the dispatcher (against hand-set backend loads, no HTTP)."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.backends import Backend, BackendPool, CircuitBreaker
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.errors import GatewayError
from sagegate.gateway.predict import cap
from sagegate.gateway.queue import BoundedQueue, GatewayRequest, QueueFull
from sagegate.gateway.scrape import EngineMetrics, parse_metrics
from sagegate.gateway.settings import BackendSettings, GatewaySettings, HealthSettings, load_settings
from sagegate.gateway.sse import SseScanner
from sagegate.gateway.tenants import identify, match_key
from sagegate.policies.admission import RULES, AdmissionConfig, Rule
from sagegate.policies.prompt_share import SHARE_FLOOR, PromptShare, share_sample
from sagegate.policies.registry import parse_policy

# --- settings -------------------------------------------------------------------------------------


def test_settings_yaml_env_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        "backends:\n  - url: http://a:8000\n    capacity_tokens: 1000\n  - http://b:8000/\n"
        "policy: edf\nport: 9000\nadmission:\n  target: 0.8\n  max_waiting: 2\n  rule: sum\n"
    )
    monkeypatch.setenv("SAGEGATE_PORT", "9100")
    monkeypatch.setenv("SAGEGATE_ADMISSION__MAX_WAITING", "3")
    s = load_settings(cfg, policy="fcfs", predictor=None)
    assert [b.url for b in s.backends] == ["http://a:8000", "http://b:8000"]
    assert [b.name for b in s.backends] == ["backend-0", "backend-1"]
    assert s.backends[0].capacity_tokens == 1000
    assert s.port == 9100  # env beats the file
    assert s.policy == "fcfs"  # an explicit override beats both
    assert s.admission.target == 0.8 and s.admission.max_waiting == 3
    assert s.admission.config().rule == "sum" and GatewaySettings().admission.config().rule == "peak"
    assert s.predictor == "prefix" and GatewaySettings().policy == "sagesched"  # the product defaults


@pytest.mark.parametrize(
    "bad",
    [
        {"predictor": "psychic"},
        {"backends": ["ftp://x"]},
        {"admission": {"target": 0}},
        {"admission": {"rule": "max"}},
        {"admission": {"peak_target": -1}},
        {"surprise": 1},
    ],
)
def test_settings_reject_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        GatewaySettings(**bad)


def test_settings_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.yaml")


# --- SSE ------------------------------------------------------------------------------------------


def _event(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i


USAGE = (
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n'
)
DONE = b"data: [DONE]\n\n"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.lists(st.integers(1, 400), max_size=30), st.booleans())
def test_sse_scanner_is_indifferent_to_chunk_boundaries(n: int, cuts: list[int], strip: bool) -> None:
    stream = b"".join(_event(i) for i in range(n)) + USAGE + DONE
    pieces, pos = [], 0
    for c in cuts:
        pieces.append(stream[pos : pos + c])
        pos += c
    pieces.append(stream[pos:])
    sc = SseScanner(strip_usage=strip)
    out = b"".join(sc.feed(p) for p in pieces) + sc.flush()
    assert sc.events == n and sc.usage == 7 and sc.done
    expected = stream.replace(USAGE, b"") if strip else stream
    assert out == expected


def test_sse_scanner_keeps_usage_on_a_token_chunk() -> None:
    ev = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}\n\n'
    sc = SseScanner(strip_usage=True)
    assert sc.feed(ev) == ev and sc.events == 1 and sc.usage == 1


def _running(i: int, details: bool = False) -> bytes:
    """A token event as vLLM writes it with ``continuous_usage_stats`` (the usage last)."""
    usage = {"prompt_tokens": 5, "total_tokens": 5 + i + 2, "completion_tokens": i + 2}
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    obj = {"id": "x", "choices": [{"index": 0, "delta": {"content": f" w{i}"}}], "usage": usage}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _without_usage(event: bytes) -> bytes:
    obj = json.loads(event[6:])
    del obj["usage"]
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(1, 400), max_size=30), st.booleans(), st.booleans())
def test_sse_scanner_reads_and_strips_the_running_usage_wherever_reads_split(
    n: int, cuts: list[int], strip: bool, details: bool
) -> None:
    """The backend's running count (``continuous_usage_stats``: the tokens so far on every chunk,
    more than the chunks when it held a token back) is read off each token event; the gateway,
    having asked for it for itself, takes it off again (``strip_running``) so the client gets the
    bytes it would have got without it, however the reads split the events."""
    events = [_running(i, details) for i in range(n)]
    stream = b"".join(events) + USAGE + DONE
    pieces, pos = [], 0
    for c in cuts:
        pieces.append(stream[pos : pos + c])
        pos += c
    pieces.append(stream[pos:])
    sc = SseScanner(strip_usage=strip, strip_running=True)
    out = b"".join(sc.feed(p) for p in pieces) + sc.flush()
    assert sc.events == n and sc.running == n + 1 and sc.usage == 7 and sc.done
    assert out == b"".join(_without_usage(e) for e in events) + (b"" if strip else USAGE) + DONE
    kept = SseScanner(strip_usage=False, strip_running=False)  # the client asked for it: kept
    assert kept.feed(stream) == stream and kept.running == n + 1


def test_sse_scanner_reads_fields_by_line_not_inside_generated_text() -> None:
    """A model that writes about SSE: its text holds ``data:``, ``data: [DONE]`` and ``"usage":{``,
    inside JSON strings. They are one token each, the stream is not done, and nothing is stripped."""
    texts = ["data: x", "data: [DONE]", 'say "usage":{"completion_tokens":9}', "\n\ndata: y"]
    chunks = [
        b"data: " + json.dumps({"choices": [{"delta": {"content": t}}]}).encode() + b"\n\n" for t in texts
    ]
    sc = SseScanner(strip_usage=True)
    out = b"".join(sc.feed(c) for c in chunks)
    assert out == b"".join(chunks) and sc.events == 4 and not sc.done and sc.usage is None
    assert sc.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n" and sc.done and sc.events == 4


def test_sse_scanner_takes_crlf_line_ends_even_split_between_reads() -> None:
    token = b'data: {"choices":[{"delta":{"content":"a"}}]}'
    sc = SseScanner(strip_usage=False)
    assert sc.feed(token + b"\r\n\r") == token + b"\n\n"  # a lone \r ends a line too
    # the \n that completes the last read's \r\n is that line end, not another blank line
    assert sc.feed(b"\n" + token + b"\r\n\r") == token + b"\n\n"
    assert sc.feed(b"\ndata: [DONE]\r\n\r\n") == b"data: [DONE]\n\n"
    assert sc.events == 2 and sc.done


# --- vLLM metrics ---------------------------------------------------------------------------------

VLLM_METRICS = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
vllm:num_preemptions_total{engine="0",model_name="m"} 11.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048",prefix_caching="True"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 5.0
"""


def test_parse_vllm_metrics() -> None:
    m = parse_metrics(VLLM_METRICS)
    assert (m.waiting, m.running, m.preemptions, m.capacity_tokens) == (5, 7, 11, 2048 * 16)
    assert m.kv_usage == pytest.approx(0.42)
    assert parse_metrics("garbage\nvllm:broken\n").capacity_tokens is None


# --- circuit breaker ------------------------------------------------------------------------------


def test_circuit_breaker_opens_and_closes() -> None:
    now = [0.0]
    b = CircuitBreaker(threshold=3, open_s=5.0, clock=lambda: now[0])
    assert not b.failure() and not b.failure()
    b.success()  # a success resets the count
    assert not b.failure() and not b.failure() and b.failure() and b.is_open
    now[0] = 4.0
    assert not b.success() and b.is_open  # too soon
    now[0] = 9.5
    assert b.success() and not b.is_open
    assert b.failure(hard=True) and b.is_open  # connection refused opens at once


# --- tenants --------------------------------------------------------------------------------------


def test_identify_headers_and_keys() -> None:
    who = identify({"x-tenant": "t1", "x-priority": "3", "x-deadline-ms": "1500"}, {}, now=10.0)
    assert (who.tenant, who.priority, who.deadline_s) == ("t1", 3, 11.5)
    assert identify({"x-slo-ttft-ms": "200"}, {}, now=1.0).deadline_s == pytest.approx(1.2)
    keys = {"k1": "alpha", "k2": "beta"}
    assert identify({"authorization": "Bearer k2", "x-tenant": "spoof"}, keys, 0.0).tenant == "beta"
    assert match_key("k3", keys) is None and match_key(None, keys) is None
    with pytest.raises(GatewayError) as e:
        identify({"authorization": "Bearer nope"}, keys, 0.0)
    assert e.value.status == 401
    for bad in ({"x-priority": "x"}, {"x-deadline-ms": "-5"}, {"x-tenant": "t" * 500}):
        with pytest.raises(GatewayError) as e:
            identify(bad, {}, 0.0)
        assert e.value.status == 400


# --- cap ------------------------------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(1, 5000), st.floats(0.01, 1.0)), min_size=1, max_size=20),
    st.integers(1, 6000),
)
def test_cap_moves_mass_onto_max_tokens(points: list[tuple[int, float]], max_tokens: int) -> None:
    dist = LengthDistribution.from_samples([o for o, _ in points], [w for _, w in points])
    capped = cap(dist, max_tokens)
    assert capped is not None
    assert capped.support[-1] <= max_tokens
    assert sum(capped.probs) == pytest.approx(1.0)
    assert capped.cdf(max_tokens - 1) == pytest.approx(dist.cdf(max_tokens - 1))
    assert cap(None, 10) is None and cap(dist, None) is dist


# --- dispatcher -----------------------------------------------------------------------------------

_rids = itertools.count()


def _req(prompt: int, prediction: int | None = None, arrival: float = 0.0) -> GatewayRequest:
    pred = None if prediction is None else LengthDistribution.point(prediction)
    return GatewayRequest(
        next(_rids), arrival, prompt, body={}, route="chat", model="m", prompt="", prediction=pred
    )


def _dispatcher(
    capacities: list[int],
    policy: str = "fcfs",
    waiting: list[int] | None = None,
    rule: Rule = "peak",
    **queue: int,
) -> Dispatcher:
    s = GatewaySettings.model_validate({"backends": [f"http://b{i}" for i in range(len(capacities))]})
    pool = BackendPool(s, httpx.AsyncClient())
    for b, cap_, w in zip(pool.backends, capacities, waiting or [0] * len(capacities), strict=True):
        b.load.capacity_tokens = cap_
        b.load.healthy = True
        b.scraped_waiting = w
        b.load.waiting = w
    pol = parse_policy(policy)
    q = BoundedQueue(pol, queue.get("max_requests", 1000), queue.get("max_tokens", 10**9))
    return Dispatcher(pol, pool, AdmissionConfig(max_waiting=100, rule=rule), q, clock=lambda: 0.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=2, max_size=4),
    st.lists(st.tuples(st.integers(1, 200), st.integers(1, 200)), min_size=1, max_size=40),
    st.sampled_from(RULES),
)
def test_dispatch_never_overfills_and_keeps_rank_order(
    capacities: list[int], reqs: list[tuple[int, int]], rule: Rule
) -> None:
    async def go() -> None:
        d = _dispatcher(capacities, "sjf-oracle", rule=rule)
        for ld in d.pool.loads:  # hold everything while the queue fills (backends full), then one pass
            ld.waiting = d.cfg.max_waiting
        made = []
        for prompt, out in reqs:
            r = _req(prompt, out)
            r.true_output = out
            made.append(r)
            d.submit(r)
        for ld in d.pool.loads:
            ld.waiting = 0
        d.dispatch()
        loads = d.pool.loads
        for b in d.pool.backends:  # an idle backend may take one oversized request; else never past target
            ld, cfg = b.load, d.cfg
            within = (
                ld.charged_tokens <= cfg.target * ld.capacity_tokens
                if rule == "sum"
                else ld.holdings.peak() <= cfg.peak_target * ld.capacity_tokens
            )
            assert within or b.inflight == 1
        sent = [r for r in made if r.backend is not None]
        held = [r for r in made if r.backend is None]
        assert len(sent) + len(d.queue) == len(made)
        if held and sent:  # dispatch stopped at the best-ranked held request: all sent rank before it
            head = d.queue.peek(0.0)
            assert head is not None
            assert all(r.key_cache < head.key_cache for r in sent)
        for r in sent:
            d.release(r)
        assert all(ld.charged_tokens == 0 for ld in loads)

    asyncio.run(go())


def test_dispatch_respects_waiting_threshold_and_most_room() -> None:
    async def go() -> None:
        d = _dispatcher([1000, 3000, 5000], waiting=[0, 0, 100])
        r = _req(10, 10)
        d.submit(r)
        d.dispatch()
        assert r.backend == 1  # backend 2 has more room but reports a long waiting list
        fut = r.future
        assert fut is not None and fut.result() == 1

    asyncio.run(go())


def test_queue_bounds_and_withdraw() -> None:
    async def go() -> None:
        d = _dispatcher([100], waiting=[1000], max_requests=2, max_tokens=50)
        a, b = _req(20), _req(20)
        d.submit(a)
        d.submit(b)
        with pytest.raises(QueueFull) as e:
            d.submit(_req(1))
        assert e.value.reason == "queue_full_requests"
        assert d.withdraw(a) and not d.withdraw(a)
        with pytest.raises(QueueFull) as e:
            d.submit(_req(40))
        assert e.value.reason == "queue_full_tokens"
        assert d.queue.tokens == 20

    asyncio.run(go())


def test_progress_corrects_the_charge_and_release_frees_it() -> None:
    async def go() -> None:
        d = _dispatcher([100_000])
        r = _req(100, 50)
        d.submit(r)
        d.dispatch()
        load = d.pool.loads[0]
        assert load.charged_tokens == 150
        d.progress(r, 80)  # past the prediction: the charge grows with the output
        assert load.charged_tokens > 180
        d.release(r)
        assert load.charged_tokens == 0 and d.pool.backends[0].inflight == 0

    asyncio.run(go())


def test_waiting_estimate_attributes_the_scrape_to_the_newest_unstarted() -> None:
    b = Backend(BackendSettings(url="http://b"), 10_000, HealthSettings(), clock=lambda: 0.0)
    for rid, tokens in ((1, 100), (2, 200), (3, 300)):
        b.sent(rid, tokens)
    assert (b.load.waiting, b.load.waiting_tokens) == (3, 600)  # all pending until they answer
    b.started(1)
    b.scrape_begins()
    b.scraped(EngineMetrics(waiting=1, running=5))  # the engine waits on one: our newest
    assert (b.load.waiting, b.load.waiting_tokens) == (1, 300)
    b.sent(4, 50)
    assert (b.load.waiting, b.load.waiting_tokens) == (2, 350)
    b.expire(4)  # pending_s passed: assumed scheduled
    assert (b.load.waiting, b.load.waiting_tokens) == (1, 300)
    b.started(3)
    b.started(3)  # idempotent
    assert (b.load.waiting, b.load.waiting_tokens) == (0, 0)
    b.started(2)
    b.started(4)
    b.scrape_begins()
    b.scraped(EngineMetrics(waiting=4))  # others' requests: our running mean prompt each
    assert b.load.waiting == 4 and b.load.waiting_tokens == round(4 * b.mean_prompt) > 0


def test_waiting_estimate_has_no_gap_while_a_scrape_is_under_way() -> None:
    """Sent just before a scrape began: it counts until that scrape answers (a slow scrape, or a
    failed one, must not let the dispatcher believe the backend's waiting list emptied)."""
    b = Backend(BackendSettings(url="http://b"), 10_000, HealthSettings(), clock=lambda: 0.0)
    b.sent(1, 100)
    b.scrape_begins()
    assert (b.load.waiting, b.load.waiting_tokens) == (1, 100)  # the scrape has not answered yet
    b.sent(2, 50)
    b.scrape_begins()  # the first scrape failed (no answer); the next one accounts for both
    assert (b.load.waiting, b.load.waiting_tokens) == (2, 150)
    b.expire(1)  # pending_s passed: assumed scheduled, whether or not a scrape is under way
    assert (b.load.waiting, b.load.waiting_tokens) == (1, 50)
    b.scraped(EngineMetrics(waiting=1, running=1))  # the answer: the engine waits on our newest
    assert (b.load.waiting, b.load.waiting_tokens) == (1, 50)
    b.started(2)
    assert (b.load.waiting, b.load.waiting_tokens) == (0, 0)


# --- prompt share ---------------------------------------------------------------------------------


def test_share_sample_is_what_prompts_hold_over_what_they_count() -> None:
    cap_ = 16_384
    assert share_sample(3_000, 1_000, 8_000, cap_) == 0.25  # 2,000 of 8,000 prompt tokens held
    assert share_sample(9_500, 1_000, 8_000, cap_) == 1.0  # nothing shared (block rounding): never above 1
    assert share_sample(1_000, 1_000, 8_000, cap_) == SHARE_FLOOR  # never below the floor
    assert share_sample(3_000, 1_000, cap_ // 8 - 1, cap_) is None  # too little running to tell
    s = PromptShare()
    s.observe(3_000, 1_000, 1_000, cap_)
    assert (s.value, s.samples) == (1.0, 0)
    s.observe(3_000, 1_000, 8_000, cap_)
    assert s.samples == 1 and 0.25 < s.value < 1.0  # smoothed toward the sample
    for _ in range(30):
        s.observe(3_000, 1_000, 8_000, cap_)
    assert abs(s.value - 0.25) < 1e-6


def test_backend_measures_the_share_of_the_prompts_it_runs() -> None:
    b = Backend(BackendSettings(url="http://b"), 10_000, HealthSettings(), clock=lambda: 0.0)
    for rid in range(6):
        b.sent(rid, 1_000)
    for rid in range(4):
        b.started(rid)
        b.progressed(100)
    b.left(5, 1_000, 0)  # one left before the scrape: not counted
    b.scrape_begins()
    # The engine runs four (one shared 1,000-token prompt, 400 generated) and waits on rid 4.
    b.scraped(EngineMetrics(waiting=1, running=4, kv_usage=1_400 / 16_384, capacity_tokens=16_384))
    assert b.held_prompt == 5_000 and b.held_generated == 400
    assert b.prompt_share.samples == 1
    assert b.prompt_share.value == 0.5 * (1.0 + 1_000 / 4_000)  # rid 4 waits: it holds no KV
    for rid in range(5):
        b.left(rid, 1_000, 100 if rid < 4 else 0)
    assert (b.held_prompt, b.held_generated, b.inflight) == (0, 0, 0)


def test_dispatch_charges_the_prompt_share() -> None:
    async def go() -> None:
        d = _dispatcher([10_000])
        d.pool.measure_share = True  # admission.prompt_share: true
        for b in d.pool.backends:
            b.prompt_share.value = 0.25
        d.pool.update_share()
        assert d.pool.prompt_share == 0.25
        r = _req(1_000, 100)
        d.submit(r)
        d.dispatch()
        assert d.pool.loads[0].charged_tokens == 250 + 100
        d.release(r)
        held = _req(100_000, 100)  # larger than any target: held while another runs
        d.submit(_req(10, 10))
        d.submit(held)
        d.dispatch()
        assert held.backend is None and held.charge is not None and held.charge.value == 25_000 + 100
        d.pool.prompt_share = 0.5  # a later scrape: the head is charged afresh
        d.dispatch()
        assert held.charge.value == 50_000 + 100

    asyncio.run(go())


def test_prompt_share_is_off_unless_asked_for() -> None:
    for admission, expected in (({}, 1.0), ({"prompt_share": False}, 1.0), ({"prompt_share": True}, 0.25)):
        s = GatewaySettings.model_validate({"backends": ["http://b"], "admission": admission})
        pool = BackendPool(s, httpx.AsyncClient())
        pool.backends[0].prompt_share.value = 0.25
        pool.backends[0].load.healthy = True
        pool.update_share()
        assert pool.prompt_share == expected, admission


def test_a_counter_that_falls_between_scrapes_is_a_restart() -> None:
    from sagegate.gateway.scrape import parse_metrics, restarted

    before = parse_metrics(
        'vllm:prefix_cache_queries_total{model_name="m"} 5000\n'
        'vllm:prefix_cache_hits_total{model_name="m"} 3000\n'
        'vllm:prompt_tokens_total{model_name="m"} 5000\n'
    )
    assert (before.prefix_queries, before.prefix_hits, before.prompt_tokens) == (5000, 3000, 5000)
    later = parse_metrics(
        'vllm:prefix_cache_queries_total{model_name="m"} 7000\nvllm:prompt_tokens_total 7000\n'
    )
    fresh = parse_metrics('vllm:prefix_cache_queries_total{model_name="m"} 40\nvllm:prompt_tokens_total 40\n')
    assert not restarted(before, later) and restarted(later, fresh) and not restarted(None, fresh)
    silent = parse_metrics('vllm:num_requests_waiting{model_name="m"} 0\n')  # a backend without counters
    assert silent.prefix_queries is None and not restarted(before, silent)


def test_a_backend_learns_its_speed_from_the_counters_of_busy_intervals() -> None:
    """Scrapes of an engine that prefills 2,000 tokens and decodes 10 steps of a batch of 20 every
    0.3 s: the backend's learned speed accounts for that time; idle intervals teach nothing."""
    now = [0.0]
    b = Backend(BackendSettings(url="http://x"), 10_000, HealthSettings(), lambda: now[0])
    assert b.load.speed is None
    prompt = gen = 0.0
    for _ in range(100):
        b.scraped(EngineMetrics(running=20, waiting=1, prompt_tokens=prompt, generation_tokens=gen))
        now[0] += 0.3
        prompt, gen = prompt + 2000, gen + 200
    s = b.load.speed
    assert s is not None
    forecast = 2000 * s.prefill_s + 10 * (s.step_s + 20 * s.per_seq_s)
    assert abs(forecast / 0.3 - 1) < 0.05
    learned = b.speed.fit.intervals
    b.scraped(EngineMetrics(running=0, waiting=0, prompt_tokens=prompt, generation_tokens=gen))
    now[0] += 5.0
    b.scraped(EngineMetrics(running=0, waiting=0, prompt_tokens=prompt, generation_tokens=gen))
    assert b.speed.fit.intervals == learned and b.load.speed == s  # idle: nothing learned
