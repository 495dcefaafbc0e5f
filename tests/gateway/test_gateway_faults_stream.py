"""Faults in the stream path (issue 13): an upstream client raising what is no ``httpx.HTTPError``,
an endless SSE event, a backend's implausible usage, a drain deadline with streams still running."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.sse import EventTooLarge, SseScanner
from tests.fault_support import BadBackend, FaultyTransport, backend_process, gateway_process
from tests.gateway_support import (
    FakeBackend,
    ServerThread,
    admin,
    chat_body,
    idle,
    metric,
    settings_for,
    wait_until,
)


@contextmanager
def stack(*backends: FakeBackend, **kw: Any) -> Iterator[tuple[str, Any]]:
    """Backends in threads and a gateway in front of them; yields its URL and its ``Gateway``."""
    servers = [ServerThread(b.app).start() for b in backends]
    app = create_app(settings_for([s.url for s in servers], **kw))
    try:
        with ServerThread(app) as gw:
            yield gw.url, app.state.gateway
    finally:
        for s in servers:
            s.stop()


def sse_events(url: str, body: dict[str, Any], timeout: float = 20) -> list[str]:
    with httpx.Client(timeout=timeout) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# --- row 1: whatever the upstream client raises is the backend failing ------------------------------
@pytest.mark.heavy
def test_an_unexpected_exception_from_the_upstream_send_is_retried_not_a_cancellation() -> None:
    with stack(FakeBackend(blocks=8192), FakeBackend(blocks=1024)) as (url, gw):
        gw.proxy.client = httpx.AsyncClient(transport=FaultyTransport(fail_sends=1))
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
        assert r.status_code == 200, r.text
        assert r.headers["x-sagegate-backend"] == "backend-1"  # retried on the other backend
        assert metric(url, 'sagegate_requests_total{route="chat",status="ok"}') == 1
        assert metric(url, 'sagegate_cancellations_total{stage="upstream"}') == 0
        assert metric(url, 'sagegate_retries_total{backend="backend-0"}') == 1
        assert idle(url)


@pytest.mark.heavy
def test_an_unexpected_exception_mid_stream_ends_it_with_an_sse_error_event() -> None:
    with stack(FakeBackend(tokens=20, delay_s=0.01)) as (url, gw):
        gw.proxy.client = httpx.AsyncClient(transport=FaultyTransport(break_after=4))
        events = sse_events(url, chat_body(stream=True, max_tokens=20))
        assert json.loads(events[-1])["error"]["code"] == "upstream_failed"
        assert all("choices" in json.loads(e) for e in events[:-1])
        wait_until(lambda: idle(url), what="reservation released")
        assert metric(url, 'sagegate_requests_total{route="chat",status="failed"}') == 1
        assert metric(url, 'sagegate_cancellations_total{stage="streaming"}') == 0


def _answer(url: str, i: int) -> str:
    """One request's fate: ``ok``, ``sse_error`` (a stream cut by an error event), or what went wrong."""
    stream = i % 3 != 0
    body = chat_body(f"request {i}", stream=stream, max_tokens=60)
    try:
        with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            if not stream:
                r.read()
                return "ok"
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    except httpx.HTTPError as exc:
        return repr(exc)
    if events[-1] == "[DONE]":
        return "ok"
    return "sse_error" if "error" in json.loads(events[-1]) else "truncated"


@pytest.mark.heavy
def test_a_backend_killed_mid_run_loses_no_request() -> None:
    """Two backend processes, 45 requests (two thirds streaming); one backend is SIGKILLed while
    streams run on it. Each request is answered 200, a stream that was on the dead backend ends with
    an SSE error event, and every request is counted once."""
    with (
        backend_process(tokens=60, delay_s=0.03) as (victim, first),
        backend_process(tokens=60, delay_s=0.03) as (_, second),
        gateway_process([first, second]) as (_, url),
    ):
        fates: list[str] = []
        threads = [threading.Thread(target=lambda i=i: fates.append(_answer(url, i))) for i in range(45)]
        for t in threads[:30]:
            t.start()
        wait_until(lambda: admin(url)["backends"][0]["inflight"] >= 5, what="requests on the victim")
        victim.send_signal(signal.SIGKILL)
        for t in threads[30:]:
            t.start()
        for t in threads:
            t.join(60)
        assert len(fates) == 45
        assert set(fates) <= {"ok", "sse_error"}, fates
        assert fates.count("ok") >= 30
        wait_until(lambda: idle(url), what="every reservation released")
        counted = sum(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(url + "/metrics", timeout=5).text.splitlines()
            if line.startswith("sagegate_requests_total{")
        )
        assert counted == 45


