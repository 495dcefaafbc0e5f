"""Replicas sharing one admission ledger, as real processes: a replica SIGKILLed mid-run, Redis going
down and coming back, a replica joining under load.

The backend is configured with a KV capacity of one token, so the rule admits exactly one request
fleet-wide at a time (an idle backend admits anything; nothing fits beside it): a replica that
admitted a second one while another replica's request runs would be over-admitting.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sagegate.harness.redis import RedisServer
from tests.fault_support import backend_process, gateway_process
from tests.gateway_support import chat_body, wait_until

pytestmark = pytest.mark.heavy  # replica and backend processes, Redis

pytest.importorskip("redis")

ADMIN = {"authorization": "Bearer admin-secret"}
LEASE_S = 1.0


@contextmanager
def replica(
    backend: str, redis_url: str, prefix: str, **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    backends = json.dumps([{"url": backend, "capacity_tokens": 1}])
    with gateway_process(
        [],
        BACKENDS=backends,
        REDIS_URL=redis_url,
        LEDGER__ENABLED="true",
        LEDGER__PREFIX=prefix,
        LEDGER__LEASE_S=str(LEASE_S),
        LEDGER__SYNC_INTERVAL_S="0.05",
        **env,
    ) as gw:
        yield gw


def ledger(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/admin/ledger", headers=ADMIN, timeout=5)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def queued(url: str) -> int:
    return int(httpx.get(url + "/admin/queue", headers=ADMIN, timeout=5).json()["queued"])


def remote(url: str) -> float:
    return float(sum(ledger(url)["remote_tokens"].values()))


def post(pool: ThreadPoolExecutor, url: str) -> Future[httpx.Response]:
    return pool.submit(httpx.post, url + "/v1/chat/completions", json=chat_body(), timeout=60)


def test_a_killed_replicas_room_goes_to_the_other(redis_url: str, redis_prefix: str) -> None:
    with (
        backend_process(tokens=30, delay_s=0.1) as (_, backend),
        replica(backend, redis_url, redis_prefix) as (proc_a, a),
        replica(backend, redis_url, redis_prefix) as (_, b),
        ThreadPoolExecutor(4) as pool,
    ):
        first = post(pool, a)  # 3 s on the backend
        wait_until(lambda: ledger(a)["own_charges"] == 1, timeout=10, what="a's request charged")
        wait_until(lambda: remote(b) > 0, timeout=10, what="b sees a's charge")
        second = post(pool, b)
        wait_until(lambda: queued(b) == 1, timeout=10, what="b holds its request: no room fleet-wide")
        assert not second.done()
        proc_a.kill()
        proc_a.wait(10)
        with pytest.raises(httpx.HTTPError):  # a's client loses its request cleanly (connection gone)
            first.result(timeout=30)
        assert second.result(timeout=30).status_code == 200  # after a's lease, b admits it
        assert remote(b) == 0
        state = ledger(b)
        assert state["mode"] == "shared" and state["own_charges"] == 0


def test_redis_down_means_local_shares_then_rejoin(private_redis: RedisServer, redis_prefix: str) -> None:
    with (
        backend_process(tokens=20, delay_s=0.1) as (_, backend),
        replica(backend, private_redis.url, redis_prefix, LEDGER__TIMEOUT_S="0.2") as (_, a),
        replica(backend, private_redis.url, redis_prefix, LEDGER__TIMEOUT_S="0.2") as (_, b),
        ThreadPoolExecutor(6) as pool,
    ):
        private_redis.kill()
        for url in (a, b):
            wait_until(lambda url=url: ledger(url)["mode"] == "local", timeout=10, what="local ledgers")
        alone = [post(pool, a), post(pool, b)]  # each replica admits into its own share at once
        wait_until(lambda: ledger(a)["own_charges"] == 1 and ledger(b)["own_charges"] == 1, timeout=10)
        extra = post(pool, a)
        wait_until(lambda: queued(a) == 1, timeout=10, what="a's share is full")
        private_redis.start()
        for url in (a, b):
            wait_until(lambda url=url: ledger(url)["mode"] == "shared", timeout=10, what="rejoin")
            assert ledger(url)["rejoins"] == 1
        import redis

        members = redis.Redis.from_url(private_redis.url).zrange(f"{redis_prefix}:members", 0, -1)
        assert len(members) == 2
        assert [f.result(timeout=30).status_code for f in [*alone, extra]] == [200, 200, 200]


def test_a_replica_joining_under_load_sees_the_fleet(redis_url: str, redis_prefix: str) -> None:
    with (
        backend_process(tokens=40, delay_s=0.1) as (_, backend),
        replica(backend, redis_url, redis_prefix) as (_, a),
        ThreadPoolExecutor(6) as pool,
    ):
        load = [post(pool, a) for _ in range(4)]  # one runs (4 s), three wait in a's queue
        wait_until(lambda: ledger(a)["own_charges"] == 1 and queued(a) == 3, timeout=10, what="a loaded")
        with replica(backend, redis_url, redis_prefix) as (_, b):  # (it takes ~9 s to start here)
            assert remote(b) > 0  # its first round, before it served anything, read a's charge
            joined = post(pool, b)
            wait_until(lambda: queued(b) == 1, timeout=10, what="b holds its request")
            results = [f.result(timeout=60) for f in [*load, joined]]
            assert [r.status_code for r in results] == [200] * 5
            assert ledger(a)["own_charges"] == 0 and ledger(b)["own_charges"] == 0
