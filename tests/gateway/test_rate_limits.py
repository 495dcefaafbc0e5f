"""Per-tenant rate limits: the rule, the rule inside Redis held equal to it, and the gateway refusing
with ``429`` + ``Retry-After`` (alone, and two replicas holding one limit through one Redis)."""

from __future__ import annotations

import asyncio
import copy
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sagegate.gateway.app import create_app
from sagegate.gateway.rate_limit_counts import LocalCounts, RedisCounts
from sagegate.gateway.rate_limit_rule import Refusal, Window, decide
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
    assert refused == Refusal("requests", 7)  # 10·(1−x) + 5 ≤ 9 once x ≥ 0.6: 36 s into the minute
    # this minute alone is over: at the next one its 10 fade like the previous minute's, 9 by 6 s in
    assert decide(rpm, Window(90.0, (0, 10), (0, 0), 0)) == Refusal("requests", 37)
    tpm = TenantLimits(tokens_per_minute=1000)
    assert decide(tpm, Window(0.0, (0, 0), (0, 900), 0), prompt_tokens=100) is None  # the prompt fits
    assert decide(tpm, Window(0.0, (0, 0), (0, 900), 0), prompt_tokens=101) is not None
    assert decide(tpm, Window(0.0, (0, 0), (0, 0), 0), prompt_tokens=1001) == Refusal("too_large", 0)
    conc = TenantLimits(concurrent=2)
    assert decide(conc, Window(0.0, (0, 0), (0, 0), 1)) is None
    assert decide(conc, Window(0.0, (0, 0), (0, 0), 2)) == Refusal("concurrent", 1)
    both = TenantLimits(requests_per_minute=10, tokens_per_minute=1000)
    # over both: named by the first, the wait the longer (tokens: this minute fades below 999 at 0.06 s)
    assert decide(both, Window(90.0, (10, 5), (0, 1000), 0), 1) == Refusal("requests", 31)


