"""Real Redis for the tests: the skip reason and polling helpers; the server itself (a private
``redis-server`` on a free loopback port) and how its binary is found are ``harness.redis``."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["NO_REDIS", "redis_available", "wait_for", "wait_for_redis"]

NO_REDIS = "REDIS UNAVAILABLE"
"""Start of the skip reason of every test that needed a Redis server and had none (the terminal
summary counts them)."""


def redis_available(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        import redis

        return bool(redis.Redis(host=host, port=port, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def wait_for_redis(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if redis_available(port=port):
            return True
        time.sleep(0.02)
    return redis_available(port=port)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes (what another replica's thread delivers
    through Redis arrives in its own time); returns whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()
