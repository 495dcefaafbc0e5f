"""The shared admission ledger against a real Redis: the rule holds over every replica's charges,
under races, across a replica's death (lease), and Redis going away and coming back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sagegate.gateway.ledger import LedgerMode, QueueHead, SharedLedger
from sagegate.gateway.settings import GatewaySettings, LedgerSettings
from sagegate.harness.redis import RedisServer
from sagegate.policies.admission import AdmissionConfig, BackendLoad, Charge

pytest.importorskip("redis")

CFG = AdmissionConfig(unknown_output=300)
"""No prediction: each charge holds its 50-token prompt and has 300 to go (footprint 350)."""
CAPACITY = 1000
"""Two such charges fit (peak 700), three do not (1050)."""
BACKENDS = ["http://a:1", "http://b:1"]


def ledger(url: str, prefix: str, **kw: float) -> SharedLedger:
    settings = LedgerSettings(
        **{"enabled": True, "prefix": prefix, "lease_s": 0.6, "sync_interval_s": 0.05, **kw}
    )
    loads = [BackendLoad(CAPACITY) for _ in BACKENDS]
    return SharedLedger(settings, url, loads, BACKENDS, CFG)


async def commit(led: SharedLedger, backend: int = 0) -> tuple[Charge, bool]:
    """Charge a fresh request as the dispatch loop does (local view first), then ask Redis."""
    charge = Charge(50, None, CFG)
    led.loads[backend].charge(charge)
    fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    led.commit(backend, charge, fut.set_result)
    ok = await fut
    if not ok:
        led.loads[backend].release(charge)
    return charge, ok


async def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


def test_the_ledger_needs_redis() -> None:
    with pytest.raises(ValueError, match="redis_url"):
        GatewaySettings(ledger=LedgerSettings(enabled=True))


def test_the_ledger_is_on_whenever_redis_is_set_unless_turned_off() -> None:
    """Replicas started with one Redis URL and nothing else share every backend's KV."""
    assert GatewaySettings(redis_url="redis://127.0.0.1:1/0").ledger_on
    assert not GatewaySettings().ledger_on
    off = GatewaySettings(redis_url="redis://127.0.0.1:1/0", ledger=LedgerSettings(enabled=False))
    assert not off.ledger_on


