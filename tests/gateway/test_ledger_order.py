"""One order across replicas (``ledger.order: threshold``, real Redis): a short request queued on
replica A is not held behind a long one replica B would dispatch into the same scarce room; with
``order: none`` B takes the room first. In process (two dispatchers) and as real gateway processes
over loopback. Plus the threshold mask itself."""

from __future__ import annotations

import asyncio
import itertools
import json
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import httpx
import pytest
from pydantic import ValidationError

from sagegate.gateway.backends import BackendPool
from sagegate.gateway.dispatcher import Dispatcher
from sagegate.gateway.ledger import SharedLedger
from sagegate.gateway.queue import BoundedQueue, GatewayRequest
from sagegate.gateway.settings import GatewaySettings, LedgerSettings
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge
from sagegate.policies.rank_threshold import ForeignHead, key_from_wire, threshold_mask, wire_key
from sagegate.policies.registry import parse_policy
from tests.fault_support import backend_process, gateway_process
from tests.gateway_support import chat_body, until, wait_until

pytest.importorskip("redis")

CFG = AdmissionConfig(unknown_output=300)
_rids = itertools.count()


def replica(url: str, prefix: str, order: str) -> Dispatcher:
    """A dispatcher over one backend of capacity 1000, ``fcfs``."""
    s = GatewaySettings.model_validate({"backends": ["http://b0"]})
    pool = BackendPool(s, httpx.AsyncClient())
    for b in pool.backends:
        b.load.capacity_tokens = 1000
        b.load.healthy = True
    settings = LedgerSettings(enabled=True, prefix=prefix, lease_s=1.0, sync_interval_s=0.05, order=order)  # type: ignore[arg-type]
    led = SharedLedger(settings, url, pool.loads, [b.url for b in pool.backends], CFG)
    pol = parse_policy("fcfs")
    d = Dispatcher(pol, pool, CFG, BoundedQueue(pol, 100, 10**9), ledger=led)
    led.on_change = d.kick  # as the gateway wires it
    return d


def request(arrival: float, prompt: int) -> GatewayRequest:
    return GatewayRequest(next(_rids), arrival, prompt, body={}, route="chat", model="m", prompt="")


async def rounds(*ledgers: SharedLedger, n: int = 3) -> None:
    """Wait until each ledger has made ``n`` more calls to Redis. A call the ``sync_interval_s`` alarm
    wakes is a sync (reads the others, kicks a dispatch pass), the others are commits' or releases':
    among three calls of an otherwise quiet replica there is a sync, and a call after it."""
    start = [led.stats.calls for led in ledgers]
    await until(
        lambda: all(led.stats.calls >= s + n for led, s in zip(ledgers, start, strict=True)),
        f"{n} ledger calls",
    )


