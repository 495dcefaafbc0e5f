"""The dispatcher with a shared ledger (real Redis): a dispatch waits for Redis's yes, a no sends the
request back into the queue, and a request whose client left meanwhile gives its charge back."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from sagegate.gateway.backends import BackendPool
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.ledger import SharedLedger
from sagegate.gateway.metrics import GatewayMetrics
from sagegate.gateway.queue import BoundedQueue, GatewayRequest
from sagegate.gateway.settings import GatewaySettings, LedgerSettings
from sagegate.policies.admission import AdmissionConfig, Charge
from sagegate.policies.registry import parse_policy
from tests.gateway_support import until

pytest.importorskip("redis")

CFG = AdmissionConfig(unknown_output=300)
_rids = itertools.count()


def replica(
    url: str,
    prefix: str,
    metrics: GatewayMetrics | None = None,
    send_first_share: float = 0.0,
    sync_interval_s: float = 0.05,
) -> Dispatcher:
    """A dispatcher over one backend of capacity 1000 (two 350-token charges fit, three do not)."""
    s = GatewaySettings.model_validate({"backends": ["http://b0"]})
    pool = BackendPool(s, httpx.AsyncClient())
    for b in pool.backends:
        b.load.capacity_tokens = 1000
        b.load.healthy = True
    settings = LedgerSettings(
        enabled=True,
        prefix=prefix,
        lease_s=max(1.0, 2 * sync_interval_s),
        sync_interval_s=sync_interval_s,
        send_first_share=send_first_share,
    )
    led = SharedLedger(settings, url, pool.loads, [b.url for b in pool.backends], CFG)
    pol = parse_policy("fcfs")
    d = Dispatcher(pol, pool, CFG, BoundedQueue(pol, 100, 10**9), metrics, ledger=led)
    led.on_change = d.kick  # as the gateway wires it: a fresher view may have room
    return d


def request() -> GatewayRequest:
    return GatewayRequest(next(_rids), 0.0, 50, body={}, route="chat", model="m", prompt="")


async def fill_elsewhere(url: str, prefix: str, n: int) -> SharedLedger:
    """Another replica holding ``n`` charges on the backend."""
    other = replica(url, prefix).ledger
    assert other is not None
    await other.start()
    for _ in range(n):
        charge = Charge(50, None, CFG)
        other.loads[0].charge(charge)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        other.commit(0, charge, fut.set_result)
        assert await fut
    return other


def answers(metrics: GatewayMetrics, answer: str) -> float:
    """How many of Redis's answers ``sagegate_ledger_commit_wait_seconds`` counted as ``answer``."""
    value = metrics.registry.get_sample_value("sagegate_ledger_commit_wait_seconds_count", {"answer": answer})
    return value or 0.0


def test_dispatch_waits_for_redis_and_a_no_requeues(redis_url: str, redis_prefix: str) -> None:
    metrics = GatewayMetrics()

    async def main() -> None:
        d = replica(redis_url, redis_prefix, metrics)
        assert d.ledger is not None
        await d.ledger.start()
        other = await fill_elsewhere(redis_url, redis_prefix, 2)  # d has not read it yet
        try:
            req = request()
            fut = d.submit(req)
            assert len(d.queue) == 0 and not fut.done()  # chosen locally, not yet confirmed
            await until(lambda: d.ledger.stats.denied >= 1, "Redis's answer")
            assert not fut.done() and len(d.queue) == 1  # Redis said no: back in the queue
            assert d.pool.loads[0].charged_tokens == 700  # ...and d's view now holds the other's
            assert other._own[0]
            for charge in list(other._own[0]):  # the other replica's requests end
                other.loads[0].release(charge)
                other.released(charge, 0)
            assert await asyncio.wait_for(fut, 5) == 0
            assert req.backend == 0 and d.ledger.stats.denied >= 1
            # the wait for every answer is measured, by answer: the no(s), then the yes
            assert answers(metrics, "no") == d.ledger.stats.denied and answers(metrics, "yes") == 1
        finally:
            await d.ledger.stop()
            await other.stop()

    asyncio.run(main())


