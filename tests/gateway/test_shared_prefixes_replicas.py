"""Two gateway replicas sharing their prefix indexes through a real Redis, over loopback HTTP, in front
of two fake backends that they list in opposite orders (so a placement without the shared index goes
elsewhere, and the replicas must name backends by URL): a conversation's second turn through the other
replica goes where its first went, with a predicted hit; without sharing it does not; a malformed
message is dropped; and with Redis killed mid-run requests still succeed, and what was placed meanwhile
reaches the other replica once Redis is back."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sagegate.core.prefix import CHARS_PER_TOKEN, text_block_keys
from sagegate.core.tokens import flatten_messages
from sagegate.gateway.app import create_app
from sagegate.gateway.shared_prefixes_parts import encode
from sagegate.harness.redis import RedisServer
from tests.gateway_support import FakeBackend, ServerThread, admin, metric, settings_for, wait_until

pytestmark = pytest.mark.heavy  # live replicas and backends, Redis

pytest.importorskip("redis")

HISTORY = "You are the booking assistant of a railway company; answer from the timetable. " * 120
APPLIED = 'sagegate_prefix_share_blocks_total{what="applied"}'
PUBLISHED = 'sagegate_prefix_share_blocks_total{what="published"}'


@dataclass
class Fleet:
    fakes: list[FakeBackend]
    """x and y."""
    urls: list[str]
    """Their URLs (x, y): A lists them in this order, B the other way round."""
    a: str
    b: str


@contextmanager
def replicas(redis_url: str, prefix: str, **share: Any) -> Iterator[Fleet]:
    """Two fake backends, and replicas A (listing them x, y) and B (y, x) on one Redis."""
    fakes = [FakeBackend(), FakeBackend()]
    with ExitStack() as stack:
        urls = [stack.enter_context(ServerThread(f.app)).url for f in fakes]
        gateways = []
        for order in (urls, urls[::-1]):
            s = settings_for(
                order, redis_url=redis_url, ledger={"prefix": prefix}, placement={"share": share}
            )
            gw = stack.enter_context(ServerThread(create_app(s)))
            wait_until(lambda gw=gw: all(b["healthy"] for b in admin(gw.url)["backends"]), what="up")
            gateways.append(gw.url)
        yield Fleet(fakes, urls, *gateways)


def turn(url: str, messages: list[dict[str, str]], session: str | None = None) -> httpx.Response:
    body = {"model": "fake", "messages": messages, "max_tokens": 4}
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r


def conversation(tag: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Turn 1, and turn 2: turn 1's history, the answer and a new message (the same long prefix)."""
    first = [{"role": "system", "content": f"[{tag}] {HISTORY}"}, {"role": "user", "content": "Basel?"}]
    second = [*first, {"role": "assistant", "content": "At 7:40."}, {"role": "user", "content": "Back?"}]
    return first, second


def caught_up(a: str, b: str) -> None:
    """Wait until B has applied as many blocks as A published (only A places turn 1s; more: a batch
    whose publish timed out in a stalled Redis, and went out again, reached B twice)."""
    wait_until(lambda: metric(b, APPLIED) >= metric(a, PUBLISHED), timeout=10, what="B caught up")


def served(fakes: list[FakeBackend]) -> list[int]:
    return [f.state.requests for f in fakes]


def went_to(fakes: list[FakeBackend], before: list[int]) -> int:
    """The fake backend that took the one request sent since ``before``."""
    after = served(fakes)
    (idx,) = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a != b]
    return idx


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "not_shared"])
def test_turn_two_through_the_other_replica_finds_turn_ones_backend(
    redis_url: str, redis_prefix: str, shared: bool
) -> None:
    with replicas(redis_url, redis_prefix, enabled=shared) as f:
        first, second = conversation("c1")
        before = served(f.fakes)
        assert turn(f.a, first).headers["x-sagegate-prefix-hit"] == "0"
        home = went_to(f.fakes, before)
        if shared:
            wait_until(lambda: metric(f.b, APPLIED) > 0, what="B applied A's blocks", timeout=10)
        else:  # no share side at all, on either replica (no sagegate_prefix_share_* metric), nor a stream
            import redis

            for url in (f.a, f.b):
                assert "sagegate_prefix_share_" not in httpx.get(url + "/metrics", timeout=5).text
            client = redis.Redis.from_url(redis_url)
            try:
                assert not client.exists(f"{redis_prefix}:prefixes")
            finally:
                client.close()
        before = served(f.fakes)
        r = turn(f.b, second)
        if shared:
            assert went_to(f.fakes, before) == home
            assert int(r.headers["x-sagegate-prefix-hit"]) > 1500  # the history, in whole blocks
            assert metric(f.a, 'sagegate_prefix_share_messages_total{what="published"}') >= 1
            assert metric(f.b, 'sagegate_prefix_share_up{side="read"}') == 1
        else:  # B never heard of turn 1: no hit, and its own tie-break picks its first backend
            assert went_to(f.fakes, before) != home
            assert r.headers["x-sagegate-prefix-hit"] == "0"
            assert metric(f.b, APPLIED) == 0


