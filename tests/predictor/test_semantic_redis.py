"""The Redis-shared history against real servers: the session's private Redis for sharing between
replicas, and a further private ``redis-server`` on a free port that is killed and restarted mid-run.

Waits poll with generous deadlines (the propagation latency itself is measured in
``benchmarks/bench_predictor.py``, not asserted here)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary
from sagegate.predictor.history import Completion, WindowBounds
from sagegate.predictor.index import IndexConfig
from sagegate.predictor.redis_store import RedisStore
from sagegate.predictor.semantic import PromptFeatures, SemanticConfig, SemanticPredictor
from tests.redis_support import NO_REDIS, wait_for
from tests.semantic_support import LONG_TASKS, SHORT_TASKS, TOPICS, family, real_embedder

pytestmark = pytest.mark.heavy  # the real MiniLM model, Redis servers


@pytest.fixture(scope="module")
def feats() -> list[PromptFeatures]:
    texts = family(SHORT_TASKS, TOPICS[:4]) + family(LONG_TASKS, TOPICS[:4])
    vecs = real_embedder().embed(texts)
    return [SemanticPredictor.features_from(v, t) for v, t in zip(vecs, texts, strict=True)]


def replica(url: str, prefix: str, **store_kw: object) -> SemanticPredictor:
    cfg = replace(
        SemanticConfig(), bounds=WindowBounds(10_000, math.inf), index=IndexConfig(background=False)
    )
    store = RedisStore(url, prefix=prefix, bounds=cfg.bounds, block_ms=100, **store_kw)  # type: ignore[arg-type]
    return SemanticPredictor(real_embedder(), store=store, config=cfg).start()


def stream_ids(url: str, prefix: str) -> set[str]:
    import redis

    r = redis.Redis.from_url(url)
    try:
        entries: Any = r.xrange(f"{prefix}:stream")
        return {Completion.from_fields(f).id for _, f in entries}
    finally:
        r.close()


def test_two_replicas_share_history_and_a_third_rebuilds_from_redis(
    redis_url: str, redis_prefix: str, feats: list[PromptFeatures]
) -> None:
    a, b = replica(redis_url, redis_prefix), replica(redis_url, redis_prefix)
    try:
        half = len(feats) // 2
        for f in feats[:half]:
            a.record_features(f, 15, 20)
        for f in feats[half:]:
            b.record_features(f, 25, 900)
        assert wait_for(lambda: a.size() == len(feats) and b.size() == len(feats))
        assert a.stats()["store_received"] == len(feats) - half
        # Each replica predicts from what the other saw: a long-task prompt known only through B.
        pa = a.predict_features(feats[-1], 25)
        assert pa.path == "semantic" and pa.mean > 450
        pb = b.predict_features(feats[0], 15)
        assert pb.path == "semantic" and pb.mean < 450
        c = replica(redis_url, redis_prefix)
        try:
            assert c.size() == len(feats)  # rebuilt at start, before any stream read
        finally:
            c.close()
    finally:
        a.close()
        b.close()


def test_window_and_models_hold_across_replicas(
    redis_url: str, redis_prefix: str, feats: list[PromptFeatures]
) -> None:
    a, b = replica(redis_url, redis_prefix), replica(redis_url, redis_prefix)
    try:
        for f in feats:
            a.record_features(f, 20, 700, model="big")
        assert wait_for(lambda: b.size("big") == len(feats))
        assert b.size("small") == 0
        assert b.predict_features(feats[0], 20, "small").path == "cold"
    finally:
        a.close()
        b.close()


def test_restart_mid_run_loses_no_completion(private_redis: RedisServer, feats: list[PromptFeatures]) -> None:
    prefix = "sagegate-fault"
    a = replica(private_redis.url, prefix, socket_timeout=0.3)
    ids: list[str] = []
    try:
        third = len(feats) // 3
        for f in feats[:third]:
            ids.append(a.record_features(f, 15, 20).id)
        assert wait_for(
            lambda: a.stats()["store_buffered"] == 0 and stream_ids(private_redis.url, prefix) == set(ids)
        )

        private_redis.kill()
        for f in feats[third : 2 * third]:
            ids.append(a.record_features(f, 25, 900).id)
            pred = a.predict_features(feats[0], 15)  # keeps answering from the local index
            assert pred.path == "semantic"
        # ...which holds what was recorded after the kill: a long task, known only from then on
        pred = a.predict_features(feats[2 * third - 1], 25)
        assert pred.path == "semantic" and pred.mean > 450
        assert wait_for(lambda: a.stats()["store_degraded"] > 0 and not a.stats()["store_connected"])
        assert a.stats()["store_buffered"] > 0

        private_redis.start()  # same port, empty: the data before the kill is gone from Redis
        for f in feats[2 * third :]:
            ids.append(a.record_features(f, 25, 900).id)
        assert wait_for(lambda: stream_ids(private_redis.url, prefix) == set(ids), timeout=15)
        stats = a.stats()
        assert stats["store_reseeds"] >= 1 and stats["store_dropped"] == 0 and stats["store_connected"]
        assert a.size() == len(ids)

        b = replica(private_redis.url, prefix)
        try:
            assert b.size() == len(ids)
            assert b.predict_features(feats[-1], 25).path == "semantic"
        finally:
            b.close()
    finally:
        a.close()


def test_redis_down_at_start_then_back(feats: list[PromptFeatures]) -> None:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(f"{NO_REDIS}: no redis-server to start")
    server = RedisServer(binary, free_port())
    a = replica(server.url, "sagegate-late", socket_timeout=0.3)
    try:
        assert a.stats()["store_connected"] is False
        rec = a.record_features(feats[0], 15, 20)
        assert a.size() == 1  # learnt locally while Redis is down
        server.start()
        assert wait_for(lambda: stream_ids(server.url, "sagegate-late") == {rec.id}, timeout=15)
    finally:
        a.close()
        server.kill()


def test_malformed_stream_entries_are_skipped(redis_url: str, redis_prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    r.xadd(f"{redis_prefix}:stream", {"id": "x", "emb": b"short"})
    good = Completion("ok", "default", np.ones(384, dtype=np.float32) / math.sqrt(384), 5, 7, time.time())
    fields: Any = good.to_fields()
    r.xadd(f"{redis_prefix}:stream", fields)
    r.close()
    p = replica(redis_url, redis_prefix)
    try:
        assert p.size() == 1
    finally:
        p.close()
