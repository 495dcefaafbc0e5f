"""The Redis history store across a Redis restart that loses the data (a private ``redis-server``
without persistence, killed and restarted on the same port mid-run): every completion the replica
recorded is in the stream exactly once, however the writer's flush and the reader's re-seed interleave.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import numpy as np

from sagegate.harness.redis import RedisServer
from sagegate.predictor.embedder import DIM
from sagegate.predictor.history import Completion, WindowBounds
from sagegate.predictor.redis_store import RedisStore
from tests.gateway_support import wait_until


def _record(i: int) -> Completion:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return Completion(Completion.new_id(), "m", v, 10 + i, 20 + i, time.time())


def _stream_ids(url: str, prefix: str) -> Counter[str]:
    import redis

    r = redis.Redis.from_url(url)
    try:
        return Counter(Completion.from_fields(f).id for _, f in r.xrange(f"{prefix}:stream"))
    finally:
        r.close()


def _store(url: str, prefix: str) -> RedisStore:
    bounds = WindowBounds(100_000, math.inf)
    return RedisStore(url, prefix=prefix, bounds=bounds, block_ms=50, socket_timeout=0.2)


def test_restart_mid_run_writes_each_completion_once(private_redis: RedisServer) -> None:
    prefix = "sagegate-once"
    store = _store(private_redis.url, prefix)
    store.start(lambda recs: None)
    ids: list[str] = []
    stop = threading.Event()

    def writer() -> None:  # appends all along, before, during and after the outage
        i = 0
        while not stop.is_set() and i < 400:
            rec = _record(i)
            ids.append(rec.id)
            store.append(rec)
            i += 1
            time.sleep(0.004)

    t = threading.Thread(target=writer, daemon=True)
    try:
        t.start()
        wait_until(lambda: store.stats().written >= 40, 10, "completions in Redis before the kill")
        private_redis.kill()
        at_kill = store.stats().appended
        # the store sees Redis gone, and completions keep coming meanwhile (unless all 400 came)
        wait_until(
            lambda: store.stats().degraded >= 1 and store.stats().appended >= min(400, at_kill + 40),
            10,
            "appends during the outage",
        )
        private_redis.start()  # empty: what was written before the kill is gone
        t.join(30)
        assert len(ids) == 400
        wait_until(lambda: sum(_stream_ids(private_redis.url, prefix).values()) >= 400, 20, "all written")
        # nothing left to send (the re-seed included): a duplicate would be in the stream already
        assert store.stats().reseeds >= 1 and store.flush_wait(10)
        seen = _stream_ids(private_redis.url, prefix)
        dups = {k: n for k, n in seen.items() if n > 1}
        assert set(seen) == set(ids) and not dups, f"{len(dups)} ids written more than once"
        assert store.stats().reseeds >= 1
    finally:
        stop.set()
        store.close()


def test_two_restarts_and_a_second_replica_see_each_completion_once(private_redis: RedisServer) -> None:
    prefix = "sagegate-once2"
    a, b = _store(private_redis.url, prefix), _store(private_redis.url, prefix)
    got: list[Completion] = []
    a.start(lambda recs: None)
    b.start(got.extend)
    ids = []
    try:
        for round_ in range(3):
            for i in range(50):
                rec = _record(i)
                ids.append(rec.id)
                a.append(rec)
            assert a.flush_wait(10)
            if round_ < 2:
                private_redis.kill()
                private_redis.start()
        wait_until(lambda: set(_stream_ids(private_redis.url, prefix)) == set(ids), 20, "all written")
        # all written since the last restart, so re-seeded after it: once nothing is left to send,
        # a duplicate would be in the stream already
        assert a.flush_wait(10)
        assert max(_stream_ids(private_redis.url, prefix).values()) == 1
        # The other replica re-reads the stream after each reset; it receives duplicates of nothing
        # beyond what a re-read repeats (its predictor ignores known ids), and misses nothing.
        wait_until(lambda: {r.id for r in got} == set(ids), 20, "all received")
    finally:
        a.close()
        b.close()
