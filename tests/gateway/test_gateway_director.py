"""One request's lifecycle: every way out of the gateway (success, client gone, backend 500, a backend
dying mid-stream, timeouts, a retry onto another backend) releases each backend reservation exactly
once and leaves the dispatcher's ledger empty. Driven over real loopback HTTP; the ledger is read
from the gateway's own objects (it runs in this process)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from sagegate.core.outcomes import Outcome, Reason
from sagegate.gateway.app import Gateway, create_app
from sagegate.gateway.backends import Backend
from sagegate.gateway.lifecycle import Lifecycle, LifecycleError, RequestState
from tests.gateway.test_gateway_units import _dispatcher, _req
from tests.gateway_support import FakeBackend, ServerThread, chat_body, settings_for, wait_until


@dataclass
class Reservations:
    """Every reservation a backend took (``sent``) and every release of one (``left``)."""

    taken: list[tuple[Any, str]] = field(default_factory=list)
    released: list[tuple[Any, str]] = field(default_factory=list)

    def watch(self, b: Backend) -> None:
        sent, left = b.sent, b.left

        def on_sent(rid: Any, prompt_tokens: int) -> None:
            self.taken.append((rid, b.name))
            sent(rid, prompt_tokens)

        def on_left(rid: Any, prompt_tokens: int, generated: int) -> None:
            self.released.append((rid, b.name))
            left(rid, prompt_tokens, generated)

        b.sent = on_sent  # type: ignore[method-assign]
        b.left = on_left  # type: ignore[method-assign]

    def each_released_once(self) -> bool:
        return sorted(self.taken) == sorted(self.released) and len(set(self.taken)) == len(self.taken)


def ledger_empty(gw: Gateway) -> bool:
    """No request alive in the director, nothing queued, nothing held or waited for at any backend."""
    return (
        not gw.director.lifecycles
        and len(gw.queue) == 0
        and all(
            b.inflight == 0
            and b.load.charged_tokens == 0
            and b.held_prompt == 0
            and b.held_generated == 0
            and not b.unstarted
            and not b.pending
            for b in gw.pool.backends
        )
    )


@contextmanager
def stack(*states: dict[str, Any], **kw: Any) -> Iterator[tuple[str, Gateway, Reservations]]:
    fakes = [FakeBackend(**s) for s in states]
    servers = [ServerThread(f.app).start() for f in fakes]
    app = create_app(settings_for([s.url for s in servers], **kw))
    gw: Gateway = app.state.gateway
    seen = Reservations()
    for b in gw.pool.backends:
        seen.watch(b)
    try:
        with ServerThread(app) as srv:
            yield srv.url, gw, seen
            wait_until(lambda: ledger_empty(gw), what="the ledger emptied")
            assert seen.each_released_once(), seen
    finally:
        for s in servers:
            s.stop()


def post(url: str, body: dict[str, Any], timeout: float = 10) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def sse_events(url: str, body: dict[str, Any]) -> list[str]:
    with httpx.Client(timeout=20) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# --- over loopback HTTP ---------------------------------------------------------------------------
@pytest.mark.heavy
def test_a_whole_answer_and_a_stream_each_release_their_reservation_once() -> None:
    with stack({"tokens": 5}) as (url, _gw, seen):
        assert post(url, chat_body()).status_code == 200
        assert sse_events(url, chat_body(stream=True))[-1] == "[DONE]"
    assert len(seen.taken) == 2


@pytest.mark.heavy
def test_client_gone_while_queued_takes_no_reservation() -> None:
    # the backend reports a long waiting list: the admission rule holds every request
    with stack({"waiting": 50}) as (url, _gw, seen), pytest.raises(httpx.ReadTimeout):
        post(url, chat_body(), timeout=0.3)
    assert seen.taken == []


@pytest.mark.heavy
def test_client_gone_mid_stream_releases_once() -> None:
    with (
        stack({"tokens": 400, "delay_s": 0.02}) as (url, gw, seen),
        httpx.Client(timeout=10) as c,
        c.stream("POST", url + "/v1/chat/completions", json=chat_body(stream=True, max_tokens=400)) as r,
    ):
        # Hold the iterator: a dropped one is finalised at once, and httpx then closes the
        # connection, so the gateway would (rightly) see this client gone before the checks below.
        lines = r.iter_lines()
        first = next(lines)
        assert r.status_code == 200 and first.startswith("data: ") and '"error"' not in first, first
        assert len(gw.director.lifecycles) == 1, (first, seen)
        (lc,) = gw.director.lifecycles.values()
        assert lc.state is RequestState.STREAMING
    assert len(seen.taken) == 1


@pytest.mark.heavy
def test_client_gone_while_the_backend_computes_a_whole_answer_releases_once() -> None:
    with stack({"tokens": 100, "delay_s": 0.05}) as (url, _gw, seen), pytest.raises(httpx.ReadTimeout):
        post(url, chat_body(), timeout=0.3)
    assert len(seen.taken) == 1


@pytest.mark.heavy
def test_backend_500_retried_on_another_releases_each_reservation_once() -> None:
    with stack({"mode": "fail500", "blocks": 8192}, {"blocks": 1024}) as (url, _gw, seen):
        r = post(url, chat_body())
        assert r.status_code == 200 and r.headers["x-sagegate-backend"] == "backend-1"
    assert [name for _, name in seen.taken] == ["backend-0", "backend-1"]


@pytest.mark.heavy
def test_every_backend_500_is_a_502_with_each_reservation_released_once() -> None:
    with stack({"mode": "fail500"}, {"mode": "fail500"}) as (url, _gw, seen):
        r = post(url, chat_body())
        assert r.status_code == 502 and r.headers["x-sagegate-reason"] == Reason.REQUEST_FAILED_TWICE
    assert len(seen.taken) == 2


@pytest.mark.heavy
def test_backend_dying_mid_stream_releases_once() -> None:
    with stack({"mode": "midstream", "tokens": 10, "die_after": 3}) as (url, gw, seen):
        events = sse_events(url, chat_body(stream=True, max_tokens=10))
        assert json.loads(events[-1])["error"]["code"] == Reason.UPSTREAM_FAILED
        wait_until(lambda: ledger_empty(gw), what="the ledger emptied")
        metrics = httpx.get(url + "/metrics").text
        assert f'sagegate_requests_total{{route="chat",status="{Outcome.FAILED}"}} 1.0' in metrics
    assert len(seen.taken) == 1


@pytest.mark.heavy
def test_queue_timeout_withdraws_without_a_reservation() -> None:
    with stack({"waiting": 50}, queue={"max_wait_s": 0.2}) as (url, _gw, seen):
        r = post(url, chat_body())
        assert r.status_code == 429 and r.headers["x-sagegate-reason"] == Reason.QUEUE_TIMEOUT
    assert seen.taken == []


@pytest.mark.heavy
def test_upstream_read_timeout_releases_once_and_answers_502() -> None:
    with stack({"tokens": 50, "delay_s": 0.1}, upstream={"read_timeout_s": 0.2}) as (url, _gw, seen):
        r = post(url, chat_body())
        assert r.status_code == 502 and "ReadTimeout" in r.json()["error"]["message"]
    assert len(seen.taken) == 1


@pytest.mark.heavy
def test_the_drain_deadline_ends_a_stream_and_releases_it_once() -> None:
    with stack({"tokens": 400, "delay_s": 0.02}) as (url, gw, seen):
        results: list[Any] = []
        streamed = threading.Event()

        def stream() -> None:
            events = sse_events(url, chat_body(stream=True, max_tokens=400))
            streamed.set()
            results.append(events[-1])

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        wait_until(lambda: len(gw.director.lifecycles) == 1 and len(gw.proxy.streams) == 1, what="streaming")
        loop = _loop_of(gw)
        loop.call_soon_threadsafe(gw.director.close_all)
        t.join(10)
        assert streamed.is_set() and json.loads(results[0])["error"]["code"] == Reason.DRAINING
        r = post(url, chat_body())
        assert r.status_code == 503 and r.headers["x-sagegate-reason"] == Reason.DRAINING
    assert len(seen.taken) == 1


def _loop_of(gw: Gateway) -> asyncio.AbstractEventLoop:
    """The gateway's event loop (it runs in a server thread): the one its streams run on."""
    (stream,) = gw.proxy.streams
    task = stream.task
    assert task is not None
    return task.get_loop()


