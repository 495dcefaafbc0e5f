"""The simulated backend publishes KV-cache events as vLLM does (``--kv-events-config``): what its
engine caches (full blocks, with their token ids), evicts and resets, on a ZMQ PUB socket with vLLM's
framing (topic, 8-byte big-endian sequence from 0, msgpack ``KVEventBatch``) and optional replay
socket, readable with a plain msgpack reader. Off, the engine is untouched."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from sagegate.cmd_backend import spawned_backend
from sagegate.core.tokens import encode, flatten_messages
from sagegate.harness.procs import free_port
from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import EngineRequest
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.kv_events import EventLog, KVEventsConfig, block_hash
from sagegate.sim.perf import PerfModel
from sagegate.sim.server import _pack

BS = 16


# --- in process: the events follow the engine's own cache ------------------------------------------------
def run_engine(events: bool, seed: int = 3) -> tuple[Engine, list[Any], list[tuple[Any, ...]]]:
    """A small pool under shared prefixes, overlapping requests (evictions, preemptions): the events
    taken after every step (checked against the pool then), and each request's outcome."""
    perf = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
    eng = Engine(perf, EngineConfig(num_gpu_blocks_override=48, block_size=BS, max_num_seqs=6))
    log = EventLog(BS)
    if events:
        eng.pool.events = log
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50_000) for _ in range(90)] for _ in range(3)]
    reqs = []
    for i in range(30):
        ids = prefixes[i % 3] + [rng.randrange(50_000) for _ in range(rng.randrange(1, 120))]
        reqs.append(EngineRequest(i, i * 0.02, len(ids), rng.randrange(1, 60), prompt=_pack(ids)))
    batches: list[Any] = []
    held: set[int] = set()
    now = 0.0
    pending = list(reqs)
    while pending or eng.has_work():
        while pending and pending[0].arrival_s <= now:
            eng.add(pending.pop(0), now)
        if not eng.has_work():
            now = pending[0].arrival_s
            continue
        step = eng.schedule(now)
        now += step.duration
        eng.complete(step, now)
        batches.append(log.take())
        if events:
            follow(held, batches[-1])
            cached = {block_hash(k) for k in [*eng.pool._ref, *eng.pool._lru]} - {None}
            assert cached == held  # what the events say is cached is exactly what the pool holds
    outcome = [(r.rid, r.t_first_token, r.t_finish, r.preemptions, r.cached_tokens) for r in reqs]
    return eng, batches, outcome


def follow(held: set[int], events: list[Any]) -> None:
    for ev in events:
        if ev["type"] == "BlockStored":
            assert not held & set(ev["block_hashes"]), "a block stored twice"
            held.update(ev["block_hashes"])
        elif ev["type"] == "BlockRemoved":
            assert set(ev["block_hashes"]) <= held, "a block removed that was not stored"
            held.difference_update(ev["block_hashes"])
        else:
            held.clear()


def test_events_follow_the_engines_cache_and_change_nothing_it_does() -> None:
    on, batches, with_events = run_engine(events=True)
    off, _, without = run_engine(events=False)
    assert with_events == without  # the same steps, times and hits: the hook changes nothing
    assert on.num_preemptions == off.num_preemptions > 0
    kinds = {ev["type"] for batch in batches for ev in batch}
    assert kinds == {"BlockStored", "BlockRemoved"}
    assert on.pool.reset_prefix_cache()
    assert on.pool.events is not None
    assert on.pool.events.take() == [{"type": "AllBlocksCleared"}]  # type: ignore[attr-defined]
    assert on.pool.free_blocks == on.pool.num_blocks


def test_stored_blocks_carry_their_tokens_and_chain_to_their_parent() -> None:
    _, batches, _ = run_engine(events=True, seed=5)
    tokens_of: dict[int, list[int]] = {}
    for ev in (ev for batch in batches for ev in batch if ev["type"] == "BlockStored"):
        assert ev["block_size"] == BS and ev["medium"] == "GPU"
        assert len(ev["token_ids"]) == BS * len(ev["block_hashes"])
        parent = ev["parent_block_hash"]
        assert parent is None or parent in tokens_of  # the parent is cached when a child is stored
        for j, h in enumerate(ev["block_hashes"]):
            tokens_of[h] = ev["token_ids"][j * BS : (j + 1) * BS]


def test_the_config_takes_vllms_json_and_refuses_unknown_keys() -> None:
    cfg = KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "kv"}')
    assert cfg.active and cfg.endpoint == "tcp://*:5557" and cfg.layout == "map"
    assert not KVEventsConfig.parse('{"enable_kv_cache_events": false}').active
    with pytest.raises(ValueError, match="unknown"):
        KVEventsConfig.parse('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}')
    with pytest.raises(ValueError):
        KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "kafka"}')


