"""Faults at the edges (issue 13): slow and stalled clients over raw sockets, no healthy backend, a
backend's 429, the circuit breaker's timing and probe timeouts while a backend answers."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from sagegate.gateway.backends import CircuitBreaker
from tests.fault_support import (
    BadBackend,
    gateway_process,
    raw_socket,
    read_until_closed,
    stop_and_log,
)
from tests.gateway.test_gateway_faults_stream import idle, stack
from tests.gateway_support import FakeBackend, ServerThread, admin, chat_body, metric, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and backends; some a sagegate serve process


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _json_body(response: bytes) -> dict[str, object]:
    body: dict[str, object] = json.loads(response.split(b"\r\n\r\n", 1)[1])
    return body


# --- row 6: client connections are bounded ----------------------------------------------------------
GUARDS = {
    "LIMITS__HEADER_TIMEOUT_S": "0.5",
    "LIMITS__BODY_TIMEOUT_S": "0.5",
    "LIMITS__MAX_HEADER_BYTES": "8192",
    "LIMITS__MAX_RELAY_BUFFER_BYTES": str(256 * 1024),
    "LIMITS__MAX_CONNECTIONS": "6",
}


@pytest.fixture(scope="module")
def guarded() -> Iterator[tuple[str, BadBackend]]:
    """One gateway process with tight client bounds in front of a backend whose streams flood; its
    log must hold no error when it stops."""
    flood = BadBackend("flood", tokens=200_000)  # streams of ~26 MB, as fast as they go
    with ServerThread(flood.app) as backend, gateway_process([backend.url], **GUARDS) as (proc, url):
        yield url, flood
        log = stop_and_log(proc)
    assert "ERROR" not in log and "Traceback" not in log, log[-2000:]


def test_slow_heads_and_bodies_get_408_and_are_closed(guarded: tuple[str, BadBackend]) -> None:
    """Slowloris: half a head, half a body, a connection that says nothing, an endless head."""
    url, _ = guarded
    half_head = raw_socket(url)
    half_head.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: appl")
    half_body = raw_socket(url)
    half_body.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"model": "fake", '
    )
    silent = raw_socket(url)
    big_head = raw_socket(url)
    big_head.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"x-filler: " + b"a" * 10_000)

    got = read_until_closed(half_head)
    assert _status(got) == 408 and b"connection: close" in got.lower()
    assert _json_body(got)["error"]["code"] == "request_timeout"  # type: ignore[index]
    got = read_until_closed(half_body)
    assert _status(got) == 408 and _json_body(got)["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert read_until_closed(silent) == b""
    got = read_until_closed(big_head)
    assert _status(got) == 431
    assert metric(url, 'sagegate_requests_total{route="chat",status="408"}') == 1
    # a client that keeps to the bounds is served as before
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
    assert r.status_code == 200


def test_connection_limit_answers_503_past_it(guarded: tuple[str, BadBackend]) -> None:
    url, _ = guarded
    held = [raw_socket(url) for _ in range(5)]  # with the request below: 6, the limit
    wait_until(lambda: httpx.get(url + "/health", timeout=5).status_code == 503, what="the limit reached")
    for s in held:
        s.close()
    wait_until(lambda: httpx.get(url + "/health", timeout=5).status_code == 200, what="room again")


def test_a_client_that_stops_reading_loses_its_stream_and_the_backend_request_is_cancelled(
    guarded: tuple[str, BadBackend],
) -> None:
    url, flood = guarded
    completed, disconnects = flood.state.completed, flood.state.disconnects
    s = raw_socket(url, rcvbuf=4096)
    body = json.dumps(chat_body(stream=True, max_tokens=1000)).encode()
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    wait_until(lambda: flood.state.disconnects > disconnects, timeout=30, what="backend request cancelled")
    assert flood.state.completed == completed
    wait_until(lambda: idle(url), what="reservation released")
    assert metric(url, 'sagegate_requests_total{route="chat",status="slow_client"}') == 1
    assert metric(url, 'sagegate_cancellations_total{stage="slow_client"}') == 1
    with contextlib.suppress(ConnectionResetError):  # dropped unflushed: a reset, or the end
        read_until_closed(s)
    s.close()
    # the gateway serves on
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
    assert r.status_code == 200


# --- row 8: no healthy backend fails fast -----------------------------------------------------------
def test_no_healthy_backend_is_503_at_once_not_after_max_wait() -> None:
    fakes = [FakeBackend(), FakeBackend()]
    with stack(*fakes, queue={"max_wait_s": 60}) as (url, _):
        for f in fakes:
            f.state.healthy = False
        wait_until(lambda: httpx.get(url + "/ready").status_code == 503, what="not ready")
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=20)
        assert r.status_code == 503 and r.headers["x-sagegate-reason"] == "no_healthy_backend"
        assert "retry-after" in r.headers
        assert time.monotonic() - t0 < 10
        assert sum(f.state.requests for f in fakes) == 0


def test_queued_requests_get_503_when_the_last_backend_goes_down() -> None:
    fake = FakeBackend(waiting=50)  # its long waiting list holds every request in the queue
    with stack(fake, queue={"max_wait_s": 60}) as (url, _):
        out: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda: out.append(
                    httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=20)
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: admin(url)["queued"] == 3, what="three queued")
        t0 = time.monotonic()
        fake.state.healthy = False
        for t in threads:
            t.join(20)
        assert time.monotonic() - t0 < 10
        assert [r.status_code for r in out] == [503] * 3
        assert all(r.headers["x-sagegate-reason"] == "no_healthy_backend" for r in out)
        assert admin(url)["queued"] == 0


# --- row 9: a backend's 429 ------------------------------------------------------------------------
def test_backend_429_passes_through_with_its_retry_after_and_does_not_open_the_circuit() -> None:
    throttling = BadBackend("throttle")
    with stack(throttling, health={"failure_threshold": 2}) as (url, _):
        for _ in range(4):
            r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "7"
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert r.headers["x-sagegate-reason"] == "upstream_rate_limited"
        backend = admin(url)["backends"][0]
        assert backend["healthy"] and not backend["circuit_open"]
        assert throttling.state.requests == 4
        assert idle(url)


def test_backend_429_is_retried_on_another_backend_first() -> None:
    throttling, ok = BadBackend("throttle", blocks=8192), FakeBackend(blocks=1024)
    with stack(throttling, ok) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
        assert r.status_code == 200 and r.headers["x-sagegate-backend"] == "backend-1"
        assert throttling.state.requests == 1


# --- row 12: the breaker's window and probe timeouts -------------------------------------------------
def test_breaker_window_runs_from_its_opening_not_from_the_last_failure() -> None:
    now = [0.0]
    b = CircuitBreaker(threshold=1, open_s=2.0, clock=lambda: now[0])
    assert b.failure() and b.is_open
    for t in range(1, 20):  # probes failing every 0.1 s while the backend restarts
        now[0] = t * 0.1
        b.failure()
    now[0] = 2.0
    assert b.success() and not b.is_open  # back on the first success after the window


def test_a_probe_timeout_does_not_mark_down_a_backend_that_answers_requests() -> None:
    """The /health probe stalls past its timeout (as on a busy gateway loop) while requests flow."""
    slow_probe = BadBackend()
    with stack(slow_probe, health={"probe_timeout_s": 0.3}) as (url, _):
        assert admin(url)["backends"][0]["healthy"]
        slow_probe.health_delay_s = 1.5
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 200, r.text
            assert admin(url)["backends"][0]["healthy"]
            time.sleep(0.05)


def test_a_probe_timeout_still_marks_down_a_backend_that_answers_nothing() -> None:
    slow_probe = BadBackend(health_delay_s=1.5)
    with stack(slow_probe, health={"probe_timeout_s": 0.3}) as (url, _):
        wait_until(lambda: not admin(url)["backends"][0]["healthy"], what="marked down")
