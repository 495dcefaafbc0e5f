"""The history baselines (``global``, ``length-bucket``) learn from every replica's completions when
the gateway has a ``redis_url``: real Redis, the gateway's own predictor objects."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from sagegate.core.predictor import LengthPredictor
from sagegate.core.request import PredictionQuery
from sagegate.gateway.predict import build_predictor
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.settings_predictor import GlobalSettings, predictor_options
from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary
from sagegate.predictor.baselines import GlobalPredictor
from sagegate.predictor.history import Completion
from sagegate.predictor.shared_history import SharedHistory
from tests.redis_support import NO_REDIS, wait_for


def query(prompt_tokens: int = 100) -> PredictionQuery:
    return PredictionQuery(0, prompt_tokens, "p", model="m")


def mean_of(p: LengthPredictor, prompt_tokens: int = 100) -> float:
    prediction = asyncio.run(p.predict(query(prompt_tokens)))
    assert prediction.distribution is not None and prediction.path == p.name
    return prediction.distribution.mean


def replica(name: str, url: str, prefix: str) -> SharedHistory:
    p = build_predictor(name, url, predictor_options(name, redis_prefix=prefix))
    assert isinstance(p, SharedHistory)
    asyncio.run(p.start())
    return p


def record(p: LengthPredictor, output_tokens: int, n: int, prompt_tokens: int = 100) -> None:
    async def go() -> None:
        for _ in range(n):
            await p.observe(query(prompt_tokens), output_tokens)

    asyncio.run(go())


@pytest.mark.parametrize("name", ["global", "length-bucket"])
def test_a_replica_learns_from_the_others_completions(name: str, redis_url: str, redis_prefix: str) -> None:
    a, b = replica(name, redis_url, redis_prefix), replica(name, redis_url, redis_prefix)
    try:
        assert isinstance(a, SharedHistory) and isinstance(b, SharedHistory)
        before = mean_of(b)
        record(a, 1000, 40)
        assert mean_of(a) == pytest.approx(1000)
        assert wait_for(lambda: b.received == 40), b.received
        assert mean_of(b) == pytest.approx(1000)
        assert before != pytest.approx(1000)  # b had nothing of its own: the answer came through Redis
        record(b, 10, 40)  # and back: a hears b, so both windows hold all 80
        assert wait_for(lambda: a.received == 40), a.received
        # A window's cached distribution may lag its last len/16 observations (``_Window``), and
        # the records arrive in batches of their own timing, so the means agree to that lag only.
        both = (1000 + 10) / 2
        lag = 0.07  # five of 80 records of either kind missing moves the mean by at most 6.5%
        assert mean_of(a) == pytest.approx(both, rel=lag)
        assert mean_of(b) == pytest.approx(both, rel=lag)
        # a third replica, started later, loads the whole window from the stream at once
        c = replica(name, redis_url, redis_prefix)
        try:
            assert c.received == 80
            assert mean_of(c) == pytest.approx(both)
        finally:
            asyncio.run(c.close())
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())


def test_length_buckets_travel_with_their_prompt_lengths(redis_url: str, redis_prefix: str) -> None:
    a = replica("length-bucket", redis_url, redis_prefix)
    b = replica("length-bucket", redis_url, redis_prefix)
    try:
        record(a, 20, 16, prompt_tokens=50)
        record(a, 900, 16, prompt_tokens=3000)
        assert wait_for(lambda: mean_of(b, 3000) == pytest.approx(900))
        assert mean_of(b, 50) == pytest.approx(20)
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())


def test_prompt_prefixes_travel_as_keys_never_as_text(redis_url: str, redis_prefix: str) -> None:
    """``prefix``: a replica learns another's outcomes under the key of the prompt's start; the
    record carries that digest, not the prompt."""
    import redis

    a = replica("prefix", redis_url, redis_prefix)
    b = replica("prefix", redis_url, redis_prefix)
    task_long, task_short = "system: write a long report. " * 50, "system: answer yes or no. " * 50

    async def learn() -> None:
        for i in range(20):
            await a.observe(PredictionQuery(i, 100, task_long + f"q{i}", model="m"), 900)
            await a.observe(PredictionQuery(i, 100, task_short + f"q{i}", model="m"), 3)

    def mean_for(p: LengthPredictor, prompt: str) -> float:
        got = asyncio.run(p.predict(PredictionQuery(99, 100, prompt, model="m"))).distribution
        assert got is not None
        return got.mean

    try:
        asyncio.run(learn())
        assert wait_for(lambda: b.received == 40), b.received
        assert mean_for(b, task_long + "new") > 700
        assert mean_for(b, task_short + "new") < 200
        assert mean_for(b, "an unrelated prompt") == pytest.approx((900 + 3) / 2, rel=0.07)
        r = redis.Redis.from_url(redis_url)
        raw = b"".join(v for _, fields in r.xrange(f"{redis_prefix}:prefix:stream") for v in fields.values())
        r.close()
        assert b"report" not in raw and b"yes or no" not in raw
    finally:
        asyncio.run(a.close())
        asyncio.run(b.close())


def test_baseline_and_semantic_streams_stay_apart(redis_url: str, redis_prefix: str) -> None:
    """A baseline's records carry no embedding; a semantic store skips them, and a baseline store
    skips a semantic record, so neither breaks the other under one prefix by mistake."""
    import redis

    from sagegate.predictor.redis_store import RedisStore

    a = replica("global", redis_url, redis_prefix)
    try:
        record(a, 300, 5)
        store = a.store
        assert isinstance(store, RedisStore) and store.flush_wait(5)
    finally:
        asyncio.run(a.close())
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
        assert b.received == 5  # the vector record was skipped
        assert mean_of(b) == pytest.approx(300)
    finally:
        asyncio.run(b.close())


@pytest.mark.heavy
def test_redis_down_the_baseline_learns_alone_and_shares_when_back() -> None:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(f"{NO_REDIS}: no redis-server to start")
    server = RedisServer(binary, free_port())
    a = replica("global", server.url, "down")
    try:
        assert a.stats().connected is False
        record(a, 700, 10)
        assert mean_of(a) == pytest.approx(700)  # learnt locally, nothing raised
        server.start()
        b = replica("global", server.url, "down")
        try:
            assert wait_for(lambda: mean_of(b) == pytest.approx(700), timeout=15)
        finally:
            asyncio.run(b.close())
    finally:
        asyncio.run(a.close())
        server.kill()


def test_without_redis_the_baseline_is_its_own() -> None:
    p = build_predictor("global", None)
    assert isinstance(p, GlobalPredictor)
    record(p, 42, 3)
    assert mean_of(p) == pytest.approx(42)


def test_redis_prefix_is_an_option_of_the_baselines_and_others_stay_refused() -> None:
    for name in ("global", "length-bucket"):
        s = GatewaySettings(predictor=name, predictor_options={"redis_prefix": "x"})
        assert s.predictor_options.predictor == name and s.predictor_options.redis_prefix == "x"
    with pytest.raises(ValueError, match=r"predictor_options\.global\.embed_threads"):
        GatewaySettings(predictor="global", predictor_options={"embed_threads": 2})
    assert GlobalSettings(redis_prefix="x").factory_options("redis://r").redis_url == "redis://r"
