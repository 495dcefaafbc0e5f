"""Shared test helpers: where the real workload data lives, and skipping cleanly when it is absent.

The data (see ``../shared/data/README.md``) is never copied into the repository; it is found at
``$SAGEGATE_DATA`` or ``<repo>/../shared/data``. A fresh checkout without it still passes: the tests
that need a file skip with a message saying what is missing and how to provide it.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.data import data_root
from sagegate.procs import RedisServer, free_port

REPO = Path(__file__).resolve().parents[1]


def data_path(*parts: str) -> Path:
    """The path of ``parts`` under the shared data folder; skips the calling test if it is absent."""
    path = data_root().joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"shared data not found: {path} "
            "(set SAGEGATE_DATA or put the data folder at <repo>/../shared/data)"
        )
    return path


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder (the test skips if it is absent); prefer ``data_path`` for one file."""
    return data_path()


MAIN_REDIS_URL = "redis://127.0.0.1:6379/0"
"""The machine's Redis server (tests that need faults start their own)."""


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A fresh key prefix on the machine's Redis (the test skips if none answers); its keys go after."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(MAIN_REDIS_URL, socket_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {MAIN_REDIS_URL}: {exc}")
    prefix = f"sagegate-test:{uuid.uuid4().hex[:8]}"
    yield prefix
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A private redis-server on a free port (no persistence) that the test may kill and restart."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(binary, free_port())
    server.start()
    yield server
    server.kill()