# --- row 3: an SSE event that never ends ------------------------------------------------------------
@pytest.mark.heavy
def test_an_endless_sse_event_ends_the_stream_with_an_error_and_closes_the_backend_request() -> None:
    bad = BadBackend("endless")
    with stack(bad, upstream={"max_sse_event_bytes": 256 * 1024}) as (url, _):
        events = sse_events(url, chat_body(stream=True))
        err = json.loads(events[-1])["error"]
        assert err["code"] == "upstream_failed" and str(256 * 1024) in err["message"]
        assert len(events) == 2  # the one whole event before it, then the error
        wait_until(lambda: bad.state.disconnects == 1, what="backend request closed")
        assert bad.sent_bytes < 16 * 1024 * 1024  # the gateway stopped reading near the bound
        wait_until(lambda: idle(url), what="reservation released")
        assert metric(url, 'sagegate_requests_total{route="chat",status="failed"}') == 1
        assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_scanner_bounds_an_unfinished_event() -> None:
    sc = SseScanner(strip_usage=False, max_event_bytes=10_000)
    assert sc.feed(b"data: 1\n\ndata: 2") == b"data: 1\n\n"
    sc.feed(b"x" * 5000)
    with pytest.raises(EventTooLarge):
        sc.feed(b"x" * 5000)


def test_scanner_scans_each_byte_once() -> None:
    """A 32 MB event in 4 KB chunks: joined and re-scanned per chunk (the old scanner) that is some
    130 GB of copying; scanned once, well under a second. The bound is 20x generous."""
    sc = SseScanner(strip_usage=False, max_event_bytes=64 * 1024 * 1024)
    piece = b"y" * 4096
    head, tail = b'data: {"choices":[{"delta":{"content":"', b'"}}]}\n\n'
    t0 = time.process_time()
    assert sc.feed(head) == b""
    for _ in range(8192):
        assert sc.feed(piece) == b""
    out = sc.feed(tail)
    assert len(out) == len(head) + 8192 * 4096 + len(tail) and sc.events == 1
    assert time.process_time() - t0 < 20


# --- row 10: a backend's usage is checked before it is recorded -------------------------------------
@pytest.mark.heavy
def test_implausible_usage_is_not_recorded() -> None:
    with stack(BadBackend("bad_usage", tokens=8)) as (url, _):
        events = sse_events(url, chat_body(stream=True, max_tokens=50))
        assert events[-1] == "[DONE]"
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=50), timeout=10)
        assert r.status_code == 200
        wait_until(lambda: idle(url), what="settled")
        # the stream's counted events stand in for its usage; the whole answer records nothing
        assert metric(url, "sagegate_actual_output_tokens_count") == 1
        assert metric(url, "sagegate_actual_output_tokens_sum") == 8
        assert metric(url, 'sagegate_requests_total{route="chat",status="ok"}') == 2


@pytest.mark.heavy
def test_usage_beyond_max_tokens_is_not_recorded() -> None:
    with stack(BadBackend("bad_usage", tokens=8, usage=10**9)) as (url, _):
        sse_events(url, chat_body(stream=True, max_tokens=50))
        wait_until(lambda: idle(url), what="settled")
        assert metric(url, "sagegate_actual_output_tokens_sum") == 8


# --- row 7: the drain deadline ends streams with an SSE error event ----------------------------------
def _stream_into(url: str, out: list[Any]) -> None:
    body = chat_body(stream=True, max_tokens=1000)
    try:
        with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            out.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
    except httpx.HTTPError as exc:
        out.append(exc)


@pytest.mark.heavy
def test_drain_deadline_ends_running_streams_with_an_sse_error_event() -> None:
    fake = FakeBackend(tokens=1000, delay_s=0.05)  # 50-second streams
    with (
        ServerThread(fake.app) as backend,
        gateway_process([backend.url], DRAIN_TIMEOUT_S="1") as (proc, url),
    ):
        results: list[list[Any]] = [[] for _ in range(4)]
        threads = [threading.Thread(target=_stream_into, args=(url, out)) for out in results]
        whole: list[httpx.Response] = []
        body = chat_body(max_tokens=1000)
        threads.append(
            threading.Thread(
                target=lambda: whole.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=30))
            )
        )
        for t in threads:
            t.start()
        wait_until(lambda: all(len(out) > 2 for out in results), timeout=15, what="streams running")
        wait_until(lambda: fake.state.requests == 5, what="all five at the backend")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(15) in (0, -signal.SIGTERM)
        for out in results:
            assert not isinstance(out[-1], Exception), out[-1]  # no RemoteProtocolError
            err = json.loads(out[-1])["error"]
            assert err["code"] == "draining", err
        assert whole[0].status_code == 503 and whole[0].headers["x-sagegate-reason"] == "draining"
        wait_until(lambda: fake.state.disconnects == 5, what="backend requests closed")
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
        assert "Cancel" not in log, log[-2000:]  # uvicorn had nothing left to cancel
