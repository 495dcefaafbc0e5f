"""``sagegate serve --workers 2``: two gateway processes behind one port, sharing the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from sagegate.harness.procs import free_port
from tests.fault_support import backend_process
from tests.gateway_support import REPO_ROOT, chat_body, wait_until

pytestmark = pytest.mark.heavy  # sagegate serve --workers 2, Redis

pytest.importorskip("redis")

ADMIN = {"authorization": "Bearer admin-secret"}


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_workers_share_one_port_and_one_ledger(redis_url: str, redis_prefix: str) -> None:
    import redis

    with backend_process(tokens=4, delay_s=0.01) as (_, backend):
        port = free_port()
        env = {
            **os.environ,
            "SAGEGATE_LOG_LEVEL": "warning",
            "SAGEGATE_ADMIN_KEY": "admin-secret",
            "SAGEGATE_BACKENDS": json.dumps([backend]),
            "SAGEGATE_REDIS_URL": redis_url,
            "SAGEGATE_LEDGER__PREFIX": redis_prefix,
        }
        cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--port", str(port), "--workers", "2"]
        cmd += ["--policy", "fcfs", "--predictor", "none"]
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            members = redis.Redis.from_url(redis_url)
            wait_until(lambda: members.zcard(f"{redis_prefix}:members") == 2, timeout=60, what="2 workers")
            wait_until(lambda: _ready(url), timeout=30, what="ready")
            seen = set()
            for _ in range(40):  # each on a new connection: the kernel spreads them over the workers
                state = httpx.get(url + "/admin/ledger", headers=ADMIN, timeout=5).json()
                assert state["mode"] == "shared" and state["local_share"] == 0.5
                seen.add(state["replica"])
            assert len(seen) == 2
            codes = [
                httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=30).status_code
                for _ in range(6)
            ]
            assert codes == [200] * 6
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        assert members.zcard(f"{redis_prefix}:members") == 0  # both left on the way out
