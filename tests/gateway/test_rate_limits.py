"""Per-tenant rate limits: the rule, the rule inside Redis held equal to it, and the gateway refusing
with ``429`` + ``Retry-After`` (alone, and two replicas holding one limit through one Redis)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sagegate.gateway.app import create_app
from sagegate.gateway.rate_limit_rule import Refusal, Window, decide
from sagegate.gateway.rate_limits import LocalCounts, RedisCounts
from sagegate.gateway.settings_rate_limits import RateLimitSettings, TenantLimits
from tests.gateway_support import FakeBackend, ServerThread, fleet, metric, settings_for, wait_until

BODY = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def post(url: str, tenant: str = "t1", **headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions", json=BODY, headers={"x-tenant": tenant, **headers}, timeout=30
    )


def test_the_rule_reads_a_sliding_minute_from_two_fixed_ones() -> None:
    rpm = TenantLimits(requests_per_minute=10)
    # 30 s into a minute, 10 requests last minute and 4 this one: 10·0.5 + 4 = 9 < 10, one more fits
    assert decide(rpm, Window(90.0, (10, 4), (0, 0), 0)) is None
    refused = decide(rpm, Window(90.0, (10, 5), (0, 0), 0))  # 10 ≥ 10: refused
    assert refused == Refusal("requests", 6)  # 10·(1−x) + 5 ≤ 9 once x ≥ 0.6: 36 s into the minute
    assert decide(rpm, Window(90.0, (0, 10), (0, 0), 0)) == Refusal("requests", 30)  # only the next minute
    tpm = TenantLimits(tokens_per_minute=1000)
    assert decide(tpm, Window(0.0, (0, 0), (0, 999), 0)) is None  # under: a request may start
    assert decide(tpm, Window(0.0, (0, 0), (0, 1000), 0)) is not None
    conc = TenantLimits(concurrent=2)
    assert decide(conc, Window(0.0, (0, 0), (0, 0), 1)) is None
    assert decide(conc, Window(0.0, (0, 0), (0, 0), 2)) == Refusal("concurrent", 1)


@pytest.mark.parametrize(
    "limits",
    [
        TenantLimits(requests_per_minute=22, tokens_per_minute=7000, concurrent=6),
        TenantLimits(requests_per_minute=40, tokens_per_minute=4000, concurrent=3),
    ],
    ids=["requests-first", "tokens-first"],
)
def test_the_rule_inside_redis_is_the_rules_own(
    redis_url: str, redis_prefix: str, limits: TenantLimits
) -> None:
    """The same random sequence of starts, output counted as it streams and ends, on one clock,
    through the Python rule and the Lua script: the same decisions, the same Retry-After."""
    rng = random.Random(7)
    settings = RateLimitSettings(redis_prefix=redis_prefix, timeout_s=5.0)
    clock = [1000.0]
    local = LocalCounts(clock=lambda: clock[0])

    async def run() -> list[tuple[Any, Any]]:
        remote = RedisCounts(redis_url, settings, LocalCounts())
        held: list[int] = []
        seen = []
        try:
            for _ in range(400):
                clock[0] += rng.expovariate(1 / 1.5)
                if held and rng.random() < 0.2:  # output counted as it streams: the request stays
                    more = rng.randint(1, 100)
                    local.release("t", more, done=False)
                    await remote.release("t", more, now=clock[0], done=False)
                    continue
                if held and rng.random() < 0.45:
                    out = held.pop(rng.randrange(len(held)))
                    local.release("t", out)
                    await remote.release("t", out, now=clock[0])
                    continue
                prompt = rng.randint(10, 300)
                mine = local.acquire("t", limits, prompt)
                theirs, decided = await remote.acquire("t", limits, prompt, now=clock[0])
                assert decided
                seen.append((mine, theirs))
                if mine is None:
                    held.append(rng.randint(0, 200))
        finally:
            await remote.close()
        return seen

    seen = asyncio.run(run())
    assert all(mine == theirs for mine, theirs in seen), [p for p in seen if p[0] != p[1]][:3]
    kinds = {m.kind for m, _ in seen if m is not None}
    assert len(kinds) >= 2 and "concurrent" in kinds, kinds  # the limits were met on the way
    assert sum(m is None for m, _ in seen) > 50


def test_over_a_limit_the_gateway_answers_429_with_retry_after() -> None:
    limits = {"tenants": {"t1": {"requests_per_minute": 3}}}
    with fleet({}, rate_limits=limits) as (_, url):
        answers = [post(url) for _ in range(4)]
        other = post(url, tenant="t2")
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[3]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert other.status_code == 200  # another tenant has no limit


def test_concurrency_is_given_back_when_a_request_ends_however_it_ends() -> None:
    slow = FakeBackend(tokens=40, delay_s=0.05)
    with (
        ServerThread(slow.app) as be,
        ServerThread(create_app(settings_for([be.url], rate_limits={"default": {"concurrent": 1}}))) as gw,
    ):
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
        first: dict[str, Any] = {}
        t = threading.Thread(target=lambda: first.update(r=post(gw.url)))
        t.start()
        wait_until(lambda: slow.state.requests == 1, what="the first request running")
        assert post(gw.url).status_code == 429
        t.join(30)
        assert first["r"].status_code == 200
        assert post(gw.url).status_code == 200  # its permit came back when it ended
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**BODY, "stream": True}) as s:
            next(s.iter_bytes())  # a stream the client walks away from
        wait_until(lambda: post(gw.url).status_code == 200, what="the abandoned stream's permit back")


def test_a_streams_output_counts_against_tokens_per_minute_as_it_streams() -> None:
    """A long answer is counted as it is relayed, not all at its end: while one still streams, the
    tenant is over its tokens per minute and the next request is refused."""
    slow = FakeBackend(tokens=400, delay_s=0.01)
    limits = {"default": {"tokens_per_minute": 250}}
    with (
        ServerThread(slow.app) as be,
        ServerThread(create_app(settings_for([be.url], rate_limits=limits))) as gw,
    ):
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
        body = {**BODY, "max_tokens": 400, "stream": True}
        with httpx.stream(
            "POST", gw.url + "/v1/chat/completions", json=body, headers={"x-tenant": "t1"}
        ) as s:
            events = (line for line in s.iter_lines() if line.startswith("data: {"))
            for _ in range(300):  # 300 tokens relayed, ~100 still to come
                next(events)
            refused = post(gw.url)
            assert slow.state.requests == 1  # the first is still streaming
            for _ in events:
                pass
    assert refused.status_code == 429, refused.text
    assert "tokens per minute" in refused.json()["error"]["message"]


def test_two_replicas_on_one_redis_hold_one_limit(redis_url: str, redis_prefix: str) -> None:
    fake = FakeBackend()
    rl = {"tenants": {"t1": {"requests_per_minute": 20}}, "redis_prefix": redis_prefix}
    with ServerThread(fake.app) as be:
        a = ServerThread(create_app(settings_for([be.url], redis_url=redis_url, rate_limits=rl)))
        b = ServerThread(create_app(settings_for([be.url], redis_url=redis_url, rate_limits=rl)))
        with a, b:
            for gw in (a, b):
                wait_until(lambda gw=gw: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
            codes = [post((a if i % 2 else b).url).status_code for i in range(40)]
    assert codes.count(200) == 20 and codes.count(429) == 20  # one minute's 20, not 20 a replica


def test_limits_and_keys_reload_from_their_file_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(
        yaml.safe_dump({"api_keys": {"k1": "acme"}, "tenants": {"acme": {"requests_per_minute": 1}}})
    )
    rl = {"file": str(path), "reload_s": 0.05}
    with fleet({}, rate_limits=rl, api_keys={"old": "gone"}) as (_, url):
        auth = {"authorization": "Bearer k1"}
        assert post(url, **auth).status_code == 200
        assert post(url, **auth).status_code == 429
        assert post(url, authorization="Bearer old").status_code == 401  # the file's keys replaced them
        path.write_text(yaml.safe_dump({"api_keys": {"k1": "acme", "k2": "beta"}}))  # acme unlimited now
        wait_until(lambda: post(url, **auth).status_code == 200, what="the new limits in force")
        assert post(url, authorization="Bearer k2").status_code == 200
        path.write_text("api_keys: [not, a, map]")  # a bad file: the limits in force stay
        for _ in range(3):
            assert post(url, authorization="Bearer k2").status_code == 200
            time.sleep(0.06)  # past reload_s: each request checks the file again
    bad = [r for r in caplog.records if "the limits in force stay" in r.getMessage()]
    assert len(bad) == 1  # said once, not at every check


def test_tokens_are_counted_per_named_tenant_and_latencies_per_request() -> None:
    """Per-tenant token counters name only configured tenants (a client-chosen ``x-tenant`` is
    ``other``: no unbounded label set); end-to-end and per-output-token histograms count each
    completed request."""
    with fleet({"tokens": 4}, rate_limits={"tenants": {"acme": {"concurrent": 8}}}) as (_, url):
        for tenant in ("acme", "acme", "made-up-1", "made-up-2"):
            assert post(url, tenant=tenant).status_code == 200
        text = httpx.get(url + "/metrics").text
        assert metric(url, 'sagegate_tenant_tokens_total{kind="output",tenant="acme"}') == 8
        assert metric(url, 'sagegate_tenant_tokens_total{kind="output",tenant="other"}') == 8
        assert metric(url, 'sagegate_tenant_tokens_total{kind="prompt",tenant="acme"}') > 0
        assert "made-up" not in text
        assert metric(url, "sagegate_e2e_seconds_count") == 4
        assert metric(url, "sagegate_time_per_output_token_seconds_count") == 4
