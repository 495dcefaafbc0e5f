"""Credentials are never shown: a backend URL's userinfo, a backend's key, the clients' and the
admin's keys, planted and then looked for on every route the gateway answers (admin routes, the
dashboard and its feed, metrics, models, the schema) and in every log line, the CLI's start-up line
included."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.redact import redact_url
from sagegate.harness.procs import free_port
from tests.gateway_support import FakeBackend, ServerThread, settings_for, wait_until

URL_SECRET = "PlantedUrlSecret1"
BACKEND_KEY = "PlantedBackendKey2"
CLIENT_KEY = "PlantedClientKey3"
ADMIN_KEY = "PlantedAdminKey4"
SECRETS = (URL_SECRET, BACKEND_KEY, CLIENT_KEY, ADMIN_KEY)


def test_a_urls_credentials_are_hidden_and_nothing_else_is() -> None:
    assert redact_url("http://user:pw@host:8000/v1") == "http://***@host:8000/v1"
    assert redact_url("http://token@10.0.0.1:8000") == "http://***@10.0.0.1:8000"
    assert redact_url("http://host:8000") == "http://host:8000"
    assert redact_url("http://a:b@c@host:1") == "http://***@host:1"  # the last @ ends the userinfo


def routes(url: str) -> dict[str, str]:
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    out = {}
    for path in (
        "/admin/queue",
        "/admin/ledger",
        "/admin/dashboard",
        "/dashboard",
        "/metrics",
        "/v1/models",
        "/openapi.json",
        "/health",
        "/ready",
    ):
        r = httpx.get(url + path, headers=auth, timeout=10)
        out[path] = f"{r.status_code} {r.headers} {r.text}"
    return out


def test_no_planted_secret_appears_on_any_route_or_log_line(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        secret_url = be.url.replace("http://", f"http://user:{URL_SECRET}@")
        settings = settings_for(
            [],
            backends=[{"url": secret_url, "api_key": BACKEND_KEY}],
            api_keys={CLIENT_KEY: "acme"},
            admin_key=ADMIN_KEY,
            redis_url=redis_url,
            ledger={"prefix": redis_prefix + ":ledger"},
            rate_limits={"redis_prefix": redis_prefix + ":limits", "default": {"concurrent": 5}},
        )
        with ServerThread(create_app(settings)) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="ready")
            body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            r = httpx.post(
                gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {CLIENT_KEY}"}
            )
            assert r.status_code == 200
            assert fake.state.headers[-1]["authorization"] == f"Bearer {BACKEND_KEY}"  # it was used
            seen = routes(gw.url)
    assert "***@" in seen["/admin/queue"]  # the backend is still named, without its credentials
    for path, text in seen.items():
        for secret in SECRETS:
            assert secret not in text, (path, secret)
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    for secret in SECRETS:
        assert secret not in logged, secret


def test_the_start_up_line_hides_a_backend_urls_credentials(tmp_path: Path) -> None:
    port = free_port()
    cmd = [
        sys.executable, "-m", "sagegate.cli", "serve", "--backend", f"http://user:{URL_SECRET}@127.0.0.1:9",
        "--port", str(port), "--predictor", "none", "--admin-key", ADMIN_KEY,
    ]  # fmt: skip
    err = tmp_path / "stderr"
    with open(err, "wb") as fh:
        proc = subprocess.Popen(
            cmd, stderr=fh, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
        try:
            wait_until(lambda: b"sagegate serve:" in err.read_bytes(), timeout=60, what="the start-up line")
            time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    text = err.read_text()
    assert "***@127.0.0.1:9" in text
    assert URL_SECRET not in text and ADMIN_KEY not in text
