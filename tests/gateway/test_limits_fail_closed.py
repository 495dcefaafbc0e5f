"""Limits and keys that fail closed: a Redis stall or a dead replica leaks no concurrency for long,
every key the limiter writes expires, a limits file that is empty, half-written, invalid or gone
keeps the limits and keys in force, and one request cannot carry a tenant far past its tokens per
minute (the reproductions of a hostile run against the operator surface)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sagegate.gateway.app import create_app
from sagegate.gateway.rate_limits import LimitsFileError, RateLimiter
from sagegate.gateway.settings_rate_limits import RateLimitSettings
from sagegate.harness.procs import free_port
from tests.gateway_support import FakeBackend, ServerThread, fleet, metric, settings_for, until, wait_until

BODY = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def post(
    url: str, key: str | None = None, body: dict[str, Any] | None = None, **headers: str
) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(url + "/v1/chat/completions", json=body or BODY, headers=headers, timeout=30)


# --- leases ----------------------------------------------------------------------------------------
def test_a_redis_stall_during_two_requests_leaks_no_place(private_redis: Any) -> None:
    """``concurrent: 2``, two requests running, Redis paused (every client) for 2.5 s while they end:
    their give-backs fail, are kept and sent again once Redis answers, so the tenant's next two run
    within seconds (before: both places stayed taken for three minutes)."""
    import redis

    slow = FakeBackend(tokens=20, delay_s=0.05)
    rl = {"tenants": {"conc": {"concurrent": 2}}, "redis_prefix": "stall"}
    r = redis.Redis.from_url(private_redis.url)
    with ServerThread(slow.app) as be:
        settings = settings_for(
            [be.url],
            redis_url=private_redis.url,
            rate_limits=rl,
            api_keys={"k": "conc"},
            ledger={"enabled": False},
        )
        with ServerThread(create_app(settings)) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
            codes: list[int] = []
            body = {**BODY, "max_tokens": 20}
            threads = [
                threading.Thread(target=lambda: codes.append(post(gw.url, "k", body).status_code))
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            wait_until(lambda: slow.state.requests == 2, what="both running")
            r.client_pause(2500, all=True)
            for t in threads:
                t.join(30)
            assert codes == [200, 200]
            errors_seen = lambda: metric(gw.url, "sagegate_limits_redis_errors_total") >= 1  # noqa: E731
            wait_until(errors_seen, what="a failed give-back counted")
            wait_until(lambda: r.zcard("stall:{conc}:slots") == 0, timeout=10, what="the places given back")
            again: list[int] = []
            threads = [
                threading.Thread(target=lambda: again.append(post(gw.url, "k", body).status_code))
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert again == [200, 200]
            assert metric(gw.url, "sagegate_limits_unsettled") == 0
    r.close()


def test_a_replica_killed_with_places_held_frees_them_when_its_leases_lapse(
    redis_url: str, redis_prefix: str
) -> None:
    settings = RateLimitSettings(
        tenants={"t": {"concurrent": 2}}, redis_prefix=redis_prefix, lease_s=1.0, timeout_s=2.0
    )

    async def run() -> None:
        killed = RateLimiter(settings, {}, redis_url)
        other = RateLimiter(settings, {}, redis_url)
        try:
            assert await killed.admit("t", 10, 10) is not None
            assert await killed.admit("t", 10, 10) is not None
            assert killed._keeper is not None
            killed._keeper.cancel()  # the process is gone: nothing renews, nothing gives back
            with pytest.raises(Exception, match="concurrent"):
                await other.admit("t", 10, 10)
            admitted: list[object] = []

            async def try_once() -> None:
                try:
                    admitted.append(await other.admit("t", 10, 10))
                except Exception:
                    await asyncio.sleep(0.1)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while not admitted and loop.time() < deadline:
                await try_once()
            assert admitted, "the dead replica's places never came back"
        finally:
            await killed.close()
            await other.close()

    asyncio.run(run())


def test_a_long_request_keeps_its_place_while_its_replica_renews_it(
    redis_url: str, redis_prefix: str
) -> None:
    settings = RateLimitSettings(tenants={"t": {"concurrent": 1}}, redis_prefix=redis_prefix, lease_s=1.0)

    async def run() -> None:
        a, b = RateLimiter(settings, {}, redis_url), RateLimiter(settings, {}, redis_url)
        try:
            permit = await a.admit("t", 10, 10)
            assert permit is not None
            await asyncio.sleep(2.5)  # two and a half leases: renewed all along
            with pytest.raises(Exception, match="concurrent"):
                await b.admit("t", 10, 10)
            permit.end(3)
            await until(lambda: not a.unsettled, what="the give-back sent")
            assert await b.admit("t", 10, 10) is not None
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


def test_every_key_the_limiter_writes_expires(redis_url: str, redis_prefix: str) -> None:
    """200 tenants (claimed, no keys) each send a request: every key left has a TTL, at most two
    minutes (the counts) or a lease (the places); none lives forever."""
    import redis

    settings = RateLimitSettings(
        default={"concurrent": 4, "tokens_per_minute": 10_000}, redis_prefix=redis_prefix
    )

    async def run() -> None:
        limiter = RateLimiter(settings, {}, redis_url)
        try:
            for i in range(200):
                permit = await limiter.admit(f"tenant-{i}", 5, 5)
                assert permit is not None
                if i % 2:
                    permit.end(2)
            await until(lambda: not limiter.unsettled, what="give-backs sent")
        finally:
            await limiter.close()

    asyncio.run(run())
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{redis_prefix}*", count=1000))
    ttls = {k.decode(): r.ttl(k) for k in keys}
    r.close()
    assert len(ttls) >= 200
    assert all(0 < t <= 120 for t in ttls.values()), [kv for kv in ttls.items() if not 0 < kv[1] <= 120][:5]
    slots = [t for k, t in ttls.items() if k.endswith(":slots")]
    assert slots and max(slots) <= settings.lease_s + 1


# --- tokens per minute --------------------------------------------------------------------------
def test_a_prompt_over_the_whole_minute_is_refused_without_a_retry_after() -> None:
    limits = {"default": {"tokens_per_minute": 500}}
    with fleet({}, rate_limits=limits) as (fakes, url):
        big = {**BODY, "messages": [{"role": "user", "content": "word " * 3000}]}
        r = post(url, body=big, **{"x-tenant": "t1"})
        assert r.status_code == 429
        assert "too large" in r.json()["error"]["message"]
        assert "retry-after" not in r.headers
        assert fakes[0].state.requests == 0
        assert post(url, **{"x-tenant": "t1"}).status_code == 200  # nothing was charged for it


def test_no_minute_serves_more_than_the_limit_and_one_requests_cap() -> None:
    """500 tokens a minute, ``max_tokens`` 150, each answer 150 tokens long, 8 clients in parallel
    for a few seconds: what is served (prompts and outputs) stays within 500 + 150."""
    fake_tokens = 150
    limits = {"default": {"tokens_per_minute": 500}}
    with fleet({"tokens": fake_tokens, "delay_s": 0.002}, rate_limits=limits) as (_, url):
        served: list[int] = []
        body = {**BODY, "max_tokens": fake_tokens}

        def client() -> None:
            for _ in range(6):
                r = post(url, body=body, **{"x-tenant": "t1"})
                if r.status_code == 200:
                    served.append(r.json()["usage"]["total_tokens"])

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert served, "nothing admitted"
    assert len(served) * (fake_tokens + 3) <= 500 + fake_tokens, served


# --- the limits file ----------------------------------------------------------------------------
GOOD = {"api_keys": {"k1": "acme"}, "tenants": {"acme": {"requests_per_minute": 1}}}


def limiter_on(path: Path, **kw: Any) -> RateLimiter:
    return RateLimiter(RateLimitSettings(file=str(path), reload_s=0.01, **kw), {})


def settle(limiter: RateLimiter) -> bool:
    """Two checks of the file (a change is applied once it is seen unchanged); whether it applied."""
    return limiter.reload(force=True) | limiter.reload(force=True)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n",
        "api_keys:\n",
        "api_keys:\n  k1: acme\ntenants:\n  acme: {requests_per_mi",
        "[1, 2]",
        "api_keys: {}\n",
    ],
    ids=["empty", "blank", "half-written", "truncated", "not-a-mapping", "every-key-removed"],
)
def test_a_limits_file_that_cannot_be_put_in_force_keeps_the_last_good_one(tmp_path: Path, text: str) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    limiter = limiter_on(path)
    assert limiter.api_keys == {"k1": "acme"}
    path.write_text(text)
    assert not settle(limiter)
    assert limiter.api_keys == {"k1": "acme"}
    assert limiter.limits_of("acme").requests_per_minute == 1
    path.write_text(yaml.safe_dump({**GOOD, "api_keys": {"k2": "acme"}}))  # a good one after it
    assert settle(limiter)
    assert limiter.api_keys == {"k2": "acme"}


def test_a_deleted_limits_file_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    limiter = limiter_on(path)
    path.unlink()
    assert not settle(limiter)
    assert limiter.api_keys == {"k1": "acme"}


def test_a_file_being_written_is_not_read_half_way(tmp_path: Path) -> None:
    """A valid first half (the keys, not yet the tenants' limits) seen once is not applied; the
    whole file, once it stays the same for a check, is."""
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    limiter = limiter_on(path)
    path.write_text("api_keys:\n  k1: acme\n  k2: beta\n")  # the writer has got this far
    assert not limiter.reload(force=True)
    tenants = {"acme": {"requests_per_minute": 1}, "beta": {"concurrent": 2}}
    path.write_text(yaml.safe_dump({"api_keys": {"k1": "acme", "k2": "beta"}, "tenants": tenants}))
    assert not limiter.reload(force=True)
    assert limiter.reload(force=True)
    assert limiter.limits_of("beta").concurrent == 2
    assert limiter.limits_of("acme").requests_per_minute == 1


def test_removing_every_key_takes_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    limiter = limiter_on(path)
    path.write_text(yaml.safe_dump({"api_keys": {}, "open": True}))
    assert settle(limiter)
    assert limiter.api_keys == {}


@pytest.mark.parametrize(
    "text", [None, "", "api_keys:\n", "api_keys: {}\n"], ids=["missing", "empty", "half", "no-keys"]
)
def test_a_limits_file_that_cannot_be_read_at_start_up_stops_the_gateway(
    tmp_path: Path, text: str | None
) -> None:
    path = tmp_path / "limits.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(LimitsFileError):
        RateLimiter(RateLimitSettings(file=str(path)), {"old": "acme"})


def test_an_emptied_limits_file_keeps_keys_and_limits_in_force_at_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    with fleet({}, rate_limits={"file": str(path), "reload_s": 0.02}) as (_, url):
        assert post(url, "k1").status_code == 200
        assert post(url, "k1").status_code == 429
        path.write_text("")  # a truncate-then-write save, caught between the two
        for _ in range(10):  # several checks of the file
            assert post(url).status_code == 401
            assert post(url, "k1").status_code == 429


def test_what_redis_never_took_is_forgotten_once_its_lease_has_lapsed_there() -> None:
    """Redis unreachable: each admission counts locally and owes Redis a give-back of the lease its
    call may still have taken; once that lease has lapsed there is nothing left to give back, so
    the list of what is owed stays bounded however long Redis stays away."""
    dead = f"redis://127.0.0.1:{free_port()}"
    settings = RateLimitSettings(default={"concurrent": 100}, lease_s=1.0, timeout_s=0.2)

    async def run() -> None:
        limiter = RateLimiter(settings, {}, dead)
        try:
            permits = [await limiter.admit("t", 5, 5) for _ in range(20)]
            assert all(p is not None and not p.shared for p in permits)  # counted here meanwhile
            assert len(limiter.unsettled) == 20 and limiter.redis_errors >= 20
            await until(lambda: not limiter.unsettled, what="the owed give-backs forgotten", timeout=5)
            for p in permits:
                assert p is not None
                p.end(1)
            assert limiter.local.minutes_of("t")  # the local counts took them
        finally:
            await limiter.close()

    asyncio.run(run())