@pytest.mark.parametrize("seed", range(6))
def test_a_retry_at_retry_after_is_admitted(seed: int) -> None:
    """For random streams of admissions and endings, every refusal's Retry-After is enough: with
    nothing else admitted meanwhile, the same request retried then passes (and a second earlier
    would not have, for a wait past the first second: the wait is not padded)."""
    rng = random.Random(seed)
    clock = [rng.uniform(0, 600)]
    local = LocalCounts(clock=lambda: clock[0])
    limits = TenantLimits(requests_per_minute=rng.randint(2, 30), tokens_per_minute=rng.randint(500, 5000))
    held: list[tuple[str, int, int]] = []
    checked = tight = longer = 0
    for i in range(600):
        clock[0] += rng.expovariate(1 / rng.choice([0.2, 2.0, 15.0]))
        if held and rng.random() < 0.4:
            slot, reserved, minute = held.pop(rng.randrange(len(held)))
            local.settle("t", slot, reserved - rng.randint(0, reserved), minute)
            continue
        prompt, reserved = rng.randint(1, limits.tokens_per_minute // 3), rng.randint(0, 300)
        refused, minute = local.acquire("t", limits, prompt, prompt + reserved, f"s{i}", 1e9)
        if refused is None:
            held.append((f"s{i}", reserved, minute))
            continue
        assert refused.kind in ("requests", "tokens")
        later = copy.deepcopy(local)
        wait = refused.retry_after_s
        again, _ = later.acquire("t", limits, prompt, prompt + reserved, "retry", 1e9, clock[0] + wait)
        assert again is None, (refused, again)
        checked += 1
        if wait > 1:
            early = copy.deepcopy(local)
            sooner, _ = early.acquire(
                "t", limits, prompt, prompt + reserved, "early", 1e9, clock[0] + wait - 1
            )
            longer += 1
            tight += sooner is not None
    assert checked > 20
    assert tight >= 0.95 * longer  # a second sooner is refused but where rounding put it past the edge


def test_the_rule_inside_redis_is_the_rules_own(redis_url: str, redis_prefix: str) -> None:
    """The same random sequence of admissions (charged prompt and output cap), settlements (refunds,
    overruns, a settle repeated), lease renewals and lapses, on one clock, through the Python rule
    and the Lua script: the same decisions, the same Retry-After, the same counts left."""
    rng = random.Random(7)
    lease = 20.0
    settings = RateLimitSettings(redis_prefix=redis_prefix, timeout_s=5.0, lease_s=lease)
    clock = [1000.0]
    local = LocalCounts(clock=lambda: clock[0])
    kinds_seen: set[str] = set()

    async def run() -> list[tuple[Any, Any]]:
        remote = RedisCounts(redis_url, settings)
        held: list[tuple[str, int, int]] = []
        seen = []
        try:
            for i in range(500):
                limits = [
                    TenantLimits(requests_per_minute=12, tokens_per_minute=20000, concurrent=8),
                    TenantLimits(requests_per_minute=40, tokens_per_minute=3000, concurrent=3),
                ][i // 250]
                clock[0] += rng.expovariate(1 / 1.5)
                roll = rng.random()
                if held and roll < 0.1:  # renewed, now
                    slots = [s for s, _, _ in held]
                    local.renew("t", slots, lease)
                    await remote.renew("t", slots, now=clock[0])
                    continue
                if roll < 0.13:  # a holder goes quiet long enough for some leases to lapse
                    clock[0] += rng.uniform(5, 25)
                    continue
                if held and roll < 0.5:
                    slot, reserved, minute = held.pop(rng.randrange(len(held)))
                    refund = reserved - rng.randint(0, reserved + 50)  # overruns too
                    for _ in range(2 if rng.random() < 0.2 else 1):  # a settle sent twice
                        local.settle("t", slot, refund, minute)
                        await remote.settle("t", slot, refund, minute, now=clock[0])
                    continue
                prompt, reserved = rng.randint(10, 1200), rng.randint(0, 400)
                if rng.random() < 0.03:
                    prompt = 25_000  # over every tokens-per-minute limit here
                slot = f"s{i}"
                mine = local.acquire("t", limits, prompt, prompt + reserved, slot, lease)
                theirs = await remote.acquire("t", limits, prompt, prompt + reserved, slot, now=clock[0])
                seen.append((mine[0], theirs[0]))
                if mine[0] is None:
                    assert mine == theirs, (i, mine, theirs, local._tenants["t"])
                    held.append((slot, reserved, mine[1]))
                else:
                    kinds_seen.add(mine[0].kind)
            import redis

            r = redis.Redis.from_url(redis_url)
            counts, slots = remote.keys("t")
            theirs_counts = {k.decode(): float(v) for k, v in r.hgetall(counts).items()}
            mine_counts = {f"{'rt'[j]}:{m}": c[j] for m, c in local.minutes_of("t").items() for j in (0, 1)}
            assert {k: v for k, v in theirs_counts.items() if v} == {
                k: v for k, v in mine_counts.items() if v
            }
            r.close()
        finally:
            await remote.close()
        return seen

    seen = asyncio.run(run())
    assert all(mine == theirs for mine, theirs in seen), [p for p in seen if p[0] != p[1]][:3]
    assert kinds_seen == {"requests", "tokens", "concurrent", "too_large"}  # every limit met on the way
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
    assert 1 <= int(refused.headers["retry-after"]) <= 120  # this minute's count fades over the next
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


def test_tokens_per_minute_charge_the_output_cap_at_admission_and_give_back_the_rest() -> None:
    """With 500 tokens a minute and ``max_tokens`` 200: parallel streams are admitted while their
    prompts fit what is left (each charged its prompt and 200), so at most the limit plus one
    request's cap is ever charged; when they end the unused output comes back and more are let in."""
    slow = FakeBackend(tokens=5, delay_s=0.2)
    limits = {"default": {"tokens_per_minute": 500}}
    with (
        ServerThread(slow.app) as be,
        ServerThread(create_app(settings_for([be.url], rate_limits=limits))) as gw,
    ):
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
        body = {**BODY, "max_tokens": 200}
        codes: list[int] = []

        def one() -> None:
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"x-tenant": "t1"}, timeout=30)
            codes.append(r.status_code)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        # prompt ~10 tokens: 210 + 210 ≤ 500 + 200, a third's prompt no longer fits (420 + 10 ≤ 500
        # does, 630 + 10 does not)
        assert sorted(codes) == [200] * 3 + [429] * 5, codes
        # each used 5 of its 200: 3·15 charged now, so three more fit again
        again = [post(gw.url, tenant="t1").status_code for _ in range(3)]
    assert again == [200, 200, 200]


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
    bad = [r for r in caplog.records if "the limits and keys in force stay" in r.getMessage()]
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
