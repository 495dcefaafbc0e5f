"""Precise cache-aware placement: the gateway follows each backend's KV-cache events (vLLM's wire
format over real ZMQ on loopback) into an exact index of what the engine caches, and predicts a
request's cached prefix from it, falling back to the approximate index when it cannot trust the
events (none configured, none yet, a gap, stopped, a backend down or restarted)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from sagegate.core.prefix import token_block_keys
from sagegate.core.tokens import encode, flatten_messages
from sagegate.gateway import locality
from sagegate.gateway.app import create_app
from sagegate.gateway.backends import BackendPool
from sagegate.gateway.kv_events import KVEventFollower
from sagegate.gateway.kv_index import ExactIndex, Malformed, Removed, Stored, decode_batch
from sagegate.gateway.locality import Locality
from sagegate.gateway.queue import GatewayRequest
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.settings_kv_events import BackendKVEvents, KVEventsSettings
from sagegate.gateway.tokens import backend_keys, keys_of
from sagegate.harness.procs import child, free_port
from tests.gateway_support import ServerThread, admin, metric, settings_for, wait_until

BS = 16
TOKENS = list(range(500, 564))  # four blocks
KEYS = token_block_keys(TOKENS, BS)


def stored(hashes: list[int], parent: int | None, tokens: list[int], **extra: Any) -> dict[str, Any]:
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens}
    return {**ev, "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None, **extra}


def removed(hashes: list[int], **extra: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", **extra}


def batch(*events: Any) -> bytes:
    return msgpack.packb([1.7e9, list(events), 0])


# --- the index and the decoder ------------------------------------------------------------------------
def test_the_index_follows_stored_removed_and_cleared_by_token_content() -> None:
    ix = ExactIndex(100)
    (ev,) = decode_batch(batch(stored([11, 12], None, TOKENS[:32])))[0]
    assert isinstance(ev, Stored) and ix.stored(ev)
    assert ix.match(KEYS) == 2  # keyed by the tokens, whatever the engine's hashes are
    (ev,) = decode_batch(batch(stored([13, 14], 12, TOKENS[32:])))[0]
    assert ix.stored(ev) and ix.match(KEYS) == 4  # chained through the parent's key
    assert ix.match(token_block_keys([*TOKENS[:16], 1, *TOKENS[17:]], BS)) == 1  # prefix only
    ix.removed([13])
    assert ix.match(KEYS) == 2 and len(ix) == 3
    (ev,) = decode_batch(batch(stored([99], 4242, TOKENS[:16])))[0]
    assert not ix.stored(ev)  # its parent is unknown: its key cannot be known
    ix.clear()
    assert ix.match(KEYS) == 0 and len(ix) == 0


def test_copies_salts_other_tiers_and_the_capacity() -> None:
    ix = ExactIndex(3)
    for _ in range(2):  # vLLM does not de-duplicate physical copies: two stores, two removals
        ix.stored(decode_batch(batch(stored([11], None, TOKENS[:16])))[0][0])  # type: ignore[arg-type]
    ix.removed([11])
    assert ix.match(KEYS) == 1
    ix.removed([11])
    assert ix.match(KEYS) == 0
    salted = stored([21], None, TOKENS[:16], lora_name="adapter", extra_keys=[["adapter"]])
    ix.stored(decode_batch(batch(salted))[0][0])  # type: ignore[arg-type]
    assert len(ix) == 1 and ix.match(KEYS) == 0  # a LoRA block never answers a plain prompt
    events, skipped = decode_batch(
        batch(stored([31], None, TOKENS[:16], medium="CPU"), removed([31], group_idx=1), {"type": "Unknown"})
    )
    assert events == [] and skipped == 3
    for h in range(40, 45):
        ix.stored(Stored([h], None, [h] * BS, BS, None))
    assert len(ix) == 3 and ix.dropped == 3  # bounded by the backend's capacity in blocks


def test_both_of_vllms_layouts_decode_alike_and_garbage_is_malformed() -> None:
    as_map = batch(stored([11, 12], None, TOKENS[:32]), removed([11]), {"type": "AllBlocksCleared"})
    as_array = msgpack.packb(
        [
            1.7e9,
            [
                ["BlockStored", [11, 12], None, TOKENS[:32], BS, None, "GPU", None, None, None, None, None],
                ["BlockRemoved", [11], "GPU", None],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    assert decode_batch(as_map) == decode_batch(as_array)
    assert isinstance(decode_batch(as_map)[0][1], Removed)
    for bad in (b"\xc1", msgpack.packb({"x": 1}), batch(stored([1], None, TOKENS[:15])), batch(removed("x"))):
        with pytest.raises(Malformed):
            decode_batch(bad)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def follower(replay: str | None = None, clock: Clock | None = None) -> KVEventFollower:
    source = BackendKVEvents(endpoint="tcp://127.0.0.1:1", replay_endpoint=replay)
    opts = KVEventsSettings(stale_s=5.0, resync_s=30.0, replay_timeout_s=2.0)
    return KVEventFollower("b", source, opts, 64 * BS, clock=clock or Clock())


def test_a_gap_clears_a_restart_clears_and_silence_after_requests_is_stale() -> None:
    clock = Clock()
    f = follower(clock=clock)
    assert f.state == "waiting" and not f.precise
    f.receive(0, batch(stored([11, 12], None, TOKENS[:32])))
    assert f.precise and f.index.match(KEYS) == 2
    f.receive(2, batch(stored([13], 12, TOKENS[32:48])))  # batch 1 was lost
    assert f.counts.gaps == 1 and f.state == "resync" and f.index.match(KEYS) == 0
    clock.t += 31
    assert f.precise  # rebuilt from what followed
    f.receive(3, batch(stored([21], None, TOKENS[:16])))
    f.receive(0, batch())  # the sequence starts again: a new engine, an empty cache
    assert f.counts.restarts == 1 and len(f.index) == 0 and f.precise
    f.note_sent()
    clock.t += 6
    assert f.state == "stale"  # requests went there and no event came: the events stopped
    f.receive(1, b"\x00garbage")
    assert f.counts.dropped["malformed"] == 1 and f.state == "resync"
    f.receive(2, batch({"type": "AllBlocksCleared"}))
    assert f.precise  # the engine says it holds nothing: exact again at once


def test_a_prefill_in_progress_counts_on_a_precise_backend() -> None:
    """Events report a block once computed: until then the index alone is blind to a request sent
    there, and a burst sharing a new prefix would be spread over the fleet. A request in flight
    credits its blocks to its backend until it leaves."""
    settings = GatewaySettings.model_validate({"backends": ["http://x:8000", "http://y:8000"]})
    pool = BackendPool(settings, httpx.AsyncClient())
    loc = Locality(settings.placement, pool.backends)
    for b in pool.backends:
        b.load.healthy = True
        b.kv = follower()
        b.kv.receive(0, batch(stored([11], None, TOKENS[:16])))  # something else: precise, 16-token blocks
        assert b.kv.precise
    prompt = SYSTEM + "When does the last train leave Basel?"
    ids = encode(prompt)
    rids = iter(range(1, 100))

    def request() -> GatewayRequest:
        req = GatewayRequest(
            next(rids), 0.0, len(ids), body={}, route="completions", model="m", prompt=prompt
        )
        loc.describe(req, None, keys_of(ids, frozenset({BS})))
        return req

    first, second = request(), request()
    assert list(loc.cached(first).hits) == [0, 0]
    loc.sent(first, 1)
    hits = loc.cached(second).hits
    assert hits[0] == 0 and hits[1] > 0.8 * len(ids), hits
    loc.sent(second, 1)
    loc.left(first, 1)
    assert loc.cached(request()).hits[1] > 0.8 * len(ids)  # the second is still there
    loc.left(second, 1)  # never computed, and no event came: the engine holds nothing of it
    assert list(loc.cached(request()).hits) == [0, 0]
    assert len(loc.in_flight[1]) == 0


# --- over real ZMQ ----------------------------------------------------------------------------------------
class HandPublisher:
    """vLLM's publisher side by hand: PUB (topic, seq, payload) and a ROUTER replaying its buffer as
    vLLM 0.32 does (topic, seq, payload), or as earlier vLLM did (seq, payload)."""

    def __init__(self, replay_topic: bool = True) -> None:
        self.replay_topic = [b"kv@b@m"] if replay_topic else []
        self.port, self.replay_port = free_port(), free_port()
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)  # a PUB that hears its subscribers (:meth:`subscribed`)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.task = asyncio.ensure_future(self._replay())

    async def subscribed(self) -> None:
        """Until a subscriber's subscription has reached it (what it sends before is lost)."""
        assert await self.pub.poll(10_000), "no subscriber"
        await self.pub.recv()

    async def send(self, seq: int, payload: bytes, lose: bool = False) -> None:
        self.buffer.append((seq, payload))
        if not lose:
            await self.pub.send_multipart([b"kv@b@m", seq.to_bytes(8, "big"), payload])

    async def _replay(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            for seq, payload in self.buffer:
                if seq >= int.from_bytes(start, "big"):
                    await self.router.send_multipart(
                        [ident, b"", *self.replay_topic, seq.to_bytes(8, "big"), payload]
                    )
            end = [b""] if self.replay_topic else []
            await self.router.send_multipart([ident, b"", *end, (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self.task.cancel()
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


@contextlib.asynccontextmanager
async def following(f: KVEventFollower) -> AsyncIterator[None]:
    """``f`` subscribed and following (:meth:`KVEventFollower.run`) for the block."""
    task = asyncio.ensure_future(f.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def deadline(what: str, timeout: float = 10.0) -> Callable[[], None]:
    """For a loop that must do something until a condition holds: call it each turn; it fails the
    test once ``timeout`` has passed instead of letting the loop hang."""
    end = time.monotonic() + timeout

    def check() -> None:
        assert time.monotonic() < end, f"timed out waiting for {what}"

    return check


async def until(cond: Any, what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("replay_topic", [True, False], ids=["vllm-0.32", "earlier"])
def test_the_follower_over_zmq_fills_a_gap_from_the_replay_socket(replay_topic: bool) -> None:
    async def scenario() -> None:
        pub = HandPublisher(replay_topic)
        source = BackendKVEvents(
            endpoint=f"tcp://127.0.0.1:{pub.port}", replay_endpoint=f"tcp://127.0.0.1:{pub.replay_port}"
        )
        f = KVEventFollower("b", source, KVEventsSettings(), 64 * BS)
        try:
            async with following(f):
                await pub.subscribed()
                await pub.send(0, batch(stored([11, 12], None, TOKENS[:32])))
                await until(lambda: f.index.match(KEYS) == 2, "the first blocks")
                await pub.send(1, batch(stored([13], 12, TOKENS[32:48])), lose=True)
                await pub.send(2, batch(stored([14], 13, TOKENS[48:])))
                await until(lambda: f.last_seq == 2, "batch 2")
                assert f.counts.gaps == 1 and f.counts.replayed == 1 and f.precise
                assert f.index.match(KEYS) == 4  # batch 1 came back through the replay socket
                await pub.send(3, batch(removed([12])))
                await until(lambda: f.index.match(KEYS) == 1, "the removal")
        finally:
            pub.close()

    asyncio.run(scenario())


def test_a_broken_subscription_is_not_precise_until_a_batch_says_what_was_missed() -> None:
    f = follower()
    f.receive(0, batch(stored([11, 12], None, TOKENS[:32])))
    f.disconnected()
    assert f.state == "disconnected" and not f.precise and f.counts.dropped["connection"] == 1
    assert f.index.match(KEYS) == 2  # kept: the next batch may show nothing was missed
    f.receive(1, batch(stored([13], 12, TOKENS[32:48])))
    assert f.precise and f.index.match(KEYS) == 3
    f.disconnected()
    f.receive(3, batch())  # batch 2 was lost with the connection
    assert f.state == "resync" and f.counts.gaps == 1 and len(f.index) == 0


OVERSIZED = b"\x00" * (5 << 20)


def test_a_message_over_the_limit_does_not_deafen_the_subscriber() -> None:
    """ZMQ closes a connection that carries a message over ``MAXMSGSIZE`` and never reconnects it:
    the follower notices, resubscribes, and follows on (the lost batch is a gap)."""

    async def scenario() -> None:
        pub = HandPublisher()
        source = BackendKVEvents(endpoint=f"tcp://127.0.0.1:{pub.port}")
        f = KVEventFollower("b", source, KVEventsSettings(resync_s=0.0), 64 * BS)
        try:
            async with following(f):
                seq = 0
                tick = deadline("the subscription")
                while f.last_seq is None:  # valid batches until the subscription is up
                    tick()
                    await pub.send(seq, batch(stored([11, 12], None, TOKENS[:32])))
                    seq += 1
                    await asyncio.sleep(0.05)
                await until(lambda: f.last_seq == seq - 1, "the batches sent")
                await pub.send(seq, OVERSIZED)
                await until(lambda: f.counts.dropped.get("connection") == 1, "the broken connection noticed")
                assert f.state == "disconnected"
                stop = seq + 2
                seq += 1
                tick = deadline("the new subscription")
                while f.last_seq is None or f.last_seq < stop:  # (sent until the new subscription is up)
                    tick()
                    await pub.send(seq, batch(stored([20 + seq], None, TOKENS[:16])))
                    seq += 1
                    await asyncio.sleep(0.05)
                assert f.counts.gaps == 1 and f.precise  # rebuilt (resync_s 0) from what follows
                before = f.counts.batches
                for _ in range(5):
                    await pub.send(seq, batch(removed([20])))
                    seq += 1
                await until(lambda: f.counts.batches == before + 5, "batches after the oversized one")
                assert f.precise and f.counts.dropped["connection"] == 1
        finally:
            pub.close()

    asyncio.run(scenario())


def test_a_publisher_that_restarts_on_the_same_port_is_followed_afresh() -> None:
    async def scenario() -> None:
        pub = HandPublisher()
        source = BackendKVEvents(endpoint=f"tcp://127.0.0.1:{pub.port}")
        f = KVEventFollower("b", source, KVEventsSettings(resync_s=0.0), 64 * BS)
        async with following(f):
            seq = 0
            tick = deadline("the subscription")
            while f.last_seq is None:  # empty batches until the subscription is up
                tick()
                await pub.send(seq, batch())
                seq += 1
                await asyncio.sleep(0.05)
            for i in range(3):
                parent = 10 + i if i else None
                await pub.send(seq, batch(stored([11 + i], parent, TOKENS[16 * i : 16 * i + 16])))
                seq += 1
            while seq < 200:  # an engine that ran a while: its sequence is far from 0
                await pub.send(seq, batch())
                seq += 1
            await until(lambda: f.last_seq == 199 and f.index.match(KEYS) == 3, "the first engine's blocks")
            port = pub.port
            pub.close()
            await until(lambda: f.state == "disconnected", "the publisher gone")
            again = zmq.asyncio.Context()
            sock = again.socket(zmq.PUB)
            sock.bind(f"tcp://127.0.0.1:{port}")  # a new engine, its sequence from 0
            try:
                seq = 0
                tick = deadline("a subscription to the new engine")
                while f.state == "disconnected":  # (its first batches may go before the subscription)
                    tick()
                    await sock.send_multipart([b"kv", seq.to_bytes(8, "big"), batch()])
                    seq += 1
                    await asyncio.sleep(0.05)
                assert f.counts.restarts == 1 and len(f.index) == 0  # the old engine's blocks are gone
                first = batch(stored([7], None, TOKENS[:16]))
                await sock.send_multipart([b"kv", seq.to_bytes(8, "big"), first])
                await until(lambda: f.index.match(KEYS) == 1, "the new engine's block")
                assert f.precise
            finally:
                sock.close(0)
                again.term()

    asyncio.run(scenario())


# --- end to end: a simulated backend publishing, the gateway following ------------------------------------
@contextmanager
def sim_backend(events_port: int | None, port: int | None = None) -> Iterator[str]:
    args = ["--time-scale", "20", "--served-model-name", "fake"]
    if events_port is not None:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
        args += ["--kv-events-config", json.dumps(cfg)]
    with child("sagegate.cmd_backend", args, port=port) as c:
        yield c.url


@contextmanager
def gateway(backends: list[dict[str, Any]], **kw: Any) -> Iterator[str]:
    with ServerThread(create_app(settings_for(backends, **kw))) as gw:  # type: ignore[arg-type]
        wait_until(lambda: all(b["healthy"] for b in admin(gw.url)["backends"]), what="backends up")
        yield gw.url


class Watcher:
    """The test's own subscriber: the last sequence the backend published, to wait for the gateway."""

    def __init__(self, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.last = -1

    def caught_up(self, gw: str, backend: str = "backend-0") -> None:
        """Wait until the backend has published nothing for a while and the gateway has seen it all."""
        while self.sock.poll(300):
            self.last = int.from_bytes(self.sock.recv_multipart()[1], "big")
        wait_until(
            lambda: metric(gw, f'sagegate_kv_events_last_seq{{backend="{backend}"}}') == self.last,
            what="the gateway to follow the events",
        )

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


SYSTEM = "You are a careful assistant for the railway company; answer in full sentences. " * 30


def turn(gw: str, backend: str, messages: list[dict[str, str]]) -> tuple[int, int]:
    """One turn: (the gateway's predicted cached tokens, the engine's own prefix cache hit)."""
    before = metric(backend, "vllm:prefix_cache_hits_total")
    body = {"model": "fake", "messages": messages, "max_tokens": 40}
    r = httpx.post(gw + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return int(r.headers["x-sagegate-prefix-hit"]), int(
        metric(backend, "vllm:prefix_cache_hits_total") - before
    )


@pytest.mark.heavy
@pytest.mark.parametrize("tokenizer", ["local", "backend"])
def test_a_conversations_predicted_hits_are_the_engines_own(tokenizer: str, monkeypatch: Any) -> None:
    """``local``: the gateway's own BPE and rendering; ``backend``: the backend's ``/tokenize``."""
    asked: list[str] = []

    async def counted(client: Any, url: str, *args: Any) -> Any:
        asked.append(url)
        return await backend_keys(client, url, *args)

    monkeypatch.setattr(locality, "backend_keys", counted)
    ev = free_port()
    with (
        sim_backend(ev) as url,
        gateway(
            [{"url": url, "kv_events": f"tcp://127.0.0.1:{ev}"}],
            placement={"kv_events": {"tokenizer": tokenizer}},
        ) as gw,
    ):
        watch = Watcher(ev)
        try:
            messages = [{"role": "system", "content": SYSTEM}]
            seen = []
            for i in range(5):
                messages.append(
                    {"role": "user", "content": f"Question {i}: when does train {i} leave Basel? " * 3}
                )
                seen.append(turn(gw, url, messages))
                watch.caught_up(gw)
                assert metric(gw, 'sagegate_kv_events_state{backend="backend-0",state="precise"}') == 1
            assert seen[0] == (0, 0)
            assert all(predicted == actual > 0 for predicted, actual in seen[1:]), seen
            # the index holds what the engine reports: the prompt's tokens as the engine tokenised them
            ids = encode(flatten_messages(messages[:-1]))
            assert metric(gw, 'sagegate_kv_events_index_blocks{backend="backend-0"}') >= len(ids) // BS
            assert metric(gw, 'sagegate_kv_events_gaps_total{backend="backend-0",what="gap"}') == 0
            assert len(asked) == (4 if tokenizer == "backend" else 0)  # once a request, while precise
        finally:
            watch.close()


@pytest.mark.heavy
def test_without_events_or_before_any_the_approximate_index_places() -> None:
    silent = free_port()  # configured, but nothing ever publishes there
    with sim_backend(None) as url, gateway([{"url": url, "kv_events": f"tcp://127.0.0.1:{silent}"}]) as gw:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "When is the first train?"},
        ]
        assert turn(gw, url, messages) == (0, 0)
        messages.append({"role": "user", "content": "And the last one?"})
        predicted, actual = turn(gw, url, messages)
        assert metric(gw, 'sagegate_kv_events_state{backend="backend-0",state="waiting"}') == 1
        assert predicted > 0 and actual > 0  # the approximate index's prediction (64-token text blocks)
        assert metric(gw, 'sagegate_backend_prefix_index_blocks{backend="backend-0"}') > 0
    with sim_backend(None) as url, gateway([url]) as gw:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "When is the first train?"},
        ]
        turn(gw, url, messages)
        assert "sagegate_kv_events" not in httpx.get(gw + "/metrics").text  # no events: no followers
        messages.append({"role": "user", "content": "And the last one?"})
        assert turn(gw, url, messages)[0] > 0


@pytest.mark.heavy
def test_a_restarted_backends_index_is_cleared_and_follows_the_new_engine() -> None:
    ev, port = free_port(), free_port()
    backend = [{"url": f"http://127.0.0.1:{port}", "kv_events": f"tcp://127.0.0.1:{ev}"}]
    args = ["--time-scale", "20", "--served-model-name", "fake", "--kv-events-config"]
    args.append(json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{ev}"}))
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "When is the first train?"},
    ]
    blocks = 'sagegate_kv_events_index_blocks{backend="backend-0"}'
    with child("sagegate.cmd_backend", args, port=port) as first, gateway(backend) as gw:
        watch = Watcher(ev)
        turn(gw, first.url, messages)
        watch.caught_up(gw)
        assert metric(gw, blocks) > 0
        first.proc.kill()
        first.proc.wait()
        wait_until(lambda: not admin(gw)["backends"][0]["healthy"], what="the backend down")
        assert metric(gw, blocks) == 0  # down: its cache is predicted empty
        with child("sagegate.cmd_backend", args, port=port) as second:  # a new engine on the same ports
            wait_until(lambda: admin(gw)["backends"][0]["healthy"], timeout=15, what="the backend back")
            # the test's own subscriber, anew: its old socket may not have reconnected yet, and would
            # then miss the new engine's events (and compare the old engine's sequence numbers)
            watch.close()
            watch = Watcher(ev)
            watch.sock.poll(300)  # let it connect before the new engine publishes
            messages.append({"role": "user", "content": "And the last one?"})
            assert turn(gw, second.url, messages) == (0, 0)  # the new engine holds nothing: predicted so
            watch.caught_up(gw)
            messages.append({"role": "user", "content": "Is there a night train?"})
            predicted, actual = turn(gw, second.url, messages)
            assert predicted == actual > 0
            assert metric(gw, 'sagegate_kv_events_state{backend="backend-0",state="precise"}') == 1
        watch.close()


def test_a_backend_names_its_events_beside_its_url(monkeypatch: Any) -> None:
    from pydantic import ValidationError

    from sagegate.gateway.settings import GatewaySettings

    backends = [{"url": "http://a:8000", "kv_events": "tcp://a:5557"}, {"url": "http://b:8000"}]
    monkeypatch.setenv("SAGEGATE_BACKENDS", json.dumps(backends))
    monkeypatch.setenv("SAGEGATE_PLACEMENT__KV_EVENTS__TOKENIZER", "backend")
    s = GatewaySettings()
    source = s.backends[0].kv_events
    assert source is not None and source.endpoint == "tcp://a:5557" and source.replay_endpoint is None
    assert s.backends[1].kv_events is None and s.placement.kv_events.tokenizer == "backend"
    with pytest.raises(ValidationError, match="to connect to"):
        GatewaySettings(backends=[{"url": "http://a:8000", "kv_events": "tcp://*:5557"}])


def test_a_subscription_that_keeps_breaking_is_warned_of_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    f = follower(clock=clock)
    for _ in range(7):  # a break every 20 s for two minutes
        f.disconnected()
        clock.t += 20.0
    lines = [r.getMessage() for r in caplog.records if "broken subscription" in r.getMessage()]
    assert len(lines) == 3  # at 0, 60 and 120 s
    assert lines[1].startswith("KV events: 3 broken")  # the ones held back are counted