# --- a real `sagegate backend` process over loopback ZMQ ------------------------------------------------
class Subscriber:
    """A plain SUB socket with a plain msgpack reader, as vLLM's consumers read the events, subscribed
    to the (idle) backend at ``url`` before the test makes it publish."""

    def __init__(self, port: int, url: str, topic: bytes = b"") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.messages: list[tuple[bytes, int, bytes]] = []
        self.joining = True
        """Until the test's first batch: the handshake's clears may still be coming (see drain)."""
        # ZMQ's slow joiner: what is published before the subscription reaches the publisher is lost.
        # A handshake: reset the idle backend's cache (it publishes AllBlocksCleared) until one arrives.
        deadline = time.monotonic() + 20
        while True:
            assert httpx.post(url + "/reset_prefix_cache", timeout=5).status_code == 200
            if self.sock.poll(50):
                break
            assert time.monotonic() < deadline, "no batch reached the subscriber"

    def drain(self, settle_s: float = 0.4) -> list[Any]:
        """Messages until none came for ``settle_s``; their decoded batches (the handshake's, which
        come before anything the test does, left out)."""
        new = []
        while self.sock.poll(int(settle_s * 1000)):
            topic, seq, payload = self.sock.recv_multipart()
            batch = msgpack.unpackb(payload)
            if self.joining and all(_cleared(ev) for ev in batch[1]):
                continue
            self.joining = False
            self.messages.append((topic, int.from_bytes(seq, "big"), payload))
            new.append(batch)
        return new

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _cleared(ev: Any) -> bool:
    return ev in ({"type": "AllBlocksCleared"}, ["AllBlocksCleared"])  # (map or array layout)


def events_of(batches: list[Any]) -> list[Any]:
    return [ev for batch in batches for ev in batch[1]]


@pytest.fixture(scope="module")
def publisher() -> Iterator[tuple[str, int, int]]:
    port, replay = free_port(), free_port()
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv@sim@fake",
    }
    args = ["--time-scale", "20", "--served-model-name", "fake", "--num-gpu-blocks-override", "64"]
    with spawned_backend([*args, "--kv-events-config", json.dumps(cfg)]) as url:
        yield url, port, replay


def chat(url: str, content: str, max_tokens: int = 20) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": content}]
    body = {"model": "fake", "messages": messages, "max_tokens": max_tokens}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return messages


@pytest.mark.heavy
def test_a_backend_publishes_stored_removed_and_cleared_as_vllm_frames_them(
    publisher: tuple[str, int, int],
) -> None:
    url, port, replay = publisher
    sub = Subscriber(port, url)
    try:
        messages = chat(url, "Tell me about the history of the railway in Switzerland. " * 12)
        first = sub.drain()
        ids = encode(flatten_messages(messages))
        stored = [ev for ev in events_of(first) if ev["type"] == "BlockStored"]
        assert stored, "no BlockStored for a 130-token prompt"
        head = stored[0]
        assert head["parent_block_hash"] is None and head["block_size"] == BS
        assert head["token_ids"] == ids[: len(head["token_ids"])]  # the prompt's own token ids
        # batches: [ts, events, data_parallel_rank], ts a float; events tagged maps, vLLM's field order
        ts, _, rank = first[0]
        assert isinstance(ts, float) and rank == 0
        assert list(head)[:8] == [
            "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
            "lora_name",
        ]  # fmt: skip
        # a pool of 64 blocks: distinct prompts evict the first one's blocks
        for i in range(4):
            chat(url, f"Prompt number {i} about rivers and lakes in Europe, " * 25)
        later = events_of(sub.drain())
        removed = [h for ev in later if ev["type"] == "BlockRemoved" for h in ev["block_hashes"]]
        assert set(head["block_hashes"]) <= set(removed)
        assert all(ev["medium"] == "GPU" for ev in later if ev["type"] == "BlockRemoved")
        live: set[int] = set()
        for ev in events_of([msgpack.unpackb(p) for _, _, p in sub.messages]):
            if ev["type"] == "BlockStored":
                live.update(ev["block_hashes"])
            elif ev["type"] == "BlockRemoved":
                live.difference_update(ev["block_hashes"])
        assert 0 < len(live) <= 64  # never more than the pool holds
        assert httpx.post(url + "/reset_prefix_cache", timeout=5).status_code == 200
        assert events_of(sub.drain()) == [{"type": "AllBlocksCleared"}]
        topics = {t for t, _, _ in sub.messages}
        seqs = [s for _, s, _ in sub.messages]
        assert topics == {b"kv@sim@fake"}
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one more each batch, no gap
        # the replay socket gives back what was published, from the asked sequence on, then -1, each
        # (topic, seq, payload) as vLLM 0.32 replays (the end marker's topic empty)
        dealer = sub.ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay}")
        dealer.send_multipart([b"", seqs[1].to_bytes(8, "big")])
        replayed = []
        while True:
            assert dealer.poll(5000)
            _, topic, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b"" and topic == b""
                break
            assert topic == b"kv@sim@fake"
            replayed.append((int.from_bytes(seq, "big"), payload))
        dealer.close(0)
        assert replayed == [(s, p) for _, s, p in sub.messages[1:]]
    finally:
        sub.close()


@pytest.mark.heavy
def test_the_array_layout_of_older_vllm() -> None:
    port = free_port()
    cfg = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}", "layout": "array"}
    with spawned_backend(["--time-scale", "20", "--kv-events-config", json.dumps(cfg)]) as url:
        sub = Subscriber(port, url)
        try:
            body = {"prompt": list(range(1000, 1040)), "max_tokens": 3}
            assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
            (batch,) = sub.drain()
            (ev,) = batch[1]
            assert ev[:5] == ["BlockStored", ev[1], None, list(range(1000, 1032)), BS]
            assert ev[5:8] == [None, "GPU", None] and len(ev[1]) == 2
        finally:
            sub.close()


@pytest.mark.heavy
def test_the_command_line_refuses_a_bad_kv_events_config() -> None:
    bad = '{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}'
    with (
        pytest.raises(RuntimeError, match="unknown --kv-events-config key"),
        spawned_backend(["--kv-events-config", bad]),
    ):
        pass