def test_a_session_is_shared_too(redis_url: str, redis_prefix: str) -> None:
    with replicas(redis_url, redis_prefix) as f:
        first, _ = conversation("c2")
        before = served(f.fakes)
        turn(f.a, first, session="s-7")
        home = went_to(f.fakes, before)
        wait_until(
            lambda: metric(f.b, 'sagegate_prefix_share_sessions_total{what="applied"}') == 1, timeout=10
        )
        # the history re-rendered (no block in common), the same session: credited where turn 1 went
        before = served(f.fakes)
        r = turn(f.b, [{"role": "system", "content": "Be brief."}, *first], session="s-7")
        assert went_to(f.fakes, before) == home and int(r.headers["x-sagegate-prefix-hit"]) > 0


def test_a_malformed_message_is_dropped_and_a_foreign_one_applied(redis_url: str, redis_prefix: str) -> None:
    import redis

    malformed = 'sagegate_prefix_share_dropped_messages_total{reason="malformed"}'
    with replicas(redis_url, redis_prefix) as f:
        client = redis.Redis.from_url(redis_url)
        stream = f"{redis_prefix}:prefixes"
        client.xadd(stream, {"m": b"SGPI garbage"})
        client.xadd(stream, {"other": b"field"})
        for url in (f.a, f.b):
            wait_until(lambda url=url: metric(url, malformed) == 2, what="both dropped both", timeout=10)
        # a well-formed message from a replica neither has met, naming backend y by its URL
        _, second = conversation("c3")
        keys = text_block_keys(flatten_messages(second), 64 * CHARS_PER_TOKEN)
        client.xadd(stream, {"m": encode(b"stranger", 64, [(f.urls[1], keys)])})
        client.close()
        for url in (f.a, f.b):
            wait_until(
                lambda url=url: metric(url, APPLIED) == len(keys), what="the stranger's blocks", timeout=10
            )
        for url in (f.a, f.b):  # y, although x is first for A, and both hold nothing of their own
            before = served(f.fakes)
            r = turn(url, second)
            assert went_to(f.fakes, before) == 1 and int(r.headers["x-sagegate-prefix-hit"]) > 1500


def test_redis_killed_mid_run(private_redis: RedisServer, redis_prefix: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="sagegate.gateway")
    with replicas(private_redis.url, redis_prefix, timeout_s=0.2, max_backoff_s=0.3) as f:
        turn(f.a, conversation("before")[0])
        wait_until(lambda: metric(f.b, APPLIED) > 0, what="sharing works", timeout=10)
        private_redis.kill()
        for url in (f.a, f.b):
            wait_until(lambda url=url: metric(url, 'sagegate_prefix_share_up{side="read"}') == 0, timeout=10)
        first, second = conversation("during")
        before = served(f.fakes)
        t0 = time.monotonic()
        turn(f.a, first)  # Redis away: requests are served at once, placed on the local index
        home = went_to(f.fakes, before)
        turn(f.b, conversation("other")[0])
        assert time.monotonic() - t0 < 5.0
        wait_until(
            lambda: metric(f.a, 'sagegate_prefix_share_failures_total{side="publish"}') > 0, timeout=10
        )
        assert metric(f.a, "sagegate_prefix_share_pending_blocks") > 0  # waiting for Redis (bounded)
        assert any(r.levelno == logging.INFO and "prefix sharing" in r.getMessage() for r in caplog.records)
        published = metric(f.a, PUBLISHED)
        private_redis.start()  # empty, as a restart without persistence
        # what A placed while Redis was away goes out now; B, reading on from where it was, gets it
        wait_until(lambda: metric(f.a, PUBLISHED) > published, timeout=10, what="A published its batch")
        caught_up(f.a, f.b)
        before = served(f.fakes)
        r = turn(f.b, second)
        assert went_to(f.fakes, before) == home and int(r.headers["x-sagegate-prefix-hit"]) > 1500
        assert metric(f.a, 'sagegate_prefix_share_up{side="publish"}') == 1


def test_a_stalled_redis_blocks_nothing(private_redis: RedisServer, redis_prefix: str) -> None:
    """Redis frozen (SIGSTOP: connections open, no answers): calls time out, requests go on at once."""
    assert private_redis.proc is not None
    with replicas(private_redis.url, redis_prefix, timeout_s=0.2, max_backoff_s=0.3) as f:
        turn(f.a, conversation("before")[0])
        wait_until(lambda: metric(f.b, APPLIED) > 0, what="sharing works", timeout=10)
        os.kill(private_redis.proc.pid, signal.SIGSTOP)
        try:
            first, second = conversation("frozen")
            t0 = time.monotonic()
            for url in (f.a, f.b, f.a):
                turn(url, first)
            assert time.monotonic() - t0 < 5.0
            for url in (f.a, f.b):
                wait_until(
                    lambda url=url: metric(url, 'sagegate_prefix_share_up{side="read"}') == 0, timeout=10
                )
            wait_until(lambda: metric(f.a, 'sagegate_prefix_share_up{side="publish"}') == 0, timeout=10)
        finally:
            os.kill(private_redis.proc.pid, signal.SIGCONT)
        # it answers again: what A placed meanwhile, and what it places now, reaches B
        first, second = conversation("after")
        before = served(f.fakes)
        turn(f.a, first)
        home = went_to(f.fakes, before)
        wait_until(lambda: metric(f.a, "sagegate_prefix_share_pending_blocks") == 0, timeout=10)
        caught_up(f.a, f.b)
        before = served(f.fakes)
        r = turn(f.b, second)
        assert went_to(f.fakes, before) == home and int(r.headers["x-sagegate-prefix-hit"]) > 1500