def test_a_request_withdrawn_while_confirming_gives_its_charge_back(
    redis_url: str, redis_prefix: str
) -> None:
    async def main() -> None:
        d = replica(redis_url, redis_prefix)
        assert d.ledger is not None
        await d.ledger.start()
        try:
            req = request()
            fut = d.submit(req)
            assert d.pool.loads[0].charged_tokens == 350 and not fut.done()
            assert d.withdraw(req)  # the client left before Redis answered
            await until(lambda: d.ledger.stats.commits >= 1, "Redis's answer")
            answered = d.ledger.stats.calls
            assert not fut.done() and req.backend is None
            assert d.pool.loads[0].charged_tokens == 0
            assert d.ledger.snapshot()["own_charges"] == 0
            # the give-back is published with d's next call (a sync at the latest)
            await until(lambda: d.ledger.stats.calls > answered, "d's next call")
            other = await fill_elsewhere(redis_url, redis_prefix, 0)
            try:
                assert other.stats.remote_tokens == [0.0]  # Redis forgot it too
            finally:
                await other.stop()
        finally:
            await d.ledger.stop()

    asyncio.run(main())


def test_within_its_budget_a_dispatch_goes_first_and_is_checked_after(
    redis_url: str, redis_prefix: str
) -> None:
    """``send_first_share``: the request goes to its backend in the pass itself (no wait for Redis),
    its charge reaches Redis with the next call, and only the budget's worth goes unseen at once."""
    metrics = GatewayMetrics()

    async def main() -> None:
        d = replica(redis_url, redis_prefix, metrics, send_first_share=0.5)  # alone: a budget of 500
        assert d.ledger is not None
        await d.ledger.start()
        try:
            first, second = request(), request()
            f1, f2 = d.submit(first), d.submit(second)
            assert f1.done() and f1.result() == 0  # sent within the pass
            assert not f2.done()  # 350 + 350 is over the budget while Redis has not seen the first
            assert await asyncio.wait_for(f2, 5) == 0  # ...so it waited for Redis's yes
            assert d.ledger.stats.sent_first == 1 and answers(metrics, "yes") == 1
            assert metrics.registry.get_sample_value("sagegate_ledger_sent_first_total") == 1
            other = await fill_elsewhere(redis_url, redis_prefix, 0)
            try:
                assert other.stats.remote_tokens == [700.0]  # both charges are in Redis
            finally:
                await other.stop()
        finally:
            await d.ledger.stop()

    asyncio.run(main())


def test_room_granted_twice_is_reported_and_stops_sending_first(redis_url: str, redis_prefix: str) -> None:
    """A replica whose stale view sent first into room another replica had taken hears ``over`` in
    the answer, and its refreshed view admits nothing more there: the next request waits (queued)."""
    metrics = GatewayMetrics()

    async def main() -> None:
        # a slow sync: only the over answer itself can have refreshed the view
        d = replica(redis_url, redis_prefix, metrics, send_first_share=0.9, sync_interval_s=2.0)
        assert d.ledger is not None
        await d.ledger.start()
        other = await fill_elsewhere(redis_url, redis_prefix, 2)  # 700 taken; d has not read it yet
        try:
            assert d.pool.loads[0].charged_tokens == 0  # the stale view
            fut = d.submit(request())
            assert fut.done()  # sent first on the stale view: granted twice (1050 > 1000)
            await until(lambda: d.ledger.stats.over > 0, "an over report")
            over = metrics.registry.get_sample_value("sagegate_ledger_over_total", {"backend": "backend-0"})
            assert over == 1
            assert d.pool.loads[0].charged_tokens == 1050  # the answer refreshed the view
            late = d.submit(request())
            await asyncio.sleep(0)  # a pass kicked by the submission runs
            assert d.dispatch() == 0  # and a pass of our own, on the view as it stands, sends nothing
            assert not late.done() and len(d.queue) == 1  # no room in the view: it waits
            assert d.ledger.stats.sent_first == 1
        finally:
            await d.ledger.stop()
            await other.stop()

    asyncio.run(main())
