"""KV-cache events as vLLM publishes them, from the simulated engine's own prefix cache.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``) reports what
its block pool caches and evicts: on a ZMQ PUB socket, one multipart message per engine step that
changed the cache, ``(topic, sequence, payload)``: the topic as configured (UTF-8), the sequence number
as 8 bytes big-endian (0, 1, 2, ... from the publisher's start), and the payload a msgpack
``KVEventBatch``: ``[ts, events, data_parallel_rank]`` (msgspec ``array_like``), each event a tagged
struct: ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
``lora_id``, ``medium``, ``lora_name``, ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``),
``BlockRemoved`` (``block_hashes``, ``medium``, ``group_idx``) or ``AllBlocksCleared``. Since vLLM PR
#42892 an event is a map keyed by field name with its tag under ``"type"`` (fields at their default
omitted); before it, an array with the tag first and every field in declaration order (``layout:
"array"`` here, a simulator-only key). An optional ROUTER socket (``replay_endpoint``) replays the
last ``buffer_steps`` batches: a client sends ``(b"", start_seq)`` and gets ``(b"", topic, seq,
payload)`` for each buffered batch from ``start_seq`` on, then ``(b"", b"", -1, b"")``, as vLLM 0.32
replays (its real replay socket, ``tests/vllm``; earlier vLLM sent no topic).

:class:`EventLog` is what ``sim.kv.BlockPool.events`` calls; the runner (``sim.server_runner``) hands
its events to :class:`Publisher` after each step. A block's hash is its simulated content key (a
chained CRC-32 of the tokens up to it, and its index) as a 64-bit integer, as vLLM sends its hashes
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default); only blocks whose token ids the engine knows
are reported (the simulated backend's prompts and outputs; a preempted request's private blocks, which
nothing else can hit, are not).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import struct
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields
from typing import Any

from sagegate.sim.prefix import CHARS_PER_TOKEN, BlockKeys

log = logging.getLogger("sagegate.sim")

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
LAYOUTS = ("map", "array")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's ``KVEventsConfig`` (``--kv-events-config``), plus ``layout``, the simulator's own."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    layout: str = "map"
    """``map`` (vLLM since PR #42892) or ``array`` (the positional layout before it)."""

    def __post_init__(self) -> None:
        if self.publisher not in ("zmq", "null"):
            raise ValueError(f"unknown KV event publisher {self.publisher!r}; valid: zmq, null")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown KV event layout {self.layout!r}; valid: {', '.join(LAYOUTS)}")
        if self.buffer_steps < 1 or self.hwm < 0:
            raise ValueError("buffer_steps must be >= 1 and hwm >= 0")

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """From the JSON vLLM's flag takes; an unknown key is an error, as in vLLM."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown --kv-events-config key(s): {', '.join(unknown)}")
        return cls(**raw)


def block_hash(key: Hashable) -> int | None:
    """The 64-bit hash a content key is published under (None: not a block with known tokens)."""
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "t":
        return ((key[1] & 0xFFFFFFFF) << 32) | (key[2] & 0xFFFFFFFF)
    return None


class EventLog:
    """The pool's observer (``sim.kv.CacheEvents``): turns what the pool does into vLLM's events, held
    until :meth:`take`. A run of consecutive blocks stored together is one ``BlockStored`` (its parent
    the block before the first), an eviction one ``BlockRemoved``, as vLLM's block pool emits them."""

    def __init__(self, block_size: int, layout: str = "map") -> None:
        self.block_size = block_size
        self.array = layout == "array"
        self._events: list[Any] = []

    def stored(self, key_of: Callable[[int], Hashable], blocks: list[int]) -> None:
        text = key_of.text if isinstance(key_of, BlockKeys) else None
        if text is None:
            return
        run: list[int] = []
        for j in blocks:
            if run and j != run[-1] + 1:
                self._stored_run(key_of, text, run)
                run = []
            run.append(j)
        self._stored_run(key_of, text, run)

    def _stored_run(self, key_of: Callable[[int], Hashable], text: str, run: list[int]) -> None:
        hashes = [block_hash(key_of(j)) for j in run]
        if not run or any(h is None for h in hashes):
            return
        bs = self.block_size
        width = bs * CHARS_PER_TOKEN
        raw = text[run[0] * width : (run[-1] + 1) * width].encode("latin-1")
        tokens = list(struct.unpack(f"<{len(raw) // 4}I", raw))
        parent = block_hash(key_of(run[0] - 1)) if run[0] > 0 else None
        extra: list[Any] = [None] * len(run)
        if self.array:
            self._events.append(
                [
                    "BlockStored",
                    hashes,
                    parent,
                    tokens,
                    bs,
                    None,
                    MEDIUM_GPU,
                    None,
                    extra,
                    0,
                    "full_attention",
                    None,
                ]
            )
        else:
            self._events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": hashes,
                    "parent_block_hash": parent,
                    "token_ids": tokens,
                    "block_size": bs,
                    "lora_id": None,
                    "medium": MEDIUM_GPU,
                    "lora_name": None,
                    "extra_keys": extra,
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            )

    def removed(self, key: Hashable) -> None:
        h = block_hash(key)
        if h is None:
            return
        if self.array:
            self._events.append(["BlockRemoved", [h], MEDIUM_GPU, 0])
        else:
            self._events.append(
                {"type": "BlockRemoved", "block_hashes": [h], "medium": MEDIUM_GPU, "group_idx": 0}
            )

    def cleared(self) -> None:
        self._events.append(["AllBlocksCleared"] if self.array else {"type": "AllBlocksCleared"})

    def take(self) -> list[Any]:
        """The events since the last call, in order."""
        out, self._events = self._events, []
        return out


class Publisher:
    """vLLM's ``ZmqEventPublisher`` on this event loop: a PUB socket (bound when the endpoint has a
    wildcard, ``ipc://`` or ``inproc://``, else connected, as vLLM decides), sequence numbers from 0,
    the last ``buffer_steps`` batches kept for the optional ROUTER replay socket. Sending never waits:
    past the high-water mark ZMQ drops, and the subscriber sees a gap in the sequence."""

    def __init__(self, config: KVEventsConfig) -> None:
        import msgpack
        import zmq
        import zmq.asyncio

        self._zmq = zmq
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self.topic = config.topic.encode("utf-8")
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(config.hwm)
        ep = config.endpoint
        if "*" in ep or "::" in ep or ep.startswith(("ipc://", "inproc://")):
            self.pub.bind(ep)
        else:
            self.pub.connect(ep)
        self.replay = None
        if config.replay_endpoint is not None:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(config.replay_endpoint)
        self.buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=config.buffer_steps)
        self.seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replay requests (on the running loop), if a replay socket is configured."""
        if self.replay is not None:
            self._task = asyncio.create_task(self._serve_replay(), name="sim-kv-replay")

    def publish(self, events: list[Any]) -> None:
        """One ``KVEventBatch`` (nothing for an empty list, as vLLM publishes only steps with events)."""
        if not events:
            return
        seq = self.seq
        self.seq += 1
        payload = self._pack([time.time(), events, 0])
        self.buffer.append((seq, payload))
        with contextlib.suppress(self._zmq.Again):
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=self._zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self.replay is not None
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV events: invalid replay request of %d frame(s)", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart(
                        [client, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            await self.replay.send_multipart([client, b"", b"", END_SEQ, b""])  # as vLLM 0.32 replays

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.ctx.term()
