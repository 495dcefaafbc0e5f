"""The history baselines (``global``, ``length-bucket``) learn from every replica's completions when
the gateway has a ``redis_url``: real Redis, the gateway's own predictor objects."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from gateway.predict import BaselinePredictor, PredictInput, build_predictor
from gateway.settings import PredictorSettings
from harness.procs import free_port
from harness.redis import RedisServer, redis_server_binary
from predictor.history import Completion
from tests.redis_support import NO_REDIS, wait_for


def inp(prompt_tokens: int = 100) -> PredictInput:
    return PredictInput(prompt="p", prompt_tokens=prompt_tokens, model="m")


def mean_of(p: BaselinePredictor, prompt_tokens: int = 100) -> float:
    dist, path = asyncio.run(p.predict(inp(prompt_tokens)))
    assert dist is not None and path == p.name
    return dist.mean


def replica(name: str, url: str, prefix: str) -> BaselinePredictor:
    p = build_predictor(name, url, PredictorSettings(redis_prefix=prefix))
    assert isinstance(p, BaselinePredictor)
    asyncio.run(p.astart())
    return p


def record(p: BaselinePredictor, output_tokens: int, n: int, prompt_tokens: int = 100) -> None:
    async def go() -> None:
        for _ in range(n):
            await p.record(inp(prompt_tokens), output_tokens)

    asyncio.run(go())


@pytest.mark.parametrize("name", ["global", "length-bucket"])
def test_a_replica_learns_from_the_others_completions(name: str, redis_url: str, redis_prefix: str) -> None:
    a, b = replica(name, redis_url, redis_prefix), replica(name, redis_url, redis_prefix)
    try:
        assert a.shared is not None and b.shared is not None
        before = mean_of(b)
        record(a, 1000, 40)
        assert mean_of(a) == pytest.approx(1000)
        assert wait_for(lambda: b.shared.received == 40), b.shared.received  # type: ignore[union-attr]
        assert mean_of(b) == pytest.approx(1000)
        assert before != pytest.approx(1000)  # b had nothing of its own: the answer came through Redis
        record(b, 10, 40)  # and back: a hears b, so both windows hold all 80
        assert wait_for(lambda: a.shared.received == 40), a.shared.received  # type: ignore[union-attr]
        # A window's cached distribution may lag its last len/16 observations (``_Window``), and
        # the records arrive in batches of their own timing, so the means agree to that lag only.
        both = (1000 + 10) / 2
        lag = 0.07  # five of 80 records of either kind missing moves the mean by at most 6.5%
        assert mean_of(a) == pytest.approx(both, rel=lag)
        assert mean_of(b) == pytest.approx(both, rel=lag)
        # a third replica, started later, loads the whole window from the stream at once
        c = replica(name, redis_url, redis_prefix)
        try:
            assert c.shared is not None and c.shared.received == 80
            assert mean_of(c) == pytest.approx(both)
        finally:
            asyncio.run(c.aclose())
    finally:
        asyncio.run(a.aclose())
        asyncio.run(b.aclose())


def test_length_buckets_travel_with_their_prompt_lengths(redis_url: str, redis_prefix: str) -> None:
    a = replica("length-bucket", redis_url, redis_prefix)
    b = replica("length-bucket", redis_url, redis_prefix)
    try:
        record(a, 20, 16, prompt_tokens=50)
        record(a, 900, 16, prompt_tokens=3000)
        assert wait_for(lambda: mean_of(b, 3000) == pytest.approx(900))
        assert mean_of(b, 50) == pytest.approx(20)
    finally:
        asyncio.run(a.aclose())
        asyncio.run(b.aclose())


def test_baseline_and_semantic_streams_stay_apart(redis_url: str, redis_prefix: str) -> None:
    """A baseline's records carry no embedding; a semantic store skips them, and a baseline store
    skips a semantic record, so neither breaks the other under one prefix by mistake."""
    import redis

    from predictor.redis_store import RedisStore

    a = replica("global", redis_url, redis_prefix)
    try:
        record(a, 300, 5)
        assert a.shared is not None
        store = a.shared.store
        assert isinstance(store, RedisStore) and store.flush_wait(5)
    finally:
        asyncio.run(a.aclose())
    semantic = RedisStore(redis_url, f"{redis_prefix}:global")  # embedded=True: expects vectors
    try:
        assert semantic.start(lambda recs: None) == []
    finally:
        semantic.close()
    emb = np.ones(384, dtype=np.float32) / math.sqrt(384)
    r = redis.Redis.from_url(redis_url)
    r.xadd(f"{redis_prefix}:global:stream", Completion("v", "m", emb, 5, 7, time.time()).to_fields())  # type: ignore[arg-type]
    r.close()
    b = replica("global", redis_url, redis_prefix)
    try:
        assert b.shared is not None and b.shared.received == 5  # the vector record was skipped
        assert mean_of(b) == pytest.approx(300)
    finally:
        asyncio.run(b.aclose())


@pytest.mark.heavy
def test_redis_down_the_baseline_learns_alone_and_shares_when_back() -> None:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(f"{NO_REDIS}: no redis-server to start")
    server = RedisServer(binary, free_port())
    a = replica("global", server.url, "down")
    try:
        assert a.shared is not None and a.shared.stats().connected is False
        record(a, 700, 10)
        assert mean_of(a) == pytest.approx(700)  # learnt locally, nothing raised
        server.start()
        b = replica("global", server.url, "down")
        try:
            assert wait_for(lambda: mean_of(b) == pytest.approx(700), timeout=15)
        finally:
            asyncio.run(b.aclose())
    finally:
        asyncio.run(a.aclose())
        server.kill()


def test_without_redis_the_baseline_is_its_own() -> None:
    p = build_predictor("global", None)
    assert isinstance(p, BaselinePredictor) and p.shared is None
    record(p, 42, 3)
    assert mean_of(p) == pytest.approx(42)


def test_redis_prefix_is_an_option_of_the_baselines_and_others_stay_refused() -> None:
    PredictorSettings(redis_prefix="x").check_for("global")
    PredictorSettings(redis_prefix="x").check_for("length-bucket")
    with pytest.raises(ValueError, match="not options of predictor 'global'"):
        PredictorSettings(embed_threads=2).check_for("global")
