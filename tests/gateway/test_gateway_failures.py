"""Failure behaviour, each over real loopback HTTP against scriptable backends: client disconnects,
backends refusing or dying, mid-stream failure, queue bounds, waiting limits, bad input."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app
from tests.gateway_support import FakeBackend, ServerThread, admin, chat_body, idle, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and backends on loopback


@contextmanager
def gateway(backends: list[ServerThread], **kw: Any) -> Iterator[str]:
    with ServerThread(create_app(settings_for([b.url for b in backends], **kw))) as gw:
        yield gw.url


@contextmanager
def fakes(*states: dict[str, Any]) -> Iterator[list[tuple[FakeBackend, ServerThread]]]:
    made = [FakeBackend(**s) for s in states]
    servers = [ServerThread(f.app).start() for f in made]
    try:
        yield list(zip(made, servers, strict=True))
    finally:
        for s in servers:
            s.stop()


def post_in_background(
    url: str, body: dict[str, Any], timeout: float = 10.0
) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout))
        except httpx.HTTPError as exc:
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


# --- client disconnects ---------------------------------------------------------------------------
def test_disconnect_mid_stream_cancels_upstream_and_releases_at_once() -> None:
    with fakes({"tokens": 400, "delay_s": 0.02}) as [(fake, srv)], gateway([srv]) as url:
        with (
            httpx.Client(timeout=10) as c,
            c.stream("POST", url + "/v1/chat/completions", json=chat_body(stream=True, max_tokens=400)) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            snap = admin(url)
            assert snap["backends"][0]["inflight"] == 1 and snap["backends"][0]["reserved_tokens"] > 0
        # the connection is closed mid-stream (the client is gone)
        wait_until(lambda: fake.state.disconnects == 1, what="upstream cancelled")
        wait_until(lambda: idle(url), what="reservation released")
        assert fake.state.completed == 0


def test_disconnect_while_non_streaming_request_runs() -> None:
    with fakes({"tokens": 100, "delay_s": 0.05}) as [(fake, srv)], gateway([srv]) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=0.3)
        wait_until(lambda: fake.state.disconnects == 1, what="upstream cancelled")
        wait_until(lambda: idle(url), what="reservation released")


def test_disconnect_while_queued_removes_it_from_the_queue() -> None:
    # The backend reports a long waiting list, so the admission rule holds every request.
    with fakes({"waiting": 50}) as [(fake, srv)], gateway([srv]) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=0.3)
        wait_until(lambda: admin(url)["queued"] == 0, what="queue emptied")
        assert fake.state.requests == 0
        assert 'sagegate_cancellations_total{stage="queued"} 1.0' in httpx.get(url + "/metrics").text


# --- backends failing -----------------------------------------------------------------------------
def test_backend_refusing_is_retried_elsewhere_and_circuit_opens_then_recovers() -> None:
    # The refusing backend has more room, so it is chosen first. The circuit stays open for 3 s: long
    # enough that a slow, shared machine cannot let it half-open between the two requests below.
    with fakes({"mode": "fail500", "blocks": 8192}, {"blocks": 1024}) as pairs:
        (bad, bad_srv), (good, good_srv) = pairs
        with gateway([bad_srv, good_srv], health={"failure_threshold": 1, "open_s": 3.0}) as url:
            r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 200
            assert bad.state.requests == 1 and good.state.requests == 1
            snap = admin(url)["backends"]
            assert snap[0]["circuit_open"] and not snap[0]["healthy"]
            # while open, nothing goes to it
            assert httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10).status_code == 200
            assert bad.state.requests == 1
            bad.state.mode = "ok"
            wait_until(
                lambda: admin(url)["backends"][0]["healthy"], timeout=10, what="circuit closed by a probe"
            )
            assert 'sagegate_retries_total{backend="backend-0"} 1.0' in httpx.get(url + "/metrics").text


def test_backend_down_is_retried_and_marked_unhealthy_until_it_returns() -> None:
    with fakes({"blocks": 8192}, {"blocks": 1024}) as pairs:
        (_, first_srv), (good, good_srv) = pairs
        port = first_srv.port
        with gateway([first_srv, good_srv]) as url:
            wait_until(lambda: all(b["healthy"] for b in admin(url)["backends"]), what="both healthy")
            first_srv.stop()  # connection refused from now on (probes have not noticed yet)
            r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
            assert r.status_code == 200 and good.state.requests == 1
            assert not admin(url)["backends"][0]["healthy"]
            revived = FakeBackend()
            with ServerThread(revived.app, port=port):
                wait_until(lambda: admin(url)["backends"][0]["healthy"], what="backend back")
                httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10).raise_for_status()
                assert revived.state.requests == 1  # it has the most room again


def test_all_backends_failing_gives_502_and_releases() -> None:
    with fakes({"mode": "fail500"}, {"mode": "fail500"}) as pairs, gateway([s for _, s in pairs]) as url:
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=10)
        assert r.status_code == 502
        # from one request, two backends failing it cannot be told from a poison request
        assert r.json()["error"]["code"] == "request_failed_twice"
        assert sum(f.state.requests for f, _ in pairs) == 2  # bounded: one try per backend
        assert idle(url)


def test_failure_mid_stream_ends_with_an_sse_error_event() -> None:
    with fakes({"mode": "midstream", "tokens": 10, "die_after": 3}) as [(_, srv)], gateway([srv]) as url:
        with (
            httpx.Client(timeout=10) as c,
            c.stream("POST", url + "/v1/chat/completions", json=chat_body(stream=True)) as r,
        ):
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        tokens = [json.loads(e) for e in events[:-1]]
        assert len(tokens) == 3 and all("choices" in t for t in tokens)
        assert json.loads(events[-1])["error"]["code"] == "upstream_failed"
        wait_until(lambda: idle(url), what="reservation released")


# --- the queue's bounds and the waiting limit -------------------------------------------------------
@pytest.mark.parametrize(
    ("bound", "reason"),
    [({"max_requests": 1}, "queue_full_requests"), ({"max_tokens": 10}, "queue_full_tokens")],
)
def test_full_queue_answers_429_with_retry_after(bound: dict[str, int], reason: str) -> None:
    with fakes({"waiting": 50}) as [(_, srv)], gateway([srv], queue={**bound, "retry_after_s": 3}) as url:
        t, _ = post_in_background(url, chat_body("first"), timeout=1.0)
        wait_until(lambda: admin(url)["queued"] == 1, what="first queued")
        r = httpx.post(url + "/v1/chat/completions", json=chat_body("second " * 20), timeout=5)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
        assert r.headers["x-sagegate-reason"] == reason
        assert r.json()["error"]["type"] == "rate_limit_error"
        t.join()


def test_waiting_too_long_is_429_when_backends_are_busy() -> None:
    with fakes({"waiting": 50}) as [(_, srv)], gateway([srv], queue={"max_wait_s": 0.2}) as url:
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=5)
        assert r.status_code == 429
        assert r.headers["x-sagegate-reason"] == "queue_timeout"
        assert "retry-after" in r.headers
        assert admin(url)["queued"] == 0


def test_waiting_too_long_is_503_when_no_backend_is_healthy() -> None:
    with fakes({"healthy": False}) as [(_, srv)], gateway([srv], queue={"max_wait_s": 0.2}) as url:
        assert httpx.get(url + "/ready").status_code == 503
        r = httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=5)
        assert r.status_code == 503
        assert r.headers["x-sagegate-reason"] == "no_healthy_backend"


# --- bad input ------------------------------------------------------------------------------------
BAD_BODIES: list[tuple[Any, str | None]] = [
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"model": "fake"}, "messages"),
    ({"model": "fake", "messages": []}, "messages"),
    ({"model": "fake", "messages": "hi"}, "messages"),
    ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, "max_tokens"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "n": 4}, "n"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": "yes please"}, "stream"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, "max_tokens"),
    ({"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5.5}, "max_tokens"),
    ({"model": "fake", "messages": [{"role": "user", "content": 7}]}, "messages"),
]


@pytest.fixture(scope="module")
def one_fake() -> Iterator[str]:
    with fakes({}) as [(_, srv)], gateway([srv], limits={"max_body_bytes": 2048}, api_keys={}) as url:
        yield url


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_invalid_body_is_400_openai_error(one_fake: str, body: Any, param: str | None) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        one_fake + "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"].startswith(param)


def test_oversized_body_is_413(one_fake: str) -> None:
    r = httpx.post(one_fake + "/v1/chat/completions", json=chat_body("x" * 5000))
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


def test_a_body_over_the_limit_gets_its_413_not_a_reset(one_fake: str) -> None:
    """The gateway reads what a client is still sending (up to 4x the limit) before it answers 413
    and closes: closing with unread data resets the connection, and the client saw a ReadError."""
    big = json.dumps(chat_body("x" * 7000)).encode()  # 3.5x the 2,048-byte limit
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", int(one_fake.rsplit(":", 1)[1])), timeout=10) as sock:
            head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            sock.sendall(head.encode() + f"content-length: {len(big)}\r\n\r\n".encode())
            for i in range(0, len(big), 512):  # in pieces, as a client on a slow link sends
                sock.sendall(big[i : i + 512])
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
        assert b"connection: close" in answer.lower()


def test_bad_headers_and_unknown_model(one_fake: str) -> None:
    r = httpx.post(one_fake + "/v1/chat/completions", json=chat_body(), headers={"x-priority": "high"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-priority"
    r = httpx.post(one_fake + "/v1/chat/completions", json={**chat_body(), "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(one_fake + "/nowhere")
    assert r.status_code == 404 and "error" in r.json()


def test_api_keys_and_admin_key() -> None:
    keys = {"key-alpha": "alpha", "key-beta": "beta"}
    with fakes({}) as [(fake, srv)], gateway([srv], api_keys=keys) as url:
        r = httpx.post(url + "/v1/chat/completions", json=chat_body())
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(
            url + "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer wrong"}
        )
        assert r.status_code == 401
        r = httpx.post(
            url + "/v1/chat/completions", json=chat_body(), headers={"authorization": "Bearer key-beta"}
        )
        assert r.status_code == 200
        assert "authorization" not in {k.lower() for k in fake.state.bodies[-1]}
        assert httpx.get(url + "/admin/queue").status_code == 403
        bad = httpx.get(url + "/admin/queue", headers={"authorization": "Bearer key-beta"})
        assert bad.status_code == 403
        assert admin(url)["policy"] == "fcfs"