@pytest.mark.parametrize("order", ["threshold", "none"])
def test_a_short_request_on_one_replica_is_not_held_behind_a_long_one_on_another(
    redis_url: str, redis_prefix: str, order: str
) -> None:
    async def main() -> None:
        a, b = replica(redis_url, redis_prefix, order), replica(redis_url, redis_prefix, order)
        assert a.ledger is not None and b.ledger is not None
        await a.ledger.start()
        await b.ledger.start()
        try:
            blocker = request(0.0, 400)  # charge 700 of 1000, on B
            assert await asyncio.wait_for(b.submit(blocker), 5) == 0
            long_b = b.submit(request(2.0, 400))  # 700: waits behind the blocker
            short = request(1.0, 50)  # 350, ranked first (arrived first): waits on A
            short_a = a.submit(short)
            if order == "threshold":  # each replica has read the other's head
                await until(lambda: len(a.ledger.heads) == len(b.ledger.heads) == 1, "both heads read")
            else:  # a few syncs, where a head would have been read
                await rounds(a.ledger, b.ledger)
            assert not long_b.done() and not short_a.done()
            assert len(b.ledger.heads) == (1 if order == "threshold" else 0)
            b.release(blocker)  # room for one of them, not both; B hears of it first
            done, _ = await asyncio.wait({long_b, short_a}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
            # the other's chance to go too, were there room: a sync on each replica after this
            # (its view refreshed, a dispatch pass kicked) and a call after that (a commit's answer)
            await rounds(a.ledger, b.ledger)
            if order == "threshold":
                assert done == {short_a} and not long_b.done()
                assert b.held_for_others > 0
                a.release(short)  # the short one ends: the long one goes (held, not starved)
                assert await asyncio.wait_for(long_b, 5) == 0
            else:
                assert done == {long_b} and not short_a.done()  # today: B took the room
        finally:
            await a.ledger.stop()
            await b.ledger.stop()

    asyncio.run(main())


def test_the_mask_holds_only_when_the_better_head_would_lose_its_room() -> None:
    loads = [BackendLoad(1000), BackendLoad(1000)]
    loads[0].charge(Charge(300, None, CFG))  # 600 on backend 0, backend 1 idle
    mine = Charge(100, None, CFG)  # 400
    better = ForeignHead((0.5, 1), Charge(400, None, CFG), 400)  # 700: fits on backend 1 alone
    assert threshold_mask((1.0, 2), mine, 100, loads, CFG, [better]) == [True, False]
    worse = ForeignHead((2.0, 3), Charge(300, None, CFG), 300)
    assert threshold_mask((1.0, 2), mine, 100, loads, CFG, [worse]) is None
    loads[1].charge(Charge(300, None, CFG))  # now the better head fits nowhere: hold
    assert threshold_mask((1.0, 2), mine, 100, loads, CFG, [better]) == [False, False]
    assert [ld.charged_tokens for ld in loads] == [600, 600]  # restored
    assert key_from_wire(wire_key((0.5, "r1", (2, None)))) == (0.5, "r1", (2, "None"))


def test_ledger_order_is_validated() -> None:
    with pytest.raises(ValidationError):
        LedgerSettings(order="global")  # type: ignore[arg-type]
    assert LedgerSettings().order == "threshold"  # the default (RESULTS.md, *Several replicas, one ledger*)


ADMIN = {"authorization": "Bearer admin-secret"}


@pytest.mark.heavy
def test_replica_processes_hold_a_later_request_for_an_earlier_one_elsewhere(
    redis_url: str, redis_prefix: str
) -> None:
    """Two gateway processes, ``fcfs``, one backend that holds one request at a time (capacity one
    token: an idle backend admits anything, nothing fits beside it). B runs a request; A's request,
    sent before B's second, must run before it, though B hears of the freed room first."""
    backends = json.dumps([{"url": "", "capacity_tokens": 1}])

    def ledger(url: str) -> dict[str, object]:
        out: dict[str, object] = httpx.get(url + "/admin/ledger", headers=ADMIN, timeout=5).json()
        return out

    def queued(url: str) -> int:
        return int(httpx.get(url + "/admin/queue", headers=ADMIN, timeout=5).json()["queued"])

    with backend_process(tokens=20, delay_s=0.1) as (_, backend):  # 2 s a request
        env = {
            "BACKENDS": backends.replace('""', json.dumps(backend)),
            "REDIS_URL": redis_url,  # the ledger is on with it: nothing else set
            "LEDGER__PREFIX": redis_prefix,
            "LEDGER__SYNC_INTERVAL_S": "0.05",
            "LEDGER__ORDER": "threshold",
        }
        with (
            gateway_process([], **env) as (_, a),
            gateway_process([], **env) as (_, b),
            ThreadPoolExecutor(4) as pool,
        ):

            def post(url: str, text: str) -> Future[httpx.Response]:
                body = chat_body(text)
                return pool.submit(httpx.post, url + "/v1/chat/completions", json=body, timeout=60)

            blocker = post(b, "blocker")
            wait_until(lambda: ledger(b)["own_charges"] == 1, timeout=10, what="b runs its first request")
            earlier = post(a, "earlier")
            wait_until(lambda: queued(a) == 1, timeout=10, what="a's request waits: no room")
            later = post(b, "later")
            wait_until(lambda: queued(b) == 1, timeout=10, what="b's second request waits")
            wait_until(lambda: ledger(b)["foreign_heads"] == 1, timeout=10, what="b has read a's head")
            assert not blocker.done()
            first, _ = wait([earlier, later], timeout=30, return_when=FIRST_COMPLETED)
            assert first == {earlier}  # a's request ran first; b held its own (order: none: b's first)
            assert later.result(timeout=30).status_code == 200  # then b's: held, not starved
            assert blocker.result(timeout=5).status_code == 200
            assert earlier.result().status_code == 200


@pytest.mark.heavy
def test_replicas_stamp_arrivals_on_one_scale() -> None:
    """Rank keys carry the gateway clock's arrival times and replicas compare published keys: two
    processes' clocks must agree (``time.monotonic`` starts at each host's boot)."""
    import subprocess
    import sys
    import time

    from sagegate.gateway.clock import fleet_clock

    code = "import time; from sagegate.gateway.clock import fleet_clock; print(fleet_clock() - time.time())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert abs(float(out.stdout)) < 0.5  # another process, the same scale as the wall clock
    assert abs(fleet_clock() - time.time()) < 0.5
    stamps = [fleet_clock() for _ in range(1000)]
    assert stamps == sorted(stamps)  # never steps back within a process