def test_a_replica_is_refused_the_room_another_took(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        a, b = ledger(redis_url, redis_prefix), ledger(redis_url, redis_prefix)
        await a.start()
        await b.start()
        try:
            assert [(await commit(a))[1] for _ in range(2)] == [True, True]
            _, ok = await commit(b)
            assert not ok  # b's own view was empty; Redis saw a's two charges
            assert b.stats.remote_tokens[0] == 700  # the denial refreshed b's view
            assert (await commit(b, backend=1))[1]  # the other backend is free
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_racing_replicas_never_admit_more_than_fits(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        # Redis's answer is what is tested, not its speed: at the default 0.25 s a first connection
        # on a loaded machine once timed out, and each replica then admitted into its local share
        reps = [ledger(redis_url, redis_prefix, timeout_s=5.0) for _ in range(3)]
        for r in reps:
            await r.start()
        try:
            results = await asyncio.gather(*(commit(r) for r in reps for _ in range(4)))
            assert sum(ok for _, ok in results) == 2
        finally:
            for r in reps:
                await r.stop()

    run(main)


def test_racing_replicas_sending_first_overshoot_at_most_their_share(
    redis_url: str, redis_prefix: str
) -> None:
    """``send_first_share``: replicas racing on empty views send first only within their budgets
    (share × capacity / replicas unseen by Redis each), so the fleet's charges exceed the limit by
    at most ``send_first_share`` of the backend; the rest wait for Redis's verdict as before."""

    async def main() -> None:
        reps = [ledger(redis_url, redis_prefix, send_first_share=0.8) for _ in range(2)]
        for r in reps:
            await r.start()
        try:
            # (a replica that joins shrinks the others' budgets from their next call: one sync)
            await until(lambda: all(r.members == 2 for r in reps), "both replicas count each other")

            async def dispatch(led: SharedLedger) -> bool:
                charge = Charge(50, None, CFG)
                led.loads[0].charge(charge)
                if led.send_first(0, charge):
                    return True
                fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                led.commit(0, charge, fut.set_result)
                if not await fut:
                    led.loads[0].release(charge)
                    return False
                return True

            results = await asyncio.gather(*(dispatch(r) for r in reps for _ in range(4)))
            first = sum(r.stats.sent_first for r in reps)
            assert first == 2  # a budget of 400 each: one 350 apiece
            await until(lambda: not any(u for r in reps for u in r._unseen), "both calls answered")
            held = sum(len(r._own[0]) for r in reps)
            # the first call to land takes its own and one commit (700), the second's publish goes
            # over (1050: reported) and its commits are refused; within 1000 + 0.8 x 1000
            assert held == sum(results) == 3 and sum(r.stats.over for r in reps) == 1
        finally:
            for r in reps:
                await r.stop()

    run(main)


def test_a_charge_sent_first_is_published_at_once(redis_url: str, redis_prefix: str) -> None:
    """Sent first, the charge is checked by the next call, which comes at once, not at the next sync:
    the other replicas see it (and an over-admission is reported) within a round trip."""

    async def main() -> None:
        a = ledger(redis_url, redis_prefix, send_first_share=0.8, sync_interval_s=30.0, lease_s=60.0)
        b = ledger(redis_url, redis_prefix)
        await a.start()
        await b.start()
        try:
            charge = Charge(50, None, CFG)
            a.loads[0].charge(charge)
            assert a.send_first(0, charge)
            await until(lambda: b.stats.remote_tokens[0] == 350, "b sees a's charge", timeout=3.0)
            assert a.stats.sent_first == 1 and not a._unseen[0]
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_progress_and_release_reach_the_other_replicas(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        a, b = ledger(redis_url, redis_prefix), ledger(redis_url, redis_prefix)
        await a.start()
        await b.start()
        try:
            charge, ok = await commit(a)
            assert ok
            await until(lambda: b.stats.remote_tokens[0] == 350, "b sees a's charge")
            a.loads[0].progress(charge, 100)  # held 150, remaining 200
            await until(lambda: b.loads[0].holdings.peak() == 350 and _remote(b) == [(150, 200)], "progress")
            a.loads[0].release(charge)
            a.released(charge, 0)
            await until(lambda: b.stats.remote_tokens[0] == 0, "b sees the release")
            assert b.loads[0].charged_tokens == 0
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_a_grown_charge_is_checked_before_the_next_sync(redis_url: str, redis_prefix: str) -> None:
    """A request that runs past its prediction grows its charge; Redis must check the others' commits
    against the grown footprint within ``publish_s``, not at the next (slow) sync."""

    async def main() -> None:
        # a sync far beyond the test (and the wait below): only the growth's own call can publish it
        slow = {"lease_s": 60.0, "sync_interval_s": 30.0, "publish_s": 0.02}
        a, b = ledger(redis_url, redis_prefix, **slow), ledger(redis_url, redis_prefix, **slow)
        await a.start()
        await b.start()
        try:
            grown, ok = await commit(a, backend=0)
            silent, ok2 = await commit(a, backend=1)
            assert ok and ok2
            for backend, charge in ((0, grown), (1, silent)):  # both run to 900: held 950, remaining 1
                assert a.loads[backend].progress(charge, 900) > 0
            calls = a.stats.calls
            a.changed(grown, 0)  # only backend 0's growth is announced, as the dispatcher does
            await until(lambda: a.stats.calls > calls, "the call publishing the growth")
            assert not (await commit(b, backend=0))[1]  # 950 + 1 with 50 + 300: peak 1002 > 1000
            assert (await commit(b, backend=1))[1]  # Redis still holds the footprint of 350 there
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_a_commit_is_checked_against_this_replicas_charges_as_they_stand(
    redis_url: str, redis_prefix: str
) -> None:
    """Progress between syncs rides the next commit on that backend, so Redis weighs the commit
    against the charges the local decision weighed, not against the last sync's."""
    import redis

    async def main() -> None:
        slow = {"lease_s": 4.0, "sync_interval_s": 1.5, "publish_s": 0.02}
        a = ledger(redis_url, redis_prefix, **slow)
        await a.start()
        client = redis.Redis.from_url(redis_url)
        key = f"{redis_prefix}:c:{a.replica}:{a.backend_ids[0]}"
        try:
            first, ok = await commit(a)
            assert ok and client.get(key) == b"50:300,"
            assert a.loads[0].progress(first, 100) == 0  # held 150, remaining 200: no growth to publish
            assert (await commit(a))[1]
            assert client.get(key) == b"150:200,50:300,"  # well before the next sync
        finally:
            client.close()
            await a.stop()

    run(main)


def test_a_release_reaches_the_other_replicas_before_their_next_sync(
    redis_url: str, redis_prefix: str
) -> None:
    """A release is announced (``{prefix}:freed``): the others read at once, so room freed on one
    replica is not left idle for a sync interval while another's queue waits for it."""

    async def main() -> None:
        slow = {"lease_s": 8.0, "sync_interval_s": 3.0, "publish_s": 0.02}
        a, b = ledger(redis_url, redis_prefix, **slow), ledger(redis_url, redis_prefix, **slow)
        b.head_of = lambda: QueueHead((1.0, 0), Charge(50, None, CFG), 50)  # b has a request waiting
        await b.start()  # publishes its head,
        await a.start()  # which a reads when it joins: a knows someone waits for room
        try:
            assert len(a.heads) == 1
            first, _ = await commit(a)
            assert (await commit(a))[1]
            assert not (await commit(b))[1]  # full: b's view now holds a's two charges (700)
            assert b.stats.remote_tokens[0] == 700
            a.loads[0].release(first)
            a.released(first, 0)
            await until(lambda: b.stats.remote_tokens[0] == 350, "b reads a's release", timeout=1.0)
            assert (await commit(b))[1]
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_where_nobody_waits_a_release_waits_for_the_sync(redis_url: str, redis_prefix: str) -> None:
    """No replica has a queued head: a release is not announced (nobody pays for the news)."""

    async def main() -> None:
        import redis.asyncio as aioredis

        # a sync far beyond the test: b reads only if told of a release
        slow = {"lease_s": 60.0, "sync_interval_s": 30.0, "publish_s": 0.02}
        a, b = ledger(redis_url, redis_prefix, **slow), ledger(redis_url, redis_prefix, **slow)
        await b.start()
        await a.start()
        client = aioredis.Redis.from_url(redis_url)
        witness = client.pubsub(ignore_subscribe_messages=True)
        await witness.subscribe(f"{redis_prefix}:freed")  # (answered: subscribed from here on)
        try:
            first, _ = await commit(a)
            assert (await commit(a))[1]
            assert not (await commit(b))[1]  # the denial shows b a's two charges
            calls = b.stats.calls
            a.loads[0].release(first)
            a.released(first, 0)
            assert (await commit(a, backend=1))[1]  # a call of a's: it publishes the release
            # a marker after it on the channel: whatever that call announced arrives first
            await client.publish(f"{redis_prefix}:freed", "marker")
            heard: list[bytes] = []
            deadline = asyncio.get_running_loop().time() + 5.0
            while not heard or heard[-1] != b"marker":
                assert asyncio.get_running_loop().time() < deadline, "the marker never came"
                msg = await witness.get_message(timeout=0.1)  # (None: nothing yet, or the subscribe's ack)
                if msg is not None:
                    heard.append(msg["data"])
            assert heard == [b"marker"]  # the release was not announced
            assert b.stats.calls == calls and b.stats.remote_tokens[0] == 700  # b did not read
        finally:
            await witness.aclose()
            await client.aclose()
            await a.stop()
            await b.stop()

    run(main)


def test_another_replicas_unscraped_sends_count_as_waiting_here(redis_url: str, redis_prefix: str) -> None:
    """What replica A sent to a backend since its last scrape, B's scrapes cannot see yet: B reads it
    from the ledger and holds it against the backlog bound (``max_waiting_tokens``), as A does."""
    from sagegate.policies.admission import choose_backend

    async def main() -> None:
        a, b = ledger(redis_url, redis_prefix), ledger(redis_url, redis_prefix)
        a.pending_of = lambda backend: (2, 1800) if backend == 0 else (0, 0)
        await a.start()
        await b.start()
        try:
            await until(lambda: b.loads[0].foreign_waiting == 2, "b reads a's pending sends")
            assert (b.loads[0].foreign_waiting_tokens, b.loads[1].foreign_waiting) == (1800, 0)
            cfg = AdmissionConfig(unknown_output=300, max_waiting_tokens=2048)
            probe = Charge(400, None, cfg)  # fits either backend's KV
            assert choose_backend(probe, b.loads, cfg, prompt_tokens=400) == 1  # 1800 + 400 > 2048 on 0
            a.pending_of = lambda backend: (0, 0)  # a's next scrape saw them start
            await until(lambda: b.loads[0].foreign_waiting == 0, "b reads that they started")
        finally:
            await a.stop()
            await b.stop()

    run(main)


def _remote(led: SharedLedger) -> list[tuple[int, int]]:
    return [(c.held, c.remaining) for c in led._remote[0]]


def test_a_dead_replicas_charges_expire_with_its_lease(redis_url: str, redis_prefix: str) -> None:
    async def main() -> None:
        a, b = ledger(redis_url, redis_prefix), ledger(redis_url, redis_prefix)
        await a.start()
        await b.start()
        try:
            assert (await commit(a))[1] and (await commit(a))[1]
            assert not (await commit(b))[1]
            assert a._task is not None
            a._task.cancel()  # a stops renewing without leaving (as a SIGKILL would)
            await until(lambda: b.stats.remote_tokens[0] == 0, "a's lease expires", timeout=5)
            assert (await commit(b))[1] and (await commit(b))[1]
            assert not (await commit(b))[1]
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_redis_down_means_a_local_share_then_rejoin(private_redis: RedisServer, redis_prefix: str) -> None:
    async def main() -> None:
        a = ledger(private_redis.url, redis_prefix, local_share=0.5, timeout_s=0.2)
        await a.start()
        try:
            assert (await commit(a))[1]
            private_redis.kill()
            await until(lambda: a.mode is LedgerMode.LOCAL, "a notices Redis is gone")
            a.prepare()
            assert a.loads[0].capacity_tokens == CAPACITY // 2  # its configured share
            assert (await commit(a, backend=1))[1]  # alone, the local view's yes stands
            private_redis.start()
            await until(lambda: a.mode is LedgerMode.SHARED, "a rejoins", timeout=10)
            a.prepare()
            assert a.loads[0].capacity_tokens == CAPACITY
            b = ledger(private_redis.url, redis_prefix)
            await b.start()
            try:  # the restarted (empty) Redis learnt a's charges again on the rejoin
                assert b.stats.remote_tokens == [350, 350]
                assert (await commit(b))[1] and not (await commit(b))[1]
            finally:
                await b.stop()
        finally:
            await a.stop()

    run(main)