# --- the lifecycle on its own -----------------------------------------------------------------------
def _dispatched() -> tuple[Lifecycle, dict[int, Lifecycle], Callable[[], int]]:
    """A lifecycle holding a reservation on a one-backend dispatcher; also the ledger and a count of
    the reservations that backend holds."""
    d = _dispatcher([100_000])
    ledger: dict[int, Lifecycle] = {}
    lc = Lifecycle(_req(100, 50), d, ledger)
    lc.enqueue()
    d.dispatch()
    lc.dispatched()
    return lc, ledger, lambda: d.pool.backends[0].inflight


def test_the_reservation_is_released_once_and_a_second_end_raises() -> None:
    async def go() -> None:
        lc, ledger, held = _dispatched()
        assert lc.state is RequestState.DISPATCHED and held() == 1 and ledger
        lc.finish(Outcome.OK)
        assert lc.state is RequestState.DONE and held() == 0 and lc.releases == 1 and not ledger
        with pytest.raises(LifecycleError):
            lc.finish(Outcome.FAILED)
        with pytest.raises(LifecycleError):
            lc.retry()
        assert lc.cancel() is None and lc.releases == 1 and held() == 0

    asyncio.run(go())


def test_a_retry_releases_the_first_reservation_and_queues_for_the_next() -> None:
    async def go() -> None:
        lc, ledger, held = _dispatched()
        lc.attempt_failed()
        lc.retry()
        assert lc.state is RequestState.QUEUED and held() == 0 and lc.releases == 1
        lc.dispatcher.dispatch()
        lc.dispatched()
        assert held() == 1
        lc.streaming()
        assert lc.cancel() is not None
        assert lc.state is RequestState.CANCELLED and held() == 0 and lc.releases == 2 and not ledger

    asyncio.run(go())


def test_a_request_dispatched_while_its_handler_sleeps_is_released_when_cancelled() -> None:
    async def go() -> None:
        d = _dispatcher([100_000])
        lc = Lifecycle(_req(100, 50), d, {})
        lc.enqueue()
        d.dispatch()  # the future resolved; the handler has not woken to see it
        assert d.pool.backends[0].inflight == 1
        assert lc.cancel() is None  # counted under no stage, as before
        assert d.pool.backends[0].inflight == 0 and lc.releases == 1

    asyncio.run(go())


def test_cancelled_while_queued_leaves_the_queue() -> None:
    async def go() -> None:
        d = _dispatcher([100], waiting=[1000])  # held: the backend reports a long waiting list
        lc = Lifecycle(_req(10), d, {})
        lc.enqueue()
        assert len(d.queue) == 1
        assert lc.cancel() == "queued" and len(d.queue) == 0 and lc.releases == 0

    asyncio.run(go())
